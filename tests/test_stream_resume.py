"""Stream resume on Responses background mode, end to end against the emulator.

A 2,000-delta answer is cut at a random event: the request reads it on from the last
event it delivered (``GET /v1/responses/{id}?stream=true&starting_after=N``), announced
by ``Resumed`` (never a discarding ``Retrying``), with no event twice and none missing
(checked by sequence numbers), the final text byte-identical to an uninterrupted run, and
the emulator's record showing the answer generated once. A cursor the server no longer
has falls back to the visible discard-and-retry; a cancelled request is cancelled on the
server too.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_sampler import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplerConfig,
    SamplingEvent,
    User,
    open_sampler,
)
from trio_sampler._http._httpx import HttpxTransport
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, PromptCache, script_headers
from trio_sampler.testing import EmulatorFixture, EmulatorTransport
from trio_sampler.types import Resumed, SamplingErrorKind
from trio_sampler.wire.responses import ResponsesTransform

#: 2,000 deltas of 5 characters each.
TEXT = "".join(f"{i:04d} " for i in range(2000))
#: The stream's first delta is its event 4 (created, in_progress, item added, part added).
FIRST_DELTA = 4

CONFIG = SamplerConfig(
    base_url="http://emulator/v1",
    backend=ApiBackend.RESPONSES,
    model="emulator-1",
    api_key="sk-emulator-test",
    retry=RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.01, jitter=0.0),
    timeouts=Timeouts(first_token=5.0, idle=5.0, response_headers=5.0),
)


def _request(
    scenario: str, *, drop_after: int | None, background: bool = True
) -> ConversationRequest:
    faults: list[dict[str, Any]] = []
    if drop_after is not None:
        faults.append({"type": "drop", "after_events": drop_after, "times": 1})
    headers = script_headers(text=TEXT, chunk_chars=5, scenario=scenario, faults=faults)
    return ConversationRequest([User("count")], extra_headers=headers, background=background)


async def _run(app: EmulatorApp, request: ConversationRequest) -> list[SamplingEvent]:
    events: list[SamplingEvent] = []
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(CONFIG, transport=transport) as sampler,
    ):
        stream = await sampler.submit(request)
        async for event in stream:
            events.append(event)
    return events


def _text(events: list[SamplingEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ChannelToken))


async def test_a_cut_background_stream_resumes_without_duplicate_or_gap() -> None:
    app = EmulatorApp(cache=PromptCache())
    whole = await _run(app, _request("whole", drop_after=None))
    assert isinstance(whole[-1], Completed)
    assert whole[-1].response.text == TEXT
    rng = random.Random(35)
    for n in range(20):
        drop_after = rng.randrange(FIRST_DELTA + 1, FIRST_DELTA + 2000)
        events = await _run(app, _request(f"drop-{n}", drop_after=drop_after))
        terminal = events[-1]
        assert isinstance(terminal, Completed), terminal
        resumed = [e for e in events if isinstance(e, Resumed)]
        assert [e.after_sequence for e in resumed] == [drop_after - 1]
        assert not any(isinstance(e, Retrying) for e in events)
        # What the consumer saw, and the response, byte for byte the uninterrupted run's.
        assert _text(events) == TEXT
        assert terminal.response.text.encode() == whole[-1].response.text.encode()
        # The server generated the answer once, and was asked for it once more.
        posts = app.requests(f"drop-{n}")
        assert len(posts) == 1
        record = app.background.records[resumed[0].response_id]
        assert (record.generations, record.retrievals, record.generated_deltas) == (1, 1, 2000)


async def test_an_expired_cursor_falls_back_to_a_visible_discard_and_retry() -> None:
    app = EmulatorApp(cache=PromptCache())
    app.background.ttl_s = 0.0  # nothing is kept long enough to be read on
    events = await _run(app, _request("expired", drop_after=900))
    terminal = events[-1]
    assert isinstance(terminal, Completed), terminal
    assert terminal.response.text == TEXT
    assert not any(isinstance(e, Resumed) for e in events)
    retries = [e for e in events if isinstance(e, Retrying)]
    assert len(retries) == 1 and retries[0].discard_partial
    assert len(app.requests("expired")) == 2  # started over: generated again


async def test_a_foreground_request_is_retried_as_before() -> None:
    app = EmulatorApp(cache=PromptCache())
    events = await _run(app, _request("foreground", drop_after=900, background=False))
    assert isinstance(events[-1], Completed)
    assert not any(isinstance(e, Resumed) for e in events)
    retries = [e for e in events if isinstance(e, Retrying)]
    assert len(retries) == 1 and retries[0].discard_partial


async def test_a_cancelled_background_request_is_cancelled_on_the_server() -> None:
    app = EmulatorApp(cache=PromptCache())
    headers = script_headers(text=TEXT, chunk_chars=5, delay_ms=1, scenario="cancel")
    request = ConversationRequest([User("count")], extra_headers=headers, background=True)
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(CONFIG, transport=transport) as sampler,
    ):
        stream = await sampler.submit(request)
        async for event in stream:
            if isinstance(event, ChannelToken):
                stream.cancel()
            if isinstance(event, Cancelled):
                break
    (record,) = app.background.records.values()
    assert record.cancelled


def _delta(sequence: int, text: str) -> tuple[str, bytes]:
    payload = (
        '{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,'
        f'"content_index":0,"delta":"{text}","sequence_number":{sequence}}}'
    )
    return ("response.output_text.delta", payload.encode())


def test_the_transform_skips_replayed_events_and_counts_gaps() -> None:
    transform = ResponsesTransform("r")
    fed = transform.feed_payloads([_delta(n, f"{n} ") for n in range(5)])
    assert transform.last_sequence == 4
    again = transform.feed_payloads([_delta(n, f"{n} ") for n in range(3, 7)])
    assert transform.replayed_events == 2
    assert transform.sequence_gaps == 0
    assert _text(fed + again) == "0 1 2 3 4 5 6 "
    transform.feed_payloads([_delta(9, "9 ")])
    assert transform.sequence_gaps == 1


@pytest.mark.parametrize("via", ["direct", "httpx"])
async def test_a_cut_resumes_over_loopback_http(emulator: EmulatorFixture, via: str) -> None:
    config = attrs.evolve(CONFIG, base_url=emulator.base_url)
    transport = HttpxTransport.for_config(config) if via == "httpx" else None
    headers = emulator.script(
        text=TEXT,
        chunk_chars=5,
        scenario=f"loopback-{via}",
        faults=[{"type": "drop", "after_events": 1500, "times": 1}],
    )
    request = ConversationRequest([User("count")], extra_headers=headers, background=True)
    events: list[SamplingEvent] = []
    try:
        with trio.fail_after(30):
            async with open_sampler(config, transport=transport) as sampler:
                async for event in await sampler.submit(request):
                    events.append(event)
    finally:
        if transport is not None:
            await transport.aclose()
    assert isinstance(events[-1], Completed), events[-1]
    assert [e.after_sequence for e in events if isinstance(e, Resumed)] == [1499]
    assert _text(events) == TEXT
    assert len(emulator.requests(f"loopback-{via}")) == 1


async def test_a_stalled_background_stream_resumes_at_its_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = EmulatorApp(cache=PromptCache())
    headers = script_headers(
        text=TEXT,
        chunk_chars=5,
        scenario="stall",
        faults=[{"type": "stall", "after_events": 600, "seconds": 3600, "times": 1}],
    )
    request = ConversationRequest([User("count")], extra_headers=headers, background=True)
    events = await _run(app, request)
    assert isinstance(events[-1], Completed), events[-1]
    (resumed,) = [e for e in events if isinstance(e, Resumed)]
    assert (resumed.after_sequence, resumed.kind) == (599, SamplingErrorKind.IDLE_TIMEOUT)
    assert _text(events) == TEXT
    assert not any(isinstance(e, Retrying) for e in events)


async def test_a_cut_before_any_event_is_not_sent_again_there_is_nothing_to_resume() -> None:
    # No response id has arrived, so there is nothing to resume; and the server may be
    # running the background response already, so a second send could start (and bill)
    # a second one. The request ends, saying why it was not retried.
    app = EmulatorApp(cache=PromptCache())
    events = await _run(app, _request("nothing-yet", drop_after=0))
    end = events[-1]
    assert isinstance(end, Failed) and end.error.kind is SamplingErrorKind.TRANSPORT
    assert "not retried: the request keeps state on the server" in end.error.message
    assert not any(isinstance(e, Resumed | Retrying) for e in events)
    assert len(app.requests("nothing-yet")) == 1
