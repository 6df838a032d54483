"""Hedged attempts under the mock clock: the second attempt starts after the hedge delay,
the first to produce content wins, the other is cancelled and accounted."""

from __future__ import annotations

import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_stream, chat_usage, error_reply
from test_routing import hosts, on

from trio_sampler import (
    Cancelled,
    Completed,
    ConversationRequest,
    Route,
    RoutingPolicy,
    SamplingEvent,
    User,
    collect,
    open_sampler,
)
from trio_sampler.config import RetryPolicy
from trio_sampler.routing import HedgePolicy, hedge_delay
from trio_sampler.types import AttemptOutcome, StreamStarted

REQUEST = ConversationRequest(items=[User("hi")])


def slow(seconds: float, text: str = "slow answer") -> Reply:
    """Headers at once, then nothing for ``seconds``, then the answer."""
    return Reply(chunks=[seconds, *chat_stream(text)])


def hedged(delay: float = 1.0, **policy: object) -> RoutingPolicy:
    return RoutingPolicy(
        [Route("a", on("a", retry=RetryPolicy(max_retries=1, base_delay=0.1, max_delay=0.1)))],
        hedge=HedgePolicy(delay_s=delay, **policy),  # type: ignore[arg-type]
    )


async def run(
    routing: RoutingPolicy, transport: ScriptedTransport
) -> tuple[list[SamplingEvent], float]:
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        start = trio.current_time()
        stream = await s.submit(REQUEST)
        events = [event async for event in stream]
        return events, trio.current_time() - start


async def test_a_slow_first_token_is_hedged_and_the_fast_attempt_wins(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport = ScriptedTransport([slow(10.0), Reply(chunks=chat_stream("fast answer"))])
    events, took = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "fast answer"
    assert took == pytest.approx(1.0, abs=0.01)  # the hedge delay, then the fast reply
    assert end.metrics is not None
    assert [(a.attempt, a.outcome) for a in end.metrics.attempts] == [
        (1, AttemptOutcome.LOST_HEDGE),
        (2, AttemptOutcome.COMPLETED),
    ]
    # Only the winner's events reach the consumer: one attempt's stream, no Retrying.
    assert [e.attempt for e in events if isinstance(e, StreamStarted)] == [2]
    assert collect(events).text == "fast answer"
    assert transport.closed_bodies == transport.opened_bodies == 2  # the loser was closed


async def test_no_hedge_when_content_comes_before_the_delay(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport = ScriptedTransport([slow(0.5, "first"), Reply(chunks=chat_stream("never"))])
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "first"
    assert len(transport.requests) == 1


async def test_the_first_attempt_may_still_win(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([slow(1.5, "first"), slow(10.0, "hedge")])
    events, took = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "first"
    assert took == pytest.approx(1.5, abs=0.01)
    assert end.metrics is not None
    assert [a.outcome for a in end.metrics.attempts] == [
        AttemptOutcome.COMPLETED,
        AttemptOutcome.LOST_HEDGE,
    ]


async def test_a_lost_hedge_is_billed_what_it_reported(autojump_clock: trio.abc.Clock) -> None:
    # The hedge reports usage before any content (some servers send it first), then loses.
    usage_first = Reply(chunks=[chat_usage(prompt=7, completion=0), 10.0, *chat_stream("late")])
    transport = ScriptedTransport([slow(1.5, "first"), usage_first])
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.metrics is not None
    lost = end.metrics.attempts[1]
    assert lost.outcome is AttemptOutcome.LOST_HEDGE
    assert lost.usage is not None and lost.usage.input_tokens == 7
    assert end.metrics.total_usage is not None
    served = end.response.usage
    assert served is not None
    assert end.metrics.total_usage.input_tokens == served.input_tokens + 7


async def test_a_fast_failure_is_retried_not_hedged(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([error_reply(503), Reply(chunks=chat_stream("retried"))])
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "retried"
    assert end.metrics is not None
    assert [a.outcome for a in end.metrics.attempts] == [
        AttemptOutcome.FAILED,
        AttemptOutcome.COMPLETED,
    ]


async def test_both_failing_without_content_goes_to_the_retry_policy(
    autojump_clock: trio.abc.Clock,
) -> None:
    silent_then_cut = Reply(chunks=[3.0], then="drop")
    transport = ScriptedTransport(
        [silent_then_cut, silent_then_cut, Reply(chunks=chat_stream("third"))]
    )
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "third"
    assert end.metrics is not None
    assert [a.outcome for a in end.metrics.attempts] == [
        AttemptOutcome.FAILED,
        AttemptOutcome.FAILED,
        AttemptOutcome.COMPLETED,
    ]


async def test_a_cancel_during_the_race_ends_both(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([slow(10.0), slow(10.0)])
    routing = hedged(delay=1.0)
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        stream = await s.submit(REQUEST)
        await trio.sleep(2.0)
        stream.cancel()
        events = [event async for event in stream]
        await stream.aclose()
        assert await s.active_count() == 0
        stats = await s.route_stats()
    assert isinstance(events[-1], Cancelled)
    assert transport.closed_bodies == transport.opened_bodies == 2
    assert stats["a"].state is not None and stats["a"].state.value == "closed"


def test_the_percentile_delay_follows_recent_first_tokens() -> None:
    policy = HedgePolicy(delay_s=5.0, percentile=0.9, min_samples=10)
    assert hedge_delay(policy, [0.2] * 18 + [3.0, 4.0]) == 0.2
    assert hedge_delay(policy, [0.2] * 17 + [3.0, 4.0, 4.5]) == 3.0


async def test_a_percentile_hedge_uses_the_routes_recent_ttft(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Ten fast requests teach the route its TTFT (0.2 s); the eleventh is slow and is
    # hedged at that delay instead of the 5 s fallback.
    replies = [slow(0.2, "fast")] * 10 + [slow(10.0, "slow"), slow(0.2, "hedge")]
    transport = ScriptedTransport(replies)
    routing = hedged(delay=5.0, percentile=0.9, min_samples=10)
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        for _ in range(10):
            await s.submit_and_collect(REQUEST)
        start = trio.current_time()
        response = await s.submit_and_collect(REQUEST)
        took = trio.current_time() - start
    assert response.text == "hedge"
    assert took == pytest.approx(0.4, abs=0.01)  # hedged at 0.2 s, answered 0.2 s later


async def test_a_hedge_may_go_to_the_next_route(autojump_clock: trio.abc.Clock) -> None:
    transport, counts = hosts(a=[slow(10.0, "from a")], b=[Reply(chunks=chat_stream("from b"))])
    routing = RoutingPolicy(
        [Route("a", on("a")), Route("b", on("b"))],
        hedge=HedgePolicy(delay_s=1.0, next_route=True),
    )
    events, took = await run(routing, transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "from b"
    assert end.route == "b" and end.model == "test-model"
    assert took == pytest.approx(1.0, abs=0.01)
    assert end.metrics is not None and end.metrics.route == "b"
    assert [(a.route, a.outcome) for a in end.metrics.attempts] == [
        ("a", AttemptOutcome.LOST_HEDGE),
        ("b", AttemptOutcome.COMPLETED),
    ]
    assert counts == {"a": 1, "b": 1}


async def test_without_a_next_route_the_hedge_stays_on_the_route(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport = ScriptedTransport([slow(10.0), Reply(chunks=chat_stream("same route"))])
    routing = hedged(delay=1.0, next_route=True)
    events, _ = await run(routing, transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "same route"
    assert end.route == "a"


async def test_a_second_hedge_when_the_first_is_slow_too(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([slow(10.0), slow(10.0), Reply(chunks=chat_stream("third"))])
    events, took = await run(hedged(delay=1.0, max_hedges=2), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "third"
    assert took == pytest.approx(2.0, abs=0.01)  # a hedge at 1 s, another at 2 s
    assert end.metrics is not None
    assert [a.outcome for a in end.metrics.attempts] == [
        AttemptOutcome.LOST_HEDGE,
        AttemptOutcome.LOST_HEDGE,
        AttemptOutcome.COMPLETED,
    ]
    assert transport.closed_bodies == transport.opened_bodies == 3


async def test_one_hedge_by_default(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([slow(10.0, "first"), slow(10.0, "hedge"), slow(0.1, "never")])
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "first"
    assert len(transport.requests) == 2


async def test_the_request_reports_the_winners_timings(autojump_clock: trio.abc.Clock) -> None:
    # The first attempt wins after the hedge started: the request's first token is its.
    transport = ScriptedTransport([slow(1.5, "first"), slow(10.0, "hedge")])
    events, _ = await run(hedged(delay=1.0), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.metrics is not None
    winner = end.metrics.attempts[0]
    assert winner.outcome is AttemptOutcome.COMPLETED
    assert end.metrics.time_to_first_token_ms == pytest.approx(1500.0, abs=10.0)
    assert end.metrics.time_to_first_token_ms == winner.time_to_first_token_ms


async def test_a_hedge_the_pacer_still_held_is_not_an_attempt(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Request Y's first attempt streams its content at 2 s. Request X, sent just after,
    # gets a 429 with Retry-After 5: the account's pacer holds every attempt until then,
    # so Y's hedge (due at 1 s) waits in the pacer and is cancelled there when Y's first
    # attempt produces content. It never sent a request: no attempt is recorded for it.
    transport = ScriptedTransport(
        [
            slow(2.0, "first"),
            error_reply(429, {"error": {"type": "rate_limit_error"}}, **{"retry-after": "5"}),
            Reply(chunks=chat_stream("x answer")),
        ]
    )
    routing = hedged(delay=1.0)
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        y = await s.submit(REQUEST)
        await trio.sleep(0.1)
        x = await s.submit(REQUEST)
        y_events = [event async for event in y]
        x_events = [event async for event in x]
    y_end, x_end = y_events[-1], x_events[-1]
    assert isinstance(y_end, Completed) and y_end.response.text == "first"
    assert isinstance(x_end, Completed) and x_end.response.text == "x answer"
    assert y_end.metrics is not None and x_end.metrics is not None
    assert [a.outcome for a in y_end.metrics.attempts] == [AttemptOutcome.COMPLETED]
    assert len(transport.requests) == 3  # Y once, X twice: every request sent is recorded
    assert len(y_end.metrics.attempts) + len(x_end.metrics.attempts) == 3
