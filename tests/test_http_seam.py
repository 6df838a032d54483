"""The mock-clock tests and production run the same actor code: only the bytes' source
differs.

The same scripts run over every carrier of ``tests/carriers.py`` (in memory, through
httpx2, through the direct transport over in-memory connections and over loopback TCP,
the production path), under the mock clock, and the calls the actor and the client make
to the HTTP seam (``Transport.open`` and each ``Body`` method) are counted: they are the
same on every carrier, and so are the events the caller sees.

The five timeouts (connect, response headers, first token, idle, total) are independent
and each failure says which fired and after how long, on every carrier (the connect
timeout needs a real connection: ``test_http_resend_rule``).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import trio
import trio.testing
from carriers import CARRIERS
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.types import Completed, ConversationRequest, Failed, SamplingEvent, User

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


# -- the five timeouts ----------------------------------------------------------------

STALL_AFTER_CONTENT = Reply(chunks=[chat_chunk({"content": "x"})], then="stall")
TIMEOUTS = [
    pytest.param(
        Reply(delay_headers=math.inf),
        "response headers timeout: no response headers within 2 s",
        id="response_headers",
    ),
    pytest.param(
        Reply(chunks=[], then="stall"),
        "first token timeout: no first token within 3 s",
        id="first_token",
    ),
    pytest.param(STALL_AFTER_CONTENT, "idle timeout: no content within 4 s", id="idle"),
]


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize(("reply", "message"), TIMEOUTS)
async def test_each_timeout_says_which_fired_and_after_how_long(
    reply: Reply, message: str, carrier: str, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([reply], carrier=carrier)
    timeouts = Timeouts(response_headers=2.0, first_token=3.0, idle=4.0, total=60.0)
    config = make_config(timeouts=timeouts, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        events = [event async for event in await sampler.submit(REQUEST)]
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.message == message


@pytest.mark.parametrize("carrier", CARRIERS)
async def test_the_total_timeout_says_so_and_after_how_long(
    carrier: str, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([STALL_AFTER_CONTENT], carrier=carrier)
    timeouts = Timeouts(response_headers=2.0, first_token=3.0, idle=40.0, total=5.0)
    config = make_config(timeouts=timeouts, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        events = [event async for event in await sampler.submit(REQUEST)]
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.error.message == "the request did not finish within its total timeout of 5 s"


@pytest.mark.parametrize("carrier", CARRIERS)
async def test_no_timeout_caps_another(
    carrier: str, autojump_clock: trio.testing.MockClock
) -> None:
    """A head after 1.5 s with ``response_headers=2`` and ``first_token=idle=0.5``, then
    content every 0.4 s: nothing fires, on any carrier (the socket read timeout is a
    backstop no shorter than the longest of them)."""
    late = Reply(delay_headers=1.5, chunks=chat_stream("a", "b", "c", pause=0.4))
    transport = ScriptedTransport([late], carrier=carrier)
    timeouts = Timeouts(response_headers=2.0, first_token=0.5, idle=0.5)
    config = make_config(timeouts=timeouts, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        events = [event async for event in await sampler.submit(REQUEST)]
    assert isinstance(events[-1], Completed), events[-1]


async def test_a_transport_of_neither_kind_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"transport must be an httpx2.AsyncBaseTransport or a"):
        async with open_sampler(make_config(), transport=object()):  # type: ignore[arg-type]
            pass
