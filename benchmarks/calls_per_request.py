"""Function calls per request: ours, the skeleton and the floor, counted.

The per-request cells of ``bench_actor.py`` measure CPU time, and on this machine two runs
of the same code minutes apart differ by several percent. This script counts instead:
every Python and built-in function call a request makes, under ``cProfile``, for each
contender of those cells (``ours``, ``skeleton``, ``floor``; see ``bench_actor.Skeleton``)
against the same independent server (``benchmarks/sse_server.py``). A count moves by a few
calls from one run to the next (a connection's expiry check, a scheduler round), so a
change to the request path can be judged by it before the noisy timing says anything:
fewer calls is less work on the interpreter.

The counts are grouped by where the called function lives (``trio_sampler``, ``trio``,
``httpcore2``, ``h11``, ``httpx2``, ``benchmarks``, built-ins, the rest), and the top
functions by calls are listed for ``ours``. Times are not reported: under a profiler they
mean little.

    python benchmarks/calls_per_request.py [--tokens 1,200] [--requests 200]
        [--json benchmarks/results/calls_per_request.json] [--top 25] [--bytecode]

``--bytecode`` counts, instead of calls, the bytecode instructions each Python function
runs in itself (``sys.settrace`` opcode events; built-in and C functions run none): the
weight of a loop body, which a call count does not see (a loop over a batch's events
makes no call per event, yet costs per event).
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_actor import Contender, RawServer, Rec
from benchmarks.common import write_results

CONTENDERS = ("ours", "skeleton", "floor")
WARMUP = 30
#: The packages a call is grouped under (the innermost of them in its path); then
#: ``builtins`` and ``other``, the columns of the printed table.
PACKAGES = ("trio_sampler", "httpcore2", "h11", "trio", "httpx2", "benchmarks")
GROUPS = ("trio_sampler", "builtins", "trio", "httpcore2", "h11", "httpx2", "benchmarks", "other")


def _where(filename: str) -> tuple[str, str]:
    """Where a profiled function lives: its group, and its file as listed."""
    if filename == "~":
        return "builtins", ""
    parts = Path(filename).parts
    for package in PACKAGES:
        if package in parts:
            index = len(parts) - 1 - parts[::-1].index(package)
            return package, "/".join(parts[index:])
    return "other", Path(filename).name


async def _count(impl: str, origin: str, tokens: int, requests: int) -> pstats.Stats:
    contender = Contender(impl, origin, tokens, "", headers={"x-bench-events": str(tokens)})
    profile = cProfile.Profile()

    async def body() -> None:
        for _ in range(WARMUP):
            rec = Rec()
            await contender.stream(rec)
            if not rec.ok:
                raise RuntimeError(f"{impl}: the warm-up stream failed: {rec.error}")
        profile.enable()
        try:
            for _ in range(requests):
                rec = Rec()
                await contender.stream(rec)
                if not rec.ok:
                    raise RuntimeError(f"{impl}: a stream failed: {rec.error}")
        finally:
            profile.disable()

    await contender.run(body)
    return pstats.Stats(profile)


async def _count_bytecode(impl: str, origin: str, tokens: int, requests: int) -> Counter[Any]:
    """Per code object, the bytecode instructions ``requests`` streams run (``sys.settrace``
    opcode events: Python functions only, each counted in itself, not in its callees)."""
    contender = Contender(impl, origin, tokens, "", headers={"x-bench-events": str(tokens)})
    counts: Counter[Any] = Counter()

    def opcodes(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return opcodes

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        return opcodes

    async def body() -> None:
        for n in range(WARMUP + requests):
            if n == WARMUP:
                sys.settrace(calls)
            rec = Rec()
            await contender.stream(rec)
            if not rec.ok:
                sys.settrace(None)
                raise RuntimeError(f"{impl}: a stream failed: {rec.error}")
        sys.settrace(None)

    await contender.run(body)
    return counts


def count(
    impl: str, origin: str, tokens: int, requests: int, top: int, bytecode: bool = False
) -> dict[str, Any]:
    """One contender's calls per request (with ``bytecode``: bytecode instructions): the
    total, per group, and its ``top`` functions."""
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    if bytecode:
        ops = trio.run(_count_bytecode, impl, origin, tokens, requests)
        for code, n in ops.items():
            group, where = _where(code.co_filename)
            groups[group] += n
            functions[f"{where}:{code.co_firstlineno}:{code.co_name}"] += n
        total = sum(groups.values())
        return {
            "bytecode_per_request": total / requests,
            "by_group": {name: n / requests for name, n in groups.most_common()},
            "top": [[name, n / requests] for name, n in functions.most_common(top)],
        }
    stats: dict[Any, Any] = trio.run(_count, impl, origin, tokens, requests).stats  # type: ignore[attr-defined]
    for (filename, line, function), (_, calls, *_rest) in stats.items():
        group, where = _where(filename)
        groups[group] += calls
        functions[f"{where}:{line}:{function}" if where else function] += calls
    total = sum(groups.values())
    return {
        "calls_per_request": total / requests,
        "by_group": {name: n / requests for name, n in groups.most_common()},
        "top": [[name, n / requests] for name, n in functions.most_common(top)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,200", help="text deltas per stream (1,200)")
    parser.add_argument("--requests", type=int, default=200, help="requests counted (200)")
    parser.add_argument("--top", type=int, default=25, help="functions listed for ours (25)")
    parser.add_argument(
        "--bytecode",
        action="store_true",
        help="count bytecode instructions per function instead of calls",
    )
    parser.add_argument(
        "--json",
        help="results file (benchmarks/results/calls_per_request.json, or "
        "bytecode_per_request.json with --bytecode)",
    )
    parser.add_argument("--no-json", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.top < 0:
        parser.error("--requests must be at least 1 and --top at least 0")
    sizes = [int(t) for t in args.tokens.split(",")]
    measure = "bytecode" if args.bytecode else "calls"
    key = f"{measure}_per_request"
    server = RawServer()
    results: dict[str, Any] = {
        "measure": measure,
        "server": "benchmarks/sse_server.py",
        "requests": args.requests,
        "platform": f"{platform.platform()}, Python {platform.python_version()}",
        "sizes": {},
    }
    try:
        for tokens in sizes:
            results["sizes"][str(tokens)] = {
                impl: count(impl, server.origin, tokens, args.requests, args.top, args.bytecode)
                for impl in CONTENDERS
            }
    finally:
        server.close()
    print(f"{measure} per request ({args.requests} requests each, C=1, {results['server']})")
    print(f"| deltas | impl | {measure}/req | " + " | ".join(GROUPS) + " |")
    print("|---|---|---|" + "---|" * len(GROUPS))
    for tokens, by_impl in results["sizes"].items():
        for impl, row in by_impl.items():
            cells = " | ".join(f"{row['by_group'].get(g, 0.0):,.0f}" for g in GROUPS)
            print(f"| {int(tokens):>6,} | {impl} | {row[key]:,.0f} | {cells} |")
    for tokens, by_impl in results["sizes"].items():
        ours = by_impl["ours"][key]
        skeleton = by_impl["skeleton"][key]
        gap = f"{ours - skeleton:+,.0f} {measure}"
        verb = "runs" if args.bytecode else "makes"  # bytecode is run; calls are made
        print(f"{int(tokens):,} deltas: ours {verb} {gap} over the skeleton")
        if args.top:
            print(f"  ours' top functions by {measure} ({int(tokens):,} deltas):")
            for name, calls in by_impl["ours"]["top"]:
                print(f"    {calls:8.1f}  {name}")
    if not args.no_json:
        write_results(args.json or f"benchmarks/results/{key}.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
