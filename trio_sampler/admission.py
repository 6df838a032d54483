"""The admission step of the actor: what it asks before each attempt, and tells after it.

A sampler opened with ``open_sampler(config, admission=...)`` enters ``admission.open()``
for its lifetime (so any connection the admission needs, such as the fleet limiter's
Redis client, is opened and closed with the sampler) and then, for every attempt of
every request:

1. ``await gate.admit(wire, config, deadline=..., first_attempt=...)`` before sending
   (cancellable; ``deadline`` is the request's ``Timeouts.total`` deadline on trio's
   clock). It returns a ticket, or raises :class:`AdmissionRefusedError`, whose ``info``
   becomes the request's ``Failed`` terminal (never retried);
2. ``await gate.settle(ticket, usage)`` when the attempt ends, however it ends, with the
   usage it reported (``None`` if none): shielded from cancellation, so it must bound its
   own time;
3. before a retry, ``await gate.retry_allowed(error)``: False ends the request with
   ``Failed`` (the error, noting the budget). A ``Retry-After`` in ``error`` is the
   gate's to share.

A gate that also has ``observe_rate_limit(ticket, snapshot, at)`` (a
:class:`RateLimitObserver`) is told, synchronously, what the provider's answer to an
admitted attempt reported of its rate limits (its headers, or a 429's), with the time it
was read on trio's clock; the fleet limiter tightens its shared state with it when the
attempt is settled.

A gate that has ``share_breaker(route, breaker)`` (a :class:`BreakerSharing`) is offered
each route's circuit breaker when the sampler opens, and returns the breaker the sampler
uses for that route (the same one, or one whose state it shares, as the fleet does).

Limits per route. An admission that has ``check_routes(routes)`` (a
:class:`RoutedAdmission`) is shown the names of the sampler's routes when
``open_sampler`` is called, and raises ``ValueError`` there for a route it names that the
routing policy does not have. Its gate has ``for_route(route)`` (a :class:`RoutedGate`):
the gate each route's attempts go through (``None``: that route is not limited; the
route ``None`` is a request without routing), kept in the route's
:class:`~trio_sampler.routing.RouteState`. Every attempt is admitted, settled and asked
about retries by the gate of the route it runs on.

Choosing a route. A route's gate that has ``try_admit`` (a :class:`RouteChoosingGate`) is
asked by the chain, for a route's first attempt while a later route could take the
request, to admit only if the attempt can start within ``within`` seconds (the routing
policy's ``max_retry_wait_s``). Otherwise it raises :class:`AdmissionBusyError`, having
reserved nothing, and the chain passes the route over (``skipped_routes``); the last
route that can take the request is asked with ``admit`` and waits. A refusal of kind
``FLEET_UNAVAILABLE`` from ``try_admit`` passes the route over too (a later route's
admission may fail open); from the last route it ends the request. ``withdraw(ticket)``
gives back everything an admitted attempt that was never sent reserved.

:mod:`trio_sampler.fleet` provides the implementation over Redis (``FleetAdmission``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .config import SamplerConfig
from .types import RateLimitSnapshot, SamplingErrorInfo, TrioSamplerError, Usage
from .wire import WireRequest

if TYPE_CHECKING:
    from .routing import CircuitBreaker, RouteBreaker

__all__ = [
    "Admission",
    "AdmissionBusyError",
    "AdmissionGate",
    "AdmissionRefusedError",
    "BreakerSharing",
    "RateLimitObserver",
    "RouteChoosingGate",
    "RoutedAdmission",
    "RoutedGate",
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


class AdmissionGate(Protocol):
    """An open admission, shared by every request of one sampler."""

    async def admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        deadline: float,
        first_attempt: bool,
    ) -> object: ...

    async def settle(self, ticket: object, usage: Usage | None) -> None: ...

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool: ...


@runtime_checkable
class RateLimitObserver(Protocol):
    """A gate that wants the provider's rate-limit reports (see the module docs): called
    without awaiting, so it must not block."""

    def observe_rate_limit(
        self, ticket: object, snapshot: RateLimitSnapshot, at: float
    ) -> None: ...


@runtime_checkable
class BreakerSharing(Protocol):
    """A gate that shares routes' circuit breakers (see the module docs)."""

    def share_breaker(self, route: str, breaker: RouteBreaker) -> CircuitBreaker: ...


@runtime_checkable
class RouteChoosingGate(Protocol):
    """A route's gate the chain may ask while it chooses a route (see the module docs)."""

    async def try_admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        within: float,
        deadline: float,
        first_attempt: bool,
    ) -> object: ...

    async def withdraw(self, ticket: object) -> None: ...


@runtime_checkable
class RoutedGate(Protocol):
    """An open admission with a gate per route (see the module docs)."""

    def for_route(self, route: str | None) -> AdmissionGate | None: ...


@runtime_checkable
class RoutedAdmission(Protocol):
    """An admission configured per route: checked against the sampler's routes when
    ``open_sampler`` is called (``None``: the sampler has no routing)."""

    def check_routes(self, routes: Sequence[str] | None) -> None: ...


class Admission(Protocol):
    """What ``open_sampler(admission=...)`` takes: it opens a gate for the sampler's life."""

    def open(self) -> AbstractAsyncContextManager[AdmissionGate]: ...
