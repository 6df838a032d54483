"""Nothing the server hands over is lost: two turns per backend.

Turn 1 streams state the server reads back on the next turn (a compaction item or block with
its ``encrypted_content``, an Anthropic ``fallback`` block, a Responses ``phase``, an
Anthropic ``caller``); turn 2's request body carries each of them exactly as received, in
its place. Sent to another backend, the state is left out and the conversion report says so.
The bodies are written here from the documented formats.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import orjson
import pytest

from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import (
    ApiBackend,
    Assistant,
    ChannelToken,
    CitationReceived,
    Completed,
    ContextEdited,
    ConversationRequest,
    ConversationResponse,
    OpaqueItem,
    OpaqueItemReceived,
    OpaquePart,
    SamplingEvent,
    ServedModelChanged,
    ServerTextDiffers,
    ServerTextTaken,
    ToolResult,
    Usage,
    User,
)
from trio_sampler.wire import collect, replay
from trio_sampler.wire._registry import build_request, new_transform, parse_request
from trio_sampler.wire._request import BuildOptions, ConversionAction
from trio_sampler.wire.sse import SSEDecoder


def sse(*payloads: dict[str, Any]) -> bytes:
    return b"".join(f"event: {p['type']}\ndata: {json.dumps(p)}\n\n".encode() for p in payloads)


def turn_two(
    backend: ApiBackend, first: ConversationResponse, *, model: str = "m"
) -> tuple[dict[str, Any], Any]:
    """Turn 2's request body (as sent) and its conversion report: each tool call of turn 1
    answered, then the user's next message."""
    results = [ToolResult(call_id=call.id, content="1") for call in first.tool_calls]
    request = ConversationRequest(items=[User("one"), *first.items, *results, User("two")])
    wire = build_request(backend, request, BuildOptions(model=model))
    return json.loads(wire.body), wire.report


def compact(value: Any) -> bytes:
    return orjson.dumps(value)


# -- Responses -------------------------------------------------------------------------

COMPACTION_ITEM = {
    "id": "cmp_0a1",
    "type": "compaction",
    "encrypted_content": "gAAAAABo+enc/rypted==",
}
SHELL_CALL = {
    "id": "sh_1",
    "type": "shell_call",
    "call_id": "call_sh_1",
    "status": "completed",
    "action": {"commands": ["ls -la"], "timeout_ms": 1000, "max_output_length": 4096},
}


def _message(text: str, msg_id: str, phase: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "phase": phase,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _responses_stream() -> bytes:
    commentary = _message("Looking.", "msg_c", "commentary")
    final = _message("Done.", "msg_f", "final_answer")
    response = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "in_progress"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": COMPACTION_ITEM},
        {"type": "response.compaction.compacting", "output_index": 0, "item_id": "cmp_0a1"},
        {"type": "response.output_item.done", "output_index": 0, "item": COMPACTION_ITEM},
    ]
    for index, item in ((1, commentary), (3, final)):
        text = item["content"][0]["text"]
        events += [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "status": "in_progress", "content": []},
            },
            {
                "type": "response.output_text.delta",
                "output_index": index,
                "item_id": item["id"],
                "content_index": 0,
                "delta": text,
            },
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
        if index == 1:
            events += [
                {"type": "response.output_item.added", "output_index": 2, "item": SHELL_CALL},
                {"type": "response.output_item.done", "output_index": 2, "item": SHELL_CALL},
            ]
    output = [COMPACTION_ITEM, commentary, SHELL_CALL, final]
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    completed = {**response, "status": "completed", "output": output, "usage": usage}
    events.append({"type": "response.completed", "response": completed})
    return sse(*events)


def test_responses_compaction_phase_and_unmodelled_items_go_back_exactly() -> None:
    events = replay(ApiBackend.RESPONSES, [_responses_stream()])
    first = collect(events)
    kinds = [type(i).__name__ for i in first.items]
    assert kinds[0] == "OpaqueItem" and first.text == "Looking.Done."
    phases = [i.phase for i in first.items if isinstance(i, Assistant) and i.content]
    assert phases == ["commentary", "final_answer"]

    body, report = turn_two(ApiBackend.RESPONSES, first)
    sent = body["input"]
    assert sent[0] == {"role": "user", "content": "one"}
    # The compaction item, byte for byte, in its place; the shell call too.
    assert compact(sent[1]) == compact(COMPACTION_ITEM)
    assert compact(SHELL_CALL) in compact(sent)
    assert [m.get("phase") for m in sent if m.get("type") == "message"] == [
        "commentary",
        "final_answer",
    ]
    assert report.lossless


def test_responses_hand_over_state_left_out_of_messages_with_a_note() -> None:
    first = collect(replay(ApiBackend.RESPONSES, [_responses_stream()]))
    body, report = turn_two(ApiBackend.MESSAGES, first)
    assert b"cmp_0a1" not in compact(body)
    dropped = [n for n in report.notes if n.action is ConversionAction.DROPPED]
    assert [n.what for n in dropped] == [
        "compaction handed over by responses",
        "shell_call handed over by responses",
    ]


# -- Messages --------------------------------------------------------------------------


def _messages_stream() -> bytes:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    fallback = {
        "type": "fallback",
        "from": {"model": "claude-x"},
        "to": {"model": "claude-y"},
        "trigger": "overloaded",
    }
    caller = {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}
    return sse(
        {"type": "message_start", "message": message},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "compaction", "content": None},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "compaction_delta", "content": "Summary so far."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "compaction_delta", "encrypted_content": "EnCrYpTeD=="},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": fallback},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 2},
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "lookup",
                "input": {},
                "caller": caller,
            },
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '{"q": 1}'},
        },
        {"type": "content_block_stop", "index": 3},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {
                "input_tokens": 12,
                "output_tokens": 9,
                "iterations": [
                    {
                        "type": "message",
                        "input_tokens": 12,
                        "output_tokens": 0,
                        "cache_read_input_tokens": 0,
                        "cache_creation_input_tokens": 0,
                    },
                    {
                        "type": "fallback_message",
                        "model": "claude-y",
                        "input_tokens": 10,
                        "output_tokens": 9,
                        "cache_read_input_tokens": 2,
                        "cache_creation_input_tokens": 0,
                    },
                ],
            },
        },
        {"type": "message_stop"},
    )


def test_messages_compaction_fallback_and_caller_go_back_exactly() -> None:
    events: list[SamplingEvent] = replay(ApiBackend.MESSAGES, [_messages_stream()])
    first = collect(events)
    opaque = [i for i in first.items if isinstance(i, OpaqueItem)]
    # compaction_delta replaces the fields it carries.
    assert [o.raw for o in opaque] == [
        {"type": "compaction", "content": "Summary so far.", "encrypted_content": "EnCrYpTeD=="},
        {
            "type": "fallback",
            "from": {"model": "claude-x"},
            "to": {"model": "claude-y"},
            "trigger": "overloaded",
        },
    ]
    assert [e.item for e in events if isinstance(e, OpaqueItemReceived)] == opaque
    (call,) = first.tool_calls
    assert call.caller == {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}
    # The fallback hop is an event; the response names the model that served last.
    hops = [e for e in events if isinstance(e, ServedModelChanged)]
    assert [(h.from_model, h.to_model, h.trigger) for h in hops] == [
        ("claude-x", "claude-y", "overloaded")
    ]
    assert first.model == "claude-y"
    # The hop's own usage (its fallback_message iteration); the total is counted once.
    assert hops[0].usage == Usage(input_tokens=12, output_tokens=9, cache_read_tokens=2)
    assert first.usage == Usage(input_tokens=12, output_tokens=9)

    body, report = turn_two(ApiBackend.MESSAGES, first)
    assistant = body["messages"][1]
    assert assistant["role"] == "assistant"
    assert [compact(b) for b in assistant["content"][:2]] == [compact(o.raw) for o in opaque]
    assert assistant["content"][2] == {"type": "text", "text": "Hi"}
    tool_use = assistant["content"][3]
    assert tool_use["caller"] == call.caller and tool_use["input"] == {"q": 1}
    assert report.lossless

    # The same body read back keeps every block (parse_request → build_request).
    again = build_request(
        ApiBackend.MESSAGES, parse_request(ApiBackend.MESSAGES, body), BuildOptions(model="m")
    )
    assert json.loads(again.body)["messages"] == body["messages"]


def test_messages_hand_over_state_left_out_of_chat_completions_with_notes() -> None:
    first = collect(replay(ApiBackend.MESSAGES, [_messages_stream()]))
    body, report = turn_two(ApiBackend.CHAT_COMPLETIONS, first)
    assert b"EnCrYpTeD" not in compact(body)
    dropped = [n.what for n in report.notes if n.action is ConversionAction.DROPPED]
    assert dropped == ["compaction handed over by messages", "fallback handed over by messages"]


def test_opaque_item_needs_the_providers_object() -> None:
    # A mapping without its "type" string is a bad value (a parsed body's ValueError);
    # something that is not a mapping at all, a value of the wrong kind.
    with pytest.raises(ValueError, match=r'OpaqueItem\.raw .*"type"'):
        OpaqueItem(raw={"no_type": 1}, origin="messages")
    with pytest.raises(TypeError, match=r"OpaqueItem\.raw .*got list"):
        OpaqueItem(raw=["compaction"], origin="messages")  # type: ignore[arg-type]


def test_shell_and_compaction_events_are_known() -> None:
    """The shell-call and compaction progress events carry nothing the items do not."""
    transform = new_transform(ApiBackend.RESPONSES)
    decoder_events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r", "model": "m", "output": []}},
        {"type": "response.shell_call_command.added", "output_index": 0, "command_index": 0},
        {"type": "response.shell_call_command.delta", "output_index": 0, "delta": "ls"},
        {"type": "response.shell_call_command.done", "output_index": 0, "command": "ls"},
        {"type": "response.shell_call_output_content.delta", "output_index": 0, "delta": "a"},
        {"type": "response.shell_call_output_content.done", "output_index": 0, "output": []},
        {"type": "response.compaction.compacting", "output_index": 1, "item_id": "cmp"},
    ]
    for event in SSEDecoder().feed(sse(*decoder_events)):
        transform.feed(event)
    assert transform.unknown_events == 0


# -- Citations ---------------------------------------------------------------------------

URL_CITATION = {
    "type": "url_citation",
    "start_index": 0,
    "end_index": 5,
    "url": "https://example.org/trio",
    "title": "Trio",
}


def test_responses_url_citation_kept_and_sent_back() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Trio.", "annotations": [URL_CITATION]}],
    }
    response = {"id": "r", "object": "response", "model": "gpt-x", "status": "in_progress"}
    stream = sse(
        {"type": "response.created", "response": {**response, "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {
            "type": "response.output_text.delta",
            "output_index": 0,
            "item_id": "msg_1",
            "content_index": 0,
            "delta": "Trio.",
        },
        {
            "type": "response.output_text.annotation.added",
            "output_index": 0,
            "item_id": "msg_1",
            "content_index": 0,
            "annotation_index": 0,
            "annotation": URL_CITATION,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [message]},
        },
    )
    events = replay(ApiBackend.RESPONSES, [stream])
    first = collect(events)
    (citation,) = first.citations
    assert (citation.source, citation.title, citation.span) == (
        "https://example.org/trio",
        "Trio",
        (0, 5),
    )
    assert citation.raw == URL_CITATION and citation.origin is ApiBackend.RESPONSES
    assert [e.citation for e in events if isinstance(e, CitationReceived)] == [citation]

    body, report = turn_two(ApiBackend.RESPONSES, first)
    (sent,) = [m for m in body["input"] if m.get("type") == "message"]
    assert compact(sent["content"][0]["annotations"]) == compact([URL_CITATION])
    assert report.lossless
    # Another backend cannot take OpenAI's annotation: left out, and said.
    _, elsewhere = turn_two(ApiBackend.MESSAGES, first)
    assert [n.what for n in elsewhere.notes] == ["citations"]


def test_messages_citations_delta_kept_and_sent_back() -> None:
    location = {
        "type": "web_search_result_location",
        "cited_text": "Trio is a library.",
        "url": "https://example.org/trio",
        "title": "Trio",
        "encrypted_index": "Eo8BCioIAhgB",
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    stream = sse(
        {"type": "message_start", "message": message},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": "", "citations": []},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "citations_delta", "citation": location},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "A library."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 4},
        },
        {"type": "message_stop"},
    )
    first = collect(replay(ApiBackend.MESSAGES, [stream]))
    (citation,) = first.citations
    assert (citation.source, citation.cited_text, citation.span) == (
        "https://example.org/trio",
        "Trio is a library.",
        None,
    )
    body, report = turn_two(ApiBackend.MESSAGES, first)
    text = body["messages"][1]["content"][0]
    assert text["text"] == "A library." and compact(text["citations"]) == compact([location])
    assert report.lossless
    again = parse_request(ApiBackend.MESSAGES, body)
    assert again.items[1] == Assistant(content="A library.", citations=first.citations)


# -- The server's final word ------------------------------------------------------------


def test_responses_final_text_wins_over_the_deltas_with_a_warning() -> None:
    """``output_item.done`` holds the message's final text: where it disagrees with the
    deltas, the response takes the server's and says so; the streamed events stay."""
    final = {
        "id": "msg_1",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello, world.", "annotations": []}],
    }
    response = {"id": "r", "object": "response", "model": "gpt-x", "status": "in_progress"}
    stream = sse(
        {"type": "response.created", "response": {**response, "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**final, "content": []}},
        {
            "type": "response.output_text.delta",
            "output_index": 0,
            "item_id": "msg_1",
            "content_index": 0,
            "delta": "Hello",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": final},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [final]},
        },
    )
    events = replay(ApiBackend.RESPONSES, [stream])
    streamed = "".join(e.text for e in events if isinstance(e, ChannelToken))
    assert streamed == "Hello"  # the events as received
    result = collect(events)
    assert result.text == "Hello, world."
    assert result.warnings == (ServerTextDiffers(0, "Hello", "Hello, world."),)
    taken = [e.warning for e in events if isinstance(e, ServerTextTaken)]
    assert taken == list(result.warnings)
    # The fold of the events alone (no terminal) reaches the same answer.
    alone = collect(e for e in events if not isinstance(e, Completed))
    assert alone.text == "Hello, world." and alone.warnings == result.warnings


def test_responses_final_text_equal_to_the_deltas_is_no_warning() -> None:
    events = replay(ApiBackend.RESPONSES, [_responses_stream()])
    assert collect(events).warnings == ()


# -- The emulator takes turn 2 ---------------------------------------------------------


async def test_the_emulator_takes_turn_two_bodies_with_hand_over_state(
    emulator: EmulatorFixture,
) -> None:
    """A body carrying compaction, fallback, phase, caller and citations is a valid
    request for the emulator of its backend (it answers, it does not fail)."""
    firsts = {
        ApiBackend.RESPONSES: collect(replay(ApiBackend.RESPONSES, [_responses_stream()])),
        ApiBackend.MESSAGES: collect(replay(ApiBackend.MESSAGES, [_messages_stream()])),
    }
    async with httpx2.AsyncClient(timeout=10) as client:
        for backend, first in firsts.items():
            body, _ = turn_two(backend, first, model="emulator-1")
            response = await client.post(emulator.url_for(backend.value), json=body)
            assert response.status_code == 200, response.text


def test_messages_context_edits_are_an_event() -> None:
    edits = [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": 900},
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 1,
            "cleared_input_tokens": 40,
        },
    ]
    message: dict[str, Any] = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    stream = sse(
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 2},
            "context_management": {"applied_edits": edits},
        },
        {"type": "message_stop"},
    )
    events = replay(ApiBackend.MESSAGES, [stream])
    (edited,) = [e for e in events if isinstance(e, ContextEdited)]
    assert list(edited.edits) == edits and edited.cleared_input_tokens == 940
    assert collect(events).text == "ok"
    # An empty list of edits (what most streams send) is no event.
    quiet = stream.replace(json.dumps(edits).encode(), b"[]")
    assert not [e for e in replay(ApiBackend.MESSAGES, [quiet]) if isinstance(e, ContextEdited)]


# ------------------------------------------------------------------ content parts


DOCUMENT: dict[str, Any] = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."},
    "title": "Facts",
    "citations": {"enabled": True},
}
AUDIO: dict[str, Any] = {
    "type": "input_audio",
    "input_audio": {"data": "UklGRg==", "format": "wav"},
}
FILE: dict[str, Any] = {"type": "input_file", "file_id": "file-abc", "filename": "notes.pdf"}


def test_a_part_the_model_does_not_type_goes_back_verbatim_to_its_backend_only() -> None:
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("messages", DOCUMENT, {"role": "user", "content": [DOCUMENT, _TEXT]}),
        ("chat_completions", AUDIO, {"role": "user", "content": [AUDIO, _TEXT_CHAT]}),
        ("responses", FILE, {"role": "user", "content": [FILE, _TEXT_RESPONSES]}),
    ]
    for backend, raw, message in cases:
        key = "input" if backend == "responses" else "messages"
        body = {"model": "m", "max_tokens": 64, key: [message]}
        request = parse_request(backend, orjson.dumps(body))
        (user,) = request.items
        assert isinstance(user, User) and user.content[0] == OpaquePart(raw, backend)
        for target in ("messages", "chat_completions", "responses"):
            wire = build_request(target, request, BuildOptions(model="m"))
            target_key = "input" if target == "responses" else "messages"
            (sent,) = orjson.loads(wire.body)[target_key]
            if target == backend:
                assert sent["content"][0] == raw and wire.report.lossless
            else:
                assert raw["type"].encode() not in wire.body
                (note,) = wire.report.notes
                assert note.action is ConversionAction.DROPPED and raw["type"] in note.what


_TEXT = {"type": "text", "text": "What colour is the sky?"}
_TEXT_CHAT = {"type": "text", "text": "What is said?"}
_TEXT_RESPONSES = {"type": "input_text", "text": "Summarise it."}
