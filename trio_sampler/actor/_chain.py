"""A request's chain of routes: what a sampler keeps per route (:class:`RouteState`), a
route as one request runs it (:class:`Leg`), and the rules that pass a route over.

The request (``_request.py``) walks the legs; what happens after a failed attempt is the
plan's (``_plan.py``).
"""

from __future__ import annotations

import collections

import attrs
import trio

from ..admission import AdmissionGate
from ..config import SamplerConfig
from ..routing import (
    BreakerState,
    BreakerVerdict,
    CircuitBreaker,
    Route,
    RouteSnapshot,
    breaker_verdict,
    ends_in_prefill,
    unsupported_by,
)
from ..types import (
    Assistant,
    AttemptOutcome,
    ConversationRequest,
    ConversationResponse,
    SamplingErrorInfo,
)
from ._metrics import AttemptMetrics, MetricsRecorder
from ._plan import FailOver

__all__ = ["Leg", "RouteState", "Skipped", "continuation", "continued", "unsuitable"]


@attrs.define(eq=False)
class RouteState:
    """What a sampler keeps per route, shared by all its requests: the circuit breaker,
    the route's admission gate (its fleet limiter, say), recent times to first token (for
    hedging), and counters for metrics."""

    route: Route
    breaker: CircuitBreaker | None = None
    #: The gate the route's attempts are admitted by (``None``: none).
    admission: AdmissionGate | None = None
    #: Seconds from an attempt's start to its first content, most recent last.
    ttft_s: collections.deque[float] = attrs.field(factory=lambda: collections.deque(maxlen=200))
    attempts: int = 0
    failures: int = 0
    completions: int = 0
    #: Requests the chain passed the route over for: its provider rate limit (the pacer),
    #: and its shared admission (the fleet limiter).
    passed_over_rate_limit: int = 0
    passed_over_admission: int = 0

    def snapshot(self) -> RouteSnapshot:
        breaker = self.breaker
        return RouteSnapshot(
            route=self.route.name,
            state=None if breaker is None else breaker.state,
            attempts=self.attempts,
            failures=self.failures,
            completions=self.completions,
            opened=0 if breaker is None else breaker.opened,
            admission=None if self.admission is None else self.admission.name,
            passed_over_rate_limit=self.passed_over_rate_limit,
            passed_over_admission=self.passed_over_admission,
        )


@attrs.frozen
class Skipped:
    """The chain passed the route over before any attempt: its circuit refused the
    request, or (``by_admission``) its shared admission had no room in time."""

    reason: str
    by_admission: bool = False


@attrs.define(eq=False)
class Leg:
    """One route of a request's chain (or the sampler's config alone, without routing)."""

    route: Route | None
    config: SamplerConfig
    state: RouteState | None
    #: The gate the route's attempts are admitted by (``None``: none).
    admission: AdmissionGate | None = None

    @property
    def name(self) -> str | None:
        return None if self.route is None else self.route.name

    @property
    def available(self) -> bool:
        """Could take an attempt (as far as can be told without asking the breaker)."""
        breaker = None if self.state is None else self.state.breaker
        return breaker is None or breaker.state is not BreakerState.OPEN

    def blocked(self, now: float) -> str | None:
        """Ask the breaker for an attempt: ``None`` if allowed, else why not."""
        breaker = None if self.state is None else self.state.breaker
        if breaker is None or breaker.allow(now):
            return None
        if breaker.state is BreakerState.HALF_OPEN:
            return "its circuit is half open and another request is probing it"
        return "its circuit is open"

    def record(self, error: SamplingErrorInfo | None, attempt: AttemptMetrics) -> None:
        """Count how an attempt ended on the route (its counters and TTFT; its breaker
        is told by the attempt's hold, :meth:`judge`)."""
        state = self.state
        if state is None:
            return
        state.attempts += 1
        if attempt.first_token_at is not None:
            state.ttft_s.append(attempt.first_token_at - attempt.started_at)
        if error is None:
            state.completions += 1
        else:
            state.failures += 1

    def judge(self, error: SamplingErrorInfo | None, now: float, *, ended: bool) -> None:
        """Tell the route's breaker how an attempt it let through ended
        (:func:`~trio_sampler.routing.breaker_verdict`); one that did not end (cancelled)
        frees a half-open circuit's probe, counting nothing."""
        breaker = None if self.state is None else self.state.breaker
        if breaker is None:
            return
        verdict = breaker_verdict(error) if ended else BreakerVerdict.ABANDONED
        if verdict is BreakerVerdict.SUCCESS:
            breaker.record_success(now)
        elif verdict is BreakerVerdict.FAILURE:
            breaker.record_failure(now)
        else:
            breaker.record_abandoned(now)

    def cut_short(
        self,
        recorder: MetricsRecorder,
        attempt: AttemptMetrics,
        partial: ConversationResponse | None,
        outcome: AttemptOutcome,
    ) -> None:
        """An attempt ended by the request (cancelled, or a hedge that lost): recorded
        with the usage it had reached (``partial``, priced); the route is not blamed (its
        hold told the breaker). Synchronous (it runs while the request is being
        cancelled)."""
        recorder.end_attempt(
            attempt,
            trio.current_time(),
            None,
            outcome=outcome,
            usage=None if partial is None else partial.usage,
            cost_usd_ticks=None if partial is None else partial.cost_usd_ticks,
        )

    def abandon(self, now: float) -> None:
        """The breaker let an attempt through that no hold will run (the route was passed
        over after all, or the request ended first): a half-open probe is free again."""
        self.judge(None, now, ended=False)


def unsuitable(leg: Leg, request: ConversationRequest, failure: FailOver | None) -> str | None:
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


def continuation(
    request: ConversationRequest, leg: Leg, failure: FailOver | None, *, by_prefill: bool
) -> str | None:
    """The text a fail-over may continue by prefill on ``leg`` (``None``: restart).

    Only with ``RoutingPolicy.continue_by_prefill`` (``by_prefill``), to a route that
    declares ``accepts_prefill``, after an attempt that streamed text and nothing else (no
    reasoning, tool calls or refusal, whose state a prefill cannot carry), ending in a
    non-space (providers reject a prefill with trailing whitespace), for a request that
    does not end in a prefill of its own."""
    if failure is None or not failure.emitted or not by_prefill or leg.route is None:
        return None
    if not leg.route.capabilities.accepts_prefill or ends_in_prefill(request):
        return None
    partial = failure.partial
    if partial is None or partial.tool_calls or partial.refusal:
        return None
    if partial.reasoning_items or partial.backend_tool_calls:
        return None
    text = partial.text
    return text if text and text == text.rstrip() else None


def continued(response: ConversationResponse, prefix: str) -> ConversationResponse:
    """A continuation's response with the text it continued put back in front."""
    items = list(response.items)
    for index, item in enumerate(items):
        if isinstance(item, Assistant):
            items[index] = attrs.evolve(item, content=prefix + item.content)
            break
    else:
        items.insert(0, Assistant(prefix))
    return attrs.evolve(response, items=tuple(items))
