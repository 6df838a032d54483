"""How much of a shared limit a fleet uses: eight worker processes behind one limit.

A private ``redis-server`` and the emulator (over loopback HTTP) enforcing the same limits
are started; ``--processes`` worker processes (``benchmarks.fleet_load``), each one sampler
with ``--tasks`` tasks submitting back to back, share one fleet limiter. Two cells:

* ``requests``: the requests-per-window limit binds (tokens are plentiful);
* ``tokens``: the tokens-per-window limit binds (each request reserves its prompt
  estimate and its ``max_output_tokens``, 40, and uses fewer: the unused part comes back).

The window is scaled down from a minute to ``--window`` seconds (the logic is the one of
a minute); each cell runs ``--warmup`` windows (1 by default) and then the two it
measures (the warm-up holds the initial burst, and whatever of its budget the fleet's
slow start left unused: any interval may hold up to ``burst`` windows beyond the rate,
so only a steady state can be within a few per cent of the limit). The fleet's limits
are 97 % of the emulator's (headroom for the delay between admission and arrival).
Reported per cell: what was admitted over the measured windows against the fleet's limit
(the target: within 5 % of it), counted by when each request ended and by when it
started (its response headers), per window, the emulator's 429s (the target: none) and
failed requests.

The workers' limiters are as by default (leases on: each process spends a batch held
locally, ``LimiterSpec.leases``). Run ``python benchmarks/fleet_limit_use.py``
(``--quick``: 4 processes, 5 s windows; ``--per-request``: ``leases=None``, one round
trip per admission; ``--estimator count``: the fleet reserves each prompt by the
provider's count, taken once per worker with ``count_tokens``, instead of body bytes / 4,
over the Responses API unless ``--backend`` says otherwise); results go to
``benchmarks/results/fleet_limit_use.json`` (``fleet_limit_use_per_request.json`` with
``--per-request``, ``fleet_limit_use_count.json`` with the counting estimator).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

try:
    from benchmarks.fleet_load import worker_command
    from benchmarks.redis_server import RedisServer, running_redis
except ModuleNotFoundError:  # run as a script: python benchmarks/fleet_limit_use.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.fleet_load import worker_command
    from benchmarks.redis_server import RedisServer, running_redis

from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits, serve

DEFAULT_JSON = Path(__file__).parent / "results" / "fleet_limit_use.json"
#: The fleet's limits, as a share of the emulator's.
HEADROOM = 0.97
TARGET_USE = 0.95
# After every worker is ready, the common start is this far ahead (seconds).
LEAD = 0.5


async def _worker(
    command: list[str], ready: trio.Semaphore, go: trio.Event, at: list[float]
) -> Any:
    """One worker process: its "ready", then the start time, then its report."""
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdin is not None and process.stdout is not None
    output = bytearray()
    try:
        async for chunk in process.stdout:
            output.extend(chunk)
            if b"ready\n" in output:
                break
        ready.release()
        await go.wait()
        await process.stdin.send_all(f"{at[0]}\n".encode())
        async for chunk in process.stdout:
            output.extend(chunk)
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
        await process.stdin.aclose()
        await process.stdout.aclose()
    return json.loads(output.decode().strip().splitlines()[-1])


async def run_cell(
    redis: RedisServer,
    binding: str,
    *,
    processes: int,
    tasks: int,
    window: float,
    leases: bool = True,
    warmup: int = 1,
    backend: str = "chat_completions",
    estimator: str = "body",
) -> dict[str, Any]:
    """One cell: the fleet against the emulator, with ``binding`` the limit that binds."""
    requests, tokens = (60, 60 * 400) if binding == "requests" else (60 * 100, 6000)
    app = EmulatorApp(
        cache=PromptCache(),
        rate_limits=RateLimits(
            requests_per_minute=requests, tokens_per_minute=tokens, window_s=window
        ),
    )
    reports: list[Any] = []
    ready, go, at = trio.Semaphore(0), trio.Event(), [0.0]
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app, backlog=4096))
        command = worker_command(
            redis=redis.url,
            base_url=f"http://127.0.0.1:{server.port}/v1",
            name=f"use-{uuid.uuid4().hex[:10]}",
            tasks=tasks,
            duration=(warmup + 2) * window,
            window=window,
            rpm=requests * HEADROOM,
            tpm=tokens * HEADROOM,
            burst=0.25,
            max_retries=0,
            leases="on" if leases else "off",
            backend=backend,
            estimator=estimator,
        )

        async def worker() -> None:
            reports.append(await _worker(command, ready, go, at))

        with trio.fail_after(30 * window):
            async with trio.open_nursery() as workers:
                for _ in range(processes):
                    workers.start_soon(worker)
                for _ in range(processes):
                    await ready.acquire()
                at[0] = time.time() + LEAD
                go.set()
        nursery.cancel_scope.cancel()
    records = [r for report in reports for r in report["records"]]
    start = at[0]
    begin, end = start + warmup * window, start + (warmup + 2) * window
    measured = [r for r in records if begin <= r["done"] < end]
    # By when each request started (its headers: when the server charged it, what the
    # fleet's guarantee counts), beside when it ended.
    started = [r for r in records if r["started"] and begin <= r["started"] < end]
    if binding == "requests":
        limit = 2 * requests * HEADROOM
        admitted, by_start = float(len(measured)), float(len(started))
    else:
        limit = 2 * tokens * HEADROOM
        admitted = float(sum(r["tokens"] for r in measured))
        by_start = float(sum(r["tokens"] for r in started))
    assert app.rate_limits is not None
    counted = {report["counted_prompt_tokens"] for report in reports}
    billed = {r["input_tokens"] for r in records if r["input_tokens"] is not None}
    return {
        "binding": binding,
        "leases": leases,
        "backend": backend,
        "estimator": estimator,
        "counted_prompt_tokens": sorted(c for c in counted if c is not None),
        "billed_prompt_tokens": sorted(billed),
        "processes": processes,
        "tasks": tasks,
        "window_s": window,
        "warmup_windows": warmup,
        "fleet_limit": limit,
        "admitted": admitted,
        "use": admitted / limit,
        "admitted_by_start": by_start,
        # Per window (the first holds the initial burst), by start: requests or tokens.
        "windows_by_start": [
            sum(
                1 if binding == "requests" else r["tokens"]
                for r in records
                if r["started"] and start + k * window <= r["started"] < start + (k + 1) * window
            )
            for k in range(warmup + 2)
        ],
        "use_by_start": by_start / limit,
        "over_limit_429s": sum(app.rate_limits.refusals.values()),
        "failed": sum(not r["ok"] for r in records),
        "requests": len(measured),
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cells = []
    with running_redis() as redis:
        for binding in ("requests", "tokens"):
            cells.append(
                await run_cell(
                    redis,
                    binding,
                    processes=args.processes,
                    tasks=args.tasks,
                    window=args.window,
                    leases=not args.per_request,
                    warmup=args.warmup,
                    backend=args.backend,
                    estimator=args.estimator,
                )
            )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="4 processes, 5 s windows")
    parser.add_argument("--warmup", type=int, default=1, help="windows run before the two measured")
    parser.add_argument(
        "--per-request", action="store_true", help="leases=None: one round trip per admission"
    )
    parser.add_argument(
        "--estimator",
        choices=("body", "count"),
        default="body",
        help="the fleet's prompt estimate: body bytes / 4, or the provider's count",
    )
    parser.add_argument(
        "--backend",
        help="the workers' API (default: chat_completions; responses with --estimator count)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.backend is None:
        args.backend = "responses" if args.estimator == "count" else "chat_completions"
    if args.json is None:
        suffix = ("_per_request" if args.per_request else "") + (
            "_count" if args.estimator == "count" else ""
        )
        args.json = DEFAULT_JSON.with_stem(DEFAULT_JSON.stem + suffix)
    if args.quick:
        args.processes, args.window = 4, 5.0
    cells = trio.run(run, args)
    print(
        f"{'binding':<10}{'limit':>10}{'admitted':>10}{'use':>8}"
        f"{'by start':>10}{'use':>8}{'429s':>6}{'failed':>8}"
    )
    for cell in cells:
        print(
            f"{cell['binding']:<10}{cell['fleet_limit']:>10.0f}{cell['admitted']:>10.0f}"
            f"{cell['use']:>8.1%}{cell['admitted_by_start']:>10.0f}{cell['use_by_start']:>8.1%}"
            f"{cell['over_limit_429s']:>6}{cell['failed']:>8}"
        )
    verdict = all(abs(c["use"] - 1) <= 1 - TARGET_USE and c["over_limit_429s"] == 0 for c in cells)
    print(
        f"target: use within {1 - TARGET_USE:.0%} of the limit and no 429: "
        f"{'met' if verdict else 'NOT met'}"
    )
    for cell in cells:
        if cell["estimator"] == "count":
            print(
                f"{cell['binding']}: prompt counted {cell['counted_prompt_tokens']}, "
                f"billed {cell['billed_prompt_tokens']}"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "cells": cells,
        "target_use": TARGET_USE,
        "command": " ".join(["python", "benchmarks/fleet_limit_use.py", *sys.argv[1:]]),
        "met": verdict,
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
