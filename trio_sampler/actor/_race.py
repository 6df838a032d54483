"""Hedged attempts: one attempt, and another each time the hedge delay passes with no
content yet; the first to produce content wins and the others are cancelled.

A race returns what one attempt returns (an :class:`AttemptResult`), with the winner's
attempt timings and route, so the request judges it like any attempt. Its lanes are tasks
of a nursery opened inside the request's scope for as long as they run: cancelling the
request cancels them, and the request cannot go on while one still runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from ..config import SamplerConfig
from ..routing import HedgePolicy, hedge_delay
from ..types import AttemptOutcome, ConversationResponse, SamplingEvent
from ..wire import PartialOutputs, StreamTransform
from ._attempt import AttemptResult, AttemptSink
from ._chain import Leg
from ._memory import Holding
from ._metrics import AttemptMetrics
from ._stream import CONTENT_EVENTS, RequestState, partial_output

__all__ = ["Lane", "Race", "RunAttempt"]

#: Runs one attempt of the race on a lane: ``(lane, leg, its metrics, first) -> result``;
#: ``first`` is true for the lane started first (it takes a prepared attempt over).
RunAttempt = Callable[[AttemptSink, Leg, AttemptMetrics, bool], Awaitable[AttemptResult]]
#: Prices an attempt's output for its route's config.
Pricer = Callable[[ConversationResponse | None, SamplerConfig], ConversationResponse | None]


class Lane:
    """One attempt of a race. Its events wait here until it wins (the first batch with
    content); then they go to the request, and the other lanes are cancelled."""

    def __init__(self, race: Race, metrics: AttemptMetrics, leg: Leg) -> None:
        self.race = race
        self.metrics = metrics
        self.leg = leg
        self.request_id = race.state.request_id
        self.submitted_at = race.state.submitted_at
        self.transform: StreamTransform | None = None
        self.scope = trio.CancelScope()
        self.held: list[tuple[list[SamplingEvent], float | None]] = []
        self.result: AttemptResult | None = None

    @property
    def emit_may_wait(self) -> bool:
        """Whether :meth:`emit` may wait for credit: once it wins, it sends what it held
        and the batch, a credit each."""
        return self.race.state.credit <= len(self.held)

    @property
    def emit_is_quick(self) -> bool:
        """No: a lane's emit yields while it holds its batches (before one lane wins)."""
        return False

    async def emit(
        self,
        batch: list[SamplingEvent],
        received_at: float | None = None,
        holding: Holding | None = None,
    ) -> None:
        race = self.race
        if race.winner is None and any(type(event) in CONTENT_EVENTS for event in batch):
            race.win(self)
            held, self.held = self.held, []
            for earlier, arrived in held:
                await race.state.emit(earlier, arrived)
        if race.winner is self:
            await race.state.emit(batch, received_at, holding)
        else:
            self.held.append((batch, received_at))
            await trio.lowlevel.checkpoint()

    async def hand_over(self) -> None:
        await self.race.state.hand_over()

    def partial(self) -> ConversationResponse | None:
        return partial_output(self.transform)

    @property
    def last_partial(self) -> ConversationResponse | None:
        """None: a racing attempt starts before any lane wins, and the request's kept
        partial output is not any one lane's to count (a hedged request's is uncounted)."""
        return None

    @property
    def buffered_bytes(self) -> int:
        """What the request's channel holds, once this lane is the one feeding it (the
        batches a lane holds before it wins have no content)."""
        return self.race.state.buffered_bytes if self.race.winner is self else 0

    @property
    def partials(self) -> PartialOutputs | None:
        """The request's parsed values: only the lane that wins feeds them (the others
        are cancelled then), so each lane counts them."""
        return self.race.state.partials


class Race:
    """Attempts of one request racing: the first to produce content wins."""

    def __init__(self, state: RequestState, run: RunAttempt, priced: Pricer) -> None:
        self.state = state
        self._run = run
        self._priced = priced
        self.lanes: list[Lane] = []
        self.winner: Lane | None = None
        #: Lanes whose attempt has ended, in the order they ended.
        self.ended: list[Lane] = []
        #: Set when a lane produced content, or when every lane has ended without.
        self.settled = trio.Event()

    def win(self, lane: Lane) -> None:
        self.winner = lane
        self.state.transform = lane.transform
        for other in self.lanes:
            if other is not lane:
                other.scope.cancel()
        self.settled.set()

    async def run(
        self, leg: Leg, target: Leg, hedge: HedgePolicy
    ) -> tuple[AttemptResult, AttemptMetrics, Leg]:
        """One attempt on ``leg``, and another on ``target`` (the same route, or the next
        with ``HedgePolicy.next_route``) each time the hedge delay passes with no content
        yet, up to ``max_hedges``. Returns the result the request judges — the winner's,
        or, if none produced content, the last to end — with its attempt's timings (not
        yet ended in the metrics) and its route."""
        assert leg.state is not None
        delay = hedge_delay(hedge, list(leg.state.ttft_s))
        state = self.state
        try:
            async with trio.open_nursery() as nursery:
                self._start(nursery, leg)
                for _ in range(hedge.max_hedges):
                    with trio.move_on_after(delay):
                        await self.settled.wait()
                    # A half-open circuit has admitted its one probe: no hedge beside it.
                    if self.settled.is_set() or target.blocked(trio.current_time()) is not None:
                        break
                    self._start(nursery, target)
        except BaseException:  # the request's cancel or total timeout: every lane ends
            for lane in self.lanes:
                if lane.result is None:
                    partial = self._priced(lane.partial(), lane.leg.config)
                    lane.leg.cut_short(
                        state.metrics, lane.metrics, partial, AttemptOutcome.CANCELLED
                    )
            raise
        chosen = self.winner or self.ended[-1]
        for lane in self.lanes:
            if lane is not chosen:
                self._end_lane(lane)
        state.transform = chosen.transform
        state.serving = chosen.leg.config
        state.metrics.current = chosen.metrics  # the request's timings are the winner's
        assert chosen.result is not None
        return chosen.result, chosen.metrics, chosen.leg

    def _start(self, nursery: trio.Nursery, leg: Leg) -> None:
        model = self.state.request.model or leg.config.model
        metrics = self.state.metrics.start_attempt(trio.current_time(), leg.name, model)
        lane = Lane(self, metrics, leg)
        first = not self.lanes
        self.lanes.append(lane)
        nursery.start_soon(self._run_lane, lane, first)

    async def _run_lane(self, lane: Lane, first: bool) -> None:
        try:
            with lane.scope:
                lane.result = await self._run(lane, lane.leg, lane.metrics, first)
        finally:
            if lane.result is not None:
                self.ended.append(lane)
            if self.winner is None and len(self.ended) == len(self.lanes):
                self.settled.set()  # every lane has ended without content

    def _end_lane(self, lane: Lane) -> None:
        """Record a lane that is not the race's result: a lost hedge (cancelled), or an
        attempt that failed by itself while another went on."""
        leg = lane.leg
        recorder = self.state.metrics
        result = lane.result
        if result is None:
            if not lane.metrics.sent:  # cancelled while one of its gates held it
                recorder.drop_attempt(lane.metrics)
                return
            partial = self._priced(lane.partial(), leg.config)
            leg.cut_short(recorder, lane.metrics, partial, AttemptOutcome.LOST_HEDGE)
            return
        now = trio.current_time()
        priced = self._priced(result.partial, leg.config)
        recorder.end_attempt(
            lane.metrics,
            now,
            result.error,
            usage=None if priced is None else priced.usage,
            cost_usd_ticks=None if priced is None else priced.cost_usd_ticks,
        )
        leg.record(result.error, lane.metrics)
