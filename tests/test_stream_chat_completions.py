"""The Chat Completions stream transform: quirks, in-stream errors, the real corpus,
split invariance and totality (hypothesis)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import corpus
from trio_sampler.providers import PROFILES
from trio_sampler.types import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    ChannelToken,
    Completed,
    ConversationResponse,
    Failed,
    FirstToken,
    Reasoning,
    ReasoningCompleted,
    SamplingChannel,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    StreamStarted,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from trio_sampler.wire._replay import replay
from trio_sampler.wire.chat_completions._stream import ChatCompletionsTransform
from trio_sampler.wire.sse import ServerSentEvent

FIXTURES = corpus.root()
CORPUS = corpus.files("chat_completions/*.sse")
MANIFEST = {entry["file"]: entry for entry in corpus.manifest("chat_completions")}
CC = ApiBackend.CHAT_COMPLETIONS
TERMINALS = (Completed, Failed)

# -- helpers ---------------------------------------------------------------------------


def run(data: bytes | list[bytes], *, provider: str | None = None) -> list[SamplingEvent]:
    chunks = [data] if isinstance(data, bytes) else data
    return replay(CC, chunks, provider=provider)


def frame(payload: dict[str, Any] | str, event: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    index: int = 0,
    usage: dict[str, Any] | None = None,
    model: str = "gpt-4o",
    **extra: Any,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}],
        "usage": usage,
    }
    payload.update(extra)
    return payload


def body(*payloads: dict[str, Any] | bytes, done: bool = True) -> bytes:
    parts = [p if isinstance(p, bytes) else frame(p) for p in payloads]
    if done:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def terminal(events: list[SamplingEvent]) -> Completed | Failed:
    assert sum(isinstance(e, TERMINALS) for e in events) == 1
    last = events[-1]
    assert isinstance(last, TERMINALS)
    return last


def response(events: list[SamplingEvent]) -> ConversationResponse:
    last = terminal(events)
    assert isinstance(last, Completed), last
    return last.response


def failed(events: list[SamplingEvent]) -> Failed:
    last = terminal(events)
    assert isinstance(last, Failed), last
    return last


def text_of(events: list[SamplingEvent], channel: SamplingChannel) -> str:
    return "".join(e.text for e in events if isinstance(e, ChannelToken) and e.channel is channel)


def reasoning_items(resp: ConversationResponse) -> list[Reasoning]:
    return [item for item in resp.items if isinstance(item, Reasoning)]


def call(name: str, args: str, call_id: str | None = None, index: int = 0) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id is not None:
        fragment["id"] = call_id
        fragment["type"] = "function"
        fragment["function"]["name"] = name
    return fragment


# -- termination -----------------------------------------------------------------------


def test_text_then_done_completes() -> None:
    events = run(
        body(
            chunk({"role": "assistant", "content": "", "refusal": None}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
        )
    )
    assert isinstance(events[0], StreamStarted)
    assert isinstance(events[1], FirstToken)
    resp = response(events)
    assert resp.assistant.content == "Hello"
    assert resp.stop_reason is StopReason.STOP and resp.raw_stop_reason == "stop"
    assert resp.model == "gpt-4o" and resp.response_id == "chatcmpl-1"
    assert resp.chunk_count == 2
    assert [e.chunk_index for e in events if isinstance(e, ChannelToken)] == [1, 2]


def test_finish_reason_without_done_completes() -> None:
    resp = response(run(body(chunk({"content": "hi"}), chunk({}, "stop"), done=False)))
    assert resp.assistant.content == "hi"


def test_no_finish_reason_and_no_done_is_truncated() -> None:
    error = failed(run(body(chunk({"content": "hi"}), done=False)))
    assert error.error.kind is SamplingErrorKind.TRANSPORT and error.error.retryable
    assert error.partial is not None and error.partial.assistant.content == "hi"


def test_empty_body_is_truncated() -> None:
    assert failed(run(b"")).error.kind is SamplingErrorKind.TRANSPORT


def test_done_without_finish_reason_completes_with_no_stop_reason() -> None:
    """[DONE] with no finish_reason: the answer is complete, why it stopped is unknown."""
    resp = response(run(body(chunk({"content": "hi"}))))
    assert resp.assistant.content == "hi"
    assert resp.stop_reason is None and resp.raw_stop_reason is None


def test_events_after_done_are_ignored() -> None:
    events = run(body(chunk({"content": "a"}), chunk({}, "stop")) + frame(chunk({"content": "b"})))
    assert response(events).assistant.content == "a"


def test_non_json_data_is_a_serialization_failure() -> None:
    error = failed(run(body(chunk({"content": "a"}), b"data: {not json\n\n")))
    assert error.error.kind is SamplingErrorKind.SERIALIZATION
    assert error.partial is not None and error.partial.assistant.content == "a"


def test_unknown_events_are_counted_and_ignored() -> None:
    transform = ChatCompletionsTransform("r")
    events = transform.start()
    for payload in ({"type": "ping"}, {"object": "keepalive"}, chunk({"content": "x"}, "stop")):
        events += transform.feed(ServerSentEvent(json.dumps(payload)))
    events += transform.feed(ServerSentEvent("[DONE]"))
    assert transform.unknown_events == 2 and transform.done_marker
    assert response(events).assistant.content == "x"


# -- text, refusal, finish reasons ------------------------------------------------------


def test_refusal_is_content_filter_with_raw_value() -> None:
    events = run(
        body(
            chunk({"role": "assistant", "content": None, "refusal": ""}),
            chunk({"refusal": "I'm"}),
            chunk({"refusal": " sorry"}),
            chunk({}, "stop"),
        )
    )
    resp = response(events)
    assert resp.assistant.refusal == "I'm sorry" and resp.assistant.content == ""
    assert resp.stop_reason is StopReason.CONTENT_FILTER and resp.raw_stop_reason == "stop"
    assert sum(isinstance(e, FirstToken) for e in events) == 1


def test_empty_refusal_field_is_not_a_refusal() -> None:
    resp = response(run(body(chunk({"content": "ok", "refusal": ""}), chunk({}, "stop"))))
    assert resp.assistant.refusal is None and resp.stop_reason is StopReason.STOP


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ("stop", StopReason.STOP),
        ("length", StopReason.LENGTH),
        ("tool_calls", StopReason.TOOL_CALLS),
        ("function_call", StopReason.TOOL_CALLS),
        ("content_filter", StopReason.CONTENT_FILTER),
        ("model_context_window_exceeded", StopReason.LENGTH),
        ("eos_token", StopReason.STOP),
    ],
)
def test_finish_reason_mapping_keeps_raw(wire: str, expected: StopReason) -> None:
    resp = response(run(body(chunk({"content": "x"}), chunk({}, wire))))
    assert resp.stop_reason is expected and resp.raw_stop_reason == wire


def test_length_stays_length_with_tool_calls() -> None:
    resp = response(
        run(body(chunk({"tool_calls": [call("f", '{"a"', "call_1")]}), chunk({}, "length")))
    )
    assert resp.stop_reason is StopReason.LENGTH
    assert resp.assistant.tool_calls == (ToolCall("call_1", "f", '{"a"', arguments_complete=False),)


def test_done_without_finish_reason_with_tool_calls_keeps_the_calls_and_no_stop_reason() -> None:
    resp = response(run(body(chunk({"tool_calls": [call("f", "{}", "call_1")]}))))
    assert [c.id for c in resp.assistant.tool_calls] == ["call_1"]
    assert resp.stop_reason is None and resp.raw_stop_reason is None


def test_explicit_nulls_logprobs_obfuscation_filters_and_moderation_are_ignored() -> None:
    events = run(
        body(
            {"choices": [], "id": "", "model": "", "object": "", "prompt_filter_results": [{}]},
            chunk(
                {"role": None, "content": None, "reasoning_content": None, "tool_calls": None},
                obfuscation="abc",
            ),
            {
                **chunk({"content": "A", "annotations": [{"type": "url_citation"}]}),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "A", "annotations": [{"type": "url_citation"}]},
                        "logprobs": {"content": [{"token": "A", "logprob": -0.1}]},
                        "content_filter_results": {"hate": {"filtered": False}},
                        "finish_reason": None,
                    }
                ],
            },
            chunk({}, "stop"),
            chunk(usage={"prompt_tokens": 3, "completion_tokens": 1}) | {"choices": []},
            chunk(moderation={"output": {"flagged": False}}) | {"choices": []},
        )
    )
    resp = response(events)
    assert resp.assistant.content == "A"
    assert resp.response_id == "chatcmpl-1" and resp.model == "gpt-4o"  # Azure's "" skipped
    assert resp.usage == Usage(input_tokens=3, output_tokens=1)  # the null after it: no clobber


def test_only_choice_zero_is_the_answer() -> None:
    events = run(
        body(
            chunk({"content": "zero"}),
            chunk({"content": "one"}, index=1),
            chunk({"tool_calls": [call("f", "{}", "c")]}, index=2),
            chunk({}, "stop", index=1),
            chunk({}, "stop"),
        )
    )
    resp = response(events)
    assert resp.assistant.content == "zero" and resp.assistant.tool_calls == ()


# -- tool calls --------------------------------------------------------------------------


def test_tool_call_in_first_chunk_does_not_fire_first_token() -> None:
    events = run(
        body(
            chunk({"role": "assistant", "content": None, "tool_calls": [call("get", "", "c1")]}),
            chunk({"tool_calls": [call("", '{"x":')]}),
            chunk({"tool_calls": [call("", "1}")]}),
            chunk({}, "tool_calls"),
        )
    )
    assert not any(isinstance(e, FirstToken) for e in events)
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].id == "c1" and deltas[0].name == "get" and deltas[0].tool_index == 0
    assert [d.arguments_delta for d in deltas[1:]] == ['{"x":', "1}"]
    resp = response(events)
    assert resp.assistant.tool_calls == (ToolCall("c1", "get", '{"x":1}'),)
    assert resp.stop_reason is StopReason.TOOL_CALLS


def test_parallel_calls_by_index() -> None:
    resp = response(
        run(
            body(
                chunk({"tool_calls": [call("a", "", "c1", 0)]}),
                chunk({"tool_calls": [call("", '{"p":1}', None, 0)]}),
                chunk({"tool_calls": [call("b", "", "c2", 1)]}),
                chunk({"tool_calls": [call("", '{"q":2}', None, 1)]}),
                chunk({}, "tool_calls"),
            )
        )
    )
    assert resp.assistant.tool_calls == (
        ToolCall("c1", "a", '{"p":1}'),
        ToolCall("c2", "b", '{"q":2}'),
    )


def test_reused_index_zero_with_new_id_starts_a_new_call() -> None:
    events = run(
        body(
            chunk({"tool_calls": [call("a", '{"p":', "c1", 0)]}),
            chunk({"tool_calls": [call("", "1}", None, 0)]}),
            chunk({"tool_calls": [call("b", '{"q":', "c2", 0)]}),
            chunk({"tool_calls": [call("", "2}", None, 0)]}),
            chunk({"tool_calls": [call("a", "", "c1", 0)]}),  # a repeated id: not new
            chunk({}, "tool_calls"),
        )
    )
    assert response(events).assistant.tool_calls == (
        ToolCall("c1", "a", '{"p":1}'),
        ToolCall("c2", "b", '{"q":2}'),
        ToolCall("c1", "a", ""),
    )
    assert sorted({e.tool_index for e in events if isinstance(e, ToolCallDelta)}) == [0, 1, 2]


def test_same_id_repeated_on_every_fragment_is_one_call() -> None:
    resp = response(
        run(
            body(
                chunk({"tool_calls": [call("a", '{"p":', "c1")]}),
                chunk({"tool_calls": [call("a", "1}", "c1")]}),
                chunk({}, "tool_calls"),
            )
        )
    )
    assert resp.assistant.tool_calls == (ToolCall("c1", "a", '{"p":1}'),)


def test_full_arguments_in_first_fragment_xai() -> None:
    fragment = {
        "id": "call_55117580",
        "function": {"name": "weather", "arguments": '{"location":"San Francisco"}'},
        "index": 0,
        "type": "function",
    }
    resp = response(run(body(chunk({"tool_calls": [fragment]}), chunk({}, "tool_calls"))))
    assert resp.assistant.tool_calls == (
        ToolCall("call_55117580", "weather", '{"location":"San Francisco"}'),
    )


def test_empty_args_parallel_calls() -> None:
    resp = response(
        run(
            body(
                chunk({"tool_calls": [call("a", "", "c1", 0)]}),
                chunk({"tool_calls": [call("", "{}", None, 0)]}),
                chunk({"tool_calls": [call("b", "", "c2", 1)]}),
                chunk({"tool_calls": [call("", "{}", None, 1)]}),
                chunk({}, "tool_calls"),
            )
        )
    )
    assert resp.assistant.tool_calls == (ToolCall("c1", "a", "{}"), ToolCall("c2", "b", "{}"))


def test_fragment_without_index_continues_the_latest_call() -> None:
    resp = response(
        run(
            body(
                chunk({"tool_calls": [{"id": "c1", "function": {"name": "a", "arguments": "{"}}]}),
                chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),
                chunk({}, "tool_calls"),
            )
        )
    )
    assert resp.assistant.tool_calls == (ToolCall("c1", "a", "{}"),)


def test_deprecated_function_call() -> None:
    resp = response(
        run(
            body(
                chunk({"function_call": {"name": "f", "arguments": ""}}),
                chunk({"function_call": {"arguments": '{"a":1}'}}),
                chunk({}, "function_call"),
            )
        )
    )
    assert resp.assistant.tool_calls == (ToolCall("call_0", "f", '{"a":1}'),)
    assert resp.stop_reason is StopReason.TOOL_CALLS and resp.raw_stop_reason == "function_call"


def test_text_and_tool_calls_in_one_turn() -> None:
    resp = response(
        run(
            body(
                chunk({"content": "Let me check."}),
                chunk({"content": "", "tool_calls": [call("f", "{}", "c1")]}),
                chunk({}, "tool_calls"),
            )
        )
    )
    assert resp.assistant.content == "Let me check." and len(resp.assistant.tool_calls) == 1


# -- reasoning ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_string_fields(field: str) -> None:
    events = run(
        body(
            chunk({"role": "assistant", "content": None, field: ""}),
            chunk({field: "think"}),
            chunk({field: "ing"}),
            chunk({"content": "answer"}),
            chunk({}, "stop"),
        )
    )
    assert text_of(events, SamplingChannel.REASONING) == "thinking"
    assert isinstance(events[1], FirstToken)
    resp = response(events)
    assert [r.text for r in reasoning_items(resp)] == ["thinking"]
    assert resp.assistant.content == "answer"
    assert isinstance(resp.items[-1], Assistant)
    # Nothing opaque, but the block still completes (once, before Completed) with its origin.
    (done,) = [e for e in events if isinstance(e, ReasoningCompleted)]
    assert done.item.text == "thinking" and not done.item.is_opaque
    assert events.index(done) == len(events) - 2


def test_reasoning_and_reasoning_details_are_not_emitted_twice() -> None:
    def both(text: str) -> dict[str, Any]:
        detail = {
            "type": "reasoning.text",
            "text": text,
            "format": "anthropic-claude-v1",
            "index": 0,
        }
        return {
            "role": "assistant",
            "content": "",
            "reasoning": text,
            "reasoning_details": [detail],
        }

    signed = {
        "type": "reasoning.text",
        "signature": "SIG",
        "format": "anthropic-claude-v1",
        "index": 0,
    }
    events = run(
        body(
            chunk({"reasoning": None, "reasoning_details": []}),
            chunk(both("This")),
            chunk(both(" is")),
            chunk({"reasoning": None, "reasoning_details": [signed]}),
            chunk({"content": "4", "reasoning": None, "reasoning_details": []}),
            chunk({}, "stop"),
        )
    )
    assert text_of(events, SamplingChannel.REASONING) == "This is"
    completed = [e for e in events if isinstance(e, ReasoningCompleted)]
    assert len(completed) == 1 and completed[0].signature == "SIG"
    resp = response(events)
    assert reasoning_items(resp) == [
        Reasoning(text="This is", signature="SIG", origin=ApiBackend.CHAT_COMPLETIONS)
    ]


def test_reasoning_string_without_details_text_is_used() -> None:
    events = run(
        body(
            chunk({"reasoning": "plain", "reasoning_details": [{"type": "x", "index": 0}]}),
            chunk({}, "stop"),
        )
    )
    assert text_of(events, SamplingChannel.REASONING) == "plain"


def test_encrypted_reasoning_details_and_summary() -> None:
    encrypted = {
        "type": "reasoning.encrypted",
        "data": "gAAAA",
        "id": "rs_1",
        "format": "openai-responses-v1",
        "index": 0,
    }
    summary = {"type": "reasoning.summary", "summary": "Thought.", "index": 1}
    redacted = {
        "type": "reasoning.encrypted",
        "data": "REDACTED",
        "format": "anthropic-claude-v1",
        "index": 2,
    }
    events = run(
        body(
            chunk({"reasoning_details": [encrypted]}),
            chunk({"reasoning_details": [summary]}),
            chunk({"reasoning_details": [redacted]}),
            chunk({"content": "hi"}),
            chunk({}, "stop"),
        )
    )
    origin = ApiBackend.CHAT_COMPLETIONS
    assert reasoning_items(response(events)) == [
        Reasoning(id="rs_1", encrypted_content="gAAAA", origin=origin),
        Reasoning(summary=("Thought.",), origin=origin),
        Reasoning(redacted_data="REDACTED", origin=origin),
    ]
    # the two opaque blocks, then the plain summary block as the stream completes
    assert sum(isinstance(e, ReasoningCompleted) for e in events) == 3
    assert text_of(events, SamplingChannel.REASONING) == "Thought."


# -- usage and cost ----------------------------------------------------------------------


def usage_of(*payloads: dict[str, Any], provider: str | None = None) -> ConversationResponse:
    return response(
        run(body(chunk({"content": "x"}), chunk({}, "stop"), *payloads), provider=provider)
    )


def usage_chunk(usage: dict[str, Any], model: str = "gpt-4o") -> dict[str, Any]:
    return chunk(usage=usage, model=model) | {"choices": []}


def test_usage_openai_with_cache_and_reasoning() -> None:
    resp = usage_of(
        usage_chunk(
            {
                "prompt_tokens": 100,
                "completion_tokens": 78,
                "total_tokens": 178,
                "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 10},
                "completion_tokens_details": {"reasoning_tokens": 64},
            }
        )
    )
    assert resp.usage == Usage(100, 78, 60, 10, 64)
    assert resp.cost_usd_ticks is None


def test_usage_chunk_with_non_empty_choices_openrouter_and_cost() -> None:
    usage = {"prompt_tokens": 43, "completion_tokens": 36, "total_tokens": 79, "cost": 0.000669}
    resp = usage_of(chunk({"role": "assistant", "content": ""}, usage=usage))
    assert resp.usage == Usage(43, 36)
    assert resp.cost_usd_ticks == 6_690_000


def test_usage_last_write_wins_and_zero_cost_does_not_clobber() -> None:
    resp = usage_of(
        usage_chunk({"prompt_tokens": 1, "completion_tokens": 1, "cost_in_usd_ticks": 500}),
        usage_chunk({"prompt_tokens": 2, "completion_tokens": 3, "cost_in_usd_ticks": 0}),
    )
    assert resp.usage == Usage(2, 3)
    assert resp.cost_usd_ticks == 500


def test_usage_deepseek_cache_hit_tokens() -> None:
    resp = usage_of(
        usage_chunk(
            {
                "prompt_tokens": 339,
                "completion_tokens": 83,
                "prompt_cache_hit_tokens": 320,
                "prompt_cache_miss_tokens": 19,
            }
        )
    )
    assert resp.usage == Usage(339, 83, 320, 0, 0)


def test_usage_top_level_reasoning_tokens_azure_deepseek() -> None:
    usage: dict[str, Any] = {"prompt_tokens": 19, "completion_tokens": 50, "total_tokens": 69}
    usage |= {"prompt_tokens_details": None, "reasoning_tokens": 30}
    resp = usage_of(usage_chunk(usage))
    assert resp.usage == Usage(19, 50, 0, 0, 30)


@pytest.mark.parametrize(
    ("usage", "model", "provider", "output"),
    [
        # xAI: total = prompt + completion + reasoning → reasoning is outside completion.
        ({"total_tokens": 303}, "grok-3-mini", None, 291),
        # no total: the model name decides ...
        ({}, "grok-4", None, 291),
        # ... or the provider.
        ({}, "some-model", "xai", 291),
        ({}, "some-model", None, 1),
        # OpenRouter-served Grok is already normalized: total = prompt + completion.
        ({"total_tokens": 13}, "x-ai/grok-4", None, 1),
        ({"total_tokens": 13}, "grok-4", "xai", 1),
    ],
)
def test_usage_xai_reasoning_added_back(
    usage: dict[str, Any], model: str, provider: str | None, output: int
) -> None:
    wire = {"prompt_tokens": 12, "completion_tokens": 1, **usage}
    wire["completion_tokens_details"] = {"reasoning_tokens": 290}
    events = run(
        body(
            chunk({"content": "x"}, model=model),
            chunk({}, "stop", model=model),
            usage_chunk(wire | {"cost_in_usd_ticks": 1466250}, model=model),
        ),
        provider=provider,
    )
    resp = response(events)
    assert resp.usage is not None
    assert resp.usage.output_tokens == output and resp.usage.reasoning_tokens == 290
    assert resp.cost_usd_ticks == 1466250


def test_usage_in_x_groq() -> None:
    resp = usage_of(
        chunk(x_groq={"usage": {"prompt_tokens": 5, "completion_tokens": 7}}) | {"choices": []}
    )
    assert resp.usage == Usage(5, 7)


def test_usage_odd_values_are_tolerated_and_a_count_sent_as_text_is_flagged() -> None:
    resp = usage_of(
        usage_chunk(
            {"prompt_tokens": 5.0, "completion_tokens": "7", "cost": "1", "cost_in_usd_ticks": -3}
        )
    )
    assert resp.usage == Usage(5, 0, malformed=1)
    assert resp.cost_usd_ticks is None


# -- hosted tools (Groq compound) ---------------------------------------------------------


def test_groq_executed_tools_become_backend_tool_calls() -> None:
    started = {"index": 0, "type": "search", "arguments": '{"q": "x"}', "search_results": {}}
    done = {"index": 0, "type": "search", "arguments": '{"q": "x"}', "output": "RESULT"}
    again = {"index": 0, "type": "search", "arguments": '{"q": "y"}'}
    events = run(
        body(
            chunk({"reasoning": "look"}),
            chunk({"executed_tools": [started]}),
            chunk({"executed_tools": [done]}),
            chunk({"executed_tools": [again]}),
            chunk({"content": "answer"}),
            chunk({}, "stop"),
        )
    )
    kinds = [
        type(e) for e in events if isinstance(e, BackendToolCallStarted | BackendToolCallCompleted)
    ]
    assert kinds == [BackendToolCallStarted, BackendToolCallCompleted, BackendToolCallStarted]
    resp = response(events)
    hosted = [item for item in resp.items if isinstance(item, BackendToolCall)]
    assert [(h.id, h.name, h.result) for h in hosted] == [
        ("executed_tool_0", "search", "RESULT"),
        ("executed_tool_1", "search", None),
    ]
    assert hosted[0].arguments == '{"q": "x"}' and hosted[0].raw == (done,)


# -- in-stream errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "event", "kind", "retryable"),
    [
        (
            {"error": {"message": "The server had an error", "type": "server_error", "code": None}},
            None,
            SamplingErrorKind.API,
            True,
        ),
        (
            {"id": "gen-1", "error": {"code": 400, "message": "Token limit reached"}},
            None,
            SamplingErrorKind.INVALID_REQUEST,
            False,
        ),
        (
            {"error": {"code": 429, "message": "Rate limited"}},
            None,
            SamplingErrorKind.RATE_LIMITED,
            True,
        ),
        (
            # A relayed status classifies as the HTTP status does (502: a server fault).
            {"error": {"code": 502, "message": "Bad gateway"}},
            None,
            SamplingErrorKind.API,
            True,
        ),
        (
            {"error": {"message": "x", "type": "invalid_request_error", "code": "tool_use_failed"}},
            "error",
            SamplingErrorKind.API,
            True,
        ),
        (
            {"error": {"message": "maximum context length is 128000 tokens", "code": None}},
            None,
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
        ),
        (
            {"error": "plain string error", "code": "overloaded"},
            None,
            SamplingErrorKind.OVERLOADED,
            True,
        ),
        ({"message": "flat error frame"}, "error", SamplingErrorKind.API, True),
    ],
)
def test_in_stream_errors(
    payload: dict[str, Any], event: str | None, kind: SamplingErrorKind, retryable: bool
) -> None:
    events = run(body(chunk({"content": "partial"}), frame(payload, event), chunk({}, "stop")))
    error = failed(events)
    assert error.error.kind is kind and error.error.retryable is retryable
    assert error.partial is not None and error.partial.assistant.content == "partial"


def test_error_chunk_keeps_its_usage_in_the_partial() -> None:
    usage = {"prompt_tokens": 43, "completion_tokens": 10}
    payload = chunk({"content": ""}, usage=usage) | {
        "error": {"code": 400, "message": "Token limit"}
    }
    error = failed(run(body(chunk({"reasoning": "r"}), chunk({}, "length"), payload)))
    assert error.partial is not None and error.partial.usage == Usage(43, 10)
    assert error.partial.stop_reason is StopReason.LENGTH


def test_error_null_is_not_an_error() -> None:
    resp = response(run(body(chunk({"content": "a"}, error=None), chunk({}, "stop"))))
    assert resp.assistant.content == "a"


# -- the real corpus ---------------------------------------------------------------------

EXPECTED_ERRORS = {
    # Groq: tool_use_failed (the model produced an invalid call): retry / resample.
    "groq-gpt-oss-120b-error-event-tool-use-failed.sse": (SamplingErrorKind.API, True),
    # OpenRouter: an integer upstream status (400) inside the 200 stream.
    "openrouter-minimax-m2-midstream-error.sse": (SamplingErrorKind.INVALID_REQUEST, False),
}


@pytest.mark.real_streams
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_ends_in_one_terminal(path: Path) -> None:
    entry = MANIFEST[f"chat_completions/{path.name}"]
    # A provider we have no profile for ("other") streams with no provider's quirks.
    provider = entry["provider"] if entry["provider"] in PROFILES else None
    events = run(path.read_bytes(), provider=provider)
    last = terminal(events)
    assert isinstance(events[0], StreamStarted)
    if "error_midstream" in entry["features"]:
        assert isinstance(last, Failed)
        kind, retryable = EXPECTED_ERRORS[path.name]
        assert last.error.kind is kind and last.error.retryable is retryable
        assert last.partial is not None and reasoning_items(last.partial)
    else:
        assert isinstance(last, Completed)
        resp = last.response
        assert resp.stop_reason is not None
        if "usage" in entry["features"]:
            assert resp.usage is not None and resp.usage.input_tokens > 0
        if "tool_calls" in entry["features"]:
            assert resp.assistant.tool_calls
            for tool_call in resp.assistant.tool_calls:
                json.loads(tool_call.arguments)
        if "text" in entry["features"]:
            assert resp.assistant.content
        if "refusal" in entry["features"]:
            assert resp.assistant.refusal and resp.stop_reason is StopReason.CONTENT_FILTER
        if "reasoning" in entry["features"]:
            assert reasoning_items(resp)
        if "cost" in entry["features"]:
            assert resp.cost_usd_ticks
        if "web_search/hosted_tool" in entry["features"] and entry["provider"] == "other":
            assert any(isinstance(item, BackendToolCall) for item in resp.items)


def _splits(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(count, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.real_streams
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_split_invariance(path: Path) -> None:
    data = path.read_bytes()
    whole = run(data)
    step = 1 if len(data) < 50_000 else 7
    assert run([data[i : i + step] for i in range(0, len(data), step)]) == whole
    rng = random.Random(path.name)
    for _ in range(5):
        assert run(_splits(data, rng, rng.randint(1, 64))) == whole


# -- totality (hypothesis) ---------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=8)
)
_json = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
_fragment = st.fixed_dictionaries(
    {},
    optional={
        "index": st.one_of(st.integers(0, 3), st.none(), _json),
        "id": st.one_of(st.sampled_from(["c1", "c2", ""]), _json),
        "type": st.just("function"),
        "function": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.one_of(st.sampled_from(["f", "g"]), _json),
                    "arguments": st.one_of(st.sampled_from(["", "{", "}", '"a"']), _json),
                },
            ),
            _json,
        ),
    },
)
_detail = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["reasoning.text", "reasoning.summary", "reasoning.encrypted", "other"]
        )
    },
    optional={
        "text": st.one_of(st.text(max_size=5), _json),
        "summary": st.one_of(st.text(max_size=5), _json),
        "signature": st.one_of(st.text(max_size=5), _json),
        "data": st.one_of(st.text(max_size=5), _json),
        "id": st.one_of(st.text(max_size=5), _json),
        "format": st.sampled_from(["anthropic-claude-v1", "openai-responses-v1", None]),
        "index": st.one_of(st.integers(0, 2), _json),
    },
)
_delta = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.just("assistant"), st.none()),
        "content": st.one_of(st.text(max_size=5), _json),
        "refusal": st.one_of(st.text(max_size=5), _json),
        "reasoning": st.one_of(st.text(max_size=5), _json),
        "reasoning_content": st.one_of(st.text(max_size=5), _json),
        "reasoning_details": st.one_of(st.lists(_detail, max_size=2), _json),
        "tool_calls": st.one_of(st.lists(_fragment, max_size=3), _json),
        "function_call": _json,
        "executed_tools": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"index": st.integers(0, 1), "type": st.just("search")},
                    optional={"output": st.one_of(st.text(max_size=5), _json), "id": _json},
                ),
                max_size=2,
            ),
            _json,
        ),
    },
)
_usage = st.fixed_dictionaries(
    {},
    optional={
        key: st.one_of(st.integers(0, 400), _json)
        for key in (
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "reasoning_tokens",
            "prompt_cache_hit_tokens",
            "cost_in_usd_ticks",
            "cost",
        )
    }
    | {
        "prompt_tokens_details": st.one_of(
            st.fixed_dictionaries({"cached_tokens": st.integers(0, 50)}), _json
        ),
        "completion_tokens_details": st.one_of(
            st.fixed_dictionaries({"reasoning_tokens": st.integers(0, 50)}), _json
        ),
    },
)
_choice = st.fixed_dictionaries(
    {"index": st.one_of(st.integers(0, 2), _json)},
    optional={
        "delta": st.one_of(_delta, _json),
        "finish_reason": st.one_of(
            st.sampled_from(["stop", "length", "tool_calls", "weird"]), st.none(), _json
        ),
        "logprobs": _json,
    },
)
_chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": _json,
        "model": st.one_of(st.sampled_from(["grok-3", "gpt-4o"]), _json),
        "choices": st.one_of(st.lists(_choice, max_size=2), _json),
        "usage": st.one_of(_usage, _json),
        "error": _json,
        "x_groq": _json,
    },
)
_event = st.one_of(
    _chunk.map(lambda c: frame(c)),
    st.tuples(_chunk, st.sampled_from(["error", "message", "ping"])).map(lambda t: frame(*t)),
    st.just(b"data: [DONE]\n\n"),
    st.just(b": keep-alive\n\n"),
    st.binary(max_size=40),
)


def _check_total(events: list[SamplingEvent]) -> None:
    assert sum(isinstance(e, TERMINALS) for e in events) == 1
    assert isinstance(events[-1], TERMINALS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_arbitrary_bytes_end_in_one_terminal(data: bytes) -> None:
    _check_total(run(data))
    _check_total(run(b"data: " + data + b"\n\n"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, max_size=8), st.randoms(use_true_random=False))
def test_arbitrary_chunks_end_in_one_terminal(frames: list[bytes], rng: random.Random) -> None:
    data = b"".join(frames)
    whole = run(data)
    _check_total(whole)
    if len(data) > 1:
        assert run(_splits(data, rng, rng.randint(1, 16))) == whole
    final = whole[-1]
    assert isinstance(final, TERMINALS)
    response_ = final.response if isinstance(final, Completed) else final.partial
    if response_ is not None:
        # Everything in the response is well-formed plain data.
        orjson.dumps(str(response_))


def test_databricks_reasoning_content_parts_are_reasoning() -> None:
    """Databricks serves gpt-oss reasoning as ``delta.content`` parts of type ``reasoning``
    whose ``summary`` holds ``summary_text`` parts; string content stays the answer."""

    def summary(text: str) -> dict[str, Any]:
        return {
            "content": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}]
        }

    events = run(
        body(
            chunk(summary("Count")),
            chunk(summary(" to 3.")),
            chunk({"content": "1, 2, 3."}, "stop"),
        )
    )
    resp = response(events)
    assert text_of(events, SamplingChannel.REASONING) == "Count to 3."
    assert [r.text for r in reasoning_items(resp)] == ["Count to 3."]
    assert resp.text == "1, 2, 3." and resp.stop_reason is StopReason.STOP


def test_custom_tool_call_fragments_carry_name_and_input() -> None:
    """A custom (free-form) tool call streams ``custom: {name, input}`` fragments."""
    first = {
        "index": 0,
        "id": "call_c1",
        "type": "custom",
        "custom": {"name": "run_sql", "input": ""},
    }
    more = {"index": 0, "type": "custom", "custom": {"input": "SELECT 1"}}
    rest = {"index": 0, "custom": {"input": " FROM t"}}
    resp = response(
        run(
            body(
                chunk({"tool_calls": [first]}),
                chunk({"tool_calls": [more]}),
                chunk({"tool_calls": [rest]}, "tool_calls"),
            )
        )
    )
    (call,) = resp.tool_calls
    assert (call.id, call.name, call.arguments) == ("call_c1", "run_sql", "SELECT 1 FROM t")


def test_audio_transcript_is_the_answer_text() -> None:
    audio = {"id": "audio_1", "data": "AAAA", "expires_at": 1, "transcript": ""}
    events = run(
        body(
            chunk({"role": "assistant", "content": None, "audio": audio}),
            chunk({"audio": {"transcript": "Hel"}}),
            chunk({"audio": {"data": "BBBB"}}),
            chunk({"audio": {"transcript": "lo"}}),
            chunk({}, "stop"),
        )
    )
    assert text_of(events, SamplingChannel.TEXT) == "Hello"
    assert response(events).text == "Hello"
