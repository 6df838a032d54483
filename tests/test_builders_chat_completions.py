"""Golden and behaviour tests for the chat_completions request builder."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builder_cases import rich

from trio_sampler.types._conversation import (
    ApiBackend,
    Assistant,
    ConversationRequest,
    Reasoning,
    System,
    ToolCall,
    ToolChoice,
    ToolResult,
    User,
)
from trio_sampler.wire._request import BuildOptions, ConversionAction, ConversionError
from trio_sampler.wire.chat_completions._request import build_request, parse_request

BACKEND = ApiBackend.CHAT_COMPLETIONS


EXPECTED: dict[str, Any] = {
    "model": "test-model",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Check the image first.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q":"cat"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Images returned by tool call call_1:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            ],
        },
        {"role": "assistant", "content": '[backend web_search] {"query":"cats"}'},
        {"role": "assistant", "content": "It is a cat.", "reasoning_content": "Now answer."},
        {"role": "user", "content": "Thanks"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look things up.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "max_completion_tokens": 2048,
    "reasoning_effort": "low",
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
            "strict": True,
        },
    },
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_rich_conversation_golden() -> None:
    wire = build_request(rich(BACKEND), BuildOptions(replay_reasoning_content=True))
    assert wire.path == "/chat/completions"
    assert wire.data == EXPECTED
    assert orjson.loads(wire.body) == EXPECTED
    assert [(n.item_index, n.what, n.action) for n in wire.report.notes] == [
        (4, "tool result images", ConversionAction.ADJUSTED),
        (6, "backend tool call web_search", ConversionAction.CONVERTED_TO_TEXT),
        (None, "hosted tool WebSearch", ConversionAction.DROPPED),
    ]


def test_rich_conversation_is_deterministic() -> None:
    first = build_request(rich(BACKEND), BuildOptions(replay_reasoning_content=True))
    second = build_request(rich(BACKEND), BuildOptions(replay_reasoning_content=True))
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


def test_exact_bytes_of_a_small_request() -> None:
    request = ConversationRequest(
        items=[System("Be brief.", developer=True), User("Hi é")], model="gpt-test"
    )
    wire = build_request(request, BuildOptions())
    assert wire.body == (
        b'{"model":"gpt-test","messages":[{"role":"developer","content":"Be brief."},'
        b'{"role":"user","content":"Hi \xc3\xa9"}],"stream":true,'
        b'"stream_options":{"include_usage":true}}'
    )


def test_deepseek_profile_replays_reasoning_and_uses_max_tokens() -> None:
    request = ConversationRequest(
        items=[
            System("dev", developer=True),
            User("q"),
            Reasoning(text="think", origin=ApiBackend.CHAT_COMPLETIONS),
            Assistant(tool_calls=[ToolCall("c1", "f", "{}")]),
            ToolResult("c1", "ok"),
        ],
        model="deepseek-v4-pro",
        max_output_tokens=100,
    )
    wire = build_request(request, BuildOptions(provider="deepseek"))
    assert wire.data["messages"][0]["role"] == "system"
    assert wire.data["messages"][2]["reasoning_content"] == "think"
    assert wire.data["max_tokens"] == 100
    assert "max_completion_tokens" not in wire.data
    assert wire.report.lossless


def test_reasoning_is_dropped_and_reported_without_replay() -> None:
    request = ConversationRequest(
        items=[
            User("q"),
            Reasoning(signature="s", text="t", origin=ApiBackend.MESSAGES),
            Assistant("a"),
        ],
        model="m",
    )
    wire = build_request(request, BuildOptions())
    assert "reasoning_content" not in wire.data["messages"][1]
    assert [(n.item_index, n.action) for n in wire.report.notes] == [(1, ConversionAction.DROPPED)]


def test_parse_reads_reasoning_content_and_legacy_max_tokens() -> None:
    request = parse_request(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q"}]},
                {"role": "assistant", "content": "a", "reasoning_content": "r"},
            ],
        }
    )
    assert request.max_output_tokens == 5
    assert request.items == (
        User("q"),
        Reasoning(text="r", origin=ApiBackend.CHAT_COMPLETIONS),
        Assistant("a"),
    )
    with pytest.raises(ValueError, match=r"messages\[0\]\.role"):
        parse_request({"messages": [{"role": "robot"}]})
