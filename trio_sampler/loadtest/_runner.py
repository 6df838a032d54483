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
from array import array
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import attrs
import httpx2
import trio

from ..actor import SamplerHandle, open_sampler
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy
from ..types import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    Failed,
    RequestMetrics,
    SamplingErrorInfo,
    ToolCallDelta,
)
from ._plan import LOADGEN_STREAM_BYTES, Concurrency, Limits, Load, LoadTest, Rate
from ._starts import StartGate
from ._stats import LAG_PROBE_INTERVAL, SLO, StageStats, quantize
from ._workload import WorkItem

__all__ = ["Progress", "StageRunner", "load_test_config", "run_stages"]

#: Streams per sampler. Each sampler has its own connection pool, and ``httpcore2``'s pool
#: walks every connection it holds each time a request is sent and each time a response
#: is closed; with 1,000 connections in one pool that walk was a fifth of the client's CPU
#: and the client spent 2.7 times the CPU per request it did at 100 streams. A stream's
#: requests all go through the same sampler.
STREAMS_PER_SAMPLER = 100


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


def load_test_config(
    config: SamplerConfig, stages: tuple[Load, ...], *, request_usage: bool = True
) -> SamplerConfig:
    """``config`` as a load generator needs it: no retries, keep-alive for every stream,
    reads timed by their bytes' arrival, and (``request_usage``) the server's token counts
    asked for where the provider's profile leaves them off."""
    peak = max(stage.peak_streams for stage in stages)
    config = config.evolve(
        retry=RetryPolicy(max_retries=0),
        max_keepalive_connections=max(config.max_keepalive_connections, peak),
        receive_timestamps=True,
    )
    return _with_usage(config) if request_usage else config


def _with_usage(config: SamplerConfig) -> SamplerConfig:
    """``config`` asking for usage on a Chat Completions stream: the other backends always
    report it, and a profile that sends ``stream_options`` already asks."""
    profile = config.profile
    asks = profile is None or profile.supports_stream_usage
    if config.backend is not ApiBackend.CHAT_COMPLETIONS or asks:
        return config
    if "stream_options" in config.extra_body:
        return config  # the user's own stream_options win
    extra = {**config.extra_body, "stream_options": {"include_usage": True}}
    return config.evolve(extra_body=extra)


def _peak_rss() -> int:
    # ru_maxrss is in KiB on Linux (the platform this measures on).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cpu_wait() -> float | None:
    """Seconds this process's main thread has been runnable but waiting for a CPU (the
    run queue), from Linux's ``/proc/self/schedstat``; ``None`` elsewhere.

    A client whose event loop wakes late while it uses little CPU was waiting here: the
    machine's cores were busy with other processes (or the server)."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


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


#: The sampler's error code when its memory cap stopped a stream.
MEMORY_CAP_CODE = "sampler_memory_cap"


def error_kind(error: SamplingErrorInfo) -> tuple[str, str]:
    """The kind a failed request is counted under, and its message as an example.

    The sampler's :class:`SamplingErrorKind`, except a stream the run's memory cap stopped
    (``memory_cap``: the client's limit, not the server's fault); the example starts with
    the HTTP status when there is one.
    """
    kind = "memory_cap" if error.error_code == MEMORY_CAP_CODE else error.kind.value
    status = "" if error.status_code is None else f"HTTP {error.status_code}: "
    return kind, status + error.message


def _tokens(terminal: Completed, item: WorkItem, counted: int) -> tuple[int, int, int, int]:
    """Input and output tokens of a completed request, and whether each is the server's
    (1) or else planned / counted (0): the server's usage where it reported one."""
    usage = terminal.response.usage
    if usage is None:
        return item.input_tokens, counted, 0, 0
    input_server = 1 if usage.input_tokens else 0
    output_server = 1 if usage.output_tokens else 0
    return (
        usage.input_tokens if input_server else item.input_tokens,
        usage.output_tokens if output_server else counted,
        input_server,
        output_server,
    )


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
        self.window_end: float | None = None
        self.start = 0.0
        self.idle = trio.Event()
        self.idle.set()
        self.starts = StartGate()

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
        if limits.duration_s is not None and now >= self.measure_start + limits.duration_s:
            self.stop(self.measure_start + limits.duration_s)
            return None
        if limits.requests is not None and self.measured_sent >= limits.requests:
            self.stop(now)
            return None
        self.measured_sent += 1
        return True

    def stop(self, at: float) -> None:
        """The stage stops sending; its measured window ends ``at``."""
        self.stopped = True
        self.window_end = at

    def in_window(self, at: float) -> bool:
        """Whether ``at`` falls in the measured window: from the first measured send to
        the stage's stop (its time limit, or the send its request limit refused)."""
        start = self.measure_start
        if start is None or at < start:
            return False
        end = self.window_end
        if end is None and self.limits.duration_s is not None:
            end = start + self.limits.duration_s
        return end is None or at <= end

    # -- one request ----------------------------------------------------------------------

    async def one(
        self, sampler: SamplerHandle, item: WorkItem, measured: bool, scheduled: float | None
    ) -> None:
        now = trio.current_time
        self._in_flight(measured)
        first: float | None = None
        last = 0.0
        count = 0
        # Microseconds, as raw 64-bit integers: not an int object a token kept for the
        # request's life (``benchmarks/bench_per_token.py``, the ``loadtest`` contender).
        gaps = array("q")
        submitted = now()  # (its time if the wait at the start gate is cancelled)
        try:
            await self.starts.turn()  # a few starts in each scheduler round (``_starts.py``)
            # The last thing before the request is handed over: the bookkeeping of its
            # sending is done once it has ended, not inside its latencies.
            submitted = now()
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
            if self.in_window(done) and isinstance(stream.terminal, Completed):
                self.stats.in_window(*_tokens(stream.terminal, item, count))
        except trio.Cancelled:
            if measured:
                self.stats.unfinished += 1
            raise
        finally:
            self._out_of_flight(measured, submitted, scheduled)
        if measured:
            self.record(item, stream.terminal, submitted, first, done, count, gaps, scheduled)

    def _in_flight(self, measured: bool) -> None:
        """A request begins: counted in flight (the stage is no longer idle)."""
        progress = self.progress
        progress.in_flight += 1
        progress.sent += 1
        if progress.in_flight == 1:
            self.idle = trio.Event()
        if measured:
            self.stats.started += 1

    def _out_of_flight(self, measured: bool, submitted: float, scheduled: float | None) -> None:
        """A request is over, however it ended: its sending counted (and, in an open loop,
        how late it was sent)."""
        progress = self.progress
        progress.in_flight -= 1
        progress.finished += 1
        if progress.in_flight == 0:
            self.idle.set()
        if measured:
            stats = self.stats
            stats.second(int(submitted - self.start)).sent += 1
            if scheduled is not None:
                stats.histograms["send_lag"].record(round((submitted - scheduled) * 1e6))

    def record(
        self,
        item: WorkItem,
        terminal: Any,
        submitted: float,
        first: float | None,
        done: float,
        count: int,
        gaps: array[int],
        scheduled: float | None,
    ) -> None:
        """Record a measured request: ``submitted``, ``first`` (its first output event
        read, if any) and ``done`` are the sending task's timestamps, ``scheduled`` its
        arrival's time in an open loop; the wire's come from the terminal's metrics (see
        the module)."""
        stats = self.stats
        stats.window(submitted + self.offset, done + self.offset)
        if isinstance(terminal, Failed):
            stats.error(*error_kind(terminal.error))
            self.progress.failed += 1
            return
        if isinstance(terminal, Cancelled) or not isinstance(terminal, Completed):
            stats.error("cancelled", "the request was cancelled")
            self.progress.failed += 1
            return
        input_tokens, output, input_server, output_server = _tokens(terminal, item, count)
        stats.input_tokens += input_tokens
        stats.output_tokens += output
        stats.input_from_server += input_server
        stats.output_from_server += output_server
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
        if scheduled is not None:
            # What the user behind an arrival waited: from when it was due, so a client
            # that fell behind its schedule shows it here (and not in TTFT or E2E).
            late = submitted + (sent_ms or 0.0) / 1000 - scheduled
            histograms["e2e_from_schedule"].record(round((e2e + late) * 1e6))
            if ttft is not None:
                histograms["ttft_from_schedule"].record(round((ttft + late) * 1e6))
        if gaps:
            histograms["itl"].record_many(gaps)
            # Events of one read share its stamp (the arrival of its last bytes).
            stats.shared_read_gaps += gaps.count(0)
            if gaps[0] == 0:
                stats.shared_first_reads += 1
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
        wait_start = cpu_wait()
        wall_start = time.monotonic()
        start = self.start = trio.current_time()
        self.progress.started_at = start
        self.warm_until = start + self.limits.warmup_s
        with _no_full_collections():
            await self._run()
        if self.measure_start is not None:
            end = self.window_end if self.window_end is not None else trio.current_time()
            self.stats.window_start = self.measure_start + self.offset
            self.stats.window_end = end + self.offset
        wait_end = cpu_wait()
        waited = None if wait_start is None or wait_end is None else wait_end - wait_start
        self.stats.client.append(
            (time.process_time() - cpu_start, time.monotonic() - wall_start, _peak_rss(), waited)
        )
        return self.stats

    async def _run(self) -> None:
        async with trio.open_nursery() as probes:
            probes.start_soon(self._probe_lag)
            probes.start_soon(self.starts.open)
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
                self.stop(start + duration)
                return
            await trio.sleep(0.05)

    async def _probe_lag(self) -> None:
        # From the measurement's start (the warm-up's lag is not the measured reads').
        lag = self.stats.histograms["loop_lag"]
        while True:
            before = trio.current_time()
            await trio.sleep(LAG_PROBE_INTERVAL)
            if self.measure_start is not None:
                lag.record(round((trio.current_time() - before - LAG_PROBE_INTERVAL) * 1e6))


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """No full garbage collections while a stage runs, young ones only when the heap grows;
    one full collection when it ends.

    What is alive when the stage starts (the samplers, their connections, the modules) is
    frozen out of the collector's sight, and the oldest generation is not collected: at
    1,000 streams a full collection walked the whole heap, 0.3 s of CPU each, seven in a
    one-minute stage, and every stream's reads waited for it.

    The young generations are collected only once :data:`STAGE_YOUNG_THRESHOLD` container
    objects were allocated and not freed since the last pass (the interpreter's 700 is
    reached by every few hundred reads' churn). At 1,000 streams and 5,000 tokens a second
    the interpreter's thresholds made 1,645 to 1,719 young and 149 to 156 middle passes
    in the 23-second cell, 3.5 to 3.9 s of the client's CPU, and they collected nothing
    the 12 passes of this threshold did not (149 objects in all): what a read or a
    request makes is freed by reference counting. With this threshold the count is
    reached only while the heap really grows (the streams' connections opening during
    the ramp): 12 passes, 0.18 s (``benchmarks/bench_loadtest.py --accuracy-cells
    1000:200 --young-threshold 700``; ``docs/benchmarks.md``). Cyclic garbage made during the
    stage waits for the next pass or the stage's end: a bounded amount of memory.
    """
    young, middle, old = gc.get_threshold()
    # A heap the program froze itself (before forking, say) stays frozen.
    frozen_already = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(young, STAGE_YOUNG_THRESHOLD), middle, _NEVER)
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
#: Container objects allocated and not freed since the last collection that start the
#: next young one while a stage runs (see :func:`_no_full_collections`).
STAGE_YOUNG_THRESHOLD = 100_000


def worker_peaks(test: LoadTest) -> list[int]:
    """The most streams each worker runs at once, over the stages (0: none)."""
    peaks = []
    for worker in range(test.workers):
        shares = [stage.share(worker, test.workers) for stage in test.stages]
        peaks.append(max((s.peak_streams for s in shares if s is not None), default=0))
    return peaks


def sampler_cap(
    run_cap: int | None, *, worker_streams: int, all_streams: int, samplers: int
) -> int | None:
    """One sampler's part of the run's memory cap ``run_cap``.

    The load generator's own cost per stream (:data:`LOADGEN_STREAM_BYTES`, outside any
    sampler's account) is reserved first, for the most streams at once. A sampler
    accounts for the streams it carries; a worker's streams are spread evenly over its
    samplers, and the workers get the rest of the cap in proportion to their most
    streams at once (``worker_streams`` of ``all_streams``, the sum over the workers), so
    each sampler gets its share (never less than a byte) and the run as a whole holds at
    most ``run_cap``.
    """
    if run_cap is None:
        return None
    run_cap = max(1, run_cap - all_streams * LOADGEN_STREAM_BYTES)
    share = run_cap * min(worker_streams, all_streams) // all_streams
    return max(1, share // samplers)


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
    config = load_test_config(test.config, test.stages, request_usage=test.request_usage)
    # A clock the machine's processes share, so merged windows line up.
    offset = time.monotonic() - trio.current_time()
    results: list[StageStats | None] = []
    peaks = worker_peaks(test)
    peak = max(peaks[worker], 1)
    count = -(-peak // STREAMS_PER_SAMPLER)
    cap = sampler_cap(
        test.max_buffered_response_bytes,
        worker_streams=peak,
        all_streams=max(sum(peaks), 1),
        samplers=count,
    )
    async with AsyncExitStack() as stack:
        samplers = [
            await stack.enter_async_context(
                open_sampler(
                    config,
                    doom_loop=DoomLoopPolicy(enabled=False),
                    seed=test.seed + number,
                    transport=transport,
                    max_buffered_response_bytes=cap,
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
