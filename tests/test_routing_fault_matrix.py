"""The routing fault matrix: a primary route misbehaves, a fallback route is healthy.

Each case is one test: the caller gets the complete canonical answer from the right route
within a stated bound (or the clean error where that is right), with the attempt counts
and the accounting checked. Cases that only need a status or a broken stream run over
real loopback HTTP against the emulator (the ``emulator`` fixture); cases that need
minutes (silent routes, stalls, an outage) run the emulator in process
(:class:`EmulatorTransport`) or a scripted transport under trio's mock clock, so their
bounds are exact and take no real time.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import attrs
import httpx2
import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream

from trio_sampler import (
    ApiBackend,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    Route,
    RoutingPolicy,
    SamplerConfig,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    User,
    collect,
    open_sampler,
)
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, EmulatorTransport, script_headers, serve
from trio_sampler.routing import BreakerPolicy, BreakerState, BreakerTransition, RouteCapabilities
from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import AttemptOutcome

TEXT = "The quick brown fox jumps over the lazy dog, twice over, for good measure."
REQUEST = ConversationRequest(items=[User("tell me")])
RETRY = RetryPolicy(max_retries=2, base_delay=0.5, max_delay=1.0, jitter=0.0)


def route(
    name: str,
    base_url: str,
    faults: list[dict[str, Any]] | None = None,
    *,
    backend: ApiBackend = ApiBackend.CHAT_COMPLETIONS,
    timeouts: Timeouts | None = None,
    capabilities: RouteCapabilities | None = None,
    **script: Any,
) -> Route:
    """A route to the emulator whose script (its own scenario) rides in its headers."""
    headers = script_headers(text=TEXT, chunk_chars=6, scenario=name, faults=faults or [], **script)
    config = SamplerConfig(
        base_url=base_url,
        backend=backend,
        model=f"{name}-model",
        api_key=f"sk-{name}-route-key-0123",
        retry=RETRY,
        timeouts=timeouts or Timeouts(first_token=10.0, idle=5.0, response_headers=10.0),
        extra_headers=headers,
    )
    return Route(name, config, capabilities or RouteCapabilities())


async def run(
    routing: RoutingPolicy, transport: httpx2.AsyncBaseTransport | None = None, **submit: Any
) -> tuple[list[SamplingEvent], float]:
    """One request through the chain: its events and how long it took (trio's clock)."""
    events: list[SamplingEvent] = []
    default = routing.routes[0].config
    async with AsyncExitStack() as stack:
        if transport is not None:  # the caller owns a transport (open_sampler borrows it)
            await stack.enter_async_context(transport)
        async with open_sampler(default, routing=routing, transport=transport) as sampler:
            start = trio.current_time()
            stream = await sampler.submit(REQUEST, **submit)
            async for event in stream:
                events.append(event)
            took = trio.current_time() - start
    return events, took


def served(events: list[SamplingEvent], by: str, model: str | None = None) -> Completed:
    """The one terminal is last, a ``Completed`` from route ``by`` with the whole text
    (and the model the server named, by default the emulator's echo of the route's)."""
    terminals = [e for e in events if isinstance(e, Completed | Failed)]
    assert len(terminals) == 1 and events[-1] is terminals[0]
    end = events[-1]
    assert isinstance(end, Completed), end
    assert end.route == by and end.model == (model or f"{by}-model")
    assert end.response.text == TEXT
    assert end.metrics is not None and end.metrics.route == by
    return end


def attempts_by_route(end: Completed | Failed) -> list[tuple[str | None, AttemptOutcome]]:
    assert end.metrics is not None
    return [(a.route, a.outcome) for a in end.metrics.attempts]


def retries(events: list[SamplingEvent]) -> list[Retrying]:
    return [e for e in events if isinstance(e, Retrying)]


F, C = AttemptOutcome.FAILED, AttemptOutcome.COMPLETED


# -- over loopback HTTP -------------------------------------------------------------------


async def test_429_with_a_long_retry_after_fails_over_at_once(emulator: EmulatorFixture) -> None:
    primary = route(
        "primary", emulator.base_url, [{"type": "status", "status": 429, "retry_after": 20}]
    )
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = served(events, "fallback")
    # A 20 s wait on the primary is longer than max_retry_wait_s (2 s): the fallback serves.
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert [r.route for r in retries(events)] == ["fallback"]
    assert end.metrics is not None
    assert end.metrics.attempts[0].kind is SamplingErrorKind.RATE_LIMITED


async def test_429_with_a_short_retry_after_is_retried_on_the_route(
    emulator: EmulatorFixture,
) -> None:
    primary = route(
        "primary",
        emulator.base_url,
        [{"type": "status", "status": 429, "retry_after": 1, "times": 1}],
    )
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, took = await run(routing)
    end = served(events, "primary")
    assert attempts_by_route(end) == [("primary", F), ("primary", C)]
    assert took >= 1.0  # the server's wait was honoured exactly
    assert not emulator.requests("fallback")


async def test_persistent_429_without_retry_after(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 429}])
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, took = await run(routing)
    end = served(events, "fallback")
    # The route's own allowance (2 retries, 0.5 s then 1 s), then the next route.
    assert attempts_by_route(end) == [("primary", F)] * 3 + [("fallback", C)]
    assert took < 3.0
    assert len(emulator.requests("primary")) == 3


async def test_500_once_is_retried_on_the_primary(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 500, "times": 1}])
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = served(events, "primary")
    assert attempts_by_route(end) == [("primary", F), ("primary", C)]
    assert not emulator.requests("fallback")


async def test_persistent_503_with_a_healthy_fallback(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 503}])
    fallback = route("fallback", emulator.base_url, backend=ApiBackend.MESSAGES)
    routing = RoutingPolicy([primary, fallback], breaker=BreakerPolicy(consecutive_failures=5))
    with trio.fail_after(15):
        async with open_sampler(primary.config, routing=routing) as sampler:
            ends = []
            for _ in range(3):
                stream = await sampler.submit(REQUEST)
                ends.append(await _terminal(stream))
            stats = await sampler.route_stats()
    # A Chat Completions primary, a Messages fallback: the neutral request is rendered again.
    assert all(isinstance(e, Completed) and e.route == "fallback" for e in ends)
    assert all(e.response.text == TEXT for e in ends if isinstance(e, Completed))
    # 3 attempts, then 2 more open the circuit; the third request does not touch it.
    assert attempts_by_route(ends[0]) == [("primary", F)] * 3 + [("fallback", C)]
    assert attempts_by_route(ends[1]) == [("primary", F)] * 2 + [("fallback", C)]
    assert attempts_by_route(ends[2]) == [("fallback", C)]
    assert ends[2].metrics is not None
    assert ends[2].metrics.skipped_routes == (("primary", "its circuit is open"),)
    assert stats["primary"].state is BreakerState.OPEN and stats["primary"].opened == 1
    assert stats["fallback"].completions == 3
    assert len(emulator.requests("primary")) == 5
    assert emulator.requests("fallback")[0]["path"] == "/v1/messages"


async def test_persistent_503_with_nowhere_to_go_fails_cleanly(
    emulator: EmulatorFixture,
) -> None:
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 503}])
    with trio.fail_after(5):
        events, took = await run(RoutingPolicy([primary]))
    end = events[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.OVERLOADED
    assert end.error.status_code == 503
    # The route's own allowance (2 retries after 0.5 s and 1 s), then the clean error.
    assert attempts_by_route(end) == [("primary", F)] * 3
    assert [r.route for r in retries(events)] == ["primary", "primary"]
    assert 1.5 <= took < 3.0


async def _terminal(stream: Any) -> Completed | Failed:
    async with stream:
        async for event in stream:
            if isinstance(event, Completed | Failed):
                return event
    raise AssertionError("no terminal")


async def test_stream_cut_mid_answer_restarts_on_the_fallback(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, [{"type": "drop", "after_events": 3}])
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(10):
        events, _ = await run(routing)
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F)] * 3 + [("fallback", C)]
    # Every restart discards what the broken attempt streamed, visibly.
    assert [(r.route, r.discard_partial) for r in retries(events)] == [
        ("primary", True),
        ("primary", True),
        ("fallback", True),
    ]


async def test_one_malformed_chunk_is_retried_on_the_primary(emulator: EmulatorFixture) -> None:
    primary = route(
        "primary", emulator.base_url, [{"type": "malformed", "after_events": 3, "times": 1}]
    )
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = served(events, "primary")
    assert attempts_by_route(end) == [("primary", F), ("primary", C)]
    assert end.metrics is not None
    assert end.metrics.attempts[0].kind is SamplingErrorKind.SERIALIZATION
    assert retries(events)[0].discard_partial


CONTEXT_BODY = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


async def test_context_length_goes_to_a_route_with_a_larger_window(
    emulator: EmulatorFixture,
) -> None:
    fault = {"type": "status", "status": 400, "body": CONTEXT_BODY}
    routing = RoutingPolicy(
        [
            route(
                "primary",
                emulator.base_url,
                [fault],
                capabilities=RouteCapabilities(context_window=8192),
            ),
            route("same", emulator.base_url, capabilities=RouteCapabilities(context_window=8192)),
            route(
                "fallback",
                emulator.base_url,
                capabilities=RouteCapabilities(context_window=200_000),
            ),
        ]
    )
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert end.metrics is not None
    assert [name for name, _ in end.metrics.skipped_routes] == ["same"]
    assert not emulator.requests("same")


async def test_context_length_without_a_larger_window_surfaces(emulator: EmulatorFixture) -> None:
    fault = {"type": "status", "status": 400, "body": CONTEXT_BODY}
    routing = RoutingPolicy(
        [
            route(
                "primary",
                emulator.base_url,
                [fault],
                capabilities=RouteCapabilities(context_window=8192),
            ),
            route(
                "fallback", emulator.base_url, capabilities=RouteCapabilities(context_window=8192)
            ),
        ]
    )
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = events[-1]
    assert isinstance(end, Failed)
    # The caller compacts: the provider's kind and message are kept.
    assert end.error.kind is SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED
    assert "maximum context length is 8192" in end.error.message
    assert not emulator.requests("fallback")


async def test_content_filter_never_fails_over(emulator: EmulatorFixture) -> None:
    body = {
        "error": {
            "message": "Your request was rejected by the safety system.",
            "type": "invalid_request_error",
            "code": "content_policy_violation",
        }
    }
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 400, "body": body}])
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.kind is SamplingErrorKind.CONTENT_FILTER
    assert "rejected by the safety system" in end.error.message
    assert attempts_by_route(end) == [("primary", F)]
    assert not retries(events) and not emulator.requests("fallback")


async def test_a_content_filter_stop_is_an_answer_not_a_fault(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, stop="content_filter")
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = events[-1]
    assert isinstance(end, Completed) and end.route == "primary"
    assert end.response.stop_reason is StopReason.CONTENT_FILTER
    assert not emulator.requests("fallback")


async def test_auth_failure_never_fails_over(emulator: EmulatorFixture) -> None:
    primary = route("primary", emulator.base_url, [{"type": "status", "status": 401}])
    routing = RoutingPolicy([primary, route("fallback", emulator.base_url)])
    with trio.fail_after(5):
        events, _ = await run(routing)
    end = events[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.AUTH
    assert not emulator.requests("fallback")


async def test_reset_before_headers_fails_over() -> None:
    async def reset(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.aclose()  # the request was read; the connection closes unanswered

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, reset, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as emulator_nursery:
            server = await emulator_nursery.start(serve)
            primary = route("primary", f"http://127.0.0.1:{port}/v1")
            routing = RoutingPolicy([primary, route("fallback", server.base_url)])
            with trio.fail_after(10):
                events, _ = await run(routing)
            emulator_nursery.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F)] * 3 + [("fallback", C)]
    assert end.metrics is not None
    assert {a.kind for a in end.metrics.attempts[:3]} == {SamplingErrorKind.TRANSPORT}


# -- under the mock clock -----------------------------------------------------------------


class HostTransport(httpx2.AsyncBaseTransport):
    """Sends each request to the transport of its host (``primary.test``, ...)."""

    def __init__(self, **by_host: httpx2.AsyncBaseTransport) -> None:
        self.by_host = by_host
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> HostTransport:
        unique = {id(t): t for t in self.by_host.values()}
        for transport in unique.values():
            await self._stack.enter_async_context(transport)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        host = request.url.host.removesuffix(".test")
        return await self.by_host[host].handle_async_request(request)


def models(**scripts: dict[str, Any]) -> tuple[EmulatorTransport, EmulatorApp]:
    """The in-process emulator playing models ``primary`` and ``fallback`` (and any
    others named), each with its own default script and fault counters."""
    table: dict[str, dict[str, Any]] = {
        "primary": {"text": TEXT, "chunk_chars": 6},
        "fallback": {"text": TEXT, "chunk_chars": 6},
    }
    for name, script in scripts.items():
        table[name] = {**table.get(name, {"text": TEXT, "chunk_chars": 6}), **script}
    app = EmulatorApp(models=table)
    return EmulatorTransport(app), app


def model_route(
    name: str,
    *,
    backend: ApiBackend = ApiBackend.CHAT_COMPLETIONS,
    capabilities: RouteCapabilities | None = None,
    retry: RetryPolicy = RETRY,
) -> Route:
    """A route to the emulator's model ``name`` (its script is the model's)."""
    config = SamplerConfig(
        base_url="http://emulator.test/v1",
        backend=backend,
        model=name,
        api_key=f"sk-{name}-route-key-0123",
        retry=retry,
        timeouts=Timeouts(first_token=10.0, idle=5.0, response_headers=10.0),
    )
    return Route(name, config, capabilities or RouteCapabilities())


def requests_for(app: EmulatorApp, model: str) -> list[dict[str, Any]]:
    return [r for r in app.requests() if (r.get("body") or {}).get("model") == model]


def in_process() -> tuple[HostTransport, EmulatorTransport]:
    emulator = EmulatorTransport()
    return HostTransport(primary=emulator, fallback=emulator), emulator


async def test_silent_primary_ends_within_twice_the_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport, app = models(primary={"faults": [{"type": "silent"}]})
    routing = RoutingPolicy([model_route("primary"), model_route("fallback")])
    events, took = await run(routing, transport)
    end = served(events, "fallback", model="fallback")
    # No headers within response_headers (10 s): fail over after the first timeout.
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert len(requests_for(app, "primary")) == 1
    assert 10.0 <= took < 2 * 10.0


async def test_first_token_after_20_s_fails_over_after_the_first_token_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport, emulator = in_process()
    primary = route("primary", "http://primary.test/v1", first_token_ms=20_000)
    routing = RoutingPolicy([primary, route("fallback", "http://fallback.test/v1")])
    events, took = await run(routing, transport)
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert end.metrics is not None
    assert end.metrics.attempts[0].kind is SamplingErrorKind.IDLE_TIMEOUT
    assert 10.0 <= took < 11.0  # first_token is 10 s; the fallback answers at once
    assert len(emulator.app.requests("primary")) == 1


async def test_stall_mid_stream_is_rescued_within_the_idle_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    transport, emulator = in_process()
    primary = route(
        "primary",
        "http://primary.test/v1",
        [{"type": "stall", "after_events": 3, "seconds": 600}],
    )
    routing = RoutingPolicy([primary, route("fallback", "http://fallback.test/v1")])
    events, took = await run(routing, transport)
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert [(r.route, r.discard_partial) for r in retries(events)] == [("fallback", True)]
    assert 5.0 <= took < 6.0  # the idle timeout (5 s), then the fallback at once
    assert len(emulator.app.requests("primary")) == 1  # a stalled route is not retried


@pytest.mark.parametrize("backend", list(ApiBackend), ids=lambda b: b.value)
async def test_no_done_marker(autojump_clock: trio.abc.Clock, backend: ApiBackend) -> None:
    # The whole reply but its final event (Chat's ``data: [DONE]``, Messages'
    # ``message_stop``, Responses' ``response.completed``), then a clean end of body.
    transport, app = models(primary={"faults": [{"type": "no_terminator"}]})
    routing = RoutingPolicy([model_route("primary", backend=backend), model_route("fallback")])
    events, _ = await run(routing, transport)
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == TEXT
    assert end.metrics is not None
    if backend is ApiBackend.RESPONSES:
        # Without response.completed the reply never said it was done: a cut stream,
        # never a Completed; the fallback serves the answer.
        assert end.route == "fallback"
        assert [a.outcome for a in end.metrics.attempts][:-1] == [F] * 3
    else:
        # The stop reason and usage arrived before the missing terminator: whole.
        assert end.route == "primary"
        assert attempts_by_route(end) == [("primary", C)]
        assert not requests_for(app, "fallback")


async def test_a_cut_before_the_finish_is_never_reported_completed(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Text, then the body ends: no finish reason, no [DONE]. A truncated answer is never a
    # Completed: the fallback serves the whole one.
    cut = ScriptedTransport([Reply(chunks=[chat_chunk({"content": TEXT[:20]})])])
    transport = HostTransport(primary=cut, fallback=EmulatorTransport())
    routing = RoutingPolicy(
        [route("primary", "http://primary.test/v1"), route("fallback", "http://fallback.test/v1")]
    )
    events, _ = await run(routing, transport)
    end = served(events, "fallback")
    assert [a.route for a in end.metrics.attempts if a.outcome is C] == ["fallback"]  # type: ignore[union-attr]


@pytest.mark.parametrize("then", ["drop", "end"])
async def test_a_stall_the_server_closes_before_the_idle_timer_fails_over(
    autojump_clock: trio.abc.Clock, then: str
) -> None:
    # Text, then 4.9 s of silence (the idle timeout is 5 s), then the server closes the
    # stream (a reset, or a clean end without a finish). A stall, routed as one: not
    # retried on the primary as a transport error.
    stalled = Reply(chunks=[chat_chunk({"content": TEXT[:20]}), 4.9], then=then)
    cut = ScriptedTransport([stalled])
    transport = HostTransport(primary=cut, fallback=EmulatorTransport())
    routing = RoutingPolicy(
        [route("primary", "http://primary.test/v1"), route("fallback", "http://fallback.test/v1")]
    )
    events, took = await run(routing, transport)
    end = served(events, "fallback")
    assert attempts_by_route(end) == [("primary", F), ("fallback", C)]
    assert end.metrics is not None
    stall = end.metrics.attempts[0]
    assert stall.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert len(cut.requests) == 1
    assert 4.9 <= took < 5.5


class RoundTrip(httpx2.AsyncBaseTransport):
    """Every exchange takes ``seconds`` on the clock before it is answered (a network's
    round trip, under the mock clock)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds

    async def __aenter__(self) -> RoundTrip:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await trio.sleep(self.seconds)
        return await self.inner.handle_async_request(request)


# The breaker's schedule is counted from each probe's start, so it holds whatever the
# round trip: with one of 1 ms or 20 ms, a probe used to reopen the circuit from its
# answer, and every later request arrived just before the circuit half-opened.
@pytest.mark.parametrize("round_trip", [0.0, 0.001, 0.02], ids=["0ms", "1ms", "20ms"])
async def test_primary_down_for_a_minute_is_returned_to_after_recovery(
    autojump_clock: trio.abc.Clock, round_trip: float
) -> None:
    recovered_at = 60.0
    # Down for the emulator's first minute (its clock starts now), then healthy.
    outage = {"type": "status", "status": 503, "until_s": recovered_at}
    emulator, app = models(primary={"faults": [outage]})
    transport = RoundTrip(emulator, round_trip)
    changes: list[BreakerTransition] = []
    routing = RoutingPolicy(
        [model_route("primary"), model_route("fallback")], on_breaker_change=changes.append
    )
    served_by: list[tuple[float, str | None]] = []
    config = routing.routes[0].config
    async with transport, open_sampler(config, routing=routing, transport=transport) as s:
        app.start_clock()
        start = trio.current_time()
        for n in range(20):
            await trio.sleep_until(start + 4.0 * n)
            stream = await s.submit(REQUEST)
            end = await _terminal(stream)
            assert isinstance(end, Completed), end
            assert end.response.text == TEXT
            served_by.append((trio.current_time() - start, end.route))
    during = [by for at, by in served_by if at < recovered_at]
    assert set(during) == {"fallback"}  # every request answered during the outage
    back = next(at for at, by in served_by if by == "primary")
    assert recovered_at <= back <= recovered_at + 30.0
    assert all(by == "primary" for at, by in served_by if at > back)
    # No probe storm: the outage cost the primary its trip (5 failures) and one probe per
    # open interval (5, 10, 20, 30 s).
    failed_on_primary = len(requests_for(app, "primary")) - sum(
        1 for _, by in served_by if by == "primary"
    )
    assert failed_on_primary <= 9
    states = [(c.old, c.new) for c in changes]
    assert states[0] == (BreakerState.CLOSED, BreakerState.OPEN)
    assert states[-1] == (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    # Each failed probe doubles the open interval, capped at max_open_s (30 s).
    opens = [c.open_for_s for c in changes if c.new is BreakerState.OPEN]
    assert opens == pytest.approx([5.0, 10.0, 20.0, 30.0], abs=2 * round_trip)


async def test_fallback_rejecting_prefill_with_the_real_refusal(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The primary's stream is cut after "The quick brown fo". The fallback is declared as
    # accepting prefill, but the model refuses one (a newer model), with the provider's
    # real 400. That refusal is not the request's error: the fallback restarts.
    transport, app = models(
        primary={"faults": [{"type": "drop", "after_events": 4}]},
        fallback={"accepts_prefill": False},
    )
    routing = RoutingPolicy(
        [
            model_route("primary", retry=RetryPolicy(max_retries=0)),
            model_route(
                "fallback",
                backend=ApiBackend.MESSAGES,
                capabilities=RouteCapabilities(accepts_prefill=True),
            ),
        ],
        continue_by_prefill=True,
    )
    events, took = await run(routing, transport)
    end = served(events, "fallback", model="fallback")
    assert attempts_by_route(end) == [("primary", F), ("fallback", F), ("fallback", C)]
    assert end.metrics is not None
    assert end.metrics.attempts[1].kind is SamplingErrorKind.INVALID_REQUEST
    assert [(r.route, r.discard_partial) for r in retries(events)] == [
        ("fallback", False),
        ("fallback", True),
    ]
    assert collect(events).text == TEXT
    sent = [r["body"]["messages"][-1] for r in requests_for(app, "fallback")]
    assert sent[0]["role"] == "assistant" and sent[1]["role"] == "user"
    assert took < 1.0


async def test_a_refused_continuation_from_a_hand_written_server(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The primary's stream is cut after "The quick brown fox"; the fallback declares
    # accepts_prefill, so the chain continues there, but the fallback refuses the prefill.
    # The refusal is not the request's error: the fallback restarts and serves it whole.
    shown = [chat_chunk({"content": "The quick "}), chat_chunk({"content": "brown fox"})]
    cut = ScriptedTransport([Reply(chunks=shown, then="drop")])
    refusal = Reply(
        status=400,
        headers={"content-type": "application/json"},
        chunks=[
            b'{"error": {"type": "invalid_request_error", '
            b'"message": "This model does not support assistant message prefill."}}'
        ],
    )
    fallback = ScriptedTransport([refusal, Reply(chunks=chat_stream(TEXT))])
    primary = route("primary", "http://primary.test/v1")
    primary = attrs.evolve(primary, config=primary.config.evolve(retry=RetryPolicy(max_retries=0)))
    routing = RoutingPolicy(
        [
            primary,
            route(
                "fallback",
                "http://fallback.test/v1",
                capabilities=RouteCapabilities(accepts_prefill=True),
            ),
        ],
        continue_by_prefill=True,
    )
    events, took = await run(routing, HostTransport(primary=cut, fallback=fallback))
    end = served(events, "fallback", model="test-model")
    assert attempts_by_route(end) == [("primary", F), ("fallback", F), ("fallback", C)]
    assert end.metrics is not None
    assert [a.kind for a in end.metrics.attempts] == [
        SamplingErrorKind.TRANSPORT,
        SamplingErrorKind.INVALID_REQUEST,
        None,
    ]
    assert [(r.route, r.discard_partial) for r in retries(events)] == [
        ("fallback", False),
        ("fallback", True),
    ]
    assert collect(events).text == TEXT
    assert took < 1.0


async def test_the_total_timeout_bounds_the_whole_chain(autojump_clock: trio.abc.Clock) -> None:
    silent = ScriptedTransport([Reply(delay_headers=float("inf"))])
    routing = RoutingPolicy(
        [route("primary", "http://primary.test/v1"), route("fallback", "http://fallback.test/v1")]
    )
    bounded = routing.routes[0].config.evolve(
        timeouts=Timeouts(first_token=10.0, idle=5.0, response_headers=10.0, total=15.0)
    )
    transport = HostTransport(primary=silent, fallback=silent)
    async with transport, open_sampler(bounded, routing=routing, transport=transport) as sampler:
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        events = [event async for event in stream]
        took = trio.current_time() - start
    end = events[-1]
    assert isinstance(end, Failed) and end.error.error_code == "total_timeout"
    assert took == pytest.approx(15.0, abs=0.01)
    # The fallback's attempt was cut short by the budget: recorded as cancelled.
    assert attempts_by_route(end) == [("primary", F), ("fallback", AttemptOutcome.CANCELLED)]
