"""What a fleet limiter enforces, as validated plain data: limits, costs, failure policy."""

from __future__ import annotations

import enum
import math

import attrs

from ..tokens import InputTokenEstimator
from ..wire import WireRequest

__all__ = [
    "Cost",
    "FailurePolicy",
    "FleetLimits",
    "LeasePolicy",
    "LimiterSpec",
    "RetryBudgetSpec",
]

#: The rate dimensions, in the order the Lua scripts receive them.
DIMENSIONS = ("requests", "input_tokens", "output_tokens", "tokens")


def _rate(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"FleetLimits.{name} must be a number or None, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"FleetLimits.{name} must be a positive number or None; got {value}")


@attrs.frozen
class Cost:
    """What one admission takes from each dimension.

    ``tokens`` is the combined dimension (input + output); it is filled in from the other
    two by :meth:`with_total` so callers only say what they know.
    """

    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("requests", "input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Cost.{name} must be an int >= 0; got {value!r}")

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def amounts(self) -> tuple[int, int, int, int]:
        """The cost per dimension, in :data:`DIMENSIONS` order."""
        return (self.requests, self.input_tokens, self.output_tokens, self.tokens)


@attrs.frozen
class FleetLimits:
    """Limits shared by every process of a fleet for one route or account.

    Each rate is per ``window_s`` seconds (60: per minute, as providers state them); a
    dimension left at ``None`` is not limited. ``burst`` is the share of one window's
    budget that may be spent at once after a quiet period (1.0, the providers' own
    behaviour: a full bucket that refills continuously). ``max_in_flight`` bounds the
    requests running at once across the fleet.

    Tests and demos scale ``window_s`` down (say to 2 s) to watch a minute's behaviour
    quickly; the algorithm is the same.
    """

    requests_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None
    #: Input and output together (OpenAI's TPM); may be combined with the other two.
    tokens_per_minute: float | None = None
    max_in_flight: int | None = None
    window_s: float = 60.0
    burst: float = 1.0

    def __attrs_post_init__(self) -> None:
        for name in self._rate_fields():
            _rate(name, getattr(self, name))
        if self.max_in_flight is not None and (
            isinstance(self.max_in_flight, bool)
            or not isinstance(self.max_in_flight, int)
            or self.max_in_flight < 1
        ):
            raise ValueError(
                f"FleetLimits.max_in_flight must be an int >= 1 or None; got {self.max_in_flight!r}"
            )
        if not isinstance(self.window_s, int | float) or not (
            math.isfinite(self.window_s) and self.window_s > 0
        ):
            raise ValueError(
                f"FleetLimits.window_s must be a positive number of seconds; got {self.window_s!r}"
            )
        if not isinstance(self.burst, int | float) or not 0 < self.burst <= 1:
            raise ValueError(
                f"FleetLimits.burst is a share of one window's budget in (0, 1]; got {self.burst}"
            )
        if all(getattr(self, n) is None for n in self._rate_fields()) and not self.max_in_flight:
            raise ValueError(
                "FleetLimits limits nothing: set at least one of requests_per_minute, "
                "input_tokens_per_minute, output_tokens_per_minute, tokens_per_minute, "
                "max_in_flight"
            )

    @staticmethod
    def _rate_fields() -> tuple[str, ...]:
        return tuple(f"{d}_per_minute" for d in DIMENSIONS)

    def rates(self) -> tuple[float | None, ...]:
        """The rate per window per dimension, in :data:`DIMENSIONS` order."""
        return tuple(getattr(self, name) for name in self._rate_fields())

    def scaled(self, share: float) -> FleetLimits:
        """The same limits times ``share`` (a process's part of the fleet's limits)."""

        def part(value: float | None) -> float | None:
            return None if value is None else value * share

        in_flight = self.max_in_flight
        return attrs.evolve(
            self,
            requests_per_minute=part(self.requests_per_minute),
            input_tokens_per_minute=part(self.input_tokens_per_minute),
            output_tokens_per_minute=part(self.output_tokens_per_minute),
            tokens_per_minute=part(self.tokens_per_minute),
            max_in_flight=None if in_flight is None else max(1, math.floor(in_flight * share)),
        )


class FailurePolicy(enum.Enum):
    """What a limiter does when Redis is unreachable or slower than the admission timeout.

    Never silent: entering and leaving the degraded state are events and metrics.
    """

    #: Admit, under each process's own local limits (``fallback_share`` of the shared ones).
    FAIL_OPEN = "fail_open"
    #: Refuse: the request ends with ``Failed`` of kind ``FLEET_UNAVAILABLE``.
    FAIL_CLOSED = "fail_closed"


@attrs.frozen
class RetryBudgetSpec:
    """A fleet-wide retry budget (a token bucket, as gRPC's retry throttling).

    Every first attempt anywhere in the fleet deposits ``ratio`` tokens (the bucket holds
    at most ``max_tokens``, and starts full); every retry takes one token, and a retry is
    refused when less than one is left. So over any interval, fleet-wide::

        retries <= max_tokens + ratio * first_attempts
    """

    ratio: float = 0.2
    max_tokens: float = 10.0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.ratio, int | float) or not 0 < self.ratio <= 1:
            raise ValueError(
                f"RetryBudgetSpec.ratio is the share of retries in (0, 1]; got {self.ratio}"
            )
        if not isinstance(self.max_tokens, int | float) or not (
            math.isfinite(self.max_tokens) and self.max_tokens >= 1
        ):
            raise ValueError(f"RetryBudgetSpec.max_tokens must be >= 1; got {self.max_tokens}")


@attrs.frozen
class LeasePolicy:
    """Leases: a process takes a batch of each limit from Redis and spends it locally.

    A lease is charged to the shared state when it is taken, so the fleet's limits hold
    exactly; the process then admits from it without a round trip, and gives back what it
    did not use ``hold`` seconds after its last refill (or when it closes).

    * ``horizon``: a batch is what this process spent in the last ``horizon`` seconds
      (its rate, smoothed, times ``horizon``), at least one request's cost.
    * ``hold``: unused units go back this long after the last refill (the most a unit
      waits idle in one process; also the most a unit is spent after it was charged).
    * ``share``: one batch takes at most this share of the room left in the fleet's
      bucket (at least what the request at hand needs), so near the end of a window the
      last units are not held by one process.
    * ``max_requests``: the most requests one batch holds.
    * ``max_slots``: the most idle in-flight slots one process keeps; a process never
      holds more slots than it has requests running or waiting.
    """

    horizon: float = 0.05
    hold: float = 0.25
    share: float = 0.25
    max_requests: int = 1000
    max_slots: int = 64

    def __attrs_post_init__(self) -> None:
        for name in ("horizon", "hold"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"LeasePolicy.{name} must be a positive number; got {value!r}")
        if not isinstance(self.share, int | float) or not 0 < self.share <= 1:
            raise ValueError(f"LeasePolicy.share is a share in (0, 1]; got {self.share!r}")
        for name in ("max_requests", "max_slots"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LeasePolicy.{name} must be an int >= 1; got {value!r}")


def _policy(value: FailurePolicy | str) -> FailurePolicy:
    try:
        return FailurePolicy(value)
    except ValueError:
        raise ValueError(
            f"on_failure must be FailurePolicy.FAIL_OPEN or FailurePolicy.FAIL_CLOSED "
            f"(or 'fail_open' / 'fail_closed'); got {value!r}"
        ) from None


@attrs.frozen
class LimiterSpec:
    """One shared limiter: its name (the route or account), limits and failure policy.

    * ``name``: identifies the shared state in Redis, e.g. ``"openai:org-abc"``. Every
      process that uses the same name (and Redis) shares the limits.
    * ``on_failure``: required, so the behaviour during a Redis outage is a decision.
    * ``fallback_share``: with ``FAIL_OPEN``, the share of ``limits`` one process may use on
      its own while Redis is out (``1/8`` for 8 processes keeps the fleet within its
      limits). Required with ``FAIL_OPEN``: a silent ``1.0`` is what multiplies the load by
      the number of processes.
    * ``admission_timeout``: one Redis round trip may take this long (seconds) before the
      failure policy applies.
    * ``lease_ttl``: an in-flight slot of a process that died is freed after this long;
      live processes renew theirs every third of it.
    * ``retry_budget``: a fleet-wide retry budget, or ``None``.
    * ``retry_after_jitter``: after a shared ``Retry-After`` window, each process waits up
      to this share of the window longer, at random, so the fleet does not return at once.
    * ``chars_per_token``: the prompt estimate at admission is the request body's length
      divided by this (over-estimates are corrected when the usage is known).
    * ``leases``: a :class:`LeasePolicy` to admit from batches held locally (one round
      trip per batch, not per request; the default, ``LeasePolicy()``), or ``None``: one
      round trip per admission and one per settlement. Leases keep the fleet's limits
      exact (a batch is charged when taken); what a process sees later is the shared
      state's news (a header clamp, a Retry-After heard elsewhere, the usage above a
      reservation), which reaches Redis with its next refill or give-back, at most
      ``LeasePolicy.hold`` later.
    * ``estimator``: the prompt estimate at admission from the rendered request (see
      :data:`trio_sampler.tokens.InputTokenEstimator`), used when it returns a number;
      else the body's length over ``chars_per_token``. Every process of the fleet
      should estimate alike.
    * ``refund_unused``: give back what a request reserved and did not use (True, as
      Anthropic does for output tokens). Set False for a provider that charges
      ``max_tokens`` up front and keeps it; usage above the reservation is charged either way.
    """

    name: str
    limits: FleetLimits
    on_failure: FailurePolicy = attrs.field(converter=_policy)
    fallback_share: float | None = None
    admission_timeout: float = 0.25
    lease_ttl: float = 30.0
    retry_budget: RetryBudgetSpec | None = None
    retry_after_jitter: float = 0.25
    chars_per_token: float = 4.0
    refund_unused: bool = True
    #: While degraded, Redis is tried again at most this often (seconds).
    probe_interval: float = 1.0
    leases: LeasePolicy | None = attrs.field(factory=LeasePolicy)
    estimator: InputTokenEstimator | None = attrs.field(default=None, eq=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "{}"):
            raise ValueError(
                f"LimiterSpec.name must be a non-empty string without braces, such as "
                f"'openai:org-abc'; got {self.name!r}"
            )
        if not isinstance(self.limits, FleetLimits):
            raise TypeError("LimiterSpec.limits must be a FleetLimits")
        if self.on_failure is FailurePolicy.FAIL_OPEN:
            share = self.fallback_share
            if share is None:
                raise ValueError(
                    "on_failure=FAIL_OPEN needs fallback_share=: the share of the limits one "
                    "process may use alone while Redis is unreachable, e.g. "
                    "fallback_share=1/8 for 8 processes"
                )
            if not isinstance(share, int | float) or not 0 < share <= 1:
                raise ValueError(f"fallback_share must be in (0, 1]; got {share}")
        for name in ("admission_timeout", "lease_ttl", "probe_interval", "chars_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"LimiterSpec.{name} must be a positive number; got {value!r}")
        if self.leases is not None and not isinstance(self.leases, LeasePolicy):
            raise TypeError("LimiterSpec.leases must be a LeasePolicy or None")
        if not 0 <= self.retry_after_jitter <= 1:
            jitter = self.retry_after_jitter
            raise ValueError(f"LimiterSpec.retry_after_jitter is a share in [0, 1]; got {jitter}")

    def estimate_input_tokens(self, body: bytes, wire: WireRequest | None = None) -> int:
        """The prompt's size at admission: the ``estimator``'s count of ``wire`` where it
        gives one, else the body's length over ``chars_per_token``."""
        if self.estimator is not None and wire is not None:
            counted = self.estimator(wire)
            if counted is not None:
                return counted
        return math.ceil(len(body) / self.chars_per_token)
