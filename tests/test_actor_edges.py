"""The contract at the API's edges, over real loopback HTTP against the emulator.

What a Trio user does around the sampler, not inside it: cancel the task that is
submitting, drop a stream without closing it, leave ``async with stream`` at any point,
shut the sampler down while other tasks submit. Each test checks that no request outlives
its caller's interest (no orphan, nothing left running, no task left), that nothing hangs,
and that leaving a block means the request is over.
"""

from __future__ import annotations

import gc
import random
import weakref

import httpx2
import pytest
import trio

from trio_sampler import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    RequestCancelledError,
    RequestStream,
    SamplerConfig,
    SamplerHandle,
    SamplingEvent,
    TerminalEvent,
    User,
    open_sampler,
)
from trio_sampler.actor import SamplerClosedError
from trio_sampler.actor._stream import RequestState
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.testing import EmulatorFixture

#: A reply that takes seconds to stream (so every cancel below lands mid-request).
SLOW = {"text": "word " * 400, "chunk_chars": 5, "delay_ms": 10}


def config_for(emulator: EmulatorFixture) -> SamplerConfig:
    return SamplerConfig(
        base_url=emulator.base_url,
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="emulator-1",
        api_key="sk-emulator-test",
        retry=RetryPolicy(max_retries=0),
        timeouts=Timeouts(connect=5.0, response_headers=5.0, first_token=5.0, idle=5.0),
    )


def slow_request(emulator: EmulatorFixture) -> ConversationRequest:
    return ConversationRequest(items=[User("talk")], extra_headers=emulator.script(**SLOW))


def request_tasks() -> list[trio.lowlevel.Task]:
    """Every live task of a request, found by walking the task tree from the root."""
    found: list[trio.lowlevel.Task] = []

    def walk(task: trio.lowlevel.Task) -> None:
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                if child.name.startswith("trio_sampler request"):
                    found.append(child)
                walk(child)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    walk(root)
    return found


async def cancel_after(scope: trio.CancelScope, checkpoints: int) -> None:
    for _ in range(checkpoints):
        await trio.lowlevel.checkpoint()
    scope.cancel()


async def test_cancelled_submit_never_leaves_an_orphan(emulator: EmulatorFixture) -> None:
    """1,000 ``submit()`` calls, each cancelled after a random number of scheduling
    rounds: every request that runs belongs to a stream its caller received. (A few
    connect at a time; the others wait for a slot, which is where a slow actor used to
    leave them for good.)"""
    rng = random.Random(12)
    request = slow_request(emulator)
    with trio.fail_after(120):
        async with open_sampler(config_for(emulator), max_concurrency=5) as sampler:
            for _ in range(20):
                handed: list[RequestStream] = []

                async def submit(checkpoints: int, handed: list[RequestStream]) -> None:
                    async with trio.open_nursery() as nursery:
                        with trio.CancelScope() as scope:
                            nursery.start_soon(cancel_after, scope, checkpoints)
                            handed.append(await sampler.submit(request))

                async with trio.open_nursery() as nursery:
                    for _ in range(50):
                        nursery.start_soon(submit, rng.randrange(4), handed)
                # No orphan: what runs is exactly what the callers hold.
                assert await sampler.active_count() == len(handed)
                assert len(request_tasks()) == len(handed)
                async with trio.open_nursery() as nursery:
                    for stream in handed:
                        nursery.start_soon(stream.aclose)
                assert all(isinstance(stream.terminal, Cancelled) for stream in handed)
                assert request_tasks() == []
                assert await sampler.active_count() == 0


async def test_cancelled_submit_and_collect_leaves_nothing_running(
    emulator: EmulatorFixture,
) -> None:
    """1,000 ``submit_and_collect()`` calls cancelled at random points (before the
    request starts, while it connects, mid-stream): once each call has returned, its
    request is over and its task is gone. (Ten talk to the server at a time, the rest
    wait for a slot: both are points a cancel must handle.)"""
    rng = random.Random(13)
    request = slow_request(emulator)
    with trio.fail_after(120):
        async with open_sampler(config_for(emulator), max_concurrency=10) as sampler:
            for _ in range(20):
                leftovers: list[int] = []

                async def collect(checkpoints: int, leftovers: list[int]) -> None:
                    async with trio.open_nursery() as nursery:
                        with trio.CancelScope() as scope:
                            nursery.start_soon(cancel_after, scope, checkpoints)
                            await sampler.submit_and_collect(request)
                        # Right after the call: nothing of this request is left.
                        leftovers.append(len(sampler._actor.live))

                async with trio.open_nursery() as nursery:
                    for _ in range(50):
                        nursery.start_soon(collect, rng.randrange(60), leftovers)
                assert request_tasks() == []
                assert await sampler.active_count() == 0
                assert len(leftovers) == 50


async def test_dropped_stream_is_cancelled_when_collected(emulator: EmulatorFixture) -> None:
    """A stream that is dropped mid-flight, unreachable only through a reference cycle
    (so only the garbage collector frees it), ends at the run loop's next pass."""
    async with open_sampler(config_for(emulator)) as sampler:
        stream = await sampler.submit(slow_request(emulator))
        async for event in stream:
            if isinstance(event, ChannelToken):
                break
        request_id = stream.request_id
        state = stream._state
        cycle: list[object] = [stream]
        cycle.append(cycle)
        collected = weakref.ref(stream)
        del stream, cycle, event
        assert await sampler.is_active(request_id)
        gc.collect()
        assert collected() is None
        # The finalizer only asked the run loop; the cancel runs in its next pass.
        await trio.lowlevel.checkpoint()
        assert not await sampler.is_active(request_id)
        assert isinstance(state.terminal, Cancelled)
        assert state.terminal.reason == "the consumer dropped the stream"
        assert state.terminal.partial is not None
        with trio.fail_after(5):
            await state.task_done.wait()
        assert request_tasks() == []


async def test_dropped_stream_is_cancelled_once_unreferenced(emulator: EmulatorFixture) -> None:
    """Breaking out of ``async for`` without ``async with`` and letting go of the stream."""
    async with open_sampler(config_for(emulator)) as sampler:

        async def read_a_little() -> RequestState:
            stream = await sampler.submit(slow_request(emulator))
            async for event in stream:
                if isinstance(event, ChannelToken):
                    break
            return stream._state  # the request's bookkeeping, not the stream

        state = await read_a_little()
        await trio.lowlevel.checkpoint()
        assert not await sampler.is_active(state.request_id)
        assert isinstance(state.terminal, Cancelled)
        with trio.fail_after(5):
            await state.task_done.wait()
        assert request_tasks() == []


async def submitter(sampler: SamplerHandle, request: ConversationRequest, log: list[str]) -> None:
    """Submit until the sampler refuses; read every stream to its end."""
    while True:
        try:
            stream = await sampler.submit(request)
        except SamplerClosedError:
            log.append("closed")
            return
        async with stream:
            async for _ in stream:
                pass
        terminal = stream.terminal
        assert isinstance(terminal, Cancelled | Completed), terminal
        log.append(type(terminal).__name__)


@pytest.mark.parametrize("cancel_enclosing", [False, True], ids=["leave", "cancel-enclosing"])
async def test_shutdown_raced_by_submitters_never_hangs(
    emulator: EmulatorFixture, cancel_enclosing: bool
) -> None:
    """250 shutdowns per mode (500 in all), each while four tasks outside the sampler's
    block keep submitting: every ``submit`` either raises ``SamplerClosedError`` or
    returns a stream that ends; nothing waits forever."""
    rng = random.Random(14 + cancel_enclosing)
    request = slow_request(emulator)
    config = config_for(emulator)
    # One HTTP transport (one connection pool over loopback) for all the samplers: a
    # sampler's own client would spend most of each round loading the CA store.
    async with httpx2.AsyncHTTPTransport() as transport:
        for _ in range(250):
            await one_shutdown_race(config, transport, request, rng, cancel_enclosing)


async def one_shutdown_race(
    config: SamplerConfig,
    transport: httpx2.AsyncBaseTransport,
    request: ConversationRequest,
    rng: random.Random,
    cancel_enclosing: bool,
) -> None:
    """One sampler, four submitters outside its block, then the block ends."""
    log: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as outside:
            with trio.CancelScope() as enclosing:
                async with open_sampler(config, transport=transport) as sampler:
                    for _ in range(4):
                        outside.start_soon(submitter, sampler, request, log)
                    for _ in range(rng.randrange(6)):
                        await trio.lowlevel.checkpoint()
                    if cancel_enclosing:
                        enclosing.cancel()
                        await trio.sleep_forever()
            assert await sampler.active_count() == 0
    assert log.count("closed") == 4
    await sampler.cancel("req_after_shutdown")  # a no-op, not an error


async def test_leaving_the_stream_block_at_any_point_ends_the_request(
    emulator: EmulatorFixture,
) -> None:
    """Leave ``async with stream`` after 0, 1, 2, ... events, by ``break``, by an
    exception or by a cancel: right after, the terminal is set, the sampler does not
    count the request, its task is gone, and the stream yields nothing more."""
    request = slow_request(emulator)
    async with open_sampler(config_for(emulator)) as sampler:
        for after in range(24):
            how = ("break", "raise", "cancel")[after % 3]
            seen: list[SamplingEvent] = []
            stream = await sampler.submit(request)
            with trio.CancelScope() as scope:
                try:
                    async with stream:
                        async for event in stream:
                            seen.append(event)
                            if len(seen) > after // 3:
                                if how == "break":
                                    break
                                if how == "raise":
                                    raise LookupError("leaving")
                                scope.cancel()
                                await trio.lowlevel.checkpoint()
                except LookupError:
                    pass
            terminal = stream.terminal
            assert isinstance(terminal, Cancelled), (after, terminal)
            assert terminal.reason == "the consumer left the stream"
            assert stream.request_id not in sampler._actor.live
            assert request_tasks() == []
            assert [event async for event in stream] == []
            with pytest.raises(RequestCancelledError):
                (await stream.result()).unwrap()
        assert await sampler.active_count() == 0


async def test_aclose_ends_the_request_and_the_iteration(emulator: EmulatorFixture) -> None:
    async with open_sampler(config_for(emulator)) as sampler:
        stream = await sampler.submit(slow_request(emulator))
        async for event in stream:
            if isinstance(event, ChannelToken):
                break
        await stream.aclose()
        terminal = stream.terminal
        assert isinstance(terminal, Cancelled)
        assert terminal.reason == "the consumer closed the stream"
        assert terminal.partial is not None and terminal.partial.text.startswith("word")
        assert request_tasks() == []
        assert [event async for event in stream] == []


async def test_cancel_is_the_next_event(emulator: EmulatorFixture) -> None:
    """After ``stream.cancel()`` the terminal is recorded at once, and it is the next
    thing the iterator yields: events that arrived but were not read are dropped."""
    async with open_sampler(config_for(emulator)) as sampler:
        stream = await sampler.submit(slow_request(emulator))
        events: list[SamplingEvent] = []
        async for event in stream:
            events.append(event)
            if isinstance(event, ChannelToken):
                await trio.sleep(0.2)  # let more reads pile up unread
                stream.cancel("enough")
                assert isinstance(stream.terminal, Cancelled)
                assert not await sampler.is_active(stream.request_id)
        assert isinstance(events[-1], Cancelled) and events[-1].reason == "enough"
        tokens = [e for e in events if isinstance(e, ChannelToken)]
        assert tokens == [events[-2]]
        partial = events[-1].partial
        assert partial is not None and len(partial.text) > len(tokens[0].text)


async def test_leaving_open_sampler_ends_every_request(emulator: EmulatorFixture) -> None:
    streams: list[RequestStream] = []
    async with open_sampler(config_for(emulator)) as sampler:
        for _ in range(10):
            streams.append(await sampler.submit(slow_request(emulator)))
        await trio.sleep(0.05)
    assert request_tasks() == []
    assert await sampler.active_count() == 0
    for stream in streams:
        terminal: TerminalEvent | None = stream.terminal
        assert isinstance(terminal, Cancelled)
        assert terminal.reason == "the sampler was shut down"
        events = [event async for event in stream]
        assert events == [terminal]
    with pytest.raises(SamplerClosedError):
        await sampler.submit(slow_request(emulator))
    await sampler.cancel(streams[0].request_id)  # a no-op after shutdown
    assert not await sampler.is_active(streams[0].request_id)


async def test_two_tasks_reading_one_stream_take_each_event_once_in_order(
    emulator: EmulatorFixture,
) -> None:
    """Two tasks iterating the same stream at once: every event goes to one of them,
    once, in the order sent (the tokens, in the order taken, spell the response), the
    terminal to one, and both iterations end. The second task waits beside the first
    (which is handed the first token, then dawdles): the tokens queued meanwhile go to
    the second while the stream is still running, not after its end."""
    script = {"text": "word " * 40, "chunk_chars": 5, "first_token_ms": 100}
    script["token_interval_ms"] = 2
    request = ConversationRequest(items=[User("talk")], extra_headers=emulator.script(**script))
    taken: list[tuple[str, SamplingEvent, bool]] = []  # (reader, event, stream running)
    ended: list[str] = []
    async with open_sampler(config_for(emulator)) as sampler:
        stream = await sampler.submit(request)

        async def read(name: str, pause: float) -> None:
            async for event in stream:
                taken.append((name, event, stream.terminal is None))
                if isinstance(event, ChannelToken):
                    await trio.sleep(pause)
            ended.append(name)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, "first", 0.05)
                await trio.testing.wait_all_tasks_blocked()  # it waits for the first token
                nursery.start_soon(read, "second", 0)
    events = [event for _, event, _ in taken]
    terminals = [event for event in events if isinstance(event, Completed)]
    assert len(terminals) == 1 and events[-1] is terminals[0]
    text = "".join(event.text for event in events if isinstance(event, ChannelToken))
    assert text == terminals[0].response.text == "word " * 40
    assert sorted(ended) == ["first", "second"]
    tokens = [(name, running) for name, event, running in taken if isinstance(event, ChannelToken)]
    assert tokens[0] == ("first", True)
    assert ("second", True) in tokens, tokens


async def test_closing_the_stream_ends_every_task_reading_it(emulator: EmulatorFixture) -> None:
    """Two tasks wait on one stream (one to be handed the next batch, one beside it):
    closing the stream from a third ends both iterations, and the request."""
    ended: list[str] = []
    async with open_sampler(config_for(emulator)) as sampler:
        stream = await sampler.submit(slow_request(emulator))
        async for event in stream:
            if isinstance(event, ChannelToken):
                break

        async def read(name: str) -> None:
            async for _ in stream:
                pass
            ended.append(name)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, "first")
                nursery.start_soon(read, "second")
                await trio.testing.wait_all_tasks_blocked()
                await stream.aclose()
        assert sorted(ended) == ["first", "second"]
        assert isinstance(stream.terminal, Cancelled)
        assert request_tasks() == []
