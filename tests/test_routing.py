"""Routing as data: the routing table, the circuit breaker's state machine, the hedge
delay, the policy's validation, and the sampler's use of chains (scripted transport,
mock clock)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import httpx2
import orjson
import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config

from trio_sampler import (
    Completed,
    ConversationRequest,
    Failed,
    ImagePart,
    Retrying,
    Route,
    RoutingPolicy,
    SamplingErrorKind,
    SamplingEvent,
    TextPart,
    User,
    collect,
    open_sampler,
)
from trio_sampler.config import RetryPolicy, SamplerConfig
from trio_sampler.routing import (
    ROUTING,
    BreakerPolicy,
    BreakerState,
    BreakerTransition,
    HedgePolicy,
    RouteAction,
    RouteBreaker,
    RouteCapabilities,
    hedge_delay,
    route_action,
    unsupported_by,
)
from trio_sampler.types import AttemptOutcome, SamplingErrorInfo, WebSearch
from trio_sampler.wire.errors import error_info

# -- the routing table ----------------------------------------------------------------


def test_every_kind_has_a_general_row() -> None:
    general = [row.kind for row in ROUTING if row.code is None]
    assert sorted(general, key=lambda k: k.value) == sorted(
        SamplingErrorKind, key=lambda k: k.value
    )


def test_no_row_is_written_twice() -> None:
    keys = [(row.kind, row.code) for row in ROUTING]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("kind", "code", "action"),
    [
        (SamplingErrorKind.OVERLOADED, None, RouteAction.RETRY_THEN_NEXT),
        (SamplingErrorKind.RATE_LIMITED, None, RouteAction.RETRY_THEN_NEXT),
        (SamplingErrorKind.RATE_LIMITED, "insufficient_quota", RouteAction.NEXT),
        (SamplingErrorKind.TRANSPORT, None, RouteAction.RETRY_THEN_NEXT),
        (SamplingErrorKind.IDLE_TIMEOUT, "first_token_timeout", RouteAction.NEXT),
        (SamplingErrorKind.IDLE_TIMEOUT, "idle_timeout", RouteAction.NEXT),
        (SamplingErrorKind.IDLE_TIMEOUT, None, RouteAction.NEXT),
        (SamplingErrorKind.IDLE_TIMEOUT, "total_timeout", RouteAction.SURFACE),
        (SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED, None, RouteAction.LARGER_WINDOW),
        (SamplingErrorKind.CONTENT_FILTER, None, RouteAction.SURFACE),
        (SamplingErrorKind.AUTH, None, RouteAction.SURFACE),
        (SamplingErrorKind.INVALID_REQUEST, None, RouteAction.SURFACE),
        (SamplingErrorKind.INTERNAL, None, RouteAction.SURFACE),
    ],
)
def test_route_action(kind: SamplingErrorKind, code: str | None, action: RouteAction) -> None:
    assert route_action(error_info(kind, "x", code=code)) is action


def test_a_code_without_a_row_takes_its_kinds_row() -> None:
    error = error_info(SamplingErrorKind.API, "x", code="server_error")
    assert route_action(error) is RouteAction.RETRY_THEN_NEXT


# -- capabilities ---------------------------------------------------------------------


def test_capabilities_skip_what_a_route_cannot_carry() -> None:
    no_tools = Route("r", make_config(), RouteCapabilities(hosted_tools=False))
    no_images = Route("r", make_config(), RouteCapabilities(images=False))
    plain = ConversationRequest(items=[User("hi")])
    searching = ConversationRequest(items=[User("hi")], hosted_tools=[WebSearch()])
    picture = ConversationRequest(
        items=[User([TextPart("look"), ImagePart("https://example.com/a.png")])]
    )
    assert unsupported_by(no_tools, plain) is None
    assert "hosted tools" in (unsupported_by(no_tools, searching) or "")
    assert unsupported_by(no_images, plain) is None
    assert "images" in (unsupported_by(no_images, picture) or "")


# -- the breaker ------------------------------------------------------------------------


def state_of(b: RouteBreaker) -> BreakerState:
    """The state now (a call, so that mypy does not narrow it across calls)."""
    return b.state


def breaker(**policy: float) -> tuple[RouteBreaker, list[BreakerTransition]]:
    changes: list[BreakerTransition] = []
    return RouteBreaker("primary", BreakerPolicy(**policy), changes.append), changes  # type: ignore[arg-type]


def test_opens_after_consecutive_failures() -> None:
    b, changes = breaker(consecutive_failures=3)
    for t in range(2):
        assert b.allow(t)
        b.record_failure(t)
    assert state_of(b) is BreakerState.CLOSED
    b.record_failure(2)
    assert state_of(b) is BreakerState.OPEN and not b.allow(2.5)
    assert [(c.old, c.new, c.open_for_s) for c in changes] == [
        (BreakerState.CLOSED, BreakerState.OPEN, 5.0)
    ]


def test_a_success_resets_the_consecutive_count() -> None:
    b, _ = breaker(consecutive_failures=3, min_attempts=100)
    for t in range(10):
        b.record_failure(t)
        b.record_failure(t + 0.1)
        b.record_success(t + 0.2)
    assert state_of(b) is BreakerState.CLOSED


def test_opens_on_the_failure_ratio_over_the_window() -> None:
    b, _ = breaker(consecutive_failures=100, min_attempts=10, failure_ratio=0.5, window_s=30)
    for t in range(9):
        (b.record_failure if t % 2 else b.record_success)(float(t))
    assert state_of(b) is BreakerState.CLOSED  # 9 attempts: below min_attempts
    b.record_failure(9.0)
    b.record_failure(10.0)  # 11 attempts, 6 failed
    assert state_of(b) is BreakerState.OPEN


def test_old_attempts_leave_the_window() -> None:
    b, _ = breaker(consecutive_failures=100, min_attempts=4, failure_ratio=0.5, window_s=10)
    for t in range(3):
        b.record_failure(float(t))
    for t in range(20, 24):
        b.record_success(float(t))
    b.record_failure(25.0)
    assert state_of(b) is BreakerState.CLOSED  # 1 of 5 in the window


def test_half_open_admits_one_probe_at_a_time() -> None:
    b, _ = breaker(consecutive_failures=1, open_s=5)
    b.record_failure(0.0)
    assert not b.allow(4.9)
    assert b.allow(5.0) and state_of(b) is BreakerState.HALF_OPEN
    assert not b.allow(5.1) and not b.allow(6.0)  # the probe is in flight
    b.record_success(6.5)
    assert state_of(b) is BreakerState.CLOSED and b.allow(6.6) and b.allow(6.7)


def test_a_failed_probe_backs_off_up_to_the_cap() -> None:
    b, changes = breaker(consecutive_failures=1, open_s=5, backoff=2, max_open_s=30)
    now = 0.0
    b.record_failure(now)
    for _ in range(5):
        now += b.reopens_in(now)
        assert b.allow(now)
        b.record_failure(now)
    opens = [c.open_for_s for c in changes if c.new is BreakerState.OPEN]
    assert opens == [5.0, 10.0, 20.0, 30.0, 30.0, 30.0]
    now += b.reopens_in(now)
    assert b.allow(now)
    b.record_success(now)
    b.record_failure(now + 1)  # the interval starts again from open_s
    assert changes[-1].open_for_s == 5.0


def test_an_abandoned_probe_frees_the_slot() -> None:
    b, _ = breaker(consecutive_failures=1, open_s=5)
    b.record_failure(0.0)
    assert b.allow(5.0)
    b.record_abandoned(5.5)
    assert state_of(b) is BreakerState.HALF_OPEN and b.allow(6.0)


# -- hedging ----------------------------------------------------------------------------


def test_hedge_delay_is_fixed_until_enough_samples() -> None:
    policy = HedgePolicy(delay_s=2.0, percentile=0.9, min_samples=10)
    assert hedge_delay(policy, [0.1] * 9) == 2.0
    samples = [0.1] * 9 + [5.0]
    assert hedge_delay(policy, samples) == 0.1
    assert hedge_delay(policy, [0.1] * 8 + [4.0, 5.0]) == 4.0
    assert hedge_delay(HedgePolicy(delay_s=1.5), samples) == 1.5


# -- bad arguments -----------------------------------------------------------------------


def bad(value: object) -> Any:
    """A value of the wrong type, as an untyped caller would pass it."""
    return value


@pytest.mark.parametrize(
    ("build", "error", "says"),
    [
        (lambda: Route("", make_config()), ValueError, 'Route("primary", config)'),
        (lambda: Route("a", bad({"base_url": "x"})), TypeError, "SamplerConfig"),
        (
            lambda: Route("a", make_config(), bad({"images": False})),
            TypeError,
            "RouteCapabilities(",
        ),
        (lambda: RouteCapabilities(context_window=0), ValueError, "context_window=200_000"),
        (lambda: RouteCapabilities(images=bad("yes")), TypeError, "images=True"),
        (lambda: RoutingPolicy([]), ValueError, "at least one route"),
        (lambda: RoutingPolicy(bad(Route("a", make_config()))), TypeError, "a list of routes"),
        (lambda: RoutingPolicy([bad(make_config())]), TypeError, 'Route("fallback"'),
        (
            lambda: RoutingPolicy([Route("a", make_config()), Route("a", make_config())]),
            ValueError,
            "its own name",
        ),
        (
            lambda: RoutingPolicy([Route("a", make_config())], breaker=bad(5)),
            TypeError,
            "BreakerPolicy(",
        ),
        (
            lambda: RoutingPolicy([Route("a", make_config())], hedge=bad(2.0)),
            TypeError,
            "HedgePolicy(",
        ),
        (
            lambda: RoutingPolicy([Route("a", make_config())], max_retry_wait_s=-1),
            ValueError,
            "max_retry_wait_s=2.0",
        ),
        (lambda: BreakerPolicy(failure_ratio=0), ValueError, "failure_ratio=0.5"),
        (lambda: BreakerPolicy(consecutive_failures=0), ValueError, ">= 1"),
        (lambda: BreakerPolicy(backoff=0.5), ValueError, "backoff=2.0"),
        (lambda: BreakerPolicy(open_s=10, max_open_s=5), ValueError, "max_open_s"),
        (lambda: HedgePolicy(delay_s=0), ValueError, "positive"),
        (lambda: HedgePolicy(delay_s=1, percentile=95), ValueError, "percentile=0.95"),
    ],
)
def test_bad_routing_arguments_say_what_to_write(
    build: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as caught:
        build()  # type: ignore[operator]
    assert says in str(caught.value)


def test_a_chain_names_known_routes() -> None:
    routing = RoutingPolicy([Route("a", make_config()), Route("b", make_config())])
    assert [r.name for r in routing.chain(["b", "a"])] == ["b", "a"]
    with pytest.raises(ValueError, match="no route is named 'c'; the routes are 'a', 'b'"):
        routing.chain(["c"])
    with pytest.raises(ValueError, match="twice"):
        routing.chain(["a", "a"])
    with pytest.raises(TypeError, match=r"chain=\['a'\]"):
        routing.chain("a")


async def test_open_sampler_checks_routing() -> None:
    with pytest.raises(TypeError, match="RoutingPolicy"):
        open_sampler(make_config(), routing=[Route("a", make_config())])  # type: ignore[arg-type]


async def test_submit_checks_chain(autojump_clock: trio.abc.Clock) -> None:
    routing = RoutingPolicy([Route("a", make_config())])
    transport = ScriptedTransport([Reply(chunks=chat_stream("hi"))])
    request = ConversationRequest(items=[User("hi")])
    async with open_sampler(make_config(), transport=transport) as sampler:
        with pytest.raises(ValueError, match=r"open_sampler\(config, routing="):
            await sampler.submit(request, chain=["a"])
    async with open_sampler(make_config(), routing=routing, transport=transport) as sampler:
        with pytest.raises(ValueError, match="either config="):
            await sampler.submit(request, chain=["a"], config=make_config())
        with pytest.raises(ValueError, match="no route is named"):
            await sampler.submit(request, chain=["z"])


# -- the sampler along a chain -------------------------------------------------------------


def by_host(**transports: ScriptedTransport) -> ScriptedTransport:
    """Requests to ``a.test`` go to ``transports["a"]``, and so on."""

    def reply(request: httpx2.Request, _index: int) -> Reply:
        server = transports[request.url.host.removesuffix(".test")]
        server.requests.append(request)
        return server._next(request)

    return ScriptedTransport(reply)


def hosts(**replies: list[Reply]) -> tuple[ScriptedTransport, dict[str, int]]:
    """One scripted transport answering per host (``a.test`` ...), counting requests."""
    counts = dict.fromkeys(replies, 0)

    def reply(request: httpx2.Request, _index: int) -> Reply:
        host = request.url.host.removesuffix(".test")
        script = replies[host]
        counts[host] += 1
        return script[min(counts[host], len(script)) - 1]

    return ScriptedTransport(reply), counts


def on(host: str, **changes: object) -> SamplerConfig:
    fields: dict[str, object] = {
        "base_url": f"http://{host}.test/v1",
        "model": f"{host}-model",
        "api_key": f"sk-{host}-SECRET-0123456789",
        "retry": RetryPolicy(max_retries=1, base_delay=0.1, max_delay=0.1, jitter=0.0),
    }
    return make_config(**{**fields, **changes})


REQUEST = ConversationRequest(items=[User("hi")])


async def test_a_request_may_name_its_own_chain(autojump_clock: trio.abc.Clock) -> None:
    transport, counts = hosts(
        a=[Reply(chunks=chat_stream("from a"))], b=[Reply(chunks=chat_stream("from b"))]
    )
    routing = RoutingPolicy([Route("a", on("a")), Route("b", on("b"))])
    async with open_sampler(on("a"), routing=routing, transport=transport) as sampler:
        first = await sampler.submit_and_collect(REQUEST)
        second = await sampler.submit_and_collect(REQUEST, chain=["b"])
    assert (first.text, second.text) == ("from a", "from b")
    assert counts == {"a": 1, "b": 1}


async def test_accounting_sums_every_attempt(autojump_clock: trio.abc.Clock) -> None:
    transport, _ = hosts(
        a=[error_reply(500)],
        b=[Reply(chunks=chat_stream("served"))],
    )
    routing = RoutingPolicy([Route("a", on("a")), Route("b", on("b"))])
    async with open_sampler(on("a"), routing=routing, transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        result = await stream.result()
    end = stream.terminal
    assert isinstance(end, Completed) and result.unwrap().text == "served"
    assert end.metrics is not None
    attempts = end.metrics.attempts
    assert [(a.route, a.model, a.outcome, a.status_code) for a in attempts] == [
        ("a", "a-model", AttemptOutcome.FAILED, 500),
        ("a", "a-model", AttemptOutcome.FAILED, 500),
        ("b", "b-model", AttemptOutcome.COMPLETED, None),
    ]
    # Failed attempts are never completions; the served usage is the last attempt's.
    assert end.metrics.usage == attempts[-1].usage
    assert end.metrics.total_usage == attempts[-1].usage  # 5xx replies report no usage
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert attempts[2].started_ms >= attempts[1].started_ms + attempts[1].duration_ms


async def test_route_credentials_are_redacted_from_every_event(
    autojump_clock: trio.abc.Clock,
) -> None:
    leak = "sk-b-SECRET-0123456789"
    transport, _ = hosts(
        a=[error_reply(503, {"error": {"message": f"upstream rejected {leak}", "type": "x"}})],
        b=[error_reply(400, {"error": {"message": f"bad key {leak}", "type": "invalid"}})],
    )
    routing = RoutingPolicy([Route("a", on("a")), Route("b", on("b"))])
    async with open_sampler(on("a"), routing=routing, transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events = [event async for event in stream]
    assert isinstance(events[-1], Failed)
    assert leak not in repr(events)


async def test_every_route_open_fails_fast_with_the_reasons(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport, counts = hosts(a=[error_reply(503)], b=[error_reply(503)])
    routing = RoutingPolicy(
        [Route("a", on("a")), Route("b", on("b"))],
        breaker=BreakerPolicy(consecutive_failures=2),
    )
    async with open_sampler(on("a"), routing=routing, transport=transport) as sampler:
        first = await (await sampler.submit(REQUEST)).result()
        stream = await sampler.submit(REQUEST)
        await stream.result()
    with pytest.raises(Exception, match="503"):
        first.unwrap()
    end = stream.terminal
    assert isinstance(end, Failed)
    assert end.error.error_code == "no_route"
    assert "a: its circuit is open; b: its circuit is open" in end.error.message
    assert counts == {"a": 2, "b": 2}


async def test_without_routing_nothing_changes(autojump_clock: trio.abc.Clock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("hi"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        await stream.result()
        assert await sampler.route_stats() == {}
    end = stream.terminal
    assert isinstance(end, Completed) and end.route is None and end.model == "test-model"
    assert end.metrics is not None and end.metrics.attempts[0].route is None


def test_error_info_is_what_the_table_reads() -> None:
    info = SamplingErrorInfo(
        kind=SamplingErrorKind.RATE_LIMITED, message="x", error_code="INSUFFICIENT_QUOTA"
    )
    assert route_action(info) is RouteAction.NEXT


# -- continuing a broken stream by prefill ---------------------------------------------------

WHOLE = "The quick brown fox jumps over the lazy dog."
SHOWN = "The quick brown fox"


def cut_after(*pieces: str) -> Reply:
    return Reply(chunks=[chat_chunk({"content": p}) for p in pieces], then="drop")


def continuing(prefix: str, rest: str) -> Callable[[httpx2.Request, int], Reply]:
    """A server that continues a trailing assistant message, and answers whole otherwise."""

    def reply(request: httpx2.Request, _index: int) -> Reply:
        messages = orjson.loads(request.content)["messages"]
        if messages[-1] == {"role": "assistant", "content": prefix}:
            return Reply(chunks=chat_stream(rest))
        return Reply(chunks=chat_stream(WHOLE))

    return reply


def prefill_routing(**fallback: object) -> RoutingPolicy:
    no_retry = RetryPolicy(max_retries=0)
    return RoutingPolicy(
        [
            Route("a", on("a", retry=no_retry)),
            Route("b", on("b", **fallback), RouteCapabilities(accepts_prefill=True)),
        ],
        continue_by_prefill=True,
    )


async def run_events(
    routing: RoutingPolicy, transport: httpx2.AsyncBaseTransport
) -> list[SamplingEvent]:
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        stream = await s.submit(REQUEST)
        return [event async for event in stream]


async def test_a_cut_stream_continues_by_prefill_where_declared(
    autojump_clock: trio.abc.Clock,
) -> None:
    fallback = ScriptedTransport(continuing(SHOWN, " jumps over the lazy dog."))
    transport = by_host(a=ScriptedTransport([cut_after("The quick ", "brown fox")]), b=fallback)
    events = await run_events(prefill_routing(), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.route == "b"
    assert end.response.text == WHOLE  # the continued text, then the continuation
    # The consumer keeps what it was shown: no discard, and the fold gives the whole text.
    assert [(r.route, r.discard_partial) for r in events if isinstance(r, Retrying)] == [
        ("b", False)
    ]
    assert collect(events).text == WHOLE
    sent = orjson.loads(fallback.requests[0].content)["messages"]
    assert sent[-1] == {"role": "assistant", "content": SHOWN}


async def test_no_continuation_where_prefill_is_not_declared(
    autojump_clock: trio.abc.Clock,
) -> None:
    fallback = ScriptedTransport(continuing(SHOWN, " jumps over the lazy dog."))
    transport = by_host(a=ScriptedTransport([cut_after("The quick ", "brown fox")]), b=fallback)
    routing = prefill_routing()
    routing = attrs.evolve(
        routing,
        routes=(
            routing.routes[0],
            attrs.evolve(routing.routes[1], capabilities=RouteCapabilities()),
        ),
    )
    events = await run_events(routing, transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == WHOLE
    assert [r.discard_partial for r in events if isinstance(r, Retrying)] == [True]
    assert orjson.loads(fallback.requests[0].content)["messages"][-1]["role"] == "user"


async def test_a_rejected_continuation_restarts_and_never_becomes_the_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    refusal = error_reply(
        400,
        {
            "error": {
                "message": "assistant prefill is not supported",
                "type": "invalid_request_error",
            }
        },
    )
    fallback = ScriptedTransport([refusal, Reply(chunks=chat_stream(WHOLE))])
    transport = by_host(a=ScriptedTransport([cut_after("The quick ", "brown fox")]), b=fallback)
    events = await run_events(prefill_routing(), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.route == "b" and end.response.text == WHOLE
    # Continue (no discard), refused, then restart (discard what was shown).
    assert [(r.route, r.discard_partial) for r in events if isinstance(r, Retrying)] == [
        ("b", False),
        ("b", True),
    ]
    assert collect(events).text == WHOLE


async def test_after_a_rejected_continuation_the_real_failure_is_reported(
    autojump_clock: trio.abc.Clock,
) -> None:
    refusal = error_reply(
        400,
        {
            "error": {
                "message": "assistant prefill is not supported",
                "type": "invalid_request_error",
            }
        },
    )
    fallback = ScriptedTransport([refusal, error_reply(503)])
    transport = by_host(a=ScriptedTransport([cut_after("The quick ", "brown fox")]), b=fallback)
    events = await run_events(
        prefill_routing(retry=RetryPolicy(max_retries=1, base_delay=0.1, max_delay=0.1)), transport
    )
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.OVERLOADED  # not the refused prefill
    assert "prefill" not in end.error.message


async def test_whitespace_at_the_cut_restarts_instead(autojump_clock: trio.abc.Clock) -> None:
    fallback = ScriptedTransport(continuing("The quick ", "brown fox jumps over the lazy dog."))
    transport = by_host(a=ScriptedTransport([cut_after("The quick ")]), b=fallback)
    events = await run_events(prefill_routing(), transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == WHOLE
    assert [r.discard_partial for r in events if isinstance(r, Retrying)] == [True]


# -- the transform's outcome -------------------------------------------------------------


@pytest.mark.parametrize("ending", ["complete", "fail"])
def test_a_transforms_outcome_is_its_terminal_and_last(ending: str) -> None:
    from trio_sampler.types import ApiBackend
    from trio_sampler.wire import SSEDecoder, new_transform

    transform = new_transform(ApiBackend.CHAT_COMPLETIONS, "r")
    before = transform.outcome
    assert before is None
    events = transform.start()
    body = b"".join(b for b in chat_stream("hi") if isinstance(b, bytes))
    if ending == "fail":
        body = body[: body.index(b"[DONE]") // 2]
    decoder = SSEDecoder()
    for sse in [*decoder.feed(body), *decoder.close()]:
        events += transform.feed(sse)
    events += transform.close()
    outcome = transform.outcome
    assert isinstance(outcome, Completed if ending == "complete" else Failed)
    assert events[-1] is outcome
    assert not [e for e in events[:-1] if isinstance(e, Completed | Failed)]
    assert transform.close() == [] and transform.outcome is outcome


# -- the breaker's window and schedule -----------------------------------------------------


def test_the_outcome_window_counts_the_last_window_s_in_buckets() -> None:
    from trio_sampler.routing import WINDOW_BUCKETS, OutcomeWindow

    window = OutcomeWindow(30.0)
    for n in range(100_000):  # a busy route: the window's state does not grow with it
        window.add(n * 0.00001, failed=n % 4 == 0)
    assert window.counts() == (100_000, 25_000)
    assert len(window._buckets) == WINDOW_BUCKETS + 1
    window.add(25.0, failed=True)
    assert window.counts() == (100_001, 25_001)
    # 30 s (and at most one bucket) later the first burst has left the window.
    window.add(31.6, failed=False)
    assert window.counts() == (2, 1)
    window.add(1000.0, failed=False)
    assert window.counts() == (1, 0)


def test_the_ratio_trips_on_the_window_only() -> None:
    breaker = RouteBreaker("r", BreakerPolicy(consecutive_failures=100, min_attempts=4))
    for at in (0.0, 1.0):
        breaker.record_failure(at)
        breaker.record_success(at)
    # Two failures in four attempts, but half of them left the window: closed.
    breaker.record_failure(40.0)
    states = [breaker.state]
    for at in (41.0, 42.0):
        breaker.record_success(at)
    states.append(breaker.state)
    breaker.record_failure(43.0)  # two of the window's four
    states.append(breaker.state)
    assert states == [BreakerState.CLOSED, BreakerState.CLOSED, BreakerState.OPEN]


def test_a_failed_probe_reopens_from_its_start_whatever_its_round_trip() -> None:
    policy = BreakerPolicy(consecutive_failures=1, open_s=5.0, backoff=2.0)
    breaker = RouteBreaker("r", policy)
    breaker.record_failure(0.0)
    assert not breaker.allow(4.99)
    assert breaker.allow(7.0)  # half open: this is the probe
    breaker.record_failure(7.5)  # its answer took half a second
    assert breaker.reopens_in(7.5) == pytest.approx(9.5)  # 10 s from the probe's start
    assert breaker.allow(17.0)
