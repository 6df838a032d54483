"""Rate-limit awareness: what providers report of their limits, and a pacer that keeps
requests inside them.

Every response's rate-limit headers, in any of the common spellings, are parsed into one
:class:`RateLimitSnapshot` (see :func:`parse_rate_limits`). The sampler shows it on
``StreamStarted.rate_limit``, ``SamplingErrorInfo.rate_limit_snapshot`` and
``RequestMetrics.rate_limit``, and feeds it to a :class:`RateLimitPacer` per account
(base URL, key and model) that holds an attempt back, before it is sent, when the
provider's budget has no room for it:

* Each reported dimension (requests, tokens, input tokens, output tokens) is a bucket that
  refills continuously, as OpenAI and Anthropic describe theirs, at the rate the reports
  imply: the deficit (``limit - remaining``) refills by the reset time, so the rate is
  their ratio, counting a reset a second later than reported (reset times come to the
  second) and only from resets of 5 s or more, the slowest of the last few; ``limit`` per
  ``window_s`` until such a report.
* An attempt reserves its cost: one request, its prompt estimate (body length /
  ``chars_per_token``) and its output cap (``max_tokens``, else the config's
  ``default_max_output_tokens``). It waits until the bucket has the room, in the order
  the attempts asked (virtual scheduling: one computation per attempt, no polling).
* A response's snapshot lowers the bucket when the provider reports less room than the
  pacer counts (another client of the key, a provider counting more than estimated);
  an attempt's reported usage gives back what it reserved beyond it.
* A 429 holds every attempt of the account until its ``Retry-After`` (else until the
  reset of the exhausted dimension), never longer than ``max_hold`` (the config's
  ``RetryPolicy.max_retry_after``): a ``Retry-After: 3600`` or a reset date decades
  away would otherwise stall the account. Reset times teach refill rates under the same
  cap.
* No attempt waits without bound or unseen: a wait past the request's ``Timeouts.total``
  or past ``RateLimitPacing.max_wait`` fails the attempt at once (nothing sent, a
  ``RATE_LIMITED`` error that says until when), and a wait that is served is announced
  by a ``Paced`` event (why, how long, until when).
* A dimension never reported is never paced: without rate-limit headers the pacer does
  nothing at all. A cost larger than a whole limit is not held (waiting cannot make it
  fit; the provider decides).

The pacer is pure (times are passed in) and shared by every request of a sampler;
``SamplerConfig(rate_limit_pacing=None)`` turns it off.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import attrs

from .tokens import InputTokenEstimator, estimate_input_tokens
from .types import RateLimitBudget, RateLimitSnapshot
from .wire import WireRequest, parse_duration, parse_rate_limits

__all__ = [
    "PacingCost",
    "RateLimitBudget",
    "RateLimitPacer",
    "RateLimitPacing",
    "RateLimitSnapshot",
    "Reservation",
    "pacing_cost",
    "parse_duration",
    "parse_rate_limits",
]

# Where each backend's body says how many tokens the answer may take.
_MAX_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
#: Reservations remembered until a response reports on them (oldest forgotten first).
MAX_PENDING = 10_000


def _positive(name: str) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_: object, __: attrs.Attribute[float], value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"RateLimitPacing.{name} must be a number; got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"RateLimitPacing.{name} must be a positive number; got {value!r}")

    return check


def _fraction(_: object, __: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(
            f"RateLimitPacing.reserve must be a fraction in [0, 1) of each limit; got {value!r}"
        )


@attrs.frozen
class RateLimitPacing:
    """How the sampler paces attempts by the provider's rate-limit headers.

    * ``window_s``: the window the reported limits are assumed to be per until a report
      shows a deficit and its reset time (60: per minute, as OpenAI and Anthropic state
      theirs); from then on the bucket refills at the rate the reports imply.
    * ``reserve``: a fraction of each limit left unused (0.1 keeps a tenth of every
      budget free, e.g. for other clients of the same key).
    * ``chars_per_token``: the prompt estimate of an attempt, body bytes per token.
    * ``estimator``: the prompt estimate of an attempt, from its rendered request (see
      :data:`trio_sampler.tokens.InputTokenEstimator`: a local tokenizer's count, say);
      when it returns ``None`` (or is not given), body bytes / ``chars_per_token``.
    * ``max_wait`` (120 s): the longest an attempt is held; a longer wait fails it at
      once with a ``RATE_LIMITED`` error (``error_code="rate_limit_pacing"``) saying
      until when, as a wait past the request's ``Timeouts.total`` does.
    """

    window_s: float = attrs.field(default=60.0, validator=_positive("window_s"))
    reserve: float = attrs.field(default=0.0, validator=_fraction)
    chars_per_token: float = attrs.field(default=4.0, validator=_positive("chars_per_token"))
    max_wait: float = attrs.field(default=120.0, validator=_positive("max_wait"))
    estimator: InputTokenEstimator | None = attrs.field(default=None, eq=False, kw_only=True)


@attrs.frozen
class PacingCost:
    """What one attempt takes from each dimension of a rate limit."""

    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0

    def of(self, dimension: str) -> int:
        if dimension == "tokens":
            return self.input_tokens + self.output_tokens
        value: int = getattr(self, dimension)
        return value


def pacing_cost(
    wire: WireRequest,
    *,
    default_max_output_tokens: int,
    chars_per_token: float = 4.0,
    estimator: InputTokenEstimator | None = None,
) -> PacingCost:
    """The cost an attempt with this body reserves: one request, the prompt estimate
    (``estimator``'s, else body bytes / ``chars_per_token``) and the body's output cap
    (else ``default_max_output_tokens``)."""
    output = default_max_output_tokens
    for field in _MAX_OUTPUT_FIELDS:
        value = wire.data.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            output = value
            break
    estimate = None if estimator is None else estimator(wire)
    if estimate is None:
        estimate = estimate_input_tokens(wire, chars_per_token)
    return PacingCost(1, estimate, output)


@attrs.define(eq=False)
class Reservation:
    """One attempt's place in the pacer: how long it must wait before it is sent."""

    sequence: int
    cost: PacingCost
    #: Seconds from the reservation until the attempt may be sent.
    wait: float
    #: The dimension that made it wait (``"retry_after"`` for a 429's hold), if any.
    held_by: str | None = None
    #: Dimensions debited (given back by :meth:`RateLimitPacer.cancel`).
    debited: tuple[str, ...] = ()
    sent: bool = False
    settled: bool = False


#: Refill rates remembered per dimension (the slowest of them is used).
_RATES_KEPT = 8
#: Reset times shorter than this do not teach the rate: they come rounded to the second
#: (Anthropic's RFC 3339 times, ``"1s"``), too coarse for a rate. A budget near its end,
#: the one case pacing matters, has a long reset.
MIN_RATE_RESET_S = 5.0
#: How much later than reported a reset may be (times given to the second).
RESET_RESOLUTION_S = 1.0


@attrs.define
class _Bucket:
    limit: int
    level: float
    rate: float
    updated: float
    #: Refill rates the recent snapshots implied (deficit / reset time).
    rates: deque[float] = attrs.field(factory=lambda: deque(maxlen=_RATES_KEPT))

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(float(self.limit), self.level + (now - self.updated) * self.rate)
            self.updated = now

    def give_back(self, amount: float) -> None:
        self.level = min(float(self.limit), self.level + amount)


class RateLimitPacer:
    """Pacing for one account (one base URL, key and model). Pure: ``now`` is passed in
    (trio's clock in the sampler).

    The model is a bucket per reported dimension, debited by each reservation and refilled
    at the limit's rate. Responses correct it in the safe direction only: a snapshot
    lowers a bucket when even its most favourable reading (every attempt sent so far
    already counted by the provider) leaves less room than the bucket holds; that is
    someone else using the key, or a provider counting more than estimated. A bucket
    rises again by refilling, and by :meth:`settle` giving back what an attempt reserved
    beyond the usage it reported. (Responses arrive in any order, so a snapshot alone
    cannot tell how many of the attempts in flight it has counted: raising a bucket on
    its word would overshoot.)
    """

    def __init__(self, pacing: RateLimitPacing | None = None, *, max_hold: float = 60.0) -> None:
        self.pacing = pacing if pacing is not None else RateLimitPacing()
        #: The longest a 429 holds the account, and the longest reset time believed
        #: (``RetryPolicy.max_retry_after`` in the sampler).
        self.max_hold = max_hold
        self._buckets: dict[str, _Bucket] = {}
        #: Reservations whose response has not reported yet, by sequence number.
        self._pending: dict[int, Reservation] = {}
        self._sequence = 0
        self._blocked_until = -math.inf
        #: The last snapshot observed (``None`` before the first).
        self.last_snapshot: RateLimitSnapshot | None = None

    def __repr__(self) -> str:
        return f"RateLimitPacer(dimensions={sorted(self._buckets)}, pending={len(self._pending)})"

    @property
    def blocked_until(self) -> float:
        """Until when a 429 holds this account (``-inf`` when it does not)."""
        return self._blocked_until

    def delay(self, now: float, cost: PacingCost | None = None) -> float:
        """Seconds an attempt of ``cost`` (one request by default) asking now would wait;
        nothing is reserved (a router asks this to prefer a route that has room)."""
        cost = cost if cost is not None else PacingCost()
        wait = max(0.0, self._blocked_until - now)
        for dimension, bucket in self._buckets.items():
            need = cost.of(dimension)
            if need > 0 and need <= bucket.limit:
                bucket.refill(now)
                wait = max(wait, self._shortfall(bucket, need) / bucket.rate)
        return wait

    def reserve(self, cost: PacingCost, now: float) -> Reservation:
        """Take ``cost`` from every paced dimension; the reservation says how long to wait
        before sending. :meth:`cancel` gives it back if the attempt is never sent."""
        self._sequence += 1
        wait = max(0.0, self._blocked_until - now)
        held_by = "retry_after" if wait > 0 else None
        debited = []
        for dimension, bucket in self._buckets.items():
            need = cost.of(dimension)
            if need <= 0 or need > bucket.limit:
                continue
            bucket.refill(now)
            dimension_wait = self._shortfall(bucket, need) / bucket.rate
            if dimension_wait > wait:
                wait, held_by = dimension_wait, dimension
            bucket.level -= need
            debited.append(dimension)
        reservation = Reservation(self._sequence, cost, wait, held_by, tuple(debited))
        self._pending[reservation.sequence] = reservation
        if len(self._pending) > MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        return reservation

    def sent(self, reservation: Reservation) -> None:
        """The attempt went out: its cost is the provider's to count from now on."""
        reservation.sent = True

    def cancel(self, reservation: Reservation) -> None:
        """The attempt was never sent (cancelled while waiting, refused by the admission):
        give its cost back."""
        if reservation.sent or reservation.settled:
            return
        self._give_back(reservation)

    def observe(
        self, snapshot: RateLimitSnapshot | None, now: float, reservation: Reservation | None
    ) -> None:
        """A response to ``reservation``'s attempt reported ``snapshot``."""
        if reservation is not None:
            self._pending.pop(reservation.sequence, None)
        if snapshot is None:
            return
        self.last_snapshot = snapshot
        for dimension, budget in snapshot.budgets():
            self._update(dimension, budget, now)

    def settle(self, reservation: Reservation, usage: PacingCost | None) -> None:
        """The attempt ended having used ``usage`` (``None``: unknown, the reservation
        stands): the tokens reserved beyond it are given back (and any excess taken)."""
        if reservation.settled or usage is None or not reservation.sent:
            return
        reservation.settled = True
        self._pending.pop(reservation.sequence, None)
        for dimension in reservation.debited:
            bucket = self._buckets.get(dimension)
            if bucket is not None and dimension != "requests":
                bucket.give_back(reservation.cost.of(dimension) - usage.of(dimension))

    def rate_limited(
        self,
        snapshot: RateLimitSnapshot | None,
        now: float,
        reservation: Reservation | None,
        *,
        retry_after: float | None = None,
    ) -> None:
        """A 429: the provider did not count the attempt, and everything the account sends
        waits until its ``Retry-After`` (else the reset of the dimension the snapshot shows
        exhausted), at most ``max_hold`` seconds."""
        if reservation is not None and not reservation.settled:
            self._give_back(reservation)
        self.observe(snapshot, now, reservation)
        wait = retry_after
        if wait is None and snapshot is not None:
            wait = snapshot.retry_after
            if wait is None:
                exhausted = snapshot.exhausted()
                wait = exhausted[1] if exhausted is not None else None
        if wait is not None and not math.isnan(wait) and wait > 0:
            self._blocked_until = max(self._blocked_until, now + min(wait, self.max_hold))

    # -- the model -------------------------------------------------------------------

    def _give_back(self, reservation: Reservation) -> None:
        reservation.settled = True
        self._pending.pop(reservation.sequence, None)
        for dimension in reservation.debited:
            bucket = self._buckets.get(dimension)
            if bucket is not None:
                bucket.give_back(reservation.cost.of(dimension))

    def _shortfall(self, bucket: _Bucket, need: int) -> float:
        floor = self.pacing.reserve * bucket.limit
        return max(0.0, need + floor - bucket.level)

    def _update(self, dimension: str, budget: RateLimitBudget, now: float) -> None:
        bucket = self._buckets.get(dimension)
        limit = budget.limit if budget.limit is not None else (bucket.limit if bucket else None)
        if limit is None or limit <= 0 or budget.remaining is None:
            return
        rates = bucket.rates if bucket is not None else deque(maxlen=_RATES_KEPT)
        reset = budget.reset_after
        if reset is not None and reset >= MIN_RATE_RESET_S and budget.remaining < limit:
            # The deficit refills by the reset time: that is the rate. Reset times come
            # to the second (the true one may be up to a second later) and rounded, so
            # the slowest recent rate is trusted.
            rates.append((limit - budget.remaining) / (reset + RESET_RESOLUTION_S))
        if rates:
            rate = min(rates)
        elif bucket is not None:
            rate = bucket.rate
        else:
            rate = limit / self.pacing.window_s
        remaining = min(float(budget.remaining), float(limit))
        if bucket is None:
            # First report of the dimension: the attempts still unreported may all be
            # uncounted (the cautious reading); they are debited here from now on.
            pending = list(self._pending.values())
            for reservation in pending:
                reservation.debited = (*reservation.debited, dimension)
            level = remaining - sum(r.cost.of(dimension) for r in pending)
            self._buckets[dimension] = _Bucket(limit, level, rate, now, rates)
            return
        bucket.refill(now)
        bucket.limit, bucket.rate = limit, rate
        # The most favourable reading: every attempt sent is already counted; only those
        # still waiting to be sent are to come.
        unsent = sum(
            r.cost.of(dimension)
            for r in self._pending.values()
            if not r.sent and dimension in r.debited
        )
        bucket.level = min(bucket.level, remaining - unsent)
