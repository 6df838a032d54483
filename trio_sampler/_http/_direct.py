"""The direct transport: httpcore2's pools, the fast path and the default.

Each pool is an ``httpx2.AsyncClient``, and httpx2 builds the client's settings (TLS,
limits, HTTP/2, proxies from the environment) into ``httpcore2`` connection pools. A
request that needs nothing of httpx2 beyond them (a POST whose URL goes to the client's
own pool rather than a proxy, no cookie in the jar, no header httpx2 sets itself) is
handed to that ``httpcore2`` pool directly, as httpx2 would hand it: the same headers in
the same order, the same timeouts, the same connection. It skips httpx2's layers
around the exchange and around every body chunk (about 0.25 ms of CPU per 200-chunk
stream: ``docs/benchmarks-actor.md``). A ``Set-Cookie`` is kept in the client's jar as
httpx2 would keep it (so later requests to its domain take httpx2's way, which sends
it); the request line httpx2 logs at INFO is logged by the ``trio_sampler.http`` logger,
the same text. Any other request goes through ``httpx2.AsyncClient.send``, on the same
pools.

Under the pools, :class:`~trio_sampler._network.TrioNetworkBackend`: a request in one
write, writes timed (when the request was sent), reads timed by their bytes' arrival when
``SamplerConfig.receive_timestamps`` is on (the load generator's timestamps), and a write
refused whole told apart (the resend rule: :meth:`DirectTransport._send_resending_unwritten`),
all recorded for the task sending the request (``trio_sampler._network.Exchange``).

**What this module relies on that httpx2, httpcore2 and h11 keep private**, each step
checked by type, so that a change answers "not taken" rather than failing a request; the
contract test ``tests/test_http_direct_contract.py`` fails loudly when an upgrade changes
any of them:

==========================================  ==============================================
private state                               used for
==========================================  ==============================================
``AsyncClient._transport``,                 the client's own pool (the direct path), and
``AsyncHTTPTransport._pool``                whether a URL goes to it
``AsyncClient._transport_for_url``          (not to a proxy mounted for it)
``AsyncConnectionPool._network_backend``    read, and set to ours (httpx2 takes none)
``BoundAsyncStream._stream``,               from a response's body to its connection's
``AsyncResponseStream._httpcore_stream``,   h11 state, for the end-of-body probe
``PoolByteStream._stream``,                 (h11's public ``trailing_data`` at the end)
``HTTP11ConnectionByteStream._connection``,
``AsyncHTTP11Connection._h11_state``
``AsyncHTTP11Connection._network_stream``,  a body's reads without a coroutine
``AsyncHTTP11Connection._h11_state``        (:func:`socket_reads`): our socket under
                                            the connection, h11 fed from it
==========================================  ==============================================

This is the only module of the library that touches them.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Mapping,
    Sequence,
)
from types import AsyncGeneratorType
from typing import cast

import attrs
import h11
import httpcore2
import httpx2
import trio

from .._network import EXCHANGE, Exchange, TrioNetworkBackend, is_stamped, socket_for_reads
from .._receive_time import (
    LAST_RECEIVED,
    StampedSocketStream,
    hold_kernel_timestamps,
)
from ..config import SamplerConfig
from ._base import (
    Body,
    HttpRequest,
    PreparedHeaders,
    SamplingClientError,
    SocketReads,
    timeout_error,
)
from ._httpx import (
    CLOSE_TIMEOUT,
    HttpxBody,
    classify_transport_error,
    client_for,
    unbuildable,
)

__all__ = ["STALE_CONNECTION_RESENDS", "DirectTransport", "header_fields"]

#: A request whose connection refused its first write whole is resent at once, at most
#: this many times (each failure closes the connection it was sent on).
STALE_CONNECTION_RESENDS = 3
#: What a failed exchange raises: httpcore2's own errors on the direct path, httpx2's on
#: httpx2's (``classify_transport_error`` reads the names, which are the same).
_REQUEST_ERRORS = (
    httpx2.RequestError,
    httpcore2.TimeoutException,
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.ProxyError,
    httpcore2.UnsupportedProtocol,
)
_CONNECT_TIMEOUTS = (httpx2.ConnectTimeout, httpcore2.ConnectTimeout)
_READ_TIMEOUTS = (httpx2.ReadTimeout, httpcore2.ReadTimeout)
# How a connection the server closed shows when a request is sent on it.
_BROKEN_CONNECTION_ERRORS = (
    httpx2.RemoteProtocolError,
    httpx2.ReadError,
    httpx2.WriteError,
    httpcore2.RemoteProtocolError,
    httpcore2.ReadError,
    httpcore2.WriteError,
)
_log = logging.getLogger("trio_sampler.http")
_USER_AGENT_DEFAULTS = frozenset({"host", "content-length", "transfer-encoding"})
_MAX_CACHED_URLS = 64
_NO_HEADERS = PreparedHeaders([], frozenset(), {})


def header_fields(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Raw header fields as ``dict(httpx2.Headers(raw).items())`` gives them (names
    lower-cased, the values of a repeated name joined with ``", "``), built in one pass
    when every field is ASCII (what servers send); any other, by ``httpx2.Headers``."""
    fields: dict[str, str] = {}
    try:
        for raw_name, raw_value in raw:
            name = raw_name.decode("ascii").lower()
            value = raw_value.decode("ascii")
            before = fields.get(name)
            fields[name] = value if before is None else f"{before}, {value}"
    except UnicodeDecodeError:  # httpx2 then decodes them all as UTF-8 or Latin-1
        return dict(httpx2.Headers(list(raw)).items())
    return fields


# -- the end-of-body probe ----------------------------------------------------------------

#: What is left unparsed on an HTTP/1.1 connection once a chunked body's last data chunk
#: was read and only its end follows: the data chunk's CRLF, the last chunk (size 0) and
#: the empty trailer section.
_CHUNKED_END = b"\r\n0\r\n\r\n"
#: The objects from a response's body to its HTTP/1.1 connection's h11 state, as
#: ``(attribute, class name of the object it holds)``: from an ``httpx2.Response``'s
#: stream to httpcore2's pool stream (the direct path's body is that stream), then on to
#: h11. Each step checked; anything else (another transport, HTTP/2, a changed
#: httpcore2) has no answer.
TO_POOL_STREAM = (
    ("_stream", "AsyncResponseStream"),  # httpx2's BoundAsyncStream
    ("_httpcore_stream", "PoolByteStream"),  # httpx2's transport stream
)
POOL_TO_H11 = (
    ("_stream", "HTTP11ConnectionByteStream"),  # httpcore2's pool stream
    ("_connection", "AsyncHTTP11Connection"),
    ("_h11_state", "Connection"),  # h11's
)


def end_received(stream: object, fields: Mapping[str, str], downloaded: int) -> bool:
    """Whether the rest of a body whose stream is ``stream`` has arrived already, so that
    reading it to its end waits for nothing: only what h11 holds unparsed on the
    connection can say, and only for HTTP/1.1 over httpcore2's pool (anything else answers
    ``False``). ``downloaded``: the body's bytes read so far, undecoded.

    The body's end is next when nothing is left of a ``content-length`` body, or when
    what is left unparsed of a chunked one is exactly the last chunk (h11 takes every
    byte of a data chunk that has arrived, so bytes left over mean that chunk ended)."""
    node = stream
    steps = POOL_TO_H11 if type(node).__name__ == "PoolByteStream" else TO_POOL_STREAM + POOL_TO_H11
    for attribute, class_name in steps:
        node = getattr(node, attribute, None)
        if type(node).__name__ != class_name:
            return False
    unparsed = getattr(node, "trailing_data", None)
    if not isinstance(unparsed, tuple) or not isinstance(unparsed[0], bytes):
        return False
    length = fields.get("content-length")
    if length is not None:
        return unparsed[0] == b"" and length.isdigit() and int(length) == downloaded
    return unparsed[0] == _CHUNKED_END and "chunked" in fields.get("transfer-encoding", "")


# -- reads without a coroutine ----------------------------------------------------------------

#: From httpcore2's HTTP/1.1 connection to its network stream (ours, or no answer).
_CONNECTION_TO_SOCKET = "_network_stream"


def socket_reads(stream: object) -> SocketReads | None:
    """The reads of a direct response's body (``stream``: httpcore2's pool stream) made
    without a coroutine (:class:`_H11Reads`), where its connection is HTTP/1.1 over one
    of our plain sockets (:class:`~trio_sampler._network.TrioNetworkBackend`) and h11 is
    reading its body; anything else answers ``None`` (its reads go through httpcore2)."""
    node = stream
    for attribute, class_name in POOL_TO_H11[:2]:
        node = getattr(node, attribute, None)
        if type(node).__name__ != class_name:
            return None
    state = getattr(node, POOL_TO_H11[2][0], None)
    network = getattr(node, _CONNECTION_TO_SOCKET, None)
    if type(state) is not h11.Connection or state.their_state is not h11.SEND_BODY:
        return None
    socket_stream = socket_for_reads(network)
    return None if socket_stream is None else _H11Reads(state, socket_stream)


class _H11Reads:
    """A direct body's reads (:class:`SocketReads`) as httpcore2 makes them
    (``AsyncHTTP11Connection._receive_response_body``): h11's events, a read of the socket
    fed to h11 whenever it needs data; a data event is a chunk, the end of the message (or
    h11's pause) the body's end, and failures are httpcore2's, classified.

    The body's end is taken here, so httpcore2's own body iterator is never started;
    closing the response (``_DirectBody.aclose``) then finds h11 done on both sides and
    gives the connection back to its pool, as after httpcore2's own reads. What it buys:
    a waiting read is trio's wait alone, where httpcore2's is nine coroutines and async
    generators (the response stream's, three of httpcore2's, the connection's read, the
    socket stream's, trio's) made each read and alive across the wait: see
    ``docs/benchmarks.md``."""

    __slots__ = ("_h11", "_needs_data", "_socket", "fileno")

    def __init__(self, state: h11.Connection, socket_stream: StampedSocketStream) -> None:
        self._h11 = state
        self._socket = socket_stream
        self.fileno = socket_stream.socket.fileno()
        #: The last take answered ``b""`` because h11 needs data: the ``take(True)`` after
        #: the wait reads at once, without asking h11 again (two of h11's ``next_event``
        #: a token, as httpcore2's reads make, where asking again made three).
        self._needs_data = False

    def take(self, ready: bool) -> bytes | None:
        state = self._h11
        needs_data, self._needs_data = self._needs_data, False
        if needs_data and ready:
            if not self._receive():
                return b""
            ready = False
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise _classified(httpcore2.RemoteProtocolError(exc), exc) from None
            kind = type(event)
            if kind is h11.Data:
                return bytes(event.data)  # type: ignore[union-attr]
            if kind is h11.EndOfMessage or event is h11.PAUSED:
                return None
            if event is not h11.NEED_DATA:  # another event: read on, as httpcore2 does
                continue
            if not ready or not self._receive():  # one read a take
                self._needs_data = True
                return b""
            ready = False

    def _receive(self) -> bool:
        """One read of the socket fed to h11; ``False``: nothing to read (a spurious
        wake)."""
        try:
            data = self._socket.read_now(httpcore2.AsyncHTTP11Connection.READ_NUM_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _classified(httpcore2.ReadError(exc), exc) from None
        if data is None:
            return False
        self._h11.receive_data(data)
        return True


def _classified(failure: Exception, cause: BaseException) -> SamplingClientError:
    """``failure`` (httpcore2's, raised from ``cause`` as httpcore2 raises it),
    classified as a failed read of httpcore2's is (``_DirectBody.read_failure``)."""
    failure.__cause__ = cause
    return SamplingClientError(classify_transport_error(failure))


# -- the pools ------------------------------------------------------------------------------


def own_pool(client: httpx2.AsyncClient) -> httpcore2.AsyncConnectionPool | None:
    """The httpcore2 connection pool under ``client``'s own default transport, which
    httpx2 builds itself and keeps private; each step checked by type (anything else,
    such as a transport of the caller's, has none)."""
    transport = getattr(client, "_transport", None)
    pool = getattr(transport, "_pool", None)
    if type(transport) is not httpx2.AsyncHTTPTransport or type(pool) is not (
        httpcore2.AsyncConnectionPool
    ):
        return None
    return pool


def to_own_pool(client: httpx2.AsyncClient, url: httpx2.URL) -> bool:
    """Whether httpx2 would send a request for ``url`` through ``client``'s own default
    transport (not through a proxy it mounted from the environment for it)."""
    choose = getattr(client, "_transport_for_url", None)
    return callable(choose) and choose(url) is getattr(client, "_transport", None)


def use_own_backend(
    pool: httpcore2.AsyncConnectionPool | None,
    *,
    stamped: bool,
    backend: httpcore2.AsyncNetworkBackend | None = None,
) -> bool:
    """Put :class:`~trio_sampler._network.TrioNetworkBackend` (or ``backend``) under a
    client's own connection pool (see :func:`own_pool`), for the connections it opens
    from now on.
    httpx2 does not take a network backend, so this sets the pool's (private) backend
    attribute, checked by type; anything else is left as it is (``False``)."""
    if pool is None or not isinstance(
        getattr(pool, "_network_backend", None), httpcore2.AsyncNetworkBackend
    ):
        return False
    pool._network_backend = backend if backend is not None else TrioNetworkBackend(stamped=stamped)
    return True


class _InFlight:
    """A request's place in its pool's count of requests in flight (``load[index]``),
    taken when made and given back at the first call. An object rather than a closure:
    the closure's function, cells and their tuple lived as long as the response (the
    collector's share)."""

    __slots__ = ("_index", "_load")

    def __init__(self, load: list[int], index: int) -> None:
        load[index] += 1
        self._load: list[int] | None = load
        self._index = index

    def __call__(self) -> None:
        load = self._load
        if load is not None:
            self._load = None
            load[self._index] -= 1


# -- bodies -------------------------------------------------------------------------------


class _DirectBody:
    """A response of the direct path: an ``httpcore2.Response``, its body's chunks as
    httpcore2 yields them (no layer added: a read failure is httpcore2's, which
    :meth:`read_failure` classifies)."""

    __slots__ = (
        "_closed",
        "_core",
        "_ended_at",
        "_release",
        "_stamped",
        "header_fields",
        "http_version",
        "request_sent_at",
        "status",
    )

    read_errors = _REQUEST_ERRORS

    def __init__(
        self,
        core: httpcore2.Response,
        request_sent_at: float | None,
        release: Callable[[], None],
    ) -> None:
        self._core = core
        self.status = core.status
        self.header_fields = header_fields(core.headers)
        version = core.extensions.get("http_version", b"HTTP/1.1")
        self.http_version = version.decode("ascii", errors="ignore")
        self.request_sent_at = request_sent_at
        self._stamped = self.http_version == "HTTP/1.1" and is_stamped(
            core.extensions.get("network_stream")
        )
        self._release = release
        self._closed = False
        self._ended_at: float | None = None

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._core.headers

    @property
    def reason_phrase(self) -> str:
        phrase = self._core.extensions.get("reason_phrase")
        if isinstance(phrase, bytes):
            return phrase.decode("ascii", errors="ignore")
        return httpx2.codes.get_reason_phrase(self.status)

    @property
    def received_at(self) -> float | None:
        return LAST_RECEIVED.get() if self._stamped else None

    @property
    def ended_at(self) -> float | None:
        return self._ended_at

    def chunks(self) -> AsyncIterator[bytes]:
        # An async pool's body is an async iterable (checked by type, not by ABC: that
        # costs microseconds per request).
        iterator = cast("AsyncIterable[bytes]", self._core.stream).__aiter__()
        if type(iterator) is AsyncGeneratorType:  # httpcore2's pool streams: no layer added
            return cast("AsyncGenerator[bytes, None]", iterator)
        return _chunks_of(iterator)

    @staticmethod
    def read_failure(exc: BaseException) -> SamplingClientError:
        return SamplingClientError(classify_transport_error(exc))

    def end_received(self, downloaded: int) -> bool:
        return self._ended_at is not None or end_received(
            self._core.stream, self.header_fields, downloaded
        )

    def socket_reads(self) -> SocketReads | None:
        return socket_reads(self._core.stream) if self.http_version == "HTTP/1.1" else None

    def ended(self) -> None:
        self._ended_at = trio.current_time()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._core.aclose()
        except _REQUEST_ERRORS as exc:
            raise SamplingClientError(classify_transport_error(exc)) from None
        finally:
            self._release()


async def _chunks_of(iterator: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    async for chunk in iterator:
        yield chunk


class _ViaHttpxBody(HttpxBody):
    """A response that took httpx2's way on this transport's pools: the end-of-body
    probe and the receive stamps apply to it too."""

    __slots__ = ("_release", "_stamped")

    def __init__(
        self, response: httpx2.Response, sent_at: float | None, release: Callable[[], None]
    ) -> None:
        super().__init__(response, sent_at)
        self._release = release
        self._stamped = response.http_version == "HTTP/1.1" and is_stamped(
            response.extensions.get("network_stream")
        )

    @property
    def received_at(self) -> float | None:
        return LAST_RECEIVED.get() if self._stamped else None

    def end_received(self, downloaded: int) -> bool:
        return super().end_received(downloaded) or end_received(
            self._response.stream, self.header_fields, downloaded
        )

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            release, self._release = self._release, _nothing
            release()


def _nothing() -> None:
    pass


# -- the transport --------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _Address:
    """One address (base URL, path, query) as requests to it are sent."""

    url: httpx2.URL
    #: Its ``Host`` header value.
    host: bytes
    #: The URL as httpcore2 takes it, when requests to it may take the direct path (it
    #: goes to the client's own pool, not to a proxy mounted for it); else ``None``.
    direct: httpcore2.URL | None


class DirectTransport:
    """The network, through httpcore2's pools (see module). A request goes to the pool
    with the fewest streams in flight: one pool serving thousands of concurrent streams
    spends its time in bookkeeping (httpcore scans every connection on each request start
    and end: measured in ``docs/benchmarks-actor.md``); ``config.connection_pools`` pools
    of fewer streams each do not."""

    def __init__(
        self,
        config: SamplerConfig,
        *,
        network_backend: httpcore2.AsyncNetworkBackend | None = None,
    ) -> None:
        """``network_backend``: where the pools' connections come from (an
        ``httpcore2`` network backend); by default TCP and TLS through
        :class:`~trio_sampler._network.TrioNetworkBackend`. Another one (connections in
        memory, for tests under the mock clock) changes where the bytes come from and
        nothing else."""
        # One TLS context for every pool: building one loads the CA store (about 20 ms),
        # and httpx2 would otherwise build one per pool. ``create_ssl_context`` is what
        # httpx2 itself uses for ``verify=True`` (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``).
        verify = httpx2.create_ssl_context()
        shards = config.connection_pools
        self._clients = [client_for(config, verify=verify) for _ in range(shards)]
        self._pools = [own_pool(client) for client in self._clients]
        stamped = config.receive_timestamps
        own = [
            use_own_backend(pool, stamped=stamped, backend=network_backend) for pool in self._pools
        ]
        # Kept open while the transport is, so the kernel stamps from the first read on.
        self._release_kernel_timestamps: Callable[[], object] | None = None
        if stamped:
            holder = hold_kernel_timestamps() if all(own) else None
            if holder is not None:
                self._release_kernel_timestamps = weakref.finalize(self, holder.close)
        self._in_flight = [0] * shards
        #: Requests resent at once because their connection refused the first write
        #: whole (the keep-alive race at its narrowest); never visible as a retry.
        self.stale_connection_resends = 0
        #: The clients' default headers (all clients alike), by lowercase name, as bytes.
        self._default_headers = {
            name.decode("latin-1").lower(): (name, value)
            for name, value in self._clients[0].headers.raw
        }
        self._urls: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Address] = {}

    @property
    def cookies(self) -> httpx2.Cookies:
        """The cookie jar every pool's requests share (httpx2's)."""
        return self._clients[0].cookies

    @property
    def pools(self) -> int:
        return len(self._clients)

    @property
    def in_flight(self) -> list[int]:
        """Per pool, the exchanges open on it now."""
        return list(self._in_flight)

    def takes_direct_path(
        self, base_url: str, path: str, params: tuple[tuple[str, str], ...] = ()
    ) -> bool:
        """Whether a POST to ``base_url/path?params`` (no cookie, no header httpx2 sets
        itself) is handed to httpcore2's pool directly."""
        probe = HttpRequest("POST", base_url, path, params, _NO_HEADERS, b"")
        return self._url(probe).direct is not None

    async def aclose(self) -> None:
        try:
            with trio.CancelScope(shield=True, relative_deadline=CLOSE_TIMEOUT):
                for client in self._clients:
                    await client.aclose()
        finally:
            if self._release_kernel_timestamps is not None:
                self._release_kernel_timestamps()

    async def open(self, request: HttpRequest) -> Body:
        load = self._in_flight
        index = load.index(min(load)) if len(load) > 1 else 0
        try:
            built = self.build(request)
        except (httpx2.HTTPError, httpx2.InvalidURL, UnicodeError) as exc:
            raise SamplingClientError(unbuildable(exc)) from None
        release = _InFlight(load, index)
        started = trio.current_time()
        try:
            response, sent_at = await self._send_resending_unwritten(index, built)
        except BaseException as exc:
            release()
            if isinstance(exc, _CONNECT_TIMEOUTS):
                connect = request.headers.timeout.get("connect") or 0.0
                raise timeout_error("connect", "no connection", connect) from None
            if isinstance(exc, _READ_TIMEOUTS):
                waited = trio.current_time() - started
                raise timeout_error("response headers", "no response headers", waited) from None
            if isinstance(exc, _REQUEST_ERRORS):
                # Not chained: an httpx exception holds the request, and it the key.
                raise SamplingClientError(classify_transport_error(exc)) from None
            raise
        if isinstance(response, httpx2.Response):
            return _ViaHttpxBody(response, sent_at, release)
        assert isinstance(built, httpcore2.Request)  # a direct response: a direct request
        return self._direct_body(built, response, sent_at, release)

    def _direct_body(
        self,
        request: httpcore2.Request,
        response: httpcore2.Response,
        sent_at: float | None,
        release: Callable[[], None],
    ) -> _DirectBody:
        body = _DirectBody(response, sent_at, release)
        # What httpx2 does with a response once it has one: keep its cookies, log it.
        fields = body.header_fields
        if "set-cookie" in fields:
            url = bytes(request.url).decode("ascii")
            self._clients[0].cookies.extract_cookies(
                httpx2.Response(
                    body.status,
                    headers=list(response.headers),
                    request=httpx2.Request("POST", url),
                )
            )
        if _log.isEnabledFor(logging.INFO):
            _log.info(
                'HTTP Request: %s %s "%s %d %s"',
                "POST",
                bytes(request.url).decode("ascii"),
                body.http_version,
                body.status,
                body.reason_phrase,
            )
        return body

    def build(self, request: HttpRequest) -> httpx2.Request | httpcore2.Request:
        """The ``httpcore2.Request`` httpx2's transport would make of ``request`` when it
        may take the direct path (see module); else httpx2's own request."""
        client = self._clients[0]
        headers = request.headers
        address = self._url(request)
        memo = headers.memo.get(self)
        if memo is None:
            # The client's default headers we did not set, in front (as httpx2 merges),
            # and whether a header httpx2 adds itself is among them.
            memo = headers.memo[self] = (
                [
                    *(p for key, p in self._default_headers.items() if key not in headers.names),
                    *headers.fields,
                ],
                not _USER_AGENT_DEFAULTS.isdisjoint(headers.names),
            )
        merged, sets_own = cast("tuple[list[tuple[bytes, bytes]], bool]", memo)
        extensions = {"timeout": dict(headers.timeout)}
        if address.direct is None or len(client.cookies) or request.method != "POST" or sets_own:
            # A proxy, cookies to send, a header httpx2 adds itself, or a method whose
            # empty body it sends without a Content-Length: its way.
            return client.build_request(
                request.method,
                address.url,
                headers=merged,
                content=request.body,
                extensions=extensions,
            )
        direct = httpcore2.Request(
            b"POST", address.direct, content=request.body, extensions=extensions
        )
        # Bytes already: not checked header by header again.
        direct.headers = [
            (b"Host", address.host),
            *merged,
            (b"Content-Length", b"%d" % len(request.body)),
        ]
        return direct

    def _url(self, request: HttpRequest) -> _Address:
        """``base_url/path?params`` parsed, with its ``Host`` header value and whether it
        may take the direct path; cached per address (a few per sampler; bounded anyway)."""
        key = (request.base_url, request.path, request.params)
        found = self._urls.get(key)
        if found is None:
            if len(self._urls) >= _MAX_CACHED_URLS:
                self._urls.clear()
            url = httpx2.URL(request.url, params=list(request.params) or None)
            direct = None
            if self._pools[0] is not None and to_own_pool(self._clients[0], url):
                direct = httpcore2.URL(
                    scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
                )
            found = self._urls[key] = _Address(url, url.netloc, direct)
        return found

    async def _send_resending_unwritten(
        self, index: int, request: httpx2.Request | httpcore2.Request
    ) -> tuple[httpx2.Response | httpcore2.Response, float | None]:
        """Send on pool ``index``, resending at once only a request that provably did not
        reach the server.

        **The resend rule.** A request is sent again without the caller seeing it only
        when its connection failed before any byte of it was written: a reused
        connection that the server had already closed refused the request's first write
        whole. The pools' connections record that for the task sending the request, in
        the :class:`~trio_sampler._network.Exchange` put in ``EXCHANGE`` here (opened
        for it or reused, ``unwritten``, when its last byte was written). Anything else
        that fails before a response head (the server read the request and closed or
        reset the connection, after none or some of a head's bytes) may have reached
        the server: it is raised, and the actor makes it a visible attempt
        (``Retrying``, an ``AttemptRecord``, a retry spent), or no retry at all for a
        request that must not be repeated. Bounded by :data:`STALE_CONNECTION_RESENDS`.

        Through another network backend (a test's in-memory connections) or a proxy
        httpx2 mounted, nothing records the exchange: such a request is never resent,
        and when it was sent is not known.
        """
        resends = 0
        while True:
            exchange = Exchange()
            recording = EXCHANGE.set(exchange)
            try:
                if isinstance(request, httpx2.Request):
                    response: httpx2.Response | httpcore2.Response = await self._clients[
                        index
                    ].send(request, stream=True)
                else:
                    pool = self._pools[index]
                    assert pool is not None  # a direct request is only built for one
                    response = await pool.handle_async_request(request)
                return response, exchange.sent_at
            except _BROKEN_CONNECTION_ERRORS:
                reused = not exchange.connected
                if not (reused and exchange.unwritten) or resends >= STALE_CONNECTION_RESENDS:
                    raise
            finally:
                EXCHANGE.reset(recording)
            resends += 1
            self.stale_connection_resends += 1
