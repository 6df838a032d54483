"""Fuzzing of everything that parses untrusted bytes (``docs/reliability.md``), with hypothesis.

The generators and checks live in ``benchmarks/fuzz.py`` (a fast runner for 10^6 inputs
per target, see ``docs/reliability.md``); here hypothesis drives them (through
``st.randoms()``) and also feeds plain arbitrary bytes, JSON and headers.

The budget per test is ``TRIO_SAMPLER_FUZZ_EXAMPLES`` (default 200). The big run::

    TRIO_SAMPLER_FUZZ_EXAMPLES=1000000 pytest tests/fuzz -p no:cacheprovider
    python benchmarks/fuzz.py --n 1000000 --jobs 2    # much faster, same checks
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import fuzz
from trio_sampler.wire import SSEDecoder, SSEEventTooLarge

EXAMPLES = int(os.environ.get("TRIO_SAMPLER_FUZZ_EXAMPLES", "200"))
BACKENDS = ("chat_completions", "responses", "messages")

budget = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(
    st.sampled_from(["error", "type", "message", "code", "param", "response", "status"])
    | st.text(max_size=10),
    json_values,
    max_size=6,
)


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


# -- SSE decoder -----------------------------------------------------------------------


@budget
@given(st.binary(max_size=600), st.integers(1, 300), st.lists(st.integers(0, 10**4), max_size=8))
def test_sse_arbitrary_bytes(data: bytes, limit: int, points: list[int]) -> None:
    fuzz.check_sse(data, limit, _cuts(data, points))


@budget
@given(st.randoms(use_true_random=False))
def test_sse_structured(rng: random.Random) -> None:
    data, limit = fuzz.gen_sse_bytes(rng)
    fuzz.check_sse(data, limit, fuzz.split(data, rng))


def test_sse_oversized_comment_line_is_split_invariant() -> None:
    # Minimal case found by the fuzzer: a complete comment line longer than the bound is
    # ignored when it arrives in one chunk but fails the stream when it arrives in two.
    body = b": " + b"x" * 20 + b"\n"
    whole = SSEDecoder(8)
    whole_error: type[Exception] | None = None
    try:
        whole.feed(body)
        whole.close()
    except SSEEventTooLarge as exc:
        whole_error = type(exc)
    split = SSEDecoder(8)
    split_error: type[Exception] | None = None
    try:
        split.feed(body[:12])
        split.feed(body[12:])
        split.close()
    except SSEEventTooLarge as exc:
        split_error = type(exc)
    assert whole_error == split_error


# -- transforms via replay -----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@budget
@given(rng=st.randoms(use_true_random=False))
def test_replay_structured(backend: str, rng: random.Random) -> None:
    body = fuzz.gen_replay_body(rng, fuzz.Seeds.load(), backend)
    fuzz.check_replay(backend, body, fuzz.split(body, rng))


@pytest.mark.parametrize("backend", BACKENDS)
@budget
@given(data=st.binary(max_size=400), points=st.lists(st.integers(0, 10**4), max_size=6))
def test_replay_arbitrary_bytes(backend: str, data: bytes, points: list[int]) -> None:
    fuzz.check_replay(backend, data, _cuts(data, points))


@pytest.mark.parametrize("backend", BACKENDS)
@budget
@given(events=st.lists(st.tuples(st.sampled_from(["message", "error", "ping"]), json_values)))
def test_replay_arbitrary_json_events(backend: str, events: list[tuple[str, Any]]) -> None:
    body = fuzz.encode_events([(name, fuzz.dumps(v).decode()) for name, v in events])
    fuzz.check_replay(backend, body, [body[i : i + 7] for i in range(0, len(body), 7)])


# -- error classification ------------------------------------------------------------------


@budget
@given(
    st.integers(-1000, 10**6),
    st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=6),
    st.binary(max_size=400),
)
def test_classify_http_error_arbitrary(
    status: int, headers: list[tuple[str, str]], body: bytes
) -> None:
    fuzz.check_http_error(status, headers, body)


@budget
@given(st.randoms(use_true_random=False))
def test_classify_http_error_structured(rng: random.Random) -> None:
    fuzz.check_http_error(*fuzz.gen_http_error(rng, fuzz.Seeds.load()))


@budget
@given(json_objects)
def test_classify_stream_error_arbitrary(payload: dict[str, Any]) -> None:
    fuzz.check_stream_error(payload)


@budget
@given(st.randoms(use_true_random=False))
def test_classify_stream_error_structured(rng: random.Random) -> None:
    fuzz.check_stream_error(fuzz.gen_stream_error(rng, fuzz.Seeds.load()))


# -- parse_request -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@budget
@given(rng=st.randoms(use_true_random=False))
def test_parse_request_structured(backend: str, rng: random.Random) -> None:
    fuzz.check_parse_request(backend, fuzz.gen_parse_body(rng, fuzz.Seeds.load(), backend))


@pytest.mark.parametrize("backend", BACKENDS)
@budget
@given(body=st.binary(max_size=300) | json_values.map(fuzz.dumps) | json_objects)
def test_parse_request_arbitrary(backend: str, body: bytes | dict[str, Any]) -> None:
    fuzz.check_parse_request(backend, body)
