"""The live progress display and the printed summary tables (``rich``)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ._late import MARK, late_words, marked
from ._results import LoadTestResult, StageResult
from ._runner import Progress
from ._stats import counter_percentile
from ._words import limits_words, shared_read_words, slo_words, tokens_words, workload_words

__all__ = [
    "LiveDisplay",
    "compare_table",
    "errors_table",
    "live_table",
    "pair_stages",
    "summary_table",
]


def _ms(value: float | None) -> str:
    """Milliseconds: a decimal below 10 s (a tenth of a ms matters there), none above."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 10_000 else f"{value:,.0f}"


class LiveDisplay:
    """Current rate, in-flight requests and the percentiles so far, redrawn in place.

    On a terminal it is a ``rich`` live table; otherwise one line per stage change, so a
    log stays readable.
    """

    def __init__(self, console: Console, stages: Sequence[str]) -> None:
        self.console = console
        self.stages = list(stages)
        self.live: Live | None = None
        self._last: tuple[float, int] | None = None
        self._stage = -1

    def __enter__(self) -> LiveDisplay:
        if self.console.is_terminal:
            self.live = Live(console=self.console, auto_refresh=False, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, stage: int, workers: list[Progress]) -> None:
        finished = sum(p.finished for p in workers)
        now = time.monotonic()
        if self._stage != stage:
            self._stage = stage
            self._last = None
            if self.live is None:
                label = self.stages[stage] if stage < len(self.stages) else "?"
                self.console.print(f"stage {stage + 1}/{len(self.stages)}: {label}")
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = (finished - self._last[1]) / (now - self._last[0])
        self._last = (now, finished)
        if self.live is None:
            return
        table = live_table(
            f"stage {stage + 1}/{len(self.stages)}: {self.stages[stage]}", workers, rate
        )
        self.live.update(table, refresh=True)


def live_table(title: str, workers: Sequence[Progress], rate: float) -> Table:
    """The running stage: label and value pairs, two a row, so it fits 60 columns."""
    live: dict[str, collections.Counter[int]] = {
        "ttft": collections.Counter(),
        "itl": collections.Counter(),
    }
    for progress in workers:
        if progress.stats is not None:
            for name, counts in live.items():
                counts.update(progress.stats.histograms[name].unflushed())
    sent = sum(p.sent for p in workers)
    finished = sum(p.finished for p in workers)
    table = Table(title=title, box=box.SIMPLE, show_header=False)
    for justify in ("left", "right", "left", "right"):
        table.add_column(justify=justify)
    phase = "measuring" if any(p.measuring for p in workers) else "warm-up"
    table.add_row("phase", phase, "req/s", f"{rate:,.1f}")
    table.add_row("sent", f"{sent:,}", "done", f"{finished:,}")
    table.add_row(
        "in flight",
        f"{sum(p.in_flight for p in workers):,}",
        "failed",
        f"{sum(p.failed for p in workers):,}",
    )
    table.add_row("TTFT p50 ms", _live_ms(live["ttft"], 50), "p99", _live_ms(live["ttft"], 99))
    table.add_row("ITL p50 ms", _live_ms(live["itl"], 50), "p99", _live_ms(live["itl"], 99))
    table.add_row("out tokens", f"{sum(p.output_tokens for p in workers):,}", "", "")
    return table


def _live_ms(counts: collections.Counter[int], percentile: float) -> str:
    value = counter_percentile(counts, percentile)
    return _ms(None if value is None else value / 1000)


#: The latency statistics printed, and the metrics.
STATISTICS = ("p50", "p90", "p95", "p99", "max")
METRICS = ("ttft", "itl", "tpot", "e2e")


def _rates_row(stage: StageResult) -> list[str]:
    summary = stage.summary
    requests = summary["requests"]
    throughput = summary["throughput"]
    goodput = summary["goodput"]
    return [
        stage.label,
        f"{requests['completed']:,}",
        f"{requests['failed'] + requests['unfinished'] + requests['dropped']:,}",
        f"{throughput['requests_per_s']:,.1f}",
        f"{throughput['output_tokens_per_s']:,.0f}",
        "-" if goodput is None else f"{goodput['requests_per_s']:,.1f}",
        "BOUND" if stage.client_bound else "ok",
    ]


#: An open loop's extra rows: latency from each arrival's schedule, and how late it was sent.
_OPEN_LOOP_ROWS = (
    ("TTFT sched", "ttft_from_schedule_ms"),
    ("E2E sched", "e2e_from_schedule_ms"),
    ("pacing err", "pacing_error_ms"),
)


def _latency_rows(stage: StageResult) -> list[tuple[str, Mapping[str, float | None]]]:
    rows = [(metric.upper(), stage.summary["latency_ms"][metric]) for metric in METRICS]
    open_loop = stage.summary.get("open_loop")
    if open_loop:
        rows += [(name, open_loop[key]) for name, key in _OPEN_LOOP_ROWS]
    return rows


def summary_table(result: LoadTestResult) -> Group:
    """Two tables, each within 80 columns: per stage, the counts, throughput, goodput and
    whether the client kept up; then per stage and metric, the percentiles (ms). Under
    them, the goodput objectives and where the token counts came from."""
    target = result.test.get("target", {})
    rates = Table(
        title=f"{target.get('model')} at {target.get('base_url')}", box=box.SIMPLE, pad_edge=False
    )
    for header in ("load", "done", "errors", "req/s", "out tok/s", "goodput/s", "client"):
        rates.add_column(header, justify="right")
    latency = Table(title="latency (ms)", box=box.SIMPLE, pad_edge=False)
    for header in ("load", "metric", *STATISTICS):
        latency.add_column(header, justify="left" if header == "metric" else "right", no_wrap=True)
    notes = [slo_words(result.test.get("slo") or {})]
    for stage in result.stages:
        rates.add_row(*_rates_row(stage))
        for index, (name, values) in enumerate(_latency_rows(stage)):
            cells = [
                _ms(values[statistic])
                + (MARK if marked(stage.summary, name.lower(), statistic) else "")
                for statistic in STATISTICS
            ]
            latency.add_row(stage.label if index == 0 else "", name, *cells)
        latency.add_section()
        notes.append(f"{stage.label}: tokens from {tokens_words(stage.summary['tokens'])}")
        shared = shared_read_words(stage.summary)
        if shared:
            notes.append(f"{stage.label}: {shared}")
        late = late_words(stage.summary)
        if late:
            notes.append(f"{stage.label}: {MARK} {late}")
        notes += [f"{stage.label}: client-bound: {r}" for r in stage.summary["client"]["reasons"]]
    return Group(rates, latency, *(Text(note) for note in notes))


def errors_table(result: LoadTestResult) -> Table | None:
    """The failed requests of each stage by kind, with the first message of each kind;
    ``None`` when no request failed."""
    table = Table(title="errors")
    for header, justify in (("load", "right"), ("kind", "left"), ("count", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    table.add_column("first message", overflow="fold")
    for stage in result.stages:
        requests = stage.summary["requests"]
        examples = requests.get("error_examples", {})
        for kind, count in requests["errors"].items():
            table.add_row(stage.label, kind, f"{count:,}", examples.get(kind, ""))
    return table if table.row_count else None


def _load_key(stage: StageResult) -> tuple[str, float]:
    load = stage.load
    return (
        load["kind"],
        float(load["streams"] if load["kind"] == "concurrency" else load["per_second"]),
    )


def _target_words(target: Mapping[str, Any]) -> str:
    extra = f", extra body {dict(target['extra_body'])}" if target.get("extra_body") else ""
    return f"{target.get('model')} at {target.get('base_url')} ({target.get('backend')}){extra}"


def _load_words(load: Mapping[str, Any]) -> str:
    if load["kind"] == "concurrency":
        return f"{load['streams']} streams, ramp {load.get('ramp_s', 0):g} s"
    cap = load.get("max_in_flight")
    in_flight = "" if cap is None else f", at most {cap} in flight"
    return f"{load['per_second']:g}/s {load.get('arrivals')} arrivals{in_flight}"


#: The settings two compared runs should share, and how each is said.
_SETTINGS: dict[str, Callable[[Any], str]] = {
    "target": _target_words,
    "workload": workload_words,
    "limits": limits_words,
    "workers": lambda workers: f"{workers} worker(s)",
}


def pair_stages(
    a: LoadTestResult, b: LoadTestResult, names: tuple[str, str]
) -> tuple[list[tuple[StageResult, StageResult]], list[str]]:
    """The stages of ``a`` and ``b`` run at the same load (concurrency or rate), in
    ``a``'s order, and a warning for each stage without a match and for each difference
    between the runs that makes the comparison unfair (target, workload, limits)."""
    by_load = {_load_key(stage): stage for stage in b.stages}
    pairs = [(s, by_load[_load_key(s)]) for s in a.stages if _load_key(s) in by_load]
    warnings = []
    matched = {_load_key(s) for s, _ in pairs}
    for name, result in zip(names, (a, b), strict=True):
        for stage in result.stages:
            if _load_key(stage) not in matched:
                other = names[1] if name == names[0] else names[0]
                warnings.append(f"{name} {stage.label} has no stage at that load in {other}")
    for key, words in _SETTINGS.items():
        if a.test.get(key) != b.test.get(key):
            first, second = (words(r.test.get(key) or {}) for r in (a, b))
            warnings.append(f"the runs' {key} differ: {first} / {second}")
    for stage_a, stage_b in pairs:
        if stage_a.load != stage_b.load:
            first, second = (_load_words(s.load) for s in (stage_a, stage_b))
            warnings.append(f"{stage_a.label}: the loads differ: {first} / {second}")
    return pairs, warnings


def compare_table(
    pairs: Sequence[tuple[StageResult, StageResult]], names: tuple[str, str]
) -> Table:
    """Stage by stage (paired by load, :func:`pair_stages`): throughput and each latency's
    p50/p90/p99 in ``a`` and ``b`` and the change from ``a`` to ``b``."""
    table = Table(title=f"{names[0]} → {names[1]} (times in ms)", box=box.SIMPLE)
    for header in ("load", "metric", names[0], names[1], "change"):
        table.add_column(header, justify="right", overflow="fold")
    for stage_a, stage_b in pairs:
        rows: list[tuple[str, float | None, float | None]] = [
            (
                "out tok/s",
                stage_a.summary["throughput"]["output_tokens_per_s"],
                stage_b.summary["throughput"]["output_tokens_per_s"],
            ),
            (
                "req/s",
                stage_a.summary["throughput"]["requests_per_s"],
                stage_b.summary["throughput"]["requests_per_s"],
            ),
        ]
        for metric in METRICS:
            for statistic in ("p50", "p90", "p99"):
                rows.append(
                    (
                        f"{metric.upper()} {statistic}",
                        stage_a.latency(metric, statistic),
                        stage_b.latency(metric, statistic),
                    )
                )
        for index, (metric, va, vb) in enumerate(rows):
            change = "-"
            if va is not None and vb is not None and va:
                change = f"{(vb - va) / va:+.1%}"
            table.add_row(stage_a.label if index == 0 else "", metric, _ms(va), _ms(vb), change)
        table.add_section()
    return table
