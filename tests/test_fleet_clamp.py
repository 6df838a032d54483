"""The header clamp: a provider's rate-limit report tightens the fleet's shared state when
it shows less room than the fleet counts (a real redis-server, scaled-down windows)."""

from __future__ import annotations

import uuid

import httpx2
import pytest
import trio

from benchmarks.redis_server import RedisServer
from trio_sampler import ConversationRequest, SamplerConfig, User
from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.fleet import (
    AdmissionRefusedError,
    Cost,
    FailurePolicy,
    FleetAdmission,
    FleetLimiter,
    FleetLimits,
    LimiterSpec,
    open_limiter,
)
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Completed, RateLimitBudget, RateLimitSnapshot

SOON = 0.2  # a deadline that admits at once or not at all (intervals here are >= 1 s)


def _spec(limits: FleetLimits, **kw: object) -> LimiterSpec:
    name = f"clamp-{uuid.uuid4().hex[:12]}"
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    kw.setdefault("admission_timeout", 2.0)
    return LimiterSpec(name, limits, **kw)  # type: ignore[arg-type]


def _requests_left(remaining: int, limit: int = 60) -> RateLimitSnapshot:
    return RateLimitSnapshot(requests=RateLimitBudget(limit, remaining, 30.0))


async def _admits_at_once(
    limiter: FleetLimiter, cost: Cost | None = None, within: float = SOON
) -> bool:
    try:
        await limiter.acquire(cost or Cost(), deadline=trio.current_time() + within)
    except AdmissionRefusedError:
        return False
    return True


async def test_a_report_of_less_room_tightens_every_process(redis_server: RedisServer) -> None:
    # Per-request settlements: the clamp goes with this release (a lease sends it with
    # its next call or give-back), counted in ``clamped``.
    spec = _spec(FleetLimits(requests_per_minute=60, window_s=60.0), leases=None)
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        permit = await first.acquire(Cost())
        # Someone else spent the account's budget: the provider says 2 remain.
        first.observe(permit, _requests_left(2), trio.current_time())
        await first.release(permit, None)
        assert first.statistics().clamped == 1
        # The other process sees it: 2 at once, then the rate.
        assert [await _admits_at_once(second) for _ in range(3)] == [True, True, False]


async def test_a_report_of_more_room_never_loosens(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=6, window_s=60.0))  # 6 at once
    async with open_limiter(spec, redis_server.url) as limiter:
        permits = [await limiter.acquire(Cost(), deadline=trio.current_time() + SOON)]
        permits += [await limiter.acquire(Cost()) for _ in range(5)]
        # A provider with a larger limit reports plenty left: the fleet's own limit holds.
        limiter.observe(permits[0], _requests_left(100, limit=1000), trio.current_time())
        for permit in permits:
            await limiter.release(permit, None)
        assert limiter.statistics().clamped == 0
        assert not await _admits_at_once(limiter)


async def test_the_token_dimensions_are_clamped_too(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(tokens_per_minute=6000, input_tokens_per_minute=3000), leases=None)
    async with open_limiter(spec, redis_server.url) as limiter:
        cost = Cost(1, 100, 100)
        permit = await limiter.acquire(cost)
        report = RateLimitSnapshot(
            tokens=RateLimitBudget(6000, 5900, 1.0), input_tokens=RateLimitBudget(3000, 50, 59.0)
        )
        limiter.observe(permit, report, trio.current_time())
        await limiter.release(permit, Cost(1, 100, 100))
        # 5,900 combined tokens left is more room than the fleet counts (5,800): not
        # clamped; 50 input tokens is less (2,900): the next 100-token prompt waits.
        assert limiter.statistics().clamped == 1
        assert not await _admits_at_once(limiter, cost)
        assert await _admits_at_once(limiter, Cost(1, 0, 100))


async def test_a_report_ages_as_it_waits_for_the_settlement(redis_server: RedisServer) -> None:
    # 10 a second: a report of "none left" read 0.5 s before the settlement has refilled 5.
    spec = _spec(FleetLimits(requests_per_minute=600, window_s=60.0))
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost())
        limiter.observe(permit, _requests_left(0, limit=600), trio.current_time() - 0.5)
        await limiter.release(permit, None)
        admitted = 0
        while await _admits_at_once(limiter, within=0.02):
            admitted += 1
        assert 3 <= admitted <= 6


REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=20)


@pytest.mark.parametrize("backend", ["chat_completions", "messages"])
async def test_a_sampler_tightens_the_fleet_from_the_providers_headers(
    redis_server: RedisServer, backend: str
) -> None:
    # The account: 60 per 6 s (10 a second). Another client of the key spends 55 of it
    # first, so the fleet (which saw none of that) would admit a burst the provider
    # refuses. One answer's headers tighten it: a second sampler's burst meets no 429.
    limits = RateLimits(requests_per_minute=60, window_s=6.0)
    app = EmulatorApp(cache=PromptCache(), rate_limits=limits)
    spec = _spec(FleetLimits(requests_per_minute=60, window_s=6.0))
    config = SamplerConfig(  # no pacer of its own: the fleet limiter is the only guard
        base_url="http://emulator.test/v1",
        backend=backend,
        model="emulator-1",
        api_key="shared-account-key",
        rate_limit_pacing=None,
        retry=RetryPolicy(max_retries=0),
    )
    # The other client has a transport of its own (closing a client closes its transport).
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as other:
        for _ in range(55):
            response = await other.post(
                "http://emulator.test/v1/chat/completions",
                headers={"authorization": "Bearer shared-account-key"},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
            assert response.status_code == 200
    async with EmulatorTransport(app) as transport:
        first_gate = FleetAdmission(redis_server.url, spec)
        async with open_sampler(config, transport=transport, admission=first_gate) as sampler:
            stream = await sampler.submit(REQUEST)
            assert isinstance([e async for e in stream][-1], Completed)
        second_gate = FleetAdmission(redis_server.url, spec)
        results: list[object] = []
        async with open_sampler(config, transport=transport, admission=second_gate) as sampler:

            async def one() -> None:
                stream = await sampler.submit(REQUEST)
                results.append([e async for e in stream][-1])

            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(one)
    assert all(isinstance(end, Completed) for end in results), results
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
