"""Render the benchmark JSON files as SVG bar charts (no plotting library needed).

    python benchmarks/plot.py [--results benchmarks/results] [--out docs/_generated]

The Sphinx build runs this too (``docs/conf.py``), so the charts in the docs always come
from the committed ``benchmarks/results/*.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from html import escape
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
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    values: dict[tuple[str, str], float],
    unit: str,
) -> str:
    """Grouped horizontal bars on a log scale (the values span orders of magnitude)."""
    row, gap, left, width = 16, 14, 150, 460
    top = 40
    height = top + len(groups) * (len(series) * row + gap) + 40 + 18 * len(series)
    present = [v for v in values.values() if v > 0]
    low = 10 ** math.floor(math.log10(min(present))) if present else 1.0
    high = 10 ** math.ceil(math.log10(max(present))) if present else 10.0

    def x(value: float) -> float:
        span = math.log10(high) - math.log10(low)
        return left + width * (math.log10(max(value, low)) - math.log10(low)) / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    decade = low
    while decade <= high:
        parts.append(
            f'<line x1="{x(decade):.1f}" y1="{top - 6}" x2="{x(decade):.1f}" '
            f'y2="{height - 40 - 18 * len(series)}" stroke="#e2e8f0"/>'
            f'<text x="{x(decade):.1f}" y="{top - 10}" text-anchor="middle" fill="#718096">'
            f"{decade:,.0f}</text>"
        )
        decade *= 10
    y = top
    for group in groups:
        parts.append(f'<text x="10" y="{y + row * len(series) / 2 + 4:.1f}">{escape(group)}</text>')
        for name in series:
            value = values.get((group, name))
            if value is not None and value > 0:
                parts.append(
                    f'<rect x="{left}" y="{y}" width="{x(value) - left:.1f}" height="{row - 3}" '
                    f'fill="{COLORS.get(name, "#4a5568")}"/>'
                    f'<text x="{x(value) + 4:.1f}" y="{y + row - 5}">{value:,.0f}</text>'
                )
            y += row
        y += gap
    y += 10
    for name in series:
        color = COLORS.get(name, "#4a5568")
        parts.append(
            f'<rect x="{left}" y="{y}" width="12" height="10" fill="{color}"/>'
            f'<text x="{left + 18}" y="{y + 9}">{escape(LABELS.get(name, name))}</text>'
        )
        y += 18
    parts.append(
        f'<text x="{left + width}" y="{height - 8}" text-anchor="end" fill="#718096">'
        f"{escape(unit)} (log scale)</text></svg>"
    )
    return "\n".join(parts)


def wire_chart(data: dict[str, Any]) -> str:
    groups = [r["backend"] for r in data["results"]]
    values: dict[tuple[str, str], float] = {}
    for result in data["results"]:
        for name, value in result["events_per_second"].items():
            values[(result["backend"], name)] = value
    return bar_chart(
        "Wire layer: replay + collect vs the SDKs' accumulators",
        groups,
        ["ours", "sdk", "floor"],
        values,
        "SSE events per CPU second",
    )


def actor_chart(data: dict[str, Any]) -> str:
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
    return bar_chart(
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
        target.write_text(chart(json.loads(source.read_text())))
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=here / "results")
    parser.add_argument("--out", type=Path, default=here.parent / "docs" / "_generated")
    args = parser.parse_args(argv)
    for path in render(args.results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
