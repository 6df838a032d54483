"""The reference agent loop against the emulator over loopback, on every backend:
a multi-tool task, compaction on a context overflow, credential refresh on a 401."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from trio_sampler import (
    ApiBackend,
    ConversationRequest,
    SamplerConfig,
    System,
    ToolResult,
    User,
    open_sampler,
)
from trio_sampler.agent import AgentStop, builtin_tools, process_conversation_turn
from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import ConversationItem

BACKENDS = [pytest.param(b, id=b.value) for b in ApiBackend]


def config(
    emulator: EmulatorFixture, backend: ApiBackend, key: str = "sk-agent-1"
) -> SamplerConfig:
    return SamplerConfig(
        base_url=emulator.base_url, backend=backend, model="emulator-1", api_key=key
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_multi_tool_task(
    emulator: EmulatorFixture, backend: ApiBackend, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("forty-two")
    headers = emulator.script(
        tool_calls=[
            {"name": "calculate", "arguments": {"expression": "6 * 7"}},
            {"name": "read_file", "arguments": {"path": "data.txt"}},
        ],
        after_tool_result={"text": "Both tools agree: 42."},
        scenario=f"multi-{backend.value}",
    )
    request = ConversationRequest(items=[User("compute and read")], extra_headers=headers)
    async with open_sampler(config(emulator, backend)) as sampler:
        result = await process_conversation_turn(sampler, request, tools=builtin_tools(tmp_path))
    assert result.stop is AgentStop.FINAL_ANSWER, result.message
    assert result.final_text == "Both tools agree: 42."
    results = [item for item in result.items if isinstance(item, ToolResult)]
    assert [r.content for r in results] == ["42", "forty-two"]
    assert not any(r.is_error for r in results)
    # The second request carried both results back to the server.
    second = emulator.requests(f"multi-{backend.value}")[1]["body"]
    assert "forty-two" in str(second)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_compacts_on_context_overflow(emulator: EmulatorFixture, backend: ApiBackend) -> None:
    overflow = {
        "type": "status",
        "status": 400,
        "times": 1,
        "body": {
            "error": {
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    }
    headers = emulator.script(
        text="fits now", scenario=f"compact-{backend.value}", faults=[overflow]
    )
    long_history: list[ConversationItem] = [System("rules"), *[User(f"old {i}") for i in range(6)]]
    request = ConversationRequest(items=[*long_history, User("latest")], extra_headers=headers)
    compacted: list[int] = []

    async def compact(items: tuple[ConversationItem, ...]) -> tuple[ConversationItem, ...]:
        compacted.append(len(items))
        return (items[0], User("summary of earlier turns"), items[-1])

    async with open_sampler(config(emulator, backend)) as sampler:
        result = await process_conversation_turn(
            sampler, request, tools=builtin_tools(Path(".")), compact=compact
        )
    assert result.stop is AgentStop.FINAL_ANSWER, result.message
    assert result.compactions == 1 and compacted == [8]
    assert result.final_text == "fits now"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_refreshes_credentials_on_401(emulator: EmulatorFixture, backend: ApiBackend) -> None:
    headers = emulator.script(
        text="welcome back",
        scenario=f"auth-{backend.value}",
        faults=[{"type": "status", "status": 401, "times": 1}],
    )
    request = ConversationRequest(items=[User("hi")], extra_headers=headers)
    first = config(emulator, backend, key="sk-expired")

    async def refresh() -> SamplerConfig:
        return attrs.evolve(first, api_key="sk-fresh")

    async with open_sampler(first) as sampler:
        result = await process_conversation_turn(
            sampler, request, tools=builtin_tools(Path(".")), refresh_credentials=refresh
        )
    assert result.stop is AgentStop.FINAL_ANSWER, result.message
    assert result.auth_refreshes == 1
    assert result.config is not None and result.config.api_key is not None
    assert result.config.api_key.reveal() == "sk-fresh"
