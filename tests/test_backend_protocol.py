"""The backend protocol: a table of real objects, and a fourth backend added from outside
(``tests/toy_backend.py``) that runs through the actor against a loopback test server."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import toy_backend
import trio
from loopback import read_request, serve

from trio_sampler import (
    ApiBackend,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    SamplerConfig,
    SamplingErrorKind,
    StopReason,
    User,
    open_sampler,
)
from trio_sampler.wire import (
    Backend,
    WireBackend,
    backends,
    collect,
    get_backend,
    parse_request,
    register_backend,
    replay,
)

TOY_BODY = (
    b'data: {"text": "Hello"}\n\n'
    b'data: {"text": ", toy"}\n\n'
    b'data: {"stop": "done", "usage": {"in": 3, "out": 2}}\n\n'
)


def test_the_table_holds_the_three_built_in_backends_and_the_toy() -> None:
    names = [b.name for b in backends()]
    assert names[:3] == [b.value for b in ApiBackend]
    assert "toy" in names
    for backend in backends():
        assert isinstance(backend, Backend)
    assert get_backend(ApiBackend.MESSAGES).default_headers == (
        ("anthropic-version", "2023-06-01"),
    )


def test_an_unknown_backend_fails_with_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'acme'; known backends: .*messages"):
        SamplerConfig(base_url="http://127.0.0.1:1/v1", backend="acme")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(toy_backend.BACKEND)
    with pytest.raises(TypeError, match="is not a Backend"):
        register_backend(object())  # type: ignore[arg-type]


def test_a_built_in_name_is_its_enum_member() -> None:
    config = SamplerConfig(base_url="http://127.0.0.1:1/v1", backend="responses")
    assert config.backend is ApiBackend.RESPONSES


def test_the_toy_backend_replays_and_parses_through_the_table() -> None:
    events = replay("toy", TOY_BODY)
    end = events[-1]
    assert isinstance(end, Completed)
    assert collect(events) == end.response
    assert end.response.text == "Hello, toy"
    assert end.response.stop_reason is StopReason.STOP
    assert parse_request("toy", b'{"prompt": "hi", "model": "t1"}').items == (User("hi"),)
    assert isinstance(toy_backend.BACKEND, WireBackend)


@pytest.mark.parametrize(
    ("reason", "kind", "retryable"),
    [
        ("busy", SamplingErrorKind.OVERLOADED, True),
        ("bad_prompt", SamplingErrorKind.INVALID_REQUEST, False),
    ],
)
def test_a_backend_classifies_its_own_in_stream_errors(
    reason: str, kind: SamplingErrorKind, retryable: bool
) -> None:
    body = (
        TOY_BODY[:25]
        + b'data: {"error": {"reason": "'
        + reason.encode()
        + b'", "detail": "no"}}\n\n'
    )
    events = replay("toy", body)
    end = events[-1]
    assert isinstance(end, Failed)
    assert (end.error.kind, end.error.retryable, end.error.error_code) == (kind, retryable, reason)
    assert end.partial is not None and end.partial.text == "Hello"
    assert get_backend("toy").classify_stream_error({"error": {"reason": reason}}).kind is kind


def test_the_built_in_backends_share_one_in_stream_classifier() -> None:
    payload = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    infos = {name: get_backend(name).classify_stream_error(payload) for name in ApiBackend}
    assert {info.kind for info in infos.values()} == {SamplingErrorKind.OVERLOADED}


async def test_a_fourth_backend_runs_through_the_actor() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(stream: trio.SocketStream) -> None:
        request = await read_request(stream)
        if request is None:
            return
        seen.append(request)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"connection: close\r\n\r\n" + TOY_BODY
        )

    async with serve(handler) as port:
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1", backend="toy", model="toy-1", api_key="k"
        )
        events: list[Any] = []
        with trio.fail_after(20):
            async with open_sampler(config) as sampler:
                stream = await sampler.submit(ConversationRequest(items=[User("say hi")]))
                events = [event async for event in stream]

    (head, body) = seen[0]
    assert head.startswith(b"POST /v1/toy/generate ")
    assert b"\r\ntoy-version: 1" in head
    assert orjson.loads(body) == {"model": "toy-1", "prompt": "say hi"}
    assert [e.text for e in events if isinstance(e, ChannelToken)] == ["Hello", ", toy"]
    end = events[-1]
    assert isinstance(end, Completed)
    assert end.response.text == "Hello, toy"
    assert end.response.usage is not None and end.response.usage.total_tokens == 5
    assert end.metrics is not None and end.metrics.attempts[-1].kind is None
