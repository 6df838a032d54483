"""The usage ledger: every attempt's usage and cost recorded exactly once, whatever ends
it (completed, failed, cancelled in every way, a lost hedge), and the request's totals
its sum; a partial that is never ``None`` once content was delivered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_chunk, chat_usage, error_reply, make_config
from test_routing import on

from trio_sampler import ConversationRequest, Route, RoutingPolicy, User, open_sampler
from trio_sampler.actor import RequestStream, SamplerHandle
from trio_sampler.actor._metrics import sum_usage
from trio_sampler.admission import Admission, AdmissionGate, Ticket
from trio_sampler.config import RetryPolicy, SamplerConfig
from trio_sampler.models import ModelCatalog
from trio_sampler.routing import HedgePolicy
from trio_sampler.types import (
    ApiBackend,
    AttemptOutcome,
    Cancelled,
    ChannelToken,
    Completed,
    Failed,
    RequestMetrics,
    Retrying,
    TerminalEvent,
    Usage,
)
from trio_sampler.wire import WireRequest

MODEL = "gpt-4o-mini"
MILLION = Usage(input_tokens=1_000_000, output_tokens=5)


def _billed_then_stall() -> Reply:
    """Text and usage reported (a million input tokens), then nothing more."""
    body = [
        chunk.replace(b'"test-model"', f'"{MODEL}"'.encode())
        for chunk in (chat_chunk({"content": "Hello"}), chat_usage(1_000_000, 5))
    ]
    return Reply(chunks=body, then="stall")


async def _by_stream_cancel(sampler: SamplerHandle, stream: RequestStream) -> TerminalEvent:
    stream.cancel()
    return await _terminal(stream)


async def _by_sampler_cancel(sampler: SamplerHandle, stream: RequestStream) -> TerminalEvent:
    await sampler.cancel(stream.request_id)
    return await _terminal(stream)


async def _by_leaving_the_block(sampler: SamplerHandle, stream: RequestStream) -> TerminalEvent:
    async with stream:
        pass
    assert stream.terminal is not None
    return stream.terminal


async def _terminal(stream: RequestStream) -> TerminalEvent:
    end = [event async for event in stream][-1]
    assert isinstance(end, Cancelled | Failed)
    return end


CANCELS: dict[str, Callable[[SamplerHandle, RequestStream], Awaitable[TerminalEvent]]] = {
    "stream.cancel": _by_stream_cancel,
    "sampler.cancel": _by_sampler_cancel,
    "leaving async with": _by_leaving_the_block,
}


def _metrics(end: TerminalEvent) -> RequestMetrics:
    assert end.metrics is not None
    return end.metrics


def _expected_cost() -> int:
    cost = ModelCatalog.load().cost_ticks(MODEL, MILLION)
    assert cost
    return cost


async def _wait_for_usage(stream: RequestStream) -> None:
    async for event in stream:
        if isinstance(event, ChannelToken):
            break
    await trio.sleep(1)  # the usage chunk is read after the text


def _assert_billed(end: TerminalEvent) -> None:
    assert isinstance(end, Cancelled)
    cost = _expected_cost()
    assert end.partial is not None and end.partial.usage == MILLION
    assert end.partial.cost_usd_ticks == cost
    assert _metrics(end).total_usage == MILLION
    assert _metrics(end).total_cost_usd_ticks == cost
    (attempt,) = _metrics(end).attempts
    assert attempt.outcome is AttemptOutcome.CANCELLED
    assert attempt.usage == MILLION and attempt.cost_usd_ticks == cost


@pytest.mark.parametrize("how", list(CANCELS))
async def test_a_cancelled_request_is_billed_like_a_failed_one(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([_billed_then_stall()])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        await _wait_for_usage(stream)
        end = await CANCELS[how](sampler, stream)
    _assert_billed(end)


async def test_a_request_cancelled_by_shutdown_is_billed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([_billed_then_stall()])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        await _wait_for_usage(stream)
    assert stream.terminal is not None
    _assert_billed(stream.terminal)


SECOND_ATTEMPTS = {
    "connect failure": Reply(error=OSError("connection refused")),
    "server error": error_reply(500),
    "empty body dropped": Reply(chunks=[], then="drop"),
}


@pytest.mark.parametrize("second_attempt", list(SECOND_ATTEMPTS))
@pytest.mark.parametrize("late", [True, False])
async def test_failed_partial_is_kept_when_the_consumer_reads_late_after_a_retry(
    second_attempt: str, late: bool, autojump_clock: trio.testing.MockClock
) -> None:
    # Attempt 1 streams text and drops; attempt 2 fails before any content. The consumer
    # reads only after the end: it is shown attempt 1's text, so the partial keeps it.
    first = Reply(chunks=[chat_chunk({"content": "Hello"})], then="drop")
    second = SECOND_ATTEMPTS[second_attempt]
    transport = ScriptedTransport([first, second])
    config = make_config(retry=RetryPolicy(max_retries=1, base_delay=0.01))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        if late:
            await trio.sleep(5)
        events = [event async for event in stream]
    assert any(isinstance(e, ChannelToken) for e in events)
    assert any(isinstance(e, Retrying) for e in events)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.partial is not None and end.partial.text == "Hello"


class _Settled(Ticket):
    def __init__(self, settled: list[Usage | None]) -> None:
        self.settled = settled

    async def settle(self, usage: Usage | None) -> None:
        self.settled.append(usage)


class _Recording(AdmissionGate):
    def __init__(self) -> None:
        self.settled: list[Usage | None] = []

    async def admit(
        self, wire: WireRequest, config: SamplerConfig, *, deadline: float, first_attempt: bool
    ) -> Ticket:
        await trio.lowlevel.checkpoint()
        return _Settled(self.settled)


class _Admission(Admission):
    def __init__(self, gate: AdmissionGate) -> None:
        self.gate = gate

    def open(self) -> AbstractAsyncContextManager[AdmissionGate]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[AdmissionGate]:
            yield self.gate

        return opened()


@pytest.mark.parametrize("how", list(CANCELS))
async def test_the_admission_settles_a_cancelled_attempt_with_what_the_ledger_bills(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    gate = _Recording()
    transport = ScriptedTransport([_billed_then_stall()])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport, admission=_Admission(gate)) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        await _wait_for_usage(stream)
        end = await CANCELS[how](sampler, stream)
    (attempt,) = _metrics(end).attempts
    assert gate.settled == [attempt.usage] == [MILLION]


def _sse(*events: dict[str, object]) -> list[bytes | float]:
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


def _fallback_stream() -> list[bytes | float]:
    """A Messages answer that opus hands to haiku half way (a server-side fallback), the
    usage of the hop reported in ``usage.iterations``."""
    fallback = {
        "type": "fallback",
        "from": {"model": "claude-opus-4-1"},
        "to": {"model": "claude-haiku-4-5"},
        "trigger": "overloaded",
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-4-1",
        "content": [],
        "usage": {"input_tokens": 1000, "output_tokens": 1},
    }
    return _sse(
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": fallback},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {
                "input_tokens": 1000,
                "output_tokens": 300,
                "iterations": [
                    {"type": "message", "input_tokens": 1000, "output_tokens": 100},
                    {"type": "fallback_message", "input_tokens": 0, "output_tokens": 200},
                ],
            },
        },
        {"type": "message_stop"},
    )


async def test_a_fallback_hop_bills_each_model_its_share_exactly_once() -> None:
    transport = ScriptedTransport([Reply(chunks=_fallback_stream())])
    config = make_config(
        backend=ApiBackend.MESSAGES, model="claude-opus-4-1", base_url="http://fake.test"
    )
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        end = [event async for event in stream][-1]
    assert isinstance(end, Completed)
    catalog = ModelCatalog.load()
    first, hop = _metrics(end).ledger
    assert (first.model, first.usage, first.hop) == (
        "claude-opus-4-1",
        Usage(input_tokens=1000, output_tokens=100),
        False,
    )
    assert (hop.model, hop.usage, hop.hop) == ("claude-haiku-4-5", Usage(output_tokens=200), True)
    first_cost = catalog.cost_ticks("claude-opus-4-1", Usage(input_tokens=1000, output_tokens=100))
    hop_cost = catalog.cost_ticks("claude-haiku-4-5", Usage(output_tokens=200))
    assert first_cost and hop_cost
    assert (first.cost_usd_ticks, hop.cost_usd_ticks) == (first_cost, hop_cost)
    total = first_cost + hop_cost
    # The usage is counted once (the hop's is a part of the response's, not more of it),
    # the cost is each model's share: the response, the attempt and the totals agree.
    assert _metrics(end).total_usage == end.response.usage == Usage(1000, 300)
    assert _metrics(end).total_cost_usd_ticks == total == end.response.cost_usd_ticks
    (attempt,) = _metrics(end).attempts
    assert attempt.cost_usd_ticks == total


def _assert_ledger_sums(end: TerminalEvent) -> None:
    """The ledger's invariants: the totals are its sum, and each attempt's lines sum to
    what its record says it cost."""
    ledger = _metrics(end).ledger
    usages = [line.usage for line in ledger if line.usage is not None]
    costs = [line.cost_usd_ticks for line in ledger if line.cost_usd_ticks is not None]
    assert _metrics(end).total_usage == (sum_usage(usages) if usages else None)
    assert _metrics(end).total_cost_usd_ticks == (sum(costs) if costs else None)
    assert sorted({line.attempt for line in ledger}) == [a.attempt for a in _metrics(end).attempts]
    for record in _metrics(end).attempts:
        lines = [line for line in ledger if line.attempt == record.attempt]
        assert all(line.outcome is record.outcome for line in lines)
        line_costs = [line.cost_usd_ticks for line in lines if line.cost_usd_ticks is not None]
        assert record.cost_usd_ticks == (sum(line_costs) if line_costs else None)


async def test_every_attempt_of_a_retried_request_is_in_the_ledger_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two billed attempts that drop mid-stream, then one that completes.
    dropped = Reply(
        chunks=[
            chunk.replace(b'"test-model"', f'"{MODEL}"'.encode())
            for chunk in (chat_chunk({"content": "Hel"}), chat_usage(400, 3))
        ],
        then="drop",
    )
    whole = Reply(
        chunks=[
            chunk.replace(b'"test-model"', f'"{MODEL}"'.encode())
            for chunk in (
                chat_chunk({"content": "Hello"}),
                chat_chunk({}, "stop"),
                chat_usage(400, 7),
                b"data: [DONE]\n\n",
            )
        ]
    )
    transport = ScriptedTransport([dropped, dropped, whole])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=3, base_delay=0.01))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        end = [event async for event in stream][-1]
    assert isinstance(end, Completed)
    _assert_ledger_sums(end)
    assert [line.usage for line in _metrics(end).ledger] == [
        Usage(400, 3),
        Usage(400, 3),
        Usage(400, 7),
    ]
    assert _metrics(end).total_usage == Usage(1200, 13)


@pytest.mark.parametrize("how", list(CANCELS))
async def test_a_cancelled_requests_ledger_sums_to_its_totals(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([_billed_then_stall()])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        await _wait_for_usage(stream)
        end = await CANCELS[how](sampler, stream)
    _assert_ledger_sums(end)
    (line,) = _metrics(end).ledger
    assert line.outcome is AttemptOutcome.CANCELLED and line.usage == MILLION


async def test_a_cancel_during_a_hedged_race_bills_both_lanes_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Both attempts report their input before any content, then hang; the hedge starts
    # after 1 s and the request is cancelled at 3 s: two cancelled lines, each billed.
    def reported(prompt: int) -> Reply:
        usage = chat_usage(prompt=prompt, completion=0).replace(b"test-model", MODEL.encode())
        return Reply(chunks=[usage, 60.0], then="stall")

    routing = RoutingPolicy(
        [Route("a", on("a", retry=RetryPolicy(max_retries=0), model=MODEL))],
        hedge=HedgePolicy(delay_s=1.0),
    )
    transport = ScriptedTransport([reported(1000), reported(2000)])
    async with open_sampler(routing.routes[0].config, routing=routing, transport=transport) as s:
        stream = await s.submit(ConversationRequest(items=[User("hi")]))
        await trio.sleep(3.0)
        stream.cancel()
        end = await _terminal(stream)
    assert isinstance(end, Cancelled)
    _assert_ledger_sums(end)
    lines = _metrics(end).ledger
    assert [(line.attempt, line.outcome) for line in lines] == [
        (1, AttemptOutcome.CANCELLED),
        (2, AttemptOutcome.CANCELLED),
    ]
    assert [line.usage for line in lines] == [Usage(1000, 0), Usage(2000, 0)]
    assert _metrics(end).total_usage == Usage(3000, 0)
    assert _metrics(end).total_cost_usd_ticks == ModelCatalog.load().cost_ticks(
        MODEL, Usage(3000, 0)
    )


async def test_an_attempt_with_content_and_no_usage_report_is_billed_an_estimate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two content chunks, then the connection drops before the usage chunk; then a 500.
    cut = Reply(
        chunks=[
            _text_chunk("Hello"),
            _text_chunk(" world"),
        ],
        then="drop",
    )
    transport = ScriptedTransport([cut, error_reply(500)])
    config = make_config(model=MODEL, retry=RetryPolicy(max_retries=1, base_delay=0.01))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        end = [event async for event in stream][-1]
    assert isinstance(end, Failed)
    _assert_ledger_sums(end)
    estimate, refused = _metrics(end).ledger
    prompt = -(-len(transport.requests[0].content) // 4)
    assert estimate.estimated, estimate
    # The output: the attempt's content events (two text pieces and the first-token mark).
    assert estimate.usage == Usage(input_tokens=prompt, output_tokens=3)
    assert estimate.cost_usd_ticks == ModelCatalog.load().cost_ticks(MODEL, estimate.usage)
    # A refusal carried no content: nothing billed, nothing estimated.
    assert (refused.usage, refused.cost_usd_ticks, refused.estimated) == (None, None, False)
    assert _metrics(end).total_usage == estimate.usage


def _text_chunk(piece: str) -> bytes:
    return chat_chunk({"content": piece}).replace(b'"test-model"', f'"{MODEL}"'.encode())


def _messages_text(piece: str) -> list[bytes | float]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    block = {"type": "text", "text": ""}
    return _sse(
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
    )


def _responses_text(piece: str) -> list[bytes | float]:
    response = {
        "id": "resp_1",
        "object": "response",
        "model": "m",
        "status": "in_progress",
        "output": [],
    }
    item = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    return _sse(
        {"type": "response.created", "sequence_number": 0, "response": response},
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": item,
        },
        {
            "type": "response.content_part.added",
            "sequence_number": 2,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 3,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": piece,
        },
    )


@pytest.mark.parametrize(
    ("backend", "body"),
    [(ApiBackend.MESSAGES, _messages_text), (ApiBackend.RESPONSES, _responses_text)],
)
async def test_failed_partial_is_kept_after_a_retry_on_every_backend(
    backend: ApiBackend,
    body: Callable[[str], list[bytes | float]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = Reply(chunks=body("Hello"), then="drop")
    transport = ScriptedTransport([first, error_reply(500)])
    config = make_config(backend=backend, retry=RetryPolicy(max_retries=1, base_delay=0.01))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        events = [event async for event in stream]
    assert any(isinstance(e, ChannelToken) for e in events)
    end = events[-1]
    assert isinstance(end, Failed)
    assert end.partial is not None and end.partial.text == "Hello"
