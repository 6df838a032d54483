"""Golden and behaviour tests for the messages request builder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from builder_cases import rich

from trio_sampler.types._conversation import (
    ApiBackend,
    Assistant,
    ConversationRequest,
    ImagePart,
    Reasoning,
    System,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    User,
)
from trio_sampler.wire._request import BuildOptions, ConversionAction, ConversionError
from trio_sampler.wire.messages._request import build_request, parse_request

BACKEND = ApiBackend.MESSAGES


EXPECTED: dict[str, Any] = {
    "model": "test-model",
    "max_tokens": 2048,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Check the image first.", "signature": "sig-1"},
                {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "cat"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [
                        {"type": "text", "text": "a cat"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBOR",
                            },
                        },
                    ],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "sunny",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {"query": "cats"},
                },
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "redacted_thinking", "data": "redacted-blob"},
                {"type": "text", "text": "It is a cat."},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}],
        },
    ],
    "tools": [
        {
            "name": "lookup",
            "description": "Look things up.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            "strict": True,
        },
        {
            "name": "weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"type": "web_search_20250305", "name": "web_search", "allowed_domains": ["example.com"]},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "output_config": {
        "format": {
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        }
    },
    "stream": True,
}


def test_rich_conversation_golden() -> None:
    wire = build_request(rich(BACKEND), BuildOptions())
    assert wire.path == "/messages"
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


def _marked(data: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(where, message index, block index) of every cache_control marker."""
    out = [("system", 0, i) for i, b in enumerate(data.get("system", [])) if "cache_control" in b]
    for m, message in enumerate(data["messages"]):
        out += [
            ("messages", m, i) for i, b in enumerate(message["content"]) if "cache_control" in b
        ]
    return out


def test_cache_breakpoints_skip_a_trailing_user_run() -> None:
    request = ConversationRequest(
        items=[
            System("sys"),
            User("u1"),
            Assistant(tool_calls=[ToolCall("c1", "f", "{}")]),
            ToolResult("c1", "r1"),
            User("reminder"),
            User([TextPart("look"), ImagePart("https://e.com/i.png")]),
        ],
        model="m",
    )
    data = build_request(request, BuildOptions()).data
    # system; the tip is the image of the last (merged) user turn; the previous request
    # ended at the user turn before the last assistant turn.
    assert _marked(data) == [("system", 0, 0), ("messages", 0, 0), ("messages", 2, 3)]


def test_cache_breakpoint_walks_back_past_a_thinking_tip() -> None:
    request = ConversationRequest(
        items=[
            User("u1"),
            Assistant("a1"),
            User("u2"),
            Reasoning(text="t", signature="s", origin=ApiBackend.MESSAGES),
        ],
        model="m",
    )
    data = build_request(request, BuildOptions()).data
    # The last message holds only a thinking block: the tip walks back to u2; the
    # previous-request marker lands on u1.
    assert _marked(data) == [("messages", 0, 0), ("messages", 2, 0)]
    assert "cache_control" not in data["messages"][3]["content"][0]


def test_cache_breakpoints_dedupe_and_can_be_disabled() -> None:
    request = ConversationRequest(items=[User("only")], model="m")
    assert _marked(build_request(request, BuildOptions()).data) == [("messages", 0, 0)]
    assert _marked(build_request(request, BuildOptions(cache_breakpoints=False)).data) == []


def test_forced_tool_with_thinking_is_adjusted_and_budget_fits() -> None:
    request = ConversationRequest(
        items=[User("q")],
        tools=[ToolSpec("f")],
        tool_choice=ToolChoice.REQUIRED,
        model="m",
        thinking_budget_tokens=4000,
        max_output_tokens=1000,
        temperature=0.2,
    )
    wire = build_request(request, BuildOptions())
    assert wire.data["tool_choice"] == {"type": "auto"}
    assert wire.data["thinking"] == {"type": "enabled", "budget_tokens": 4000}
    assert wire.data["max_tokens"] == 5000
    assert "temperature" not in wire.data
    assert {n.what for n in wire.report.notes} == {
        "tool_choice",
        "max_output_tokens",
        "temperature",
    }


def test_mid_conversation_system_and_foreign_items_are_converted() -> None:
    request = ConversationRequest(
        items=[
            User("q"),
            Reasoning(id="rs", encrypted_content="e", origin=ApiBackend.RESPONSES),
            Assistant("a", tool_calls=[ToolCall("call:1", "f", "not json")]),
            ToolResult("call:1", "r", is_error=True),
            System("late"),
        ],
        model="m",
    )
    wire = build_request(request, BuildOptions(cache_breakpoints=False))
    assert wire.data["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "f",
        "input": {},
    }
    assert wire.data["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "r", "is_error": True},
        {"type": "text", "text": "<system>\nlate\n</system>"},
    ]
    actions = [(n.item_index, n.action) for n in wire.report.notes]
    assert (1, ConversionAction.DROPPED) in actions
    assert (4, ConversionAction.CONVERTED_TO_TEXT) in actions
    assert (2, ConversionAction.ADJUSTED) in actions


def test_parse_splits_assistant_turn_in_block_order() -> None:
    request = parse_request(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "text", "text": "a"},
                        {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}},
                    ],
                },
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        }
    )
    assert request.items[1:] == (
        Reasoning(text="t", signature="s", origin=ApiBackend.MESSAGES),
        Assistant("a", tool_calls=[ToolCall("c1", "f", '{"x":1}')]),
    )
    assert request.tool_choice is ToolChoice.REQUIRED
    assert request.parallel_tool_calls is False
    with pytest.raises(ValueError, match=r"messages\[0\]\.role"):
        parse_request({"messages": [{"role": "system", "content": "x"}]})
