"""One request, from Submit to its terminal: attempts, retries, timeouts, doom loops.

Everything that can fail is caught *inside* an attempt and becomes data (a
:class:`SamplingErrorInfo`); the retry loop turns data into the next step; the terminal
is delivered synchronously from ``finally``. So nothing escapes into the actor, and the
"exactly one terminal" rule holds on every path, cancellation included.

Timers are deadlines on the body read, not watchdog tasks: before the first content
event the deadline is ``first_token`` after the headers; after it, ``idle`` after the last
content event (pings and SSE comments produce no content events, so they do not keep a
dead stream alive). Connect and response-header timeouts live in the client; the
optional ``total`` timeout is a cancel scope around all attempts.
"""

from __future__ import annotations

import math
import random

import attrs
import trio

from .._by_identity import ByIdentity
from ..admission import (
    AdmissionBusyError,
    AdmissionGate,
    AdmissionRefusedError,
    BreakerSharing,
    RateLimitObserver,
    RouteChoosingGate,
    RoutedGate,
)
from ..client import ResponseStream, SamplingClient, SamplingClientError
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy, TailRepetitionDetector, parse_trigger
from ..models import ModelCatalog
from ..retry import Decision, RetryAction, RetryBudget, classify
from ..routing import (
    CircuitBreaker,
    HedgePolicy,
    Route,
    RouteAction,
    RouteBreaker,
    RouteState,
    RoutingPolicy,
    ends_in_prefill,
    hedge_delay,
    route_action,
    unsupported_by,
)
from ..types import (
    ApiBackend,
    Assistant,
    AttemptOutcome,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    ImagesStripped,
    RateLimitSnapshot,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    StreamStarted,
    StripReason,
    TerminalEvent,
    Usage,
)
from ..wire import (
    BuildOptions,
    SSEDecodeError,
    SSEDecoder,
    StreamTransform,
    WireRequest,
    build_request,
    new_transform,
)
from ..wire._replay import decode_failure
from ..wire.errors import internal_error
from ._chain import (
    Admitted,
    AttemptSink,
    FailOver,
    Lane,
    Leg,
    Prepared,
    Race,
    Skipped,
    continued,
)
from ._memory import ResponseMemory
from ._metrics import AttemptMetrics
from ._pacing import PacedAttempt, Pacers
from ._stream import CONTENT_EVENTS as _CONTENT
from ._stream import RequestState, partial_output

__all__ = ["ConnectionDrains", "RequestRunner"]

_REASONING = SamplingChannel.REASONING
#: Until an attempt's first content event, a read is parsed this much at a time, and the
#: events up to the slice that holds the first content are handed to the consumer before
#: the rest is parsed: one read often holds a whole short answer (hundreds of events),
#: and the first token should not wait for all of them (time to first token). Feeding
#: the SSE decoder a read in pieces yields the same events as feeding it whole.
_FIRST_SLICE_BYTES = 1024
# After a completed stream, read at most this much more to reuse the connection.
_DRAIN_MAX_BYTES = 64 * 1024
_DRAIN_MAX_SECONDS = 1.0


class ConnectionDrains:
    """Reads the end of completed responses in the background, for connection reuse.

    A stream's terminator is usually followed by a few bytes (the last chunk of a chunked
    body) before the connection can go back to the pool. Reading them is not the
    request's business: its ``Completed`` is delivered as soon as the terminator is
    parsed, and the drain runs afterwards in a task of the sampler's nursery, off the
    request's clock and outside its cancel scope, bounded to ``_DRAIN_MAX_BYTES`` and
    ``_DRAIN_MAX_SECONDS`` (after that the connection is closed). :meth:`close` (the
    sampler shutting down) cancels every drain: their connections are closed at once.
    """

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._scopes: set[trio.CancelScope] = set()
        self._closed = False

    def open(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def start(self, stream: ResponseStream) -> None:
        """Take ``stream`` over and drain it in the background. Without a nursery (or once
        closed) the stream is left to its ``open_stream`` block, which closes it."""
        if self._nursery is None or self._closed:
            return
        self._nursery.start_soon(self._drain, stream.detach(), name="trio_sampler connection drain")

    async def _drain(self, stream: ResponseStream) -> None:
        try:
            # One scope: the drain's time bound, and what ``close`` cancels.
            with trio.CancelScope(relative_deadline=_DRAIN_MAX_SECONDS) as scope:
                if self._closed:
                    scope.cancel()
                self._scopes.add(scope)
                try:
                    await stream.drain(max_bytes=_DRAIN_MAX_BYTES)
                finally:
                    self._scopes.discard(scope)
        finally:
            await stream.aclose()

    def close(self) -> None:
        """Cancel every drain (their connections are closed); start no more."""
        self._closed = True
        for scope in self._scopes:
            scope.cancel()


@attrs.define
class _AttemptResult:
    """How one attempt ended: a response, or an error with what had arrived."""

    response: ConversationResponse | None = None
    error: SamplingErrorInfo | None = None
    partial: ConversationResponse | None = None
    #: Content events were forwarded to the consumer (a retry must discard them).
    emitted_output: bool = False
    doom_triggers: tuple[str, ...] = ()


def _error(
    kind: SamplingErrorKind, message: str, *, retryable: bool, code: str
) -> SamplingErrorInfo:
    return SamplingErrorInfo(kind=kind, message=message, retryable=retryable, error_code=code)


#: A stream cut after this share of its read timer in silence was stalled: the server
#: closed it before the timer would have (routed as a stall, not retried in place).
STALL_CLOSE_SHARE = 0.5


def _stall_close(error: SamplingErrorInfo, timer: float, deadline: float) -> SamplingErrorInfo:
    """``error`` as a stall when it is a cut that ended a silence of at least
    :data:`STALL_CLOSE_SHARE` of the read timer (``timer`` s, firing at ``deadline``)."""
    if error.kind is not SamplingErrorKind.TRANSPORT or not timer:
        return error
    silent = trio.current_time() - (deadline - timer)
    if silent < STALL_CLOSE_SHARE * timer:
        return error
    return attrs.evolve(
        error,
        kind=SamplingErrorKind.IDLE_TIMEOUT,
        message=f"the stream stalled: {silent:.3g} s without content, then it was cut "
        f"({error.message})",
        error_code="stall_closed",
    )


class RequestRunner:
    """Runs requests for one actor; shared state is the client, the budget and the RNG."""

    def __init__(
        self,
        client: SamplingClient,
        retry_policy: RetryPolicy | None,
        doom_policy: DoomLoopPolicy,
        *,
        rng: random.Random,
        limiter: trio.CapacityLimiter | None,
        catalog: ModelCatalog | None = None,
        admission: AdmissionGate | None = None,
        routing: RoutingPolicy | None = None,
        memory: ResponseMemory | None = None,
    ) -> None:
        self._client = client
        self._memory = memory
        self._routing = routing
        #: Per route name: the state every request of the sampler shares.
        self._routes: dict[str, RouteState] = {}
        self._admission = admission
        gate: object = admission  # any gate; only routed ones have a gate per route
        #: The admission's gate per route, when it has one (asked once: a check against a
        #: runtime protocol is dozens of calls, and the admission does not change).
        self._routed = gate if isinstance(gate, RoutedGate) else None
        #: Per config: the options its requests are built with.
        self._build_options: ByIdentity[BuildOptions] = ByIdentity()
        if routing is not None:
            for route in routing.routes:
                self._route_state(route)
        self._catalog = catalog
        self._retry_policy = retry_policy
        self._doom = doom_policy
        self._rng = rng
        self._limiter = limiter
        self._budgets: dict[tuple[float, float], RetryBudget] = {}
        #: Where completed responses are drained for connection reuse (the sampler's).
        self.drains = ConnectionDrains()
        #: The rate-limit pacer of each account (base URL, key, model) the sampler uses.
        self.pacers = Pacers()

    @property
    def routes(self) -> dict[str, RouteState]:
        """Per route name, the state shared by the sampler's requests."""
        return self._routes

    def _budget(self, policy: RetryPolicy) -> RetryBudget | None:
        if policy.retry_budget_ratio is None:
            return None
        key = (policy.retry_budget_ratio, policy.retry_budget_window_s)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = RetryBudget(*key)
        return budget

    # -- the request ---------------------------------------------------------------------

    async def serve(self, state: RequestState) -> None:
        """The request task: exactly one terminal, whatever happens (see module doc), and
        ``state.task_done`` set as its last act."""
        terminal: TerminalEvent | None = None
        try:
            with state.scope:
                # Helper tasks (hedged attempts) run in a nursery of their own, opened
                # inside this scope only while they run (``_race``).
                terminal = await self._run(state)
        except Exception as exc:  # a bug of ours (a helper's: an ExceptionGroup): typed
            terminal = self._internal_error(state, exc)
        finally:
            try:
                # Cancelled: a cancel() recorded its terminal already (finish keeps the
                # first). Without a recorded reason the cancel came from a scope
                # enclosing the sampler: a shutdown too.
                if terminal is None:
                    partial = self._priced(state.partial(), state.serving)
                    terminal = Cancelled(
                        state.request_id,
                        state.cancel_reason or "the sampler was shut down",
                        partial,
                        state.metrics.build(partial),
                    )
                state.finish(terminal)
            finally:
                # The task's last act, whatever happened above.
                state.task_done.set()

    def _priced(
        self, response: ConversationResponse | None, config: SamplerConfig | None
    ) -> ConversationResponse | None:
        if response is None or config is None:
            return response
        return self._with_cost(response, config)

    def _internal_error(self, state: RequestState, exc: Exception) -> Failed:
        return Failed(
            state.request_id,
            internal_error(exc, "running the request"),
            state.partial(),
            state.metrics.build(None),
        )

    async def _run(self, state: RequestState) -> TerminalEvent:
        """The slot wait and every attempt on every route, under the one
        ``Timeouts.total`` deadline counted from submit: waiting for a ``max_concurrency``
        slot, backoff sleeps, fail-overs and a consumer that stops reading all spend it."""
        total = state.config.timeouts.total
        if not total:  # no deadline: no scope to enter and leave
            return await self._limited_chain(state)
        with trio.CancelScope(deadline=state.submitted_at + total) as total_scope:
            return await self._limited_chain(state)
        # Only reached when the total deadline fired.
        assert total_scope.cancelled_caught
        partial = self._priced(state.partial(), state.serving) or state.last_partial
        return Failed(
            state.request_id,
            _error(
                SamplingErrorKind.IDLE_TIMEOUT,
                f"the request did not finish within its total timeout of {total:g} s",
                retryable=False,
                code="total_timeout",
            ),
            partial,
            state.metrics.build(partial),
        )

    async def _limited_chain(self, state: RequestState) -> TerminalEvent:
        """The chain, in a ``max_concurrency`` slot when the sampler has a limit."""
        if self._limiter is not None:
            async with self._limiter:
                return await self._chain(state)
        return await self._chain(state)

    def _with_cost(
        self, response: ConversationResponse, config: SamplerConfig
    ) -> ConversationResponse:
        """Fill in the cost from the model catalog when the server reported none."""
        if response.cost_usd_ticks is not None or response.usage is None or self._catalog is None:
            return response
        model = response.model or config.model
        cost = self._catalog.cost_ticks(model, response.usage) if model else None
        return response if cost is None else attrs.evolve(response, cost_usd_ticks=cost)

    # -- the chain -----------------------------------------------------------------------

    def _legs(self, state: RequestState) -> list[Leg]:
        if state.chain is None:
            return [Leg(None, state.config, None, self._gate_for(None))]
        legs = []
        for route in state.chain:
            route_state = self._route_state(route)
            legs.append(Leg(route, route.config, route_state, route_state.admission))
        return legs

    def _gate_for(self, route: str | None) -> AdmissionGate | None:
        """The gate ``route``'s attempts go through: the route's own, when the admission
        has one per route (``None``: a request without routing)."""
        if self._routed is not None:
            return self._routed.for_route(route)
        return self._admission

    def _route_state(self, route: Route) -> RouteState:
        found = self._routes.get(route.name)
        if found is None or found.route is not route:
            breaker: CircuitBreaker | None = None
            routing = self._routing
            if routing is not None and routing.breaker is not None:
                breaker = RouteBreaker(route.name, routing.breaker, routing.on_breaker_change)
                gate: object = self._admission  # a gate may share the breaker (a fleet's)
                if isinstance(gate, BreakerSharing):
                    breaker = gate.share_breaker(route.name, breaker)
            found = self._routes[route.name] = RouteState(
                route, breaker, admission=self._gate_for(route.name)
            )
        return found

    async def _chain(self, state: RequestState) -> TerminalEvent:
        """Run the request along its chain of routes (one leg without routing): each
        route until it serves the request, or the routing table sends the request on
        (``trio_sampler.routing.ROUTING``), or ends it."""
        legs = self._legs(state)
        metrics = state.metrics
        failure: FailOver | None = None
        for index, leg in enumerate(legs):
            reason = self._unsuitable(leg, state.request, failure)
            if reason is not None:
                assert leg.route is not None  # a sampler without routing skips nothing
                metrics.skip(leg.route.name, reason)
                continue
            later = [
                other
                for other in legs[index + 1 :]
                if self._unsuitable(other, state.request, failure) is None and other.available
            ]
            held = self._rate_limit_hold(leg, later)
            if held is not None:
                assert leg.route is not None and leg.state is not None
                leg.state.passed_over_rate_limit += 1
                metrics.skip(leg.route.name, held)
                continue
            # Asking the route's admission while choosing is worth it only when a later
            # route is admitted elsewhere (routes of one limiter share its budget).
            steer = any(other.admission is not leg.admission for other in later)
            result = await self._attempts(
                state,
                leg,
                failure,
                has_next=bool(later),
                hedge_leg=later[0] if later else None,
                steer=steer,
            )
            if isinstance(result, Skipped):
                assert leg.route is not None and leg.state is not None
                if result.by_admission:
                    leg.state.passed_over_admission += 1
                metrics.skip(leg.route.name, result.reason)
                continue
            if isinstance(result, FailOver):
                failure = result
                continue
            return result
        if failure is not None:
            error = failure.error
            if failure.action is RouteAction.LARGER_WINDOW:
                error = attrs.evolve(
                    error, message=f"{error.message} (no route with a larger context window)"
                )
            return Failed(state.request_id, error, failure.partial, metrics.build(failure.partial))
        skipped = "; ".join(f"{name}: {why}" for name, why in metrics.skipped)
        return Failed(
            state.request_id,
            _error(
                SamplingErrorKind.OVERLOADED,
                f"no route could take the request ({skipped})",
                retryable=True,
                code="no_route",
            ),
            None,
            metrics.build(None),
        )

    def _rate_limit_hold(self, leg: Leg, later: list[Leg]) -> str | None:
        """Why the chain passes over ``leg`` for its rate limit (``None``: it does not).

        A route whose account is held by a 429 (until its ``Retry-After`` or reset), or
        whose pacer would hold the attempt longer than ``max_retry_wait_s``, is passed
        over while a later route could take the request at once; the last route that
        can take it waits instead."""
        routing = self._routing
        if leg.route is None or routing is None:
            return None
        now = trio.current_time()
        wait = self._pacing_delay(leg.config, now)
        if wait <= routing.max_retry_wait_s:
            return None
        if not any(
            self._pacing_delay(other.config, now) <= routing.max_retry_wait_s for other in later
        ):
            return None
        pacer = self.pacers.for_config(leg.config)
        why = "a 429" if pacer is not None and pacer.blocked_until > now else "its budget"
        return f"rate limited ({why}): no room for {wait:.3g} s"

    def _pacing_delay(self, config: SamplerConfig, now: float) -> float:
        pacer = self.pacers.for_config(config)
        return 0.0 if pacer is None else pacer.delay(now)

    @staticmethod
    def _unsuitable(leg: Leg, request: ConversationRequest, failure: FailOver | None) -> str | None:
        """Why the chain passes over ``leg`` for this request (``None``: it does not)."""
        if leg.route is None:
            return None
        reason = unsupported_by(leg.route, request)
        if reason is not None:
            return reason
        if failure is not None and failure.min_window is not None:
            window = leg.route.capabilities.context_window
            if window is None or window <= failure.min_window:
                return (
                    f"its context window ({window or 'unknown'}) is not larger than "
                    f"{failure.min_window} tokens, which the request exceeded"
                )
        return None

    async def _fail_over(
        self, state: RequestState, failure: FailOver, leg: Leg, *, continuing: bool
    ) -> None:
        """Tell the consumer the next attempt goes to ``leg``: what the failed route
        streamed is discarded, unless the new attempt continues it."""
        await self._emit_retry(
            state,
            state.metrics.started,
            (self._retry_policy or leg.config.retry).max_retries,
            failure.error,
            0.0,
            failure.emitted and not continuing,
            (),
            leg.name,
        )

    def _continuation(self, state: RequestState, leg: Leg, failure: FailOver | None) -> str | None:
        """The text a fail-over may continue by prefill on ``leg`` (``None``: restart).

        Only with ``RoutingPolicy.continue_by_prefill``, to a route that declares
        ``accepts_prefill``, after an attempt that streamed text and nothing else (no
        reasoning, tool calls or refusal, whose state a prefill cannot carry), ending
        in a non-space (providers reject a prefill with trailing whitespace), for a
        request that does not end in a prefill of its own."""
        routing = self._routing
        if failure is None or not failure.emitted or routing is None:
            return None
        if not routing.continue_by_prefill or leg.route is None:
            return None
        if not leg.route.capabilities.accepts_prefill or ends_in_prefill(state.request):
            return None
        partial = failure.partial
        if partial is None or partial.tool_calls or partial.refusal:
            return None
        if partial.reasoning_items or partial.backend_tool_calls:
            return None
        text = partial.text
        return text if text and text == text.rstrip() else None

    def _routing_verdict(
        self,
        leg: Leg,
        error: SamplingErrorInfo,
        emitted: bool,
        decision: Decision,
        partial: ConversationResponse | None,
        *,
        has_next: bool,
    ) -> FailOver | None:
        """The routing table's verdict after a failed attempt on a route: move on to the
        next route (a :class:`FailOver`), or ``None``: the retry policy decides."""
        if leg.route is None:
            return None
        action = route_action(error)
        if action is RouteAction.LARGER_WINDOW:
            window = leg.route.capabilities.context_window or 0
            return FailOver(error, partial, emitted, action, min_window=window)
        if action is RouteAction.SURFACE or not has_next:
            return None
        fail_over = FailOver(error, partial, emitted, action)
        if action is RouteAction.NEXT or decision.action is RetryAction.FAIL:
            return fail_over
        assert self._routing is not None
        if decision.delay > self._routing.max_retry_wait_s:
            return fail_over
        if leg.blocked(trio.current_time()) is not None:  # the circuit opened meanwhile
            return fail_over
        return None

    def _end_cancelled(
        self,
        state: RequestState,
        leg: Leg,
        attempt: AttemptMetrics,
        config: SamplerConfig,
        sink: AttemptSink | None = None,
    ) -> None:
        """An attempt cut short by the request's cancel or total timeout: recorded with
        the usage it had reached; the route is not blamed. Synchronous (it runs while
        the request is being cancelled)."""
        partial = self._priced(partial_output((sink or state).transform), config)
        state.metrics.end_attempt(
            attempt,
            trio.current_time(),
            None,
            outcome=AttemptOutcome.CANCELLED,
            usage=None if partial is None else partial.usage,
            cost_usd_ticks=None if partial is None else partial.cost_usd_ticks,
        )
        leg.abandon(trio.current_time())

    # -- one route -----------------------------------------------------------------------

    async def _attempts(
        self,
        state: RequestState,
        leg: Leg,
        failure: FailOver | None,
        *,
        has_next: bool,
        hedge_leg: Leg | None = None,
        steer: bool = False,
    ) -> TerminalEvent | FailOver | Skipped:
        """Attempts on one route: its retry policy, then the routing table's verdict.

        ``has_next``: another route could take the request after this one (without
        routing, never: the retry policy alone decides, as it always has). ``steer``: a
        later route is admitted by another gate, so this route's admission is asked to
        admit its first attempt within ``max_retry_wait_s`` or have it passed over."""
        config = leg.config
        state.serving = config
        metrics = state.metrics
        policy = self._retry_policy or config.retry
        budget = self._budget(policy)
        request = state.request
        retries = 0
        resamples = 0
        consecutive_rate_limits = 0
        images_stripped = False
        doom_max = self._doom.max_resamples
        if not self._doom.enabled or policy.max_retries == 0:
            doom_max = 0
        last_partial: ConversationResponse | None = None
        model = request.model or config.model
        prefix = self._continuation(state, leg, failure)
        if prefix is not None:
            request = attrs.evolve(request, items=(*request.items, Assistant(prefix)))
        first = True
        prepared: Prepared | None = None
        while True:
            if first:
                # The breaker is asked once per route (a half-open circuit admits one
                # probe); a retry on the route asks again in ``_routing_verdict``.
                blocked = leg.blocked(trio.current_time())
                if blocked is not None:
                    return Skipped(blocked)
                if steer:
                    # The route's shared admission has its say while the route is chosen.
                    chosen = await self._ask_route(state, leg, request, armed=doom_max > 0)
                    if isinstance(chosen, Skipped):
                        leg.abandon(trio.current_time())
                        return chosen
                    prepared = chosen
                try:
                    if budget is not None and metrics.started == 0:  # the first attempt
                        budget.record_request(trio.current_time())
                    if failure is not None:
                        await self._fail_over(state, failure, leg, continuing=prefix is not None)
                except BaseException:
                    if prepared is not None:
                        await self._discard(prepared)
                    raise
                first = False
            armed = resamples < doom_max
            hedge = self._routing.hedge if self._routing is not None else None
            served = leg  # the route of the attempt the loop judges (a hedge's may differ)
            if hedge is not None and leg.state is not None:
                # A continuation is hedged on its own route: the prefill was chosen for it.
                target = leg
                if hedge.next_route and hedge_leg is not None and prefix is None:
                    target = hedge_leg
                try:
                    result, attempt_metrics, served = await self._race(
                        state, request, leg, target, hedge, armed=armed, prepared=prepared
                    )
                finally:
                    if prepared is not None:  # the first lane takes it; if it never ran:
                        await self._discard(prepared)
                    prepared = None
            else:
                attempt_metrics = metrics.start_attempt(trio.current_time(), leg.name, model)
                admitted: list[Admitted] = []
                result = None
                try:
                    result = await self._attempt(
                        state,
                        request,
                        config,
                        attempt_metrics,
                        armed=armed,
                        attempt=metrics.started,
                        admitted=admitted,
                        gate=leg.admission,
                        prepared=prepared,
                    )
                finally:
                    prepared = None
                    if admitted:
                        await self._settle(admitted[0], state, result)
                    if result is None:  # cancelled: the request's cancel or its total timeout
                        self._end_cancelled(state, leg, attempt_metrics, config)
            assert result is not None
            error = result.error
            usage_from = result.response if result.response is not None else result.partial
            priced = self._priced(usage_from, served.config)
            ended_at = trio.current_time()
            metrics.end_attempt(
                attempt_metrics,
                ended_at,
                error,
                usage=None if priced is None else priced.usage,
                cost_usd_ticks=None if priced is None else priced.cost_usd_ticks,
            )
            served.record(error, ended_at, attempt_metrics)
            if result.response is not None:
                assert priced is not None
                metrics.route = served.name
                response = priced if prefix is None else continued(priced, prefix)
                return Completed(
                    state.request_id,
                    response,
                    metrics.build(response),
                    route=served.name,
                    model=priced.model or attempt_metrics.model,
                )
            assert error is not None
            # A partial is billed too: priced like a response.
            last_partial = state.last_partial = priced
            # The consumer may still hold the continued text: the next attempt discards it.
            emitted = result.emitted_output or prefix is not None
            if prefix is not None:
                # A continuation that failed is not tried again: what follows starts over.
                # A refused prefill is the route's answer to the continuation, not to the
                # request, so it never becomes the request's error: restart at once.
                prefix, request = None, state.request
                if error.kind is SamplingErrorKind.INVALID_REQUEST:
                    await self._emit_retry(
                        state, metrics.started, policy.max_retries, error, 0.0, True, (), leg.name
                    )
                    continue
            if error.kind is SamplingErrorKind.DOOM_LOOP_DETECTED and armed:
                resamples += 1
                await self._emit_retry(
                    state,
                    resamples,
                    doom_max,
                    error,
                    self._rng.uniform(0.0, 0.25),
                    emitted,
                    result.doom_triggers,
                    leg.name,
                )
                continue
            if emitted and not policy.retry_mid_stream:
                return Failed(state.request_id, error, last_partial, metrics.build(last_partial))
            decision = classify(
                error,
                retries,
                policy,
                consecutive_rate_limits=consecutive_rate_limits,
                images_stripped=images_stripped,
                uniform=self._rng.random,
            )
            if decision.action is RetryAction.STRIP_IMAGES:
                request, urls = request.strip_images()
                images_stripped = True
                if not urls:
                    return Failed(
                        state.request_id, error, last_partial, metrics.build(last_partial)
                    )
                reason = (
                    StripReason.SERVER_REJECTED
                    if (error.error_code or "") == "invalid_image" and error.status_code == 400
                    else StripReason.PAYLOAD_HEURISTIC
                )
                await state.emit([ImagesStripped(state.request_id, urls, reason)])
                retries += 1
                await self._emit_retry(
                    state,
                    retries,
                    policy.max_retries,
                    error,
                    0.0,
                    emitted,
                    (),
                    leg.name,
                )
                continue
            fail_over = self._routing_verdict(
                leg, error, emitted, decision, last_partial, has_next=has_next
            )
            if fail_over is not None:
                return fail_over
            if decision.action is RetryAction.FAIL:
                return Failed(state.request_id, error, last_partial, metrics.build(last_partial))
            spent = None
            if budget is not None and not budget.try_spend(trio.current_time()):
                spent = "the retry budget"
            elif leg.admission is not None and not await leg.admission.retry_allowed(error):
                spent = "the fleet retry budget"
            if spent is not None:
                message = f"{error.message} (not retried: {spent} is spent)"
                return Failed(
                    state.request_id,
                    attrs.evolve(error, message=message),
                    last_partial,
                    metrics.build(last_partial),
                )
            consecutive_rate_limits = (
                consecutive_rate_limits + 1 if error.kind is SamplingErrorKind.RATE_LIMITED else 0
            )
            retries += 1
            await self._emit_retry(
                state,
                retries,
                policy.max_retries,
                error,
                decision.delay,
                emitted,
                (),
                leg.name,
            )

    # -- hedged attempts ------------------------------------------------------------------

    async def _race(
        self,
        state: RequestState,
        request: ConversationRequest,
        leg: Leg,
        target: Leg,
        hedge: HedgePolicy,
        *,
        armed: bool,
        prepared: Prepared | None = None,
    ) -> tuple[_AttemptResult, AttemptMetrics, Leg]:
        """One attempt on ``leg``, and another on ``target`` (the same route, or the next
        with ``HedgePolicy.next_route``) each time the hedge delay passes with no content
        yet, up to ``max_hedges``; all are tasks of a nursery inside the request's scope.
        The first to produce content wins and the others are cancelled (recorded as lost
        hedges, with whatever usage they had). Returns the result the retry loop judges —
        the winner's, or, if neither produced content, the last to end — with its
        attempt's timings (not yet ended in the metrics) and its route."""
        assert leg.state is not None
        delay = hedge_delay(hedge, list(leg.state.ttft_s))
        race = Race(state)
        try:
            async with trio.open_nursery() as nursery:
                self._start_lane(nursery, race, request, leg, armed, prepared)
                for _ in range(hedge.max_hedges):
                    with trio.move_on_after(delay):
                        await race.settled.wait()
                    # A half-open circuit has admitted its one probe: no hedge beside it.
                    if race.settled.is_set() or target.blocked(trio.current_time()) is not None:
                        break
                    self._start_lane(nursery, race, request, target, armed)
        except BaseException:  # the request's cancel or total timeout: every lane ends
            for lane in race.lanes:
                if lane.result is None:
                    self._end_cancelled(state, lane.leg, lane.metrics, lane.leg.config, lane)
            raise
        # The winner; or, if neither produced content, the one that ended last.
        chosen = race.winner or race.ended[-1]
        for lane in race.lanes:
            if lane is not chosen:
                self._end_lane(state, lane)
        state.transform = chosen.transform
        state.serving = chosen.leg.config
        state.metrics.current = chosen.metrics  # the request's timings are the winner's
        assert chosen.result is not None
        return chosen.result, chosen.metrics, chosen.leg

    def _start_lane(
        self,
        nursery: trio.Nursery,
        race: Race,
        request: ConversationRequest,
        leg: Leg,
        armed: bool,
        prepared: Prepared | None = None,
    ) -> None:
        model = request.model or leg.config.model
        metrics = race.state.metrics.start_attempt(trio.current_time(), leg.name, model)
        lane = Lane(race, metrics, leg)
        race.lanes.append(lane)
        nursery.start_soon(self._run_lane, race, lane, request, armed, prepared)

    async def _run_lane(
        self,
        race: Race,
        lane: Lane,
        request: ConversationRequest,
        armed: bool,
        prepared: Prepared | None,
    ) -> None:
        try:
            with lane.scope:
                lane.result = await self._attempt(
                    lane,
                    request,
                    lane.leg.config,
                    lane.metrics,
                    armed=armed,
                    attempt=lane.metrics.number,
                    admitted=lane.admitted,
                    gate=lane.leg.admission,
                    prepared=prepared,
                )
        finally:
            if lane.admitted:
                await self._settle(lane.admitted[0], lane, lane.result)
            if lane.result is not None:
                race.ended.append(lane)
            if race.winner is None and len(race.ended) == len(race.lanes):
                race.settled.set()  # every lane has ended without content

    def _end_lane(self, state: RequestState, lane: Lane) -> None:
        """Record a lane that is not the race's result: a lost hedge (cancelled), or an
        attempt that failed by itself while the other went on."""
        leg = lane.leg
        now = trio.current_time()
        result = lane.result
        if result is None:
            if not lane.metrics.sent:  # cancelled while the pacer or admission held it
                state.metrics.drop_attempt(lane.metrics)
                leg.abandon(now)
                return
            partial = self._priced(lane.partial(), leg.config)
            state.metrics.end_attempt(
                lane.metrics,
                now,
                None,
                outcome=AttemptOutcome.LOST_HEDGE,
                usage=None if partial is None else partial.usage,
                cost_usd_ticks=None if partial is None else partial.cost_usd_ticks,
            )
            leg.abandon(now)
            return
        priced = self._priced(result.partial, leg.config)
        state.metrics.end_attempt(
            lane.metrics,
            now,
            result.error,
            usage=None if priced is None else priced.usage,
            cost_usd_ticks=None if priced is None else priced.cost_usd_ticks,
        )
        leg.record(result.error, now, lane.metrics)

    async def _settle(
        self, admitted: Admitted, state: AttemptSink, result: _AttemptResult | None
    ) -> None:
        """Tell the admission how an attempt ended (shielded: it runs on cancellation too;
        the admission bounds its own time)."""
        gate, ticket = admitted
        usage: Usage | None = None
        if result is not None and result.response is not None:
            usage = result.response.usage
        elif result is not None and result.partial is not None:
            usage = result.partial.usage
        elif state.transform is not None:
            usage = state.transform.usage
        with trio.CancelScope(shield=True):
            await gate.settle(ticket, usage)

    async def _discard(self, prepared: Prepared) -> None:
        """A prepared attempt that will not be sent: its reservations go back (shielded)."""
        if prepared.taken:
            return
        prepared.taken = True
        if prepared.paced is not None:
            prepared.paced.withdraw()
        if prepared.admitted is not None:
            gate, ticket = prepared.admitted
            assert isinstance(gate, RouteChoosingGate)
            with trio.CancelScope(shield=True):
                await gate.withdraw(ticket)

    async def _ask_route(
        self, state: RequestState, leg: Leg, request: ConversationRequest, *, armed: bool
    ) -> Prepared | Skipped | None:
        """The route's first attempt, prepared while the chain chooses the route: its
        body, its place in the pacer, and the route's shared admission asked to admit
        within ``max_retry_wait_s`` (one round trip). A route whose admission has no room
        in time is :class:`Skipped` (nothing reserved); ``None``: nothing to ask (the
        attempt prepares itself)."""
        gate: object = leg.admission  # any gate; only choosing ones are asked here
        routing = self._routing
        if routing is None or not isinstance(gate, RouteChoosingGate):
            return None
        config = leg.config
        wire = self._wire(request, config, armed)
        if isinstance(wire, SamplingErrorInfo):
            return None  # the attempt reports it
        started_at = trio.current_time()
        scratch = AttemptMetrics(0, started_at, leg.name, None)
        deadline = self._deadline(state, config)
        paced = await self.pacers.admit(
            config,
            wire,
            scratch,
            deadline=deadline,
            request_id=state.request_id,
            announce=state.emit,
        )
        if isinstance(paced, SamplingErrorInfo):
            return Prepared(wire, None, None, started_at, scratch.paced_s, error=paced)
        try:
            ticket = await gate.try_admit(
                wire,
                config,
                within=routing.max_retry_wait_s,
                deadline=deadline,
                first_attempt=state.metrics.started == 0,
            )
        except BaseException as exc:  # not admitted: the pacer's place goes back
            if paced is not None:
                paced.withdraw()
            if isinstance(exc, AdmissionBusyError):
                return Skipped(exc.reason, by_admission=True)
            if not isinstance(exc, AdmissionRefusedError):
                raise
            if exc.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE:
                # This route's limiter fails closed; a later route's may not.
                return Skipped(f"fleet unavailable ({exc.info.message})", by_admission=True)
            return Prepared(wire, None, None, started_at, scratch.paced_s, error=exc.info)
        assert leg.admission is not None
        return Prepared(wire, paced, (leg.admission, ticket), started_at, scratch.paced_s)

    async def _emit_retry(
        self,
        state: RequestState,
        attempt: int,
        max_retries: int,
        error: SamplingErrorInfo,
        delay: float,
        discard: bool,
        triggers: tuple[str, ...],
        route: str | None = None,
    ) -> None:
        # The attempt's partial output is discarded once the Retrying is handed over.
        await state.emit_retry(
            [
                Retrying(
                    state.request_id,
                    attempt,
                    max_retries,
                    error.kind,
                    error.message,
                    delay,
                    discard,
                    triggers,
                    route,
                )
            ]
        )
        await trio.sleep(delay)

    # -- one attempt ---------------------------------------------------------------------

    @staticmethod
    def _deadline(sink: AttemptSink, config: SamplerConfig) -> float:
        """When the attempt's waits must end, on trio's clock: the request's
        ``Timeouts.total`` (its sampler's, or its own config's), or its route's if shorter."""
        request = sink.race.state if isinstance(sink, Lane) else sink
        assert isinstance(request, RequestState)
        totals = [t for t in (request.config.timeouts.total, config.timeouts.total) if t]
        return sink.submitted_at + min(totals) if totals else math.inf

    def _options(self, config: SamplerConfig) -> BuildOptions:
        """``config.build_options()``, made once per config (a few per sampler; bounded)."""
        options = self._build_options.get(config)
        if options is None:
            options = self._build_options.put(config, config.build_options())
        return options

    def _wire(
        self, request: ConversationRequest, config: SamplerConfig, armed: bool
    ) -> WireRequest | SamplingErrorInfo:
        """The attempt's body, or why the backend cannot carry the request."""
        try:
            wire = build_request(config.backend, request, self._options(config))
        except ValueError as exc:  # a request the backend cannot carry (anything else: ours)
            return _error(
                SamplingErrorKind.INVALID_REQUEST, str(exc), retryable=False, code="invalid_request"
            )
        doom_header = config.profile.doom_loop_header if config.profile is not None else None
        if armed and doom_header and config.backend is ApiBackend.RESPONSES:
            wire = attrs.evolve(
                wire, headers=(*wire.headers, (doom_header, str(self._doom.window_tokens)))
            )
        return wire

    async def _attempt(
        self,
        state: AttemptSink,
        request: ConversationRequest,
        config: SamplerConfig,
        metrics: AttemptMetrics,
        *,
        armed: bool,
        attempt: int,
        admitted: list[Admitted],
        gate: AdmissionGate | None,
        prepared: Prepared | None = None,
    ) -> _AttemptResult:
        """One attempt: its body, the pacer, the admission (``gate``), the stream. A
        ``prepared`` attempt (the chain asked its route while choosing it) has its body,
        pacer place and admission already, and is taken over here before any checkpoint."""
        if prepared is not None:
            prepared.taken = True
            metrics.started_at = prepared.started_at
            metrics.paced_s = prepared.paced_s
            if prepared.admitted is not None:
                admitted.append(prepared.admitted)
            if prepared.error is not None:
                return _AttemptResult(error=prepared.error)
            wire = prepared.wire
            paced = prepared.paced
            gate = None  # admitted already
        else:
            built = self._wire(request, config, armed)
            if isinstance(built, SamplingErrorInfo):
                return _AttemptResult(error=built)
            wire = built
            deadline = self._deadline(state, config)
            admission = await self.pacers.admit(
                config,
                wire,
                metrics,
                deadline=deadline,
                request_id=state.request_id,
                announce=state.emit,
            )
            if isinstance(admission, SamplingErrorInfo):
                return _AttemptResult(error=admission)
            paced = admission
        result: _AttemptResult | None = None
        try:
            result = await self._admitted_attempt(
                state,
                wire,
                config,
                metrics,
                paced,
                armed=armed,
                attempt=attempt,
                admitted=admitted,
                gate=gate,
            )
            return result
        finally:
            if paced is not None:
                paced.withdraw()  # unless it was sent: then the pacer keeps the cost
                if result is not None:
                    done = result.response if result.response is not None else result.partial
                    paced.ended(None if done is None else done.usage)

    async def _admitted_attempt(
        self,
        state: AttemptSink,
        wire: WireRequest,
        config: SamplerConfig,
        metrics: AttemptMetrics,
        paced: PacedAttempt | None,
        *,
        armed: bool,
        attempt: int,
        admitted: list[Admitted],
        gate: AdmissionGate | None,
    ) -> _AttemptResult:
        """The attempt once the rate-limit pacer let it go: the admission (by ``gate``,
        unless it was admitted already), the stream."""
        if gate is not None:
            try:
                ticket = await gate.admit(
                    wire,
                    config,
                    deadline=self._deadline(state, config),
                    first_attempt=attempt == 1,
                )
            except AdmissionRefusedError as exc:
                return _AttemptResult(error=exc.info)
            admitted.append((gate, ticket))
        if paced is not None:
            paced.sending()
        transform = new_transform(config.backend, state.request_id, provider=config.provider)
        # One stream holds at most what it may read; all of them together, ``_memory``.
        transform.max_held_bytes = config.max_response_bytes
        holding = self._memory.hold(transform) if self._memory is not None else None
        # Disarmed attempts run the detector too: an accepted response carries its trigger.
        detector = TailRepetitionDetector(self._doom) if self._doom.enabled else None
        state.transform = transform
        timeouts = config.timeouts
        emitted = False
        triggers: tuple[str, ...] = ()
        metrics.sent = True
        # The read timer: its length, and when it fires (a close near it is a stall).
        timer, deadline = 0.0, math.inf
        try:
            async with self._client.open_stream(wire, config=config) as stream:
                now = trio.current_time()
                metrics.request_sent_at = stream.request_sent_at
                # The metrics' times are the bytes' arrival where the reads say it.
                received = stream.received_at
                metrics.headers_at = now if received is None else received
                started = transform.start(stream.header_fields, attempt=attempt)
                if started and isinstance(started[0], StreamStarted):
                    metrics.rate_limit = started[0].rate_limit
                    if paced is not None:
                        paced.headers(started[0].rate_limit)
                    self._tell_admission(admitted, started[0].rate_limit)
                await state.emit(started, metrics.headers_at)
                decoder = SSEDecoder(config.max_sse_event_bytes)
                timer = timeouts.first_token
                deadline = now + timer
                chunks = stream.__aiter__()
                body_done = False
                # The part of a read not parsed yet (see ``_FIRST_SLICE_BYTES``).
                pending = b""
                # The read that ended the stream held its first content too.
                first_content_at_end = False
                while not transform.finished:
                    chunk: bytes | None = None
                    timed_out = False
                    if pending:
                        chunk, pending = pending, b""
                    else:
                        if holding is not None:
                            holding.report()
                        timed_out = True
                        # One scope per read: the timer, and the memory's stop.
                        with trio.move_on_at(deadline) as read_scope:
                            if holding is not None:
                                holding.guard(read_scope)
                            try:
                                chunk = await chunks.__anext__()
                            except StopAsyncIteration:
                                chunk = None  # end of body
                            timed_out = False
                        if holding is not None:
                            holding.guard(None)
                            holding.check()
                    if timed_out:
                        events = transform.abort(self._timeout_error(emitted))
                    elif chunk is None:
                        body_done = True
                        events = self._close(transform, decoder)
                    else:
                        if emitted:
                            events = self._feed(transform, decoder, chunk)
                        else:
                            events, pending = self._feed_to_content(transform, decoder, chunk)
                    now = trio.current_time()
                    received = stream.received_at
                    at = now if received is None else received
                    metrics.last_byte_at = at
                    batch, done, content, reasoning = self._split(events, transform)
                    if content:
                        timer = timeouts.idle
                        deadline = now + timer
                        metrics.tokens(at, content)
                        first_content_at_end = not emitted
                        emitted = True
                    if detector is not None and reasoning:
                        trigger = detector.feed(reasoning)
                        if trigger is not None:
                            triggers = (trigger,)
                        # A trigger in the read that also ended the stream is judged
                        # with the response (``_judge``): nothing is left to abort.
                        if trigger is not None and armed and not done:
                            batch_tail = transform.abort(
                                _error(
                                    SamplingErrorKind.DOOM_LOOP_DETECTED,
                                    "the reasoning is repeating itself; resampling",
                                    retryable=True,
                                    code="doom_loop",
                                )
                            )
                            extra, done, _, _ = self._split(batch_tail, transform)
                            batch.extend(extra)
                    if armed and not done and transform.acc.doom_loop_signals:
                        # A confident server signal aborts the attempt when it arrives.
                        extra, done = self._server_doom(transform)
                        batch.extend(extra)
                    if batch:
                        await state.emit(batch, at)
                    if done:
                        break
                    if content and pending:
                        await self._hand_over(state)
                if not body_done and isinstance(transform.outcome, Completed):
                    await self._finish_body(state, stream, first_content_at_end)
        except SamplingClientError as exc:
            metrics.rate_limit = exc.info.rate_limit_snapshot or metrics.rate_limit
            if paced is not None:
                paced.failed(exc.info)
            self._tell_admission(admitted, exc.info.rate_limit_snapshot)
            error = _stall_close(exc.info, timer, deadline)
            return _AttemptResult(error=error, partial=state.partial(), emitted_output=emitted)
        finally:
            if holding is not None:
                holding.release()
        result = self._judge(transform.outcome, emitted, armed, triggers)
        if result.error is not None:
            result.error = _stall_close(result.error, timer, deadline)
        return result

    def _server_doom(self, transform: StreamTransform) -> tuple[list[SamplingEvent], bool]:
        """Abort the attempt if the server reported a doom loop the policy trusts."""
        signals = transform.acc.doom_loop_signals
        confident = [s for s in signals if self._doom.is_confident(parse_trigger(s))]
        if not confident:
            return [], False
        reason = f"the server detected a doom loop ({', '.join(confident)})"
        error = _error(
            SamplingErrorKind.DOOM_LOOP_DETECTED, reason, retryable=True, code="doom_loop"
        )
        extra, done, _, _ = self._split(transform.abort(error), transform)
        return extra, done

    @staticmethod
    def _tell_admission(admitted: list[Admitted], snapshot: RateLimitSnapshot | None) -> None:
        """Pass the provider's rate-limit report to an admission that wants it."""
        if snapshot is None or not admitted:
            return
        gate, ticket = admitted[0]
        if isinstance(gate, RateLimitObserver):  # any gate; only observers are told
            gate.observe_rate_limit(ticket, snapshot, trio.current_time())

    async def _finish_body(
        self, sink: AttemptSink, stream: ResponseStream, first_content_at_end: bool
    ) -> None:
        """The end of a completed stream's body, read for connection reuse: here when it
        has arrived already (reading it waits for nothing, and the connection is back in
        the pool before the terminal is delivered), otherwise in the background
        (:class:`ConnectionDrains`: the terminal never waits for a server's last chunk).
        A first token sent in the same read is handed over before the reading."""
        if not stream.end_received():
            self.drains.start(stream)
            return
        if first_content_at_end:
            await self._hand_over(sink)
        await stream.drain(max_bytes=_DRAIN_MAX_BYTES)

    @staticmethod
    async def _hand_over(sink: AttemptSink) -> None:
        """Let the consumer take the batch just sent before the rest of the read is
        parsed: yield until it has read every batch sent, at most twice (Trio runs the
        ready tasks of a round in either order, so one yield may resume this task first)."""
        state = sink.race.state if isinstance(sink, Lane) else sink
        assert isinstance(state, RequestState)
        for _ in range(2):
            if state.read >= state.sent:
                return
            await trio.lowlevel.checkpoint()

    @staticmethod
    def _timeout_error(emitted: bool) -> SamplingErrorInfo:
        if emitted:
            return _error(
                SamplingErrorKind.IDLE_TIMEOUT,
                "the stream went idle: no content within the idle timeout",
                retryable=True,
                code="idle_timeout",
            )
        return _error(
            SamplingErrorKind.IDLE_TIMEOUT,
            "no first token within the first-token timeout",
            retryable=True,
            code="first_token_timeout",
        )

    @staticmethod
    def _feed(transform: StreamTransform, decoder: SSEDecoder, chunk: bytes) -> list[SamplingEvent]:
        try:
            return transform.feed_payloads(decoder.feed_payloads(chunk))
        except SSEDecodeError as exc:
            return transform.abort(decode_failure(exc))

    @classmethod
    def _feed_to_content(
        cls, transform: StreamTransform, decoder: SSEDecoder, chunk: bytes
    ) -> tuple[list[SamplingEvent], bytes]:
        """Feed ``chunk`` ``_FIRST_SLICE_BYTES`` at a time until an event is content (or
        the stream ends): the events so far, and the part of ``chunk`` not fed yet."""
        events: list[SamplingEvent] = []
        while chunk:
            head, chunk = chunk[:_FIRST_SLICE_BYTES], chunk[_FIRST_SLICE_BYTES:]
            fed = cls._feed(transform, decoder, head)
            events.extend(fed)
            if transform.finished or any(type(event) in _CONTENT for event in fed):
                break
        return events, chunk

    @staticmethod
    def _close(transform: StreamTransform, decoder: SSEDecoder) -> list[SamplingEvent]:
        events = transform.feed_payloads(decoder.close_payloads())
        events.extend(transform.close())
        return events

    @staticmethod
    def _split(
        events: list[SamplingEvent], transform: StreamTransform
    ) -> tuple[list[SamplingEvent], bool, int, str]:
        """Forwardable events, whether the transform ended, content count, reasoning text.

        The transform's terminal is its outcome (``transform.outcome``), not an event to
        forward: the request's own terminal comes later, from the retry loop. It is the
        last event of the call that ended the stream, so it is held back by position."""
        outcome = transform.outcome
        done = outcome is not None
        if done and events and events[-1] is outcome:
            events = events[:-1]
        # ``events`` is the transform's fresh list (or a copy without the terminal): the
        # batch itself. Its events are counted in C: a batch of tokens alone (the usual
        # one) costs no Python per event, nor does one of a stream without reasoning.
        kinds = list(map(type, events))
        tokens = kinds.count(ChannelToken)
        content = tokens if tokens == len(kinds) else sum(map(_CONTENT.__contains__, kinds))
        if not tokens or not transform.reasoning_opened:
            return events, done, content, ""
        reasoning = [
            event.text
            for event in events
            if type(event) is ChannelToken and event.channel is _REASONING
        ]
        return events, done, content, "".join(reasoning)

    def _judge(
        self,
        end: Completed | Failed | None,
        emitted: bool,
        armed: bool,
        triggers: tuple[str, ...],
    ) -> _AttemptResult:
        """Turn the transform's terminal into the attempt's result (empty, doom checks).

        ``triggers`` are the local detector's: on an armed attempt they resample like a
        confident server signal, and an accepted response carries them beside the
        server's in ``doom_loop_signals``."""
        if isinstance(end, Failed):
            return _AttemptResult(
                error=end.error, partial=end.partial, emitted_output=emitted, doom_triggers=triggers
            )
        assert isinstance(end, Completed)
        response = end.response
        confident: tuple[str, ...] = ()
        local: tuple[str, ...] = ()
        if response.doom_loop_signals or triggers:  # the usual response has neither
            confident = tuple(
                s for s in response.doom_loop_signals if self._doom.is_confident(parse_trigger(s))
            )
            local = tuple(t for t in triggers if t not in response.doom_loop_signals)
        if local:
            response = attrs.evolve(
                response, doom_loop_signals=(*response.doom_loop_signals, *local)
            )
        if armed and (confident or triggers):
            reason = (
                f"the server detected a doom loop ({', '.join(confident)})"
                if confident
                else "the reasoning is repeating itself; resampling"
            )
            return _AttemptResult(
                error=_error(
                    SamplingErrorKind.DOOM_LOOP_DETECTED, reason, retryable=True, code="doom_loop"
                ),
                partial=response,
                emitted_output=emitted,
                doom_triggers=(*confident, *local),
            )
        if response.is_empty and response.stop_reason not in (
            StopReason.CONTENT_FILTER,
            StopReason.LENGTH,
        ):
            return _AttemptResult(
                error=_error(
                    SamplingErrorKind.EMPTY_RESPONSE,
                    "the model returned no text and no tool calls",
                    retryable=True,
                    code="empty_response",
                ),
                partial=response,
                emitted_output=emitted,
            )
        return _AttemptResult(response=response, emitted_output=emitted)
