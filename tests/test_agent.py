"""The reference agent loop and its tools, under the mock clock with the scripted transport."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.lowlevel
import trio.testing
from fakes import (
    DONE,
    Reply,
    ScriptedTransport,
    chat_chunk,
    chat_stream,
    chat_usage,
    error_reply,
    make_config,
)

from trio_sampler.actor import open_sampler
from trio_sampler.agent import (
    AgentResult,
    AgentStop,
    CalculationError,
    ToolError,
    ToolRegistry,
    builtin_tools,
    calculate,
    process_conversation_turn,
)
from trio_sampler.config import SamplerConfig
from trio_sampler.types import (
    Assistant,
    ConversationItem,
    ConversationRequest,
    SamplingEvent,
    ToolCall,
    ToolResult,
    User,
)

REQUEST = ConversationRequest(items=[User("What is 6*7, and what is in notes.txt?")])
CONTEXT_BODY: dict[str, object] = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


def tool_call_stream(*calls: tuple[str, str, str]) -> list[bytes | float]:
    """A Chat Completions body asking for ``calls`` (id, name, arguments), arguments split."""
    out: list[bytes | float] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        head = {"index": index, "id": call_id, "type": "function"}
        function = {"name": name, "arguments": ""}
        out.append(chat_chunk({"tool_calls": [{**head, "function": function}]}))
        middle = len(arguments) // 2
        for fragment in (arguments[:middle], arguments[middle:]):
            delta: dict[str, object] = {
                "tool_calls": [{"index": index, "function": {"arguments": fragment}}]
            }
            out.append(chat_chunk(delta))
    return [*out, chat_chunk({}, "tool_calls"), chat_usage(), DONE]


def body(transport: ScriptedTransport, index: int) -> dict[str, Any]:
    value = orjson.loads(transport.requests[index].content)
    assert isinstance(value, dict)
    return value


async def run_agent(
    script: Sequence[Reply], registry: ToolRegistry, **kwargs: Any
) -> tuple[AgentResult, ScriptedTransport]:
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        result = await process_conversation_turn(sampler, REQUEST, tools=registry, **kwargs)
    return result, transport


# -- the loop -----------------------------------------------------------------------------


async def test_multi_tool_task(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("buy milk\n")
    script = [
        Reply(
            chunks=tool_call_stream(
                ("call_1", "calculate", '{"expression": "6*7"}'),
                ("call_2", "read_file", '{"path": "notes.txt"}'),
            )
        ),
        Reply(chunks=chat_stream("42, and the note says buy milk.")),
    ]
    events: list[SamplingEvent] = []
    result, transport = await run_agent(script, builtin_tools(tmp_path), on_event=events.append)

    assert result.stop is AgentStop.FINAL_ANSWER, result.message
    assert result.final_text == "42, and the note says buy milk."
    assert result.steps == 2
    assert result.usage.input_tokens == 20 and result.usage.output_tokens == 10
    kinds = [type(item).__name__ for item in result.items]
    assert kinds == ["User", "Assistant", "ToolResult", "ToolResult", "Assistant"]
    first_assistant = result.items[1]
    assert isinstance(first_assistant, Assistant)
    assert [c.name for c in first_assistant.tool_calls] == ["calculate", "read_file"]
    assert result.items[2] == ToolResult(call_id="call_1", content="42")
    assert result.items[3] == ToolResult(call_id="call_2", content="buy milk\n")

    first, second = body(transport, 0), body(transport, 1)
    assert {t["function"]["name"] for t in first["tools"]} == {
        "read_file",
        "list_directory",
        "calculate",
    }
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [
        ("call_1", "42"),
        ("call_2", "buy milk\n"),
    ]
    assistant = next(m for m in second["messages"] if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1", "call_2"]
    assert sum(1 for e in events if type(e).__name__ == "Completed") == 2


async def test_compaction_when_context_overflows(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[tuple[ConversationItem, ...]] = []

    async def compact(items: tuple[ConversationItem, ...]) -> list[ConversationItem]:
        seen.append(items)
        return [User("summary of the conversation so far")]

    script = [error_reply(400, CONTEXT_BODY), Reply(chunks=chat_stream("done"))]
    result, transport = await run_agent(script, ToolRegistry(), compact=compact)
    assert result.stop is AgentStop.FINAL_ANSWER
    assert result.compactions == 1
    assert seen == [REQUEST.items]
    assert [m["content"] for m in body(transport, 1)["messages"]] == [
        "summary of the conversation so far"
    ]
    assert result.items[0] == User("summary of the conversation so far")


async def test_compaction_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def compact(items: tuple[ConversationItem, ...]) -> tuple[ConversationItem, ...]:
        nonlocal calls
        calls += 1
        return items

    script = [error_reply(400, CONTEXT_BODY)]
    result, transport = await run_agent(script, ToolRegistry(), compact=compact, max_compactions=2)
    assert result.stop is AgentStop.CONTEXT_OVERFLOW
    assert calls == 2 and len(transport.requests) == 3
    assert result.error is not None and result.error.error_code == "context_length_exceeded"


async def test_overflow_without_compactor(autojump_clock: trio.testing.MockClock) -> None:
    result, _ = await run_agent([error_reply(400, CONTEXT_BODY)], ToolRegistry())
    assert result.stop is AgentStop.CONTEXT_OVERFLOW
    assert "context_length_exceeded" in result.message


async def test_auth_refresh_on_401(autojump_clock: trio.testing.MockClock) -> None:
    fresh = make_config(api_key="sk-refreshed-key")

    async def refresh() -> SamplerConfig:
        return fresh

    script = [error_reply(401), Reply(chunks=chat_stream("hi"))]
    result, transport = await run_agent(script, ToolRegistry(), refresh_credentials=refresh)
    assert result.stop is AgentStop.FINAL_ANSWER
    assert result.auth_refreshes == 1
    assert result.config is fresh
    assert transport.requests[1].headers["authorization"] == "Bearer sk-refreshed-key"


async def test_auth_refresh_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def refresh() -> SamplerConfig:
        nonlocal calls
        calls += 1
        return make_config()

    result, transport = await run_agent(
        [error_reply(401)], ToolRegistry(), refresh_credentials=refresh, max_auth_refreshes=2
    )
    assert result.stop is AgentStop.AUTH_FAILED
    assert calls == 2 and len(transport.requests) == 3


async def test_401_without_refresher_fails(autojump_clock: trio.testing.MockClock) -> None:
    result, transport = await run_agent([error_reply(401)], ToolRegistry())
    assert result.stop is AgentStop.AUTH_FAILED
    assert len(transport.requests) == 1


async def test_fatal_error(autojump_clock: trio.testing.MockClock) -> None:
    result, _ = await run_agent([error_reply(404)], ToolRegistry())
    assert result.stop is AgentStop.FAILED
    assert result.error is not None and result.error.status_code == 404


async def test_step_limit(autojump_clock: trio.testing.MockClock) -> None:
    script = [Reply(chunks=tool_call_stream(("call_x", "calculate", '{"expression": "1+1"}')))]
    result, transport = await run_agent(script, builtin_tools("."), max_steps=3)
    assert result.stop is AgentStop.STEP_LIMIT
    assert result.steps == 3 and len(transport.requests) == 3
    assert "step limit" in result.message
    # Every tool call got its result, so the conversation can be resubmitted as it is.
    assert isinstance(result.items[-1], ToolResult) and result.items[-1].content == "2"


async def test_tool_errors_do_not_end_the_loop(autojump_clock: trio.testing.MockClock) -> None:
    registry = ToolRegistry()

    def explode() -> str:
        raise RuntimeError("disk on fire")

    registry.register(explode, parameters={"type": "object", "properties": {}})

    script = [
        Reply(
            chunks=tool_call_stream(
                ("c1", "no_such_tool", "{}"),
                ("c2", "explode", "{}"),
                ("c3", "explode", "{not json"),
            )
        ),
        Reply(chunks=chat_stream("sorry")),
    ]
    result, transport = await run_agent(script, registry)
    assert result.stop is AgentStop.FINAL_ANSWER
    results = [i for i in result.items if isinstance(i, ToolResult)]
    assert all(r.is_error for r in results)
    assert "unknown tool 'no_such_tool'" in results[0].content
    assert "RuntimeError: disk on fire" in results[1].content
    assert "not valid JSON" in results[2].content
    assert len([m for m in body(transport, 1)["messages"] if m["role"] == "tool"]) == 3


async def test_request_tools_win_over_registry_names(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_sampler.types import ToolSpec

    own = ToolSpec(name="calculate", description="the caller's own")
    transport = ScriptedTransport([Reply(chunks=chat_stream("ok"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        request = ConversationRequest(items=[User("hi")], tools=[own])
        await process_conversation_turn(sampler, request, tools=builtin_tools("."))
    tools = body(transport, 0)["tools"]
    assert [t["function"]["name"] for t in tools] == ["calculate", "read_file", "list_directory"]
    assert tools[0]["function"]["description"] == "the caller's own"


# -- the registry -------------------------------------------------------------------------


async def test_registry_runs_sync_async_and_threaded_tools() -> None:
    registry = ToolRegistry()

    def add(a: int, b: int) -> int:
        """Add two numbers.

        More text that is not part of the description."""
        return a + b

    async def echo(text: str) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return {"echo": text}

    spec = registry.register(add)
    assert spec.description == "Add two numbers."
    registry.register(echo)
    registry.register(lambda: "from a thread", name="threaded", run_in_thread=True)
    assert "add" in registry and len(registry) == 3

    assert (await registry.execute(ToolCall("1", "add", '{"a": 2, "b": 3}'))).content == "5"
    echoed = await registry.execute(ToolCall("2", "echo", '{"text": "hi"}'))
    assert echoed.content == '{"echo":"hi"}' and not echoed.is_error
    assert (await registry.execute(ToolCall("3", "threaded", ""))).content == "from a thread"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"a": 1}', "arguments: missing required property 'b'"),
        ('{"a": 1, "b": 2, "c": 3}', "arguments: unexpected property 'c'"),
        ('{"a": "one", "b": 2}', "a: expected integer, got string"),
        ("[1, 2]", "must be a JSON object"),
        ('{"a": 1, "b"', "not valid JSON"),
    ],
)
async def test_registry_bad_arguments(arguments: str, message: str) -> None:
    registry = ToolRegistry()

    def add(a: int, b: int) -> int:
        return a + b

    registry.register(add)
    result = await registry.execute(ToolCall("x", "add", arguments))
    assert result.is_error and result.call_id == "x"
    assert message in result.content


async def test_registry_required_from_schema_and_tool_error() -> None:
    registry = ToolRegistry()

    def fetch(url: str = "") -> str:
        raise ToolError("the network is off limits")

    schema = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
    registry.register(fetch, parameters=schema)
    missing = await registry.execute(ToolCall("1", "fetch", "{}"))
    assert missing.is_error and "missing required argument(s): url" in missing.content
    failed = await registry.execute(ToolCall("2", "fetch", '{"url": "x"}'))
    assert failed.is_error and failed.content == "fetch failed: the network is off limits"


async def test_registry_truncates_long_results() -> None:
    registry = ToolRegistry(max_result_chars=10)
    registry.register(lambda: "x" * 25, name="long")
    result = await registry.execute(ToolCall("1", "long", "{}"))
    assert result.content == "x" * 10 + "\n[truncated: 15 more characters]"


def test_registry_rejects_bad_and_duplicate_names() -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="not accepted"):
        registry.register(lambda: 1, name="has space")
    registry.register(lambda: 1, name="one")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(lambda: 1, name="one")


# -- calculate ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("(2 + 3) * 4", "20"),
        ("7 // 2", "3"),
        ("-3 % 5", "2"),
        ("2 ** -1", "0.5"),
        ("1.5 * 2", "3.0"),
        ("+-+1", "-1"),
        ("2 ** 100", str(2**100)),
        ("  10 / 4 ", "2.5"),
    ],
)
def test_calculate(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "Call is not allowed"),
        ("__import__", "names are not allowed"),
        ("x + 1", "names are not allowed"),
        ("().__class__", "not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 1j", "only numbers"),
        ("[1, 2]", "List is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 if 1 else 2", "not allowed"),
        ("2 ** 100000", "exponent 100000 is too large"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 5000", "too large"),
        ("(10 ** 3000) * (10 ** 3000)", "too large"),
        ("2.0 ** 5000", "overflowed"),
        ("(-8) ** 0.5", "complex"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1e308 * 10", "not a finite number"),
        ("-" * 500 + "1", "nested"),
        ("1 +", "not a valid arithmetic expression"),
        ("1" * 1001, "longer than"),
        ("1; import os", "not a valid"),
    ],
)
def test_calculate_refuses(expression: str, message: str) -> None:
    with pytest.raises(CalculationError, match=message):
        calculate(expression)


async def test_calculate_tool_reports_errors() -> None:
    registry = builtin_tools(".")
    result = await registry.execute(ToolCall("1", "calculate", '{"expression": "os.system(1)"}'))
    assert result.is_error and "not allowed" in result.content


# -- file tools -----------------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.txt").write_text("beta")
    (tmp_path / "secret.txt").write_text("top secret")
    (root / "escape").symlink_to(tmp_path / "secret.txt")
    (root / "escape_dir").symlink_to(tmp_path)
    (root / "inside").symlink_to(root / "a.txt")
    return root


async def read(root: Path, path: str, **kwargs: Any) -> ToolResult:
    registry = builtin_tools(root, **kwargs)
    return await registry.execute(ToolCall("r", "read_file", orjson.dumps({"path": path}).decode()))


async def test_read_file_inside_root(sandbox: Path) -> None:
    assert (await read(sandbox, "a.txt")).content == "alpha"
    assert (await read(sandbox, "sub/b.txt")).content == "beta"
    assert (await read(sandbox, "sub/../a.txt")).content == "alpha"
    assert (await read(sandbox, "inside")).content == "alpha"  # a symlink staying inside


@pytest.mark.parametrize(
    "path",
    ["../secret.txt", "escape", "escape_dir/secret.txt", "/etc/passwd", "sub/../../secret.txt"],
)
async def test_read_file_refuses_escapes(sandbox: Path, path: str) -> None:
    result = await read(sandbox, path)
    assert result.is_error and "outside the allowed directory" in result.content
    assert "top secret" not in result.content


async def test_read_file_errors(sandbox: Path) -> None:
    missing = await read(sandbox, "nope.txt")
    assert missing.is_error and "no such file" in missing.content
    directory = await read(sandbox, "sub")
    assert directory.is_error and "is a directory" in directory.content
    (sandbox / "blob.bin").write_bytes(b"\x00\x01\x02")
    binary = await read(sandbox, "blob.bin")
    assert binary.is_error and "binary" in binary.content
    nul = await read(sandbox, "a\0.txt")
    assert nul.is_error


async def test_read_file_refuses_fifo(sandbox: Path) -> None:
    os.mkfifo(sandbox / "pipe")
    with trio.fail_after(5):  # opening a FIFO must not block
        result = await read(sandbox, "pipe")
    assert result.is_error and "not a regular file" in result.content


async def test_read_file_is_size_capped(sandbox: Path) -> None:
    (sandbox / "big.txt").write_text("y" * 100)
    result = await read(sandbox, "big.txt", max_file_bytes=10)
    assert result.content == "y" * 10 + "\n[truncated: showing the first 10 of 100 bytes]"


async def test_list_directory(sandbox: Path) -> None:
    registry = builtin_tools(sandbox)
    listing = await registry.execute(ToolCall("l", "list_directory", "{}"))
    assert listing.content.splitlines() == [
        ".: 5 entries",
        "a.txt",
        "escape@",
        "escape_dir@",
        "inside@",
        "sub/",
    ]
    sub = await registry.execute(ToolCall("l", "list_directory", '{"path": "sub"}'))
    assert sub.content.splitlines() == ["sub: 1 entries", "b.txt"]
    outside = await registry.execute(ToolCall("l", "list_directory", '{"path": ".."}'))
    assert outside.is_error and "outside" in outside.content
    escaped = await registry.execute(ToolCall("l", "list_directory", '{"path": "escape_dir"}'))
    assert escaped.is_error and "outside" in escaped.content
    not_dir = await registry.execute(ToolCall("l", "list_directory", '{"path": "a.txt"}'))
    assert not_dir.is_error and "not a directory" in not_dir.content
