"""Hostile endless streams against one sampler's memory cap: how far does the process grow?

Each case runs in two fresh interpreters: a loopback server that answers every request
with a stream that never ends, and a sampler running ``--streams`` requests at once under
``max_buffered_response_bytes=--cap`` (its process alone is measured: the server's own
buffers are not the sampler's). The cases:

* ``endless-event``: one SSE event that never ends (it grows in each stream's SSE
  decoder, up to ``max_sse_event_bytes``);
* ``endless-text``: text deltas without end (they grow in each stream's fold);
* ``endless-wide-text``: the same in CJK characters (three bytes each in UTF-8, two in
  the strings that hold them);
* ``endless-tool-objects``: a tool call whose arguments are ``[{},{},...]`` without end,
  for a request with tools: parsed as they stream, they hold 24 bytes of dictionaries
  per byte of text (the parsed values are counted too).

Reported: the growth of the process's peak resident set (``VmHWM``, reset before the
streams start) over the cap, how the streams ended, and the machine's load average at
the end (the runs share the machine). Loopback only, bounded in time
(each stream ends when the cap or a per-stream bound stops it). Prints a table and writes
``benchmarks/results/memory_cap.json``.

With ``--loadtest C``, the load generator (``trio-sampler loadtest``, ``--concurrency C``
for ``--loadtest-seconds``) runs against the endless-text server under each of
``--loadtest-cap-mib``, its process measured the same way (the growth over its resident
set once imported).

    python benchmarks/memory_cap.py [--streams 20] [--cap-mib 32 128] [--loadtest 1000]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results

_MIB = 1024 * 1024

SERVER = r"""
import functools, sys
import orjson, trio

case = sys.argv[1]
CHAR = "\u8bed" if case == "endless-wide-text" else "x"
TEXT = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": CHAR * 4096}}]})
TEXT += b"\n\n"
def tool(arguments, **opening):
    call = {"index": 0, "function": {"arguments": arguments, **opening}}
    if opening:
        call.update(id="call_1", type="function")
    delta = {"tool_calls": [call]}
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"
TOOL_OPEN = tool("[", name="f")
OBJECTS = tool("{}," * 1365)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
PIECE = b"x" * 65536 if case == "endless-event" else TEXT * 16
if case == "endless-tool-objects":
    PIECE = OBJECTS * 16

async def handler(stream):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        await stream.send_all(HEAD)
        if case == "endless-event":
            await stream.send_all(b"data: ")
        if case == "endless-tool-objects":
            await stream.send_all(TOOL_OPEN)
        while True:
            await stream.send_all(PIECE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()

async def main():
    async with trio.open_nursery() as nursery:
        serving = functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        listeners = await nursery.start(serving)
        print(listeners[0].socket.getsockname()[1], flush=True)

trio.run(main)
"""

CHILD = r"""
import json, sys
import trio
from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import ConversationRequest, Failed, ToolSpec, User

port, streams, cap, case = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

async def main():
    config = SamplerConfig(
        base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key="sk-memory-bench-0000",
        timeouts=Timeouts(first_token=120, idle=120), retry=RetryPolicy(max_retries=0),
    )
    tools = (ToolSpec(name="f"),) if case == "endless-tool-objects" else ()
    request = ConversationRequest(items=[User("hi")], tools=tools)
    codes = []
    async with open_sampler(config, max_buffered_response_bytes=cap) as sampler:
        async def one():
            stream = await sampler.submit(request)
            async for event in stream:
                if isinstance(event, Failed):
                    codes.append(event.error.error_code or event.error.kind.value)
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM from the current resident set
        before = status("VmRSS:")
        async with trio.open_nursery() as inner:
            for _ in range(streams):
                inner.start_soon(one)
        growth = status("VmHWM:") - before
    print(json.dumps({"growth": growth, "codes": codes}))

trio.run(main)
"""


LOADTEST = r"""
import json, sys
import trio_sampler.cli, trio_sampler.loadtest

def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
before = status("VmRSS:")
try:
    trio_sampler.cli.main(sys.argv[2:])
finally:
    growth = status("VmHWM:") - before
    # What the report says stopped the streams (the stage's errors, by kind).
    with open(sys.argv[1]) as results:
        errors = json.load(results)["stages"][0]["requests"]["errors"]
    codes = [kind for kind, count in errors.items() for _ in range(count)]
    print(json.dumps({"growth": growth, "codes": codes}))
"""


def run_case(case: str, streams: int, cap: int, loadtest: float = 0) -> dict[str, object]:
    server = subprocess.Popen([sys.executable, "-c", SERVER, case], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().decode().strip()
        if loadtest:
            handle, report = tempfile.mkstemp(suffix=".json")
            os.close(handle)
            command = ["-c", LOADTEST, report, "loadtest", f"--json={report}"]
            command += [f"--base-url=http://127.0.0.1:{port}/v1"]
            command += ["--model=m", f"--concurrency={streams}", f"--duration={loadtest}"]
            command += ["--warmup=0", f"--memory-cap={cap}", "--no-progress"]
        else:
            command = ["-c", CHILD, port, str(streams), str(cap), case]
        done = subprocess.run(
            [sys.executable, *command], capture_output=True, timeout=600, check=not loadtest
        )
    finally:
        server.terminate()
        server.wait()
        if loadtest:
            os.unlink(report)
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--cap-mib", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--loadtest", type=int, default=0, metavar="C", help="loadtest streams")
    parser.add_argument("--loadtest-seconds", type=float, default=30.0)
    parser.add_argument("--loadtest-cap-mib", type=int, nargs="+", default=[1024])
    args = parser.parse_args()
    rows = []
    print(f"{'case':<20} {'streams':>7} {'cap':>7} {'RSS growth':>11} {'x cap':>6}  endings")
    cases = [
        (cap_mib, case, args.streams)
        for cap_mib in args.cap_mib
        for case in (
            "endless-event",
            "endless-text",
            "endless-wide-text",
            "endless-tool-objects",
        )
    ]
    if args.loadtest:
        cases += [(cap_mib, "loadtest", args.loadtest) for cap_mib in args.loadtest_cap_mib]
    for cap_mib, case, streams in cases:
        cap = cap_mib * _MIB
        if case == "loadtest":
            result = run_case("endless-text", streams, cap, args.loadtest_seconds)
        else:
            result = run_case(case, streams, cap)
        growth = int(str(result["growth"]))
        codes = result["codes"]
        assert isinstance(codes, list)
        endings = dict(collections.Counter(str(code) for code in codes))
        rows.append(
            {
                "case": case,
                "streams": streams,
                "cap": cap,
                "growth": growth,
                "ratio": round(growth / cap, 3),
                "endings": endings,
            }
        )
        print(
            f"{case:<20} {streams:>7} {cap_mib:>5}Mi {growth / _MIB:>8.1f}MiB "
            f"{growth / cap:>6.2f}  {endings}"
        )
    write_results(
        Path(__file__).parent / "results" / "memory_cap.json",
        {"load_average": os.getloadavg(), "runs": rows},
    )


if __name__ == "__main__":
    main()
