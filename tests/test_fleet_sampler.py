"""The fleet limiter as the sampler's admission step, against the emulator and a real Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from benchmarks.redis_server import RedisServer, running_redis
from trio_sampler import ApiBackend, ConversationRequest, SamplerConfig, User
from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.fleet import (
    FailurePolicy,
    FleetAdmission,
    FleetEvent,
    FleetLimits,
    LimiterDegraded,
    LimiterSpec,
    RetryBudgetSpec,
)
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Cancelled, Completed, Failed, Retrying, SamplingErrorKind

REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=50)


def _config(**kw: object) -> SamplerConfig:
    return SamplerConfig(
        base_url="http://emulator.test/v1",
        model="emulator-1",
        api_key="test-key",
        **kw,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def _sampler(
    config: SamplerConfig, app: EmulatorApp, admission: FleetAdmission
) -> AsyncIterator[SamplerHandle]:
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport, admission=admission) as sampler,
    ):
        yield sampler


def _spec(limits: FleetLimits, **kw: object) -> LimiterSpec:
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    # Generous unless a test is about it: the suite shares two cores with other work.
    kw.setdefault("admission_timeout", 2.0)
    return LimiterSpec(f"sampler-{uuid.uuid4().hex[:12]}", limits, **kw)  # type: ignore[arg-type]


async def _run_all(
    sampler: SamplerHandle, count: int, request: ConversationRequest = REQUEST
) -> list[list[object]]:
    results: list[list[object]] = []

    async def one() -> None:
        stream = await sampler.submit(request)
        results.append([event async for event in stream])

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return results


def _terminal(events: Sequence[object]) -> object:
    terminals = [e for e in events if isinstance(e, Completed | Failed | Cancelled)]
    assert len(terminals) == 1 and events[-1] is terminals[0], events
    return terminals[0]


async def test_the_sampler_keeps_the_emulator_within_its_limits(
    redis_server: RedisServer,
) -> None:
    # The emulator enforces 20 requests per (scaled) 1 s window; the fleet limit is 95 % of
    # it, the headroom that absorbs the varying delay between admission and arrival.
    limits = RateLimits(requests_per_minute=20, window_s=1.0)
    app = EmulatorApp(cache=PromptCache(), rate_limits=limits)
    spec = _spec(FleetLimits(requests_per_minute=19, window_s=1.0))
    start = trio.current_time()
    async with _sampler(
        _config(),
        app,
        FleetAdmission(redis_server.url, spec),
    ) as sampler:
        results = await _run_all(sampler, 30)
    elapsed = trio.current_time() - start
    errors = [str(t.error) for t in map(_terminal, results) if isinstance(t, Failed)]
    assert not errors
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
    assert not any(isinstance(e, Retrying) for r in results for e in r)
    assert elapsed > 0.55  # 19 at once, then 11 more at 19 per second


async def test_total_timeout_bounds_the_admission_wait(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1, window_s=60.0))
    config = _config(timeouts=Timeouts(total=0.5))
    async with _sampler(
        config,
        EmulatorApp(cache=PromptCache()),
        FleetAdmission(redis_server.url, spec),
    ) as sampler:
        start = trio.current_time()
        results = await _run_all(sampler, 3)
        elapsed = trio.current_time() - start
    terminals = [_terminal(r) for r in results]
    assert sum(isinstance(t, Completed) for t in terminals) == 1
    refused = [t for t in terminals if isinstance(t, Failed)]
    assert len(refused) == 2
    assert all(t.error.error_code == "fleet_rate_limited" for t in refused)
    assert elapsed < 0.5  # refused at once: the wait would end past the deadline


async def test_cancel_while_waiting_for_admission(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=2, window_s=60.0, burst=0.5))
    async with _sampler(
        _config(),
        EmulatorApp(cache=PromptCache()),
        FleetAdmission(redis_server.url, spec),
    ) as sampler:
        first = await sampler.submit(REQUEST)
        assert isinstance(_terminal([e async for e in first]), Completed)
        waiting = await sampler.submit(REQUEST, request_id="waiting")
        await trio.sleep(0.1)
        await sampler.cancel("waiting")
        with trio.fail_after(1):
            events: list[object] = [e async for e in waiting]
    assert isinstance(_terminal(events), Cancelled)


async def test_fail_closed_ends_each_request_with_fleet_unavailable() -> None:
    events: list[FleetEvent] = []
    with running_redis() as server:
        # Every admission asks Redis (a lease's units, charged before the outage, are
        # spent first: test_redis_down_applies_the_policy_when_the_lease_runs_out).
        spec = _spec(FleetLimits(requests_per_minute=1000), admission_timeout=0.5, leases=None)
        async with _sampler(
            _config(),
            EmulatorApp(cache=PromptCache()),
            FleetAdmission(server.url, spec, on_event=events.append),
        ) as sampler:
            assert all(isinstance(_terminal(r), Completed) for r in await _run_all(sampler, 3))
            server.stop()
            start = trio.current_time()
            results = await _run_all(sampler, 5)
            elapsed = trio.current_time() - start
    terminals = [_terminal(r) for r in results]
    assert all(
        isinstance(t, Failed) and t.error.kind is SamplingErrorKind.FLEET_UNAVAILABLE
        for t in terminals
    )
    assert elapsed < spec.admission_timeout + 0.3
    assert [type(e) for e in events] == [LimiterDegraded]


async def test_redis_killed_mid_run_fail_open_loses_nothing() -> None:
    events: list[FleetEvent] = []
    with running_redis() as server:
        spec = _spec(
            FleetLimits(requests_per_minute=600, window_s=1.0),
            on_failure=FailurePolicy.FAIL_OPEN,
            fallback_share=1.0,
            admission_timeout=0.5,
        )
        script = {"x-emulator-script": json.dumps({"text": "a b c d", "delay_ms": 20})}
        async with (
            _sampler(
                _config(extra_headers=script),
                EmulatorApp(cache=PromptCache()),
                FleetAdmission(server.url, spec, on_event=events.append),
            ) as sampler,
            trio.open_nursery() as nursery,
        ):
            collected: list[list[object]] = []

            async def batch() -> None:
                collected.extend(await _run_all(sampler, 40))

            nursery.start_soon(batch)
            await trio.sleep(0.05)
            server.stop()  # while requests are in flight and others wait for admission
    assert len(collected) == 40
    assert all(isinstance(_terminal(r), Completed) for r in collected)
    assert [type(e) for e in events] == [LimiterDegraded]


async def test_fleet_retry_budget_caps_retries_in_an_outage(redis_server: RedisServer) -> None:
    # The primary answers 503 to everything; retries are limited fleet-wide to
    # max_tokens + ratio x first attempts = 2 + 0.1 x 20 = 4.
    outage = {"x-emulator-script": json.dumps({"faults": [{"type": "status", "status": 503}]})}
    spec = _spec(
        FleetLimits(requests_per_minute=10_000),
        retry_budget=RetryBudgetSpec(ratio=0.1, max_tokens=2),
    )
    policy = RetryPolicy(max_retries=5, base_delay=0.01, max_delay=0.02)
    async with _sampler(
        _config(extra_headers=outage, retry=policy),
        EmulatorApp(cache=PromptCache()),
        FleetAdmission(redis_server.url, spec),
    ) as sampler:
        results = await _run_all(sampler, 20)
    retries = sum(isinstance(e, Retrying) for r in results for e in r)
    assert all(isinstance(_terminal(r), Failed) for r in results)
    assert 1 <= retries <= 4
    spent = [
        t
        for t in (_terminal(r) for r in results)
        if isinstance(t, Failed) and "fleet retry budget" in t.error.message
    ]
    assert len(spent) >= 16


@pytest.mark.parametrize("backend", list(ApiBackend), ids=lambda b: b.value)
def test_the_gate_reserves_prompt_and_output(backend: ApiBackend) -> None:
    from trio_sampler.fleet import FleetGate
    from trio_sampler.fleet._limiter import FleetLimiter, redis_client
    from trio_sampler.wire import build_request

    spec = _spec(FleetLimits(tokens_per_minute=100_000))
    limiter = FleetLimiter(spec, redis_client("unix:///nonexistent.sock"))
    config = _config(backend=backend)
    wire = build_request(config.backend, REQUEST, config.build_options())
    cost = FleetGate(limiter).cost(wire, config)
    assert cost.output_tokens == 50
    assert cost.input_tokens == -(-len(wire.body) // 4)
    unlimited = ConversationRequest(items=[User("hello")])
    wire = build_request(config.backend, unlimited, config.build_options())
    assert FleetGate(limiter).cost(wire, config).output_tokens == config.default_max_output_tokens
