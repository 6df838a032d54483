"""The usage ledger: every attempt's usage and cost recorded exactly once, whatever ends
it (completed, failed, cancelled in every way, a lost hedge), and the request's totals
its sum; a partial that is never ``None`` once content was delivered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_chunk, chat_usage, error_reply, make_config

from trio_sampler import ConversationRequest, User, open_sampler
from trio_sampler.actor import RequestStream, SamplerHandle
from trio_sampler.admission import Admission, AdmissionGate, Ticket
from trio_sampler.config import RetryPolicy, SamplerConfig
from trio_sampler.models import ModelCatalog
from trio_sampler.types import (
    AttemptOutcome,
    Cancelled,
    ChannelToken,
    Failed,
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
    assert end.metrics.total_usage == MILLION
    assert end.metrics.total_cost_usd_ticks == cost
    (attempt,) = end.metrics.attempts
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
    (attempt,) = end.metrics.attempts
    assert gate.settled == [attempt.usage] == [MILLION]
