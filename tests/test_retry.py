"""The retry decision table, the backoff formula and the retry budget (pure)."""

from __future__ import annotations

import pytest

from trio_sampler.config import RetryPolicy
from trio_sampler.retry import Decision, RetryAction, RetryBudget, backoff_delay, classify
from trio_sampler.types import SamplingErrorInfo, SamplingErrorKind

K = SamplingErrorKind
RETRY, STRIP, FAIL = RetryAction.RETRY, RetryAction.STRIP_IMAGES, RetryAction.FAIL
POLICY = RetryPolicy(max_retries=4, base_delay=0.5, max_delay=30.0, jitter=0.25)


def err(kind: SamplingErrorKind, status: int | None = None, **kw: object) -> SamplingErrorInfo:
    retryable = kw.pop("retryable", True)
    assert isinstance(retryable, bool)
    return SamplingErrorInfo(kind=kind, message="m", status_code=status, retryable=retryable, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "retries", "expected"),
    [
        pytest.param(err(K.AUTH, 401, retryable=False), 0, FAIL, id="401"),
        pytest.param(err(K.AUTH, 403, retryable=False), 0, FAIL, id="403"),
        pytest.param(err(K.CONTEXT_LENGTH_EXCEEDED, 400, retryable=False), 0, FAIL, id="context"),
        pytest.param(err(K.PAYLOAD_TOO_LARGE, 413, retryable=False), 0, STRIP, id="413"),
        pytest.param(
            err(K.INVALID_REQUEST, 400, retryable=False, error_code="invalid_image"),
            0,
            STRIP,
            id="invalid-image",
        ),
        pytest.param(
            err(
                K.INVALID_REQUEST,
                400,
                retryable=False,
                error_code="invalid_image",
                should_retry=False,
            ),
            0,
            STRIP,
            id="invalid-image-ignores-should-retry-false",
        ),
        pytest.param(err(K.OVERLOADED, 503, should_retry=False), 0, FAIL, id="should-retry-false"),
        pytest.param(
            err(K.INVALID_REQUEST, 400, retryable=False, should_retry=True),
            0,
            RETRY,
            id="should-retry-true",
        ),
        pytest.param(err(K.RATE_LIMITED, 429), 0, RETRY, id="429"),
        pytest.param(err(K.RATE_LIMITED, 429, retryable=False), 0, FAIL, id="429-quota"),
        pytest.param(err(K.HTTP, 408), 0, RETRY, id="408"),
        pytest.param(err(K.HTTP, 409), 0, RETRY, id="409"),
        pytest.param(err(K.API, 500), 0, RETRY, id="500"),
        pytest.param(err(K.OVERLOADED, 529), 0, RETRY, id="529"),
        pytest.param(err(K.HTTP, 525, retryable=False), 0, FAIL, id="525"),
        pytest.param(err(K.TRANSPORT), 0, RETRY, id="transport"),
        pytest.param(err(K.API), 0, RETRY, id="in-stream-error"),
        pytest.param(err(K.EMPTY_RESPONSE), 0, RETRY, id="empty"),
        pytest.param(err(K.IDLE_TIMEOUT), 0, RETRY, id="idle"),
        pytest.param(err(K.IDLE_TIMEOUT, retryable=False), 0, FAIL, id="total-timeout"),
        pytest.param(err(K.SERIALIZATION), 0, RETRY, id="malformed-chunk"),
        pytest.param(err(K.INVALID_REQUEST, 400, retryable=False), 0, FAIL, id="400"),
        pytest.param(err(K.INVALID_REQUEST, 404, retryable=False), 0, FAIL, id="404"),
        pytest.param(err(K.INVALID_REQUEST, 422, retryable=False), 0, FAIL, id="422"),
        pytest.param(err(K.CONTENT_FILTER, retryable=False), 0, FAIL, id="content-filter"),
        pytest.param(err(K.MAX_TOKENS_TRUNCATION, retryable=False), 0, FAIL, id="truncation"),
        pytest.param(err(K.API, 500), 4, FAIL, id="exhausted"),
        pytest.param(err(K.API, 500), 3, RETRY, id="last-retry"),
    ],
)
def test_decision_table(error: SamplingErrorInfo, retries: int, expected: RetryAction) -> None:
    assert classify(error, retries, POLICY, uniform=lambda: 0.5).action is expected


def test_image_strip_happens_once() -> None:
    error = err(K.PAYLOAD_TOO_LARGE, 413, retryable=False)
    assert classify(error, 0, POLICY, images_stripped=True).action is FAIL


def test_rate_limit_retry_after_is_exact_and_capped() -> None:
    limited = err(K.RATE_LIMITED, 429, retry_after=7.0)
    assert classify(limited, 0, POLICY, uniform=lambda: 0.9) == Decision(RETRY, 7.0, "rate limited")
    too_long = err(K.RATE_LIMITED, 429, retry_after=600.0)
    decision = classify(too_long, 0, POLICY)
    assert decision.action is FAIL and "600 s" in decision.reason


def test_consecutive_rate_limits_cap() -> None:
    limited = err(K.RATE_LIMITED, 429)
    assert classify(limited, 1, POLICY, consecutive_rate_limits=2).action is RETRY
    assert classify(limited, 1, POLICY, consecutive_rate_limits=3).action is FAIL


def test_retry_after_on_5xx_is_jittered_upwards() -> None:
    error = err(K.OVERLOADED, 503, retry_after=10.0)
    assert classify(error, 0, POLICY, uniform=lambda: 0.0).delay == 10.0
    assert classify(error, 0, POLICY, uniform=lambda: 1.0).delay == pytest.approx(12.5)


@pytest.mark.parametrize(
    ("retries", "uniform", "expected"),
    [
        (0, 0.0, 0.5),
        (1, 0.0, 1.0),
        (3, 0.0, 4.0),
        (6, 0.0, 30.0),
        (100, 0.0, 30.0),
        (0, 1.0, 0.375),
        (6, 1.0, 22.5),
    ],
)
def test_backoff_formula(retries: int, uniform: float, expected: float) -> None:
    assert backoff_delay(retries, POLICY, uniform) == pytest.approx(expected)


def test_retry_budget_limits_share_of_traffic() -> None:
    budget = RetryBudget(ratio=0.2, window=10.0, min_retries=2)
    for _ in range(20):
        budget.record_request(0.0)
    allowed = sum(budget.try_spend(1.0) for _ in range(10))
    assert allowed == 4  # 20 % of 20 first attempts
    # Outside the window everything is forgotten: the floor applies again.
    assert budget.try_spend(20.0) and budget.try_spend(20.0) and not budget.try_spend(20.0)


def test_retry_budget_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=0.0)
    with pytest.raises(ValueError, match="window"):
        RetryBudget(ratio=0.1, window=0)
