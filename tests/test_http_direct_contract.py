"""What the direct transport relies on that httpx2, httpcore2 and h11 keep private.

``trio_sampler._http._direct`` is the one module that touches their private state, and
it checks each step by type so that a change makes it answer "not taken" (the httpx2
path, no end-of-body probe) rather than fail a request. Silently slower is still a
regression: each test here names one thing relied on and fails loudly, with what
changed, when an upgrade of those libraries changes it.
"""

from __future__ import annotations

import socket
import struct

import h11
import httpcore2
import httpx2
import pytest
import trio
from fakes import http11_sse_response
from loopback import read_request, serve, take_all

from trio_sampler._http._direct import (
    _BROKEN_CONNECTION_ERRORS,
    POOL_TO_H11,
    TO_POOL_STREAM,
    own_pool,
    socket_reads,
    to_own_pool,
    use_own_backend,
)
from trio_sampler._network import EXCHANGE, Exchange, TrioNetworkBackend, _Connection

BODY = b"data: [DONE]\n\n"


async def answer(stream: trio.SocketStream) -> None:
    while await read_request(stream) is not None:
        await stream.send_all(http11_sse_response(BODY))


def test_the_client_keeps_its_pool_where_the_direct_path_finds_it() -> None:
    """``AsyncClient._transport`` is an ``AsyncHTTPTransport`` whose ``_pool`` is an
    ``httpcore2.AsyncConnectionPool``."""
    client = httpx2.AsyncClient()
    transport = getattr(client, "_transport", None)
    assert type(transport) is httpx2.AsyncHTTPTransport, (
        f"httpx2.AsyncClient._transport is now {type(transport)!r}"
    )
    pool = getattr(transport, "_pool", None)
    assert type(pool) is httpcore2.AsyncConnectionPool, (
        f"httpx2.AsyncHTTPTransport._pool is now {type(pool)!r}"
    )
    assert own_pool(client) is pool


def test_the_client_says_which_transport_a_url_takes() -> None:
    """``AsyncClient._transport_for_url(url)`` returns its own transport for a URL no
    proxy is mounted for, and the proxy's for one that is."""
    client = httpx2.AsyncClient()
    choose = getattr(client, "_transport_for_url", None)
    assert callable(choose), "httpx2.AsyncClient._transport_for_url is gone"
    assert to_own_pool(client, httpx2.URL("http://127.0.0.1:9/v1"))
    proxied = httpx2.AsyncClient(proxy="http://127.0.0.1:3128")
    assert not to_own_pool(proxied, httpx2.URL("http://127.0.0.1:9/v1"))


async def test_the_pool_takes_our_network_backend() -> None:
    """``AsyncConnectionPool._network_backend`` holds an ``AsyncNetworkBackend``, and one
    set there opens the pool's connections from then on."""
    async with serve(answer) as port, httpx2.AsyncClient() as client:
        pool = own_pool(client)
        backend = getattr(pool, "_network_backend", None)
        assert isinstance(backend, httpcore2.AsyncNetworkBackend), (
            f"httpcore2.AsyncConnectionPool._network_backend is now {type(backend)!r}"
        )
        assert use_own_backend(pool, stamped=False)
        assert type(getattr(pool, "_network_backend", None)) is TrioNetworkBackend
        response = await client.post(f"http://127.0.0.1:{port}/v1", content=b"{}")
        assert type(response.extensions["network_stream"]) is _Connection


def _walk(start: object, steps: tuple[tuple[str, str], ...]) -> object:
    node = start
    for attribute, class_name in steps:
        node = getattr(node, attribute, None)
        assert type(node).__name__ == class_name, (
            f"the step {attribute!r} now holds a {type(node).__name__}, not a {class_name}"
        )
    return node


async def test_a_body_leads_to_its_connections_h11_state() -> None:
    """From an ``httpx2.Response``'s stream, and from an ``httpcore2`` pool response's
    stream, the private steps the end-of-body probe walks reach h11's ``Connection``,
    whose public ``trailing_data`` is ``(bytes, bool)``."""
    async with serve(answer) as port, httpx2.AsyncClient() as client:
        url = f"http://127.0.0.1:{port}/v1"
        async with client.stream("POST", url, content=b"{}") as response:
            state = _walk(response.stream, TO_POOL_STREAM + POOL_TO_H11)
            assert isinstance(state, h11.Connection)
            unparsed = state.trailing_data
            assert isinstance(unparsed, tuple) and isinstance(unparsed[0], bytes)
            assert await response.aread() == BODY
        pool = own_pool(client)
        assert pool is not None
        core = await pool.handle_async_request(
            httpcore2.Request(
                b"POST", url, headers=[(b"Host", b"x"), (b"Content-Length", b"2")], content=b"{}"
            )
        )
        try:
            assert type(core.stream).__name__ == "PoolByteStream"
            assert isinstance(_walk(core.stream, POOL_TO_H11), h11.Connection)
        finally:
            await core.aclose()


async def test_the_pool_connects_and_writes_in_the_task_sending_the_request() -> None:
    """httpcore2 opens a request's connection (``connect_tcp``) and writes the request
    through the pool's network backend in the task that sends it: what lets our
    connections record the exchange for that task (``trio_sampler._network.Exchange``,
    read by the resend rule and for the request's sending time). A response carries
    ``http_version`` and ``network_stream``."""
    async with serve(answer) as port, httpx2.AsyncClient() as client:
        pool = own_pool(client)
        assert use_own_backend(pool, stamped=False)
        assert pool is not None
        exchanges = []
        for _ in range(2):  # a new connection, then the same one reused
            exchange = Exchange()
            recording = EXCHANGE.set(exchange)
            before = trio.current_time()
            try:
                core = await pool.handle_async_request(_post(port))
            finally:
                EXCHANGE.reset(recording)
            assert core.extensions["http_version"] == b"HTTP/1.1"
            assert "network_stream" in core.extensions
            await core.aread()
            await core.aclose()
            assert exchange.sent_at is not None and exchange.sent_at >= before
            exchanges.append(exchange)
    assert [e.connected for e in exchanges] == [True, False], "httpcore2 connects elsewhere"
    assert not any(e.refused or e.unwritten for e in exchanges)


async def test_a_write_refused_whole_reaches_the_sending_task_as_a_broken_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a reused connection the server has reset, httpcore2 writes the request through
    our connection, whose write is refused whole: the exchange says ``unwritten`` (not
    one byte went), and httpcore2 raises one of the errors the resend rule catches."""
    quiet = _Connection.get_extra_info

    def never_readable(self: _Connection, info: str) -> object:
        return False if info == "is_readable" else quiet(self, info)

    monkeypatch.setattr(_Connection, "get_extra_info", never_readable)

    async def answer_then_reset(stream: trio.SocketStream) -> None:
        if await read_request(stream) is not None:
            await stream.send_all(http11_sse_response(BODY))
            await trio.sleep(0.05)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()

    async with serve(answer_then_reset) as port, httpx2.AsyncClient() as client:
        pool = own_pool(client)
        assert use_own_backend(pool, stamped=False)
        assert pool is not None
        core = await pool.handle_async_request(_post(port))
        await core.aread()
        await core.aclose()
        await trio.sleep(0.3)  # the reset arrives
        exchange = Exchange()
        recording = EXCHANGE.set(exchange)
        try:
            with pytest.raises(_BROKEN_CONNECTION_ERRORS):
                await pool.handle_async_request(_post(port))
        finally:
            EXCHANGE.reset(recording)
    assert not exchange.connected and exchange.refused and exchange.unwritten


def _post(port: int) -> httpcore2.Request:
    return httpcore2.Request(
        b"POST",
        f"http://127.0.0.1:{port}/v1",
        headers=[(b"Host", b"x"), (b"Content-Length", b"2")],
        content=b"{}",
    )


async def test_socket_reads_read_a_body_through_h11_and_give_its_connection_back() -> None:
    """From a pool response's stream, ``_stream`` and ``_connection`` reach httpcore2's
    HTTP/1.1 connection, whose ``_network_stream`` is our connection: the direct body's
    reads without a coroutine (``socket_reads``) take h11's events from it, a read of
    the socket when h11 needs data, and the end of the message; closing the response then
    gives the connection back to the pool (the next request reuses it)."""
    sent_rest = trio.Event()
    may_send = trio.Event()

    async def paced(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            await stream.send_all(head + b"transfer-encoding: chunked\r\n\r\n")
            await may_send.wait()
            await stream.send_all(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
            sent_rest.set()

    async with serve(paced) as port, httpx2.AsyncClient() as client:
        pool = own_pool(client)
        assert pool is not None and use_own_backend(pool, stamped=False)
        request = httpcore2.Request(
            b"POST",
            f"http://127.0.0.1:{port}/v1",
            headers=[(b"Host", b"x"), (b"Content-Length", b"2")],
            content=b"{}",
        )
        core = await pool.handle_async_request(request)
        connection = _walk(core.stream, POOL_TO_H11[:2])
        assert type(getattr(connection, "_network_stream", None)) is _Connection, (
            "httpcore2's HTTP/1.1 connection no longer keeps its network stream in _network_stream"
        )
        reads = socket_reads(core.stream)
        assert reads is not None
        assert reads.take(False) == b""  # nothing parsed: wait for the socket
        may_send.set()
        await sent_rest.wait()
        assert await take_all(reads) == [BODY, None]
        await core.aclose()
        assert [c.is_idle() for c in pool.connections] == [True]
        again = await pool.handle_async_request(request)
        assert await again.aread() == BODY
        assert len(pool.connections) == 1  # the same connection, reused
