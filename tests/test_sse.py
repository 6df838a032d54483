"""The SSE decoder: WHATWG framing over bytes, split invariance, bounds."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_sampler.wire import ServerSentEvent, SSEDecoder, SSEEventTooLarge


def decode(
    body: bytes, *, split: list[int] | None = None, limit: int = 1 << 20
) -> list[ServerSentEvent]:
    decoder = SSEDecoder(limit)
    out: list[ServerSentEvent] = []
    if split is None:
        out += decoder.feed(body)
    else:
        start = 0
        for point in [*split, len(body)]:
            out += decoder.feed(body[start:point])
            start = point
    out += decoder.close()
    return out


def all_ways(body: bytes) -> list[list[ServerSentEvent]]:
    """The body fed whole, byte by byte, and at every two-way split."""
    ways = [decode(body), decode(body, split=list(range(1, len(body))))]
    ways += [decode(body, split=[i]) for i in range(1, len(body))]
    return ways


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b"data: hi\n\n", [ServerSentEvent("hi")], id="lf"),
        pytest.param(b"data: hi\r\n\r\n", [ServerSentEvent("hi")], id="crlf"),
        pytest.param(b"data: hi\r\r", [ServerSentEvent("hi")], id="cr-only"),
        pytest.param(b"data: a\r\ndata: b\n\r\n", [ServerSentEvent("a\nb")], id="mixed-ends"),
        pytest.param(b"\xef\xbb\xbfdata: x\n\n", [ServerSentEvent("x")], id="bom"),
        pytest.param(
            b": OPENROUTER PROCESSING\n\ndata: x\n\n", [ServerSentEvent("x")], id="comment"
        ),
        pytest.param(b"data: a\ndata: b\n\n", [ServerSentEvent("a\nb")], id="multi-line"),
        pytest.param(
            b"event: ping\ndata: {}\n\n", [ServerSentEvent("{}", event="ping")], id="event-name"
        ),
        pytest.param(
            b"id: 7\nretry: 1500\ndata: x\n\ndata: y\n\n",
            [ServerSentEvent("x", id="7", retry=1500), ServerSentEvent("y", id="7")],
            id="id-persists-retry-does-not",
        ),
        pytest.param(b"data:nospace\n\n", [ServerSentEvent("nospace")], id="no-space"),
        pytest.param(b"data:  two\n\n", [ServerSentEvent(" two")], id="one-space-stripped"),
        pytest.param(b"data\n\n", [ServerSentEvent("")], id="field-without-colon"),
        pytest.param(b"event: x\n\n", [], id="no-data-no-dispatch"),
        pytest.param(b"foo: bar\ndata: x\n\n", [ServerSentEvent("x")], id="unknown-field"),
        pytest.param(b"retry: soon\ndata: x\n\n", [ServerSentEvent("x")], id="bad-retry"),
        pytest.param(b"data: x\n", [ServerSentEvent("x")], id="missing-final-blank-line"),
        pytest.param(b'data: x\n\ndata: {"cut', [ServerSentEvent("x")], id="cut-mid-line"),
        pytest.param(
            'data: {"t":"a\u2028b"}\n\n'.encode(),
            [ServerSentEvent('{"t":"a\u2028b"}')],
            id="u2028-is-not-a-line-end",
        ),
        pytest.param("data: héllo €\n\n".encode(), [ServerSentEvent("héllo €")], id="multibyte"),
        pytest.param(b"data: \xff\xfe\n\n", [ServerSentEvent("\ufffd\ufffd")], id="invalid-utf8"),
    ],
)
def test_framing(body: bytes, expected: list[ServerSentEvent]) -> None:
    for events in all_ways(body):
        assert events == expected


def test_crlf_split_exactly_between_cr_and_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [ServerSentEvent("a")]
    assert decoder.feed(b"\ndata: b\n\n") == [ServerSentEvent("b")]


def test_multibyte_character_split_across_reads() -> None:
    body = "data: 你好\n\n".encode()
    cut = body.index("好".encode()) + 1  # inside the 3-byte sequence
    assert decode(body, split=[cut]) == [ServerSentEvent("你好")]


def test_bom_only_stripped_at_start() -> None:
    assert decode(b"data: a\n\n\xef\xbb\xbfdata: b\n\n") == [ServerSentEvent("a")]


def test_event_too_large_fails_and_stays_failed() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    with pytest.raises(SSEEventTooLarge, match="64-byte limit"):
        decoder.feed(b"data: " + b"x" * 100 + b"\n\n")
    with pytest.raises(SSEEventTooLarge):
        decoder.feed(b"data: ok\n\n")
    assert decoder.close() == []


def test_unterminated_line_is_bounded() -> None:
    """A server that never sends a newline cannot make the decoder buffer without limit."""
    decoder = SSEDecoder(max_event_bytes=1024)
    with pytest.raises(SSEEventTooLarge):
        for _ in range(100):
            decoder.feed(b"y" * 100)


def test_many_data_lines_are_bounded() -> None:
    decoder = SSEDecoder(max_event_bytes=1024)
    with pytest.raises(SSEEventTooLarge):
        for _ in range(1000):
            decoder.feed(b"data: 12345678\n")


def test_invalid_limit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="positive"):
        SSEDecoder(0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.randoms(use_true_random=False))
def test_arbitrary_bytes_are_split_invariant(body: bytes, rnd: random.Random) -> None:
    whole = decode(body)
    points = sorted({rnd.randrange(1, len(body)) for _ in range(4)}) if len(body) > 1 else []
    assert decode(body, split=points) == whole
    assert decode(body, split=list(range(1, len(body)))) == whole


_field = st.sampled_from([b"data", b"event", b"id", b"retry", b"", b":x", b"other"])
_value = st.text(max_size=20).map(lambda s: s.encode())
_eol = st.sampled_from([b"\n", b"\r", b"\r\n"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_field, _value, _eol), max_size=20), st.randoms(use_true_random=False))
def test_structured_streams_are_split_invariant(
    lines: list[tuple[bytes, bytes, bytes]], rnd: random.Random
) -> None:
    body = b"".join((f + b": " + v if f else b"") + e for f, v, e in lines)
    whole = decode(body)
    points = sorted({rnd.randrange(1, len(body)) for _ in range(5)}) if len(body) > 1 else []
    assert decode(body, split=points) == whole
