"""The Responses stream transform: quirks (hand-written SSE), the real corpus, split
invariance and totality (hypothesis)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import corpus
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
    OpaqueItem,
    OpaqueItemReceived,
    Reasoning,
    ReasoningCompleted,
    SamplingChannel,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from trio_sampler.wire import SSEDecoder, collect, replay
from trio_sampler.wire.responses._stream import ResponsesTransform

CORPUS = corpus.root()
MANIFEST = corpus.manifest("responses")
TERMINALS = (Completed, Failed)


def run(
    body: bytes, chunks: list[int] | None = None
) -> tuple[list[SamplingEvent], ResponsesTransform]:
    """Drive the transform directly: body split at ``chunks`` offsets (or whole)."""
    transform = ResponsesTransform("r")
    decoder = SSEDecoder()
    events: list[SamplingEvent] = transform.start()
    start = 0
    for point in [*(chunks or []), len(body)]:
        for sse in decoder.feed(body[start:point]):
            events += transform.feed(sse)
        start = point
    for sse in decoder.close():
        events += transform.feed(sse)
    events += transform.close()
    return events, transform


def sse(*payloads: dict[str, Any] | str, event_lines: bool = True) -> bytes:
    """An SSE body: one event per payload (a string is sent as raw data, e.g. ``[DONE]``)."""
    out = []
    for payload in payloads:
        if isinstance(payload, str):
            out.append(f"data: {payload}\n\n")
            continue
        data = json.dumps(payload)
        name = f"event: {payload['type']}\n" if event_lines and "type" in payload else ""
        out.append(f"{name}data: {data}\n\n")
    return "".join(out).encode()


def terminal(events: list[SamplingEvent]) -> Completed | Failed:
    ends = [e for e in events if isinstance(e, TERMINALS)]
    assert len(ends) == 1, ends
    assert events[-1] is ends[0]
    return ends[0]


def completed(events: list[SamplingEvent]) -> ConversationResponse:
    end = terminal(events)
    assert isinstance(end, Completed), end
    return end.response


# -- wire building blocks ----------------------------------------------------------------

CREATED = {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-x", "output": []}}


def done_response(output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 40},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 10},
        "total_tokens": 130,
    }
    response: dict[str, Any] = {
        "id": "resp_1",
        "model": "gpt-x",
        "status": "completed",
        "output": output,
    }
    response["usage"] = usage
    response.update(extra)
    return {"type": "response.completed", "response": response}


def message(text: str, *, msg_id: str = "msg_1", phase: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    if phase:
        item["phase"] = phase
    return item


def text_events(text: str, *, index: int = 0, msg_id: str = "msg_1") -> list[dict[str, Any]]:
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"id": msg_id, "type": "message", "content": [], "role": "assistant"},
        },
        *[
            {
                "type": "response.output_text.delta",
                "item_id": msg_id,
                "output_index": index,
                "content_index": 0,
                "delta": piece,
            }
            for piece in text.split(" ")
            if piece
        ],
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": message(text.replace(" ", ""), msg_id=msg_id),
        },
    ]


FC_ADDED = {
    "type": "response.output_item.added",
    "output_index": 1,
    "item": {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": "call_A",
        "name": "multiply",
    },
}
FC_DONE_ITEM = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"a":1,"b":2}',
    "call_id": "call_A",
    "name": "multiply",
}


def fc_events() -> list[dict[str, Any]]:
    return [
        FC_ADDED,
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 1,
            "delta": '{"a":',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 1,
            "delta": '1,"b":2}',
        },
        # real captures: no ``name`` on .done
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": 1,
            "arguments": '{"a":1,"b":2}',
        },
        {"type": "response.output_item.done", "output_index": 1, "item": FC_DONE_ITEM},
    ]


# -- quirks ------------------------------------------------------------------------------


def test_text_first_token_model_and_id() -> None:
    events, _ = run(
        sse(CREATED, *text_events("Hello world"), done_response([message("Helloworld")]))
    )
    response = completed(events)
    assert response.text == "Helloworld"
    assert response.model == "gpt-x" and response.response_id == "resp_1"
    assert response.stop_reason is StopReason.STOP and response.raw_stop_reason == "completed"
    assert response.assistant.id == "msg_1"
    assert sum(isinstance(e, FirstToken) for e in events) == 1
    tokens = [e for e in events if isinstance(e, ChannelToken)]
    assert [t.text for t in tokens] == ["Hello", "world"]
    assert [t.chunk_index for t in tokens] == [1, 2]
    assert response.chunk_count == 2


def test_usage_normalized() -> None:
    events, _ = run(sse(CREATED, done_response([message("x")])))
    assert completed(events).usage == Usage(
        input_tokens=100, output_tokens=30, cache_read_tokens=40, reasoning_tokens=10
    )


@pytest.mark.parametrize(
    ("extra_usage", "cache_write", "cost"),
    [
        pytest.param(
            {"input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 7}},
            7,
            None,
            id="cache-write",
        ),
        pytest.param({"cache_write_tokens": 5}, 5, None, id="cache-write-top-level"),
        pytest.param({"cost_in_usd_ticks": 1466250}, 0, 1466250, id="xai-ticks"),
        pytest.param({"cost_in_usd_ticks": 0}, 0, None, id="xai-zero-ticks-ignored"),
        pytest.param({"cost": 1.13e-05, "is_byok": False}, 0, 113000, id="openrouter-cost"),
        pytest.param(
            {"input_tokens_details": None, "output_tokens_details": None},
            0,
            None,
            id="null-details",
        ),
    ],
)
def test_usage_extensions(extra_usage: dict[str, Any], cache_write: int, cost: int | None) -> None:
    end = done_response([message("x")])
    end["response"]["usage"].update(extra_usage)
    response = completed(run(sse(CREATED, end))[0])
    assert response.usage is not None
    assert response.usage.cache_write_tokens == cache_write
    assert response.cost_usd_ticks == cost


def test_function_call_keyed_by_item_id_with_call_id_as_id() -> None:
    # The deltas carry a *different* output_index than the item: the item_id wins.
    body = fc_events()
    body[1] = {**body[1], "output_index": 7}
    events, _ = run(sse(CREATED, *body, done_response([FC_DONE_ITEM])))
    response = completed(events)
    assert response.tool_calls == (ToolCall("call_A", "multiply", '{"a":1,"b":2}'),)
    assert response.stop_reason is StopReason.TOOL_CALLS
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].id == "call_A" and deltas[0].name == "multiply"
    assert {d.tool_index for d in deltas} == {0}
    assert "".join(d.arguments_delta for d in deltas) == '{"a":1,"b":2}'
    # tool-call deltas never trigger FirstToken
    assert not any(isinstance(e, FirstToken) for e in events)


def test_output_item_done_arguments_are_authoritative() -> None:
    body = fc_events()
    del body[3]  # no arguments.done
    body[2] = {**body[2], "delta": "GARBLED"}
    events, _ = run(sse(CREATED, *body, done_response([])))  # empty final output: streamed
    assert completed(events).tool_calls[0].arguments == '{"a":1,"b":2}'


def test_empty_final_output_falls_back_to_stream() -> None:
    events, _ = run(sse(CREATED, *text_events("a b"), *fc_events(), done_response([])))
    response = completed(events)
    assert response.text == "ab"
    assert response.tool_calls == (ToolCall("call_A", "multiply", '{"a":1,"b":2}'),)
    assert response.stop_reason is StopReason.TOOL_CALLS


def test_streamed_text_stands_against_a_different_final_text() -> None:
    # The response is the fold of the events the consumer saw: a final text that
    # contradicts the deltas does not silently replace them.
    events, _ = run(sse(CREATED, *text_events("streamed"), done_response([message("server text")])))
    response = completed(events)
    assert response.text == "streamed"
    assert response.chunk_count == 1
    assert collect(e for e in events if not isinstance(e, Completed)).text == "streamed"


def test_final_text_completes_text_lost_at_the_end_of_the_deltas() -> None:
    events, _ = run(sse(CREATED, *text_events("Hello"), done_response([message("Hello world")])))
    response = completed(events)
    assert response.text == "Hello world"
    assert [e.text for e in events if isinstance(e, ChannelToken)] == ["Hello", " world"]


def test_refusal_is_content_filter() -> None:
    refusal_item = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
    }
    body = sse(
        CREATED,
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "content": [], "role": "assistant"},
        },
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "refusal", "refusal": ""},
        },
        {
            "type": "response.refusal.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "I can't ",
        },
        {
            "type": "response.refusal.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "help with that.",
        },
        {
            "type": "response.refusal.done",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "refusal": "I can't help with that.",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": refusal_item},
        done_response([refusal_item]),
    )
    events, _ = run(body)
    response = completed(events)
    assert response.refusal == "I can't help with that."
    assert response.text == ""
    assert response.stop_reason is StopReason.CONTENT_FILTER
    assert response.raw_stop_reason == "refusal"
    # never shown as answer text: the refusal has its own channel
    assert not any(
        isinstance(e, ChannelToken) and e.channel is not SamplingChannel.REFUSAL for e in events
    )
    # and from the stream alone (empty final output)
    events, _ = run(
        body.replace(b'"output": [{"id": "msg_1"', b'"output": [], "x": [{"id": "msg_1"')
    )
    assert completed(events).refusal == "I can't help with that."


def reasoning_events(*, encrypted_added: str, encrypted_done: str) -> list[dict[str, Any]]:
    summary = [
        {"type": "summary_text", "text": "Part one."},
        {"type": "summary_text", "text": "Part two."},
    ]
    return [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {
                "id": "rs_1",
                "type": "reasoning",
                "encrypted_content": encrypted_added,
                "summary": [],
            },
        },
        {
            "type": "response.reasoning_summary_part.added",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "part": {"type": "summary_text", "text": ""},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "Part ",
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "one.",
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 1,
            "delta": "Part two.",
        },
        {
            "type": "response.reasoning_summary_text.done",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 1,
            "text": "Part two.",
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "id": "rs_1",
                "type": "reasoning",
                "encrypted_content": encrypted_done,
                "summary": summary,
            },
        },
    ]


def test_reasoning_summary_and_encrypted_content_from_done() -> None:
    body = reasoning_events(encrypted_added="gAAA_ADDED", encrypted_done="gAAA_DONE")
    final_item = {**body[-1]["item"]}
    expected = Reasoning(
        summary=("Part one.", "Part two."), id="rs_1", encrypted_content="gAAA_DONE"
    )
    for output in ([final_item, message("ok")], []):  # from the final output, and from the stream
        events, _ = run(sse(CREATED, *body, *text_events("ok", index=1), done_response(output)))
        response = completed(events)
        (item,) = response.reasoning_items
        assert attrs_eq(item, expected)
        assert isinstance(response.items[-1], Assistant)
        done = [e for e in events if isinstance(e, ReasoningCompleted)]
        assert done[0].item.encrypted_content == "gAAA_DONE"
        reasoning_tokens = [
            e
            for e in events
            if isinstance(e, ChannelToken) and e.channel is SamplingChannel.REASONING
        ]
        assert "".join(t.text for t in reasoning_tokens) == "Part one.Part two."
        assert isinstance(events[[type(e) for e in events].index(FirstToken) + 1], ChannelToken)


def attrs_eq(item: Reasoning, expected: Reasoning) -> bool:
    return (item.text, item.summary, item.id, item.encrypted_content) == (
        expected.text,
        expected.summary,
        expected.id,
        expected.encrypted_content,
    )


def test_final_reasoning_without_summary_keeps_streamed_summary() -> None:
    body = reasoning_events(encrypted_added="A", encrypted_done="B")
    thin = {"id": "rs_1", "type": "reasoning", "summary": []}
    events, _ = run(sse(CREATED, *body, done_response([thin, message("ok")])))
    (item,) = completed(events).reasoning_items
    assert item.summary == ("Part one.", "Part two.") and item.encrypted_content == "B"


def test_reasoning_text_and_overlapping_items() -> None:
    # OpenRouter: reasoning item 0 finishes *after* the message item 1; no event: lines.
    body = sse(
        CREATED,
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "reasoning", "id": "rs_t", "summary": []},
        },
        {
            "type": "response.reasoning_text.delta",
            "item_id": "rs_t",
            "output_index": 0,
            "content_index": 0,
            "delta": "think ",
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "message", "id": "msg_t", "content": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_t",
            "output_index": 1,
            "content_index": 0,
            "delta": "4",
        },
        {
            "type": "response.reasoning_text.delta",
            "item_id": "rs_t",
            "output_index": 0,
            "content_index": 0,
            "delta": "more",
        },
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": message("4", msg_id="msg_t"),
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "type": "reasoning",
                "id": "rs_t",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think more"}],
            },
        },
        done_response([]),
        "[DONE]",
        event_lines=False,
    )
    events, transform = run(body)
    response = completed(events)
    assert [type(i) for i in response.items] == [Reasoning, Assistant]
    assert response.reasoning_items[0].text == "think more"
    assert response.text == "4"
    assert transform.unknown_events == 0  # [DONE] after the terminal: tolerated


def test_message_phases_concatenate() -> None:
    output = [
        message("Checking. ", msg_id="m1", phase="commentary"),
        message("Done.", msg_id="m2", phase="final_answer"),
    ]
    events, _ = run(sse(CREATED, done_response(output)))
    response = completed(events)
    assert response.text == "Checking. Done."
    assert response.assistant.id == "m2"


def web_search_events() -> list[dict[str, Any]]:
    action = {
        "type": "search",
        "query": "weather SF",
        "sources": [{"type": "api", "name": "oai-weather"}],
    }
    return [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "ws_1", "type": "web_search_call", "status": "in_progress"},
        },
        {"type": "response.web_search_call.in_progress", "output_index": 0, "item_id": "ws_1"},
        {"type": "response.web_search_call.searching", "output_index": 0, "item_id": "ws_1"},
        {"type": "response.web_search_call.completed", "output_index": 0, "item_id": "ws_1"},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "id": "ws_1",
                "type": "web_search_call",
                "status": "completed",
                "action": action,
            },
        },
    ]


def test_hosted_web_search() -> None:
    body = web_search_events()
    done_item = body[-1]["item"]
    for output in ([done_item, message("sunny")], []):
        events, _ = run(sse(CREATED, *body, *text_events("sunny", index=1), done_response(output)))
        response = completed(events)
        started = [e for e in events if isinstance(e, BackendToolCallStarted)]
        finished = [e for e in events if isinstance(e, BackendToolCallCompleted)]
        assert [(e.call_id, e.name) for e in started] == [("ws_1", "web_search")]
        assert [(e.call_id, e.name) for e in finished] == [("ws_1", "web_search")]
        (call,) = response.backend_tool_calls
        assert call.raw == (done_item,)
        assert orjson.loads(call.arguments) == done_item["action"]
        assert call.status == "completed"
        assert response.stop_reason is StopReason.STOP  # hosted calls are not local tool calls


def test_xai_web_search_item_without_progress_events() -> None:
    item = {
        "arguments": '{"query":"what is xAI"}',
        "call_id": "",
        "name": "web_search",
        "type": "web_search_call",
        "id": "fc_x_0",
        "status": "completed",
    }
    body = sse(
        CREATED,
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        done_response([item, message("xAI is...")]),
    )
    (call,) = completed(run(body)[0]).backend_tool_calls
    assert (call.id, call.name, call.arguments) == (
        "fc_x_0",
        "web_search",
        '{"query":"what is xAI"}',
    )


def test_compaction_and_unknown_items_kept_verbatim_in_place() -> None:
    compaction = {"id": "cmp_1", "type": "compaction", "encrypted_content": "zzz"}
    body = sse(
        CREATED,
        {"type": "response.output_item.added", "output_index": 0, "item": compaction},
        {"type": "response.output_item.done", "output_index": 0, "item": compaction},
        *text_events("hi", index=1),
        done_response([compaction, message("hi")]),
    )
    events, transform = run(body)
    response = completed(events)
    assert [type(i) for i in response.items] == [OpaqueItem, Assistant]
    kept = response.items[0]
    assert isinstance(kept, OpaqueItem) and kept.raw == compaction and kept.kind == "compaction"
    assert kept.origin is ApiBackend.RESPONSES
    received = [e for e in events if isinstance(e, OpaqueItemReceived)]
    assert [(e.item, e.item_index) for e in received] == [(kept, 0)]
    assert transform.unknown_items == 1


def test_unknown_event_types_counted_and_ignored() -> None:
    body = sse(
        CREATED,
        {"type": "response.brand_new_thing.delta", "item_id": "x", "delta": "?"},
        {"type": "response.web_search_call.brand_new_phase", "item_id": "ws"},
        {"no_type": True},
        *text_events("ok"),
        done_response([message("ok")]),
    )
    events, transform = run(body)
    assert completed(events).text == "ok"
    assert transform.unknown_events == 3


def test_no_sequence_number_and_no_event_lines() -> None:
    events, _ = run(
        sse(CREATED, *text_events("a b"), done_response([message("ab")]), event_lines=False)
    )
    assert completed(events).text == "ab"


def test_background_and_resumed_stream() -> None:
    queued = {
        "type": "response.queued",
        "sequence_number": 5,
        "response": {"id": "resp_bg", "model": "gpt-4o", "status": "queued", "output": []},
    }
    end = done_response([message("4")])
    end["response"]["id"] = "resp_bg"
    events, _ = run(sse(queued, *text_events("4"), end))  # no response.created at all
    response = completed(events)
    assert response.response_id == "resp_bg" and response.text == "4"


@pytest.mark.parametrize(
    ("reason", "stop"),
    [
        ("max_output_tokens", StopReason.LENGTH),
        ("content_filter", StopReason.CONTENT_FILTER),
        ("something_new", StopReason.LENGTH),
    ],
)
def test_incomplete(reason: str, stop: StopReason) -> None:
    end = done_response([FC_DONE_ITEM])
    end["type"] = "response.incomplete"
    end["response"].update(status="incomplete", incomplete_details={"reason": reason})
    events, _ = run(sse(CREATED, *fc_events(), end))
    response = completed(events)
    assert response.stop_reason is stop  # ``length`` stays length even with tool calls
    assert response.raw_stop_reason == reason
    assert response.usage is not None and response.usage.output_tokens == 30


# -- errors inside the 200 stream --------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "kind", "retryable", "code"),
    [
        pytest.param(
            {
                "type": "error",
                "code": "ERR_SOMETHING",
                "message": "Something went wrong",
                "param": None,
            },
            SamplingErrorKind.API,
            True,
            "ERR_SOMETHING",
            id="flat",
        ),
        pytest.param(
            {
                "type": "error",
                "error": {
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                    "message": "You exceeded your current quota",
                    "param": None,
                },
            },
            SamplingErrorKind.RATE_LIMITED,
            False,
            "insufficient_quota",
            id="nested-quota",
        ),
        pytest.param(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": "Your input exceeds the context window of this model.",
                    "param": "input",
                },
            },
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
            "context_length_exceeded",
            id="nested-context",
        ),
        pytest.param(
            {
                "type": "error",
                "code": "context_length_exceeded",
                "message": "too long",
                "param": "input",
            },
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
            "context_length_exceeded",
            id="flat-context",
        ),
        pytest.param(
            {
                "type": "error",
                "error": {"type": "server_error", "code": "server_error", "message": "oops"},
            },
            SamplingErrorKind.API,
            True,
            "server_error",
            id="nested-server-error",
        ),
        pytest.param(
            {
                "type": "response.failed",
                "response": {
                    "id": "resp_1",
                    "status": "failed",
                    "error": {
                        "code": "context_length_exceeded",
                        "message": "Your input exceeds the context window",
                    },
                },
            },
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
            "context_length_exceeded",
            id="failed-context",
        ),
        pytest.param(
            {
                "type": "response.failed",
                "response": {
                    "id": "resp_1",
                    "status": "failed",
                    "error": {"code": "rate_limit_exceeded", "message": "slow down"},
                },
            },
            SamplingErrorKind.RATE_LIMITED,
            True,
            "rate_limit_exceeded",
            id="failed-rate-limit",
        ),
        pytest.param(
            {
                "type": "response.failed",
                "response": {
                    "id": "resp_1",
                    "status": "failed",
                    "error": {"code": "server_error", "message": "The model failed"},
                },
            },
            SamplingErrorKind.API,
            True,
            "server_error",
            id="failed-server-error",
        ),
        pytest.param(
            {
                "type": "response.failed",
                "response": {"id": "resp_1", "status": "failed", "error": None},
            },
            SamplingErrorKind.API,
            True,
            None,
            id="failed-no-details",
        ),
        pytest.param(
            {"error": {"message": "upstream died", "code": 502}},
            SamplingErrorKind.API,  # as an HTTP 502 with a provider error body
            True,
            "502",
            id="typeless-envelope",
        ),
    ],
)
def test_stream_errors(
    payload: dict[str, Any], kind: SamplingErrorKind, retryable: bool, code: str | None
) -> None:
    later = {
        "type": "response.failed",
        "response": {
            "id": "resp_1",
            "status": "failed",
            "error": {"code": "server_error", "message": "ignored"},
        },
    }
    events, _ = run(sse(CREATED, *text_events("partial text"), payload, later, *text_events("x")))
    end = terminal(events)
    assert isinstance(end, Failed)
    assert (end.error.kind, end.error.retryable, end.error.error_code) == (kind, retryable, code)
    assert end.partial is not None and end.partial.text == "partialtext"


def test_truncated_stream_fails_with_partial() -> None:
    events, _ = run(sse(CREATED, *text_events("half"))[:-3])
    end = terminal(events)
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.TRANSPORT and end.error.retryable
    assert end.partial is not None and end.partial.text == "half"


def test_done_marker_without_terminal_is_truncated() -> None:
    events, transform = run(sse(CREATED, *text_events("x"), "[DONE]"))
    assert isinstance(terminal(events), Failed)
    assert transform.done_marker


def test_done_marker_after_completed_is_tolerated() -> None:
    events, _ = run(sse(CREATED, done_response([message("x")]), "[DONE]", "[DONE]"))
    assert completed(events).text == "x"


def test_invalid_json_is_serialization_failure() -> None:
    events, _ = run(sse(CREATED) + b"data: {not json\n\n")
    end = terminal(events)
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.SERIALIZATION


# -- doom loop ---------------------------------------------------------------------------


def test_doom_loop_checks_are_recorded_never_fatal() -> None:
    check1 = {
        "type": "response.doom_loop_check",
        "doom_loop_check": {"triggers": ["tail_repetition:8@thinking"]},
    }
    check2 = {
        "type": "response.doom_loop_check",
        "doom_loop_check": {"triggers": ["tail_repetition:8@thinking", "low_logprob@response", 3]},
    }
    end = done_response(
        [message("ok")], doom_loop_check={"triggers": ["tail_repetition:4@thinking"]}
    )
    body = (
        sse(CREATED, check1)
        + b"event: response.doom_loop_check\ndata: {garbage\n\n"
        + b'event: response.doom_loop_check\ndata: {"type": "response.doom_loop_check"}\n\n'
        + sse(check2, *text_events("ok"), end)
    )
    events, transform = run(body)
    response = completed(events)
    assert response.doom_loop_signals == (
        "tail_repetition:8@thinking",
        "low_logprob@response",
        "tail_repetition:4@thinking",
    )
    assert transform.malformed_doom_loop_events == 2
    assert transform.unknown_events == 0


# -- the real corpus ---------------------------------------------------------------------


def corpus_ids() -> list[str]:
    return [Path(entry["file"]).stem for entry in MANIFEST]


@pytest.mark.real_streams
@pytest.mark.parametrize("entry", MANIFEST, ids=corpus_ids())
def test_corpus_terminal(entry: dict[str, Any]) -> None:
    body = (CORPUS / entry["file"]).read_bytes()
    events, transform = run(body)
    end = terminal(events)
    if "error_midstream" in entry["features"]:
        assert isinstance(end, Failed)
        assert end.error.kind is SamplingErrorKind.RATE_LIMITED  # insufficient_quota
        assert end.error.error_code == "insufficient_quota" and not end.error.retryable
        return
    assert isinstance(end, Completed)
    response = end.response
    assert transform.unknown_events == 0
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.model == entry["model"]
    features = set(entry["features"])
    assert bool(response.tool_calls) == ("tool_calls" in features)
    assert response.stop_reason is (
        StopReason.TOOL_CALLS if response.tool_calls else StopReason.STOP
    )
    if "text" in features:
        assert response.text
    if "encrypted_reasoning" in features:
        assert any(r.encrypted_content for r in response.reasoning_items)
    if "reasoning_summary" in features:
        assert any(r.summary for r in response.reasoning_items)
    if "reasoning_text" in features:
        assert any(r.text for r in response.reasoning_items)
    if "cache_tokens" in features:
        assert response.usage.cache_read_tokens > 0
    if "web_search/hosted_tool" in features:
        assert response.backend_tool_calls
        assert all(isinstance(c, BackendToolCall) and c.raw for c in response.backend_tool_calls)
    for call in response.tool_calls:
        assert call.id.startswith("call_")
        call.parsed_arguments()
    # registry integration: replay + collect give the same response
    assert collect(replay("responses", [body], request_id="r")) == response


def split_points(size: int, rng: random.Random) -> list[int]:
    return sorted(rng.sample(range(1, size), min(size - 1, rng.randint(1, 40))))


@pytest.mark.real_streams
@pytest.mark.parametrize("entry", MANIFEST, ids=corpus_ids())
def test_corpus_split_invariance(entry: dict[str, Any]) -> None:
    body = (CORPUS / entry["file"]).read_bytes()
    whole, _ = run(body)
    step = 1 if len(body) < 50_000 else 7
    assert run(body, list(range(step, len(body), step)))[0] == whole
    rng = random.Random(entry["sha256"])
    for _ in range(5):
        assert run(body, split_points(len(body), rng))[0] == whole


@pytest.mark.real_streams
def test_encrypted_content_from_done_in_real_capture() -> None:
    # OpenAI re-encrypts on every copy: .added, .done and response.completed all differ.
    # The live event carries .done's; the final item the server's complete response's.
    body = (
        CORPUS / "responses/openai-gpt-5.1-codex-max-reasoning-summary-function-call.sse"
    ).read_bytes()
    seen: dict[str, str] = {}
    decoder = SSEDecoder()
    for event in decoder.feed(body) + decoder.close():
        payload = orjson.loads(event.data)
        if payload.get("item", {}).get("type") == "reasoning":
            seen[payload["type"]] = payload["item"]["encrypted_content"]
        if payload["type"] == "response.completed":
            seen["final"] = payload["response"]["output"][0]["encrypted_content"]
    assert len(set(seen.values())) == 3
    events = run(body)[0]
    assert completed(events).reasoning_items[0].encrypted_content == seen["final"]
    streamed = [e for e in events if isinstance(e, ReasoningCompleted)]
    assert streamed[0].item.encrypted_content == seen["response.output_item.done"]


# -- totality ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=1, max_value=400), max_size=5))
def test_arbitrary_bytes_never_raise(body: bytes, cuts: list[int]) -> None:
    events, _ = run(body, sorted({c for c in cuts if c < len(body)}))
    terminal(events)


_EVENT_TYPES = [
    "response.created",
    "response.in_progress",
    "response.queued",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.content_part.added",
    "response.web_search_call.in_progress",
    "response.code_interpreter_call.interpreting",
    "response.doom_loop_check",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
    "response.mystery",
]
_ITEM_TYPES = [
    "message",
    "function_call",
    "reasoning",
    "web_search_call",
    "mcp_call",
    "compaction",
    5,
    None,
]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.text(max_size=6)
    | st.floats(allow_nan=False)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_item = st.fixed_dictionaries(
    {"type": st.sampled_from(_ITEM_TYPES)},
    optional={
        "id": st.sampled_from(["fc_1", "rs_1", "msg_1", "ws_1"]) | _scalars,
        "call_id": _scalars,
        "name": _scalars,
        "arguments": _scalars,
        "encrypted_content": _scalars,
        "summary": st.lists(
            st.fixed_dictionaries({"type": st.just("summary_text"), "text": _scalars}), max_size=2
        )
        | _json,
        "content": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["output_text", "refusal", "reasoning_text"]),
                    "text": _scalars,
                    "refusal": _scalars,
                }
            ),
            max_size=2,
        )
        | _json,
        "action": _json,
    },
)
_response = st.fixed_dictionaries(
    {},
    optional={
        "id": _scalars,
        "model": _scalars,
        "status": _scalars,
        "output": st.lists(_item, max_size=3) | _json,
        "usage": st.fixed_dictionaries(
            {},
            optional={
                "input_tokens": _scalars,
                "output_tokens": _scalars,
                "cost": _scalars,
                "cost_in_usd_ticks": _scalars,
                "input_tokens_details": _json,
                "output_tokens_details": _json,
            },
        )
        | _json,
        "incomplete_details": _json,
        "error": _json,
        "doom_loop_check": _json,
    },
)
_event = st.fixed_dictionaries(
    {"type": st.sampled_from(_EVENT_TYPES)},
    optional={
        "item_id": st.sampled_from(["fc_1", "rs_1", "msg_1", "ws_1"]) | _scalars,
        "output_index": st.integers(0, 3) | _scalars,
        "summary_index": st.integers(-1, 2) | _scalars,
        "delta": _scalars,
        "arguments": _scalars,
        "name": _scalars,
        "item": _item | _json,
        "part": _json,
        "response": _response | _json,
        "error": _json,
        "code": _scalars,
        "message": _scalars,
        "doom_loop_check": _json,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event | _json, max_size=12), st.booleans(), st.integers(1, 64))
def test_arbitrary_events_never_raise(payloads: list[Any], event_lines: bool, step: int) -> None:
    parts = []
    for payload in payloads:
        name = payload.get("type") if isinstance(payload, dict) else None
        prefix = f"event: {name}\n" if event_lines and isinstance(name, str) else ""
        parts.append(f"{prefix}data: {json.dumps(payload)}\n\n")
    body = "".join(parts).encode()
    events, _ = run(body)
    terminal(events)
    assert run(body, list(range(step, len(body), step)))[0] == events
