"""Requests that keep state on the server (``docs/stateful-requests.md``): the fields,
how each backend renders or refuses them, and the replay rule: a stored or chained
request is sent again only when the failure proves the server did not process it."""

from __future__ import annotations

import json
import socket

import pytest
import trio
from loopback import read_request, serve

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingErrorKind,
    SamplingEvent,
    User,
)
from trio_sampler.wire import BuildOptions, build_request, parse_request

ITEMS = (User("hello"),)
STATEFUL = {
    "stored": ConversationRequest(items=ITEMS, store=True),
    "chained": ConversationRequest(items=ITEMS, previous_response_id="resp_1"),
    "in a conversation": ConversationRequest(items=ITEMS, conversation="conv_1"),
}


def _body(backend: ApiBackend, request: ConversationRequest) -> dict[str, object]:
    wire = build_request(backend, request, BuildOptions(model="m"))
    body = json.loads(wire.body)
    assert isinstance(body, dict)
    return body


def test_replay_safe_is_false_for_a_stored_or_chained_request_only() -> None:
    assert ConversationRequest(items=ITEMS).replay_safe
    assert ConversationRequest(items=ITEMS, store=False).replay_safe
    assert not any(request.replay_safe for request in STATEFUL.values())


def test_responses_renders_the_state_fields_and_reads_them_back() -> None:
    request = ConversationRequest(
        items=ITEMS, store=True, previous_response_id="resp_1", conversation="conv_1"
    )
    body = _body(ApiBackend.RESPONSES, request)
    assert (body["store"], body["previous_response_id"], body["conversation"]) == (
        True,
        "resp_1",
        "conv_1",
    )
    back = parse_request(ApiBackend.RESPONSES, body)
    assert (back.store, back.previous_response_id, back.conversation) == (True, "resp_1", "conv_1")
    # The object form of a conversation reads back as its id.
    body["conversation"] = {"id": "conv_2"}
    assert parse_request(ApiBackend.RESPONSES, body).conversation == "conv_2"
    assert "store" not in _body(ApiBackend.RESPONSES, ConversationRequest(items=ITEMS))


def test_chat_completions_renders_store_and_reads_it_back() -> None:
    body = _body(ApiBackend.CHAT_COMPLETIONS, ConversationRequest(items=ITEMS, store=True))
    assert body["store"] is True
    assert parse_request(ApiBackend.CHAT_COMPLETIONS, body).store is True


@pytest.mark.parametrize("backend", [ApiBackend.CHAT_COMPLETIONS, ApiBackend.MESSAGES])
@pytest.mark.parametrize("field", ["previous_response_id", "conversation"])
def test_a_backend_without_server_side_conversations_refuses_a_chain(
    backend: ApiBackend, field: str
) -> None:
    request = ConversationRequest(items=ITEMS, **{field: "id_1"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"{field} continues server-side state"):
        build_request(backend, request, BuildOptions(model="m"))


def test_messages_refuses_store() -> None:
    with pytest.raises(ValueError, match="store=True keeps the response on the server"):
        build_request(
            ApiBackend.MESSAGES,
            ConversationRequest(items=ITEMS, store=True),
            BuildOptions(model="m"),
        )
    _body(ApiBackend.MESSAGES, ConversationRequest(items=ITEMS, store=False))


def test_a_bad_state_field_is_named() -> None:
    with pytest.raises(TypeError, match="store must be True, False or None"):
        ConversationRequest(items=ITEMS, store="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="previous_response_id must be a str"):
        ConversationRequest(items=ITEMS, previous_response_id=3)  # type: ignore[arg-type]


def _config(port: int) -> SamplerConfig:
    return SamplerConfig(
        base_url=f"http://127.0.0.1:{port}/v1",
        backend=ApiBackend.RESPONSES,
        model="m",
        api_key="sk-STATEFUL-0123456789abcdef",
        timeouts=Timeouts(connect=5.0, response_headers=5.0, first_token=5.0, idle=5.0),
        retry=RetryPolicy(max_retries=3, base_delay=0.01, jitter=0.0),
    )


async def _run(config: SamplerConfig, request: ConversationRequest) -> list[SamplingEvent]:
    async with open_sampler(config) as sampler:
        return [event async for event in await sampler.submit(request)]


@pytest.mark.parametrize("what", list(STATEFUL))
async def test_a_stateful_request_the_server_read_and_dropped_is_never_sent_twice(
    what: str,
) -> None:
    posts = 0

    async def read_then_close(stream: trio.SocketStream) -> None:
        nonlocal posts
        if await read_request(stream) is not None:
            posts += 1  # read whole, maybe processed; then the connection closes

    with trio.fail_after(30):
        async with serve(read_then_close) as port:
            events = await _run(_config(port), STATEFUL[what])
            stateless = await _run(_config(port), ConversationRequest(items=ITEMS))
    end = events[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.TRANSPORT
    assert not [e for e in events if isinstance(e, Retrying)]
    assert "not retried" in end.error.message and "may have processed it" in end.error.message
    # The stateless request is retried as before: its four attempts, visibly.
    assert isinstance(stateless[-1], Failed)
    assert len([e for e in stateless if isinstance(e, Retrying)]) == 3
    assert posts == 1 + 4


async def test_a_stateful_request_that_never_reached_the_server_is_retried() -> None:
    with socket.socket() as probe:  # a port nothing listens on: every connect is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(30):
        events = await _run(_config(port), STATEFUL["stored"])
    end = events[-1]
    assert isinstance(end, Failed) and end.error.error_code == "not_sent"
    assert len([e for e in events if isinstance(e, Retrying)]) == 3
