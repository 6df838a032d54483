"""Golden and behaviour tests for the responses request builder."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builder_cases import rich

from trio_sampler.types import OpaqueItem
from trio_sampler.types._conversation import (
    ApiBackend,
    Assistant,
    ConversationRequest,
    Reasoning,
    System,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    User,
)
from trio_sampler.wire._request import BuildOptions, ConversionAction, ConversionError
from trio_sampler.wire.responses._request import build_request, parse_request

BACKEND = ApiBackend.RESPONSES


EXPECTED: dict[str, Any] = {
    "model": "test-model",
    "instructions": "You are terse.",
    "input": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.png",
                    "detail": "auto",
                },
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBOR",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Check the image first."}],
            "encrypted_content": "gAAAA-1",
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q":"cat"}',
        },
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "weather",
            "arguments": '{"city":"Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [
                {"type": "input_text", "text": "a cat"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBOR",
                    "detail": "auto",
                },
            ],
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "sunny"},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "cats"},
        },
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAA-2"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is a cat.", "annotations": []}],
        },
        {"role": "user", "content": "Thanks"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look things up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "strict": True,
        },
        {
            "type": "function",
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"type": "web_search", "filters": {"allowed_domains": ["example.com"]}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "max_output_tokens": 2048,
    "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "text": {
        "format": {
            "type": "json_schema",
            "name": "answer",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
            "strict": True,
        }
    },
    "stream": True,
}


def test_rich_conversation_golden() -> None:
    wire = build_request(rich(BACKEND), BuildOptions())
    assert wire.path == "/responses"
    assert wire.data == EXPECTED
    assert orjson.loads(wire.body) == EXPECTED
    assert [(n.item_index, n.what, n.action) for n in wire.report.notes] == []


def test_rich_conversation_is_deterministic() -> None:
    first = build_request(rich(BACKEND), BuildOptions())
    second = build_request(rich(BACKEND), BuildOptions())
    assert first.body == second.body


def test_strict_raises_on_first_lossy_conversion() -> None:
    request = ConversationRequest(items=[User("hi")], model="m", tool_choice=ToolChoice.REQUIRED)
    with pytest.raises(ConversionError) as info:
        build_request(request, BuildOptions(strict=True))
    assert info.value.note.what == "tool_choice"
    assert info.value.note.action is ConversionAction.DROPPED


def test_missing_model_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="model"):
        build_request(ConversationRequest(items=[User("hi")]), BuildOptions())


def test_options_model_and_extra_body_last() -> None:
    wire = build_request(
        ConversationRequest(items=[User("hi")]),
        BuildOptions(model="fallback", stream=False, extra_body={"model": "x", "seed": 1}),
    )
    assert wire.data["model"] == "x"
    assert list(wire.data)[-1] == "seed"
    assert "stream" not in wire.data


def test_parse_rejects_bad_shapes_naming_the_field() -> None:
    with pytest.raises(ValueError, match="model"):
        parse_request(b'{"model": 3, "messages": [], "input": []}')
    with pytest.raises(ValueError, match="JSON"):
        parse_request(b"not json")


def test_foreign_and_orphan_reasoning_are_dropped_and_reported() -> None:
    request = ConversationRequest(
        items=[
            User("q"),
            Reasoning(text="t", signature="s", origin=ApiBackend.MESSAGES),
            Assistant("a"),
            User("again"),
            Reasoning(id="rs_9", encrypted_content="e", origin=ApiBackend.RESPONSES),
            Assistant(""),  # renders to nothing, so rs_9 would have no following item
        ],
        model="m",
    )
    wire = build_request(request, BuildOptions())
    assert [i.get("type", "message") for i in wire.data["input"]] == ["message"] * 3
    assert [(n.item_index, n.action) for n in wire.report.notes] == [
        (1, ConversionAction.DROPPED),
        (4, ConversionAction.DROPPED),
    ]
    assert "include" not in wire.data


def test_developer_first_item_stays_in_input_and_strict_false_is_explicit() -> None:
    request = ConversationRequest(
        items=[System("d", developer=True), User("q")],
        tools=[ToolSpec("f", strict=False)],
        model="m",
        stop_sequences=["x"],
    )
    wire = build_request(request, BuildOptions())
    assert "instructions" not in wire.data
    assert wire.data["input"][0] == {"role": "developer", "content": "d"}
    assert wire.data["tools"][0]["strict"] is False
    assert [n.what for n in wire.report.notes] == ["stop sequences"]


def test_parse_joins_function_calls_to_the_assistant_message() -> None:
    request = parse_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "content": [{"type": "output_text", "text": "a"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
        }
    )
    assert request.items[1] == Assistant("a", tool_calls=[ToolCall("c1", "f", "{}")], id="msg_1")
    assert request.items[2] == ToolResult("c1", "ok")
    # An item type the neutral model does not type is kept verbatim; a non-string is refused.
    reference = {"type": "item_reference", "id": "x"}
    assert parse_request({"input": [reference]}).items == (
        OpaqueItem(raw=reference, origin=ApiBackend.RESPONSES),
    )
    with pytest.raises(ValueError, match=r"input\[0\]\.type must be a string"):
        parse_request({"input": [{"type": 7, "id": "x"}]})
