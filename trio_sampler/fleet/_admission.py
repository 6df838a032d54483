"""The fleet limiter as the sampler's admission step (see :mod:`trio_sampler.admission`)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import attrs
import trio

from ..config import SamplerConfig
from ..routing import CircuitBreaker, RouteBreaker
from ..types import RateLimitSnapshot, SamplingErrorInfo, SamplingErrorKind, Usage
from ..wire import WireRequest
from ._breaker import SharedBreaker
from ._events import EventHook
from ._limiter import FleetLimiter, Permit, open_limiter
from ._spec import Cost, LimiterSpec

__all__ = ["FleetAdmission", "FleetGate"]

# Where each backend's body says how many tokens the answer may take.
_MAX_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _route_names(value: bool | Iterable[str]) -> bool | frozenset[str]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        raise TypeError(
            "share_breakers takes True (every route) or route names, e.g. "
            f'share_breakers={{"{value}"}}, not a bare string'
        )
    return frozenset(value)


@attrs.frozen
class FleetAdmission:
    """Shared limits for a sampler: ``open_sampler(config, admission=FleetAdmission(url,
    spec))``. The sampler opens one Redis client for its lifetime and asks the limiter
    before every attempt; every attempt is charged, retries included.

    Before each attempt the request's cost is reserved: one request, the prompt estimate
    (the body's length / ``spec.chars_per_token``) and the body's output cap
    (``max_tokens`` and its per-backend names, else ``config.default_max_output_tokens``).
    When the attempt ends, the reservation is corrected with the usage it reported.
    Before each retry the fleet retry budget is asked, and a 429's ``Retry-After`` is
    shared with the fleet.

    ``share_breakers`` (off by default) shares the circuit breakers of a routing sampler
    across the fleet: ``True`` for every route, or the names of the routes to share. A
    route one process sees failing opens for every process (they learn it within
    ``breaker_sync_s``, and at once after their own breakers change); see
    ``docs/fleet.md``.
    """

    url: str
    spec: LimiterSpec
    on_event: EventHook | None = None
    share_breakers: bool | frozenset[str] = attrs.field(default=False, converter=_route_names)
    breaker_sync_s: float = 0.25

    def __attrs_post_init__(self) -> None:
        sync = self.breaker_sync_s
        if isinstance(sync, bool) or not isinstance(sync, int | float) or not 0 < sync < math.inf:
            raise ValueError(
                f"FleetAdmission.breaker_sync_s is a positive number of seconds; got {sync!r}"
            )

    @asynccontextmanager
    async def open(self) -> AsyncIterator[FleetGate]:
        async with (
            open_limiter(self.spec, self.url, on_event=self.on_event) as limiter,
            trio.open_nursery() as nursery,
        ):
            gate = FleetGate(limiter, self.share_breakers, self.breaker_sync_s)
            nursery.start_soon(gate.run_breaker_sync)
            try:
                yield gate
            finally:
                nursery.cancel_scope.cancel()


@attrs.define
class FleetGate:
    """An open :class:`FleetAdmission`: the gate the sampler's requests go through."""

    limiter: FleetLimiter
    share_breakers: bool | frozenset[str] = False
    breaker_sync_s: float = 0.25
    breakers: list[SharedBreaker] = attrs.field(factory=list)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def share_breaker(self, route: str, breaker: RouteBreaker) -> CircuitBreaker:
        """The breaker the sampler uses for ``route``: shared when the route is."""
        shared = self.share_breakers
        if shared is False or (shared is not True and route not in shared):
            return breaker
        wrapped = SharedBreaker(breaker, self._notify)
        self.breakers.append(wrapped)
        return wrapped

    def _notify(self) -> None:
        self._changed.set()

    async def run_breaker_sync(self) -> None:
        """Sync the shared breakers every ``breaker_sync_s``, and at once after a change."""
        while True:
            with trio.move_on_after(self.breaker_sync_s):
                await self._changed.wait()
            self._changed = trio.Event()
            await self.limiter.sync_breakers(self.breakers)

    def cost(self, wire: WireRequest, config: SamplerConfig) -> Cost:
        """What an attempt with this body reserves."""
        output = config.default_max_output_tokens
        for field in _MAX_OUTPUT_FIELDS:
            value = wire.data.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                output = value
                break
        return Cost(1, self.limiter.spec.estimate_input_tokens(wire.body), output)

    async def admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        deadline: float = math.inf,
        first_attempt: bool = True,
    ) -> Permit:
        return await self.limiter.acquire(
            self.cost(wire, config), deadline=deadline, first_attempt=first_attempt
        )

    def observe_rate_limit(self, ticket: object, snapshot: RateLimitSnapshot, at: float) -> None:
        """The provider's rate-limit report for the attempt: the settlement clamps the
        shared state to it (no round trip of its own)."""
        assert isinstance(ticket, Permit)
        self.limiter.observe(ticket, snapshot, at)

    async def settle(self, ticket: object, usage: Usage | None) -> None:
        assert isinstance(ticket, Permit)
        actual = (
            None
            if usage is None
            else Cost(ticket.cost.requests, usage.input_tokens, usage.output_tokens)
        )
        await self.limiter.release(ticket, actual)

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool:
        if error.kind is SamplingErrorKind.RATE_LIMITED and error.retry_after is not None:
            await self.limiter.note_retry_after(error.retry_after)
        return await self.limiter.try_retry()
