"""May this attempt go? The gates an attempt passes before it is sent, held as one.

``async with gates.hold(leg, wire, ...) as ticket:`` waits for the attempt's place in its
account's rate-limit pacer, then for the route's admission (a fleet limiter, say); the
ticket says why the attempt may not go (``ticket.refused``), and is the attempt's
:class:`~trio_sampler.actor._attempt.AttemptObserver`: what the wire reports of the
provider's limits reaches the pacer and the admission through it. Its exit gives back
what an attempt never sent reserved, and settles the rest with the usage the attempt
reached (shielded: it runs on cancellation too). The sampler's concurrency slot is held
around the whole request, and the route's breaker is asked as the route is chosen
(``_request.py``); the memory share is held by the attempt's body read (``_attempt.py``).

A route's first attempt may be *prepared* while the chain chooses the route
(:meth:`Gates.prepare`): its pacer place and its admission, asked to admit within
``max_retry_wait_s``. The prepared ticket is then taken over by ``hold``, or given back
(:meth:`Gates.discard`).
"""

from __future__ import annotations

from types import TracebackType

import attrs
import trio

from ..admission import AdmissionBusyError, AdmissionRefusedError, Ticket
from ..config import SamplerConfig
from ..types import RateLimitSnapshot, SamplingErrorInfo, SamplingErrorKind
from ..wire import WireRequest
from ._attempt import AttemptResult, AttemptSink
from ._chain import Leg, Skipped
from ._metrics import AttemptMetrics
from ._pacing import PacedAttempt, Pacers

__all__ = ["Gates", "Hold", "Prepared"]


@attrs.define(eq=False)
class Prepared:
    """A route's first attempt, prepared while the chain chose the route: its body, its
    pacer place and its admission (or the error that ends it before sending). The
    attempt takes it over (``taken``); otherwise its reservations are given back."""

    wire: WireRequest
    paced: PacedAttempt | None
    ticket: Ticket | None
    #: When the preparation began (the attempt's start) and what the pacer held it.
    started_at: float
    paced_s: float
    error: SamplingErrorInfo | None = None
    taken: bool = False


class Hold:
    """One attempt's hold on its gates (see the module docs)."""

    def __init__(
        self,
        pacers: Pacers,
        sink: AttemptSink,
        leg: Leg,
        wire: WireRequest,
        metrics: AttemptMetrics,
        *,
        deadline: float,
        prepared: Prepared | None,
    ) -> None:
        self._pacers = pacers
        self._sink = sink
        self._leg = leg
        self._wire = wire
        self._metrics = metrics
        self._deadline = deadline
        self._prepared = prepared
        self._paced: PacedAttempt | None = None
        self._ticket: Ticket | None = None
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
            self._paced, self._ticket = prepared.paced, prepared.ticket
            self.refused = prepared.error
            return self
        config = self._leg.config
        paced = await self._pacers.admit(
            config,
            self._wire,
            self._metrics,
            deadline=self._deadline,
            request_id=self._sink.request_id,
            announce=self._sink.emit,
        )
        if isinstance(paced, SamplingErrorInfo):
            self.refused = paced
            return self
        self._paced = paced
        gate = self._leg.admission
        if gate is None:
            return self
        try:
            self._ticket = await gate.admit(
                self._wire,
                config,
                deadline=self._deadline,
                first_attempt=self._metrics.number == 1,
            )
        except AdmissionRefusedError as exc:
            self.refused = exc.info
        except BaseException:
            self._release_pacer()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release_pacer()
        ticket = self._ticket
        if ticket is None:
            return
        result = self.result
        output = None if result is None else result.output
        # What the request's ledger bills the attempt: a cancel has already taken the
        # request's transform away, not the attempt's.
        usage = self._metrics.usage if output is None else output.usage
        with trio.CancelScope(shield=True):  # the admission bounds its own time
            await ticket.settle(usage)

    def _release_pacer(self) -> None:
        paced, self._paced = self._paced, None
        if paced is None:
            return
        paced.withdraw()  # unless it was sent: then the pacer keeps the cost
        output = None if self.result is None else self.result.output
        if self.result is not None:
            paced.ended(None if output is None else output.usage)

    # -- what the wire reports (``AttemptObserver``) --

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
    """The gates of one sampler: the pacer of each account it uses; the admission gates
    travel with the routes (``Leg.admission``)."""

    def __init__(self) -> None:
        #: The rate-limit pacer of each account (base URL, key, model) the sampler uses.
        self.pacers = Pacers()

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
        return Hold(self.pacers, sink, leg, wire, metrics, deadline=deadline, prepared=prepared)

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
        place in the pacer, and the route's shared admission asked to admit within
        ``within`` seconds (one round trip). A route whose admission has no room in time
        is :class:`Skipped` (nothing reserved); ``None``: nothing to ask (the attempt
        holds its gates itself)."""
        gate = leg.admission
        if gate is None or not gate.chooses_routes:
            return None
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
                wire, config, within=within, deadline=deadline, first_attempt=first_attempt
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

    @staticmethod
    async def discard(prepared: Prepared) -> None:
        """A prepared attempt that will not be sent: its reservations go back (shielded)."""
        if prepared.taken:
            return
        prepared.taken = True
        if prepared.paced is not None:
            prepared.paced.withdraw()
        if prepared.ticket is not None:
            with trio.CancelScope(shield=True):
                await prepared.ticket.withdraw()
