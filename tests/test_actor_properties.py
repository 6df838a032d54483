"""Property test of the actor contract: random fault schedules × random cancel times ×
several concurrent requests, under the mock clock."""

from __future__ import annotations

import re

import httpx2
import orjson
import trio
import trio.testing
from fakes import DONE, Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.types import (
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    StreamStarted,
    User,
)

TERMINALS = (Completed, Failed, Cancelled)
MAX_RETRIES = 3


def fault_reply(kind: str, after: int) -> Reply:
    partial: list[bytes | float] = [chat_chunk({"content": f"p{i} "}) for i in range(after)]
    if kind == "status429":
        return error_reply(
            429, {"error": {"type": "rate_limit_error", "message": "slow"}}, **{"retry-after": "2"}
        )
    if kind in ("status500", "status503"):
        return error_reply(int(kind[-3:]))
    if kind == "status400":
        return error_reply(400, {"error": {"type": "invalid_request_error", "message": "bad"}})
    if kind == "stream_error":
        return Reply(
            chunks=[*partial, b'data: {"error": {"type": "server_error", "message": "x"}}\n\n']
        )
    if kind == "drop":
        return Reply(chunks=partial, then="drop")
    if kind == "stall":
        return Reply(chunks=partial, then="stall")
    if kind == "malformed":
        return Reply(chunks=[*partial, b"data: {nope\n\n"])
    if kind == "empty":
        return Reply(chunks=[chat_chunk({}, "stop"), DONE])
    raise AssertionError(kind)


FAULTS = st.sampled_from(
    [
        "status429",
        "status500",
        "status503",
        "status400",
        "stream_error",
        "drop",
        "stall",
        "malformed",
        "empty",
    ]
)
SCHEDULE = st.lists(st.tuples(FAULTS, st.integers(0, 3)), max_size=4)
CANCEL = st.one_of(st.none(), st.floats(0.0, 120.0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(SCHEDULE, CANCEL), min_size=1, max_size=4), st.integers(0, 2**16))
def test_exactly_one_terminal_under_random_faults(
    plans: list[tuple[list[tuple[str, int]], float | None]], seed: int
) -> None:
    trio.run(_run, plans, seed, clock=trio.testing.MockClock(autojump_threshold=0))


async def run_plans(
    sampler: SamplerHandle, cancels: list[float | None]
) -> dict[int, list[SamplingEvent]]:
    """Submit ``User("request N")`` for every N at once, cancel request N after
    ``cancels[N]`` seconds (never when ``None``), and return every request's events."""
    results: dict[int, list[SamplingEvent]] = {}

    async def one(index: int, cancel_at: float | None) -> None:
        stream = await sampler.submit(ConversationRequest(items=[User(f"request {index}")]))
        events: list[SamplingEvent] = []
        async with trio.open_nursery() as nursery:
            if cancel_at is not None:

                async def canceller() -> None:
                    await trio.sleep(cancel_at)
                    stream.cancel()

                nursery.start_soon(canceller)
            async for event in stream:
                events.append(event)
            nursery.cancel_scope.cancel()
        results[index] = events

    async with trio.open_nursery() as nursery:
        for index, cancel_at in enumerate(cancels):
            nursery.start_soon(one, index, cancel_at)
    return results


async def _run(plans: list[tuple[list[tuple[str, int]], float | None]], seed: int) -> None:
    attempts: dict[int, int] = {}
    served: dict[int, list[str]] = {}

    def script(request: httpx2.Request, _: int) -> Reply:
        body = orjson.loads(request.content)
        index = int(body["messages"][-1]["content"].removeprefix("request "))
        attempt = attempts.get(index, 0)
        attempts[index] = attempt + 1
        schedule = plans[index][0]
        if attempt < len(schedule):
            kind, after = schedule[attempt]
            return fault_reply(kind, after)
        text = f"final {index} after {attempt}"
        served.setdefault(index, []).append(text)
        return Reply(chunks=chat_stream(*re.findall(r"\S+\s*", text), pause=1.0))

    config = make_config(
        retry=RetryPolicy(max_retries=MAX_RETRIES, base_delay=1.0, max_delay=4.0),
        timeouts=Timeouts(first_token=30.0, idle=10.0),
    )
    transport = ScriptedTransport(script)
    async with open_sampler(config, transport=transport, seed=seed) as sampler:
        results = await run_plans(sampler, [cancel_at for _, cancel_at in plans])

    # Every response body the client opened was closed (no leaked connections).
    assert transport.closed_bodies == transport.opened_bodies
    for index, events in results.items():
        terminals = [e for e in events if isinstance(e, TERMINALS)]
        assert len(terminals) == 1, events
        assert events[-1] is terminals[0]
        # A Retrying precedes every new attempt.
        starts = sum(isinstance(e, StreamStarted) for e in events)
        retries = sum(isinstance(e, Retrying) for e in events)
        assert starts <= retries + 1
        assert attempts.get(index, 0) <= retries + 1
        terminal = terminals[0]
        if isinstance(terminal, Completed):
            # The final response is what the last attempt's server sent...
            assert terminal.response.text == served[index][-1]
            # ...and equals the text streamed after the last discard.
            last_discard = max(
                (i for i, e in enumerate(events) if isinstance(e, Retrying) and e.discard_partial),
                default=-1,
            )
            streamed = "".join(
                e.text
                for e in events[last_discard + 1 :]
                if isinstance(e, ChannelToken) and e.channel is SamplingChannel.TEXT
            )
            assert streamed == terminal.response.text
        schedule, cancel_at = plans[index]
        if (
            cancel_at is None
            and len(schedule) <= MAX_RETRIES
            and not any(kind == "status400" for kind, _ in schedule)
        ):
            assert isinstance(terminal, Completed), terminal
