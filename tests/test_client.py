"""SamplingClient over httpx2.MockTransport: headers, status errors, streaming, limits."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import cast

import httpcore2
import httpx2
import orjson
import pytest
import trio

from trio_sampler._http import DirectTransport, HttpxTransport
from trio_sampler.client import SamplingClient, SamplingClientError
from trio_sampler.config import AuthScheme, SamplerConfig, Timeouts
from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    SamplingErrorInfo,
    SamplingErrorKind,
    User,
)
from trio_sampler.wire import BuildOptions, build_request
from trio_sampler.wire._request import WireRequest

KEY = "sk-test-SUPERSECRET-0123456789"
WIRE = WireRequest(
    path="/chat/completions",
    body=b'{"model":"m","stream":true}',
    data={"model": "m", "stream": True},
    headers=(("x-grok-req-id", "r1"),),
)

Handler = Callable[[httpx2.Request], Awaitable[httpx2.Response]]


class Chunks(httpx2.AsyncByteStream):
    """A response body delivered in the given pieces; records whether it was closed."""

    def __init__(self, *chunks: bytes, fail_after: int | None = None) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, chunk in enumerate(self.chunks):
            if self.fail_after is not None and index == self.fail_after:
                raise httpx2.ReadError("connection reset by peer")
            await trio.lowlevel.checkpoint()
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


def config(**kwargs: object) -> SamplerConfig:
    fields: dict[str, object] = {"base_url": "https://api.example.test/v1/", "api_key": KEY}
    fields.update(kwargs)
    return SamplerConfig(**fields)  # type: ignore[arg-type]


def recording(
    response: Callable[[httpx2.Request], httpx2.Response],
) -> tuple[list[httpx2.Request], httpx2.MockTransport]:
    seen: list[httpx2.Request] = []

    async def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return response(request)

    return seen, httpx2.MockTransport(handler)


def sse_ok(*chunks: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda _: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, stream=Chunks(*chunks)
    )


def direct_of(client: SamplingClient) -> DirectTransport:
    """The direct transport under ``client`` (its default)."""
    transport = client.transport
    assert isinstance(transport, DirectTransport)
    return transport


async def read_all(client: SamplingClient, wire: WireRequest = WIRE) -> list[bytes]:
    async with client.open_stream(wire) as stream:
        assert stream.status == 200
        return [chunk async for chunk in stream]


@pytest.mark.parametrize(
    ("scheme", "backend", "present", "absent"),
    [
        (
            AuthScheme.BEARER,
            ApiBackend.CHAT_COMPLETIONS,
            {"authorization": f"Bearer {KEY}"},
            ["x-api-key", "anthropic-version"],
        ),
        (
            AuthScheme.X_API_KEY,
            ApiBackend.MESSAGES,
            {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
            ["authorization"],
        ),
        (AuthScheme.NONE, ApiBackend.RESPONSES, {}, ["authorization", "x-api-key"]),
    ],
)
async def test_headers_per_auth_scheme(
    scheme: AuthScheme, backend: ApiBackend, present: dict[str, str], absent: list[str]
) -> None:
    seen, transport = recording(sse_ok(b"data: x\n\n"))
    cfg = config(auth_scheme=scheme, backend=backend, extra_headers={"X-Title": "t"})
    async with SamplingClient(cfg, transport=transport) as client:
        await read_all(client)
    (request,) = seen
    for name, value in present.items():
        assert request.headers[name] == value
    for name in absent:
        assert name not in request.headers
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["accept-encoding"] == "identity"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-title"] == "t"
    assert request.headers["x-grok-req-id"] == "r1"
    assert request.method == "POST"
    assert str(request.url) == "https://api.example.test/v1/chat/completions"
    assert request.content == WIRE.body


async def test_the_request_on_the_wire_is_complete() -> None:
    """Every header in order (httpx2's connection default first, then ours), the jar's
    cookies, the per-config timeouts, and each config's own URL (the parsed URL is
    cached per address)."""
    seen, transport = recording(sse_ok(b""))
    cfg = config(
        extra_headers={"X-Title": "t"},
        timeouts=Timeouts(connect=3.0, write=5.0, response_headers=4.0, first_token=7.0, idle=6.0),
    )
    other = config(base_url="https://other.test/api")
    async with SamplingClient(cfg, transport=transport) as client:
        carrier = client.transport
        assert isinstance(carrier, HttpxTransport)
        carrier.cookies.set("affinity", "node-7", domain="api.example.test")
        await read_all(client)
        await read_all(client)
        await read_all(client)
        async with client.open_stream(WIRE, config=other) as stream:
            assert [c async for c in stream] == []
    first = seen[0]
    assert [name for name, _ in first.headers.multi_items()] == [
        "host",
        "connection",
        "user-agent",
        "content-type",
        "accept",
        "authorization",
        "x-title",
        "x-grok-req-id",
        "accept-encoding",
        "cookie",
        "content-length",
    ]
    assert first.headers["connection"] == "keep-alive"
    assert first.headers["user-agent"].startswith("trio-sampler/")
    assert first.headers["cookie"] == "affinity=node-7"
    assert first.headers["content-length"] == str(len(WIRE.body))
    assert first.extensions["timeout"] == {"connect": 3.0, "read": 7.0, "write": 5.0, "pool": None}
    assert str(seen[2].url) == "https://api.example.test/v1/chat/completions"
    assert str(seen[3].url) == "https://other.test/api/chat/completions"
    assert "cookie" not in seen[3].headers  # the jar's cookie is for its own domain


async def test_query_params_and_path_join() -> None:
    seen, transport = recording(sse_ok(b""))
    cfg = config(query_params={"api-version": "2024-10-21"})
    wire = WireRequest(path="responses", body=b"{}", data={})
    async with SamplingClient(cfg, transport=transport) as client:
        await read_all(client, wire)
    assert str(seen[0].url) == "https://api.example.test/v1/responses?api-version=2024-10-21"


async def test_streams_bytes_as_they_arrive_and_closes() -> None:
    body = Chunks(b'data: {"a":', b"1}\n\n", b"data: [DONE]\n\n")

    async def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, stream=body)

    async with SamplingClient(config(), transport=httpx2.MockTransport(handler)) as client:
        async with client.open_stream(WIRE) as stream:
            assert stream.headers is not None
            first = await stream.iter_bytes().__anext__()
            assert first == b'data: {"a":'
        assert body.closed  # left early: the response was closed


async def test_full_stream_roundtrip() -> None:
    _, transport = recording(sse_ok(b"a", b"b", b"c"))
    async with SamplingClient(config(), transport=transport) as client:
        assert await read_all(client) == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "retryable"),
    [
        (
            401,
            {},
            b'{"error":{"message":"Incorrect API key provided: ' + KEY.encode() + b'"}}',
            SamplingErrorKind.AUTH,
            False,
        ),
        (
            429,
            {"retry-after": "3"},
            b'{"error":{"type":"rate_limit_error","message":"slow down"}}',
            SamplingErrorKind.RATE_LIMITED,
            True,
        ),
        (
            400,
            {},
            b'{"error":{"code":"context_length_exceeded","message":"too long"}}',
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
        ),
        (
            529,
            {"request-id": "req_1"},
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            SamplingErrorKind.OVERLOADED,
            True,
        ),
        (502, {}, b"<html>bad gateway</html>", SamplingErrorKind.HTTP, True),
    ],
)
async def test_non_2xx_raises_classified(
    status: int, headers: dict[str, str], body: bytes, kind: SamplingErrorKind, retryable: bool
) -> None:
    stream = Chunks(body)
    _, transport = recording(lambda _: httpx2.Response(status, headers=headers, stream=stream))
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError) as info:
            await read_all(client)
    error = info.value
    assert (error.kind, error.info.retryable, error.info.status_code) == (kind, retryable, status)
    assert KEY not in str(error) and KEY not in repr(error) and KEY not in repr(error.info)
    assert error.__cause__ is None
    assert stream.closed
    if status == 429:
        assert error.info.retry_after == 3.0
    if status == 529:
        assert error.info.provider_request_id == "req_1"


async def test_error_body_read_is_bounded() -> None:
    huge = [b"x" * 65536] * 100
    _, transport = recording(lambda _: httpx2.Response(500, stream=Chunks(*huge)))
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError) as info:
            await read_all(client)
    assert info.value.info.status_code == 500


async def test_redirect_is_not_followed() -> None:
    seen, transport = recording(
        lambda _: httpx2.Response(307, headers={"location": "https://evil.test/steal"})
    )
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError) as info:
            await read_all(client)
    assert len(seen) == 1
    assert info.value.kind is SamplingErrorKind.HTTP
    assert not info.value.info.retryable
    assert "redirect" in str(info.value)


async def test_max_response_bytes() -> None:
    _, transport = recording(sse_ok(b"x" * 600, b"y" * 600))
    async with SamplingClient(config(max_response_bytes=1000), transport=transport) as client:
        with pytest.raises(SamplingClientError, match="max_response_bytes") as info:
            await read_all(client)
    assert info.value.kind is SamplingErrorKind.HTTP


async def test_gzip_despite_identity_is_decoded_and_capped() -> None:
    payload = b"data: hello\n\n" * 100
    compressed = gzip.compress(payload)
    _, transport = recording(
        lambda _: httpx2.Response(
            200,
            headers={"content-encoding": "gzip"},
            stream=Chunks(compressed[:10], compressed[10:]),
        )
    )
    async with SamplingClient(config(), transport=transport) as client:
        assert b"".join(await read_all(client)) == payload

    bomb = gzip.compress(b"\0" * (10 * 1024 * 1024))
    _, transport = recording(
        lambda _: httpx2.Response(200, headers={"content-encoding": "gzip"}, stream=Chunks(bomb))
    )
    async with SamplingClient(config(max_response_bytes=4096), transport=transport) as client:
        with pytest.raises(SamplingClientError, match="max_response_bytes"):
            await read_all(client)


async def test_unknown_content_encoding_is_an_error() -> None:
    _, transport = recording(
        lambda _: httpx2.Response(200, headers={"content-encoding": "br"}, stream=Chunks(b"?"))
    )
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError, match="'br'-encoded"):
            await read_all(client)


async def test_connect_error_is_transport_and_leaks_nothing() -> None:
    async def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError(
            f"cannot connect to {request.url} with {request.headers['authorization']}",
            request=request,
        )

    cfg = config(query_params={"key": "qsecret123"})
    async with SamplingClient(cfg, transport=httpx2.MockTransport(handler)) as client:
        with pytest.raises(SamplingClientError) as info:
            await read_all(client)
    error = info.value
    assert error.kind is SamplingErrorKind.TRANSPORT and error.info.retryable
    for text in (str(error), repr(error), error.info.message):
        assert KEY not in text and "qsecret123" not in text
    # Not chained: the httpx exception holds the request, which holds the key.
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


async def test_mid_stream_read_error() -> None:
    _, transport = recording(
        lambda _: httpx2.Response(200, stream=Chunks(b"a", b"b", fail_after=1))
    )
    got: list[bytes] = []
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError) as info:
            async with client.open_stream(WIRE) as stream:
                async for chunk in stream:
                    got.append(chunk)
    assert got == [b"a"]
    assert info.value.kind is SamplingErrorKind.TRANSPORT


async def test_response_headers_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx2.Request) -> httpx2.Response:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    cfg = config(timeouts=Timeouts(response_headers=5))
    async with SamplingClient(cfg, transport=httpx2.MockTransport(handler)) as client:
        start = trio.current_time()
        with pytest.raises(SamplingClientError) as info:
            await read_all(client)
        assert trio.current_time() - start == pytest.approx(5)
    assert info.value.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert info.value.info.retryable
    assert "5 s" in str(info.value)


async def test_cancellation_is_not_converted(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx2.Request) -> httpx2.Response:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async with SamplingClient(config(), transport=httpx2.MockTransport(handler)) as client:
        with trio.move_on_after(1) as scope:
            await read_all(client)
        assert scope.cancelled_caught
        assert trio.current_time() == pytest.approx(1)


async def test_post_json() -> None:
    seen, transport = recording(
        lambda _: httpx2.Response(200, json={"id": "x"}, headers={"x-request-id": "req_9"})
    )
    async with SamplingClient(config(), transport=transport) as client:
        status, headers, body = await client.post_json(WIRE)
    assert status == 200 and headers["x-request-id"] == "req_9"
    assert orjson.loads(body) == {"id": "x"}
    assert seen[0].headers["accept"] == "application/json"


async def test_post_json_error() -> None:
    _, transport = recording(lambda _: httpx2.Response(503, text="unavailable"))
    async with SamplingClient(config(), transport=transport) as client:
        with pytest.raises(SamplingClientError) as info:
            await client.post_json(WIRE)
    assert info.value.kind is SamplingErrorKind.OVERLOADED


async def test_per_call_config_overrides_url_and_key() -> None:
    seen, transport = recording(sse_ok(b"ok"))
    other = config(base_url="https://other.test/api", api_key="sk-other-000000000")
    client = SamplingClient(config(), transport=transport)
    async with client, client.open_stream(WIRE, config=other) as stream:
        assert [c async for c in stream] == [b"ok"]
    assert str(seen[0].url) == "https://other.test/api/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-other-000000000"


def test_client_repr_has_no_key() -> None:
    client = SamplingClient(config())
    assert KEY not in repr(client) and KEY not in repr(client.config)


def test_pools_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a TLS context loads the CA store (~20 ms): once per client, not per pool."""
    import httpcore2

    built: list[object] = []
    original = httpcore2.default_ssl_context

    def counting(*args: object, **kwargs: bool) -> object:
        context = original(*args, **kwargs)
        built.append(context)
        return context

    monkeypatch.setattr(httpcore2, "default_ssl_context", counting)
    config = SamplerConfig(
        base_url="https://api.example.test/v1",
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="m",
        connection_pools=8,
    )
    client = SamplingClient(config)
    assert len(built) == 1
    assert direct_of(client).pools == 8


async def test_streams_spread_over_the_least_busy_pools(emulator: EmulatorFixture) -> None:
    """Concurrent streams over real sockets each take the pool with the fewest in flight."""
    config = SamplerConfig(
        base_url=emulator.base_url,
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="m",
        connection_pools=3,
    )
    request = ConversationRequest(
        items=(User("hi"),), extra_headers=emulator.script(text="hello there")
    )
    wire = build_request(ApiBackend.CHAT_COMPLETIONS, request, BuildOptions(model="m"))
    async with SamplingClient(config) as client:
        async with client.open_stream(wire) as first, client.open_stream(wire) as second:
            assert direct_of(client).in_flight == [1, 1, 0]
            async with client.open_stream(wire) as third:
                assert direct_of(client).in_flight == [1, 1, 1]
                for stream in (first, second, third):
                    assert stream.status == 200
        assert direct_of(client).in_flight == [0, 0, 0]


@pytest.mark.parametrize(
    "cfg",
    [
        config(extra_headers={"X-Title": "t"}),
        config(extra_headers={"Authorization": "Bearer gateway-token-0123456789"}),
        config(backend=ApiBackend.MESSAGES, auth_scheme=AuthScheme.X_API_KEY),
        config(query_params={"api-version": "2024-10-21"}),
    ],
)
async def test_the_request_built_is_the_one_httpx2_builds(cfg: SamplerConfig) -> None:
    """The client builds its requests itself (headers as bytes, merged once per config):
    the headers, in order and byte for byte, the URL and the body are those of
    ``AsyncClient.build_request`` with the same headers. Over a transport of the caller's
    that is an ``httpx2.Request``; to the client's own pool (the direct path) it is the
    ``httpcore2.Request`` httpx2's transport would make of that one."""
    for transport in (httpx2.MockTransport(lambda request: httpx2.Response(200)), None):
        async with SamplingClient(cfg, transport=transport) as client:
            request = client._request(WIRE, cfg, stream=True)
            carrier = client.transport
            assert isinstance(carrier, DirectTransport | HttpxTransport)
            ours = carrier.build(request)
            if transport is None:
                assert isinstance(ours, httpcore2.Request)
                raw_headers = ours.headers
                url = httpx2.URL(bytes(ours.url).decode("ascii"))
                content = b"".join(cast("Iterable[bytes]", ours.stream))
            else:
                assert isinstance(ours, httpx2.Request)
                raw_headers, url, content = ours.headers.raw, ours.url, ours.content
            theirs = httpx2.AsyncClient().build_request(
                "POST",
                url,
                content=WIRE.body,
                headers=[
                    ("user-agent", dict(raw_headers)[b"user-agent"].decode("ascii")),
                    ("content-type", "application/json"),
                    ("accept", "text/event-stream"),
                    *cfg.request_headers(),
                    *WIRE.headers,
                    ("accept-encoding", "identity"),
                ],
            )
        assert raw_headers == theirs.headers.raw
        assert url == theirs.url and content == theirs.content == WIRE.body
        if isinstance(ours, httpcore2.Request):
            assert (ours.method, ours.url) == (
                b"POST",
                httpcore2.URL(
                    scheme=theirs.url.raw_scheme,
                    host=theirs.url.raw_host,
                    port=theirs.url.port,
                    target=theirs.url.raw_path,
                ),
            )


async def test_every_way_out_of_an_exchange_closes_and_gives_the_pool_back() -> None:
    """A 2xx read to its end, a non-2xx, a read error, an error of the caller's in the
    block and a cancel in it: each closes the response and leaves the pool's count at 0;
    a SamplingClientError raised in the block leaves scrubbed of the key."""
    bodies: list[Chunks] = []

    def respond(request: httpx2.Request) -> httpx2.Response:
        status = 500 if request.url.path.endswith("/fail") else 200
        body = Chunks(b"a", b"b", fail_after=1 if request.url.path.endswith("/reset") else None)
        bodies.append(body)
        return httpx2.Response(status, stream=body)

    _, transport = recording(respond)

    def wire(path: str) -> WireRequest:
        return WireRequest(path=path, body=WIRE.body, data=WIRE.data, headers=WIRE.headers)

    async with SamplingClient(config(), transport=transport) as client:
        assert await read_all(client, wire("/ok")) == [b"a", b"b"]
        with pytest.raises(SamplingClientError) as status:
            await read_all(client, wire("/fail"))
        assert status.value.info.status_code == 500
        with pytest.raises(SamplingClientError) as reset:
            await read_all(client, wire("/reset"))
        assert reset.value.kind is SamplingErrorKind.TRANSPORT
        with pytest.raises(KeyError):
            async with client.open_stream(wire("/ok")):
                raise KeyError("the caller's own")
        with trio.CancelScope() as scope:
            async with client.open_stream(wire("/ok")):
                scope.cancel()
                await trio.lowlevel.checkpoint()
        assert scope.cancelled_caught
        with pytest.raises(SamplingClientError) as raised:
            async with client.open_stream(wire("/ok")):
                raise SamplingClientError(
                    SamplingErrorInfo(
                        kind=SamplingErrorKind.TRANSPORT,
                        message=f"the peer echoed {KEY}",
                        retryable=True,
                    )
                )
        assert KEY not in str(raised.value)
        assert KEY not in raised.value.info.message
    assert len(bodies) == 6
    assert all(body.closed for body in bodies)
