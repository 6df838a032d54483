"""Running a whole load test: in this process, or over worker processes with merged results."""

from __future__ import annotations

import collections
import multiprocessing
import queue
import traceback
from collections.abc import Callable
from typing import Any

import attrs
import httpx2
import trio

from ..types import TrioSamplerError
from ._machine import load_average, machine
from ._plan import LoadTest
from ._results import LoadTestResult, StageResult, summarize_stage
from ._runner import Progress, run_stages
from ._stats import LatencyHistogram, StageStats

__all__ = ["LoadTestError", "run", "run_load_test"]

#: Seconds workers wait for each other at a stage's start before giving up.
BARRIER_TIMEOUT = 120.0
#: Seconds between a worker's progress messages.
PROGRESS_INTERVAL = 0.5


class LoadTestError(TrioSamplerError, RuntimeError):
    """A worker process failed; the message carries its traceback."""


def _version() -> str:
    from .. import __version__

    return __version__


def build_result(
    test: LoadTest, merged: list[StageStats], load_before: list[float] | None = None
) -> LoadTestResult:
    stages = tuple(
        StageResult(
            summarize_stage(
                stage.describe(),
                stage.label(),
                stats,
                cpu_bound=test.client_cpu_bound,
                lag_bound_ms=test.client_lag_bound_ms,
                slo_given=test.slo.given,
                memory_cap=test.max_buffered_response_bytes,
            )
        )
        for stage, stats in zip(test.stages, merged, strict=True)
    )
    described = {**test.describe(), "machine": machine(load_before)}
    return LoadTestResult(test=described, stages=stages, version=_version())


async def run_load_test(
    test: LoadTest,
    *,
    progress: Progress | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> LoadTestResult:
    """Run ``test`` in this process's Trio loop and return its result.

    ``progress`` (optional) is updated live, for a display running beside. ``transport``
    replaces the network (e.g. the emulator's in-memory transport, under the mock clock).
    Only one worker runs here: for ``workers > 1`` call :func:`run` from synchronous code.
    """
    if test.workers != 1:
        raise ValueError(
            f"run_load_test runs in this process; for workers={test.workers} call "
            "trio_sampler.loadtest.run(test), which starts the worker processes"
        )
    load_before = load_average()
    stages = await run_stages(test, progress=progress, transport=transport)
    merged = [s if s is not None else StageStats() for s in stages]
    return build_result(test, merged, load_before)


def run(
    test: LoadTest,
    *,
    on_progress: Callable[[int, list[Progress]], None] | None = None,
) -> LoadTestResult:
    """Run ``test`` to the end (synchronous) and return its result.

    With ``workers == 1`` the test runs in this process under ``trio.run``; otherwise in
    ``workers`` processes (started with ``spawn``), each with its own sampler, which meet
    at a barrier before every stage and send back their histograms, merged here.

    ``on_progress(stage, per_worker)`` is called about twice a second with each worker's
    latest :class:`Progress` (its ``stats`` hold the histograms recorded so far).

    Raises:
        LoadTestError: a worker failed (its traceback is in the message).
    """
    if test.workers == 1:
        return _run_here(test, on_progress)
    return _run_workers(test, on_progress)


def _run_here(
    test: LoadTest, on_progress: Callable[[int, list[Progress]], None] | None
) -> LoadTestResult:
    progress = Progress()

    async def main() -> LoadTestResult:
        async with trio.open_nursery() as nursery:
            if on_progress is not None:

                async def report() -> None:
                    while True:
                        on_progress(progress.stage, [progress])
                        await trio.sleep(PROGRESS_INTERVAL)

                nursery.start_soon(report)
            result = await run_load_test(test, progress=progress)
            nursery.cancel_scope.cancel()
        return result

    return trio.run(main)


def _worker_main(
    test: LoadTest, api_key: str | None, worker: int, messages: Any, barrier: Any
) -> None:
    """A worker process: run every stage, sending progress and each stage's statistics."""
    try:
        if api_key is not None:
            test = attrs.evolve(test, config=test.config.evolve(api_key=api_key))
        trio.run(_worker, test, worker, messages, barrier)
    except BaseException:
        messages.put(("error", worker, traceback.format_exc()))
        barrier.abort()


async def _worker(test: LoadTest, worker: int, messages: Any, barrier: Any) -> None:
    progress = Progress()

    async def before_stage(index: int) -> None:
        await trio.to_thread.run_sync(barrier.wait, BARRIER_TIMEOUT)

    def on_stage(index: int, stats: StageStats) -> None:
        messages.put(("stage", worker, index, stats.to_wire()))

    async with trio.open_nursery() as nursery:

        async def report() -> None:
            while True:
                await trio.sleep(PROGRESS_INTERVAL)
                stats = progress.stats
                snapshot = _snapshot(progress)
                messages.put(
                    ("progress", worker, snapshot, None if stats is None else _partial(stats))
                )

        nursery.start_soon(report)
        stages = await run_stages(
            test, worker=worker, progress=progress, on_stage=on_stage, before_stage=before_stage
        )
        for index, stats in enumerate(stages):
            if stats is None:
                messages.put(("stage", worker, index, None))
        nursery.cancel_scope.cancel()
    messages.put(("done", worker, None, None))


def _snapshot(progress: Progress) -> dict[str, Any]:
    return {
        "stage": progress.stage,
        "label": progress.label,
        "started_at": progress.started_at,
        "measuring": progress.measuring,
        "sent": progress.sent,
        "finished": progress.finished,
        "failed": progress.failed,
        "in_flight": progress.in_flight,
        "output_tokens": progress.output_tokens,
    }


def _partial(stats: StageStats) -> dict[str, dict[int, int]]:
    # The live values (a copy: the worker keeps recording), not the encoded histograms:
    # encoding would flush them, which costs the worker's event loop milliseconds.
    return {name: dict(stats.histograms[name].unflushed()) for name in ("ttft", "itl")}


def _from_snapshot(snapshot: dict[str, Any], partial: dict[str, dict[int, int]] | None) -> Progress:
    progress = Progress(**snapshot)
    if partial is not None:
        stats = StageStats()
        for name, counts in partial.items():
            stats.histograms[name] = LatencyHistogram.from_counts(collections.Counter(counts))
        progress.stats = stats
    return progress


def _run_workers(
    test: LoadTest, on_progress: Callable[[int, list[Progress]], None] | None
) -> LoadTestResult:
    load_before = load_average()
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    barrier = context.Barrier(test.workers)
    # A Secret refuses to be pickled (so it cannot leak into a pickle by accident); the
    # key travels to the workers, over their private pipe, as a separate argument.
    key = test.config.api_key
    keyless = attrs.evolve(test, config=test.config.evolve(api_key=None))
    processes = [
        context.Process(
            target=_worker_main,
            args=(keyless, None if key is None else key.reveal(), worker, messages, barrier),
            name=f"trio-sampler-loadtest-{worker}",
            daemon=True,
        )
        for worker in range(test.workers)
    ]
    for process in processes:
        process.start()
    latest: dict[int, Progress] = {}
    per_stage: list[dict[int, StageStats | None]] = [{} for _ in test.stages]
    done: set[int] = set()
    try:
        while len(done) < test.workers:
            try:
                kind, worker, first, second = messages.get(timeout=PROGRESS_INTERVAL)
            except queue.Empty:
                dead = [p for i, p in enumerate(processes) if i not in done and not p.is_alive()]
                if dead:
                    raise LoadTestError(
                        f"worker {dead[0].name} exited with status {dead[0].exitcode} "
                        "without reporting"
                    ) from None
                continue
            if kind == "error":
                raise LoadTestError(f"worker {worker} failed:\n{first}")
            if kind == "progress":
                latest[worker] = _from_snapshot(first, second)
                if on_progress is not None:
                    stage = max(p.stage for p in latest.values())
                    on_progress(stage, list(latest.values()))
            elif kind == "stage":
                per_stage[first][worker] = None if second is None else StageStats.from_wire(second)
            elif kind == "done":
                done.add(worker)
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join()
    merged = []
    for stage_stats in per_stage:
        total = StageStats()
        for stats in stage_stats.values():
            if stats is not None:
                total.merge(stats)
        merged.append(total)
    return build_result(test, merged, load_before)
