"""Machine instructions per request: ours, the skeleton and the floor, counted by valgrind.

The per-request cells of ``bench_actor.py`` time CPU, which on this machine moves by
several percent between runs minutes apart; ``calls_per_request.py`` counts Python calls,
which do not weigh what a call does (a ``len`` and an h11 header check count alike) and
miss the C code under them (``orjson``, the regexes, the interpreter itself). This
script counts what the processor runs in user space: each contender (``ours``,
``skeleton``, ``floor``; see ``bench_actor.Skeleton``) is driven in a process of its own
under ``valgrind --tool=callgrind`` against the same independent server
(``benchmarks/sse_server.py``), twice: ``--warmup`` requests then ``--requests``, and
the same warm-up then three times as many. The difference of the two totals, divided by
the difference in requests, is one request's instructions with the start-up, the imports
and the warm-up taken out. Every run has the same hash seed (``PYTHONHASHSEED=0``). The
same code counts within about one percent from run to run (trio's scheduler still picks
its own orders), whatever else the machine does; what the kernel does for a request (its
system calls) is not counted.

    python benchmarks/instructions_per_request.py [--tokens 1,200] [--requests 100]
        [--warmup 30] [--impls ours,skeleton,floor,ours_httpx]
        [--json benchmarks/results/instructions_per_request.json]

It needs ``valgrind`` on the ``PATH`` (Debian's package). Under callgrind a request runs
about 50 times slower: the default run takes about four minutes on two cores.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_actor import Contender, RawServer, Rec
from benchmarks.common import per_request_arguments, write_results

#: ``ours_httpx``: ours over the plain httpx transport of the HTTP seam (an
#: ``httpx2.AsyncHTTPTransport`` passed in), beside ``ours`` on the default, direct one.
CONTENDERS = ("ours", "skeleton", "floor", "ours_httpx")


def drive(impl: str, origin: str, tokens: int, warmup: int, requests: int) -> None:
    """Run ``warmup`` then ``requests`` streams of ``impl`` against ``origin``, one after
    the other; raise if one fails (what runs under callgrind)."""

    async def run() -> None:
        contender = Contender(
            "ours" if impl == "ours_httpx" else impl,
            origin,
            tokens,
            "",
            headers={"x-bench-events": str(tokens)},
            through_httpx2=impl == "ours_httpx",
        )

        async def body() -> None:
            for _ in range(warmup + requests):
                rec = Rec()
                await contender.stream(rec)
                if not rec.ok:
                    raise RuntimeError(f"{impl}: a stream failed: {rec.error}")

        await contender.run(body)

    trio.run(run)


def read_total(callgrind_out: str) -> int:
    """The total instruction count of a callgrind output file's text (its ``summary:``
    line, or ``totals:`` where the version writes that)."""
    for line in callgrind_out.splitlines():
        key, _, value = line.partition(":")
        if key in ("summary", "totals") and value.split():
            return int(value.split()[0])
    raise ValueError("no summary or totals line in the callgrind output")


def _start(
    valgrind: str, out: Path, impl: str, origin: str, tokens: int, warmup: int, requests: int
) -> subprocess.Popen[str]:
    """``drive`` in a process of its own under callgrind, writing its counts to ``out``."""
    command = [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--drive",
        impl,
        origin,
        str(tokens),
        str(warmup),
        str(requests),
    ]
    # One hash seed for every run: the layout of dicts and sets moves the count otherwise.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )


def count(
    valgrind: str, impl: str, origin: str, tokens: int, warmup: int, requests: int
) -> dict[str, Any]:
    """One contender's instructions per request (see the module doc): two processes under
    callgrind, run side by side."""
    runs = (requests, 3 * requests)
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder) / f"callgrind.{n}" for n in runs]
        procs = [
            _start(valgrind, out, impl, origin, tokens, warmup, n)
            for out, n in zip(outs, runs, strict=True)
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"{impl}: the run under callgrind failed:\n{err[-2000:]}")
        totals = [read_total(out.read_text()) for out in outs]
    return {
        "instructions_per_request": (totals[1] - totals[0]) / (runs[1] - runs[0]),
        "totals": dict(zip((str(n) for n in runs), totals, strict=True)),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--drive"]:
        impl, origin = argv[1:3]
        tokens, warmup, requests = (int(n) for n in argv[3:6])
        drive(impl, origin, tokens, warmup, requests)
        return 0
    parser, args, impls = per_request_arguments(
        argv,
        __doc__,
        CONTENDERS,
        requests_help="requests of the short run",
        warmup=30,
        json_path="benchmarks/results/instructions_per_request.json",
    )
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        parser.error("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    sizes = [int(t) for t in args.tokens.split(",")]
    server = RawServer()
    results: dict[str, Any] = {
        "server": "benchmarks/sse_server.py",
        "requests": [args.requests, 3 * args.requests],
        "warmup": args.warmup,
        "platform": f"{platform.platform()}, Python {platform.python_version()}",
        "sizes": {},
    }
    try:
        for tokens in sizes:
            results["sizes"][str(tokens)] = {
                impl: count(valgrind, impl, server.origin, tokens, args.warmup, args.requests)
                for impl in impls
            }
    finally:
        server.close()
    print(f"instructions per request (callgrind, C=1, {results['server']})")
    print("| deltas | impl | instructions/req | × floor |")
    print("|---|---|---|---|")
    for tokens, by_impl in results["sizes"].items():
        floor = by_impl.get("floor", {}).get("instructions_per_request")
        for impl, row in by_impl.items():
            per = row["instructions_per_request"]
            ratio = f"{per / floor:.3f}" if floor else "-"
            print(f"| {int(tokens):>6,} | {impl} | {per:,.0f} | {ratio} |")
    if not args.no_json:
        write_results(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
