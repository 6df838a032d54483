"""Connection reuse over real loopback HTTP/1.1, with servers written by hand.

* After a stream's terminator the rest of the body (the last chunk of a chunked body) is
  read at once when it has arrived with the body (the connection is back in the pool
  before ``Completed``; no task is started for it), and otherwise off the request's
  clock: ``Completed`` does not wait for it, ``Timeouts.total`` does not count it, and
  the connection still goes back to the pool.
* A reused connection the server drops after reading the request is an ordinary,
  visible retry, as the same failure on a fresh connection is: the request may have
  reached the server, so it is never resent unseen.

Each server is a ``trio.serve_tcp`` on 127.0.0.1, port 0, that keeps connections open
(keep-alive) and answers each request with whatever the test wants.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import orjson
import pytest
import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_stream, http11_sse_response, make_config

from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.client import SamplingClient
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
KEY = "sk-REUSE-0123456789abcdef"


def _chunk(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def sse_body(text: str = "hi") -> bytes:
    """A complete Chat Completions stream: content, finish, usage, ``[DONE]``."""
    base = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    return b"".join(
        [
            _chunk({**base, "choices": [{"index": 0, "delta": {"content": text}}]}),
            _chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            _chunk(
                {
                    **base,
                    "choices": [],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            ),
            b"data: [DONE]\n\n",
        ]
    )


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def complete_response(text: str = "hi") -> bytes:
    """A whole response with a length: nothing is left to read after the terminator."""
    return http11_sse_response(sse_body(text))


@attrs.define
class Server:
    port: int = 0
    #: Connections accepted, requests read (over all connections).
    connections: int = 0
    requests: int = 0
    #: Requests read and then dropped with their connection, unanswered.
    unanswered: int = 0
    #: When (trio time) each connection was closed by the client, in order.
    closed_by_client: list[float] = attrs.field(factory=list)
    #: Set when the client closes a connection.
    client_closed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


class _Reader:
    """Reads HTTP/1.1 requests (head and a content-length body) off one connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def _more(self) -> bool:
        data = await self._stream.receive_some(65536)
        self._buffer += data
        return bool(data)

    async def request(self) -> bytes | None:
        """The next request, or ``None`` once the client closed the connection."""
        while b"\r\n\r\n" not in self._buffer:
            if not await self._more():
                return None
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(self._buffer) < length:
            if not await self._more():
                return None
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return head + b"\r\n\r\n" + body

    async def wait_closed(self) -> None:
        """Wait until the client closes the connection."""
        while await self._more():
            pass


#: Answers the ``number``-th request on a connection (0 first); returns False to close it.
Handler = Callable[[trio.SocketStream, _Reader, Server, int], Awaitable[bool]]


@asynccontextmanager
async def keep_alive_server(handler: Handler) -> AsyncIterator[Server]:
    server = Server()

    async def on_connection(stream: trio.SocketStream) -> None:
        server.connections += 1
        reader = _Reader(stream)
        try:
            number = 0
            while await reader.request() is not None:
                server.requests += 1
                if not await handler(stream, reader, server, number):
                    break
                number += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
        )
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()


def config_for(server: Server, **changes: object) -> SamplerConfig:
    base = SamplerConfig(
        base_url=server.base_url,
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="m",
        api_key=KEY,
        timeouts=Timeouts(connect=5.0, response_headers=5.0, first_token=5.0, idle=5.0),
        retry=RetryPolicy(max_retries=0),
    )
    return base.evolve(**changes) if changes else base


def terminal_of(events: list[SamplingEvent]) -> Completed | Failed:
    end = events[-1]
    assert isinstance(end, Completed | Failed), events
    assert sum(isinstance(e, Completed | Failed) for e in events) == 1
    return end


# -- the drain after the terminator ---------------------------------------------------


class DrainTasks(trio.abc.Instrument):
    """Counts the connection-drain tasks started while it is installed."""

    def __init__(self) -> None:
        self.started = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name == "trio_sampler connection drain":
            self.started += 1


@asynccontextmanager
async def counting_drains() -> AsyncIterator[DrainTasks]:
    drains = DrainTasks()
    trio.lowlevel.add_instrument(drains)
    try:
        yield drains
    finally:
        trio.lowlevel.remove_instrument(drains)


async def whole_chunked_reply(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """The whole stream and the last chunk in one write, keep-alive."""
    await stream.send_all(CHUNKED_HEAD + http_chunk(sse_body(f"reply {number}")) + LAST_CHUNK)
    return True


async def whole_length_reply(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """The whole stream with a ``content-length``, keep-alive."""
    await stream.send_all(complete_response(f"reply {number}"))
    return True


@pytest.mark.parametrize("handler", [whole_chunked_reply, whole_length_reply])
async def test_an_end_of_body_that_came_with_it_is_read_at_once(handler: Handler) -> None:
    """Nothing to wait for after the terminator: the end of the body is read before
    ``Completed`` is delivered, with no task of its own, and the connection is reused."""
    with trio.fail_after(30):
        async with (
            keep_alive_server(handler) as server,
            open_sampler(config_for(server)) as sampler,
            counting_drains() as drains,
        ):
            ends = [terminal_of(await collect(sampler)) for _ in range(3)]
    assert [end.response.text for end in ends if isinstance(end, Completed)] == [
        "reply 0",
        "reply 1",
        "reply 2",
    ]
    assert drains.started == 0
    assert server.connections == 1


async def last_chunk_with_a_trailer(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """The last chunk carries a trailer field: not the bare end the client recognizes."""
    trailer = b"0\r\nx-checksum: %d\r\n\r\n" % number
    await stream.send_all(CHUNKED_HEAD + http_chunk(sse_body(f"reply {number}")) + trailer)
    return True


async def test_an_end_of_body_not_recognized_as_complete_is_drained_in_the_background() -> None:
    with trio.fail_after(30):
        async with (
            keep_alive_server(last_chunk_with_a_trailer) as server,
            open_sampler(config_for(server)) as sampler,
            counting_drains() as drains,
        ):
            for _ in range(3):
                assert isinstance(terminal_of(await collect(sampler)), Completed)
                await trio.sleep(0.1)  # the drain reads the trailer meanwhile
    assert drains.started == 3
    assert server.connections == 1


async def late_last_chunk(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    await stream.send_all(CHUNKED_HEAD + http_chunk(sse_body(f"reply {number}")))
    await trio.sleep(0.2)
    await stream.send_all(LAST_CHUNK)
    return True


async def data_chunk_cut_short(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """A data chunk announced longer than what is sent of it (the rest never comes)."""
    body = sse_body()
    await stream.send_all(CHUNKED_HEAD + b"%x\r\n%s" % (len(body) + 10, body))
    await reader.wait_closed()
    return False


@pytest.mark.parametrize(
    ("handler", "received"),
    [
        (whole_chunked_reply, True),
        (whole_length_reply, True),
        (last_chunk_with_a_trailer, False),
        (late_last_chunk, False),
        (data_chunk_cut_short, False),
    ],
)
async def test_the_client_tells_whether_the_end_of_a_body_has_arrived(
    autojump_clock: trio.testing.MockClock, handler: Handler, received: bool
) -> None:
    """``ResponseStream.end_received`` once the stream's terminator is read, on real
    httpx2 connections: it reads what h11 holds unparsed, through httpcore2 objects that
    are private, so this is also the test that fails if httpcore2 changes them."""
    async with keep_alive_server(handler) as server:
        config = config_for(server)
        wire = build_request(config.backend, REQUEST, config.build_options())
        async with SamplingClient(config) as client, client.open_stream(wire) as stream:
            body = b""
            while b"[DONE]" not in body:
                body += await stream.__anext__()
            assert stream.end_received() is received
            if received:  # then reading to the end does not wait at all
                start = trio.current_time()
                with pytest.raises(StopAsyncIteration):
                    await stream.__anext__()
                assert trio.current_time() == start
                assert stream.end_received()


async def hold_body_open(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """The whole stream, terminator included, in an unfinished chunked body held open
    until the client closes the connection."""
    await stream.send_all(CHUNKED_HEAD + http_chunk(sse_body()))
    await reader.wait_closed()
    server.closed_by_client.append(trio.current_time())
    server.client_closed.set()
    return False


async def test_completed_does_not_wait_for_the_end_of_the_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        keep_alive_server(hold_body_open) as server,
        open_sampler(config_for(server)) as sampler,
    ):
        start = trio.current_time()
        events = [event async for event in await sampler.submit(REQUEST)]
        completed_after = trio.current_time() - start
        end = terminal_of(events)
        assert isinstance(end, Completed) and end.response.text == "hi"
        # Delivered when the terminator was parsed: no virtual time passed at all.
        assert completed_after == 0.0
        # The unfinished body is still drained in the background, bounded in time
        # (one second), and then the connection is closed.
        with trio.fail_after(5):
            await server.client_closed.wait()
        assert 1.0 <= server.closed_by_client[0] - start < 1.1


async def test_total_timeout_does_not_count_the_drain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with keep_alive_server(hold_body_open) as server:
        config = config_for(server, timeouts=Timeouts(total=0.5))
        async with open_sampler(config) as sampler:
            events = [event async for event in await sampler.submit(REQUEST)]
    end = terminal_of(events)
    assert isinstance(end, Completed), end


async def test_leaving_the_sampler_closes_a_connection_being_drained(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with keep_alive_server(hold_body_open) as server:
        async with open_sampler(config_for(server)) as sampler:
            events = [event async for event in await sampler.submit(REQUEST)]
            assert isinstance(terminal_of(events), Completed)
            left_at = trio.current_time()
        # Leaving did not wait out the drain's second: the connection was closed at once.
        assert trio.current_time() == left_at
        with trio.fail_after(5):
            await server.client_closed.wait()
        assert server.closed_by_client[0] < left_at + 0.1


async def test_connection_is_reused_after_a_late_end_of_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The last chunk comes 0.2 s after the terminator: ``Completed`` does not wait for
    it, and the next request still goes over the same connection."""
    async with (
        keep_alive_server(late_last_chunk) as server,
        open_sampler(config_for(server)) as sampler,
    ):
        texts = []
        for _ in range(3):
            start = trio.current_time()
            events = [event async for event in await sampler.submit(REQUEST)]
            assert trio.current_time() == start  # Completed before the last chunk
            end = terminal_of(events)
            assert isinstance(end, Completed)
            texts.append(end.response.text)
            await trio.sleep(0.5)  # the drain has read the last chunk by now
    assert texts == ["reply 0", "reply 1", "reply 2"]
    assert server.connections == 1


async def test_scripted_stall_after_the_terminator_does_not_delay_completed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("hi"), then="stall")])
    config = make_config(timeouts=Timeouts(total=0.5))
    async with open_sampler(config, transport=transport) as sampler:
        start = trio.current_time()
        events = [event async for event in await sampler.submit(REQUEST)]
        assert trio.current_time() == start
    end = terminal_of(events)
    assert isinstance(end, Completed) and end.response.text == "hi"
    assert transport.closed_bodies == transport.opened_bodies == 1


# -- the keep-alive race ----------------------------------------------------------------


async def drop_on_reuse(
    stream: trio.SocketStream, reader: _Reader, server: Server, number: int
) -> bool:
    """Answer a connection's first request; on the next one, close without answering:
    what the client sees when the server closed an idle connection just as it was reused."""
    if number == 0:
        await stream.send_all(complete_response(f"reply {server.requests}"))
        return True
    server.unanswered += 1
    return False


async def collect(sampler: SamplerHandle) -> list[SamplingEvent]:
    return [event async for event in await sampler.submit(REQUEST)]


async def test_a_reused_connection_dropped_after_the_request_is_a_visible_retry() -> None:
    """20 requests, each sent on a pooled connection the server then drops unanswered
    after reading the request: the server may have acted on it, so each shows one
    ``Retrying`` (a transport error, a retry spent) and completes on a new connection;
    nothing is sent unseen (see ``test_http_resend_rule`` for the one resend allowed)."""
    with trio.fail_after(60):
        async with (
            keep_alive_server(drop_on_reuse) as server,
            open_sampler(
                config_for(server, retry=RetryPolicy(max_retries=1, base_delay=0.001))
            ) as sampler,
        ):
            runs = [await collect(sampler) for _ in range(20)]
    retrying = [[e.kind for e in events if isinstance(e, Retrying)] for events in runs]
    assert retrying == [[]] + [[SamplingErrorKind.TRANSPORT]] * 19
    ends = [terminal_of(events) for events in runs]
    assert all(isinstance(end, Completed) for end in ends)
    assert server.unanswered == 19
    assert server.requests == 1 + 2 * 19  # one POST per attempt the caller saw


async def test_the_same_failure_on_a_fresh_connection_is_a_visible_retry() -> None:
    async def drop_everything(
        stream: trio.SocketStream, reader: _Reader, server: Server, number: int
    ) -> bool:
        server.unanswered += 1
        return False

    with trio.fail_after(30):
        async with keep_alive_server(drop_everything) as server:
            config = config_for(server, retry=RetryPolicy(max_retries=1, base_delay=0.01))
            async with open_sampler(config) as sampler:
                events = await collect(sampler)
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert [r.kind for r in retrying] == [SamplingErrorKind.TRANSPORT]
    end = terminal_of(events)
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.TRANSPORT
    assert server.connections == 2 and server.requests == 2  # nothing resent unseen


async def test_a_response_cut_after_its_headers_is_not_resent() -> None:
    """Bytes of a response arrived: that is a broken response, not the race."""

    async def cut_on_reuse(
        stream: trio.SocketStream, reader: _Reader, server: Server, number: int
    ) -> bool:
        if number == 0:
            await stream.send_all(complete_response())
            return True
        await stream.send_all(CHUNKED_HEAD + http_chunk(sse_body()[:40]))
        return False

    with trio.fail_after(30):
        async with (
            keep_alive_server(cut_on_reuse) as server,
            open_sampler(config_for(server)) as sampler,
        ):
            first = terminal_of(await collect(sampler))
            second = terminal_of(await collect(sampler))
    assert isinstance(first, Completed)
    assert isinstance(second, Failed) and second.error.kind is SamplingErrorKind.TRANSPORT
    assert server.requests == 2 and server.connections == 1
