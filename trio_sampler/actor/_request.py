"""One request, from Submit to its terminal: its scope, its total deadline, its chain of
routes, and the plan's steps between attempts.

Everything that can fail is caught *inside* an attempt (``_attempt.py``) and becomes data;
the plan (``_plan.py``) turns data into the next step; the terminal is delivered
synchronously from ``finally``. So nothing escapes into the actor, and the "exactly one
terminal" rule holds on every path, cancellation included. This is the only module that
builds a terminal event.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping

import attrs
import trio

from ..admission import AdmissionGate
from ..client import SamplingClient
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy
from ..models import ModelCatalog
from ..retry import RetryBudget
from ..routing import (
    CircuitBreaker,
    HedgePolicy,
    Route,
    RouteAction,
    RouteBreaker,
    RoutingPolicy,
)
from ..types import (
    Assistant,
    AttemptOutcome,
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    ImagesStripped,
    Retrying,
    SamplingErrorInfo,
    SamplingErrorKind,
    StripReason,
    TerminalEvent,
)
from ..wire.errors import internal_error
from ._attempt import AttemptResult, Attempts, AttemptSink, ConnectionDrains, error_info
from ._chain import Leg, RouteState, Skipped, continuation, continued, unsuitable
from ._gates import Gates, Prepared
from ._memory import ResponseMemory
from ._metrics import AttemptMetrics, priced_response
from ._pacing import Pacers
from ._plan import (
    Facts,
    FailOver,
    Finish,
    History,
    Policies,
    Resample,
    Resume,
    ResumePoint,
    Step,
    StripImages,
    decide,
)
from ._race import Race
from ._stream import RequestState, partial_output

__all__ = ["ConnectionDrains", "RequestRunner"]

#: Each step of the plan, at debug level: the request, the step, the error and the rule.
_log = logging.getLogger("trio_sampler.actor")


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
        route_admissions: Mapping[str, AdmissionGate] | None = None,
        routing: RoutingPolicy | None = None,
        memory: ResponseMemory | None = None,
    ) -> None:
        self._memory = memory
        self._routing = routing
        #: Per route name: the state every request of the sampler shares.
        self._routes: dict[str, RouteState] = {}
        self._admission = admission
        #: The open gate of each route that carries its own admission (``Route.admission``).
        self._route_admissions: Mapping[str, AdmissionGate] = route_admissions or {}
        if routing is not None:
            for route in routing.routes:
                self._route_state(route)
        self._catalog = catalog
        self._retry_policy = retry_policy
        self._doom = doom_policy
        self._rng = rng
        self._budgets: dict[tuple[float, float], RetryBudget] = {}
        #: Where completed responses are drained for connection reuse (the sampler's).
        self.drains = ConnectionDrains()
        #: Every gate an attempt passes, the concurrency limiter's slot and the memory
        #: account's share included (``_gates.py``).
        self.gates = Gates(limiter, memory)
        self.attempts = Attempts(client, doom_policy, self.drains)

    @property
    def catalog(self) -> ModelCatalog | None:
        """What prices the usage the server reported no cost for."""
        return self._catalog

    @property
    def routes(self) -> dict[str, RouteState]:
        """Per route name, the state shared by the sampler's requests."""
        return self._routes

    @property
    def pacers(self) -> Pacers:
        """The rate-limit pacer of each account (base URL, key, model) the sampler uses."""
        return self.gates.pacers

    # -- the request ---------------------------------------------------------------------

    async def serve(self, state: RequestState) -> None:
        """The request task: exactly one terminal, whatever happens (see module doc), and
        ``state.finish_task()`` as its last act."""
        terminal: TerminalEvent | None = None
        try:
            with state.scope:
                # Helper tasks (hedged attempts) run in a nursery of their own, opened
                # inside this scope only while they run (``_race.py``).
                terminal = await self._run(state)
        except Exception as exc:  # a bug of ours (a helper's: an ExceptionGroup): typed
            terminal = Failed(
                state.request_id,
                internal_error(exc, "running the request"),
                state.partial(),
                state.metrics.build(None),
            )
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
                state.finish_task()

    async def _run(self, state: RequestState) -> TerminalEvent:
        """Every attempt on every route, under the one ``Timeouts.total`` deadline
        counted from submit: waiting for a ``max_concurrency`` slot (each attempt's,
        ``_gates.py``), backoff sleeps, fail-overs and a consumer that stops reading all
        spend it."""
        total = state.config.timeouts.total
        if not total:  # no deadline: no scope to enter and leave
            return await self._chain(state)
        with trio.CancelScope(deadline=state.submitted_at + total) as total_scope:
            return await self._chain(state)
        # Only reached when the total deadline fired.
        assert total_scope.cancelled_caught
        message = f"the request did not finish within its total timeout of {total:g} s"
        error = error_info(
            SamplingErrorKind.IDLE_TIMEOUT, message, retryable=False, code="total_timeout"
        )
        partial = self._priced(state.partial(), state.serving) or state.last_partial
        return Failed(state.request_id, error, partial, state.metrics.build(partial))

    def _priced(
        self, response: ConversationResponse | None, config: SamplerConfig | None
    ) -> ConversationResponse | None:
        """``response`` with its cost from the model catalog when the server reported none."""
        if config is None:
            return response
        return priced_response(response, self._catalog, config.model)

    def _budget(self, policy: RetryPolicy) -> RetryBudget | None:
        if policy.retry_budget_ratio is None:
            return None
        key = (policy.retry_budget_ratio, policy.retry_budget_window_s)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = RetryBudget(*key)
        return budget

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
        """The gate ``route``'s attempts go through (``None``: a request without
        routing): from the route's own admission (``Route.admission``), else the
        sampler's; either may give each route a gate of its own."""
        owner = self._admission if route is None else self._owner(route)
        return None if owner is None else owner.for_route(route)

    def _owner(self, route: str) -> AdmissionGate | None:
        """The open admission that gives ``route`` its gate and shares its breaker."""
        own = self._route_admissions.get(route)
        return own if own is not None else self._admission

    def _route_state(self, route: Route) -> RouteState:
        found = self._routes.get(route.name)
        if found is None or found.route is not route:
            breaker: CircuitBreaker | None = None
            routing = self._routing
            owner = self._owner(route.name)
            if routing is not None and routing.breaker is not None:
                breaker = RouteBreaker(route.name, routing.breaker, routing.on_breaker_change)
                if owner is not None:  # it may share the breaker (a fleet does)
                    breaker = owner.share_breaker(route.name, breaker)
            found = self._routes[route.name] = RouteState(
                route, breaker, admission=self._gate_for(route.name)
            )
        return found

    async def _chain(self, state: RequestState) -> TerminalEvent:
        """Run the request along its chain of routes (one leg without routing): each
        route until it serves the request, or the plan sends the request on
        (``trio_sampler.routing.ROUTING``), or ends it."""
        legs = self._legs(state)
        failure: FailOver | None = None
        # Not ``enumerate``: it and the list's iterator would live as long as the
        # request (``later`` is a tuple for the same reason: an empty one is shared).
        for index in range(len(legs)):
            leg = legs[index]
            reason = unsuitable(leg, state.request, failure)
            if reason is not None:
                assert leg.route is not None  # a sampler without routing skips nothing
                state.metrics.skip(leg.route.name, reason)
                continue
            later = _later(legs[index + 1 :], state.request, failure)
            result = await self._leg(state, leg, later, failure)
            if isinstance(result, FailOver):
                failure = result
            elif result is not None:
                return result
        return self._chain_failed(state, failure)

    async def _leg(
        self, state: RequestState, leg: Leg, later: tuple[Leg, ...], failure: FailOver | None
    ) -> TerminalEvent | FailOver | None:
        """The request on ``leg`` (``None``: the route was passed over)."""
        held = self._rate_limit_hold(leg, later)
        if held is not None:
            assert leg.route is not None and leg.state is not None
            leg.state.passed_over_rate_limit += 1
            state.metrics.skip(leg.route.name, held)
            return None
        steer = _steers(leg, later)
        hedge_leg = later[0] if later else None
        result = await self._route(
            state, leg, failure, hedge_leg, has_next=bool(later), steer=steer
        )
        if isinstance(result, Skipped):
            assert leg.route is not None and leg.state is not None
            if result.by_admission:
                leg.state.passed_over_admission += 1
            state.metrics.skip(leg.route.name, result.reason)
            return None
        return result

    def _chain_failed(self, state: RequestState, failure: FailOver | None) -> Failed:
        """The end of a chain no route served: the last route's failure, or, if every
        route was passed over, why."""
        metrics = state.metrics
        if failure is not None:
            error = failure.error
            if failure.action is RouteAction.LARGER_WINDOW:
                error = attrs.evolve(
                    error, message=f"{error.message} (no route with a larger context window)"
                )
            return Failed(state.request_id, error, failure.partial, metrics.build(failure.partial))
        skipped = "; ".join(f"{name}: {why}" for name, why in metrics.skipped)
        error = error_info(
            SamplingErrorKind.OVERLOADED,
            f"no route could take the request ({skipped})",
            retryable=True,
            code="no_route",
        )
        return Failed(state.request_id, error, None, metrics.build(None))

    def _rate_limit_hold(self, leg: Leg, later: tuple[Leg, ...]) -> str | None:
        """Why the chain passes over ``leg`` for its rate limit (``None``: it does not).

        A route whose account is held by a 429 (until its ``Retry-After`` or reset), or
        whose pacer would hold the attempt longer than ``max_retry_wait_s``, is passed
        over while a later route could take the request at once; the last route that
        can take it waits instead."""
        routing = self._routing
        if leg.route is None or routing is None:
            return None
        now = trio.current_time()
        gates = self.gates
        wait = gates.pacing_delay(leg.config, now)
        if wait <= routing.max_retry_wait_s:
            return None
        limit = routing.max_retry_wait_s
        if not any(gates.pacing_delay(other.config, now) <= limit for other in later):
            return None
        why = "a 429" if gates.held_by_429(leg.config, now) else "its budget"
        return f"rate limited ({why}): no room for {wait:.3g} s"

    # -- one route -----------------------------------------------------------------------

    def _policies(self, leg: Leg) -> Policies:
        policy = self._retry_policy or leg.config.retry
        resamples = self._doom.max_resamples
        if not self._doom.enabled or policy.max_retries == 0:
            resamples = 0
        routing = self._routing
        wait = routing.max_retry_wait_s if routing is not None and leg.route is not None else None
        return Policies(policy, resamples, wait)

    async def _route(
        self,
        state: RequestState,
        leg: Leg,
        failure: FailOver | None,
        hedge_leg: Leg | None,
        *,
        has_next: bool,
        steer: bool,
    ) -> TerminalEvent | FailOver | Skipped:
        """Attempts on one route until it serves the request, or the plan ends the request
        or sends it on. ``has_next``: another route could take the request after this one.
        ``steer``: a later route is admitted by another gate, so this route's admission
        is asked to admit its first attempt within ``max_retry_wait_s`` or pass it over."""
        state.serving = leg.config
        policies = self._policies(leg)
        by_prefill = self._routing is not None and self._routing.continue_by_prefill
        prefix = continuation(state.request, leg, failure, by_prefill=by_prefill)
        request = state.request
        if prefix is not None:
            request = attrs.evolve(request, items=(*request.items, Assistant(prefix)))
        budget = self._budget(policies.retry)
        continuing = prefix is not None
        opened = await self._open_route(
            state, leg, request, failure, policies, budget, steer=steer, continuing=continuing
        )
        if isinstance(opened, Skipped):
            return opened
        prepared = opened
        history = History(continuing=continuing)
        context_window = None if leg.route is None else leg.route.capabilities.context_window
        resume: ResumePoint | None = None
        while True:
            armed = history.resamples < policies.max_resamples
            hedge_to = hedge_leg if prefix is None else None
            result, metrics, served = await self._try(
                state, request, leg, hedge_to, prepared, armed=armed, resume=resume
            )
            prepared = None
            priced = self._record(state, served, metrics, result)
            if result.response is not None:
                assert priced is not None
                return self._completed(state, served, metrics, priced, prefix)
            assert result.error is not None
            if priced is not None:  # kept for the terminal, whatever the next attempt shows
                state.last_partial = priced
            facts = _facts(result, priced, armed, state, context_window, has_next, request)
            step, let_through = self._decide(leg, facts, history, policies)
            resume = step.point if isinstance(step, Resume) else None
            if prefix is not None:  # a failed continuation is not tried again
                prefix, request = None, state.request
            followed = await self._next(state, leg, step, facts, request, budget, let_through)
            if not isinstance(followed, tuple):
                return followed
            request, history = followed

    def _decide(
        self, leg: Leg, facts: Facts, history: History, policies: Policies
    ) -> tuple[Step, bool]:
        """The plan's next step (``_plan.RULES``), with the sampler's jitter and the
        route's breaker; and whether the breaker, asked, let another attempt through
        (its verdict then comes from that attempt's hold, or :meth:`_next` frees it)."""
        let_through = False

        def circuit_open() -> bool:
            nonlocal let_through
            let_through = leg.blocked(trio.current_time()) is None
            return not let_through

        step = decide(facts, history, policies, uniform=self._rng.random, circuit_open=circuit_open)
        return step, let_through

    async def _next(
        self,
        state: RequestState,
        leg: Leg,
        step: Step,
        facts: Facts,
        request: ConversationRequest,
        budget: RetryBudget | None,
        let_through: bool,
    ) -> TerminalEvent | FailOver | tuple[ConversationRequest, History]:
        """:meth:`_follow`; a breaker's permission the plan took (``let_through``) is
        given back when no attempt on the route follows (a half-open probe stays free)."""
        try:
            followed = await self._follow(state, leg, step, facts, request, budget)
        except BaseException:
            if let_through:
                leg.abandon(trio.current_time())
            raise
        if let_through and not isinstance(followed, tuple):
            leg.abandon(trio.current_time())
        return followed

    async def _open_route(
        self,
        state: RequestState,
        leg: Leg,
        request: ConversationRequest,
        failure: FailOver | None,
        policies: Policies,
        budget: RetryBudget | None,
        *,
        steer: bool,
        continuing: bool,
    ) -> Prepared | Skipped | None:
        """The route's breaker asked (once per route: a half-open circuit admits one
        probe), its admission asked while it is chosen (``steer``), the request counted
        for the retry budget, and the consumer told of the fail-over."""
        blocked = leg.blocked(trio.current_time())
        if blocked is not None:
            return Skipped(blocked)
        prepared = None
        try:
            if steer:
                armed = policies.max_resamples > 0
                chosen = await self._prepare(state, leg, request, armed=armed)
                if isinstance(chosen, Skipped):
                    leg.abandon(trio.current_time())
                    return chosen
                prepared = chosen
            if budget is not None and state.metrics.started == 0:  # the first attempt
                budget.record_request(trio.current_time())
            if failure is not None:
                discard = failure.emitted and not continuing
                max_retries = policies.retry.max_retries
                await self._emit_retry(
                    state, state.metrics.started, max_retries, failure.error, 0.0, discard, (), leg
                )
        except BaseException:  # no attempt will run: the breaker's permission goes back
            leg.abandon(trio.current_time())
            if prepared is not None:
                await self.gates.discard(prepared)
            raise
        return prepared

    async def _prepare(
        self, state: RequestState, leg: Leg, request: ConversationRequest, *, armed: bool
    ) -> Prepared | Skipped | None:
        """The route's first attempt prepared while the chain chooses the route (see
        ``Gates.prepare``); ``None``: nothing to ask, the attempt holds its gates itself."""
        routing = self._routing
        if routing is None:
            return None
        wire = self.attempts.wire(request, leg.config, armed)
        if isinstance(wire, SamplingErrorInfo):
            return None  # the attempt reports it
        return await self.gates.prepare(
            state,
            leg,
            wire,
            within=routing.max_retry_wait_s,
            deadline=self._deadline(state, leg.config),
            first_attempt=state.metrics.started == 0,
        )

    async def _follow(
        self,
        state: RequestState,
        leg: Leg,
        step: Step,
        facts: Facts,
        request: ConversationRequest,
        budget: RetryBudget | None,
    ) -> TerminalEvent | FailOver | tuple[ConversationRequest, History]:
        """Carry out the plan's ``step``: the request and history the next attempt runs
        with, or how the route ends (a terminal, or a fail-over)."""
        error, partial = facts.error, facts.partial
        _log.debug(
            "%s: %s after %s (rule: %s)",
            state.request_id,
            type(step).__name__,
            error.kind.value,
            step.rule,
        )
        if isinstance(step, FailOver):
            return step
        if isinstance(step, Finish):
            return Failed(state.request_id, step.error, partial, state.metrics.build(partial))
        if isinstance(step, StripImages):
            request, urls = request.strip_images()
            if not urls:
                return Failed(state.request_id, error, partial, state.metrics.build(partial))
            rejected = (error.error_code or "") == "invalid_image" and error.status_code == 400
            reason = StripReason.SERVER_REJECTED if rejected else StripReason.PAYLOAD_HEURISTIC
            await state.emit([ImagesStripped(state.request_id, urls, reason)])
            await self._emit_retry(
                state, step.attempt, step.max_retries, error, 0.0, step.discard, (), leg
            )
            return request, step.history
        if isinstance(step, Resume):  # the read's headers announce it (``Resumed``)
            return request, step.history
        if isinstance(step, Resample):
            await self._emit_retry(
                state,
                step.attempt,
                step.max_retries,
                error,
                step.delay,
                step.discard,
                step.triggers,
                leg,
            )
            return request, step.history
        spent = await self._spent(leg, error, budget) if step.charged else None
        if spent is not None:
            message = f"{error.message} (not retried: {spent} is spent)"
            failed = attrs.evolve(error, message=message)
            return Failed(state.request_id, failed, partial, state.metrics.build(partial))
        await self._emit_retry(
            state, step.attempt, step.max_retries, error, step.delay, step.discard, (), leg
        )
        return request, step.history

    @staticmethod
    async def _spent(leg: Leg, error: SamplingErrorInfo, budget: RetryBudget | None) -> str | None:
        """The retry budget a retry would overspend (``None``: the retry may go)."""
        if budget is not None and not budget.try_spend(trio.current_time()):
            return "the retry budget"
        if leg.admission is not None and not await leg.admission.retry_allowed(error):
            return "the fleet retry budget"
        return None

    def _completed(
        self,
        state: RequestState,
        served: Leg,
        metrics: AttemptMetrics,
        priced: ConversationResponse,
        prefix: str | None,
    ) -> Completed:
        state.metrics.route = served.name
        response = priced if prefix is None else continued(priced, prefix)
        return Completed(
            state.request_id,
            response,
            state.metrics.build(response),
            route=served.name,
            model=priced.model or metrics.model,
        )

    def _record(
        self, state: RequestState, served: Leg, metrics: AttemptMetrics, result: AttemptResult
    ) -> ConversationResponse | None:
        """End the attempt in the metrics and tell its route; its output, priced."""
        priced = self._priced(result.output, served.config)
        ended_at = trio.current_time()
        cost = state.metrics.end_attempt(
            metrics,
            ended_at,
            result.error,
            usage=None if priced is None else priced.usage,
            cost_usd_ticks=None if priced is None else priced.cost_usd_ticks,
        )
        served.record(result.error, metrics)
        if priced is not None and cost != priced.cost_usd_ticks:  # billed per model
            priced = attrs.evolve(priced, cost_usd_ticks=cost)
        return priced

    async def _emit_retry(
        self,
        state: RequestState,
        attempt: int,
        max_retries: int,
        error: SamplingErrorInfo,
        delay: float,
        discard: bool,
        triggers: tuple[str, ...],
        leg: Leg,
    ) -> None:
        # The attempt's partial output is discarded once the Retrying is handed over.
        retrying = Retrying(
            state.request_id,
            attempt,
            max_retries,
            error.kind,
            error.message,
            delay,
            discard,
            triggers,
            leg.name,
        )
        await state.emit_retry([retrying])
        await trio.sleep(delay)

    # -- one attempt, or a race of them --------------------------------------------------

    async def _try(
        self,
        state: RequestState,
        request: ConversationRequest,
        leg: Leg,
        hedge_leg: Leg | None,
        prepared: Prepared | None,
        *,
        armed: bool,
        resume: ResumePoint | None = None,
    ) -> tuple[AttemptResult, AttemptMetrics, Leg]:
        """One attempt on ``leg`` (hedged when the routing policy says so; a resumed
        read is not): its result, its timings (not yet ended in the metrics) and the
        route that served it."""
        hedge = self._routing.hedge if self._routing is not None else None
        if hedge is not None and leg.state is not None and resume is None:
            # A continuation is hedged on its own route: the prefill was chosen for it.
            target = hedge_leg if hedge.next_route and hedge_leg is not None else leg
            return await self._hedged(state, request, leg, target, hedge, prepared, armed=armed)
        model = request.model or leg.config.model
        metrics = state.metrics.start_attempt(trio.current_time(), leg.name, model)
        result = None
        try:
            result = await self._attempt(
                state, state, request, leg, metrics, armed=armed, prepared=prepared, resume=resume
            )
        finally:
            if result is None:  # cancelled: the request's cancel or its total timeout
                partial = self._priced(partial_output(state.transform), leg.config)
                leg.cut_short(state.metrics, metrics, partial, AttemptOutcome.CANCELLED)
        return result, metrics, leg

    async def _hedged(
        self,
        state: RequestState,
        request: ConversationRequest,
        leg: Leg,
        target: Leg,
        hedge: HedgePolicy,
        prepared: Prepared | None,
        *,
        armed: bool,
    ) -> tuple[AttemptResult, AttemptMetrics, Leg]:
        """One attempt on ``leg`` raced by a hedge on ``target`` (``_race.Race``). Apart
        from :meth:`_try`: the lanes' closure makes cells of what it reads, which would
        live through every request's attempt, hedged or not (the collector's share)."""

        async def run(
            lane: AttemptSink, on: Leg, metrics: AttemptMetrics, first: bool
        ) -> AttemptResult:
            return await self._attempt(
                state,
                lane,
                request,
                on,
                metrics,
                armed=armed,
                prepared=prepared if first else None,
            )

        try:
            return await Race(state, run, self._priced).run(leg, target, hedge)
        finally:
            if prepared is not None:  # the first lane takes it; if it never ran:
                await self.gates.discard(prepared)

    async def _attempt(
        self,
        state: RequestState,
        sink: AttemptSink,
        request: ConversationRequest,
        leg: Leg,
        metrics: AttemptMetrics,
        *,
        armed: bool,
        prepared: Prepared | None,
        resume: ResumePoint | None = None,
    ) -> AttemptResult:
        """One attempt: its body, its gates, the stream. A ``prepared`` attempt (the chain
        asked its route while choosing it) has its body and gates already; a ``resume``
        reads the cut stream on (``GET``, through the same gates)."""
        if prepared is not None:
            wire = prepared.wire
        else:
            built = self.attempts.wire(request, leg.config, armed)
            if isinstance(built, SamplingErrorInfo):  # never reached its gates
                leg.abandon(trio.current_time())
                return AttemptResult(error=built)
            wire = built if resume is None else self.attempts.resume_wire(built, resume)
        deadline = self._deadline(state, leg.config)
        hold = self.gates.hold(sink, leg, wire, metrics, deadline=deadline, prepared=prepared)
        async with hold:
            if hold.refused is not None:
                hold.result = AttemptResult(error=hold.refused)
            else:
                hold.result = await self.attempts.run(
                    sink, wire, leg.config, metrics, hold, armed=armed, resume=resume
                )
                if sink is not state:  # a race's lane streams into a transform of its own
                    hold.result.resume = None
            return hold.result

    @staticmethod
    def _deadline(state: RequestState, config: SamplerConfig) -> float:
        """When the attempt's waits must end, on trio's clock: the request's
        ``Timeouts.total`` (its sampler's, or its own config's), or its route's if shorter."""
        totals = [t for t in (state.config.timeouts.total, config.timeouts.total) if t]
        return state.submitted_at + min(totals) if totals else math.inf


def _facts(
    result: AttemptResult,
    priced: ConversationResponse | None,
    armed: bool,
    state: RequestState,
    context_window: int | None,
    has_next: bool,
    request: ConversationRequest,
) -> Facts:
    """The failed attempt ``result``, as the plan sees it."""
    assert result.error is not None
    return Facts(
        result.error,
        priced,
        result.emitted_output,
        armed,
        result.doom_triggers,
        state.metrics.started,
        context_window,
        has_next,
        result.resume,
        result.resume_refused,
        replay_safe=request.replay_safe,
    )


# The chain's two questions about the routes after a leg, as functions of their own: a
# generator expression in a coroutine (and before Python 3.12 a comprehension) reads
# the coroutine's names it uses from cells, which then live as long as the request.


def _later(
    rest: list[Leg], request: ConversationRequest, failure: FailOver | None
) -> tuple[Leg, ...]:
    """The legs of ``rest`` that could still take the request after ``failure``."""
    return tuple(
        other for other in rest if unsuitable(other, request, failure) is None and other.available
    )


def _steers(leg: Leg, later: tuple[Leg, ...]) -> bool:
    """Whether a later route is admitted by another gate than ``leg``'s (asking ``leg``'s
    admission while choosing is worth it only then: routes of one limiter share its
    budget)."""
    return any(other.admission is not leg.admission for other in later)
