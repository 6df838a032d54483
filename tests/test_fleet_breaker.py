"""Circuit breakers shared by a fleet (a real redis-server): one process seeing a route
fail opens it for every process; a route not shared keeps its breaker to itself."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from benchmarks.redis_server import RedisServer
from trio_sampler import (
    Completed,
    ConversationRequest,
    Route,
    RoutingPolicy,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.actor import SamplerHandle
from trio_sampler.config import RetryPolicy
from trio_sampler.emulator import EmulatorApp, EmulatorTransport, PromptCache
from trio_sampler.fleet import FailurePolicy, FleetAdmission, FleetLimits, LimiterSpec
from trio_sampler.fleet._breaker import SharedBreaker
from trio_sampler.routing import BreakerPolicy, BreakerState, RouteBreaker

REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=20)
DOWN = {"primary-model": {"faults": [{"type": "status", "status": 503}]}}


def _route(name: str) -> Route:
    config = SamplerConfig(
        base_url="http://emulator.test/v1",
        model=f"{name}-model",
        api_key=f"sk-{name}-route-key-0123",
        retry=RetryPolicy(max_retries=0),
    )
    return Route(name, config)


def _routing() -> RoutingPolicy:
    return RoutingPolicy(
        [_route("primary"), _route("fallback")],
        breaker=BreakerPolicy(consecutive_failures=2, open_s=30.0),
    )


def _spec() -> LimiterSpec:
    limits = FleetLimits(requests_per_minute=10_000)
    name = f"breakers-{uuid.uuid4().hex[:12]}"
    return LimiterSpec(name, limits, on_failure=FailurePolicy.FAIL_CLOSED, admission_timeout=2.0)


@asynccontextmanager
async def _process(
    app: EmulatorApp, admission: FleetAdmission, routing: RoutingPolicy
) -> AsyncIterator[SamplerHandle]:
    """One process of the fleet: its own transport, sampler and gate."""
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(
            routing.routes[0].config, routing=routing, transport=transport, admission=admission
        ) as sampler,
    ):
        yield sampler


async def _serve(sampler: SamplerHandle) -> Completed:
    stream = await sampler.submit(REQUEST)
    end = [event async for event in stream][-1]
    assert isinstance(end, Completed), end
    return end


def _sent_to(app: EmulatorApp, model: str) -> int:
    return sum(1 for entry in app.requests() if entry["body"]["model"] == model)


async def test_one_process_opening_a_route_opens_it_for_all(redis_server: RedisServer) -> None:
    app = EmulatorApp(cache=PromptCache(), models=DOWN)
    spec = _spec()
    async with (
        _process(app, FleetAdmission(redis_server.url, spec, share_breakers=True), _routing()) as a,
        _process(app, FleetAdmission(redis_server.url, spec, share_breakers=True), _routing()) as b,
    ):
        for _ in range(2):  # two 503s on the primary: a's circuit opens
            assert (await _serve(a)).route == "fallback"
        assert (await a.route_stats())["primary"].state is BreakerState.OPEN
        with trio.fail_after(5):
            # b learns it from Redis, at its next sync (every 0.25 s): poll its state.
            while (await b.route_stats())["primary"].state is not BreakerState.OPEN:  # noqa: ASYNC110
                await trio.sleep(0.02)
        before = _sent_to(app, "primary-model")
        end = await _serve(b)
    assert end.route == "fallback"
    assert end.metrics is not None
    assert [name for name, _ in end.metrics.skipped_routes] == ["primary"]
    assert _sent_to(app, "primary-model") == before  # b never tried the primary


async def test_a_route_not_shared_keeps_its_breaker_to_itself(redis_server: RedisServer) -> None:
    app = EmulatorApp(cache=PromptCache(), models=DOWN)
    spec = _spec()
    only_fallback = frozenset({"fallback"})
    async with (
        _process(app, FleetAdmission(redis_server.url, spec, share_breakers=True), _routing()) as a,
        _process(
            app, FleetAdmission(redis_server.url, spec, share_breakers=only_fallback), _routing()
        ) as b,
    ):
        for _ in range(2):
            await _serve(a)
        await trio.sleep(0.6)  # a few sync intervals
        before = _sent_to(app, "primary-model")
        end = await _serve(b)
    assert end.route == "fallback"
    assert _sent_to(app, "primary-model") == before + 1  # b tried it: its own breaker is closed


def test_share_breakers_takes_true_or_route_names() -> None:
    spec = _spec()
    assert FleetAdmission("unix:///x", spec, share_breakers=["a", "b"]).share_breakers == frozenset(
        {"a", "b"}
    )
    with pytest.raises(TypeError, match="not a bare string"):
        FleetAdmission("unix:///x", spec, share_breakers="primary")
    with pytest.raises(ValueError, match="breaker_sync_s"):
        FleetAdmission("unix:///x", spec, breaker_sync_s=0)


async def test_after_the_fleets_window_one_probe_at_a_time() -> None:
    # Pure: the wrapper's own logic, the shared window set by hand.
    local = RouteBreaker("primary", BreakerPolicy(consecutive_failures=2, open_s=5.0))
    told: list[Any] = []
    breaker = SharedBreaker(local, lambda: told.append(breaker.pending))
    now = trio.current_time()
    breaker.shared(5000, now)  # another process opened it for 5 s
    assert breaker.reopens_in(now) == pytest.approx(5.0) and not breaker.allow(now)
    later = now + 6
    assert breaker.allow(later) and not breaker.allow(later)  # one probe
    breaker.record_failure(later)  # the probe failed: open again (backed off), for the fleet
    assert told == [("o", 10.0)] and breaker.take_pending() == "o10000"
    assert not breaker.allow(later + 9)
    assert breaker.allow(later + 11) and not breaker.allow(later + 11)  # one probe again
    breaker.record_success(later + 11)  # the probe passed: closed, for the fleet
    assert breaker.take_pending() == "c"
    assert breaker.state is BreakerState.CLOSED and breaker.allow(later + 11)
