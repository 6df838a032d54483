"""The mock-clock tests and production run the same actor code: only the bytes' source
differs.

The same scripts run over every carrier of ``tests/carriers.py`` (in memory, through
httpx2, through the direct transport over in-memory connections and over loopback TCP,
the production path), under the mock clock, and the calls the actor and the client make
to the HTTP seam (``Transport.open`` and each ``Body`` method) are counted: they are the
same on every carrier, and so are the events the caller sees.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio
import trio.testing
from carriers import CARRIERS
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.types import ConversationRequest, SamplingEvent, User

REQUEST = ConversationRequest(items=[User("hello")])

SCRIPTS = {
    "complete": [Reply(chunks=chat_stream("Hel", "lo", " there", pause=0.25))],
    "retry after a 503": [error_reply(503), Reply(chunks=chat_stream("up", pause=0.1))],
    "dropped mid-stream, then complete": [
        Reply(chunks=[chat_chunk({"content": "par"}), 0.1], then="drop"),
        Reply(chunks=chat_stream("whole", pause=0.1)),
    ],
}


def shape(events: list[SamplingEvent]) -> list[str]:
    """The events' kinds in order (their ids and times differ from run to run)."""
    return [type(event).__name__ for event in events]


async def run(script: list[Reply], carrier: str) -> tuple[Counter[str], list[str], int]:
    transport = ScriptedTransport(script, carrier=carrier)
    config = make_config(retry=RetryPolicy(max_retries=2, base_delay=0.5, jitter=0.0))
    async with open_sampler(config, transport=transport) as sampler:
        events = [event async for event in await sampler.submit(REQUEST)]
    return transport.seam_calls, shape(events), len(transport.requests)


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_every_carrier_takes_the_same_path_through_the_seam(
    name: str, autojump_clock: trio.testing.MockClock
) -> None:
    runs = {carrier: await run(SCRIPTS[name], carrier) for carrier in CARRIERS}
    memory = runs["memory"]
    assert memory[0]["open"] >= 1 and memory[0]["aclose"] == memory[0]["open"]
    for carrier, result in runs.items():
        assert result == memory, f"{carrier} differs from the in-memory run: {runs}"
