"""The live progress display and the printed summary tables (``rich``)."""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ._results import LoadTestResult, StageResult
from ._runner import Progress
from ._stats import counter_percentile

__all__ = ["LiveDisplay", "compare_table", "summary_table"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


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
        sent = sum(p.sent for p in workers)
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
        live: dict[str, collections.Counter[int]] = {
            "ttft": collections.Counter(),
            "itl": collections.Counter(),
        }
        for progress in workers:
            if progress.stats is not None:
                for name, counts in live.items():
                    counts.update(progress.stats.histograms[name].unflushed())
        table = Table(title=f"stage {stage + 1}/{len(self.stages)}: {self.stages[stage]}")
        for column in ("phase", "sent", "done", "failed", "in flight", "req/s", "out tok"):
            table.add_column(column, justify="right")
        for column in ("TTFT p50", "TTFT p99", "ITL p50", "ITL p99"):
            table.add_column(f"{column} ms", justify="right")
        table.add_row(
            "measuring" if any(p.measuring for p in workers) else "warm-up",
            f"{sent:,}",
            f"{finished:,}",
            f"{sum(p.failed for p in workers):,}",
            f"{sum(p.in_flight for p in workers):,}",
            f"{rate:,.1f}",
            f"{sum(p.output_tokens for p in workers):,}",
            _live_ms(live["ttft"], 50),
            _live_ms(live["ttft"], 99),
            _live_ms(live["itl"], 50),
            _live_ms(live["itl"], 99),
        )
        self.live.update(table, refresh=True)


def _live_ms(counts: collections.Counter[int], percentile: float) -> str:
    value = counter_percentile(counts, percentile)
    return _ms(None if value is None else value / 1000)


def _stage_cells(stage: StageResult) -> list[str]:
    summary = stage.summary
    requests = summary["requests"]
    throughput = summary["throughput"]
    goodput = summary["goodput"]
    cells = [
        stage.label,
        f"{requests['completed']:,}",
        f"{requests['failed'] + requests['unfinished'] + requests['dropped']:,}",
        f"{throughput['requests_per_s']:,.1f}",
        f"{throughput['output_tokens_per_s']:,.0f}",
        "-" if goodput is None else f"{goodput['requests_per_s']:,.1f}",
    ]
    for metric in ("ttft", "itl", "tpot", "e2e"):
        cells += [_ms(stage.latency(metric, "p50")), _ms(stage.latency(metric, "p99"))]
    cells.append("yes" if stage.client_bound else "no")
    return cells


_HEADERS = (
    "load",
    "done",
    "errors",
    "req/s",
    "out tok/s",
    "goodput/s",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "ITL p99",
    "TPOT p50",
    "TPOT p99",
    "E2E p50",
    "E2E p99",
    "client-bound",
)


def summary_table(result: LoadTestResult) -> Table:
    """One row per stage: counts, throughput, goodput and p50/p99 latencies (ms)."""
    target = result.test.get("target", {})
    table = Table(title=f"{target.get('model')} at {target.get('base_url')} (times in ms)")
    for header in _HEADERS:
        table.add_column(header, justify="right")
    for stage in result.stages:
        table.add_row(*_stage_cells(stage))
    stopped = sum(
        stage.summary["requests"].get("errors", {}).get("sampler_memory_cap", 0)
        for stage in result.stages
    )
    if stopped:
        table.caption = (
            f"{stopped:,} streams were stopped by the run's memory cap "
            "(max_buffered_response_bytes): the server sent more than the run may hold"
        )
    return table


def compare_table(a: LoadTestResult, b: LoadTestResult, names: tuple[str, str]) -> Table:
    """Stage by stage (matched by position): each p50/p99 and throughput of ``a`` and ``b``
    and the change from ``a`` to ``b``."""
    table = Table(title=f"{names[0]} → {names[1]} (times in ms)")
    for header in ("load", "metric", names[0], names[1], "change"):
        table.add_column(header, justify="right")
    for stage_a, stage_b in zip(a.stages, b.stages, strict=False):
        label = (
            stage_a.label
            if stage_a.label == stage_b.label
            else f"{stage_a.label} / {stage_b.label}"
        )
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
        for metric in ("ttft", "itl", "tpot", "e2e"):
            for statistic in ("p50", "p99"):
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
            table.add_row(label if index == 0 else "", metric, _ms(va), _ms(vb), change)
        table.add_section()
    return table
