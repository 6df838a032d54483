"""Per-route fleet limits in a routing sampler (a real redis-server): each route's own
limiter is asked when the chain chooses a route, charged by the attempts that run on it,
and reconciled there.

"Another process" is a second limiter on the same spec and Redis (``open_limiter``), as
in ``test_fleet.py``. Redis decides on its own clock, so these tests run on the real one,
with windows scaled so a decision is never within a loaded machine's jitter of its bound.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from benchmarks.redis_server import RedisServer, running_redis
from trio_sampler import (
    Cancelled,
    Completed,
    ConversationRequest,
    Failed,
    Route,
    RoutingPolicy,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.actor import SamplerHandle
from trio_sampler.admission import AdmissionBusyError
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, EmulatorTransport, PromptCache
from trio_sampler.fleet import (
    Cost,
    FailurePolicy,
    FleetAdmission,
    FleetEvent,
    FleetLimiter,
    FleetLimits,
    LimiterDegraded,
    LimiterSpec,
    open_limiter,
    redis_client,
)

REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=20)
#: A decision bound far from every wait these tests make, either side.
MAX_WAIT = 0.3


def _spec(limits: FleetLimits, **kw: Any) -> LimiterSpec:
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    kw.setdefault("admission_timeout", 2.0)  # the suite shares two cores with other work
    return LimiterSpec(f"route-{uuid.uuid4().hex[:12]}", limits, **kw)


def _route(name: str, **kw: Any) -> Route:
    config = SamplerConfig(
        base_url="http://emulator.test/v1",
        model=f"{name}-model",
        api_key=f"sk-{name}-route-key-0123",
        retry=RetryPolicy(max_retries=0),
        **kw,
    )
    return Route(name, config)


def _routing(**kw: Any) -> RoutingPolicy:
    return RoutingPolicy(
        [_route("primary", **kw), _route("backup", **kw)], breaker=None, max_retry_wait_s=MAX_WAIT
    )


@asynccontextmanager
async def _sampler(
    admission: FleetAdmission,
    app: EmulatorApp | None = None,
    routing: RoutingPolicy | None = None,
) -> AsyncIterator[SamplerHandle]:
    routing = routing or _routing()
    async with (
        EmulatorTransport(app or EmulatorApp(cache=PromptCache())) as transport,
        open_sampler(
            routing.routes[0].config, routing=routing, transport=transport, admission=admission
        ) as sampler,
    ):
        yield sampler


async def _end(sampler: SamplerHandle, request: ConversationRequest = REQUEST) -> object:
    stream = await sampler.submit(request)
    events = [event async for event in stream]
    return events[-1]


async def _served(sampler: SamplerHandle) -> Completed:
    end = await _end(sampler)
    assert isinstance(end, Completed), end
    return end


def _skipped(end: Completed | Failed) -> dict[str, str]:
    assert end.metrics is not None
    return dict(end.metrics.skipped_routes)


async def _room(limiter: FleetLimiter, cost: Cost) -> bool:
    """Whether ``cost`` fits the limiter at once (reserving it if so)."""
    try:
        await limiter.acquire(cost, within=0.0, first_attempt=False)
    except AdmissionBusyError:
        return False
    return True


async def _next_room(limiter: FleetLimiter) -> float:
    """Seconds until one request fits the limiter (nothing reserved unless it fits now)."""
    try:
        await limiter.acquire(Cost(), within=0.0, first_attempt=False)
    except AdmissionBusyError as busy:
        assert busy.wait is not None
        return busy.wait
    return 0.0


async def test_a_route_spent_by_another_process_is_passed_over_until_it_refills(
    redis_server: RedisServer,
) -> None:
    # One request per 3 s on the primary's account: another process takes it.
    primary = _spec(FleetLimits(requests_per_minute=1, window_s=3.0))
    backup = _spec(FleetLimits(requests_per_minute=1000))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with open_limiter(primary, redis_server.url) as other, _sampler(admission) as sampler:
        await other.acquire(Cost())
        spent_at = trio.current_time()
        passed = await _served(sampler)
        stats = (await sampler.route_stats())["primary"]
        # The ask that passed the primary over reserved nothing: it refills on time.
        await trio.sleep_until(spent_at + 3.1)
        again = await _served(sampler)
    assert passed.route == "backup"
    reason = _skipped(passed)["primary"]
    assert reason.startswith(f"fleet rate limited ({primary.name!r}: no room for ")
    assert stats.admission == primary.name and stats.passed_over_admission == 1
    assert stats.attempts == 0
    assert again.route == "primary" and _skipped(again) == {}


async def _evalsha_calls(url: str) -> int:
    client = redis_client(url)
    async with client:
        stats = await client.info("commandstats")
    entry = stats.get("cmdstat_evalsha")
    return int(entry["calls"]) if isinstance(entry, dict) else 0


async def test_one_round_trip_per_route_asked(redis_server: RedisServer) -> None:
    # A request that passes the primary over costs one script call there (the refused
    # ask), one on the backup (its admission) and one to settle it: nothing more.
    primary = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=1000))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with open_limiter(primary, redis_server.url) as other, _sampler(admission) as sampler:
        await other.acquire(Cost())
        before = await _evalsha_calls(redis_server.url)
        end = await _served(sampler)
        after = await _evalsha_calls(redis_server.url)
    assert end.route == "backup"
    assert after - before == 3


async def test_another_sampler_spending_a_route_steers_this_one(
    redis_server: RedisServer,
) -> None:
    # Two samplers (two processes of a fleet) with the same per-route limits: what one
    # spends on the primary, the other routes around.
    primary = _spec(FleetLimits(requests_per_minute=2, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=1000))
    app = EmulatorApp(cache=PromptCache())

    def admission() -> FleetAdmission:
        return FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})

    async with _sampler(admission(), app) as one, _sampler(admission(), app) as other:
        spent = [(await _served(one)).route for _ in range(2)]
        end = await _served(other)
        stats = await other.route_stats()
    assert spent == ["primary", "primary"]
    assert end.route == "backup" and list(_skipped(end)) == ["primary"]
    assert stats["primary"].passed_over_admission == 1 and stats["backup"].completions == 1


async def test_the_last_route_waits_for_its_fleet_budget(redis_server: RedisServer) -> None:
    primary = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=1, window_s=2.0))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with (
        open_limiter(primary, redis_server.url) as first,
        open_limiter(backup, redis_server.url) as second,
        _sampler(admission) as sampler,
    ):
        await first.acquire(Cost())
        await second.acquire(Cost())
        start = trio.current_time()
        end = await _served(sampler)
        waited = trio.current_time() - start
    assert end.route == "backup"
    assert list(_skipped(end)) == ["primary"]
    assert 0.5 < waited < 4.0  # the backup's refill, about 2 s


async def test_the_last_routes_wait_respects_the_total_timeout(redis_server: RedisServer) -> None:
    primary = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    config = _route("primary").config
    async with (
        open_limiter(primary, redis_server.url) as first,
        open_limiter(backup, redis_server.url) as second,
        EmulatorTransport(EmulatorApp(cache=PromptCache())) as transport,
        open_sampler(
            attrs.evolve(config, timeouts=Timeouts(total=5.0)),
            routing=_routing(),
            transport=transport,
            admission=admission,
        ) as sampler,
    ):
        await first.acquire(Cost())
        await second.acquire(Cost())
        start = trio.current_time()
        end = await _end(sampler)
        elapsed = trio.current_time() - start
        assert await _room(second, Cost(0, 0, 0))  # nothing held by the refusal
    assert isinstance(end, Failed) and end.error.error_code == "fleet_rate_limited"
    assert list(_skipped(end)) == ["primary"]
    assert elapsed < 2.0  # refused at once: the wait would end past the deadline


async def test_a_request_waiting_on_the_last_route_holds_no_reservation(
    redis_server: RedisServer,
) -> None:
    primary = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=1, window_s=60.0))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with (
        open_limiter(primary, redis_server.url) as first,
        open_limiter(backup, redis_server.url) as second,
        _sampler(admission) as sampler,
    ):
        await first.acquire(Cost())
        await second.acquire(Cost())
        stream = await sampler.submit(REQUEST, request_id="waiting")
        with trio.fail_after(10):
            while (await sampler.route_stats())["primary"].passed_over_admission < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        # Queued on the backup (~60 s away), the request reserves nothing meanwhile: the
        # backup's next room stays ~60 s away (booked for its start, it was ~120 s).
        await trio.sleep(0.2)
        assert await sampler.is_active("waiting")
        assert await _next_room(second) <= 61
        await sampler.cancel("waiting")
        with trio.fail_after(5):
            events = [event async for event in stream]
        assert await _next_room(second) <= 61
    assert isinstance(events[-1], Cancelled)


async def test_per_route_limits_are_independent(redis_server: RedisServer) -> None:
    primary = _spec(FleetLimits(requests_per_minute=1000))
    backup = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with open_limiter(backup, redis_server.url) as other, _sampler(admission) as sampler:
        await other.acquire(Cost())  # the backup's account is spent: the primary's is not
        ends = [await _served(sampler) for _ in range(3)]
        stats = await sampler.route_stats()
    assert [end.route for end in ends] == ["primary"] * 3
    assert all(_skipped(end) == {} for end in ends)
    assert stats["backup"].admission == backup.name and stats["backup"].passed_over_admission == 0


async def test_routes_naming_one_spec_share_one_limiter(redis_server: RedisServer) -> None:
    # One account behind both routes: its budget is one, so the chain does not pass the
    # primary over for a route whose room is the same; the primary waits its refill.
    account = _spec(FleetLimits(requests_per_minute=1, window_s=2.0))
    admission = FleetAdmission(redis_server.url, routes={"primary": account, "backup": account})
    async with _sampler(admission) as sampler:
        first = await _served(sampler)
        start = trio.current_time()
        second = await _served(sampler)
        waited = trio.current_time() - start
        stats = await sampler.route_stats()
    assert [first.route, second.route] == ["primary", "primary"]
    assert _skipped(second) == {} and 0.5 < waited < 4.0
    assert stats["primary"].admission == stats["backup"].admission == account.name


async def test_a_route_without_a_limiter_is_not_limited_by_the_fleet(
    redis_server: RedisServer,
) -> None:
    # The default spec limits every route not named; "backup" is named with None: free.
    default = _spec(FleetLimits(requests_per_minute=1, window_s=600.0))
    admission = FleetAdmission(redis_server.url, default, routes={"backup": None})
    async with open_limiter(default, redis_server.url) as other, _sampler(admission) as sampler:
        await other.acquire(Cost())
        ends = [await _served(sampler) for _ in range(3)]
        stats = await sampler.route_stats()
    assert [end.route for end in ends] == ["backup"] * 3
    assert all(list(_skipped(end)) == ["primary"] for end in ends)
    assert stats["primary"].admission == default.name and stats["backup"].admission is None
    assert stats["primary"].passed_over_admission == 3


async def test_in_flight_slots_and_a_shared_retry_after_pass_a_route_over(
    redis_server: RedisServer,
) -> None:
    slots = _spec(FleetLimits(max_in_flight=1))
    waiting = _spec(FleetLimits(requests_per_minute=1000))
    backup = _spec(FleetLimits(requests_per_minute=1000))
    async with (
        open_limiter(slots, redis_server.url) as holder,
        open_limiter(waiting, redis_server.url) as told,
    ):
        await holder.acquire(Cost())  # holds the one slot
        await told.note_retry_after(120.0)  # a 429 another process saw
        reasons = []
        for spec in (slots, waiting):
            admission = FleetAdmission(redis_server.url, routes={"primary": spec, "backup": backup})
            async with _sampler(admission) as sampler:
                end = await _served(sampler)
            assert end.route == "backup"
            reasons.append(_skipped(end)["primary"])
    assert reasons[0] == f"fleet rate limited ({slots.name!r}: all 1 in-flight slots taken)"
    assert reasons[1].startswith(f"fleet rate limited ({waiting.name!r}: a shared Retry-After")


async def test_a_request_too_large_for_a_routes_limit_goes_to_a_larger_one(
    redis_server: RedisServer,
) -> None:
    small = _spec(FleetLimits(output_tokens_per_minute=10))
    large = _spec(FleetLimits(output_tokens_per_minute=10_000))
    admission = FleetAdmission(redis_server.url, routes={"primary": small, "backup": large})
    async with _sampler(admission) as sampler:
        end = await _served(sampler)  # 20 output tokens: more than the primary's burst
    assert end.route == "backup"
    assert _skipped(end)["primary"].startswith(f"fleet limit too small ({small.name!r}:")
    # As the last route, the small limit refuses as before: the caller's to fix.
    only_small = FleetAdmission(redis_server.url, routes={"primary": small, "backup": small})
    async with _sampler(only_small) as sampler:
        refused = await _end(sampler)
    assert isinstance(refused, Failed) and refused.error.error_code == "exceeds_fleet_limit"


async def test_each_attempt_is_charged_and_reconciled_on_its_own_route(
    redis_server: RedisServer,
) -> None:
    # The primary fails (503) and the backup serves: the primary's limiter holds one
    # request and its token reservation (no usage reported), the backup's one request and
    # the usage the response reported. Windows of 10 minutes: nothing refills meanwhile.
    def limits() -> FleetLimits:
        return FleetLimits(requests_per_minute=10, tokens_per_minute=1000, window_s=600.0)

    primary, backup = _spec(limits()), _spec(limits())
    app = EmulatorApp(
        cache=PromptCache(),
        models={"primary-model": {"faults": [{"type": "status", "status": 503}]}},
    )
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with _sampler(admission, app) as sampler:
        end = await _served(sampler)
        stats = await sampler.route_stats()
    assert end.route == "backup" and end.response.usage is not None
    used = end.response.usage.input_tokens + end.response.usage.output_tokens
    assert end.metrics is not None
    assert [attempt.route for attempt in end.metrics.attempts] == ["primary", "backup"]
    assert (stats["primary"].attempts, stats["backup"].completions) == (1, 1)
    async with (
        open_limiter(primary, redis_server.url) as first,
        open_limiter(backup, redis_server.url) as second,
    ):
        # Nine requests of ten are left on each account.
        assert not await _room(first, Cost(10, 0, 0)) and not await _room(second, Cost(10, 0, 0))
        # The backup holds exactly the usage reported: the rest of the burst fits, one more not.
        assert not await _room(second, Cost(0, 1000 - used + 1, 0))
        assert await _room(second, Cost(0, 1000 - used, 0))
        # The primary still holds its reservation (prompt estimate + 20 output tokens).
        assert not await _room(first, Cost(0, 1000 - 20 + 1, 0))


async def test_hedges_charge_the_route_they_run_on(redis_server: RedisServer) -> None:
    from trio_sampler.routing import HedgePolicy

    slow = {"x-emulator-script": json.dumps({"text": "a b c", "first_token_ms": 400})}
    primary = _spec(FleetLimits(requests_per_minute=10, window_s=600.0))
    backup = _spec(FleetLimits(requests_per_minute=10, window_s=600.0))
    routing = RoutingPolicy(
        [_route("primary", extra_headers=slow), _route("backup")],
        breaker=None,
        max_retry_wait_s=MAX_WAIT,
        hedge=HedgePolicy(delay_s=0.1, next_route=True),
    )
    admission = FleetAdmission(redis_server.url, routes={"primary": primary, "backup": backup})
    async with _sampler(admission, routing=routing) as sampler:
        end = await _served(sampler)
    assert end.route == "backup"
    async with (
        open_limiter(primary, redis_server.url) as first,
        open_limiter(backup, redis_server.url) as second,
    ):
        # One request on each account: the primary's attempt and the backup's hedge.
        assert not await _room(first, Cost(10, 0, 0)) and await _room(first, Cost(9, 0, 0))
        assert not await _room(second, Cost(10, 0, 0)) and await _room(second, Cost(9, 0, 0))


async def test_redis_down_each_route_applies_its_own_failure_policy() -> None:
    # The primary's account fails closed, the backup's fails open: with Redis gone the
    # primary is passed over (nothing sent to it) and the backup admits on its local floor.
    events: list[FleetEvent] = []
    primary = _spec(FleetLimits(requests_per_minute=1000), admission_timeout=0.5)
    backup = _spec(
        FleetLimits(requests_per_minute=1000),
        on_failure=FailurePolicy.FAIL_OPEN,
        fallback_share=0.5,
        admission_timeout=0.5,
    )
    app = EmulatorApp(cache=PromptCache())
    with running_redis() as server:
        admission = FleetAdmission(
            server.url, routes={"primary": primary, "backup": backup}, on_event=events.append
        )
        async with _sampler(admission, app) as sampler:
            assert (await _served(sampler)).route == "primary"
            server.stop()
            ends = [await _served(sampler) for _ in range(2)]
    assert [end.route for end in ends] == ["backup", "backup"]
    assert all(_skipped(end)["primary"].startswith("fleet unavailable (") for end in ends)
    degraded = [e for e in events if isinstance(e, LimiterDegraded)]
    assert len(degraded) == len(events) == 2
    assert sorted((e.limiter, e.routes, e.policy) for e in degraded) == sorted(
        [
            (primary.name, ("primary",), FailurePolicy.FAIL_CLOSED),
            (backup.name, ("backup",), FailurePolicy.FAIL_OPEN),
        ]
    )
    assert sum(1 for entry in app.requests() if entry["body"]["model"] == "primary-model") == 1


# -- bad arguments ---------------------------------------------------------------------


def _a_spec(name: str = "acct", rpm: float = 10) -> LimiterSpec:
    return LimiterSpec(name, FleetLimits(requests_per_minute=rpm), on_failure="fail_closed")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, r"limits nothing: give spec=LimiterSpec"),
        ({"routes": {"primary": None}}, ValueError, "limits nothing"),
        ({"routes": [("primary", _a_spec())]}, TypeError, r"maps route names to their LimiterSpec"),
        ({"routes": {"": _a_spec()}}, ValueError, "keyed by route names"),
        ({"routes": {"primary": "acct"}}, TypeError, r"routes\['primary'\] must be a LimiterSpec"),
        ({"spec": "acct"}, TypeError, "spec must be a LimiterSpec"),
        (
            {"routes": {"primary": _a_spec(rpm=10), "backup": _a_spec(rpm=20)}},
            ValueError,
            r"routes\['primary'\] and routes\['backup'\] both name the limiter 'acct' with "
            r"different settings",
        ),
        (
            {"spec": _a_spec(rpm=10), "routes": {"backup": _a_spec(rpm=20)}},
            ValueError,
            r"spec= and routes\['backup'\] both name the limiter 'acct'",
        ),
    ],
)
def test_bad_fleet_admissions_fail_at_construction(
    kwargs: Mapping[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        FleetAdmission("unix:///nowhere.sock", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "routing", "match"),
    [
        (
            {"routes": {"primray": _a_spec()}},
            True,
            r"names the route 'primray', which the sampler's routing policy does not have; "
            r"its routes are 'primary', 'backup'",
        ),
        ({"routes": {"primary": _a_spec()}}, False, r"this sampler has no routing"),
        (
            {"spec": _a_spec(), "share_breakers": {"fallback"}},
            True,
            "names the route 'fallback'",
        ),
        ({"spec": _a_spec(), "share_breakers": {"primary"}}, False, "has no routing"),
        (
            {"routes": {"primary": _a_spec(), "backup": None}, "share_breakers": {"backup"}},
            True,
            r"share_breakers names 'backup', which the fleet does not limit",
        ),
    ],
)
def test_route_names_are_checked_when_the_sampler_is_opened(
    kwargs: Mapping[str, Any], routing: bool, match: str
) -> None:
    admission = FleetAdmission("unix:///nowhere.sock", **kwargs)
    config = _route("primary").config
    with pytest.raises(ValueError, match=match):
        open_sampler(config, admission=admission, routing=_routing() if routing else None)


def test_which_limiter_a_route_uses() -> None:
    default, own = _a_spec("default"), _a_spec("own")
    admission = FleetAdmission("unix:///x", default, routes={"own": own, "free": None})
    assert admission.limiter_for("own") is own
    assert admission.limiter_for("free") is None
    assert admission.limiter_for("other") is default and admission.limiter_for(None) is default
    assert FleetAdmission("unix:///x", routes={"own": own}).limiter_for("other") is None
