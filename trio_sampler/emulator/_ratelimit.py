"""Server-side rate limits per API key, with the providers' headers and 429s.

Each limited dimension is a bucket that holds one window's budget and refills
continuously (the way OpenAI and Anthropic describe their limits). A request is charged
when it arrives: one request, its prompt's tokens, and its ``max_tokens`` as output (what
the providers count up front). If any bucket lacks the room, the answer is a 429 with
``retry-after`` (the time until the room is there) and nothing is charged. When the
response ends, the output charge is corrected to what was generated (Anthropic adjusts
its output-token limit this way); ``refund_unused=False`` keeps the up-front charge, as
OpenAI's token limit does.

Every answer on a limited app carries the headers: ``x-ratelimit-{limit,remaining,reset}-
{requests,tokens}`` on Chat Completions and Responses, ``anthropic-ratelimit-{requests,
input-tokens,output-tokens,tokens}-{limit,remaining,reset}`` on Messages.

Buckets are kept per key digest (never the key itself). Time is trio's clock, so tests
can run a minute under the mock clock, or scale ``window_s`` down.
"""

from __future__ import annotations

import datetime
import hashlib
import math

import attrs
import trio

__all__ = ["Charge", "RateLimitBook", "RateLimits", "Verdict"]

_DIMENSIONS = ("requests", "input_tokens", "output_tokens", "tokens")
_MAX_KEYS = 10_000


def _check(name: str, value: float | None) -> None:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"RateLimits.{name} must be a positive number or None; got {value!r}")


@attrs.frozen
class RateLimits:
    """Limits the emulator enforces per API key, per ``window_s`` seconds (60: a minute)."""

    requests_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None
    #: Input and output together (OpenAI's TPM).
    tokens_per_minute: float | None = None
    window_s: float = 60.0
    refund_unused: bool = True

    def __attrs_post_init__(self) -> None:
        for dim in _DIMENSIONS:
            _check(f"{dim}_per_minute", getattr(self, f"{dim}_per_minute"))
        _check("window_s", self.window_s)

    def limit(self, dim: str) -> float | None:
        value: float | None = getattr(self, f"{dim}_per_minute")
        return value


class _Bucket:
    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, capacity: float, window: float, now: float) -> None:
        self.capacity = capacity
        self.rate = capacity / window
        self.level = capacity
        self.updated = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def until(self, amount: float) -> float:
        """Seconds until ``amount`` is available (after :meth:`refill`)."""
        return max(0.0, (amount - self.level) / self.rate)


@attrs.define
class Charge:
    """What one admitted request was charged, to correct when it ends."""

    key: str
    output_tokens: int
    settled: bool = False


@attrs.frozen
class Verdict:
    """The answer to one request: admitted or not, the wait, and the headers to send."""

    admitted: bool
    retry_after: float
    #: The dimension that refused (``None`` when admitted).
    exhausted: str | None
    headers: list[tuple[bytes, bytes]]
    charge: Charge | None


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``"1s"``, ``"6m0s"``, ``"250ms"``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    if minutes:
        return f"{int(minutes)}m{rest:.0f}s"
    return f"{rest:.3g}s"


class RateLimitBook:
    """The buckets of every key of one emulator app."""

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._buckets: dict[str, dict[str, _Bucket]] = {}
        #: 429s answered, by exhausted dimension (tests and operators read this).
        self.refusals: dict[str, int] = {}

    def _for(self, key: str, now: float) -> dict[str, _Bucket]:
        buckets = self._buckets.get(key)
        if buckets is None:
            if len(self._buckets) >= _MAX_KEYS:
                self._buckets.pop(next(iter(self._buckets)))
            buckets = self._buckets[key] = {
                dim: _Bucket(limit, self.limits.window_s, now)
                for dim in _DIMENSIONS
                if (limit := self.limits.limit(dim)) is not None
            }
        for bucket in buckets.values():
            bucket.refill(now)
        return buckets

    @staticmethod
    def key_of(api_key: str | None) -> str:
        return hashlib.sha256((api_key or "").encode()).hexdigest()[:32]

    def admit(
        self, api_key: str | None, input_tokens: int, max_output_tokens: int, *, anthropic: bool
    ) -> Verdict:
        """Charge a request arriving now, or refuse it (charging nothing)."""
        now = trio.current_time()
        key = self.key_of(api_key)
        buckets = self._for(key, now)
        amounts = {
            "requests": 1,
            "input_tokens": input_tokens,
            "output_tokens": max_output_tokens,
            "tokens": input_tokens + max_output_tokens,
        }
        waits = {dim: b.until(amounts[dim]) for dim, b in buckets.items()}
        exhausted = max(waits, key=lambda d: waits[d]) if waits else None
        if exhausted is not None and waits[exhausted] > 0:
            self.refusals[exhausted] = self.refusals.get(exhausted, 0) + 1
            wait = waits[exhausted]
            return Verdict(False, wait, exhausted, self._headers(buckets, anthropic), None)
        for dim, bucket in buckets.items():
            bucket.level -= amounts[dim]
        charge = Charge(key, max_output_tokens)
        return Verdict(True, 0.0, None, self._headers(buckets, anthropic), charge)

    def settle(self, charge: Charge, output_tokens: int) -> None:
        """The response ended having generated ``output_tokens``: correct the charge."""
        if charge.settled:
            return
        charge.settled = True
        delta = output_tokens - charge.output_tokens
        if delta < 0 and not self.limits.refund_unused:
            return
        buckets = self._buckets.get(charge.key)
        if buckets is None:
            return
        now = trio.current_time()
        for dim in ("output_tokens", "tokens"):
            bucket = buckets.get(dim)
            if bucket is not None:
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level - delta)

    @staticmethod
    def _headers(buckets: dict[str, _Bucket], anthropic: bool) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        for dim, bucket in buckets.items():
            remaining = max(0, math.floor(bucket.level))
            reset = (bucket.capacity - bucket.level) / bucket.rate  # until full again
            if anthropic:
                name = dim.replace("_", "-")
                at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=reset)
                stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
                headers += [
                    (f"anthropic-ratelimit-{name}-limit".encode(), b"%d" % bucket.capacity),
                    (f"anthropic-ratelimit-{name}-remaining".encode(), b"%d" % remaining),
                    (f"anthropic-ratelimit-{name}-reset".encode(), stamp.encode()),
                ]
            elif dim in ("requests", "tokens"):
                headers += [
                    (f"x-ratelimit-limit-{dim}".encode(), b"%d" % bucket.capacity),
                    (f"x-ratelimit-remaining-{dim}".encode(), b"%d" % remaining),
                    (f"x-ratelimit-reset-{dim}".encode(), _duration(reset).encode()),
                ]
        return headers
