"""The usage ledger under random faults, cancels, hedges and fail-overs: for each request,
the sum of its ledger equals what the server billed it, by the server's own record.

The server is a scripted transport that, for every request it receives, picks a random
reply (a clean answer, a drop or a stall after the usage was reported, a 500, a 429) and
records the usage that reply reports to the client. The usage always comes first, at the
moment the response starts, so a request that reached the server was billed what the
server recorded, however the client then ended it. Routing has two routes and a hedge
(half a second without content starts a second attempt); some consumers cancel at a
random moment. Under the mock clock the run is deterministic for its seed.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

import httpx2
import trio
from fakes import DONE, Reply, ScriptedTransport, chat_chunk, chat_usage, error_reply
from test_routing import on

from trio_sampler import ConversationRequest, Route, RoutingPolicy, User, open_sampler
from trio_sampler.actor import SamplerHandle
from trio_sampler.actor._metrics import sum_usage
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.routing import HedgePolicy
from trio_sampler.types import TerminalEvent, Usage

MODEL = "gpt-4o-mini"
REQUESTS = 500
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
        self.transport = ScriptedTransport(self.reply)

    def reply(self, request: httpx2.Request, _index: int) -> Reply:
        found = _MARK.search(request.content)
        assert found is not None
        number = int(found.group(1))
        rng = self.rng
        kind = rng.choices(["ok", "drop", "stall", "500", "429"], [5, 2, 1, 1, 1])[0]
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
        config = on(
            name,
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


async def test_the_ledger_sums_to_what_the_server_billed_each_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = BillingServer(seed=35)
    routing = _routing()
    rng = random.Random(7)
    ends: dict[int, TerminalEvent] = {}
    async with (
        open_sampler(
            routing.routes[0].config, routing=routing, transport=server.transport
        ) as sampler,
        trio.open_nursery() as nursery,
    ):
        for number in range(REQUESTS):
            cancel_at = rng.uniform(0.05, 3.0) if rng.random() < 0.2 else None
            nursery.start_soon(_one, sampler, number, cancel_at, ends)
            await trio.sleep(rng.uniform(0.0, 0.05))
    assert len(ends) == REQUESTS
    differences = []
    kinds: dict[str, int] = defaultdict(int)
    outcomes: set[str] = set()
    for number, end in ends.items():
        kinds[type(end).__name__] += 1
        assert end.metrics is not None
        outcomes |= {line.outcome.value for line in end.metrics.ledger}
        ledger = [line.usage for line in end.metrics.ledger if line.usage is not None]
        expected = sum_usage(server.billed.get(number, []))
        if sum_usage(ledger) != expected or end.metrics.total_usage != expected:
            differences.append((number, expected, end.metrics.total_usage))
    assert differences == []
    # The run exercised what it claims to.
    assert {"Completed", "Failed", "Cancelled"} <= set(kinds)
    assert {"completed", "failed", "cancelled", "lost_hedge"} <= outcomes
