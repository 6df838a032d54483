"""The estimate of what a :class:`PartialJSON`'s value holds, against ``tracemalloc``.

Within 0.5x to 2.5x for each shape, read a few bytes at a time, a
read's worth at a time and whole (the module's documentation says where it is over)."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from trio_sampler.types._partial_json import PartialJSON

_SHAPES = {
    "empty objects": "[" + ",".join(["{}"] * 5000) + "]",
    "empty arrays": "[" + ",".join(["[]"] * 5000) + "]",
    "small integers": "[" + ",".join(["1"] * 5000) + "]",
    "large integers": "[" + ",".join(["123456"] * 5000) + "]",
    "records": json.dumps([{"name": f"x{n}", "n": n} for n in range(1000)]),
    "long string": json.dumps({"text": "abc " * 10_000}),
    "wide string": json.dumps({"text": "\xe9\u20ac\U0001f600 " * 5000}, ensure_ascii=False),
    "wide object": json.dumps({f"k{n}": n for n in range(2000)}),
}


def _measured(text: str, step: int) -> tuple[int, int]:
    """(what tracemalloc saw the reader and its value take, the reader's estimate)."""
    gc.collect()
    tracemalloc.start()
    try:
        reader = PartialJSON()
        for at in range(0, len(text), step):
            reader.feed(text[at : at + step])
        reader.value  # noqa: B018  # the open string's pieces joined, as a caller sees it
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return traced, reader.held_bytes


@pytest.mark.parametrize("shape", sorted(_SHAPES))
@pytest.mark.parametrize("step", [3, 1024, 0])
def test_the_estimate_is_within_a_factor_of_what_is_held(shape: str, step: int) -> None:
    text = _SHAPES[shape]
    traced, estimate = _measured(text, step or len(text))
    assert 0.5 * traced <= estimate <= 2.5 * traced, (traced, estimate)


def test_a_string_read_in_pieces_counts_each_piece_until_joined() -> None:
    reader = PartialJSON()
    reader.feed('"')
    for _ in range(100):
        reader.feed("abcd")
    in_pieces = reader.held_bytes
    reader.value  # noqa: B018  # joined into one string
    assert reader.held_bytes < in_pieces
    reader.feed('"')
    assert reader.finish() == "abcd" * 100
    assert 400 <= reader.held_bytes < 600
