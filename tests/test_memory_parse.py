"""The sampler's memory account while a read's tool arguments are parsed.

One read of JSON text can make far more memory than it brings once parsed: 64 KiB of
``[{},{},...]`` makes about 1.5 MB of values and 5.5 MB of changes. The account is told
of what the parse has made every ``GUARD_SLICE`` characters (``PartialOutputs.parse``
stops there), so a stream is stopped within the read that would take it over the cap,
with the same typed ``Failed`` as any other, and not one whole read later.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pydantic
import pytest
import trio
import trio.testing
from fakes import DONE, Reply, ScriptedTransport, chat_chunk, chat_usage, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.actor._memory import STREAM_OVERHEAD, ResponseMemory
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    Failed,
    JSONChangeKind,
    OutputDelta,
    Retrying,
    SamplingErrorKind,
    SamplingEvent,
    ToolArgumentsDelta,
    ToolCallDelta,
    ToolSpec,
    User,
)
from trio_sampler.wire import PartialOutputs, new_transform
from trio_sampler.wire._partial_output import CHANGE_BYTES, GUARD_SLICE


class Point(pydantic.BaseModel):
    x: int
    y: int = 0


#: At most what one character makes once parsed, values and changes (``[{},...]``: about
#: 115 bytes), with room for the estimate's rounding.
_MOST_PER_CHARACTER = 128

#: Shapes whose text grows once parsed, as ``(opening, item, closing)``: the items repeat
#: (``{n}``: the item's number, for keys that differ).
_SHAPES = {
    "empty objects": ("[", "{},", "{}]"),
    "empty arrays": ("[", "[],", "[]]"),
    "zeros": ("[", "0,", "0]"),
    "members": ("{", '"{n}":{},', '"z":{}}'),
    "long string": ('{"s":"', r"ab\n\"\u00e9", '"}'),
}


def _document(shape: str, items: int) -> str:
    opening, item, closing = _SHAPES[shape]
    if "{n}" in item:
        return opening + "".join(item.replace("{n}", str(n)) for n in range(items)) + closing
    return opening + item * items + closing


def _call(arguments: str) -> ToolCallDelta:
    return ToolCallDelta("r", 0, "call_1", "f", arguments)


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_a_parse_stops_every_slice_with_what_it_made_counted(shape: str) -> None:
    """Between two stops the parse reads one slice: what it made there (values, and the
    changes not yet handed on) is in ``buffered_bytes`` at the next stop, and bounded."""
    text = _document(shape, 20_000)
    partials = PartialOutputs("r", None)
    parse = partials.parse([_call(text)])
    counted = [partials.buffered_bytes]
    try:
        while True:
            next(parse)
            counted.append(partials.buffered_bytes)
    except StopIteration as end:
        out: list[SamplingEvent] = end.value
    assert len(counted) - 1 == (len(text) - 1) // GUARD_SLICE  # a stop before each slice
    steps = [after - before for before, after in itertools.pairwise(counted)]
    assert max(steps) <= GUARD_SLICE * _MOST_PER_CHARACTER, (shape, max(steps))
    # Handed on, the changes are the batch's (``delta_bytes``), no longer the parse's.
    [delta] = [event for event in out if isinstance(event, ToolArgumentsDelta)]
    assert partials.delta_bytes == len(delta.changes) * CHANGE_BYTES
    assert partials.buffered_bytes < counted[-1] + GUARD_SLICE * _MOST_PER_CHARACTER
    assert partials.arguments(0) == json.loads(text)


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_a_parse_read_in_slices_makes_the_value_a_whole_read_makes(shape: str) -> None:
    """The slices change how the text is cut, not what it reads: the same value, and
    changes that rebuild it (every value placed, every container closed)."""
    text = _document(shape, 5_000)
    sliced, whole = PartialOutputs("r", None), PartialOutputs("r", None)
    out = sliced.batch([_call(text)])  # more than a slice: read in slices
    [delta] = [event for event in out if isinstance(event, ToolArgumentsDelta)]
    assert whole.batch([_call(text[:100]), _call(text[100:])]) != []
    assert sliced.arguments(0) == whole.arguments(0) == json.loads(text)
    closed = [change for change in delta.changes if change.kind is JSONChangeKind.CLOSE]
    assert closed[-1].path == () and closed[-1].value == json.loads(text)


def test_a_small_batch_is_read_without_a_stop() -> None:
    """The usual batch (a read of a few fragments) is read at once: no stop, no look at
    the account beyond the one before its read."""
    partials = PartialOutputs("r", None)
    events: list[SamplingEvent] = [_call('{"city": "Paris", '), _call('"days": [1, 2]}')]
    parse = partials.parse(events)
    with pytest.raises(StopIteration) as end:
        next(parse)
    assert [type(e) for e in end.value.value] == [ToolCallDelta, ToolCallDelta, ToolArgumentsDelta]
    assert partials.arguments(0) == {"city": "Paris", "days": [1, 2]}


def _tool_stream(arguments: str) -> list[bytes | float]:
    """A tool call whose ``arguments`` arrive in one read (4 KiB an event), then its end."""
    opening = {"index": 0, "id": "call_1", "type": "function"}
    first: dict[str, object] = {
        "tool_calls": [{**opening, "function": {"name": "f", "arguments": ""}}]
    }
    pieces = [arguments[i : i + 4096] for i in range(0, len(arguments), 4096)]
    read = b"".join(
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        for piece in pieces
    )
    return [chat_chunk(first), read, chat_chunk({}, "tool_calls"), chat_usage(), DONE]


async def _run(arguments: str, cap: int) -> tuple[list[SamplingEvent], ResponseMemory, Any]:
    transport = ScriptedTransport([Reply(chunks=_tool_stream(arguments))])
    request = ConversationRequest(items=[User("hi")], tools=(ToolSpec(name="f"),))
    async with open_sampler(
        make_config(), transport=transport, max_buffered_response_bytes=cap
    ) as sampler:
        stream = await sampler.submit(request)
        memory = sampler._actor.runner._memory
        assert memory is not None
        events = [event async for event in stream]
        return events, memory, stream.partial_arguments(0)


@pytest.mark.parametrize("shape", ["empty objects", "empty arrays", "zeros", "members"])
async def test_a_read_that_parses_past_the_cap_is_stopped_within_it(
    shape: str, autojump_clock: trio.testing.MockClock
) -> None:
    """64 KiB of text in one read makes megabytes once parsed: under a 1 MiB cap the
    stream ends in the memory's ``Failed`` partway through that read, the account never
    past the cap by more than one slice's values and changes (and the read itself, eight
    copies counted)."""
    text = _document(shape, 64 * 1024 // len(_SHAPES[shape][1]))
    cap = 1024 * 1024
    events, memory, partial = await _run(text, cap)
    terminal = events[-1]
    assert isinstance(terminal, Failed), terminal
    assert terminal.error.error_code == "sampler_memory_cap"
    assert not terminal.error.retryable
    # Stopped partway: the parsed value holds part of what the read brought.
    read = json.loads(text)
    assert len(partial) < len(read) // 2
    slice_bytes = GUARD_SLICE * _MOST_PER_CHARACTER
    assert memory.peak <= cap + slice_bytes + 8 * len(text), memory.peak - cap


async def test_tool_arguments_under_the_cap_stream_as_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Under a cap with room for them, the same arguments complete: the deltas carry
    every change a reader without an account makes, in order, and the whole value."""
    text = _document("members", 3_000)
    events, _, partial = await _run(text, 64 * 1024 * 1024)
    assert events[-1].__class__.__name__ == "Completed"
    deltas = [e for e in events if isinstance(e, ToolArgumentsDelta)]
    sent = "".join(e.arguments_delta for e in events if isinstance(e, ToolCallDelta))
    assert sent == text and partial == json.loads(text)
    unguarded = PartialOutputs("r", None)
    out = unguarded.batch([_call(text)])
    [expected] = [e for e in out if isinstance(e, ToolArgumentsDelta)]
    changes = [change for delta in deltas for change in delta.changes]
    assert changes == list(expected.changes)


async def test_the_others_wait_while_a_stopped_stream_has_not_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream stopped still holds its memory until it ends: the memory counts it as
    unwinding, is short while that does not fit beside the rest, and a stream asking for
    room waits until it has ended (then goes on, not stopped)."""
    memory = ResponseMemory(3 * STREAM_OVERHEAD)  # what a report counts at least: its own
    transforms = [new_transform(ApiBackend.CHAT_COMPLETIONS, f"r{n}") for n in range(2)]
    large, small = (memory.hold(transform) for transform in transforms)
    memory.update(large, 2 * STREAM_OVERHEAD)
    memory.update(small, STREAM_OVERHEAD + 1000)  # past the limit: the largest is stopped
    assert large.stopped and not small.stopped
    assert memory.unwinding == 2 * STREAM_OVERHEAD
    assert memory.total == STREAM_OVERHEAD + 1000 and memory.short and small.short
    waited = trio.Event()

    async def ask() -> None:
        await small.room()
        waited.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        assert not waited.is_set()  # the stopped stream holds its memory yet
        large.release()  # it has ended
        await waited.wait()
    assert (memory.unwinding, memory.short, small.stopped) == (0, False, False)
    assert memory.total == STREAM_OVERHEAD + small._transform.held_bytes  # reported again
    small.release()
    assert memory.total == 0


def test_a_stopped_stream_that_fits_beside_the_others_lets_them_go_on() -> None:
    """Unwinding alone is not short: only when it does not fit beside what the others
    hold (a small stream stopped among large ones leaves room)."""
    memory = ResponseMemory(100)
    holdings = [memory.hold(new_transform(ApiBackend.CHAT_COMPLETIONS, f"r{n}")) for n in range(3)]
    first, second, third = holdings
    memory.update(first, 45)
    memory.update(second, 10)
    memory.update(third, 50)  # 105: the third (largest) is stopped
    assert third.stopped and memory.unwinding == 50 and memory.total == 55
    shortness = [memory.short]  # 55 + 50 > 100
    memory.update(second, 5)
    shortness.append(memory.short)  # 50 + 50: it fits
    assert shortness == [True, False]
    third.release()
    third.release()  # a second release counts nothing twice
    assert memory.unwinding == 0 and memory.total == 50


def test_a_retry_in_a_batch_forgets_the_answer_call_where_it_stands() -> None:
    """A batch's runs are found first, then read: a ``Retrying`` that discards the attempt
    starts the readers over where it stands, and the forced answer call is forgotten
    there too, so a call after it is read as what it is in the new attempt."""
    request = ConversationRequest([User("x")], output=Point, tools=[ToolSpec("f")])
    partials = PartialOutputs.for_request("r", request)
    assert partials is not None and partials.structured is not None
    name = partials.structured.schema.name
    retry = Retrying("r", 1, 2, SamplingErrorKind.TRANSPORT, "cut", 0.0, discard_partial=True)
    partials.batch(
        [
            ToolCallDelta("r", 0, "call_1", name, '{"x": 1'),  # the answer, forced
            retry,
            ToolCallDelta("r", 0, "call_2", "f", '{"city": "Paris"}'),  # now a plain call
        ]
    )
    assert partials.output() is None
    assert partials.arguments(0) == {"city": "Paris"}
    out = partials.batch(
        [retry, ToolCallDelta("r", 0, "call_3", name, '{"x": 2, "y": 3}')]  # forced again
    )
    assert partials.output() == {"x": 2, "y": 3} and partials.arguments(0) is None
    assert any(isinstance(event, OutputDelta) for event in out)
