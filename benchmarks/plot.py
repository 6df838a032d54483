"""Draw the benchmark charts from the results JSON with matplotlib (the ``docs`` extra).

    python benchmarks/plot.py [--results benchmarks/results] [--out docs/_generated]

The Sphinx build runs this too (``docs/conf.py``), so the charts in the docs always come
from the committed ``benchmarks/results/*.json``. Output is SVG with the text kept as text,
and byte-stable for the same input (no timestamps, fixed hash salt).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "ours": "#2b6cb0",
    "floor": "#a0aec0",
    "sdk": "#dd6b20",
    "openai": "#dd6b20",
    "anthropic": "#d69e2e",
}
LABELS = {
    "ours": "trio_sampler",
    "floor": "floor (split + parse)",
    "sdk": "official SDK",
    "openai": "openai SDK",
    "anthropic": "anthropic SDK",
}


def bar_chart(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    values: dict[tuple[str, str], float],
    unit: str,
) -> None:
    """Grouped horizontal bars on a log scale (the values span orders of magnitude)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "trio_sampler"})
    bar = 0.8 / len(series)
    figure, axes = plt.subplots(
        figsize=(8, 1.5 + 0.32 * len(groups) * len(series)), layout="constrained"
    )
    for index, name in enumerate(series):
        positions = [g - 0.4 + bar * (index + 0.5) for g in range(len(groups))]
        widths = [values.get((group, name), 0.0) for group in groups]
        shown = [(p, w) for p, w in zip(positions, widths, strict=True) if w > 0]
        if not shown:
            continue
        bars = axes.barh(
            [p for p, _ in shown],
            [w for _, w in shown],
            height=bar * 0.9,
            color=COLORS.get(name, "#4a5568"),
            label=LABELS.get(name, name),
        )
        axes.bar_label(bars, labels=[f"{w:,.0f}" for _, w in shown], padding=3, fontsize=8)
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    axes.set_yticks(range(len(groups)), labels=list(groups))
    axes.invert_yaxis()  # the first group on top
    axes.set_xlabel(f"{unit} (log scale)")
    axes.set_title(title, loc="left", fontsize=11, fontweight="bold", pad=10)
    axes.grid(axis="x", color="#e2e8f0", linewidth=0.8)
    axes.set_axisbelow(True)
    axes.spines[["top", "right"]].set_visible(False)
    axes.margins(x=0.15)
    # Below the plot, never over a bar.
    figure.legend(loc="outside lower center", ncols=len(series), fontsize=8, frameon=False)
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)


def wire_chart(data: dict[str, Any], path: Path) -> None:
    groups = [r["backend"] for r in data["results"]]
    values: dict[tuple[str, str], float] = {}
    for result in data["results"]:
        for name, value in result["events_per_second"].items():
            values[(result["backend"], name)] = value
    bar_chart(
        path,
        "Wire layer: replay + collect vs the SDKs' accumulators",
        groups,
        ["ours", "sdk", "floor"],
        values,
        "SSE events per CPU second",
    )


def actor_chart(data: dict[str, Any], path: Path) -> None:
    rows = data["rows"]
    concurrency = sorted({r["concurrency"] for r in rows})
    impls = [
        i for i in ("ours", "floor", "openai", "anthropic") if any(r["impl"] == i for r in rows)
    ]
    values = {
        (f"C = {r['concurrency']:,}", r["impl"]): r["events_per_s"]
        for r in rows
        if r.get("events_per_s")
    }
    bar_chart(
        path,
        "Actor over loopback: events/s by concurrency",
        [f"C = {c:,}" for c in concurrency],
        impls,
        values,
        "events per second",
    )


def render(results: Path, out: Path) -> list[Path]:
    """Write one SVG per results file found; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, chart in (("bench_wire", wire_chart), ("bench_actor", actor_chart)):
        source = results / f"{name}.json"
        if not source.is_file():
            continue
        target = out / f"{name}.svg"
        chart(json.loads(source.read_text()), target)
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--results", type=Path, default=here / "results")
    parser.add_argument("--out", type=Path, default=here.parent / "docs" / "_generated")
    args = parser.parse_args(argv)
    for path in render(args.results, args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
