"""Property tests over random well-formed conversations, on all three builders."""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_sampler.types._conversation import (
    ApiBackend,
    Assistant,
    ConversationItem,
    ConversationRequest,
    ImagePart,
    Reasoning,
    System,
    TextPart,
    ToolCall,
    ToolResult,
    User,
)
from trio_sampler.wire._request import BuildOptions
from trio_sampler.wire.chat_completions import _request as chat
from trio_sampler.wire.messages import _request as messages
from trio_sampler.wire.responses import _request as responses

MODULES: dict[ApiBackend, ModuleType] = {
    ApiBackend.CHAT_COMPLETIONS: chat,
    ApiBackend.RESPONSES: responses,
    ApiBackend.MESSAGES: messages,
}
OPTIONS = BuildOptions(model="m", cache_breakpoints=False, replay_reasoning_content=True)

text = st.text(min_size=1, max_size=12)
ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
image = st.builds(
    ImagePart,
    st.sampled_from(["https://e.com/a.png", "data:image/png;base64,iVBOR"]),
)


def _reasoning(backend: ApiBackend, n: int) -> Reasoning:
    if backend is ApiBackend.MESSAGES:
        return Reasoning(text=f"t{n}", signature=f"sig{n}", origin=backend)
    if backend is ApiBackend.RESPONSES:
        return Reasoning(
            summary=(f"s{n}",), id=f"rs_{n}", encrypted_content=f"e{n}", origin=backend
        )
    return Reasoning(text=f"t{n}", origin=backend)


@st.composite
def conversations(draw: st.DrawFn, backend: ApiBackend) -> list[list[ConversationItem]]:
    """A conversation as a list of request-sized chunks (user side, then assistant side)."""
    chunks: list[list[ConversationItem]] = []
    head: list[ConversationItem] = []
    if draw(st.booleans()):
        head.append(System(draw(text)))
    for turn in range(draw(st.integers(1, 4))):
        user: list[ConversationItem] = [
            User(draw(st.lists(st.one_of(text.map(TextPart), image), min_size=1, max_size=3)))
        ]
        chunks.append(head + user if turn == 0 else user)
        assistant: list[ConversationItem] = []
        if draw(st.booleans()):
            assistant.append(_reasoning(backend, turn))
        calls = [
            ToolCall(f"call_{turn}_{i}", draw(ident), orjson.dumps({"x": i}).decode())
            for i in range(draw(st.integers(0, 2)))
        ]
        assistant.append(Assistant(draw(text), tool_calls=calls))
        assistant += [ToolResult(c.id, draw(text)) for c in calls]
        chunks.append(assistant)
    return chunks


def _flat(chunks: list[list[ConversationItem]]) -> list[ConversationItem]:
    return [item for chunk in chunks for item in chunk]


def _build(backend: ApiBackend, items: list[ConversationItem]) -> Any:
    return MODULES[backend].build_request(ConversationRequest(items=items), OPTIONS)


def _messages_of(backend: ApiBackend, data: Any) -> list[bytes]:
    key = "input" if backend is ApiBackend.RESPONSES else "messages"
    return [orjson.dumps(m) for m in data[key]]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_render_then_parse_gives_the_conversation_back(data: st.DataObject) -> None:
    for backend, module in MODULES.items():
        items = _flat(data.draw(conversations(backend)))
        wire = _build(backend, items)
        assert wire.report.lossless
        assert module.parse_request(wire.body).items == tuple(items)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_prefix_renders_to_the_same_bytes(data: st.DataObject) -> None:
    for backend in MODULES:
        chunks = data.draw(conversations(backend))
        full = _build(backend, _flat(chunks))
        assert full.body == _build(backend, _flat(chunks)).body  # deterministic
        full_messages = _messages_of(backend, full.data)
        for cut in range(1, len(chunks) + 1, 2):  # requests end after the user side
            prefix = _messages_of(backend, _build(backend, _flat(chunks[:cut])).data)
            assert full_messages[: len(prefix)] == prefix


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_messages_invariants(data: st.DataObject) -> None:
    chunks = data.draw(conversations(ApiBackend.MESSAGES))
    cut = data.draw(st.integers(1, len(chunks)))
    wire = messages.build_request(
        ConversationRequest(items=_flat(chunks[:cut])), BuildOptions(model="m")
    )
    msgs = wire.data["messages"]
    roles = [m["role"] for m in msgs]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles))
    markers = [b for b in wire.data.get("system", []) if "cache_control" in b]
    for n, message in enumerate(msgs):
        blocks = message["content"]
        markers += [b for b in blocks if "cache_control" in b]
        assert not any("cache_control" in b for b in blocks if "thinking" in b["type"])
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if results:
            kinds = [b["type"] for b in blocks]
            assert kinds[: len(results)] == ["tool_result"] * len(results)
            uses = [b["id"] for b in msgs[n - 1]["content"] if b["type"] == "tool_use"]
            assert results == uses
    assert 1 <= len(markers) <= 3
