"""The Anthropic Messages stream transform: one test per wire quirk, the real-capture
corpus (terminal kind, split invariance) and property tests (totality)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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
    Cancelled,
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
    ToolCallDelta,
    Usage,
)
from trio_sampler.wire._replay import collect, replay
from trio_sampler.wire.messages._stream import MessagesTransform
from trio_sampler.wire.sse import SSEDecoder

RID = "replay"

# -- helpers ---------------------------------------------------------------------------


CORPUS = corpus.root()
MANIFEST = corpus.manifest("messages")
CORPUS_IDS = [Path(entry["file"]).stem for entry in MANIFEST]


def run(body: bytes | Iterable[bytes]) -> list[SamplingEvent]:
    """Decode and transform a body (whole, or as the given chunks)."""
    chunks = [body] if isinstance(body, bytes) else body
    return replay(ApiBackend.MESSAGES, chunks, request_id=RID)


def run_direct(chunks: Iterable[bytes]) -> tuple[MessagesTransform, list[SamplingEvent]]:
    """The same as :func:`run`, by hand, keeping the transform for its counters."""
    transform = MessagesTransform(RID)
    decoder = SSEDecoder()
    events = transform.start()
    for chunk in chunks:
        for sse in decoder.feed(chunk):
            events += transform.feed(sse)
    for sse in decoder.close():
        events += transform.feed(sse)
    events += transform.close()
    return transform, events


def frame(payload: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One SSE frame; the ``event:`` line is the payload's ``type`` unless given."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    name = (
        event if event is not None else (payload.get("type") if isinstance(payload, dict) else None)
    )
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n".encode()


def body(*payloads: dict[str, Any] | str) -> bytes:
    return b"".join(frame(payload) for payload in payloads)


def message_start(
    usage: dict[str, Any] | None = None, *, msg_id: str = "msg_1", model: str = "claude-test"
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    message["usage"] = usage if usage is not None else {"input_tokens": 10, "output_tokens": 1}
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return delta(index, type="text_delta", text=text)


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(
    stop_reason: str | None = "end_turn",
    usage: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None, **extra},
        "usage": usage if usage is not None else {"output_tokens": 5},
    }


STOP = {"type": "message_stop"}
PING = {"type": "ping"}


def text_message(*pieces: str, stop_reason: str = "end_turn") -> list[dict[str, Any]]:
    return [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        *(text_delta(0, piece) for piece in pieces),
        block_stop(0),
        message_delta(stop_reason),
        STOP,
    ]


def terminal(events: Sequence[SamplingEvent]) -> Completed | Failed | Cancelled:
    """Exactly one terminal, and it is the last event."""
    terminals = [e for e in events if isinstance(e, Completed | Failed | Cancelled)]
    assert len(terminals) == 1, terminals
    assert events[-1] is terminals[0]
    return terminals[0]


def completed(events: Sequence[SamplingEvent]) -> ConversationResponse:
    end = terminal(events)
    assert isinstance(end, Completed), end
    return end.response


def failed(events: Sequence[SamplingEvent]) -> Failed:
    end = terminal(events)
    assert isinstance(end, Failed), end
    return end


def of_type(events: Iterable[SamplingEvent], cls: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


# -- the basic shape -------------------------------------------------------------------


def test_text_stream_events_in_order() -> None:
    events = run(body(*text_message("Hello, ", "world!")))
    assert events[:4] == [
        StreamStarted(RID),
        FirstToken(RID),
        ChannelToken(RID, SamplingChannel.TEXT, "Hello, ", 1),
        ChannelToken(RID, SamplingChannel.TEXT, "world!", 2),
    ]
    response = completed(events)
    assert response.items == (Assistant(content="Hello, world!", model="claude-test", id="msg_1"),)
    assert response.stop_reason is StopReason.STOP
    assert response.raw_stop_reason == "end_turn"
    assert response.model == "claude-test"
    assert response.response_id == "msg_1"
    assert response.chunk_count == 2
    assert response.usage == Usage(input_tokens=10, output_tokens=5)
    assert collect(events) == response


def test_initial_text_in_block_start_counts() -> None:
    events = run(
        body(
            message_start(),
            block_start(0, {"type": "text", "text": "Hi"}),
            text_delta(0, " there"),
            block_stop(0),
            message_delta(),
            STOP,
        )
    )
    assert completed(events).text == "Hi there"
    assert of_type(events, ChannelToken)[0].text == "Hi"


def test_many_text_blocks_concatenate_without_separator() -> None:
    events = run(
        body(
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            text_delta(0, "one."),
            block_stop(0),
            block_start(1, {"citations": [], "type": "text", "text": ""}),
            text_delta(1, "two."),
            block_stop(1),
            message_delta(),
            STOP,
        )
    )
    assert completed(events).text == "one.two."


def test_empty_text_block_start_is_not_first_token() -> None:
    events = run(body(message_start(), block_start(0, {"type": "text", "text": ""})))
    assert not of_type(events, FirstToken)


# -- thinking --------------------------------------------------------------------------


def thinking_block(index: int, text: str, *signatures: str) -> list[dict[str, Any]]:
    return [
        block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(index, type="thinking_delta", thinking=text),
        delta(index, type="thinking_delta", thinking=""),
        *(delta(index, type="signature_delta", signature=sig) for sig in signatures),
        block_stop(index),
    ]


def test_thinking_signature_replaces_and_completes_reasoning() -> None:
    events = run(
        body(
            message_start(),
            *thinking_block(0, "let me think", "sig-old", "sig-final"),
            block_start(1, {"type": "text", "text": ""}),
            text_delta(1, "Answer"),
            block_stop(1),
            message_delta(),
            STOP,
        )
    )
    # Opening a thinking block is first content, before its first delta.
    assert events[1] == FirstToken(RID)
    assert events[2] == ChannelToken(RID, SamplingChannel.REASONING, "let me think", 1)
    item = Reasoning(text="let me think", signature="sig-final", origin=ApiBackend.MESSAGES)
    assert of_type(events, ReasoningCompleted) == [ReasoningCompleted(RID, item)]
    response = completed(events)
    assert response.items[0] == item
    assert response.text == "Answer"


def test_every_thinking_block_is_its_own_reasoning_item() -> None:
    events = run(
        body(
            message_start(),
            *thinking_block(0, "first", "sig-1"),
            block_start(1, {"type": "text", "text": ""}),
            text_delta(1, "middle"),
            block_stop(1),
            *thinking_block(2, "second", "sig-2"),
            message_delta(),
            STOP,
        )
    )
    assert [e.signature for e in of_type(events, ReasoningCompleted)] == ["sig-1", "sig-2"]
    items = completed(events).items
    assert [(i.text, i.signature) for i in items if isinstance(i, Reasoning)] == [
        ("first", "sig-1"),
        ("second", "sig-2"),
    ]
    assert isinstance(items[-1], Assistant)


def test_redacted_thinking_arrives_whole() -> None:
    events = run(
        body(
            message_start(),
            block_start(0, {"type": "redacted_thinking", "data": "EqkECkYIBxgC"}),
            block_stop(0),
            block_start(1, {"type": "redacted_thinking", "data": "second-blob"}),
            block_stop(1),
            block_start(2, {"type": "text", "text": ""}),
            text_delta(2, "ok"),
            block_stop(2),
            message_delta(),
            STOP,
        )
    )
    assert events[1] == FirstToken(RID)
    first = Reasoning(redacted_data="EqkECkYIBxgC", origin=ApiBackend.MESSAGES)
    second = Reasoning(redacted_data="second-blob", origin=ApiBackend.MESSAGES)
    assert [e.item for e in of_type(events, ReasoningCompleted)] == [first, second]
    assert completed(events).items[:2] == (first, second)
    assert first.is_opaque


def test_thinking_block_cut_without_stop_is_closed_at_message_delta() -> None:
    events = run(
        body(
            message_start(),
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, type="thinking_delta", thinking="partial thought"),
            message_delta("max_tokens"),
            STOP,
        )
    )
    response = completed(events)
    assert response.items[0] == Reasoning(text="partial thought", origin=ApiBackend.MESSAGES)
    assert response.stop_reason is StopReason.LENGTH


# -- local tool calls ------------------------------------------------------------------


def tool_block(index: int, call_id: str, name: str, *fragments: str) -> list[dict[str, Any]]:
    return [
        block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
        *(delta(index, type="input_json_delta", partial_json=f) for f in fragments),
        block_stop(index),
    ]


def test_tool_use_input_is_assembled_from_fragments() -> None:
    events = run(
        body(
            message_start(),
            *tool_block(0, "toolu_1", "get_weather", "", '{"location":', ' "Paris"}'),
            message_delta("tool_use"),
            STOP,
        )
    )
    assert of_type(events, ToolCallDelta) == [
        ToolCallDelta(RID, 0, "toolu_1", "get_weather", ""),
        ToolCallDelta(RID, 0, None, None, '{"location":'),
        ToolCallDelta(RID, 0, None, None, ' "Paris"}'),
    ]
    assert not of_type(events, FirstToken)  # tool-call deltas are not first content
    response = completed(events)
    (call,) = response.assistant.tool_calls
    assert (call.id, call.name, call.parsed_arguments()) == (
        "toolu_1",
        "get_weather",
        {"location": "Paris"},
    )
    assert response.stop_reason is StopReason.TOOL_CALLS


@pytest.mark.parametrize("fragments", [(), ("",), ("", "")], ids=["none", "empty", "empties"])
def test_tool_use_without_input_means_empty_object(fragments: tuple[str, ...]) -> None:
    events = run(
        body(
            message_start(),
            *tool_block(0, "toolu_1", "no_args", *fragments),
            *tool_block(1, "toolu_2", "no_args"),
            message_delta("tool_use"),
            STOP,
        )
    )
    calls = completed(events).assistant.tool_calls
    assert [(c.id, c.arguments) for c in calls] == [("toolu_1", "{}"), ("toolu_2", "{}")]
    assert [e.tool_index for e in of_type(events, ToolCallDelta)] == [0, 1]


def test_tool_use_input_sent_whole_in_block_start() -> None:
    # Some gateways put the whole input into the start block and send no deltas.
    start = block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}})
    events = run(body(message_start(), start, block_stop(0), message_delta("tool_use"), STOP))
    assert completed(events).assistant.tool_calls[0].parsed_arguments() == {"a": 1}


def test_tool_use_cut_by_max_tokens_is_closed_and_kept_raw() -> None:
    events = run(
        body(
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            text_delta(0, "Writing the file."),
            block_stop(0),
            block_start(1, {"type": "tool_use", "id": "toolu_9", "name": "make_file", "input": {}}),
            delta(1, type="input_json_delta", partial_json=""),
            delta(1, type="input_json_delta", partial_json='{"lines": ["a", "b'),
            message_delta("max_tokens"),
            STOP,
        )
    )
    response = completed(events)
    (call,) = response.assistant.tool_calls
    assert call.arguments == '{"lines": ["a", "b'  # truncated: the actor must not run it
    assert response.stop_reason is StopReason.LENGTH  # length stays length with tool calls
    assert response.raw_stop_reason == "max_tokens"


# -- hosted (server) tools -------------------------------------------------------------

SEARCH_RESULT = [
    {"type": "web_search_result", "title": "T", "url": "https://e.x", "page_age": None}
]


def test_server_tool_use_and_result_make_one_backend_tool_call() -> None:
    result_block = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": SEARCH_RESULT,
    }
    events = run(
        body(
            message_start(),
            block_start(
                0,
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            ),
            delta(0, type="input_json_delta", partial_json=""),
            delta(0, type="input_json_delta", partial_json='{"query": "ne'),
            delta(0, type="input_json_delta", partial_json='ws"}'),
            block_stop(0),
            block_start(1, result_block),
            block_stop(1),
            block_start(2, {"citations": [], "type": "text", "text": ""}),
            delta(2, type="citations_delta", citation={"type": "web_search_result_location"}),
            text_delta(2, "News."),
            block_stop(2),
            message_delta("end_turn", {"input_tokens": 3100, "output_tokens": 40}),
            STOP,
        )
    )
    assert of_type(events, BackendToolCallStarted) == [
        BackendToolCallStarted(RID, "srvtoolu_1", "web_search")
    ]
    (done,) = of_type(events, BackendToolCallCompleted)
    assert (done.call_id, done.name, done.result, done.item_index) == (
        "srvtoolu_1",
        "web_search",
        SEARCH_RESULT,
        0,
    )
    assert done.call is not None and done.call.arguments == '{"query": "news"}'
    assert not of_type(events, ToolCallDelta)  # hosted input is not a local tool call
    response = completed(events)
    call = response.items[0]
    assert call == BackendToolCall(
        id="srvtoolu_1",
        name="web_search",
        arguments='{"query": "news"}',
        status="completed",
        result=SEARCH_RESULT,
        origin=ApiBackend.MESSAGES,
        raw=(
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "news"},
            },
            result_block,
        ),
    )
    assert response.text == "News."
    assert response.assistant.tool_calls == ()


def test_server_tool_error_result_is_a_failed_call() -> None:
    error = {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}
    events = run(
        body(
            message_start(),
            block_start(
                0, {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}
            ),
            block_stop(0),
            block_start(
                1, {"type": "web_search_tool_result", "tool_use_id": "s1", "content": error}
            ),
            block_stop(1),
            message_delta(),
            STOP,
        )
    )
    call = completed(events).items[0]
    assert isinstance(call, BackendToolCall)
    assert (call.status, call.result, call.arguments) == ("failed", error, "{}")


def test_result_without_its_call_block_is_named_after_its_type() -> None:
    # A pause_turn continuation starts with the result of a call made in the last turn.
    block = {"type": "web_search_tool_result", "tool_use_id": "s0", "content": []}
    events = run(body(message_start(), block_start(0, block), block_stop(0), message_delta(), STOP))
    call = completed(events).items[0]
    assert isinstance(call, BackendToolCall)
    assert (call.id, call.name, call.raw) == ("s0", "web_search", (block,))


def test_server_tool_without_result_keeps_its_input_for_pause_turn() -> None:
    events = run(
        body(
            message_start(),
            block_start(
                0, {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}
            ),
            delta(0, type="input_json_delta", partial_json='{"query": "x"}'),
            block_stop(0),
            message_delta("pause_turn"),
            STOP,
        )
    )
    response = completed(events)
    call = response.items[0]
    assert isinstance(call, BackendToolCall)
    assert call.arguments == '{"query": "x"}'
    assert call.raw[0]["input"] == {"query": "x"}
    assert (response.stop_reason, response.raw_stop_reason) == (StopReason.STOP, "pause_turn")


# -- usage -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start_usage", "delta_usages", "expected"),
    [
        pytest.param(
            {
                "input_tokens": 100,
                "cache_read_input_tokens": 5000,
                "cache_creation_input_tokens": 200,
                "output_tokens": 1,
            },
            [{"output_tokens": 7}],
            Usage(
                input_tokens=5300, output_tokens=7, cache_read_tokens=5000, cache_write_tokens=200
            ),
            id="three-buckets-summed",
        ),
        pytest.param(
            {
                "input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": 1,
            },
            [
                {
                    "input_tokens": 10,
                    "cache_read_input_tokens": 900,
                    "cache_creation_input_tokens": 50,
                    "output_tokens": 3,
                }
            ],
            Usage(input_tokens=960, output_tokens=3, cache_read_tokens=900, cache_write_tokens=50),
            id="delta-overwrites-start",
        ),
        pytest.param(
            {"input_tokens": 2050, "output_tokens": 3},
            [
                {"input_tokens": 31772, "output_tokens": 300},
                {
                    "input_tokens": 31772,
                    "output_tokens": 644,
                    "server_tool_use": {"web_search_requests": 2},
                },
            ],
            Usage(input_tokens=31772, output_tokens=644),
            id="cumulative-never-added",
        ),
        pytest.param(
            {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 2},
            [{"input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 9}],
            Usage(input_tokens=100, output_tokens=9, cache_read_tokens=60),
            id="null-does-not-overwrite",
        ),
        pytest.param(
            {"input_tokens": 0, "cache_read_input_tokens": 2500, "output_tokens": 1},
            [],
            Usage(input_tokens=2500, output_tokens=1, cache_read_tokens=2500),
            id="pure-cache-hit-start-only",
        ),
        pytest.param(
            {"input_tokens": 8, "output_tokens": 1},
            [{"output_tokens": 300, "output_tokens_details": {"thinking_tokens": 261}}],
            Usage(input_tokens=8, output_tokens=300, reasoning_tokens=261),
            id="thinking-tokens",
        ),
    ],
)
def test_usage(
    start_usage: dict[str, Any], delta_usages: list[dict[str, Any]], expected: Usage
) -> None:
    frames = [message_start(start_usage)]
    frames += [message_delta("end_turn", usage) for usage in delta_usages]
    frames.append(STOP)
    assert completed(run(body(*frames))).usage == expected


def test_message_start_without_usage_has_no_usage() -> None:
    start = message_start()
    del start["message"]["usage"]
    payload = message_delta()
    del payload["usage"]
    response = completed(run(body(start, payload, STOP)))
    assert response.usage is None


@pytest.mark.parametrize(
    ("usage_extra", "ticks"),
    [({"cost_in_usd_ticks": 1234}, 1234), ({"cost": 0.0012}, 12_000_000), ({"cost": 0}, None)],
    ids=["ticks", "usd", "zero-is-unreported"],
)
def test_gateway_cost(usage_extra: dict[str, Any], ticks: int | None) -> None:
    frames = [message_start(), message_delta("end_turn", {"output_tokens": 2, **usage_extra}), STOP]
    assert completed(run(body(*frames))).cost_usd_ticks == ticks


# -- stop reasons ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("end_turn", StopReason.STOP),
        ("stop_sequence", StopReason.STOP),
        ("pause_turn", StopReason.STOP),
        ("max_tokens", StopReason.LENGTH),
        ("model_context_window_exceeded", StopReason.LENGTH),
        ("tool_use", StopReason.TOOL_CALLS),
        ("refusal", StopReason.CONTENT_FILTER),
        ("compaction", StopReason.STOP),
        ("something_new", StopReason.STOP),
    ],
)
def test_stop_reason_mapping(raw: str, expected: StopReason) -> None:
    response = completed(run(body(*text_message("x", stop_reason=raw))))
    assert (response.stop_reason, response.raw_stop_reason) == (expected, raw)


def test_stop_sequence_is_kept() -> None:
    frames = [message_start(), message_delta("stop_sequence"), STOP]
    frames[1]["delta"]["stop_sequence"] = "</answer>"
    response = completed(run(body(*frames)))
    assert (response.stop_reason, response.stop_sequence) == (StopReason.STOP, "</answer>")


def test_refusal_explanation_becomes_the_refusal_text() -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "I can't help with that."}
    frames = [message_start(), PING, message_delta("refusal", stop_details=details), STOP]
    response = completed(run(body(*frames)))
    assert response.stop_reason is StopReason.CONTENT_FILTER
    assert response.raw_stop_reason == "refusal"
    assert response.assistant.refusal == "I can't help with that."
    assert response.text == ""


def test_refusal_without_details_keeps_text_and_has_no_refusal_text() -> None:
    response = completed(run(body(*text_message("Sorry.", stop_reason="refusal"))))
    assert response.stop_reason is StopReason.CONTENT_FILTER
    assert (response.text, response.assistant.refusal) == ("Sorry.", None)


def test_missing_stop_reason_is_inferred_at_message_stop() -> None:
    # Non-Anthropic gateways sometimes send message_stop without any stop_reason.
    text = completed(run(body(message_start(), message_delta(None), STOP)))
    assert (text.stop_reason, text.raw_stop_reason) == (StopReason.STOP, None)
    tools = completed(run(body(message_start(), *tool_block(0, "t", "f"), STOP)))
    assert tools.stop_reason is StopReason.TOOL_CALLS


# -- stream framing and termination ----------------------------------------------------


def test_ping_is_ignored_anywhere() -> None:
    plain = run(body(*text_message("a", "b")))
    frames = text_message("a", "b")
    pinged = [PING, *(x for frame_ in frames for x in (frame_, PING))]
    transform, events = run_direct([body(*pinged)])
    assert events == plain
    assert transform.unknown_events == 0


def test_whitespace_padded_json_and_done_marker() -> None:
    raw = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","model":"c",'
        b'"usage":{"input_tokens":1,"output_tokens":1}}    }\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}          }\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"hi"}       }\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"output_tokens":2}      }\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"   }\n\n'
        b"data: [DONE]\n\n"
    )
    response = completed(run(raw))
    assert (response.text, response.stop_reason) == ("hi", StopReason.STOP)


def test_ends_after_message_delta_without_message_stop_completes() -> None:
    frames = text_message("done")[:-1]
    assert completed(run(body(*frames))).text == "done"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([], id="empty-body"),
        pytest.param([message_start()], id="after-message-start"),
        pytest.param(text_message("cut")[:3], id="mid-text"),
        pytest.param(text_message("cut")[:4], id="after-block-stop"),
        pytest.param(
            [*text_message("cut")[:4], message_delta(None)], id="delta-without-stop-reason"
        ),
    ],
)
def test_truncated_stream_fails_with_partial(frames: list[dict[str, Any]]) -> None:
    end = failed(run(body(*frames)))
    assert end.error.kind is SamplingErrorKind.TRANSPORT
    assert end.error.retryable
    if any(f["type"] == "content_block_delta" for f in frames):
        assert end.partial is not None and end.partial.text == "cut"


def test_body_cut_mid_line_fails() -> None:
    raw = body(*text_message("hello"))
    end = failed(run(raw[: raw.index(b"message_delta") + 30]))
    assert end.error.kind is SamplingErrorKind.TRANSPORT
    assert end.partial is not None and end.partial.text == "hello"


def test_events_after_the_terminal_are_ignored() -> None:
    frames = [*text_message("a"), *text_message("b")[1:]]
    events = run(body(*frames))
    assert completed(events).text == "a"


def test_repeated_message_start_with_same_id_is_ignored() -> None:
    frames = text_message("a")
    frames.insert(2, message_start({"input_tokens": 999, "output_tokens": 999}))
    response = completed(run(body(*frames)))
    assert response.text == "a"
    assert response.usage == Usage(input_tokens=10, output_tokens=5)


def test_unknown_event_delta_and_block_types_are_counted_and_ignored() -> None:
    frames = [
        message_start(),
        {"type": "brand_new_event", "x": 1},
        block_start(0, {"type": "compaction", "content": None}),
        delta(0, type="compaction_delta", content="summary"),
        block_stop(0),
        block_start(1, {"type": "container_upload", "file_id": "f"}),
        block_stop(1),
        block_start(2, {"type": "text", "text": ""}),
        delta(2, type="future_delta", value=1),
        text_delta(2, "ok"),
        block_stop(2),
        message_delta(),
        STOP,
    ]
    transform, events = run_direct([body(*frames)])
    assert completed(events).text == "ok"
    assert transform.unknown_events == 2  # brand_new_event and future_delta
    assert transform.unknown_blocks == 2  # compaction and container_upload


def test_event_without_type_uses_the_sse_event_name() -> None:
    raw = body(message_start()) + frame({"index": 0}, event="ping") + body(message_delta(), STOP)
    transform, events = run_direct([raw])
    completed(events)
    assert transform.unknown_events == 0


@pytest.mark.parametrize(
    "data",
    ["{not json", "[1, 2]", '{"type":"content_block_delta","index":0}'],
    ids=["invalid-json", "not-an-object", "delta-missing-field"],
)
def test_malformed_events_fail_as_serialization(data: str) -> None:
    raw = body(message_start(), block_start(0, {"type": "text", "text": ""}), text_delta(0, "x"))
    end = failed(run(raw + frame(data, event="content_block_delta")))
    assert end.error.kind is SamplingErrorKind.SERIALIZATION
    assert end.partial is not None and end.partial.text == "x"


# -- errors inside the 200 stream ------------------------------------------------------


def error_frame(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


@pytest.mark.parametrize(
    ("error_type", "message", "kind", "retryable"),
    [
        ("overloaded_error", "Overloaded", SamplingErrorKind.OVERLOADED, True),
        ("api_error", "Internal server error", SamplingErrorKind.API, True),
        ("rate_limit_error", "Rate limited", SamplingErrorKind.RATE_LIMITED, True),
        ("invalid_request_error", "bad request", SamplingErrorKind.INVALID_REQUEST, False),
        (
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
            SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
            False,
        ),
        ("authentication_error", "invalid x-api-key", SamplingErrorKind.AUTH, False),
        ("request_too_large", "too large", SamplingErrorKind.PAYLOAD_TOO_LARGE, False),
    ],
)
@pytest.mark.parametrize("where", ["before-message-start", "mid-text"])
def test_error_event(
    error_type: str, message: str, kind: SamplingErrorKind, retryable: bool, where: str
) -> None:
    prefix = [] if where == "before-message-start" else text_message("partial ")[:3]
    end = failed(run(body(*prefix, error_frame(error_type, message), *text_message("x"))))
    assert (end.error.kind, end.error.retryable, end.error.error_type) == (
        kind,
        retryable,
        error_type,
    )
    assert end.error.status_code is None
    if prefix:
        assert end.partial is not None and end.partial.text == "partial "
        assert end.partial.usage == Usage(input_tokens=10, output_tokens=1)
    else:
        assert end.partial is None


def test_error_event_with_spaces_as_in_the_docs() -> None:
    raw = (
        b"event: error\n"
        b'data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
        b"\n\n"
    )
    end = failed(run(raw))
    assert end.error.kind is SamplingErrorKind.OVERLOADED
    assert end.error.message == "Overloaded"


def test_error_event_named_only_by_its_sse_event() -> None:
    raw = frame({"error": {"type": "overloaded_error", "message": "Overloaded"}}, event="error")
    assert failed(run(raw)).error.kind is SamplingErrorKind.OVERLOADED


# -- the real-capture corpus -----------------------------------------------------------


def corpus_body(entry: dict[str, Any]) -> bytes:
    return (CORPUS / str(entry["file"])).read_bytes()


@pytest.mark.real_streams
@pytest.mark.parametrize("entry", MANIFEST, ids=CORPUS_IDS)
def test_corpus_stream_ends_in_the_expected_terminal(entry: dict[str, Any]) -> None:
    transform, events = run_direct([corpus_body(entry)])
    end = terminal(events)
    if "error_midstream" in entry["features"]:
        assert isinstance(end, Failed)
        assert end.error.kind in (SamplingErrorKind.OVERLOADED, SamplingErrorKind.API)
        return
    assert isinstance(end, Completed), end
    response = end.response
    assert response.raw_stop_reason == entry["finish"][-1]
    assert response.model == entry["model"]
    assert response.usage is not None and response.usage.input_tokens > 0
    assert isinstance(response.items[-1], Assistant)
    assert transform.unknown_events == 0  # every event type of the real API is known
    assert events == run(corpus_body(entry))  # replay agrees with a hand-driven transform


def _splits(data: bytes, rnd: random.Random, pieces: int) -> list[bytes]:
    cuts = sorted(rnd.sample(range(1, len(data)), min(pieces, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.real_streams
@pytest.mark.parametrize("entry", MANIFEST, ids=CORPUS_IDS)
def test_corpus_stream_is_split_invariant(entry: dict[str, Any]) -> None:
    data = corpus_body(entry)
    whole = run(data)
    step = 1 if len(data) < 50_000 else 7
    assert run(data[i : i + step] for i in range(0, len(data), step)) == whole
    rnd = random.Random(entry["sha256"])
    for pieces in (2, 17, 300):
        assert run(_splits(data, rnd, pieces)) == whole


@pytest.mark.real_streams
def test_corpus_features() -> None:
    """Spot checks on what the captures are known to contain."""
    by_name = {Path(e["file"]).stem: e for e in MANIFEST}

    def response(name: str) -> ConversationResponse:
        return completed(run(corpus_body(by_name[f"anthropic-{name}"])))

    cut = response("claude-3.7-sonnet-max-tokens-in-tool-input")
    assert cut.stop_reason is StopReason.LENGTH
    assert cut.assistant.tool_calls[0].name == "make_file"
    with pytest.raises(ValueError):
        json.loads(cut.assistant.tool_calls[0].arguments)

    redacted = response("claude-sonnet-4.5-redacted-thinking")
    assert [bool(i.redacted_data) for i in redacted.items if isinstance(i, Reasoning)] == [True] * 2

    search = response("claude-sonnet-4-web-search-citations")
    assert search.usage is not None and search.usage.input_tokens == 31772
    calls = [i for i in search.items if isinstance(i, BackendToolCall)]
    assert [c.name for c in calls] == ["web_search", "web_search"]
    assert all(len(c.raw) == 2 and c.status == "completed" for c in calls)

    paused = response("claude-sonnet-4.5-pause-turn-web-search")
    assert (paused.stop_reason, paused.raw_stop_reason) == (StopReason.STOP, "pause_turn")
    assert paused.usage is not None and paused.usage.reasoning_tokens == 261

    cached = response("claude-sonnet-5-code-execution-cache-creation")
    assert cached.usage == Usage(
        input_tokens=6 + 3337 + 6289,
        output_tokens=198,
        cache_read_tokens=6289,
        cache_write_tokens=3337,
        reasoning_tokens=0,
    )

    mcp = response("claude-sonnet-4.5-mcp-tool-use")
    (mcp_call,) = [i for i in mcp.items if isinstance(i, BackendToolCall)]
    assert (mcp_call.name, mcp_call.raw[0]["type"], mcp_call.raw[1]["type"]) == (
        "ask_question",
        "mcp_tool_use",
        "mcp_tool_result",
    )


# -- properties ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000), seed=st.integers(0, 2**32))
def test_arbitrary_bytes_end_in_exactly_one_terminal(data: bytes, seed: int) -> None:
    events = run(data)
    terminal(events)
    if len(data) > 1:
        assert run(_splits(data, random.Random(seed), 5)) == events


_json_scalars = st.none() | st.booleans() | st.integers(-5, 10) | st.text(max_size=8)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_index = st.integers(0, 3) | _json_scalars
_block = st.sampled_from(
    [
        {"type": "text", "text": ""},
        {"type": "text", "text": "hi"},
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "redacted_thinking", "data": "blob"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
        {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
        {"type": "mcp_tool_result", "tool_use_id": "srv_2", "is_error": True, "content": None},
        {"type": "compaction", "content": None},
    ]
) | st.dictionaries(st.sampled_from(["type", "id", "name", "input", "tool_use_id"]), _json)
_delta = st.sampled_from(
    [
        {"type": "text_delta", "text": "a"},
        {"type": "thinking_delta", "thinking": "t"},
        {"type": "thinking_delta", "thinking": ""},
        {"type": "signature_delta", "signature": "sig"},
        {"type": "input_json_delta", "partial_json": ""},
        {"type": "input_json_delta", "partial_json": '{"a": '},
        {"type": "input_json_delta", "partial_json": "1}"},
        {"type": "citations_delta", "citation": {}},
        {"type": "new_delta"},
    ]
) | st.dictionaries(
    st.sampled_from(["type", "text", "thinking", "signature", "partial_json"]), _json
)
_usage = st.dictionaries(
    st.sampled_from(
        [
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens_details",
            "cost",
            "cost_in_usd_ticks",
        ]
    ),
    st.none() | st.integers(-3, 10**6) | st.floats(allow_nan=True) | _json,
)
_stop = st.sampled_from(["end_turn", "max_tokens", "tool_use", "refusal", "weird"]) | _json_scalars
_events = st.one_of(
    st.builds(lambda u: message_start(u), _usage),
    st.builds(
        lambda i, b: {"type": "content_block_start", "index": i, "content_block": b}, _index, _block
    ),
    st.builds(lambda i, d: {"type": "content_block_delta", "index": i, "delta": d}, _index, _delta),
    st.builds(lambda i: {"type": "content_block_stop", "index": i}, _index),
    st.builds(
        lambda s, u, d: {
            "type": "message_delta",
            "delta": {"stop_reason": s, "stop_details": d},
            "usage": u,
        },
        _stop,
        _usage,
        _json,
    ),
    st.just(STOP),
    st.just(PING),
    st.just(error_frame("overloaded_error", "Overloaded")),
    st.dictionaries(st.sampled_from(["type", "index", "delta", "message", "error"]), _json),
)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(_events, max_size=14), seed=st.integers(0, 2**32))
def test_arbitrary_message_events_end_in_exactly_one_terminal(
    frames: list[dict[str, Any]], seed: int
) -> None:
    raw = body(*frames)
    events = run(raw)
    terminal(events)
    assert isinstance(events[0], StreamStarted)
    if len(raw) > 1:
        assert run(_splits(raw, random.Random(seed), 9)) == events
