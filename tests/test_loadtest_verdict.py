"""Pass or fail for CI: the ``--fail-if`` thresholds and a stage where every request failed."""

from __future__ import annotations

from typing import Any

import pytest

from trio_sampler.loadtest import LoadTestResult, StageResult, Threshold, verdict


def _stage(label: str = "C=8", **changes: Any) -> StageResult:
    latency = {
        metric: {"count": 10, "p50": 100.0, "p90": 150.0, "p95": 200.0, "p99": 600.0,
                 "max": 900.0, "mean": 120.0}
        for metric in ("ttft", "itl", "tpot", "e2e")
    }  # fmt: skip
    summary: dict[str, Any] = {
        "label": label,
        "requests": {"completed": 98, "failed": 2, "errors": {"overloaded": 2}},
        "throughput": {"requests_per_s": 12.5, "output_tokens_per_s": 1600.0},
        "goodput": {"requests_per_s": 11.0, "fraction": 0.9},
        "latency_ms": latency,
    }
    summary.update(changes)
    return StageResult(summary)


def _result(*stages: StageResult) -> LoadTestResult:
    return LoadTestResult(test={}, stages=stages)


@pytest.mark.parametrize(
    ("text", "metric", "op", "value"),
    [
        ("ttft.p99>500ms", "ttft.p99", ">", 500.0),
        ("itl.p95 > 50ms", "itl.p95", ">", 50.0),
        ("e2e.max>=30s", "e2e.max", ">=", 30_000.0),
        ("error_rate>1%", "error_rate", ">", 0.01),
        ("goodput<95%", "goodput", "<", 0.95),
        ("throughput<20", "throughput", "<", 20.0),
        ("output_tps<1000", "output_tps", "<", 1000.0),
    ],
)
def test_thresholds_parse(text: str, metric: str, op: str, value: float) -> None:
    threshold = Threshold.parse(text)
    assert (threshold.metric, threshold.op) == (metric, op)
    assert threshold.value == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft", "write METRIC>VALUE, e.g. ttft.p99>500ms"),
        ("ttft.p42>5ms", "with a statistic (p50, p90, p95, p99, max, mean)"),
        ("ttft.p99>500", "give the time in ms or s"),
        ("latency>5ms", "unknown metric 'latency'"),
        ("error_rate>0.01", "write error_rate as in error_rate>1%"),
        ("throughput<20%", "write throughput as in throughput<20"),
    ],
)
def test_bad_thresholds_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--fail-if") as error:
        Threshold.parse(text)
    assert message in str(error.value)


def test_a_threshold_crossed_is_one_line_naming_stage_value_and_condition() -> None:
    thresholds = [Threshold.parse(t) for t in ("ttft.p99>500ms", "error_rate>1%", "itl.p50>200ms")]
    assert verdict(_result(_stage("C=1"), _stage("C=8")), thresholds) == [
        "C=1: ttft.p99 600.0 ms (ttft.p99>500ms)",
        "C=1: error_rate 2.00% (error_rate>1%)",
        "C=8: ttft.p99 600.0 ms (ttft.p99>500ms)",
        "C=8: error_rate 2.00% (error_rate>1%)",
    ]
    assert verdict(_result(_stage()), [Threshold.parse("goodput<85%")]) == []
    assert verdict(_result(_stage()), [Threshold.parse("goodput<95%")]) == [
        "C=8: goodput 90.00% (goodput<95%)"
    ]


def test_a_stage_where_every_request_failed_fails_without_thresholds() -> None:
    dead = _stage("C=4", requests={"completed": 0, "failed": 944, "errors": {"transport": 944}})
    assert verdict(_result(_stage("C=1"), dead)) == ["C=4: every request failed (transport 944)"]
    assert verdict(_result(_stage())) == []


def test_a_metric_the_stage_has_no_value_for_does_not_fail_it() -> None:
    stage = _stage(goodput=None)
    assert verdict(_result(stage), [Threshold.parse("goodput<95%")]) == []
