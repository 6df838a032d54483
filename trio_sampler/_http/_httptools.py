"""The C-parser transport: HTTP/1.1 over trio's sockets, parsed by ``httptools``.

``httptools`` wraps llhttp, the C parser of Node.js that uvicorn uses. Per read this
transport does one read of the connection and one ``feed_data``: llhttp takes the chunked
framing apart in C and calls back once per data chunk. Over plain TCP the body offers
:class:`~trio_sampler._http.SocketReads` (the reader waits on the socket and takes the
read: no coroutine per read); under TLS it reads through ``trio.SSLStream``. There is no h11 state
machine, no httpcore2 pool and no cancel scope per read, where the default transport
spends much of its per-token time (``docs/benchmarks-actor.md``). Opt-in:
``SamplerConfig(http_transport="httptools")`` with the ``fast`` extra installed.

What it keeps of the other transports:

* **Connections**: a TCP connection per exchange, TLS over it for ``https`` (ALPN
  ``http/1.1``; the system's CA store, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), kept
  alive per origin after a body read to its end (at most
  ``max_keepalive_connections`` idle per origin, the newest reused first). An idle
  connection found readable (the server closed it, or sent what nobody asked for) is
  closed, never used.
* **Timeouts**: ``connect`` (TCP and TLS), ``write`` (the request) and ``read`` (each
  read of the response head) are the socket timeouts; the client bounds the head by
  ``response_headers``, and the actor bounds the body's reads by its first-token, idle
  and total timers, so body reads carry no scope of their own.
* **The resend rule** (``docs/retry-policy.md``): a request is sent again unseen only
  when a reused connection refused its write whole
  (:class:`~trio_sampler._receive_time.NothingWritten`: not one byte reached the
  kernel), at most :data:`STALE_CONNECTION_RESENDS` times. Anything else that fails
  before a head may have reached the server, and is raised.
* **Times**: writes are timed (``request_sent_at``); with
  ``SamplerConfig.receive_timestamps`` reads are timed by their bytes' arrival
  (``received_at``), through :class:`~trio_sampler._receive_time.StampedSocketStream`.

Only HTTP/1.1, and only ``http`` and ``https`` URLs without a proxy: anything else is the
default transport's.
"""

from __future__ import annotations

import ssl
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Mapping,
    Sequence,
)
from urllib.parse import urlencode, urlsplit

import httptools
import trio

from .._receive_time import (
    LAST_SENT,
    NothingWritten,
    StampedSocketStream,
    hold_kernel_timestamps,
)
from ..config import SamplerConfig
from ..types import SamplingErrorInfo, SamplingErrorKind
from ._base import Body, HttpRequest, SamplingClientError, SocketReads, timeout_error
from ._direct import STALE_CONNECTION_RESENDS, header_fields
from ._httpx import CLOSE_TIMEOUT, classify_transport_error

__all__ = ["HttptoolsTransport"]

_RECEIVE_BYTES = 65536
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_CACHED_URLS = 64
#: What a connection broken under a read or a write raises.
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def _failure(
    what: str, exc: BaseException | None = None, *, retryable: bool = True
) -> SamplingClientError:
    """A transport failure saying ``what`` happened (and ``exc``'s class, no text: it
    may name the URL)."""
    detail = f" ({type(exc).__name__})" if exc is not None else ""
    return SamplingClientError(
        SamplingErrorInfo(
            kind=SamplingErrorKind.TRANSPORT, message=f"{what}{detail}", retryable=retryable
        )
    )


def _limit(seconds: float | None) -> float:
    return float("inf") if seconds is None else seconds


# -- one response as llhttp parses it ---------------------------------------------------


class _Message:
    """The parser's callbacks for one response: the head's fields, the body's pieces not
    handed on yet, and whether the head and the whole message were parsed."""

    __slots__ = ("complete", "head_done", "pieces", "raw_headers")

    def __init__(self) -> None:
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.pieces: list[bytes] = []
        self.head_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


# -- connections and their pools ----------------------------------------------------------


class _Origin:
    """Where requests of one base URL, path and query go, and how their head starts."""

    __slots__ = ("host", "key", "port", "request_line", "tls")

    def __init__(self, url: str, params: tuple[tuple[str, str], ...]) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise SamplingClientError(
                SamplingErrorInfo(
                    kind=SamplingErrorKind.INVALID_REQUEST,
                    message="the httptools transport takes http:// and https:// URLs only: "
                    "check base_url",
                )
            )
        self.tls = scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or _DEFAULT_PORTS[scheme]
        self.key = (scheme, self.host, self.port)
        target = parts.path or "/"
        query = "&".join(q for q in (parts.query, urlencode(params)) if q)
        if query:
            target = f"{target}?{query}"
        host = parts.netloc.rsplit("@", 1)[-1]
        self.request_line = f" {target} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii")


class _Connection:
    """One HTTP/1.1 connection: the stream (TLS or not) and the TCP stream under it."""

    __slots__ = ("socket_stream", "stream")

    def __init__(self, stream: StampedSocketStream | trio.SSLStream[StampedSocketStream]) -> None:
        #: Its ``receive_some`` is one read (``b""``: the server closed); a plain read
        #: waits for the socket first (``StampedSocketStream``).
        self.stream = stream
        self.socket_stream = (
            stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        )

    def dead(self) -> bool:
        """Whether an idle connection has something to read: the server's close (or
        bytes nobody asked for); either way it is not to be used."""
        return self.socket_stream.socket.is_readable()

    def close(self) -> None:
        """Close at once (no TLS close_notify: the connection is being dropped)."""
        self.socket_stream.socket.close()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def _connect(
    origin: _Origin, seconds: float | None, stamped: bool, context: ssl.SSLContext | None
) -> _Connection:
    """A new connection to ``origin`` within ``seconds`` (TCP, then TLS for https)."""
    try:
        with trio.fail_after(_limit(seconds)):
            tcp = await trio.open_tcp_stream(origin.host, origin.port)
            stream: StampedSocketStream | trio.SSLStream[StampedSocketStream]
            stream = StampedSocketStream(tcp, stamp_reads=stamped)
            if origin.tls:
                assert context is not None
                stream = trio.SSLStream(
                    stream, context, server_hostname=origin.host, https_compatible=True
                )
                try:
                    await stream.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
    except trio.TooSlowError:
        raise timeout_error("connect", "no connection", _limit(seconds)) from None
    except (*_BROKEN, ssl.SSLError) as exc:
        raise SamplingClientError(classify_transport_error(exc)) from None
    return _Connection(stream)


# -- the body -----------------------------------------------------------------------------


class _HttptoolsBody:
    """A response whose head was parsed; its body's pieces as llhttp hands them over,
    joined per read."""

    __slots__ = (
        "_chunks",
        "_closed",
        "_connection",
        "_ended_at",
        "_message",
        "_parser",
        "_release",
        "_reusable",
        "_stamped",
        "header_fields",
        "http_version",
        "raw_headers",
        "request_sent_at",
        "status",
    )

    read_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        connection: _Connection,
        parser: httptools.HttpResponseParser,
        message: _Message,
        sent_at: float | None,
        release: Callable[[_Connection, bool], None],
        stamped: bool,
    ) -> None:
        self._connection = connection
        self._parser = parser
        self._message = message
        self._release = release
        self._stamped = stamped
        self.status = parser.get_status_code()
        self.http_version = f"HTTP/{parser.get_http_version()}"
        self.raw_headers: Sequence[tuple[bytes, bytes]] = message.raw_headers
        self.header_fields: Mapping[str, str] = header_fields(message.raw_headers)
        # Whether the connection outlives the message, from the head (llhttp's own
        # answer is reset once the message completes).
        self._reusable = self.http_version == "HTTP/1.1" and "close" not in (
            self.header_fields.get("connection", "").lower()
        )
        self.request_sent_at = sent_at
        self._ended_at: float | None = None
        self._closed = False
        self._chunks: AsyncGenerator[bytes, None] | None = None

    @property
    def received_at(self) -> float | None:
        return self._connection.socket_stream.received_at if self._stamped else None

    @property
    def ended_at(self) -> float | None:
        return self._ended_at

    def chunks(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = self._read()
        return self._chunks

    async def _read(self) -> AsyncGenerator[bytes, None]:
        # Per read: one receive_some, one feed_data, one yield; no scope (the actor's
        # timers bound the wait) and no object kept past the read.
        receive = self._connection.stream.receive_some
        while True:
            chunk = self._parsed()
            if chunk is None:
                return
            if chunk:
                yield chunk
                continue
            try:
                data = await receive(_RECEIVE_BYTES)
            except _BROKEN as exc:
                raise _failure("the connection failed while reading", exc) from None
            self._feed(data)

    def socket_reads(self) -> SocketReads | None:
        """The body's reads without a coroutine (:class:`SocketReads`), over a plain
        connection (TLS reads go through ``trio.SSLStream``) whose reads
        ``read_now`` makes as ``receive_some`` does."""
        stream = self._connection.stream
        if type(stream) is not StampedSocketStream or not stream.reads_now:
            return None
        return self

    @property
    def fileno(self) -> int:
        return self._connection.socket_stream.socket.fileno()

    def take(self, ready: bool) -> bytes | None:
        """:meth:`_read`'s steps, one read at most (:class:`SocketReads`): the pieces
        parsed, else the end, else (``ready``) one read fed to llhttp."""
        message = self._message
        if ready and not message.pieces and not message.complete:
            stream = self._connection.stream
            assert type(stream) is StampedSocketStream
            try:
                data = stream.read_now(_RECEIVE_BYTES)
            except _BROKEN as exc:
                raise _failure("the connection failed while reading", exc) from None
            if data is None:  # a spurious wake
                return b""
            self._feed(data)
        return self._parsed()

    def _parsed(self) -> bytes | None:
        """The body bytes llhttp parsed and nobody took yet; ``None`` once the message is
        complete and taken (its connection is given back then); ``b""``: none yet."""
        message = self._message
        pieces = message.pieces
        if pieces:
            chunk = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            return chunk
        if message.complete:
            self._end(reusable=self._reusable)
            return None
        return b""

    def _feed(self, data: bytes | bytearray) -> None:
        """One read's bytes to llhttp (``b""``: the server closed the connection)."""
        if not data:
            self._end_at_eof()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._parse_error(exc)

    def _parse_error(self, exc: httptools.HttpParserError) -> None:
        """A body llhttp cannot parse fails; bytes after a whole message (nobody asked
        for them) only keep its connection from being reused."""
        if not self._message.complete:
            raise _failure("the server broke the HTTP protocol", exc) from None
        self._end(reusable=False)

    def _end_at_eof(self) -> None:
        """The server closed the connection: the end of a body delimited by the close,
        else a body cut short."""
        fields = self.header_fields
        if "content-length" in fields or "chunked" in fields.get("transfer-encoding", ""):
            raise _failure("the server closed the connection mid-response")
        self._message.complete = True
        self._end(reusable=False)

    def _end(self, *, reusable: bool, ended: bool = True) -> None:
        """Give the connection back (kept alive if ``reusable``, else closed), once."""
        if ended and self._ended_at is None:
            self._ended_at = trio.current_time()
        release, self._release = self._release, _keep
        release(self._connection, reusable)

    @staticmethod
    def read_failure(exc: BaseException) -> SamplingClientError:
        return SamplingClientError(classify_transport_error(exc))

    def end_received(self, downloaded: int) -> bool:
        """llhttp has parsed the message's end already (it arrived with the last data)."""
        return self._message.complete

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        chunks = self._chunks
        if chunks is not None:
            await chunks.aclose()
        if self._release is not _keep:  # not given back yet: reused only if it ended
            complete = self._message.complete
            self._end(reusable=complete and self._reusable, ended=complete)
        await trio.lowlevel.checkpoint()


def _keep(connection: _Connection, reusable: bool) -> None:
    pass


class _Idle:
    """An origin's idle connections, up to ``keep``; called with a response's connection
    when the response ends (``reusable``: it may carry another request), else it is
    closed. One per origin, given to each response (a closure per response lived as
    long as the response: its function, cells and their tuple, the collector's share)."""

    __slots__ = ("connections", "keep")

    def __init__(self, keep: int) -> None:
        self.connections: list[_Connection] = []
        self.keep = keep

    def __call__(self, connection: _Connection, reusable: bool) -> None:
        if reusable and len(self.connections) < self.keep:
            self.connections.append(connection)
        else:
            connection.close()


# -- the transport --------------------------------------------------------------------------


class HttptoolsTransport:
    """HTTP/1.1 over trio sockets, parsed by llhttp through ``httptools`` (see module)."""

    def __init__(self, config: SamplerConfig, *, ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: for ``https`` origins (default: the system's CA store, ALPN
        ``http/1.1``)."""
        self._context = ssl_context
        self._stamped = config.receive_timestamps
        self._keep_alive = config.max_keepalive_connections
        self._idle: dict[tuple[str, str, int], _Idle] = {}
        self._origins: dict[tuple[str, tuple[tuple[str, str], ...]], _Origin] = {}
        #: Requests resent at once because a reused connection refused the first write
        #: whole; never visible as a retry.
        self.stale_connection_resends = 0
        self._release_kernel_timestamps: Callable[[], object] | None = None
        if self._stamped:
            holder = hold_kernel_timestamps()
            if holder is not None:
                self._release_kernel_timestamps = weakref.finalize(self, holder.close)

    def _tls_context(self) -> ssl.SSLContext:
        if self._context is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._context = context
        return self._context

    def _origin(self, request: HttpRequest) -> _Origin:
        key = (request.url, request.params)
        found = self._origins.get(key)
        if found is None:
            if len(self._origins) >= _MAX_CACHED_URLS:
                self._origins.clear()
            found = self._origins[key] = _Origin(request.url, request.params)
        return found

    def _head(self, request: HttpRequest, origin: _Origin) -> bytes:
        """The request's head and body, one write."""
        headers = request.headers
        head = headers.memo.get(self)
        if head is None:
            fields = b"".join(b"%s: %s\r\n" % pair for pair in headers.fields)
            head = headers.memo[self] = fields
        assert isinstance(head, bytes)
        return b"".join(
            (
                request.method.encode("ascii"),
                origin.request_line,
                head,
                b"Content-Length: %d\r\n\r\n" % len(request.body),
                request.body,
            )
        )

    async def _connection(self, origin: _Origin, seconds: float | None) -> tuple[_Connection, bool]:
        """An idle live connection to ``origin`` (``True``: reused), else a new one."""
        idle = self._idle.get(origin.key)
        while idle is not None and idle.connections:
            connection = idle.connections.pop()
            if not connection.dead():
                return connection, True
            await connection.aclose()
        context = self._tls_context() if origin.tls else None
        return await _connect(origin, seconds, self._stamped, context), False

    def _release(self, origin: _Origin) -> _Idle:
        """Where a response to ``origin`` gives its connection back."""
        idle = self._idle.get(origin.key)
        if idle is None:
            idle = self._idle[origin.key] = _Idle(self._keep_alive)
        return idle

    async def open(self, request: HttpRequest) -> Body:
        try:
            origin = self._origin(request)
            data = self._head(request, origin)
        except (UnicodeError, TypeError, ValueError):
            raise _failure(
                "the request could not be built: check base_url, wire.path and header "
                "values (ASCII only)",
                retryable=False,
            ) from None
        timeouts = request.headers.timeout
        resends = 0
        while True:
            connection, reused = await self._connection(origin, timeouts.get("connect"))
            try:
                sent_at = await self._send(connection, data, timeouts.get("write"))
            except NothingWritten:
                await connection.aclose()
                if not reused or resends >= STALE_CONNECTION_RESENDS:
                    raise _failure("the connection failed while sending") from None
                resends += 1
                self.stale_connection_resends += 1
                continue
            return await self._response(connection, origin, sent_at, timeouts.get("read"))

    @staticmethod
    async def _send(connection: _Connection, data: bytes, seconds: float | None) -> float:
        """Write ``data`` within ``seconds``; when its last byte went out."""
        try:
            with trio.fail_after(_limit(seconds)):
                await connection.stream.send_all(data)
        except NothingWritten:
            raise
        except trio.TooSlowError:
            await connection.aclose()
            raise _failure("timed out sending the request") from None
        except BaseException as exc:
            await connection.aclose()
            if isinstance(exc, _BROKEN):
                raise _failure("the connection failed while sending", exc) from None
            raise
        sent = LAST_SENT.get()
        return trio.current_time() if sent is None else sent

    async def _response(
        self, connection: _Connection, origin: _Origin, sent_at: float, seconds: float | None
    ) -> Body:
        """Read the response head (each read within ``seconds``)."""
        message = _Message()
        parser = httptools.HttpResponseParser(message)
        try:
            while not message.head_done:
                with trio.fail_after(_limit(seconds)):
                    data = await connection.stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    raise _failure("the server closed the connection without a response")
                parser.feed_data(data)
        except BaseException as exc:
            await connection.aclose()
            if isinstance(exc, trio.TooSlowError):
                waited = _limit(seconds)
                raise timeout_error("response headers", "no response headers", waited) from None
            if isinstance(exc, httptools.HttpParserError):
                raise _failure("the server broke the HTTP protocol", exc) from None
            if isinstance(exc, _BROKEN):
                raise _failure("the connection failed while reading", exc) from None
            raise
        return _HttptoolsBody(
            connection, parser, message, sent_at, self._release(origin), self._stamped
        )

    async def aclose(self) -> None:
        try:
            with trio.CancelScope(shield=True, relative_deadline=CLOSE_TIMEOUT):
                idle, self._idle = self._idle, {}
                for kept in idle.values():
                    for connection in kept.connections:
                        await connection.aclose()
        finally:
            if self._release_kernel_timestamps is not None:
                self._release_kernel_timestamps()
