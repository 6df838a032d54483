"""Scheduler rounds and system calls per request: ours, the skeleton and the floor, counted.

``instructions_per_request.py`` counts what a request runs in user space; what it costs
in the kernel is not there. On this path most of that is one ``epoll_wait`` per round
of Trio's scheduler (every round asks the kernel for I/O, with a zero timeout when a task
is ready), so the rounds a request takes are the kernel's share that our code decides:
ours splits a request over two tasks (the request's and the consumer), which hand over
to each other; the floor runs it in one.

Each contender (``ours``, ``skeleton``, ``floor``; see ``bench_actor.Skeleton``) is driven
against the same independent server (``benchmarks/sse_server.py``) in a process of its
own, ``--warmup`` requests then ``--requests``, one at a time:

* **rounds**: a Trio instrument, added after the warm-up, counts the scheduler's rounds
  (``after_io_wait``) and task steps (``before_task_step``); ``getrusage`` splits the
  same requests' CPU time into user space and the kernel (``--requests 1000`` for
  times steadier than the default's);
* **system calls** (with ``strace`` on the ``PATH``): the process runs under
  ``strace -f -c`` twice, with ``--requests`` and three times as many; the difference of
  the two counts per call, divided by the difference in requests, is one request's (calls
  made fewer than once in 10 requests are left out).

Trio runs the ready tasks of a round in a random order (it reverses them half the time),
so a hand-over between two tasks costs one round or two: the counts are averages.

    python benchmarks/rounds_per_request.py [--tokens 1,200] [--requests 100]
        [--warmup 20] [--impls ours,skeleton,floor]
        [--json benchmarks/results/rounds_per_request.json]
"""

from __future__ import annotations

import json
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_actor import Contender, RawServer, Rec
from benchmarks.common import per_request_arguments, write_results

CONTENDERS = ("ours", "skeleton", "floor")
#: A line of ``strace -c``'s table: % time, seconds, usecs/call, calls, [errors,] name.
_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


class _Rounds(trio.abc.Instrument):
    """Counts the scheduler's rounds and task steps while it is added."""

    def __init__(self) -> None:
        self.rounds = 0
        self.steps = 0

    def after_io_wait(self, timeout: float) -> None:
        self.rounds += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


def drive(impl: str, origin: str, tokens: int, warmup: int, requests: int) -> dict[str, float]:
    """Run ``warmup`` then ``requests`` streams of ``impl`` one after the other; the
    rounds and task steps per request of the second part, and its CPU time in user
    space and in the kernel (``getrusage``; the instrument's few calls a round
    included)."""
    counter = _Rounds()
    usage: list[resource.struct_rusage] = []

    async def run() -> None:
        contender = Contender(impl, origin, tokens, "", headers={"x-bench-events": str(tokens)})

        async def body() -> None:
            for number in range(warmup + requests):
                if number == warmup:
                    trio.lowlevel.add_instrument(counter)
                    usage.append(resource.getrusage(resource.RUSAGE_SELF))
                rec = Rec()
                await contender.stream(rec)
                if not rec.ok:
                    raise RuntimeError(f"{impl}: a stream failed: {rec.error}")
            usage.append(resource.getrusage(resource.RUSAGE_SELF))
            trio.lowlevel.remove_instrument(counter)

        await contender.run(body)

    trio.run(run)
    first, last = usage
    return {
        "rounds": counter.rounds / requests,
        "steps": counter.steps / requests,
        "user_ms": (last.ru_utime - first.ru_utime) / requests * 1000.0,
        "sys_ms": (last.ru_stime - first.ru_stime) / requests * 1000.0,
    }


def _drive_command(impl: str, origin: str, tokens: int, warmup: int, requests: int) -> list[str]:
    script = str(Path(__file__).resolve())
    return [
        sys.executable,
        script,
        "--drive",
        impl,
        origin,
        str(tokens),
        str(warmup),
        str(requests),
    ]


def rounds(impl: str, origin: str, tokens: int, warmup: int, requests: int) -> dict[str, float]:
    """``drive`` in a process of its own (a fresh heap and scheduler for each contender)."""
    out = subprocess.run(
        _drive_command(impl, origin, tokens, warmup, requests),
        check=True,
        capture_output=True,
        text=True,
    )
    counts: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return counts


def syscalls(
    strace: str, impl: str, origin: str, tokens: int, warmup: int, requests: int
) -> dict[str, float]:
    """One request's system calls by name (see the module doc)."""
    totals: list[Counter[str]] = []
    for n in (requests, 3 * requests):
        with tempfile.TemporaryDirectory() as folder:
            table = Path(folder) / "strace.txt"
            subprocess.run(
                [
                    strace,
                    "-f",
                    "-c",
                    "-o",
                    str(table),
                    *_drive_command(impl, origin, tokens, warmup, n),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            counts: Counter[str] = Counter()
            for line in table.read_text().splitlines():
                row = _STRACE_ROW.match(line)
                if row is not None and row.group(2) != "total":
                    counts[row.group(2)] = int(row.group(1))
            totals.append(counts)
    extra = 2 * requests
    per = {name: (totals[1][name] - totals[0][name]) / extra for name in totals[1] | totals[0]}
    return {
        name: value for name, value in sorted(per.items(), key=lambda kv: -kv[1]) if value >= 0.1
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--drive"]:
        impl, origin = argv[1:3]
        tokens, warmup, requests = (int(n) for n in argv[3:6])
        print(json.dumps(drive(impl, origin, tokens, warmup, requests)))
        return 0
    _, args, impls = per_request_arguments(
        argv,
        __doc__,
        CONTENDERS,
        requests_help="requests counted (100)",
        warmup=20,
        json_path="benchmarks/results/rounds_per_request.json",
    )
    strace = shutil.which("strace")
    server = RawServer()
    results: dict[str, Any] = {
        "server": "benchmarks/sse_server.py",
        "requests": args.requests,
        "warmup": args.warmup,
        "platform": f"{platform.platform()}, Python {platform.python_version()}",
        "sizes": {},
    }
    try:
        for tokens in (int(t) for t in args.tokens.split(",")):
            by_impl: dict[str, Any] = {}
            for impl in impls:
                row: dict[str, Any] = rounds(
                    impl, server.origin, tokens, args.warmup, args.requests
                )
                if strace is not None:
                    calls = syscalls(
                        strace, impl, server.origin, tokens, args.warmup, args.requests
                    )
                    row["syscalls"] = sum(calls.values())
                    row["syscalls_by_name"] = calls
                by_impl[impl] = row
            results["sizes"][str(tokens)] = by_impl
    finally:
        server.close()
    print(f"scheduler rounds and system calls per request (C=1, {results['server']})")
    print(
        "| deltas | impl | rounds/req | task steps/req | user ms/req | sys ms/req "
        "| syscalls/req | by name |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tokens, by_impl in results["sizes"].items():
        for impl, row in by_impl.items():
            total = row.get("syscalls")
            names = ", ".join(f"{k} {v:.2f}" for k, v in row.get("syscalls_by_name", {}).items())
            shown = "-" if total is None else f"{total:.2f}"
            print(
                f"| {int(tokens):>6,} | {impl} | {row['rounds']:.2f} | {row['steps']:.2f} "
                f"| {row['user_ms']:.3f} | {row['sys_ms']:.3f} | {shown} | {names or '-'} |"
            )
    if not args.no_json:
        write_results(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
