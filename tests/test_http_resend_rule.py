"""The HTTP seam's promises about what reaches a server, over real loopback sockets, on
the default (direct) and the httpx transports (``test_http_httptools`` holds httptools to
the same).

* A request the server may have received is never sent again invisibly. A server that
  reads a whole POST on a reused connection and then closes or resets it before a
  complete response head (after none, a few or most of the head's bytes, at once or
  after holding the request) gives one visible failed attempt: a ``Retrying`` of kind
  ``TRANSPORT`` when a retry is left (the retry is spent: ``max_retries`` counts it),
  a ``Failed`` of kind ``TRANSPORT`` when none is. The server sees exactly one POST per
  attempt the caller was told of.
* The timeouts are independent: waiting for the response head is bounded by
  ``response_headers`` alone, not by the shorter ``first_token``/``idle``.
* A connect timeout says what timed out and after how long, in words of its own.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
from fakes import http11_sse_response
from loopback import read_request, serve

from trio_sampler._network import _Connection
from trio_sampler._receive_time import NothingWritten, StampedSocketStream
from trio_sampler.actor import open_sampler
from trio_sampler.client import SamplingClient, SamplingClientError
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import (
    ApiBackend,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingErrorKind,
    SamplingEvent,
    User,
)
from trio_sampler.wire import build_request

REQUEST = ConversationRequest(items=[User("hello")])
SSE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)
RESPONSE = http11_sse_response(SSE)


@attrs.define
class Origin:
    port: int = 0
    #: Requests read whole, over all connections.
    posts: int = 0
    connections: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _reset(stream: trio.SocketStream) -> None:
    """Make the connection's close an RST (``SO_LINGER`` on, zero seconds)."""
    linger = struct.pack("ii", 1, 0)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)


@asynccontextmanager
async def breaking_on_reuse(head_bytes: int, hold: float, how: str) -> AsyncIterator[Origin]:
    """Answer a connection's first request; read the second whole, wait ``hold``
    seconds, send the first ``head_bytes`` bytes of a response head and close the
    connection (``how``: ``"close"``, a FIN, or ``"reset"``, an RST)."""
    origin = Origin()

    async def on_connection(stream: trio.SocketStream) -> None:
        origin.connections += 1
        number = 0
        while await read_request(stream) is not None:
            origin.posts += 1
            if number == 0:
                await stream.send_all(RESPONSE)
                number += 1
                continue
            await trio.sleep(hold)
            if head_bytes:
                await stream.send_all(RESPONSE[:head_bytes])
            if how == "reset":
                _reset(stream)
            return

    async with serve(on_connection) as port:
        origin.port = port
        yield origin


def config_for(origin: Origin, **changes: object) -> SamplerConfig:
    base = SamplerConfig(
        base_url=origin.base_url,
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="m",
        api_key="sk-RESEND-0123456789abcdef",
        timeouts=Timeouts(connect=5.0, response_headers=5.0, first_token=5.0, idle=5.0),
        connection_pools=1,
    )
    return base.evolve(**changes)


async def collect(config: SamplerConfig, count: int) -> list[list[SamplingEvent]]:
    async with open_sampler(config) as sampler:
        return [[e async for e in await sampler.submit(REQUEST)] for _ in range(count)]


BREAKS = [
    pytest.param(0, 0.0, "close", id="close-before-any-head-byte"),
    pytest.param(9, 0.0, "close", id="close-after-9-head-bytes"),
    pytest.param(30, 0.0, "close", id="close-after-30-head-bytes"),
    pytest.param(0, 0.0, "reset", id="reset-before-any-head-byte"),
    pytest.param(9, 0.0, "reset", id="reset-after-9-head-bytes"),
    pytest.param(0, 2.0, "close", id="close-after-holding-2s"),
]


#: The transports whose sending these tests hold to the rule (``httptools`` has its own
#: copies, over its own connections: ``test_http_httptools``).
TRANSPORTS = ("direct", "httpx")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("head_bytes", "hold", "how"), BREAKS)
async def test_a_post_the_server_read_is_one_visible_attempt(
    head_bytes: int, hold: float, how: str, transport: str
) -> None:
    """The second request goes on the kept connection, which the server breaks after
    reading it: the caller sees one ``Retrying`` (a transport error), and the server
    one POST per attempt (the retry on a new connection)."""
    with trio.fail_after(30):
        async with breaking_on_reuse(head_bytes, hold, how) as origin:
            retry = RetryPolicy(max_retries=1, base_delay=0.01, jitter=0.0)
            config = config_for(origin, retry=retry, http_transport=transport)
            first, second = await collect(config, 2)
    assert isinstance(first[-1], Completed)
    retrying = [e for e in second if isinstance(e, Retrying)]
    assert [r.kind for r in retrying] == [SamplingErrorKind.TRANSPORT]
    end = second[-1]
    assert isinstance(end, Completed) and end.metrics is not None
    assert [a.kind for a in end.metrics.attempts] == [SamplingErrorKind.TRANSPORT, None]
    # Three POSTs: the first request, the broken one, and its visible retry.
    assert origin.posts == 3
    assert origin.connections == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("head_bytes", "hold", "how"), BREAKS[:4])
async def test_without_a_retry_left_it_fails_and_is_sent_once(
    head_bytes: int, hold: float, how: str, transport: str
) -> None:
    with trio.fail_after(30):
        async with breaking_on_reuse(head_bytes, hold, how) as origin:
            config = config_for(origin, retry=RetryPolicy(max_retries=0), http_transport=transport)
            first, second = await collect(config, 2)
    assert isinstance(first[-1], Completed)
    assert not [e for e in second if isinstance(e, Retrying)]
    end = second[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.TRANSPORT
    assert end.metrics is not None
    assert [(a.attempt, a.kind) for a in end.metrics.attempts] == [(1, SamplingErrorKind.TRANSPORT)]
    assert origin.posts == 2


async def test_the_response_head_wait_is_bounded_by_response_headers_alone() -> None:
    """``response_headers=2`` with ``first_token=idle=0.5``: a head sent after 1 s is
    awaited, and the stream completes."""

    async def late_head(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            await trio.sleep(1.0)
            await stream.send_all(RESPONSE)

    async with serve(late_head) as port:
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="m",
            api_key="sk-LATE-0123456789abcdef",
            timeouts=Timeouts(connect=5.0, response_headers=2.0, first_token=0.5, idle=0.5),
            retry=RetryPolicy(max_retries=0),
        )
        with trio.fail_after(30):
            (events,) = await collect(config, 1)
    assert isinstance(events[-1], Completed), events[-1]


async def test_the_response_head_timeout_says_which_and_how_long() -> None:
    async def never_answer(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            await trio.sleep_forever()

    async with serve(never_answer) as port:
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="m",
            api_key="sk-LATE-0123456789abcdef",
            timeouts=Timeouts(connect=5.0, response_headers=0.8, first_token=0.2, idle=0.2),
            retry=RetryPolicy(max_retries=0),
        )
        with trio.fail_after(30):
            start = trio.current_time()
            (events,) = await collect(config, 1)
            elapsed = trio.current_time() - start
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.message == "response headers timeout: no response headers within 0.8 s"
    assert elapsed >= 0.8


@asynccontextmanager
async def unaccepting_port() -> AsyncIterator[int]:
    """A listening port whose accept queue is full: a new connection's SYN goes
    unanswered, so connecting to it times out."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(filler)
        await trio.sleep(0.1)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_connect_timeout_says_which_and_how_long() -> None:
    async with unaccepting_port() as port:
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="m",
            api_key="sk-CONNECT-0123456789abcdef",
            timeouts=Timeouts(connect=0.3),
        )
        wire = build_request(config.backend, REQUEST, config.build_options())
        with trio.fail_after(30), pytest.raises(SamplingClientError) as caught:
            async with SamplingClient(config) as client, client.open_stream(wire):
                pass
    info = caught.value.info
    assert info.kind is SamplingErrorKind.TRANSPORT and info.retryable
    assert info.message == "connect timeout: no connection within 0.3 s"
    assert "nursery" not in info.message and "sub-exception" not in info.message


async def test_a_write_refused_whole_raises_nothing_written() -> None:
    """A connection the server reset refuses the next write whole: ``NothingWritten``,
    the one failure that proves a request did not reach the server."""
    reset = trio.Event()

    async def reset_at_once(stream: trio.SocketStream) -> None:
        _reset(stream)
        await stream.aclose()
        reset.set()

    async with serve(reset_at_once) as port:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        stamped = StampedSocketStream(client, stamp_reads=False)
        await reset.wait()
        await trio.sleep(0.05)  # the RST arrives
        with pytest.raises(NothingWritten):
            await stamped.send_all(b"POST / HTTP/1.1\r\n\r\n")
        await stamped.aclose()


async def test_a_request_that_provably_did_not_reach_the_server_is_resent_unseen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keep-alive race: the server reset a pooled connection, and the pool (told
    here that the connection is quiet) reuses it. The request's write is refused whole,
    so it is sent again at once on a new connection: no ``Retrying``, no retry spent
    (``max_retries=0``), one POST reaches the server for each request."""
    quiet = _Connection.get_extra_info

    def never_readable(self: _Connection, info: str) -> object:
        return False if info == "is_readable" else quiet(self, info)

    monkeypatch.setattr(_Connection, "get_extra_info", never_readable)
    origin = Origin()

    async def answer_then_reset(stream: trio.SocketStream) -> None:
        origin.connections += 1
        if await read_request(stream) is not None:
            origin.posts += 1
            await stream.send_all(RESPONSE)
            await trio.sleep(0.05)
            _reset(stream)

    async with serve(answer_then_reset) as port:
        origin.port = port
        config = config_for(origin, retry=RetryPolicy(max_retries=0))
        with trio.fail_after(30):
            async with open_sampler(config) as sampler:
                runs = []
                for _ in range(3):
                    runs.append([e async for e in await sampler.submit(REQUEST)])
                    await trio.sleep(0.2)  # the reset arrives before the next request
    assert all(isinstance(events[-1], Completed) for events in runs), runs
    assert not [e for events in runs for e in events if isinstance(e, Retrying)]
    assert origin.posts == 3
    assert origin.connections == 3
