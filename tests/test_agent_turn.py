"""An agent turn as one unit: a handle to cancel it, a budget that ends it with a typed
reason, a cancel scope around it that keeps the partial answer, tool calls of one step run
concurrently on request, and the routes that answered; under the mock clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config
from test_agent import REQUEST, tool_call_stream

from trio_sampler.actor import open_sampler
from trio_sampler.agent import AgentStop, AgentTurn, ToolRegistry, TurnBudget
from trio_sampler.models import ModelCatalog, ModelInfo, ModelPrices
from trio_sampler.routing import Route, RoutingPolicy

CALCULATE = ("call_1", "calculate", '{"expression": "6*7"}')
QUOTA: dict[str, object] = {
    "error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}
}


def calculator() -> ToolRegistry:
    registry = ToolRegistry()

    def calculate(expression: str) -> str:
        return "42"

    registry.register(
        calculate,
        parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
    )
    return registry


def slow_answer() -> Reply:
    """Two chunks of an answer, then a long pause before the rest."""
    return Reply(
        chunks=[
            chat_chunk({"content": "The answer "}),
            chat_chunk({"content": "is"}),
            30.0,
            *chat_stream(" 42."),
        ]
    )


def turn_for(sampler: Any, script_tools: ToolRegistry | None = None, **kwargs: Any) -> AgentTurn:
    return AgentTurn(sampler, REQUEST, tools=script_tools or calculator(), **kwargs)


async def run_turn(script: Sequence[Reply], **kwargs: Any) -> tuple[AgentTurn, Any]:
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        turn = turn_for(sampler, **kwargs)
        result = await turn.run()
    return turn, result


async def test_a_turn_cancelled_from_another_task_keeps_its_partial_and_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = [Reply(chunks=tool_call_stream(CALCULATE)), slow_answer()]
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        turn = turn_for(sampler)
        async with trio.open_nursery() as nursery:

            async def cancel_later() -> None:
                await trio.sleep(5)
                turn.cancel("the user pressed Escape")

            nursery.start_soon(cancel_later)
            result = await turn.run()
    assert result.stop is AgentStop.CANCELLED
    assert result.final_text == "The answer is"
    assert result.steps == 1  # the first step answered; the second was cut
    assert result.usage.input_tokens == 10 and result.usage.output_tokens == 5
    assert "the user pressed Escape" in result.message
    assert turn.result is result


async def test_a_cancel_scope_around_the_turn_keeps_its_partial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = [Reply(chunks=tool_call_stream(CALCULATE)), slow_answer()]
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        turn = turn_for(sampler)
        with trio.move_on_after(5):
            await turn.run()
    result = turn.result
    assert result is not None
    assert result.stop is AgentStop.CANCELLED
    assert result.final_text == "The answer is"
    assert result.usage.input_tokens == 10 and result.usage.output_tokens == 5
    assert result.steps == 1


async def test_cancel_before_the_turn_runs_sends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("hi"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        turn = turn_for(sampler)
        turn.cancel()
        result = await turn.run()
    assert result.stop is AgentStop.CANCELLED
    assert transport.requests == []


async def test_a_step_budget_ends_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    script = [Reply(chunks=tool_call_stream(CALCULATE))]
    _, result = await run_turn(script, budget=TurnBudget(steps=2))
    assert result.stop is AgentStop.STEP_LIMIT
    assert result.steps == 2


async def test_a_time_budget_ends_the_turn_with_its_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = [Reply(chunks=tool_call_stream(CALCULATE)), slow_answer()]
    start = trio.current_time()
    _, result = await run_turn(script, budget=TurnBudget(seconds=1.0))
    assert result.stop is AgentStop.TIME_BUDGET
    assert trio.current_time() - start == pytest.approx(1.0)
    assert result.final_text == "The answer is"
    assert "1 s" in result.message and "idle" not in result.message


async def test_the_time_budget_is_per_turn_not_per_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three requests of 0.4 s each: each within a 1 s bound, the turn not."""
    paced: list[bytes | float] = [chat_chunk({"content": "x"}), 0.4]
    script = [
        Reply(chunks=paced + tool_call_stream(CALCULATE)),
        Reply(chunks=paced + tool_call_stream(CALCULATE)),
        Reply(chunks=paced + chat_stream("done")),
    ]
    _, result = await run_turn(script, budget=TurnBudget(seconds=1.0))
    assert result.stop is AgentStop.TIME_BUDGET
    assert result.steps == 2


async def test_a_cost_budget_ends_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    prices = ModelPrices(input=60.0, output=120.0)  # 10 in + 5 out: $0.0012 a step
    catalog = ModelCatalog(
        models={
            "test-model": ModelInfo("test-model", "test", "chat_completions", 1000, 100, prices)
        }
    )
    script = [Reply(chunks=tool_call_stream(CALCULATE))]
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport, models=catalog) as sampler:
        result = await turn_for(sampler, budget=TurnBudget(cost_usd=0.001)).run()
    assert result.stop is AgentStop.COST_BUDGET
    assert result.steps == 1
    assert result.cost_usd == pytest.approx(0.0012)
    assert "$0.001" in result.message


async def test_a_token_budget_ends_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    script = [Reply(chunks=tool_call_stream(CALCULATE))]
    _, result = await run_turn(script, budget=TurnBudget(tokens=20))
    assert result.stop is AgentStop.TOKEN_BUDGET
    assert result.steps == 2  # 15 tokens after one step, 30 after two


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seconds": 0}, "TurnBudget.seconds"),
        ({"tokens": -1}, "TurnBudget.tokens"),
        ({"cost_usd": "1"}, "TurnBudget.cost_usd"),
        ({"steps": 0}, "TurnBudget.steps"),
    ],
)
def test_a_bad_budget_says_which_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        TurnBudget(**changes)


async def test_tool_calls_of_one_step_run_concurrently_when_asked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = ToolRegistry()
    running: list[int] = []
    peak = 0

    async def wait(seconds: float) -> str:
        nonlocal peak
        running.append(1)
        peak = max(peak, len(running))
        await trio.sleep(seconds)
        running.pop()
        return f"waited {seconds:g}"

    registry.register(
        wait, parameters={"type": "object", "properties": {"seconds": {"type": "number"}}}
    )
    calls = [(f"c{i}", "wait", f'{{"seconds": {i + 1}}}') for i in range(3)]
    script = [Reply(chunks=tool_call_stream(*calls)), Reply(chunks=chat_stream("done"))]
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        start = trio.current_time()
        result = await turn_for(sampler, registry, parallel_tools=2).run()
        elapsed = trio.current_time() - start
    assert result.stop is AgentStop.FINAL_ANSWER
    assert peak == 2  # bounded
    assert elapsed == pytest.approx(4.0)  # 1 and 2 together, then 3 after the first
    contents = [getattr(item, "content", None) for item in result.items[2:5]]
    assert contents == ["waited 1", "waited 2", "waited 3"]  # the model's order


async def test_the_result_names_the_routes_that_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    primary = make_config(base_url="http://primary.test/v1")
    fallback = make_config(base_url="http://fallback.test/v1")
    routing = RoutingPolicy([Route("primary", primary), Route("fallback", fallback)])
    script = [
        error_reply(429, QUOTA),  # primary's key is spent: the fallback takes the step
        Reply(chunks=tool_call_stream(CALCULATE)),
        Reply(chunks=chat_stream("42")),
    ]
    transport = ScriptedTransport(script)
    async with open_sampler(routing=routing, transport=transport) as sampler:
        result = await turn_for(sampler).run()
    assert result.stop is AgentStop.FINAL_ANSWER, result.message
    assert result.routes == ("fallback", "primary")
