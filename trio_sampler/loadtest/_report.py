"""The self-contained HTML report: plots drawn with matplotlib, embedded as SVG.

One file, no scripts, no external assets: open it anywhere, attach it to a ticket.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._results import LoadTestResult, StageResult

__all__ = ["render_report", "write_report"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th { background: #f4f4f4; }
.bound { color: #b00; font-weight: bold; }
figure { margin: 1em 0; }
code { background: #f4f4f4; padding: 0 0.2em; }
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
                    label = stage.label if len(runs) == 1 else f"{name} {stage.label}"
                    axis.plot([v / 1000 for v, _ in points], [f for _, f in points], label=label)
        axis.set_title(title)
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of values ≤ x")
        axis.set_xscale("log")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    figures.append(("Latency distributions (CDF)", _figure_svg(fig)))
    plt.close(fig)

    # Latency percentiles and throughput against the swept load.
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, result in runs:
        xs, xlabel, numeric = _x_axis(result.stages)
        prefix = "" if len(runs) == 1 else f"{name} "
        for axis, metric in ((axes[0], "ttft"), (axes[1], "tpot")):
            for statistic, style in (("p50", "-o"), ("p99", "--o")):
                ys = [s.latency(metric, statistic) for s in result.stages]
                axis.plot(
                    xs,
                    [float("nan") if y is None else y for y in ys],
                    style,
                    label=f"{prefix}{statistic}",
                )
            axis.set_title(f"{metric.upper()} vs load")
            axis.set_xlabel(xlabel)
            axis.set_ylabel("ms")
        out = [s.summary["throughput"]["output_tokens_per_s"] for s in result.stages]
        axes[2].plot(xs, out, "-o", label=f"{prefix}output tokens/s")
        good = [s.summary["goodput"] for s in result.stages]
        if all(g is not None for g in good):
            axes[2].plot(
                xs, [g["requests_per_s"] for g in good], "--o", label=f"{prefix}goodput requests/s"
            )
        axes[2].set_title("throughput vs load")
        axes[2].set_xlabel(xlabel)
        for axis in axes:
            if numeric and len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 10:
                axis.set_xscale("log")
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    fig.tight_layout()
    figures.append(("Latency and throughput against load", _figure_svg(fig)))
    plt.close(fig)

    # Each stage over time: an open loop past capacity shows TTFT climbing while arrivals
    # keep their rate and completions plateau.
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
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


def _table(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    headers = ["run", "load", "done", "errors", "req/s", "out tok/s", "goodput/s"]
    for metric in ("TTFT", "ITL", "TPOT", "E2E"):
        headers += [f"{metric} p50", f"{metric} p99"]
    headers.append("client")
    rows = []
    for name, result in runs:
        for stage in result.stages:
            summary = stage.summary
            requests = summary["requests"]
            goodput = summary["goodput"]
            cells = [
                name,
                stage.label,
                f"{requests['completed']:,}",
                f"{requests['failed'] + requests['unfinished'] + requests['dropped']:,}",
                f"{summary['throughput']['requests_per_s']:,.2f}",
                f"{summary['throughput']['output_tokens_per_s']:,.0f}",
                "-" if goodput is None else f"{goodput['requests_per_s']:,.2f}",
            ]
            for metric in ("ttft", "itl", "tpot", "e2e"):
                for statistic in ("p50", "p99"):
                    value = stage.latency(metric, statistic)
                    cells.append("-" if value is None else f"{value:,.1f}")
            client = summary["client"]
            reasons = "; ".join(client["reasons"])
            cells.append(
                f'<span class="bound" title="{html.escape(reasons)}">client-bound</span>'
                if client["client_bound"]
                else "ok"
            )
            rows.append(cells)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c if c.startswith('<span') else html.escape(c)}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(runs: Sequence[tuple[str, LoadTestResult]]) -> str:
    """The HTML of a report on one run, or several side by side (``compare``)."""
    first = runs[0][1]
    target = first.test.get("target", {})
    title = (
        f"Load test: {target.get('model')} at {target.get('base_url')}"
        if len(runs) == 1
        else "Load test comparison: " + " vs ".join(name for name, _ in runs)
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for name, result in runs:
        test = result.test
        backend = html.escape(str(test.get("target", {}).get("backend")))
        parts.append(
            f"<p><b>{html.escape(name)}</b>: {backend}"
            f", workload <code>{html.escape(str(test.get('workload')))}</code>, "
            f"{test.get('workers')} worker(s), created {html.escape(result.created)}, "
            f"trio-sampler {html.escape(result.version)}. Times in ms; the tokens' source "
            "(server usage or counted) is in the JSON.</p>"
        )
    parts.append(_table(runs))
    for caption, svg in _plots(runs):
        parts.append(f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path: str | Path, runs: Sequence[tuple[str, LoadTestResult]]) -> None:
    Path(path).write_text(render_report(runs), encoding="utf-8")
