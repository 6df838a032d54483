"""An in-process, streaming transport to an :class:`EmulatorApp`.

For unit tests under the mock clock and for examples with no sockets: the emulator's ASGI
app runs in-process and the body is *streamed* as the app sends it (``httpx2.ASGITransport``
buffers the whole body). Pacing (``delay_ms``, stalls, ping intervals) uses ``trio.sleep``,
so under ``autojump_clock`` it costs no wall time.

It is two transports at once: the library's own seam (``open``, a
``trio_sampler._http.Transport``: what ``open_sampler(transport=EmulatorTransport())``
uses, with no HTTP library in between) and an ``httpx2`` transport
(``handle_async_request``, for an ``httpx2.AsyncClient`` of the caller's). Both run the
same exchange.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any
from wsgiref.handlers import format_date_time

import httpx2
import trio

from .._http._base import Body, HttpRequest
from .._http._memory import MemoryBody, MemoryResponse
from ._app import EmulatorApp
from ._cache import PromptCache

__all__ = ["EmulatorTransport"]


_Head = tuple[int, list[tuple[bytes, bytes]], "_BodyStream"]


class _BodyStream(httpx2.AsyncByteStream):
    """The response body, read from the app's ``http.response.body`` messages as sent."""

    def __init__(
        self,
        receive: trio.MemoryReceiveChannel[Mapping[str, Any]],
        disconnect: trio.Event,
        app_scope: trio.CancelScope,
    ) -> None:
        self._receive = receive
        self._disconnect = disconnect
        self._app_scope = app_scope

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for message in self._receive:
            if message["type"] == "error":
                raise message["error"]
            if message["type"] != "http.response.body":
                continue
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return
        # The app returned mid-body: what a real server does by closing the connection.
        raise httpx2.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )

    async def aclose(self) -> None:
        self._disconnect.set()
        self._app_scope.cancel()
        await self._receive.aclose()


def _date_header() -> tuple[bytes, bytes]:
    return (b"date", format_date_time(time.time()).encode("ascii"))


class EmulatorTransport(httpx2.AsyncBaseTransport):
    """An in-process, streaming transport to an :class:`EmulatorApp`.

    Use it as the transport of an ``httpx2.AsyncClient`` *inside* ``async with`` (the
    transport runs each request's app task in a nursery it opens on entry)::

        async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
            async with client.stream("POST", "http://emulator/v1/chat/completions", ...) as r:
                async for chunk in r.aiter_raw():
                    ...

    Closing a response early cancels the app task (as a client disconnect would).
    """

    def __init__(self, app: EmulatorApp | None = None) -> None:
        self.app = app if app is not None else EmulatorApp(cache=PromptCache())
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> EmulatorTransport:
        stack = contextlib.AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            self._nursery = None
            await stack.aclose()

    async def open(self, request: HttpRequest) -> Body:
        """The library's seam: one exchange with the app, no HTTP library in between."""
        target = request.path if request.path.startswith("/") else "/" + request.path
        prefix = request.base_url.split("://", 1)[-1].partition("/")[2]
        path = f"/{prefix}{target}" if prefix else target
        scheme, _, rest = request.base_url.partition("://")
        host, _, port = rest.partition("/")[0].partition(":")
        query = "&".join(f"{name}={value}" for name, value in request.params).encode()
        headers = [(name.lower(), value) for name, value in request.headers.fields]
        status, head, body = await self._exchange(
            request.method,
            scheme,
            (host, int(port) if port else 80),
            path,
            query,
            headers,
            request.body,
        )
        return MemoryBody(MemoryResponse(status, head, body))

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        status, head, stream = await self._exchange(
            request.method,
            request.url.scheme,
            (request.url.host, request.url.port or 80),
            request.url.path,
            request.url.query,
            [(k.lower(), v) for k, v in request.headers.raw],
            body,
        )
        return httpx2.Response(status_code=status, headers=head, stream=stream, request=request)

    async def _exchange(
        self,
        method: str,
        scheme: str,
        server: tuple[str, int],
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> _Head:
        """Run the app on one request; return its status, headers and the body to come."""
        if self._nursery is None:
            raise RuntimeError(
                "EmulatorTransport is not open: use the AsyncClient (or the transport) "
                "in an 'async with' block"
            )
        send_channel, receive_channel = trio.open_memory_channel[Mapping[str, Any]](math.inf)
        disconnect = trio.Event()
        app_scope = trio.CancelScope()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.1"},
            "http_version": "1.1",
            "method": method,
            "scheme": scheme,
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": server,
            "extensions": {},
        }
        sent_request = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_request
            if not sent_request:
                sent_request = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: Mapping[str, Any]) -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await send_channel.send(message)

        async def run_app() -> None:
            with send_channel, app_scope:
                try:
                    await self.app(scope, receive, send)
                except Exception as exc:  # delivered to the reader, not the nursery
                    await send({"type": "error", "error": exc})

        self._nursery.start_soon(run_app)
        try:
            async for message in receive_channel:
                if message["type"] == "error":
                    raise message["error"]
                if message["type"] == "http.response.start":
                    # The Date header a server adds (Hypercorn does, as RFC 9110
                    # asks): what absolute rate-limit resets are read against.
                    return (
                        message["status"],
                        [_date_header(), *message.get("headers", [])],
                        _BodyStream(receive_channel, disconnect, app_scope),
                    )
        except BaseException:
            # Given up before the headers (a timeout, a cancel): the client is gone.
            disconnect.set()
            app_scope.cancel()
            raise
        raise httpx2.RemoteProtocolError("the emulator app sent no response")
