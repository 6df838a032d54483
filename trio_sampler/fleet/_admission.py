"""The fleet limiter as the sampler's admission step (see :mod:`trio_sampler.admission`)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import MappingProxyType

import attrs
import trio

from ..admission import Admission, AdmissionGate, Ticket
from ..breaker import CircuitBreaker, RouteBreaker
from ..config import SamplerConfig
from ..types import RateLimitSnapshot, SamplingErrorInfo, SamplingErrorKind, Usage
from ..types._credential_names import redact_url
from ..wire import WireRequest
from ._breaker import SharedBreaker
from ._events import EventHook, FleetEvent, LimiterStatistics
from ._limiter import FleetLimiter, Permit, open_limiters
from ._spec import Cost, LimiterSpec

__all__ = ["FleetAdmission", "FleetGate", "LimiterGate"]

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


_RouteSpecs = Mapping[str, LimiterSpec | None]


def _route_specs(value: _RouteSpecs | None) -> _RouteSpecs:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError(
            "FleetAdmission.routes maps route names to their LimiterSpec (or None: not "
            'limited by the fleet), e.g. routes={"primary": LimiterSpec(...), "backup": '
            f"None}}; got a {type(value).__name__}"
        )
    routes: dict[str, LimiterSpec | None] = {}
    for route, spec in value.items():
        if not isinstance(route, str) or not route.strip():
            raise ValueError(
                "FleetAdmission.routes is keyed by route names, as in "
                f'Route("primary", config); got the key {route!r}'
            )
        if spec is not None and not isinstance(spec, LimiterSpec):
            raise TypeError(
                f"FleetAdmission.routes[{route!r}] must be a LimiterSpec (or None: the "
                f"fleet does not limit the route), not a {type(spec).__name__}"
            )
        routes[route] = spec
    return MappingProxyType(routes)


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in names)


@attrs.frozen
class FleetAdmission(Admission):
    """Shared limits for a sampler: ``open_sampler(config, admission=FleetAdmission(url,
    spec))``. The sampler opens one Redis client for its lifetime and asks the limiter
    before every attempt; every attempt is charged, retries included.

    Before each attempt the request's cost is reserved: one request, the prompt estimate
    (the body's length / ``spec.chars_per_token``) and the body's output cap
    (``max_tokens`` and its per-backend names, else ``config.default_max_output_tokens``).
    When the attempt ends, the reservation is corrected with the usage it reported.
    Before each retry the fleet retry budget is asked, and a 429's ``Retry-After`` is
    shared with the fleet.

    **Per route.** With routing, ``routes`` gives routes their own limiter (one account
    each): ``routes={"primary": spec_a, "backup": spec_b}``. Routes whose specs have the
    same name share one limiter (the same account); a route named with ``None`` is not
    limited by the fleet; a route not named uses ``spec``, and without ``spec`` is not
    limited either. Requests without a chain use ``spec``. Each attempt is charged to the
    limiter of the route it runs on (hedges and fail-overs included), and the chain asks
    each route's limiter when it chooses a route: a route whose shared budget would hold
    the attempt longer than ``RoutingPolicy.max_retry_wait_s`` is passed over while a
    later route could take the request (see ``docs/fleet.md``). Route names are checked
    against the routing policy when ``open_sampler`` is called. Every limiter shares the
    sampler's one Redis client.

    ``share_breakers`` (off by default) shares the circuit breakers of a routing sampler
    across the fleet: ``True`` for every route the fleet limits, or the names of the
    routes to share. A route one process sees failing opens for every process (they
    learn it within ``breaker_sync_s``, and at once after their own breakers change); its
    state lives beside its route's limiter. See ``docs/fleet.md``.
    """

    #: The Redis URL (its password, if any, hidden in the repr).
    url: str = attrs.field(repr=redact_url)
    spec: LimiterSpec | None = None
    on_event: EventHook | None = None
    share_breakers: bool | frozenset[str] = attrs.field(default=False, converter=_route_names)
    breaker_sync_s: float = 0.25
    routes: Mapping[str, LimiterSpec | None] = attrs.field(
        factory=dict, converter=_route_specs, hash=False, kw_only=True
    )

    def __attrs_post_init__(self) -> None:
        sync = self.breaker_sync_s
        if isinstance(sync, bool) or not isinstance(sync, int | float) or not 0 < sync < math.inf:
            raise ValueError(
                f"FleetAdmission.breaker_sync_s is a positive number of seconds; got {sync!r}"
            )
        if self.spec is not None and not isinstance(self.spec, LimiterSpec):
            raise TypeError(
                "FleetAdmission.spec must be a LimiterSpec, e.g. FleetAdmission(url, "
                f'LimiterSpec("openai:org-abc", FleetLimits(...), ...)); got a '
                f"{type(self.spec).__name__}"
            )
        seen: dict[str, tuple[LimiterSpec, str]] = {}
        named = [("spec=", self.spec)] + [(f"routes[{r!r}]", s) for r, s in self.routes.items()]
        for where, spec in named:
            if spec is None:
                continue
            first = seen.setdefault(spec.name, (spec, where))
            if first[0] != spec:
                raise ValueError(
                    f"{first[1]} and {where} both name the limiter {spec.name!r} with "
                    "different settings: one name is one shared limiter, so give both the "
                    "same LimiterSpec (routes of one account), or give them different names"
                )
        if not seen:
            raise ValueError(
                "FleetAdmission limits nothing: give spec=LimiterSpec(...) (every route, and "
                'requests without routing), and/or routes={"primary": LimiterSpec(...)}'
            )

    def limiter_for(self, route: str | None) -> LimiterSpec | None:
        """The spec of the limiter ``route``'s attempts are charged to (``None``: the
        fleet does not limit it); the route ``None`` is a request without routing."""
        if route is not None and route in self.routes:
            return self.routes[route]
        return self.spec

    def check_routes(self, routes: Sequence[str] | None) -> None:
        """Raise ``ValueError`` for a route named here that the sampler's routing policy
        lacks (``routes``; ``None``: the sampler has no routing). ``open_sampler`` calls
        it, so a misspelt route fails at the call."""
        shared = self.share_breakers
        if routes is None:
            if self.routes:
                raise ValueError(
                    f"FleetAdmission(routes=...) limits the routes {_quoted(self.routes)}, "
                    "and this sampler has no routing: open it with routing=RoutingPolicy"
                    "([...]), or give FleetAdmission spec= alone"
                )
            if isinstance(shared, frozenset) and shared:
                raise ValueError(
                    f"FleetAdmission(share_breakers=...) names the routes {_quoted(shared)}, "
                    "and this sampler has no routing: open it with routing=RoutingPolicy([...])"
                )
            return
        known = list(routes)
        named = [*self.routes, *(sorted(shared) if isinstance(shared, frozenset) else ())]
        for route in named:
            if route not in known:
                raise ValueError(
                    f"FleetAdmission names the route {route!r}, which the sampler's routing "
                    f"policy does not have; its routes are {_quoted(known)}"
                )
        if isinstance(shared, frozenset):
            for route in sorted(shared):
                if self.limiter_for(route) is None:
                    raise ValueError(
                        f"share_breakers names {route!r}, which the fleet does not limit: a "
                        "shared breaker lives beside its route's limiter, so give the route "
                        "a LimiterSpec (routes= or spec=), or do not share its breaker"
                    )

    def _specs(self) -> list[LimiterSpec]:
        """Each distinct limiter once, the default first."""
        specs: dict[str, LimiterSpec] = {}
        for spec in (self.spec, *self.routes.values()):
            if spec is not None:
                specs.setdefault(spec.name, spec)
        return list(specs.values())

    @asynccontextmanager
    async def open(self) -> AsyncIterator[FleetGate]:
        gates: list[FleetGate] = []
        hook = self.on_event

        def named(event: FleetEvent) -> None:
            # Each limiter's events name the sampler's routes it admits.
            assert hook is not None
            routes = gates[0].routes_of(event.limiter) if gates else ()
            hook(attrs.evolve(event, routes=routes))

        async with (
            open_limiters(
                self._specs(), self.url, on_event=None if hook is None else named
            ) as limiters,
            trio.open_nursery() as nursery,
        ):
            by_name = {limiter.spec.name: limiter for limiter in limiters}
            default = None if self.spec is None else by_name[self.spec.name]
            routes = {
                route: None if spec is None else by_name[spec.name]
                for route, spec in self.routes.items()
            }
            gate = FleetGate(default, self.share_breakers, self.breaker_sync_s, routes=routes)
            gates.append(gate)
            nursery.start_soon(gate.run_breaker_sync)
            try:
                yield gate
            finally:
                nursery.cancel_scope.cancel()


class _PermitTicket(Ticket):
    """An attempt admitted by a limiter: its permit, settled or withdrawn there."""

    def __init__(self, limiter: FleetLimiter, permit: Permit) -> None:
        self.limiter = limiter
        self.permit = permit

    def observe(self, snapshot: RateLimitSnapshot, at: float) -> None:
        """The provider's rate-limit report for the attempt: the settlement clamps the
        shared state to it (no round trip of its own)."""
        self.limiter.observe(self.permit, snapshot, at)

    async def settle(self, usage: Usage | None) -> None:
        permit = self.permit
        actual = (
            None
            if usage is None
            else Cost(permit.cost.requests, usage.input_tokens, usage.output_tokens)
        )
        await self.limiter.release(permit, actual)

    async def withdraw(self) -> None:
        await self.limiter.withdraw(self.permit)


class LimiterGate(AdmissionGate):
    """One limiter as the gate of the routes it limits: admits, settles and allows the
    retries of their attempts (built by :class:`FleetGate`)."""

    def __init__(self, limiter: FleetLimiter) -> None:
        self.limiter = limiter

    def __repr__(self) -> str:
        return f"LimiterGate({self.limiter.spec.name!r})"

    @property
    def name(self) -> str:
        """The limiter's name (``LimiterSpec.name``): what ``route_stats`` shows."""
        return self.limiter.spec.name

    def statistics(self) -> LimiterStatistics:
        return self.limiter.statistics()

    def cost(self, wire: WireRequest, config: SamplerConfig) -> Cost:
        """What an attempt with this body reserves."""
        output = config.default_max_output_tokens
        for field in _MAX_OUTPUT_FIELDS:
            value = wire.data.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                output = value
                break
        return Cost(1, self.limiter.spec.estimate_input_tokens(wire.body, wire), output)

    async def admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        deadline: float = math.inf,
        first_attempt: bool = True,
    ) -> Ticket:
        permit = await self.limiter.acquire(
            self.cost(wire, config), deadline=deadline, first_attempt=first_attempt
        )
        return _PermitTicket(self.limiter, permit)

    async def try_admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        within: float,
        deadline: float = math.inf,
        first_attempt: bool = True,
    ) -> Ticket:
        """Admit only if the attempt can start within ``within`` seconds (one round
        trip); else :class:`~trio_sampler.admission.AdmissionBusyError`, nothing reserved."""
        permit = await self.limiter.acquire(
            self.cost(wire, config), deadline=deadline, first_attempt=first_attempt, within=within
        )
        return _PermitTicket(self.limiter, permit)

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool:
        if error.kind is SamplingErrorKind.RATE_LIMITED and error.retry_after is not None:
            await self.limiter.note_retry_after(error.retry_after)
        return await self.limiter.try_retry()


class FleetGate(AdmissionGate):
    """An open :class:`FleetAdmission`: the gate the sampler's requests go through, one
    :class:`LimiterGate` per limiter (:meth:`for_route`).

    Used as a gate itself, it admits with the default limiter (``FleetAdmission.spec``).
    """

    def __init__(
        self,
        limiter: FleetLimiter | None,
        share_breakers: bool | frozenset[str] = False,
        breaker_sync_s: float = 0.25,
        *,
        routes: Mapping[str, FleetLimiter | None] | None = None,
    ) -> None:
        #: The default limiter: routes not in ``routes``, and requests without routing.
        self.limiter = limiter
        self.share_breakers = share_breakers
        self.breaker_sync_s = breaker_sync_s
        self._gates: dict[str, LimiterGate] = {}
        self._default = None if limiter is None else self._gate(limiter)
        self._routes = {
            route: None if found is None else self._gate(found)
            for route, found in (routes or {}).items()
        }
        #: Routes the sampler asked a gate for, by limiter name (an ordered set).
        self._asked: dict[str, dict[str, None]] = {}
        #: Shared breakers, by the limiter they are synced through.
        self.breakers: dict[str, list[SharedBreaker]] = {}
        self._changed = trio.Event()

    def _gate(self, limiter: FleetLimiter) -> LimiterGate:
        gate = self._gates.get(limiter.spec.name)
        if gate is None:
            gate = self._gates[limiter.spec.name] = LimiterGate(limiter)
        return gate

    def for_route(self, route: str | None) -> LimiterGate | None:
        """The gate of ``route``'s limiter (``None``: the fleet does not limit it); the
        route ``None`` is a request without routing. The sampler asks once per route."""
        named = route is not None and route in self._routes
        gate = self._routes[route] if named and route is not None else self._default
        if gate is not None and route is not None:
            self._asked.setdefault(gate.name, {})[route] = None
        return gate

    def routes_of(self, limiter: str) -> tuple[str, ...]:
        """The routes the sampler asked for that ``limiter`` admits, in their order."""
        return tuple(self._asked.get(limiter, ()))

    def statistics(self) -> dict[str, LimiterStatistics]:
        """Each limiter's counters in this process, by limiter name."""
        return {name: gate.statistics() for name, gate in self._gates.items()}

    def share_breaker(self, route: str, breaker: RouteBreaker) -> CircuitBreaker:
        """The breaker the sampler uses for ``route``: shared when the route is (and the
        fleet limits it: the shared state lives beside the route's limiter)."""
        shared = self.share_breakers
        gate = self.for_route(route)
        if shared is False or (shared is not True and route not in shared) or gate is None:
            return breaker
        wrapped = SharedBreaker(breaker, self._notify)
        self.breakers.setdefault(gate.name, []).append(wrapped)
        return wrapped

    def _notify(self) -> None:
        self._changed.set()

    async def run_breaker_sync(self) -> None:
        """Sync the shared breakers every ``breaker_sync_s``, and at once after a change:
        one round trip per limiter that holds shared breakers."""
        while True:
            with trio.move_on_after(self.breaker_sync_s):
                await self._changed.wait()
            self._changed = trio.Event()
            for name, breakers in self.breakers.items():
                await self._gates[name].limiter.sync_breakers(breakers)

    def _default_gate(self) -> LimiterGate:
        if self._default is None:
            raise RuntimeError(
                "this FleetAdmission has no default spec; its gates are per route (for_route)"
            )
        return self._default

    def cost(self, wire: WireRequest, config: SamplerConfig) -> Cost:
        """What an attempt with this body reserves from the default limiter."""
        return self._default_gate().cost(wire, config)

    async def admit(
        self,
        wire: WireRequest,
        config: SamplerConfig,
        *,
        deadline: float = math.inf,
        first_attempt: bool = True,
    ) -> Ticket:
        return await self._default_gate().admit(
            wire, config, deadline=deadline, first_attempt=first_attempt
        )

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool:
        return await self._default_gate().retry_allowed(error)
