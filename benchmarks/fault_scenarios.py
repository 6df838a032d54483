"""The routing fault scenarios: our HTTP attempts beside the reference client's.

Each scenario of ``tests/test_routing_fault_matrix.py`` (a primary route misbehaving one
way, a healthy fallback route, the routes configured as there: two retries a route, 0.5 s
then 1 s apart, a 10 s first-token and response-headers bound, a 5 s idle bound) runs
through our sampler against the in-process emulator under trio's mock clock, so the
minute-long ones take no real time. Its HTTP attempts are counted (one record per attempt
in ``RequestMetrics.attempts``), and whether the caller got the answer.

Beside it: the attempts of the reference client, Grok Build's Rust sampler
(https://github.com/xai-org/grok-build, ``crates/codegen/xai-grok-sampler``), for the same
primary, derived from its documented retry rules (:data:`REFERENCE_RULES`, each with the
file it comes from) by a small model (:func:`reference_attempts`). The reference talks to
one endpoint: it has no fallback route and no breaker, so it retries the primary until its
budget (``max_retries`` 5, the value its shell passes; the attempt reaching it is fatal)
or its separate 429 threshold (2) ends the request. Its backoff is taken at the nominal
value (its ±20 % jitter left out).

A row passes when our sampler ends as the scenario says it should (an answer, or the
clean error where that is right) and makes no more attempts than the reference; a row
where we make more attempts is marked ``recovers`` when the reference fails and we
answer (the extra attempt is the fallback that serves), else ``MORE``.

    python benchmarks/fault_scenarios.py [--json benchmarks/results/fault_scenarios.json]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio
import trio.testing

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results
from trio_sampler import (
    ApiBackend,
    Completed,
    ConversationRequest,
    Failed,
    Route,
    RoutingPolicy,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, EmulatorTransport
from trio_sampler.routing import BreakerPolicy, RouteCapabilities

TEXT = "The quick brown fox jumps over the lazy dog, twice over, for good measure."
REQUEST = ConversationRequest(items=[User("tell me")])
#: The fault matrix's route settings.
RETRY = RetryPolicy(max_retries=2, base_delay=0.5, max_delay=1.0, jitter=0.0)
TIMEOUTS = Timeouts(first_token=10.0, idle=5.0, response_headers=10.0)

# -- the reference client's rules ----------------------------------------------------------

_REPO = "https://github.com/xai-org/grok-build/blob/19d42e3/crates/codegen/xai-grok-sampler/src"
#: ``max_retries`` as the reference's shell starts its sampler actor (configured, else 5).
REFERENCE_MAX_RETRIES = 5
#: Its separate cap on 429s (``RATE_LIMIT_RETRY_THRESHOLD``): one retry.
REFERENCE_429_THRESHOLD = 2
#: Its idle timeout (``DEFAULT_IDLE_TIMEOUT_SECS``); nothing bounds the wait for headers.
REFERENCE_IDLE_S = 300.0

#: What the reference does with each kind of failure, in the order ``classify_error``
#: looks (rule, decision, where it is written).
REFERENCE_RULES: tuple[tuple[str, str, str], ...] = (
    ("auth (401)", "fail, to the session", f"{_REPO}/retry.rs (classify_error, first rule)"),
    ("context length (any status)", "fatal: vetoed", f"{_REPO}/retry.rs (is_retry_vetoed)"),
    (
        "429",
        "retry after Retry-After exactly, else 2 s doubling; fatal once the retry count "
        "reaches min(max_retries, 2)",
        f"{_REPO}/retry.rs (RATE_LIMIT_RETRY_THRESHOLD)",
    ),
    (
        "5xx (not 525/526), transport error, broken stream, empty answer",
        "retry after min(Retry-After, 30 s) or 2 s doubling to 30 s; fatal once the "
        "retry count reaches max_retries",
        f"{_REPO}/retry.rs (retry_backoff_with_jitter, DEFAULT_MAX_RETRIES)",
    ),
    (
        "unparseable stream frame",
        "fatal (Serialization, never retried)",
        f"{_REPO}/stream/messages.rs",
    ),
    ("400, 403, 404, 422 (content filter)", "fatal", f"{_REPO}/retry.rs (the last rule)"),
    (
        "a stall (no chunk for the idle timeout)",
        "fatal (IdleTimeout, never retried); 300 s by default",
        f"{_REPO}/actor/request_task.rs (DEFAULT_IDLE_TIMEOUT_SECS)",
    ),
    (
        "no response headers",
        "waits without bound (only a 10 s connect timeout)",
        f"{_REPO}/client.rs",
    ),
    ("max_retries", "5 as its shell starts the actor", "crates/codegen/xai-grok-shell/src"),
)


@attrs.frozen
class Answer:
    """What the primary does to one attempt (for the reference model)."""

    kind: str  # ok, 429, 5xx, transport, broken, malformed, context, filtered, auth,
    # silent, slow (first token after ``delay``), stall
    retry_after: float | None = None
    delay: float = 0.0


#: The primary's answer to attempt ``n`` (0-based) sent at time ``t``.
Schedule = Callable[[int, float], Answer]


def _backoff(next_count: int) -> float:
    """The reference's ``retry_backoff_with_jitter(n)`` at its nominal value."""
    return min(2.0 * 2.0 ** (max(next_count, 1) - 1), 30.0)


def _decide(answer: Answer, retries: int) -> float | None:
    """The reference's decision for a failed attempt: the wait before the next, or None
    (the request ends with the error)."""
    following = retries + 1
    if answer.kind in ("auth", "context", "malformed", "filtered", "stall"):
        return None
    if answer.kind == "429":
        if following >= min(REFERENCE_MAX_RETRIES, REFERENCE_429_THRESHOLD):
            return None
        return answer.retry_after if answer.retry_after is not None else _backoff(following)
    if following >= REFERENCE_MAX_RETRIES:  # 5xx, transport, a broken stream
        return None
    if answer.retry_after is not None:
        return min(answer.retry_after, 30.0)
    return _backoff(following)


def reference_attempts(schedule: Schedule, start: float = 0.0) -> tuple[int, bool, float]:
    """One request of the reference client: (HTTP attempts, answered, when it ended)."""
    now, retries, attempts = start, 0, 0
    while True:
        answer = schedule(attempts, now)
        attempts += 1
        if answer.kind == "ok":
            return attempts, True, now + answer.delay
        if answer.kind == "silent":
            return attempts, False, math.inf  # no headers, no bound: it waits
        if answer.kind == "slow":
            if answer.delay < REFERENCE_IDLE_S:
                return attempts, True, now + answer.delay
            return attempts, False, now + REFERENCE_IDLE_S
        if answer.kind == "stall":
            return attempts, False, now + REFERENCE_IDLE_S
        wait = _decide(answer, retries)
        if wait is None:
            return attempts, False, now + answer.delay
        retries += 1
        now += answer.delay + wait


#: One request of the reference, or several: (HTTP attempts, answered, when it ended).
ReferenceRun = Callable[[], tuple[int, bool, float]]


def _every_time(answer: Answer) -> Schedule:
    return lambda _n, _t: answer


def _always(answer: Answer) -> ReferenceRun:
    """One request; the primary answers ``answer`` every time."""
    return lambda: reference_attempts(_every_time(answer))


def _first(answer: Answer) -> ReferenceRun:
    """One request; the primary answers ``answer`` once, then well."""
    return lambda: reference_attempts(lambda n, _t: answer if n == 0 else Answer("ok"))


# -- our sampler -----------------------------------------------------------------------------


class _ByHost(httpx2.AsyncBaseTransport):
    """Each request to the transport of its host (``primary.test``, ``fallback.test``),
    after ``round_trip`` seconds on the clock."""

    def __init__(self, round_trip: float = 0.0, **by_host: httpx2.AsyncBaseTransport) -> None:
        self.by_host = by_host
        self.round_trip = round_trip
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> _ByHost:
        for transport in {id(t): t for t in self.by_host.values()}.values():
            await self._stack.enter_async_context(transport)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.round_trip:
            await trio.sleep(self.round_trip)
        return await self.by_host[request.url.host.removesuffix(".test")].handle_async_request(
            request
        )


class _Reset(httpx2.AsyncBaseTransport):
    """A server that reads the request and closes the connection unanswered."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await trio.lowlevel.checkpoint()
        raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")


def _route(
    name: str,
    backend: ApiBackend = ApiBackend.CHAT_COMPLETIONS,
    window: int | None = None,
    timeouts: Timeouts = TIMEOUTS,
) -> Route:
    config = SamplerConfig(
        base_url=f"http://{name}.test/v1",
        backend=backend,
        model=name,
        api_key=f"sk-{name}-route-key-0123",
        retry=RETRY,
        timeouts=timeouts,
    )
    return Route(name, config, RouteCapabilities(context_window=window))


@attrs.frozen
class Ours:
    attempts: int
    answered: bool
    requests: int


async def _submit_all(
    routing: RoutingPolicy,
    transport: httpx2.AsyncBaseTransport,
    app: EmulatorApp | None,
    every: list[float],
) -> Ours:
    """Submit one request at each time of ``every`` (after the previous ended)."""
    ends: list[Completed | Failed] = []
    async with transport:
        config = routing.routes[0].config
        async with open_sampler(config, routing=routing, transport=transport) as sampler:
            if app is not None:
                app.start_clock()
            start = trio.current_time()
            for at in every:
                await trio.sleep_until(start + at)
                stream = await sampler.submit(REQUEST)
                async with stream:
                    async for event in stream:
                        if isinstance(event, Completed | Failed):
                            ends.append(event)
    attempts = sum(len(end.metrics.attempts) for end in ends if end.metrics is not None)
    answered = all(
        isinstance(end, Completed) and end.response.text.startswith(TEXT[:10]) for end in ends
    )
    return Ours(attempts, answered and len(ends) == len(every), len(ends))


def _emulator(**primary: Any) -> tuple[EmulatorApp, EmulatorTransport]:
    table = {name: {"text": TEXT, "chunk_chars": 6} for name in ("primary", "same", "fallback")}
    table["primary"].update(primary)
    app = EmulatorApp(models=table)
    return app, EmulatorTransport(app)


def _two_routes(
    primary: dict[str, Any],
    *,
    routes: list[Route] | None = None,
    breaker: BreakerPolicy | None = None,
    every: list[float] | None = None,
    round_trip: float = 0.0,
) -> Callable[[], Awaitable[Ours]]:
    async def run() -> Ours:
        app, emulator = _emulator(**primary)
        chain = routes or [_route("primary"), _route("fallback")]
        kwargs: dict[str, Any] = {} if breaker is None else {"breaker": breaker}
        transport = _ByHost(round_trip, primary=emulator, same=emulator, fallback=emulator)
        return await _submit_all(RoutingPolicy(chain, **kwargs), transport, app, every or [0.0])

    return run


async def _reset_before_headers() -> Ours:
    app, emulator = _emulator()
    transport = _ByHost(primary=_Reset(), fallback=emulator)
    routing = RoutingPolicy([_route("primary"), _route("fallback")])
    return await _submit_all(routing, transport, app, [0.0])


def _status(status: int, **fault: Any) -> dict[str, Any]:
    return {"faults": [{"type": "status", "status": status, **fault}]}


CONTEXT_BODY = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}
FILTER_BODY = {
    "error": {
        "message": "Your request was rejected by the safety system.",
        "type": "invalid_request_error",
        "code": "content_policy_violation",
    }
}
OUTAGE_S = 60.0
#: The minute-long outage: 20 requests, one every 4 s (each after the previous ended).
EVERY_4_S = [4.0 * n for n in range(20)]


def _outage_schedule(round_trip: float) -> ReferenceRun:
    """The reference over the minute-long outage: its 20 requests in a row."""

    def run() -> tuple[int, bool, float]:
        def primary(_n: int, t: float) -> Answer:
            return Answer("5xx" if t < OUTAGE_S else "ok", delay=round_trip)

        total, answered, now = 0, True, 0.0
        for at in EVERY_4_S:
            attempts, ok, ended = reference_attempts(primary, max(at, now))
            total, answered, now = total + attempts, answered and ok, ended
        return total, answered, now

    return run


@attrs.frozen
class Scenario:
    name: str
    ours: Callable[[], Awaitable[Ours]]
    #: The reference client's run of the same requests.
    reference: ReferenceRun
    #: Our sampler should answer (False: the clean error is right).
    should_answer: bool = True


def _slow(seconds: float) -> ReferenceRun:
    return _always(Answer("slow", delay=seconds))


SCENARIOS = (
    Scenario(
        "429, Retry-After 20 s, every time",
        _two_routes(_status(429, retry_after=20)),
        _always(Answer("429", retry_after=20.0)),
    ),
    Scenario(
        "429 once, Retry-After 1 s",
        _two_routes(_status(429, retry_after=1, times=1)),
        _first(Answer("429", retry_after=1.0)),
    ),
    Scenario(
        "429 every time, no Retry-After",
        _two_routes(_status(429)),
        _always(Answer("429")),
    ),
    Scenario("500 once", _two_routes(_status(500, times=1)), _first(Answer("5xx"))),
    Scenario(
        "503 every time, healthy fallback (3 requests)",
        _two_routes(
            _status(503),
            routes=[_route("primary"), _route("fallback", ApiBackend.MESSAGES)],
            breaker=BreakerPolicy(consecutive_failures=5),
            every=[0.0, 0.0, 0.0],
        ),
        lambda: _several(_every_time(Answer("5xx")), 3),
    ),
    Scenario(
        "503 every time, no fallback",
        lambda: _alone(_status(503)),
        _always(Answer("5xx")),
        should_answer=False,
    ),
    Scenario(
        "stream cut mid-answer, every time",
        _two_routes({"faults": [{"type": "drop", "after_events": 3}]}),
        _always(Answer("broken")),
    ),
    Scenario(
        "one malformed chunk",
        _two_routes({"faults": [{"type": "malformed", "after_events": 3, "times": 1}]}),
        _first(Answer("malformed")),
    ),
    Scenario(
        "context length, a larger window next",
        _two_routes(
            _status(400, body=CONTEXT_BODY),
            routes=[
                _route("primary", window=8192),
                _route("same", window=8192),
                _route("fallback", window=200_000),
            ],
        ),
        _always(Answer("context")),
    ),
    Scenario(
        "context length, no larger window",
        _two_routes(
            _status(400, body=CONTEXT_BODY),
            routes=[_route("primary", window=8192), _route("fallback", window=8192)],
        ),
        _always(Answer("context")),
        should_answer=False,
    ),
    Scenario(
        "content filter (400)",
        _two_routes(_status(400, body=FILTER_BODY)),
        _always(Answer("filtered")),
        should_answer=False,
    ),
    Scenario(
        "content-filter stop (an answer)",
        _two_routes({"stop": "content_filter"}),
        _always(Answer("ok")),
    ),
    Scenario("auth failure (401)", _two_routes(_status(401)), _always(Answer("auth")), False),
    Scenario("reset before headers", _reset_before_headers, _always(Answer("transport"))),
    Scenario(
        "silent primary", _two_routes({"faults": [{"type": "silent"}]}), _always(Answer("silent"))
    ),
    Scenario("first token after 20 s", _two_routes({"first_token_ms": 20_000}), _slow(20.0)),
    Scenario(  # the same with our default timeouts (first token: 300 s)
        "first token after 20 s, default Timeouts()",
        _two_routes(
            {"first_token_ms": 20_000},
            routes=[_route("primary", timeouts=Timeouts()), _route("fallback")],
        ),
        _slow(20.0),
    ),
    Scenario(
        "stall mid-stream (600 s)",
        _two_routes({"faults": [{"type": "stall", "after_events": 3, "seconds": 600}]}),
        _always(Answer("stall")),
    ),
    Scenario(
        "primary down a minute, 20 ms round trip (20 requests)",
        _two_routes(
            {"faults": [{"type": "status", "status": 503, "until_s": OUTAGE_S}]},
            every=EVERY_4_S,
            round_trip=0.02,
        ),
        _outage_schedule(0.02),
    ),
)


def _several(schedule: Schedule, count: int) -> tuple[int, bool, float]:
    total, answered, now = 0, True, 0.0
    for _ in range(count):
        attempts, ok, now = reference_attempts(schedule, now)
        total, answered = total + attempts, answered and ok
    return total, answered, now


async def _alone(primary: dict[str, Any]) -> Ours:
    app, emulator = _emulator(**primary)
    transport = _ByHost(primary=emulator)
    return await _submit_all(RoutingPolicy([_route("primary")]), transport, app, [0.0])


def _run_ours(scenario: Scenario) -> Ours:
    async def main() -> Ours:
        with trio.fail_after(3600):  # on the mock clock
            return await scenario.ours()

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _reference(scenario: Scenario) -> tuple[int, bool]:
    attempts, answered, _ = scenario.reference()
    return attempts, answered


def _verdict(ours: Ours, scenario: Scenario, reference: tuple[int, bool]) -> str:
    if ours.answered != scenario.should_answer:
        return "WRONG END"
    if ours.attempts <= reference[0]:
        return "pass"
    if ours.answered and not reference[1]:
        return "recovers"
    return "MORE"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="benchmarks/results/fault_scenarios.json")
    args = parser.parse_args()
    rows = []
    header = f"{'scenario':<54} {'ours':>5} {'ref':>5}  {'ours ends':<10} {'ref ends':<10} verdict"
    print(header)
    print("-" * len(header))
    for scenario in SCENARIOS:
        ours = _run_ours(scenario)
        reference = _reference(scenario)
        verdict = _verdict(ours, scenario, reference)
        ends = ("answered" if ours.answered else "error", "answered" if reference[1] else "error")
        print(
            f"{scenario.name:<54} {ours.attempts:>5} {reference[0]:>5}  {ends[0]:<10} "
            f"{ends[1]:<10} {verdict}"
        )
        rows.append(
            {
                "scenario": scenario.name,
                "ours_attempts": ours.attempts,
                "reference_attempts": reference[0],
                "ours_answered": ours.answered,
                "reference_answered": reference[1],
                "should_answer": scenario.should_answer,
                "verdict": verdict,
            }
        )
    write_results(
        args.json,
        {
            "python": platform.python_version(),
            "reference": {
                "source": "https://github.com/xai-org/grok-build (19d42e3)",
                "max_retries": REFERENCE_MAX_RETRIES,
                "rate_limit_threshold": REFERENCE_429_THRESHOLD,
                "idle_timeout_s": REFERENCE_IDLE_S,
                "rules": [
                    {"failure": f, "decision": d, "source": s} for f, d, s in REFERENCE_RULES
                ],
            },
            "ours": {
                "max_retries_per_route": RETRY.max_retries,
                "timeouts": attrs.asdict(TIMEOUTS),
            },
            "scenarios": rows,
        },
    )


if __name__ == "__main__":
    main()
