"""A request's chain of routes, as the request task runs it: its legs (one per route),
what moves it from one to the next, and the two lanes of a hedged attempt.

The runner (``_request_task.py``) drives these; they hold the per-request decisions and
the bookkeeping, so the retry loop reads as the routing table says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from ..admission import AdmissionGate
from ..config import SamplerConfig
from ..routing import BREAKER_COUNTS, BreakerState, Route, RouteAction, RouteState, route_action
from ..types import (
    Assistant,
    ConversationResponse,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
)
from ._metrics import AttemptMetrics
from ._stream import CONTENT_EVENTS, RequestState, partial_output

if TYPE_CHECKING:
    from ..types import SamplingErrorInfo as _Error
    from ..wire import StreamTransform, WireRequest
    from ._pacing import PacedAttempt
    from ._request_task import _AttemptResult

#: An admitted attempt's ticket, with the gate that issued it (and settles it).
Admitted = tuple[AdmissionGate, object]

__all__ = [
    "NOT_THE_ROUTES_FAULT",
    "Admitted",
    "AttemptSink",
    "FailOver",
    "Lane",
    "Leg",
    "Prepared",
    "Race",
    "Skipped",
    "continued",
]


@attrs.frozen
class FailOver:
    """A route gave up on the request and the routing table sends it on."""

    error: SamplingErrorInfo
    partial: ConversationResponse | None
    #: The failed attempt had streamed output (the next route's ``Retrying`` discards it).
    emitted: bool
    action: RouteAction
    #: After a context-length error: only a route with a larger window may follow.
    min_window: int | None = None


@attrs.frozen
class Skipped:
    """The chain passed the route over before any attempt: its circuit refused the
    request, or (``by_admission``) its shared admission had no room in time."""

    reason: str
    by_admission: bool = False


@attrs.define(eq=False)
class Prepared:
    """A route's first attempt, prepared while the chain chose the route: its body, its
    pacer place and its admission (or the error that ends it before sending). The
    attempt takes it over (``taken``); otherwise its reservations are given back."""

    wire: WireRequest
    paced: PacedAttempt | None
    admitted: Admitted | None
    #: When the preparation began (the attempt's start) and what the pacer held it.
    started_at: float
    paced_s: float
    error: _Error | None = None
    taken: bool = False


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

    def record(self, error: SamplingErrorInfo | None, now: float, attempt: AttemptMetrics) -> None:
        """Tell the route's state how an attempt ended (breaker, counters, TTFT)."""
        state = self.state
        if state is None:
            return
        state.attempts += 1
        if attempt.first_token_at is not None:
            state.ttft_s.append(attempt.first_token_at - attempt.started_at)
        breaker = state.breaker
        if error is None:
            state.completions += 1
            if breaker is not None:
                breaker.record_success(now)
            return
        state.failures += 1
        if breaker is None:
            return
        if error.kind in NOT_THE_ROUTES_FAULT:
            breaker.record_abandoned(now)
        elif route_action(error) in BREAKER_COUNTS:
            breaker.record_failure(now)
        else:  # the route answered (an invalid request, a content filter...): it is up
            breaker.record_success(now)

    def abandon(self, now: float) -> None:
        breaker = None if self.state is None else self.state.breaker
        if breaker is not None:
            breaker.record_abandoned(now)


# Failures that say nothing about the route's health either way.
NOT_THE_ROUTES_FAULT = frozenset(
    {
        SamplingErrorKind.INTERNAL,
        SamplingErrorKind.FLEET_UNAVAILABLE,
        SamplingErrorKind.DOOM_LOOP_DETECTED,
    }
)


class AttemptSink(Protocol):
    """Where one attempt sends its events: the request itself, or a hedging lane."""

    request_id: str
    submitted_at: float
    transform: StreamTransform | None

    async def emit(self, batch: list[SamplingEvent], received_at: float | None = None) -> None:
        """Hand on ``batch``, produced by a read whose bytes arrived at ``received_at``."""

    def partial(self) -> ConversationResponse | None: ...


class Race:
    """Two attempts of one request racing: the first to produce content wins."""

    def __init__(self, state: RequestState) -> None:
        self.state = state
        self.lanes: list[Lane] = []
        self.winner: Lane | None = None
        #: Lanes whose attempt has ended, in the order they ended.
        self.ended: list[Lane] = []
        #: Set when a lane produced content, or when every lane has ended without.
        self.settled = trio.Event()


class Lane:
    """One attempt of a race. Its events wait here until it wins (the first batch with
    content); then they go to the request, and the other lane is cancelled."""

    def __init__(self, race: Race, metrics: AttemptMetrics, leg: Leg) -> None:
        self.race = race
        self.metrics = metrics
        self.leg = leg
        self.request_id = race.state.request_id
        self.submitted_at = race.state.submitted_at
        self.transform: StreamTransform | None = None
        self.scope = trio.CancelScope()
        self.held: list[tuple[list[SamplingEvent], float | None]] = []
        self.result: _AttemptResult | None = None
        self.admitted: list[Admitted] = []

    async def emit(self, batch: list[SamplingEvent], received_at: float | None = None) -> None:
        race = self.race
        if race.winner is None and any(type(event) in CONTENT_EVENTS for event in batch):
            race.winner = self
            race.state.transform = self.transform
            for other in race.lanes:
                if other is not self:
                    other.scope.cancel()
            race.settled.set()
            held, self.held = self.held, []
            for earlier, arrived in held:
                await race.state.emit(earlier, arrived)
        if race.winner is self:
            await race.state.emit(batch, received_at)
        else:
            self.held.append((batch, received_at))
            await trio.lowlevel.checkpoint()

    def partial(self) -> ConversationResponse | None:
        return partial_output(self.transform)


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
