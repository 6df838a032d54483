"""What a request does after a failed attempt on a route: the rules, as a table.

Pure: :func:`decide` reads the attempt's outcome, the route's history and the policies,
and returns the next :data:`Step`; it awaits nothing, reads no clock and changes nothing.
The request (``_request.py``) carries the step out. The rules are tried in the order of
:data:`RULES`; the first that applies decides. Each row names the rule and says why it
stands where it does, so any ``Retrying``, fail-over or ``Failed`` can be traced to one row
(and, for the routing and retry rows, to one row of ``routing.ROUTING`` or of
``retry.classify``'s table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

from ..config import RetryPolicy
from ..retry import Decision, RetryAction, classify
from ..routing import RouteAction, route_action
from ..types import ConversationResponse, SamplingErrorInfo, SamplingErrorKind

__all__ = [
    "NOT_SENT",
    "RULES",
    "Facts",
    "FailOver",
    "Finish",
    "History",
    "Policies",
    "Resample",
    "Resume",
    "ResumePoint",
    "Retry",
    "Rule",
    "Step",
    "StripImages",
    "decide",
    "not_processed",
]


@attrs.frozen
class ResumePoint:
    """Where a cut stream can be read on from: the server keeps the response
    (Responses background mode) and replays its events after ``after_sequence``."""

    response_id: str
    #: The sequence number of the last event the consumer was given.
    after_sequence: int
    #: Content reached the consumer before the cut (a fall-back retry discards it).
    emitted: bool
    #: What cut the stream.
    cut: SamplingErrorInfo


@attrs.frozen
class History:
    """What the request's attempts on the current route have done so far."""

    #: Retries the retry policy has granted on the route.
    retries: int = 0
    #: Doom-loop resamples on the route.
    resamples: int = 0
    consecutive_rate_limits: int = 0
    images_stripped: bool = False
    #: The attempt continued a previous route's text by prefill.
    continuing: bool = False
    #: Cut streams resumed on the route.
    resumes: int = 0


@attrs.frozen
class Policies:
    """The policies that bear on the route's next step."""

    retry: RetryPolicy
    #: Doom-loop resamples allowed on the route (0: none).
    max_resamples: int = 0
    #: The routing policy's ``max_retry_wait_s``; ``None``: the request has no routing.
    max_retry_wait_s: float | None = None


@attrs.frozen
class Facts:
    """A failed attempt, as the plan sees it."""

    error: SamplingErrorInfo
    partial: ConversationResponse | None = None
    #: Content reached the consumer (a retry discards it).
    emitted: bool = False
    #: The attempt ran armed: a doom loop it detected resamples.
    armed: bool = False
    doom_triggers: tuple[str, ...] = ()
    #: Attempts the request has started (all routes), the one just ended included.
    started: int = 1
    #: The route's declared context window (``None``: unknown), under routing.
    context_window: int | None = None
    #: A later route could take the request.
    has_next: bool = False
    #: The attempt was cut where its stream can be resumed (``None``: it cannot).
    resume_point: ResumePoint | None = None
    #: The attempt was a resumed read the server refused (the response expired, or was
    #: never kept): the request starts over.
    resume_refused: bool = False
    #: Sending the request again leaves the server as sending it once would
    #: (``ConversationRequest.replay_safe``: not stored, not chained).
    replay_safe: bool = True


@attrs.frozen
class Retry:
    """Try the route again after ``delay`` seconds; ``discard``: the consumer drops what
    the failed attempt streamed. ``charged``: the retry spends the retry budgets (a spent
    budget ends the request instead)."""

    delay: float
    discard: bool
    attempt: int
    max_retries: int
    history: History
    charged: bool = True
    #: The name of the rule (``RULES``) that decided it.
    rule: str = ""


@attrs.frozen
class Resample:
    """A doom loop on an armed attempt: sample the route again (not a retry)."""

    delay: float
    discard: bool
    attempt: int
    max_retries: int
    triggers: tuple[str, ...]
    history: History
    rule: str = ""


@attrs.frozen
class Resume:
    """Read the cut stream on from ``point`` (a ``Resumed`` event; nothing discarded)."""

    point: ResumePoint
    attempt: int
    max_retries: int
    history: History
    rule: str = ""


@attrs.frozen
class StripImages:
    """Try again without the request's images (if it has none, the request fails)."""

    discard: bool
    attempt: int
    max_retries: int
    history: History
    rule: str = ""


@attrs.frozen
class FailOver:
    """The route gives up on the request and the routing table sends it on."""

    error: SamplingErrorInfo
    partial: ConversationResponse | None
    #: The failed attempt had streamed output (the next route's ``Retrying`` discards it).
    emitted: bool
    action: RouteAction
    #: After a context-length error: only a route with a larger window may follow.
    min_window: int | None = None
    rule: str = ""


@attrs.frozen
class Finish:
    """The request ends with ``error`` (``Failed``, with the attempt's partial)."""

    error: SamplingErrorInfo
    rule: str = ""


Step = Retry | Resume | Resample | StripImages | FailOver | Finish

#: A rule: ``None`` when it does not apply. ``uniform`` draws in [0, 1); ``circuit_open``
#: asks the route's breaker (only the routing rule calls it, and only when it matters).
_Apply = Callable[
    [Facts, History, Policies, Decision | None, Callable[[], float], Callable[[], bool]],
    "Step | None",
]


@attrs.frozen
class Rule:
    """One row of :data:`RULES`."""

    name: str
    why: str
    apply: _Apply


def _resume(facts: Facts, history: History, policies: Policies, *_: object) -> Step | None:
    point = facts.resume_point
    if point is None or history.resumes >= policies.retry.max_retries:
        return None
    resumes = history.resumes + 1
    after = attrs.evolve(history, resumes=resumes, continuing=False)
    return Resume(point, resumes, policies.retry.max_retries, after)


def _resume_refused(facts: Facts, history: History, policies: Policies, *_: object) -> Step | None:
    if not facts.resume_refused:
        return None
    return Retry(
        0.0,
        facts.emitted or history.continuing,
        facts.started,
        policies.retry.max_retries,
        attrs.evolve(history, continuing=False),
        charged=False,
    )


def _continuation_refused(
    facts: Facts, history: History, policies: Policies, *_: object
) -> Step | None:
    if not history.continuing or facts.error.kind is not SamplingErrorKind.INVALID_REQUEST:
        return None
    if not facts.replay_safe and not not_processed(facts.error):
        return None  # "replay safety" ends it
    return Retry(
        0.0,
        True,
        facts.started,
        policies.retry.max_retries,
        attrs.evolve(history, continuing=False),
        charged=False,
    )


def _doom_resample(
    facts: Facts,
    history: History,
    policies: Policies,
    _decision: object,
    uniform: Callable[[], float],
    *_: object,
) -> Step | None:
    if facts.error.kind is not SamplingErrorKind.DOOM_LOOP_DETECTED or not facts.armed:
        return None
    if not facts.replay_safe:  # the server processed it: "replay safety" ends it
        return None
    resamples = history.resamples + 1
    return Resample(
        0.25 * uniform(),
        _discard(facts, history),
        resamples,
        policies.max_resamples,
        facts.doom_triggers,
        attrs.evolve(history, resamples=resamples, continuing=False),
    )


def _mid_stream(facts: Facts, history: History, policies: Policies, *_: object) -> Step | None:
    if _discard(facts, history) and not policies.retry.retry_mid_stream:
        return Finish(facts.error)
    return None


def _strip_images(
    facts: Facts, history: History, policies: Policies, decision: Decision | None, *_: object
) -> Step | None:
    assert decision is not None
    if decision.action is not RetryAction.STRIP_IMAGES:
        return None
    return StripImages(
        _discard(facts, history),
        history.retries + 1,
        policies.retry.max_retries,
        attrs.evolve(history, retries=history.retries + 1, images_stripped=True, continuing=False),
    )


def _routing(
    facts: Facts,
    history: History,
    policies: Policies,
    decision: Decision | None,
    _uniform: object,
    circuit_open: Callable[[], bool],
) -> Step | None:
    if policies.max_retry_wait_s is None:  # no routing: the retry policy alone decides
        return None
    assert decision is not None
    error = facts.error
    action = route_action(error)
    emitted = _discard(facts, history)
    if action is RouteAction.LARGER_WINDOW:
        window = facts.context_window or 0
        return FailOver(error, facts.partial, emitted, action, min_window=window)
    if action is RouteAction.SURFACE or not facts.has_next:
        return None
    fail_over = FailOver(error, facts.partial, emitted, action)
    if action is RouteAction.NEXT or decision.action is RetryAction.FAIL:
        return fail_over
    if decision.delay > policies.max_retry_wait_s or circuit_open():
        return fail_over
    return None


#: The failures that prove the server did not process the request: no connection was
#: made (``_http``'s ``not_sent``), the sampler's own admission refused it, or the server
#: answered with a refusal before processing (a 429, an Anthropic 529 overload, an
#: authentication, size or validity refusal). An in-stream error is no proof: the server
#: was processing the request when it sent it.
NOT_SENT: Final = "not_sent"
_REFUSED_STATUSES: Final = frozenset({429, 529})
_REFUSALS: Final = frozenset(
    {
        SamplingErrorKind.AUTH,
        SamplingErrorKind.RATE_LIMITED,
        SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
        SamplingErrorKind.INVALID_REQUEST,
        SamplingErrorKind.PAYLOAD_TOO_LARGE,
    }
)


def not_processed(error: SamplingErrorInfo) -> bool:
    """Whether ``error`` proves the server did not process the request."""
    if error.error_code == NOT_SENT or error.kind is SamplingErrorKind.FLEET_UNAVAILABLE:
        return True
    if error.status_code is None:  # in-stream, or the connection failed after it was made
        return False
    return error.status_code in _REFUSED_STATUSES or error.kind in _REFUSALS


def _replay_unsafe(
    facts: Facts, _history: History, _policies: Policies, decision: Decision | None, *_: object
) -> Step | None:
    if facts.replay_safe or not_processed(facts.error):
        return None
    assert decision is not None
    error = facts.error
    if decision.action is RetryAction.FAIL:  # it would not be retried: no fail-over either
        return Finish(error)
    message = (
        f"{error.message} (not retried: the request keeps state on the server "
        "(store, background, previous_response_id or conversation) and the server may "
        "have processed it; a second send could apply it twice)"
    )
    return Finish(attrs.evolve(error, message=message, retryable=False))


def _fail(
    facts: Facts, _history: History, _policies: Policies, decision: Decision | None, *_: object
) -> Step | None:
    assert decision is not None
    return Finish(facts.error) if decision.action is RetryAction.FAIL else None


def _retry(
    facts: Facts, history: History, policies: Policies, decision: Decision | None, *_: object
) -> Step | None:
    assert decision is not None
    rate_limited = facts.error.kind is SamplingErrorKind.RATE_LIMITED
    retries = history.retries + 1
    after = attrs.evolve(
        history,
        retries=retries,
        consecutive_rate_limits=history.consecutive_rate_limits + 1 if rate_limited else 0,
        continuing=False,
    )
    return Retry(
        decision.delay, _discard(facts, history), retries, policies.retry.max_retries, after
    )


def _discard(facts: Facts, history: History) -> bool:
    """The consumer holds output the next attempt replaces: the attempt's, or the text
    a continuation carried over."""
    return facts.emitted or history.continuing


#: The rules, in the order they are tried (the first that applies decides). Between
#: "mid-stream" and "image strip" the retry policy classifies the error
#: (``retry.classify``); the later rules read its decision.
RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "resume",
        "a cut stream whose response the server keeps (Responses background mode) is "
        "read on from its last delivered event: nothing is repeated, discarded or "
        "generated again, so it comes before every retry rule (retry_mid_stream "
        "included); bounded by max_retries resumes on the route",
        _resume,
    ),
    Rule(
        "resume refused",
        "the server no longer has the response (expired, or never kept: 404/410): "
        "start over at once, visibly (Retrying, discarding what was streamed), uncharged "
        "(the lost cursor is not a server failure)",
        _resume_refused,
    ),
    Rule(
        "continuation refused",
        "a route that rejects a prefill refused the continuation, not the request: start "
        "over at once, on the same route, uncharged",
        _continuation_refused,
    ),
    Rule(
        "doom resample",
        "an armed attempt caught repeating itself is sampled again (DoomLoopPolicy): a "
        "resample, not a retry, so it comes before every retry rule",
        _doom_resample,
    ),
    Rule(
        "mid-stream",
        "output reached the consumer and RetryPolicy.retry_mid_stream is off: a retry "
        "would repeat what was seen",
        _mid_stream,
    ),
    Rule(
        "replay safety",
        "a request that is not replay-safe (stored or chained: "
        "ConversationRequest.replay_safe; none of the three APIs takes an idempotency "
        "key) is sent again only when the failure proves the server did not process "
        "it: no connection was made, or a 429, a 529 or an invalid-request refusal. "
        "Anything else that would retry, resample, strip images or fail over ends it, "
        "saying why",
        _replay_unsafe,
    ),
    Rule(
        "image strip",
        "the retry policy says the images are the problem: try without them (once)",
        _strip_images,
    ),
    Rule(
        "routing table",
        "under routing, routing.ROUTING says whether this route may retry or another "
        "route takes over (also when the wait is longer than max_retry_wait_s or the "
        "circuit opened meanwhile)",
        _routing,
    ),
    Rule(
        "fail",
        "the retry policy gives up (not retryable, or retries spent)",
        _fail,
    ),
    Rule(
        "retry",
        "retry on the route after the policy's backoff; the retry budgets are charged "
        "last, when the retry is certain",
        _retry,
    ),
)

#: The rules tried before the retry policy is asked.
_BEFORE_CLASSIFY: Final = 5


def decide(
    facts: Facts,
    history: History,
    policies: Policies,
    *,
    uniform: Callable[[], float],
    circuit_open: Callable[[], bool] = lambda: False,
) -> Step:
    """The next step after the failed attempt ``facts`` (the first rule of
    :data:`RULES` that applies; its name is the step's ``rule``). ``uniform`` draws
    jitter in [0, 1); ``circuit_open`` says whether the route's breaker now refuses it."""
    for rule in RULES[:_BEFORE_CLASSIFY]:
        step = rule.apply(facts, history, policies, None, uniform, circuit_open)
        if step is not None:
            return attrs.evolve(step, rule=rule.name)
    decision = classify(
        facts.error,
        history.retries,
        policies.retry,
        consecutive_rate_limits=history.consecutive_rate_limits,
        images_stripped=history.images_stripped,
        uniform=uniform,
    )
    for rule in RULES[_BEFORE_CLASSIFY:]:
        step = rule.apply(facts, history, policies, decision, uniform, circuit_open)
        if step is not None:
            return attrs.evolve(step, rule=rule.name)
    raise AssertionError("the last rule always applies")  # pragma: no cover
