"""Wire shapes seen in real traffic, each built here from the documented format.

* Anthropic: the whole answer inside ``message_start`` (a ``tool_use`` block already in
  ``content``, ``stop_reason: "tool_use"``), then ``message_stop``.
* Mistral / Magistral Chat Completions: ``delta.content`` as a list of parts, ``text`` and
  ``thinking`` (whose ``thinking`` is itself a list of text parts).
* Several complete tool calls in one chunk, with distinct ids and no ``index``.
* Tool calls with ``id: ""`` (Gemini's OpenAI-compatible endpoint): kept apart, never
  merged.
"""

from __future__ import annotations

from typing import Any

import orjson

from trio_sampler import ApiBackend, Completed, StopReason, ToolCall
from trio_sampler.wire import collect, replay


def frames(*payloads: tuple[str | None, dict[str, Any]]) -> bytes:
    out = b""
    for event, payload in payloads:
        if event:
            out += f"event: {event}\n".encode()
        out += b"data: " + orjson.dumps(payload) + b"\n\n"
    return out


def chat(*chunks: dict[str, Any]) -> bytes:
    body = frames(*((None, {"id": "c", "model": "m", "choices": [c]}) for c in chunks))
    return body + b"data: [DONE]\n\n"


def completed(backend: ApiBackend, body: bytes) -> Completed:
    events = replay(backend, body)
    end = events[-1]
    assert isinstance(end, Completed), end
    assert collect(events) == end.response
    return end


def test_anthropic_whole_answer_in_message_start() -> None:
    body = frames(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [
                        {"type": "text", "text": "Looking it up."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                    "stop_reason": "tool_use",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 20},
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )
    response = completed(ApiBackend.MESSAGES, body).response
    assert response.stop_reason is StopReason.TOOL_CALLS
    assert response.raw_stop_reason == "tool_use"
    assert response.text == "Looking it up."
    assert response.tool_calls == (ToolCall("toolu_1", "get_weather", '{"city":"Paris"}'),)
    assert response.usage is not None and response.usage.output_tokens == 20


def test_anthropic_whole_answer_in_message_start_without_message_stop() -> None:
    # The stop reason came with the message: a body cut after it still completes.
    body = frames(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "content": [{"type": "text", "text": "Done."}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 1, "output_tokens": 2},
                },
            },
        ),
    )
    response = completed(ApiBackend.MESSAGES, body).response
    assert (response.text, response.stop_reason) == ("Done.", StopReason.STOP)


def test_mistral_content_parts_with_thinking() -> None:
    body = chat(
        {
            "index": 0,
            "delta": {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "Let me "}]},
                ],
            },
        },
        {
            "index": 0,
            "delta": {
                "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "think."}]},
                    {"type": "text", "text": "The answer"},
                ]
            },
        },
        {"index": 0, "delta": {"content": [{"type": "text", "text": " is 4."}]}},
        {"index": 0, "delta": {"content": ""}, "finish_reason": "stop"},
    )
    response = completed(ApiBackend.CHAT_COMPLETIONS, body).response
    assert response.reasoning_text == "Let me think."
    assert response.text == "The answer is 4."
    assert [type(i).__name__ for i in response.items] == ["Reasoning", "Assistant"]


def test_mistral_content_parts_of_plain_text_only() -> None:
    body = chat(
        {"index": 0, "delta": {"content": [{"type": "text", "text": "Hello"}]}},
        {"index": 0, "delta": {"content": [{"type": "text", "text": " there"}]}},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
    )
    assert completed(ApiBackend.CHAT_COMPLETIONS, body).response.text == "Hello there"


def test_several_complete_tool_calls_in_one_chunk_without_index() -> None:
    body = chat(
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {"id": "aaaaaaaaa", "function": {"name": "add", "arguments": '{"a": 1}'}},
                    {"id": "bbbbbbbbb", "function": {"name": "mul", "arguments": '{"b": 2}'}},
                    {"id": "ccccccccc", "function": {"name": "add", "arguments": '{"a": 3}'}},
                ]
            },
        },
        {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
    )
    response = completed(ApiBackend.CHAT_COMPLETIONS, body).response
    assert response.tool_calls == (
        ToolCall("aaaaaaaaa", "add", '{"a": 1}'),
        ToolCall("bbbbbbbbb", "mul", '{"b": 2}'),
        ToolCall("ccccccccc", "add", '{"a": 3}'),
    )


def test_tool_calls_with_empty_ids_are_kept_apart() -> None:
    first = {"id": "", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    second = {"id": "", "type": "function", "function": {"name": "g", "arguments": '{"y": 2}'}}
    for chunks in (
        # one call per chunk
        [
            {"index": 0, "delta": {"tool_calls": [first]}},
            {"index": 0, "delta": {"tool_calls": [second]}},
        ],
        # both in one chunk
        [{"index": 0, "delta": {"tool_calls": [first, second]}}],
        # both at wire index 0
        [{"index": 0, "delta": {"tool_calls": [{**first, "index": 0}, {**second, "index": 0}]}}],
    ):
        body = chat(*chunks, {"index": 0, "delta": {}, "finish_reason": "tool_calls"})
        calls = completed(ApiBackend.CHAT_COMPLETIONS, body).response.tool_calls
        assert [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}'), ("g", '{"y": 2}')]
        assert len({c.id for c in calls}) == 2  # distinct ids, for the tool results


def test_a_fragmented_call_with_an_empty_id_is_still_one_call() -> None:
    body = chat(
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {"index": 0, "id": "", "function": {"name": "f", "arguments": '{"x"'}}
                ]
            },
        },
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}},
        {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
    )
    calls = completed(ApiBackend.CHAT_COMPLETIONS, body).response.tool_calls
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]


async def test_a_tool_call_cut_off_mid_arguments_is_flagged_and_not_run() -> None:
    from trio_sampler.tools import ToolRegistry

    body = chat(
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "function": {"name": "add", "arguments": '{"a": 1, "b'},
                    }
                ]
            },
        },
        {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
    )
    (call,) = completed(ApiBackend.CHAT_COMPLETIONS, body).response.tool_calls
    assert not call.arguments_complete
    ran: list[object] = []
    registry = ToolRegistry()

    def add(a: int, b: int) -> int:
        ran.append((a, b))
        return a + b

    registry.register(add)
    result = await registry.execute(call)
    assert result.is_error and "cut off" in result.content
    assert not ran
