"""The admission step of the actor: what it asks before each attempt, and tells after it.

Three base classes with no-op defaults (the pattern of ``trio.abc.Instrument``): override
the methods you need, leave the rest.

:class:`Admission` is what ``open_sampler(config, admission=...)`` takes. The sampler
calls ``check_routes`` when it is opened, and enters ``admission.open()`` for its lifetime
(so any connection the admission needs, such as the fleet limiter's Redis client, is
opened and closed with the sampler); ``open`` yields the sampler's :class:`AdmissionGate`.

For every attempt of every request, on the gate of the route it runs on:

1. ``ticket = await gate.admit(wire, config, deadline=..., first_attempt=...)`` before
   sending (cancellable; ``deadline`` is the request's ``Timeouts.total`` deadline on
   trio's clock). It returns a :class:`Ticket`, or raises :class:`AdmissionRefusedError`,
   whose ``info`` becomes the request's ``Failed`` terminal (never retried);
2. ``ticket.observe(snapshot, at)``, synchronously, with what the provider's answer
   reported of its rate limits (its headers, or a 429's) and the time it was read on
   trio's clock (the fleet limiter tightens its shared state with it at settlement);
3. ``await ticket.settle(usage)`` when the attempt ends, however it ends, with the usage
   it reported (``None`` if none): shielded from cancellation, so it must bound its own
   time. A ticket is also an async context manager whose exit settles it with
   ``ticket.usage``;
4. before a retry, ``await gate.retry_allowed(error)``: False ends the request with
   ``Failed`` (the error, noting the budget). A ``Retry-After`` in ``error`` is the
   gate's to share.

Routes. ``gate.for_route(route)`` is the gate each route's attempts go through (by
default the gate itself; ``None``: that route is not admitted by anything; the route
``None`` is a request without routing). It is asked once per route when the sampler
opens, together with ``gate.share_breaker(route, breaker)``, which returns the circuit
breaker the sampler uses for the route (by default the one it is given; the fleet returns
one whose state it shares).

Choosing a route. A gate that overrides ``try_admit`` (:attr:`AdmissionGate.chooses_routes`)
is asked by the chain, for a route's first attempt while a later route could take the
request, to admit only if the attempt can start within ``within`` seconds (the routing
policy's ``max_retry_wait_s``). Otherwise it raises :class:`AdmissionBusyError`, having
reserved nothing, and the chain passes the route over (``skipped_routes``); the last
route that can take the request is asked with ``admit`` and waits. A refusal of kind
``FLEET_UNAVAILABLE`` from ``try_admit`` passes the route over too (a later route's
admission may fail open); from the last route it ends the request. ``ticket.withdraw()``
gives back everything an admitted attempt that was never sent reserved.

:mod:`trio_sampler.fleet` provides the implementation over Redis (``FleetAdmission``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType

import trio

from .breaker import CircuitBreaker, RouteBreaker
from .config import SamplerConfig
from .types import RateLimitSnapshot, SamplingErrorInfo, TrioSamplerError, Usage
from .wire import WireRequest

__all__ = [
    "Admission",
    "AdmissionBusyError",
    "AdmissionGate",
    "AdmissionRefusedError",
    "Ticket",
]


class AdmissionRefusedError(TrioSamplerError):
    """An attempt is not admitted; ``info`` is what its ``Failed`` terminal carries."""

    def __init__(self, info: SamplingErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class AdmissionBusyError(TrioSamplerError):
    """A route's admission cannot take the attempt within the time the chain allows;
    nothing was reserved, and the chain tries a later route.

    ``reason`` says why in words (it becomes the route's ``skipped_routes`` entry);
    ``wait`` is how long the admission would have held the attempt, when known.
    """

    def __init__(self, reason: str, wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait = wait


class Ticket:
    """One admitted attempt (see the module docs). The defaults do nothing."""

    #: What ``async with ticket`` settles with on exit.
    usage: Usage | None = None

    def observe(self, snapshot: RateLimitSnapshot, at: float) -> None:
        """The provider's rate-limit report for the attempt, read at ``at``."""

    async def settle(self, usage: Usage | None) -> None:
        """The attempt ended, having used ``usage`` (``None``: not known)."""

    async def withdraw(self) -> None:
        """The attempt will not be sent: give back what it reserved."""

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.settle(self.usage)


class AdmissionGate:
    """An open admission, shared by every request of one sampler (see the module docs).
    The defaults admit every attempt and allow every retry."""

    @property
    def name(self) -> str | None:
        """The shared limit the gate charges (``RouteSnapshot.admission``; ``None``: none)."""
        return None

    @property
    def chooses_routes(self) -> bool:
        """The gate overrides :meth:`try_admit`: the chain asks it while choosing a route."""
        return type(self).try_admit is not AdmissionGate.try_admit

    def for_route(self, route: str | None) -> AdmissionGate | None:
        """The gate ``route``'s attempts go through (``None``: none)."""
        return self

    def share_breaker(self, route: str, breaker: RouteBreaker) -> CircuitBreaker:
        """The breaker the sampler uses for ``route``: ``breaker``, or one sharing it."""
        return breaker

    async def admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        deadline: float,
        first_attempt: bool,
    ) -> Ticket:
        """Wait until the attempt may be sent; its ticket."""
        return Ticket()

    async def try_admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        within: float,
        deadline: float,
        first_attempt: bool,
    ) -> Ticket:
        """Admit only if the attempt can start within ``within`` seconds, else raise
        :class:`AdmissionBusyError` having reserved nothing."""
        return await self.admit(wire, config, deadline=deadline, first_attempt=first_attempt)

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool:
        """May the request retry after ``error``?"""
        return True


class Admission:
    """What ``open_sampler(admission=...)`` takes (see the module docs)."""

    def check_routes(self, routes: Sequence[str] | None) -> None:
        """Raise ``ValueError`` for a route the admission names that the sampler's
        routing policy lacks (``routes``; ``None``: the sampler has no routing)."""

    def open(self) -> AbstractAsyncContextManager[AdmissionGate]:
        """The gate for the sampler's lifetime."""
        return _open_default()


@asynccontextmanager
async def _open_default() -> AsyncIterator[AdmissionGate]:
    yield AdmissionGate()
