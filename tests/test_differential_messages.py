"""Differential test: our Messages transform vs the official ``anthropic`` SDK's own
accumulator, on the same bytes (every real capture in the corpus).

The SDK side is built the way its ``MessageStream`` does it: its own ``SSEDecoder``,
``ping`` skipped, each event's JSON turned into ``RawMessageStreamEvent`` by
``construct_type`` (what ``_process_response_data`` uses without strict validation), and
folded with ``accumulate_event``. Then the final ``Message`` is compared with our
``ConversationResponse``.

Deliberate differences, asserted as such below (and listed in
``docs/backends/messages-stream.md``):

1. ``stop_reason`` is normalized (``end_turn``/``stop_sequence``/``pause_turn`` → stop,
   ``max_tokens``/``model_context_window_exceeded`` → length, ``tool_use`` → tool_calls,
   ``refusal`` → content_filter, unknown → stop); the SDK's raw value is our
   ``raw_stop_reason``.
2. Usage is normalized: our ``input_tokens`` = SDK ``input_tokens`` +
   ``cache_read_input_tokens`` + ``cache_creation_input_tokens``; ``reasoning_tokens`` =
   ``output_tokens_details.thinking_tokens`` (0 when absent).
3. Text blocks are one string: ours is the SDK's text blocks concatenated in order.
4. Tool input is JSON text, not an object. A ``tool_use`` cut by ``max_tokens`` keeps the
   raw truncated text (invalid JSON, so the actor can refuse to run it); the SDK parses it
   leniently (jiter ``partial_mode``) into an incomplete object. We check that the SDK's
   object is exactly what partial parsing of our text gives.
5. A thinking block's empty signature (never signed) is ``None`` for us, ``""`` in the SDK.
6. Hosted tools are :class:`BackendToolCall` items (call block + result block in ``raw``),
   not content blocks; their ``result`` is the result block's ``content``.

Files the SDK (non-beta types) cannot model, checked against hand-written expectations
instead of the SDK for those blocks: ``anthropic-claude-sonnet-4.5-mcp-tool-use``
(``mcp_tool_use`` / ``mcp_tool_result``), ``anthropic-claude-sonnet-5-advisor-tool``
(``advisor_tool_result``) and ``anthropic-claude-sonnet-4.6-compaction-cache-read``
(``compaction`` block and ``compaction_delta``). The SDK coerces those blocks into
unrelated models; the rest of those streams is still compared with the SDK.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import jiter
import pytest
from anthropic._models import construct_type
from anthropic._streaming import SSEDecoder as SDKDecoder
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent

from benchmarks import corpus
from trio_sampler.types import (
    ApiBackend,
    BackendToolCall,
    Completed,
    ConversationResponse,
    OpaqueItem,
    Reasoning,
    StopReason,
    Usage,
)
from trio_sampler.wire._replay import replay

CORPUS = corpus.root()
MANIFEST = corpus.manifest("messages")

pytestmark = pytest.mark.real_streams

#: Block types the SDK's (non-beta) ``ContentBlock`` union models.
SDK_BLOCKS = frozenset(
    {
        "text",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    }
)

#: Deliberate difference 1: the normalization of the SDK's raw ``stop_reason``.
STOP_MAP = {
    "end_turn": StopReason.STOP,
    "stop_sequence": StopReason.STOP,
    "pause_turn": StopReason.STOP,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "tool_use": StopReason.TOOL_CALLS,
    "refusal": StopReason.CONTENT_FILTER,
}


def sdk_message(body: bytes) -> Any:
    """The SDK's final ``Message`` for ``body``, accumulated exactly as its stream does."""
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    for sse in SDKDecoder().iter_bytes(iter([body])):
        if sse.event == "ping" or sse.event is None:
            continue
        assert sse.event != "error", "the corpus has no in-stream error"
        event = cast(
            RawMessageStreamEvent, construct_type(type_=RawMessageStreamEvent, value=sse.json())
        )
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    return snapshot


def ours(body: bytes) -> ConversationResponse:
    end = replay(ApiBackend.MESSAGES, [body])[-1]
    assert isinstance(end, Completed), end
    return end.response


def blocks(message: Any, *types: str) -> list[Any]:
    return [b for b in message.content if b.type in types]


@pytest.mark.parametrize("entry", corpus.params("messages"))
def test_same_result_as_the_official_sdk(entry: dict[str, Any]) -> None:
    body = entry["path"].read_bytes()
    sdk = sdk_message(body)
    mine = ours(body)

    # Identity.
    assert (mine.response_id, mine.model) == (sdk.id, sdk.model)

    # Text (difference 3: one string) and its citations, each as received.
    assert mine.text == "".join(b.text for b in blocks(sdk, "text"))
    assert [dict(c.raw) for c in mine.citations] == [
        c.to_dict(mode="json") for b in blocks(sdk, "text") for c in b.citations or []
    ]

    # Reasoning, in order, one item per block (difference 5: "" signature → None).
    reasoning = [i for i in mine.items if isinstance(i, Reasoning)]
    assert [(r.text, r.signature) for r in reasoning if r.redacted_data is None] == [
        (b.thinking, b.signature or None) for b in blocks(sdk, "thinking")
    ]
    assert [r.redacted_data for r in reasoning if r.redacted_data is not None] == [
        b.data for b in blocks(sdk, "redacted_thinking")
    ]
    assert all(r.origin is ApiBackend.MESSAGES for r in reasoning)

    # Local tool calls (difference 4: JSON text; truncated input kept raw).
    sdk_tools = blocks(sdk, "tool_use")
    calls = mine.assistant.tool_calls
    assert [(c.id, c.name) for c in calls] == [(b.id, b.name) for b in sdk_tools]
    for call, block in zip(calls, sdk_tools, strict=True):
        if sdk.stop_reason == "max_tokens" and block is sdk_tools[-1]:
            with pytest.raises(ValueError):
                json.loads(call.arguments)
            assert jiter.from_json(call.arguments.encode(), partial_mode=True) == block.input
        else:
            assert call.parsed_arguments() == block.input

    # Hosted tools (difference 6): SDK-modelled call and result blocks.
    hosted = {i.id: i for i in mine.items if isinstance(i, BackendToolCall)}
    for block in blocks(sdk, "server_tool_use"):
        started = hosted[block.id]
        assert (started.name, json.loads(started.arguments)) == (block.name, block.input)
        assert started.raw[0] == block.to_dict(mode="json")
    for block in sdk.content:
        if block.type.endswith("_tool_result") and block.type in SDK_BLOCKS:
            done = hosted[block.tool_use_id]
            assert done.result == block.to_dict(mode="json")["content"]
            assert done.raw[-1] == block.to_dict(mode="json")

    # Stop reason (difference 1) and stop sequence.
    assert mine.raw_stop_reason == sdk.stop_reason
    assert mine.stop_reason is STOP_MAP.get(sdk.stop_reason, StopReason.STOP)
    assert mine.stop_sequence == sdk.stop_sequence

    # Usage (difference 2).
    usage = sdk.usage
    details = usage.output_tokens_details
    assert mine.usage == Usage(
        input_tokens=usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0),
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_input_tokens or 0,
        cache_write_tokens=usage.cache_creation_input_tokens or 0,
        reasoning_tokens=(details.thinking_tokens if details is not None else None) or 0,
    )


def _by_name(name: str) -> ConversationResponse:
    (entry,) = [e for e in MANIFEST if Path(e["file"]).stem == name]
    return ours((CORPUS / entry["file"]).read_bytes())


def test_mcp_tool_blocks_the_sdk_cannot_model() -> None:
    response = _by_name("anthropic-claude-sonnet-4.5-mcp-tool-use")
    (call,) = [i for i in response.items if isinstance(i, BackendToolCall)]
    assert call.id == "mcptoolu_01FZmJ5UspaX5BB9uU339UT1"
    assert call.name == "ask_question"
    assert call.status == "completed"
    assert [r["type"] for r in call.raw] == ["mcp_tool_use", "mcp_tool_result"]
    assert call.raw[0]["server_name"] == "deepwiki"
    assert call.raw[0]["input"] == json.loads(call.arguments)
    assert "repoName" in call.raw[0]["input"]
    assert call.result[0]["type"] == "text"
    assert call.result[0]["text"].startswith("This repository, `pydantic/pydantic-ai`")
    # Order: thinking, then the MCP call, then the answer.
    assert [type(i).__name__ for i in response.items] == [
        "Reasoning",
        "BackendToolCall",
        "Assistant",
    ]


def test_advisor_tool_result_the_sdk_cannot_model() -> None:
    response = _by_name("anthropic-claude-sonnet-5-advisor-tool")
    (call,) = [i for i in response.items if isinstance(i, BackendToolCall)]
    assert (call.id, call.name, call.status) == (
        "srvtoolu_01DgsKYsJWQfJxubLmaKLEj6",
        "advisor",
        "completed",
    )
    assert call.result == {
        "type": "advisor_result",
        "text": "4.\n\nShip it — this needs no further calls.",
        "stop_reason": "end_turn",
    }
    assert [r["type"] for r in call.raw] == ["server_tool_use", "advisor_tool_result"]


def test_compaction_block_the_sdk_cannot_model_is_kept_verbatim() -> None:
    response = _by_name("anthropic-claude-sonnet-4.6-compaction-cache-read")
    assert response.text == "Hello! 👋"
    assert [type(i).__name__ for i in response.items] == ["OpaqueItem", "Assistant"]
    (block,) = [i for i in response.items if isinstance(i, OpaqueItem)]
    # The block as started, each compaction_delta's fields replacing the start's.
    body = (CORPUS / "messages/anthropic-claude-sonnet-4.6-compaction-cache-read.sse").read_bytes()
    deltas = [
        json.loads(line[6:])["delta"]
        for line in body.decode().splitlines()
        if line.startswith("data: ") and '"compaction_delta"' in line
    ]
    assert deltas
    expected: dict[str, Any] = {"type": "compaction", "content": None}
    for delta in deltas:
        expected.update({k: v for k, v in delta.items() if k != "type"})
    assert block.raw == expected and block.origin is ApiBackend.MESSAGES
    # message_delta's cumulative usage replaces message_start's (cache read 55096 → 0).
    assert response.usage == Usage(input_tokens=181, output_tokens=8)
