"""An in-process, streaming ``httpx2`` transport to an :class:`EmulatorApp`.

For unit tests under the mock clock and for examples with no sockets: the emulator's ASGI
app runs in-process and the body is *streamed* as the app sends it (``httpx2.ASGITransport``
buffers the whole body). Pacing (``delay_ms``, stalls, ping intervals) uses ``trio.sleep``,
so under ``autojump_clock`` it costs no wall time.
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

from ._app import EmulatorApp
from ._cache import PromptCache

__all__ = ["EmulatorTransport"]


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

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._nursery is None:
            raise RuntimeError(
                "EmulatorTransport is not open: use the AsyncClient (or the transport) "
                "in an 'async with' block"
            )
        body = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        send_channel, receive_channel = trio.open_memory_channel[Mapping[str, Any]](math.inf)
        disconnect = trio.Event()
        app_scope = trio.CancelScope()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.1"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 1),
            "server": (request.url.host, request.url.port or 80),
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
                    return httpx2.Response(
                        status_code=message["status"],
                        # The Date header a server adds (Hypercorn does, as RFC 9110
                        # asks): what absolute rate-limit resets are read against.
                        headers=[_date_header(), *message.get("headers", [])],
                        stream=_BodyStream(receive_channel, disconnect, app_scope),
                        request=request,
                    )
        except BaseException:
            # Given up before the headers (a timeout, a cancel): the client is gone.
            disconnect.set()
            app_scope.cancel()
            raise
        raise httpx2.RemoteProtocolError("the emulator app sent no response")
