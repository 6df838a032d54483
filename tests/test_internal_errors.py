"""Our own bugs versus malformed provider data.

Malformed provider data is caught by explicit validation and ends in a retryable
``Failed`` of kind ``serialization``, the same on every backend. An exception from our own
code (``AttributeError``, ``TypeError``, ``AssertionError``...) ends in a ``Failed`` of
kind ``internal``, code ``internal_error``: never retried, logged once with its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from fakes import Reply, ScriptedTransport, chat_stream, make_config

from trio_sampler import (
    ApiBackend,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingErrorKind,
    User,
    open_sampler,
)
from trio_sampler.config import RetryPolicy
from trio_sampler.wire import replay
from trio_sampler.wire._accumulate import StreamAccumulator
from trio_sampler.wire.chat_completions import ChatCompletionsTransform
from trio_sampler.wire.messages import MessagesTransform
from trio_sampler.wire.responses import ResponsesTransform


def _sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


# A text delta whose text is a number, on each backend's own framing.
MALFORMED_TEXT_DELTA: dict[ApiBackend, bytes] = {
    ApiBackend.CHAT_COMPLETIONS: _sse(
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": 42}}]}
    )
    + b"data: [DONE]\n\n",
    ApiBackend.RESPONSES: _sse({"type": "response.created", "response": {"id": "r1", "model": "m"}})
    + _sse({"type": "response.output_text.delta", "item_id": "msg_1", "delta": 42})
    + _sse({"type": "response.completed", "response": {"id": "r1", "output": []}}),
    ApiBackend.MESSAGES: _sse(
        {"type": "message_start", "message": {"id": "m1", "model": "m", "usage": {}}},
        "message_start",
    )
    + _sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        "content_block_start",
    )
    + _sse(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 42}},
        "content_block_delta",
    )
    + _sse({"type": "message_stop"}, "message_stop"),
}


@pytest.mark.parametrize("backend", list(ApiBackend), ids=lambda b: b.value)
def test_malformed_text_delta_fails_the_same_on_every_backend(backend: ApiBackend) -> None:
    events = replay(backend, MALFORMED_TEXT_DELTA[backend])
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.SERIALIZATION
    assert end.error.retryable
    assert "int" in end.error.message


@pytest.mark.parametrize(
    ("backend", "transform", "method"),
    [
        (ApiBackend.CHAT_COMPLETIONS, ChatCompletionsTransform, "_on_chunk"),
        (ApiBackend.RESPONSES, ResponsesTransform, "_on_json"),
        (ApiBackend.MESSAGES, MessagesTransform, "_on_json"),
    ],
    ids=lambda v: getattr(v, "value", None) or getattr(v, "__name__", str(v)),
)
def test_a_bug_in_a_transform_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    backend: ApiBackend,
    transform: type[Any],
    method: str,
) -> None:
    def broken(self: Any, *args: Any) -> None:
        raise AttributeError("'NoneType' object has no attribute 'text'")

    monkeypatch.setattr(transform, method, broken)
    with caplog.at_level(logging.ERROR, logger="trio_sampler"):
        events = replay(backend, MALFORMED_TEXT_DELTA[backend])
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.INTERNAL
    assert end.error.error_code == "internal_error"
    assert not end.error.retryable
    assert "AttributeError" in end.error.message
    records = [r for r in caplog.records if r.name == "trio_sampler"]
    assert len(records) == 1
    assert records[0].exc_info is not None  # the traceback is logged


def test_a_bug_in_the_run_of_plain_text_chunks_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The plain text chunks of a Chat Completions read go to the accumulator at once,
    outside the per-event mapping: a bug there is reported as ours all the same."""

    def broken(self: Any, *args: Any) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(StreamAccumulator, "texts", broken)
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    body = _sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    body += _sse(chunk) * 3 + b"data: [DONE]\n\n"
    with caplog.at_level(logging.ERROR, logger="trio_sampler"):
        events = replay(ApiBackend.CHAT_COMPLETIONS, body)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.INTERNAL
    assert end.error.error_code == "internal_error"
    assert "TypeError" in end.error.message
    assert len([r for r in caplog.records if r.name == "trio_sampler"]) == 1


async def test_the_actor_never_retries_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, delta: Any, out: Any) -> None:
        raise AttributeError("a bug")

    monkeypatch.setattr(ChatCompletionsTransform, "_on_delta", broken)
    transport = ScriptedTransport([Reply(chunks=chat_stream("Hello", " world"))])
    config = make_config(retry=RetryPolicy(max_retries=4, base_delay=0.01, max_delay=0.01))
    with caplog.at_level(logging.ERROR, logger="trio_sampler"):
        async with open_sampler(config, transport=transport) as sampler:
            stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
            events = [event async for event in stream]
    assert len(transport.requests) == 1  # one request sent, none retried
    assert not any(isinstance(e, Retrying) for e in events)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.INTERNAL
    assert end.error.error_code == "internal_error"
    assert len([r for r in caplog.records if "internal error" in r.getMessage()]) == 1


async def test_a_bug_outside_the_transform_is_an_internal_error_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from trio_sampler.actor import _attempt

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug in a builder")

    monkeypatch.setattr(_attempt, "build_request", broken)
    transport = ScriptedTransport([Reply(chunks=chat_stream("Hello"))])
    with caplog.at_level(logging.ERROR, logger="trio_sampler"):
        async with open_sampler(make_config(), transport=transport) as sampler:
            stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
            events = [event async for event in stream]
    assert not transport.requests
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.INTERNAL
    assert not end.error.retryable
    # Logged once, with its traceback (the client's redaction filter renders it to
    # ``exc_text``, scrubbed, in place of ``exc_info``).
    logged = [r for r in caplog.records if r.exc_info is not None or r.exc_text]
    assert len(logged) == 1
    assert "a bug in a builder" in (logged[0].exc_text or "") or logged[0].exc_info is not None
