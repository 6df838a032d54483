"""The plan after a failed attempt (``trio_sampler.actor._plan``), without an event loop.

``decide`` is pure: these tests call it directly, over generated histories, errors and
policies, and check each rule of ``RULES`` in the order it is documented.
"""

from __future__ import annotations

import random

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_sampler.actor._plan import (
    RULES,
    Facts,
    FailOver,
    Finish,
    History,
    Policies,
    Resample,
    Resume,
    ResumePoint,
    Retry,
    Step,
    StripImages,
    decide,
    not_processed,
)
from trio_sampler.config import RetryPolicy
from trio_sampler.routing import RouteAction, route_action
from trio_sampler.types import SamplingErrorInfo, SamplingErrorKind

_CODES = (None, "total_timeout", "insufficient_quota", "invalid_image", "doom_loop", "not_sent")

errors = st.builds(
    SamplingErrorInfo,
    kind=st.sampled_from(list(SamplingErrorKind)),
    message=st.just("it failed"),
    status_code=st.sampled_from([None, 400, 413, 429, 500, 503, 529]),
    retryable=st.booleans(),
    retry_after=st.one_of(st.none(), st.floats(0.0, 120.0)),
    should_retry=st.sampled_from([None, True, False]),
    error_code=st.sampled_from(_CODES),
)
histories = st.builds(
    History,
    retries=st.integers(0, 6),
    resamples=st.integers(0, 3),
    consecutive_rate_limits=st.integers(0, 4),
    images_stripped=st.booleans(),
    continuing=st.booleans(),
    resumes=st.integers(0, 6),
)
policies = st.builds(
    Policies,
    retry=st.builds(
        RetryPolicy,
        max_retries=st.integers(0, 5),
        retry_mid_stream=st.booleans(),
        max_consecutive_rate_limits=st.integers(1, 4),
    ),
    max_resamples=st.integers(0, 3),
    max_retry_wait_s=st.one_of(st.none(), st.floats(0.0, 10.0)),
)
facts = st.builds(
    Facts,
    error=errors,
    partial=st.none(),
    emitted=st.booleans(),
    armed=st.booleans(),
    doom_triggers=st.sampled_from([(), ("repetition:12",)]),
    started=st.integers(1, 10),
    context_window=st.sampled_from([None, 8_000, 128_000]),
    has_next=st.booleans(),
    replay_safe=st.booleans(),
)
#: Facts of any attempt, a resumable cut or a refused resume among them.
any_facts = st.builds(
    attrs.evolve,
    facts,
    resume_point=st.one_of(
        st.none(),
        st.builds(ResumePoint, st.just("resp_1"), st.integers(0, 99), st.booleans(), errors),
    ),
    resume_refused=st.booleans(),
)


def _decide(
    f: Facts, h: History, p: Policies, *, seed: int = 0, circuit_open: bool = False
) -> Step:
    return decide(f, h, p, uniform=random.Random(seed).random, circuit_open=lambda: circuit_open)


def test_the_rules_are_tried_in_the_documented_order() -> None:
    assert [rule.name for rule in RULES] == [
        "resume",
        "resume refused",
        "continuation refused",
        "doom resample",
        "mid-stream",
        "replay safety",
        "image strip",
        "routing table",
        "fail",
        "retry",
    ]
    assert all(rule.why for rule in RULES)


@settings(max_examples=400)
@given(any_facts, histories, policies, st.integers(0, 2**32), st.booleans())
def test_decide_is_a_function_of_its_inputs(
    f: Facts, h: History, p: Policies, seed: int, circuit_open: bool
) -> None:
    first = _decide(f, h, p, seed=seed, circuit_open=circuit_open)
    again = _decide(f, h, p, seed=seed, circuit_open=circuit_open)
    assert first == again


_RULES_OF: dict[type, set[str]] = {
    Retry: {"resume refused", "continuation refused", "retry"},
    Resume: {"resume"},
    Resample: {"doom resample"},
    StripImages: {"image strip"},
    FailOver: {"routing table"},
    Finish: {"mid-stream", "replay safety", "fail"},
}


@settings(max_examples=400)
@given(any_facts, histories, policies, st.booleans())
def test_every_step_names_the_one_rule_that_made_it(
    f: Facts, h: History, p: Policies, circuit_open: bool
) -> None:
    step = _decide(f, h, p, circuit_open=circuit_open)
    assert step.rule in _RULES_OF[type(step)]
    assert step.rule in {rule.name for rule in RULES}


@settings(max_examples=400)
@given(any_facts, histories, policies)
def test_every_next_attempt_starts_over_rather_than_continuing(
    f: Facts, h: History, p: Policies
) -> None:
    step = _decide(f, h, p)
    if isinstance(step, Retry | Resume | Resample | StripImages):
        assert not step.history.continuing


@given(facts, histories, policies)
def test_a_refused_continuation_restarts_at_once_uncharged(
    f: Facts, h: History, p: Policies
) -> None:
    invalid = attrs.evolve(f.error, kind=SamplingErrorKind.INVALID_REQUEST)
    f = attrs.evolve(f, error=invalid, replay_safe=True)
    step = _decide(f, attrs.evolve(h, continuing=True), p)
    assert step == Retry(
        0.0,
        True,
        f.started,
        p.retry.max_retries,
        attrs.evolve(h, continuing=False),
        charged=False,
        rule="continuation refused",
    )


@given(facts, histories, policies, st.integers(0, 2**32))
def test_a_doom_loop_on_an_armed_attempt_resamples(
    f: Facts, h: History, p: Policies, seed: int
) -> None:
    doom = attrs.evolve(f.error, kind=SamplingErrorKind.DOOM_LOOP_DETECTED)
    f = attrs.evolve(f, error=doom, armed=True, replay_safe=True)
    step = _decide(f, h, p, seed=seed)
    assert isinstance(step, Resample)
    assert step.attempt == h.resamples + 1
    assert step.max_retries == p.max_resamples
    assert 0.0 <= step.delay < 0.25
    assert step.delay == 0.25 * random.Random(seed).random()
    assert step.triggers == f.doom_triggers
    assert step.discard == (f.emitted or h.continuing)


@given(facts, histories, policies)
def test_output_already_seen_ends_the_request_without_mid_stream_retries(
    f: Facts, h: History, p: Policies
) -> None:
    p = attrs.evolve(p, retry=attrs.evolve(p.retry, retry_mid_stream=False))
    f = attrs.evolve(f, emitted=True, armed=False)
    if h.continuing and f.error.kind is SamplingErrorKind.INVALID_REQUEST:
        return  # the continuation rule comes first
    assert _decide(f, h, p) == Finish(f.error, rule="mid-stream")


@settings(max_examples=400)
@given(facts, histories, policies)
def test_without_routing_there_is_never_a_fail_over(f: Facts, h: History, p: Policies) -> None:
    step = _decide(f, h, attrs.evolve(p, max_retry_wait_s=None))
    assert not isinstance(step, FailOver)


@settings(max_examples=400)
@given(facts, histories, policies, st.booleans())
def test_a_fail_over_follows_the_routing_table(
    f: Facts, h: History, p: Policies, circuit_open: bool
) -> None:
    step = _decide(f, h, p, circuit_open=circuit_open)
    if not isinstance(step, FailOver):
        return
    action = route_action(f.error)
    assert p.max_retry_wait_s is not None
    assert step.action is action
    assert action is not RouteAction.SURFACE
    if action is RouteAction.LARGER_WINDOW:
        assert step.min_window == (f.context_window or 0)
    else:
        assert f.has_next  # the last route's retry policy decides alone


@given(facts, histories, policies)
def test_an_open_circuit_sends_a_retryable_failure_on(f: Facts, h: History, p: Policies) -> None:
    f = attrs.evolve(
        f,
        error=SamplingErrorInfo(SamplingErrorKind.OVERLOADED, "busy", 529, retryable=True),
        emitted=False,
        armed=False,
        has_next=True,
    )
    h = attrs.evolve(h, continuing=False, retries=0, consecutive_rate_limits=0)
    p = attrs.evolve(p, max_retry_wait_s=60.0, retry=attrs.evolve(p.retry, max_retries=3))
    assert isinstance(_decide(f, h, p, circuit_open=True), FailOver)
    assert isinstance(_decide(f, h, p, circuit_open=False), Retry)


@settings(max_examples=400)
@given(facts, histories, policies)
def test_a_retry_counts_and_stays_within_the_policy(f: Facts, h: History, p: Policies) -> None:
    step = _decide(f, h, p)
    if isinstance(step, Retry) and step.charged:
        assert step.attempt == h.retries + 1 <= p.retry.max_retries
        assert step.history.retries == h.retries + 1
        rate_limited = f.error.kind is SamplingErrorKind.RATE_LIMITED
        expected = h.consecutive_rate_limits + 1 if rate_limited else 0
        assert step.history.consecutive_rate_limits == expected
    if isinstance(step, StripImages):
        assert not h.images_stripped
        assert step.history.images_stripped
        assert step.history.retries == h.retries + 1


@settings(max_examples=200)
@given(st.lists(errors, min_size=1, max_size=12), policies, st.integers(0, 2**32))
def test_a_route_runs_out_of_retries(
    failures: list[SamplingErrorInfo], p: Policies, seed: int
) -> None:
    """Walking a route's failures, the retries granted never pass ``max_retries`` plus
    the one image strip, and a resample is granted only while armed."""
    history = History()
    rng = random.Random(seed)
    granted = 0
    for number, error in enumerate(failures, start=1):
        armed = history.resamples < p.max_resamples
        f = Facts(error, None, False, armed, (), number, None, True)
        step = decide(f, history, p, uniform=rng.random)
        if isinstance(step, Resample):
            assert armed
        elif isinstance(step, Retry | StripImages):
            granted += 1
        else:
            return
        history = step.history
    assert granted <= p.retry.max_retries + 1


@given(any_facts, histories, policies)
def test_a_resumable_cut_resumes_within_max_retries_whatever_else_holds(
    f: Facts, h: History, p: Policies
) -> None:
    step = _decide(f, h, p)
    if f.resume_point is not None and h.resumes < p.retry.max_retries:
        assert step == Resume(
            f.resume_point,
            h.resumes + 1,
            p.retry.max_retries,
            attrs.evolve(h, resumes=h.resumes + 1, continuing=False),
            rule="resume",
        )
    else:
        assert not isinstance(step, Resume)


@given(any_facts, histories, policies)
def test_a_refused_resume_starts_over_visibly_and_uncharged(
    f: Facts, h: History, p: Policies
) -> None:
    step = _decide(f, h, p)
    if f.resume_refused and (f.resume_point is None or h.resumes >= p.retry.max_retries):
        assert isinstance(step, Retry)
        assert step.rule == "resume refused"
        assert (step.delay, step.charged) == (0.0, False)
        assert step.discard == (f.emitted or h.continuing)


@settings(max_examples=600)
@given(facts, histories, policies, st.booleans())
def test_a_request_that_is_not_replay_safe_is_sent_again_only_when_never_processed(
    f: Facts, h: History, p: Policies, circuit_open: bool
) -> None:
    """A stored or chained request is retried, resampled, stripped of its images or
    failed over only after a failure that proves the server did not process it."""
    step = _decide(attrs.evolve(f, replay_safe=False), h, p, circuit_open=circuit_open)
    if isinstance(step, Retry | Resample | StripImages | FailOver):
        assert not_processed(f.error)


_DROPPED = SamplingErrorInfo(
    SamplingErrorKind.TRANSPORT, "the connection failed while reading", retryable=True
)
_PROOFS = {
    "no connection": attrs.evolve(_DROPPED, error_code="not_sent"),
    "a 429": SamplingErrorInfo(
        SamplingErrorKind.RATE_LIMITED, "slow down", status_code=429, retryable=True
    ),
    "a 529": SamplingErrorInfo(
        SamplingErrorKind.OVERLOADED, "overloaded", status_code=529, retryable=True
    ),
}


def test_a_stored_request_the_server_may_have_processed_ends_saying_why() -> None:
    f = Facts(_DROPPED, started=1, replay_safe=False)
    step = _decide(f, History(), Policies(RetryPolicy()))
    assert isinstance(step, Finish) and step.rule == "replay safety"
    assert "not retried" in step.error.message and "store" in step.error.message
    assert not step.error.retryable
    # The same failure of a stateless request is retried.
    assert isinstance(
        _decide(attrs.evolve(f, replay_safe=True), History(), Policies(RetryPolicy())), Retry
    )


def test_a_stored_request_is_retried_after_a_failure_proving_it_was_never_processed() -> None:
    for error in _PROOFS.values():
        step = _decide(
            Facts(error, started=1, replay_safe=False), History(), Policies(RetryPolicy())
        )
        assert isinstance(step, Retry), error


def test_the_not_sent_code_is_the_one_the_http_layer_gives() -> None:
    from trio_sampler._http._httpx import NOT_SENT as GIVEN
    from trio_sampler.actor._plan import NOT_SENT as READ

    assert GIVEN == READ
