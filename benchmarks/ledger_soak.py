"""The usage ledger against a billing server: random faults, cancels, hedges and
fail-overs; each request's ledger must sum to what the server recorded billing it.

The server is the tests' scripted transport (``tests/fakes.py``, in memory): for every
request it receives it picks a random reply (a clean answer, a drop or a stall after the
usage was reported, a 500, a 429) and records the usage that reply reports. The usage
comes first, when the response starts, so a request that reached the server was billed
what the server recorded, however the client then ended it. Two routes with a hedge (half
a second without content starts a second attempt on the next route); a share of the
consumers cancel at a random moment. It runs under trio's mock clock, as fast as the CPU
allows (the mix is the seed's; Trio's scheduling order moves the exact counts a little).

    python benchmarks/ledger_soak.py --requests 10000

prints a table and writes ``benchmarks/results/ledger_soak.json``. The test
(``tests/test_ledger_soak.py``) runs 500 requests.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2
import trio
import trio.testing

_ROOT = Path(__file__).resolve().parent.parent
try:
    from benchmarks.common import write_results
except ModuleNotFoundError:  # run as a script: python benchmarks/ledger_soak.py
    sys.path.insert(0, str(_ROOT))
    from benchmarks.common import write_results
if str(_ROOT / "tests") not in sys.path:  # the scripted transport
    sys.path.insert(0, str(_ROOT / "tests"))

from fakes import (  # noqa: E402
    DONE,
    Reply,
    ScriptedTransport,
    chat_chunk,
    chat_usage,
    error_reply,
    make_config,
)

from trio_sampler.actor import SamplerHandle, open_sampler  # noqa: E402
from trio_sampler.actor._metrics import sum_usage  # noqa: E402
from trio_sampler.config import RetryPolicy, Timeouts  # noqa: E402
from trio_sampler.routing import HedgePolicy, Route, RoutingPolicy  # noqa: E402
from trio_sampler.types import ConversationRequest, TerminalEvent, Usage, User  # noqa: E402

MODEL = "gpt-4o-mini"
_MARK = re.compile(rb"request-(\d+)")


def _usage(prompt: int, completion: int) -> bytes:
    return chat_usage(prompt, completion).replace(b"test-model", MODEL.encode())


def _text(piece: str, finish: str | None = None) -> bytes:
    return chat_chunk({"content": piece}, finish).replace(b"test-model", MODEL.encode())


class BillingServer:
    """Random replies, and a record of the usage each request was billed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.billed: dict[int, list[Usage]] = defaultdict(list)
        self.replies: Counter[str] = Counter()
        self.transport = ScriptedTransport(self.reply, carrier="memory")

    def reply(self, request: httpx2.Request, _index: int) -> Reply:
        found = _MARK.search(request.content)
        assert found is not None
        number = int(found.group(1))
        rng = self.rng
        kind = rng.choices(["ok", "drop", "stall", "500", "429"], [5, 2, 1, 1, 1])[0]
        self.replies[kind] += 1
        if kind == "500":
            return error_reply(500)
        if kind == "429":
            return error_reply(429, None, **{"retry-after-ms": "100"})
        prompt, completion = rng.randint(10, 5000), rng.randint(1, 50)
        self.billed[number].append(Usage(prompt, completion))
        wait = rng.choice([0.0, 0.2, 1.0])  # 1.0: the hedge (0.5 s) starts meanwhile
        head: list[bytes | float] = [_usage(prompt, completion), wait, _text("Hi")]
        if kind == "ok":
            return Reply(chunks=[*head, 0.1, _text("", "stop"), DONE])
        if kind == "drop":
            return Reply(chunks=[*head, 0.3], then="drop")
        return Reply(chunks=head, then="stall")


def _routing() -> RoutingPolicy:
    def route(name: str) -> Route:
        config = make_config(
            base_url=f"http://{name}.test/v1",
            model=MODEL,
            retry=RetryPolicy(max_retries=2, base_delay=0.05, max_delay=0.1),
            timeouts=Timeouts(first_token=3.0, idle=2.0),
        )
        return Route(name, config)

    return RoutingPolicy([route("a"), route("b")], hedge=HedgePolicy(delay_s=0.5))


async def _one(
    sampler: SamplerHandle, number: int, cancel_at: float | None, ends: dict[int, TerminalEvent]
) -> None:
    stream = await sampler.submit(ConversationRequest(items=[User(f"request-{number}")]))
    async with stream:
        if cancel_at is not None:
            with trio.move_on_after(cancel_at):
                async for _ in stream:
                    pass
            stream.cancel()
        async for _ in stream:
            pass
    assert stream.terminal is not None
    ends[number] = stream.terminal


async def run_ledger_soak(requests: int, *, seed: int = 35, cancel_rate: float = 0.2) -> Any:
    """Run ``requests`` requests (under a mock clock, or any clock) and compare each
    request's ledger with the server's record; the report counts the differences."""
    server = BillingServer(seed)
    routing = _routing()
    rng = random.Random(seed + 1)
    ends: dict[int, TerminalEvent] = {}
    async with (
        open_sampler(
            routing.routes[0].config, routing=routing, transport=server.transport
        ) as sampler,
        trio.open_nursery() as nursery,
    ):
        for number in range(requests):
            cancel_at = rng.uniform(0.05, 3.0) if rng.random() < cancel_rate else None
            nursery.start_soon(_one, sampler, number, cancel_at, ends)
            await trio.sleep(rng.uniform(0.0, 0.05))
    differences = []
    terminals: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for number, end in sorted(ends.items()):
        terminals[type(end).__name__] += 1
        assert end.metrics is not None
        lines.update(line.outcome.value for line in end.metrics.ledger)
        ledger = [line.usage for line in end.metrics.ledger if line.usage is not None]
        expected = sum_usage(server.billed.get(number, []))
        if sum_usage(ledger) != expected or end.metrics.total_usage != expected:
            differences.append([number, repr(expected), repr(end.metrics.total_usage)])
    return {
        "requests": requests,
        "terminals": len(ends),
        "differences": len(differences),
        "examples": differences[:5],
        "terminals_by_kind": dict(terminals),
        "ledger_lines_by_outcome": dict(lines),
        "server_replies": dict(server.replies),
        "billed_attempts": sum(len(billed) for billed in server.billed.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--cancel-rate", type=float, default=0.2)
    parser.add_argument("--out", default=str(_ROOT / "benchmarks/results/ledger_soak.json"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = trio.run(
        lambda: run_ledger_soak(args.requests, seed=args.seed, cancel_rate=args.cancel_rate),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    report["wall_s"] = round(time.perf_counter() - started, 2)
    rows = [
        ("requests", report["requests"]),
        ("terminals", report["terminals"]),
        ("billed attempts (server)", report["billed_attempts"]),
        *((f"ledger lines: {k}", v) for k, v in sorted(report["ledger_lines_by_outcome"].items())),
        *((f"terminals: {k}", v) for k, v in sorted(report["terminals_by_kind"].items())),
        ("differences", report["differences"]),
        ("wall seconds", report["wall_s"]),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    write_results(args.out, report)
    return 0 if report["differences"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
