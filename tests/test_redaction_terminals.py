"""The terminal's redaction walk: every string a terminal carries, and the cheap tests
that let the redactor skip a string without running its patterns.

The walk visits only the fields that can hold a server's (or an admission's) text, and
skips a string its patterns cannot match. These tests plant a credential in every
string-carrying field of every terminal kind, found by looking at the types themselves
(a field added later is planted too, or the test says it was missed), and check that
each cheap test agrees with the pattern it stands in for.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from trio_sampler._redact import (
    _SHAPE_ANCHORS,
    _SHAPE_MIN_CHARS,
    _SHAPES,
    Redactor,
    _shape,
    could_hold_shape,
    scrub_secrets,
)
from trio_sampler.types import (
    ApiBackend,
    Assistant,
    AttemptOutcome,
    AttemptRecord,
    BackendToolCall,
    Cancelled,
    Completed,
    ConversationResponse,
    Failed,
    LedgerEntry,
    OutputError,
    OutputErrorKind,
    RateLimitBudget,
    RateLimitSnapshot,
    Reasoning,
    RequestMetrics,
    SamplingErrorInfo,
    SamplingErrorKind,
    StopReason,
    TerminalEvent,
    ToolCall,
    Usage,
)

KEY = "Kp2xLm9QrT4vWz7YbN3cF6hJ8aD1eG5s"  # held by the redactor
SHAPE = "sk-proj-abcdefgh12345678"  # not held: a credential by its shape alone
R = Redactor([("api_key", KEY)])

#: Fields that pass as they are, as ``docs/contract.md`` §7 says: generated content (the
#: payload: text, refusals, reasoning and its round-trip state, tool calls, hosted-tool
#: payloads) and the caller's own names (its request id, its route names, the model it
#: asked for). Every other string a terminal carries is scrubbed.
PASSES = {
    "Completed.request_id",
    "Failed.request_id",
    "Cancelled.request_id",
    "Completed.route",
    "RequestMetrics.route",
    "RequestMetrics.skipped_routes[0]",
    "AttemptRecord.route",
    "AttemptRecord.model",
    "Assistant.content",
    "Assistant.refusal",
    "ToolCall.id",
    "ToolCall.name",
    "ToolCall.arguments",
    "Reasoning.text",
    "Reasoning.summary",
    "Reasoning.id",
    "Reasoning.encrypted_content",
    "Reasoning.signature",
    "Reasoning.redacted_data",
    "BackendToolCall.id",
    "BackendToolCall.name",
    "BackendToolCall.arguments",
    "BackendToolCall.status",
    "BackendToolCall.result",
    "BackendToolCall.raw",
    # Hand-over state the next turn sends back byte-exactly.
    "Assistant.phase",
    "Assistant.audio_id",
    "ToolCall.caller",
    "ToolCall.namespace",
    # The structured answer and why it could not be read: the model's output.
    "ConversationResponse.output_parsed",
    "OutputError.message",
    "OutputError.text",
    "OutputError.refusal",
}


def planted(where: str) -> str:
    return f"{where} {KEY} {SHAPE}"


def _response(where: str) -> ConversationResponse:
    def p(field: str) -> str:
        return planted(f"{where}.{field}")

    return ConversationResponse(
        items=[
            Reasoning(
                text=p("reasoning.text"),
                summary=[p("reasoning.summary")],
                id=p("reasoning.id"),
                encrypted_content=p("reasoning.encrypted"),
                signature=p("reasoning.signature"),
                redacted_data=p("reasoning.redacted"),
                origin=ApiBackend.MESSAGES,
            ),
            BackendToolCall(
                id=p("hosted.id"),
                name=p("hosted.name"),
                arguments=p("hosted.arguments"),
                status=p("hosted.status"),
                result={p("hosted.result.key"): p("hosted.result")},
                raw=[{p("hosted.raw.key"): p("hosted.raw")}],
            ),
            # An item naming the response's own model string, and one with its own.
            Assistant(content=p("text"), model=p("model")),
            Assistant(
                content=p("text2"),
                tool_calls=[
                    ToolCall(
                        p("call.id"),
                        p("call.name"),
                        p("call.arguments"),
                        caller={p("call.caller.key"): p("call.caller")},
                        namespace=p("call.namespace"),
                    )
                ],
                refusal=p("refusal"),
                model=p("item.model"),
                id=p("item.id"),
                phase=p("phase"),
                audio_id=p("audio_id"),
            ),
        ],
        stop_reason=StopReason.STOP,
        raw_stop_reason=p("raw_stop_reason"),
        usage=Usage(1, 2),
        model=p("model"),
        response_id=p("response_id"),
        stop_sequence=p("stop_sequence"),
        doom_loop_signals=[p("signal")],
        output_parsed={p("output.key"): p("output.value")},
        output_error=OutputError(
            OutputErrorKind.INVALID, p("output.message"), p("output.text"), p("output.refusal")
        ),
    )


def _metrics() -> RequestMetrics:
    budget = RateLimitBudget(limit=10, remaining=5, reset_after=1.0)
    snapshot = RateLimitSnapshot(requests=budget, tokens=budget, retry_after=1.0)
    record = AttemptRecord(
        attempt=1,
        kind=SamplingErrorKind.API,
        outcome=AttemptOutcome.FAILED,
        route=planted("record.route"),
        model=planted("record.model"),
        usage=Usage(1, 2),
        rate_limit=snapshot,
    )
    return RequestMetrics(
        attempts=(record,),
        usage=Usage(1, 2),
        total_usage=Usage(1, 2),
        route=planted("metrics.route"),
        skipped_routes=((planted("skipped.route"), planted("skipped.reason")),),
        rate_limit=snapshot,
    )


def _terminals() -> list[TerminalEvent]:
    error = SamplingErrorInfo(
        kind=SamplingErrorKind.API,
        message=planted("error.message"),
        status_code=500,
        error_type=planted("error.type"),
        error_code=planted("error.code"),
        provider_request_id=planted("error.request_id"),
        rate_limit={planted("rate_limit.name"): planted("rate_limit.value")},
        rate_limit_snapshot=RateLimitSnapshot(retry_after=1.0),
    )
    completed = _response("completed")
    return [
        Completed(planted("request_id"), completed, _metrics(), planted("route"), completed.model),
        Completed(planted("request_id"), _response("own"), _metrics(), None, planted("model")),
        Failed(planted("request_id"), error, _response("failed"), _metrics()),
        Cancelled(planted("request_id"), planted("reason"), _response("cancelled"), _metrics()),
    ]


def _carries_text(hint: Any) -> bool:
    if hint is str or hint is Any:
        return True
    return any(_carries_text(arg) for arg in typing.get_args(hint))


def _strings(
    value: Any, where: str, carrying: dict[str, bool] | None = None
) -> Iterator[tuple[str, str]]:
    """Every string inside ``value`` with the field it sits in (``Class.field``, or
    ``Class.field[i]`` inside a field's tuples of pairs). ``carrying`` collects every
    field whose type can hold text, and whether any instance of it held the secret."""
    if isinstance(value, str):
        yield where, value
    elif attrs.has(type(value)):
        hints = typing.get_type_hints(type(value))
        for field in attrs.fields(type(value)):
            inner = getattr(value, field.name)
            name = f"{type(value).__name__}.{field.name}"
            if carrying is not None and _carries_text(hints[field.name]):
                carrying[name] = carrying.get(name, False) or KEY in repr(inner)
            yield from _strings(inner, name, carrying)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _strings(key, where, carrying)
            yield from _strings(inner, where, carrying)
    elif isinstance(value, tuple | list):
        for inner in value:
            if isinstance(inner, tuple) and all(isinstance(x, str) for x in inner):
                for position, text in enumerate(inner):
                    yield f"{where}[{position}]", text
            else:
                yield from _strings(inner, where, carrying)


def test_a_secret_in_every_string_field_of_every_terminal_kind_is_redacted() -> None:
    seen: set[str] = set()
    carrying: dict[str, bool] = {}
    for terminal in _terminals():
        planted_strings = dict(_strings(terminal, type(terminal).__name__, carrying))
        scrubbed = R.event(terminal)
        for where, text in _strings(scrubbed, type(terminal).__name__):
            seen.add(where)
            if where in PASSES:
                assert KEY in text and SHAPE in text, where
            else:
                assert KEY not in text and "abcdefgh12345678" not in text, (where, text)
                assert "[REDACTED api_key …eG5s]" in text and "[REDACTED]" in text, where
        assert planted_strings  # the walk above really looked at something
    # Every field whose type can hold text (found from the types) held the secret.
    assert [name for name, held in carrying.items() if not held] == []
    # Every field the exceptions name exists, and something was scrubbed besides.
    assert seen >= PASSES
    assert seen - PASSES >= {
        "ConversationResponse.model",
        "ConversationResponse.response_id",
        "ConversationResponse.raw_stop_reason",
        "ConversationResponse.stop_sequence",
        "ConversationResponse.doom_loop_signals",
        "Assistant.model",
        "Assistant.id",
        "Completed.model",
        "Cancelled.reason",
        "SamplingErrorInfo.message",
        "SamplingErrorInfo.error_type",
        "SamplingErrorInfo.error_code",
        "SamplingErrorInfo.provider_request_id",
        "SamplingErrorInfo.rate_limit",
        "RequestMetrics.skipped_routes[1]",
    }


def test_a_clean_terminal_is_returned_as_it_is() -> None:
    response = ConversationResponse(
        items=[Assistant("hello", model="gpt-4o-mini", id="msg_01")],
        stop_reason=StopReason.STOP,
        raw_stop_reason="stop",
        usage=Usage(3, 1),
        model="gpt-4o-mini",
        response_id="chatcmpl-abc123",
    )
    completed = Completed("req_1", response, RequestMetrics(), None, "gpt-4o-mini")
    assert R.event(completed) is completed
    failed = Failed("req_1", SamplingErrorInfo(kind=SamplingErrorKind.API, message="overloaded"))
    assert R.event(failed) is failed
    cancelled = Cancelled("req_1", "cancelled by the caller", response, RequestMetrics())
    assert R.event(cancelled) is cancelled


def test_the_ledger_loses_the_credential_a_provider_request_id_echoes() -> None:
    """Each ledger line's provider request id is scrubbed; lines that held nothing are
    kept as they were, and metrics that held nothing are returned as they are."""
    clean = LedgerEntry(1, AttemptOutcome.FAILED, "m", None, None, provider_request_id="req_01")
    echoed = attrs.evolve(clean, attempt=2, provider_request_id=f"req {KEY}")
    metrics = RequestMetrics(ledger=(clean, echoed, attrs.evolve(clean, attempt=3)))
    scrubbed = R.metrics(metrics)
    assert scrubbed is not None
    assert scrubbed.ledger[0] is clean and scrubbed.ledger[2] is metrics.ledger[2]
    assert scrubbed.ledger[1].provider_request_id == "req [REDACTED api_key …eG5s]"
    # Nothing else of the line changed.
    assert attrs.evolve(scrubbed.ledger[1], provider_request_id=f"req {KEY}") == echoed
    kept = RequestMetrics(ledger=(clean, attrs.evolve(clean, provider_request_id=None)))
    assert R.metrics(kept) is kept


# -- the cheap tests agree with the patterns ----------------------------------------------

_FRAGMENTS = [
    *_SHAPE_ANCHORS,
    *(anchor.upper() for anchor in _SHAPE_ANCHORS),
    "Bearer ",
    "basic\t",
    "?sig=",
    "&code=",
    "x-api-key: ",
    '"token": "',
    "=",
    ":",
    "-",
    "_",
    ".",
    " ",
    "abcdefghijklmnopqrstuvwxyz0123456789",
    "ABCDEFGHIJKLMNOP",
    "AIzaSyD3x7Kq9LmPz2Vb8Nc4Wr6Ty",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
    "gh",
    "sk",
    "xai",
    "\u212a",  # KELVIN SIGN: "k" when matched without case
    "\u017f",  # LATIN SMALL LETTER LONG S: "s" likewise
    "\u0130",  # LATIN CAPITAL LETTER I WITH DOT ABOVE
    "é",
]
_texts = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=6)), max_size=12).map(
    "".join
)


def test_no_text_shorter_than_the_minimum_can_match_a_shape() -> None:
    # The pattern's own minimum width, as the regular-expression compiler computes it.
    parsed = re._parser.parse(_SHAPES.pattern, _SHAPES.flags)  # type: ignore[attr-defined]
    assert parsed.getwidth()[0] >= _SHAPE_MIN_CHARS


@given(_texts)
def test_the_shape_test_never_passes_over_a_shape(text: str) -> None:
    if _SHAPES.search(text) is not None:
        assert could_hold_shape(text)
    assert scrub_secrets(text) == _SHAPES.sub(_shape, text)


SHORT_KEY = "bench-key"  # under 12 characters: matched whole, in any letter case
SHORT = Redactor([("api_key", SHORT_KEY)])
_short_texts = st.lists(
    st.one_of(
        st.sampled_from(
            [SHORT_KEY, SHORT_KEY.upper(), "bench-\u212aey", "BENCH-KEY", "bench", "-key", "ben"]
        ),
        st.sampled_from(_FRAGMENTS),
        st.text(max_size=5),
    ),
    max_size=8,
).map("".join)


def _reference_text(redactor: Redactor, text: str) -> str:
    """What ``Redactor.text`` computes, with every pattern run on every text."""
    if redactor._windows and len(text) >= 12:
        text = redactor._scrub_windows(text)
    assert redactor._short is not None
    text = redactor._short.sub(redactor._short_mask, text)
    return _SHAPES.sub(_shape, text)


@given(_short_texts)
def test_the_short_value_test_agrees_with_its_pattern(text: str) -> None:
    assert SHORT.text(text) == _reference_text(SHORT, text)


def test_a_short_key_echoed_through_a_case_fold_outside_ascii_is_scrubbed() -> None:
    # "bench-Key" with the Kelvin sign matches the key without case; looking its label up
    # by the ASCII-lowered match raised KeyError inside the terminal's redaction.
    echoed = "the key bench-\u212aey was refused"
    assert SHORT.text(echoed) == "the key [REDACTED api_key] was refused"
