"""The SSE decoder: WHATWG framing over bytes, split invariance, bounds."""

from __future__ import annotations

import itertools
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


def _reads(body: bytes, sizes: list[int]) -> list[int]:
    """Split points that cut ``body`` into reads of the given sizes, cycled."""
    points: list[int] = []
    at = 0
    for size in itertools.cycle(sizes):
        at += size
        if at >= len(body):
            return points
        points.append(at)
    raise AssertionError("unreachable")


_long_line = st.tuples(
    st.sampled_from([b"data: ", b"data:", b"event: ", b"id: ", b": ", b"other: "]),
    st.integers(min_value=0, max_value=40_000),
    st.sampled_from([b"\n", b"\r", b"\r\n"]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_long_line, min_size=1, max_size=6),
    st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=5),
    st.sampled_from([b"", b"\n", b"\r\n"]),
)
def test_long_lines_in_small_reads_are_split_invariant(
    lines: list[tuple[bytes, int, bytes]], sizes: list[int], end: bytes
) -> None:
    """Lines far longer than one read, cut at arbitrary read sizes, decode the same."""
    body = b"".join(f + "é€x"[n % 3].encode() * n + e for f, n, e in lines) + end
    whole = decode(body)
    assert decode(body, split=_reads(body, sizes)) == whole
    assert decode(body, split=_reads(body, [64])) == whole


def test_a_long_data_line_trickled_in_small_reads_keeps_every_byte() -> None:
    payload = "".join(f"{i:07d}," for i in range(40_000)).encode()  # 320 kB, no line end
    body = b"data: " + payload + b"\r\n\r\n"
    assert decode(body, split=list(range(64, len(body), 64))) == [ServerSentEvent(payload.decode())]


def test_a_line_fails_as_soon_as_its_event_cannot_fit() -> None:
    """The bound covers the event so far plus the unfinished line: memory stays bounded by
    the limit, and a trickled line fails on the read that crosses it, not at its end."""
    decoder = SSEDecoder(max_event_bytes=100)
    assert decoder.feed(b"event: big\n") == []  # 11 bytes of the event
    feeds = 0
    with pytest.raises(SSEEventTooLarge):
        for _ in range(1000):
            feeds += 1
            decoder.feed(b"data: " if feeds == 1 else b"z" * 8)
    # 11 + 6 + 8 * 11 = 105 > 100: the 12th read is the one that crosses the limit.
    assert feeds == 12


def test_an_event_at_exactly_the_limit_is_dispatched() -> None:
    line = b"data: " + b"q" * 93 + b"\n"  # 100 bytes counted, blank line not counted
    events = decode(line + b"\n", split=list(range(1, len(line), 7)), limit=100)
    assert events == [ServerSentEvent("q" * 93)]
    with pytest.raises(SSEEventTooLarge):
        decode(b"data: " + b"q" * 94 + b"\n\n", split=list(range(1, 101, 7)), limit=100)


def test_comment_lines_of_any_length_cost_no_buffer() -> None:
    """A keep-alive comment longer than the bound, trickled, is skipped, not buffered."""
    body = b": " + b"." * 5000 + b"\ndata: after\n\n"
    assert decode(body, split=list(range(1, len(body), 13)), limit=64) == [ServerSentEvent("after")]
