"""Client CPU per token when every token arrives in its own read: ours on each transport
against the raw Trio socket floor and the httpx2 floor, the collector's time apart.

The server is paced and independent (standard-library ``asyncio`` in a process of its
own, sharing no code with the library): each ``POST`` gets a chunked Chat Completions
stream whose events go out one per write, ``--interval-ms`` apart per stream (a role
chunk, ``--tokens`` one-word text deltas, the finish chunk and ``[DONE]``), as a model
server sends them. Each contender runs in a fresh process of its own: ``C`` streams at
once in a closed loop (a stream's end starts the next), and over a window after a
warm-up the process's CPU time (user + system), the time in the garbage collector
(``gc.callbacks``, start to stop) and the text deltas received are read; the table gives
CPU and collector microseconds per token, each contender's CPU over the raw and the
``httpx2`` floors' (``× raw``, ``× httpx2``) and the SDK's CPU over the contender's
(``SDK ÷``: how many times less the contender spends than the ``openai`` loop). Contenders:

=================  ====================================================================
``raw``            a ``trio.SocketStream`` per stream (kept alive): the request in one
                   write, ``receive_some``, split on blank lines, ``orjson`` per event
                   (the chunked framing is skipped, not checked: the floor of floors)
``httpx2``         ``httpx2.AsyncClient.stream``, ``aiter_raw``, the same split and
                   ``orjson``
``direct``         ``open_sampler`` on the default transport (httpcore2's pools)
``httpx``          ``open_sampler`` with ``http_transport="httpx"``
``httptools``      ``open_sampler`` with ``http_transport="httptools"`` (llhttp)
``loadtest``       the load generator's sampler (``trio_sampler.loadtest``): the default
                   transport with ``receive_timestamps`` on (reads timed by the kernel's
                   stamps), no doom-loop detector, its consumer's per-token work (each
                   token's arrival and gap kept), and the collector as in a stage
``openai``         the official ``openai`` SDK: ``AsyncOpenAI.chat.completions.create(
                   stream=True)`` in ``C`` asyncio tasks, its own ``httpx2`` pool sized
                   for ``C``, no retries (what an application on the SDK pays)
=================  ====================================================================

    python benchmarks/bench_per_token.py [--cells 100:20:100,1000:200:25] [--tokens 100]
        [--warmup 3] [--window 10] [--impls raw,httpx2,direct,httpx,httptools,loadtest,openai]
        [--stagger] [--json benchmarks/results/bench_per_token.json]

Streams started together stay in step (every stream of a cell is paced alike), so in a
closed loop they end and start again all at once, a thousand requests' objects freed and
made within a few hundred milliseconds: the collector's passes come in those waves and
none between them. So a window covers whole stream lifetimes: past ``--window`` seconds
it runs on until the tokens it counted are a multiple of ``C`` streams' tokens (at most
one lifetime more; its length is in the JSON), and holds as many waves as lifetimes
wherever it starts (a fixed 10 s held two waves but 1.8 lifetimes' tokens at C = 1,000,
and read the collector about 14 % high). ``--stagger`` starts each stream after a
random share of one stream's length instead (the warm-up counts from the last start),
so requests end and start spread over the window, as they do against a real server.

The machine's load average is recorded beside every cell: on a shared machine the CPU a
process is charged for moves with its neighbours (caches, frequency), so compare
contenders of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script: the checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IMPLS = ("raw", "httpx2", "direct", "httpx", "httptools", "loadtest", "openai")
#: ``open_sampler``'s contenders, by the ``http_transport`` they run on.
OURS = {"direct": "direct", "httpx": "httpx", "httptools": "httptools", "loadtest": "direct"}
_HEAD_END = b"\r\n\r\n"


# -- the paced server (standard library only) ----------------------------------------


def _frame(choices: list[object]) -> bytes:
    payload = {
        "id": "chatcmpl-paced",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "paced",
        "choices": choices,
    }
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _delta(content: str) -> bytes:
    return _frame([{"index": 0, "delta": {"content": content}, "finish_reason": None}])


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_ROLE = _frame([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
_END = (
    _frame([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    + b"e\r\ndata: [DONE]\n\n\r\n"
    + b"0\r\n\r\n"
)
_WORDS = [_delta(word) for word in ("The ", "weather ", "is ", "mild ", "today, ")]


class _PacedConnection(asyncio.Protocol):
    """Answers each request with a stream paced one event per write."""

    def __init__(self, tokens: int, interval: float) -> None:
        self.tokens = tokens
        self.interval = interval
        self.buffer = b""
        self.streaming = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        """Start answering the next request read whole, if not streaming."""
        if self.streaming or self.transport is None:
            return
        end = self.buffer.find(_HEAD_END)
        if end < 0:
            return
        length = 0
        for line in self.buffer[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        self.streaming = True
        self.transport.write(_HEAD + _ROLE)
        asyncio.get_running_loop().call_later(self.interval, self._send, 0)

    def _send(self, sent: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if sent == self.tokens:
            transport.write(_END)
            self.streaming = False
            self._next()
            return
        transport.write(_WORDS[sent % len(_WORDS)])
        asyncio.get_running_loop().call_later(self.interval, self._send, sent + 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def serve_main(port_file: str, tokens: int, interval: float) -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _PacedConnection(tokens, interval), "127.0.0.1", 0, backlog=4096
        )
        port = server.sockets[0].getsockname()[1]
        Path(port_file).write_text(str(port))  # noqa: ASYNC240 (once, at start)
        await asyncio.Event().wait()

    asyncio.run(serve())


# -- the contenders (each in a process of its own) --------------------------------------


class Counter:
    """Text deltas received, and the collector's time (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.gc_s = 0.0
        self.collections = 0
        #: Collections of each generation (0, 1, 2).
        self.by_generation = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._started
            self.collections += 1
            self.by_generation[info["generation"]] += 1


def _parse(pending: bytes, data: bytes, counter: Counter) -> bytes:
    """The floors' SSE handling: split on blank lines, ``orjson`` per event; what is left
    of the last event."""
    import orjson

    frames = (pending + data).split(b"\n\n")
    for frame in frames[:-1]:
        at = frame.find(b"data: ")
        if at < 0 or frame.endswith(b"[DONE]"):
            continue
        choices = orjson.loads(frame[at + 6 :])["choices"]
        if choices and choices[0]["delta"].get("content"):
            counter.tokens += 1
    return frames[-1]


_BODY = b'{"model":"paced","messages":[{"role":"user","content":"hi"}],"stream":true}'


async def _raw_loop(port: int, counter: Counter) -> None:
    import trio

    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
    )
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    while True:
        await stream.send_all(request)
        pending = b""
        while not pending.endswith(b"0\r\n\r\n"):
            data = await stream.receive_some(65536)
            if not data:
                raise RuntimeError("the server closed the connection")
            pending = _parse(pending, data, counter)


async def _httpx2_loop(client: Any, port: int, counter: Counter) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"content-type": "application/json"}
    while True:
        async with client.stream("POST", url, content=_BODY, headers=headers) as response:
            pending = b""
            async for data in response.aiter_raw():
                pending = _parse(pending, data, counter)


async def _ours_loop(sampler: Any, counter: Counter) -> None:
    from trio_sampler.types import ChannelToken, Completed, ConversationRequest, User

    request = ConversationRequest(items=[User("hi")])
    while True:
        async for event in await sampler.submit(request):
            kind = type(event)
            if kind is ChannelToken:
                counter.tokens += 1
            elif kind is not Completed and getattr(event, "error", None) is not None:
                raise RuntimeError(f"a stream failed: {event}")


async def _loadtest_loop(sampler: Any, counter: Counter) -> None:
    """The load generator's consumer (``trio_sampler.loadtest._runner``), per token: the
    bytes' arrival, the gap since the last, kept."""
    from array import array

    import trio

    from trio_sampler.types import ChannelToken, Completed, ConversationRequest, User

    request = ConversationRequest(items=[User("hi")])
    while True:
        stream = await sampler.submit(request)
        gaps = array("q")
        first: float | None = None
        last = 0.0
        async with stream:
            async for event in stream:
                if type(event) is ChannelToken:
                    at = stream.received_at
                    if at is None:
                        at = trio.current_time()
                    if first is None:
                        first = at
                    else:
                        gaps.append(round((at - last) * 1e6))
                    last = at
                    counter.tokens += 1
        if not isinstance(stream.terminal, Completed):
            raise RuntimeError(f"a stream failed: {stream.terminal}")


def _ours_config(impl: str, port: int) -> Any:
    from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
    from trio_sampler.types import ApiBackend

    return SamplerConfig(
        base_url=f"http://127.0.0.1:{port}/v1",
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="paced",
        api_key="bench-key",
        timeouts=Timeouts(connect=60.0, response_headers=120.0),
        retry=RetryPolicy(max_retries=0),
        http_transport=OURS[impl],
        receive_timestamps=impl == "loadtest",
    )


class Window:
    """What a contender spent over the measured window: CPU, tokens and the collector's
    time, from its start (after the warm-up) to :meth:`close`."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.started = time.monotonic()
        self.cpu = time.process_time()
        self.tokens = counter.tokens
        self.gc_s = counter.gc_s
        self.collections = counter.collections
        self.generations = list(counter.by_generation)

    def counted(self) -> int:
        return self.counter.tokens - self.tokens

    def whole_lifetimes(self, per_lifetime: int) -> int:
        """The tokens after which the window covers whole stream lifetimes: the multiple
        of ``per_lifetime`` (``C`` streams' tokens each) at or above those counted so far
        (those counted, when ``per_lifetime`` is 0: no rounding)."""
        counted = self.counted()
        if per_lifetime <= 0:
            return counted
        return max(1, -(-counted // per_lifetime)) * per_lifetime

    def close(self) -> dict[str, Any]:
        counter = self.counter
        window = time.monotonic() - self.started
        cpu = time.process_time() - self.cpu
        tokens = self.counted()
        return {
            "window_s": window,
            "tokens": tokens,
            "tokens_per_s": tokens / window,
            "cpu_share": cpu / window,
            "cpu_us_per_token": cpu / tokens * 1e6 if tokens else None,
            "gc_us_per_token": (counter.gc_s - self.gc_s) / tokens * 1e6 if tokens else None,
            "gc_collections": counter.collections - self.collections,
            "gc_collections_by_generation": [
                n - before
                for n, before in zip(counter.by_generation, self.generations, strict=True)
            ],
            "total_tokens": counter.tokens,
        }


class Schedule(NamedTuple):
    """When a contender's process measures: ``C`` streams, their starts spread over
    ``stagger`` seconds, a warm-up, then a window of ``window`` seconds at least, run on
    to a multiple of ``lifetime`` tokens (``C`` streams' tokens; 0: as given)."""

    concurrency: int
    warmup: float
    window: float
    stagger: float
    lifetime: int


#: How often a window past its length looks whether it covers whole lifetimes yet: the
#: counter is polled (an event set by the loops would put a test in every token's path).
_ROUNDING_POLL_S = 0.01

#: One stream's loop of a contender: a request after another, counting its tokens.
StreamLoop = Callable[[], Awaitable[None]]

#: ``trio.sleep`` or ``asyncio.sleep``: the schedule below runs under either loop.
Sleep = Callable[[float], Awaitable[object]]


async def _started_late(start: StreamLoop, stagger: float, sleep: Sleep) -> None:
    """One stream's loop, after a random share of ``stagger`` seconds."""
    await sleep(random.random() * stagger)
    await start()


async def _spent(counter: Counter, schedule: Schedule, sleep: Sleep) -> dict[str, Any]:
    """What the streams (started) spend over the schedule's window, after its starts
    and warm-up, the window run on to whole lifetimes."""
    await sleep(schedule.stagger + schedule.warmup)
    spent = Window(counter)
    await sleep(schedule.window)
    target = spent.whole_lifetimes(schedule.lifetime)
    while spent.counted() < target:  # the loops' counter, polled (see above)
        await sleep(_ROUNDING_POLL_S)
    return spent.close()


async def _openai_measure(port: int, schedule: Schedule) -> dict[str, Any]:
    """The ``openai`` contender, under asyncio (the SDK's own loop)."""
    import httpx2
    import openai

    concurrency = schedule.concurrency
    counter = Counter()
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=concurrency)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="bench-key",
        max_retries=0,
        timeout=120.0,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    )

    async def loop() -> None:
        messages: Any = [{"role": "user", "content": "hi"}]
        while True:
            stream = await client.chat.completions.create(
                model="paced", messages=messages, stream=True
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    counter.tokens += 1

    tasks = [
        asyncio.create_task(_started_late(loop, schedule.stagger, asyncio.sleep))
        for _ in range(concurrency)
    ]
    try:
        return await _spent(counter, schedule, asyncio.sleep)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


async def _measure(impl: str, port: int, schedule: Schedule) -> dict[str, Any]:
    import trio

    counter = Counter()
    result: dict[str, Any] = {}

    async def loops(start: StreamLoop) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(schedule.concurrency):
                nursery.start_soon(_started_late, start, schedule.stagger, trio.sleep)
            result.update(await _spent(counter, schedule, trio.sleep))
            nursery.cancel_scope.cancel()

    await run_streams(impl, port, schedule.concurrency, counter, loops)
    return result


async def run_streams(
    impl: str,
    port: int,
    concurrency: int,
    counter: Counter,
    streams: Callable[[StreamLoop], Awaitable[None]],
) -> None:
    """``streams(start)``, ``start`` being one stream's loop of ``impl`` (any contender
    but ``openai``, which runs under asyncio) counting into ``counter``, with the client
    or sampler it needs open around it (pooled for ``concurrency`` streams)."""
    if impl == "raw":
        await streams(lambda: _raw_loop(port, counter))
    elif impl == "httpx2":
        import httpx2

        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=concurrency)
        async with httpx2.AsyncClient(limits=limits, timeout=120.0) as client:
            await streams(lambda: _httpx2_loop(client, port, counter))
    elif impl == "loadtest":
        from trio_sampler.actor import open_sampler
        from trio_sampler.doom_loop import DoomLoopPolicy
        from trio_sampler.loadtest._runner import _no_full_collections

        no_doom = DoomLoopPolicy(enabled=False)
        async with open_sampler(_ours_config(impl, port), doom_loop=no_doom) as sampler:
            with _no_full_collections():  # as the load generator runs a stage
                await streams(lambda: _loadtest_loop(sampler, counter))
    else:
        from trio_sampler.actor import open_sampler

        async with open_sampler(_ours_config(impl, port)) as sampler:
            await streams(lambda: _ours_loop(sampler, counter))


def client_main(impl: str, port: int, schedule: Schedule) -> None:
    import trio

    from benchmarks.common import raise_nofile

    raise_nofile()
    if impl == "openai":
        result = asyncio.run(_openai_measure(port, schedule))
    else:
        result = trio.run(_measure, impl, port, schedule)
    print(json.dumps(result))


# -- the driver ----------------------------------------------------------------------------


def _start_server(
    tokens: int, interval: float, folder: Path
) -> tuple[subprocess.Popen[bytes], int]:
    port_file = folder / "port"
    port_file.unlink(missing_ok=True)
    script = str(Path(__file__).resolve())
    command = [sys.executable, script, "--serve", str(port_file), str(tokens), str(interval)]
    server = subprocess.Popen(command)
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return server, int(port_file.read_text())
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("the paced server did not start")


def run_cell(
    impl: str, concurrency: int, interval_ms: float, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """One contender at one load, against a fresh paced server."""
    server, port = _start_server(args.tokens, interval_ms / 1000.0, folder)
    try:
        script = str(Path(__file__).resolve())
        command = [
            sys.executable,
            script,
            "--client",
            impl,
            str(port),
            str(concurrency),
            str(args.warmup),
            str(args.window),
            str(args.tokens * interval_ms / 1000.0 if args.stagger else 0.0),
            str(concurrency * args.tokens),  # the window ends on whole lifetimes
        ]
        load_before = os.getloadavg()[0]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            return {"error": done.stderr[-1500:]}
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["load_1min"] = [load_before, os.getloadavg()[0]]
        offered = concurrency * 1000.0 / interval_ms
        result["offered_tokens_per_s"] = offered
        return result
    finally:
        server.kill()
        server.wait()


def count_instructions(
    impl: str, concurrency: int, interval_ms: float, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """User-space instructions per token under ``valgrind --tool=callgrind``: two runs of
    ``impl`` (windows ``W`` and ``3 W``), the difference of their totals over the
    difference of their tokens (start-up, imports and warm-up cancel out). The load must
    be light enough for the slowed client to keep up (one token per read still)."""
    from benchmarks.instructions_per_request import read_total

    server, port = _start_server(args.tokens, interval_ms / 1000.0, folder)
    try:
        script = str(Path(__file__).resolve())
        runs = []
        for window in (args.window, 3 * args.window):
            out = folder / f"callgrind.{impl}.{window}"
            command = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                script,
                "--client",
                impl,
                str(port),
                str(concurrency),
                str(args.warmup),
                str(window),
                "0",  # the counts are of one token's work: no stagger
                "0",  # and the windows as given (their difference is what counts)
            ]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=1800, check=False, env=env
            )
            if done.returncode != 0:
                return {"error": done.stderr[-1500:]}
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append((read_total(out.read_text()), result["total_tokens"], result))
    finally:
        server.kill()
        server.wait()
    (short, short_tokens, first), (long, long_tokens, last) = runs
    return {
        "instructions_per_token": (long - short) / (long_tokens - short_tokens),
        "tokens": [short_tokens, long_tokens],
        # A full collection walks the whole heap (tens of millions of instructions): one
        # in one window and not the other moves the difference by far more than a
        # change to the read path, so each window's collections are kept beside it.
        "gc_collections_by_generation": [
            first["gc_collections_by_generation"],
            last["gc_collections_by_generation"],
        ],
        "tokens_per_s_offered": concurrency * 1000.0 / interval_ms,
        "tokens_per_s_received": last["tokens_per_s"],
    }


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render(cells: dict[str, dict[str, Any]]) -> str:
    width = max([22, *(len(key) + 1 for key in cells)])
    lines = [
        f"{'cell':<{width}}{'tokens/s':>10}{'CPU share':>10}{'CPU µs/tok':>11}{'GC µs/tok':>10}"
        f"{'× raw':>7}{'× httpx2':>9}{'SDK ÷':>7}  load"
    ]
    for key, row in cells.items():
        load_key = key.split(" ", 1)[1]
        raw = cells.get(f"raw {load_key}", {}).get("cpu_us_per_token")
        floor = cells.get(f"httpx2 {load_key}", {}).get("cpu_us_per_token")
        sdk = cells.get(f"openai {load_key}", {}).get("cpu_us_per_token")
        cpu = row.get("cpu_us_per_token")
        if "error" in row:
            lines.append(f"{key:<{width}}  failed: {row['error'][-200:]!r}")
            continue
        lines.append(
            f"{key:<{width}}{_fmt(row['tokens_per_s'], ',.0f'):>10}"
            f"{_fmt(row['cpu_share'], '.2f'):>10}"
            f"{_fmt(cpu):>11}{_fmt(row['gc_us_per_token']):>10}"
            f"{_fmt(cpu / raw if cpu and raw else None, '.2f'):>7}"
            f"{_fmt(cpu / floor if cpu and floor else None, '.2f'):>9}"
            f"{_fmt(sdk / cpu if cpu and sdk else None, '.2f'):>7}"
            f"  {row['load_1min'][0]:.1f}→{row['load_1min'][1]:.1f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cells",
        default="100:20:100,1000:200:25",
        help="C:interval_ms[:tokens per stream], comma-separated",
    )
    parser.add_argument("--tokens", type=int, default=100, help="text deltas per stream")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="seconds measured at least (then on to whole stream lifetimes)",
    )
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", default="benchmarks/results/bench_per_token.json")
    parser.add_argument(
        "--stagger",
        action="store_true",
        help="start each stream after a random share of one stream's length (the warm-up "
        "counts from the last start), so that streams do not end and start all at once",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per token under callgrind instead (light cells: 2:50)",
    )
    args = parser.parse_args(argv)
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_per_token.{os.getpid()}"
    folder.mkdir(exist_ok=True)
    cells: dict[str, dict[str, Any]] = {}
    default_tokens = args.tokens
    specs = [cell.split(":") for cell in args.cells.split(",")]
    # Two cells at one load that differ only in their streams' length are told apart
    # by it (else the second's rows would replace the first's).
    loads = [tuple(spec[:2]) for spec in specs]
    for concurrency, interval, *tokens in specs:
        args.tokens = int(tokens[0]) if tokens else default_tokens
        load = f"C={concurrency},{interval}ms"
        if loads.count((concurrency, interval)) > 1:
            load += f",{args.tokens}tok"
        for impl in args.impls.split(","):
            key = f"{impl} {load}"
            if args.instructions:
                cells[key] = count_instructions(
                    impl, int(concurrency), float(interval), args, folder
                )
                print(key, json.dumps(cells[key]), flush=True)
                continue
            cells[key] = run_cell(impl, int(concurrency), float(interval), args, folder)
            cells[key]["tokens_per_stream"] = args.tokens
            print(render({key: cells[key]}).splitlines()[-1], flush=True)
    if not args.instructions:
        print()
        print(render(cells))
    out = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "default_tokens_per_stream": default_tokens,
        "warmup_s": args.warmup,
        "window_s": args.window,
        "stagger": args.stagger,
        "cells": cells,
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--client":
        impl, port, concurrency, warmup, window, stagger, lifetime = sys.argv[2:9]
        schedule = Schedule(
            int(concurrency), float(warmup), float(window), float(stagger), int(lifetime)
        )
        client_main(impl, int(port), schedule)
    else:
        sys.exit(main())
