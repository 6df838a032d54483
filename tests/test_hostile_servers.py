"""Hostile servers (``docs/reliability.md``): raw HTTP/1.1 over loopback, written by hand.

Each server is a ``trio.serve_tcp`` on 127.0.0.1, port 0, that writes whatever bytes the
test wants. Every request must end in one ``Failed`` of the right kind, within the
configured bounds (small timeouts, real clock) and with bounded memory.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import orjson
import trio
from loopback import read_request, serve

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import (
    Completed,
    ConversationRequest,
    Failed,
    SamplingErrorKind,
    SamplingEvent,
    User,
)

REQUEST = ConversationRequest(items=[User("hello")])
KEY = "sk-HOSTILE-0123456789abcdef"


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@attrs.define
class Server:
    port: int
    requests: list[bytes] = attrs.field(factory=list)
    connections: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


Handler = Callable[[trio.SocketStream, Server], Awaitable[None]]


@asynccontextmanager
async def hostile(handler: Handler) -> AsyncIterator[Server]:
    """Serve ``handler`` (after the request was read) on a free loopback port."""
    server = Server(port=0)

    async def on_connection(stream: trio.SocketStream) -> None:
        server.connections += 1
        request = await read_request(stream)
        server.requests.append(b"" if request is None else request[0] + b"\r\n\r\n" + request[1])
        await handler(stream, server)

    async with serve(on_connection) as port:
        server.port = port
        yield server


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def chunk(text: str) -> bytes:
    data = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def config_for(server: Server, **changes: object) -> SamplerConfig:
    base = SamplerConfig(
        base_url=server.base_url,
        model="m",
        api_key=KEY,
        timeouts=Timeouts(connect=2.0, response_headers=1.0, first_token=1.0, idle=1.0, total=None),
        retry=RetryPolicy(max_retries=0),
    )
    return base.evolve(**changes) if changes else base


async def run(config: SamplerConfig) -> tuple[list[SamplingEvent], float]:
    start = trio.current_time()
    with trio.fail_after(30):  # a hang is a failure, not a stuck suite
        async with open_sampler(config) as sampler:
            stream = await sampler.submit(REQUEST)
            events = [event async for event in stream]
    return events, trio.current_time() - start


def failed(events: list[SamplingEvent]) -> Failed:
    terminals = [e for e in events if isinstance(e, Completed | Failed)]
    assert len(terminals) == 1 and events[-1] is terminals[0], events
    terminal = events[-1]
    assert isinstance(terminal, Failed), terminal
    assert KEY not in repr(terminal)
    return terminal


async def test_event_larger_than_limit() -> None:
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD + chunk("hi") + b"data: " + b"x" * 200_000 + b"\n\n")
        await trio.sleep_forever()

    async with hostile(handler) as server:
        before = _rss_kib()
        events, elapsed = await run(config_for(server, max_sse_event_bytes=4096))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.HTTP
    assert "4096-byte limit" in terminal.error.message
    assert elapsed < 2.0
    assert _rss_kib() - before < 32 * 1024


async def test_endless_stream_bounded_by_max_response_bytes() -> None:
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD)
        piece = chunk("spam ") * 100
        while True:
            await stream.send_all(piece)

    async with hostile(handler) as server:
        before = _rss_kib()
        events, elapsed = await run(config_for(server, max_response_bytes=256 * 1024))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.HTTP
    assert "max_response_bytes" in terminal.error.message
    assert elapsed < 5.0
    assert _rss_kib() - before < 64 * 1024


async def test_endless_stream_bounded_by_total_timeout() -> None:
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD)
        while True:
            await stream.send_all(chunk("spam "))
            await trio.sleep(0.01)

    async with hostile(handler) as server:
        timeouts = Timeouts(response_headers=1.0, first_token=1.0, idle=1.0, total=1.0)
        events, elapsed = await run(config_for(server, timeouts=timeouts))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert terminal.error.error_code == "total_timeout"
    assert 0.9 < elapsed < 3.0


async def test_slow_drip_of_an_unfinished_line_hits_the_first_token_timeout() -> None:
    # One byte per 0.1 s of a comment line that never ends: bytes arrive, no event does.
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD + b":")
        while True:
            await trio.sleep(0.1)
            await stream.send_all(b"p")

    async with hostile(handler) as server:
        events, elapsed = await run(config_for(server))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert elapsed < 3.0


async def test_slow_drip_after_content_hits_the_idle_timeout() -> None:
    # Content, then complete keep-alive comments every 0.1 s: pings do not reset idle.
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD + chunk("hello"))
        while True:
            await trio.sleep(0.1)
            await stream.send_all(b": ping\n\n")

    async with hostile(handler) as server:
        events, elapsed = await run(config_for(server))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert terminal.partial is not None and terminal.partial.text == "hello"
    assert elapsed < 3.0


async def test_slow_drip_bounded_by_total_timeout() -> None:
    # Content one character per 0.1 s keeps idle alive; only ``total`` ends it.
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD)
        while True:
            await stream.send_all(chunk("x"))
            await trio.sleep(0.1)

    async with hostile(handler) as server:
        timeouts = Timeouts(response_headers=1.0, first_token=1.0, idle=1.0, total=1.5)
        events, elapsed = await run(config_for(server, timeouts=timeouts))
    terminal = failed(events)
    assert terminal.error.error_code == "total_timeout"
    assert elapsed < 3.5


async def test_server_never_sends_headers() -> None:
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await trio.sleep_forever()

    async with hostile(handler) as server:
        events, elapsed = await run(config_for(server))
    terminal = failed(events)
    assert terminal.error.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert "headers" in terminal.error.message
    assert elapsed < 3.0


async def test_html_body() -> None:
    page = b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1>" + b"x" * 1000 + b"</html>"

    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n"
            b"content-length: " + str(len(page)).encode() + b"\r\n\r\n" + page
        )

    async with hostile(handler) as server:
        events, elapsed = await run(config_for(server))
    terminal = failed(events)
    assert "<html" not in terminal.error.message.lower()
    assert elapsed < 3.0


async def test_invalid_utf8() -> None:
    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(
            SSE_HEAD + chunk("ok") + b'data: {"choices":[{"delta":{"content":"\xff\xfe\xc3"}}]}\n\n'
            b"data: \x80\x81\x82\n\n"
        )

    async with hostile(handler) as server:
        events, elapsed = await run(config_for(server))
    terminal = failed(events)
    assert terminal.error.kind in (
        SamplingErrorKind.SERIALIZATION,
        SamplingErrorKind.HTTP,
        SamplingErrorKind.TRANSPORT,
    )
    assert elapsed < 3.0


async def test_gzip_bomb_bounded_after_decoding() -> None:
    bomb = gzip.compress(b"\0" * (200 * 1024 * 1024), compresslevel=9)  # ~200 KB on the wire

    async def handler(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-encoding: gzip\r\nconnection: close\r\n"
            b"content-length: " + str(len(bomb)).encode() + b"\r\n\r\n"
        )
        await stream.send_all(bomb)

    async with hostile(handler) as server:
        before = _rss_kib()
        events, elapsed = await run(config_for(server, max_response_bytes=1024 * 1024))
        request = server.requests[0].lower()
    terminal = failed(events)
    assert b"accept-encoding: identity" in request
    assert terminal.error.kind is SamplingErrorKind.HTTP
    assert "max_response_bytes" in terminal.error.message
    assert elapsed < 5.0
    assert _rss_kib() - before < 64 * 1024


async def test_redirect_to_another_host_is_not_followed() -> None:
    async def other(stream: trio.SocketStream, server: Server) -> None:
        await stream.send_all(SSE_HEAD + chunk("stolen") + b"data: [DONE]\n\n")

    async with hostile(other) as second:

        async def redirect(stream: trio.SocketStream, server: Server) -> None:
            location = f"http://localhost:{second.port}/v1/chat/completions".encode()
            await stream.send_all(
                b"HTTP/1.1 307 Temporary Redirect\r\nlocation: "
                + location
                + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )

        async with hostile(redirect) as first:
            events, elapsed = await run(
                config_for(first, retry=RetryPolicy(max_retries=2, base_delay=0.01))
            )
            await trio.sleep(0.2)
    terminal = failed(events)
    assert terminal.error.status_code == 307
    assert not terminal.error.retryable
    assert second.connections == 0 and second.requests == []
    assert len(first.requests) == 1
    assert math.isfinite(elapsed) and elapsed < 3.0
