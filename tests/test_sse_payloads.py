"""The per-event fast form: ``SSEDecoder.feed_payloads`` and ``StreamTransform.feed_payloads``.

A data-only event travels as its raw bytes, parsed without a ``str`` or an event object.
These tests hold the fast form to the general one: the decoder against a reference
decoder written from the WHATWG rules (whole body at once, one line at a time), and each
backend's transform fed through ``feed_payloads`` against the same transform fed one
``ServerSentEvent`` at a time, over random framings and random read boundaries.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import corpus
from trio_sampler.types import ApiBackend, ChannelToken, SamplingEvent
from trio_sampler.wire import ServerSentEvent, SSEDecoder, new_transform
from trio_sampler.wire.chat_completions import ChatCompletionsTransform
from trio_sampler.wire.messages import MessagesTransform
from trio_sampler.wire.sse import SSEPayload, payload_event

_BOM = b"\xef\xbb\xbf"


def reference(body: bytes) -> list[ServerSentEvent]:
    """The events of a whole body, by the WHATWG rules, the plainest way."""
    if body.startswith(_BOM):
        body = body[3:]
    lines = re.split(rb"\r\n|\r|\n", body)
    lines.pop()  # the unterminated last line (or b""): a cut line is not an event
    events: list[ServerSentEvent] = []
    data: list[str] = []
    event: str | None = None
    last_id: str | None = None
    retry: int | None = None
    for line in [*lines, b""]:  # end of body dispatches a complete last event
        if not line:
            if data:
                events.append(ServerSentEvent("\n".join(data), event or "message", last_id, retry))
            data, event, retry = [], None, None
            continue
        if line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            retry = int(value)
    return events


def _chunks(body: bytes, rnd: random.Random, cuts: int) -> list[bytes]:
    points = sorted({rnd.randrange(1, len(body)) for _ in range(cuts)}) if len(body) > 1 else []
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


def payloads(chunks: list[bytes]) -> list[SSEPayload]:
    decoder = SSEDecoder(1 << 20)
    out: list[SSEPayload] = []
    for chunk in chunks:
        out += decoder.feed_payloads(chunk)
    return out + decoder.close_payloads()


_field = st.sampled_from(
    [b"data: ", b"data:", b"data", b"event: ", b"id: ", b"id:", b"retry: ", b": ", b"x: ", b""]
)
_value = st.one_of(
    st.text(max_size=12).map(str.encode),
    st.sampled_from([b"{}", b"[DONE]", b"\xff\xfe", b"\xe2\x82", b"12", b"a\x00b", b""]),
)
_eol = st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n"])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(_field, _value, _eol), max_size=24),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_payloads_are_the_reference_events(
    lines: list[tuple[bytes, bytes, bytes]], bom: bool, rnd: random.Random
) -> None:
    body = (_BOM if bom else b"") + b"".join(f + v + e for f, v, e in lines)
    expected = reference(body)
    for cuts in (0, 3, len(body)):
        got = payloads(_chunks(body, rnd, cuts))
        assert [payload_event(item) for item in got] == expected
        for item, event in zip(got, expected, strict=True):
            # The raw forms are exactly the plain events: one data line, no id, no retry.
            if type(item) is bytes:
                assert (event.event, event.id, event.retry) == ("message", None, None)
            if type(item) is tuple:
                assert (event.event, event.id, event.retry) == (item[0], None, None)
            if type(item) is not ServerSentEvent:
                assert "\n" not in event.data
        decoder = SSEDecoder(1 << 20)
        events: list[ServerSentEvent] = []
        for chunk in _chunks(body, rnd, cuts):
            events += decoder.feed(chunk)
        assert events + decoder.close() == expected


def test_a_one_line_event_is_its_raw_bytes() -> None:
    body = (
        b'data: {"a":"\xc3\xa9"}\n\nevent: e\ndata: {}\n\nevent:\ndata: z\n\n'
        b"data: a\ndata: b\n\nid: 1\ndata: x\n\ndata: y\n\n"
    )
    assert payloads([body]) == [
        b'{"a":"\xc3\xa9"}',
        ("e", b"{}"),
        b"z",  # an empty name is the default one
        ServerSentEvent("a\nb"),
        ServerSentEvent("x", id="1"),
        ServerSentEvent("y", id="1"),  # the id persists: no bytes form after it
    ]


# -- the transforms --------------------------------------------------------------------


def _chat(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
    base = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta}]}
    if finish is not None:
        base["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return _chat({**base, **extra})


_CHAT_FRAMES = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Hello"}),
    _chunk({"content": " wörld"}),
    _chunk({"content": ""}),  # a plain chunk of no text
    # The plain text chunk as servers send it, and each field that takes it off the
    # plain path (a finish reason, usage, an error, Groq's extension, a second choice).
    _chat(
        {
            "id": "c1",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "as sent"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "usage": None,
        }
    ),
    _chunk({"content": "end"}, "length"),
    _chunk({"content": "!"}, usage=None, error=None),
    _chunk({"content": "?"}, x_groq={"id": "g"}),
    _chunk({"content": "u"}, x_groq={"usage": {"prompt_tokens": 4, "completion_tokens": 1}}),
    _chat({"id": "c1", "choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1}]}),
    _chat({"id": "c1", "choices": [{"index": 0, "delta": {"content": "late"}}]}),  # no model
    _chat({"choices": [{"delta": {"content": "no id"}}], "model": "m"}),
    _chat({"id": "c1", "model": "m", "choices": [{"delta": {"content": ["x"]}}]}),
    _chat({"id": "c1", "model": "m", "choices": [[]]}),
    _chunk({"content": 7}),  # malformed: content of the wrong type
    _chunk({"reasoning_content": "hm"}),
    _chunk({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]}),
    _chunk({}, "stop"),
    _chunk({"content": "x"}, usage={"prompt_tokens": 3, "completion_tokens": 2}),
    _chat({"id": "c1", "choices": [{"index": 1, "delta": {"content": "other"}}]}),
    _chat({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 1}}),
    _chat({"error": {"message": "overloaded", "type": "server_error"}}),
    _chat([1, 2]),  # JSON but not an object
    b'data: {"id":"c1","model":"m","choices":[{"delta":{"content":"\xff"}}]}\n\n',  # not UTF-8
    b"data: {not json\n\n",
    b"data: \n\n",
    b"data:    \n\n",
    b"data: [DONE]\n\n",
    b": keep-alive\n\n",
    b"event: error\ndata: " + orjson.dumps({"error": {"message": "bad"}}) + b"\n\n",
    b"id: 9\n",  # every event after it has an id: no bytes form
    b"retry: 10\n",
    b'data: {"id":"c1",\ndata: "choices":[]}\n\n',  # one event in two data lines
    # Named events of the other two protocols, and the Responses doom-loop check.
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"item_id":"m1","output_index":0,"content_index":0,"delta":"hi"}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hi"}}\n\n',
    b'event: response.doom_loop_check\ndata: {"doom_loop_check":{"triggers":["x"]}}\n\n',
    b"event: response.doom_loop_check\ndata: nope\n\n",
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"cut',
]


def _per_event(backend: ApiBackend, chunks: list[bytes]) -> list[SamplingEvent]:
    """The general path: one ``ServerSentEvent`` at a time through ``feed``."""
    transform = new_transform(backend, "r")
    decoder = SSEDecoder(1 << 20)
    events = transform.start({"openai-model": "m"})
    for chunk in chunks:
        for sse in decoder.feed(chunk):
            events += transform.feed(sse)
    for sse in decoder.close():
        events += transform.feed(sse)
    return events + transform.close()


def _fast(backend: ApiBackend, chunks: list[bytes]) -> list[SamplingEvent]:
    """The fast path, read by read, as the actor and ``replay`` feed it."""
    transform = new_transform(backend, "r")
    decoder = SSEDecoder(1 << 20)
    events = transform.start({"openai-model": "m"})
    for chunk in chunks:
        events += transform.feed_payloads(decoder.feed_payloads(chunk))
    events += transform.feed_payloads(decoder.close_payloads())
    return events + transform.close()


def _same(backend: ApiBackend, body: bytes, rnd: random.Random) -> None:
    for cuts in (0, 4, 40):
        chunks = _chunks(body, rnd, cuts)
        assert _fast(backend, chunks) == _per_event(backend, chunks)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(_CHAT_FRAMES), max_size=30),
    st.sampled_from(list(ApiBackend)),
    st.randoms(use_true_random=False),
)
def test_feed_payloads_gives_the_events_of_feed(
    frames: list[bytes], backend: ApiBackend, rnd: random.Random
) -> None:
    """Any mix of well-formed, malformed and odd events, for each backend (a Chat
    Completions event is an unknown or malformed event to the other two)."""
    _same(backend, b"".join(frames), rnd)


_ROLE = _chunk({"role": "assistant", "content": ""})
_HELLO = _chunk({"content": "Hello"})
_WORLD = _chunk({"content": " wörld"})


@pytest.mark.parametrize(
    "frames",
    [
        [_ROLE, _chunk({"content": ""})],  # a plain chunk of no text opens no item
        [_ROLE, _chunk({"content": ""}), _chunk({"reasoning_content": "hm"}), _HELLO],
        [_ROLE, _HELLO, _chunk({"content": "x"}, usage={"prompt_tokens": 1}), _WORLD],
        [_ROLE, _HELLO, _WORLD, _chunk({"content": 7}), _HELLO],  # malformed mid-run
        [_ROLE, _HELLO, _chunk({}, "stop"), _WORLD],  # a finish reason inside a read
        [_ROLE, _HELLO, _chat({"error": {"message": "overloaded"}}), _WORLD],
        [_ROLE, _HELLO, _chunk({"reasoning_content": "hm"}), _WORLD, _HELLO],
        [_chat({"id": "c1", "choices": [{"delta": {"content": "a"}}]}), _HELLO],  # no model
    ],
)
def test_a_read_of_chat_chunks_gives_the_events_of_feed(frames: list[bytes]) -> None:
    """The plain text chunks of a read and the chunks around them, in one read and
    in reads of every size."""
    body = b"".join(frames) + b"data: [DONE]\n\n"
    expected = _per_event(ApiBackend.CHAT_COMPLETIONS, [body])
    assert _fast(ApiBackend.CHAT_COMPLETIONS, [body]) == expected
    for size in (1, 7, 64, 200):
        chunks = [body[start : start + size] for start in range(0, len(body), size)]
        assert _fast(ApiBackend.CHAT_COMPLETIONS, chunks) == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(_CHAT_FRAMES[:4]), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=200),
    st.randoms(use_true_random=False),
)
def test_a_run_of_text_past_the_memory_bound_fails_where_the_general_path_does(
    frames: list[bytes], limit: int, rnd: random.Random
) -> None:
    """A read's plain text chunks go to the accumulator at once: the delta that passes
    ``max_held_bytes`` fails the stream at the same event, with the same partial."""
    body = b"".join(frames) + b"data: [DONE]\n\n"

    def bounded(feed: str) -> list[SamplingEvent]:
        transform = new_transform(ApiBackend.CHAT_COMPLETIONS, "r")
        transform.max_held_bytes = limit
        decoder = SSEDecoder(1 << 20)
        events = transform.start({})
        for chunk in _chunks(body, rnd, 3):
            if feed == "payloads":
                events += transform.feed_payloads(decoder.feed_payloads(chunk))
            else:
                for sse in decoder.feed(chunk):
                    events += transform.feed(sse)
        return events + transform.close()

    assert bounded("payloads") == bounded("events")


def test_a_subclass_that_maps_chunks_itself_sees_every_chunk() -> None:
    """A Chat Completions transform that overrides how a chunk is mapped gets the
    plain text chunks through it too."""
    seen: list[object] = []

    class Watching(ChatCompletionsTransform):
        def _on_json(
            self, event_name: str, payload: dict[str, object], out: list[SamplingEvent]
        ) -> None:
            seen.append(payload["choices"])
            super()._on_json(event_name, payload, out)

    body = _CHAT_FRAMES[0] + _chunk({"content": "a"}) + _chunk({"content": "b"})
    transform = Watching("r")
    transform.start({})
    events = transform.feed_payloads(SSEDecoder().feed_payloads(body))
    assert len(seen) == 3
    plain = ChatCompletionsTransform("r")
    plain.start({})
    assert events == plain.feed_payloads(SSEDecoder().feed_payloads(body))


def test_a_subclass_that_maps_events_itself_sees_every_event() -> None:
    """A transform that overrides ``feed`` gets every event through it, the bytes
    form included (as a ``ServerSentEvent``)."""
    seen: list[ServerSentEvent] = []

    class Watching(ChatCompletionsTransform):
        def feed(self, event: ServerSentEvent) -> list[SamplingEvent]:
            seen.append(event)
            return super().feed(event)

    body = _chunk({"content": "a"}) + b"data: [DONE]\n\n"
    events = Watching("r").feed_payloads(SSEDecoder().feed_payloads(body))
    assert [event.data[:6] for event in seen] == ['{"id":', "[DONE]"]
    assert events == ChatCompletionsTransform("r").feed_payloads(SSEDecoder().feed_payloads(body))


def test_a_subclass_that_takes_named_events_sees_every_named_event() -> None:
    """A transform that overrides ``_feed_data`` without naming the events it takes
    (``taken_events``) gets every named event through it."""
    seen: list[str] = []

    class Taking(MessagesTransform):
        def _feed_data(self, name: str, data: str, out: list[SamplingEvent]) -> None:
            seen.append(name)
            super()._feed_data(name, data, out)

    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n'
        b"event: ping\ndata: {}\n\n"
    )
    Taking("r").feed_payloads(SSEDecoder().feed_payloads(body))
    assert seen == ["message_start", "ping"]


@pytest.mark.parametrize("capture", corpus.params())
def test_real_captures_give_the_same_events_both_ways(capture: dict[str, Any]) -> None:
    body = capture["path"].read_bytes()
    _same(ApiBackend(capture["backend"]), body, random.Random(str(capture["id"])))


# -- the plain chunk parsed at its text alone -------------------------------------------


def _server_chunk(text: object, style: int, **extra: object) -> bytes:
    """A text chunk as different servers write it: compact with raw UTF-8 (OpenAI,
    vLLM), ASCII-escaped with spaces (Python's ``json.dumps``), its fields reordered."""
    chunk: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        ],
        **extra,
    }
    if style == 0:
        return _chat(chunk)
    if style == 1:
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"
    reordered = {key: chunk[key] for key in reversed(chunk)}
    return b"data: " + json.dumps(reordered, ensure_ascii=False).encode() + b"\n\n"


_texts = st.lists(
    st.text(st.characters(codec="utf-8"), max_size=4)
    | st.sampled_from(['"', "\\", "\n", "\u2028", "}", '","x":"', "\x00"]),
    max_size=3,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            _texts.map(lambda text: (text, {})),
            # A field of its own per chunk (OpenAI's ``obfuscation``): no two alike.
            _texts.map(lambda text: (text, {"obfuscation": text[::-1] + "x"})),
            st.sampled_from([(7, {}), (None, {}), (["x"], {}), ("", {"usage": None})]),
        ),
        max_size=30,
    ),
    st.integers(min_value=0, max_value=2),
    st.randoms(use_true_random=False),
)
def test_chunks_alike_but_for_their_text_give_the_events_of_feed(
    chunks: list[tuple[object, dict[str, object]]], style: int, rnd: random.Random
) -> None:
    """A plain chunk that is the last one's bytes around another JSON string is parsed
    at its text alone: any text, however escaped, and any chunk that differs elsewhere
    or holds something else in that place, gives what the general path gives."""
    body = _server_chunk("", style) + b"".join(_server_chunk(t, style, **x) for t, x in chunks)
    _same(ApiBackend.CHAT_COMPLETIONS, body + b"data: [DONE]\n\n", rnd)


def test_text_in_the_place_of_the_text_is_the_only_thing_taken_from_bytes_alike() -> None:
    """Bytes that match the last plain chunk around a different value (a number, an
    object, a string and more) are parsed whole; a duplicate ``content`` key leaves
    the general path to every chunk."""
    role = _server_chunk("", 0)
    plain = _server_chunk("a", 0)
    head, tail = plain.split(b'"a"')
    bodies = [
        role + plain + head + b"7" + tail,
        role + plain + head + b'"b","content":"c"' + tail,
        role + plain + head + b'{"x":"y"}' + tail,
        role + plain + head + b'"\xff"' + tail,
        role + plain + head + b'"b"  ' + tail,
        role + plain + plain.replace(b'{"content":"a"}', b'{"content":"z","content":"a"}') * 2,
        # The same text again further on: the text's place is the one that parses as it.
        role
        + _server_chunk("a", 0, extra={"content": "a"})
        + _server_chunk("a", 0, extra={"content": "b"}),
    ]
    for body in bodies:
        body += b"data: [DONE]\n\n"
        expected = _per_event(ApiBackend.CHAT_COMPLETIONS, [body])
        assert _fast(ApiBackend.CHAT_COMPLETIONS, [body]) == expected
        assert _fast(ApiBackend.CHAT_COMPLETIONS, _chunks(body, random.Random(1), 5)) == expected


def test_a_stream_of_chunks_alike_is_parsed_whole_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the shortcut is for: after the first plain chunk, a chunk alike but for its
    text is not parsed whole again."""
    from trio_sampler.wire.chat_completions import _stream

    sizes: list[int] = []

    def loads(data: bytes) -> object:
        sizes.append(len(data))
        return orjson.loads(data)

    monkeypatch.setattr(
        _stream,
        "orjson",
        argparse.Namespace(loads=loads, dumps=orjson.dumps, JSONDecodeError=orjson.JSONDecodeError),
    )
    body = _server_chunk("", 0) + b"".join(_server_chunk(f"w{n} ", 0) for n in range(50))
    events = _fast(ApiBackend.CHAT_COMPLETIONS, [body + b"data: [DONE]\n\n"])
    assert "".join(e.text for e in events if isinstance(e, ChannelToken)) == "".join(
        f"w{n} " for n in range(50)
    )
    whole = [size for size in sizes if size > 40]
    assert len(whole) <= 3  # the role chunk, the first plain one and its probe
