"""The wire's timestamps: when a request's last byte was written
(``ResponseStream.request_sent_at``, ``time_to_request_sent_ms`` in the metrics), and, with
``SamplerConfig.receive_timestamps``, when a response's bytes arrived
(``RequestStream.received_at``, the metrics' headers, first token and last byte). The load
generator times its latencies from them.

Over real loopback HTTP/1.1 the client takes the write from httpcore's trace of the
body's send, and the arrivals from the kernel's receive timestamps; a transport that is not
httpcore's (a mock, the in-memory emulator) says neither. The servers here are
``trio.serve_tcp`` handlers in the same Trio run, so both sides read the same clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx2
import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_stream, http11_sse_response, make_config
from loopback import read_request, serve

from trio_sampler._receive_time import kernel_timestamps_available
from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.client import SamplingClient
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import (
    ApiBackend,
    ChannelToken,
    Completed,
    ConversationRequest,
    RequestMetrics,
    User,
)
from trio_sampler.wire import build_request

REQUEST = ConversationRequest(items=[User("hello")])
#: The server holds every answer this long after the whole request came in.
HOLD_S = 0.2


#: The answer's body: one token, the finish, ``[DONE]``.
BODY = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


async def completed_metrics(sampler: SamplerHandle) -> RequestMetrics:
    """The metrics of :data:`REQUEST` run to its end on ``sampler`` (it must complete)."""
    stream = await sampler.submit(REQUEST)
    async with stream:
        async for _ in stream:
            pass
    terminal = stream.terminal
    assert isinstance(terminal, Completed)
    assert terminal.metrics is not None
    return terminal.metrics


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

    async def answer(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            server.read_at.append(trio.current_time())
            await trio.sleep(HOLD_S)
            await stream.send_all(http11_sse_response(BODY))

    async with serve(answer) as server.port:
        yield server


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
            metrics = await completed_metrics(sampler)
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
        metrics = await completed_metrics(sampler)
    assert metrics.time_to_request_sent_ms is None
    assert metrics.attempts[0].time_to_request_sent_ms is None


async def test_a_mock_transport_stream_has_no_write_time() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=BODY)

    config = make_config()
    async with SamplingClient(config, transport=httpx2.MockTransport(answer)) as client:
        wire = build_request(config.backend, REQUEST, config.build_options())
        async with client.open_stream(wire) as stream:
            assert stream.request_sent_at is None


# -- arrivals: the kernel's receive timestamps --------------------------------------------

#: After sending the first token the server blocks the whole process this long (a
#: blocking sleep: the loop runs nothing, so nothing reads the socket meanwhile).
BLOCKED_S = 0.2
_CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def first_token_then_block() -> AsyncIterator[tuple[int, list[float]]]:
    """A server that answers at once with the head and the first token, notes when it
    sent them, blocks the process for :data:`BLOCKED_S`, then sends the rest 0.2 s
    later."""
    sent: list[float] = []
    first, rest = BODY.split(b"\n\n", 1)

    async def answer(stream: trio.SocketStream) -> None:
        await read_request(stream)
        # Written and then blocked on without a schedule point in between: the client's
        # read can only come after the sleep.
        sent.append(trio.current_time())
        os.write(stream.socket.fileno(), _CHUNKED_HEAD + _chunk(first + b"\n\n"))
        time.sleep(BLOCKED_S)  # noqa: ASYNC251 (the point: the loop stops)
        # The rest comes later, so the client's read of the first token returns it alone
        # (a read is stamped with the arrival of the last segment it returns).
        await trio.sleep(0.2)
        await stream.send_all(_chunk(rest) + b"0\r\n\r\n")
        await stream.receive_some(65536)  # until the client closes

    async with serve(answer) as port:
        yield port, sent


@pytest.mark.parametrize("stamped", [True, False], ids=["receive_timestamps", "read_times"])
async def test_arrivals_are_the_bytes_arrival_not_the_clients_read(stamped: bool) -> None:
    with trio.fail_after(30):
        async with first_token_then_block() as (port, sent):
            config = HoldingServer(port).config().evolve(receive_timestamps=stamped)
            async with open_sampler(config) as sampler:
                # The sampler's client asked the kernel for timestamps as it started; the
                # kernel switches them on a moment later (see ``_receive_time``).
                await trio.sleep(0.05)
                stream = await sampler.submit(REQUEST)
                token_at: float | None = None
                async with stream:
                    async for event in stream:
                        if isinstance(event, ChannelToken) and token_at is None:
                            token_at = stream.received_at
            terminal = stream.terminal
            assert isinstance(terminal, Completed) and terminal.metrics is not None
            metrics = terminal.metrics
            assert token_at is not None and metrics.time_to_first_token_ms is not None
            assert metrics.time_to_headers_ms is not None
            late_ms = (token_at - sent[0]) * 1000
            if stamped and kernel_timestamps_available():
                assert -1 < late_ms < 50  # when it came, though read 200 ms later
            else:
                assert late_ms >= BLOCKED_S * 1000  # when the read returned
            # The metrics say the same of the first token, and the head came with it.
            first_ms = metrics.time_to_first_token_ms
            assert metrics.time_to_headers_ms == pytest.approx(first_ms, abs=1.0)
            [read_first] = {round(token_at - first_ms / 1000, 6)}  # one submit instant
            assert read_first <= sent[0]


def test_receive_timestamps_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="receive_timestamps must be True or False"):
        HoldingServer().config().evolve(receive_timestamps="yes")


async def test_a_stamped_write_is_timed_before_the_schedule_point_after_it() -> None:
    # The write is timed right after the kernel took it: a task that runs in the schedule
    # point after the write (here one that blocks the loop) is not in the time.
    from trio_sampler._receive_time import LAST_SENT, StampedSocketStream

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        port = listeners[0].socket.getsockname()[1]
        client = StampedSocketStream(await trio.open_tcp_stream("127.0.0.1", port))
        async with client, await listeners[0].accept() as server:
            armed = False

            async def hog() -> None:
                # Blocks the loop at its first step after the write was started.
                while not armed:
                    await trio.lowlevel.checkpoint()
                time.sleep(0.2)  # noqa: ASYNC251 (the point: a task that holds the loop)

            # Trio runs a batch's tasks in either order, so the hog lands inside the
            # write's schedule point about every other time: try until it does.
            for _ in range(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hog)
                    await trio.lowlevel.checkpoint()
                    armed = True
                    before = trio.current_time()
                    await client.send_all(b"request")
                    after = trio.current_time()
                armed = False
                assert await server.receive_some() == b"request"
                if after - before >= 0.2:
                    break
            else:
                raise AssertionError("the hog never ran inside send_all")
            written = LAST_SENT.get()
            assert written is not None
            assert before <= written < before + 0.05
            # What the socket cannot take at once goes through trio's own send_all.
            big = b"x" * (16 * 1024 * 1024)
            async with trio.open_nursery() as nursery:

                async def drain() -> None:
                    left = len(big)
                    while left:
                        left -= len(await server.receive_some(1 << 20))

                nursery.start_soon(drain)
                await client.send_all(big)
            assert (LAST_SENT.get() or 0.0) >= after
