"""Anthropic Messages on Amazon Bedrock: the request (the model in the path, no ``model``
or ``stream`` in the body, ``anthropic_version`` in it) and the answer in AWS event-stream
framing (``InvokeModelWithResponseStream``), decoded into the same Messages events.

The frames are written from the documented format (prelude, headers, payload, CRC-32s)
and checked against botocore's own parser; the events inside are the documented
Anthropic stream events.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import attrs
import httpx2
import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig
from trio_sampler.emulator import EmulatorApp, PromptCache
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import (
    Assistant,
    Completed,
    ConversationRequest,
    Failed,
    MCPServer,
    SamplingErrorKind,
    SamplingEvent,
    User,
)
from trio_sampler.wire import (
    BuildOptions,
    EventStreamDecodeError,
    EventStreamDecoder,
    build_request,
    new_transform,
    replay,
    stream_decoder,
)
from trio_sampler.wire.eventstream import (
    EVENT_STREAM_MEDIA_TYPE,
    encode_chunk,
    encode_exception,
    encode_message,
)

MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
USER = [{"role": "user", "content": "hi"}]
KEY = "bedrock-api-key-0123456789abcdef"


def _events(text: str = "Hello there") -> list[dict[str, Any]]:
    message: dict[str, Any] = {
        "id": "msg_bdrk_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    half = len(text) // 2
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
            for t in (text[:half], text[half:])
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 4},
        },
        {
            "type": "message_stop",
            "amazon-bedrock-invocationMetrics": {"inputTokenCount": 12, "outputTokenCount": 4},
        },
    ]


def _stream(events: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_chunk(orjson.dumps(event)) for event in events)


def _run(body: bytes, *, split: int | None = None) -> list[SamplingEvent]:
    """``body`` through the decoder and the Messages transform, as the reader does."""
    decoder = EventStreamDecoder()
    transform = new_transform("messages", provider="bedrock_messages")
    out = transform.start({"content-type": EVENT_STREAM_MEDIA_TYPE})
    pieces = [body] if split is None else [body[:split], body[split:]]
    try:
        for piece in pieces:
            out += transform.feed_payloads(decoder.feed_payloads(piece))
    except EventStreamDecodeError as exc:
        from trio_sampler.wire._replay import decode_failure

        return out + transform.abort(decode_failure(exc))
    out += transform.feed_payloads(decoder.close_payloads())
    return out + transform.close()


# -- the request ----------------------------------------------------------------------


def test_the_request_puts_the_model_in_the_path_and_the_version_in_the_body() -> None:
    options = BuildOptions(model=MODEL, provider="bedrock_messages", stream=True)
    wire = build_request("messages", ConversationRequest([User("hi")]), options)
    assert wire.path == f"/model/{MODEL}/invoke-with-response-stream"
    assert "model" not in wire.data and "stream" not in wire.data
    assert wire.data["anthropic_version"] == "bedrock-2023-05-31"
    plain = build_request(
        "messages", ConversationRequest([User("hi")]), attrs.evolve(options, stream=False)
    )
    assert plain.path == f"/model/{MODEL}/invoke"


def test_beta_features_go_in_the_body() -> None:
    server = MCPServer("docs", "https://mcp.example.com/mcp")
    request = ConversationRequest([User("hi")], hosted_tools=[server])
    options = BuildOptions(model=MODEL, provider="bedrock_messages")
    wire = build_request("messages", request, options)
    assert wire.data["anthropic_beta"] == ["mcp-client-2025-04-04"]
    assert "anthropic-beta" not in dict(wire.headers)


def test_an_inference_profile_arn_is_one_path_segment() -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"
    options = BuildOptions(model=arn, provider="bedrock_messages")
    wire = build_request("messages", ConversationRequest([User("hi")]), options)
    assert wire.path == (
        "/model/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile%2Fabc123"
        "/invoke-with-response-stream"
    )


# -- the framing ----------------------------------------------------------------------


def test_chunks_decode_to_the_model_events_as_botocore_reads_them() -> None:
    events = _events()
    body = _stream(events)
    reference = EventStreamBuffer()
    reference.add_data(body)
    theirs = [base64.b64decode(orjson.loads(message.payload)["bytes"]) for message in reference]
    ours = EventStreamDecoder().feed_payloads(body)
    assert ours == theirs == [orjson.dumps(event) for event in events]


def test_split_at_every_byte_the_payloads_are_the_same() -> None:
    body = _stream(_events("split me anywhere"))
    whole = EventStreamDecoder().feed_payloads(body)
    for split in range(len(body) + 1):
        decoder = EventStreamDecoder()
        assert decoder.feed_payloads(body[:split]) + decoder.feed_payloads(body[split:]) == whole


def test_byte_at_a_time_gives_the_same_events_as_whole() -> None:
    body = _stream(_events())
    decoder = EventStreamDecoder()
    fed = [
        payload
        for byte in range(len(body))
        for payload in decoder.feed_payloads(body[byte : byte + 1])
    ]
    assert fed == EventStreamDecoder().feed_payloads(body)
    assert decoder.buffered_bytes < 200  # nothing held once every message is complete


def test_a_whole_stream_is_the_same_response_at_every_split() -> None:
    body = _stream(_events())
    whole = _run(body)
    completed = whole[-1]
    assert isinstance(completed, Completed)
    assert completed.response.text == "Hello there"
    for split in range(0, len(body) + 1, 7):
        ended = _run(body, split=split)[-1]
        assert isinstance(ended, Completed) and ended.response == completed.response


def test_replay_reads_an_event_stream_for_a_bedrock_provider_or_content_type() -> None:
    body = _stream(_events())
    by_provider = replay("messages", body, provider="bedrock_messages")[-1]
    by_header = replay("messages", body, headers={"Content-Type": EVENT_STREAM_MEDIA_TYPE})[-1]
    assert isinstance(by_provider, Completed) and isinstance(by_header, Completed)
    assert by_provider.response.text == by_header.response.text == "Hello there"


def test_other_event_types_and_headers_are_read_past() -> None:
    odd = encode_message({":message-type": "event", ":event-type": "metadata"}, b"{}")
    body = odd + _stream(_events())
    assert len(EventStreamDecoder().feed_payloads(body)) == len(_events())


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "message CRC mismatch"),
        (lambda b: b[:5] + bytes([b[5] ^ 1]) + b[6:], "prelude CRC mismatch"),
    ],
    ids=["payload", "prelude"],
)
def test_a_corrupt_frame_ends_the_stream_in_a_typed_failed(damage: Any, message: str) -> None:
    body = _stream(_events())
    with pytest.raises(EventStreamDecodeError, match=message):
        EventStreamDecoder().feed_payloads(damage(body))
    failed = _run(damage(body))[-1]
    assert isinstance(failed, Failed)
    assert failed.error.kind is SamplingErrorKind.HTTP and not failed.error.retryable
    assert message in failed.error.message


def test_lengths_out_of_bounds_are_refused_before_anything_is_buffered() -> None:
    prelude = (10**9).to_bytes(4, "big") + (0).to_bytes(4, "big")
    frame = prelude + zlib.crc32(prelude).to_bytes(4, "big")
    decoder = EventStreamDecoder(max_event_bytes=1 << 20)
    with pytest.raises(EventStreamDecodeError, match="exceeds the 1048576-byte limit"):
        decoder.feed_payloads(frame)
    with pytest.raises(EventStreamDecodeError, match="already failed"):
        decoder.feed_payloads(b"")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"bytes": 3}', 'no "bytes" string'),
        (b"not json", "malformed"),
        (b'{"bytes": "not base64!"}', "malformed"),
        ('{"bytes": "é"}'.encode(), "malformed"),
    ],
    ids=["not-a-string", "not-json", "not-base64", "not-ascii"],
)
def test_a_chunk_without_base64_bytes_is_malformed(payload: bytes, message: str) -> None:
    bad = encode_message({":message-type": "event", ":event-type": "chunk"}, payload)
    with pytest.raises(EventStreamDecodeError, match=message):
        EventStreamDecoder().feed_payloads(bad)


def test_a_body_cut_mid_frame_is_a_retryable_early_end() -> None:
    events = _events()
    body = _stream(events)
    failed = _run(body[: len(_stream(events[:3])) + 10])[-1]
    assert isinstance(failed, Failed)
    assert failed.error.kind is SamplingErrorKind.TRANSPORT and failed.error.retryable


@pytest.mark.parametrize(
    ("exception", "kind", "retryable"),
    [
        ("throttlingException", SamplingErrorKind.RATE_LIMITED, True),
        ("modelStreamErrorException", SamplingErrorKind.API, True),
        ("internalServerException", SamplingErrorKind.API, True),
        ("serviceUnavailableException", SamplingErrorKind.OVERLOADED, True),
        ("modelTimeoutException", SamplingErrorKind.API, True),
        ("validationException", SamplingErrorKind.INVALID_REQUEST, False),
    ],
)
def test_an_exception_message_is_a_typed_failure(
    exception: str, kind: SamplingErrorKind, retryable: bool
) -> None:
    events = _events()
    body = _stream(events[:3]) + encode_exception(exception, f"{exception} happened")
    failed = _run(body)[-1]
    assert isinstance(failed, Failed)
    assert (failed.error.kind, failed.error.retryable) == (kind, retryable)
    assert failed.error.error_type == exception
    assert failed.error.message == f"{exception} happened"
    assert failed.partial is not None and failed.partial.text == "Hello"


def test_the_decoder_is_chosen_by_the_media_type() -> None:
    assert isinstance(stream_decoder(EVENT_STREAM_MEDIA_TYPE), EventStreamDecoder)
    assert not isinstance(stream_decoder("text/event-stream"), EventStreamDecoder)


# -- over the emulator and the actor --------------------------------------------------


def _config(**overrides: Any) -> SamplerConfig:
    return SamplerConfig.for_provider(
        "bedrock_messages",
        model=MODEL,
        api_key=KEY,
        base_url="http://emulator.test",
        env={},
        **overrides,
    )


async def test_two_turns_over_the_emulator() -> None:
    app = EmulatorApp(cache=PromptCache())
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(_config(), transport=transport) as sampler,
    ):
        first = ConversationRequest([User("Say hello.")])
        one = await sampler.submit_and_collect(first)
        assert one.text
        second = ConversationRequest([*first.items, *one.items, User("Again.")])
        two = await sampler.submit_and_collect(second)
        assert two.text
    assert isinstance(one.items[-1], Assistant)
    recorded = app.requests()
    assert len(recorded) == 2
    assert recorded[0]["path"] == f"/model/{MODEL}/invoke-with-response-stream"
    assert recorded[0]["headers"]["accept"] == EVENT_STREAM_MEDIA_TYPE
    # The second turn carried the first answer back.
    assert one.text in orjson.dumps(recorded[1]).decode()


async def test_the_emulator_refuses_a_body_bedrock_refuses() -> None:
    app = EmulatorApp(cache=PromptCache())
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        response = await client.post(
            f"http://emulator.test/model/{MODEL}/invoke-with-response-stream",
            json={"model": MODEL, "max_tokens": 10, "messages": [], "anthropic_version": "x"},
            headers={"authorization": f"Bearer {KEY}"},
        )
    assert response.status_code == 400
    assert "extraneous key [model]" in response.text


async def test_an_error_status_on_the_stream_route_keeps_its_json_body() -> None:
    app = EmulatorApp(cache=PromptCache())
    script = orjson.dumps({"faults": [{"type": "status", "status": 429}]}).decode()
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        response = await client.post(
            f"http://emulator.test/model/{MODEL}/invoke-with-response-stream",
            json={"max_tokens": 10, "messages": USER, "anthropic_version": "bedrock-2023-05-31"},
            headers={"authorization": f"Bearer {KEY}", "x-emulator-script": script},
        )
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/json"
    assert response.json()["type"] == "error"


async def test_a_stream_error_from_the_emulator_arrives_as_a_typed_exception() -> None:
    app = EmulatorApp(cache=PromptCache())
    script = orjson.dumps({"faults": [{"type": "stream_error", "error_type": "rate_limit_error"}]})
    config = _config(extra_headers={"x-emulator-script": script.decode()})
    policy = RetryPolicy(max_retries=0)
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport, retry_policy=policy) as sampler,
    ):
        stream = await sampler.submit(ConversationRequest([User("hi")]))
        async with stream:
            events = [event async for event in stream]
    failed = events[-1]
    assert isinstance(failed, Failed)
    assert failed.error.kind is SamplingErrorKind.RATE_LIMITED
    assert failed.error.error_type == "throttlingException"


@given(st.binary(max_size=400), st.integers(min_value=0, max_value=400))
def test_any_bytes_decode_or_raise_the_decode_error(noise: bytes, at: int) -> None:
    """Never another exception, whatever the bytes: a valid stream with noise spliced in
    (often past the CRCs, so the frames parse further than random bytes would)."""
    body = _stream(_events())
    at = min(at, len(body))
    decoder = EventStreamDecoder()
    try:
        decoder.feed_payloads(body[:at] + noise + body[at:])
    except EventStreamDecodeError:
        pass
    assert decoder.close_payloads() == []


def _framed(headers: bytes, payload: bytes) -> bytes:
    """A frame with valid CRCs around any header block and payload."""
    total = 12 + len(headers) + len(payload) + 4
    prelude = total.to_bytes(4, "big") + len(headers).to_bytes(4, "big")
    head = prelude + zlib.crc32(prelude).to_bytes(4, "big") + headers + payload
    return head + zlib.crc32(head).to_bytes(4, "big")


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_any_headers_and_payload_with_valid_crcs_decode_or_raise_the_decode_error(
    headers: bytes, payload: bytes
) -> None:
    chunk = bytes([11]) + b":event-type" + bytes([7, 0, 5]) + b"chunk"
    for block in (headers, chunk + headers):
        try:
            EventStreamDecoder().feed_payloads(_framed(block, payload))
        except EventStreamDecodeError:
            pass
