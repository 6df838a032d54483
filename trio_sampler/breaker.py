"""Circuit breakers: the state machine of a route's circuit, and its policy.

Pure: nothing here reads a clock (every method takes the time on trio's clock) or knows
of routes beyond their names. :mod:`trio_sampler.routing` re-exports every name (the
public home of the breaker is the routing policy, ``RoutingPolicy(breaker=...)``); the
module sits below :mod:`trio_sampler.admission` so that an admission (which may share a
route's breaker across processes) and a :class:`~trio_sampler.routing.Route` (which may
carry an admission of its own) import it without a cycle. Which attempt ends count for
or against a route is the routing table's (:func:`trio_sampler.routing.breaker_verdict`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs

__all__ = [
    "WINDOW_BUCKETS",
    "BreakerPolicy",
    "BreakerState",
    "BreakerTransition",
    "BreakerVerdict",
    "CircuitBreaker",
    "OutcomeWindow",
    "RouteBreaker",
    "check_count",
    "check_positive",
]


class BreakerVerdict(enum.Enum):
    """What an attempt's end tells its route's breaker (:func:`breaker_verdict`)."""

    SUCCESS = "success"
    FAILURE = "failure"
    #: Neither: a half-open circuit's probe slot is freed, nothing is counted.
    ABANDONED = "abandoned"


class BreakerState(enum.Enum):
    """A route's circuit: closed (in use), open (routed around), half open (one probe)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


def check_positive(name: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"BreakerPolicy.{name} must be a positive number; got {value!r}")

    return check


def check_count(owner: str, name: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be a whole number >= 1; got {value!r}")

    return check


@attrs.frozen
class BreakerPolicy:
    """When a route's circuit opens, and how it is probed (``docs/routing.md``).

    * Opens after ``consecutive_failures`` (5) failed attempts in a row, or when at least
      ``min_attempts`` (10) attempts ended within the last ``window_s`` (30 s) and at
      least ``failure_ratio`` (0.5) of them failed.
    * Open for ``open_s`` (5 s); then half open: the next attempt is the one probe (other
      requests keep routing around it). A probe that succeeds closes the circuit; one that
      fails opens it again for ``backoff`` (2) times as long, at most ``max_open_s``
      (30 s): 5, 10, 20, 30, 30 ... seconds. So a route that recovers is back in use
      within ``max_open_s`` plus one request interval, and is never probed by more than
      one request at a time.

    Only failures the routing table blames on the route count (5xx, 429, transport,
    timeouts, malformed streams); an invalid request, a content filter or a
    context-length error does not.
    """

    consecutive_failures: int = attrs.field(
        default=5, validator=check_count("BreakerPolicy", "consecutive_failures")
    )
    failure_ratio: float = 0.5
    window_s: float = attrs.field(default=30.0, validator=check_positive("window_s"))
    min_attempts: int = attrs.field(
        default=10, validator=check_count("BreakerPolicy", "min_attempts")
    )
    open_s: float = attrs.field(default=5.0, validator=check_positive("open_s"))
    backoff: float = 2.0
    max_open_s: float = attrs.field(default=30.0, validator=check_positive("max_open_s"))

    def __attrs_post_init__(self) -> None:
        ratio = self.failure_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValueError(
                "BreakerPolicy.failure_ratio is a fraction in (0, 1], e.g. failure_ratio=0.5; "
                f"got {ratio!r}"
            )
        backoff = self.backoff
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 1:
            raise ValueError(
                f"BreakerPolicy.backoff is a factor >= 1, e.g. backoff=2.0; got {backoff!r}"
            )
        if self.max_open_s < self.open_s:
            raise ValueError(
                f"BreakerPolicy.max_open_s ({self.max_open_s}) must be >= open_s ({self.open_s})"
            )


@attrs.frozen
class BreakerTransition:
    """A route's circuit changed state (given to ``RoutingPolicy.on_breaker_change``)."""

    route: str
    old: BreakerState
    new: BreakerState
    #: ``trio.current_time()`` of the change.
    at: float
    #: While open: how long until the next probe is allowed, in seconds.
    open_for_s: float | None = None


class CircuitBreaker(Protocol):
    """The breaker interface the actor uses. The state may live elsewhere (a fleet could
    share it across processes); every method takes the time on trio's clock."""

    @property
    def state(self) -> BreakerState: ...

    @property
    def opened(self) -> int:
        """How many times the circuit opened (``RouteSnapshot.opened``)."""
        ...

    def allow(self, now: float) -> bool:
        """May an attempt go to this route now? In half open, True for one probe at a time."""
        ...

    def record_success(self, now: float) -> None: ...

    def record_failure(self, now: float) -> None: ...

    def record_abandoned(self, now: float) -> None:
        """An allowed attempt ended without a verdict (cancelled, or a failure the route is
        not blamed for): a probe's slot is free again."""
        ...


#: Buckets a breaker's window is counted in (its resolution: the window / this).
WINDOW_BUCKETS = 20


class OutcomeWindow:
    """Attempts and failures of the last ``window_s`` seconds, counted in
    :data:`WINDOW_BUCKETS` buckets: recording and reading are O(1) whatever the traffic
    (the oldest bucket leaves whole, so the window is ``window_s`` to one bucket more)."""

    __slots__ = ("_attempts", "_buckets", "_failures", "_newest", "_width")

    def __init__(self, window_s: float) -> None:
        self._width = window_s / WINDOW_BUCKETS
        #: Per bucket: its index (time / width), attempts, failures.
        self._buckets = [[-1, 0, 0] for _ in range(WINDOW_BUCKETS + 1)]
        self._newest = -1
        self._attempts = 0
        self._failures = 0

    def add(self, now: float, *, failed: bool) -> None:
        index = self._advance(now)
        bucket = self._buckets[index % len(self._buckets)]
        bucket[1] += 1
        bucket[2] += failed
        self._attempts += 1
        self._failures += failed

    def counts(self) -> tuple[int, int]:
        """Attempts and failures in the window (as of the last :meth:`add`)."""
        return self._attempts, self._failures

    def clear(self) -> None:
        for bucket in self._buckets:
            bucket[:] = [-1, 0, 0]
        self._attempts = self._failures = 0

    def _advance(self, now: float) -> int:
        index = math.floor(now / self._width)
        if index <= self._newest:
            return max(index, self._newest - WINDOW_BUCKETS)  # late: counted as old as kept
        # Buckets that fell out of the window leave (at most all of them: O(1)).
        for stale in range(max(self._newest + 1, index - WINDOW_BUCKETS), index + 1):
            bucket = self._buckets[stale % len(self._buckets)]
            self._attempts -= bucket[1]
            self._failures -= bucket[2]
            bucket[:] = [stale, 0, 0]
        self._newest = index
        return index


class RouteBreaker:
    """The in-process :class:`CircuitBreaker` (see :class:`BreakerPolicy` for the rules).

    Pure: it never reads a clock. ``on_change`` is called with each
    :class:`BreakerTransition`, synchronously.
    """

    def __init__(
        self,
        route: str,
        policy: BreakerPolicy,
        on_change: Callable[[BreakerTransition], None] | None = None,
    ) -> None:
        self.route = route
        self.policy = policy
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        #: Attempts and failures ended within the window, counted in buckets.
        self._recent = OutcomeWindow(policy.window_s)
        self._open_for = policy.open_s
        self._opened_at = 0.0
        self._probing = False
        #: When the probe in flight was let through (its failure reopens from then).
        self._probe_at = 0.0
        #: How many times the circuit opened (metrics).
        self.opened = 0

    @property
    def state(self) -> BreakerState:
        return self._state

    def reopens_in(self, now: float) -> float:
        """Seconds until a probe is allowed (0 unless open)."""
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._open_for - now)

    def allow(self, now: float) -> bool:
        if self._state is BreakerState.OPEN and now >= self._opened_at + self._open_for:
            self._move(BreakerState.HALF_OPEN, now)
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            self._probe_at = now
            return True
        return False

    def record_success(self, now: float) -> None:
        self._note(now, failed=False)
        self._consecutive = 0
        if self._state is not BreakerState.CLOSED:
            self._probing = False
            self._open_for = self.policy.open_s
            self._recent.clear()
            self._move(BreakerState.CLOSED, now)

    def record_failure(self, now: float) -> None:
        self._note(now, failed=True)
        self._consecutive += 1
        if self._state is BreakerState.HALF_OPEN:
            # Open again, counted from the probe's start: the next probe is due
            # ``open_for`` after this one, whatever its round trip took.
            self._probing = False
            self._open_for = min(self.policy.max_open_s, self._open_for * self.policy.backoff)
            self._open(min(self._probe_at, now), now)
        elif self._state is BreakerState.CLOSED and self._tripped():
            self._open_for = self.policy.open_s
            self._open(now, now)

    def record_abandoned(self, now: float) -> None:
        if self._state is BreakerState.HALF_OPEN:
            self._probing = False

    def _tripped(self) -> bool:
        policy = self.policy
        if self._consecutive >= policy.consecutive_failures:
            return True
        attempts, failures = self._recent.counts()
        if attempts < policy.min_attempts:
            return False
        return failures >= policy.failure_ratio * attempts

    def _note(self, now: float, *, failed: bool) -> None:
        self._recent.add(now, failed=failed)

    def _open(self, since: float, now: float) -> None:
        self._opened_at = since
        self.opened += 1
        self._move(BreakerState.OPEN, now)

    def _move(self, new: BreakerState, now: float) -> None:
        old, self._state = self._state, new
        if self._on_change is not None and (old is not new or new is BreakerState.OPEN):
            open_for = self.reopens_in(now) if new is BreakerState.OPEN else None
            self._on_change(BreakerTransition(self.route, old, new, now, open_for))
