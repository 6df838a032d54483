"""The retry policy as pure functions: one decision table, one backoff formula, one budget.

Nothing here sleeps or reads a clock: callers pass the attempt count, the time and the
random source, so every rule is a table test.

Backoff (``n`` = retries already taken, ``U`` uniform in [0, 1))::

    delay = min(max_delay, base_delay * 2**n) * (1 - jitter * U)

With the defaults (0.5 s, 30 s, 0.25): about 0.5, 1, 2, 4, 8, 16, 30, 30 ... seconds,
each shortened by up to 25 % so that clients that failed together do not retry together.
A server's ``Retry-After`` replaces the formula: on a 429 it is honoured exactly (capped
at ``max_retry_after``; a longer demand is not retried); on other statuses it is stretched
by up to ``jitter`` so a fleet does not come back in lockstep.
"""

from __future__ import annotations

import collections
import enum
import random
from collections.abc import Callable

import attrs

from .config import RetryPolicy, check_retry_budget
from .types import SamplingErrorInfo, SamplingErrorKind

__all__ = [
    "Decision",
    "RetryAction",
    "RetryBudget",
    "backoff_delay",
    "classify",
    "is_image_error",
]


class RetryAction(enum.Enum):
    """What to do after a failed attempt."""

    #: Sleep ``Decision.delay`` seconds, then try again.
    RETRY = "retry"
    #: Replace images by placeholder text and try again at once (at most once per request).
    STRIP_IMAGES = "strip_images"
    #: End the request with ``Failed``.
    FAIL = "fail"


@attrs.frozen
class Decision:
    action: RetryAction
    delay: float = 0.0
    #: Why, in words a log reader understands.
    reason: str = ""


def is_image_error(error: SamplingErrorInfo) -> bool:
    """413, or a server verdict that an image could not be processed."""
    if error.kind is SamplingErrorKind.PAYLOAD_TOO_LARGE or error.status_code == 413:
        return True
    if (error.error_code or "").lower() == "invalid_image":
        return True
    return "could not process image" in error.message.lower() and error.status_code in (
        400,
        500,
        None,
    )


def backoff_delay(retries_taken: int, policy: RetryPolicy, uniform: float) -> float:
    """The formula of the module docstring; ``uniform`` is a draw from [0, 1)."""
    exponent = min(max(retries_taken, 0), 62)
    base = min(policy.max_delay, policy.base_delay * (2.0**exponent))
    return base * (1.0 - policy.jitter * uniform)


def classify(
    error: SamplingErrorInfo,
    retries_taken: int,
    policy: RetryPolicy,
    *,
    consecutive_rate_limits: int = 0,
    images_stripped: bool = False,
    uniform: Callable[[], float] = random.random,
) -> Decision:
    """Decide what follows a failed attempt. Rules, first match wins:

    ======================================  ==================================================
    condition                               decision
    ======================================  ==================================================
    internal error (a bug of ours)          fail, never retried
    auth (401)                              fail (the bridge refreshes credentials)
    context length exceeded                 fail, never retried (the bridge compacts)
    413 / invalid image                     strip images once, then fail
    ``x-should-retry: false``               fail
    retries exhausted (``max_retries``)     fail
    429                                     retry after ``Retry-After`` (exact, capped) or the
                                            backoff; fail past ``max_consecutive_rate_limits``
                                            or for ``insufficient_quota``
    ``x-should-retry: true``                retry with backoff
    ``error.retryable`` (the one table,     retry with backoff (``Retry-After`` jittered)
    :data:`~trio_sampler.wire.errors.
    RETRYABLE`: 408, 409, 5xx but
    525/526, transport, in-stream errors,
    empty response, idle timeout,
    malformed chunk)
    anything else (400, 403, 404, 422...)   fail
    ======================================  ==================================================
    """
    kind = error.kind
    if kind is SamplingErrorKind.INTERNAL:
        return Decision(RetryAction.FAIL, reason="a bug in the sampler is never retried")
    if kind is SamplingErrorKind.AUTH:
        return Decision(RetryAction.FAIL, reason="authentication failed")
    if kind is SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED:
        return Decision(RetryAction.FAIL, reason="the context window is exceeded")
    if is_image_error(error):
        if images_stripped:
            return Decision(RetryAction.FAIL, reason="rejected again after images were stripped")
        return Decision(RetryAction.STRIP_IMAGES, reason="the server rejected the payload/image")
    if error.should_retry is False:
        return Decision(RetryAction.FAIL, reason="the server said not to retry")
    if retries_taken >= policy.max_retries:
        return Decision(RetryAction.FAIL, reason=f"gave up after {retries_taken} retries")
    if kind is SamplingErrorKind.RATE_LIMITED:
        if not error.retryable:
            return Decision(RetryAction.FAIL, reason="rate limited (not transient)")
        if consecutive_rate_limits >= policy.max_consecutive_rate_limits:
            return Decision(
                RetryAction.FAIL, reason=f"rate limited {consecutive_rate_limits} times in a row"
            )
        if error.retry_after is not None:
            if error.retry_after > policy.max_retry_after:
                return Decision(
                    RetryAction.FAIL,
                    reason=f"the server asked to wait {error.retry_after:g} s, more than the "
                    f"{policy.max_retry_after:g} s cap",
                )
            return Decision(RetryAction.RETRY, max(error.retry_after, 0.0), "rate limited")
        return Decision(
            RetryAction.RETRY, backoff_delay(retries_taken, policy, uniform()), "rate limited"
        )
    if error.should_retry is True or error.retryable:
        if error.retry_after is not None:
            wait = min(max(error.retry_after, 0.0), policy.max_retry_after)
            delay = wait * (1.0 + policy.jitter * uniform())
        else:
            delay = backoff_delay(retries_taken, policy, uniform())
        return Decision(RetryAction.RETRY, delay, f"{kind.value} is transient")
    return Decision(RetryAction.FAIL, reason=f"{kind.value} is not retryable")


class RetryBudget:
    """Retries limited to a share of recent traffic, across all of an actor's requests.

    Over a sliding window of ``window`` seconds, a retry is allowed while
    ``retries < max(min_retries, ratio * first_attempts)``. During an outage the share of
    retries stays bounded, so clients do not multiply the load on a struggling server.
    Pure: the caller passes ``now``.
    """

    def __init__(self, ratio: float, window: float = 10.0, min_retries: int = 10) -> None:
        check_retry_budget(ratio, window)
        self.ratio = ratio
        self.window = window
        self.min_retries = min_retries
        self._attempts: collections.deque[float] = collections.deque()
        self._retries: collections.deque[float] = collections.deque()

    def _trim(self, now: float) -> None:
        horizon = now - self.window
        for queue in (self._attempts, self._retries):
            while queue and queue[0] < horizon:
                queue.popleft()

    def record_request(self, now: float) -> None:
        """A first attempt was made."""
        self._trim(now)
        self._attempts.append(now)

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False when the budget is spent."""
        self._trim(now)
        allowed = max(float(self.min_retries), self.ratio * len(self._attempts))
        if len(self._retries) >= allowed:
            return False
        self._retries.append(now)
        return True
