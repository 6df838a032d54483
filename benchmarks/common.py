"""Small pieces the benchmark scripts share (and the tests' hand-written servers use): the
CPU time and run-queue wait of child processes, one HTTP/1.1 request read off a socket,
the arguments of the per-request counts, a results file written, and the open-file limit
raised for many streams."""

from __future__ import annotations

import argparse
import json
import os
import resource
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

__all__ = ["cpu_seconds", "raise_nofile", "read_request", "run_queue_seconds", "write_results"]

# A request head longer than this is not a request these servers are sent.
_MAX_HEAD = 1 << 20


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU of the processes ``pids`` so far (from ``/proc``)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def run_queue_seconds(pids: Iterable[int]) -> float:
    """Seconds the processes ``pids`` have spent runnable but waiting for a CPU (Linux's
    ``/proc/PID/schedstat``; 0 where it is missing). A process that waited as long as it
    ran was starved by the machine, whatever its own CPU use says."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


async def read_request(stream: trio.SocketStream) -> tuple[bytes, bytes] | None:
    """One request's head (without the blank line) and its ``content-length`` body;
    ``None`` when the peer closes (or sends a megabyte of head) first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk or len(data) > _MAX_HEAD:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


def write_results(path: str | Path, results: object) -> None:
    """Write ``results`` to ``path`` as indented JSON (its folder made if need be), and
    say so on standard output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")


def per_request_arguments(
    argv: Sequence[str],
    doc: str,
    contenders: Sequence[str],
    *,
    requests_help: str,
    warmup: int,
    json_path: str,
) -> tuple[argparse.ArgumentParser, argparse.Namespace, list[str]]:
    """The arguments of a script that counts something per request over the contenders
    (``instructions_per_request.py``, ``rounds_per_request.py``): the parser (for the
    script's own errors), the arguments, and the contenders chosen, checked."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,200", help="text deltas per stream (1,200)")
    parser.add_argument("--requests", type=int, default=100, help=requests_help)
    parser.add_argument(
        "--warmup", type=int, default=warmup, help=f"unmeasured requests first ({warmup})"
    )
    parser.add_argument(
        "--impls", default="ours,skeleton,floor", help="contenders (" + ",".join(contenders) + ")"
    )
    parser.add_argument("--json", default=json_path, help="results file")
    parser.add_argument("--no-json", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    impls = args.impls.split(",")
    if args.requests < 1 or args.warmup < 0 or not set(impls) <= set(contenders):
        parser.error(
            "--requests must be at least 1, --warmup at least 0, and --impls a list of "
            + ", ".join(contenders)
        )
    return parser, args, impls


#: Open files wanted per process: 10,000 streams plus the previous cell's lingering sockets.
WANTED_NOFILE = 65536


def raise_nofile() -> tuple[int, int]:
    """Raise the open-file limit (to ``WANTED_NOFILE`` where allowed, e.g. as root; else
    the soft limit to the hard one); return the (soft, hard) now set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < WANTED_NOFILE:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (WANTED_NOFILE, WANTED_NOFILE))
        except (ValueError, OSError):
            pass  # not privileged: the hard limit stands
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)
