"""Objects the collector tracks per stream in flight: ours on each transport against the
raw Trio and the ``httpx2`` floors, counted.

With many streams open, the collector's time is mostly its full collections, and each
visits every tracked object alive: a process at ``C`` streams holds ``C`` times what one
stream keeps between its tokens (its request's state, its tasks' coroutines and scopes,
its connection). ``bench_per_token.py`` times the collector, but a window holds a few
full collections and the time moves by tens of percent from run to run; this script
counts what it visits instead, which runs repeat to the object.

Each contender (as in ``bench_per_token.py``: ``raw``, ``httpx2``, ``direct``, ``httpx``,
``httptools``) runs in a fresh process against that script's paced server (standard
library ``asyncio`` in a process of its own, one event per write), twice: with ``C_low``
and with ``C_high`` streams open. The streams are long (no stream ends while counted);
after ``--settle`` seconds, when every stream is between two tokens, the process runs a
full collection and counts ``gc.get_objects()`` by type. The difference of the two
counts, divided by ``C_high - C_low``, is one stream's objects (its connection's
included: a stream holds one), by type; the process's own (the modules, the sampler)
cancel out.

    python benchmarks/objects_per_stream.py [--streams 100,600] [--settle 2]
        [--impls raw,httpx2,direct,httpx,httptools] [--top 8]
        [--json benchmarks/results/objects_per_stream.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_per_token as paced
from benchmarks.common import raise_nofile, write_results

#: Not the ``loadtest`` contender: it freezes the heap (``gc.freeze``), which hides the
#: objects from ``gc.get_objects``.
IMPLS = ("raw", "httpx2", "direct", "httpx", "httptools")
#: Text deltas a stream is given: none ends while the streams are counted.
TOKENS = 100_000
#: Between two tokens of a stream.
INTERVAL_S = 0.2


def census() -> Counter[str]:
    """The tracked objects alive after a full collection, by type."""
    gc.collect()
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


async def _count(impl: str, port: int, streams: int, settle: float) -> Counter[str]:
    """``streams`` streams of ``impl`` open for ``settle`` seconds, then counted."""
    import trio

    tokens = paced.Counter()
    counted: Counter[str] = Counter()

    async def open_streams(start: paced.StreamLoop) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(start)
            await trio.sleep(settle)
            if tokens.tokens < streams:
                raise RuntimeError(f"{impl}: {tokens.tokens} tokens for {streams} streams")
            counted.update(census())
            nursery.cancel_scope.cancel()

    await paced.run_streams(impl, port, streams, tokens, open_streams)
    return counted


def count_main(impl: str, port: int, streams: int, settle: float) -> None:
    """One count, in a process of its own: the census as JSON on standard output."""
    import trio

    raise_nofile()
    print(json.dumps(trio.run(_count, impl, port, streams, settle)))


def _run_count(impl: str, port: int, streams: int, settle: float) -> Counter[str]:
    script = str(Path(__file__).resolve())
    command = [sys.executable, script, "--count", impl, str(port), str(streams), str(settle)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} at {streams} streams failed:\n{done.stderr[-1500:]}")
    return Counter(json.loads(done.stdout.strip().splitlines()[-1]))


def per_stream(impl: str, low: int, high: int, settle: float, folder: Path) -> dict[str, Any]:
    """One contender's objects per stream: a count at ``low`` and at ``high`` streams,
    each against a fresh paced server."""
    counts = []
    for streams in (low, high):
        server, port = paced._start_server(TOKENS, INTERVAL_S, folder)
        try:
            counts.append(_run_count(impl, port, streams, settle))
        finally:
            server.kill()
            server.wait()
    span = high - low
    by_type = {name: (counts[1][name] - counts[0][name]) / span for name in counts[0] | counts[1]}
    kept = {name: n for name, n in by_type.items() if abs(n) >= 0.5}
    return {
        "objects_per_stream": sum(by_type.values()),
        "by_type": dict(sorted(kept.items(), key=lambda item: -item[1])),
        "totals": {str(low): sum(counts[0].values()), str(high): sum(counts[1].values())},
    }


def render(results: dict[str, dict[str, Any]], top: int) -> str:
    floor = results.get("httpx2", {}).get("objects_per_stream")
    lines = [
        "| impl | objects/stream | × httpx2 | the most, per stream |",
        "|---|---|---|---|",
    ]
    for impl, row in results.items():
        count = row["objects_per_stream"]
        ratio = f"{count / floor:.2f}" if floor else "-"
        most = ", ".join(
            f"{name.rpartition('.')[2]} {n:.1f}" for name, n in list(row["by_type"].items())[:top]
        )
        lines.append(f"| {impl} | {count:.1f} | {ratio} | {most} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="100,600", help="C_low,C_high")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before a count")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--top", type=int, default=8, help="types listed per contender")
    parser.add_argument("--json", default="benchmarks/results/objects_per_stream.json")
    args = parser.parse_args(argv)
    low, high = (int(n) for n in args.streams.split(","))
    if not 0 <= low < high:
        parser.error(f"--streams must be two counts, the first below the second; got {low},{high}")
    if args.settle <= INTERVAL_S:
        parser.error(f"--settle must be above {INTERVAL_S} s (a stream's first token)")
    impls = args.impls.split(",")
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        parser.error(f"unknown --impls {', '.join(unknown)}; choose from {', '.join(IMPLS)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for impl in impls:
            results[impl] = per_stream(impl, low, high, args.settle, Path(folder))
            print(f"{impl}: {results[impl]['objects_per_stream']:.1f}", file=sys.stderr)
    print(f"tracked objects per stream in flight (C = {low} and {high}, paced server)")
    print(render(results, args.top))
    write_results(
        args.json,
        {
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "streams": [low, high],
            "settle_s": args.settle,
            "contenders": results,
        },
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--count":
        count_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        sys.exit(main())
