"""The load generator's pieces: length distributions, workloads, mergeable histograms."""

from __future__ import annotations

import collections
import itertools
import math
import random
from pathlib import Path

import orjson
import pytest

from trio_sampler import Assistant, System, User
from trio_sampler.loadtest import (
    Concurrency,
    DatasetError,
    DatasetWorkload,
    Fixed,
    Histogram,
    LatencyHistogram,
    Limits,
    Normal,
    Rate,
    StageStats,
    SyntheticWorkload,
    Uniform,
    parse_length,
)
from trio_sampler.loadtest._stats import counter_percentile


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("256", Fixed(256)),
        ("uniform:64:512", Uniform(64, 512)),
        ("normal:300:80", Normal(300.0, 80.0)),
        ("histogram:128=0.5,1024=0.5", Histogram([(128, 0.5), (1024, 0.5)])),
    ],
)
def test_parse_length(spec: str, expected: object) -> None:
    assert parse_length(spec) == expected
    assert parse_length(spec).describe() == spec


@pytest.mark.parametrize("spec", ["", "zero", "uniform:5", "normal:a:b", "histogram:", "poisson:3"])
def test_bad_length_specs_say_what_to_write(spec: str) -> None:
    with pytest.raises(ValueError, match="uniform:LOW:HIGH"):
        parse_length(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("0", "must"), ("uniform:9:3", "at least low"), ("histogram:5=0", "not all be zero")],
)
def test_invalid_lengths_are_rejected(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_length(spec)


def test_distributions_stay_in_range_and_follow_their_shape() -> None:
    rng = random.Random(1)
    uniform = [Uniform(10, 20).sample(rng) for _ in range(2000)]
    assert min(uniform) == 10 and max(uniform) == 20
    normal = [Normal(100, 10).sample(rng) for _ in range(5000)]
    assert sum(normal) / len(normal) == pytest.approx(100, abs=1)
    clipped = [Normal(5, 50, low=3, high=9).sample(rng) for _ in range(500)]
    assert min(clipped) >= 3 and max(clipped) <= 9
    weights = [Histogram([(1, 3.0), (2, 1.0)]).sample(rng) for _ in range(4000)]
    assert weights.count(1) / len(weights) == pytest.approx(0.75, abs=0.03)


def test_synthetic_prompts_have_the_planned_length_and_share_prefixes() -> None:
    workload = SyntheticWorkload(Fixed(50), Fixed(7), prefix_tokens=20, prefix_groups=2)
    items = workload.items(random.Random(3))
    drawn = [next(items) for _ in range(40)]
    prompts = [item.request.items[-1] for item in drawn]
    assert all(isinstance(p, User) and len(p.text.split()) == 50 for p in prompts)
    assert {item.request.max_output_tokens for item in drawn} == {7}
    prefixes = {" ".join(p.text.split()[:20]) for p in prompts if isinstance(p, User)}
    suffixes = {" ".join(p.text.split()[20:]) for p in prompts if isinstance(p, User)}
    assert len(prefixes) == 2  # two groups, shared across requests
    assert len(suffixes) == 40  # the rest is each request's own


def test_without_prefix_sharing_prompts_differ_from_the_start() -> None:
    items = SyntheticWorkload(Fixed(30), None).items(random.Random(4))
    prompts = [next(items).request.items[0] for _ in range(30)]
    firsts = {tuple(p.text.split()[:5]) for p in prompts if isinstance(p, User)}
    assert len(firsts) == 30


def _write(path: Path, *records: object) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n\n")
    return path


def test_dataset_shapes(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "d.jsonl",
        {"prompt": "p" * 40},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]},
        {
            "conversations": [
                {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "hello"},
                {"from": "human", "value": "more"},
                {"from": "gpt", "value": "y" * 80},
            ],
            "id": "ignored",
        },
    )
    prompt, messages, sharegpt = DatasetWorkload(path).load()
    assert prompt.request.items == (User("p" * 40),) and prompt.input_tokens == 10
    assert prompt.output_tokens is None
    assert messages.request.items == (System("be brief"), User("q"))
    # The last recorded reply is not sent; its length is the output budget.
    assert sharegpt.request.items == (User("hi"), Assistant("hello"), User("more"))
    assert sharegpt.request.max_output_tokens == 20


def test_dataset_output_override_and_cycle(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", {"prompt": "a"}, {"prompt": "b"})
    items = DatasetWorkload(path, output_tokens=Fixed(9)).items(random.Random(0))
    drawn = [next(items) for _ in range(6)]
    assert {i.request.max_output_tokens for i in drawn} == {9}
    texts = [i.request.items[0].text for i in drawn]  # type: ignore[union-attr]
    assert sorted(texts[:2]) == ["a", "b"] and texts[:2] == texts[2:4]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{nope", "d.jsonl:1: not JSON"),
        (b"[1]", "JSON object"),
        (b'{"text": "x"}', "expected a 'prompt', 'messages' or 'conversations'"),
        (b'{"messages": []}', "non-empty list"),
        (b'{"messages": [{"role": "robot", "content": "x"}]}', "role must be one of"),
        (b'{"conversations": [{"from": "gpt", "value": "x"}]}', "no user turn"),
        (b'{"prompt": "x", "output_tokens": 0}', "positive integer"),
    ],
)
def test_dataset_errors_name_the_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(DatasetError, match=message):
        DatasetWorkload(path).load()


def test_empty_dataset_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DatasetError, match="no conversations"):
        DatasetWorkload(path).load()


def test_merged_percentiles_are_those_of_all_values_not_averages() -> None:
    fast, slow, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    fast_values = [1000 + i for i in range(900)]
    slow_values = [50_000 + 10 * i for i in range(100)]
    fast.record_many(fast_values)
    slow.record_many(slow_values)
    both.record_many(fast_values + slow_values)
    merged = LatencyHistogram()
    merged.merge(fast)
    merged.merge(slow)
    for p in (50.0, 90.0, 95.0, 99.0):
        assert merged.value_at(p) == both.value_at(p)
    exact_p95 = sorted(fast_values + slow_values)[949]
    assert merged.value_at(95.0) == pytest.approx(exact_p95, rel=0.001)
    averaged = (fast.value_at(95.0) + slow.value_at(95.0)) / 2
    assert abs(averaged - exact_p95) > 10_000  # what averaging would have reported


def test_histogram_encoding_round_trips_and_merges_across_processes() -> None:
    stats = StageStats()
    stats.histograms["ttft"].record_many([120_000, 121_000, 119_500])
    stats.started = stats.completed = 3
    stats.error("overloaded", "HTTP 529: Overloaded")
    stats.window(10.0, 12.5)
    stats.window_start, stats.window_end = 10.0, 12.0
    stats.in_window(30, 40)
    stats.client.append((0.5, 2.5, 1 << 20, 0.25))
    stats.second(0).sent = 3
    stats.second(0).ttft.update([120_000, 121_000])
    other = StageStats.from_wire(
        orjson.loads(orjson.dumps(stats.to_wire(), option=orjson.OPT_NON_STR_KEYS))
    )
    other.window(9.0, 11.0)
    other.window_start, other.window_end = 9.5, 11.5
    stats.merge(other)
    assert stats.histograms["ttft"].count == 6
    assert stats.completed == 6 and stats.errors == {"overloaded": 2}
    assert stats.duration == pytest.approx(3.5)
    # The workers' measured windows make one, their completions in it add up.
    assert stats.window_s == pytest.approx(2.5)
    assert (stats.window_completed, stats.window_output_tokens) == (2, 80)
    assert stats.error_examples == {"overloaded": "HTTP 529: Overloaded"}
    assert len(stats.client) == 2
    [row] = stats.timeline_rows()
    assert row["sent"] == 6 and row["ttft_p50_ms"] == pytest.approx(120, rel=0.001)


def test_histogram_summary_and_cdf() -> None:
    histogram = LatencyHistogram()
    histogram.record_many(list(range(1000, 101_000, 1000)))
    summary = histogram.summary(0.001)
    assert summary["count"] == 100
    assert summary["p50"] == pytest.approx(50, rel=0.001)
    assert summary["max"] == pytest.approx(100, rel=0.001)
    cdf = histogram.cdf()
    assert cdf[-1][1] == 1.0
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(cdf))
    assert LatencyHistogram().summary(0.001)["p50"] is None


def test_shares_split_the_load_over_workers() -> None:
    assert [Concurrency(10).share(i, 4) for i in range(4)] == [
        Concurrency(3),
        Concurrency(3),
        Concurrency(2),
        Concurrency(2),
    ]
    assert Concurrency(1).share(1, 2) is None
    # A ramp stays one ramp: worker w starts the streams w, w + workers, ... of the whole.
    ramped = Concurrency(10, ramp_s=5.0)
    starts = sorted(
        share.start_offset(j)
        for share in (ramped.share(i, 4) for i in range(4))
        if share is not None
        for j in range(share.streams)
    )
    assert starts == pytest.approx([0.5 * k for k in range(10)])
    assert [ramped.start_offset(k) for k in range(3)] == pytest.approx([0, 0.5, 1.0])
    shares = [Rate(30, "constant").share(i, 3) for i in range(3)]
    assert {s.per_second for s in shares} == {10}
    assert [s.phase for s in shares] == pytest.approx([0, 1 / 30, 2 / 30])
    limits = Limits(duration_s=None, requests=5)
    parts = [limits.share(i, 3) for i in range(3)]
    assert [p.requests for p in parts if p is not None] == [2, 2, 1]
    assert Limits(duration_s=None, requests=1).share(1, 2) is None


@pytest.mark.parametrize("ramp", [-1.0, math.inf, math.nan])
def test_a_ramp_is_a_finite_number_of_seconds(ramp: float) -> None:
    with pytest.raises(ValueError, match="ramp_s must be a finite number of seconds"):
        Concurrency(4, ramp_s=ramp)


def test_limits_need_a_stop() -> None:
    with pytest.raises(ValueError, match="duration_s or a requests limit"):
        Limits(duration_s=None)
    with pytest.raises(ValueError, match="positive"):
        Limits(duration_s=0)


def test_recorded_values_keep_three_significant_digits_and_an_exact_mean() -> None:
    rng = random.Random(5)
    values = [rng.randint(1, 5_000_000) for _ in range(5000)]
    histogram = LatencyHistogram()
    histogram.record_many(values)
    ordered = sorted(values)
    for p in (50.0, 90.0, 99.0):
        exact = ordered[math.ceil(p / 100 * len(ordered)) - 1]
        assert histogram.value_at(p) == pytest.approx(exact, rel=0.001)
    assert histogram.summary(1.0)["mean"] == pytest.approx(sum(values) / len(values))


def test_live_percentiles_agree_with_the_histogram() -> None:
    rng = random.Random(6)
    histogram = LatencyHistogram()
    histogram.record_many([rng.randint(100, 900_000) for _ in range(3000)])
    live = collections.Counter(histogram.unflushed())
    for p in (50.0, 99.0, 100.0):
        assert counter_percentile(live, p) == pytest.approx(histogram.value_at(p), rel=0.001)
    assert counter_percentile(collections.Counter(), 50.0) is None
