"""Every gate an attempt passes is held by the attempt (``actor/_gates.py``): the
concurrency slot, the breaker's verdict, the pacer, the admission and the memory share
are taken when the attempt starts and given back when it ends, however it ends.

Under trio's mock clock, over the actor's own code and a scripted transport.
"""

from __future__ import annotations

import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.routing import (
    BreakerPolicy,
    BreakerState,
    HedgePolicy,
    Route,
    RoutingPolicy,
)
from trio_sampler.types import (
    Cancelled,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingEvent,
    StreamStarted,
    User,
)

REQUEST = ConversationRequest(items=[User("hi")])


async def test_a_request_in_its_retry_backoff_holds_no_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``max_concurrency`` bounds attempts in flight: while one request waits out a 30 s
    backoff, another runs in the only slot."""
    transport = ScriptedTransport(
        [error_reply(503), Reply(chunks=chat_stream("second")), Reply(chunks=chat_stream("first"))]
    )
    config = make_config(retry=RetryPolicy(base_delay=30.0, max_delay=30.0, jitter=0.0))
    async with open_sampler(config, transport=transport, max_concurrency=1) as sampler:
        first = await sampler.submit(REQUEST)
        async for event in first:
            if isinstance(event, Retrying):
                break
        start = trio.current_time()
        second = await sampler.submit_and_collect(REQUEST)
        assert second.text == "second"
        assert trio.current_time() - start < 1.0  # not after the first's backoff
        rest = [event async for event in first]
    end = rest[-1]
    assert isinstance(end, Completed) and end.response.text == "first"


def _hedged() -> tuple[ScriptedTransport, RoutingPolicy]:
    """One route, hedged after 1 s; the first attempt's content comes after 3 s."""
    config = make_config(retry=RetryPolicy(max_retries=0))
    slow = Reply(chunks=[3.0, *chat_stream("slow")])
    fast = Reply(chunks=chat_stream("fast"))
    routing = RoutingPolicy([Route("only", config)], hedge=HedgePolicy(delay_s=1.0))
    return ScriptedTransport([slow, fast]), routing


async def test_a_hedge_takes_a_slot_of_its_own(autojump_clock: trio.testing.MockClock) -> None:
    """A hedge is one more request to the provider: it waits for a slot like any attempt.
    With one slot, the first attempt keeps it and wins; the hedge is never sent."""
    transport, routing = _hedged()
    async with open_sampler(transport=transport, routing=routing, max_concurrency=1) as sampler:
        stream = await sampler.submit(REQUEST)
        events = [event async for event in stream]
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "slow"
    assert len(transport.requests) == 1
    assert end.metrics is not None and len(end.metrics.attempts) == 1


async def test_with_a_slot_free_the_hedge_is_sent(autojump_clock: trio.testing.MockClock) -> None:
    transport, routing = _hedged()
    async with open_sampler(transport=transport, routing=routing, max_concurrency=2) as sampler:
        stream = await sampler.submit(REQUEST)
        events = [event async for event in stream]
    end = events[-1]
    assert isinstance(end, Completed) and end.response.text == "fast"
    assert len(transport.requests) == 2


async def test_a_probe_the_request_gave_up_before_its_attempt_frees_the_circuit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A fail-over to a half-open route takes its one probe; a request cancelled before
    that probe's attempt starts (its consumer not taking the ``Retrying``) gives the
    probe back, so the next request may probe the route."""
    config = make_config(retry=RetryPolicy(max_retries=0))
    a = Route("a", config.evolve(base_url="http://a.test/v1"))
    b = Route("b", config.evolve(base_url="http://b.test/v1"))
    routing = RoutingPolicy([a, b], breaker=BreakerPolicy(consecutive_failures=1, open_s=5.0))
    transport = ScriptedTransport(
        [
            error_reply(500),  # opens b
            Reply(chunks=[chat_chunk({"content": "x"})], then="stall"),  # a probe, cancelled
            # a is cut after its first batch: the request fails over to b
            Reply(chunks=[chat_chunk({"content": "y"})], then="drop"),
            Reply(chunks=chat_stream("b is back")),  # the next request's probe of b
        ]
    )
    async with open_sampler(
        transport=transport, routing=routing, max_buffered_batches=1
    ) as sampler:
        opening = await sampler.submit(REQUEST, chain=["b"])
        assert not isinstance([e async for e in opening][-1], Completed)
        await trio.sleep(6.0)  # b's circuit may be probed now
        cancelled = await sampler.submit(REQUEST, chain=["b"])
        await trio.testing.wait_all_tasks_blocked()
        cancelled.cancel()  # its probe is abandoned: b is half open, free to probe
        assert isinstance([e async for e in cancelled][-1], Cancelled)
        await trio.testing.wait_all_tasks_blocked()  # its task unwinds
        assert (await sampler.route_stats())["b"].state is BreakerState.HALF_OPEN
        unread = await sampler.submit(REQUEST)
        async for started in unread:  # the consumer takes one batch, then stops reading
            assert isinstance(started, StreamStarted)
            break
        await trio.testing.wait_all_tasks_blocked()
        # a was cut; the fail-over took b's probe and waits for the consumer (a's batch
        # fills the buffer): b was not sent to, and no other request may probe it.
        assert len(transport.requests) == 3
        busy = [e async for e in await sampler.submit(REQUEST, chain=["b"])][-1]
        assert isinstance(busy, Failed) and "another request is probing it" in busy.error.message
        unread.cancel()
        events: list[SamplingEvent] = [event async for event in unread]
        assert isinstance(events[-1], Cancelled)
        await trio.testing.wait_all_tasks_blocked()  # its task unwinds
        probe = await sampler.submit(REQUEST, chain=["b"])
        end = [event async for event in probe][-1]
    assert isinstance(end, Completed) and end.response.text == "b is back"
