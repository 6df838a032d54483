"""When a request's last byte was written: ``ResponseStream.request_sent_at`` and
``time_to_request_sent_ms`` in the metrics (the load generator times TTFT from it).

Over real loopback HTTP/1.1 the client takes it from httpcore's trace of the body's send;
a transport that is not httpcore's (a mock, the in-memory emulator) does not say, and the
time is ``None``. The server here is a ``trio.serve_tcp`` handler in the same Trio run,
so both sides read the same clock.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx2
import trio
from fakes import Reply, ScriptedTransport, chat_stream, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.client import SamplingClient
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import ApiBackend, Completed, ConversationRequest, User
from trio_sampler.wire import build_request

REQUEST = ConversationRequest(items=[User("hello")])
#: The server holds every answer this long after the whole request came in.
HOLD_S = 0.2


def _response() -> bytes:
    body = (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":'
        b'[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":'
        b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@attrs.define
class HoldingServer:
    """Answers each request :data:`HOLD_S` after its last byte was read; notes when."""

    port: int = 0
    #: Per request: when the read that completed it returned.
    read_at: list[float] = attrs.field(factory=list)

    def config(self) -> SamplerConfig:
        return SamplerConfig(
            base_url=f"http://127.0.0.1:{self.port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="m",
            api_key="sk-test-0123456789",
            timeouts=Timeouts(connect=5.0, response_headers=5.0, first_token=5.0, idle=5.0),
            retry=RetryPolicy(max_retries=0),
        )


@asynccontextmanager
async def holding_server() -> AsyncIterator[HoldingServer]:
    server = HoldingServer()

    async def on_connection(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            try:
                while True:
                    while b"\r\n\r\n" not in buffer:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        buffer += data
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    while len(buffer) < length:
                        buffer += await stream.receive_some(65536)
                    buffer = buffer[length:]
                    server.read_at.append(trio.current_time())
                    await trio.sleep(HOLD_S)
                    await stream.send_all(_response())
            except trio.BrokenResourceError:
                return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
        )
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()


async def test_the_stream_says_when_its_request_was_written() -> None:
    with trio.fail_after(30):
        async with holding_server() as server, SamplingClient(server.config()) as client:
            config = server.config()
            wire = build_request(config.backend, REQUEST, config.build_options())
            for _ in range(2):  # a new connection, then a reused one
                before = trio.current_time()
                async with client.open_stream(wire) as stream:
                    headers_at = trio.current_time()
                    async for _ in stream:
                        pass
                sent_at = stream.request_sent_at
                assert sent_at is not None
                # Written after the call began and, give or take the scheduling slack of
                # one schedule point, before the server's read finished; long before the
                # answer, which came HOLD_S after that read.
                assert before <= sent_at <= server.read_at[-1] + 0.05
                assert headers_at - sent_at >= HOLD_S - 0.05


async def test_the_metrics_time_the_request_from_its_write() -> None:
    with trio.fail_after(30):
        async with holding_server() as server, open_sampler(server.config()) as sampler:
            stream = await sampler.submit(REQUEST)
            async with stream:
                async for _ in stream:
                    pass
            terminal = stream.terminal
            assert isinstance(terminal, Completed)
            metrics = terminal.metrics
            assert metrics is not None
            sent_ms = metrics.time_to_request_sent_ms
            assert sent_ms is not None
            assert metrics.time_to_headers_ms is not None
            assert metrics.time_to_first_token_ms is not None
            assert 0 <= sent_ms <= metrics.time_to_headers_ms
            # The server held the answer HOLD_S after the whole request was in.
            assert metrics.time_to_headers_ms - sent_ms >= HOLD_S * 1000 - 50
            [attempt] = metrics.attempts
            assert attempt.time_to_request_sent_ms == sent_ms


async def test_a_transport_that_does_not_say_leaves_it_unknown() -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("hi"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        async with stream:
            async for _ in stream:
                pass
    terminal = stream.terminal
    assert isinstance(terminal, Completed)
    metrics = terminal.metrics
    assert metrics is not None
    assert metrics.time_to_request_sent_ms is None
    assert metrics.attempts[0].time_to_request_sent_ms is None


async def test_a_mock_transport_stream_has_no_write_time() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=_response().split(b"\r\n\r\n", 1)[1])

    config = make_config()
    async with SamplingClient(config, transport=httpx2.MockTransport(answer)) as client:
        wire = build_request(config.backend, REQUEST, config.build_options())
        async with client.open_stream(wire) as stream:
            assert stream.request_sent_at is None
