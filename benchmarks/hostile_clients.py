"""``trio-sampler serve`` against hostile clients, over loopback: does it stay up, and what
does it cost?

Four phases against one ``serve`` process, each followed by a normal request that must be
answered (and the process must still be running):

1. HTTP/2 rapid reset: ``--rapid`` connections, each opening ``--streams`` streams and
   resetting each at once (HEADERS + DATA + RST_STREAM), ``--concurrency`` at a time;
2. slow HTTP/2 bodies: ``--slow`` requests that send half a body, get their 408 at the
   ``--body-timeout``, and go on sending on the answered stream;
3. clients that never read: ``--idle`` HTTP/1.1 connections each asking for a long
   streamed reply and never reading it; the server's RSS is measured before and while
   they hang;
4. the same over HTTP/2 (one stream per connection).

Bounded in count and time; loopback only. Prints a table and writes
``benchmarks/results/hostile_clients.json``.

    python benchmarks/hostile_clients.py [--rapid 1000] [--slow 100] [--idle 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import httpx2
import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results

CHAT: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
#: A long streamed reply (about 18 MB, the most one request may ask for): far more than
#: the socket buffers hold.
LONG = {**CHAT, "stream": True, "max_tokens": 128_000}
FILL = '{"ignore_eos": true}'


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def h2_headers(*extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":scheme", "http"),
        (":authority", "localhost"),
        ("content-type", "application/json"),
        *extra,
    ]


async def h2_open(port: int) -> tuple[trio.SocketStream, h2.connection.H2Connection]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    await stream.send_all(conn.data_to_send())
    return stream, conn


async def rapid_reset(port: int, streams: int) -> None:
    try:
        stream, conn = await h2_open(port)
        async with stream:
            for _ in range(streams):
                stream_id = conn.get_next_available_stream_id()
                conn.send_headers(stream_id, h2_headers())
                conn.send_data(stream_id, orjson.dumps(CHAT), end_stream=True)
                conn.reset_stream(stream_id)
            await stream.send_all(conn.data_to_send())
            with trio.move_on_after(1):
                while await stream.receive_some(65536):
                    pass
    except (OSError, trio.BrokenResourceError):
        pass  # the server may close a connection that abuses it


async def slow_body(port: int, hold: float) -> None:
    try:
        stream, conn = await h2_open(port)
        async with stream:
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, h2_headers())
            conn.send_data(stream_id, b'{"model": ')
            await stream.send_all(conn.data_to_send())
            deadline = trio.current_time() + hold
            while trio.current_time() < deadline:
                await trio.sleep(0.25)
                conn.send_data(stream_id, b" ")
                await stream.send_all(conn.data_to_send())
    except (OSError, trio.BrokenResourceError):
        pass  # answered (408) and closed, as it should be


async def idle_http1(port: int, hold: trio.Event) -> None:
    body = orjson.dumps(LONG)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
        b"x-emulator-script: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (FILL.encode(), len(body))
    )
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + body)
        await hold.wait()  # never reads


async def idle_http2(port: int, hold: trio.Event) -> None:
    stream, conn = await h2_open(port)
    async with stream:
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, h2_headers(("x-emulator-script", FILL)))
        conn.send_data(stream_id, orjson.dumps(LONG), end_stream=True)
        await stream.send_all(conn.data_to_send())
        await hold.wait()  # never reads


async def served(port: int) -> float | None:
    """Seconds until a normal request is answered (``None``: not within 300 s). A flood
    leaves work queued behind it, so the answer may take as long as that work."""
    started = time.perf_counter()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with trio.move_on_after(300):
        while True:
            try:
                async with httpx2.AsyncClient(timeout=300) as client:
                    response = await client.post(url, json=CHAT)
                if response.status_code == 200:
                    return round(time.perf_counter() - started, 2)
            except httpx2.HTTPError:
                pass
            await trio.sleep(1)
    return None


async def in_batches(count: int, concurrency: int, job: Any, *args: Any) -> float:
    started = time.perf_counter()
    limit = trio.CapacityLimiter(concurrency)

    async def one() -> None:
        async with limit:
            await job(*args)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return time.perf_counter() - started


async def idle_phase(port: int, pid: int, count: int, job: Any, settle: float) -> dict[str, Any]:
    before = rss_bytes(pid)
    hold = trio.Event()
    peak = before
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(job, port, hold)
        deadline = trio.current_time() + settle
        while trio.current_time() < deadline:
            await trio.sleep(0.5)
            peak = max(peak, rss_bytes(pid))
        hold.set()
    return {"clients": count, "rss_before": before, "rss_peak": peak, "growth": peak - before}


def start_server(body_timeout: float) -> tuple[subprocess.Popen[str], int]:
    """``trio-sampler serve`` on a free loopback port, and that port."""
    command = [sys.executable, "-m", "trio_sampler", "serve", "--port", "0"]
    command += ["--body-timeout", str(body_timeout), "--keep-alive-timeout", "60"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline().rsplit(":", 1)[1])


async def main(args: argparse.Namespace) -> None:
    server, port = start_server(args.body_timeout)
    try:
        results: dict[str, Any] = {"rss_start": rss_bytes(server.pid)}
        seconds = await in_batches(args.rapid, args.concurrency, rapid_reset, port, args.streams)
        results["rapid_reset"] = {
            "connections": args.rapid,
            "streams_each": args.streams,
            "seconds": round(seconds, 2),
            "alive": server.poll() is None,
            "served_after": await served(port),
        }
        hold = args.body_timeout + 2
        seconds = await in_batches(args.slow, args.slow, slow_body, port, hold)
        results["slow_body"] = {
            "requests": args.slow,
            "body_timeout": args.body_timeout,
            "seconds": round(seconds, 2),
            "alive": server.poll() is None,
            "served_after": await served(port),
        }
        for name, job in (("idle_http1", idle_http1), ("idle_http2", idle_http2)):
            phase = await idle_phase(port, server.pid, args.idle, job, args.settle)
            phase["alive"] = server.poll() is None
            phase["served_after"] = await served(port)
            results[name] = phase
    finally:
        server.terminate()
        await trio.to_thread.run_sync(server.wait)
    print(f"{'phase':<12} {'count':>6} {'seconds':>8} {'alive':>6} {'served after':>13}  RSS")
    for name in ("rapid_reset", "slow_body", "idle_http1", "idle_http2"):
        row = results[name]
        count = row.get("connections") or row.get("requests") or row.get("clients")
        growth = f"{row['growth'] / 2**20:.1f} MiB" if "growth" in row else ""
        print(
            f"{name:<12} {count:>6} {row.get('seconds', args.settle):>8} "
            f"{row['alive']!s:>6} {row['served_after']!s:>12}s  {growth}"
        )
    results["args"] = vars(args)
    write_results(Path(__file__).parent / "results" / "hostile_clients.json", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rapid", type=int, default=1000, help="rapid-reset connections")
    parser.add_argument("--streams", type=int, default=100, help="streams reset per connection")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--slow", type=int, default=100, help="slow-body requests")
    parser.add_argument("--body-timeout", type=float, default=2.0)
    parser.add_argument("--idle", type=int, default=300, help="clients that never read")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds idle clients hang")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    trio.run(main, parser.parse_args())
