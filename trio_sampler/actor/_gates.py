"""May this attempt go? Every gate an attempt passes, held as one.

``async with gates.hold(sink, leg, wire, metrics, ...) as hold:`` is the one place an
attempt takes and gives back what it holds, in this order:

1. a slot of the sampler's concurrency limiter (``max_concurrency``): one per attempt in
   flight, a hedge included; a request waiting out its retry backoff holds none;
2. the route's breaker probe: the breaker is asked as the route is chosen (routing, in
   ``_request.py``; a hedge asks before it starts, ``_race.py``), and the attempt's
   verdict reaches it from the hold's exit (``Leg.judge``), so a half-open circuit's
   probe is released however the attempt ends, cancellation included;
3. its place in its account's rate-limit pacer;
4. the route's admission (a fleet limiter, say): a :class:`~trio_sampler.admission.Ticket`;
5. the attempt's share of the sampler's memory account (:meth:`Hold.share`, taken by the
   body read once the attempt's transform exists: the read is where bytes arrive).

``hold.refused`` says why the attempt may not go; the hold is the attempt's
:class:`~trio_sampler.actor._attempt.AttemptObserver`: what the wire reports of the
provider's limits reaches the pacer and the admission through it. The exit gives all of
it back in reverse order (the memory share, the ticket settled with the usage the
attempt reached or withdrawn if it was never sent, the pacer's place, the breaker's
verdict, the slot), shielded where it awaits: it runs on cancellation too. An entry cut
short (a cancel while a gate holds the attempt) gives back what it had taken.

A route's first attempt may be *prepared* while the chain chooses the route
(:meth:`Gates.prepare`): its slot, its pacer place and its admission, asked to admit
within ``max_retry_wait_s``. The prepared attempt is then taken over by ``hold``, or
given back (:meth:`Gates.discard`).
"""

from __future__ import annotations

from types import TracebackType

import attrs
import trio

from ..admission import AdmissionBusyError, AdmissionGate, AdmissionRefusedError, Ticket
from ..config import SamplerConfig
from ..types import RateLimitSnapshot, SamplingErrorInfo, SamplingErrorKind
from ..wire import StreamTransform, WireRequest
from ._attempt import AttemptResult, AttemptSink
from ._chain import Leg, Skipped
from ._memory import Holding, KeptPartial, ResponseMemory
from ._metrics import AttemptMetrics
from ._pacing import PacedAttempt, Pacers

__all__ = ["Gates", "Hold", "Prepared"]


@attrs.define(eq=False)
class Prepared:
    """A route's first attempt, prepared while the chain chose the route: its body, its
    slot, its pacer place and its admission (or the error that ends it before sending). The
    attempt takes it over (``taken``); otherwise its reservations are given back."""

    wire: WireRequest
    paced: PacedAttempt | None
    ticket: Ticket | None
    #: When the preparation began (the attempt's start) and what the pacer held it.
    started_at: float
    paced_s: float
    error: SamplingErrorInfo | None = None
    taken: bool = False
    #: The borrower of the concurrency limiter's slot it holds (``None``: none).
    slot: object | None = None


class Hold:
    """One attempt's hold on its gates (see the module docs)."""

    def __init__(
        self,
        gates: Gates,
        sink: AttemptSink,
        leg: Leg,
        wire: WireRequest,
        metrics: AttemptMetrics,
        *,
        deadline: float,
        prepared: Prepared | None,
    ) -> None:
        self._gates = gates
        self._sink = sink
        self._leg = leg
        self._wire = wire
        self._metrics = metrics
        self._deadline = deadline
        self._prepared = prepared
        #: The borrower of the limiter's slot held (``None``: none held).
        self._slot: object | None = None
        self._paced: PacedAttempt | None = None
        self._ticket: Ticket | None = None
        self._holding: Holding | None = None
        #: Why the attempt may not go (``None``: it may).
        self.refused: SamplingErrorInfo | None = None
        #: How the attempt ended (``None``: cancelled); its usage settles the ticket.
        self.result: AttemptResult | None = None

    async def __aenter__(self) -> Hold:
        prepared = self._prepared
        if prepared is not None:  # taken over before any checkpoint
            prepared.taken = True
            self._metrics.started_at = prepared.started_at
            self._metrics.paced_s = prepared.paced_s
            self._slot, self._paced, self._ticket = prepared.slot, prepared.paced, prepared.ticket
            self.refused = prepared.error
            return self
        try:
            await self._enter()
        except BaseException:  # cut short: what was taken goes back
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _enter(self) -> None:
        gates, metrics = self._gates, self._metrics
        if gates.limiter is not None:  # the attempt starts once it has its slot
            self._slot = await gates.take_slot()
            metrics.started_at = trio.current_time()
        config = self._leg.config
        paced = await gates.pacers.admit(
            config,
            self._wire,
            metrics,
            deadline=self._deadline,
            request_id=self._sink.request_id,
            announce=self._sink.emit,
        )
        if isinstance(paced, SamplingErrorInfo):
            self.refused = paced
            return
        self._paced = paced
        gate = self._leg.admission
        if gate is None:
            return
        try:
            self._ticket = await gate.admit(
                self._wire, config, deadline=self._deadline, first_attempt=metrics.number == 1
            )
        except AdmissionRefusedError as exc:
            self.refused = exc.info

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Everything the hold took, given back in reverse order."""
        holding, self._holding = self._holding, None
        if holding is not None:
            holding.release()
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            with trio.CancelScope(shield=True):  # the admission bounds its own time
                await self._settle(ticket)
        self._release_pacer()
        leg = self._leg
        if leg.state is not None:  # a route: its breaker hears how the attempt ended
            result = self.result
            error = None if result is None else result.error
            leg.judge(error, trio.current_time(), ended=result is not None)
        slot, self._slot = self._slot, None
        if slot is not None:
            self._gates.give_slot(slot)

    async def _settle(self, ticket: Ticket) -> None:
        if not self._metrics.sent:  # never sent: nothing of it was used
            await ticket.withdraw()
            return
        result = self.result
        output = None if result is None else result.output
        # What the request's ledger bills the attempt: a cancel has already taken the
        # request's transform away, not the attempt's.
        usage = self._metrics.usage if output is None else output.usage
        await ticket.settle(usage)

    def _release_pacer(self) -> None:
        paced, self._paced = self._paced, None
        if paced is None:
            return
        paced.withdraw()  # unless it was sent: then the pacer keeps the cost
        output = None if self.result is None else self.result.output
        if self.result is not None:
            paced.ended(None if output is None else output.usage)

    # -- what the attempt reports (``AttemptObserver``) --

    def share(self, transform: StreamTransform) -> Holding | None:
        """The attempt's share of the sampler's memory account, counting what
        ``transform`` and the sink hold (``None``: no account); given back at the exit."""
        memory = self._gates.memory
        if memory is None:
            return None
        holding = self._holding = memory.hold(transform)
        sink = self._sink
        # The events waiting for the consumer hold its text too, and a retry keeps the
        # partial of the attempt before it.
        holding.count(sink, passing=True)
        if sink.last_partial is not None:
            holding.count(KeptPartial(sink.last_partial))
        if sink.partials is not None:  # the parsed values: 24 bytes a byte, at worst
            holding.count(sink.partials)
        return holding

    def sending(self) -> None:
        if self._paced is not None:
            self._paced.sending()

    def headers(self, snapshot: RateLimitSnapshot | None) -> None:
        if self._paced is not None:
            self._paced.headers(snapshot)
        self._observe(snapshot)

    def failed(self, error: SamplingErrorInfo) -> None:
        if self._paced is not None:
            self._paced.failed(error)
        self._observe(error.rate_limit_snapshot)

    def _observe(self, snapshot: RateLimitSnapshot | None) -> None:
        """Pass the provider's rate-limit report to the admission's ticket."""
        if snapshot is not None and self._ticket is not None:
            self._ticket.observe(snapshot, trio.current_time())


class Gates:
    """The gates of one sampler: its concurrency limiter, the pacer of each account it
    uses and its memory account; the breakers and the admission gates travel with the
    routes (``Leg.state``, ``Leg.admission``)."""

    def __init__(
        self,
        limiter: trio.CapacityLimiter | None = None,
        memory: ResponseMemory | None = None,
    ) -> None:
        #: At most ``max_concurrency`` attempts in flight (``None``: no limit).
        self.limiter = limiter
        #: The rate-limit pacer of each account (base URL, key, model) the sampler uses.
        self.pacers = Pacers()
        #: Response text held across the sampler's attempts (``None``: not bounded).
        self.memory = memory

    def hold(
        self,
        sink: AttemptSink,
        leg: Leg,
        wire: WireRequest,
        metrics: AttemptMetrics,
        *,
        deadline: float,
        prepared: Prepared | None = None,
    ) -> Hold:
        """The attempt's hold on its gates (an async context manager)."""
        return Hold(self, sink, leg, wire, metrics, deadline=deadline, prepared=prepared)

    async def take_slot(self) -> object | None:
        """Wait for a slot of the concurrency limiter (cancellable); the borrower that
        holds it (``None``: no limiter)."""
        limiter = self.limiter
        if limiter is None:
            return None
        # A borrower of its own: a prepared attempt's slot is given back by the task
        # that runs it (a race's lane), not the one that took it.
        borrower = object()
        await limiter.acquire_on_behalf_of(borrower)
        return borrower

    def give_slot(self, borrower: object | None) -> None:
        if borrower is not None and self.limiter is not None:
            self.limiter.release_on_behalf_of(borrower)

    def pacing_delay(self, config: SamplerConfig, now: float) -> float:
        """How long ``config``'s pacer would hold an attempt now."""
        pacer = self.pacers.for_config(config)
        return 0.0 if pacer is None else pacer.delay(now)

    def held_by_429(self, config: SamplerConfig, now: float) -> bool:
        pacer = self.pacers.for_config(config)
        return pacer is not None and pacer.blocked_until > now

    async def prepare(
        self,
        sink: AttemptSink,
        leg: Leg,
        wire: WireRequest,
        *,
        within: float,
        deadline: float,
        first_attempt: bool,
    ) -> Prepared | Skipped | None:
        """The route's first attempt, prepared while the chain chooses the route: its
        slot, its place in the pacer, and the route's shared admission asked to admit
        within ``within`` seconds (one round trip). A route whose admission has no room
        in time is :class:`Skipped` (nothing reserved); ``None``: nothing to ask (the
        attempt holds its gates itself)."""
        gate = leg.admission
        if gate is None or not gate.chooses_routes:
            return None
        slot = await self.take_slot()  # first, as the hold takes it
        try:
            prepared = await self._admit(
                sink, leg, gate, wire, within=within, deadline=deadline, first=first_attempt
            )
        except BaseException:
            self.give_slot(slot)
            raise
        if isinstance(prepared, Skipped):
            self.give_slot(slot)
        else:
            prepared.slot = slot
        return prepared

    async def _admit(
        self,
        sink: AttemptSink,
        leg: Leg,
        gate: AdmissionGate,
        wire: WireRequest,
        *,
        within: float,
        deadline: float,
        first: bool,
    ) -> Prepared | Skipped:
        """The pacer's place and the admission of a prepared attempt (see :meth:`prepare`)."""
        config = leg.config
        started_at = trio.current_time()
        scratch = AttemptMetrics(0, started_at, leg.name, None)
        paced = await self.pacers.admit(
            config,
            wire,
            scratch,
            deadline=deadline,
            request_id=sink.request_id,
            announce=sink.emit,
        )
        if isinstance(paced, SamplingErrorInfo):
            return Prepared(wire, None, None, started_at, scratch.paced_s, error=paced)
        try:
            ticket = await gate.try_admit(
                wire, config, within=within, deadline=deadline, first_attempt=first
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
        return Prepared(wire, paced, ticket, started_at, scratch.paced_s)

    async def discard(self, prepared: Prepared) -> None:
        """A prepared attempt that will not be sent: its reservations go back (shielded)."""
        if prepared.taken:
            return
        prepared.taken = True
        if prepared.paced is not None:
            prepared.paced.withdraw()
        if prepared.ticket is not None:
            with trio.CancelScope(shield=True):
                await prepared.ticket.withdraw()
        slot, prepared.slot = prepared.slot, None
        self.give_slot(slot)
