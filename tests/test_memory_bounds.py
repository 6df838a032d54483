"""Memory per hostile stream, and across streams, measured where it can be: in a child process.

Each case runs a hand-written loopback server and a sampler in a fresh interpreter and
reports the growth of its peak resident set (``VmHWM``, reset before the stream) over the
stream. One stream may hold about 1 × ``max_response_bytes`` (its text grows in place and
the partial shares it, never joined into a second copy; a compressed body is inflated a
step at a time); 20 hostile streams at once stay within the sampler-wide
``max_buffered_response_bytes``, the largest failing first.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
import trio

from trio_sampler.actor import _gates, _memory, open_sampler
from trio_sampler.actor._memory import STREAM_OVERHEAD, ResponseMemory, response_bytes
from trio_sampler.config import SamplerConfig
from trio_sampler.emulator import EmulatorApp, script_headers
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import (
    ApiBackend,
    Assistant,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    Reasoning,
    Retrying,
    SamplingEvent,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    User,
)
from trio_sampler.wire import PartialOutputs, ResponseFold, collect, new_transform
from trio_sampler.wire._accumulate import StreamAccumulator
from trio_sampler.wire._partial_output import CHANGE_BYTES

_MIB = 1024 * 1024

_CHILD = r"""
import functools, json, sys, zlib
import orjson, trio
from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.types import ConversationRequest, Failed, User

case, limit, streams, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

def event(delta):
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"

DELTA = 4096
TEXT = event({"content": "x" * DELTA})
WIDE = event({"content": "\U0001f600"})
TOOL_OPEN = event({"tool_calls": [
    {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
]})
TOOL = event({"tool_calls": [{"index": 0, "function": {"arguments": "a" * DELTA}}]})
# Each fragment a whole object: the arguments always begin and end like one JSON text.
WHOLE = json.dumps({"a": "o" * DELTA})
OBJECTS = event({"tool_calls": [{"index": 0, "function": {"arguments": WHOLE}}]})
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"

async def handler(stream):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        if case == "gzip-bomb":
            # After a full flush a deflate block stands alone: the same one, sent forever.
            squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
            first = squeeze.compress(TEXT * 256) + squeeze.flush(zlib.Z_FULL_FLUSH)
            block = squeeze.compress(TEXT * 256) + squeeze.flush(zlib.Z_FULL_FLUSH)
            await stream.send_all(HEAD + b"content-encoding: gzip\r\n\r\n" + first)
            while True:
                await stream.send_all(block * 4)
        await stream.send_all(HEAD + b"\r\n")
        if case == "endless-event":
            # One event that never ends: it grows in the SSE decoder, not in the fold.
            await stream.send_all(b"data: ")
            while True:
                await stream.send_all(b"x" * 65536)
        if case.startswith("endless-tool"):
            await stream.send_all(TOOL_OPEN)
        pieces = {"endless-tool-arguments": TOOL, "endless-tool-objects": OBJECTS}
        piece = pieces.get(case, TEXT) * 16
        sent = 0
        while True:
            if case == "widening" and sent > limit // 2:
                await stream.send_all(WIDE)  # every character held at 4 bytes: refused
            await stream.send_all(piece)
            sent += len(piece)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()

async def main():
    async with trio.open_nursery() as nursery:
        serving = functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        listeners = await nursery.start(serving)
        port = listeners[0].socket.getsockname()[1]
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key="sk-memory-test-0000",
            max_response_bytes=limit, timeouts=Timeouts(first_token=60, idle=60),
            retry=RetryPolicy(max_retries=0),
        )
        request = ConversationRequest(items=[User("hi")])
        codes = []
        async with open_sampler(config, max_buffered_response_bytes=cap or None) as sampler:
            async def one():
                stream = await sampler.submit(request)
                async for event in stream:
                    if isinstance(event, Failed):
                        codes.append(event.error.error_code or event.error.kind.value)
            # Warm up (imports, the first connection), then measure from here.
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # resets VmHWM to the current resident set
            before = status("VmRSS:")
            async with trio.open_nursery() as inner:
                for _ in range(streams):
                    inner.start_soon(one)
            growth = status("VmHWM:") - before
            memory = sampler._actor.runner._memory
            peak_total = memory.peak if memory is not None else 0
        print(json.dumps({"growth": growth, "codes": codes, "peak_total": peak_total}))
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def _run_child(case: str, limit: int, streams: int = 1, cap: int = 0) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, case, str(limit), str(streams), str(cap)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result: dict[str, object] = orjson.loads(done.stdout.splitlines()[-1])
    return result


LIMIT = 64 * _MIB


@pytest.mark.parametrize(
    ("case", "code"),
    [
        # The body is over max_response_bytes before the text is (the framing counts too).
        ("endless-delta", "response_too_large"),
        ("endless-tool-arguments", "response_too_large"),
        ("endless-tool-objects", "response_too_large"),
        ("gzip-bomb", "response_too_large"),
        # Half the limit of ASCII, then one emoji: all of it at 4 bytes is refused.
        ("widening", "response_too_large"),
    ],
)
def test_one_hostile_stream_holds_at_most_its_response_bytes(case: str, code: str) -> None:
    result = _run_child(case, LIMIT)
    assert result["codes"] == [code], result
    growth = int(str(result["growth"]))
    assert growth <= 1.1 * LIMIT, f"{case}: peak grew {growth / LIMIT:.2f} x max_response_bytes"


def test_twenty_hostile_streams_stay_within_the_sampler_cap() -> None:
    cap = 48 * _MIB
    result = _run_child("endless-delta", 32 * _MIB, streams=20, cap=cap)
    codes = result["codes"]
    assert isinstance(codes, list) and len(codes) == 20
    assert "sampler_memory_cap" in codes, codes
    # What the sampler counted never passed the cap by more than one read per stream.
    assert int(str(result["peak_total"])) <= cap + 20 * 256 * 1024, result
    growth = int(str(result["growth"]))
    assert growth <= 1.1 * cap + 20 * _MIB, f"20 streams: peak grew {growth / _MIB:.0f} MiB"


def test_endless_events_count_against_the_sampler_cap() -> None:
    """An event that never ends grows in each stream's SSE decoder (up to
    ``max_sse_event_bytes``, 16 MiB): those buffers count against the sampler's cap like
    text does. Regression: uncounted, 20 such streams held 364 MiB under a 32 MiB cap."""
    cap = 32 * _MIB
    result = _run_child("endless-event", 64 * _MIB, streams=20, cap=cap)
    codes = result["codes"]
    assert isinstance(codes, list) and len(codes) == 20
    assert "sampler_memory_cap" in codes, codes
    assert int(str(result["peak_total"])) <= cap + 20 * 256 * 1024, result


# -- in process: the bookkeeping ------------------------------------------------------


def _accumulator(limit: int | None = None) -> StreamAccumulator:
    acc = StreamAccumulator("r", ApiBackend.CHAT_COMPLETIONS)
    if limit is not None:
        acc.fold.max_held_bytes = limit
    return acc


def test_text_grows_in_place_and_is_shared_with_the_response() -> None:
    acc = _accumulator()
    out: list[SamplingEvent] = []
    for _ in range(1000):
        acc.text("y" * 100, out)
    acc.complete(out)
    end = out[-1]
    assert isinstance(end, Completed) and end.response.text == "y" * 100_000
    assert acc.held_bytes == 100_000
    # The response's text is the accumulated string itself, not a copy of it.
    assert end.response.assistant.content is acc.build_response().assistant.content


def test_the_fold_of_the_events_holds_its_text_once_too() -> None:
    acc = _accumulator()
    out: list[SamplingEvent] = []
    for i in range(500):
        acc.text("é" if i == 250 else "z" * 10, out)
    for piece in ('{"a"', ": 1}"):
        acc.tool_arguments("t", piece, out)
    acc.complete(out)
    fold = ResponseFold()
    for event in out:
        fold.add(event)
    built = fold.build()
    assert built.text == "z" * 2500 + "é" + "z" * 2490
    assert built.assistant.content is fold.build().assistant.content
    assert built.assistant.tool_calls[0].arguments == '{"a": 1}'
    assert collect(out) == built
    end = out[-1]
    assert isinstance(end, Completed) and end.response == built


def test_holding_more_than_the_limit_fails_the_stream_before_growing() -> None:
    acc = _accumulator(limit=10_000)
    out: list[SamplingEvent] = []
    for _ in range(60):
        acc.text("a" * 100, out)
    # One wide character would make all of it 4 bytes per character: refused before.
    acc.text("\U0001f600", out)
    assert acc.finished
    terminal = out[-1]
    assert isinstance(terminal, Failed)
    assert terminal.error.error_code == "response_too_large" and not terminal.error.retryable
    assert "max_response_bytes (10000 bytes)" in terminal.error.message
    assert terminal.partial is not None and terminal.partial.text == "a" * 6000
    # The refused delta was never emitted: the events fold to the same partial.
    assert not any(isinstance(e, ChannelToken) and e.text == "\U0001f600" for e in out)
    assert collect(out).text == "a" * 6000
    assert acc.held_bytes <= 10_000


@pytest.mark.parametrize("channel", ["text", "reasoning", "tool", "refusal"])
def test_every_kind_of_text_counts_against_the_limit(channel: str) -> None:
    acc = _accumulator(limit=40_000)
    out: list[SamplingEvent] = []
    for _ in range(100):
        if channel == "text":
            acc.text("b" * 1000, out)
        elif channel == "reasoning":
            acc.reasoning("r", "b" * 1000, out)
        elif channel == "tool":
            acc.tool_arguments("t", "b" * 1000, out)
        else:
            acc.refusal("b" * 1000, out)
        if acc.finished:
            break
    terminal = out[-1]
    assert isinstance(terminal, Failed), channel
    assert terminal.error.error_code == "response_too_large"
    assert acc.held_bytes == 40_000
    # 40 deltas fit exactly; the 41st was refused, not emitted.
    emitted = [
        e
        for e in out
        if (isinstance(e, ChannelToken) and e.text)
        or (isinstance(e, ToolCallDelta) and e.arguments_delta)
    ]
    assert len(emitted) == 40


def test_held_bytes_follow_the_width_of_the_text() -> None:
    fold = ResponseFold()
    for _ in range(300):
        fold.text(0, "ab")
    fold.text(0, "\u0100")  # every character now takes 2 bytes
    assert fold.build().text == "ab" * 300 + "\u0100"
    assert fold.held_bytes == 601 * 2
    fold.reset()
    assert fold.held_bytes == 0 and fold.build().text == ""


@pytest.mark.parametrize("text", ["\xe9t\xe9", "\u20ac", "\u20ac\u20ac", "\U0001f600"])
def test_held_bytes_of_a_delta_whose_utf8_form_was_made(text: str) -> None:
    """A delta's size is what its characters take, also when its UTF-8 form has been
    made and kept on the string (``orjson.dumps`` and C APIs do that): the delta that
    exactly fits the bound is taken, in the per-delta checks and when settled."""
    width = 1 if max(text) < "\u0100" else 2 if max(text) < "\U00010000" else 4
    for exact in (True, False):
        fold = ResponseFold()
        fold.max_held_bytes = len(text) * width * (1 if exact else 4)
        delta = orjson.loads(orjson.dumps(text))  # a string of its own, as parsed
        orjson.dumps(delta)  # its UTF-8 form is now kept on it
        assert fold.text(0, delta)
        assert fold.build().text == text
        assert fold.held_bytes == len(text) * width


def test_response_memory_stops_the_largest() -> None:
    memory = ResponseMemory(100)
    transforms = [new_transform(ApiBackend.CHAT_COMPLETIONS, f"r{n}") for n in range(3)]
    small, large, medium = (memory.hold(transform) for transform in transforms)
    memory.update(small, 10)
    memory.update(large, 60)
    memory.update(medium, 30)
    assert memory.total == 100 and not any(h.stopped for h in (small, large, medium))
    memory.update(small, 20)
    assert large.stopped and not small.stopped and not medium.stopped
    assert memory.total == 50 and memory.peak == 110
    large.release()  # released when stopped: not subtracted twice
    small.release()
    assert memory.total == 30
    error = memory.error()
    assert error.error_code == "sampler_memory_cap" and not error.retryable
    assert "max_buffered_response_bytes (100 bytes)" in error.message


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1GiB"])
def test_open_sampler_refuses_a_bad_cap(bad: object) -> None:
    with pytest.raises(ValueError, match="max_buffered_response_bytes"):
        open_sampler(
            SamplerConfig(base_url="http://127.0.0.1:9/v1"),
            max_buffered_response_bytes=bad,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("arguments", "complete"),
    [
        ("", True),
        ("  \n", True),
        ('{"a": 1}', True),
        ('{"a": 1}\n', True),
        ("[1, 2]", True),
        ('"x"', True),
        ("true", True),
        ("null", True),
        ("12", True),
        ('{"a": 1', False),
        ('{"a": "b', False),
        ("aaaa", False),
        ('{"a": 1}{"a": 1}', False),
        ("{", False),
        ('{"a": 1111', False),
        ("[1, 2}", False),
        ("-1", True),
        ("false", True),
        (' {"a": 1}', True),
        ("1}", False),
    ],
)
def test_arguments_complete_without_parsing_what_cannot_be_json(
    arguments: str, complete: bool
) -> None:
    from trio_sampler.wire._fold import arguments_complete

    assert arguments_complete(arguments) is complete


def test_a_compressed_body_is_inflated_a_step_at_a_time() -> None:
    import zlib

    from trio_sampler.client import INFLATE_STEP_BYTES, SamplingClientError, _BodyDecoder

    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = squeeze.compress(b"x" * (8 * _MIB)) + squeeze.flush()
    assert len(bomb) < 64 * 1024
    decoder = _BodyDecoder("gzip", 4 * _MIB)
    pieces = [decoder.feed(bomb)]
    with pytest.raises(SamplingClientError, match="max_response_bytes") as info:
        while decoder.pending:
            pieces.append(decoder.feed(b""))
    assert info.value.info.error_code == "response_too_large"
    assert max(map(len, pieces)) <= INFLATE_STEP_BYTES
    assert sum(map(len, pieces)) == 4 * _MIB  # every byte up to the limit, then refused
    # A body within the limit comes out whole, step by step.
    small = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = small.compress(b"y" * _MIB) + small.flush()
    decoder = _BodyDecoder("gzip", 4 * _MIB)
    out = [decoder.feed(body)]
    while decoder.pending:
        out.append(decoder.feed(b""))
    assert b"".join(out) == b"y" * _MIB


def test_long_arguments_are_checked_without_a_copy_and_like_short_ones() -> None:
    from trio_sampler.wire._fold import arguments_complete

    whole = orjson.dumps({"a": "x" * (2 * _MIB)}).decode()
    assert arguments_complete(whole)
    assert arguments_complete(f"  {whole}\n")
    assert not arguments_complete(whole + '{"a": 1}')
    assert not arguments_complete(whole + " x")
    assert arguments_complete("[" + "1," * _MIB + "1]")
    assert not arguments_complete("[" + " " * (2 * _MIB) + "NaN]")  # not JSON
    assert not arguments_complete("[" * (2 * _MIB) + "]" * (2 * _MIB))  # too deep


def test_deltas_wait_only_briefly_whatever_else_arrives() -> None:
    from trio_sampler.wire._fold import PENDING_BYTES, PENDING_PARTS

    acc = _accumulator(limit=256 * _MIB)
    out: list[SamplingEvent] = []
    most_text = most_tool = 0
    for _ in range(3000):
        acc.text("ab", out)  # small: they wait to be appended together
        acc.reasoning("r", "x" * 700, out)
        acc.tool_arguments("t", "c", out)
        out.clear()
        most_text = max(most_text, len(acc._text.parts))
        most_tool = max(most_tool, len(acc.fold._tools[0].arguments.parts))
    # The run of text waits at most one window of bytes (703 arrive per round), however
    # the windows end; the tool's arguments at most its count of parts.
    assert most_text <= PENDING_BYTES // 703 + 1, most_text
    assert most_tool <= PENDING_PARTS, most_tool
    response = acc.build_response()
    assert response.text == "ab" * 3000
    assert response.assistant.tool_calls[0].arguments == "c" * 3000


def test_a_hosted_tools_input_being_assembled_counts_as_held() -> None:
    """Transform state that grows with what the server sends (Messages assembles a
    server tool's input outside the fold) counts in what the stream holds, so a server
    that sends an endless input is stopped by the sampler's cap like endless text."""
    from trio_sampler.wire.sse import SSEDecoder

    def sse(payload: dict[str, object]) -> bytes:
        return b"event: x\ndata: " + orjson.dumps(payload) + b"\n\n"

    tool = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    piece = '{"query": "' + "n" * 1000
    body = sse({"type": "message_start", "message": {"id": "m", "usage": {}}}) + sse(
        {"type": "content_block_start", "index": 0, "content_block": tool}
    )
    body += b"".join(
        sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
        )
        for _ in range(100)
    )
    transform = new_transform(ApiBackend.MESSAGES, "r")
    decoder = SSEDecoder()
    for event in decoder.feed(body):
        transform.feed(event)
    assert transform.held_bytes >= 100 * len(piece)


async def test_events_a_slow_consumer_has_not_read_are_counted() -> None:
    """Batches the consumer has not taken hold their deltas' text besides the fold (up to
    ``max_buffered_batches`` of them): the account counts both."""
    config = SamplerConfig(
        base_url="http://emulator/v1",
        model="m",
        extra_headers=tuple(script_headers(text="x" * 200_000, chunk_chars=100).items()),
    )
    async with (
        EmulatorTransport(EmulatorApp()) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        memory = sampler._actor.runner._memory
        assert memory is not None
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        with trio.fail_after(10):  # the consumer reads nothing until the request ends
            await sampler._actor.live[stream.request_id].done.wait()
        result = await stream.result()
    assert result.response is not None
    # The response's whole text is 200,000 bytes: the account counted more than that at
    # its peak, the fold's text and the text of the events waiting in the channel.
    assert len(result.response.text) == 200_000
    assert memory.peak > 300_000


class _Passing:
    """A passing buffer of a set size (the connection's reads, say)."""

    def __init__(self, size: int) -> None:
        self.buffered_bytes = size


def test_every_live_stream_costs_its_overhead_however_little_it_holds() -> None:
    """A stream holds its connection, parser state and task before any text: the account
    counts ``STREAM_OVERHEAD`` for each live one, and nothing once it is released."""
    memory = ResponseMemory(10 * STREAM_OVERHEAD)
    holdings = [memory.hold(new_transform(ApiBackend.CHAT_COMPLETIONS, f"r{n}")) for n in range(3)]
    for holding in holdings:
        holding.report()
    assert memory.total == 3 * STREAM_OVERHEAD
    for holding in holdings:
        holding.release()
    assert memory.total == 0


def test_what_a_stopped_stream_read_through_stays_counted_while_others_run() -> None:
    """The buffers a read passes through are freed, and the allocator keeps that memory
    for later reads: when a stream is stopped its passing share stays counted (it is not
    handed to the text of the others), a passing buffer growing again reuses it, and it
    is forgotten once no stream is left."""
    memory = ResponseMemory(100 + 2 * STREAM_OVERHEAD)
    transforms = [new_transform(ApiBackend.CHAT_COMPLETIONS, f"r{n}") for n in range(3)]
    first, second, third = (memory.hold(transform) for transform in transforms)
    memory.update(first, STREAM_OVERHEAD + 40, passing=30)
    memory.update(second, STREAM_OVERHEAD + 50, passing=20)
    assert memory.total == 2 * STREAM_OVERHEAD + 90 and memory.retained == 0
    first.release()  # its 30 passing bytes are kept by the allocator
    assert memory.retained == 30 and memory.total == STREAM_OVERHEAD + 50 + 30
    memory.update(third, STREAM_OVERHEAD + 25, passing=25)  # a read reuses 25 of them
    assert memory.retained == 5 and memory.passing_peak == 50
    assert memory.total == 2 * STREAM_OVERHEAD + 75 + 5
    memory.update(second, STREAM_OVERHEAD + 76, passing=20)  # past the limit by one
    assert second.stopped and not third.stopped
    second.release()
    third.release()
    assert memory.total == memory.retained == memory.passing_peak == 0


def test_a_stream_reports_its_buffers_and_which_of_them_pass() -> None:
    """What an attempt reports: its overhead, the fold's text and every buffer counted,
    the passing ones also on their own."""
    memory = ResponseMemory(1 << 30)
    transform = new_transform(ApiBackend.CHAT_COMPLETIONS, "r")
    holding = memory.hold(transform)
    holding.count(_Passing(1000))
    holding.count(_Passing(300), passing=True)
    holding.report()
    assert holding.held() == (STREAM_OVERHEAD + transform.held_bytes + 1300, 300)
    assert memory.total == STREAM_OVERHEAD + transform.held_bytes + 1300
    assert memory.passing == memory.passing_peak == 300


def test_the_strings_of_a_response_are_counted_as_cpython_holds_them() -> None:
    """``response_bytes`` sums the strings of every item (text, reasoning, tool calls), so
    a partial kept from a failed attempt is counted at 1, 2 or 4 bytes a character."""
    wide = "\u8bed" * 1000
    response = ConversationResponse(
        items=[
            Reasoning(text="r" * 300),
            Assistant(wide, tool_calls=[ToolCall(id="c1", name="f", arguments='{"a": 1}')]),
        ]
    )
    strings = ("r" * 300, wide, "c1", "f", '{"a": 1}')
    assert response_bytes(response) == sum(map(sys.getsizeof, strings))
    assert sys.getsizeof(wide) > 2 * len(wide)  # two bytes a character, as held
    assert response_bytes(None) == 0


async def test_the_partial_kept_from_a_failed_attempt_is_counted_by_the_next(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """A stream cut midway is tried again; the request keeps the first attempt's partial
    output for its terminal meanwhile, and the second attempt counts it in the account."""
    kept: list[int] = []

    class Recorded(_memory.KeptPartial):
        def __init__(self, response: ConversationResponse | None) -> None:
            super().__init__(response)
            kept.append(self.buffered_bytes)

    monkeypatch.setattr(_gates, "KeptPartial", Recorded)
    text = " ".join(["word"] * 2000)
    config = SamplerConfig(
        base_url="http://emulator/v1",
        model="m",
        extra_headers=tuple(
            script_headers(
                text=text, faults=[{"type": "drop", "after_events": 1000, "times": 1}]
            ).items()
        ),
    )
    async with (
        EmulatorTransport(EmulatorApp()) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        events = [event async for event in stream]
    assert any(isinstance(event, Retrying) for event in events)
    assert isinstance(events[-1], Completed)
    assert len(kept) == 1 and kept[0] > 900 * len("word ")


async def _arguments_of_empty_objects(cap: int, *, with_tools: bool) -> tuple[str, int]:
    """A tool call whose arguments are 20,000 empty objects (about 60 KB of text, 1.5 MB
    once parsed), read under ``cap``: the terminal's error code ('' when it completed) and
    what the parsed values were estimated to hold at the end."""
    arguments: dict[str, list[dict[str, int]]] = {"a": [{} for _ in range(20_000)]}
    config = SamplerConfig(
        base_url="http://emulator/v1",
        model="m",
        extra_headers=tuple(
            script_headers(tool_calls=[{"name": "f", "arguments": arguments}]).items()
        ),
    )
    tools = (ToolSpec(name="f"),) if with_tools else ()
    async with (
        EmulatorTransport(EmulatorApp()) as transport,
        open_sampler(config, transport=transport, max_buffered_response_bytes=cap) as sampler,
    ):
        stream = await sampler.submit(ConversationRequest(items=[User("hi")], tools=tools))
        partials = sampler._actor.live[stream.request_id].partials
        events = [event async for event in stream]
    terminal = events[-1]
    code = terminal.error.error_code or "" if isinstance(terminal, Failed) else ""
    return code, 0 if partials is None else partials.buffered_bytes


async def test_parsed_tool_arguments_count_against_the_sampler_cap() -> None:
    """Parsed, ``[{},{},...]`` holds 24 bytes a byte of text: under a cap its text fits
    (the same stream completes when nothing parses it), the parsed values stop it."""
    cap = 1_000_000  # the stream peaks at about 0.73 MB unparsed, 2.4 MB parsed
    code, _ = await _arguments_of_empty_objects(cap, with_tools=False)
    assert code == ""
    code, held = await _arguments_of_empty_objects(cap, with_tools=True)
    assert code == "sampler_memory_cap"
    code, held = await _arguments_of_empty_objects(64 * _MIB, with_tools=True)
    assert code == "" and held > 20_000 * 64  # a dictionary each, at least


def test_the_changes_a_parsed_batch_carries_are_counted_with_it() -> None:
    """A batch's ``ToolArgumentsDelta`` carries a change for each value it placed (two
    for a container: opened and closed); ``delta_bytes`` counts them for that batch."""
    partials = PartialOutputs("r", None)
    text = "[" + "{}," * 100  # an array still open: its items read one by one
    out = partials.batch([ToolCallDelta("r", 0, "c1", "f", text)])
    [delta] = [event for event in out if isinstance(event, ToolArgumentsDelta)]
    assert len(delta.changes) > 2 * 99
    assert partials.delta_bytes == len(delta.changes) * CHANGE_BYTES
    assert partials.buffered_bytes > 100 * 64  # a dictionary each, at least
    partials.batch([])
    assert partials.delta_bytes == 0
