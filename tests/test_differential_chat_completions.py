"""Differential test: our Chat Completions transform vs the official ``openai`` SDK.

Both sides read the same bytes of every real capture. The SDK side is what
``client.chat.completions.stream(...)`` does, step by step: the SDK's own SSE decoder,
``Stream.__stream__``'s rules (stop at ``[DONE]``, raise ``APIError`` on a chunk with a
truthy ``error``), ``construct_type`` into ``ChatCompletionChunk`` (no validation, as the
SDK does), the ``ChatCompletionStream`` filter that drops non-``chat.completion.chunk``
objects (Azure's leading filter chunk), then ``ChatCompletionStreamState.handle_chunk``
and ``get_final_completion()``. Only choice 0 is compared (n>1 streams: the SDK keeps all).

Deliberate differences, asserted below and listed in docs/backends/chat_completions-stream.md:

1. A refusal: the SDK keeps ``finish_reason="stop"``; we report ``content_filter`` and keep
   ``"stop"`` as ``raw_stop_reason``.
2. Usage is normalized: xAI's ``completion_tokens`` excludes reasoning, we add it back into
   ``output_tokens``; DeepSeek's ``prompt_cache_hit_tokens`` and Azure-DeepSeek's top-level
   ``reasoning_tokens`` are read.
3. Usage is last *non-null* write: the SDK overwrites its usage with every chunk's value, so
   a chunk after the usage chunk (OpenAI's moderation chunk) leaves it ``None``
   (``openai-gpt-5-text-moderation-chunk.sse``: hand-written expectation instead).
4. Groq puts usage only in ``x_groq.usage``; the SDK ignores it, we read it
   (``groq-compound-web-search-executed-tools.sse``: hand-written expectation).
5. OpenRouter ``reasoning`` + ``reasoning_details`` carry the same text twice; the SDK
   accumulates both fields, we emit it once. Encrypted / signed details become the
   ``Reasoning`` item's opaque state (checked against the SDK's accumulated details).
6. Groq ``executed_tools``: the SDK merges the started and completed entries by index into
   one dict (concatenating their ``arguments``); we emit a hosted tool call with the
   output as result (hand-written expectation; the SDK cannot model it).
7. In-stream errors: the SDK raises ``APIError``; we end with ``Failed`` (classified,
   with the partial output).
8. OpenRouter ``delta.annotations`` (web plugin citations) have no ``index``: the SDK's
   ``accumulate_delta`` raises ``RuntimeError``; we ignore annotations
   (``openrouter-deepseek-chat-web-search-annotations.sse``: hand-written expectation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai._models import construct_type
from openai._streaming import SSEDecoder as OpenAISSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState, ParsedChatCompletionSnapshot
from openai.types.chat import ChatCompletionChunk

from benchmarks import corpus
from trio_sampler.providers import PROFILES
from trio_sampler.types import (
    ApiBackend,
    BackendToolCall,
    Completed,
    ConversationResponse,
    Failed,
    Reasoning,
    SamplingEvent,
    StopReason,
    Usage,
)
from trio_sampler.wire._replay import replay

FIXTURES = corpus.root()
CORPUS = corpus.files("chat_completions/*.sse")
MANIFEST = {entry["file"]: entry for entry in corpus.manifest("chat_completions")}

_FINISH = {
    "stop": StopReason.STOP,
    "length": StopReason.LENGTH,
    "tool_calls": StopReason.TOOL_CALLS,
    "function_call": StopReason.TOOL_CALLS,
    "content_filter": StopReason.CONTENT_FILTER,
}

# Difference 3 and 4: the SDK reports no usage for these; what the wire says instead.
HAND_WRITTEN_USAGE = {
    "openai-gpt-5-text-moderation-chunk.sse": Usage(13, 11, 0, 0, 0),
    "groq-compound-web-search-executed-tools.sse": Usage(5003, 359, 0, 0, 0),
}


# Difference 8: OpenRouter's ``delta.annotations`` entries have no ``index``; the SDK's
# accumulate_delta raises RuntimeError on them. Hand-written expectations instead.
SDK_CANNOT_MODEL = {"openrouter-deepseek-chat-web-search-annotations.sse"}


class SDKError(Exception):
    """What the SDK's stream raised (``APIError``), with its message."""


def sdk_final(data: bytes) -> ParsedChatCompletionSnapshot:
    """Accumulate ``data`` exactly the way the openai SDK's chat streaming helper does.

    Returns the state's final snapshot: ``get_final_completion()`` would raise
    ``LengthFinishReasonError`` on ``finish_reason="length"`` streams, which we want to
    compare too (our transform reports ``length`` and lets the actor decide).
    """
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for sse in OpenAISSEDecoder().iter_bytes(iter([data])):
        if sse.data.startswith("[DONE]"):
            break
        payload = sse.json()
        if isinstance(payload, dict) and payload.get("error"):  # Stream.__stream__
            error = payload["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise SDKError(message or "An error occurred during streaming")
        if payload.get("object") != "chat.completion.chunk":  # ChatCompletionStream's check
            continue
        chunk = construct_type(type_=ChatCompletionChunk, value=payload)
        assert isinstance(chunk, ChatCompletionChunk)
        state.handle_chunk(chunk)
    return state.current_completion_snapshot


def ours(path: Path) -> list[SamplingEvent]:
    provider = MANIFEST[f"chat_completions/{path.name}"]["provider"]
    if provider not in PROFILES:  # a provider we have no profile for ("other")
        provider = None
    return replay(ApiBackend.CHAT_COMPLETIONS, [path.read_bytes()], provider=provider)


def sdk_usage(completion: ParsedChatCompletionSnapshot, model: str) -> Usage | None:
    """The SDK's usage, normalized as ``Usage`` documents it (the xAI add-back is difference 2)."""
    usage = completion.usage
    if usage is None:
        return None
    cached = 0
    if usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens or 0
    reasoning = 0
    if usage.completion_tokens_details is not None:
        reasoning = usage.completion_tokens_details.reasoning_tokens or 0
    output = usage.completion_tokens
    if model.startswith("grok") and reasoning:
        output += reasoning
    return Usage(usage.prompt_tokens, output, cached, 0, reasoning)


def extra(message: Any, name: str) -> Any:
    return (message.model_extra or {}).get(name)


@pytest.mark.real_streams
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_same_result_as_the_openai_sdk(path: Path) -> None:
    events = ours(path)
    final = events[-1]
    if path.name in SDK_CANNOT_MODEL:
        with pytest.raises(RuntimeError, match="Expected list delta entry to have an `index`"):
            sdk_final(path.read_bytes())
        return  # checked against hand-written expectations below
    try:
        completion = sdk_final(path.read_bytes())
    except SDKError as exc:
        # Difference 7: the SDK raises, we fail with the classified error and the partial.
        assert isinstance(final, Failed)
        assert str(exc)[:100] in final.error.message
        assert final.partial is not None
        return
    assert isinstance(final, Completed), final
    resp: ConversationResponse = final.response
    choice = next(c for c in completion.choices if c.index == 0)
    message = choice.message

    # Text and refusal.
    assert resp.assistant.content == (message.content or "")
    assert resp.assistant.refusal == (message.refusal or None)

    # Stop reason (difference 1 for refusals), raw value kept.
    assert resp.raw_stop_reason == choice.finish_reason
    expected_stop = _FINISH[choice.finish_reason]
    if message.refusal:
        expected_stop = StopReason.CONTENT_FILTER
    assert resp.stop_reason is expected_stop

    # Tool calls: id, name, parsed arguments, in order.
    sdk_calls = [
        (call.id, call.function.name, json.loads(call.function.arguments or "{}"))
        for call in message.tool_calls or []
        if call.type == "function"
    ]
    our_calls = [
        (call.id, call.name, json.loads(call.arguments or "{}"))
        for call in resp.assistant.tool_calls
    ]
    assert our_calls == sdk_calls

    # Reasoning text: reasoning_content / reasoning as the SDK accumulated them
    # (difference 5: the same text in reasoning_details is not counted twice).
    reasoning_items = [item for item in resp.items if isinstance(item, Reasoning)]
    our_reasoning = "".join(item.text + "".join(item.summary) for item in reasoning_items)
    sdk_reasoning = extra(message, "reasoning_content") or extra(message, "reasoning") or ""
    details = extra(message, "reasoning_details") or []
    if not sdk_reasoning:
        sdk_reasoning = "".join(d.get("text") or d.get("summary") or "" for d in details)
    assert our_reasoning == sdk_reasoning
    # Opaque reasoning state equals what the SDK accumulated in reasoning_details.
    sdk_signatures = "".join(d.get("signature") or "" for d in details)
    sdk_encrypted = "".join(d.get("data") or "" for d in details)
    assert "".join(item.signature or "" for item in reasoning_items) == sdk_signatures
    assert "".join(item.encrypted_content or "" for item in reasoning_items) == sdk_encrypted

    # Usage (differences 2, 3, 4).
    if path.name in HAND_WRITTEN_USAGE:
        assert completion.usage is None
        assert resp.usage == HAND_WRITTEN_USAGE[path.name]
    else:
        assert resp.usage == sdk_usage(completion, completion.model)

    # Model and id (the SDK takes them from the first chunk it kept).
    assert resp.model == completion.model
    if path.name != "groq-compound-web-search-executed-tools.sse":  # new id on every chunk
        assert resp.response_id == completion.id


@pytest.mark.real_streams
def test_xai_usage_difference_is_the_reasoning_add_back() -> None:
    """Difference 2 on the real xAI capture: 12 + 1 + 290 = 303 (total_tokens)."""
    path = FIXTURES / "chat_completions" / "xai-grok-3-mini-reasoning-text.sse"
    completion = sdk_final(path.read_bytes())
    assert completion.usage is not None and completion.usage.completion_tokens == 1
    final = ours(path)[-1]
    assert isinstance(final, Completed)
    assert final.response.usage == Usage(12, 291, 11, 0, 290)
    assert final.response.cost_usd_ticks == 1466250


@pytest.mark.real_streams
def test_groq_executed_tools_hand_written() -> None:
    """Difference 6: the SDK has no model for hosted tools on Chat Completions."""
    path = FIXTURES / "chat_completions" / "groq-compound-web-search-executed-tools.sse"
    final = ours(path)[-1]
    assert isinstance(final, Completed)
    hosted = [item for item in final.response.items if isinstance(item, BackendToolCall)]
    assert len(hosted) == 1
    assert hosted[0].name == "search" and hosted[0].status == "completed"
    assert json.loads(hosted[0].arguments) == {
        "query": "What is the weather in San Francisco today?"
    }
    assert isinstance(hosted[0].result, str)
    assert hosted[0].result.startswith("Title: Weather in San Francisco")
    # Order: reasoning that led to the search, the search, then the answer.
    kinds = [type(item).__name__ for item in final.response.items]
    assert kinds == ["Reasoning", "BackendToolCall", "Assistant"]


@pytest.mark.real_streams
def test_openrouter_annotations_hand_written() -> None:
    """Difference 8: the SDK crashes on index-less annotations; we ignore annotations."""
    path = FIXTURES / "chat_completions" / "openrouter-deepseek-chat-web-search-annotations.sse"
    final = ours(path)[-1]
    assert isinstance(final, Completed)
    resp = final.response
    assert resp.assistant.content == (
        "The URL for Pydantic AI's GitHub repository is:  \n\n"
        "https://github.com/pydantic/pydantic-ai"
    )
    assert resp.stop_reason is StopReason.STOP and resp.raw_stop_reason == "stop"
    assert resp.usage == Usage(2317, 53, 0, 0, 0)
    assert resp.cost_usd_ticks == 76509169  # round(0.0076509169000000005 * 1e10)
    assert resp.model == "deepseek/deepseek-chat"
    assert resp.items[:-1] == ()


def test_openai_sdk_version_is_a_v2_plus() -> None:
    assert int(openai.__version__.split(".")[0]) >= 2
