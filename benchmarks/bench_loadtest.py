"""The load generator measured: its accuracy, and the load it drives per client core.

**Accuracy.** The emulator runs in its own processes (``--server-procs``, one per core by
default, sharing a port with ``SO_REUSEPORT``; ``--keep-alive-timeout 300``), paced to send
the first token ``D`` ms after each request arrived and then one token every ``I`` ms
(``first_token_ms``, ``token_interval_ms``, ``ignore_eos``; each token in a write of its
own, woken by a ``timerfd`` on Linux). A request arrives when its last bytes reached the
server's socket (the kernel's receive timestamp): the head's parsing, the app's start and
the body's handover count against ``D``, as in a real server. ``trio_sampler.loadtest``
runs a closed loop at each concurrency and reports TTFT (from the request's last byte
written) and ITL; the error is the reported p50 and p99 minus ``D`` and ``I``. Target:
within 1 ms at p50 and 5 ms at p99 at 1, 100 and 1,000 streams.

**The server keeps its schedule only as well as the machine lets it**, and the load
generator, measuring truthfully, reports the server's lateness too. So each cell also
reads the server's own record of its paced writes (``GET /v1/emulator/pacing`` on every
server process, cleared at the end of the warm-up): the TTFT and ITL the server actually
produced, timed at its write system calls, and how late those writes were against their
schedule. "Load generator minus server" is the load generator's own error, with the
server's lateness taken out. Two things keep the emulator punctual on two shared cores,
and both are measured (``docs/benchmarks.md``): ``trio-sampler serve`` collects cyclic
garbage by heap growth rather than the interpreter's allocation counts (whose pauses of
up to 180 ms made the 1,000-stream p99), and the server processes run first when they
are runnable (``--server-priority realtime``: ``SCHED_RR`` priority 1 where the system
permits it, else normal; the JSON says which). Without the priority the server waits for
a CPU behind the client for up to tens of milliseconds. The load generator itself runs at
normal priority and shares the cores: its own delays are what its kernel timestamps have
to take out.

The streams start together, as ``trio-sampler loadtest`` starts them without ``--ramp``
(``--ramp S`` spreads them over ``S`` seconds). Against a server this steady they stay in
step: every request of a round ends, and the next starts, with the others, and every
token of a round arrives in one burst. The load generator starts a few requests in each
scheduler round (``trio_sampler/loadtest/_starts.py``) so that the reads of the streams
already running are not held up behind the starts of the others. The warm-up is the ramp
plus ``2.5 T``, with ``T = D + (N - 1) * I`` one request's duration: two rounds and a
half, so every stream has opened its connection.

The pacing: ``D = 250``, ``I = 100``, ``N = 16`` tokens at 1 and 100 streams; at 1,000
streams ``I = 1000`` (``T`` = 15.25 s), so that cell sends what the 100-stream cell does
(1,000 tokens and ~65 requests per second) while holding 1,000 streams and connections
open. A fourth cell sends 5,000 tokens a second: 1,000 streams at ``I = 200``
(``T`` = 3.25 s), the load of a model server at that concurrency; each cell reports the
load generator's event-loop lag (from the warm-up's end) and the share of token gaps
that were 0 (two tokens in one read, stamped with the second's arrival: the signature of
a client that fell behind by an interval), and what the load generator marked as too
high (``late_reads``). ``--accuracy-cells 1000:200`` runs that cell alone (any ``C:I``,
with ``D = 250`` and ``N = 16``); ``--client-priority realtime`` runs the client
processes at ``SCHED_RR`` 1 below the server's 2, ahead of every other process, as on a
machine with nothing else running. The load generator runs on the transport
``trio-sampler loadtest`` runs on (``httptools`` where installed, else the default
``direct``; ``--http-transport`` to choose).

On this 2-core machine the server and the client share the cores, and the cost of a cell
is not only its tokens per second: the load generator spent about 6 ms of CPU per
16-token request at 100 streams and 15-20 ms at 1,000 (per open stream: the connection
pools, the heap the garbage collector walks), so the 1,000-stream cell needs most of a
core for the client alone, and the two emulator processes 0.3 between them. Whether the
machine could give it that is in the table: ``wait`` is the time each side was runnable
but had no CPU (``/proc/PID/schedstat``), in cores; a cell whose client or server waited
was measured on a machine too busy for it, and its errors are that machine's queue.

**The raw probe.** Beside each accuracy cell of at most 1,000 tokens a second, a raw
client measures the same thing the same way against the same server and pacing: ``httpx2``
+ ``orjson`` under Trio, no library code, its streams spread over one request's duration
(it has no start gate: started together, its reads would wait behind its starts), warmed
up as long, and closed-loop for the same duration; TTFT from the request's last byte
written (httpcore's trace of the body's send, as the load generator times it) to the read
holding the first content event, ITL between the reads holding content events. Its error
is what the machine, the HTTP layer and the server cost before the load generator does
anything; the load generator's own share is its error minus the probe's (``added_*`` in
the JSON).

**Throughput.** Against the same emulator in bench mode (pre-rendered bodies, one write per
response), streams of ``--tokens`` text deltas at ``C`` concurrent streams, side by side in
one run: the load generator (one worker) and a loop over the official ``openai`` SDK
(``AsyncOpenAI(max_retries=0).chat.completions.create(stream=True)`` in ``C`` asyncio
tasks, each counting the chunks with content), each in its own process for the same
duration. Events per client core = output events received / client CPU seconds
(``time.process_time`` of the client process). Target: the load generator drives at least
15x the events per core of the SDK loop.

Run ``python benchmarks/bench_loadtest.py`` (``--quick`` for a short run). It prints a
table and PASS/FAIL per target, writes JSON to ``benchmarks/results/bench_loadtest.json``,
and exits 0 unless the benchmark itself cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

try:
    from benchmarks.common import cpu_seconds, run_queue_seconds
except ModuleNotFoundError:  # run as a script: python benchmarks/bench_loadtest.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import cpu_seconds, run_queue_seconds

DEFAULT_JSON = Path(__file__).parent / "results" / "bench_loadtest.json"
MODEL = "bench-model"
FIRST_TOKEN_MS = 250.0
TOKEN_INTERVAL_MS = 100.0
ACCURACY_TOKENS = 16
#: The accuracy cells: (streams, first token ms, token interval ms, tokens per request).
#: At 1,000 streams the interval is 1 s, so the cell sends the 1,000 tokens per second
#: (and ~65 requests per second) of the 100-stream cell, which is what the two cores
#: serve with room to spare; see the docstring.
#: The last is the 5,000 tokens per second cell: 1,000 streams at I = 200 ms.
ACCURACY_CELLS = (
    (1, FIRST_TOKEN_MS, TOKEN_INTERVAL_MS, ACCURACY_TOKENS),
    (100, FIRST_TOKEN_MS, TOKEN_INTERVAL_MS, ACCURACY_TOKENS),
    (1000, FIRST_TOKEN_MS, 1000.0, ACCURACY_TOKENS),
    (1000, FIRST_TOKEN_MS, 200.0, ACCURACY_TOKENS),
)
QUICK_ACCURACY_CELLS = ACCURACY_CELLS[:2]
#: The raw probe runs beside the cells that send at most this many tokens a second.
PROBE_MAX_TOKENS_PER_S = 1000
TARGET_P50_MS = 1.0
TARGET_P99_MS = 5.0
TARGET_VS_OPENAI = 15.0
CHUNK_CHARS = 4


class Server:
    """``procs`` emulator processes on one port (``trio-sampler serve --reuse-port``)."""

    def __init__(self, procs: int, bench: bool, priority: str = "normal", level: int = 1) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.priority = priority
        port = 0
        try:
            for _ in range(max(1, procs)):
                command = [
                    sys.executable, "-m", "trio_sampler.cli", "serve", "--reuse-port",
                    "--port", str(port), "--backlog", "4096", "--keep-alive-timeout", "300",
                ]  # fmt: skip
                if bench:
                    command.append("--bench")
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                self.procs.append(proc)
                assert proc.stdout is not None
                line = proc.stdout.readline().strip()
                if not line.startswith("listening on "):
                    raise RuntimeError(f"the emulator did not start (first line {line!r})")
                self.origin = line.removeprefix("listening on ")
                port = int(self.origin.rsplit(":", 1)[1])
                self.priority = _raise_priority(proc.pid, priority, level)
        except BaseException:
            self.close()
            raise

    def cpu_seconds(self) -> float:
        """User + system CPU of the server processes so far (from ``/proc``)."""
        return cpu_seconds(proc.pid for proc in self.procs)

    def run_queue_seconds(self) -> float:
        """Seconds the server processes have waited for a CPU so far (from ``/proc``)."""
        return run_queue_seconds(proc.pid for proc in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _raise_priority(pid: int, priority: str, level: int = 1) -> str:
    """Give process ``pid`` the CPU first: ``realtime`` (``SCHED_RR``, priority ``level``)
    or ``nice`` (-10); what it got (``normal`` where the system does not allow it)."""
    try:
        if priority == "realtime":
            os.sched_setscheduler(pid, os.SCHED_RR, os.sched_param(level))
        elif priority == "nice":
            os.setpriority(os.PRIO_PROCESS, pid, -10)
    except (OSError, AttributeError):  # not permitted, or not on this platform
        return "normal"
    return priority


def _script(**fields: Any) -> str:
    return json.dumps(fields, separators=(",", ":"))


def _paced_script(first_token_ms: float, token_interval_ms: float) -> str:
    """The emulator's script for an accuracy cell: the known pacing, ``max_tokens`` filled."""
    return _script(
        ignore_eos=True,
        chunk_chars=CHUNK_CHARS,
        first_token_ms=first_token_ms,
        token_interval_ms=token_interval_ms,
    )


def _request_s(first_token_ms: float, token_interval_ms: float, tokens: int) -> float:
    """One paced request's duration, first byte to last token, in seconds."""
    return (first_token_ms + (tokens - 1) * token_interval_ms) / 1000


def _config(origin: str, script: str, http_transport: str = "direct") -> Any:
    from trio_sampler import SamplerConfig, Timeouts

    return SamplerConfig(
        http_transport=http_transport,
        base_url=origin + "/v1",
        model=MODEL,
        api_key="bench-key",
        extra_headers={"x-emulator-script": script},
        timeouts=Timeouts(connect=120.0, response_headers=300.0),
    )


# -- accuracy -------------------------------------------------------------------------------


def _server_pacing(origin: str, procs: int, method: str = "GET") -> list[dict[str, Any]]:
    """Every server process's punctuality report (``/v1/emulator/pacing``, with its
    values; ``DELETE``: cleared). The processes share a port and the kernel hands each new
    connection to one of them, so this asks on new connections until each has answered."""
    import urllib.request

    reports: dict[int, dict[str, Any]] = {}
    # The values only when read: clearing runs in the client's process during the stage,
    # and parsing every value of the warm-up there held its interpreter for milliseconds.
    query = "?values=1" if method == "GET" else ""
    for _ in range(50 * procs):
        request = urllib.request.Request(
            origin + "/v1/emulator/pacing" + query,
            method=method,
            headers={"authorization": "Bearer bench-key", "connection": "close"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            report = orjson.loads(answer.read())
        reports[report["pid"]] = report
        if len(reports) >= procs:
            break
    return list(reports.values())


def _server_side(
    reports: list[dict[str, Any]], first_token_ms: float, interval_ms: float
) -> dict[str, Any]:
    """What the server did, over every process's values: its TTFT and ITL (their p50 and
    p99 minus ``D`` and ``I``), and how late its writes were (p50, p99)."""

    def merged(kind: str) -> list[float]:
        return sorted(value for report in reports for value in report[kind]["values"])

    def at(values: list[float], q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    out: dict[str, Any] = {"processes": len(reports)}
    for kind, target in (("ttft", first_token_ms), ("itl", interval_ms)):
        values = merged(kind)
        out[f"{kind}_count"] = len(values)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value = at(values, q)
            out[f"{kind}_{name}_err_ms"] = None if value is None else value - target
    for kind in ("first_token_late", "token_late"):
        values = merged(kind)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            out[f"{kind}_{name}_ms"] = at(values, q)
    return out


class CollectorLog:
    """The garbage collections in this process while open: passes, milliseconds and
    objects collected per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = info["generation"]
            self.passes[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started
            self.collected[generation] += info["collected"]

    def __enter__(self) -> CollectorLog:
        import gc

        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, list[float] | list[int]]:
        return {
            "passes": self.passes,
            "ms": [round(s * 1000, 1) for s in self.seconds],
            "collected": self.collected,
        }


def accuracy_cell(
    origin: str,
    streams: int,
    duration: float,
    workers: int,
    first_token_ms: float = FIRST_TOKEN_MS,
    token_interval_ms: float = TOKEN_INTERVAL_MS,
    tokens: int = ACCURACY_TOKENS,
    server_procs: int = 1,
    young_threshold: int | None = None,
    ramp_s: float = 0.0,
    http_transport: str = "direct",
) -> dict[str, Any]:
    import threading

    from trio_sampler.loadtest import _runner

    if young_threshold is not None:  # the stage's young collections as they were
        _runner.STAGE_YOUNG_THRESHOLD = young_threshold

    from trio_sampler.loadtest import Concurrency, Fixed, Limits, LoadTest, SyntheticWorkload, run

    script = _paced_script(first_token_ms, token_interval_ms)
    request_s = _request_s(first_token_ms, token_interval_ms, tokens)
    test = LoadTest(
        _config(origin, script, http_transport),
        # The streams start together, as the command's do without --ramp (``ramp_s``
        # spreads them), and the warm-up covers the ramp and two more rounds: every
        # stream's connection is open.
        [Concurrency(streams, ramp_s=ramp_s)],
        SyntheticWorkload(Fixed(64), Fixed(tokens)),
        Limits(duration_s=duration, warmup_s=ramp_s + request_s * 2.5, drain_timeout_s=120),
        workers=min(workers, streams),
    )
    # The server's record starts where the load generator's does: at the warm-up's end.
    clear = threading.Timer(
        test.limits.warmup_s, _server_pacing, (origin, server_procs), {"method": "DELETE"}
    )
    clear.start()
    collector = CollectorLog()
    try:
        with collector:
            [stage] = run(test).stages
    finally:
        clear.cancel()
    server = _server_side(_server_pacing(origin, server_procs), first_token_ms, token_interval_ms)
    summary = stage.summary
    latency = summary["latency_ms"]
    reported = {
        "ttft_p50_err_ms": latency["ttft"]["p50"] - first_token_ms,
        "ttft_p99_err_ms": latency["ttft"]["p99"] - first_token_ms,
        "itl_p50_err_ms": latency["itl"]["p50"] - token_interval_ms,
        "itl_p99_err_ms": latency["itl"]["p99"] - token_interval_ms,
    }
    # The load generator against what the server did: its reported percentile minus the
    # server's own (both minus the same D or I).
    versus = {
        f"vs_server_{key}": None if server[key] is None else value - server[key]
        for key, value in reported.items()
    }
    return {
        "streams": streams,
        "first_token_ms": first_token_ms,
        "token_interval_ms": token_interval_ms,
        "tokens": tokens,
        "workers": test.workers,
        "completed": summary["requests"]["completed"],
        "failed": summary["requests"]["failed"],
        **reported,
        "server": server,
        **versus,
        "client_bound": summary["client"]["client_bound"],
        "client_reasons": summary["client"]["reasons"],
        "client_cpu_fraction": [w["cpu_fraction"] for w in summary["client"]["workers"]],
        "client_cpu_wait_fraction": [w["cpu_wait_fraction"] for w in summary["client"]["workers"]],
        # Falling behind: how late the event loop woke (p50, p99, max), and the share of
        # the gaps between content events that were zero (two events in one read).
        "loop_lag_ms": {
            key: summary["client"]["loop_lag_ms"][key] for key in ("p50", "p99", "max")
        },
        "shared_read_fraction": summary["itl_shared_read_fraction"],
        "late_reads": summary["late_reads"],
        # This process's collections (one worker: the stage's own; with more, the
        # workers' are theirs and not counted here).
        "client_gc": collector.summary(),
    }


async def _probe(
    origin: str,
    streams: int,
    duration: float,
    first_token_ms: float,
    token_interval_ms: float,
    tokens: int,
) -> dict[str, Any]:
    """The raw probe: what an accuracy cell measures, with ``httpx2`` and ``orjson`` alone."""
    import httpx2
    import trio

    script = _paced_script(first_token_ms, token_interval_ms)
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "word " * 64}],
            "max_completion_tokens": tokens,
            "stream": True,
        }
    )
    headers = {
        "authorization": "Bearer bench-key",
        "content-type": "application/json",
        "x-emulator-script": script,
    }
    url = origin + "/v1/chat/completions"
    request_s = _request_s(first_token_ms, token_interval_ms, tokens)
    ttft: list[float] = []
    itl: list[float] = []
    failed = 0
    async with httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=streams),
        timeout=httpx2.Timeout(300.0, connect=120.0, pool=None),
    ) as http:
        start = trio.current_time()
        measure_from = start + request_s * 2.5
        stop_at = measure_from + duration

        async def one() -> None:
            nonlocal failed
            sent = submitted = trio.current_time()
            measured = submitted >= measure_from
            last: float | None = None
            pending = b""

            async def trace(event: str, info: object) -> None:
                nonlocal sent
                if event.endswith("send_request_body.complete"):
                    sent = trio.current_time()  # the request's last byte written

            extensions = {"trace": trace}
            async with http.stream(
                "POST", url, content=body, headers=headers, extensions=extensions
            ) as response:
                if response.status_code != 200:
                    failed += 1
                    await response.aread()
                    return
                async for raw in response.aiter_raw():
                    now = trio.current_time()
                    frames = (pending + raw).split(b"\n\n")
                    pending = frames.pop()
                    content = False
                    for frame in frames:
                        if frame.startswith(b"data: {"):
                            choices = orjson.loads(frame[6:])["choices"]
                            content = content or bool(
                                choices and choices[0]["delta"].get("content")
                            )
                    if content and measured:
                        if last is None:
                            ttft.append((now - sent) * 1000)
                        else:
                            itl.append((now - last) * 1000)
                    if content:
                        last = now

        async def stream_loop(offset: float) -> None:
            await trio.sleep_until(start + offset)
            while trio.current_time() < stop_at:
                await one()

        async with trio.open_nursery() as nursery:
            for stream in range(streams):
                nursery.start_soon(stream_loop, request_s * stream / streams)

    def error(values: list[float], q: float, target: float) -> float | None:
        if not values:
            return None
        values.sort()
        return values[min(len(values) - 1, int(q * len(values)))] - target

    return {
        "ttft_p50_err_ms": error(ttft, 0.5, first_token_ms),
        "ttft_p99_err_ms": error(ttft, 0.99, first_token_ms),
        "itl_p50_err_ms": error(itl, 0.5, token_interval_ms),
        "itl_p99_err_ms": error(itl, 0.99, token_interval_ms),
        "requests": len(ttft),
        "failed": failed,
    }


def probe_cell(**spec: Any) -> dict[str, Any]:
    import trio

    result: dict[str, Any] = trio.run(functools.partial(_probe, **spec))
    return result


# -- throughput ---------------------------------------------------------------------------


def _text(tokens: int) -> str:
    prose = "The quick brown fox jumps over the lazy dog while the loader counts. "
    needed = tokens * CHUNK_CHARS
    return (prose * (needed // len(prose) + 1))[:needed]


def ours_cell(origin: str, streams: int, tokens: int, duration: float) -> dict[str, Any]:
    from trio_sampler.loadtest import Concurrency, Fixed, Limits, LoadTest, SyntheticWorkload, run

    script = _script(text=_text(tokens), chunk_chars=CHUNK_CHARS)
    test = LoadTest(
        _config(origin, script),
        [Concurrency(streams)],
        SyntheticWorkload(Fixed(16), None),
        Limits(duration_s=duration, drain_timeout_s=120),
    )
    [stage] = run(test).stages
    summary = stage.summary
    # Output events = one per request's first event + every gap after it.
    events = summary["latency_ms"]["itl"]["count"] + summary["latency_ms"]["ttft"]["count"]
    [client] = summary["client"]["workers"]
    return {
        "impl": "loadtest",
        "events": events,
        "cpu_s": client["cpu_s"],
        "wall_s": client["wall_s"],
        "failed": summary["requests"]["failed"],
        "client_bound": summary["client"]["client_bound"],
    }


async def _openai_loop(origin: str, streams: int, tokens: int, duration: float) -> dict[str, Any]:
    import httpx2
    import openai

    script = _script(text=_text(tokens), chunk_chars=CHUNK_CHARS)
    events = 0
    failed = 0
    http = httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=streams),
        timeout=httpx2.Timeout(300.0, connect=120.0, pool=None),
    )
    async with openai.AsyncOpenAI(
        base_url=origin + "/v1", api_key="bench-key", max_retries=0, http_client=http
    ) as client:
        stop_at = time.monotonic() + duration

        async def stream_loop() -> None:
            nonlocal events, failed
            while time.monotonic() < stop_at:
                try:
                    response = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "Tell me about the weather."}],
                        stream=True,
                        extra_headers={"x-emulator-script": script},
                    )
                    async for chunk in response:
                        if chunk.choices and chunk.choices[0].delta.content:
                            events += 1
                except openai.APIError:
                    failed += 1

        cpu = time.process_time()
        wall = time.monotonic()
        await asyncio.gather(*(stream_loop() for _ in range(streams)))
        return {
            "impl": "openai",
            "events": events,
            "cpu_s": time.process_time() - cpu,
            "wall_s": time.monotonic() - wall,
            "failed": failed,
            "client_bound": None,
        }


def run_in_process(kind: str, **spec: Any) -> dict[str, Any]:
    """Run one cell in a fresh process (its own heap and GC state); returns its JSON."""
    command = [sys.executable, __file__, "--_cell", json.dumps({"kind": kind, **spec})]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} cell failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cell_main(spec: dict[str, Any]) -> None:
    kind = spec.pop("kind")
    # The client process (and the worker processes it starts, which inherit it) at the
    # real-time class below the server's: the CPU before any other process's.
    priority = _raise_priority(os.getpid(), spec.pop("client_priority", "normal"), 1)
    waited = run_queue_seconds([os.getpid()])
    wall = time.monotonic()
    if kind == "accuracy":
        result = accuracy_cell(**spec)
    elif kind == "probe":
        result = probe_cell(**spec)
    elif kind == "ours":
        result = ours_cell(**spec)
    else:
        result = asyncio.run(_openai_loop(**spec))
    # The share of the cell's wall time this client was runnable but had no CPU.
    result["client_wait"] = (run_queue_seconds([os.getpid()]) - waited) / (time.monotonic() - wall)
    result["client_priority"] = priority
    print(json.dumps(result))


# -- the report -----------------------------------------------------------------------------


def _ok(value: bool) -> str:
    return "PASS" if value else "FAIL"


def _signed(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>+{width}.2f}"


def _marked(late: dict[str, Any] | None) -> str:
    """The statistics the load generator marked as too high (its ``late_reads``)."""
    from trio_sampler.loadtest._late import affected_words

    if not late:
        return "-"
    return "; ".join(affected_words(late, comma=",")) or "-"


def _collections(log: dict[str, Any] | None, workers: int) -> str:
    if not log or workers != 1:
        return f"{'-':>5} {'-':>6}"
    return f"{sum(log['passes']):>5} {sum(log['ms']):>6.0f}"


def _print_behind(cells: list[dict[str, Any]]) -> None:
    print("\nFalling behind (the load generator's event-loop lag from the warm-up's end, ms)")
    print(f"{'C':>6} {'I':>5} {'workers':>7} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} "
          f"{'0 gaps':>7} {'GC n':>5} {'GC ms':>6}  marked too high (by up to one I)")  # fmt: skip
    for cell in cells:
        lag = cell.get("loop_lag_ms") or {}
        shared = cell.get("shared_read_fraction")
        print(
            f"{cell['streams']:>6} {cell['token_interval_ms']:>5g} {cell['workers']:>7} "
            + " ".join(
                f"{'-':>8}" if lag.get(key) is None else f"{lag[key]:>8.1f}"
                for key in ("p50", "p99", "max")
            )
            + f" {'-' if shared is None else format(shared, '.2%'):>7} "
            + _collections(cell.get("client_gc"), cell["workers"])
            + "  "
            + _marked(cell.get("late_reads"))
        )
    print(
        "(0 gaps: the share of token gaps that were 0, two tokens in one read; the load\n"
        " generator marks the statistics those reach when its loop was late by an interval;\n"
        " GC: the client's collections during the run, one worker only)"
    )


def print_report(results: dict[str, Any]) -> None:
    print("\nAccuracy (pacing D, I in ms, N tokens per request; errors in ms)")
    header = (
        f"{'C':>6} {'D':>5} {'I':>5} {'N':>3} {'done':>7} {'fail':>5} {'TTFT p50':>9} "
        f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'client':>6} {'wait':>5} "
        f"{'server':>6} {'wait':>5} {'verdict':>12}  target"
    )
    print(header)
    for cell in results["accuracy"]:
        client = sum(cell["client_cpu_fraction"])
        # The workers' own run-queue wait (the cell's process only starts them).
        waits = [w for w in cell.get("client_cpu_wait_fraction") or [] if w is not None]
        client_wait = sum(waits) if waits else cell.get("client_wait", 0.0)
        print(
            f"{cell['streams']:>6} {cell['first_token_ms']:>5g} {cell['token_interval_ms']:>5g} "
            f"{cell['tokens']:>3} {cell['completed']:>7,} "
            f"{cell['failed']:>5} {cell['ttft_p50_err_ms']:>+9.2f} "
            f"{cell['ttft_p99_err_ms']:>+9.2f} "
            f"{cell['itl_p50_err_ms']:>+8.2f} {cell['itl_p99_err_ms']:>+8.2f} "
            f"{client:>6.2f} {client_wait:>5.2f} {cell['server_cores']:>6.2f} "
            f"{cell.get('server_wait', 0.0):>5.2f} "
            f"{'client-bound' if cell['client_bound'] else 'ok':>12}  {_ok(cell['pass'])}"
        )
    print(
        "(client, server: cores used; wait: cores' worth of time runnable with no CPU, from\n"
        " /proc/PID/schedstat, a machine too busy for the cell; the server's over the whole\n"
        " cell, warm-up included)"
    )
    _print_behind(results["accuracy"])
    if any("server" in cell for cell in results["accuracy"]):
        print("\nWhat the server did (its record of its paced writes, from the warm-up's end; ms)")
        print(
            f"{'C':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
            f"{'late p50':>9} {'late p99':>9}  load generator minus server: "
            "TTFT p50, p99, ITL p50, p99  target"
        )
        for cell in results["accuracy"]:
            server = cell.get("server")
            if server is None:
                continue
            keys = ("ttft_p50_err_ms", "ttft_p99_err_ms", "itl_p50_err_ms", "itl_p99_err_ms")
            shown = " ".join(_signed(server[key], 9 if "ttft" in key else 8) for key in keys)
            late = " ".join(_signed(server[f"token_late_{name}_ms"], 9) for name in ("p50", "p99"))
            versus = ", ".join(
                "-" if cell[f"vs_server_{key}"] is None else f"{cell[f'vs_server_{key}']:+.2f}"
                for key in keys
            )
            verdict = "-" if cell.get("pass_vs_server") is None else _ok(cell["pass_vs_server"])
            print(f"{cell['streams']:>6} {shown} {late}  {versus}  {verdict}")
        print(
            "(the server's TTFT and ITL minus D and I: how late it was; late: its later\n"
            " deltas' writes minus when they were due; target: the load generator within\n"
            " 1 / 5 ms of the server at p50 / p99; server priority: "
            f"{results.get('server_priority')})"
        )
    if any("probe" in cell for cell in results["accuracy"]):
        print(
            "\nThe raw probe (httpx2 + orjson, the same server and pacing, its streams spread"
            " over one request's duration; errors in ms)"
        )
        print(f"{'C':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  "
              "load generator minus probe: TTFT p50, ITL p50")  # fmt: skip
        for cell in results["accuracy"]:
            probe = cell.get("probe")
            if probe is None:
                continue
            values = [
                probe[f"{key}_err_ms"] for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
            ]
            shown = " ".join(f"{'-':>9}" if v is None else f"{v:>+9.2f}" for v in values)
            added = [cell.get("added_ttft_p50_ms"), cell.get("added_itl_p50_ms")]
            print(
                f"{cell['streams']:>6} {shown}  "
                + ", ".join("-" if a is None else f"{a:+.2f}" for a in added)
            )
    if not results["throughput"]:
        return
    print(f"\nThroughput (C = {results['throughput_streams']}, {results['tokens']} events/stream)")
    columns = ("client", "events", "CPU s", "wall s", "events/core-s", "fail")
    widths = (10, 10, 7, 7, 14, 5)
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for cell in results["throughput"]:
        print(
            f"{cell['impl']:>10} {cell['events']:>10,} {cell['cpu_s']:>7.2f} "
            f"{cell['wall_s']:>7.2f} "
            f"{cell['events_per_cpu_s']:>14,.0f} {cell['failed']:>5}"
        )
    ratio = results["ratio_vs_openai"]
    print(
        f"\nloadtest / openai events per core: {ratio:.1f}x "
        f"(target >= {TARGET_VS_OPENAI:g}x): {_ok(ratio >= TARGET_VS_OPENAI)}"
    )


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    cells: tuple[tuple[int, float, float, int], ...] = (
        QUICK_ACCURACY_CELLS if args.quick else ACCURACY_CELLS
    )
    if args.accuracy_streams is not None:
        cells = tuple(cell for cell in ACCURACY_CELLS if cell[0] in args.accuracy_streams)
    if args.accuracy_cells is not None:
        # Any streams and interval, with the cells' D and N.
        cells = tuple(
            (streams, FIRST_TOKEN_MS, interval, ACCURACY_TOKENS)
            for streams, interval in sorted(args.accuracy_cells)
        )
    duration = 4.0 if args.quick else args.duration
    accuracy = []
    # A real-time client runs below the server (SCHED_RR 1 and 2).
    level = 2 if args.client_priority == "realtime" else 1
    server = Server(args.server_procs, bench=False, priority=args.server_priority, level=level)
    server_priority = server.priority
    try:
        for streams, first_ms, interval_ms, tokens in cells:
            cpu = server.cpu_seconds()
            waited = server.run_queue_seconds()
            wall = time.monotonic()
            cell = run_in_process(
                "accuracy", origin=server.origin, streams=streams, duration=duration,
                workers=args.workers, first_token_ms=first_ms, token_interval_ms=interval_ms,
                tokens=tokens, server_procs=len(server.procs),
                client_priority=args.client_priority, young_threshold=args.young_threshold,
                ramp_s=args.ramp, http_transport=args.http_transport,
            )  # fmt: skip
            cell["server_cpu_s"] = server.cpu_seconds() - cpu
            cell["server_cores"] = cell["server_cpu_s"] / (time.monotonic() - wall)
            cell["server_wait"] = (server.run_queue_seconds() - waited) / (time.monotonic() - wall)
            cell["pass"] = (
                abs(cell["ttft_p50_err_ms"]) <= TARGET_P50_MS
                and abs(cell["itl_p50_err_ms"]) <= TARGET_P50_MS
                and abs(cell["ttft_p99_err_ms"]) <= TARGET_P99_MS
                and abs(cell["itl_p99_err_ms"]) <= TARGET_P99_MS
                and cell["failed"] == 0
            )
            # The load generator against what the server did (the same bounds).
            versus = [cell[f"vs_server_{key}_err_ms"] for key in ("ttft_p50", "itl_p50")]
            tails = [cell[f"vs_server_{key}_err_ms"] for key in ("ttft_p99", "itl_p99")]
            cell["pass_vs_server"] = (
                None
                if None in versus or None in tails
                else all(abs(v) <= TARGET_P50_MS for v in versus)
                and all(abs(v) <= TARGET_P99_MS for v in tails)
            )
            accuracy.append(cell)
            print(f"accuracy C={streams} I={interval_ms:g}: {cell}", flush=True)
            # The probe (one httpx2 pool, timed when its reads return) is already late by
            # hundreds of ms at 1,000 tokens a second: past that it measures nothing new.
            if args.no_probe or streams * 1000 / interval_ms > PROBE_MAX_TOKENS_PER_S:
                continue
            probe = run_in_process(
                "probe", origin=server.origin, streams=streams, duration=duration,
                first_token_ms=first_ms, token_interval_ms=interval_ms, tokens=tokens,
                client_priority=args.client_priority,
            )  # fmt: skip
            cell["probe"] = probe
            for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
                theirs = probe[f"{key}_err_ms"]
                cell[f"added_{key}_ms"] = None if theirs is None else cell[f"{key}_err_ms"] - theirs
            print(f"probe C={streams} I={interval_ms:g}: {probe}", flush=True)
    finally:
        server.close()
    tokens = 500 if args.quick else args.tokens
    streams = 50 if args.quick else args.streams
    throughput: list[dict[str, Any]] = []
    server = Server(args.server_procs, bench=True)
    try:
        selected = args.accuracy_streams is not None or args.accuracy_cells is not None
        for kind in ("ours", "openai") if not selected else ():
            cell = run_in_process(
                kind, origin=server.origin, streams=streams, tokens=tokens, duration=duration
            )
            cell["events_per_cpu_s"] = cell["events"] / cell["cpu_s"] if cell["cpu_s"] else 0.0
            throughput.append(cell)
            print(f"throughput {kind}: {cell}", flush=True)
    finally:
        server.close()
    ratio = None
    if throughput:
        ours, theirs = throughput
        ratio = (
            ours["events_per_cpu_s"] / theirs["events_per_cpu_s"]
            if theirs["events_per_cpu_s"]
            else 0.0
        )
    return {
        "benchmark": "bench_loadtest",
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average": list(os.getloadavg()),
        },
        "method": __doc__,
        "server_procs": args.server_procs,
        "server_priority": server_priority,
        "client_priority": args.client_priority,
        "http_transport": args.http_transport,
        "duration_s": duration,
        "accuracy": accuracy,
        "throughput_streams": streams,
        "tokens": tokens,
        "throughput": throughput,
        "ratio_vs_openai": ratio,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per cell")
    parser.add_argument("--server-procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workers", type=int, default=1, help="load-test worker processes")
    parser.add_argument(
        "--server-priority",
        choices=("normal", "nice", "realtime"),
        default="realtime",
        help="the accuracy cells' server processes' CPU priority (see the method)",
    )
    parser.add_argument(
        "--client-priority",
        choices=("normal", "realtime"),
        default="normal",
        help="the accuracy cells' client processes' CPU priority: realtime runs them "
        "(SCHED_RR 1) below the server (then SCHED_RR 2) and before every other process, "
        "as on a machine with nothing else running",
    )
    parser.add_argument(
        "--http-transport",
        choices=("direct", "httpx", "httptools"),
        help="the load generator's HTTP transport in the accuracy cells (default: the "
        "command's, httptools where installed, else direct)",
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="the accuracy cells' ramp in seconds (default 0: every stream starts at once, "
        "as trio-sampler loadtest does without --ramp)",
    )
    parser.add_argument(
        "--young-threshold",
        type=int,
        help="the load generator's young-collection threshold during a stage (default: "
        "its own, 100,000; 700 is the interpreter's, as before it was raised)",
    )
    parser.add_argument(
        "--accuracy-streams",
        type=lambda text: {int(part) for part in text.split(",")},
        help="run only these accuracy cells (e.g. 1000), and no throughput cells",
    )
    parser.add_argument(
        "--accuracy-cells",
        type=lambda text: {
            (int(c), float(i)) for c, i in (part.split(":") for part in text.split(","))
        },
        help="run only these accuracy cells, as C:I (streams, token interval ms, with "
        "D = 250 ms and 16 tokens; e.g. 1000:200, the 5,000 tokens per second cell), and "
        "no throughput cells",
    )
    parser.add_argument("--no-probe", action="store_true", help="skip the raw probe")
    parser.add_argument("--streams", type=int, default=200, help="throughput concurrency")
    parser.add_argument("--tokens", type=int, default=2000, help="events per throughput stream")
    parser.add_argument("--_cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.http_transport is None:  # what trio-sampler loadtest runs on
        from trio_sampler.cli._loadtest import _fastest_transport

        args.http_transport = _fastest_transport()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._cell is not None:
        cell_main(json.loads(args._cell))
        return 0
    results = orchestrate(args)
    print_report(results)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
