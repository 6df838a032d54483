"""The actor under load: concurrent streams from the emulator, against a raw floor and the SDKs.

One emulator runs in bench mode (pre-rendered bodies, one write per response) in a
separate process; every measurement cell runs in a fresh client process (so heaps, file
descriptors and GC state of one cell never leak into the next) against that same server.
At each concurrency ``C`` the contenders are:

* **ours**: ``open_sampler(config)`` (Chat Completions backend), ``C`` requests submitted at
  once, every event of every stream read by its own consumer task;
* **floor**: one ``httpx2.AsyncClient``, ``aiter_raw``, bytes split on ``b"\\n\\n"``,
  ``orjson.loads``, no events, same ``C``, under trio;
* **openai**: ``AsyncOpenAI(max_retries=0, http_client=httpx2.AsyncClient(...))``,
  ``chat.completions.create(stream=True)``, iterating the chunks (anyio on trio);
* **anthropic**: ``AsyncAnthropic(...)`` likewise, ``messages.create(stream=True)`` against
  the emulator's Messages endpoint, iterating the raw events.

Each stream is a scripted reply of ``--tokens`` text deltas (``chunk_chars`` characters
each). An **event** is one text delta delivered to the consumer (``ChannelToken`` for
ours, a chunk with ``delta.content`` for the floor and openai, a ``content_block_delta``
for anthropic), so every column counts the same unit of work.

Measured per cell: events/s (wall clock, first request to last terminal), client CPU per
event (``time.process_time()`` delta of the client process over the same window), time to
first token at the consumer (p50/p99, and ours minus the floor's at the same ``C``), and
memory per in-flight stream (RSS delta / ``C`` with ``C`` slow streams held open after each
received its first token). For ours alone: cancel-to-terminal latency with 1,000 streams
in flight (``RequestStream.cancel()`` to the ``Cancelled`` event arriving at the consumer),
one cancel at a time (the target) and all at once (reported).

**Per request** (``run_per_request``): against an independent server in its own process
(``benchmarks/sse_server.py``: standard-library asyncio, pre-rendered Chat Completions
bodies in one chunked write, keep-alive; no code shared with the library or the
emulator), ours and the floor run streams of 1, 200 and 2,000 text deltas one after the
other (C = 1), **in one process, taking turns in blocks of 10 streams** (floor first in
even blocks, ours first in odd ones) after 30 unmeasured streams of each: 400 / 300 / 40
measured streams each. Per contender, over its own blocks: client CPU per request and per
event (``time.process_time()``: everything the process did meanwhile, the actor's
background work included), TTFT p50 at the consumer, time to the response headers, and
generation-0 collections per request (allocation churn). Taking turns within
milliseconds, both see the same machine: in separate processes a minute apart the floor's
own CPU per 200-delta request moved between 1.24 and 2.39 ms. Five repeats, each a fresh
process; the result per size is the median over the repeats of ours ÷ floor (CPU) and
ours − floor (TTFT), with the block pairs' quartiles beside it. The load average is
recorded before and after. ``--only per_request`` runs just these cells. A third
contender takes its turn between the two, the skeleton (``Skeleton``): the shape of ours'
contract alone on the floor's parsing; ours minus the skeleton is what the rest of ours'
work costs.

**Against the openai SDK** (``run_vs_sdk``): the same independent server, ``C`` = 200
streams of 2,000 text deltas at once, ours, the floor and the openai SDK each in a fresh
process. Events per client core (events ÷ client CPU seconds) is what a load generator's
reach depends on, and this setting measures it without the server sharing the client's
code or dominating the cores with per-request work: the emulator cells above (200-delta
streams, the emulator beside the client on the same two cores) mostly measure per-request
costs and the server. ``--only vs_sdk`` runs just this cell.

Run ``python benchmarks/bench_actor.py`` (``--quick`` for a short run); see
``docs/benchmarks-actor.md``. It prints a table and PASS/FAIL per target (progress goes to
stderr), writes JSON, and exits 1 when a target is missed (2 when it cannot run).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import importlib.metadata
import io
import json
import math
import os
import platform
import pstats
import random
import resource
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import httpcore2
import httpx2
import orjson
import trio

try:
    from benchmarks.common import cpu_seconds, raise_nofile, read_request
except ModuleNotFoundError:  # run as a script: python benchmarks/bench_actor.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import cpu_seconds, raise_nofile, read_request

from trio_sampler.actor import RequestStream, SamplerHandle, open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingChannel,
    User,
)

IMPLS = ("ours", "floor", "openai", "anthropic")
DEFAULT_CONCURRENCY = (1, 100, 500, 2000, 10000)
QUICK_CONCURRENCY = (1, 50, 200)
DEFAULT_JSON = Path(__file__).parent / "results" / "bench_actor.json"
MODEL = "bench-model"
MAX_TOKENS = 8192
#: Streams per cell at least (small ``C`` is repeated in rounds so the numbers are stable).
MIN_STREAMS = 200
#: Slow script for the memory and cancel cells: the role chunk and the first text delta at
#: once, then silence for ``SLOW_STALL_S`` (the emulator's ``stall`` fault), then the rest:
#: every stream is open and idle when measured, with no background traffic.
SLOW_STALL_S = 120.0
SLOW_TOKENS = 10
#: How long to wait for every slow stream to get its first token.
START_TIMEOUT_S = 90.0
WORKER_TIMEOUT_S = 1800.0

#: Targets (see docs/benchmarks-actor.md).
TARGET_CPU_VS_FLOOR = 2.0  # ours CPU/event <= 2x floor's, at C = TARGET_AT
TARGET_VS_OPENAI = 15.0  # ours events per client core >= 15x openai's (the vs_sdk cell)
TARGET_AT = 500
TARGET_MAX_C = 10000  # streams without errors
TARGET_CANCEL_P99_MS = 5.0
#: Per request, C = 1, against the independent server (``run_per_request``).
TARGET_REQUEST_TOKENS = 200
TARGET_REQUEST_CPU_VS_FLOOR = 1.3  # client CPU per request of a 200-delta stream
TARGET_ADDED_TTFT_MS = 0.5  # TTFT p50 minus the floor's, 200-delta stream
LONG_TOKENS = 2000
TARGET_LONG_CPU_VS_FLOOR = 2.0  # client CPU per event of a 2,000-delta stream
VS_SDK_CONCURRENCY = 200  # streams at once in the vs_sdk cell (quick: 50)
VS_SDK_IMPLS = ("ours", "floor", "openai")

_PROSE = (
    "The weather in Edinburgh is mild today, with light rain expected after noon and a "
    "gentle westerly wind; temperatures stay near 14 degrees until the evening. "
)


# -- shared helpers --------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class GcClock:
    """Time the garbage collector runs while the block runs (``gc.callbacks``), and how
    many of its runs were full (generation 2) collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        if info["generation"] == 2:
            self.full += 1


def script_text(tokens: int, chunk_chars: int) -> str:
    needed = tokens * chunk_chars
    return (_PROSE * (needed // len(_PROSE) + 1))[:needed]


def script_header(tokens: int, chunk_chars: int, stall_s: float = 0.0) -> str:
    """The ``x-emulator-script`` value: ``tokens`` text deltas of ``chunk_chars`` characters;
    with ``stall_s``, silence after the first text delta (SSE events 0 and 1 of the
    Chat Completions body; the Messages body has its first delta at event 3)."""
    script: dict[str, Any] = {"text": script_text(tokens, chunk_chars), "chunk_chars": chunk_chars}
    if stall_s:
        script["faults"] = [{"type": "stall", "after_events": 4, "seconds": stall_s}]
    return json.dumps(script, separators=(",", ":"))


def machine_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "trio": trio.__version__,
        "httpx2": httpx2.__version__,
        "openai": importlib.metadata.version("openai"),
        "anthropic": importlib.metadata.version("anthropic"),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    }


# -- the server process ----------------------------------------------------------------


def serve_main(backlog: int, port: int) -> None:
    """One emulator process in bench mode, bound with ``SO_REUSEPORT`` (several of them
    share the port; see :class:`Server`), with a listen backlog long enough for 10k
    connects (Hypercorn's default of 100 drops SYNs at C = 10,000)."""
    import functools

    from trio_sampler.emulator import EmulatorServer, serve

    raise_nofile()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server: EmulatorServer = await nursery.start(
                functools.partial(
                    serve,
                    port=port,
                    bench=True,
                    backlog=backlog,
                    reuse_port=True,
                    # At C = 10,000 the client can take longer than Hypercorn's default
                    # 5 s to write a request on a connection it has just opened.
                    keep_alive_timeout=300.0,
                )
            )
            print(f"listening on {server.origin}", flush=True)

    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass


#: Emulator processes sharing the port by default: one per core. A single process
#: accepts (and serves) only so fast: at 10,000 simultaneous connects its listen queue
#: (capped by net.core.somaxconn) overflows and the dropped SYNs are retried by the
#: kernel after 1, 3, 7, 15, 31, 63 s, which is what a held-open cell then measures.
DEFAULT_SERVER_PROCS = os.cpu_count() or 1


class Server:
    """The emulator: ``procs`` processes on one port (``SO_REUSEPORT``, the kernel spreads
    connections over them); ``origin`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, backlog: int, procs: int = 1) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        port = 0
        try:
            for _ in range(max(1, procs)):
                command = [sys.executable, __file__, "--_serve", "--backlog", str(backlog)]
                proc = subprocess.Popen(
                    [*command, "--_port", str(port)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                self.procs.append(proc)
                assert proc.stdout is not None
                line = proc.stdout.readline().strip()
                prefix = "listening on "
                if not line.startswith(prefix):
                    raise RuntimeError(f"the emulator did not start (first line {line!r})")
                self.origin = line[len(prefix) :]
                port = int(self.origin.rsplit(":", 1)[1])
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def cpu_seconds(self) -> float:
        """User + system CPU of the server processes so far (from ``/proc``)."""
        return cpu_seconds(self.pids)

    def open_files(self) -> int:
        """File descriptors the server processes hold (sockets included)."""
        return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in self.pids)

    def settle(self, below: int = 500, timeout: float = 120.0) -> int:
        """Wait until the previous cell's sockets are gone from the server (it closes them
        as it reads their EOFs, which takes a while after 10,000 streams): the next cell
        must not inherit them, or 10,000 new connects can exceed the open-file limit.
        Returns when fewer than ``below`` remain, or the count has not moved for 2 s."""
        deadline = time.monotonic() + timeout
        count = self.open_files()
        still_since = time.monotonic()
        while count > below and time.monotonic() < deadline:
            time.sleep(0.25)
            now_count = self.open_files()
            if now_count != count:
                count, still_since = now_count, time.monotonic()
            elif time.monotonic() - still_since >= 2.0:
                break
        return count

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- one stream per contender ------------------------------------------------------------


class Rec:
    """What one stream saw, at its consumer."""

    __slots__ = (
        "error",
        "events",
        "first",
        "headers_ms",
        "metric_ttft_ms",
        "ok",
        "start",
        "terminal_at",
    )

    def __init__(self) -> None:
        self.start = 0.0
        self.first: float | None = None
        #: From the start to the response headers (ours: ``metrics.time_to_headers_ms``).
        self.headers_ms: float | None = None
        self.events = 0
        self.ok = False
        self.error: str | None = None
        self.metric_ttft_ms: float | None = None
        self.terminal_at: float | None = None


class StartCounter:
    """Called at each stream's first token; ``all_started`` is set at the ``n``-th call."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.all_started = trio.Event()

    def __call__(self) -> None:
        self.count += 1
        if self.count == self.n:
            self.all_started.set()


#: The skeleton's terminal: one object, after every delta.
_SKELETON_END = object()
_SKELETON_TIMEOUT_S = 300.0


class Skeleton:
    """The shape of ours' contract alone, on the floor's parsing (the per-request cells'
    third contender): what any sampler that keeps that shape pays before it does anything
    else.

    Per request, as ours: a task of its own in a nursery opened beside the consumer, with a
    cancel scope of its own; the request handed to an ``httpcore2`` pool directly (ours'
    direct path, the same headers as the floor's); a timeout scope around every read; each
    text delta a ``ChannelToken``, the deltas of a read sent as one batch over a memory
    channel; one terminal object at the end; the consumer reading the events one at a
    time through an async iterator. Nothing else: no rendering of a conversation, no
    transform state, no response, metrics, redaction, retry, routing or pacing. Ours
    minus the skeleton is what all of that costs."""

    def __init__(self, origin: str, headers: dict[str, str], body: bytes) -> None:
        self.url = httpcore2.URL(origin + "/v1/chat/completions")
        host = origin.split("://", 1)[1].encode()
        self.headers = [
            (b"Host", host),
            *((name.encode(), value.encode()) for name, value in headers.items()),
            (b"Content-Length", b"%d" % len(body)),
        ]
        self.body = body
        self.timeout = {
            "connect": 120.0,
            "read": _SKELETON_TIMEOUT_S,
            "write": _SKELETON_TIMEOUT_S,
            "pool": None,
        }
        self.pool: httpcore2.AsyncConnectionPool | None = None
        self.nursery: trio.Nursery | None = None

    async def run(self, body: Callable[[], Awaitable[None]]) -> None:
        async with (
            httpcore2.AsyncConnectionPool(
                max_connections=None, max_keepalive_connections=64
            ) as self.pool,
            trio.open_nursery() as self.nursery,
        ):
            await body()

    def submit(self) -> AsyncIterator[object]:
        assert self.nursery is not None
        send, receive = trio.open_memory_channel[list[object]](math.inf)
        self.nursery.start_soon(self._request, send, trio.CancelScope())
        return self._events(receive)

    @staticmethod
    async def _events(receive: trio.MemoryReceiveChannel[list[object]]) -> AsyncIterator[object]:
        async with receive:
            async for batch in receive:
                for event in batch:
                    yield event

    async def _request(
        self, send: trio.MemorySendChannel[list[object]], scope: trio.CancelScope
    ) -> None:
        assert self.pool is not None
        with send, scope:
            request = httpcore2.Request(
                b"POST",
                self.url,
                headers=self.headers,
                content=self.body,
                extensions={"timeout": self.timeout},
            )
            response = await self.pool.handle_async_request(request)
            try:
                # The pool's own body iterator, as ours' direct path reads it.
                chunks = cast("AsyncIterable[bytes]", response.stream).__aiter__()
                pending = b""
                index = 0
                while True:
                    with trio.move_on_after(_SKELETON_TIMEOUT_S):
                        try:
                            raw = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                    frames = (pending + raw).split(b"\n\n")
                    pending = frames.pop()
                    batch: list[object] = []
                    for frame in frames:
                        if not frame.startswith(b"data: ") or frame[6:] == b"[DONE]":
                            continue
                        choices = orjson.loads(frame[6:])["choices"]
                        if choices and (text := choices[0]["delta"].get("content")):
                            index += 1
                            batch.append(
                                ChannelToken("req_skeleton", SamplingChannel.TEXT, text, index)
                            )
                    if batch:
                        send.send_nowait(batch)
            finally:
                await response.aclose()
            send.send_nowait([_SKELETON_END])


class Contender:
    """Opens what a contender needs (an actor, a client) and runs one stream on it."""

    def __init__(
        self,
        impl: str,
        origin: str,
        tokens: int,
        script: str,
        *,
        headers: dict[str, str] | None = None,
        through_httpx2: bool = False,
    ) -> None:
        self.impl = impl
        self.origin = origin
        self.tokens = tokens
        #: Ours over a transport of its own (``httpx2.AsyncClient.send``), not the
        #: client's direct path to its ``httpcore2`` pools: for an A/B of that path.
        self.through_httpx2 = through_httpx2
        #: The emulator reads its script from these; ``headers`` replaces them (another server).
        self.headers = (
            {"x-emulator-script": script, "x-emulator-bench": "1"} if headers is None else headers
        )
        self.handle: SamplerHandle | None = None
        self.http: httpx2.AsyncClient | None = None
        self.skeleton: Skeleton | None = None
        # The SDKs are imported only by their own cells: each cell's process loads just its
        # contender's library, as an application would (a bigger heap makes every full
        # garbage collection slower, which would tax whichever contender ran beside it).
        self.openai: Any = None
        self.anthropic: Any = None
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Tell me about the weather."}
        ]
        self.floor_body = orjson.dumps({"model": MODEL, "messages": self.messages, "stream": True})
        self.request = ConversationRequest(
            items=[User("Tell me about the weather.")],
            max_output_tokens=MAX_TOKENS,
            extra_headers=self.headers,
        )

    def sampler_config(self) -> SamplerConfig:
        return SamplerConfig(
            base_url=self.origin + "/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model=MODEL,
            api_key="bench-key",
            timeouts=Timeouts(connect=120.0, response_headers=300.0),
            retry=RetryPolicy(max_retries=0),  # errors must show, not be retried away
            # BENCH_CONNECTION_POOLS overrides the library default (for A/B runs).
            connection_pools=int(os.environ.get("BENCH_CONNECTION_POOLS", "16")),
        )

    @staticmethod
    def http_client() -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
            timeout=httpx2.Timeout(300.0, connect=120.0, pool=None),
        )

    async def run(self, body: Callable[[], Awaitable[None]]) -> None:
        """Open the contender's client for the duration of ``body``."""
        if self.impl == "ours" and self.through_httpx2:
            limits = httpx2.Limits(max_connections=None, max_keepalive_connections=64)
            async with (
                httpx2.AsyncHTTPTransport(limits=limits) as transport,
                open_sampler(self.sampler_config(), transport=transport) as handle,
            ):
                self.handle = handle
                await body()
        elif self.impl == "ours":
            async with open_sampler(self.sampler_config()) as handle:
                self.handle = handle
                await body()
        elif self.impl == "floor":
            async with self.http_client() as http:
                self.http = http
                await body()
        elif self.impl == "skeleton":
            headers = {**self.headers, "content-type": "application/json"}
            self.skeleton = Skeleton(self.origin, headers, self.floor_body)
            await self.skeleton.run(body)
        elif self.impl == "openai":
            import openai

            async with openai.AsyncOpenAI(
                base_url=self.origin + "/v1",
                api_key="bench-key",
                max_retries=0,
                timeout=httpx2.Timeout(300.0, connect=120.0, pool=None),
                http_client=self.http_client(),
            ) as client:
                self.openai = client
                await body()
        elif self.impl == "anthropic":
            import anthropic

            async with anthropic.AsyncAnthropic(
                base_url=self.origin,
                api_key="bench-key",
                max_retries=0,
                timeout=httpx2.Timeout(300.0, connect=120.0, pool=None),
                http_client=self.http_client(),
            ) as client:
                self.anthropic = client
                await body()
        else:
            raise ValueError(f"unknown contender {self.impl!r}")

    async def stream(
        self,
        rec: Rec,
        *,
        started: Callable[[], None] | None = None,
        on_stream: Callable[[RequestStream], None] | None = None,
    ) -> None:
        """Run one stream to its end, recording into ``rec``; never raises (but Cancelled).

        ``started`` is called once, at the first text delta; ``on_stream`` (ours only) gets
        the ``RequestStream`` as soon as it exists.
        """
        rec.start = time.perf_counter()
        try:
            if self.impl == "ours":
                await self._ours(rec, started, on_stream)
            elif self.impl == "floor":
                await self._floor(rec, started)
            elif self.impl == "skeleton":
                await self._skeleton(rec, started)
            elif self.impl == "openai":
                await self._openai(rec, started)
            else:
                await self._anthropic(rec, started)
        except Exception as exc:  # recorded as this stream's error
            rec.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        if rec.ok and rec.events != self.tokens:
            rec.ok = False
            rec.error = rec.error or f"expected {self.tokens} text deltas, got {rec.events}"

    def _token(self, rec: Rec, started: Callable[[], None] | None) -> None:
        rec.events += 1
        if rec.first is None:
            rec.first = time.perf_counter()
            if started is not None:
                started()

    async def _ours(
        self,
        rec: Rec,
        started: Callable[[], None] | None,
        on_stream: Callable[[RequestStream], None] | None,
    ) -> None:
        assert self.handle is not None
        stream = await self.handle.submit(self.request)
        if on_stream is not None:
            on_stream(stream)
        async with stream:
            async for event in stream:
                kind = type(event)
                if kind is ChannelToken:
                    self._token(rec, started)
                elif kind is Completed or kind is Failed or kind is Cancelled:
                    assert isinstance(event, Completed | Failed | Cancelled)
                    rec.terminal_at = time.perf_counter()
                    if event.metrics is not None:
                        rec.metric_ttft_ms = event.metrics.time_to_first_token_ms
                        rec.headers_ms = event.metrics.time_to_headers_ms
                    if isinstance(event, Completed):
                        rec.ok = True
                    elif isinstance(event, Failed):
                        rec.error = f"Failed: {event.error}"
                    else:
                        rec.error = f"Cancelled: {event.reason}"

    async def _floor(self, rec: Rec, started: Callable[[], None] | None) -> None:
        assert self.http is not None
        headers = {**self.headers, "content-type": "application/json"}
        url = self.origin + "/v1/chat/completions"
        async with self.http.stream("POST", url, content=self.floor_body, headers=headers) as r:
            rec.headers_ms = (time.perf_counter() - rec.start) * 1000.0
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}")
            pending = b""
            async for raw in r.aiter_raw():
                frames = (pending + raw).split(b"\n\n")
                pending = frames.pop()
                for frame in frames:
                    if not frame.startswith(b"data: "):
                        continue
                    data = frame[6:]
                    if data == b"[DONE]":
                        rec.ok = True
                        continue
                    choices = orjson.loads(data)["choices"]
                    if choices and choices[0]["delta"].get("content"):
                        self._token(rec, started)

    async def _skeleton(self, rec: Rec, started: Callable[[], None] | None) -> None:
        assert self.skeleton is not None
        events = self.skeleton.submit()
        await trio.lowlevel.checkpoint()  # as ``submit``: a checkpoint, then the stream
        async for event in events:
            if type(event) is ChannelToken:
                self._token(rec, started)
            elif event is _SKELETON_END:
                rec.ok = True

    async def _openai(self, rec: Rec, started: Callable[[], None] | None) -> None:
        assert self.openai is not None
        stream = await self.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me about the weather."}],
            stream=True,
            extra_headers=self.headers,
        )
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    self._token(rec, started)
                elif chunk.choices and chunk.choices[0].finish_reason:
                    rec.ok = True

    async def _anthropic(self, rec: Rec, started: Callable[[], None] | None) -> None:
        assert self.anthropic is not None
        stream = await self.anthropic.messages.create(
            model=MODEL,
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "Tell me about the weather."}],
            stream=True,
            extra_headers=self.headers,
        )
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    self._token(rec, started)
                elif event.type == "message_stop":
                    rec.ok = True


# -- worker cells (each in a fresh process) ----------------------------------------------


def _errors(recs: Sequence[Rec]) -> tuple[int, list[str]]:
    failed = [r.error or "no terminal" for r in recs if not r.ok]
    common = [f"{n} x {text}" for text, n in Counter(failed).most_common(3)]
    return len(failed), common


async def _warm_up(contender: Contender) -> None:
    rec = Rec()
    await contender.stream(rec)
    if not rec.ok:
        raise RuntimeError(f"{contender.impl}: the warm-up stream failed: {rec.error}")


async def cell_throughput(spec: dict[str, Any]) -> dict[str, Any]:
    impl, concurrency, tokens = spec["impl"], int(spec["concurrency"]), int(spec["tokens"])
    script = script_header(tokens, int(spec["chunk_chars"]))
    contender = Contender(impl, spec["origin"], tokens, script, headers=spec.get("headers"))
    rounds = max(1, math.ceil(MIN_STREAMS / concurrency))
    recs: list[Rec] = []
    out: dict[str, Any] = {}

    async def body() -> None:
        await _warm_up(contender)
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with GcClock() as collector:
            for _ in range(rounds):
                batch = [Rec() for _ in range(concurrency)]
                recs.extend(batch)
                async with trio.open_nursery() as nursery:
                    for rec in batch:
                        nursery.start_soon(contender.stream, rec)
        out["cpu_s"] = time.process_time() - cpu0
        out["wall_s"] = time.perf_counter() - wall0
        out["gc_s"] = collector.seconds
        out["gc_full"] = collector.full

    await contender.run(body)
    events = sum(r.events for r in recs)
    errors, samples = _errors(recs)
    ttft = [(r.first - r.start) * 1000.0 for r in recs if r.first is not None]
    metric_ttft = [r.metric_ttft_ms for r in recs if r.metric_ttft_ms is not None]
    out.update(
        impl=impl,
        concurrency=concurrency,
        rounds=rounds,
        streams=len(recs),
        errors=errors,
        error_samples=samples,
        events=events,
        events_per_s=events / out["wall_s"] if out["wall_s"] else None,
        cpu_us_per_event=out["cpu_s"] / events * 1e6 if events else None,
        ttft_p50_ms=percentile(ttft, 0.5),
        ttft_p99_ms=percentile(ttft, 0.99),
        metric_ttft_p50_ms=percentile(metric_ttft, 0.5),
    )
    return out


async def cell_per_request_paired(spec: dict[str, Any]) -> dict[str, Any]:
    """Ours and the floor in one process, taking turns in blocks of ``block`` streams of
    ``tokens`` text deltas (C = 1) against the independent server, floor first in even
    blocks and ours first in odd ones, after ``warmup`` unmeasured streams of each. The
    :class:`Skeleton` (ours' contract's shape alone) takes its turn between them.

    Each contender's CPU is the sum of ``time.process_time()`` over its own blocks (ours
    includes its background work: the actor, the drain of each body's end), so a change
    in the machine's speed (another VM on the host, the CPU's clock) reaches both within
    milliseconds of each other rather than a process start apart. TTFT is each stream's
    start (before ``submit`` / the request call) to its first text delta at the consumer;
    ``gen0_per_request`` counts the collector's generation-0 runs (one per ~700 net
    container allocations) per stream: allocation churn, not time. ``cpu_vs_floor`` is
    ours' total over the floor's, and ``block_ratios`` each block pair's ratio.
    """
    tokens, requests = int(spec["tokens"]), int(spec["requests"])
    warmup, block = int(spec["warmup"]), int(spec["block"])
    headers = {"x-bench-events": str(tokens), "x-bench-chunk-chars": "4"}
    through_httpx2 = bool(spec.get("through_httpx2"))
    contenders = {
        impl: Contender(
            impl, spec["origin"], tokens, "", headers=headers, through_httpx2=through_httpx2
        )
        for impl in ("ours", "skeleton", "floor")
    }
    recs: dict[str, list[Rec]] = {impl: [] for impl in contenders}
    spent: dict[str, dict[str, float]] = {
        impl: {"cpu_s": 0.0, "wall_s": 0.0, "gc_s": 0.0, "gen0": 0.0} for impl in contenders
    }
    block_ratios: list[float] = []

    async def body() -> None:
        for _ in range(warmup):
            for contender in contenders.values():
                await _warm_up(contender)
        gc.collect()
        for number in range(math.ceil(requests / block)):
            order = (
                ("floor", "skeleton", "ours") if number % 2 == 0 else ("ours", "skeleton", "floor")
            )
            this_block: dict[str, float] = {}
            for impl in order:
                batch = [Rec() for _ in range(block)]
                recs[impl].extend(batch)
                gen0 = gc.get_stats()[0]["collections"]
                cpu0, wall0 = time.process_time(), time.perf_counter()
                with GcClock() as collector:
                    for rec in batch:
                        await contenders[impl].stream(rec)
                this_block[impl] = time.process_time() - cpu0
                totals = spent[impl]
                totals["cpu_s"] += this_block[impl]
                totals["wall_s"] += time.perf_counter() - wall0
                totals["gc_s"] += collector.seconds
                totals["gen0"] += gc.get_stats()[0]["collections"] - gen0
            if this_block["floor"] > 0:
                block_ratios.append(this_block["ours"] / this_block["floor"])

    async def with_skeleton() -> None:
        await contenders["skeleton"].run(body)

    async def with_floor() -> None:
        await contenders["floor"].run(with_skeleton)

    await contenders["ours"].run(with_floor)
    out: dict[str, Any] = {"tokens": tokens, "block": block, "block_ratios": block_ratios}
    for impl, totals in spent.items():
        done = recs[impl]
        errors, samples = _errors(done)
        ttft = [(r.first - r.start) * 1000.0 for r in done if r.first is not None]
        to_headers = [r.headers_ms for r in done if r.headers_ms is not None]
        out[impl] = {
            "impl": impl,
            "tokens": tokens,
            "requests": len(done),
            "cpu_s": totals["cpu_s"],
            "wall_s": totals["wall_s"],
            "gc_s": totals["gc_s"],
            "gen0_per_request": totals["gen0"] / len(done),
            "errors": errors,
            "error_samples": samples,
            "cpu_ms_per_request": totals["cpu_s"] / len(done) * 1000.0,
            "cpu_us_per_event": totals["cpu_s"] / (len(done) * tokens) * 1e6,
            "wall_ms_per_request": totals["wall_s"] / len(done) * 1000.0,
            "ttft_p50_ms": percentile(ttft, 0.5),
            "ttft_p90_ms": percentile(ttft, 0.9),
            "headers_p50_ms": percentile(to_headers, 0.5),
        }
    floor_cpu = spent["floor"]["cpu_s"]
    out["cpu_vs_floor"] = spent["ours"]["cpu_s"] / floor_cpu if floor_cpu else None
    out["skeleton_cpu_vs_floor"] = spent["skeleton"]["cpu_s"] / floor_cpu if floor_cpu else None
    return out


async def cell_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """``C`` slow streams held open; RSS delta once every one has its first token."""
    impl, concurrency = spec["impl"], int(spec["concurrency"])
    contender = Contender(
        impl, spec["origin"], SLOW_TOKENS, script_header(SLOW_TOKENS, 4, SLOW_STALL_S)
    )
    out: dict[str, Any] = {"impl": impl, "concurrency": concurrency}
    recs = [Rec() for _ in range(concurrency)]
    started = StartCounter(concurrency)

    async def body() -> None:
        fast = Contender(impl, spec["origin"], 5, script_header(5, 4))
        fast.handle, fast.http, fast.openai, fast.anthropic = (
            contender.handle,
            contender.http,
            contender.openai,
            contender.anthropic,
        )
        await _warm_up(fast)
        gc.collect()
        before = rss_bytes()
        wall0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for rec in recs:
                nursery.start_soon(_bound_stream(contender, rec, started))
            with trio.move_on_after(START_TIMEOUT_S):
                await started.all_started.wait()
            out["open_s"] = time.perf_counter() - wall0
            out["started"] = started.count
            out["rss_before"] = before
            out["rss_held"] = rss_bytes()
            nursery.cancel_scope.cancel()

    await contender.run(body)
    delta = out["rss_held"] - out["rss_before"]
    out["bytes_per_stream"] = delta / max(1, out["started"])
    not_started = [r for r in recs if r.first is None]
    out["errors"] = len(not_started)
    out["error_samples"] = _errors(not_started)[1]
    return out


def _bound_stream(
    contender: Contender, rec: Rec, started: Callable[[], None]
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        await contender.stream(rec, started=started)

    return run


async def cell_cancel(spec: dict[str, Any]) -> dict[str, Any]:
    """Cancel-to-terminal latency, ours, with ``n`` slow streams in flight."""
    n = int(spec["streams"])
    impl = spec.get("impl", "ours")
    contender = Contender(
        impl, spec["origin"], SLOW_TOKENS, script_header(SLOW_TOKENS, 4, SLOW_STALL_S)
    )
    out: dict[str, Any] = {"impl": impl, "streams": n}

    async def one_round(mode: str) -> dict[str, Any]:
        recs = [Rec() for _ in range(n)]
        streams: list[RequestStream | None] = [None] * n
        ended = [trio.Event() for _ in range(n)]
        started = StartCounter(n)

        async def run(i: int) -> None:
            def keep(stream: RequestStream) -> None:
                streams[i] = stream

            await contender.stream(recs[i], started=started, on_stream=keep)
            ended[i].set()

        latencies: list[float] = []
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(run, i)
            with trio.move_on_after(START_TIMEOUT_S):
                await started.all_started.wait()
            ready = started.count
            cancel_at = [0.0] * n
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(n):
                stream = streams[i]
                if stream is None or recs[i].terminal_at is not None:
                    continue
                cancel_at[i] = time.perf_counter()
                stream.cancel("bench cancel")
                if mode == "sequential":
                    await ended[i].wait()
            for i in range(n):
                await ended[i].wait()
                done_at = recs[i].terminal_at
                if cancel_at[i] and done_at is not None:
                    latencies.append((done_at - cancel_at[i]) * 1000.0)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        wrong = sum(1 for r in recs if r.error is None or not r.error.startswith("Cancelled"))
        return {
            "started": ready,
            "measured": len(latencies),
            "not_cancelled_terminal": wrong,
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies) if latencies else None,
            "cpu_us_per_cancel": cpu / max(1, len(latencies)) * 1e6,
            "wall_s": wall,
        }

    async def body() -> None:
        out["sequential"] = await one_round("sequential")
        out["burst"] = await one_round("burst")

    await contender.run(body)
    return out


#: Text deltas per stream in the cancel-under-load cell. A stream that completes anyway is
#: replaced by a new one, so the cell always has its ``n`` streams streaming.
LOAD_TOKENS = 5_000
LOAD_CANCELS = 300
LOAD_CANCELS_PER_ROUND = 30


class RoundClock(trio.abc.Instrument):
    """Times each pass of Trio's scheduler over its runnable tasks (a "round").

    Trio alternates between waiting for I/O and running the tasks that are ready; a round
    is the time from the end of one I/O wait to the start of the next, and every task
    that becomes ready waits for (part of) the round in progress plus its turn in the
    next one. Only rounds that ran at least one task step are recorded.
    """

    def __init__(self) -> None:
        self.rounds_ms: list[float] = []
        self.steps: list[int] = []
        self._started: float | None = None
        self._steps = 0

    def after_io_wait(self, timeout: float) -> None:
        self._started = time.perf_counter()
        self._steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1

    def before_io_wait(self, timeout: float) -> None:
        if self._started is not None and self._steps:
            self.rounds_ms.append((time.perf_counter() - self._started) * 1000.0)
            self.steps.append(self._steps)


async def cell_cancel_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Cancel-to-terminal latency with ``n`` streams actively streaming at full speed.

    ``n`` streams of a long bench-mode reply are read as fast as the client can (a stream
    that completes is replaced, so ``n`` are always streaming). Then ``cancels`` of them
    are cancelled one at a time, at random, each replaced by a fresh stream; after every
    ``LOAD_CANCELS_PER_ROUND`` cancels the canceller sleeps 5 to 25 ms (at least one
    scheduling round, which at this load is long). Measured:

    * ``terminal``: ``stream.cancel()`` until the stream's terminal is the ``Cancelled``
      (``stream.terminal``, which is what the consumer's next read returns);
    * ``consumer``: ``stream.cancel()`` until the consumer task holds the ``Cancelled``
      event: this adds the wait for the scheduler to run that task again, which no
      library can shorten (Trio runs every ready task once per round, in no set order);
    * ``round``: the scheduler's rounds during the cancels (:class:`RoundClock`), with
      the mean number of task steps per round.
    """
    n = int(spec["streams"])
    cancels = int(spec.get("cancels", LOAD_CANCELS))
    tokens = int(spec.get("tokens", LOAD_TOKENS))
    contender = Contender("ours", spec["origin"], tokens, script_header(tokens, 4))
    rng = random.Random(12)
    out: dict[str, Any] = {"impl": "ours", "streams": n, "cancels": cancels, "tokens": tokens}
    terminal_ms: list[float] = []
    #: The same span in this thread's CPU time: what the cancel costs, without the time
    #: the OS gave the core to another process (the machine may be shared).
    terminal_cpu_ms: list[float] = []
    consumer_ms: list[float] = []
    gc_runs = [0]
    with_gc = 0

    def count_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_runs[0] += 1

    wrong: list[str] = []
    clock = RoundClock()
    completed = 0

    async def body() -> None:
        nonlocal completed, with_gc
        handle = contender.handle
        assert handle is not None
        streams: dict[int, RequestStream] = {}
        received: dict[int, float] = {}
        seen: dict[int, trio.Event] = {}
        cancelled_at: dict[int, float] = {}
        started = StartCounter(n)
        next_id = 0

        async def consume(nursery: trio.Nursery, key: int, on_first: Callable[[], None]) -> None:
            # The consumer submits its own request: starting a stream costs the starter
            # no checkpoint, so no cancel below waits for a scheduling round to start its
            # replacement (at this load a round takes up to seconds).
            nonlocal completed
            stream = await handle.submit(contender.request)
            streams[key] = stream
            first = True
            async with stream:
                async for event in stream:
                    kind = type(event)
                    if kind is ChannelToken and first:
                        first = False
                        on_first()
                    elif kind is Cancelled:
                        received[key] = time.perf_counter()
                        seen[key].set()
                    elif kind is Completed:
                        completed += 1
                        streams.pop(key, None)
                        start_one(nursery, lambda: None)
                    elif kind is Failed:
                        wrong.append(f"Failed: {event}"[:200])
                        streams.pop(key, None)

        def start_one(nursery: trio.Nursery, on_first: Callable[[], None]) -> None:
            nonlocal next_id
            key, next_id = next_id, next_id + 1
            seen[key] = trio.Event()
            nursery.start_soon(consume, nursery, key, on_first)

        async with trio.open_nursery() as nursery:
            start0 = time.perf_counter()
            for _ in range(n):
                start_one(nursery, started)
            with trio.move_on_after(START_TIMEOUT_S):
                await started.all_started.wait()
            start_s = time.perf_counter() - start0
            out["started"] = started.count
            await trio.sleep(1.0)  # let the streams settle into a rhythm
            trio.lowlevel.add_instrument(clock)
            gc.callbacks.append(count_gc)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            try:
                for done in range(cancels):
                    key = rng.choice([k for k, s in streams.items() if s.terminal is None])
                    stream = streams.pop(key)
                    collections = gc_runs[0]
                    cpu_before = time.thread_time()
                    before = time.perf_counter()
                    stream.cancel("bench cancel")
                    after = time.perf_counter()
                    terminal_cpu_ms.append((time.thread_time() - cpu_before) * 1000.0)
                    if gc_runs[0] != collections:
                        with_gc += 1
                    if not isinstance(stream.terminal, Cancelled):
                        wrong.append(f"terminal {type(stream.terminal).__name__} after cancel()")
                    terminal_ms.append((after - before) * 1000.0)
                    cancelled_at[key] = before
                    start_one(nursery, lambda: None)
                    if done % LOAD_CANCELS_PER_ROUND == LOAD_CANCELS_PER_ROUND - 1:
                        # Let the streams run: a round at this load can take seconds on a
                        # small machine, so the cancels come in groups, not one per round.
                        await trio.sleep(rng.uniform(0.005, 0.025))
                cancels_s = time.perf_counter() - wall0
                with trio.move_on_after(60.0):
                    for key in cancelled_at:
                        # Waiting on an Event that is set is still a checkpoint, and a
                        # checkpoint costs a whole scheduling round at this load (up to
                        # seconds): only the consumers not done yet are waited for.
                        if not seen[key].is_set():
                            await seen[key].wait()
                for key, before in cancelled_at.items():
                    if key in received:
                        consumer_ms.append((received[key] - before) * 1000.0)
                    else:
                        wrong.append("the consumer never saw its Cancelled")
            finally:
                trio.lowlevel.remove_instrument(clock)
                gc.callbacks.remove(count_gc)
            out["cpu_s"] = time.process_time() - cpu0
            out["wall_s"] = time.perf_counter() - wall0
            out["phases_s"] = {"start": start_s, "cancels": cancels_s}
            out["streaming_at_end"] = sum(1 for s in streams.values() if s.terminal is None)
            nursery.cancel_scope.cancel()

    await contender.run(body)
    for name, values in (
        ("terminal", terminal_ms),
        ("terminal_cpu", terminal_cpu_ms),
        ("consumer", consumer_ms),
        ("round", clock.rounds_ms),
    ):
        out[name] = {
            "count": len(values),
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
            "max_ms": max(values) if values else None,
        }
    out["round"]["mean_steps"] = sum(clock.steps) / len(clock.steps) if clock.steps else None
    out["terminal"]["with_gc"] = with_gc
    out["completed_and_replaced"] = completed
    out["errors"] = len(wrong)
    out["error_samples"] = [f"{k} x {v}" for v, k in Counter(wrong).most_common(3)]
    return out


# -- hedged attempts ---------------------------------------------------------------------

#: The hedging cell's route: time to first token 90 % fast, 10 % slow, drawn per attempt.
HEDGE_FAST_MS = 50.0
HEDGE_SLOW_MS = 1500.0
HEDGE_SLOW_SHARE = 0.10


class _BimodalTTFT(httpx2.AsyncBaseTransport):
    """The in-process emulator, each attempt's first token drawn fast or slow (seeded).

    The draw is per HTTP request, so a hedge of a slow attempt is itself fast 90 % of the
    time, as with a real server whose slowness is per request (a cold replica, a queue)."""

    def __init__(self, seed: int) -> None:
        from trio_sampler.emulator import EmulatorTransport

        self.inner = EmulatorTransport()
        self.rng = random.Random(seed)
        self.attempts = 0

    async def __aenter__(self) -> _BimodalTTFT:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(None, None, None)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        from trio_sampler.emulator import script_headers

        self.attempts += 1
        slow = self.rng.random() < HEDGE_SLOW_SHARE
        headers = script_headers(
            text=_PROSE, chunk_chars=16, first_token_ms=HEDGE_SLOW_MS if slow else HEDGE_FAST_MS
        )
        request.headers.update(headers)
        return await self.inner.handle_async_request(request)


async def _hedging_run(spec: dict[str, Any], hedge: Any) -> dict[str, Any]:
    from trio_sampler.routing import Route, RoutingPolicy

    config = SamplerConfig(
        base_url="http://bench.invalid/v1",
        model=MODEL,
        retry=RetryPolicy(max_retries=0),
        timeouts=Timeouts(first_token=30.0),
    )
    routing = RoutingPolicy([Route("bench", config)], breaker=None, hedge=hedge)
    ttfts: list[float] = []
    errors = 0
    request = ConversationRequest(items=[User("hello")])
    limit = trio.CapacityLimiter(spec["concurrency"])
    async with _BimodalTTFT(spec["seed"]) as transport:
        async with open_sampler(config, routing=routing, transport=transport) as sampler:

            async def one() -> None:
                nonlocal errors
                async with limit:
                    start = time.perf_counter()
                    stream = await sampler.submit(request)
                    first: float | None = None
                    async with stream:
                        async for event in stream:
                            if first is None and type(event) is ChannelToken:
                                first = time.perf_counter() - start
                    if first is None or not isinstance(stream.terminal, Completed):
                        errors += 1
                    else:
                        ttfts.append(first * 1000.0)

            async with trio.open_nursery() as nursery:
                for _ in range(spec["requests"]):
                    nursery.start_soon(one)
        attempts = transport.attempts
    ttfts.sort()
    return {
        "hedge": None if hedge is None else repr(hedge),
        "requests": spec["requests"],
        "errors": errors,
        "attempts_per_request": attempts / spec["requests"],
        "ttft_p50_ms": percentile(ttfts, 0.50),
        "ttft_p90_ms": percentile(ttfts, 0.90),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "over_1s": sum(1 for t in ttfts if t > 1000.0),
        "ttft_max_ms": ttfts[-1] if ttfts else None,
    }


async def cell_hedging(spec: dict[str, Any]) -> dict[str, Any]:
    """p99 time to first token against a bimodal route, hedging off, fixed, percentile."""
    from trio_sampler.routing import HedgePolicy

    modes = {
        "off": None,
        "fixed 200 ms": HedgePolicy(delay_s=0.2),
        "fixed 200 ms, 2 hedges": HedgePolicy(delay_s=0.2, max_hedges=2),
        "p90 of recent TTFT": HedgePolicy(delay_s=0.2, percentile=0.9, min_samples=20),
    }
    runs = {name: await _hedging_run(spec, hedge) for name, hedge in modes.items()}
    return {
        "cell": "hedging",
        "fast_ms": HEDGE_FAST_MS,
        "slow_ms": HEDGE_SLOW_MS,
        "slow_share": HEDGE_SLOW_SHARE,
        "concurrency": spec["concurrency"],
        "runs": runs,
    }


#: The keep-alive race cell: requests one after another, each sent 0 to
#: ``RACE_SPACING_MAX_S`` after the previous one ended, to a server that closes every
#: connection ``RACE_CLOSE_AFTER_S`` after its response.
RACE_REQUESTS = 300
RACE_CLOSE_AFTER_S = 0.020
RACE_SPACING_MAX_S = 0.030


def _race_response(number: int) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "model": MODEL}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"content": f"reply {number}"}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def cell_keepalive_race(spec: dict[str, Any]) -> dict[str, Any]:
    """The keep-alive race, over loopback: the server answers a connection's request and
    closes the connection ``close_after_s`` later, without saying so (no ``connection:
    close``), as a server or proxy that drops connections soon after a response does. The
    client keeps the connection for reuse and sends its next request 0 to
    ``spacing_max_s`` after the previous one ended: a request sent before the close goes
    out on a connection the server is about to drop, unanswered. Counted: the
    ``Retrying`` events the consumer saw (at most one per race: a request the server may
    have read is retried visibly, never resent unseen), the requests that met the race
    (they arrived at a connection as the server closed it), failures, connections."""
    requests = int(spec.get("requests", RACE_REQUESTS))
    close_after = float(spec.get("close_after_s", RACE_CLOSE_AFTER_S))
    spacing_max = float(spec.get("spacing_max_s", RACE_SPACING_MAX_S))
    rng = random.Random(7)
    counts = {"connections": 0, "answered": 0, "races": 0}

    async def on_connection(stream: trio.SocketStream) -> None:
        counts["connections"] += 1
        try:
            if await read_request(stream) is None:
                return
            counts["answered"] += 1
            await stream.send_all(_race_response(counts["answered"]))
            await trio.sleep(close_after)
            # A request that arrived meanwhile (the socket is readable) met the race.
            readable, _, _ = select.select([stream.socket.fileno()], [], [], 0)
            counts["races"] += bool(readable)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    retrying = 0
    failed: list[str] = []
    out: dict[str, Any] = {
        "impl": "ours",
        "requests": requests,
        "close_after_s": close_after,
        "spacing_max_s": spacing_max,
    }
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model=MODEL,
            api_key="sk-bench-0123456789",
            connection_pools=1,
        )
        request = ConversationRequest(items=[User("hello")])
        wall0 = time.perf_counter()
        async with open_sampler(config, seed=1) as sampler:
            for _ in range(requests):
                async for event in await sampler.submit(request):
                    if isinstance(event, Retrying):
                        retrying += 1
                    elif isinstance(event, Failed):
                        failed.append(str(event.error)[:200])
                await trio.sleep(rng.uniform(0.0, spacing_max))
        out["wall_s"] = time.perf_counter() - wall0
        nursery.cancel_scope.cancel()
    out["visible_retries"] = retrying
    out["failed"] = len(failed)
    out["failed_samples"] = [f"{k} x {v}" for k, v in Counter(failed).most_common(3)]
    out["races"] = counts["races"]
    out["answered"] = counts["answered"]
    out["connections"] = counts["connections"]
    return out


CELLS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "throughput": cell_throughput,
    "memory": cell_memory,
    "cancel": cell_cancel,
    "cancel_load": cell_cancel_load,
    "hedging": cell_hedging,
    "per_request_paired": cell_per_request_paired,
    "keepalive_race": cell_keepalive_race,
}


def worker_main(spec: dict[str, Any]) -> None:
    raise_nofile()
    cell = CELLS[spec["cell"]]
    profile_path: str | None = spec.get("profile")
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    result = trio.run(cell, spec)
    if profiler is not None and profile_path is not None:
        profiler.disable()
        profiler.dump_stats(profile_path)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(45)
        print(text.getvalue(), file=sys.stderr)
    print("RESULT " + json.dumps(result), flush=True)


def run_cell(spec: dict[str, Any], timeout: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Run one cell in a fresh client process; its last ``RESULT`` line is the answer."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--_worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {**spec, "failed": f"timed out after {timeout:g} s"}
    if spec.get("profile"):
        sys.stderr.write(done.stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return {**spec, "failed": f"exit {done.returncode}: " + " | ".join(tail)}


# -- orchestration, table, targets -------------------------------------------------------


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def build_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in results["concurrency"]:
        cells = results["throughput"].get(str(c), {})
        mems = results["memory"].get(str(c), {})
        floor = cells.get("floor", {})
        oai = cells.get("openai", {})
        for impl in results["impls"]:
            cell = cells.get(impl, {})
            mem = mems.get(impl, {})
            row: dict[str, Any] = {"concurrency": c, "impl": impl}
            if "skipped" in cell:
                row["note"] = cell["skipped"]
            elif "failed" in cell:
                row["note"] = "failed: " + cell["failed"]
            else:
                row.update(
                    streams=cell.get("streams"),
                    errors=cell.get("errors"),
                    events_per_s=cell.get("events_per_s"),
                    cpu_us_per_event=cell.get("cpu_us_per_event"),
                    gc_pct=100.0 * cell["gc_s"] / cell["cpu_s"]
                    if cell.get("cpu_s") and "gc_s" in cell
                    else None,
                    gc_full=cell.get("gc_full"),
                    ttft_p50_ms=cell.get("ttft_p50_ms"),
                    ttft_p99_ms=cell.get("ttft_p99_ms"),
                )
                fcpu = floor.get("cpu_us_per_event")
                if fcpu and row["cpu_us_per_event"] is not None:
                    row["cpu_vs_floor"] = row["cpu_us_per_event"] / fcpu
                oeps = oai.get("events_per_s")
                if oeps and row["events_per_s"] is not None:
                    row["eps_vs_openai"] = row["events_per_s"] / oeps
                if floor.get("ttft_p50_ms") is not None and row["ttft_p50_ms"] is not None:
                    row["added_ttft_p50_ms"] = row["ttft_p50_ms"] - floor["ttft_p50_ms"]
                if cell.get("errors"):
                    row["note"] = "; ".join(cell.get("error_samples", []))
            if mem and "failed" not in mem and "skipped" not in mem:
                row["mem_kib_per_stream"] = mem["bytes_per_stream"] / 1024
                row["mem_started"] = mem["started"]
                if mem.get("errors"):
                    note = row.get("note", "") + f" mem: {mem['errors']} not started"
                    row["note"] = note.strip()
            elif mem:
                row.setdefault("note", mem.get("skipped") or mem.get("failed"))
            rows.append(row)
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    header = (
        "|      C | impl      | streams | errors |    events/s | CPU µs/ev | GC % | CPU × floor "
        "| ev/s × openai | TTFT p50 ms | TTFT p99 ms | added TTFT p50 ms | KiB/stream | note |"
    )
    lines = [header, "|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|"]
    for row in rows:
        lines.append(
            f"| {row['concurrency']:>6,} | {row['impl']:<9} | {_fmt(row.get('streams')):>7} "
            f"| {_fmt(row.get('errors')):>6} | {_fmt(row.get('events_per_s')):>11} "
            f"| {_fmt(row.get('cpu_us_per_event'), '.1f'):>9} "
            f"| {_fmt(row.get('gc_pct'), '.0f'):>4} "
            f"| {_fmt(row.get('cpu_vs_floor'), '.2f'):>11} "
            f"| {_fmt(row.get('eps_vs_openai'), '.1f'):>13} "
            f"| {_fmt(row.get('ttft_p50_ms'), ',.1f'):>11} "
            f"| {_fmt(row.get('ttft_p99_ms'), ',.1f'):>11} "
            f"| {_fmt(row.get('added_ttft_p50_ms'), ',.1f'):>17} "
            f"| {_fmt(row.get('mem_kib_per_stream'), '.1f'):>10} | {row.get('note', '')} |"
        )
    return "\n".join(lines)


def _status(value: object, ok: bool) -> str:
    return "N/A" if value is None else ("PASS" if ok else "FAIL")


def judge(results: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def row(c: int, impl: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["concurrency"] == c and r["impl"] == impl), None)

    targets: list[dict[str, Any]] = []
    ours = row(TARGET_AT, "ours")
    ratio = ours.get("cpu_vs_floor") if ours else None
    targets.append(
        {
            "target": f"client CPU/event <= {TARGET_CPU_VS_FLOOR:g}x the floor at C={TARGET_AT}",
            "value": None if ratio is None else f"{ratio:.2f}x",
            "status": _status(ratio, ratio is not None and ratio <= TARGET_CPU_VS_FLOOR),
        }
    )
    targets.append(judge_vs_sdk(results.get("vs_sdk") or {}))
    big = row(TARGET_MAX_C, "ours")
    if big is None or big.get("errors") is None:
        status, value = "N/A", "not run (add 10000 to --concurrency)"
    else:
        # Both cells must be clean: the throughput run (errors) and the held-open run
        # (every one of the streams open at the same time got its first token).
        started = big.get("mem_started")
        ok = big["errors"] == 0 and big.get("streams") == TARGET_MAX_C and started == TARGET_MAX_C
        status = "PASS" if ok else "FAIL"
        value = f"{big['errors']} errors; {started} of {TARGET_MAX_C:,} held open started"
    targets.append(
        {
            "target": f"{TARGET_MAX_C:,} concurrent streams without errors",
            "value": value,
            "status": status,
        }
    )
    cancel = results.get("cancel", {})
    seq = cancel.get("sequential", {})
    p99 = seq.get("p99_ms")
    n = cancel.get("streams", 0)
    complete = seq.get("measured") == n and seq.get("not_cancelled_terminal") == 0
    targets.append(
        {
            "target": f"cancel-to-terminal p99 <= {TARGET_CANCEL_P99_MS:g} ms with {n:,} in flight",
            "value": None if p99 is None else f"{p99:.2f} ms",
            "status": "N/A"
            if p99 is None
            else ("PASS" if p99 <= TARGET_CANCEL_P99_MS and complete else "FAIL"),
        }
    )
    targets.extend(judge_per_request(results.get("per_request") or {}))
    load = results.get("cancel_load") or {}
    load_p99 = (load.get("terminal") or {}).get("p99_ms")
    load_ok = (
        load_p99 is not None
        and load.get("errors") == 0
        and (load.get("terminal") or {}).get("count") == load.get("cancels")
    )
    targets.append(
        {
            "target": f"cancel-to-terminal p99 <= {TARGET_CANCEL_P99_MS:g} ms with "
            f"{load.get('streams', 0):,} streaming at full speed",
            "value": None if load_p99 is None else f"{load_p99:.3f} ms",
            "status": "N/A"
            if load_p99 is None
            else ("PASS" if load_ok and load_p99 <= TARGET_CANCEL_P99_MS else "FAIL"),
        }
    )
    race = results.get("keepalive_race") or {}
    visible = race.get("visible_retries")
    # A request the server may have read is never resent unseen (docs/retry-policy.md):
    # a race it met is one visible retry, and nothing fails.
    targets.append(
        {
            "target": "keep-alive race: 0 failed, at most one visible retry per race hit, "
            f"out of {race.get('requests', 0)}",
            "value": None
            if visible is None
            else f"{visible} visible, {race['failed']} failed ({race['races']} races hit)",
            "status": _status(visible, race.get("failed") == 0 and visible <= race.get("races", 0)),
        }
    )
    return targets


def judge_vs_sdk(cell: dict[str, Any]) -> dict[str, Any]:
    ratio = cell.get("ours_vs_openai")
    where = (
        f"{cell.get('tokens', LONG_TOKENS):,}-delta streams, "
        f"C={cell.get('concurrency', VS_SDK_CONCURRENCY)}, independent server"
    )
    contenders = cell.get("contenders") or {}
    return {
        "target": f"events per client core >= {TARGET_VS_OPENAI:g}x the openai SDK's ({where})",
        "value": None
        if ratio is None
        else f"{ratio:.1f}x ({contenders['ours']['cpu_us_per_event']:.2f} vs "
        f"{contenders['openai']['cpu_us_per_event']:.2f} µs/event)",
        "status": _status(ratio, ratio is not None and ratio >= TARGET_VS_OPENAI),
    }


def judge_per_request(per_request: dict[str, Any]) -> list[dict[str, Any]]:
    sizes = per_request.get("sizes", {})
    short = sizes.get(str(TARGET_REQUEST_TOKENS), {})
    long = sizes.get(str(LONG_TOKENS), {})
    ratio = short.get("cpu_vs_floor")
    added = short.get("added_ttft_p50_ms")
    long_ratio = None
    if long.get("ours_cpu_us_per_event") and long.get("floor_cpu_us_per_event"):
        long_ratio = _median(
            [
                p["ours"]["cpu_us_per_event"] / p["floor"]["cpu_us_per_event"]
                for p in long["runs"]
                if "failed" not in p["ours"] and "failed" not in p["floor"]
            ]
        )
    where = f"{TARGET_REQUEST_TOKENS}-delta streams, C=1, independent server"
    return [
        {
            "target": f"client CPU/request <= {TARGET_REQUEST_CPU_VS_FLOOR:g}x the floor ({where})",
            "value": None
            if ratio is None
            else f"{ratio:.2f}x ({short['ours_cpu_ms_per_request']:.3f} vs "
            f"{short['floor_cpu_ms_per_request']:.3f} ms)",
            "status": _status(ratio, ratio is not None and ratio <= TARGET_REQUEST_CPU_VS_FLOOR),
        },
        {
            "target": f"TTFT p50 within {TARGET_ADDED_TTFT_MS:g} ms of the floor's ({where})",
            "value": None
            if added is None
            else f"+{added:.3f} ms ({short['ours_ttft_p50_ms']:.3f} vs "
            f"{short['floor_ttft_p50_ms']:.3f} ms)",
            "status": _status(added, added is not None and added <= TARGET_ADDED_TTFT_MS),
        },
        {
            "target": f"client CPU/event <= {TARGET_LONG_CPU_VS_FLOOR:g}x the floor "
            f"({LONG_TOKENS:,}-delta streams, C=1, independent server)",
            "value": None
            if long_ratio is None
            else f"{long_ratio:.2f}x ({long['ours_cpu_us_per_event']:.2f} vs "
            f"{long['floor_cpu_us_per_event']:.2f} µs)",
            "status": _status(
                long_ratio, long_ratio is not None and long_ratio <= TARGET_LONG_CPU_VS_FLOOR
            ),
        },
    ]


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    nofile = raise_nofile()
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for impl in impls:
        if impl not in IMPLS:
            raise SystemExit(f"unknown contender {impl!r}; choose from {', '.join(IMPLS)}")
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    # Each stream needs one fd in the client and one in the server (plus a few spare).
    limit_notes: dict[int, str] = {}
    for c in concurrency:
        if c + 256 > nofile[0]:
            limit_notes[c] = (
                f"RLIMIT_NOFILE hard limit {nofile[1]} < {c} streams + 256 spare: impossible "
                "on this machine (raise the hard limit, e.g. ulimit -Hn, as root)"
            )
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "config": {
            "tokens": args.tokens,
            "chunk_chars": args.chunk_chars,
            "sdk_max_concurrency": args.sdk_max_concurrency,
            "cancel_streams": args.cancel_streams,
            "memory": not args.no_memory,
            "slow_script": {"stall_s": SLOW_STALL_S, "tokens": SLOW_TOKENS},
            "min_streams_per_cell": MIN_STREAMS,
        },
        "impls": impls,
        "concurrency": concurrency,
        "throughput": {},
        "memory": {},
        "cancel": {},
    }
    server = Server(args.backlog, args.server_procs)
    results["server"] = {
        "origin": server.origin,
        "backlog": args.backlog,
        "processes": len(server.procs),
    }
    pids = ", ".join(map(str, server.pids))
    print(f"emulator (bench mode) at {server.origin}, pids {pids}", file=sys.stderr, flush=True)
    try:
        for c in concurrency:
            tp: dict[str, Any] = {}
            mem: dict[str, Any] = {}
            results["throughput"][str(c)] = tp
            results["memory"][str(c)] = mem
            for impl in impls:
                skip = limit_notes.get(c)
                sdk = impl in ("openai", "anthropic")
                if skip is None and sdk and c > args.sdk_max_concurrency:
                    skip = (
                        f"skipped: C > --sdk-max-concurrency {args.sdk_max_concurrency} "
                        "(run time: see docs)"
                    )
                if skip is not None:
                    tp[impl] = mem[impl] = {"skipped": skip}
                    print(f"C={c:>6} {impl:<9} {skip}", file=sys.stderr, flush=True)
                    continue
                spec = {
                    "cell": "throughput",
                    "impl": impl,
                    "concurrency": c,
                    "tokens": args.tokens,
                    "chunk_chars": args.chunk_chars,
                    "origin": server.origin,
                }
                server.settle()
                server_cpu0 = server.cpu_seconds()
                cell = run_cell(spec)
                cell["server_cpu_s"] = server.cpu_seconds() - server_cpu0
                tp[impl] = cell
                print(
                    f"C={c:>6} {impl:<9} "
                    + (
                        f"failed: {cell['failed']}"
                        if "failed" in cell
                        else f"{cell['events_per_s']:>11,.0f} ev/s  "
                        f"{cell['cpu_us_per_event']:6.1f} µs/ev  "
                        f"GC {cell['gc_s']:.2f} s ({cell['gc_full']} full)  "
                        f"errors {cell['errors']}  "
                        f"TTFT p50 {cell['ttft_p50_ms']:.1f} ms  wall {cell['wall_s']:.1f} s  "
                        f"server CPU {cell['server_cpu_s']:.1f} s"
                    ),
                    file=sys.stderr,
                    flush=True,
                )
                if not args.no_memory and c > 1:
                    server.settle()
                    m = run_cell({**spec, "cell": "memory"})
                    mem[impl] = m
                    print(
                        f"C={c:>6} {impl:<9} "
                        + (
                            f"memory failed: {m['failed']}"
                            if "failed" in m
                            else f"memory {m['bytes_per_stream'] / 1024:.1f} KiB/stream "
                            f"({m['started']}/{c} started in {m['open_s']:.1f} s)"
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
        if args.cancel_streams and "ours" in impls:
            results["cancel"] = run_cell(
                {
                    "cell": "cancel",
                    "impl": "ours",
                    "streams": args.cancel_streams,
                    "origin": server.origin,
                }
            )
        if args.cancel_streams and "ours" in impls:
            results["cancel_load"] = run_load_cell(args, server)
        if "ours" in impls:
            results["hedging"] = run_hedging_cell(args)
            results["keepalive_race"] = run_race_cell()
        if args.profile:
            run_cell(
                {
                    "cell": "throughput",
                    "impl": "ours",
                    "concurrency": args.profile,
                    "tokens": args.tokens,
                    "chunk_chars": args.chunk_chars,
                    "origin": server.origin,
                    "profile": str(Path(args.json).with_suffix(".prof")),
                }
            )
    finally:
        server.close()
    if not args.no_per_request:
        results["per_request"] = run_per_request(args)
    if "ours" in impls and "openai" in impls:
        results["vs_sdk"] = run_vs_sdk(args)
    return results


def run_load_cell(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    server.settle()
    cell = run_cell(
        {
            "cell": "cancel_load",
            "streams": args.cancel_streams,
            "cancels": args.load_cancels,
            "origin": server.origin,
        }
    )
    print("cancel under load: measured (in the report below)", file=sys.stderr, flush=True)
    return cell


def run_hedging_cell(args: argparse.Namespace) -> dict[str, Any]:
    requests = 1000 if args.quick else 5000
    cell = run_cell({"cell": "hedging", "requests": requests, "concurrency": 10, "seed": 7})
    print("hedging: measured (in the report below)", file=sys.stderr, flush=True)
    return cell


#: The per-request cells: text deltas per stream, and streams measured per cell (quick).
PER_REQUEST_SIZES = {1: (400, 60), 200: (300, 60), LONG_TOKENS: (40, 10)}
PER_REQUEST_WARMUP = 30
#: Streams per turn of a contender in the paired per-request cells.
PER_REQUEST_BLOCK = 10
PER_REQUEST_REPEATS = 5


class RawServer:
    """``benchmarks/sse_server.py`` in its own process: pre-rendered Chat Completions
    streams from a server that shares no code with the library."""

    def __init__(self) -> None:
        script = Path(__file__).with_name("sse_server.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"the SSE server did not start (first line {line!r})")
        self.origin = line.removeprefix("listening on ")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _median(values: Sequence[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    mid = len(present) // 2
    return present[mid] if len(present) % 2 else (present[mid - 1] + present[mid]) / 2


def run_per_request(args: argparse.Namespace) -> dict[str, Any]:
    """The per-request cells: per size, ``repeats`` fresh processes, each running ours and
    the floor in turns of :data:`PER_REQUEST_BLOCK` streams (``cell_per_request_paired``);
    the medians over the repeats of each value and of ours ÷ floor (CPU) and ours − floor
    (TTFT), each ratio taken within one repeat."""
    repeats = args.per_request_repeats
    server = RawServer()
    out: dict[str, Any] = {
        "server": "benchmarks/sse_server.py (asyncio, pre-rendered, chunked, keep-alive)",
        "method": "paired: ours and the floor in one process, in alternating blocks",
        # "direct": the client's direct path to its httpcore2 pools (the default);
        # "httpx2": ours over a transport of its own, through httpx2.AsyncClient.send.
        "ours_path": "httpx2" if args.per_request_through_httpx2 else "direct",
        "concurrency": 1,
        "warmup": PER_REQUEST_WARMUP,
        "block": PER_REQUEST_BLOCK,
        "repeats": repeats,
        "load_average_before": list(os.getloadavg()),
        "sizes": {},
    }
    try:
        for tokens, (full, quick) in PER_REQUEST_SIZES.items():
            requests = quick if args.quick else full
            runs: list[dict[str, Any]] = []
            for _ in range(repeats):
                spec = {
                    "cell": "per_request_paired",
                    "tokens": tokens,
                    "requests": requests,
                    "warmup": PER_REQUEST_WARMUP,
                    "block": PER_REQUEST_BLOCK,
                    "origin": server.origin,
                    "through_httpx2": args.per_request_through_httpx2,
                }
                cell = run_cell(spec)
                if "failed" in cell:
                    pair = {"ours": cell, "floor": cell}
                    print(f"per request, {tokens:>5} deltas: failed: {cell['failed']}",
                          file=sys.stderr, flush=True)  # fmt: skip
                else:
                    pair = {
                        "ours": cell["ours"],
                        "skeleton": cell["skeleton"],
                        "floor": cell["floor"],
                        "block_ratios": cell["block_ratios"],
                    }
                    for impl in ("ours", "skeleton", "floor"):
                        one = cell[impl]
                        print(
                            f"per request, {tokens:>5} deltas, {impl:<8} "
                            f"{one['cpu_ms_per_request']:.3f} ms CPU/request  "
                            f"{one['cpu_us_per_event']:.2f} µs/ev  "
                            f"TTFT p50 {one['ttft_p50_ms']:.3f} ms  "
                            f"headers p50 {_fmt(one['headers_p50_ms'], '.3f')} ms  "
                            f"gen0/req {one['gen0_per_request']:.2f}  errors {one['errors']}",
                            file=sys.stderr,
                            flush=True,
                        )
                    print(f"per request, {tokens:>5} deltas: ours / floor "
                          f"{cell['cpu_vs_floor']:.2f}, skeleton / floor "
                          f"{cell['skeleton_cpu_vs_floor']:.2f}",
                          file=sys.stderr, flush=True)  # fmt: skip
                runs.append(pair)
            out["sizes"][str(tokens)] = {"requests": requests, "runs": runs, **_summary(runs)}
    finally:
        server.close()
    out["load_average_after"] = list(os.getloadavg())
    return out


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats (cells that failed or had errors are left out)."""

    def good(cell: dict[str, Any]) -> bool:
        return "failed" not in cell and cell.get("errors") == 0

    pairs = [p for p in runs if good(p["ours"]) and good(p["floor"])]
    summary: dict[str, Any] = {"valid_repeats": len(pairs)}
    for key in (
        "cpu_ms_per_request",
        "cpu_us_per_event",
        "ttft_p50_ms",
        "headers_p50_ms",
        "gen0_per_request",
    ):
        for impl in ("ours", "floor"):
            summary[f"{impl}_{key}"] = _median([p[impl][key] for p in pairs])
    summary["cpu_vs_floor"] = _median(
        [p["ours"]["cpu_ms_per_request"] / p["floor"]["cpu_ms_per_request"] for p in pairs]
    )
    # The contract's shape alone (``Skeleton``; runs from before it have none).
    shaped = [p for p in pairs if "skeleton" in p and good(p["skeleton"])]
    if shaped:
        for key in ("cpu_ms_per_request", "ttft_p50_ms"):
            summary[f"skeleton_{key}"] = _median([p["skeleton"][key] for p in shaped])
        summary["skeleton_cpu_vs_floor"] = _median(
            [p["skeleton"]["cpu_ms_per_request"] / p["floor"]["cpu_ms_per_request"] for p in shaped]
        )
        summary["ours_over_skeleton_ms"] = _median(
            [p["ours"]["cpu_ms_per_request"] - p["skeleton"]["cpu_ms_per_request"] for p in shaped]
        )
    summary["added_ttft_p50_ms"] = _median(
        [p["ours"]["ttft_p50_ms"] - p["floor"]["ttft_p50_ms"] for p in pairs]
    )
    # A cross-check less sensitive to other processes: the least CPU each contender needed
    # in any repeat (contention only ever adds), and their ratio.
    if pairs:
        least = {
            impl: min(p[impl]["cpu_ms_per_request"] for p in pairs) for impl in ("ours", "floor")
        }
        summary["cpu_vs_floor_of_minima"] = least["ours"] / least["floor"]
    # The paired cells' block pairs, over every repeat: how far one turn strays.
    blocks = sorted(ratio for p in pairs for ratio in p.get("block_ratios", ()))
    if blocks:
        summary["block_ratio_quartiles"] = [
            blocks[int(q * (len(blocks) - 1))] for q in (0.25, 0.5, 0.75)
        ]
    return summary


def run_vs_sdk(args: argparse.Namespace) -> dict[str, Any]:
    """Ours, the floor and the openai SDK, each in a fresh process, ``C`` long streams at
    once against the independent server: events per client core, side by side."""
    concurrency = 50 if args.quick else VS_SDK_CONCURRENCY
    server = RawServer()
    headers = {"x-bench-events": str(LONG_TOKENS), "x-bench-chunk-chars": "4"}
    out: dict[str, Any] = {
        "server": "benchmarks/sse_server.py (asyncio, pre-rendered, chunked, keep-alive)",
        "concurrency": concurrency,
        "tokens": LONG_TOKENS,
        "load_average_before": list(os.getloadavg()),
        "contenders": {},
    }
    try:
        for impl in VS_SDK_IMPLS:
            spec = {
                "cell": "throughput",
                "impl": impl,
                "concurrency": concurrency,
                "tokens": LONG_TOKENS,
                "chunk_chars": 4,
                "origin": server.origin,
                "headers": headers,
            }
            out["contenders"][impl] = cell = run_cell(spec)
            print(
                f"vs SDK, C={concurrency}, {LONG_TOKENS:,} deltas, {impl:<6} "
                + (
                    f"failed: {cell['failed']}"
                    if "failed" in cell
                    else f"{cell['cpu_us_per_event']:.2f} µs/ev  "
                    f"{cell['events_per_s']:,.0f} ev/s  errors {cell['errors']}"
                ),
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.close()
    out["load_average_after"] = list(os.getloadavg())

    def per_event(impl: str) -> float | None:
        cell = out["contenders"].get(impl) or {}
        if "failed" in cell or cell.get("errors") != 0:
            return None
        value = cell.get("cpu_us_per_event")
        return float(value) if value else None

    ours, floor, sdk = per_event("ours"), per_event("floor"), per_event("openai")
    out["ours_vs_openai"] = sdk / ours if ours and sdk else None
    out["floor_vs_openai"] = sdk / floor if floor and sdk else None
    out["ours_cpu_vs_floor"] = ours / floor if ours and floor else None
    return out


def print_vs_sdk(cell: dict[str, Any]) -> None:
    if not cell:
        return
    load = cell.get("load_average_before") or [math.nan]
    print(
        f"\nvs the openai SDK (C={cell['concurrency']}, {cell['tokens']:,} deltas per stream, "
        f"{cell['server']}; load average {load[0]:.2f} before)"
    )
    print("| impl | streams | errors | CPU µs/ev | events/s | events per core × openai |")
    print("|---|---|---|---|---|---|")
    sdk = (cell["contenders"].get("openai") or {}).get("cpu_us_per_event")
    for impl, data in cell["contenders"].items():
        if "failed" in data:
            print(f"| {impl} | - | - | - | - | failed: {data['failed']} |")
            continue
        per_event = data.get("cpu_us_per_event")
        times = sdk / per_event if sdk and per_event else None
        print(
            f"| {impl} | {data['streams']:,} | {data['errors']} | {_fmt(per_event, '.2f')} "
            f"| {_fmt(data.get('events_per_s'))} | {_fmt(times, '.1f')} |"
        )


def run_race_cell() -> dict[str, Any]:
    cell = run_cell({"cell": "keepalive_race", "requests": RACE_REQUESTS})
    print("keep-alive race: measured (in the report below)", file=sys.stderr, flush=True)
    return cell


#: Cells ``--only`` can run by themselves (their results replace those in ``--json``).
ONLY_CELLS = ("cancel_load", "hedging", "per_request", "keepalive_race", "vs_sdk")


def run_only(args: argparse.Namespace) -> dict[str, Any]:
    """Run just the cells named by ``--only`` and merge them into the results file."""
    path = Path(args.json)
    results: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if "machine" not in results:
        raise SystemExit(f"--only updates an existing results file; {path} has no full run")
    raise_nofile()
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    for name in names:
        if name not in ONLY_CELLS:
            raise SystemExit(f"--only: unknown cell {name!r}; choose from {ONLY_CELLS}")
    if "cancel_load" in names:
        server = Server(args.backlog, args.server_procs)
        try:
            results["cancel_load"] = run_load_cell(args, server)
        finally:
            server.close()
    if "hedging" in names:
        results["hedging"] = run_hedging_cell(args)
    if "per_request" in names:
        results["per_request"] = run_per_request(args)
    if "keepalive_race" in names:
        results["keepalive_race"] = run_race_cell()
    if "vs_sdk" in names:
        results["vs_sdk"] = run_vs_sdk(args)
    results.setdefault("updated", []).append(
        {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cells": args.only,
        }
    )
    return results


def print_report(results: dict[str, Any]) -> None:
    rows = build_rows(results)
    results["rows"] = rows
    results["targets"] = judge(results, rows)
    machine = results["machine"]
    print()
    print(
        f"{results['command']}\n{machine['platform']}, {machine['cpu_count']} CPUs, Python "
        f"{machine['python']}, trio {machine['trio']}, httpx2 {machine['httpx2']}, openai "
        f"{machine['openai']}, anthropic {machine['anthropic']}; {results['config']['tokens']} "
        f"text deltas per stream"
    )
    print(render_table(rows))
    print_cancel(results.get("cancel") or {})
    print_cancel_load(results.get("cancel_load") or {})
    print_hedging(results.get("hedging") or {})
    print_per_request(results.get("per_request") or {})
    print_vs_sdk(results.get("vs_sdk") or {})
    print_race(results.get("keepalive_race") or {})
    print()
    for target in results["targets"]:
        print(f"{target['status']:<4}  {target['target']}: {target['value']}")


def print_cancel(cancel: dict[str, Any]) -> None:
    for mode in ("sequential", "burst"):
        data = cancel.get(mode)
        if data:
            print(
                f"cancel-to-terminal ({cancel['impl']}), {cancel['streams']:,} in flight, {mode}: "
                f"p50 {_fmt(data['p50_ms'], '.3f')} ms, p99 {_fmt(data['p99_ms'], '.3f')} ms, "
                f"max {_fmt(data['max_ms'], '.3f')} ms ({data['measured']} measured, "
                f"{data['not_cancelled_terminal']} without a Cancelled terminal; "
                f"{data['cpu_us_per_cancel']:.0f} µs CPU per cancel)"
            )


def print_hedging(cell: dict[str, Any]) -> None:
    if not cell:
        return
    if "failed" in cell:
        print(f"hedging: failed: {cell['failed']}")
        return
    print(
        f"hedging: time to first token {cell['fast_ms']:g} ms, or {cell['slow_ms']:g} ms for "
        f"{cell['slow_share']:.0%} of attempts; {cell['concurrency']} at once"
    )
    for name, run in cell["runs"].items():
        print(
            f"  {name:<24} p50 {_fmt(run['ttft_p50_ms'], ',.0f')} ms, p90 "
            f"{_fmt(run['ttft_p90_ms'], ',.0f')} ms, p95 {_fmt(run['ttft_p95_ms'], ',.0f')} ms, "
            f"p99 {_fmt(run['ttft_p99_ms'], ',.0f')} ms, max {_fmt(run['ttft_max_ms'], ',.0f')} "
            f"ms, {run['over_1s']} over 1 s; {run['attempts_per_request']:.2f} attempts per "
            f"request, {run['errors']} errors of {run['requests']:,}"
        )


def print_per_request(per_request: dict[str, Any]) -> None:
    if not per_request:
        return
    load = per_request.get("load_average_before") or [math.nan]
    method = per_request.get("method", "each contender in its own process")
    if per_request.get("ours_path") == "httpx2":
        method += "; ours through httpx2.AsyncClient.send"
    print(
        f"\nper request (C=1, {per_request['server']}; {method}; medians of "
        f"{per_request['repeats']} repeats; load average {load[0]:.2f} before)"
    )
    print(
        "| deltas | ours CPU ms/req | floor CPU ms/req | CPU × floor | ours µs/ev | floor µs/ev "
        "| ours TTFT p50 ms | floor TTFT p50 ms | added TTFT ms | ours headers ms "
        "| floor headers ms | ours gen0/req | floor gen0/req | CPU × floor (minima) |"
    )
    print("|" + "---|" * 14)
    for tokens, size in per_request["sizes"].items():
        print(
            f"| {int(tokens):>6,} | {_fmt(size['ours_cpu_ms_per_request'], '.3f'):>15} "
            f"| {_fmt(size['floor_cpu_ms_per_request'], '.3f'):>16} "
            f"| {_fmt(size['cpu_vs_floor'], '.2f'):>11} "
            f"| {_fmt(size['ours_cpu_us_per_event'], '.2f'):>10} "
            f"| {_fmt(size['floor_cpu_us_per_event'], '.2f'):>11} "
            f"| {_fmt(size['ours_ttft_p50_ms'], '.3f'):>16} "
            f"| {_fmt(size['floor_ttft_p50_ms'], '.3f'):>17} "
            f"| {_fmt(size['added_ttft_p50_ms'], '+.3f'):>13} "
            f"| {_fmt(size['ours_headers_p50_ms'], '.3f'):>15} "
            f"| {_fmt(size['floor_headers_p50_ms'], '.3f'):>16} "
            f"| {_fmt(size['ours_gen0_per_request'], '.2f'):>13} "
            f"| {_fmt(size['floor_gen0_per_request'], '.2f'):>14} "
            f"| {_fmt(size.get('cpu_vs_floor_of_minima'), '.2f'):>20} |"
        )
    if any("skeleton_cpu_vs_floor" in size for size in per_request["sizes"].values()):
        print(
            "\nthe contract's shape alone (the skeleton: a task, a channel, ChannelToken "
            "batches, a terminal, over the direct path), against ours and the floor:"
        )
        print(
            "| deltas | floor CPU ms/req | skeleton CPU ms/req | skeleton × floor "
            "| ours CPU ms/req | ours × floor | ours − skeleton ms |"
        )
        print("|" + "---|" * 7)
        for tokens, size in per_request["sizes"].items():
            if "skeleton_cpu_vs_floor" not in size:
                continue
            print(
                f"| {int(tokens):>6,} | {_fmt(size['floor_cpu_ms_per_request'], '.3f'):>16} "
                f"| {_fmt(size['skeleton_cpu_ms_per_request'], '.3f'):>19} "
                f"| {_fmt(size['skeleton_cpu_vs_floor'], '.2f'):>16} "
                f"| {_fmt(size['ours_cpu_ms_per_request'], '.3f'):>15} "
                f"| {_fmt(size['cpu_vs_floor'], '.2f'):>12} "
                f"| {_fmt(size['ours_over_skeleton_ms'], '+.3f'):>18} |"
            )
    for tokens, size in per_request["sizes"].items():
        quartiles = size.get("block_ratio_quartiles")
        if quartiles:
            print(
                f"{int(tokens):,} deltas: ours ÷ floor per block pair, quartiles "
                + " / ".join(f"{q:.2f}" for q in quartiles)
            )


def print_cancel_load(cell: dict[str, Any]) -> None:
    if not cell:
        return
    if "failed" in cell:
        print(f"cancel under load: failed: {cell['failed']}")
        return
    print(
        f"cancel under load (ours): {cell['streams']:,} streams streaming at full speed, "
        f"{cell['cancels']} cancels ({cell['errors']} errors"
        + (f": {'; '.join(cell['error_samples'])}" if cell["errors"] else "")
        + ")"
    )
    for name, label in (
        ("terminal", "cancel() -> terminal recorded"),
        ("terminal_cpu", "  the same, in CPU time"),
        ("consumer", "cancel() -> consumer holds Cancelled"),
        ("round", "scheduling round"),
    ):
        data = cell.get(name)
        if data is None:  # results written before this measure existed
            continue
        steps = data.get("mean_steps")
        with_gc = data.get("with_gc")
        print(
            f"  {label:<38} p50 {_fmt(data['p50_ms'], '.3f')} ms, p99 "
            f"{_fmt(data['p99_ms'], '.3f')} ms, max {_fmt(data['max_ms'], '.3f')} ms "
            f"({data['count']:,} samples"
            + ("" if steps is None else f", {steps:.0f} task steps per round on average")
            + ("" if with_gc is None else f", {with_gc} with a GC run inside")
            + ")"
        )


def print_race(cell: dict[str, Any]) -> None:
    if not cell:
        return
    if "failed_samples" not in cell:
        print(f"keep-alive race: failed: {cell.get('failed')}")
        return
    print(
        f"keep-alive race (ours): visible retries {cell['visible_retries']} out of "
        f"{cell['requests']} (the server closes each connection "
        f"{cell['close_after_s'] * 1000:g} ms after its response, requests 0 to "
        f"{cell['spacing_max_s'] * 1000:g} ms apart; {cell['races']} requests met the race, "
        f"{cell['failed']} failed, {cell['connections']} connections, {cell['wall_s']:.1f} s)"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Concurrent streams through the actor vs a raw floor and the official SDKs."
    )
    parser.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated concurrency levels (default 1,100,500,2000,10000; quick 1,50,200)",
    )
    parser.add_argument("--tokens", type=int, default=None, help="text deltas per stream (200)")
    parser.add_argument("--chunk-chars", type=int, default=4, help="characters per text delta")
    parser.add_argument(
        "--impls", default=",".join(IMPLS), help=f"contenders to run ({','.join(IMPLS)})"
    )
    parser.add_argument(
        "--sdk-max-concurrency",
        type=int,
        default=None,
        help="cap C for the openai/anthropic SDKs (default 2000; quick 200)",
    )
    parser.add_argument(
        "--cancel-streams", type=int, default=None, help="streams in flight for the cancel test"
    )
    parser.add_argument(
        "--load-cancels",
        type=int,
        default=LOAD_CANCELS,
        help=f"cancels measured in the cancel-under-load cell ({LOAD_CANCELS})",
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"run only these cells ({','.join(ONLY_CELLS)}) and merge them into --json",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory cells")
    parser.add_argument("--no-per-request", action="store_true", help="skip the per-request cells")
    parser.add_argument(
        "--per-request-repeats",
        type=int,
        default=None,
        help=f"alternating repeats of the per-request cells ({PER_REQUEST_REPEATS}; quick 1)",
    )
    parser.add_argument(
        "--per-request-through-httpx2",
        action="store_true",
        help="run ours in the per-request cells over a transport of its own (through "
        "httpx2.AsyncClient.send, not the client's direct path): an A/B of that path",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="C",
        help="also profile ours (cProfile) at this C; stats go to stderr and JSON_PATH.prof",
    )
    parser.add_argument("--backlog", type=int, default=4096, help="server listen backlog")
    parser.add_argument("--quick", action="store_true", help="small sizes (for the CLI)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    parser.add_argument("--no-json", action="store_true", help="print the tables only")
    parser.add_argument(
        "--server-procs",
        type=int,
        default=DEFAULT_SERVER_PROCS,
        help=f"emulator processes sharing the port (default: one per core, {DEFAULT_SERVER_PROCS})",
    )
    parser.add_argument("--_serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    if args.concurrency is None:
        args.concurrency = ",".join(map(str, QUICK_CONCURRENCY if quick else DEFAULT_CONCURRENCY))
    if args.tokens is None:
        args.tokens = 50 if quick else 200
    if args.sdk_max_concurrency is None:
        args.sdk_max_concurrency = 200 if quick else 2000
    if args.cancel_streams is None:
        args.cancel_streams = 200 if quick else 1000
    if args.per_request_repeats is None:
        args.per_request_repeats = 1 if quick else PER_REQUEST_REPEATS
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._serve:
        serve_main(args.backlog, args._port)
        return 0
    if args._worker is not None:
        worker_main(json.loads(args._worker))
        return 0
    results = run_only(args) if args.only else orchestrate(args)
    print_report(results)
    if not args.no_json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    missed = [t for t in results["targets"] if t["status"] == "FAIL"]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
