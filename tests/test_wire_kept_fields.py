"""What ``parse_request`` → ``build_request`` keeps beyond the typed conversation: the order
of interleaved function and hosted tools, a gateway's own fields on Chat Completions
messages and parts, an assistant turn's audio reference, a tool search call's namespace.

The bodies are written from the documented request formats: OpenAI's tool search
(``{"type": "tool_search"}`` before deferred function tools), Anthropic's tool search tool,
OpenRouter's and Vercel AI Gateway's ``cache_control`` on Chat Completions content parts and
messages, OpenRouter's ``reasoning_details``, and OpenAI's assistant ``audio: {"id": ...}``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import orjson
import pytest

from trio_sampler import ApiBackend, ConversationRequest, ToolSpec, User
from trio_sampler.types import (
    Assistant,
    ProviderFields,
    System,
    TextPart,
    WebSearch,
)
from trio_sampler.wire import collect, replay
from trio_sampler.wire._request import BuildOptions, ConversionAction
from trio_sampler.wire.chat_completions import _request as chat
from trio_sampler.wire.messages import _request as messages
from trio_sampler.wire.responses import _request as responses

OPTIONS = BuildOptions(model="m", stream=True, cache_breakpoints=False)


def _round_trip(module: ModuleType, body: dict[str, Any]) -> dict[str, Any]:
    rebuilt = module.build_request(module.parse_request(body), OPTIONS)
    data: dict[str, Any] = orjson.loads(rebuilt.body)
    return data


def _function(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "parameters": {"type": "object", "properties": {}},
        "defer_loading": True,
    }


# -- tool order ---------------------------------------------------------------------


def test_responses_hosted_tool_before_function_tools_keeps_its_place() -> None:
    tools = [{"type": "tool_search"}, _function("get_rate"), _function("get_stock")]
    body = {"model": "m", "input": "rates?", "tools": tools, "stream": True}
    request = responses.parse_request(body)
    assert request.tool_order == ("hosted", "function", "function")
    assert _round_trip(responses, body)["tools"] == tools


def test_messages_tool_search_tool_first_keeps_its_place() -> None:
    tools = [
        {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
        {
            "name": "get_weather",
            "input_schema": {"type": "object", "properties": {}},
            "defer_loading": True,
        },
    ]
    body = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": tools,
        "stream": True,
    }
    assert _round_trip(messages, body)["tools"] == tools


def test_chat_provider_tool_between_function_tools_keeps_its_place() -> None:
    def function(name: str) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
        }

    tools = [function("a"), {"type": "openrouter:web_search"}, function("b")]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    request = chat.parse_request(body)
    assert request.tool_order == ("function", "hosted", "function")
    assert _round_trip(chat, body)["tools"] == tools


def test_default_order_records_nothing() -> None:
    tools = [_function("get_rate"), {"type": "web_search"}]
    body = {"model": "m", "input": "rates?", "tools": tools}
    assert responses.parse_request(body).tool_order == ()
    assert _round_trip(responses, body)["tools"] == tools


def test_an_order_record_shorter_or_longer_than_the_tools_still_sends_every_tool() -> None:
    lookup, fetch = ToolSpec("lookup"), ToolSpec("fetch")
    request = ConversationRequest(
        [User("hi")],
        tools=[lookup, fetch],
        hosted_tools=[WebSearch()],
        tool_order=["hosted", "hosted", "function"],
    )
    built = responses.build_request(request, OPTIONS).data["tools"]
    assert [t.get("name", t["type"]) for t in built] == ["web_search", "lookup", "fetch"]


def test_a_bad_tool_order_entry_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"tool_order\[1\] is 'provider'"):
        ConversationRequest([User("hi")], tool_order=["function", "provider"])


def test_responses_function_call_namespace_goes_back() -> None:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_rate",
        "namespace": "get_rate",
        "arguments": "{}",
    }
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "rate?"},
            call,
            {"type": "function_call_output", "call_id": "call_1", "output": "0.9"},
        ],
    }
    request = responses.parse_request(body)
    assistant = request.items[1]
    assert isinstance(assistant, Assistant)
    assert assistant.tool_calls[0].namespace == "get_rate"
    assert _round_trip(responses, body)["input"][1] == call


# -- a gateway's fields on Chat Completions messages and parts ----------------------


CACHE = {"type": "ephemeral", "ttl": "5m"}


def test_cache_control_on_content_parts_goes_back_where_it_was() -> None:
    body = {
        "model": "anthropic/claude-sonnet-4.6",
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": "rules", "cache_control": CACHE}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "text", "text": "second", "cache_control": CACHE},
                ],
            },
        ],
    }
    request = chat.parse_request(body)
    system, user = request.items
    assert isinstance(system, System) and isinstance(user, User)
    assert system.part_fields == ProviderFields(
        ApiBackend.CHAT_COMPLETIONS, {"cache_control": CACHE}
    )
    assert user.content[0] == TextPart("first")
    assert _round_trip(chat, body)["messages"] == body["messages"]


def test_cache_control_on_messages_goes_back_where_it_was() -> None:
    marked = {"cache_control": {"type": "ephemeral"}}
    body = {
        "model": "anthropic/claude-sonnet-4",
        "messages": [
            {"role": "system", "content": "rules", **marked},
            {"role": "user", "content": "hello", **marked},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42", **marked},
        ],
    }
    assert _round_trip(chat, body)["messages"] == body["messages"]


def test_reasoning_details_on_an_assistant_message_goes_back() -> None:
    details = [{"type": "reasoning.encrypted", "data": "b64==", "format": "google-gemini-v1"}]
    body = {
        "model": "google/gemini-3-pro-preview",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Sunny.", "reasoning_details": details},
        ],
    }
    assistant = chat.parse_request(body).items[1]
    assert isinstance(assistant, Assistant)
    assert assistant.provider_fields == ProviderFields(
        "chat_completions", {"reasoning_details": details}
    )
    assert _round_trip(chat, body)["messages"][1] == body["messages"][1]


def test_a_rendered_field_wins_over_a_kept_one() -> None:
    fields = ProviderFields("chat_completions", {"content": "stale", "name": "bob"})
    request = ConversationRequest([User("fresh", provider_fields=fields)])
    message = chat.build_request(request, OPTIONS).data["messages"][0]
    assert message == {"role": "user", "content": "fresh", "name": "bob"}


def test_kept_fields_do_not_go_to_another_backend_and_the_report_says_so() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CACHE}]},
            {"role": "assistant", "content": "ok", "reasoning_details": [{"type": "x"}]},
            {"role": "user", "content": "more"},
        ],
    }
    request = chat.parse_request(body)
    rebuilt = messages.build_request(request, OPTIONS)
    assert b"reasoning_details" not in rebuilt.body
    assert b'"ttl"' not in rebuilt.body
    dropped = {(n.item_index, n.what) for n in rebuilt.report.notes}
    assert (0, "content part fields cache_control") in dropped
    assert (1, "message fields reasoning_details") in dropped
    assert all(n.action is ConversionAction.DROPPED for n in rebuilt.report.notes)


def test_provider_fields_want_a_mapping() -> None:
    with pytest.raises(TypeError, match=r"ProviderFields\.fields"):
        ProviderFields("chat_completions", {})
    with pytest.raises(TypeError, match="provider_fields is a ProviderFields"):
        User("hi", provider_fields={"name": "bob"})  # type: ignore[arg-type]


# -- an assistant turn's audio reference -----------------------------------------------


def test_assistant_audio_reference_goes_back() -> None:
    body = {
        "model": "gpt-audio",
        "modalities": ["text", "audio"],
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "audio": {"id": "audio_abc123"}},
            {"role": "user", "content": "Again, slower."},
        ],
    }
    assistant = chat.parse_request(body).items[1]
    assert assistant == Assistant(audio_id="audio_abc123")
    assert _round_trip(chat, body)["messages"][1] == {
        "role": "assistant",
        "content": None,
        "audio": {"id": "audio_abc123"},
    }


def test_audio_reference_is_reported_dropped_elsewhere() -> None:
    request = ConversationRequest(
        [User("hi"), Assistant("hello", audio_id="audio_1"), User("again")]
    )
    report = responses.build_request(request, OPTIONS).report
    assert [(n.item_index, n.what) for n in report.notes] == [(1, "audio reference")]


def test_audio_without_its_id_names_the_field() -> None:
    body = {"model": "m", "messages": [{"role": "assistant", "audio": {}}]}
    with pytest.raises(ValueError, match=r"messages\[0\]\.audio"):
        chat.parse_request(body)


def test_a_streamed_function_call_keeps_its_namespace_for_the_next_turn() -> None:
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_rate",
        "namespace": "get_rate",
        "arguments": "{}",
        "status": "completed",
    }
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    usage = {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0, "response": response},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**call, "arguments": ""},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [call], "usage": usage},
        },
    ]
    body = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )
    turn = collect(replay("responses", body))
    (assistant,) = turn.items
    assert isinstance(assistant, Assistant)
    assert assistant.tool_calls[0].namespace == "get_rate"
    request = ConversationRequest([User("rate?"), assistant])
    sent = responses.build_request(request, OPTIONS).data["input"][1]
    assert sent["namespace"] == "get_rate"


def test_a_streamed_audio_answer_is_referred_to_on_the_next_turn() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}
        return b"data: " + orjson.dumps({**body, "model": "gpt-audio"}) + b"\n\n"

    body = (
        chunk({"role": "assistant", "audio": {"id": "audio_abc123", "transcript": "Hi"}})
        + chunk({"audio": {"transcript": " there"}})
        + chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )
    turn = collect(replay("chat_completions", body))
    (assistant,) = turn.items
    assert isinstance(assistant, Assistant)
    assert (assistant.content, assistant.audio_id) == ("Hi there", "audio_abc123")
    request = ConversationRequest([User("Say hi."), assistant, User("Again.")])
    sent = chat.build_request(request, OPTIONS).data["messages"][1]
    assert sent["audio"] == {"id": "audio_abc123"}
