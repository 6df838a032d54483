"""What a provider's rate-limit headers said, as one typed, immutable value.

Every provider spells its limits differently (OpenAI ``x-ratelimit-*-requests`` with
durations such as ``6m0s``, Anthropic ``anthropic-ratelimit-*`` with RFC 3339 reset
times, the IETF ``RateLimit`` fields, gateways' bare ``x-ratelimit-limit``); a
:class:`RateLimitSnapshot` is the same facts in one shape: per dimension, the limit, what
remains and how long until it is whole again, plus the server's ``Retry-After``. The
parser is :func:`trio_sampler.wire.parse_rate_limits`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs

__all__ = ["RATE_LIMIT_DIMENSIONS", "RateLimitBudget", "RateLimitSnapshot"]

#: The dimensions a snapshot can carry, in the order they are reported.
RATE_LIMIT_DIMENSIONS = ("requests", "tokens", "input_tokens", "output_tokens")


@attrs.frozen
class RateLimitBudget:
    """One dimension of a rate limit (requests, or tokens of some kind).

    Each field is ``None`` when the server did not say (or said something unparseable).
    """

    #: The budget per window.
    limit: int | None = None
    #: What is left of it now.
    remaining: int | None = None
    #: Seconds, from when the headers were received, until the budget is whole again
    #: (OpenAI: the duration; Anthropic: the reset time minus the response's ``Date``).
    reset_after: float | None = None

    @property
    def used_fraction(self) -> float | None:
        """``1 - remaining / limit`` (``None`` without both)."""
        if self.limit is None or self.remaining is None or self.limit <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.remaining / self.limit))


@attrs.frozen
class RateLimitSnapshot:
    """The rate-limit state one response reported. Plain numbers: never a secret.

    A dimension the response did not mention is ``None``. ``retry_after`` is the server's
    ``retry-after-ms`` / ``retry-after`` in seconds (a 429 usually carries it).
    """

    requests: RateLimitBudget | None = None
    #: Input and output tokens together (OpenAI's TPM, Anthropic's ``tokens``).
    tokens: RateLimitBudget | None = None
    input_tokens: RateLimitBudget | None = None
    output_tokens: RateLimitBudget | None = None
    retry_after: float | None = None

    def budgets(self) -> Iterator[tuple[str, RateLimitBudget]]:
        """``(dimension, budget)`` for each dimension reported, in a fixed order."""
        for name in RATE_LIMIT_DIMENSIONS:
            budget: RateLimitBudget | None = getattr(self, name)
            if budget is not None:
                yield name, budget

    @property
    def empty(self) -> bool:
        """Nothing usable was reported."""
        return self.retry_after is None and next(self.budgets(), None) is None

    def exhausted(self, *, reserve: float = 0.0) -> tuple[str, float] | None:
        """The dimension whose remaining budget is at or below ``reserve`` (a fraction of
        its limit, or an absolute count when ``reserve >= 1``), with the seconds until it
        resets; the longest wait when several are; ``None`` when none is.

        A budget without a reset time counts as exhausted for 0 s (nothing to wait for).
        """
        found: tuple[str, float] | None = None
        for name, budget in self.budgets():
            if budget.remaining is None:
                continue
            floor = reserve if reserve >= 1 or budget.limit is None else reserve * budget.limit
            if budget.remaining > math.floor(floor) and budget.remaining > 0:
                continue
            wait = budget.reset_after or 0.0
            if found is None or wait > found[1]:
                found = (name, wait)
        return found
