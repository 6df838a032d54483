"""Round trip over every real captured request body: parse, rebuild, compare.

``parse_request`` then ``build_request`` must give the original JSON up to the short list
of normalizations in :func:`normalize` (also listed in docs/backends/request-mapping.md).
Fields the neutral model has no place for go through ``BuildOptions.extra_body``, which
is what that option is for.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from benchmarks import corpus
from trio_sampler.wire._request import BuildOptions
from trio_sampler.wire.chat_completions import _request as chat
from trio_sampler.wire.messages import _request as messages
from trio_sampler.wire.responses import _request as responses

FIXTURES = corpus.root()
MODULES: dict[str, ModuleType] = {
    "chat_completions": chat,
    "responses": responses,
    "messages": messages,
}
CASES = corpus.files("*/*.request.json")
#: The request bodies of every corpus (the leaf test below reads them all).
ALL_CASES = corpus.all_files("*/*.request.json")

pytestmark = pytest.mark.real_streams


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _one_text(content: Any, text_type: str) -> Any:
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], dict)
        and content[0].get("type") == text_type
        and set(content[0]) == {"type", "text"}
    ):
        return content[0]["text"]
    return content


def normalize(backend: str, body: dict[str, Any]) -> dict[str, Any]:
    """Apply the documented normalizations to a wire body (original or rebuilt)."""
    # 1. A null field means "unset" on every backend; SDKs send explicit nulls.
    body = _drop_nulls(body)
    # 2. A content list holding one plain text part is the same as a string.
    if backend == "chat_completions":
        for message in body.get("messages", []):
            if message.get("role") != "assistant" and "content" in message:
                message["content"] = _one_text(message["content"], "text")
    if backend == "responses":
        # 8. A string input is one user message; a role message's "type": "message" is
        #    the default type.
        if isinstance(body.get("input"), str):
            body["input"] = [{"role": "user", "content": body["input"]}]
        for item in body.get("input", []):
            role_message = isinstance(item, dict) and item.get("role") not in (None, "assistant")
            if role_message and item.get("type") == "message":
                del item["type"]
        for item in body.get("input", []):
            if isinstance(item, dict) and "role" in item and item.get("role") != "assistant":
                item["content"] = _one_text(item["content"], "input_text")
            # 3. The fc_… item id of a replayed function_call is not kept (optional on input).
            if isinstance(item, dict) and item.get("type") == "function_call":
                item.pop("id", None)
        # 4. include is recomputed: reasoning.encrypted_content exactly when reasoning is
        #    requested or replayed; other include values are not in the neutral model.
        body.pop("include", None)
        # 5. reasoning.summary is always "auto" when an effort is set.
        if isinstance(body.get("reasoning"), dict):
            body["reasoning"].pop("summary", None)
    if backend == "messages":
        # 2 (Messages). A string system / message content is one text block.
        if isinstance(body.get("system"), list):
            body["system"] = _one_text(body["system"], "text")
        for message in body.get("messages", []):
            message["content"] = _one_text(message["content"], "text")
            # 6. A tool_result's list of text blocks is the same as their joined string.
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                    inner = block["content"]
                    if all(b.get("type") == "text" and set(b) == {"type", "text"} for b in inner):
                        block["content"] = "".join(b["text"] for b in inner)
    # 7. Chat stream_options is always {"include_usage": true} when streaming.
    if backend == "chat_completions":
        body.pop("stream_options", None)
        # 9. Mistral's tool_choice "any" is "required" (Mistral takes both).
        if body.get("tool_choice") == "any":
            body["tool_choice"] = "required"
        for message in body.get("messages", []):
            # 10. An assistant turn's empty content beside its tool calls is no content.
            calls = message.get("role") == "assistant" and message.get("tool_calls")
            if calls and message.get("content") == "":
                del message["content"]
    # 11. Tool controls without tools are not sent (the APIs reject them; the report notes it).
    if not body.get("tools"):
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
    if backend == "responses":
        # 12. A leading system message in input is the instructions (for a request that does
        #     not continue a stored response, the same prompt).
        first = body.get("input", [None])[0] if body.get("input") else None
        if (
            "instructions" not in body
            and "previous_response_id" not in body
            and isinstance(first, dict)
            and first.get("role") == "system"
            and isinstance(first.get("content"), str)
        ):
            body["instructions"] = body["input"].pop(0)["content"]
        # 13. An input message's status is an output field the API ignores on input.
        for item in body.get("input", []):
            if isinstance(item, dict) and item.get("role") in ("user", "system", "developer"):
                item.pop("status", None)
        # 14. An assistant message's string content is one output_text part.
        for item in body.get("input", []):
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, str) and item.get("role") == "assistant":
                item["content"] = [{"type": "output_text", "text": content}]
    return body


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_request_round_trip(path: Path) -> None:
    backend = path.parent.name
    module = MODULES[backend]
    original = orjson.loads(path.read_bytes())
    request = module.parse_request(original)
    options = BuildOptions(
        stream=bool(original.get("stream")),
        cache_breakpoints=False,
        extra_body=module.unmodeled_request_fields(original),
    )
    rebuilt = module.build_request(request, options)
    assert orjson.loads(rebuilt.body) == rebuilt.data
    assert normalize(backend, orjson.loads(rebuilt.body)) == normalize(backend, original)


def test_fixtures_are_present() -> None:
    assert len(CASES) >= 40
    assert {p.parent.name for p in CASES} == set(MODULES)


#: The conversation and its tools: what must survive without any help from extra_body.
CONVERSATION_AND_TOOLS = (
    "messages",
    "input",
    "system",
    "instructions",
    "tools",
    "mcp_servers",
    "tool_choice",
    "parallel_tool_calls",
)


def _leaves(value: Any, path: tuple[Any, ...]) -> set[tuple[tuple[Any, ...], Any]]:
    """Every scalar in ``value`` with the path of keys and indices that leads to it."""
    if isinstance(value, dict):
        return {leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))}
    if isinstance(value, list):
        return {leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))}
    return {(path, value)}


def _conversation_and_tool_leaves(body: dict[str, Any]) -> set[tuple[tuple[Any, ...], Any]]:
    return {
        leaf for key in CONVERSATION_AND_TOOLS if key in body for leaf in _leaves(body[key], (key,))
    }


def _sends_reasoning_back(body: dict[str, Any]) -> bool | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    sent = any(isinstance(m, dict) and "reasoning_content" in m for m in messages)
    return True if sent else None


def _leaf_case_id(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.parent.name}/{path.name}"


@pytest.mark.parametrize(
    "path",
    ALL_CASES,
    ids=_leaf_case_id,
)
def test_request_keeps_its_conversation_and_tools(path: Path) -> None:
    """The neutral model alone carries every message and every tool of a real body,
    with no exception: the order of interleaved function and hosted tools, a gateway's
    own fields on messages and parts, an assistant turn's audio reference.

    Only fields outside the conversation and its tools may go through ``extra_body``;
    every leaf of the conversation, the tools (hosted and provider tools included) and
    the tool controls must come back from ``parse_request`` → ``build_request``.
    """
    backend = path.parent.name
    module = MODULES[backend]
    original = orjson.loads(path.read_bytes())
    unmodeled = module.unmodeled_request_fields(original)
    assert not set(unmodeled) & set(CONVERSATION_AND_TOOLS)
    options = BuildOptions(
        stream=bool(original.get("stream")),
        cache_breakpoints=False,
        extra_body=unmodeled,
        model=None if "model" in original else "model-in-the-path",  # Vertex bodies
        # A caller talking to a provider that wants its reasoning back says so.
        replay_reasoning_content=_sends_reasoning_back(original),
    )
    rebuilt = module.build_request(module.parse_request(original), options)
    wanted = _conversation_and_tool_leaves(normalize(backend, original))
    got = _conversation_and_tool_leaves(normalize(backend, orjson.loads(rebuilt.body)))
    assert wanted - got == set()
