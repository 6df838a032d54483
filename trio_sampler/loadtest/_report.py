"""The self-contained HTML report: plots drawn with matplotlib, embedded as SVG.

One file, no scripts, no external assets: open it anywhere, attach it to a ticket.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._late import MARK, late_words, marked
from ._results import LoadTestResult, StageResult
from ._words import (
    limits_words,
    machine_words,
    shared_read_words,
    slo_words,
    tokens_words,
    workload_words,
)

__all__ = ["render_report", "write_report"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1180px;
       padding: 0 1em; color: #222; line-height: 1.4; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th { background: #f4f4f4; }
td.text, th.text { text-align: left; }
.bound { color: #b00; }
.warning { color: #b00; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: bold; }
dd { margin: 0; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
"""


def _figure_svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _x_axis(stages: Sequence[StageResult]) -> tuple[list[float], str, bool]:
    """The sweep's x values (streams or rate), its label, and whether it is numeric."""
    kinds = {stage.load["kind"] for stage in stages}
    if kinds == {"concurrency"}:
        return [float(s.load["streams"]) for s in stages], "concurrent streams", True
    if kinds == {"rate"}:
        return [float(s.load["per_second"]) for s in stages], "arrival rate (requests/s)", True
    return [float(i + 1) for i in range(len(stages))], "stage", False


def _plots(runs: Sequence[tuple[str, LoadTestResult]]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figures: list[tuple[str, str]] = []
    # Latency CDFs, one panel per metric, one line per stage (and run).
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for axis, (metric, title) in zip(
        axes.flat,
        (
            ("ttft", "time to first token"),
            ("itl", "inter-token latency"),
            ("tpot", "time per output token"),
            ("e2e", "end-to-end latency"),
        ),
        strict=True,
    ):
        for name, result in runs:
            for stage in result.stages:
                points = stage.histogram(metric).cdf()
                if points:
                    # From 0 at the smallest value: a steady latency is a vertical step.
                    points.insert(0, (points[0][0], 0.0))
                    label = stage.label if len(runs) == 1 else f"{name} {stage.label}"
                    axis.plot([v / 1000 for v, _ in points], [f for _, f in points], label=label)
        axis.set_title(title)
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of values ≤ x")
        axis.set_ylim(0, 1.02)
        axis.set_xscale("log")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    figures.append(("Latency distributions (CDF)", _figure_svg(fig)))
    plt.close(fig)

    # Latency percentiles and throughput against the swept load; goodput (requests/s)
    # beside the requests/s, on its own axis, never on the tokens/s one.
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ttft_axis, tpot_axis, tokens_axis, requests_axis = axes.flat
    for name, result in runs:
        xs, xlabel, numeric = _x_axis(result.stages)
        prefix = "" if len(runs) == 1 else f"{name} "
        for axis, metric in ((ttft_axis, "ttft"), (tpot_axis, "tpot")):
            for statistic, style in (("p50", "-o"), ("p90", ":o"), ("p99", "--o")):
                ys = [s.latency(metric, statistic) for s in result.stages]
                axis.plot(
                    xs,
                    [float("nan") if y is None else y for y in ys],
                    style,
                    label=f"{prefix}{statistic}",
                )
            axis.set_title(f"{metric.upper()} vs load")
            axis.set_ylabel("ms")
        out = [s.summary["throughput"]["output_tokens_per_s"] for s in result.stages]
        tokens_axis.plot(xs, out, "-o", label=f"{prefix}output tokens/s")
        done = [s.summary["throughput"]["requests_per_s"] for s in result.stages]
        requests_axis.plot(xs, done, "-o", label=f"{prefix}completed")
        good = [s.summary["goodput"] for s in result.stages]
        if all(g is not None for g in good):
            requests_axis.plot(
                xs, [g["requests_per_s"] for g in good], "--o", label=f"{prefix}goodput"
            )
        tokens_axis.set_title("output tokens/s vs load")
        requests_axis.set_title("requests/s vs load (goodput: within the SLOs)")
        requests_axis.set_ylabel("requests/s")
        for axis in axes.flat:
            axis.set_xlabel(xlabel)
            if numeric and len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 10:
                axis.set_xscale("log")
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    fig.tight_layout()
    figures.append(("Latency and throughput against load", _figure_svg(fig)))
    plt.close(fig)

    # Each stage over time: an open loop past capacity shows TTFT climbing while arrivals
    # keep their rate and completions plateau.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, result in runs:
        for stage in result.stages:
            rows = stage.summary.get("timeline") or []
            if not rows:
                continue
            label = stage.label if len(runs) == 1 else f"{name} {stage.label}"
            seconds = [row["second"] for row in rows]
            p99 = [row["ttft_p99_ms"] for row in rows]
            axes[0].plot(seconds, [float("nan") if v is None else v for v in p99], label=label)
            axes[1].plot(seconds, [row["sent"] for row in rows], "--", label=f"{label} sent")
            axes[1].plot(seconds, [row["completed"] for row in rows], label=f"{label} completed")
    axes[0].set_title("TTFT p99 of the requests sent in each second")
    axes[0].set_xlabel("seconds into the stage")
    axes[0].set_ylabel("ms")
    axes[1].set_title("requests sent and completed per second")
    axes[1].set_xlabel("seconds into the stage")
    for axis in axes:
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
    fig.tight_layout()
    figures.append(("Each stage over time", _figure_svg(fig)))
    plt.close(fig)
    return figures


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], text: int = 1) -> str:
    """A table whose first ``text`` columns are text (left-aligned), the rest numbers."""

    def cell(tag: str, index: int, value: str) -> str:
        kind = ' class="text"' if index < text else ""
        return f"<{tag}{kind}>{html.escape(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _stages(runs: Sequence[tuple[str, LoadTestResult]]) -> list[tuple[str, StageResult]]:
    many = len(runs) > 1
    return [
        (f"{name} {stage.label}" if many else stage.label, stage)
        for name, result in runs
        for stage in result.stages
    ]


def _rates(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    headers = ["stage", "tokens from", "done", "errors", "window s", "req/s", "out tok/s"]
    headers += ["goodput/s", "good", "client"]
    rows = []
    for label, stage in _stages(runs):
        summary = stage.summary
        requests, throughput, goodput = (summary[k] for k in ("requests", "throughput", "goodput"))
        rows.append(
            [
                label,
                tokens_words(summary["tokens"]),
                f"{requests['completed']:,}",
                f"{requests['failed'] + requests['unfinished'] + requests['dropped']:,}",
                f"{throughput.get('window_s', summary['duration_s']):,.1f}",
                f"{throughput['requests_per_s']:,.2f}",
                f"{throughput['output_tokens_per_s']:,.0f}",
                "-" if goodput is None else f"{goodput['requests_per_s']:,.2f}",
                "-" if goodput is None else f"{goodput['fraction']:.1%}",
                "client-bound" if stage.client_bound else "ok",
            ]
        )
    return _html_table(headers, rows, text=2)


def _latencies(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    statistics = ("p50", "p90", "p95", "p99", "max", "mean")
    rows = []
    for label, stage in _stages(runs):
        for metric in ("ttft", "itl", "tpot", "e2e"):
            cells = [
                _ms(stage.latency(metric, statistic))
                + (MARK if marked(stage.summary, metric, statistic) else "")
                for statistic in statistics
            ]
            rows.append([label, metric.upper(), *cells])
        open_loop = stage.summary.get("open_loop")
        if open_loop:
            for key, name in (
                ("ttft_from_schedule_ms", "TTFT from schedule"),
                ("e2e_from_schedule_ms", "E2E from schedule"),
                ("pacing_error_ms", "pacing error"),
            ):
                rows.append([label, name, *(_ms(open_loop[key][s]) for s in statistics)])
    return _html_table(["stage", "metric", *statistics], rows, text=2)


def _client(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    items = []
    for label, stage in _stages(runs):
        client = stage.summary["client"]
        busiest = max((w["cpu_fraction"] for w in client["workers"]), default=0.0)
        lag = client["loop_lag_ms"].get("p99")
        measured = f"busiest worker {busiest:.0%} of a core, event-loop lag p99 {_ms(lag)} ms"
        state = (
            f'<span class="bound">client-bound</span> ({measured}): '
            + html.escape("; ".join(client["reasons"]))
            if client["client_bound"]
            else f"kept up ({measured})"
        )
        shared = shared_read_words(stage.summary)
        note = f" {html.escape(shared[0].upper() + shared[1:])}." if shared else ""
        late = late_words(stage.summary)
        if late:
            note += f' <span class="bound">{html.escape(MARK)} {html.escape(late)}</span>.'

        items.append(f"<li><b>{html.escape(label)}</b>: {state}.{note}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _errors(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    rows = []
    for label, stage in _stages(runs):
        requests = stage.summary["requests"]
        examples = requests.get("error_examples", {})
        for kind, count in requests["errors"].items():
            rows.append([label, kind, examples.get(kind, ""), f"{count:,}"])
    if not rows:
        return "<p>No request failed.</p>"
    return _html_table(["stage", "kind", "first message", "count"], rows, text=3)


def _about(name: str, result: LoadTestResult, many: bool) -> str:
    test = result.test
    target = test.get("target", {})
    stages = ", ".join(stage.label for stage in result.stages)
    facts = [
        ("target", f"{target.get('model')} at {target.get('base_url')} ({target.get('backend')})"),
        ("workload", workload_words(test.get("workload") or {})),
        ("stages", f"{stages}; {limits_words(test.get('limits') or {})}"),
        ("goodput", slo_words(test.get("slo") or {})),
        ("client", f"{test.get('workers')} worker process(es), seed {test.get('seed')}"),
        ("machine", machine_words(test.get("machine")) or "not recorded"),
        ("created", f"{result.created}, trio-sampler {result.version}"),
    ]
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts)
    heading = f"<h3>{html.escape(name)}</h3>" if many else ""
    return f"{heading}<dl>{rows}</dl>"


def render_report(
    runs: Sequence[tuple[str, LoadTestResult]], *, warnings: Sequence[str] = ()
) -> str:
    """The HTML of a report on one run, or several side by side (``compare``, whose
    ``warnings`` about stages that do not pair are shown at the top)."""
    first = runs[0][1]
    target = first.test.get("target", {})
    title = (
        f"Load test: {target.get('model')} at {target.get('base_url')}"
        if len(runs) == 1
        else "Load test comparison: " + " vs ".join(name for name, _ in runs)
    )
    many = len(runs) > 1
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *(f'<p class="warning">Warning: {html.escape(w)}</p>' for w in warnings),
        "<h2>The run</h2>",
        *(_about(name, result, many) for name, result in runs),
        "<h2>Throughput and goodput</h2>",
        "<p>Throughput: the requests completed in each stage's measured window (from its "
        "first measured request to the moment it stopped sending), per second of it.</p>",
        _rates(runs),
        "<h2>Latency (ms)</h2>",
        _latencies(runs),
        "<h2>Errors</h2>",
        _errors(runs),
        "<h2>The client</h2>",
        _client(runs),
    ]
    for caption, svg in _plots(runs):
        parts.append(f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    path: str | Path, runs: Sequence[tuple[str, LoadTestResult]], *, warnings: Sequence[str] = ()
) -> None:
    Path(path).write_text(render_report(runs, warnings=warnings), encoding="utf-8")
