"""The actor's contract (``docs/contract.md``) under the mock clock, with a scripted transport.

Every test checks the same rule from a different angle: exactly one terminal event, it is
the last event, it arrives promptly, and no task outlives its request.

Every test runs once per carrier of the script's bytes (``tests/carriers.py``): in
memory, through httpx2, through the direct transport over in-memory connections, and
through the direct transport over loopback TCP. The actor and the client are the same
code on each; only the transport under the seam differs.
"""

from __future__ import annotations

import math

import carriers
import httpx2
import pytest
import trio
import trio.testing
from fakes import (
    Reply,
    ScriptedTransport,
    chat_chunk,
    chat_stream,
    error_reply,
    make_config,
)

from trio_sampler.actor import (
    DuplicateRequestError,
    RequestCancelledError,
    SamplerClosedError,
    open_sampler,
)
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.types import (
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingError,
    SamplingErrorKind,
    SamplingEvent,
    StreamStarted,
    TerminalEvent,
    User,
)

REQUEST = ConversationRequest(items=[User("hello")])


@pytest.fixture(autouse=True, params=carriers.CARRIERS)
def carrier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The carrier of every scripted transport the test makes."""
    monkeypatch.setattr(carriers, "current", request.param)
    return str(request.param)


TERMINALS = (Completed, Failed, Cancelled)


def one_terminal(events: list[SamplingEvent]) -> TerminalEvent:
    terminals = [e for e in events if isinstance(e, TERMINALS)]
    assert len(terminals) == 1, events
    assert events[-1] is terminals[0]
    return terminals[0]


async def drain(stream: object) -> list[SamplingEvent]:
    from trio_sampler.actor import RequestStream

    assert isinstance(stream, RequestStream)
    return [event async for event in stream]


async def test_completes_with_metrics(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("Hel", "lo", pause=0.5))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events = await drain(stream)
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed)
    assert terminal.response.text == "Hello"
    assert isinstance(events[0], StreamStarted)
    metrics = terminal.metrics
    assert metrics is not None
    assert metrics.time_to_first_token_ms == 0.0
    assert metrics.itl_max_ms == pytest.approx(500.0)
    assert metrics.usage is not None and metrics.usage.input_tokens == 10
    assert [a.kind for a in metrics.attempts] == [None]
    assert transport.closed_bodies == 1


async def test_submit_and_collect_returns_response(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("ok"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        response = await sampler.submit_and_collect(REQUEST)
    assert response.text == "ok"


async def test_submit_and_collect_raises_sampling_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([error_reply(400)])
    async with open_sampler(make_config(), transport=transport) as sampler:
        with pytest.raises(SamplingError) as info:
            await sampler.submit_and_collect(REQUEST)
    assert info.value.info.status_code == 400
    assert len(transport.requests) == 1  # 400 is not retried


async def test_cancel_mid_stream_returns_partial(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport(
        [Reply(chunks=[chat_chunk({"content": "partial "}), 10.0, chat_chunk({"content": "x"})])]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []
        async for event in stream:
            events.append(event)
            if isinstance(event, ChannelToken):
                await sampler.cancel(stream.request_id)
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert terminal.partial is not None and terminal.partial.text == "partial "
    assert terminal.reason == "cancelled by the caller"
    assert transport.closed_bodies == 1  # the connection was closed


async def test_cancel_while_waiting_for_headers(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(delay_headers=math.inf)])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        stream.cancel()
        events = await drain(stream)
        assert trio.current_time() == start  # prompt: no virtual time passed
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert terminal.partial is None


async def test_cancel_immediately_after_submit(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("never"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        stream.cancel("changed my mind")  # no checkpoint since submit returned
        events = await drain(stream)
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert terminal.reason == "changed my mind"
    assert transport.closed_bodies == len(transport.requests)


async def test_cancel_before_the_request_task_starts_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request queued behind the concurrency limit is cancelled before it sends anything."""
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    async with open_sampler(make_config(), transport=transport, max_concurrency=1) as sampler:
        first = await sampler.submit(REQUEST)
        second = await sampler.submit(REQUEST)
        await trio.testing.wait_all_tasks_blocked()
        second.cancel()
        events = await drain(second)
        assert isinstance(one_terminal(events), Cancelled)
        assert len(transport.requests) == 1
        first.cancel()
        assert isinstance(one_terminal(await drain(first)), Cancelled)


async def test_cancel_during_backoff(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([error_reply(503)])
    config = make_config(retry=RetryPolicy(base_delay=30.0, max_delay=30.0, jitter=0.0))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []
        async for event in stream:
            events.append(event)
            if isinstance(event, Retrying):
                assert event.delay == 30.0
                start = trio.current_time()
                stream.cancel()
        assert trio.current_time() == start
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert len(transport.requests) == 1


async def test_terminal_produced_before_it_is_read(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("done"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.sleep(1)  # the request finishes while nobody reads
        assert not await sampler.is_active(stream.request_id)
        stream.cancel()  # too late: a no-op
        events = await drain(stream)
    assert isinstance(one_terminal(events), Completed)


async def test_a_consumer_cancelled_while_waiting_reads_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The consumer waits to be handed each batch: a cancel of that wait ends it alone
    # (the request goes on) and the next read gets the next event, nothing lost.
    transport = ScriptedTransport([Reply(chunks=chat_stream("a", "b", pause=10.0))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []
        while not any(isinstance(event, ChannelToken) for event in events):
            events.append(await stream.__anext__())
        with trio.move_on_after(1.0) as waited:
            await stream.__anext__()  # "b" is 10 s away
        assert waited.cancelled_caught
        events += await drain(stream)
    assert [e.text for e in events if isinstance(e, ChannelToken)] == ["a", "b"]
    assert isinstance(one_terminal(events), Completed)


async def test_closing_the_stream_ends_a_consumer_waiting_in_another_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("a", "b", pause=10.0))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []

        async def consume() -> None:
            events.extend(await drain(stream))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.sleep(1.0)  # the consumer has "a" and waits for "b"
            await stream.aclose()
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert [e.text for e in events if isinstance(e, ChannelToken)] == ["a"]


async def test_consumer_leaving_early_cancels(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream(*["tok"] * 50, pause=1.0))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        async with stream:
            async for event in stream:
                if isinstance(event, ChannelToken):
                    break
        await trio.testing.wait_all_tasks_blocked()
        assert await sampler.active_count() == 0
    assert stream.terminal is not None and isinstance(stream.terminal, Cancelled)
    assert stream.terminal.partial is not None and stream.terminal.partial.text == "tok"


async def test_shutdown_cancels_in_flight(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    streams = []
    async with open_sampler(make_config(), transport=transport) as sampler:
        for _ in range(5):
            streams.append(await sampler.submit(REQUEST))
        await trio.testing.wait_all_tasks_blocked()
        assert await sampler.active_count() == 5
    for stream in streams:
        events = await drain(stream)
        terminal = one_terminal(events)
        assert isinstance(terminal, Cancelled)
        assert terminal.reason == "the sampler was shut down"
    with pytest.raises(SamplerClosedError):
        await sampler.submit(REQUEST)


async def test_cancelling_submit_and_collect_cancels_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    async with open_sampler(make_config(), transport=transport) as sampler:
        with trio.move_on_after(5):
            await sampler.submit_and_collect(REQUEST)
        await trio.testing.wait_all_tasks_blocked()
        assert await sampler.active_count() == 0


async def test_result_outcome_for_cancel(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.testing.wait_all_tasks_blocked()
        stream.cancel()
        result = await stream.result()
    with pytest.raises(RequestCancelledError) as info:
        result.unwrap()
    assert info.value.partial is not None and info.value.partial.text == "a"


async def test_duplicate_request_id_rejected(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(delay_headers=math.inf)])
    async with open_sampler(make_config(), transport=transport) as sampler:
        first = await sampler.submit(REQUEST, request_id="same")  # kept: dropping cancels
        with pytest.raises(DuplicateRequestError, match="'same' is already running"):
            await sampler.submit(REQUEST, request_id="same")
        first.cancel()
        # Once the first has ended, its id is free again.
        second = await sampler.submit(REQUEST, request_id="same")
        second.cancel()


async def test_retry_then_success_discards_partial(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport(
        [
            Reply(chunks=[chat_chunk({"content": "lost "})], then="drop"),
            Reply(chunks=chat_stream("kept")),
        ]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "kept"
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert len(retrying) == 1 and retrying[0].discard_partial
    assert retrying[0].kind is SamplingErrorKind.TRANSPORT
    assert terminal.metrics is not None
    assert [a.kind for a in terminal.metrics.attempts] == [SamplingErrorKind.TRANSPORT, None]


async def test_rate_limit_honours_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport(
        [
            error_reply(
                429,
                {"error": {"type": "rate_limit_error", "message": "slow down"}},
                **{"retry-after": "7"},
            ),
            Reply(chunks=chat_stream("ok")),
        ]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        start = trio.current_time()
        events = await drain(await sampler.submit(REQUEST))
        elapsed = trio.current_time() - start
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert retrying[0].delay == 7.0 and not retrying[0].discard_partial
    assert elapsed == pytest.approx(7.0)
    assert isinstance(one_terminal(events), Completed)


async def test_retries_exhausted(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([error_reply(503)])
    config = make_config(retry=RetryPolicy(max_retries=2))
    async with open_sampler(config, transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.status_code == 503
    assert len(transport.requests) == 3
    assert [e.attempt for e in events if isinstance(e, Retrying)] == [1, 2]


async def test_idle_timeout_is_not_reset_by_pings(autojump_clock: trio.testing.MockClock) -> None:
    pings: list[bytes | float] = [b": keep-alive\n\n", 5.0] * 100
    transport = ScriptedTransport(
        [Reply(chunks=[chat_chunk({"content": "a"}), *pings]), Reply(chunks=chat_stream("b"))]
    )
    config = make_config(timeouts=Timeouts(idle=20.0), retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        start = trio.current_time()
        events = await drain(await sampler.submit(REQUEST))
        assert trio.current_time() - start == pytest.approx(20.0)
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed)
    assert terminal.error.kind is SamplingErrorKind.IDLE_TIMEOUT
    assert terminal.partial is not None and terminal.partial.text == "a"


async def test_content_restarts_the_idle_timer_at_each_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each content read restarts the idle timer from its own arrival: tokens 1.5 s apart
    under a 2 s timer never time out, and the silence after the last one fails exactly 2 s
    after it (content at 0, 1.5 and 3 s: the failure at 5 s)."""
    chunks: list[bytes | float] = [
        chat_chunk({"content": "a"}),
        1.5,
        chat_chunk({"content": "b"}),
        1.5,
        chat_chunk({"content": "c"}),
    ]
    transport = ScriptedTransport([Reply(chunks=chunks, then="stall")])
    config = make_config(timeouts=Timeouts(idle=2.0), retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        start = trio.current_time()
        events = await drain(await sampler.submit(REQUEST))
        assert trio.current_time() - start == pytest.approx(5.0)
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.error_code == "idle_timeout"
    assert terminal.partial is not None and terminal.partial.text == "abc"


async def test_first_token_timeout(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=[], then="stall")])
    config = make_config(timeouts=Timeouts(first_token=30.0), retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed)
    assert terminal.error.error_code == "first_token_timeout"


async def test_total_timeout_spans_retries(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([error_reply(503)])
    config = make_config(
        timeouts=Timeouts(total=10.0), retry=RetryPolicy(max_retries=50, base_delay=3, jitter=0)
    )
    async with open_sampler(config, transport=transport) as sampler:
        start = trio.current_time()
        events = await drain(await sampler.submit(REQUEST))
        assert trio.current_time() - start == pytest.approx(10.0)
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.error_code == "total_timeout"


async def test_connect_error_is_transport_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport(
        [Reply(error=httpx2.ConnectError("refused")), Reply(chunks=chat_stream("up"))]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert [e.kind for e in events if isinstance(e, Retrying)] == [SamplingErrorKind.TRANSPORT]
    assert isinstance(one_terminal(events), Completed)


async def test_backpressure_bounds_buffered_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    chunks: list[bytes | float] = [chat_chunk({"content": "x"}) for _ in range(100)]
    transport = ScriptedTransport([Reply(chunks=[*chunks, *chat_stream()])])
    async with open_sampler(make_config(), transport=transport, max_buffered_batches=4) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.testing.wait_all_tasks_blocked()
        # Nobody reads: the request stops reading the body after 4 batches (+ StreamStarted).
        assert len(stream._state.queue) <= 5
        events = await drain(stream)
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "x" * 100


async def test_update_config_applies_to_later_submits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("ok"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        await sampler.submit_and_collect(REQUEST)
        await sampler.update_config(make_config(model="other-model"))
        await sampler.submit_and_collect(REQUEST)
    models = [orjson_loads(r.content)["model"] for r in transport.requests]
    assert models == ["test-model", "other-model"]


async def test_api_key_never_in_events(autojump_clock: trio.testing.MockClock) -> None:
    body = {"error": {"message": "bad key sk-test-SECRET-0123456789"}}
    transport = ScriptedTransport([error_reply(401, body)])
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert "SECRET" not in repr(events)
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.kind is SamplingErrorKind.AUTH


def orjson_loads(data: bytes) -> dict[str, object]:
    import orjson

    value = orjson.loads(data)
    assert isinstance(value, dict)
    return value


async def test_errors_in_the_block_surface_unwrapped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Regression: a nursery inside ``open_sampler`` wrapped the caller's own exception
    in an ExceptionGroup."""
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    with pytest.raises(KeyError, match="mine"):
        async with open_sampler(make_config(), transport=transport) as sampler:
            stream = await sampler.submit(REQUEST)
            raise KeyError("mine")
    events = await drain(stream)
    assert isinstance(one_terminal(events), Cancelled)


async def test_outer_cancel_while_inside_the_block(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    with trio.move_on_after(3) as scope:
        async with open_sampler(make_config(), transport=transport) as sampler:
            stream = await sampler.submit(REQUEST)
            await trio.sleep_forever()
    assert scope.cancelled_caught
    terminal = one_terminal(await drain(stream))
    assert isinstance(terminal, Cancelled) and terminal.reason == "the sampler was shut down"


async def test_total_timeout_covers_the_wait_for_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Regression: a request queued behind ``max_concurrency`` waited outside its total
    timeout (``total=5`` failed after 999.9 s)."""
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    config = make_config(timeouts=Timeouts(total=5.0), retry=RetryPolicy(max_retries=0))
    async with open_sampler(make_config(), transport=transport, max_concurrency=1) as sampler:
        first = await sampler.submit(REQUEST)  # holds the only slot, forever
        start = trio.current_time()
        events = await drain(await sampler.submit(REQUEST, config=config))
        assert trio.current_time() - start == pytest.approx(5.0)
        first.cancel()
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.error_code == "total_timeout"
    assert len(transport.requests) == 1  # the second never reached the server


async def test_total_timeout_covers_a_consumer_that_stops_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    chunks: list[bytes | float] = [chat_chunk({"content": "x"}) for _ in range(50)]
    transport = ScriptedTransport([Reply(chunks=[*chunks, *chat_stream()])])
    config = make_config(timeouts=Timeouts(total=5.0))
    async with open_sampler(config, transport=transport, max_buffered_batches=2) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.sleep(6)  # nobody reads; the request is stuck on backpressure
        terminal = stream.terminal
        assert isinstance(terminal, Failed) and terminal.error.error_code == "total_timeout"
        assert terminal.partial is not None and terminal.partial.text.startswith("x")
        assert not await sampler.is_active(stream.request_id)


async def test_a_consumer_stalled_past_the_idle_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The idle timer does not fire while the request waits for a consumer that stopped
    reading; past its deadline, the next read takes what is already buffered and fails
    only if it has to wait for the server (which of the two depends on the carrier's
    buffering), and then as the idle timeout."""
    chunks: list[bytes | float] = [chat_chunk({"content": "x"}) for _ in range(50)]
    transport = ScriptedTransport([Reply(chunks=[*chunks, *chat_stream()])])
    config = make_config(timeouts=Timeouts(idle=2.0), retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport, max_buffered_batches=2) as sampler:
        stream = await sampler.submit(REQUEST)
        await trio.sleep(10)  # nobody reads for five idle timeouts
        assert stream.terminal is None  # not failed during the wait
        events = await drain(stream)
    terminal = one_terminal(events)
    if isinstance(terminal, Completed):
        assert terminal.response.text == "x" * 50
    else:
        assert isinstance(terminal, Failed) and terminal.error.error_code == "idle_timeout"
        assert terminal.partial is not None and terminal.partial.text.startswith("x")


async def test_cancel_before_an_unread_retry_keeps_the_seen_partial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Regression: ``Cancelled.partial`` was ``None`` although the consumer had been shown
    the attempt's tokens (the attempt's output was dropped before its ``Retrying`` could be
    handed over)."""
    transport = ScriptedTransport(
        [
            Reply(chunks=[chat_chunk({"content": "seen"})], then="drop"),
            Reply(chunks=chat_stream("second")),
        ]
    )
    async with open_sampler(make_config(), transport=transport, max_buffered_batches=1) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []
        async for event in stream:
            events.append(event)
            if isinstance(event, ChannelToken):
                await trio.testing.wait_all_tasks_blocked()  # the Retrying is ready
                stream.cancel()
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    assert not any(isinstance(e, Retrying) for e in events)
    assert terminal.partial is not None and terminal.partial.text == "seen"


async def test_cancel_after_a_read_retry_has_the_new_attempts_partial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport(
        [
            Reply(chunks=[chat_chunk({"content": "lost"})], then="drop"),
            Reply(chunks=[chat_chunk({"content": "new"})], then="stall"),
        ]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        events: list[SamplingEvent] = []
        async for event in stream:
            events.append(event)
            if isinstance(event, Retrying):
                await trio.sleep(5)  # past the backoff: the second attempt's text arrives
                stream.cancel()
    terminal = one_terminal(events)
    assert isinstance(terminal, Cancelled)
    # The consumer was told to drop "lost"; the second attempt's "new" had arrived unread.
    assert terminal.partial is not None and terminal.partial.text == "new"
