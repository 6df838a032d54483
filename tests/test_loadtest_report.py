"""What a reader of a load test's results sees: the tables at 80 and 60 columns, the HTML
report, ``compare``'s pairing of stages, the test in words."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from trio_sampler import SamplerConfig
from trio_sampler.cli import main
from trio_sampler.loadtest import (
    SLO,
    Concurrency,
    DatasetWorkload,
    Fixed,
    Histogram,
    Limits,
    LoadTest,
    LoadTestResult,
    Progress,
    Rate,
    StageStats,
    SyntheticWorkload,
    Uniform,
)
from trio_sampler.loadtest._display import live_table, pair_stages, summary_table
from trio_sampler.loadtest._late import late_reads, late_words
from trio_sampler.loadtest._report import render_report
from trio_sampler.loadtest._run import build_result
from trio_sampler.loadtest._words import limits_words, slo_words, workload_words

CONFIG = SamplerConfig(base_url="http://127.0.0.1:8000/v1", model="some-model-name")


def _stats(scale: int, *, lag_us: int = 200, failed: int = 0) -> StageStats:
    """A stage's statistics with wide numbers: every column at its widest."""
    stats = StageStats()
    widest = {"ttft": 12_345_678, "itl": 23_456, "tpot": 23_456, "e2e": 99_999_000}
    for name, value in widest.items():
        stats.histograms[name].record_many([value // 2, value, value * 2])
    stats.histograms["loop_lag"].record_many([lag_us] * 100)
    stats.histograms["send_lag"].record_many([30, 40])
    stats.histograms["ttft_from_schedule"].record_many([12_345_700])
    stats.histograms["e2e_from_schedule"].record_many([99_999_100])
    stats.started = stats.completed = 12_345 * scale
    stats.good = stats.completed // 2
    stats.output_tokens = stats.input_tokens = 9_876_543 * scale
    stats.output_from_server = stats.input_from_server = stats.completed
    for _ in range(failed):
        stats.error("overloaded", "HTTP 529: the server is overloaded, try again later")
    stats.window_start, stats.window_end = 100.0, 130.0
    stats.window(100.0, 131.0)
    stats.in_window(9_876_543 * scale, 9_876_543 * scale)
    stats.window_completed = 12_345 * scale
    stats.client.append((10.0, 31.0, 1 << 30, 20.0))
    return stats


def _result(stages: list[Concurrency | Rate] | None = None, lag_us: int = 200) -> LoadTestResult:
    stages = stages or [Concurrency(1), Concurrency(1000)]
    test = LoadTest(
        CONFIG,
        stages,
        SyntheticWorkload(Uniform(100, 300), Fixed(128), prefix_tokens=50, prefix_groups=4),
        Limits(duration_s=30, warmup_s=5),
        slo=SLO(ttft_ms=500, tpot_ms=50),
    )
    merged = [_stats(10**i, lag_us=lag_us, failed=3) for i in range(len(stages))]
    return build_result(test, merged, [1.5, 1.25, 0.75])


def _render(renderable: object, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_results_table_reads_whole_at_80_columns() -> None:
    result = _result([Concurrency(1), Concurrency(1000), Rate(2500.5)], lag_us=50_000)
    text = _render(summary_table(result), 80)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for header in ("p50", "p90", "p95", "p99", "goodput/s"):
        assert header in text
    # The numbers whole, the goodput's objectives and the tokens' source stated.
    assert "24,707" in text and "46.9" in text  # ms: a decimal below 10 s
    assert "goodput counts the completed requests with TTFT ≤ 500 ms and TPOT ≤ 50 ms" in text
    assert "C=1000: tokens from the server's usage" in text
    # An open loop's latency from the schedule and pacing error beside the latency.
    assert "TTFT sched" in text and "pacing err" in text
    # Why the client was bound, in words.
    assert "C=1: client-bound: event-loop lag p99 50.0 ms" in text
    # Late wake-ups while using little CPU: the process waited for one (the run queue).
    words = " ".join(text.split())
    assert "using only 32% of a core and waiting for a CPU 65% of the time" in words


def test_the_live_table_reads_whole_at_60_columns() -> None:
    progress = Progress(
        measuring=True, sent=1_234_567, finished=1_234_000, failed=12_345, in_flight=1000,
        output_tokens=987_654_321, stats=_stats(1),
    )  # fmt: skip
    text = _render(live_table("stage 2/3: C=1000", [progress, progress], 12_345.6), 60)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 60
    assert "2,469,134" in text and "1,975,308,642" in text  # sent, output tokens


def test_the_html_report_says_what_ran_where_and_why_the_client_was_bound() -> None:
    page = render_report([("run", _result(lag_us=50_000))])
    text = re.sub(r"<svg.*?</svg>", "", page, flags=re.S)
    # The workload in words, not a Python dict; the machine; the goodput's objectives.
    assert "synthetic prompts of 100 to 300 (uniform) input tokens" in text
    assert "{'" not in text and "{&#x27;" not in text
    assert "cores" in text and "1.50 / 1.25 / 0.75 before" in text
    assert "goodput counts the completed requests with TTFT ≤ 500 ms" in text
    # p90 and p95, the errors by kind, the reasons in plain text (not a tooltip).
    assert "<th>p90</th>" in text and "<th>p95</th>" in text
    assert "HTTP 529: the server is overloaded" in text and ">overloaded<" in text
    assert (
        "client-bound</span> (busiest worker 32% of a core, event-loop lag p99 50.0 ms): "
        "event-loop lag p99 50.0 ms (bound: 10 ms)" in text
    )
    assert "title=" not in text
    # Plots scale to the page.
    assert page.count("<svg") == 3 and "figure svg { max-width: 100%" in page


def test_compare_pairs_stages_by_load_and_warns_about_the_rest() -> None:
    a = _result([Concurrency(1), Concurrency(2)])
    b = _result([Concurrency(2), Concurrency(4)])
    pairs, warnings = pair_stages(a, b, ("a", "b"))
    assert [(x.label, y.label) for x, y in pairs] == [("C=2", "C=2")]
    assert warnings == [
        "a C=1 has no stage at that load in b",
        "b C=4 has no stage at that load in a",
    ]
    same, none = pair_stages(a, a, ("a", "a2"))
    assert len(same) == 2 and none == []
    # Settings that differ are said in words.
    other = _result([Concurrency(1)])
    other = LoadTestResult(
        test={**other.test, "limits": Limits(duration_s=60).describe()}, stages=other.stages
    )
    _, [warning] = pair_stages(_result([Concurrency(1)]), other, ("a", "b"))
    assert warning == (
        "the runs' limits differ: each stage: a warm-up of 5 s not measured, then measured "
        "for 30 s, then up to 60 s for the requests in flight / each stage: measured for "
        "60 s, then up to 60 s for the requests in flight"
    )


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        (SyntheticWorkload(Fixed(256), Fixed(128)), "synthetic prompts of 256 input tokens, "
         "output tokens 128 at most"),
        (SyntheticWorkload(Fixed(8), Histogram([(128, 1), (1024, 3)]), prefix_tokens=64),
         "output tokens one of 128 (25%), 1,024 (75%) at most; all start with the same "
         "64-token prefix"),
    ],
)  # fmt: skip
def test_workloads_in_words(workload: SyntheticWorkload, words: str) -> None:
    assert workload_words(workload.describe()).endswith(words.split("synthetic prompts of ")[-1])
    assert "{" not in workload_words(workload.describe())


def test_a_dataset_limits_and_slos_in_words(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    described = DatasetWorkload(path, limit=500).describe()
    assert workload_words(described) == (
        "the first 500 conversations of the dataset chats.jsonl, output tokens the "
        "dataset's own at most"
    )
    limits = Limits(duration_s=30, requests=500, warmup_s=5, warmup_requests=10)
    assert limits_words(limits.describe()) == (
        "each stage: a warm-up of 5 s and 10 requests not measured, then measured for 30 s "
        "or 500 requests (whichever comes first), then up to 60 s for the requests in flight"
    )
    assert slo_words({}).startswith("no SLO given")


def test_compare_from_the_command_line_warns_on_stderr_and_pairs_by_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    _result([Concurrency(1), Concurrency(2)]).write_json(before)
    _result([Concurrency(2), Concurrency(4)]).write_json(after)
    page = tmp_path / "compare.html"
    assert main(["loadtest", "compare", str(before), str(after), "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "trio-sampler loadtest: warning: before C=1 has no stage at that load in after",
        "trio-sampler loadtest: warning: after C=4 has no stage at that load in before",
    ]
    assert "C=2" in out and "C=1 " not in out and "C=4" not in out
    assert "Warning: before C=1 has no stage at that load in after" in page.read_text()
    # Nothing in common: nothing to compare.
    _result([Concurrency(8)]).write_json(after)
    assert main(["loadtest", "compare", str(before), str(after)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "trio-sampler loadtest: before and after have no stage at the same load to compare"
    )


@pytest.mark.parametrize(
    ("lag_max_ms", "itl_shared", "ttft_shared", "affected"),
    [
        # The loop never late by a whole interval: every read stamped right.
        (150.0, 0.02, 0.02, None),
        # Late by more, but no read carried two tokens: nothing moved.
        (450.0, 0.0, 0.0, None),
        # 2 % of the gaps: p99 and max; 0.5 % of the first tokens: the max alone.
        (450.0, 0.02, 0.005, {"ttft": ["max"], "itl": ["p99", "max"]}),
        # 12 % of the gaps reach p90.
        (200.0, 0.12, 0.0, {"ttft": [], "itl": ["p90", "p95", "p99", "max"]}),
    ],
)
def test_late_reads_mark_the_percentiles_their_share_reaches(
    lag_max_ms: float, itl_shared: float, ttft_shared: float, affected: object
) -> None:
    late = late_reads(
        interval_ms=200.0,
        lag_p99_ms=lag_max_ms / 2,
        lag_max_ms=lag_max_ms,
        itl_shared=itl_shared,
        ttft_shared=ttft_shared,
        floor_ms=10.0,
    )
    assert (None if late is None else late["affected"]) == affected
    if late is not None:
        assert late["late_by_max_ms"] == lag_max_ms
        assert late["too_high_by_up_to_ms"] == 200.0


def test_a_loop_held_just_short_of_an_interval_by_the_probe_is_late() -> None:
    # The probe sleeps 10 ms at a time: a loop held from just after one sleep began
    # shows 10 ms less lag than the reads waited.
    def late(resolution_ms: float) -> dict[str, Any] | None:
        return late_reads(
            interval_ms=200.0, lag_p99_ms=150.0, lag_max_ms=191.0, itl_shared=0.001,
            ttft_shared=0.0, floor_ms=10.0, resolution_ms=resolution_ms,
        )  # fmt: skip

    assert late(0.0) is None
    marked = late(10.0)
    assert marked is not None and marked["affected"] == {"ttft": [], "itl": ["max"]}
    assert marked["probe_resolution_ms"] == 10.0


def test_tokens_sent_together_are_not_late_reads() -> None:
    # An interval of about 0 (every token in one write): a loop late by less than the
    # lag bound kept up.
    kept_up = late_reads(
        interval_ms=0.001, lag_p99_ms=2.0, lag_max_ms=5.0, itl_shared=1.0, ttft_shared=1.0,
        floor_ms=10.0,
    )  # fmt: skip
    assert kept_up is None
    behind = late_reads(
        interval_ms=0.001, lag_p99_ms=20.0, lag_max_ms=50.0, itl_shared=1.0, ttft_shared=1.0,
        floor_ms=10.0,
    )  # fmt: skip
    assert behind is not None and behind["affected"]["itl"] == ["p50", "p90", "p95", "p99", "max"]


def _late_stage(lag_ms: int) -> StageStats:
    """1,000 requests of 16 tokens 200 ms apart (TTFT 250 ms) whose client read 2 % of
    the tokens one interval late: each such read carried the next token too and was
    stamped with its arrival, the gap before it 400 ms and the one inside it 0; 15 of
    the first tokens came with the second (TTFT 450 ms). The event loop was ``lag_ms``
    late at the most."""
    stats = StageStats()
    gaps = 15_000
    late = gaps // 50
    stats.histograms["itl"].record_many([200_000] * (gaps - 2 * late) + [400_000, 0] * late)
    stats.histograms["ttft"].record_many([250_000] * 985 + [450_000] * 15)
    stats.histograms["e2e"].record_many([3_250_000] * 1000)
    stats.histograms["loop_lag"].record_many([500] * 990 + [lag_ms * 1000] * 10)
    stats.shared_read_gaps = late
    stats.shared_first_reads = 15
    stats.started = stats.completed = 1000
    stats.window_start, stats.window_end = 100.0, 110.0
    stats.window(100.0, 113.25)
    stats.client.append((8.0, 13.25, 1 << 28, 0.0))
    return stats


def _late_result(lag_ms: int, ramp_s: float = 0.0) -> LoadTestResult:
    stage = Concurrency(1000, ramp_s=ramp_s)
    test = LoadTest(CONFIG, [stage], SyntheticWorkload(Fixed(64), Fixed(16)))
    return build_result(test, [_late_stage(lag_ms)])


def test_a_client_that_fell_behind_marks_the_percentiles_it_made_too_high() -> None:
    result = _late_result(lag_ms=380)
    [stage] = result.stages
    late = stage.summary["late_reads"]
    assert late["affected"] == {"ttft": ["p99", "max"], "itl": ["p99", "max"]}
    assert late["late_by_max_ms"] == pytest.approx(380, rel=0.001)
    assert late["interval_ms"] == pytest.approx(200, rel=0.001)
    assert late["itl_shared_fraction"] == pytest.approx(0.02)
    assert late["ttft_shared_fraction"] == pytest.approx(0.015)
    # It is a reason the client was bound, with by how much.
    assert stage.client_bound
    reasons = stage.summary["client"]["reasons"]
    assert any(reason.startswith("reads late by up to 380.2 ms") for reason in reasons)
    # The table marks exactly those cells and says why, and by how much.
    text = _render(summary_table(result), 80)
    words = " ".join(text.split())
    ttft_row = next(line for line in text.splitlines() if " TTFT " in line)
    itl_row = next(line for line in text.splitlines() if " ITL " in line)
    # (A percentile is the top of its histogram bucket: 250.1 for 250.)
    assert ttft_row.split()[-5:] == ["250.1", "250.1", "250.1", "450.0*", "450.0*"]
    assert itl_row.split()[-5:] == ["200.1", "200.1", "200.1", "400.1*", "400.1*"]
    assert "*" not in next(line for line in text.splitlines() if " E2E " in line)
    assert "the client fell behind: its event loop was up to 380.2 ms late" in words
    assert "(TTFT p99, max; ITL p99, max) may be up to one interval (200.1 ms) too high" in words
    # Started together (no ramp), the streams stay in step: the remedy is said.
    assert late["streams_started_together"] is True
    assert "start them over about one request's duration (--ramp)" in words
    # The HTML report too, and the document keeps it.
    page = render_report([("run", result)])
    assert "<td>450.0*</td>" in page and "<td>250.1</td>" in page
    assert "the client fell behind: its event loop was up to 380.2 ms late" in page
    again = LoadTestResult.from_json(result.to_json())
    assert again.stages[0].summary["late_reads"] == late


def test_a_client_that_kept_up_marks_nothing() -> None:
    # The same reads two tokens at a time, with the loop never late by an interval: the
    # server sent them together, and that is what arrived.
    [stage] = _late_result(lag_ms=120).stages
    assert stage.summary["late_reads"] is None
    text = _render(summary_table(_late_result(lag_ms=120)), 80)
    assert "*" not in text and "fell behind" not in text


def test_streams_spread_by_a_ramp_are_not_told_to_ramp() -> None:
    [stage] = _late_result(lag_ms=380, ramp_s=3.25).stages
    late = stage.summary["late_reads"]
    assert late["streams_started_together"] is False
    assert "--ramp" not in late_words(stage.summary)
    assert late_words(stage.summary).endswith("use more workers, or fewer streams")
