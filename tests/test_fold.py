"""One fold: the response of a stream is the fold of its events, in the order of the wire.

Bodies are written here from the documented formats. For each: the terminal's response,
``collect`` over all events, and ``collect`` over the deltas alone agree, and the output
items keep the wire order (reasoning, hosted tools, text, reasoning, ...) on every
backend, through a parse -> build round trip too.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest

from trio_sampler import (
    ApiBackend,
    Assistant,
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    Retrying,
    SamplingErrorKind,
    ToolCallCompleted,
    User,
)
from trio_sampler.types import BackendToolCall, Reasoning
from trio_sampler.wire import BuildOptions, ResponseFold, build_request, collect, replay


def sse(*frames: tuple[str | None, dict[str, Any]]) -> bytes:
    out = b""
    for event, payload in frames:
        if event:
            out += f"event: {event}\n".encode()
        out += b"data: " + orjson.dumps(payload) + b"\n\n"
    return out


def m(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"type": kind, **fields}


# thinking → text → thinking → text → tool_use, in one Messages turn.
MESSAGES_INTERLEAVED = sse(
    m("message_start", message={"id": "msg_1", "model": "claude", "usage": {"input_tokens": 5}}),
    m("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
    m("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "First."}),
    m("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "sig1"}),
    m("content_block_stop", index=0),
    m("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    m("content_block_delta", index=1, delta={"type": "text_delta", "text": "Let me check. "}),
    m("content_block_stop", index=1),
    m("content_block_start", index=2, content_block={"type": "thinking", "thinking": ""}),
    m("content_block_delta", index=2, delta={"type": "thinking_delta", "thinking": "Second."}),
    m("content_block_delta", index=2, delta={"type": "signature_delta", "signature": "sig2"}),
    m("content_block_stop", index=2),
    m("content_block_start", index=3, content_block={"type": "text", "text": ""}),
    m("content_block_delta", index=3, delta={"type": "text_delta", "text": "Calling."}),
    m("content_block_stop", index=3),
    m(
        "content_block_start",
        index=4,
        content_block={"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}},
    ),
    m("content_block_delta", index=4, delta={"type": "input_json_delta", "partial_json": '{"q":'}),
    m("content_block_delta", index=4, delta={"type": "input_json_delta", "partial_json": '"x"}'}),
    m("content_block_stop", index=4),
    m("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 30}),
    m("message_stop"),
)


def r(kind: str, **fields: Any) -> tuple[None, dict[str, Any]]:
    return None, {"type": kind, **fields}


_REASONING_1 = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc1"}
_SEARCH = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "trio"},
}
_REASONING_2 = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "enc2"}
_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Found it.", "annotations": []}],
}

# reasoning → hosted search → reasoning → message, with the final output repeating it.
RESPONSES_INTERLEAVED = sse(
    r("response.created", response={"id": "resp_1", "model": "o4-mini", "output": []}),
    r(
        "response.output_item.added",
        output_index=0,
        item={**_REASONING_1, "encrypted_content": None},
    ),
    r("response.output_item.done", output_index=0, item=_REASONING_1),
    r("response.output_item.added", output_index=1, item={**_SEARCH, "status": "in_progress"}),
    r("response.output_item.done", output_index=1, item=_SEARCH),
    r(
        "response.output_item.added",
        output_index=2,
        item={**_REASONING_2, "encrypted_content": None},
    ),
    r("response.output_item.done", output_index=2, item=_REASONING_2),
    r("response.output_item.added", output_index=3, item={**_MESSAGE, "content": []}),
    r("response.output_text.delta", item_id="msg_1", output_index=3, delta="Found it."),
    r("response.output_item.done", output_index=3, item=_MESSAGE),
    r(
        "response.completed",
        response={
            "id": "resp_1",
            "model": "o4-mini",
            "status": "completed",
            "output": [_REASONING_1, _SEARCH, _REASONING_2, _MESSAGE],
            "usage": {"input_tokens": 10, "output_tokens": 20},
        },
    ),
)


def chat(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
    return None, {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


CHAT_REASONING_THEN_TEXT = (
    sse(
        chat({"reasoning_content": "Think."}),
        chat({"content": "Answer"}),
        chat(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}
                ]
            }
        ),
        chat({}, "tool_calls"),
    )
    + b"data: [DONE]\n\n"
)

BODIES = {
    "messages-interleaved": (ApiBackend.MESSAGES, MESSAGES_INTERLEAVED),
    "responses-interleaved": (ApiBackend.RESPONSES, RESPONSES_INTERLEAVED),
    "chat-reasoning-text-tool": (ApiBackend.CHAT_COMPLETIONS, CHAT_REASONING_THEN_TEXT),
}


def kinds(response: ConversationResponse) -> list[str]:
    return [type(item).__name__ for item in response.items]


def without_turn_metadata(response: ConversationResponse) -> tuple[Any, ...]:
    return tuple(
        attrs.evolve(i, model=None, id=None) if isinstance(i, Assistant) else i
        for i in response.items
    )


@pytest.mark.parametrize("name", list(BODIES))
def test_the_fold_of_the_events_is_the_response(name: str) -> None:
    backend, body = BODIES[name]
    events = replay(backend, body)
    end = events[-1]
    assert isinstance(end, Completed)
    assert collect(events) == end.response
    deltas = [e for e in events if not isinstance(e, Completed)]
    assert without_turn_metadata(collect(deltas)) == without_turn_metadata(end.response)


def test_messages_keeps_thinking_text_thinking_in_wire_order() -> None:
    response = collect(replay(ApiBackend.MESSAGES, MESSAGES_INTERLEAVED))
    assert kinds(response) == ["Reasoning", "Assistant", "Reasoning", "Assistant"]
    first, text, second, last = response.items
    assert isinstance(first, Reasoning) and first.signature == "sig1"
    assert isinstance(second, Reasoning) and second.signature == "sig2"
    assert isinstance(text, Assistant) and text.content == "Let me check. "
    assert isinstance(last, Assistant) and last.content == "Calling."
    assert response.text == "Let me check. Calling."
    assert [c.name for c in response.tool_calls] == ["lookup"]
    assert last.tool_calls == response.tool_calls  # calls sit on the last assistant item


def test_messages_wire_order_round_trips_through_the_builder() -> None:
    response = collect(replay(ApiBackend.MESSAGES, MESSAGES_INTERLEAVED))
    request = ConversationRequest(items=[User("go"), *response.items], model="claude")
    wire = build_request(ApiBackend.MESSAGES, request, BuildOptions())
    body = orjson.loads(wire.body)
    assistant = body["messages"][1]
    assert assistant["role"] == "assistant"
    assert [b["type"] for b in assistant["content"]] == [
        "thinking",
        "text",
        "thinking",
        "text",
        "tool_use",
    ]


def test_responses_keeps_reasoning_and_hosted_tools_in_wire_order() -> None:
    response = collect(replay(ApiBackend.RESPONSES, RESPONSES_INTERLEAVED))
    assert kinds(response) == ["Reasoning", "BackendToolCall", "Reasoning", "Assistant"]
    search = response.items[1]
    assert isinstance(search, BackendToolCall)
    assert orjson.loads(search.arguments) == {"type": "search", "query": "trio"}
    reasoning = response.items[2]
    assert isinstance(reasoning, Reasoning) and reasoning.encrypted_content == "enc2"


def test_chat_reasoning_comes_before_the_text_it_leads_to() -> None:
    response = collect(replay(ApiBackend.CHAT_COMPLETIONS, CHAT_REASONING_THEN_TEXT))
    assert kinds(response) == ["Reasoning", "Assistant"]
    assert response.text == "Answer"
    assert response.reasoning_items[0].origin is ApiBackend.CHAT_COMPLETIONS


def test_each_local_tool_call_completes_whole_before_the_terminal() -> None:
    events = replay(ApiBackend.MESSAGES, MESSAGES_INTERLEAVED)
    done = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_index, e.call.name, e.call.arguments) for e in done] == [
        (0, "lookup", '{"q":"x"}')
    ]
    assert events.index(done[0]) == len(events) - 2


def test_a_failed_stream_partial_is_the_fold_of_its_deltas() -> None:
    cut = MESSAGES_INTERLEAVED[: MESSAGES_INTERLEAVED.index(b"Calling.")]
    events = replay(ApiBackend.MESSAGES, cut)
    end = events[-1]
    assert isinstance(end, Failed) and end.partial is not None
    deltas = [e for e in events if not isinstance(e, Failed)]
    assert without_turn_metadata(collect(deltas)) == without_turn_metadata(end.partial)
    assert end.partial.text == "Let me check. "


def test_a_discarding_retry_starts_the_fold_over() -> None:
    first = replay(ApiBackend.CHAT_COMPLETIONS, CHAT_REASONING_THEN_TEXT)[:-1]
    retry = Retrying("r", 1, 2, SamplingErrorKind.TRANSPORT, "reset", 0.0, True)
    second = replay(ApiBackend.CHAT_COMPLETIONS, CHAT_REASONING_THEN_TEXT)
    fold = ResponseFold()
    for event in [*first, retry, *second[:-1]]:
        fold.add(event)
    assert fold.response().text == "Answer"
    assert len(fold.response().tool_calls) == 1


def test_a_cancelled_terminal_partial_is_preferred() -> None:
    partial = ConversationResponse(items=[Assistant("kept")])
    assert collect([Cancelled("r", "stop", partial)]) is partial
