"""The client's direct path: a request to its own connection pool goes to ``httpcore2``
as httpx2 would send it, and everything httpx2 would do around it still happens.

Each test runs the same exchange twice over loopback, once on the direct path (the
client's own pools) and once through httpx2 (an ``httpx2.AsyncHTTPTransport`` passed in,
which takes ``AsyncClient.send``), and compares what the server saw and what the caller
got. Timeouts are small and real (the servers are real sockets).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx2
import hypercorn.config
import hypercorn.trio
import hypothesis.strategies as st
import pytest
import trio
import trustme
from fakes import http11_sse_response, make_config
from hypothesis import given
from log_capture import LogCapture
from loopback import read_request, serve

from trio_sampler._http import DirectTransport, HttpxTransport
from trio_sampler._http._direct import header_fields as _header_fields
from trio_sampler.client import SamplingClient, SamplingClientError
from trio_sampler.config import AuthScheme, RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.emulator import EmulatorApp
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    SamplingErrorInfo,
    SamplingErrorKind,
    User,
)
from trio_sampler.wire import BuildOptions, build_request
from trio_sampler.wire._request import WireRequest

WIRE = WireRequest(
    path="chat/completions", body=b'{"model":"m","stream":true}', data={}, headers=()
)
BODY = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
SECRET = "sk-DIRECT-PATH-0123456789abcdef"

Handler = Callable[[trio.SocketStream, "Server"], Awaitable[None]]


@attrs.define
class Server:
    port: int = 0
    #: Every request as it arrived: its head (without the blank line) and its body.
    requests: list[tuple[bytes, bytes]] = attrs.field(factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[Server]:
    """Serve ``handler`` for every request on a keep-alive connection, after reading it."""
    state = Server()

    async def on_connection(stream: trio.SocketStream) -> None:
        while (request := await read_request(stream)) is not None:
            state.requests.append(request)
            await handler(stream, state)

    async with serve(on_connection) as port:
        state.port = port
        yield state


def direct_of(client: SamplingClient) -> DirectTransport:
    """The direct transport under ``client`` (its default)."""
    transport = client.transport
    assert isinstance(transport, DirectTransport)
    return transport


async def answer(stream: trio.SocketStream, _: Server) -> None:
    await stream.send_all(http11_sse_response(BODY))


def config_for(base_url: str, **changes: object) -> SamplerConfig:
    """Small timeouts (the failures' servers stall), unless ``changes`` has its own."""
    return make_config(
        **{
            "base_url": base_url,
            "api_key": SECRET,
            "retry": RetryPolicy(max_retries=0),
            "timeouts": Timeouts(connect=2.0, response_headers=0.3, first_token=0.3, idle=0.3),
            **changes,
        }
    )


#: For the TLS tests: a handshake on a busy machine may take longer than the stalls' bound.
TLS_TIMEOUTS = Timeouts(connect=10.0, response_headers=10.0, first_token=10.0, idle=10.0)


@asynccontextmanager
async def both_paths(config: SamplerConfig) -> AsyncIterator[tuple[SamplingClient, SamplingClient]]:
    """Two open clients of ``config``: on the direct path, and through httpx2's own send
    (over a transport of the test's, closed after them)."""
    async with (
        httpx2.AsyncHTTPTransport() as transport,
        SamplingClient(config) as direct,
        SamplingClient(config, transport=transport) as through_httpx2,
    ):
        yield direct, through_httpx2


async def read_all(client: SamplingClient) -> bytes:
    async with client.open_stream(WIRE) as stream:
        return b"".join([chunk async for chunk in stream])


async def failure(client: SamplingClient) -> SamplingErrorInfo:
    with pytest.raises(SamplingClientError) as raised:
        await read_all(client)
    return raised.value.info


async def test_the_direct_path_sends_the_bytes_httpx2_sends() -> None:
    async with server(answer) as origin:
        config = config_for(origin.base_url, extra_headers={"X-Title": "t"})
        async with both_paths(config) as (direct, through_httpx2):
            assert direct_of(direct).takes_direct_path(config.base_url, WIRE.path)
            assert isinstance(through_httpx2.transport, HttpxTransport)
            assert await read_all(direct) == await read_all(through_httpx2) == BODY
            assert await read_all(direct) == BODY  # and again, on the kept connection
    first, second, third = origin.requests
    assert first == second == third
    head, body = first
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nauthorization: Bearer " + SECRET.encode() in head
    assert body == WIRE.body


async def test_a_cookie_the_server_sets_is_kept_and_sent_back_on_either_path() -> None:
    async def set_cookie(stream: trio.SocketStream, state: Server) -> None:
        response = http11_sse_response(BODY)
        if len(state.requests) % 2 == 1:  # the first request of each client
            response = response.replace(
                b"\r\n\r\n", b"\r\nset-cookie: affinity=node-7; Path=/\r\n\r\n", 1
            )
        await stream.send_all(response)

    async with server(set_cookie) as origin, both_paths(config_for(origin.base_url)) as clients:
        for client in clients:
            await read_all(client)
            await read_all(client)
    direct = [head for head, _ in origin.requests[:2]]
    through_httpx2 = [head for head, _ in origin.requests[2:]]
    assert direct == through_httpx2
    assert b"cookie:" not in direct[0].lower()
    assert b"\r\ncookie: affinity=node-7\r\n" in direct[1].lower()


async def test_a_proxy_from_the_environment_is_used_as_httpx2_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request whose URL httpx2 would send through a proxy it mounted from the
    environment does not take the direct path: it goes to the proxy."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with server(answer) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        config = config_for("http://origin.invalid/v1")
        async with SamplingClient(config) as client:
            assert not direct_of(client).takes_direct_path(config.base_url, WIRE.path)
            assert await read_all(client) == BODY
    (head, _), *_ = proxy.requests
    assert head.startswith(b"POST http://origin.invalid/v1/chat/completions HTTP/1.1\r\n")


async def test_the_request_line_is_logged_with_its_credentials_scrubbed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with server(answer) as origin:
        config = config_for(origin.base_url, query_params={"key": SECRET})
        caplog.set_level(logging.INFO, logger="trio_sampler.http")
        async with SamplingClient(config) as client:
            assert await read_all(client) == BODY
    (record,) = [r for r in caplog.records if r.name == "trio_sampler.http"]
    line = record.getMessage()
    assert line.startswith(f"HTTP Request: POST http://127.0.0.1:{origin.port}/v1/chat/")
    assert line.endswith('"HTTP/1.1 200 OK"')
    assert SECRET not in caplog.text


async def stall_before_headers(stream: trio.SocketStream, _: Server) -> None:
    await trio.sleep(5)


async def stall_in_the_body(stream: trio.SocketStream, _: Server) -> None:
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n"
        + BODY[:20]
    )
    await trio.sleep(5)


async def close_in_the_body(stream: trio.SocketStream, _: Server) -> None:
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n"
        + BODY[:20]
    )
    await stream.aclose()


async def garbage_status_line(stream: trio.SocketStream, _: Server) -> None:
    await stream.send_all(b"HTTP/9 banana\r\n\r\n")
    await stream.aclose()


async def close_before_answering(stream: trio.SocketStream, _: Server) -> None:
    await stream.aclose()


async def not_found(stream: trio.SocketStream, _: Server) -> None:
    body = b'{"error":{"message":"no such model","type":"invalid_request_error"}}'
    await stream.send_all(
        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (stall_before_headers, SamplingErrorKind.IDLE_TIMEOUT),
        (stall_in_the_body, SamplingErrorKind.IDLE_TIMEOUT),
        (close_in_the_body, SamplingErrorKind.TRANSPORT),
        (garbage_status_line, SamplingErrorKind.TRANSPORT),
        (close_before_answering, SamplingErrorKind.TRANSPORT),
        (not_found, SamplingErrorKind.INVALID_REQUEST),
    ],
)
async def test_a_failure_is_classified_as_it_is_through_httpx2(
    handler: Handler, kind: SamplingErrorKind
) -> None:
    """httpcore2's errors, which httpx2 would have mapped to its own of the same names,
    give the same kind, retryability and message."""
    async with server(handler) as origin:
        config = config_for(origin.base_url)
        async with both_paths(config) as clients:
            assert direct_of(clients[0]).takes_direct_path(config.base_url, WIRE.path)
            direct, through_httpx2 = [await failure(client) for client in clients]
    assert direct == through_httpx2
    assert direct.kind is kind
    assert SECRET not in str(direct)


async def test_a_refused_connection_is_classified_as_it_is_through_httpx2() -> None:
    async with server(answer) as origin:
        base_url = origin.base_url
    # The server is gone: its port refuses.
    async with both_paths(config_for(base_url)) as clients:
        direct, through_httpx2 = [await failure(client) for client in clients]
    assert direct == through_httpx2
    assert direct.kind is SamplingErrorKind.TRANSPORT and direct.retryable
    assert direct.message.startswith("could not connect to the server")


@asynccontextmanager
async def tls_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The emulator under Hypercorn over TLS, offering HTTP/2 (ALPN ``h2``) and
    HTTP/1.1, with a certificate the clients trust (``SSL_CERT_FILE``, which the client's
    TLS context reads as httpx2's does); yields its base URL."""
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    certificate.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    certificate.private_key_pem.write_to_path(str(key_file))
    authority.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    served = hypercorn.config.Config()
    served.bind = ["127.0.0.1:0"]
    served.certfile, served.keyfile = str(cert_file), str(key_file)
    served.alpn_protocols = ["h2", "http/1.1"]
    served.accesslog = None
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(hypercorn.trio.serve, EmulatorApp(), served)
        yield bound + "/v1"
        nursery.cancel_scope.cancel()


def emulator_wire(backend: ApiBackend) -> WireRequest:
    return build_request(
        backend, ConversationRequest(items=[User("hello")]), BuildOptions(model="emulator-chat")
    )


async def test_http2_over_tls_takes_the_direct_path_as_httpx2_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``http2=True`` a TLS server that offers HTTP/2 is spoken to in HTTP/2 on the
    direct path, and the answer is the one httpx2's way gets; the end of an HTTP/2 body
    is never guessed from h11's buffer (there is none)."""
    wire = emulator_wire(ApiBackend.CHAT_COMPLETIONS)
    bodies = []
    async with tls_emulator(tmp_path, monkeypatch) as base_url:
        config = config_for(base_url, http2=True, timeouts=TLS_TIMEOUTS)
        async with (
            httpx2.AsyncHTTPTransport(http2=True, verify=httpx2.create_ssl_context()) as transport,
            SamplingClient(config) as direct,
            SamplingClient(config, transport=transport) as through_httpx2,
        ):
            assert direct_of(direct).takes_direct_path(config.base_url, wire.path)
            for client in (direct, through_httpx2, direct):
                async with client.open_stream(wire) as stream:
                    assert stream.http_version == "HTTP/2"
                    assert not stream.end_received()
                    bodies.append(b"".join([chunk async for chunk in stream]))
    # The same answer but for the clock: ``created`` is the second each was rendered in.
    same = [re.sub(rb'"created":\d+', b'"created":0', body) for body in bodies]
    assert same[0] == same[1] == same[2]
    assert b'"content"' in bodies[0] and bodies[0].endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("backend", [ApiBackend.CHAT_COMPLETIONS, ApiBackend.MESSAGES])
async def test_no_key_in_the_http2_stacks_debug_records(
    backend: ApiBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    debug_logs: LogCapture,
) -> None:
    """Over HTTP/2 the request's headers go through ``h2`` and ``hpack``, whose DEBUG
    records show header values (hpack hides only the headers marked sensitive, and
    ``x-api-key`` is not): the client's log filter covers those loggers too."""
    wire = emulator_wire(backend)
    async with tls_emulator(tmp_path, monkeypatch) as base_url:
        auth = AuthScheme.X_API_KEY if backend is ApiBackend.MESSAGES else AuthScheme.BEARER
        config = config_for(
            base_url, http2=True, backend=backend, auth_scheme=auth, timeouts=TLS_TIMEOUTS
        )
        async with SamplingClient(config) as client, client.open_stream(wire) as stream:
            assert stream.http_version == "HTTP/2"
            assert [chunk async for chunk in stream]
    assert any(name.startswith("hpack") for name in debug_logs.names)
    assert not [text for text in debug_logs.texts if SECRET in text]


_NAMES = st.sampled_from([b"Content-Type", b"content-type", b"X-Request-Id", b"set-cookie", b"Via"])
_VALUES = st.one_of(
    st.binary(max_size=12).map(lambda raw: bytes(byte & 0x7F for byte in raw)),  # ASCII
    st.text(max_size=6).map(str.encode),  # UTF-8
    st.binary(max_size=6),  # anything: Latin-1 to httpx2
)


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_a_direct_responses_headers_read_as_httpx2_reads_them(
    raw: list[tuple[bytes, bytes]],
) -> None:
    """The direct path reads its headers in one pass: the same names and values as
    ``httpx2.Headers`` gives (lower-cased names, a repeated name's values joined)."""
    assert _header_fields(raw) == dict(httpx2.Headers(raw).items())


async def test_the_response_headers_read_on_either_path_are_the_same() -> None:
    """``ResponseStream.header_fields``, what the sampler reads a response's headers as,
    is the same over the direct path and through httpx2, repeated headers included."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nX-Request-Id: req-7\r\n"
        b"Via: a\r\nvia: b\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    )

    async def repeated(stream: trio.SocketStream, _: Server) -> None:
        await stream.send_all(head + BODY)

    seen = []
    async with server(repeated) as state, both_paths(config_for(state.base_url)) as clients:
        for client in clients:
            async with client.open_stream(WIRE) as stream:
                seen.append(dict(stream.header_fields))
                assert stream.request_id == "req-7"
                assert b"".join([chunk async for chunk in stream]) == BODY
    assert seen[0] == seen[1]
    assert seen[0]["via"] == "a, b"
    assert seen[0]["x-request-id"] == "req-7"
