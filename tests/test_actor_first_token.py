"""The first token of a read that holds a whole answer reaches the consumer first.

A fast server (or a cached answer) can put hundreds of events in one network read. The
consumer gets the first content event before the request has parsed the rest of that
read, and the events it sees are exactly those of the same body read in small pieces.
"""

from __future__ import annotations

import trio
from fakes import DONE, Reply, ScriptedTransport, chat_chunk, chat_usage, make_config

from trio_sampler import ChannelToken, Completed, ConversationRequest, User, open_sampler
from trio_sampler.actor import RequestStream
from trio_sampler.config import RetryPolicy
from trio_sampler.types import SamplingEvent

PIECES = [f"w{i:03d} " for i in range(300)]


def body() -> bytes:
    """A role chunk, 300 text deltas, the finish, usage and ``[DONE]``: about 40 KB."""
    parts = [chat_chunk({"role": "assistant", "content": ""})]
    parts += [chat_chunk({"content": piece}) for piece in PIECES]
    parts += [chat_chunk({}, "stop"), chat_usage(completion=len(PIECES)), DONE]
    return b"".join(parts)


def parsed_text_chunks(stream: RequestStream) -> int:
    """Text deltas the request has parsed so far (its attempt's accumulation)."""
    transform = stream._state.transform
    return -1 if transform is None else transform.acc.text_chunks


async def run(chunks: list[bytes]) -> tuple[list[SamplingEvent], int]:
    """All events of one request over ``chunks``, and how many text deltas the request
    had parsed when the consumer held the first token."""
    transport = ScriptedTransport([Reply(chunks=chunks)])
    config = make_config(retry=RetryPolicy(max_retries=0))
    events: list[SamplingEvent] = []
    parsed_at_first = -1
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("go")]))
        async with stream:
            async for event in stream:
                if type(event) is ChannelToken and parsed_at_first < 0:
                    parsed_at_first = parsed_text_chunks(stream)
                events.append(event)
    return events, parsed_at_first


def shape(events: list[SamplingEvent]) -> list[tuple[str, str]]:
    """What the consumer sees, without timings and ids."""
    out = []
    for event in events:
        if isinstance(event, ChannelToken):
            out.append(("token", event.text))
        elif isinstance(event, Completed):
            out.append(("completed", event.response.text))
        else:
            out.append((type(event).__name__, ""))
    return out


async def test_first_token_is_handed_over_before_the_rest_of_the_read_is_parsed() -> None:
    whole = body()
    assert len(whole) > 30_000
    events, parsed_at_first = await run([whole])
    tokens = [e.text for e in events if isinstance(e, ChannelToken)]
    assert tokens == PIECES
    assert isinstance(events[-1], Completed)
    assert events[-1].response.text == "".join(PIECES)
    # The consumer held the first token while most of the read was still unparsed.
    assert 1 <= parsed_at_first < len(PIECES) // 4


async def test_the_events_are_those_of_the_body_read_in_small_pieces() -> None:
    whole = body()
    at_once, _ = await run([whole])
    for size in (1, 97, 4095, 4096, 4097, 10_000):
        pieces = [whole[i : i + size] for i in range(0, len(whole), size)]
        in_pieces, _ = await run(pieces)
        assert shape(in_pieces) == shape(at_once), size


async def test_a_consumer_that_does_not_read_does_not_hold_the_request_up() -> None:
    """The hand-over yields a bounded number of times: with a consumer busy elsewhere,
    the request still reads its whole body."""
    transport = ScriptedTransport([Reply(chunks=[body()])])
    config = make_config(retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport, max_buffered_batches=64) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("go")]))
        async with stream:
            with trio.fail_after(5):
                await stream._state.done.wait()
            assert isinstance(stream.terminal, Completed)
            assert stream.terminal.response.text == "".join(PIECES)
