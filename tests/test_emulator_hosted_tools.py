"""The emulator accepts every hosted tool our builders send and, when the script says so,
runs one: the stream carries it in the backend's real shape, and our transforms read it
back as a hosted tool call."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

from trio_sampler import ApiBackend, ConversationRequest, User
from trio_sampler.emulator._script import ScriptError, parse_script
from trio_sampler.testing import EmulatorFixture, emulator, script_headers
from trio_sampler.types import (
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    CodeExecution,
    FileSearch,
    HostedTool,
    MCPServer,
    ProviderTool,
    WebFetch,
    WebSearch,
)
from trio_sampler.wire import SSEDecoder, collect, replay
from trio_sampler.wire._request import BuildOptions
from trio_sampler.wire.chat_completions import _request as chat
from trio_sampler.wire.messages import _request as messages
from trio_sampler.wire.responses import _request as responses

__all__ = ["emulator"]

BUILDERS = {
    ApiBackend.CHAT_COMPLETIONS: chat.build_request,
    ApiBackend.RESPONSES: responses.build_request,
    ApiBackend.MESSAGES: messages.build_request,
}

TOOLS: dict[str, HostedTool] = {
    "web_search": WebSearch(),
    "web_fetch": WebFetch(),
    "code_execution": CodeExecution(),
    "file_search": FileSearch(["vs_1"]),
    "mcp": MCPServer("wiki", "https://mcp.example.com/mcp", require_approval="never"),
}
SCRIPTS: dict[str, dict[str, Any]] = {
    "web_search": {"name": "web_search", "query": "trio nurseries"},
    "web_fetch": {"name": "web_fetch", "url": "https://trio.readthedocs.io/"},
    "code_execution": {"name": "code_execution", "code": "print(6 * 7)"},
    "file_search": {"name": "file_search", "query": "cancel scopes"},
    "mcp": {
        "name": "mcp",
        "server": "wiki",
        "tool": "ask_question",
        "arguments": {"question": "What is a nursery?"},
    },
}

#: (backend, scripted tool) → (the BackendToolCall name, its arguments as JSON).
EXPECTED: dict[tuple[ApiBackend, str], tuple[str, Any]] = {
    (ApiBackend.CHAT_COMPLETIONS, "web_search"): ("search", {"query": "trio nurseries"}),
    (ApiBackend.RESPONSES, "web_search"): (
        "web_search",
        {"type": "search", "query": "trio nurseries"},
    ),
    (ApiBackend.RESPONSES, "code_execution"): ("code_interpreter", {"code": "print(6 * 7)"}),
    (ApiBackend.RESPONSES, "file_search"): ("file_search", {"queries": ["cancel scopes"]}),
    (ApiBackend.RESPONSES, "mcp"): ("ask_question", {"question": "What is a nursery?"}),
    (ApiBackend.MESSAGES, "web_search"): ("web_search", {"query": "trio nurseries"}),
    (ApiBackend.MESSAGES, "web_fetch"): ("web_fetch", {"url": "https://trio.readthedocs.io/"}),
    (ApiBackend.MESSAGES, "code_execution"): ("bash_code_execution", {"command": "print(6 * 7)"}),
    (ApiBackend.MESSAGES, "mcp"): ("ask_question", {"question": "What is a nursery?"}),
}


async def run(
    emu: EmulatorFixture, backend: ApiBackend, tools: list[HostedTool], **script: Any
) -> tuple[httpx2.Response, list[Any]]:
    request = ConversationRequest(items=[User("Look it up.")], hosted_tools=tools)
    wire = BUILDERS[backend](request, BuildOptions(model="emulated-model"))
    headers = {"content-type": "application/json", **dict(wire.headers)}
    headers.update(script_headers(**script) if script else {})
    async with httpx2.AsyncClient(timeout=10) as client:
        response = await client.post(emu.url_for(backend.value), content=wire.body, headers=headers)
    assert response.status_code == 200, response.text
    decoder = SSEDecoder()
    payloads = [
        orjson.loads(e.data)
        for e in decoder.feed(response.content) + decoder.close()
        if e.data != "[DONE]"
    ]
    return response, payloads


@pytest.mark.parametrize(("backend", "name"), sorted(EXPECTED, key=str))
async def test_a_scripted_hosted_tool_streams_and_reads_back(
    emulator: EmulatorFixture, backend: ApiBackend, name: str
) -> None:
    response, _ = await run(
        emulator, backend, [TOOLS[name]], hosted_tool=SCRIPTS[name], text="Found it."
    )
    events = list(replay(backend, [response.content]))
    started = [e for e in events if isinstance(e, BackendToolCallStarted)]
    completed = [e for e in events if isinstance(e, BackendToolCallCompleted)]
    result = collect(events)
    calls = [item for item in result.items if isinstance(item, BackendToolCall)]
    want_name, want_arguments = EXPECTED[backend, name]
    call = calls[-1]
    assert (call.name, orjson.loads(call.arguments)) == (want_name, want_arguments)
    assert [e.call_id for e in started] == [e.call_id for e in completed] == [c.id for c in calls]
    assert call.origin is backend and call.raw
    assert result.assistant.content == "Found it."


async def test_responses_items_have_the_real_event_sequences(emulator: EmulatorFixture) -> None:
    sequences: dict[str, list[str]] = {}
    for name in ("file_search", "code_execution", "mcp"):
        _, payloads = await run(
            emulator, ApiBackend.RESPONSES, [TOOLS[name]], hosted_tool=SCRIPTS[name]
        )
        sequences[name] = [p["type"] for p in payloads if p["type"] not in _ENVELOPE]
        numbers = [p["sequence_number"] for p in payloads]
        assert numbers == list(range(len(numbers)))
    assert sequences["file_search"][:5] == [
        "response.output_item.added",
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
        "response.output_item.done",
    ]
    code = sequences["code_execution"]
    assert code[:2] == ["response.output_item.added", "response.code_interpreter_call.in_progress"]
    assert "response.code_interpreter_call_code.delta" in code
    assert code[code.index("response.code_interpreter_call_code.done") :][:4] == [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
        "response.output_item.done",
    ]
    mcp = sequences["mcp"]
    assert mcp[:4] == [
        "response.output_item.added",  # mcp_list_tools
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ]
    assert mcp[4:6] == ["response.output_item.added", "response.mcp_call.in_progress"]
    assert "response.mcp_call_arguments.done" in mcp and "response.mcp_call.completed" in mcp


_ENVELOPE = {"response.created", "response.in_progress", "response.completed"}


async def test_messages_blocks_have_the_real_shapes(emulator: EmulatorFixture) -> None:
    shapes: dict[str, Any] = {}
    for name in ("web_fetch", "code_execution", "mcp"):
        _, payloads = await run(
            emulator, ApiBackend.MESSAGES, [TOOLS[name]], hosted_tool=SCRIPTS[name]
        )
        starts = [p["content_block"] for p in payloads if p["type"] == "content_block_start"]
        shapes[name] = [(b["type"], b.get("name")) for b in starts]
        delta = next(p for p in payloads if p["type"] == "message_delta")
        shapes[name + " usage"] = delta["usage"].get("server_tool_use")
        shapes[name + " container"] = "container" in delta["delta"]
    assert shapes["web_fetch"][:2] == [
        ("server_tool_use", "web_fetch"),
        ("web_fetch_tool_result", None),
    ]
    assert shapes["web_fetch usage"] == {"web_search_requests": 0, "web_fetch_requests": 1}
    assert shapes["code_execution"][:2] == [
        ("server_tool_use", "bash_code_execution"),
        ("bash_code_execution_tool_result", None),
    ]
    assert shapes["code_execution container"] is True
    assert shapes["mcp"][:2] == [("mcp_tool_use", "ask_question"), ("mcp_tool_result", None)]
    assert shapes["mcp container"] is False


async def test_chat_completions_web_search_is_groq_executed_tools(
    emulator: EmulatorFixture,
) -> None:
    _, payloads = await run(
        emulator, ApiBackend.CHAT_COMPLETIONS, [], hosted_tool=SCRIPTS["web_search"]
    )
    executed = [
        p["choices"][0]["delta"]["executed_tools"][0]
        for p in payloads
        if p.get("choices") and "executed_tools" in p["choices"][0]["delta"]
    ]
    assert [("output" in t, len(t["search_results"]["results"])) for t in executed] == [
        (False, 0),
        (True, 1),
    ]


@pytest.mark.parametrize(
    ("backend", "name"),
    [
        (ApiBackend.RESPONSES, "web_fetch"),
        (ApiBackend.MESSAGES, "file_search"),
        (ApiBackend.CHAT_COMPLETIONS, "mcp"),
    ],
)
async def test_a_hosted_tool_the_backend_lacks_adds_nothing(
    emulator: EmulatorFixture, backend: ApiBackend, name: str
) -> None:
    response, _ = await run(emulator, backend, [], hosted_tool=SCRIPTS[name], text="Plain.")
    result = collect(replay(backend, [response.content]))
    assert not [i for i in result.items if isinstance(i, BackendToolCall)]
    assert result.assistant.content == "Plain."


@pytest.mark.parametrize("backend", list(ApiBackend))
async def test_every_hosted_tool_and_provider_tool_is_accepted(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    """Whatever our builder sends for the whole family is a valid request."""
    tools = [*TOOLS.values(), ProviderTool(backend, {"type": "emulated_provider_tool"})]
    response, _ = await run(emulator, backend, tools, text="ok")
    assert collect(replay(backend, [response.content])).assistant.content == "ok"


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"name": "browser"}, "one of web_search, web_fetch"),
        ({"name": "web_fetch", "query": "x"}, "takes url; remove query"),
        ({"name": "mcp", "arguments": "x"}, "arguments must be an object"),
        ({"name": "code_execution", "code": 1}, "code must be a string"),
    ],
)
def test_bad_hosted_tool_scripts_say_what_to_write(script: dict[str, Any], message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(orjson.dumps({"hosted_tool": script}).decode())
