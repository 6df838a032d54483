"""The window scan's probes skip only positions the plain scan would have missed.

``Redactor._scrub_windows`` looks a window up only near a probe hit (a shorter piece of
a window, at every fourth position). The reference below is the plain scan it replaced,
a window looked up at every position; on texts built of pieces of every form of the held
credentials (overlapping, cut anywhere, beside whitespace and base64 characters) both
give the same text.
"""

from __future__ import annotations

import base64
import json
import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_sampler._redact import _WINDOW, Redactor, _echo, _lower_ascii

KEY = "Kp2xLm9QrT4vWz7YbN3cF6hJ8aD1eG5s"
SPACED = "Bearer sk-test/ab+cd=ef gh"  # an auth scheme, "/", "+", "=" and a space inside
BASIC = "Basic " + base64.b64encode(b"someone:pa55w0rd-long-enough").decode()
REDACTOR = Redactor([("api_key", KEY), ("authorization", SPACED), ("x-auth", BASIC)])


def _reference(redactor: Redactor, text: str) -> str:
    """The plain scan: a window looked up at every position (an echo found is extended
    as the probed scan extends it, by ``_echo``: the two differ only in where they look)."""
    windows = redactor._windows
    lowered = _lower_ascii(text)
    size = len(text)
    pieces: list[str] = []
    done = position = 0
    while position + _WINDOW <= size:
        hit = windows.get(lowered[position : position + _WINDOW])
        if hit is None:
            position += 1
            continue
        mask, widen = hit
        position, end = _echo(text, lowered, windows, position, done, widen)
        pieces += [text[done:position], mask]
        done = position = end
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _forms(value: str) -> list[str]:
    raw = value.encode()
    return [
        value,
        value.upper(),
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        json.dumps(value)[1:-1].replace("/", "\\/"),
        repr(value)[1:-1],
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(b"x" + raw).decode(),
        base64.b64encode(b"ab" + raw + b"cd").decode(),
    ]


_FORMS = [
    form for value in (KEY, SPACED, BASIC, "someone:pa55w0rd-long-enough") for form in _forms(value)
]


@st.composite
def _piece(draw: st.DrawFn) -> str:
    """A cut of a form (a truncated echo, or too short to count), or filler."""
    form = draw(st.sampled_from(_FORMS))
    start = draw(st.integers(0, len(form)))
    end = draw(st.integers(start, len(form)))
    return form[start:end]


_FILLER = st.one_of(
    st.sampled_from([" ", "\t", "\n", "=", "+", "/", "-", "_", "AAAA", "Zm9v", "é", "\u0130"]),
    st.text(max_size=8),
)
_TEXTS = st.lists(st.one_of(_piece(), _FILLER), max_size=10).map("".join)


@settings(max_examples=400)
@given(_TEXTS)
def test_the_probed_scan_is_the_plain_scan(text: str) -> None:
    assert REDACTOR._scrub_windows(text) == _reference(REDACTOR, text)


@given(st.sampled_from(_FORMS), st.integers(0, 7), st.integers(0, 7))
def test_every_offset_of_a_whole_form(form: str, before: int, after: int) -> None:
    # Each form at every offset from the probe grid, with base64 characters around it.
    text = "Q" * before + form + "w" * after
    assert REDACTOR._scrub_windows(text) == _reference(REDACTOR, text)
    assert REDACTOR._scrub_windows(text) != text
