"""One retry table: one kind → retryable mapping, one status/code → kind mapping for HTTP
statuses and in-stream error codes alike, and each knob in one place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_sampler.config import RetryPolicy
from trio_sampler.retry import RetryAction, RetryBudget, classify
from trio_sampler.types import SamplingErrorInfo, SamplingErrorKind
from trio_sampler.wire.errors import (
    RETRYABLE,
    classify_http_error,
    classify_stream_error,
    error_info,
)


def test_the_table_covers_every_kind() -> None:
    assert set(RETRYABLE) == set(SamplingErrorKind)


@pytest.mark.parametrize("kind", list(SamplingErrorKind), ids=lambda k: k.value)
def test_error_info_takes_retryable_from_the_table(kind: SamplingErrorKind) -> None:
    assert error_info(kind, "x").retryable is RETRYABLE[kind]


@pytest.mark.parametrize("kind", list(SamplingErrorKind), ids=lambda k: k.value)
def test_classify_follows_the_flag_it_was_given(kind: SamplingErrorKind) -> None:
    # No second set of retryable kinds in the retry policy: the error's flag decides
    # (after the kind-specific rules that come first).
    policy = RetryPolicy()
    decision = classify(error_info(kind, "x"), 0, policy, uniform=lambda: 0.0)
    if kind in (SamplingErrorKind.PAYLOAD_TOO_LARGE,):
        assert decision.action is RetryAction.STRIP_IMAGES
    elif RETRYABLE[kind]:
        assert decision.action is RetryAction.RETRY
    else:
        assert decision.action is RetryAction.FAIL


def test_an_internal_error_is_never_retried_whatever_the_flags() -> None:
    error = SamplingErrorInfo(
        kind=SamplingErrorKind.INTERNAL, message="bug", retryable=True, should_retry=True
    )
    assert classify(error, 0, RetryPolicy()).action is RetryAction.FAIL


@given(st.integers(min_value=400, max_value=599))
def test_an_in_stream_status_code_classifies_like_the_http_status(status: int) -> None:
    http = classify_http_error(
        status, {}, b'{"error": {"code": "%d", "message": "upstream"}}' % status
    )
    stream = classify_stream_error({"error": {"code": status, "message": "upstream"}})
    assert (stream.kind, stream.retryable) == (http.kind, http.retryable)


def test_in_stream_403_is_auth_like_http_403() -> None:
    stream = classify_stream_error({"error": {"code": 403, "message": "forbidden"}})
    http = classify_http_error(403, {}, b'{"error": {"message": "forbidden"}}')
    assert stream.kind is http.kind is SamplingErrorKind.AUTH
    assert not stream.retryable and not http.retryable


def test_a_spent_quota_is_not_retryable_in_the_stream_or_over_http() -> None:
    body = {"error": {"type": "insufficient_quota", "message": "You exceeded your current quota"}}
    stream = classify_stream_error(body)
    http = classify_http_error(429, {}, b'{"error": {"type": "insufficient_quota"}}')
    assert stream.kind is http.kind is SamplingErrorKind.RATE_LIMITED
    assert not stream.retryable and not http.retryable


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5, 10.0])
def test_the_retry_budget_ratio_has_one_rule(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"fraction in \(0, 1\]") as from_policy:
        RetryPolicy(retry_budget_ratio=ratio)
    with pytest.raises(ValueError, match=r"fraction in \(0, 1\]") as from_budget:
        RetryBudget(ratio)
    assert str(from_policy.value) == str(from_budget.value)


def test_the_doom_loop_budget_lives_in_the_doom_loop_policy_only() -> None:
    assert not hasattr(RetryPolicy(), "doom_loop_retries")
