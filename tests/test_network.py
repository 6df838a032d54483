"""The network backend under the client's own pools: a request goes out in one write, and
nothing written ever waits for a write that does not come.

httpcore's HTTP/1.1 connection writes a request in pieces (its head, each chunk of its
body, the end of the message); the backend holds a small piece until the next one and
sends them together. The end-to-end tests count the writes that reach the connection's
socket stream while a real loopback server reads the request; the others drive one connection
over a recording stream, the way httpcore drives it.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import inf

import httpcore2
import pytest
import trio
from fakes import chat_stream, http11_sse_response, make_config
from loopback import read_request, serve

from trio_sampler._network import JOIN_MAX_BYTES, TrioNetworkBackend, _Connection
from trio_sampler._receive_time import StampedSocketStream
from trio_sampler.client import SamplingClient
from trio_sampler.types import ConversationRequest, User
from trio_sampler.wire import build_request


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every write the client's connections hand to their socket stream, in order (each
    one system call, unless the socket's buffer is full)."""
    seen: list[bytes] = []
    original = StampedSocketStream.send_all

    async def send_all(
        self: StampedSocketStream,
        data: bytes | bytearray | memoryview,
        *,
        wait_s: float = inf,
        schedule: bool = True,
    ) -> None:
        seen.append(bytes(data))
        await original(self, data, wait_s=wait_s, schedule=schedule)

    monkeypatch.setattr(StampedSocketStream, "send_all", send_all)
    yield seen


async def echo_length(stream: trio.SocketStream) -> None:
    """Answer each request with its body's length, as plain text."""
    while (request := await read_request(stream)) is not None:
        body = str(len(request[1])).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body)
        await stream.send_all(head + body)


async def test_a_sampling_request_is_one_write(sends: list[bytes]) -> None:
    body = b"".join(piece for piece in chat_stream("hi") if isinstance(piece, bytes))

    async def answer(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            await stream.send_all(http11_sse_response(body))

    with trio.fail_after(30):
        async with serve(answer) as port:
            config = make_config(base_url=f"http://127.0.0.1:{port}/v1")
            wire = build_request(
                config.backend, ConversationRequest(items=[User("hello")]), config.build_options()
            )
            async with SamplingClient(config) as client:
                for _ in range(3):  # a new connection, then reused ones
                    async with client.open_stream(wire) as stream:
                        async for _ in stream:
                            pass
    assert len(sends) == 3
    for sent in sends:
        head, _, body = sent.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert body == wire.body


@pytest.mark.parametrize(
    ("size", "writes"),
    [
        (0, 1),  # a head alone: sent at the end of the message
        (1000, 1),
        (JOIN_MAX_BYTES, 1),
        (JOIN_MAX_BYTES + 1, 2),  # a large body is not copied to go with the head
    ],
)
async def test_the_server_gets_every_byte_in_as_few_writes(
    sends: list[bytes], size: int, writes: int
) -> None:
    with trio.fail_after(30):
        async with (
            serve(echo_length) as port,
            httpcore2.AsyncConnectionPool(network_backend=TrioNetworkBackend()) as pool,
        ):
            for _ in range(2):
                sends.clear()
                response = await pool.request(
                    "POST", f"http://127.0.0.1:{port}/", content=b"x" * size
                )
                assert response.status == 200
                assert response.content == str(size).encode()
                assert len(sends) == writes
                assert sum(len(s) for s in sends) > size


async def test_a_request_without_a_body_is_sent_whole(sends: list[bytes]) -> None:
    with trio.fail_after(30):
        async with (
            serve(echo_length) as port,
            httpcore2.AsyncConnectionPool(network_backend=TrioNetworkBackend()) as pool,
        ):
            response = await pool.request("GET", f"http://127.0.0.1:{port}/")
    assert response.content == b"0"
    assert len(sends) == 1 and sends[0].startswith(b"GET / HTTP/1.1\r\n")


class Recording(trio.abc.HalfCloseableStream):
    """A socket stream that notes each operation; reads return ``reply`` once."""

    def __init__(self, reply: bytes = b"", broken: bool = False) -> None:
        self.log: list[tuple[str, bytes]] = []
        self.reply = reply
        self.broken = broken
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self.broken:
            raise trio.BrokenResourceError("reset by peer")
        self.log.append(("send", bytes(data)))

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.broken:
            raise trio.BrokenResourceError("reset by peer")
        self.log.append(("receive", b""))
        reply, self.reply = self.reply, b""
        return reply

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


def connection(inner: Recording) -> _Connection:
    return _Connection(inner, stamped=False)  # type: ignore[arg-type]  # a stand-in socket


async def test_a_held_write_goes_out_before_a_read() -> None:
    inner = Recording(reply=b"HTTP/1.1 204 No Content\r\n\r\n")
    conn = connection(inner)
    await conn.write(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    assert inner.log == []  # held for what follows
    assert await conn.read(65536) == b"HTTP/1.1 204 No Content\r\n\r\n"
    assert inner.log == [("send", b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"), ("receive", b"")]


async def test_the_pieces_of_a_request_go_out_in_order_as_one() -> None:
    inner = Recording()
    conn = connection(inner)
    await conn.write(b"head;")
    await conn.write(b"body")
    await conn.write(b"")  # the end of the message: nothing held, nothing sent
    await conn.write(b"next head;")
    await conn.write(b"")
    assert inner.log == [("send", b"head;body"), ("send", b"next head;")]


async def test_an_http2_connection_is_written_as_it_comes() -> None:
    inner = Recording()
    conn = connection(inner)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    await conn.write(preface)
    await conn.write(b"frame")
    assert inner.log == [("send", preface), ("send", b"frame")]


async def test_a_failed_send_at_a_read_is_reported_by_the_read() -> None:
    # httpcore ignores a failed request write and lets the read say what happened.
    conn = connection(Recording(broken=True))
    await conn.write(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(httpcore2.ReadError):
        await conn.read(65536)


async def test_a_failed_send_is_a_write_error() -> None:
    conn = connection(Recording(broken=True))
    await conn.write(b"head;")
    with pytest.raises(httpcore2.WriteError):
        await conn.write(b"body")


async def test_closing_drops_what_is_held() -> None:
    inner = Recording()
    conn = connection(inner)
    await conn.write(b"head;")
    await conn.aclose()
    assert inner.closed and inner.log == []


class Stalled(Recording):
    """A socket stream whose writes never complete (a peer that stopped reading)."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep_forever()


async def test_a_write_that_outlasts_its_timeout_is_a_write_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    conn = connection(Stalled())
    started = trio.current_time()
    with pytest.raises(httpcore2.WriteTimeout) as raised:
        await conn.write(b"x" * (JOIN_MAX_BYTES + 1), timeout=5.0)
    assert trio.current_time() - started == pytest.approx(5.0)
    assert isinstance(raised.value.__cause__, trio.TooSlowError)


async def test_a_socket_write_that_waits_past_its_timeout_is_a_write_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The socket takes what fits at once; the rest waits for a peer that does not read,
    # and that wait is bounded by the write timeout.
    ours, peer = trio.socket.socketpair()
    with ours, peer:
        stream = StampedSocketStream(trio.SocketStream(ours), stamp_reads=False)
        conn = _Connection(stream, stamped=False)
        started = trio.current_time()
        with pytest.raises(httpcore2.WriteTimeout) as raised:
            await conn.write(b"x" * (16 * 1024 * 1024), timeout=5.0)
        assert trio.current_time() - started == pytest.approx(5.0)
        assert isinstance(raised.value.__cause__, trio.TooSlowError)
