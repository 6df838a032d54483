"""What a fleet limiter announces: state changes as events, counters as statistics."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._spec import FailurePolicy

__all__ = ["FleetEvent", "LimiterDegraded", "LimiterRecovered", "LimiterStatistics"]


@attrs.frozen
class LimiterDegraded:
    """Redis failed or was slower than the admission timeout; ``policy`` applies from now
    until a probe succeeds (at most every ``probe_interval``)."""

    limiter: str
    policy: FailurePolicy
    #: What failed, in words (an exception's type and message; never a password).
    reason: str
    #: The sampler's routes this limiter admits (empty for a limiter opened on its own,
    #: or one only requests without routing use).
    routes: tuple[str, ...] = ()


@attrs.frozen
class LimiterRecovered:
    """Redis answered again; shared limits apply from now."""

    limiter: str
    #: How long the limiter was degraded, in seconds.
    degraded_for: float
    #: The sampler's routes this limiter admits (as in :class:`LimiterDegraded`).
    routes: tuple[str, ...] = ()


FleetEvent = LimiterDegraded | LimiterRecovered
EventHook = Callable[[FleetEvent], None]


@attrs.frozen
class LimiterStatistics:
    """Counters of one limiter in this process, since it was opened (a metric snapshot)."""

    #: Admitted by the shared state in Redis.
    admitted: int = 0
    #: Admitted by the local floor while degraded (``FAIL_OPEN``).
    admitted_locally: int = 0
    #: Lease calls that took a batch (``LimiterSpec.leases``): the round trips behind
    #: the admissions spent from a lease.
    lease_refills: int = 0
    #: Refused: the wait would pass the request's deadline, or the cost exceeds a burst.
    refused: int = 0
    #: Asked by a chain choosing a route, and found no room within its bound: the
    #: request went to a later route (nothing reserved).
    passed_over: int = 0
    #: Refused because Redis was unavailable (``FAIL_CLOSED``).
    refused_unavailable: int = 0
    #: Seconds spent waiting for admission, summed over requests.
    waited: float = 0.0
    #: Redis calls that failed, timed out, or were answered wrongly.
    redis_failures: int = 0
    #: Of those, replies of the wrong shape (or not RESP at all).
    malformed_replies: int = 0
    #: Times the limiter entered the degraded state.
    degradations: int = 0
    #: True while degraded.
    degraded: bool = False
    #: Fleet retry budget: retries allowed and refused.
    retries_allowed: int = 0
    retries_refused: int = 0
    #: In-flight leases this process holds now.
    leases: int = 0
    #: Dimensions the provider's rate-limit headers tightened in the shared state (the
    #: provider reported less room than the fleet counted).
    clamped: int = 0
