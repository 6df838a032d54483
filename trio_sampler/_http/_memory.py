"""The in-memory transport: exchanges answered by a Python responder in the same process.

For tests under the mock clock and for the in-memory emulator: the responder gets each
:class:`~trio_sampler._http._base.HttpRequest` and answers with a :class:`MemoryResponse`
(status, headers, the body as an async iterable of bytes, which may pause on
``trio.sleep``, raise or never end). Nothing of an HTTP library is involved, and above
the seam everything runs as it does over the network.

A responder's exception that is not a :class:`SamplingClientError` is classified as a
transport failure by its class name (an ``httpx2.ConnectError`` raised by a script is a
connect failure), as the network transports classify theirs.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)

import attrs
import trio

from ._base import Body, HttpRequest, SamplingClientError
from ._httpx import classify_transport_error

__all__ = ["MemoryResponse", "MemoryTransport", "Responder"]


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


@attrs.define(eq=False)
class MemoryResponse:
    """A responder's answer: the head, and the body still to come."""

    status: int
    headers: Sequence[tuple[str | bytes, str | bytes]]
    chunks: AsyncIterable[bytes]
    #: Called once when the body is closed (read to its end or not).
    on_close: Callable[[], Awaitable[None]] | None = None


Responder = Callable[[HttpRequest], Awaitable[MemoryResponse]]


def _failure(exc: Exception) -> SamplingClientError:
    if isinstance(exc, SamplingClientError):
        return exc
    return SamplingClientError(classify_transport_error(exc))


class MemoryBody:
    """A :class:`~trio_sampler._http._base.Body` over a :class:`MemoryResponse`."""

    read_errors = ()
    request_sent_at = None
    received_at = None
    http_version = "HTTP/1.1"

    def __init__(self, response: MemoryResponse) -> None:
        self._response = response
        self.status = response.status
        self.raw_headers = [(_as_bytes(n), _as_bytes(v)) for n, v in response.headers]
        fields: dict[str, str] = {}
        for name, value in self.raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            fields[key] = text if key not in fields else f"{fields[key]}, {text}"
        self.header_fields: Mapping[str, str] = fields
        self.ended_at: float | None = None
        self._chunks: AsyncGenerator[bytes, None] | None = None
        self._closed = False

    def chunks(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = self._read()
        return self._chunks

    async def _read(self) -> AsyncGenerator[bytes, None]:
        iterator = aiter(self._response.chunks)
        try:
            while True:
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    self.ended_at = trio.current_time()
                    return
                except Exception as exc:
                    raise _failure(exc) from None
                if chunk:
                    yield chunk
        finally:
            closer = getattr(iterator, "aclose", None)
            if closer is not None:
                with trio.CancelScope(shield=True):
                    await closer()

    @staticmethod
    def read_failure(exc: BaseException) -> SamplingClientError:  # pragma: no cover
        raise AssertionError("a memory body raises its failures classified")

    def end_received(self, downloaded: int) -> bool:
        return self.ended_at is not None

    def socket_reads(self) -> None:
        return None  # its reads are the library's (or the responder's) own

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            if self._chunks is not None:
                await self._chunks.aclose()
            closer = getattr(self._response.chunks, "aclose", None)
            if closer is not None:
                await closer()
            if self._response.on_close is not None:
                await self._response.on_close()


class MemoryTransport:
    """A :class:`~trio_sampler._http._base.Transport` whose exchanges ``respond``
    answers (see module)."""

    def __init__(self, respond: Responder) -> None:
        self._respond = respond

    async def open(self, request: HttpRequest) -> Body:
        try:
            response = await self._respond(request)
        except Exception as exc:
            raise _failure(exc) from None
        return MemoryBody(response)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
