"""Differential test: our Responses transform against the official ``openai`` SDK on the
same bytes (the real corpus).

The SDK side runs its real streaming path: ``openai.Stream`` over an ``httpx2.Response``
holding the recorded body, wrapped in ``ResponseStream`` (which feeds every event to
``openai.lib.streaming.responses.ResponseStreamState``), and ``get_final_response()``.

Deliberate differences, each asserted below (and listed in docs/backends/responses-stream.md):

* stop reason: the SDK has none; ours is ``tool_calls`` when the completed response has a
  ``function_call`` item, else ``stop`` (``raw_stop_reason`` keeps the status ``completed``);
* refusal: the SDK keeps a ``refusal`` content part; ours is ``Assistant.refusal`` with
  stop reason ``content_filter`` (raw ``refusal``);
* usage: normalized into :class:`Usage` (same numbers: Responses ``input_tokens`` already
  includes cached tokens and ``output_tokens`` includes reasoning); ``total_tokens`` is
  derived; cost in ticks from ``cost_in_usd_ticks`` / OpenRouter ``cost``;
* hosted tools (web/file search, code interpreter, MCP) are ``BackendToolCall`` items with
  the raw output item kept; unknown output item types are dropped (the SDK keeps them);
* the nested ``error`` event: the SDK raises ``APIError``; ours ends in ``Failed`` with a
  classified kind and the partial output;
* a resumed stream (no ``response.created``): the SDK's ``ResponseStreamState`` raises;
  ours completes. For that file the final ``response.completed`` object is validated as
  ``openai.types.responses.Response`` and compared instead.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, cast

import httpx2
import openai
import pytest
from openai import OpenAI, Stream
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStream
from openai.types.responses import Response, ResponseStreamEvent

from benchmarks import corpus
from trio_sampler.types import (
    ChannelToken,
    Completed,
    ConversationResponse,
    Failed,
    SamplingChannel,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    ToolCallDelta,
    Usage,
)
from trio_sampler.wire import collect, replay
from trio_sampler.wire.sse import SSEDecoder

CORPUS = corpus.root()
MANIFEST = corpus.manifest("responses")
HOSTED = {
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "custom_tool_call",
}
# Files the SDK's stream state cannot take (checked against hand-written expectations below).
SDK_CANNOT = frozenset(
    {
        "real-streams/responses/openai-gpt-4o-background-resume-starting-after.sse",  # no created
        "real-streams/responses/openai-gpt-5-nano-error-event-response-failed.sse",  # APIError
    }
)
CLIENT = OpenAI(api_key="sk-test-not-a-key", base_url="http://sdk.invalid/v1")


def sdk_stream(body: bytes) -> ResponseStream[Any]:
    request = httpx2.Request("POST", "http://sdk.invalid/v1/responses")
    response = httpx2.Response(
        200, content=body, request=request, headers={"content-type": "text/event-stream"}
    )
    raw: Stream[ResponseStreamEvent] = Stream(
        cast_to=cast(Any, ResponseStreamEvent), response=response, client=CLIENT
    )
    return ResponseStream(raw_stream=raw, text_format=omit, input_tools=omit, starting_after=None)


def sdk_run(body: bytes) -> tuple[Response, list[Any]]:
    """The SDK's events and final response for ``body``."""
    stream = sdk_stream(body)
    with warnings.catch_warnings():
        # The SDK's own model_dump of a web_search_call's ``action`` (a union it validates
        # loosely) emits a pydantic "serializer warnings" UserWarning on one capture
        # (openai-gpt-5-web-search-cached-tokens). It is the SDK's internal round trip, not
        # our code, and pyproject turns warnings into errors: ignore exactly that one.
        warnings.filterwarnings(
            "ignore", message="Pydantic serializer warnings", category=UserWarning
        )
        events = list(stream)
        final = stream.get_final_response()
    return final, events


def ours(body: bytes) -> tuple[ConversationResponse, list[SamplingEvent]]:
    events = replay("responses", [body], request_id="diff")
    assert isinstance(events[-1], Completed | Failed)
    return collect(events), events


def expected_usage(final: Response) -> Usage:
    usage = final.usage
    assert usage is not None
    details = usage.input_tokens_details
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=details.cached_tokens if details else 0,
        cache_write_tokens=(getattr(details, "cache_write_tokens", None) or 0) if details else 0,
        reasoning_tokens=usage.output_tokens_details.reasoning_tokens
        if usage.output_tokens_details
        else 0,
    )


#: ``incomplete_details.reason`` → our stop reason (the reason is ``raw_stop_reason``).
INCOMPLETE = {"max_output_tokens": StopReason.LENGTH, "content_filter": StopReason.CONTENT_FILTER}
#: The one ``oracle_caveat`` of this backend (by a phrase of it): the terminal snapshot's
#: ``output`` is empty by the backend's design, so the faithful reading is the streamed
#: items, compared delta by delta in `test_corpus_against_sdk`.
EMPTY_SNAPSHOT = "sends response.completed with `output: []`"
#: Captures whose ``response.completed`` text disagrees with the streamed deltas (25 streamed
#: characters, 1,638 in the final object): the response takes the server's, with warnings.
DELTAS_DISAGREE = {"real-streams-2/responses/openai-gpt-5.3-codex-cache-phase.sse"}


def expected_stop(final: Response, calls: list[Any]) -> tuple[StopReason, str]:
    """Deliberate: the SDK has no stop reason; ours, with its raw value."""
    refused = any(
        part.type == "refusal"
        for item in final.output
        if item.type == "message"
        for part in item.content
    )
    if final.status == "incomplete":
        assert final.incomplete_details is not None and final.incomplete_details.reason
        reason = final.incomplete_details.reason
        return INCOMPLETE.get(reason, StopReason.LENGTH), reason  # else a truncation too
    assert final.status == "completed"
    if refused:
        return StopReason.CONTENT_FILTER, "refusal"
    return (StopReason.TOOL_CALLS if calls else StopReason.STOP), "completed"


def compare_final(
    final: Response, response: ConversationResponse, entry: dict[str, Any] | None = None
) -> None:
    """Our response against the SDK's final ``Response`` (text, reasoning, tools, stop, usage)."""
    assert response.response_id == final.id and response.model == final.model
    assert response.usage == expected_usage(final)
    if final.usage is not None and final.usage.total_tokens is not None:
        assert response.usage.total_tokens == final.usage.total_tokens
    if EMPTY_SNAPSHOT in ((entry or {}).get("oracle_caveat") or ""):
        assert final.output == [] and response.text  # the caveat's faithful reading
        return
    if entry is not None and entry["id"] in DELTAS_DISAGREE:
        # The server's final word: its text, with a warning per corrected message.
        deltas = "".join(
            json.loads(sse.data).get("delta", "")
            for sse in SSEDecoder().feed(entry["path"].read_bytes())
            if sse.event == "response.output_text.delta"
        )
        assert "".join(w.streamed for w in response.warnings) == deltas
        assert "".join(w.final for w in response.warnings) == final.output_text != deltas
    else:
        assert response.warnings == ()
    assert response.text == final.output_text
    # Annotations are citations, each as received.
    assert [dict(c.raw) for c in response.citations] == [
        note.to_dict(mode="json")
        for item in final.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
        for note in part.annotations
    ]
    reasoning = [o for o in final.output if o.type == "reasoning"]
    assert len(response.reasoning_items) == len(reasoning)
    for mine, theirs in zip(response.reasoning_items, reasoning, strict=True):
        assert mine.id == theirs.id
        assert mine.summary == tuple(s.text for s in theirs.summary)
        assert mine.text == "".join(c.text for c in (theirs.content or []))
        assert mine.encrypted_content == theirs.encrypted_content
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        (c.call_id, c.name, c.arguments) for c in calls
    ]
    hosted = [o for o in final.output if o.type in HOSTED]
    assert [c.id for c in response.backend_tool_calls] == [getattr(o, "id", None) for o in hosted]
    assert (response.stop_reason, response.raw_stop_reason) == expected_stop(final, calls)


@pytest.mark.parametrize("entry", corpus.params("responses", skip=SDK_CANNOT))
def test_corpus_against_sdk(entry: dict[str, Any]) -> None:
    body = entry["path"].read_bytes()
    response, events = ours(body)
    try:
        final, sdk_events = sdk_run(body)
    except openai.APIError as exc:  # Deliberate: the SDK raises, we fail with the partial.
        end = events[-1]
        assert isinstance(end, Failed) and exc.message.startswith(end.error.message.rstrip("…"))
        return
    except RuntimeError as exc:
        # The SDK's stream helper takes only response.completed: an incomplete response is
        # compared through its terminal object (test_completed_object_validates_...).
        assert "response.completed" in str(exc) and b"event: response.incomplete" in body
        return
    compare_final(final, response, entry)
    # The live deltas agree too: text, and each function call's argument fragments.
    sdk_text = "".join(e.delta for e in sdk_events if e.type == "response.output_text.delta")
    our_text = "".join(
        e.text for e in events if isinstance(e, ChannelToken) and e.channel is SamplingChannel.TEXT
    )
    assert our_text == sdk_text
    sdk_reasoning = "".join(
        e.delta
        for e in sdk_events
        if e.type in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta")
    )
    our_reasoning = "".join(
        e.text
        for e in events
        if isinstance(e, ChannelToken) and e.channel is SamplingChannel.REASONING
    )
    assert our_reasoning == sdk_reasoning
    sdk_args: dict[str, str] = {}
    for e in sdk_events:
        if e.type == "response.function_call_arguments.delta":
            sdk_args[e.item_id] = e.snapshot  # the SDK's accumulated arguments so far
    our_args: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            our_args.setdefault(e.tool_index, []).append(e.arguments_delta)
    # Calls whose arguments arrive whole in output_item.done stream no fragment on either side.
    assert [a for a in ("".join(v) for _, v in sorted(our_args.items())) if a] == [
        a for a in sdk_args.values() if a
    ]


@pytest.mark.parametrize("entry", corpus.params("responses"))
def test_completed_object_validates_as_sdk_response(entry: dict[str, Any]) -> None:
    """Every terminal ``response`` object, parsed as the SDK's ``Response``, agrees with ours."""
    body = entry["path"].read_bytes()
    decoder = SSEDecoder()
    terminal = None
    for sse in decoder.feed(body) + decoder.close():
        if not sse.data.startswith("[DONE]"):
            payload = json.loads(sse.data)
            if payload["type"] in ("response.completed", "response.failed", "response.incomplete"):
                terminal = payload
    assert terminal is not None
    # The SDK's own parsing path (construct_type, as its Stream does): a strict
    # ``Response.model_validate`` rejects every real capture older than the 2026 schema,
    # which made ``input_tokens_details.cache_write_tokens`` required.
    final = construct_type(type_=Response, value=terminal["response"])
    assert isinstance(final, Response)
    response, events = ours(body)
    if final.status == "failed":
        end = events[-1]
        assert isinstance(end, Failed)
        assert final.error is not None and end.error.error_code == final.error.code
        return
    compare_final(final, response, entry)


@pytest.mark.real_streams
def test_resumed_stream_sdk_cannot_model() -> None:
    """GET ...?stream=true&starting_after=N: no response.created. Hand-written expectations."""
    body = (CORPUS / "responses/openai-gpt-4o-background-resume-starting-after.sse").read_bytes()
    with pytest.raises(RuntimeError, match=r"response\.created"):
        sdk_run(body)
    response, _ = ours(body)
    assert response.text == "2 + 2 equals 4."
    assert response.stop_reason is StopReason.STOP
    assert response.usage == Usage(input_tokens=15, output_tokens=9)
    assert response.response_id == "resp_0850765c843cca5300699cc47d93c0819089a181f5feeff8eb"


@pytest.mark.real_streams
def test_nested_error_event_sdk_raises_we_fail() -> None:
    body = (CORPUS / "responses/openai-gpt-5-nano-error-event-response-failed.sse").read_bytes()
    with pytest.raises(openai.APIError) as raised:
        sdk_run(body)
    _, events = ours(body)
    end = events[-1]
    assert isinstance(end, Failed)
    assert isinstance(raised.value.body, dict)
    assert end.error.error_code == raised.value.body["code"] == "insufficient_quota"
    assert end.error.message == raised.value.message
    # Deliberate: a classified kind; quota exhaustion is not retried.
    assert end.error.kind is SamplingErrorKind.RATE_LIMITED and not end.error.retryable


def test_refusal_against_sdk() -> None:
    """No real refusal capture exists: a hand-written stream in the documented shape."""
    item = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
    }
    created = {
        "id": "resp_r",
        "object": "response",
        "created_at": 1,
        "model": "gpt-x",
        "output": [],
        "status": "in_progress",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    payloads = [
        {"type": "response.created", "sequence_number": 0, "response": created},
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            "sequence_number": 2,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "refusal", "refusal": ""},
        },
        {
            "type": "response.refusal.delta",
            "sequence_number": 3,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "I can't help with that.",
        },
        {
            "type": "response.refusal.done",
            "sequence_number": 4,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "refusal": "I can't help with that.",
        },
        {
            "type": "response.content_part.done",
            "sequence_number": 5,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": item["content"][0],
        },
        {
            "type": "response.output_item.done",
            "sequence_number": 6,
            "output_index": 0,
            "item": item,
        },
        {
            "type": "response.completed",
            "sequence_number": 7,
            "response": {
                **created,
                "status": "completed",
                "output": [item],
                "usage": {
                    "input_tokens": 5,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 6,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 11,
                },
            },
        },
    ]
    body = "".join(f"event: {p['type']}\ndata: {json.dumps(p)}\n\n" for p in payloads).encode()
    final, _ = sdk_run(body)
    response, _ = ours(body)
    (message,) = final.output
    assert message.type == "message" and message.content[0].type == "refusal"
    assert response.refusal == message.content[0].refusal
    assert response.text == final.output_text == ""
    # Deliberate: a refusal is stop reason content_filter, raw value "refusal".
    assert response.stop_reason is StopReason.CONTENT_FILTER
    assert response.raw_stop_reason == "refusal"


@pytest.mark.real_streams
def test_truncated_stream_sdk_raises_we_fail() -> None:
    body = (CORPUS / "responses/openai-gpt-5.5-text.sse").read_bytes()
    cut = body[: body.index(b"event: response.completed")]
    with pytest.raises(RuntimeError, match=r"response\.completed"):
        sdk_run(cut)
    _, events = ours(cut)
    end = events[-1]
    assert isinstance(end, Failed)
    # Deliberate: a typed, retryable failure that keeps what was received.
    assert end.error.kind is SamplingErrorKind.TRANSPORT and end.error.retryable
    assert end.partial is not None and end.partial.text == "pong"
