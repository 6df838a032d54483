"""The reference client's retry rules as ``benchmarks/fault_scenarios.py`` models them:
each documented rule gives the attempt count it should (pure arithmetic, no I/O)."""

from __future__ import annotations

import math

import pytest

from benchmarks.fault_scenarios import (
    REFERENCE_429_THRESHOLD,
    REFERENCE_MAX_RETRIES,
    Answer,
    reference_attempts,
)


def _always(answer: Answer) -> tuple[int, bool, float]:
    return reference_attempts(lambda _n, _t: answer)


def test_a_retryable_failure_takes_max_retries_attempts_with_the_documented_backoff() -> None:
    attempts, answered, ended = _always(Answer("5xx"))
    assert (attempts, answered) == (REFERENCE_MAX_RETRIES, False)
    assert ended == 2 + 4 + 8 + 16  # 2 s doubling, between the five attempts


def test_a_429_is_retried_once_after_its_retry_after_exactly() -> None:
    attempts, answered, ended = _always(Answer("429", retry_after=20.0))
    assert (attempts, answered, ended) == (REFERENCE_429_THRESHOLD, False, 20.0)
    attempts, answered, ended = reference_attempts(
        lambda n, _t: Answer("429", retry_after=1.0) if n == 0 else Answer("ok")
    )
    assert (attempts, answered, ended) == (2, True, 1.0)


@pytest.mark.parametrize("kind", ["auth", "context", "malformed", "filtered"])
def test_fatal_failures_are_not_retried(kind: str) -> None:
    assert _always(Answer(kind))[:2] == (1, False)


def test_no_headers_waits_without_end_and_a_stall_ends_at_the_idle_timeout() -> None:
    assert _always(Answer("silent")) == (1, False, math.inf)
    assert _always(Answer("stall")) == (1, False, 300.0)
    assert _always(Answer("slow", delay=20.0)) == (1, True, 20.0)


def test_a_primary_that_recovers_mid_backoff_answers_the_next_attempt() -> None:
    def primary(_n: int, t: float) -> Answer:
        return Answer("5xx" if t < 5.0 else "ok")

    # Attempts at 0, 2 and 6 s: the third is answered.
    assert reference_attempts(primary) == (3, True, 6.0)
