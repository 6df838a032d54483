"""The fleet limiter while Redis fails: paused, slowed, restarted empty, answering garbage.

A private ``redis-server`` behind a loopback proxy (``benchmarks/redis_proxy.py``), and a
sampler whose admissions go through a :class:`~trio_sampler.fleet.FleetAdmission` on it
(leases as by default), against the in-process emulator. ``--tasks`` tasks submit
requests (50 ms apart) from one second before the fault to its end; then, as another
process of the fleet would, a second limiter asks for every in-flight slot until it has
them all. Scenarios:

* ``pause``: the redis-server process stopped (``SIGSTOP``) for 3 s;
* ``slow``: every reply held 0.5 s (twice the admission timeout) for 5 s;
* ``restart``: redis-server stopped and started again, empty (no state, no scripts);
* ``garbage``: every reply replaced by ``+OK`` (a reply of the wrong shape) for 3 s.

Each runs once failing closed and once failing open. Reported per run: the requests and
their terminals (exactly one each), how they ended, the longest request, and how long a
refused request took from the later of its submission and the fault's start ("refused";
the policy applies within one admission timeout: a refused request ends in about that).
A request may queue for an in-flight slot before the fault (20 tasks, 16 slots): the
longest refused request counted from its submission is written to the JSON too
(``longest_refused_since_submit_s``). Also reported: how long
after the fault ended every in-flight slot was free to the other process ("capacity
back"; the target: within one admission timeout, 0.25 s, plus the lease's ``hold``
where the sampler's own lease keeps idle slots that long). The load average is printed.

    python benchmarks/fleet_redis_faults.py [--tasks 20]
        [--json benchmarks/results/fleet_redis_faults.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results
from benchmarks.redis_proxy import RedisProxy, running_proxy
from benchmarks.redis_server import RedisServer, running_redis
from trio_sampler import ConversationRequest, SamplerConfig, User
from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.emulator import EmulatorApp, PromptCache
from trio_sampler.fleet import (
    AdmissionRefusedError,
    Cost,
    FailurePolicy,
    FleetAdmission,
    FleetLimits,
    LimiterSpec,
    Permit,
    open_limiter,
)
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Completed, Failed

ADMISSION_TIMEOUT = 0.25
IN_FLIGHT = 16
LIMITS = FleetLimits(requests_per_minute=100_000, max_in_flight=IN_FLIGHT)
REQUEST = ConversationRequest(items=[User("hello")], max_output_tokens=20)
CONFIG = SamplerConfig(base_url="http://emulator.test/v1", model="m", api_key="test-key")
#: How long "capacity back" is waited for, at most (lease_ttl is 30 s).
CAPACITY_WAIT_S = 10.0


async def _pause(server: RedisServer, _proxy: RedisProxy) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        await trio.sleep(3.0)
    finally:
        server.process.send_signal(signal.SIGCONT)


async def _slow(_server: RedisServer, proxy: RedisProxy) -> None:
    proxy.delay = 2 * ADMISSION_TIMEOUT
    await trio.sleep(5.0)
    proxy.delay = 0.0


async def _restart(server: RedisServer, _proxy: RedisProxy) -> None:
    await trio.to_thread.run_sync(server.stop)
    await trio.to_thread.run_sync(server.start)


async def _garbage(_server: RedisServer, proxy: RedisProxy) -> None:
    proxy.wrong = b"+OK\r\n"
    await trio.sleep(3.0)
    proxy.wrong = None


FAULTS: dict[str, Callable[[RedisServer, RedisProxy], Awaitable[None]]] = {
    "pause 3 s": _pause,
    "slow 5 s": _slow,
    "restart empty": _restart,
    "garbage 3 s": _garbage,
}


async def _load(sampler: SamplerHandle, until: trio.Event, records: list[dict[str, Any]]) -> None:
    """Submit requests one after the other (50 ms apart) until ``until`` is set."""
    while not until.is_set():
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        terminals = [e async for e in stream if isinstance(e, Completed | Failed)]
        records.append(
            {
                "start": start,
                "terminals": len(terminals),
                "end": "completed"
                if terminals and isinstance(terminals[-1], Completed)
                else (
                    terminals[-1].error.kind.value
                    if terminals and isinstance(terminals[-1], Failed)
                    else "none"
                ),
                "took_s": trio.current_time() - start,
            }
        )
        await trio.sleep(0.05)


async def _capacity_back(spec: LimiterSpec, url: str, since: float) -> float:
    """Seconds from ``since`` (the fault's end) until another process gets every in-flight
    slot at once."""
    other = LimiterSpec(spec.name, LIMITS, on_failure=FailurePolicy.FAIL_CLOSED, leases=None)
    start = trio.current_time()
    async with open_limiter(other, url) as limiter:
        while trio.current_time() - start < CAPACITY_WAIT_S:
            held: list[Permit] = []
            try:
                for _ in range(IN_FLIGHT):
                    deadline = trio.current_time() + 0.005
                    held.append(await limiter.acquire(Cost(), deadline=deadline))
            except AdmissionRefusedError:
                pass
            for permit in held:
                await limiter.release(permit, None)
            if len(held) == IN_FLIGHT:
                return trio.current_time() - since
            await trio.sleep(0.02)
    return float("inf")


async def _one(fault: str, policy: FailurePolicy, tasks: int) -> dict[str, Any]:
    spec = LimiterSpec(
        f"faults-{uuid.uuid4().hex[:10]}",
        LIMITS,
        on_failure=policy,
        fallback_share=1.0 if policy is FailurePolicy.FAIL_OPEN else None,
        admission_timeout=ADMISSION_TIMEOUT,
        probe_interval=0.1,
    )
    records: list[dict[str, Any]] = []
    with running_redis() as server:
        async with (
            running_proxy(str(server.socket_path)) as proxy,
            EmulatorTransport(EmulatorApp(cache=PromptCache())) as transport,
            open_sampler(
                CONFIG, transport=transport, admission=FleetAdmission(proxy.url, spec)
            ) as sampler,
        ):
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(_load, sampler, stop, records)
                await trio.sleep(1.0)
                fault_at = trio.current_time()
                await FAULTS[fault](server, proxy)
                fault_end = trio.current_time()
                stop.set()
            back = await _capacity_back(spec, server.url, fault_end)
    ends = Counter(r["end"] for r in records)
    refused = [r for r in records if r["end"] == "fleet_unavailable"]
    return {
        "fault": fault,
        "policy": policy.value,
        "requests": len(records),
        "one_terminal_each": all(r["terminals"] == 1 for r in records),
        "ends": dict(ends),
        "longest_request_s": max(r["took_s"] for r in records),
        "longest_refused_s": max(
            (r["start"] + r["took_s"] - max(r["start"], fault_at) for r in refused),
            default=0.0,
        ),
        "longest_refused_since_submit_s": max((r["took_s"] for r in refused), default=0.0),
        "capacity_back_s": back,
    }


async def _run(tasks: int, faults: list[str]) -> list[dict[str, Any]]:
    rows = []
    for fault in faults:
        for policy in (FailurePolicy.FAIL_CLOSED, FailurePolicy.FAIL_OPEN):
            rows.append(await _one(fault, policy, tasks))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--faults", nargs="*", choices=list(FAULTS), default=list(FAULTS))
    parser.add_argument("--json", default="benchmarks/results/fleet_redis_faults.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = trio.run(_run, args.tasks, args.faults)
    header = (
        f"{'fault':<14}{'policy':<12}{'requests':>9}{'1 terminal':>11}{'longest s':>10}"
        f"{'refused s':>10}{'(submit) s':>11}{'capacity s':>11}  ends"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ends = ", ".join(f"{kind} {count}" for kind, count in sorted(row["ends"].items()))
        print(
            f"{row['fault']:<14}{row['policy']:<12}{row['requests']:>9}"
            f"{'yes' if row['one_terminal_each'] else 'NO':>11}{row['longest_request_s']:>10.3f}"
            f"{row['longest_refused_s']:>10.3f}{row['longest_refused_since_submit_s']:>11.3f}"
            f"{row['capacity_back_s']:>11.3f}  {ends}"
        )
    load_after = os.getloadavg()
    print(
        "load average (1, 5, 15 min): before "
        + " ".join(f"{x:.2f}" for x in load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in load_after)
    )
    write_results(
        args.json,
        {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "admission_timeout_s": ADMISSION_TIMEOUT,
            "tasks": args.tasks,
            "runs": rows,
        },
    )


if __name__ == "__main__":
    main()
