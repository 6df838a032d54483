"""The rate-limit pacer in the request path: one :class:`RateLimitPacer` per account,
asked before each attempt is sent and told what each response reported.

A wait is never silent nor unbounded: one the request's deadline or
``RateLimitPacing.max_wait`` cannot hold fails the attempt at once (nothing sent; the
error says until when), and one that is served is announced first (a :class:`Paced`
event on the request's stream)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from .._by_identity import ByIdentity
from ..config import SamplerConfig
from ..ratelimit import PacingCost, RateLimitPacer, Reservation, pacing_cost
from ..types import (
    Paced,
    RateLimitSnapshot,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    Usage,
)
from ..wire import WireRequest
from ._metrics import AttemptMetrics

__all__ = ["PacedAttempt", "Pacers"]

#: Where a waiting attempt announces its wait: the request's (or lane's) ``emit``.
Announce = Callable[[list[SamplingEvent]], Awaitable[None]]

#: Accounts whose pacers are kept (the least recently used is forgotten past this).
MAX_ACCOUNTS = 1024


@attrs.define
class PacedAttempt:
    """An attempt's place in its account's pacer, until its response reports."""

    pacer: RateLimitPacer
    reservation: Reservation

    def sending(self) -> None:
        self.pacer.sent(self.reservation)

    def withdraw(self) -> None:
        """The attempt will not be sent after all (refused by the admission, cancelled)."""
        self.pacer.cancel(self.reservation)

    def headers(self, snapshot: RateLimitSnapshot | None) -> None:
        """The response's headers are in: what they say of the limits."""
        self.pacer.observe(snapshot, trio.current_time(), self.reservation)

    def ended(self, usage: Usage | None) -> None:
        """The attempt ended having used ``usage``: tokens reserved beyond it go back."""
        if usage is not None:
            cost = PacingCost(1, usage.input_tokens, usage.output_tokens)
            self.pacer.settle(self.reservation, cost)

    def failed(self, error: SamplingErrorInfo) -> None:
        """The attempt failed with ``error`` (a 429 holds the account)."""
        snapshot = error.rate_limit_snapshot
        now = trio.current_time()
        if error.kind is SamplingErrorKind.RATE_LIMITED and error.status_code == 429:
            self.pacer.rate_limited(snapshot, now, self.reservation, retry_after=error.retry_after)
        else:
            self.pacer.observe(snapshot, now, self.reservation)


class Pacers:
    """The pacers of one sampler, one per account (base URL, backend, key and model)."""

    def __init__(self) -> None:
        self._by_account: dict[tuple[object, ...], RateLimitPacer] = {}
        #: Per config: its account's key, made once.
        self._keys: ByIdentity[tuple[object, ...]] = ByIdentity(MAX_ACCOUNTS)

    def _key(self, config: SamplerConfig) -> tuple[object, ...]:
        key = self._keys.get(config)
        if key is None:
            key = self._keys.put(
                config,
                (
                    config.base_url,
                    str(config.backend),
                    config.api_key,
                    config.model,
                    config.rate_limit_pacing,
                    config.retry.max_retry_after,
                ),
            )
        return key

    def for_config(self, config: SamplerConfig) -> RateLimitPacer | None:
        """The pacer of ``config``'s account (``None`` when pacing is off for it)."""
        pacing = config.rate_limit_pacing
        if pacing is None:
            return None
        key = self._key(config)
        pacer = self._by_account.pop(key, None)
        if pacer is None:
            pacer = RateLimitPacer(pacing, max_hold=config.retry.max_retry_after)
        self._by_account[key] = pacer  # most recently used last
        while len(self._by_account) > MAX_ACCOUNTS:
            del self._by_account[next(iter(self._by_account))]
        return pacer

    async def admit(
        self,
        config: SamplerConfig,
        wire: WireRequest,
        metrics: AttemptMetrics,
        *,
        deadline: float,
        request_id: str = "",
        announce: Announce | None = None,
    ) -> PacedAttempt | SamplingErrorInfo | None:
        """Wait until the account's budget has room for this attempt.

        Returns the attempt's place (tell it what the response reports), ``None`` when
        pacing is off, or the error to end the attempt with when the wait would pass the
        request's ``deadline`` or the pacing's ``max_wait`` (nothing was sent). A wait
        served is first announced (a :class:`Paced` event through ``announce``).
        """
        pacer = self.for_config(config)
        if pacer is None:
            return None
        pacing = pacer.pacing
        cost = pacing_cost(
            wire,
            default_max_output_tokens=config.default_max_output_tokens,
            chars_per_token=pacing.chars_per_token,
            estimator=pacing.estimator,
        )
        now = trio.current_time()
        reservation = pacer.reserve(cost, now)
        paced = PacedAttempt(pacer, reservation)
        wait = reservation.wait
        if wait <= 0:
            return paced
        if now + wait > deadline or wait > pacing.max_wait:
            paced.withdraw()
            return _too_long(pacer, reservation, past_deadline=now + wait > deadline)
        if announce is not None:
            why = _reason(reservation.held_by)
            await announce([Paced(request_id, why, wait, now + wait, metrics.route)])
        try:
            await trio.sleep_until(now + wait)
        except BaseException:
            paced.withdraw()
            raise
        metrics.paced_s += wait
        return paced


def _reason(held_by: str | None) -> str:
    if held_by == "retry_after":
        return "the provider's 429 holds the account (Retry-After)"
    return f"the provider's {held_by} budget has no room yet"


def _too_long(
    pacer: RateLimitPacer, reservation: Reservation, *, past_deadline: bool
) -> SamplingErrorInfo:
    """The error of an attempt whose wait no bound allows: why, how long, until when
    (UTC, to the second)."""
    wait = reservation.wait
    bound = "its total timeout" if past_deadline else f"max_wait ({pacer.pacing.max_wait:g} s)"
    until = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + wait))
    return SamplingErrorInfo(
        kind=SamplingErrorKind.RATE_LIMITED,
        message=(
            f"{_reason(reservation.held_by)}: this request would wait {wait:.3g} s (until "
            f"{until}), past {bound}; nothing was sent"
        ),
        retryable=False,
        retry_after=wait,
        error_code="rate_limit_pacing",
        rate_limit_snapshot=pacer.last_snapshot,
    )
