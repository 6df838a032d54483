"""A scripted in-memory HTTP transport for actor tests under the mock clock.

Each request gets the next :class:`Reply` of the script: a status and headers (possibly
after a delay, or never), then body chunks with virtual-time pauses between them, then
the end of the body, a dropped connection or a stall. Everything runs on ``trio.sleep``,
so under ``autojump_clock`` minutes of backoff and timeouts pass in microseconds.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import attrs
import carriers
import httpx2
import orjson
import trio

from trio_sampler._http import (
    Body,
    DirectTransport,
    HttpRequest,
    HttpxTransport,
    MemoryResponse,
    MemoryTransport,
    SamplingClientError,
    Transport,
)
from trio_sampler._http._httptools import HttptoolsTransport
from trio_sampler.config import SamplerConfig
from trio_sampler.types import ApiBackend


@attrs.define
class Reply:
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=lambda: {"content-type": "text/event-stream"})
    #: bytes are sent as one read each; a float is a pause (virtual seconds) before the next.
    chunks: Sequence[bytes | float] = ()
    #: Wait this long before answering at all (``math.inf``: never send headers).
    delay_headers: float = 0.0
    #: Raise this instead of answering (a connect failure, say).
    error: Exception | None = None
    #: After the chunks: ``"end"`` (clean end of body), ``"drop"`` (connection reset) or
    #: ``"stall"`` (never send another byte).
    then: str = "end"


async def _body(reply: Reply) -> AsyncGenerator[bytes, None]:
    for item in reply.chunks:
        if isinstance(item, float | int):
            await trio.sleep(float(item))
        else:
            yield item
    if reply.then == "drop":
        raise httpx2.ReadError("connection reset by peer")
    if reply.then == "stall":
        await trio.sleep_forever()


def as_httpx_request(request: HttpRequest) -> httpx2.Request:
    """``request`` as an ``httpx2.Request`` (what the script and the tests look at)."""
    return httpx2.Request(
        request.method,
        request.url,
        params=list(request.params) or None,
        headers=request.headers.fields,
        content=request.body,
    )


class _HttpxBody(httpx2.AsyncByteStream):
    def __init__(self, reply: Reply, transport: ScriptedTransport) -> None:
        self._reply = reply
        self._transport = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async with aclosing(_body(self._reply)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def aclose(self) -> None:
        await self._transport._closed()


class _Counted:
    """A body of the seam, its calls counted (and its close, ``count_close``)."""

    def __init__(self, body: Body, transport: ScriptedTransport, count_close: bool) -> None:
        self._body = body
        self._transport = transport
        self._count_close = count_close
        self._closed = False
        self.read_errors = body.read_errors

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    def chunks(self) -> AsyncIterator[bytes]:
        self._transport.seam_calls["chunks"] += 1
        return self._body.chunks()

    def end_received(self, downloaded: int) -> bool:
        self._transport.seam_calls["end_received"] += 1
        return self._body.end_received(downloaded)

    def socket_reads(self) -> None:
        return None  # the reads are counted through ``chunks``

    def read_failure(self, exc: BaseException) -> SamplingClientError:
        return self._body.read_failure(exc)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.seam_calls["aclose"] += 1
            if self._count_close:
                await self._transport._closed()
        await self._body.aclose()


class ScriptedTransport(httpx2.AsyncBaseTransport):
    """Serves ``script`` replies in order (the last one repeats), recording requests.

    A transport of the library's seam (``trio_sampler._http.Transport``: ``open``), in
    memory, and an ``httpx2`` transport too (``handle_async_request``), for the tests that
    put it behind one of their own."""

    def __init__(
        self,
        script: Sequence[Reply] | Callable[[httpx2.Request, int], Reply],
        *,
        carrier: str | None = None,
    ) -> None:
        self._script = script
        self.requests: list[httpx2.Request] = []
        self.opened_bodies = 0
        self.closed_bodies = 0
        #: Which transport of the seam carries the exchanges (``tests/carriers.py``).
        self.carrier = carrier or carriers.current
        self._carried: Transport | None = None
        self._loopback_port = 0
        #: Calls to the seam, by name (``open`` and each ``Body`` method the client made).
        self.seam_calls: Counter[str] = Counter()

    def _next(self, request: httpx2.Request) -> Reply:
        index = len(self.requests) - 1
        if callable(self._script):
            return self._script(request, index)
        return self._script[min(index, len(self._script) - 1)]

    async def reply_to(self, recorded: httpx2.Request) -> Reply:
        """Record ``recorded``, wait as its reply says, and return the reply (or raise
        its error)."""
        self.requests.append(recorded)
        reply = self._next(recorded)
        if reply.delay_headers:
            if math.isinf(reply.delay_headers):
                await trio.sleep_forever()
            await trio.sleep(reply.delay_headers)
        if reply.error is not None:
            raise reply.error
        self.opened_bodies += 1
        return reply

    async def _closed(self) -> None:
        self.closed_bodies += 1

    async def open(self, request: HttpRequest) -> Body:
        self.seam_calls["open"] += 1
        if self.carrier == "memory":
            return _Counted(await MemoryTransport(self._respond).open(request), self, True)
        if self._carried is None:
            self._carried = await self._carrier()
        if self.carrier in ("loopback", "httptools"):
            request = attrs.evolve(request, base_url=f"http://127.0.0.1:{self._loopback_port}/v1")
        body = await self._carried.open(request)
        # Over httpx2 the script's own body counts its close; else it is counted here.
        return _Counted(body, self, self.carrier != "httpx")

    async def _carrier(self) -> Transport:
        config = make_config(connection_pools=1)
        if self.carrier == "httpx":
            return HttpxTransport.borrowing(self, config)
        serve = functools.partial(carriers.serve_script, self)
        if self.carrier == "direct":
            return DirectTransport(config, network_backend=carriers.MemoryNetworkBackend(serve))
        assert self.carrier in ("loopback", "httptools"), self.carrier
        serve = functools.partial(carriers.serve_script, self, keep_alive=False)
        self._loopback_port = await carriers.listen_for(serve)
        if self.carrier == "httptools":
            return HttptoolsTransport(config)
        return DirectTransport(config)

    async def _respond(self, request: HttpRequest) -> MemoryResponse:
        reply = await self.reply_to(as_httpx_request(request))
        return MemoryResponse(reply.status, list(reply.headers.items()), _body(reply))

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        reply = await self.reply_to(request)
        return httpx2.Response(
            reply.status, headers=reply.headers, stream=_HttpxBody(reply, self), request=request
        )

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def chat_chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    data = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chat_usage(prompt: int = 10, completion: int = 5) -> bytes:
    data = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "model": "test-model",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat_stream(*pieces: str, pause: float = 0.0, finish: str = "stop") -> list[bytes | float]:
    """A complete Chat Completions body: one chunk per piece, finish, usage, [DONE]."""
    out: list[bytes | float] = []
    for piece in pieces:
        out.append(chat_chunk({"content": piece}))
        if pause:
            out.append(pause)
    out += [chat_chunk({}, finish), chat_usage(), DONE]
    return out


def http11_sse_response(body: bytes) -> bytes:
    """``body`` as a whole HTTP/1.1 ``200`` event-stream response with a length (for
    servers on real sockets): nothing is left to read after it."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def error_reply(status: int, body: Mapping[str, object] | None = None, **headers: str) -> Reply:
    payload = body or {"error": {"message": f"status {status}", "type": "server_error"}}
    return Reply(
        status=status,
        headers={"content-type": "application/json", **headers},
        chunks=[orjson.dumps(payload)],
    )


def make_config(**changes: object) -> SamplerConfig:
    """A chat-completions config aimed at the fake server."""
    base = SamplerConfig(
        base_url="http://fake.test/v1",
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="test-model",
        api_key="sk-test-SECRET-0123456789",
    )
    return base.evolve(**changes) if changes else base
