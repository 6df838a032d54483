"""The plain transport: an ``httpx2.AsyncClient``, through its public API only.

``client.send(request, stream=True)``, the body by ``aiter_raw``; no attribute of httpx2
or httpcore2 that they keep private is touched. It carries every request sent through
an ``httpx2`` transport of the caller's (``open_sampler(transport=httpx2.MockTransport(...))``:
:meth:`HttpxTransport.borrowing`), and can carry a sampler's network traffic too
(:meth:`HttpxTransport.for_config`), for comparison with the direct transport.

The classification of transport failures lives here too (:func:`classify_transport_error`):
httpx2's and httpcore2's exceptions (and trio's, and the OS's) by class name, so the
same table serves the direct transport, whose failures are httpcore2's.
"""

from __future__ import annotations

import importlib.util
import re
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2
import trio

from .._redact import scrub_secrets
from ..config import SamplerConfig
from ..types import SamplingErrorInfo, SamplingErrorKind
from ._base import Body, HttpRequest, SamplingClientError, timeout_error

__all__ = [
    "CLOSE_TIMEOUT",
    "REQUEST_ERRORS",
    "HttpxTransport",
    "classify_transport_error",
    "client_for",
]

#: Closing a response is local (a socket close, or an h2 RST_STREAM); bounded anyway so a
#: cancelled request never waits on the network while shielded.
CLOSE_TIMEOUT = 5.0
#: What a failed httpx2 exchange raises.
REQUEST_ERRORS = (httpx2.RequestError,)
_CONNECT_TIMEOUTS = (httpx2.ConnectTimeout,)
_READ_TIMEOUTS = (httpx2.ReadTimeout,)


def client_for(
    config: SamplerConfig, *, transport: httpx2.AsyncBaseTransport | None = None, verify: Any = True
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` with ``config``'s pool settings: no cap on connections
    (the actor bounds concurrency; a pool cap would queue streams invisibly and a pool
    timeout would fail them), redirects never followed (credentials
    never go to another host), HTTP/2 when asked for and ``h2`` is installed."""
    return httpx2.AsyncClient(
        verify=verify,
        transport=transport,
        limits=httpx2.Limits(
            max_connections=None,
            max_keepalive_connections=config.max_keepalive_connections,
        ),
        timeout=httpx2.Timeout(**_socket_timeouts(config)),
        follow_redirects=False,
        http2=config.http2 and _h2_available(),
    )


def _socket_timeouts(config: SamplerConfig) -> dict[str, float | None]:
    timeouts = config.timeouts
    return {
        "connect": timeouts.connect,
        "read": timeouts.read,
        "write": timeouts.write,
        "pool": None,
    }


def _h2_available() -> bool:
    return importlib.util.find_spec("h2") is not None


async def _already_read(content: bytes) -> AsyncGenerator[bytes, None]:
    yield content


class HttpxBody:
    """A :class:`~trio_sampler._http._base.Body` over an ``httpx2.Response``."""

    __slots__ = ("_chunks", "_ended_at", "_fields", "_response", "request_sent_at")

    read_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, response: httpx2.Response, request_sent_at: float | None = None) -> None:
        self._response = response
        self._fields: dict[str, str] | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._ended_at: float | None = None
        self.request_sent_at = request_sent_at

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def http_version(self) -> str:
        return self._response.http_version

    @property
    def header_fields(self) -> Mapping[str, str]:
        if self._fields is None:
            self._fields = dict(self._response.headers.items())
        return self._fields

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._response.headers.raw

    @property
    def received_at(self) -> float | None:
        return None

    @property
    def ended_at(self) -> float | None:
        return self._ended_at

    def chunks(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = self._read()
        return self._chunks

    async def _read(self) -> AsyncGenerator[bytes, None]:
        response = self._response
        if response.is_stream_consumed:
            # Read before it reached us (a mock transport built with ``content=``/``json=``).
            raw: AsyncIterator[bytes] = _already_read(response.content)
        else:
            raw = response.aiter_raw()
        try:
            while True:
                try:
                    chunk = await raw.__anext__()
                except StopAsyncIteration:
                    self._ended_at = trio.current_time()
                    return
                except REQUEST_ERRORS as exc:
                    # Not chained: an httpx exception holds the request, and it the key.
                    raise SamplingClientError(classify_transport_error(exc)) from None
                except httpx2.StreamError:
                    return  # closed: the exchange has ended
                yield chunk
        finally:
            if isinstance(raw, AsyncGenerator):
                with trio.CancelScope(shield=True):
                    await raw.aclose()

    @staticmethod
    def read_failure(exc: BaseException) -> SamplingClientError:
        return SamplingClientError(classify_transport_error(exc))

    def end_received(self, downloaded: int) -> bool:
        return self._ended_at is not None

    def socket_reads(self) -> None:
        return None  # its reads are the library's (or the responder's) own

    async def aclose(self) -> None:
        if self._response.is_closed:
            return
        chunks = self._chunks
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()
        try:
            await self._response.aclose()
        except REQUEST_ERRORS as exc:
            raise SamplingClientError(classify_transport_error(exc)) from None


async def send_through(
    client: httpx2.AsyncClient, request: httpx2.Request, started: float
) -> httpx2.Response:
    """``client.send(request, stream=True)``, its failures classified: a connect timeout
    and a read timeout before the head (the wait for the response head) say so."""
    try:
        return await client.send(request, stream=True)
    except _CONNECT_TIMEOUTS:
        timeout = request.extensions.get("timeout", {}).get("connect")
        raise timeout_error("connect", "no connection", float(timeout or 0.0)) from None
    except _READ_TIMEOUTS:
        waited = trio.current_time() - started
        raise timeout_error("response headers", "no response headers", waited) from None
    except REQUEST_ERRORS as exc:
        raise SamplingClientError(classify_transport_error(exc)) from None


class HttpxTransport:
    """A :class:`~trio_sampler._http._base.Transport` sending through an
    ``httpx2.AsyncClient``'s public API (see module). ``owned``: :meth:`aclose` closes
    the client."""

    def __init__(self, client: httpx2.AsyncClient, *, owned: bool) -> None:
        self._client = client
        self._owned = owned

    @classmethod
    def borrowing(
        cls, transport: httpx2.AsyncBaseTransport, config: SamplerConfig
    ) -> HttpxTransport:
        """Requests through ``transport``, which stays the caller's to close."""
        return cls(client_for(config, transport=_Borrowed(transport)), owned=True)

    @classmethod
    def for_config(cls, config: SamplerConfig) -> HttpxTransport:
        """Requests to the network, with ``config``'s pool settings."""
        return cls(client_for(config, verify=httpx2.create_ssl_context()), owned=True)

    @property
    def cookies(self) -> httpx2.Cookies:
        return self._client.cookies

    def build(self, request: HttpRequest) -> httpx2.Request:
        """``request`` as ``AsyncClient.build_request`` builds it (its default headers we
        did not set, its cookies)."""
        headers = request.headers
        return self._client.build_request(
            request.method,
            request.url,
            params=list(request.params) or None,
            headers=headers.fields,
            content=request.body,
            extensions={"timeout": dict(headers.timeout)},
        )

    async def open(self, request: HttpRequest) -> Body:
        try:
            built = self.build(request)
        except (httpx2.HTTPError, httpx2.InvalidURL, UnicodeError) as exc:
            raise SamplingClientError(unbuildable(exc)) from None
        response = await send_through(self._client, built, trio.current_time())
        return HttpxBody(response)

    async def aclose(self) -> None:
        if self._owned:
            with trio.CancelScope(shield=True, relative_deadline=CLOSE_TIMEOUT):
                await self._client.aclose()


class _Borrowed(httpx2.AsyncBaseTransport):
    """A transport the caller owns: requests go through, closing is left to the caller
    (``httpx2.AsyncClient.aclose`` would otherwise close it, possibly from the wrong task
    or cancel scope, e.g. an ``EmulatorTransport`` that holds a nursery)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def unbuildable(exc: Exception) -> SamplingErrorInfo:
    return SamplingErrorInfo(
        kind=SamplingErrorKind.INVALID_REQUEST,
        message=f"the request could not be built ({type(exc).__name__}): check "
        "base_url, wire.path and header values (ASCII only)",
    )


# -- classifying a failure that produced no response --------------------------------

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]+")

# httpx/httpx2 exception class name → (kind, retryable, what happened). Looked up along
# the MRO, most specific first, so subclasses of these work too.
_TRANSPORT_TABLE: dict[str, tuple[SamplingErrorKind, bool, str]] = {
    "ConnectTimeout": (SamplingErrorKind.TRANSPORT, True, "timed out connecting to the server"),
    "ReadTimeout": (SamplingErrorKind.IDLE_TIMEOUT, True, "timed out waiting for data"),
    "WriteTimeout": (SamplingErrorKind.TRANSPORT, True, "timed out sending the request"),
    "PoolTimeout": (
        SamplingErrorKind.TRANSPORT,
        True,
        "timed out waiting for a free connection",
    ),
    "TooSlowError": (SamplingErrorKind.IDLE_TIMEOUT, True, "timed out"),
    "ConnectError": (SamplingErrorKind.TRANSPORT, True, "could not connect to the server"),
    "ReadError": (SamplingErrorKind.TRANSPORT, True, "the connection failed while reading"),
    "WriteError": (SamplingErrorKind.TRANSPORT, True, "the connection failed while sending"),
    "CloseError": (SamplingErrorKind.TRANSPORT, True, "the connection failed while closing"),
    "RemoteProtocolError": (
        SamplingErrorKind.TRANSPORT,
        True,
        "the server broke the HTTP protocol (connection dropped mid-response?)",
    ),
    "LocalProtocolError": (
        SamplingErrorKind.TRANSPORT,
        False,
        "the request could not be sent (invalid header or URL?)",
    ),
    "UnsupportedProtocol": (
        SamplingErrorKind.TRANSPORT,
        False,
        "unsupported URL scheme: base_url must start with http:// or https://",
    ),
    "ProxyError": (SamplingErrorKind.TRANSPORT, True, "the proxy failed"),
    "DecodingError": (SamplingErrorKind.SERIALIZATION, False, "the response could not be decoded"),
    "SSLError": (SamplingErrorKind.TRANSPORT, True, "the TLS connection failed"),
    "ConnectionError": (SamplingErrorKind.TRANSPORT, True, "the connection failed"),
    "TimeoutError": (SamplingErrorKind.TRANSPORT, True, "timed out"),
    "OSError": (SamplingErrorKind.TRANSPORT, True, "network error"),
}


def _safe_detail(exc: BaseException) -> str:
    """``str(exc)`` with every URL cut down to scheme and host, and secrets scrubbed."""
    detail = _URL.sub(lambda m: _strip_url(m.group(0)), str(exc))
    return scrub_secrets(" ".join(detail.split()))[:200]


def _strip_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}://{host}/…" if host else f"{scheme}://…"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# getaddrinfo answers that will not change on a retry: the name does not exist (as opposed
# to EAI_AGAIN, a temporary failure of the resolver, which is retried).
_PERMANENT_DNS_ERRORS = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY", "EAI_SERVICE")
    if hasattr(socket, name)
)


#: ``SamplingErrorInfo.error_code`` of a failure before any connection was made.
NOT_SENT = "not_sent"
#: The failures that happen before a connection exists (connect, TLS handshake, name
#: resolution, no free connection in the pool).
_NOT_SENT = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout"})


def classify_transport_error(exc: BaseException) -> SamplingErrorInfo:
    """Classify a failure that produced no HTTP response (connect, TLS, read, timeout).

    Connect, TLS and read errors → TRANSPORT, retryable; a read timeout (no bytes for the
    read timeout, i.e. idle) → IDLE_TIMEOUT, retryable; connect/write/pool timeouts →
    TRANSPORT, retryable. A certificate verification failure and a host name that does not
    resolve are *not* retryable (they fail the same way again; a temporary resolver failure
    is). The message never contains a URL's path or query (which may hold
    keys), nor anything that looks like a credential.
    """
    chain = _chain(exc)
    kind, retryable, what = SamplingErrorKind.TRANSPORT, True, "network error"
    for klass in type(exc).__mro__:
        entry = _TRANSPORT_TABLE.get(klass.__name__)
        if entry is not None:
            kind, retryable, what = entry
            break
    texts = " ".join(f"{type(e).__name__} {e}" for e in chain)
    if "SSLCertVerificationError" in texts or "CERTIFICATE_VERIFY_FAILED" in texts:
        kind, retryable = SamplingErrorKind.TRANSPORT, False
        what = "TLS certificate verification failed (check the server's certificate or CA bundle)"
    elif kind is SamplingErrorKind.TRANSPORT and ("SSLError" in texts or "TLS" in texts):
        what = "the TLS handshake failed"
    elif any(isinstance(e, socket.gaierror) and e.errno in _PERMANENT_DNS_ERRORS for e in chain):
        kind, retryable = SamplingErrorKind.TRANSPORT, False
        what = "the server's host name does not resolve (check the base URL)"
    detail = next((d for d in (_safe_detail(e) for e in chain) if d), "")
    message = f"{what}: {detail}" if detail else what
    # No connection, so no byte of the request was written: the one transport failure
    # that proves the server never saw the request (a stateful request may be retried).
    not_sent = any(klass.__name__ in _NOT_SENT for klass in type(exc).__mro__)
    return SamplingErrorInfo(
        kind=kind,
        message=message,
        status_code=None,
        retryable=retryable,
        error_code=NOT_SENT if not_sent else None,
    )
