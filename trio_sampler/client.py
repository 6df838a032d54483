"""The HTTP side of an actor: requests built once per config, sent through one seam.

:class:`SamplingClient` builds each request's headers (once per config and header set),
sends it through a :class:`~trio_sampler._http.Transport` (the library's one HTTP seam:
``trio_sampler._http``) and turns what comes back into what the actor reads: a non-2xx
status becomes a classified :class:`SamplingClientError` *before* any stream exists, and
a 2xx is a :class:`ResponseStream` whose iteration yields body chunks as they arrive
(undecoded by the HTTP library: the SSE decoder works on bytes). Every failure leaves as
a :class:`SamplingClientError` carrying a :class:`SamplingErrorInfo`; trio cancellation
passes through untouched. The same code runs whatever transport carries the bytes: the
network (the direct transport, the default), an ``httpx2`` transport, or a responder in
memory under the mock clock.

Security properties (``docs/contract.md`` §7):

* The key is read from the config's :class:`~trio_sampler.config.Secret` only when headers
  are built, and no exception raised here contains it: HTTP library exceptions (which hold
  the request and its headers) are replaced, not chained, and every
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

import time
import urllib.parse
import weakref
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType

import httpx2
import trio

from ._by_identity import ByIdentity
from ._http import (
    Body,
    DirectTransport,
    HttpRequest,
    HttpxTransport,
    PreparedHeaders,
    SocketReads,
    Transport,
)
from ._http._base import SamplingClientError, timeout_error
from ._http._direct import STALE_CONNECTION_RESENDS
from ._http._httpx import CLOSE_TIMEOUT
from ._redact import RedactingFilter, Redactor, install_log_filter, redactor_for
from .config import SamplerConfig
from .providers import AuthScheme
from .types import SamplingErrorInfo, SamplingErrorKind
from .wire._request import WireRequest
from .wire.errors import classify_http_error

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "STALE_CONNECTION_RESENDS",
    "ResponseStream",
    "SamplingClient",
    "SamplingClientError",
]

#: A non-2xx body is read up to this many bytes for classification, no more.
MAX_ERROR_BODY_BYTES = 64 * 1024
_USER_AGENT = f"trio-sampler/0.1 httpx2/{httpx2.__version__}"
_MAX_CACHED_URLS = 64
#: Headers the HTTP library adds itself unless they are given.
_IDENTITY = (b"accept-encoding", b"identity")


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
    def inflating(self) -> bool:
        """The body is compressed (gzip or deflate)."""
        return self._zlib is not None

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


class _Fields(Mapping[str, str]):
    """Header fields read case-insensitively (the fields' names are lower-cased)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, str]) -> None:
        self._fields = fields

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Headers({dict(self._fields)!r})"


class ResponseStream:
    """A response whose status was 2xx and whose body is still to be read: what the
    actor reads, over the transport's :class:`~trio_sampler._http.Body`.

    ``async for chunk in stream`` (or ``stream.iter_bytes()``) yields body chunks as they
    arrive, at most ``max_response_bytes`` in all. Read failures raise
    :class:`SamplingClientError`. The response is closed when the
    :meth:`SamplingClient.open_stream` block exits.
    """

    __slots__ = (
        "_body",
        "_closed",
        "_decoder",
        "_downloaded",
        "_end_taken",
        "_ended",
        "_raw",
        "_reads",
        "detached",
        "fileno",
    )

    def __init__(self, body: Body, max_bytes: int) -> None:
        self._body = body
        self._raw: AsyncIterator[bytes] | None = None
        self._decoder = _BodyDecoder(body.header_fields.get("content-encoding", ""), max_bytes)
        #: The body's bytes read so far, undecoded.
        self._downloaded = 0
        #: The body was read to its end (and the response closed then).
        self._ended = False
        self._closed = False
        #: Taken out of its ``open_stream`` block (:meth:`detach`): the block leaves it open.
        self.detached = False
        self._reads: SocketReads | None = None
        #: :meth:`take` read the body's end (the next ``__anext__`` closes and stops).
        self._end_taken = False
        #: The socket :meth:`take` reads (``-1``: none, see :meth:`socket_reads`).
        self.fileno = -1

    @property
    def status(self) -> int:
        return self._body.status

    @property
    def http_version(self) -> str:
        """``"HTTP/1.1"``, ``"HTTP/2"``, ..."""
        return self._body.http_version

    @property
    def request_sent_at(self) -> float | None:
        """When the request's last byte was written to its connection
        (``trio.current_time()``; ``None`` when the transport does not say: a mock, the
        in-memory emulator)."""
        return self._body.request_sent_at

    @property
    def received_at(self) -> float | None:
        """When the bytes of the last read of this response arrived (trio's clock), if its
        reads are timed so (``SamplerConfig.receive_timestamps``, over HTTP/1.1); else
        ``None``. Read it in the task that reads the response, after a read."""
        return self._body.received_at

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers, case-insensitive."""
        return _Fields(self._body.header_fields)

    @property
    def header_fields(self) -> Mapping[str, str]:
        """The response headers with their names lower-cased, the values of a repeated
        name joined with ``", "`` (as ``dict(headers.items())``): what the library reads
        them as."""
        return self._body.header_fields

    @property
    def request_id(self) -> str | None:
        """The provider's request id (``x-request-id`` or ``request-id``)."""
        headers = self._body.header_fields
        return headers.get("x-request-id") or headers.get("request-id")

    def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk (the same iterator as ``async for`` on the stream)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    def socket_reads(self) -> SocketReads | None:
        """The body's reads without a coroutine per read, for a reader that waits itself
        (:class:`~trio_sampler._http.SocketReads`: wait until :attr:`fileno` is readable,
        then :meth:`take`), where the transport offers them and the body needs no
        inflating; ``None``: read with ``async for``. Ask before the first read. The
        reads are bounded by the reader's own deadline, never by the socket read timeout
        (``Timeouts.read`` is no shorter than the actor's read timers)."""
        if self._raw is not None or self._decoder.inflating:
            return None
        reads = self._body.socket_reads()
        if reads is not None:
            self._reads, self.fileno = reads, reads.fileno
            return self
        return None

    def take(self, ready: bool) -> bytes | None:
        """A read without waiting (:meth:`socket_reads`): body bytes, ``b""`` (none yet:
        wait for :attr:`fileno`, then ``take(True)``), or ``None``: none this way (the
        body's end: the next ``__anext__`` closes the response and stops)."""
        reads = self._reads
        if reads is None:
            return None
        chunk = reads.take(ready)
        if chunk is None:
            self._reads, self._end_taken = None, True
            return None
        if chunk:
            self._downloaded += len(chunk)
            return self._decoder.feed(chunk)
        return chunk

    async def __anext__(self) -> bytes:
        body = self._body
        if self._end_taken:
            self._end_taken, self._ended, self._closed = False, True, True
            await body.aclose()
            raise StopAsyncIteration
        if self._raw is None:
            if self._ended:
                raise StopAsyncIteration
            self._raw = body.chunks()
        while True:
            if self._decoder.pending:
                await trio.lowlevel.checkpoint()  # inflating is work: let others run
                chunk = b""
            else:
                try:
                    chunk = await self._raw.__anext__()
                except StopAsyncIteration:
                    # Read to its end: closed now, giving its connection back to the pool
                    # (local work: nothing to shield or bound).
                    self._ended = self._closed = True
                    await body.aclose()
                    raise
                except body.read_errors as exc:
                    raise body.read_failure(exc) from None
                self._downloaded += len(chunk)
            decoded = self._decoder.feed(chunk)
            if decoded:
                return decoded

    def end_received(self) -> bool:
        """Whether what is left of the body has arrived already: :meth:`drain` would read
        it to its end without waiting for the network (``False`` whenever the transport
        cannot tell). The decoder's pending inflation, if any, is local work too."""
        return self._ended or self._body.end_received(self._downloaded)

    def detach(self) -> ResponseStream:
        """Take the response out of its :meth:`SamplingClient.open_stream` block: leaving
        the block no longer closes it, and the caller must (:meth:`drain` what is left,
        then :meth:`aclose`). For reading the end of a body in another task."""
        self.detached = True
        return self

    async def drain(self, *, max_bytes: int) -> None:
        """Read what is left of the body, at most ``max_bytes``, without a time bound
        (the caller's scope is one); a read failure only ends it. The response stays open:
        :meth:`aclose` it (which returns the connection to the pool if the body ended).

        Where the body's reads are :meth:`socket_reads`, they go on that way: the end of
        a body (a chunked body's last chunk, most often read already) is taken without
        starting the transport's own body iterator for it."""
        try:
            left = max_bytes
            while left > 0 and self._reads is not None:
                chunk = self.take(False)
                if chunk == b"":
                    await trio.lowlevel.wait_readable(self.fileno)
                    chunk = self.take(True)
                left -= len(chunk or b"")
            while left > 0:  # the end taken above closes the response here
                left -= len(await self.__anext__())
        except (StopAsyncIteration, SamplingClientError):
            pass  # the end of the body, or a connection that will not be reused

    async def aclose(self) -> None:
        """Close the response (and its connection, if the body is unfinished), shielded
        and bounded in time. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True, relative_deadline=CLOSE_TIMEOUT):
            raw = self._raw
            closer = getattr(raw, "aclose", None)
            if closer is not None:
                await closer()
            await self._body.aclose()


def _transport_for(
    config: SamplerConfig, transport: Transport | httpx2.AsyncBaseTransport | None
) -> tuple[Transport, bool]:
    """The transport a client sends through, and whether the client owns it: the direct
    transport by default, the caller's own as it is, an ``httpx2`` transport of the
    caller's run through ``httpx2.AsyncClient`` (the transport stays the caller's)."""
    if transport is None:
        return _network_transport(config), True
    if isinstance(transport, Transport):
        return transport, False
    if isinstance(transport, httpx2.AsyncBaseTransport):
        return HttpxTransport.borrowing(transport, config), True
    raise TypeError(
        f"transport must be a trio_sampler transport or an httpx2.AsyncBaseTransport, "
        f"not {type(transport).__name__}"
    )


def _network_transport(config: SamplerConfig) -> Transport:
    """The transport ``config.http_transport`` names."""
    if config.http_transport == "httptools":
        try:
            from ._http._httptools import HttptoolsTransport
        except ImportError:
            raise ValueError(
                "http_transport='httptools' needs the httptools package: "
                "pip install 'trio-sampler[fast]' (or http_transport='direct')"
            ) from None
        return HttptoolsTransport(config)
    if config.http_transport == "httpx":
        return HttpxTransport.for_config(config)
    return DirectTransport(config)


class _Exchange:
    """:meth:`SamplingClient._exchange`'s context manager, written out (a generator-based
    one costs microseconds per request to enter and leave).

    Entering sends through the transport within the response-head timeout, checks the
    status and returns the body; a failure on the way closes the response. Leaving closes
    the body unless it was detached. A :class:`SamplingClientError` raised while entering,
    in the block or while closing leaves scrubbed of the request's credentials."""

    __slots__ = ("_body", "_client", "_config", "_headers_timeout", "_redactor", "_stream", "_wire")

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

    async def __aenter__(self) -> ResponseStream:
        client = self._client
        config = self._config
        redactor = self._redactor = client._request_redactor(config, self._wire.headers)
        client._log_filter.add(redactor)
        try:
            request = client._request(self._wire, config, stream=self._stream)
            body = await client._open(request, self._headers_timeout)
            try:
                await client._raise_for_status(body, config.timeouts.response_headers)
            except BaseException:
                with trio.CancelScope(shield=True, relative_deadline=CLOSE_TIMEOUT):
                    await body.aclose()
                raise
        except SamplingClientError as exc:
            raise SamplingClientError(redactor.error(exc.info)) from None
        stream = self._body = ResponseStream(body, config.max_response_bytes)
        return stream

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
            if not body.detached:
                await body.aclose()
        except SamplingClientError as error:
            raise SamplingClientError(redactor.error(error.info)) from None
        if isinstance(exc, SamplingClientError):
            raise SamplingClientError(redactor.error(exc.info)) from None


class SamplingClient:
    """The HTTP side of an actor, shared by all its requests.

    Usable as ``async with SamplingClient(config) as client:``. ``config`` supplies the
    pool and timeout settings; each call may pass another ``config`` (a newer snapshot
    after ``UpdateConfig``) for its URL, headers, timeouts and limits.

    ``transport`` replaces the network: a :class:`~trio_sampler._http.Transport` (the
    in-memory emulator's ``EmulatorTransport``, a scripted one in tests), or an
    ``httpx2.AsyncBaseTransport`` (``httpx2.MockTransport``), run through
    ``httpx2.AsyncClient``. A transport given here stays the caller's to close. Without
    one, the direct transport (``trio_sampler._http._direct``) carries the requests: its
    pool and HTTP/2 settings come from ``config``.
    """

    def __init__(
        self,
        config: SamplerConfig,
        *,
        transport: Transport | httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = config
        self._transport, self._owns_transport = _transport_for(config, transport)
        #: Per config, streaming or not and header set: what its requests carry.
        self._prepared_by_config: ByIdentity[PreparedHeaders] = ByIdentity(_MAX_CACHED_URLS)
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

    @property
    def transport(self) -> Transport:
        """What carries this client's requests."""
        return self._transport

    @property
    def stale_connection_resends(self) -> int:
        """Requests resent at once because their connection refused the first write
        whole (the one resend allowed: ``docs/retry-policy.md``); never a retry."""
        return getattr(self._transport, "stale_connection_resends", 0)

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
        """Close the transport (unless it is the caller's), then remove the client's
        logging filter."""
        try:
            if self._owns_transport:
                await self._transport.aclose()
        finally:
            self._remove_log_filter()

    @staticmethod
    def _redactor(config: SamplerConfig, headers: Iterable[tuple[str, str]]) -> Redactor:
        return redactor_for(config.credentials(headers))

    def _request_redactor(
        self, config: SamplerConfig, headers: tuple[tuple[str, str], ...]
    ) -> Redactor:
        """The redactor of a request of ``config`` with ``headers``, found once per config
        and header set (the same few come again with every request; bounded anyway), or
        each time when the config's credentials change (SigV4: a refreshed session token)."""
        if config.credentials_change:
            return self._redactor(config, headers)
        redactor = self._redactors.get(config, headers)
        if redactor is None:
            redactor = self._redactors.put(config, self._redactor(config, headers), headers)
        return redactor

    def _request(self, wire: WireRequest, config: SamplerConfig, *, stream: bool) -> HttpRequest:
        try:
            prepared = self._prepared(config, stream, wire.headers)
        except UnicodeError:
            raise SamplingClientError(
                SamplingErrorInfo(
                    kind=SamplingErrorKind.INVALID_REQUEST,
                    message="the request could not be built (UnicodeEncodeError): check "
                    "base_url, wire.path and header values (ASCII only)",
                )
            ) from None
        params = (*config.query_params, *wire.query) if wire.query else config.query_params
        if config.auth_scheme is AuthScheme.AWS_SIGV4:  # signed per request, over its bytes
            prepared = _signed(wire, config.base_url, params, prepared)
        return HttpRequest(
            wire.method,
            config.base_url,
            wire.path,
            params,
            prepared,
            wire.body,
        )

    def _prepared(
        self, config: SamplerConfig, stream: bool, extra: tuple[tuple[str, str], ...]
    ) -> PreparedHeaders:
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
            ("accept", config.stream_media_type if stream else "application/json"),
            *config.request_headers(),
            *extra,
        ):
            # As bytes, encoded as httpx2 would (ASCII), so it has nothing to encode.
            headers[name.lower()] = (name.encode("ascii"), value.encode("ascii"))
        # After everything else: never let a header list re-enable compression (see
        # module).
        headers["accept-encoding"] = _IDENTITY
        timeouts = config.timeouts
        prepared = PreparedHeaders(
            list(headers.values()),
            frozenset(headers),
            {
                "connect": timeouts.connect,
                "read": timeouts.read,
                "write": timeouts.write,
                "pool": None,
            },
        )
        return self._prepared_by_config.put(config, prepared, (stream, extra))

    async def _open(self, request: HttpRequest, headers_timeout: float) -> Body:
        """The transport's response to ``request``, its head awaited at most
        ``headers_timeout`` (the response-headers timeout: none of the others caps it)."""
        # A bare scope rather than ``fail_after`` (the same, plus two context managers).
        with trio.CancelScope(relative_deadline=headers_timeout):
            return await self._transport.open(request)
        # Left without a response: the scope caught its own deadline's cancellation.
        raise timeout_error("response headers", "no response headers", headers_timeout)

    @staticmethod
    async def _raise_for_status(body: Body, read_timeout: float) -> None:
        if 200 <= body.status < 300:
            return
        content = bytearray()
        # Best effort and bounded in size and time: the status alone still classifies.
        with trio.move_on_after(read_timeout):
            try:
                chunks = body.chunks()
                async for chunk in chunks:
                    content += chunk
                    if len(content) >= MAX_ERROR_BODY_BYTES:
                        break
            except SamplingClientError:
                pass
            except body.read_errors:
                pass
        fields = body.header_fields
        try:
            decoded = _BodyDecoder(fields.get("content-encoding", ""), MAX_ERROR_BODY_BYTES).feed(
                bytes(content[:MAX_ERROR_BODY_BYTES])
            )
        except SamplingClientError:
            decoded = b""
        raise SamplingClientError(
            classify_http_error(body.status, list(fields.items()), decoded, now=time.time())
        )

    def open_stream(
        self, wire: WireRequest, *, config: SamplerConfig | None = None
    ) -> AbstractAsyncContextManager[ResponseStream]:
        """POST ``wire`` and yield the 2xx response, body unread.

        Entering waits for the response headers at most ``timeouts.response_headers``
        (then ``IDLE_TIMEOUT``, retryable, saying so). A non-2xx status reads up to
        :data:`MAX_ERROR_BODY_BYTES` of the body and raises :class:`SamplingClientError`
        classified by :func:`classify_http_error`; a connect/TLS/read failure raises it
        classified by the transport. Trio cancellation is never caught. Leaving the block
        closes the response (and its connection, if the body was not read to the end).
        """
        config = config or self._config
        # The exchange's own manager, not one wrapped around it (a generator-based
        # context manager costs microseconds to enter and leave).
        return _Exchange(self, wire, config, True, config.timeouts.response_headers)

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
        async with _Exchange(self, wire, config, False, wait) as stream:
            body = bytearray()
            async for chunk in stream:
                body += chunk
            return (stream.status, stream.headers, bytes(body))


def _signed(
    wire: WireRequest,
    base_url: str,
    params: tuple[tuple[str, str], ...],
    prepared: PreparedHeaders,
) -> PreparedHeaders:
    """``prepared`` with the AWS SigV4 headers of this request added (the ``bedrock``
    extra; ``trio_sampler._sigv4``): the one place a request is signed, over the query
    the transport sends (the configuration's and the request's own)."""
    from . import _sigv4

    url = base_url.rstrip("/") + wire.path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    headers = [(name.decode("ascii"), value.decode("ascii")) for name, value in prepared.fields]
    try:
        added = _sigv4.sign(wire.method, url, headers, wire.body)
    except ValueError as exc:  # no credentials or region: the message says what to set
        raise SamplingClientError(
            SamplingErrorInfo(kind=SamplingErrorKind.AUTH, message=str(exc))
        ) from None
    fields = [*prepared.fields, *((n.encode("ascii"), v.encode("ascii")) for n, v in added)]
    names = prepared.names | {name.lower() for name, _ in added}
    return PreparedHeaders(fields, names, prepared.timeout)
