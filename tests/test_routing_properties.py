"""Property test of the contract across routes: random fault schedules on each route of a
chain × random cancel times × hedging on or off × several concurrent requests, under the
mock clock. Every request ends with exactly one terminal, last; what the consumer folds is
what the terminal says; every HTTP attempt is accounted."""

from __future__ import annotations

import re

import httpx2
import orjson
import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_stream, make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_actor_properties import FAULTS, fault_reply, run_plans

from trio_sampler import Cancelled, Completed, Failed, Route, RoutingPolicy, collect, open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.routing import BreakerPolicy, HedgePolicy, RouteCapabilities

TERMINALS = (Completed, Failed, Cancelled)
ROUTES = ("a", "b", "c")
SCHEDULE = st.lists(st.tuples(FAULTS, st.integers(0, 3)), max_size=3)
PLAN = st.tuples(st.tuples(SCHEDULE, SCHEDULE, SCHEDULE), st.one_of(st.none(), st.floats(0, 90)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(PLAN, min_size=1, max_size=4),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_exactly_one_terminal_along_a_chain(
    plans: list[tuple[tuple[list[tuple[str, int]], ...], float | None]],
    hedging: bool,
    continuing: bool,
    seed: int,
) -> None:
    trio.run(
        _run, plans, hedging, continuing, seed, clock=trio.testing.MockClock(autojump_threshold=0)
    )


async def _run(
    plans: list[tuple[tuple[list[tuple[str, int]], ...], float | None]],
    hedging: bool,
    continuing: bool,
    seed: int,
) -> None:
    attempts: dict[tuple[int, str], int] = {}
    sent: dict[int, int] = {}

    def script(request: httpx2.Request, _: int) -> Reply:
        body = orjson.loads(request.content)
        user = next(m for m in body["messages"] if m["role"] == "user")
        index = int(user["content"].removeprefix("request "))
        host = request.url.host.removesuffix(".test")
        attempt = attempts.get((index, host), 0)
        attempts[(index, host)] = attempt + 1
        sent[index] = sent.get(index, 0) + 1
        schedule = plans[index][0][ROUTES.index(host)]
        if attempt < len(schedule):
            kind, after = schedule[attempt]
            return fault_reply(kind, after)
        text = f"final {index} from {host}"
        return Reply(chunks=chat_stream(*re.findall(r"\S+\s*", text), pause=1.0))

    def config(host: str) -> object:
        return make_config(
            base_url=f"http://{host}.test/v1",
            retry=RetryPolicy(max_retries=1, base_delay=1.0, max_delay=2.0),
            timeouts=Timeouts(first_token=20.0, idle=10.0, response_headers=20.0),
        )

    routing = RoutingPolicy(
        [
            Route(host, config(host), RouteCapabilities(accepts_prefill=host == "c"))  # type: ignore[arg-type]
            for host in ROUTES
        ],
        breaker=BreakerPolicy(consecutive_failures=3, open_s=5.0),
        hedge=HedgePolicy(delay_s=2.0) if hedging else None,
        continue_by_prefill=continuing,
    )
    transport = ScriptedTransport(script)
    async with open_sampler(
        routing.routes[0].config, routing=routing, transport=transport, seed=seed
    ) as sampler:
        results = await run_plans(sampler, [cancel_at for _, cancel_at in plans])

    assert transport.closed_bodies == transport.opened_bodies
    for index, events in results.items():
        terminals = [e for e in events if isinstance(e, TERMINALS)]
        assert len(terminals) == 1, events
        terminal = events[-1]
        assert terminal is terminals[0]
        assert terminal.metrics is not None
        records = terminal.metrics.attempts
        if isinstance(terminal, Cancelled):
            assert len(records) >= sent.get(index, 0)
        else:
            # Every HTTP attempt has its record, with its route.
            assert len(records) == sent.get(index, 0)
            assert {r.route for r in records} <= set(ROUTES)
        if isinstance(terminal, Completed):
            assert terminal.route in ROUTES
            assert terminal.response.text.endswith(f"from {terminal.route}")
            # What the consumer folds from the events is the answer, continuation or not.
            assert collect(events).text == terminal.response.text
            completed = [r for r in records if r.outcome.value == "completed"]
            assert len(completed) == 1 and completed[0].route == terminal.route
