"""Eight OS processes behind one shared limit, against an emulator enforcing the same limit.

Each worker process (``benchmarks.fleet_load``) runs one sampler with 50 tasks that
submit back to back over real loopback HTTP; the fleet limiter in Redis is all that
coordinates them. The window is scaled down from a minute to 10 s (the logic is the
same): three windows, measured over the last two (the first holds the initial burst).
"""

from __future__ import annotations

import collections
import functools
import json
import subprocess
import time
import uuid
from typing import Any

import trio

from benchmarks.fleet_load import worker_command
from benchmarks.redis_server import RedisServer
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits, serve

PROCESSES = 8
# After every worker is ready, the common start is this far ahead.
LEAD = 0.5


class _Start:
    """The common start time, set once every worker is ready."""

    def __init__(self) -> None:
        self.ready = trio.Semaphore(0)
        self.go = trio.Event()
        self.at = 0.0


async def _worker(command: list[str], start: _Start) -> dict[str, Any]:
    """One worker process: wait for its "ready", hand it the start time, read its report."""
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    assert stdin is not None and stdout is not None and stderr is not None
    output = bytearray()
    errors = bytearray()
    try:
        async with trio.open_nursery() as nursery:

            async def drain_stderr() -> None:
                async for chunk in stderr:
                    errors.extend(chunk)

            nursery.start_soon(drain_stderr)
            async for chunk in stdout:
                output.extend(chunk)
                if b"ready\n" in output:
                    break
            assert b"ready\n" in output, errors.decode()[-2000:]
            start.ready.release()
            await start.go.wait()
            await stdin.send_all(f"{start.at}\n".encode())
            async for chunk in stdout:
                output.extend(chunk)
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
        await stdin.aclose()
        await stdout.aclose()
        await stderr.aclose()
    assert process.returncode == 0, errors.decode()[-2000:]
    report: dict[str, Any] = json.loads(output.decode().strip().splitlines()[-1])
    return report


async def _run_fleet(
    redis_server: RedisServer, app: EmulatorApp, **options: Any
) -> tuple[float, list[dict[str, Any]]]:
    """Start the emulator and ``PROCESSES`` workers; return the start time and the reports."""
    reports: list[dict[str, Any]] = []
    start = _Start()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app, backlog=4096))
        command = worker_command(
            redis=redis_server.url,
            base_url=f"http://127.0.0.1:{server.port}/v1",
            name=f"procs-{uuid.uuid4().hex[:10]}",
            **options,
        )

        async def worker() -> None:
            reports.append(await _worker(command, start))

        with trio.fail_after(180):
            async with trio.open_nursery() as workers:
                for _ in range(PROCESSES):
                    workers.start_soon(worker)
                for _ in range(PROCESSES):
                    await start.ready.acquire()
                start.at = time.time() + LEAD
                start.go.set()
        nursery.cancel_scope.cancel()
    return start.at, reports


async def test_eight_processes_never_exceed_the_shared_limit(redis_server: RedisServer) -> None:
    window = 10.0
    limit = 60  # requests per window at the emulator: 6 per second
    tokens = limit * 100
    app = EmulatorApp(
        cache=PromptCache(),
        rate_limits=RateLimits(
            requests_per_minute=limit, tokens_per_minute=tokens, window_s=window
        ),
    )
    # The fleet's limits sit a little under the provider's: 97 % of the rate and a quarter
    # of the burst, headroom for the varying delay between admission (on Redis's clock) and
    # arrival (on the emulator's): a request admitted early but delivered late must not
    # make the provider's bucket tighter than ours.
    start_at, reports = await _run_fleet(
        redis_server,
        app,
        tasks=50,
        duration=3 * window,
        window=window,
        rpm=limit * 0.97,
        tpm=tokens * 0.97,
        burst=0.25,
        max_retries=0,
    )
    records = [r for report in reports for r in report["records"]]
    assert app.rate_limits is not None
    per_second = collections.Counter(int(r["done"] - start_at) for r in records)
    assert app.rate_limits.refusals == {}, (app.rate_limits.refusals, per_second)
    assert not [r for r in records if not r["ok"]], [r["error"] for r in records if not r["ok"]][:5]
    assert sum(r["rate_limited"] for r in records) == 0
    assert all(report["events"] == [] for report in reports)  # Redis never degraded
    # Steady state, windows 2 and 3: the fleet ran at the shared limit, within 5 %.
    measured = sum(start_at + window <= r["done"] < start_at + 3 * window for r in records)
    expected = 2 * limit
    per_second = collections.Counter(int(r["done"] - start_at) for r in records)
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected, per_second)
    # Every worker took part (the limit is shared, not hoarded by one process).
    assert all(len(report["records"]) > 0 for report in reports)


async def test_fleet_retry_budget_across_eight_processes(redis_server: RedisServer) -> None:
    # A primary that answers 503 to everything. Without a budget: 160 first attempts x 5
    # retries = 800 retries. With the fleet budget (ratio 0.1, 5 tokens): at most
    # 5 + 0.1 x 160 = 21, across all eight processes together.
    outage = json.dumps({"faults": [{"type": "status", "status": 503}]})
    app = EmulatorApp(cache=PromptCache())
    _, reports = await _run_fleet(
        redis_server,
        app,
        tasks=5,
        max_requests=4,
        duration=60.0,
        rpm=1_000_000,
        max_retries=5,
        budget_ratio=0.1,
        budget_tokens=5,
        script=outage,
    )
    records = [r for report in reports for r in report["records"]]
    assert len(records) == PROCESSES * 5 * 4
    assert not any(r["ok"] for r in records)
    retries = sum(r["retries"] for r in records)
    assert 5 <= retries <= 5 + 0.1 * len(records), retries
