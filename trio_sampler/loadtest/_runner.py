"""Running stages in one process: the closed and open loops, the timestamps, the self-check.

The timestamps of a request (``trio.current_time()`` values):

* ``submitted``: taken by the task that sends the request, just before
  :meth:`SamplerHandle.submit`;
* ``sent``: when the request's last byte was written to its connection, as the sampler's
  HTTP layer saw it (``RequestMetrics.time_to_request_sent_ms``); ``submitted`` on a
  transport that does not report it (the in-memory emulator);
* ``first`` and ``last``: when the bytes of the network reads that brought the first
  output and the end of the body arrived (``time_to_first_token_ms``,
  ``time_to_last_byte_ms``: the kernel's receive timestamps, the load generator's
  samplers having ``receive_timestamps`` on);
* ``t_i``: when the bytes of the read that brought each output event arrived
  (``RequestStream.received_at``), and ``done``: when the sending task reads the terminal.

TTFT = ``first - sent``; E2E = ``last - sent``; TPOT = ``(E2E - TTFT) / (output_tokens -
1)``; ITL = the gaps between consecutive output events' ``t_i``. The client's own time
before the wire, ``sent - submitted``, is reported beside them (``request_write``).
"""

from __future__ import annotations

import contextlib
import gc
import random
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import attrs
import httpx2
import trio

from ..actor import SamplerHandle, open_sampler
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy
from ..types import Cancelled, ChannelToken, Completed, Failed, RequestMetrics, ToolCallDelta
from ._plan import Concurrency, Limits, Load, LoadTest, Rate
from ._stats import SLO, StageStats, quantize
from ._workload import WorkItem

__all__ = ["Progress", "StageRunner", "load_test_config", "run_stages"]

#: How often the event-loop lag probe wakes (seconds).
LAG_PROBE_INTERVAL = 0.01
#: Streams per sampler. Each sampler has its own connection pool, and ``httpcore2``'s pool
#: walks every connection it holds each time a request is sent and each time a response
#: is closed; with 1,000 connections in one pool that walk was a fifth of the client's CPU
#: and the client spent 2.7 times the CPU per request it did at 100 streams. A stream's
#: requests all go through the same sampler.
STREAMS_PER_SAMPLER = 100
#: The error code of a stream the memory cap stopped (``actor._memory``).
MEMORY_CAP = "sampler_memory_cap"


@attrs.define
class Progress:
    """Live counters of the running stage, read by the progress display."""

    stage: int = 0
    label: str = ""
    started_at: float = 0.0
    measuring: bool = False
    sent: int = 0
    finished: int = 0
    failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    stats: StageStats | None = None


def load_test_config(config: SamplerConfig, stages: tuple[Load, ...]) -> SamplerConfig:
    """``config`` as a load generator needs it: no retries, keep-alive for every stream,
    reads timed by their bytes' arrival."""
    peak = max(stage.peak_streams for stage in stages)
    return config.evolve(
        retry=RetryPolicy(max_retries=0),
        max_keepalive_connections=max(config.max_keepalive_connections, peak),
        receive_timestamps=True,
    )


def _peak_rss() -> int:
    # ru_maxrss is in KiB on Linux (the platform this measures on).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _latencies(
    metrics: RequestMetrics | None, submitted: float, first: float | None, done: float
) -> tuple[float | None, float, float | None]:
    """TTFT (``None`` without output) and E2E in seconds, from the wire's timestamps where
    the sampler has them, else from the sending task's; and the request's write in ms
    from the sampler's submit, when the wire said it."""
    if metrics is None or metrics.time_to_last_byte_ms is None:
        return (None if first is None else first - submitted), done - submitted, None
    # The sampler's times are ms from its own submit; without the write, from the submit.
    sent_ms = metrics.time_to_request_sent_ms
    start_ms = 0.0 if sent_ms is None else sent_ms
    first_ms = metrics.time_to_first_token_ms
    ttft = None if first is None or first_ms is None else (first_ms - start_ms) / 1000
    return ttft, (metrics.time_to_last_byte_ms - start_ms) / 1000, sent_ms


class StageRunner:
    """Runs one stage's load in this process and records it into a :class:`StageStats`."""

    def __init__(
        self,
        samplers: list[SamplerHandle],
        items: Iterator[WorkItem],
        load: Load,
        limits: Limits,
        slo: SLO,
        rng: random.Random,
        progress: Progress,
        clock_offset: float,
    ) -> None:
        self.samplers = samplers
        self._next_sampler = 0
        self.items = items
        self.load = load
        self.limits = limits
        self.slo = slo
        self.rng = rng
        self.progress = progress
        self.offset = clock_offset
        self.stats = StageStats()
        progress.stats = self.stats
        self.warm_until = 0.0
        self.warmup_left = limits.warmup_requests
        self.measure_start: float | None = None
        self.measured_sent = 0
        self.stopped = False
        self.start = 0.0
        self.idle = trio.Event()
        self.idle.set()

    # -- what the next request is -------------------------------------------------------

    def next_slot(self, now: float) -> bool | None:
        """Whether a request sent ``now`` is measured; ``None``: the stage stops sending."""
        if self.stopped:
            return None
        if now < self.warm_until or self.warmup_left > 0:
            self.warmup_left -= 1
            return False
        if self.measure_start is None:
            self.measure_start = now
            self.progress.measuring = True
        limits = self.limits
        if (limits.duration_s is not None and now >= self.measure_start + limits.duration_s) or (
            limits.requests is not None and self.measured_sent >= limits.requests
        ):
            self.stopped = True
            return None
        self.measured_sent += 1
        return True

    # -- one request ----------------------------------------------------------------------

    async def one(
        self, sampler: SamplerHandle, item: WorkItem, measured: bool, scheduled: float | None
    ) -> None:
        progress = self.progress
        stats = self.stats
        now = trio.current_time
        progress.in_flight += 1
        progress.sent += 1
        if progress.in_flight == 1:
            self.idle = trio.Event()
        if measured:
            stats.started += 1
        first: float | None = None
        last = 0.0
        count = 0
        gaps: list[int] = []
        # The last thing before the request is handed over: the bookkeeping of its sending
        # is done once it has ended, not inside its latencies.
        submitted = now()
        try:
            stream = await sampler.submit(item.request)
            async with stream:
                async for event in stream:
                    kind = type(event)
                    if kind is ChannelToken or (
                        isinstance(event, ToolCallDelta) and event.arguments_delta
                    ):
                        # When its bytes arrived, where the sampler's reads say it.
                        at = stream.received_at
                        if at is None:
                            at = now()
                        if first is None:
                            first = at
                        else:
                            gaps.append(round((at - last) * 1e6))
                        last = at
                        count += 1
            done = now()
        except trio.Cancelled:
            if measured:
                stats.unfinished += 1
            raise
        finally:
            progress.in_flight -= 1
            progress.finished += 1
            if progress.in_flight == 0:
                self.idle.set()
            if measured:
                stats.second(int(submitted - self.start)).sent += 1
                if scheduled is not None:
                    stats.histograms["send_lag"].record(round((submitted - scheduled) * 1e6))
        if measured:
            self.record(item, stream.terminal, submitted, first, done, count, gaps)

    def record(
        self,
        item: WorkItem,
        terminal: Any,
        submitted: float,
        first: float | None,
        done: float,
        count: int,
        gaps: list[int],
    ) -> None:
        """Record a measured request: ``submitted``, ``first`` (its first output event
        read, if any) and ``done`` are the sending task's timestamps; the wire's come from
        the terminal's metrics (see the module)."""
        stats = self.stats
        stats.window(submitted + self.offset, done + self.offset)
        if isinstance(terminal, Failed):
            # Stopped by the run's memory cap: named as such in the report's errors.
            code = terminal.error.error_code
            stats.error(code if code == MEMORY_CAP else terminal.error.kind.value)
            self.progress.failed += 1
            return
        if isinstance(terminal, Cancelled) or not isinstance(terminal, Completed):
            stats.error("cancelled")
            self.progress.failed += 1
            return
        usage = terminal.response.usage
        output = count
        if usage is not None and usage.output_tokens:
            output = usage.output_tokens
            stats.output_from_server += 1
        stats.input_tokens += (
            usage.input_tokens if usage is not None and usage.input_tokens else item.input_tokens
        )
        if usage is not None and usage.input_tokens:
            stats.input_from_server += 1
        stats.output_tokens += output
        stats.completed += 1
        finished = stats.second(int(done - self.start))
        finished.completed += 1
        finished.output_tokens += output
        self.progress.output_tokens += output
        histograms = stats.histograms
        ttft, e2e, sent_ms = _latencies(terminal.metrics, submitted, first, done)
        if sent_ms is not None:
            stats.wire_timed += 1
            histograms["request_write"].record(round(sent_ms * 1e3))
        histograms["e2e"].record(round(e2e * 1e6))
        tpot = None
        if ttft is not None:
            histograms["ttft"].record(round(ttft * 1e6))
            stats.second(int(submitted - self.start)).ttft[quantize(round(ttft * 1e6))] += 1
            if output > 1:
                tpot = (e2e - ttft) / (output - 1)
                histograms["tpot"].record(round(tpot * 1e6))
        if gaps:
            histograms["itl"].record_many(gaps)
        if e2e > 0:
            histograms["stream_output_tps"].record(round(output / e2e * 1000))
        if self._good(ttft, tpot, e2e):
            stats.good += 1

    def _good(self, ttft: float | None, tpot: float | None, e2e: float) -> bool:
        slo = self.slo
        if slo.ttft_ms is not None and (ttft is None or ttft * 1000 > slo.ttft_ms):
            return False
        if slo.tpot_ms is not None and tpot is not None and tpot * 1000 > slo.tpot_ms:
            return False
        return slo.e2e_ms is None or e2e * 1000 <= slo.e2e_ms

    # -- the loops ------------------------------------------------------------------------

    async def closed_loop(self, load: Concurrency, nursery: trio.Nursery) -> None:
        async def stream_loop(starts_at: float, sampler: SamplerHandle) -> None:
            await trio.sleep_until(starts_at)
            while (slot := self.next_slot(trio.current_time())) is not None:
                await self.one(sampler, next(self.items), slot, None)

        samplers = self.samplers
        for stream in range(load.streams):
            nursery.start_soon(
                stream_loop,
                self.start + load.start_offset(stream),
                samplers[stream % len(samplers)],
            )

    async def open_loop(self, rate: Rate, nursery: trio.Nursery) -> None:
        gap: Callable[[], float]
        if rate.arrivals == "poisson":
            gap = lambda: self.rng.expovariate(rate.per_second)  # noqa: E731
        else:
            gap = lambda: 1.0 / rate.per_second  # noqa: E731
        due = trio.current_time() + rate.phase
        while True:
            await trio.sleep_until(due)
            slot = self.next_slot(due)
            if slot is None:
                return
            cap = rate.max_in_flight
            if cap is not None and self.progress.in_flight >= cap:
                if slot:
                    self.stats.dropped += 1
            else:
                sampler = self.samplers[self._next_sampler]
                self._next_sampler = (self._next_sampler + 1) % len(self.samplers)
                nursery.start_soon(self.one, sampler, next(self.items), slot, due)
            due += gap()

    async def run(self) -> StageStats:
        """Send the stage's load, drain, and return its statistics."""
        cpu_start = time.process_time()
        wall_start = time.monotonic()
        start = self.start = trio.current_time()
        self.progress.started_at = start
        self.warm_until = start + self.limits.warmup_s
        with _no_full_collections():
            await self._run()
        self.stats.client.append(
            (time.process_time() - cpu_start, time.monotonic() - wall_start, _peak_rss())
        )
        return self.stats

    async def _run(self) -> None:
        async with trio.open_nursery() as probes:
            probes.start_soon(self._probe_lag)
            async with trio.open_nursery() as requests:
                if isinstance(self.load, Concurrency):
                    await self.closed_loop(self.load, requests)
                    # The streams stop by themselves; wake them for the time limit too.
                    await self._wait_for_stop()
                else:
                    await self.open_loop(self.load, requests)
                with trio.move_on_after(self.limits.drain_timeout_s):
                    await self.idle.wait()
                requests.cancel_scope.cancel()
            probes.cancel_scope.cancel()

    async def _wait_for_stop(self) -> None:
        # Closed-loop streams only look at the limits between requests; the stage stops
        # sending at the time limit itself, and the drain timeout starts from there.
        duration = self.limits.duration_s
        while not self.stopped:
            start = self.measure_start
            if (
                duration is not None
                and start is not None
                and trio.current_time() >= start + duration
            ):
                self.stopped = True
                return
            await trio.sleep(0.05)

    async def _probe_lag(self) -> None:
        lag = self.stats.histograms["loop_lag"]
        while True:
            before = trio.current_time()
            await trio.sleep(LAG_PROBE_INTERVAL)
            lag.record(round((trio.current_time() - before - LAG_PROBE_INTERVAL) * 1e6))


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """No full garbage collections while a stage runs; one when it ends.

    What is alive when the stage starts (the samplers, their connections, the modules) is
    frozen out of the collector's sight, and the oldest generation is not collected: at
    1,000 streams a full collection walked the whole heap, 0.3 s of CPU each, seven in a
    one-minute stage, and every stream's reads waited for it. The young generations are
    still collected (short-lived cycles die there); what reaches the oldest generation and
    becomes garbage during the stage is collected at its end.
    """
    young, middle, old = gc.get_threshold()
    # A heap the program froze itself (before forking, say) stays frozen.
    frozen_already = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, middle, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
        if not frozen_already:
            gc.unfreeze()
        gc.collect()


#: A full-collection threshold never reached (the count of middle collections since
#: the last full one).
_NEVER = 2**30


async def run_stages(
    test: LoadTest,
    *,
    worker: int = 0,
    progress: Progress | None = None,
    on_stage: Callable[[int, StageStats], None] | None = None,
    before_stage: Callable[[int], Any] | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> list[StageStats | None]:
    """Run every stage of ``test`` as worker ``worker`` of ``test.workers``.

    ``before_stage(i)``, if given, is awaited before stage ``i`` starts (the workers'
    barrier). Returns each stage's statistics (``None`` for a stage this worker had no
    share of). ``transport`` replaces the network (tests).
    """
    progress = progress if progress is not None else Progress()
    rng = random.Random(test.seed + worker)
    items = test.workload.items(rng)
    config = load_test_config(test.config, test.stages)
    # A clock the machine's processes share, so merged windows line up.
    offset = time.monotonic() - trio.current_time()
    results: list[StageStats | None] = []
    shares = [stage.share(worker, test.workers) for stage in test.stages]
    peak = max((share.peak_streams for share in shares if share is not None), default=1)
    count = -(-peak // STREAMS_PER_SAMPLER)
    # The run's one memory cap, shared out: together the samplers never hold more.
    share = max(1, test.max_buffered_response_bytes // (count * test.workers))
    async with AsyncExitStack() as stack:
        samplers = [
            await stack.enter_async_context(
                open_sampler(
                    config,
                    doom_loop=DoomLoopPolicy(enabled=False),
                    seed=test.seed + number,
                    transport=transport,
                    max_buffered_response_bytes=share,
                )
            )
            for number in range(count)
        ]
        for index, stage in enumerate(test.stages):
            if before_stage is not None:
                await before_stage(index)
            load = stage.share(worker, test.workers)
            limits = test.limits.share(worker, stage.participants(test.workers))
            progress.stage = index
            progress.label = stage.label()
            progress.measuring = False
            if load is None or limits is None:
                results.append(None)
                continue
            runner = StageRunner(samplers, items, load, limits, test.slo, rng, progress, offset)
            stats = await runner.run()
            results.append(stats)
            if on_stage is not None:
                on_stage(index, stats)
    return results
