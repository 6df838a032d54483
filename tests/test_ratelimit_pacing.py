"""The rate-limit pacer: pure logic, then in the sampler against the emulator's limits
(mock clock)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from trio_sampler import ConversationRequest, SamplerConfig, User
from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.ratelimit import (
    PacingCost,
    RateLimitBudget,
    RateLimitPacer,
    RateLimitPacing,
    RateLimitSnapshot,
)
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import (
    Cancelled,
    Completed,
    Failed,
    Paced,
    Retrying,
    SamplingErrorKind,
    StreamStarted,
)

ONE = PacingCost(1, 0, 0)


def _snapshot(remaining: int, limit: int = 60, reset: float | None = None) -> RateLimitSnapshot:
    """A report of ``limit`` a minute: the deficit refills by the reset, which the pacer
    counts a second later than reported (times come to the second)."""
    if reset is None:
        reset = max(0.0, (limit - remaining) * 60 / limit - 1)
    return RateLimitSnapshot(requests=RateLimitBudget(limit, remaining, reset))


# --- the pacer, pure ---------------------------------------------------------------------


def test_without_a_snapshot_nothing_is_held() -> None:
    pacer = RateLimitPacer()
    waits = [pacer.reserve(PacingCost(1, 10_000, 10_000), now=0.0).wait for _ in range(1000)]
    assert waits == [0.0] * 1000


def test_an_exhausted_budget_spaces_attempts_at_the_refill_rate() -> None:
    pacer = RateLimitPacer()
    first = pacer.reserve(ONE, now=0.0)
    pacer.observe(_snapshot(remaining=0), now=0.0, reservation=first)
    # 60 per minute, none left: one attempt per second, in the order they asked.
    waits = [pacer.reserve(ONE, now=0.0).wait for _ in range(5)]
    assert waits == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])
    assert pacer.delay(now=0.0) == pytest.approx(6.0)


def test_room_left_is_used_before_anything_waits() -> None:
    pacer = RateLimitPacer()
    pacer.observe(_snapshot(remaining=3), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    waits = [pacer.reserve(ONE, now=0.0).wait for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.0, 0.0, 1.0, 2.0])


def test_a_report_never_raises_the_count_while_attempts_are_in_flight() -> None:
    pacer = RateLimitPacer()
    reported = pacer.reserve(ONE, now=0.0)
    pacer.observe(_snapshot(remaining=2), now=0.0, reservation=reported)
    later = [pacer.reserve(ONE, now=0.0) for _ in range(2)]  # the last of the room
    for reservation in later:
        pacer.sent(reservation)
    assert [r.wait for r in later] == [0.0, 0.0]
    # A report processed before those two says 2 remain: responses come in any order,
    # so it does not give the room back.
    pacer.observe(_snapshot(remaining=2), now=0.0, reservation=later[1])
    assert pacer.reserve(ONE, now=0.0).wait == pytest.approx(1.0)


def test_the_first_report_counts_the_unreported_attempts_as_uncounted() -> None:
    pacer = RateLimitPacer()
    old, new = pacer.reserve(ONE, now=0.0), pacer.reserve(ONE, now=0.0)
    pacer.observe(_snapshot(remaining=0), now=0.0, reservation=new)
    # ``old`` may not be in the provider's count yet: it is debited (the cautious reading).
    assert pacer.delay(now=0.0) == pytest.approx(2.0)
    pacer.observe(_snapshot(remaining=50), now=0.0, reservation=old)
    assert pacer.delay(now=0.0) == pytest.approx(2.0)


def test_a_report_of_less_room_lowers_the_count() -> None:
    # Someone else uses the key: the provider reports 5 left where the pacer counts 29.
    pacer = RateLimitPacer()
    pacer.observe(_snapshot(remaining=30), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    reservation = pacer.reserve(ONE, now=0.0)
    pacer.sent(reservation)
    pacer.observe(_snapshot(remaining=5), now=0.0, reservation=reservation)
    waits = [pacer.reserve(ONE, now=0.0).wait for _ in range(6)]
    assert waits == pytest.approx([0.0] * 5 + [1.0])


def test_reported_usage_gives_back_the_tokens_reserved_beyond_it() -> None:
    pacer = RateLimitPacer()
    first = pacer.reserve(PacingCost(1, 100, 1000), now=0.0)
    pacer.observe(
        RateLimitSnapshot(tokens=RateLimitBudget(6000, 1100, 48.0)), now=0.0, reservation=first
    )
    big = pacer.reserve(PacingCost(1, 100, 1000), now=0.0)
    pacer.sent(big)
    assert pacer.delay(now=0.0, cost=PacingCost(1, 100, 1000)) == pytest.approx(11.0)
    pacer.settle(big, PacingCost(1, 100, 50))  # it answered in 50 tokens, not 1000
    assert pacer.delay(now=0.0, cost=PacingCost(1, 100, 1000)) == pytest.approx(1.5)


def test_a_cancelled_reservation_gives_its_place_back() -> None:
    pacer = RateLimitPacer()
    pacer.observe(_snapshot(remaining=0), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    waiting = pacer.reserve(ONE, now=0.0)
    assert waiting.wait == pytest.approx(1.0)
    pacer.cancel(waiting)
    assert pacer.reserve(ONE, now=0.0).wait == pytest.approx(1.0)
    sent = pacer.reserve(ONE, now=0.0)
    pacer.sent(sent)
    pacer.cancel(sent)  # too late: it went out
    assert pacer.delay(now=0.0) == pytest.approx(3.0)


def test_the_bucket_refills_but_never_past_its_limit() -> None:
    pacer = RateLimitPacer()
    pacer.observe(_snapshot(remaining=0), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    # An hour later the bucket is full (60), not 3,600: the 61st waits.
    waits = [pacer.reserve(ONE, now=3600.0).wait for _ in range(61)]
    assert waits[:60] == [0.0] * 60 and waits[60] == pytest.approx(1.0)


def test_tokens_are_paced_by_the_cost_of_each_attempt() -> None:
    pacer = RateLimitPacer()
    first = pacer.reserve(PacingCost(1, 100, 100), now=0.0)
    pacer.observe(
        RateLimitSnapshot(tokens=RateLimitBudget(6000, 500, 54.0)), now=0.0, reservation=first
    )
    # 100 tokens a second refill; 500 left; each attempt takes 200.
    waits = [pacer.reserve(PacingCost(1, 100, 100), now=0.0).wait for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.0, 1.0, 3.0])
    # A cost larger than the whole limit is not held: waiting cannot make it fit.
    assert pacer.reserve(PacingCost(1, 7000, 0), now=0.0).wait == pytest.approx(0.0)


def test_a_slower_reported_refill_wins_over_the_window() -> None:
    # A daily limit: 1000 a day, 10 left, whole again in 24 h: far slower than 1000/min.
    pacer = RateLimitPacer()
    pacer.observe(
        RateLimitSnapshot(requests=RateLimitBudget(1000, 0, 86_399.0)),
        now=0.0,
        reservation=pacer.reserve(ONE, now=0.0),
    )
    assert pacer.delay(now=0.0) == pytest.approx(86.4)


def test_a_429_gives_the_attempt_back_the_provider_did_not_count() -> None:
    pacer = RateLimitPacer()
    pacer.observe(_snapshot(remaining=1), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    refused = pacer.reserve(ONE, now=0.0)
    pacer.sent(refused)
    pacer.rate_limited(None, now=0.0, reservation=refused)
    assert pacer.delay(now=0.0) == 0.0


def test_a_429_with_retry_after_holds_every_attempt_until_then() -> None:
    pacer = RateLimitPacer()
    failed = pacer.reserve(ONE, now=10.0)
    pacer.rate_limited(None, now=10.0, reservation=failed, retry_after=7.5)
    assert pacer.blocked_until == pytest.approx(17.5)
    held = pacer.reserve(ONE, now=11.0)
    assert held.wait == pytest.approx(6.5) and held.held_by == "retry_after"
    assert pacer.reserve(ONE, now=18.0).wait == 0.0


def test_a_429_without_retry_after_waits_for_the_exhausted_reset() -> None:
    pacer = RateLimitPacer()
    failed = pacer.reserve(ONE, now=0.0)
    pacer.rate_limited(_snapshot(remaining=0, reset=12.0), now=0.0, reservation=failed)
    assert pacer.blocked_until == pytest.approx(12.0)


def test_reserve_keeps_a_fraction_of_each_limit_free() -> None:
    pacer = RateLimitPacer(RateLimitPacing(reserve=0.1))
    pacer.observe(_snapshot(remaining=10), now=0.0, reservation=pacer.reserve(ONE, now=0.0))
    # 6 of 60 are kept free: 4 go at once, the fifth waits for one refill.
    waits = [pacer.reserve(ONE, now=0.0).wait for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_s": 0}, "window_s must be a positive number"),
        ({"reserve": 1.0}, r"reserve must be a fraction in \[0, 1\)"),
        ({"chars_per_token": float("nan")}, "chars_per_token must be a positive number"),
    ],
)
def test_bad_pacing_settings_fail_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RateLimitPacing(**kwargs)


def test_sampler_config_takes_pacing_or_none() -> None:
    assert SamplerConfig(base_url="http://x/v1").rate_limit_pacing == RateLimitPacing()
    assert SamplerConfig(base_url="http://x/v1", rate_limit_pacing=None).rate_limit_pacing is None
    with pytest.raises(TypeError, match=r"RateLimitPacing\(\.\.\.\) or None"):
        SamplerConfig(base_url="http://x/v1", rate_limit_pacing=True)  # type: ignore[arg-type]


# --- in the sampler, against the emulator's limits ---------------------------------------

REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=50)


def _config(**kw: object) -> SamplerConfig:
    return SamplerConfig(
        base_url="http://emulator.test/v1",
        model="emulator-1",
        api_key="test-key",
        **kw,  # type: ignore[arg-type]
    )


def _terminal(events: Sequence[object]) -> object:
    terminals = [e for e in events if isinstance(e, Completed | Failed | Cancelled)]
    assert len(terminals) == 1 and events[-1] is terminals[0], events
    return terminals[0]


async def _steady_load(
    config: SamplerConfig, app: EmulatorApp, *, workers: int, each: int
) -> list[list[object]]:
    """One request to learn the limits, then ``workers`` tasks sending ``each`` requests
    back to back."""
    results: list[list[object]] = []
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        first = await sampler.submit(REQUEST)
        results.append([event async for event in first])

        async def worker() -> None:
            for _ in range(each):
                stream = await sampler.submit(REQUEST)
                results.append([event async for event in stream])

        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                nursery.start_soon(worker)
    return results


async def test_steady_load_meets_no_429_once_a_snapshot_was_seen(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=60))
    start = trio.current_time()
    # 20 tasks x 9 requests = 180 after the first: three minutes at 60 per minute.
    results = await _steady_load(_config(), app, workers=20, each=9)
    elapsed = trio.current_time() - start
    assert all(isinstance(_terminal(events), Completed) for events in results)
    assert not any(isinstance(e, Retrying) for events in results for e in events)
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
    # Paced at the limit, not below it: the 59 left after the first go at once, the
    # other 121 one a second.
    assert 120 <= elapsed <= 125
    stamps = [e.rate_limit for events in results for e in events if isinstance(e, StreamStarted)]
    assert all(s is not None and s.requests is not None for s in stamps)
    metrics = [_terminal(events).metrics for events in results]  # type: ignore[attr-defined]
    assert sum(m.rate_limit_wait_ms > 0 for m in metrics) >= 100
    assert all(m.rate_limit is not None for m in metrics)


async def test_without_pacing_the_same_load_meets_429s(autojump_clock: trio.abc.Clock) -> None:
    # The control for the test above: the limit is real, and the load exceeds it.
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=60))
    config = _config(rate_limit_pacing=None, retry=RetryPolicy(max_retries=0))
    results = await _steady_load(config, app, workers=20, each=9)
    failed = [t for t in map(_terminal, results) if isinstance(t, Failed)]
    assert failed and all(t.error.kind is SamplingErrorKind.RATE_LIMITED for t in failed)
    assert failed[0].error.rate_limit_snapshot is not None
    assert failed[0].metrics is not None and failed[0].metrics.rate_limit is not None


async def test_steady_load_under_a_token_limit(autojump_clock: trio.abc.Clock) -> None:
    limits = RateLimits(tokens_per_minute=6_000, refund_unused=False)
    app = EmulatorApp(cache=PromptCache(), rate_limits=limits)
    results = await _steady_load(_config(), app, workers=10, each=8)
    assert all(isinstance(_terminal(events), Completed) for events in results)
    assert app.rate_limits is not None and app.rate_limits.refusals == {}


async def test_a_429_holds_the_other_requests_until_retry_after(
    autojump_clock: trio.abc.Clock,
) -> None:
    # No limits, no headers: one scripted 429 with Retry-After, and the requests after it
    # are held instead of meeting the 429 window too.
    from trio_sampler.emulator import script_headers

    app = EmulatorApp(cache=PromptCache())
    headers = script_headers(
        scenario="rl", faults=[{"type": "status", "status": 429, "retry_after": 30, "times": 1}]
    )
    config = _config(extra_headers=tuple(headers.items()))
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        start = trio.current_time()
        first = await sampler.submit(REQUEST)
        events = [event async for event in first]
        assert isinstance(_terminal(events), Completed)
        assert trio.current_time() - start == pytest.approx(30, abs=0.5)
        second_start = trio.current_time()
        second = await sampler.submit(REQUEST)
        assert isinstance(_terminal([e async for e in second]), Completed)
        assert trio.current_time() - second_start < 1


async def test_a_wait_past_the_total_timeout_fails_at_once_without_sending(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=2))
    config = _config(timeouts=Timeouts(total=5.0), retry=RetryPolicy(max_retries=0))
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        for _ in range(2):
            stream = await sampler.submit(REQUEST)
            assert isinstance(_terminal([e async for e in stream]), Completed)
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        terminal = _terminal([e async for e in stream])
    assert isinstance(terminal, Failed)
    assert terminal.error.kind is SamplingErrorKind.RATE_LIMITED
    assert terminal.error.error_code == "rate_limit_pacing"
    assert trio.current_time() - start < 0.1
    assert len(app.requests()) == 2  # the third was never sent


async def test_the_refill_rate_is_learnt_from_the_reported_resets(
    autojump_clock: trio.abc.Clock,
) -> None:
    # 60 per 10 s (not per minute): the resets say so, and the pacer runs at 6 a second.
    limits = RateLimits(requests_per_minute=60, window_s=10.0)
    app = EmulatorApp(cache=PromptCache(), rate_limits=limits)
    start = trio.current_time()
    results = await _steady_load(_config(), app, workers=20, each=6)
    elapsed = trio.current_time() - start
    assert all(isinstance(_terminal(events), Completed) for events in results)
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
    # 121 requests: 60 at once, then 61 at about 6 a second (a reset of 10 s is counted
    # as 11: times come to the second).
    assert 9.5 <= elapsed <= 12.5


@pytest.mark.parametrize("backend", ["responses", "messages"])
async def test_steady_load_on_the_other_backends(
    backend: str, autojump_clock: trio.abc.Clock
) -> None:
    # Messages reports RFC 3339 reset times to the second: pacing stays within the limit.
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=60))
    results = await _steady_load(_config(backend=backend), app, workers=10, each=8)
    assert all(isinstance(_terminal(events), Completed) for events in results)
    assert app.rate_limits is not None and app.rate_limits.refusals == {}


# --- bounded, visible waits --------------------------------------------------------------


@pytest.mark.parametrize("retry_after", [3600.0, 2.4e9, float("inf")])
def test_a_429_holds_the_account_at_most_max_hold(retry_after: float) -> None:
    # Retry-After: 3600, or an HTTP date in 2100 (seconds from now), held the account
    # for as long as it said: every later request stalled.
    pacer = RateLimitPacer(max_hold=60.0)
    failed = pacer.reserve(ONE, now=10.0)
    pacer.rate_limited(None, now=10.0, reservation=failed, retry_after=retry_after)
    assert pacer.blocked_until == pytest.approx(70.0)


def test_a_reset_decades_away_holds_the_account_at_most_max_hold() -> None:
    pacer = RateLimitPacer(max_hold=60.0)
    failed = pacer.reserve(ONE, now=0.0)
    far = RateLimitSnapshot(requests=RateLimitBudget(60, 0, 2.4e9))
    pacer.rate_limited(far, now=0.0, reservation=failed)
    assert pacer.blocked_until == pytest.approx(60.0)


async def test_a_retry_after_of_an_hour_holds_later_requests_max_retry_after_at_most(
    autojump_clock: trio.abc.Clock,
) -> None:
    from trio_sampler.emulator import script_headers

    app = EmulatorApp(cache=PromptCache())
    fault = {"type": "status", "status": 429, "retry_after": 3600, "times": 1}
    headers = script_headers(scenario="rl-hour", faults=[fault])
    config = _config(extra_headers=tuple(headers.items()), retry=RetryPolicy(max_retry_after=30.0))
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        first = await sampler.submit(REQUEST)
        refused = _terminal([event async for event in first])
        assert isinstance(refused, Failed)  # an hour is past max_retry_after: not retried
        start = trio.current_time()
        second = await sampler.submit(REQUEST)
        events = [event async for event in second]
    assert isinstance(_terminal(events), Completed)
    assert trio.current_time() - start == pytest.approx(30.0, abs=0.5)
    [paced] = [e for e in events if isinstance(e, Paced)]
    assert "429" in paced.reason and paced.wait_s == pytest.approx(30.0, abs=0.5)


async def test_a_wait_past_max_wait_fails_at_once_saying_until_when(
    autojump_clock: trio.abc.Clock,
) -> None:
    # No Timeouts.total: only max_wait bounds the wait.
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=2))
    config = _config(
        retry=RetryPolicy(max_retries=0), rate_limit_pacing=RateLimitPacing(max_wait=5.0)
    )
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        for _ in range(2):
            stream = await sampler.submit(REQUEST)
            assert isinstance(_terminal([e async for e in stream]), Completed)
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        terminal = _terminal([e async for e in stream])
    assert isinstance(terminal, Failed)
    assert terminal.error.kind is SamplingErrorKind.RATE_LIMITED
    assert terminal.error.error_code == "rate_limit_pacing"
    assert "max_wait (5 s)" in terminal.error.message and "until " in terminal.error.message
    assert "UTC" in terminal.error.message and "requests" in terminal.error.message
    assert terminal.error.retry_after is not None and terminal.error.retry_after > 5.0
    assert trio.current_time() - start < 0.1
    assert len(app.requests()) == 2


async def test_a_served_wait_is_announced_before_it_starts(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=2))
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(_config(), transport=transport) as sampler,
    ):
        for _ in range(2):
            stream = await sampler.submit(REQUEST)
            assert isinstance(_terminal([e async for e in stream]), Completed)
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        events = []
        async for event in stream:
            events.append((trio.current_time() - start, event))
    [(at, paced)] = [(at, e) for at, e in events if isinstance(e, Paced)]
    assert at < 0.01  # announced when the wait begins, not after it
    assert paced.reason == "the provider's requests budget has no room yet"
    assert paced.until - paced.wait_s == pytest.approx(start, abs=0.01)
    assert isinstance(events[-1][1], Completed)
    assert events[-1][0] >= paced.wait_s


def test_max_wait_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_wait must be a positive number"):
        RateLimitPacing(max_wait=0)
