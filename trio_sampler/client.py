"""The only module that does network I/O: POST a rendered request, hand back body bytes.

:class:`SamplingClient` owns one ``httpx2.AsyncClient``. :meth:`SamplingClient.open_stream`
turns a non-2xx status into a classified :class:`SamplingClientError` *before* any stream
exists, and otherwise yields raw body chunks as they arrive (``aiter_raw``: the SSE decoder
works on bytes). Every failure leaves as a :class:`SamplingClientError` carrying a
:class:`SamplingErrorInfo`; trio cancellation passes through untouched.

Security properties (design §4.7):

* The key is read from the config's :class:`~trio_sampler.config.Secret` only when headers
  are built, and no exception raised here contains it: httpx exceptions (which hold the
  request and its headers) are replaced, not chained, and every
  :class:`SamplingClientError` is scrubbed of the exact credentials of its request (any
  form; see ``trio_sampler._redact``).
* While the client is open, a logging filter scrubs the records of the ``trio_sampler``,
  ``httpx2``, ``httpcore2`` and ``hpack`` loggers the same way (httpx2 logs every URL at INFO,
  httpcore2 raw response headers at DEBUG, hpack, under HTTP/2, each request header it
  encodes at DEBUG); :meth:`SamplingClient.aclose` removes it.
* Redirects are never followed: a 3xx is an error, so credentials never go to another host.
* Streams ask for ``accept-encoding: identity``: a compressed body could expand a few KiB
  into gigabytes (a gzip bomb) inside the HTTP library, before our size cap sees it. A
  server that compresses anyway is decoded here, incrementally and under the same cap.
"""

from __future__ import annotations

import importlib.util
import logging
import weakref
import zlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, aclosing
from types import AsyncGeneratorType, TracebackType
from typing import Any, TypeAlias, cast

import attrs
import httpcore2
import httpx2
import trio

from ._by_identity import ByIdentity
from ._network import TrioNetworkBackend, is_stamped
from ._receive_time import LAST_RECEIVED, LAST_SENT, hold_kernel_timestamps
from ._redact import RedactingFilter, Redactor, install_log_filter, redactor_for
from .config import SamplerConfig
from .providers import AuthScheme
from .types import SamplingErrorInfo, SamplingErrorKind
from .wire._request import WireRequest
from .wire.errors import classify_http_error, classify_transport_error

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "STALE_CONNECTION_RESENDS",
    "ResponseStream",
    "SamplingClient",
    "SamplingClientError",
]

#: A non-2xx body is read up to this many bytes for classification, no more.
MAX_ERROR_BODY_BYTES = 64 * 1024
# Closing a response is local (socket close, or an h2 RST_STREAM); bound it anyway so a
# cancelled request never waits on the network while shielded.
_CLOSE_TIMEOUT = 5.0
#: A request that failed on a reused connection before any response arrived is resent at
#: once, at most this many times (each failure closes the connection it was sent on).
STALE_CONNECTION_RESENDS = 3
# The failures a server's close of an idle pooled connection shows as: its FIN (nothing
# to read: "Server disconnected without sending a response"), its RST, or a failed write.
_STALE_CONNECTION_ERRORS = (
    httpx2.RemoteProtocolError,
    httpx2.ReadError,
    httpx2.WriteError,
    httpcore2.RemoteProtocolError,
    httpcore2.ReadError,
    httpcore2.WriteError,
)
#: What a failed exchange raises: httpx2's errors, or on the direct path (see
#: :class:`SamplingClient`) httpcore2's own, which httpx2 would have mapped to the
#: httpx2 errors of the same names (``classify_transport_error`` reads the names).
_REQUEST_ERRORS = (
    httpx2.RequestError,
    httpcore2.TimeoutException,
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.ProxyError,
    httpcore2.UnsupportedProtocol,
)
#: The direct path's request line, as httpx2 logs it for the requests it sends.
_log = logging.getLogger("trio_sampler.http")

_USER_AGENT = f"trio-sampler/0.1 httpx2/{httpx2.__version__}"
_MAX_CACHED_URLS = 64


class SamplingClientError(Exception):
    """A request failed before or while its body was read. ``info`` says how.

    ``str()`` is ``str(info)``: kind, status and a scrubbed, user-facing message.
    """

    def __init__(self, info: SamplingErrorInfo) -> None:
        super().__init__(str(info))
        self.info = info

    @property
    def kind(self) -> SamplingErrorKind:
        return self.info.kind


def _h2_available() -> bool:
    return importlib.util.find_spec("h2") is not None


async def _already_read(content: bytes) -> AsyncGenerator[bytes, None]:
    yield content


def _signed(
    wire: WireRequest, url: str, fields: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """``fields`` with the SigV4 headers of this request added (the ``bedrock`` extra)."""
    from . import _sigv4

    headers = [(name.decode("ascii"), value.decode("ascii")) for name, value in fields]
    try:
        added = _sigv4.sign(wire.method, url, headers, wire.body)
    except ValueError as exc:  # no credentials or region: the message says what to set
        raise SamplingClientError(
            SamplingErrorInfo(kind=SamplingErrorKind.AUTH, message=str(exc))
        ) from None
    return [*fields, *((n.encode("ascii"), v.encode("ascii")) for n, v in added)]


def _header_fields(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
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


class _CoreResponse:
    """An ``httpcore2.Response`` from the direct path (see :class:`SamplingClient`), as
    this module reads a response: the part of ``httpx2.Response`` it uses, with the same
    meanings (``http_version`` a ``str``, ``headers`` an ``httpx2.Headers``), and no
    wrapper around the body, whose chunks come from httpcore2 as they are.

    ``fields`` holds the headers as :func:`_header_fields` gives them, read by this module
    on every request; the ``httpx2.Headers`` is built only when something asks for it."""

    __slots__ = (
        "_core",
        "_headers",
        "extensions",
        "fields",
        "http_version",
        "is_closed",
        "status_code",
    )

    def __init__(self, core: httpcore2.Response) -> None:
        self._core = core
        self.status_code = core.status
        self._headers: httpx2.Headers | None = None
        self.fields = _header_fields(core.headers)
        self.extensions = core.extensions
        version = core.extensions.get("http_version", b"HTTP/1.1")
        self.http_version = version.decode("ascii", errors="ignore")
        self.is_closed = False

    @property
    def headers(self) -> httpx2.Headers:
        if self._headers is None:
            self._headers = httpx2.Headers(self._core.headers)
        return self._headers

    @property
    def stream(self) -> object:
        return self._core.stream

    @property
    def reason_phrase(self) -> str:
        phrase = self.extensions.get("reason_phrase")
        if isinstance(phrase, bytes):
            return phrase.decode("ascii", errors="ignore")
        return httpx2.codes.get_reason_phrase(self.status_code)

    def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        # An async pool's body is an async iterable (checked by type, not by ABC: that
        # costs microseconds per request).
        iterator = cast("AsyncIterable[bytes]", self._core.stream).__aiter__()
        if type(iterator) is AsyncGeneratorType:  # httpcore2's pool streams: no layer added
            return cast("AsyncGenerator[bytes, None]", iterator)
        return _chunks_of(iterator)

    async def aclose(self) -> None:
        if not self.is_closed:
            self.is_closed = True
            await self._core.aclose()


async def _chunks_of(iterator: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    async for chunk in iterator:
        yield chunk


_AnyResponse: TypeAlias = "httpx2.Response | _CoreResponse"


def _fields(response: _AnyResponse) -> Mapping[str, str]:
    """``response``'s headers, names lower-cased (see :func:`_header_fields`)."""
    if type(response) is _CoreResponse:
        return response.fields
    return response.headers


def _raw_chunks(response: _AnyResponse) -> AsyncGenerator[bytes, None]:
    """The undecoded body. A response whose body was read before it reached us (mock
    transports built with ``content=``/``json=``) is replayed from memory."""
    if type(response) is httpx2.Response and response.is_stream_consumed:
        try:
            return _already_read(response.content)
        except httpx2.ResponseNotRead:
            pass
    return response.aiter_raw()


#: What is left unparsed on an HTTP/1.1 connection once a chunked body's last data chunk
#: was read and only its end follows: the data chunk's CRLF, the last chunk (size 0) and
#: the empty trailer section.
_CHUNKED_END = b"\r\n0\r\n\r\n"
#: The objects between a response's body and its HTTP/1.1 connection's h11 state, as
#: ``(attribute, class name of the object it holds)``: from an ``httpx2.Response`` of the
#: default transport to httpcore2's pool stream (:data:`_TO_POOL_STREAM`; a
#: :class:`_CoreResponse`'s body is that stream), then on to h11 (:data:`_POOL_TO_H11`).
#: httpcore2 keeps them private, so each step is checked and anything else (another
#: transport, HTTP/2, a changed httpcore2) has no answer.
_TO_POOL_STREAM = (
    ("_stream", "AsyncResponseStream"),  # httpx2's BoundAsyncStream
    ("_httpcore_stream", "PoolByteStream"),  # httpx2's transport stream
)
_POOL_TO_H11 = (
    ("_stream", "HTTP11ConnectionByteStream"),  # httpcore2's pool stream
    ("_connection", "AsyncHTTP11Connection"),
    ("_h11_state", "Connection"),  # h11's
)


def _end_received(response: _AnyResponse, downloaded: int) -> bool:
    """Whether the rest of ``response``'s body has arrived already, so that reading it to
    its end waits for nothing: only what h11 holds unparsed on the connection can say,
    and only for HTTP/1.1 over httpcore2's pool (anything else answers ``False``).
    ``downloaded``: the body's bytes read so far, undecoded.

    The body's end is next when nothing is left of a ``content-length`` body, or when
    what is left unparsed of a chunked one is exactly the last chunk (h11 takes every
    byte of a data chunk that has arrived, so bytes left over mean that chunk ended)."""
    node: object = response.stream
    steps = (
        _POOL_TO_H11 if type(node).__name__ == "PoolByteStream" else _TO_POOL_STREAM + _POOL_TO_H11
    )
    for attribute, class_name in steps:
        node = getattr(node, attribute, None)
        if type(node).__name__ != class_name:
            return False
    unparsed = getattr(node, "trailing_data", None)
    if not isinstance(unparsed, tuple) or not isinstance(unparsed[0], bytes):
        return False
    headers = _fields(response)
    length = headers.get("content-length")
    if length is not None:
        return unparsed[0] == b"" and length.isdigit() and int(length) == downloaded
    return unparsed[0] == _CHUNKED_END and "chunked" in headers.get("transfer-encoding", "")


def _too_large(limit: int) -> SamplingClientError:
    # HTTP, not PAYLOAD_TOO_LARGE: that kind means *our request* was too large (and makes
    # the actor strip images). A server sending an endless body is a broken exchange,
    # and sending the same request again would most likely do the same.
    return SamplingClientError(
        SamplingErrorInfo(
            kind=SamplingErrorKind.HTTP,
            message=(
                f"the response body exceeded max_response_bytes ({limit} bytes); "
                "raise SamplerConfig.max_response_bytes if this is expected"
            ),
            retryable=False,
            error_code="response_too_large",
        )
    )


#: A compressed body is inflated at most this much at a time: a few KiB of gzip can
#: expand into the whole ``max_response_bytes``, which must never exist at once.
INFLATE_STEP_BYTES = 256 * 1024


class _BodyDecoder:
    """Counts body bytes against a limit, and undoes gzip/deflate if the server applied it
    despite ``accept-encoding: identity``, never producing more than the limit, and never
    more than :data:`INFLATE_STEP_BYTES` per call (the rest waits: :attr:`pending`)."""

    def __init__(self, content_encoding: str, limit: int) -> None:
        self._limit = limit
        self._seen = 0
        encoding = content_encoding.strip().lower()
        self._zlib: zlib._Decompress | None = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._zlib = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # gzip or zlib header
        elif encoding not in ("", "identity"):
            raise SamplingClientError(
                SamplingErrorInfo(
                    kind=SamplingErrorKind.HTTP,
                    message=(
                        f"the server sent a {encoding!r}-encoded body although the request "
                        "asked for identity; only gzip and deflate can be decoded"
                    ),
                )
            )

    @property
    def pending(self) -> bool:
        """Compressed input is left from the last call: call :meth:`feed` with ``b""``
        before feeding the next chunk."""
        return self._zlib is not None and bool(self._zlib.unconsumed_tail)

    def feed(self, chunk: bytes) -> bytes:
        if self._zlib is not None:
            if self._zlib.unconsumed_tail:
                chunk = self._zlib.unconsumed_tail + chunk
            try:
                chunk = self._zlib.decompress(
                    chunk, min(INFLATE_STEP_BYTES, self._limit - self._seen + 1)
                )
            except zlib.error:
                raise SamplingClientError(
                    SamplingErrorInfo(
                        kind=SamplingErrorKind.SERIALIZATION,
                        message="the compressed response body is corrupt",
                        retryable=True,
                    )
                ) from None
        self._seen += len(chunk)
        if self._seen > self._limit:
            raise _too_large(self._limit)
        return chunk


class ResponseStream:
    """A response whose status was 2xx and whose body is still to be read.

    ``async for chunk in stream`` (or ``stream.iter_bytes()``) yields body chunks as they
    arrive, at most ``max_response_bytes`` in all. Read failures raise
    :class:`SamplingClientError` (a read timeout is ``IDLE_TIMEOUT``). The response is
    closed when the :meth:`SamplingClient.open_stream` block exits.
    """

    def __init__(
        self, response: _AnyResponse, max_bytes: int, request_sent_at: float | None = None
    ) -> None:
        self._response = response
        # This response's reads are timed by their bytes' arrival (and, HTTP/1.1, each
        # read runs in the task reading the response): see ``received_at``.
        self._stamped = response.http_version == "HTTP/1.1" and is_stamped(
            response.extensions.get("network_stream")
        )
        #: When the request's last byte was written to its connection
        #: (``trio.current_time()``; ``None`` when the transport does not say: a mock, the
        #: in-memory emulator).
        self.request_sent_at = request_sent_at
        self._raw: AsyncGenerator[bytes, None] | None = None
        self._decoder = _BodyDecoder(_fields(response).get("content-encoding", ""), max_bytes)
        #: The body's bytes read so far, undecoded.
        self._downloaded = 0
        #: The body was read to its end (and the response closed then).
        self._ended = False
        #: Taken out of its ``open_stream`` block (:meth:`detach`): the block leaves it open.
        self.detached = False

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def received_at(self) -> float | None:
        """When the bytes of the last read of this response arrived (trio's clock), if its
        reads are timed so (``SamplerConfig.receive_timestamps``, over HTTP/1.1); else
        ``None``. Read it in the task that reads the response, after a read."""
        return LAST_RECEIVED.get() if self._stamped else None

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers, case-insensitive."""
        return self._response.headers

    @property
    def header_fields(self) -> Mapping[str, str]:
        """The response headers with their names lower-cased, the values of a repeated
        name joined with ``", "`` (as ``dict(headers.items())``): what the library reads
        them as (over the direct path, read once per response)."""
        response = self._response
        if type(response) is _CoreResponse:
            return response.fields
        return dict(response.headers.items())

    @property
    def request_id(self) -> str | None:
        """The provider's request id (``x-request-id`` or ``request-id``)."""
        headers = _fields(self._response)
        return headers.get("x-request-id") or headers.get("request-id")

    def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk (the same iterator as ``async for`` on the stream)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._raw is None:
            self._raw = _raw_chunks(self._response)
        while True:
            if self._decoder.pending:
                await trio.lowlevel.checkpoint()  # inflating is work: let others run
                chunk = b""
            else:
                try:
                    chunk = await self._raw.__anext__()
                except StopAsyncIteration:
                    self._ended = True
                    if not self._response.is_closed:
                        await self._close_ended()
                    raise
                except _REQUEST_ERRORS as exc:
                    raise SamplingClientError(classify_transport_error(exc)) from None
                except httpx2.StreamError:
                    raise StopAsyncIteration from None  # closed: the block has exited
                self._downloaded += len(chunk)
            decoded = self._decoder.feed(chunk)
            if decoded:
                return decoded

    async def _close_ended(self) -> None:
        # httpx2 closes a response read to its end (giving its connection back to the
        # pool); a direct one is closed here, the same way.
        try:
            await self._response.aclose()
        except _REQUEST_ERRORS as exc:
            raise SamplingClientError(classify_transport_error(exc)) from None

    def end_received(self) -> bool:
        """Whether what is left of the body has arrived already: :meth:`drain` would read
        it to its end without waiting for the network (HTTP/1.1 only; otherwise
        ``False``). The decoder's pending inflation, if any, is local work too."""
        return self._ended or _end_received(self._response, self._downloaded)

    def detach(self) -> ResponseStream:
        """Take the response out of its :meth:`SamplingClient.open_stream` block: leaving
        the block no longer closes it, and the caller must (:meth:`drain` what is left,
        then :meth:`aclose`). For reading the end of a body in another task."""
        self.detached = True
        return self

    async def drain(self, *, max_bytes: int) -> None:
        """Read what is left of the body, at most ``max_bytes``, without a time bound
        (the caller's scope is one); a read failure only ends it. The response stays open:
        :meth:`aclose` it (which returns the connection to the pool if the body ended)."""
        try:
            left = max_bytes
            while left > 0:
                left -= len(await self.__anext__())
        except (StopAsyncIteration, SamplingClientError):
            pass  # the end of the body, or a connection that will not be reused

    async def aclose(self) -> None:
        """Close the response (and its connection, if the body is unfinished). Idempotent."""
        if self._ended and self._response.is_closed:
            return  # read to its end: closed then, the connection given back
        with trio.CancelScope(shield=True, relative_deadline=_CLOSE_TIMEOUT):
            raw = self._raw
            if raw is not None:
                await raw.aclose()
            await self._response.aclose()


class _ConnectionTrace:
    """An httpcore ``trace`` extension: was the request sent on a reused connection, and
    when was its last byte written?

    Reused when httpcore sent it over HTTP/1.1 or HTTP/2 without first opening a
    connection for it. ``sent_at`` is when httpcore handed the request's last byte to the
    connection (the end of its ``send_request_body`` step): the write's own time on the
    client's own connections (they time their writes, ``trio_sampler._network``), else
    the time at that step, a schedule point after the write. A transport that is not
    httpcore's (a mock, the in-memory emulator) emits no events: its requests count as
    not reused, and ``sent_at`` stays ``None``.

    Once the body is sent both answers are known, and the trace takes itself out of the
    request's extensions (httpcore reads them at each step): the rest of the exchange (the
    response, the close) is not traced at all."""

    __slots__ = ("_extensions", "_started_at", "connected", "sent", "sent_at")

    def __init__(self, extensions: MutableMapping[str, Any]) -> None:
        self._extensions = extensions
        self.connected = False
        self.sent = False
        self.sent_at: float | None = None
        self._started_at = 0.0

    @property
    def reused(self) -> bool:
        return self.sent and not self.connected

    async def __call__(self, event: str, info: object) -> None:
        if event.endswith("send_request_body.complete"):  # http11. or http2.
            # The client's own connections time their writes; else now, a schedule
            # point after the write.
            written = LAST_SENT.get()
            if written is None or written < self._started_at:  # not this request's write
                written = trio.current_time()
            self.sent_at = written
            if self._extensions.get("trace") is self:
                del self._extensions["trace"]
        elif event.startswith("connection.connect_"):  # connect_tcp, connect_unix_socket
            self.connected = True
        elif event.startswith(("http11.send_request_headers", "http2.send_request_headers")):
            if not self.sent:
                self._started_at = trio.current_time()
            self.sent = True


def _own_pool(client: httpx2.AsyncClient) -> httpcore2.AsyncConnectionPool | None:
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


def _to_own_pool(client: httpx2.AsyncClient, url: httpx2.URL) -> bool:
    """Whether httpx2 would send a request for ``url`` through ``client``'s own default
    transport (not through a proxy it mounted from the environment for it)."""
    choose = getattr(client, "_transport_for_url", None)
    return callable(choose) and choose(url) is getattr(client, "_transport", None)


def _use_own_backend(pool: httpcore2.AsyncConnectionPool | None, *, stamped: bool) -> bool:
    """Put :class:`~trio_sampler._network.TrioNetworkBackend` under a client's own
    connection pool (see :func:`_own_pool`), for the connections it opens from now on:
    a request in one write, and with ``stamped`` reads timed by their bytes' arrival.
    httpx2 does not take a network backend, so this sets the pool's (private) backend
    attribute, checked by type; anything else is left as it is (``False``)."""
    if pool is None or not isinstance(
        getattr(pool, "_network_backend", None), httpcore2.AsyncNetworkBackend
    ):
        return False
    pool._network_backend = TrioNetworkBackend(stamped=stamped)
    return True


class _BorrowedTransport(httpx2.AsyncBaseTransport):
    """A transport the caller owns: requests go through, closing is left to the caller
    (``httpx2.AsyncClient.aclose`` would otherwise close it, possibly from the wrong task
    or cancel scope, e.g. an ``EmulatorTransport`` that holds a nursery)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


_IDENTITY = (b"accept-encoding", b"identity")
#: Headers ``httpx2.Request(content=...)`` adds itself unless they are given.
_AUTO_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})


@attrs.frozen(eq=False)
class _Address:
    """One address (base URL, path, query) as requests to it are sent."""

    url: httpx2.URL
    #: Its ``Host`` header value.
    host: bytes
    #: The URL as httpcore2 takes it, when requests to it may take the direct path (it
    #: goes to the client's own pool, not to a proxy mounted for it); else ``None``.
    direct: httpcore2.URL | None


@attrs.frozen(eq=False)
class _Prepared:
    """What every request of one config and header set carries (its own headers last):
    the headers as httpx2 would send them, as bytes, and the timeouts."""

    #: The request's headers but ``Host`` and ``Content-Length``: the client's default
    #: headers it does not set, in front, then its own.
    fields: list[tuple[bytes, bytes]]
    #: A header httpx2 adds itself is among them (``Host``, ``Content-Length``, ...).
    sets_own: bool
    timeout: dict[str, float | None]


def _unbuildable(exc: Exception) -> SamplingErrorInfo:
    return SamplingErrorInfo(
        kind=SamplingErrorKind.INVALID_REQUEST,
        message=f"the request could not be built ({type(exc).__name__}): check "
        "base_url, wire.path and header values (ASCII only)",
    )


class _Exchange:
    """:meth:`SamplingClient._exchange`'s context manager, written out (a generator-based
    one costs microseconds per request to enter and leave).

    Entering sends on the pool with the fewest streams in flight (counted until the
    exchange ends), checks the status and returns the body; a failure on the way closes
    the response. Leaving closes the body unless it was detached. A
    :class:`SamplingClientError` raised while entering, in the block or while closing
    leaves scrubbed of the request's credentials."""

    __slots__ = (
        "_body",
        "_client",
        "_config",
        "_headers_timeout",
        "_index",
        "_redactor",
        "_stream",
        "_wire",
    )

    def __init__(
        self,
        client: SamplingClient,
        wire: WireRequest,
        config: SamplerConfig,
        stream: bool,
        headers_timeout: float,
    ) -> None:
        self._client = client
        self._wire = wire
        self._config = config
        self._stream = stream
        self._headers_timeout = headers_timeout
        self._redactor: Redactor | None = None
        self._body: ResponseStream | None = None
        self._index = 0

    async def __aenter__(self) -> ResponseStream:
        client = self._client
        config = self._config
        redactor = self._redactor = client._request_redactor(config, self._wire.headers)
        client._log_filter.add(redactor)
        try:
            request = client._build(self._wire, config, stream=self._stream)
            load = client._in_flight
            index = load.index(min(load)) if len(load) > 1 else 0
            load[index] += 1
            try:
                response, sent_at = await client._send(index, request, self._headers_timeout)
                try:
                    await client._raise_for_status(response, config.timeouts.response_headers)
                    body = ResponseStream(response, config.max_response_bytes, sent_at)
                except BaseException:
                    with trio.CancelScope(shield=True, relative_deadline=_CLOSE_TIMEOUT):
                        await response.aclose()
                    raise
            except BaseException:
                load[index] -= 1
                raise
        except SamplingClientError as exc:
            raise SamplingClientError(redactor.error(exc.info)) from None
        self._index = index
        self._body = body
        return body

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        body = self._body
        redactor = self._redactor
        assert body is not None and redactor is not None  # only left once entered
        try:
            try:
                if not body.detached:
                    await body.aclose()
            finally:
                self._client._in_flight[self._index] -= 1
        except SamplingClientError as error:
            raise SamplingClientError(redactor.error(error.info)) from None
        if isinstance(exc, SamplingClientError):
            raise SamplingClientError(redactor.error(exc.info)) from None


class SamplingClient:
    """The HTTP side of an actor: a few connection pools shared by all its requests.

    A stream goes to the pool with the fewest streams in flight. One pool serving
    thousands of concurrent streams spends its time in bookkeeping (httpcore scans every
    connection on each request start and end: measured in ``docs/benchmarks-actor.md``);
    ``config.connection_pools`` pools of fewer streams each do not.

    Usable as ``async with SamplingClient(config) as client:``. ``config`` supplies the
    pool and timeout settings; each call may pass another ``config`` (a newer snapshot
    after ``UpdateConfig``) for its URL, headers, timeouts and limits.

    ``transport`` replaces the network (``httpx2.MockTransport``, the emulator's
    ``EmulatorTransport``); pool and HTTP/2 settings then do not apply, and the transport
    stays the caller's to close.

    **The direct path.** Each pool is an ``httpx2.AsyncClient``, and httpx2 builds the
    client's settings (TLS, limits, HTTP/2, proxies from the environment) into
    ``httpcore2`` connection pools. A request that needs nothing of httpx2 beyond them
    (a POST whose URL goes to the client's own pool rather than a proxy, no cookie in the
    jar) is handed to that ``httpcore2`` pool directly, as httpx2 would hand it: the
    same headers in the same order, the same timeouts and trace, the same connection. It
    skips httpx2's layers around the exchange and around every body chunk (about 0.25 ms
    of CPU per 200-chunk stream: ``docs/benchmarks-actor.md``). httpcore2's errors are
    classified as the httpx2 errors of the same names would be; a ``Set-Cookie`` is kept
    in the client's jar as httpx2 would keep it (so later requests to its domain take
    httpx2's path, which sends it); the request line httpx2 logs at INFO is logged by the
    ``trio_sampler.http`` logger, the same text. Any other request (and every request
    over a ``transport`` of the caller's) goes through ``httpx2.AsyncClient.send``.
    """

    def __init__(
        self, config: SamplerConfig, *, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        self._config = config
        # With a transport of the caller's (tests, the in-memory emulator) one pool is
        # enough: there is no socket pool to spread.
        shards = 1 if transport is not None else config.connection_pools
        # One TLS context for every pool: building one loads the CA store (about 20 ms),
        # and httpx2 would otherwise build one per pool (16 loads by default, measured 320 ms
        # of startup). ``create_ssl_context`` is what httpx2 itself uses for ``verify=True``
        # (system store, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured).
        verify = httpx2.create_ssl_context() if transport is None else True
        self._clients = [
            httpx2.AsyncClient(
                verify=verify,
                transport=None if transport is None else _BorrowedTransport(transport),
                # The actor bounds concurrency; a pool cap would queue streams invisibly
                # and a pool timeout would fail them (trio-notes A.12).
                limits=httpx2.Limits(
                    max_connections=None,
                    max_keepalive_connections=config.max_keepalive_connections,
                ),
                timeout=self._timeout(config),
                follow_redirects=False,
                http2=config.http2 and _h2_available(),
            )
            for _ in range(shards)
        ]
        #: Per pool, the ``httpcore2`` pool of the direct path (``None``: not taken).
        self._pools = [
            None if transport is not None else _own_pool(client) for client in self._clients
        ]
        # Kept open while the client is, so the kernel stamps from the first read on;
        # closed by ``aclose``, or when a client that was never closed is collected.
        self._release_kernel_timestamps: Callable[[], object] | None = None
        stamped = transport is None and config.receive_timestamps
        own = [_use_own_backend(pool, stamped=stamped) for pool in self._pools]
        if stamped:
            holder = hold_kernel_timestamps() if all(own) else None
            if holder is not None:
                self._release_kernel_timestamps = weakref.finalize(self, holder.close)
        self._in_flight = [0] * shards
        #: Requests resent at once because a reused connection turned out to be closed
        #: by the server (the keep-alive race); never visible as a retry.
        self.stale_connection_resends = 0
        #: The clients' default headers (all clients alike), by lowercase name, as bytes.
        self._default_headers = {
            name.decode("latin-1").lower(): (name, value)
            for name, value in self._clients[0].headers.raw
        }
        self._urls: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Address] = {}
        #: Per config, streaming or not and header set: what its requests carry.
        self._prepared_by_config: ByIdentity[_Prepared] = ByIdentity(_MAX_CACHED_URLS)
        #: Per config and header set: the redactor of its requests.
        self._redactors: ByIdentity[Redactor] = ByIdentity(_MAX_CACHED_URLS)
        # Installed last: nothing above can fail after it, so it is always removed by
        # ``aclose``.
        self._log_filter = RedactingFilter()
        self._log_filter.add(self._redactor(config, ()))
        # Removed by ``aclose``, or when a client that was never closed is collected.
        self._remove_log_filter = weakref.finalize(self, install_log_filter(self._log_filter))

    @property
    def config(self) -> SamplerConfig:
        return self._config

    @staticmethod
    def _timeout(config: SamplerConfig) -> httpx2.Timeout:
        timeouts = config.timeouts
        return httpx2.Timeout(
            connect=timeouts.connect, read=timeouts.read, write=timeouts.write, pool=None
        )

    async def __aenter__(self) -> SamplingClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection, then remove the client's logging filter."""
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.relative_deadline = _CLOSE_TIMEOUT
                for client in self._clients:
                    await client.aclose()
        finally:
            self._remove_log_filter()
            if self._release_kernel_timestamps is not None:
                self._release_kernel_timestamps()

    @staticmethod
    def _redactor(config: SamplerConfig, headers: Iterable[tuple[str, str]]) -> Redactor:
        return redactor_for(config.credentials(headers))

    def _request_redactor(
        self, config: SamplerConfig, headers: tuple[tuple[str, str], ...]
    ) -> Redactor:
        """The redactor of a request of ``config`` with ``headers``, found once per config
        and header set (the same few come again with every request; bounded anyway)."""
        redactor = self._redactors.get(config, headers)
        if redactor is None:
            redactor = self._redactors.put(config, self._redactor(config, headers), headers)
        return redactor

    def _build(
        self, wire: WireRequest, config: SamplerConfig, *, stream: bool
    ) -> httpx2.Request | httpcore2.Request:
        """What ``AsyncClient.build_request`` would build, without its per-request merging
        (measured at about a third of a request's fixed cost): the client's default headers
        we did not set, in front; its cookies; the URL parsed once per address; the headers
        every request of ``config`` and its header set carries, merged once (:meth:`_prepared`).
        A request for the direct path (see the class) is the ``httpcore2.Request`` that
        httpx2's transport would make of it."""
        client = self._clients[0]
        try:
            prepared = self._prepared(config, stream, wire.headers)
            extensions = {"timeout": dict(prepared.timeout)}
            address = self._url(config.base_url, wire.path, config.query_params)
            url = address.url
            fields = prepared.fields
            if config.auth_scheme is AuthScheme.AWS_SIGV4:
                fields = _signed(wire, str(url), fields)
            cookies = client.cookies
            if len(cookies) or prepared.sets_own or wire.method != "POST":
                # Cookies to send, a header httpx2 would otherwise add itself, or a method
                # whose empty body it sends without a Content-Length: its way.
                return httpx2.Request(
                    wire.method,
                    url,
                    content=wire.body,
                    headers=fields,
                    cookies=cookies if len(cookies) else None,
                    extensions=extensions,
                )
            # The headers ``Request(content=...)`` adds, added here: the same request, but
            # the body needs no encoding step and the headers no second merge.
            sent = [
                (b"Host", address.host),
                *fields,
                (b"Content-Length", b"%d" % len(wire.body)),
            ]
            if address.direct is not None:
                direct = httpcore2.Request(
                    b"POST", address.direct, content=wire.body, extensions=extensions
                )
                # Bytes already (see ``_prepared``): not checked header by header again.
                direct.headers = sent
                return direct
            request = httpx2.Request(
                wire.method,
                url,
                headers=sent,
                stream=httpx2.ByteStream(wire.body),
                extensions=extensions,
            )
            request.read()
            return request
        except (httpx2.HTTPError, httpx2.InvalidURL, UnicodeError) as exc:
            raise SamplingClientError(_unbuildable(exc)) from None

    def _prepared(
        self, config: SamplerConfig, stream: bool, extra: tuple[tuple[str, str], ...]
    ) -> _Prepared:
        """The headers and timeouts of a request of ``config`` (and streaming or not) with
        headers ``extra`` of its own, merged once per config and header set (the same few
        come again with every request; bounded anyway)."""
        found = self._prepared_by_config.get(config, (stream, extra))
        if found is not None:
            return found
        headers: dict[str, tuple[bytes, bytes]] = {}
        for name, value in (
            ("user-agent", _USER_AGENT),
            ("content-type", "application/json"),
            ("accept", "text/event-stream" if stream else "application/json"),
            *config.request_headers(),
            *extra,
        ):
            # As bytes, encoded as httpx2 would (ASCII), so it has nothing to encode.
            headers[name.lower()] = (name.encode("ascii"), value.encode("ascii"))
        # After everything else: never let a header list re-enable compression (see
        # module).
        headers["accept-encoding"] = _IDENTITY
        defaults = [pair for key, pair in self._default_headers.items() if key not in headers]
        prepared = _Prepared(
            [*defaults, *headers.values()],
            not _AUTO_HEADERS.isdisjoint(headers),
            self._timeout(config).as_dict(),
        )
        return self._prepared_by_config.put(config, prepared, (stream, extra))

    def _url(self, base_url: str, path: str, params: tuple[tuple[str, str], ...]) -> _Address:
        """``base_url/path?params`` parsed, with its ``Host`` header value and whether it
        may take the direct path; cached per address (a few per sampler; bounded anyway)."""
        key = (base_url, path, params)
        found = self._urls.get(key)
        if found is None:
            if len(self._urls) >= _MAX_CACHED_URLS:
                self._urls.clear()
            url = httpx2.URL(f"{base_url}/{path.lstrip('/')}", params=list(params) or None)
            direct = None
            if self._pools[0] is not None and _to_own_pool(self._clients[0], url):
                direct = httpcore2.URL(
                    scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
                )
            found = self._urls[key] = _Address(url, url.netloc, direct)
        return found

    async def _send(
        self, index: int, request: httpx2.Request | httpcore2.Request, headers_timeout: float
    ) -> tuple[_AnyResponse, float | None]:
        """The response from pool ``index``, and when the request's last byte was written
        (``None`` when the transport does not say)."""
        try:
            # A bare scope rather than ``fail_after`` (the same, plus two context managers).
            with trio.CancelScope(relative_deadline=headers_timeout):
                return await self._send_resending_stale(index, request)
            # Left without a response: the scope caught its own deadline's cancellation.
            info = SamplingErrorInfo(
                kind=SamplingErrorKind.IDLE_TIMEOUT,
                message=f"no response headers within {headers_timeout:g} s",
                retryable=True,
            )
        except _REQUEST_ERRORS as exc:
            # Not chained: an httpx exception holds the request, and the request the key.
            info = classify_transport_error(exc)
        raise SamplingClientError(info)

    async def _send_resending_stale(
        self, index: int, request: httpx2.Request | httpcore2.Request
    ) -> tuple[_AnyResponse, float | None]:
        """Send (:meth:`_send_once`), resending at once when a reused connection failed
        before any response arrived.

        The keep-alive race: a server closes a connection that sat idle in the pool just
        as a request is sent on it (the pool checks each idle connection before reuse, so
        only a close that arrives during the send gets through). Nothing of a response was
        received and the server dropped the connection without reading on, so the request
        is sent again on another connection, invisibly: no ``Retrying``, no backoff, no
        retry spent. The same failure on a connection opened for this request is a real
        one and is raised (the actor's retry policy decides). Bounded by
        :data:`STALE_CONNECTION_RESENDS`; the header timeout spans every resend.
        """
        resends = 0
        while True:
            trace = _ConnectionTrace(request.extensions)
            request.extensions["trace"] = trace
            try:
                return await self._send_once(index, request), trace.sent_at
            except _STALE_CONNECTION_ERRORS:
                if not trace.reused or resends >= STALE_CONNECTION_RESENDS:
                    raise
            resends += 1
            self.stale_connection_resends += 1

    async def _send_once(
        self, index: int, request: httpx2.Request | httpcore2.Request
    ) -> _AnyResponse:
        """``request`` sent on pool ``index``: an ``httpcore2.Request`` straight to its
        ``httpcore2`` pool (the direct path), any other through ``httpx2``."""
        if isinstance(request, httpx2.Request):
            return await self._clients[index].send(request, stream=True)
        pool = self._pools[index]
        assert pool is not None  # only built for a client that has one
        response = _CoreResponse(await pool.handle_async_request(request))
        # What httpx2 does with a response once it has one: keep its cookies, log it.
        if "set-cookie" in response.fields:
            url = bytes(request.url).decode("ascii")
            self._clients[0].cookies.extract_cookies(
                httpx2.Response(
                    response.status_code,
                    headers=response.headers,
                    request=httpx2.Request("POST", url),
                )
            )
        if _log.isEnabledFor(logging.INFO):
            _log.info(
                'HTTP Request: %s %s "%s %d %s"',
                "POST",
                bytes(request.url).decode("ascii"),
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response

    async def _raise_for_status(self, response: _AnyResponse, read_timeout: float) -> None:
        if 200 <= response.status_code < 300:
            return
        body = bytearray()
        # Best effort and bounded in size and time: the status alone still classifies.
        with trio.move_on_after(read_timeout):
            try:
                async with aclosing(_raw_chunks(response)) as chunks:
                    async for chunk in chunks:
                        body += chunk
                        if len(body) >= MAX_ERROR_BODY_BYTES:
                            break
            except (*_REQUEST_ERRORS, httpx2.StreamError):
                pass
        encoding = response.headers.get("content-encoding", "")
        try:
            decoded = _BodyDecoder(encoding, MAX_ERROR_BODY_BYTES).feed(
                bytes(body[:MAX_ERROR_BODY_BYTES])
            )
        except SamplingClientError:
            decoded = b""
        raise SamplingClientError(
            classify_http_error(response.status_code, response.headers.multi_items(), decoded)
        )

    def open_stream(
        self, wire: WireRequest, *, config: SamplerConfig | None = None
    ) -> AbstractAsyncContextManager[ResponseStream]:
        """POST ``wire`` and yield the 2xx response, body unread.

        Entering waits for the response headers at most ``timeouts.response_headers``
        (then ``IDLE_TIMEOUT``, retryable). A non-2xx status reads up to
        :data:`MAX_ERROR_BODY_BYTES` of the body and raises :class:`SamplingClientError`
        classified by :func:`classify_http_error`; a connect/TLS/read failure raises it
        classified by :func:`classify_transport_error`. Trio cancellation is never caught.
        Leaving the block closes the response (and its connection, if the body was not
        read to the end).
        """
        config = config or self._config
        # The exchange's own manager, not one wrapped around it (a generator-based
        # context manager costs microseconds to enter and leave).
        return self._exchange(
            wire, config, stream=True, headers_timeout=config.timeouts.response_headers
        )

    def _exchange(
        self, wire: WireRequest, config: SamplerConfig, *, stream: bool, headers_timeout: float
    ) -> _Exchange:
        """Send on the least busy pool, check the status, yield the body; always close.

        Every :class:`SamplingClientError` leaving here (from the exchange or from reading
        the body in the block) is scrubbed of this request's credentials.
        """
        return _Exchange(self, wire, config, stream, headers_timeout)

    async def post_json(
        self, wire: WireRequest, *, config: SamplerConfig | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        """POST a non-streaming request; return ``(status, headers, body)`` of a 2xx.

        Errors as in :meth:`open_stream`. Headers of a non-streaming call only arrive
        after the whole answer was generated, so the wait for them is bounded by
        ``timeouts.total`` if set, else by ``max(response_headers, first_token)``.
        """
        config = config or self._config
        timeouts = config.timeouts
        wait = timeouts.total or max(timeouts.response_headers, timeouts.first_token)
        async with self._exchange(wire, config, stream=False, headers_timeout=wait) as stream:
            body = bytearray()
            async for chunk in stream:
                body += chunk
            return (stream.status, stream.headers, bytes(body))
