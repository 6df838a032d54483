"""The emulator against hostile HTTP/2 clients, over loopback with a raw ``h2`` client.

Each connection is isolated: whatever one connection does (resets streams as fast as it
can open them, sends a body too slowly and keeps sending after its 408), the server logs
it, ends that connection only and goes on serving others. The ``drop`` fault resets its
HTTP/2 stream, so the client sees the error at once rather than at its idle timeout.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx2
import orjson
import pytest
import trio
import trio.testing
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.tcp_server import TCPServer

from trio_sampler.emulator import EmulatorApp, EmulatorServer, _app, script_headers, serve
from trio_sampler.emulator._budget import Frames, ReplyBudget, stream_deltas
from trio_sampler.emulator._reply import PlannedToolCall, Reply, ReplyUsage
from trio_sampler.emulator._serve import MAX_RESETS
from trio_sampler.emulator._validate import ApiError

CHAT: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


class RawH2:
    """An HTTP/2 client connection driven frame by frame (prior knowledge, no TLS)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send_all(data)

    def headers(self, path: str, extra: dict[str, str] | None = None) -> list[tuple[str, str]]:
        return [
            (":method", "POST"),
            (":path", path),
            (":scheme", "http"),
            (":authority", "localhost"),
            ("content-type", "application/json"),
            *(extra or {}).items(),
        ]

    async def events(self) -> list[h2.events.Event]:
        """The events of the next read (``[]`` when the server closed the connection)."""
        data = await self.stream.receive_some(65536)
        if not data:
            return []
        events = self.conn.receive_data(data)
        await self.flush()
        return list(events)


@asynccontextmanager
async def raw_h2(server: EmulatorServer) -> AsyncIterator[RawH2]:
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        client = RawH2(stream)
        client.conn.initiate_connection()
        await client.flush()
        yield client


async def served_normally(server: EmulatorServer) -> bool:
    """Whether a fresh connection still gets a normal answer."""
    async with httpx2.AsyncClient(timeout=10) as client:
        response = await client.post(server.url_for("chat_completions"), json=CHAT)
    return response.status_code == 200 and bool(response.json()["choices"])


async def test_slow_http2_body_gets_its_408_and_the_server_lives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, body_timeout=0.2))
        async with raw_h2(server) as client:
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, client.headers("/v1/chat/completions"))
            client.conn.send_data(stream_id, b'{"model": ')
            await client.flush()
            status = None
            with trio.fail_after(10):
                while status is None:
                    for event in await client.events():
                        if isinstance(event, h2.events.ResponseReceived):
                            status = dict(cast(list[tuple[str, str]], event.headers))[":status"]
            assert status == "408"
            # The client goes on sending on the stream the server has answered and closed:
            # the server ends this connection.
            with pytest.raises(trio.BrokenResourceError):
                for _ in range(50):
                    client.conn.send_data(stream_id, b" " * 100)
                    await client.flush()
                    await trio.sleep(0.02)
        assert await served_normally(server)
        nursery.cancel_scope.cancel()
    logged = [r for r in caplog.records if r.name == "trio_sampler.emulator"]
    assert [r.getMessage().endswith("ended by an exception") for r in logged] == [True]


class CountingApp(EmulatorApp):
    """An emulator app that counts the requests reaching it."""

    calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.calls += 1
        await super().__call__(scope, receive, send)


async def rapid_reset(client: RawH2, streams: int) -> None:
    """Open ``streams`` streams, each reset right after its request, in one write."""
    for _ in range(streams):
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, client.headers("/v1/chat/completions"))
        client.conn.send_data(stream_id, orjson.dumps(CHAT), end_stream=True)
        client.conn.reset_stream(stream_id)
    await client.flush()


async def test_http2_rapid_reset_is_answered_with_goaway_and_the_server_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        for _ in range(3):
            async with raw_h2(server) as client:
                await rapid_reset(client, MAX_RESETS + 50)
                goaway = None
                with trio.fail_after(10):
                    while events := await client.events():
                        for event in events:
                            if isinstance(event, h2.events.ConnectionTerminated):
                                goaway = event
                # The server told the client why, then closed the connection.
                assert goaway is not None
                assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert await served_normally(server)
        nursery.cancel_scope.cancel()
    logged = [r.getMessage() for r in caplog.records if r.name == "trio_sampler.emulator"]
    assert len(logged) == 3
    assert all(f"reset more than {MAX_RESETS} streams" in message for message in logged)


async def test_http2_streams_opened_and_reset_in_one_read_never_reach_the_app() -> None:
    app = CountingApp()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app))
        async with raw_h2(server) as client:
            await rapid_reset(client, 50)
            # A normal request on the same connection: answered, and the app's only one.
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, client.headers("/v1/chat/completions"))
            client.conn.send_data(stream_id, orjson.dumps(CHAT), end_stream=True)
            await client.flush()
            ended = False
            with trio.fail_after(10):
                while not ended:
                    events = await client.events()
                    assert events, "the connection closed under 50 resets"
                    ended = any(isinstance(e, h2.events.StreamEnded) for e in events)
        assert app.calls == 1
        nursery.cancel_scope.cancel()


async def test_drop_over_http2_resets_the_stream_at_once() -> None:
    headers = script_headers(faults=[{"type": "drop", "after_events": 3}])
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        async with raw_h2(server) as client:
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, client.headers("/v1/chat/completions", headers))
            client.conn.send_data(stream_id, orjson.dumps({**CHAT, "stream": True}), True)
            await client.flush()
            received = b""
            reset = None
            with trio.fail_after(5):  # an open stream would wait out this timeout
                while reset is None:
                    events = await client.events()
                    assert events, "the connection closed instead of the stream being reset"
                    for event in events:
                        if isinstance(event, h2.events.DataReceived):
                            received += event.data
                        elif isinstance(event, h2.events.StreamReset):
                            reset = event
            assert reset.stream_id == stream_id
            assert received.count(b"\n\n") == 3  # the events before the drop arrived
            # The connection itself goes on: a second request on it is answered.
            second = client.conn.get_next_available_stream_id()
            client.conn.send_headers(second, client.headers("/v1/chat/completions"))
            client.conn.send_data(second, orjson.dumps(CHAT), end_stream=True)
            await client.flush()
            ended = False
            with trio.fail_after(5):
                while not ended:
                    for event in await client.events():
                        ended |= isinstance(event, h2.events.StreamEnded)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("backend", "field", "body"),
    [
        ("chat_completions", "max_tokens", CHAT),
        ("chat_completions", "max_completion_tokens", CHAT),
        ("responses", "max_output_tokens", {"model": "gpt-test", "input": "hi"}),
        ("messages", "max_tokens", {"model": "claude-test", "messages": CHAT["messages"]}),
    ],
)
async def test_more_output_tokens_than_any_model_gives_is_a_400_naming_the_field(
    backend: str, field: str, body: dict[str, Any]
) -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        async with httpx2.AsyncClient(timeout=10) as client:
            response = await client.post(
                server.url_for(backend),
                json={**body, field: 10**7, "stream": True},
                headers=script_headers(ignore_eos=True),
            )
        assert response.status_code == 400
        assert field in response.json()["error"]["message"]
        assert "128000" in response.json()["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_replies_held_for_clients_that_never_read_are_bounded_in_total() -> None:
    """One client asks for a long reply and never reads it: the reply stays held (the
    socket buffers are full). Past the server's bound, the next long reply is refused as
    overloaded (503) while a short one still fits."""
    long_reply = {**CHAT, "stream": True, "max_tokens": 100_000}
    app = EmulatorApp(max_reply_bytes=20 * 2**20)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app))
        body = orjson.dumps(long_reply)
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\nx-emulator-script: "
            b'{"ignore_eos": true}\r\ncontent-type: application/json\r\n'
            b"content-length: %d\r\n\r\n" % len(body)
        )
        async with await trio.open_tcp_stream(server.host, server.port) as idle:
            await idle.send_all(head + body)  # and never reads
            with trio.fail_after(10):
                while not app.replies.held:  # noqa: ASYNC110 (a counter, polled)
                    await trio.sleep(0.01)
            async with httpx2.AsyncClient(timeout=10) as client:
                refused = await client.post(
                    server.url_for("chat_completions"),
                    json=long_reply,
                    headers=script_headers(ignore_eos=True),
                )
                assert refused.status_code == 503
                assert "overloaded" in refused.json()["error"]["message"]
                assert await served_normally(server)
        with trio.fail_after(10):
            while app.replies.held:  # noqa: ASYNC110 (the client went away: it is let go)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


def test_the_hypercorn_internals_the_server_relies_on_are_where_it_expects_them() -> None:
    """``emulator/_serve.py`` reaches into Hypercorn (the reset bound, the ``drop`` fault):
    an upgrade that moves any of these fails here by name, not as a silent loss."""
    assert inspect.iscoroutinefunction(TCPServer.protocol_send)
    assert "self.protocol = ProtocolWrapper(" in inspect.getsource(TCPServer.run)
    assert "self.protocol = H2Protocol(" in inspect.getsource(ProtocolWrapper)
    handle = inspect.getsource(H2Protocol.handle)
    assert "await self._handle_events(events)" in handle
    assert "await self._flush()" in inspect.getsource(H2Protocol.initiate)
    for name in ("connection", "stream_buffers", "priority", "send", "client", "has_data"):
        assert name in inspect.getsource(H2Protocol.__init__), name
    stream_init = inspect.getsource(HTTPStream.__init__)
    assert "self.stream_id = " in stream_init
    assert "self.closed = " in stream_init


def test_a_rendered_stream_is_held_packed_and_counted_as_it_is_held() -> None:
    """The frames of a stream live in one buffer: read back frame by frame (by index,
    from the end, in slices) they are the frames rendered, and what the budget counts is
    what that buffer and its offsets take, not a list of small objects."""
    rendered = [b"data: %d\n\n" % n * (n % 7 + 1) for n in range(1000)]
    frames = Frames(rendered)
    assert list(frames) == rendered and len(frames) == len(rendered)
    assert frames[0] == rendered[0] and frames[-1] == rendered[-1] and frames[500] == rendered[500]
    assert list(frames[:-1]) == rendered[:-1] and list(frames[10:20]) == rendered[10:20]
    assert frames.data == b"".join(rendered)
    assert frames.nbytes == sys.getsizeof(frames.data) + sys.getsizeof(array("Q", range(1000)))
    with pytest.raises(IndexError):
        frames[1000]


def test_a_stream_that_would_pass_the_budget_is_refused_before_it_is_rendered() -> None:
    """A stream's size is learned per API from the last one held (bytes per delta); the
    next one is sized by its deltas before anything is rendered, and refused (503, 529
    for Anthropic) when it would pass the limit, while one that fits is not."""
    budget = ReplyBudget(limit=1000)
    budget.check(anthropic=False, api="chat_completions", deltas=10_000)  # nothing learned
    with budget.holding(600, anthropic=False, api="chat_completions", deltas=60):
        assert budget.per_delta["chat_completions"] == 10.0
        budget.check(anthropic=False, api="chat_completions", deltas=40)  # 400 more fits
        with pytest.raises(ApiError) as refused:
            budget.check(anthropic=True, api="chat_completions", deltas=41)
        assert refused.value.status == 529
        budget.check(anthropic=False, api="messages", deltas=10_000)  # not learned yet
    assert budget.held == 0


def test_the_deltas_of_a_reply_are_counted_without_rendering_it() -> None:
    """``stream_deltas`` counts one delta per word (or per ``chunk_chars`` slice) and per
    slice of tool arguments, plus the stream's own events: what sizes a reply up front."""
    words = Reply("seed", "", "one two three\nfour", (), None, "stop", ReplyUsage(1, 4))
    assert stream_deltas(words) == 4 + 1
    sliced = attrs.evolve(words, text="x" * 100, chunk_chars=10)
    assert stream_deltas(sliced) == 10 + 1
    call = PlannedToolCall("call_1", "f", '{"a": "' + "y" * 33 + '"}')  # 41 characters
    assert stream_deltas(attrs.evolve(words, text="", tool_calls=(call,))) == 6 + 1


async def test_long_replies_past_the_budget_are_refused_without_being_rendered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Clients that never read: the first long reply is held (its writes wait on the
    client), the next ones are refused with 503 and a ``retry-after`` before they are
    rendered, so what the server holds stays at the budget however many such clients
    come."""
    rendered: list[int] = []
    packed = Frames

    def counting(frames: Any) -> Frames:
        result = packed(frames)
        rendered.append(result.nbytes)
        return result

    monkeypatch.setattr(_app, "Frames", counting)
    app = EmulatorApp(max_reply_bytes=2 * 2**20)
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 100_000})
    statuses: list[int] = []

    async def never_reading_client() -> None:
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await trio.sleep_forever()  # the client stays connected
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
                if message["status"] == 503:
                    assert (b"retry-after", b"1") in message["headers"]
            elif message.get("more_body"):
                await trio.sleep_forever()  # the socket's buffers are full

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": [(b"x-emulator-script", b'{"ignore_eos": true}')],
            "query_string": b"",
            "http_version": "1.1",
        }
        await app(scope, cast(Any, receive), cast(Any, send))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(never_reading_client)
        await trio.testing.wait_all_tasks_blocked()
        assert statuses == [200, 503, 503, 503, 503]
        assert len(rendered) == 1 and app.replies.held == rendered[0] > 2 * 2**20
        nursery.cancel_scope.cancel()
