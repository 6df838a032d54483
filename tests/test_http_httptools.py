"""The C-parser transport (``SamplerConfig(http_transport="httptools")``) over real
loopback sockets: what the contract suite's scripted server does not reach.

* Keep-alive: a body read to its end gives its connection back, and the next request
  to the origin goes on it; a body closed unfinished closes its connection.
* Bodies framed each way: chunked, ``Content-Length`` and delimited by the close; a body
  cut short is a transport failure, never a complete answer.
* The resend rule of ``docs/retry-policy.md``, as the default transport keeps it: a
  request the server read is one visible attempt; a write refused whole on a reused
  connection is resent unseen.
* The head's timeout and the connect timeout say which fired; TLS with the system's CA
  store (``SSL_CERT_FILE``); receive stamps when asked for.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme
from fakes import http11_sse_response
from loopback import read_request, serve, take_all, take_next
from test_http_resend_rule import (
    BREAKS,
    RESPONSE,
    SSE,
    Origin,
    _reset,
    breaking_on_reuse,
    collect,
    config_for,
    unaccepting_port,
)

from trio_sampler._http import DirectTransport, HttpxTransport
from trio_sampler._http._httptools import HttptoolsTransport, _Connection
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
    User,
)
from trio_sampler.wire import build_request

REQUEST = ConversationRequest(items=[User("hello")])


def httptools_config(origin: Origin, **changes: object) -> SamplerConfig:
    return config_for(origin, http_transport="httptools", **changes)


def chunked(*pieces: bytes) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@asynccontextmanager
async def answering(response: bytes, *, close: bool = False) -> AsyncIterator[Origin]:
    """Answer every request with ``response`` (then close the connection if ``close``)."""
    origin = Origin()

    async def on_connection(stream: trio.SocketStream) -> None:
        origin.connections += 1
        while await read_request(stream) is not None:
            origin.posts += 1
            await stream.send_all(response)
            if close:
                return

    async with serve(on_connection) as port:
        origin.port = port
        yield origin


def test_the_option_names_what_it_takes() -> None:
    with pytest.raises(ValueError, match="http_transport must be one of 'direct', 'httptools'"):
        SamplerConfig(base_url="http://x.test/v1", http_transport="h11")


@pytest.mark.parametrize(
    ("name", "transport"),
    [("direct", DirectTransport), ("httptools", HttptoolsTransport), ("httpx", HttpxTransport)],
)
async def test_the_option_selects_the_transport_a_sampler_opens(
    name: str, transport: type[object]
) -> None:
    config = SamplerConfig(base_url="http://x.test/v1", http_transport=name)
    async with SamplingClient(config) as client:
        assert type(client.transport) is transport


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(
            chunked(*SSE.split(b"\n\n")[:1], b"\n\n", SSE[SSE.index(b"data: [D") :]), id="chunked"
        ),
        pytest.param(RESPONSE, id="content-length"),
    ],
)
async def test_a_body_read_to_its_end_gives_its_connection_back(response: bytes) -> None:
    with trio.fail_after(30):
        async with answering(response) as origin:
            runs = await collect(httptools_config(origin), 3)
    assert all(isinstance(events[-1], Completed) for events in runs), runs
    assert origin.posts == 3
    assert origin.connections == 1


async def test_a_body_delimited_by_the_close_ends_there() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    with trio.fail_after(30):
        async with answering(head + SSE, close=True) as origin:
            runs = await collect(httptools_config(origin), 2)
    assert all(isinstance(events[-1], Completed) for events in runs), runs
    assert origin.connections == 2


async def test_a_body_cut_short_is_a_transport_failure() -> None:
    cut = chunked(SSE)[:-12]  # the last chunk's end and the terminator never come
    config = httptools_config(Origin(), retry=RetryPolicy(max_retries=0))
    with trio.fail_after(30):
        async with answering(cut, close=True) as origin:
            (events,) = await collect(config.evolve(base_url=origin.base_url), 1)
    end = events[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.TRANSPORT, end


@pytest.mark.parametrize(("head_bytes", "hold", "how"), BREAKS)
async def test_a_post_the_server_read_is_one_visible_attempt(
    head_bytes: int, hold: float, how: str
) -> None:
    with trio.fail_after(30):
        async with breaking_on_reuse(head_bytes, hold, how) as origin:
            retry = RetryPolicy(max_retries=1, base_delay=0.01, jitter=0.0)
            first, second = await collect(httptools_config(origin, retry=retry), 2)
    assert isinstance(first[-1], Completed)
    assert [e.kind for e in second if isinstance(e, Retrying)] == [SamplingErrorKind.TRANSPORT]
    assert isinstance(second[-1], Completed)
    assert origin.posts == 3
    assert origin.connections == 2


async def test_a_write_refused_whole_on_a_reused_connection_is_resent_unseen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server resets each connection after its answer; the pool is told the
    connection is quiet, so the next request is written to it, refused whole, and sent
    again on a new connection: no retry spent, one POST per request."""
    monkeypatch.setattr(_Connection, "dead", lambda self: False)
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
        config = httptools_config(origin, retry=RetryPolicy(max_retries=0))
        with trio.fail_after(30):
            async with open_sampler(config) as sampler:
                runs = []
                for _ in range(3):
                    runs.append([e async for e in await sampler.submit(REQUEST)])
                    await trio.sleep(0.2)  # the reset arrives before the next request
    assert all(isinstance(events[-1], Completed) for events in runs), runs
    assert not [e for events in runs for e in events if isinstance(e, Retrying)]
    assert origin.posts == 3


async def test_the_head_and_connect_timeouts_say_which_and_how_long() -> None:
    async def never_answer(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            await trio.sleep_forever()

    timeouts = Timeouts(connect=0.3, response_headers=0.5, first_token=0.2, idle=0.2)
    async with serve(never_answer) as port:
        origin = Origin(port=port)
        config = httptools_config(origin, timeouts=timeouts, retry=RetryPolicy(max_retries=0))
        with trio.fail_after(30):
            (events,) = await collect(config, 1)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.message == "response headers timeout: no response headers within 0.5 s"
    async with unaccepting_port() as port:
        config = httptools_config(Origin(port=port), timeouts=timeouts)
        wire = build_request(config.backend, REQUEST, config.build_options())
        with trio.fail_after(30), pytest.raises(SamplingClientError) as caught:
            async with SamplingClient(config) as client, client.open_stream(wire):
                pass
    assert caught.value.info.message == "connect timeout: no connection within 0.3 s"


async def test_tls_with_the_system_ca_store_keep_alive_and_receive_stamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    authority = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(served)

    connections = 0

    async def over_tls(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        tls = trio.SSLStream(stream, served, server_side=True)
        while await read_request(tls) is not None:  # type: ignore[arg-type]
            await tls.send_all(http11_sse_response(SSE))

    async with serve(over_tls) as port:
        config = SamplerConfig(
            base_url=f"https://127.0.0.1:{port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="m",
            api_key="sk-TLS-0123456789abcdef",
            http_transport="httptools",
            receive_timestamps=True,
        )
        wire = build_request(config.backend, REQUEST, config.build_options())
        transport = HttptoolsTransport(config)
        with trio.fail_after(30):
            async with SamplingClient(config, transport=transport) as client:
                for _ in range(2):
                    async with client.open_stream(wire) as stream:
                        body = b"".join([chunk async for chunk in stream])
                        assert stream.received_at is not None
                        assert stream.end_received()
            await transport.aclose()
    assert body == SSE
    assert connections == 1  # the second request went on the kept connection


@pytest.mark.parametrize("transport", ["httptools", "direct"])
@pytest.mark.parametrize("stamped", [False, True], ids=["plain", "stamped"])
async def test_socket_reads_take_a_body_to_its_end_and_keep_its_connection(
    transport: str, stamped: bool
) -> None:
    """Over plain TCP a response offers reads without a coroutine (``socket_reads``):
    ``take`` gives the body, then ``None`` at its end; the response then ends as after
    ``async for`` (the connection is reused), and stamped reads say when bytes arrived.
    A compressed body is read with ``async for`` only."""
    response = chunked(*SSE.split(b"\n\n")[:1], b"\n\n", SSE[SSE.index(b"data: [D") :])
    gzipped = response.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n", 1)
    with trio.fail_after(30):
        async with answering(response) as origin, answering(gzipped) as compressed:
            config = config_for(origin, http_transport=transport, receive_timestamps=stamped)
            wire = build_request(config.backend, REQUEST, config.build_options())
            async with SamplingClient(config) as client:
                for _ in range(2):
                    async with client.open_stream(wire) as stream:
                        assert stream.socket_reads() is stream
                        taken = await take_all(stream)
                        assert (stream.received_at is not None) is stamped
                        with pytest.raises(StopAsyncIteration):
                            await stream.__anext__()
                        assert stream.end_received()
                    assert b"".join(c for c in taken if c) == SSE and taken[-1] is None
                other = config.evolve(base_url=compressed.base_url)
                async with client.open_stream(wire, config=other) as stream:
                    assert stream.socket_reads() is None
    assert origin.connections == 1 and origin.posts == 2


@pytest.mark.parametrize("transport", ["httptools", "direct"])
async def test_a_drain_after_socket_reads_goes_on_with_them_and_keeps_the_connection(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a body read over socket reads (what the actor drains once the stream
    is complete) is read the same way: the transport's own body iterator is never
    started for it, and the connection goes back to the pool."""
    response = chunked(*SSE.split(b"\n\n")[:1], b"\n\n", SSE[SSE.index(b"data: [D") :])
    with trio.fail_after(30):
        async with answering(response) as origin:
            config = config_for(origin, http_transport=transport)
            wire = build_request(config.backend, REQUEST, config.build_options())
            async with SamplingClient(config) as client:
                for _ in range(2):
                    async with client.open_stream(wire) as stream:
                        assert stream.socket_reads() is stream
                        assert await take_next(stream)
                        body = type(stream._body)

                        def no_iterator(self: object) -> None:
                            raise AssertionError("the body's own iterator was started")

                        with monkeypatch.context() as patch:
                            patch.setattr(body, "chunks", no_iterator)
                            await stream.drain(max_bytes=1 << 20)
                        assert stream.end_received()
    assert origin.connections == 1 and origin.posts == 2


@pytest.mark.parametrize("transport", ["httptools", "direct"])
async def test_the_idle_timer_restarts_at_each_token_past_the_first_token_timer(
    transport: str,
) -> None:
    """Tokens 50 ms apart under a 0.4 s idle timer run on past the first-token timer
    (0.5 s) and past each deadline the reads' scope kept from earlier tokens (the scope's
    deadline lags the timer's: ``_Body``), and the silence after the last token fails
    as an idle timeout about 0.4 s after it, with every token in the partial."""
    tokens = 24
    sent_last: list[float] = []

    async def drip(stream: trio.SocketStream) -> None:
        while await read_request(stream) is not None:
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            await stream.send_all(head)
            for _ in range(tokens):
                event = (
                    b'data: {"id":"c","object":"chat.completion.chunk","model":"m",'
                    b'"choices":[{"index":0,"delta":{"content":"t"}}]}\n\n'
                )
                await stream.send_all(b"%x\r\n%s\r\n" % (len(event), event))
                sent_last[:] = [trio.current_time()]
                await trio.sleep(0.05)
            await trio.sleep_forever()

    timeouts = Timeouts(first_token=0.5, idle=0.4)
    async with serve(drip) as port:
        origin = Origin(port=port)
        config = config_for(
            origin, http_transport=transport, timeouts=timeouts, retry=RetryPolicy(max_retries=0)
        )
        with trio.fail_after(30):
            (events,) = await collect(config, 1)
            ended = trio.current_time()
    end = events[-1]
    assert isinstance(end, Failed), events
    assert end.error.error_code == "idle_timeout"
    assert end.partial is not None and end.partial.text == "t" * tokens
    assert 0.35 <= ended - sent_last[0] < 1.5
