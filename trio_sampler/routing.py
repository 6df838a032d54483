"""Routing: fallback chains, the per-error routing table, circuit breakers and hedging.

A sampler opened with ``open_sampler(config, routing=RoutingPolicy([...]))`` runs each
request along an ordered chain of :class:`Route` values: each a full
:class:`~trio_sampler.config.SamplerConfig` (backend, address, model, key, its own retry
policy and timeouts) plus the :class:`RouteCapabilities` the chain uses to skip a route
that cannot carry the request. The neutral conversation is rendered again for every
route, so backends may differ along a chain.

Everything in this module is data and pure functions: the routing table
(:data:`ROUTING`, :func:`route_action`), the one breaker rule (:func:`breaker_verdict`)
and the hedge delay (:func:`hedge_delay`). The breaker's state machine
(:class:`CircuitBreaker`, which takes the time as an argument) lives in
:mod:`trio_sampler.breaker`, below the admission a route may carry, and is re-exported
here. The actor applies them; ``docs/routing.md`` is the narrative.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from ._percentile import percentile
from .admission import Admission
from .breaker import WINDOW_BUCKETS as WINDOW_BUCKETS
from .breaker import (
    BreakerPolicy,
    BreakerState,
    BreakerTransition,
    BreakerVerdict,
    CircuitBreaker,
    RouteBreaker,
    check_count,
    check_positive,
)
from .breaker import OutcomeWindow as OutcomeWindow
from .config import SamplerConfig
from .types import Assistant, ConversationRequest, SamplingErrorInfo, SamplingErrorKind, User

__all__ = [
    "ROUTING",
    "BreakerPolicy",
    "BreakerState",
    "BreakerTransition",
    "BreakerVerdict",
    "CircuitBreaker",
    "HedgePolicy",
    "Route",
    "RouteAction",
    "RouteBreaker",
    "RouteCapabilities",
    "RouteSnapshot",
    "RoutingPolicy",
    "RoutingRow",
    "breaker_verdict",
    "ends_in_prefill",
    "hedge_delay",
    "route_action",
    "unsupported_by",
]


# -- routes ----------------------------------------------------------------------------


def _check_window(_instance: object, _attribute: object, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            "RouteCapabilities.context_window is the route's context window in tokens, "
            f"e.g. context_window=200_000 (or None if unknown); got {value!r}"
        )


def _check_flag(name: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(
                f"RouteCapabilities.{name} is True or False, e.g. {name}=True; got {value!r}"
            )

    return check


@attrs.frozen
class RouteCapabilities:
    """What a route can carry. The chain skips a route that cannot carry a request.

    * ``accepts_prefill`` (False): the target continues a trailing assistant message
      (Anthropic Messages does; OpenAI's APIs do not). Only then may a stream cut mid-answer
      be *continued* on this route instead of restarted (``RoutingPolicy.continue_by_prefill``).
    * ``context_window`` (None = unknown): tokens. After a context-length error the chain
      moves on only to a route that declares a larger window than the route that refused.
    * ``hosted_tools`` (True): the route runs server-side tools (web search, code
      execution...). A request with hosted tools skips a route that declares False.
    * ``images`` (True): the route accepts image input. A request with images skips a
      route that declares False.
    """

    accepts_prefill: bool = attrs.field(default=False, validator=_check_flag("accepts_prefill"))
    context_window: int | None = attrs.field(default=None, validator=_check_window)
    hosted_tools: bool = attrs.field(default=True, validator=_check_flag("hosted_tools"))
    images: bool = attrs.field(default=True, validator=_check_flag("images"))


def _check_name(_instance: Any, _attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError(
            f"a Route's name is a short non-empty label without surrounding spaces, e.g. "
            f'Route("primary", config); got {value!r}'
        )


def _check_config(_instance: Any, _attribute: Any, value: Any) -> None:
    if not isinstance(value, SamplerConfig):
        raise TypeError(
            'a Route\'s config is a SamplerConfig, e.g. Route("primary", '
            f"SamplerConfig(base_url=..., model=...)); got a {type(value).__name__}"
        )


def _check_capabilities(_instance: Any, _attribute: Any, value: Any) -> None:
    if not isinstance(value, RouteCapabilities):
        raise TypeError(
            "capabilities must be a RouteCapabilities, e.g. "
            f"RouteCapabilities(context_window=200_000); got a {type(value).__name__}"
        )


def _check_admission(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, Admission):
        raise TypeError(
            "Route.admission is an Admission (or None: the sampler's admission= applies), "
            'e.g. Route("primary", config, admission=FleetAdmission(url, LimiterSpec(...))); '
            f"got a {type(value).__name__}"
        )


def _admission_repr(value: Admission | None) -> str:
    """The admission's kind alone: its own repr may name an address or a credential."""
    return "None" if value is None else f"<{type(value).__name__}>"


@attrs.frozen
class Route:
    """One target of a chain: a name (in metrics, events and logs), its configuration
    (its own retry policy and timeouts included) and what it can carry.

    ``admission`` (``None``: the sampler's ``admission=`` applies) is the route's own
    admission step, e.g. ``FleetAdmission(url, spec)`` for the limits of the route's
    account: the sampler opens it with itself (one per distinct object: routes given the
    same object share it, and its one connection), and the route's attempts go through
    its gate instead of the sampler's. Its breaker is shared as that gate says
    (``AdmissionGate.share_breaker``).
    """

    name: str = attrs.field(validator=_check_name)
    config: SamplerConfig = attrs.field(validator=_check_config, repr=False)
    capabilities: RouteCapabilities = attrs.field(
        factory=RouteCapabilities, validator=_check_capabilities
    )
    admission: Admission | None = attrs.field(
        default=None, validator=_check_admission, repr=_admission_repr, kw_only=True
    )


def unsupported_by(route: Route, request: ConversationRequest) -> str | None:
    """Why ``route`` cannot carry ``request`` (``None``: it can). Pure."""
    capabilities = route.capabilities
    if not capabilities.hosted_tools and request.hosted_tools:
        return "the request uses hosted tools and the route declares hosted_tools=False"
    if not capabilities.images and _has_images(request):
        return "the request has images and the route declares images=False"
    return None


def _has_images(request: ConversationRequest) -> bool:
    return any(
        (isinstance(item, User) and item.images) or getattr(item, "images", ())
        for item in request.items
    )


def ends_in_prefill(request: ConversationRequest) -> bool:
    """The request's last item is an assistant turn with text (a prefill)."""
    return (
        bool(request.items)
        and isinstance(last := request.items[-1], Assistant)
        and bool(last.content)
    )


# -- the routing table -----------------------------------------------------------------


class RouteAction(enum.Enum):
    """What a failed attempt means for the chain (see :data:`ROUTING`)."""

    #: Retry on this route within its own ``RetryPolicy``; when that gives up, the next
    #: route takes over.
    RETRY_THEN_NEXT = "retry_then_next"
    #: Do not retry this route: the next route takes over at once. On the last route of
    #: the chain, the route's ``RetryPolicy`` decides as if there were no chain.
    NEXT = "next"
    #: The next route that declares a larger ``context_window`` than this one; if none,
    #: surface the error (the caller compacts the conversation).
    LARGER_WINDOW = "larger_window"
    #: Never fail over: the request ends with this error (the provider's reason kept).
    SURFACE = "surface"


@attrs.frozen
class RoutingRow:
    """One row of the routing table: errors of ``kind`` (and ``code``, if set) → ``action``."""

    kind: SamplingErrorKind
    code: str | None
    action: RouteAction
    why: str


_A = RouteAction
_K = SamplingErrorKind

#: The one routing table: first row matching ``(kind, error_code)`` wins; rows with a code
#: come before their kind's general row. Every kind has a general row (a test checks it).
ROUTING: Final[tuple[RoutingRow, ...]] = (
    RoutingRow(_K.IDLE_TIMEOUT, "total_timeout", _A.SURFACE, "the whole-call budget is spent"),
    RoutingRow(
        _K.IDLE_TIMEOUT,
        None,
        _A.NEXT,
        "a silent route (no headers, no first token, or a stall) costs a full timeout per "
        "try: fail over after the first",
    ),
    RoutingRow(
        _K.RATE_LIMITED,
        "insufficient_quota",
        _A.NEXT,
        "this key's quota is spent; another route's key may not be",
    ),
    RoutingRow(_K.RATE_LIMITED, None, _A.RETRY_THEN_NEXT, "busy: a short retry, then elsewhere"),
    RoutingRow(_K.OVERLOADED, None, _A.RETRY_THEN_NEXT, "busy: a short retry, then elsewhere"),
    RoutingRow(_K.API, None, _A.RETRY_THEN_NEXT, "a server error (5xx with a provider body)"),
    RoutingRow(_K.HTTP, None, _A.RETRY_THEN_NEXT, "a server or proxy error (5xx, 408, 409)"),
    RoutingRow(_K.TRANSPORT, None, _A.RETRY_THEN_NEXT, "connect, TLS or read failure, cut"),
    RoutingRow(_K.SERIALIZATION, None, _A.RETRY_THEN_NEXT, "a malformed stream"),
    RoutingRow(_K.EMPTY_RESPONSE, None, _A.RETRY_THEN_NEXT, "no text and no tool calls"),
    RoutingRow(
        _K.DOOM_LOOP_DETECTED,
        None,
        _A.RETRY_THEN_NEXT,
        "resampled on the route first (DoomLoopPolicy), then elsewhere",
    ),
    RoutingRow(
        _K.CONTEXT_LENGTH_EXCEEDED,
        None,
        _A.LARGER_WINDOW,
        "only a larger window can carry it; else the caller compacts",
    ),
    RoutingRow(_K.CONTENT_FILTER, None, _A.SURFACE, "the provider's verdict on the content"),
    RoutingRow(_K.AUTH, None, _A.SURFACE, "a credential to fix, not a fault to route around"),
    RoutingRow(_K.INVALID_REQUEST, None, _A.SURFACE, "the request itself is wrong"),
    RoutingRow(
        _K.PAYLOAD_TOO_LARGE, None, _A.SURFACE, "images stripped on the route first; then too big"
    ),
    RoutingRow(
        _K.MAX_TOKENS_TRUNCATION, None, _A.SURFACE, "the output cap was reached: the caller's"
    ),
    RoutingRow(
        _K.FLEET_UNAVAILABLE, None, _A.SURFACE, "the shared limiter is down: nothing was sent"
    ),
    RoutingRow(_K.INTERNAL, None, _A.SURFACE, "a bug of ours is never routed around"),
)

_BY_KEY: Mapping[tuple[SamplingErrorKind, str | None], RouteAction] = MappingProxyType(
    {(row.kind, row.code): row.action for row in ROUTING}
)


def route_action(error: SamplingErrorInfo) -> RouteAction:
    """The routing table's verdict on ``error`` (its code's row, else its kind's)."""
    code = (error.error_code or "").lower() or None
    action = _BY_KEY.get((error.kind, code))
    return action if action is not None else _BY_KEY[(error.kind, None)]


#: Failures that count against a route's breaker: the route, not the request, is at fault.
BREAKER_COUNTS: Final[frozenset[RouteAction]] = frozenset(
    {RouteAction.RETRY_THEN_NEXT, RouteAction.NEXT}
)

#: Failures that say nothing about the route's health either way.
NOT_THE_ROUTES_FAULT: Final[frozenset[SamplingErrorKind]] = frozenset(
    {
        SamplingErrorKind.INTERNAL,
        SamplingErrorKind.FLEET_UNAVAILABLE,
        SamplingErrorKind.DOOM_LOOP_DETECTED,
    }
)


def breaker_verdict(error: SamplingErrorInfo | None) -> BreakerVerdict:
    """The one breaker rule: an attempt that completed, or whose route answered (an
    invalid request, a content filter...), is a success; a failure the routing table
    routes around (:data:`BREAKER_COUNTS`) is a failure; one that says nothing of the
    route (:data:`NOT_THE_ROUTES_FAULT`) is neither."""
    if error is None:
        return BreakerVerdict.SUCCESS
    if error.kind in NOT_THE_ROUTES_FAULT:
        return BreakerVerdict.ABANDONED
    if route_action(error) in BREAKER_COUNTS:
        return BreakerVerdict.FAILURE
    return BreakerVerdict.SUCCESS


# -- hedging ---------------------------------------------------------------------------


@attrs.frozen
class HedgePolicy:
    """Hedged attempts (opt-in): when an attempt has produced no content after the hedge
    delay, a second attempt starts beside it; the first to produce content wins and the
    other is cancelled (its usage, if any, is accounted).

    * ``delay_s``: a fixed hedge delay in seconds; or
    * ``percentile`` (e.g. 0.95): the delay is that percentile of the route's recent times
      to first token (the last ``window`` attempts, at least ``min_samples`` of them;
      ``delay_s`` is used until then, and is required as that fallback).
    * ``next_route`` (False): the hedge goes to the next route of the chain that can take
      the request (when there is one) instead of the same route.
    * ``max_hedges`` (1): how many hedges an attempt may get, one more each time the delay
      passes again with no content. With a share ``s`` of slow attempts, ``s ** (n + 1)``
      of requests stay slow with ``n`` hedges: one hedge cannot fix a p99 when ``s`` is
      10 %, two can.

    A hedge is sent only while its route's breaker permits (a half-open circuit admits its
    one probe and no hedge beside it), and takes a ``max_concurrency`` slot of its own.
    """

    delay_s: float = attrs.field(validator=check_positive("delay_s"))
    percentile: float | None = None
    window: int = attrs.field(default=200, validator=check_count("HedgePolicy", "window"))
    min_samples: int = attrs.field(default=20, validator=check_count("HedgePolicy", "min_samples"))
    next_route: bool = False
    max_hedges: int = attrs.field(default=1, validator=check_count("HedgePolicy", "max_hedges"))

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.next_route, bool):
            raise TypeError(
                f"HedgePolicy.next_route is True or False, e.g. next_route=True; got "
                f"{self.next_route!r}"
            )
        p = self.percentile
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p < 1
        ):
            raise ValueError(
                f"HedgePolicy.percentile is a fraction in (0, 1), e.g. percentile=0.95; got {p!r}"
            )


def hedge_delay(policy: HedgePolicy, recent_ttft_s: Sequence[float]) -> float:
    """The hedge delay given the route's recent times to first token. Pure."""
    if policy.percentile is None or len(recent_ttft_s) < policy.min_samples:
        return policy.delay_s
    return percentile(sorted(recent_ttft_s), policy.percentile)


# -- the policy ------------------------------------------------------------------------


def _routes(value: Iterable[Route]) -> tuple[Route, ...]:
    if isinstance(value, Route | SamplerConfig | str | bytes):
        raise TypeError(
            "RoutingPolicy takes a list of routes, e.g. "
            'RoutingPolicy([Route("primary", primary), Route("fallback", fallback)])'
        )
    return tuple(value)


@attrs.frozen
class RoutingPolicy:
    """The sampler's chain and how it is run: ``open_sampler(config, routing=...)``.

    * ``routes``: the default chain, in order (names unique). A request may name its own
      chain from these routes: ``submit(request, chain=["fallback", "primary"])``.
    * ``breaker`` (:class:`BreakerPolicy` by default; ``None``: no breaker): one circuit
      per route, shared by every request of the sampler.
    * ``hedge`` (``None`` by default): hedged attempts (:class:`HedgePolicy`).
    * ``max_retry_wait_s`` (2 s): a retry on the same route that would first wait longer
      than this (its backoff, or a ``Retry-After``) goes to the next route instead, when
      one can take the request.
    * ``continue_by_prefill`` (False): after a stream broke mid-answer, a route that
      declares ``accepts_prefill`` continues the text already shown (sent as an assistant
      prefill) instead of restarting; without it, or elsewhere, the next attempt restarts
      with ``Retrying(discard_partial=True)``.
    * ``on_breaker_change``: called with each :class:`BreakerTransition`.
    """

    routes: tuple[Route, ...] = attrs.field(converter=_routes)
    breaker: BreakerPolicy | None = attrs.field(factory=BreakerPolicy)
    hedge: HedgePolicy | None = None
    max_retry_wait_s: float = 2.0
    continue_by_prefill: bool = False
    on_breaker_change: Callable[[BreakerTransition], None] | None = attrs.field(
        default=None, eq=False
    )

    def __attrs_post_init__(self) -> None:
        if not self.routes:
            raise ValueError(
                "RoutingPolicy needs at least one route, e.g. "
                'RoutingPolicy([Route("primary", primary), Route("fallback", fallback)])'
            )
        seen: set[str] = set()
        for route in self.routes:
            if not isinstance(route, Route):
                raise TypeError(
                    'each route is a Route, e.g. Route("fallback", SamplerConfig(...)); '
                    f"got a {type(route).__name__}"
                )
            if route.name in seen:
                raise ValueError(
                    f"two routes are named {route.name!r}: give each route its own name"
                )
            seen.add(route.name)
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise TypeError(
                "breaker must be a BreakerPolicy (or None for no breaker), e.g. breaker="
                f"BreakerPolicy(consecutive_failures=5); got a {type(self.breaker).__name__}"
            )
        if self.hedge is not None and not isinstance(self.hedge, HedgePolicy):
            raise TypeError(
                "hedge must be a HedgePolicy (or None), e.g. hedge=HedgePolicy(delay_s=2.0); "
                f"got a {type(self.hedge).__name__}"
            )
        wait = self.max_retry_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(
                "RoutingPolicy.max_retry_wait_s is a number of seconds >= 0, e.g. "
                f"max_retry_wait_s=2.0; got {wait!r}"
            )
        if not isinstance(self.continue_by_prefill, bool):
            raise TypeError(
                "RoutingPolicy.continue_by_prefill is True or False, e.g. "
                f"continue_by_prefill=True; got {self.continue_by_prefill!r}"
            )
        if self.on_breaker_change is not None and not callable(self.on_breaker_change):
            raise TypeError("on_breaker_change must be a function taking a BreakerTransition")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(route.name for route in self.routes)

    def chain(self, names: Sequence[str] | None) -> tuple[Route, ...]:
        """The routes ``names`` picks, in that order (``None``: the default chain).
        Raises ``ValueError`` naming the known routes for an unknown or repeated name."""
        if names is None:
            return self.routes
        if isinstance(names, str):
            raise TypeError(f"chain is a list of route names, e.g. chain=[{names!r}]; got a str")
        by_name = {route.name: route for route in self.routes}
        picked: list[Route] = []
        for name in names:
            route = by_name.get(name)
            if route is None:
                known = ", ".join(repr(n) for n in self.names)
                raise ValueError(f"no route is named {name!r}; the routes are {known}")
            if route in picked:
                raise ValueError(f"the chain names {name!r} twice; name each route once")
            picked.append(route)
        if not picked:
            raise ValueError("chain must name at least one route (or be None for the default)")
        return tuple(picked)


# -- what a sampler reports per route ----------------------------------------------


@attrs.frozen
class RouteSnapshot:
    """A route's state as ``SamplerHandle.route_stats()`` reports it."""

    route: str
    #: The circuit's state (``None``: no breaker).
    state: BreakerState | None
    #: Attempts that ended on the route, the failed ones, and those that completed.
    attempts: int
    failures: int
    completions: int
    #: How many times the circuit opened.
    opened: int
    #: The shared limit the route's attempts are charged to (a fleet limiter's
    #: ``LimiterSpec.name``; ``None``: none).
    admission: str | None = None
    #: Requests the chain passed the route over for its provider rate limit (the
    #: pacer), and for its shared limit (the fleet limiter had no room in time).
    passed_over_rate_limit: int = 0
    passed_over_admission: int = 0
