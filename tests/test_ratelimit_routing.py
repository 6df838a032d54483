"""Rate limits in a fallback chain: a route held by a 429, or out of budget by its
headers, is passed over while the next route has room, and taken again after its reset
(emulator in process, trio's mock clock)."""

from __future__ import annotations

from typing import Any

import trio

from trio_sampler import (
    Completed,
    ConversationRequest,
    Route,
    RoutingPolicy,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.config import RetryPolicy
from trio_sampler.emulator import EmulatorApp, EmulatorTransport, PromptCache, RateLimits

REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=50)


def _route(name: str) -> Route:
    config = SamplerConfig(
        base_url="http://emulator.test/v1",
        model=f"{name}-model",
        api_key=f"sk-{name}-route-key-0123",
        retry=RetryPolicy(max_retries=2, base_delay=0.5, max_delay=1.0, jitter=0.0),
    )
    return Route(name, config)


def _served(events: list[Any]) -> Completed:
    end = events[-1]
    assert isinstance(end, Completed), end
    return end


def _sent_to(app: EmulatorApp, model: str) -> int:
    return sum(1 for entry in app.requests() if entry["body"]["model"] == model)


async def test_a_429_sends_the_chain_to_the_next_route_until_retry_after(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = EmulatorApp(
        cache=PromptCache(),
        models={
            "primary-model": {
                "faults": [{"type": "status", "status": 429, "retry_after": 30, "times": 1}]
            }
        },
    )
    routing = RoutingPolicy([_route("primary"), _route("fallback")])
    served_by: list[tuple[float, str | None, tuple[tuple[str, str], ...]]] = []
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(routing.routes[0].config, routing=routing, transport=transport) as sampler,
    ):
        start = trio.current_time()
        for at in (0, 5, 10, 20, 31, 35):
            await trio.sleep_until(start + at)
            stream = await sampler.submit(REQUEST)
            end = _served([event async for event in stream])
            assert end.metrics is not None
            served_by.append((at, end.route, end.metrics.skipped_routes))
    routes = [(at, route) for at, route, _ in served_by]
    assert routes == [
        (0, "fallback"),  # the 429 (Retry-After 30 s > max_retry_wait_s): on at once
        (5, "fallback"),
        (10, "fallback"),
        (20, "fallback"),
        (31, "primary"),  # the hold is over: the primary is preferred again
        (35, "primary"),
    ]
    for when, _, skipped in served_by[1:4]:
        assert [name for name, _ in skipped] == ["primary"], when
        assert "rate limited (a 429)" in skipped[0][1]
    # The primary saw the one 429 and then nothing until its Retry-After had passed.
    assert _sent_to(app, "primary-model") == 3


async def test_a_route_out_of_budget_yields_to_the_next_one_with_room(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Two requests a minute per key: the primary's headers say its budget is spent for
    # the next 30 s, the fallback (its own key) has room: no 429 anywhere.
    app = EmulatorApp(cache=PromptCache(), rate_limits=RateLimits(requests_per_minute=2))
    routing = RoutingPolicy([_route("primary"), _route("fallback")])
    routes: list[str | None] = []
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(routing.routes[0].config, routing=routing, transport=transport) as sampler,
    ):
        for _ in range(4):
            stream = await sampler.submit(REQUEST)
            routes.append(_served([event async for event in stream]).route)
        # Both budgets spent: the last route waits for its refill instead of failing.
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        end = _served([event async for event in stream])
        waited = trio.current_time() - start
    assert routes == ["primary", "primary", "fallback", "fallback"]
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
    assert end.metrics is not None and end.metrics.rate_limit_wait_ms > 0
    # One request of 2 a minute refills in 30 s (31 with the reset counted a second late).
    assert 0 < waited <= 31.5
