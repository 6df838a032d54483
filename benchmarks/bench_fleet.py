"""Admission latency of the fleet limiter over a Unix socket: p50 / p99 per round trip.

A private ``redis-server`` (persistence off, Unix socket) is started; one process opens a
:class:`~trio_sampler.fleet.FleetLimiter` and measures, with ``time.perf_counter``, the
full cost a request pays: ``acquire`` (the ADMIT script: every dimension, the lease, the
retry-budget deposit) and ``release`` (the SETTLE script), each one round trip. Cells:

* ``admit`` / ``settle`` one at a time (the latency of a lone request), with
  ``leases=None`` (one ADMIT and one SETTLE round trip per request);
* ``admit`` with 1, 10 and 100 concurrent tasks sharing the client (the latency under
  load, and the admissions per second one process gets), ``leases=None``;
* the same cells as a limiter is by default, with leases (``LimiterSpec.leases``, a
  ``LeasePolicy()``): admissions spent from a batch held locally, one LEASE round trip
  per batch.

Each cell also reports the process's CPU time per call (``time.process_time``: this
process only, not Redis's; in the concurrent cells per admission, its settlement
included), which a busy machine disturbs less than the wall-clock latency. The load
average is printed and recorded beside the numbers.

Limits are set high so nothing waits: this measures the mechanism, not the limits.
Targets: admission p50 <= 0.3 ms, p99 <= 2 ms (one round trip each); by default (with
leases), at least 20,000 admissions per second at 10 tasks, admit p99 <= 2 ms. Run
``python benchmarks/bench_fleet.py`` (``--quick`` for a short run); results go to
``benchmarks/results/bench_fleet.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import trio

try:
    from benchmarks.redis_server import running_redis
except ModuleNotFoundError:  # run as a script: python benchmarks/bench_fleet.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.redis_server import running_redis

from trio_sampler.fleet import (
    Cost,
    FailurePolicy,
    FleetLimiter,
    FleetLimits,
    LimiterSpec,
    RetryBudgetSpec,
    open_limiter,
)

DEFAULT_JSON = Path(__file__).parent / "results" / "bench_fleet.json"
TARGET_P50_MS = 0.3
TARGET_P99_MS = 2.0
TARGET_LEASED_PER_S = 20_000

#: A limiter as it is by default: leases on (``LeasePolicy()``).
LEASED = LimiterSpec(
    "bench:account-leased",
    FleetLimits(
        requests_per_minute=1e9,
        input_tokens_per_minute=1e12,
        output_tokens_per_minute=1e12,
        tokens_per_minute=1e12,
        max_in_flight=1_000_000,
    ),
    on_failure=FailurePolicy.FAIL_CLOSED,
    retry_budget=RetryBudgetSpec(),
    admission_timeout=5.0,
)
#: Every admission and settlement its own round trip (``leases=None``).
SPEC = attrs.evolve(LEASED, name="bench:account", leases=None)
COST = Cost(1, 1_200, 400)
ACTUAL = Cost(1, 1_150, 120)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def _sequential(limiter: FleetLimiter, count: int) -> dict[str, Any]:
    admit: list[float] = []
    settle: list[float] = []
    admit_cpu = settle_cpu = 0.0
    clock, cpu = time.perf_counter, time.process_time
    for _ in range(count):
        start, start_cpu = clock(), cpu()
        permit = await limiter.acquire(COST)
        middle, middle_cpu = clock(), cpu()
        await limiter.release(permit, ACTUAL)
        end, end_cpu = clock(), cpu()
        admit.append(middle - start)
        settle.append(end - middle)
        admit_cpu += middle_cpu - start_cpu
        settle_cpu += end_cpu - middle_cpu
    return {
        "admit": {**_percentiles(admit), "cpu_ms": admit_cpu / count * 1000},
        "settle": {**_percentiles(settle), "cpu_ms": settle_cpu / count * 1000},
        "n": count,
    }


async def _concurrent(limiter: FleetLimiter, tasks: int, per_task: int) -> dict[str, Any]:
    admit: list[float] = []

    async def one() -> None:
        for _ in range(per_task):
            start = time.perf_counter()
            permit = await limiter.acquire(COST)
            admit.append(time.perf_counter() - start)
            await limiter.release(permit, ACTUAL)

    began, began_cpu = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(one)
    elapsed = time.perf_counter() - began
    # Per admission, its settlement included (both round trips).
    cpu_ms = (time.process_time() - began_cpu) / len(admit) * 1000
    return {
        "tasks": tasks,
        "admit": {**_percentiles(admit), "cpu_ms": cpu_ms},
        "admissions_per_s": len(admit) / elapsed,
        "n": len(admit),
    }


async def _cells(spec: LimiterSpec, url: str, count: int) -> dict[str, Any]:
    async with open_limiter(spec, url) as limiter:
        await _sequential(limiter, 200)  # warm up
        sequential = await _sequential(limiter, count)
        concurrent = [
            await _concurrent(limiter, tasks, max(1, count // tasks // 2)) for tasks in (1, 10, 100)
        ]
        stats = limiter.statistics()
        assert stats.redis_failures == 0
    return {
        "sequential": sequential,
        "concurrent": concurrent,
        "round_trips": stats.lease_refills if spec.leases else None,
    }


async def _run(url: str, quick: bool) -> dict[str, Any]:
    count = 2_000 if quick else 20_000
    plain = await _cells(SPEC, url, count)
    leased = await _cells(LEASED, url, 10 * count)
    return {"sequential": plain["sequential"], "concurrent": plain["concurrent"], "leased": leased}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with running_redis() as server:
        cells = trio.run(_run, server.url, args.quick)
    seq = cells["sequential"]
    print(
        f"{'cell':<34}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'CPU ms':>9}"
        f"{'per s':>10}"
    )
    rows = [
        ("per-request admit (1 at a time)", seq["admit"], None),
        ("per-request settle", seq["settle"], None),
    ]
    rows += [
        (f"per-request admit, {c['tasks']} tasks", c["admit"], c["admissions_per_s"])
        for c in cells["concurrent"]
    ]
    leased = cells["leased"]
    rows += [
        ("default admit (1 at a time)", leased["sequential"]["admit"], None),
        ("default settle", leased["sequential"]["settle"], None),
    ]
    rows += [
        (f"default admit, {c['tasks']} tasks", c["admit"], c["admissions_per_s"])
        for c in leased["concurrent"]
    ]
    for name, p, rate in rows:
        per_s = f"{rate:>10.0f}" if rate else f"{'':>10}"
        print(
            f"{name:<34}{p['p50_ms']:>9.3f}{p['p90_ms']:>9.3f}{p['p99_ms']:>9.3f}"
            f"{p['max_ms']:>9.3f}{p['cpu_ms']:>9.3f}{per_s}"
        )
    met = seq["admit"]["p50_ms"] <= TARGET_P50_MS and seq["admit"]["p99_ms"] <= TARGET_P99_MS
    print(
        f"target p50 <= {TARGET_P50_MS} ms, p99 <= {TARGET_P99_MS} ms "
        "(per request, one at a time): "
        f"{'met' if met else 'missed'}"
    )
    ten = next(c for c in leased["concurrent"] if c["tasks"] == 10)
    leased_met = (
        ten["admissions_per_s"] >= TARGET_LEASED_PER_S and ten["admit"]["p99_ms"] <= TARGET_P99_MS
    )
    print(
        f"target by default (leases), 10 tasks: >= {TARGET_LEASED_PER_S} admissions/s, p99 <= "
        f"{TARGET_P99_MS} ms: {'met' if leased_met else 'missed'} "
        f"({leased['round_trips']} LEASE round trips in all)"
    )
    print(
        "load average (1, 5, 15 min): before "
        + " ".join(f"{x:.2f}" for x in load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    result = {
        "benchmark": "bench_fleet",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average": os.getloadavg(),
        },
        "targets": {
            "p50_ms": TARGET_P50_MS,
            "p99_ms": TARGET_P99_MS,
            "met": met,
            "leased_per_s": TARGET_LEASED_PER_S,
            "leased_met": leased_met,
        },
        "quick": args.quick,
        **cells,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
