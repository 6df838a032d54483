"""The bridge (``docs/bridge-and-agent.md``): one request → one outcome, events forwarded
in order."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.bridge import (
    CONTEXT_WINDOW_STOP_REASON,
    SamplerTurnOutcome,
    TurnCancelled,
    TurnCompactAndResubmit,
    TurnFatal,
    TurnRefreshAuthAndResubmit,
    TurnResponse,
    _TurnAccumulation,
    outcome_for_terminal,
    run_turn_via_sampler,
)
from trio_sampler.config import SamplerConfig
from trio_sampler.types import (
    Assistant,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    User,
)

REQUEST = ConversationRequest(items=[User("hello")])
K = SamplingErrorKind
CONTEXT_BODY: dict[str, object] = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}

# Every error kind → (outcome without a refresher, outcome with one).
TRANSLATION: dict[SamplingErrorKind, tuple[type[object], type[object]]] = {
    K.AUTH: (TurnFatal, TurnRefreshAuthAndResubmit),
    K.HTTP: (TurnFatal, TurnFatal),
    K.API: (TurnFatal, TurnFatal),
    K.SERIALIZATION: (TurnFatal, TurnFatal),
    K.IDLE_TIMEOUT: (TurnFatal, TurnFatal),
    K.RATE_LIMITED: (TurnFatal, TurnFatal),
    K.EMPTY_RESPONSE: (TurnFatal, TurnFatal),
    K.MAX_TOKENS_TRUNCATION: (TurnFatal, TurnFatal),
    K.DOOM_LOOP_DETECTED: (TurnFatal, TurnFatal),
    K.CONTEXT_LENGTH_EXCEEDED: (TurnCompactAndResubmit, TurnCompactAndResubmit),
    K.OVERLOADED: (TurnFatal, TurnFatal),
    K.INVALID_REQUEST: (TurnFatal, TurnFatal),
    K.PAYLOAD_TOO_LARGE: (TurnFatal, TurnFatal),
    K.CONTENT_FILTER: (TurnFatal, TurnFatal),
    K.TRANSPORT: (TurnFatal, TurnFatal),
    K.FLEET_UNAVAILABLE: (TurnFatal, TurnFatal),
    K.INTERNAL: (TurnFatal, TurnFatal),
}


def test_translation_table_covers_every_kind() -> None:
    assert set(TRANSLATION) == set(SamplingErrorKind)


@pytest.mark.parametrize("kind", list(SamplingErrorKind), ids=lambda k: k.value)
@pytest.mark.parametrize("can_refresh", [False, True], ids=["no_refresher", "refresher"])
def test_failed_translation(kind: SamplingErrorKind, can_refresh: bool) -> None:
    partial = ConversationResponse(items=[Assistant("so far")])
    error = SamplingErrorInfo(kind=kind, message="boom")
    outcome = outcome_for_terminal(Failed("r1", error, partial), can_refresh_auth=can_refresh)
    assert type(outcome) is TRANSLATION[kind][can_refresh]
    assert outcome.request_id == "r1"
    assert not isinstance(outcome, TurnResponse | TurnCancelled)
    assert outcome.error is error
    if not isinstance(outcome, TurnRefreshAuthAndResubmit):
        assert outcome.partial is partial


@pytest.mark.parametrize(
    ("status", "error_type", "expected"),
    [
        pytest.param(401, "authentication_error", TurnRefreshAuthAndResubmit, id="401"),
        pytest.param(None, "authentication_error", TurnRefreshAuthAndResubmit, id="in-stream"),
        pytest.param(403, "permission_error", TurnFatal, id="403"),
        pytest.param(None, "permission_error", TurnFatal, id="permission-in-stream"),
    ],
)
def test_only_credential_failures_ask_for_a_refresh(
    status: int | None, error_type: str, expected: type[object]
) -> None:
    """A 403 means the key is valid but not allowed: a fresh key will not help."""
    error = SamplingErrorInfo(kind=K.AUTH, message="no", status_code=status, error_type=error_type)
    outcome = outcome_for_terminal(Failed("r", error), can_refresh_auth=True)
    assert type(outcome) is expected


def test_completed_translation() -> None:
    response = ConversationResponse(items=[Assistant("hi")], stop_reason=StopReason.STOP)
    outcome = outcome_for_terminal(Completed("r", response), can_refresh_auth=False)
    assert outcome == TurnResponse(response, None, "r")


def test_context_window_stop_reason_is_compaction() -> None:
    response = ConversationResponse(
        items=[Assistant("cut")],
        stop_reason=StopReason.LENGTH,
        raw_stop_reason=CONTEXT_WINDOW_STOP_REASON,
    )
    outcome = outcome_for_terminal(Completed("r", response), can_refresh_auth=True)
    assert isinstance(outcome, TurnCompactAndResubmit)
    assert outcome.error.kind is K.CONTEXT_LENGTH_EXCEEDED
    assert outcome.error.error_code == CONTEXT_WINDOW_STOP_REASON
    assert outcome.partial is response


def test_plain_length_stop_is_a_response() -> None:
    response = ConversationResponse(
        items=[Assistant("cut")], stop_reason=StopReason.LENGTH, raw_stop_reason="length"
    )
    outcome = outcome_for_terminal(Completed("r", response), can_refresh_auth=False)
    assert isinstance(outcome, TurnResponse)


def test_cancelled_translation_uses_own_accumulation_when_terminal_has_none() -> None:
    mine = ConversationResponse(items=[Assistant("mine")])
    outcome = outcome_for_terminal(
        Cancelled("r", "stop", None), can_refresh_auth=False, partial=mine
    )
    assert outcome == TurnCancelled("stop", mine, None, "r")


def test_accumulation_resets_on_discard_partial() -> None:
    acc = _TurnAccumulation()
    assert acc.response() is None
    acc.add(ChannelToken("r", SamplingChannel.TEXT, "old", 1))
    acc.add(Retrying("r", 1, 4, K.TRANSPORT, "reset", 0.5, discard_partial=False))
    acc.add(ChannelToken("r", SamplingChannel.TEXT, " kept", 2))
    response = acc.response()
    assert response is not None and response.text == "old kept"
    acc.add(Retrying("r", 2, 4, K.TRANSPORT, "reset", 0.5, discard_partial=True))
    acc.add(ChannelToken("r", SamplingChannel.TEXT, "new", 1))
    response = acc.response()
    assert response is not None and response.text == "new"


# -- through the actor ------------------------------------------------------------------


async def run(
    script: list[Reply],
    *,
    refresher: bool = False,
    config: SamplerConfig | None = None,
) -> tuple[SamplerTurnOutcome, list[SamplingEvent], ScriptedTransport]:
    transport = ScriptedTransport(script)
    events: list[SamplingEvent] = []

    async def refresh() -> SamplerConfig:
        raise AssertionError("the bridge must not call the refresher")

    async with open_sampler(make_config(), transport=transport) as sampler:
        outcome = await run_turn_via_sampler(
            sampler,
            REQUEST,
            on_event=events.append,
            refresh_credentials=refresh if refresher else None,
            config=config,
        )
    return outcome, events, transport


async def test_response_and_events_forwarded_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcome, events, _ = await run([Reply(chunks=chat_stream("Hel", "lo"))])
    assert isinstance(outcome, TurnResponse)
    assert outcome.response.text == "Hello"
    assert outcome.metrics is not None
    assert isinstance(events[-1], Completed)
    assert [e.text for e in events if isinstance(e, ChannelToken)] == ["Hel", "lo"]


async def test_async_callback_is_awaited(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[str] = []

    async def on_event(event: SamplingEvent) -> None:
        await trio.sleep(1)  # a slow consumer: the stream waits for it
        seen.append(type(event).__name__)

    transport = ScriptedTransport([Reply(chunks=chat_stream("a", "b"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        outcome = await run_turn_via_sampler(sampler, REQUEST, on_event=on_event)
    assert isinstance(outcome, TurnResponse)
    assert seen[0] == "StreamStarted" and seen[-1] == "Completed"


async def test_context_length_error_is_compact(autojump_clock: trio.testing.MockClock) -> None:
    outcome, events, transport = await run([error_reply(400, CONTEXT_BODY)])
    assert isinstance(outcome, TurnCompactAndResubmit)
    assert outcome.error.kind is K.CONTEXT_LENGTH_EXCEEDED
    assert len(transport.requests) == 1  # never retried
    assert isinstance(events[-1], Failed)


async def test_context_window_stop_reason_on_the_wire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcome, _, _ = await run([Reply(chunks=chat_stream("x", finish=CONTEXT_WINDOW_STOP_REASON))])
    assert isinstance(outcome, TurnCompactAndResubmit)
    assert outcome.partial is not None and outcome.partial.text == "x"


async def test_401_with_refresher_asks_for_refresh(autojump_clock: trio.testing.MockClock) -> None:
    outcome, _, transport = await run([error_reply(401)], refresher=True)
    assert isinstance(outcome, TurnRefreshAuthAndResubmit)
    assert outcome.error.status_code == 401
    assert len(transport.requests) == 1


async def test_401_without_refresher_is_fatal(autojump_clock: trio.testing.MockClock) -> None:
    outcome, _, _ = await run([error_reply(401)])
    assert isinstance(outcome, TurnFatal)
    assert outcome.error.kind is K.AUTH


async def test_other_failure_is_fatal(autojump_clock: trio.testing.MockClock) -> None:
    outcome, _, _ = await run([error_reply(404)], refresher=True)
    assert isinstance(outcome, TurnFatal)


async def test_retry_with_discard_partial_gives_last_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dropped = Reply(chunks=[chat_chunk({"content": "lost"})], then="drop")
    outcome, events, _ = await run([dropped, Reply(chunks=chat_stream("kept"))])
    assert isinstance(outcome, TurnResponse)
    assert outcome.response.text == "kept"
    retries = [e for e in events if isinstance(e, Retrying)]
    assert len(retries) == 1 and retries[0].discard_partial


async def test_config_override_is_used(autojump_clock: trio.testing.MockClock) -> None:
    fresh = make_config(api_key="sk-fresh-key")
    outcome, _, transport = await run([Reply(chunks=chat_stream("ok"))], config=fresh)
    assert isinstance(outcome, TurnResponse)
    assert transport.requests[0].headers["authorization"] == "Bearer sk-fresh-key"


async def test_cancel_from_elsewhere_is_cancelled_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "part"})], then="stall")])
    async with open_sampler(make_config(), transport=transport) as sampler:

        async def cancel_on_token(event: SamplingEvent) -> None:
            if isinstance(event, ChannelToken):
                await sampler.cancel(event.request_id, "user pressed stop")

        outcome = await run_turn_via_sampler(sampler, REQUEST, on_event=cancel_on_token)
    assert isinstance(outcome, TurnCancelled)
    assert outcome.reason == "user pressed stop"
    assert outcome.partial is not None and outcome.partial.text == "part"


async def test_caller_cancelled_cancels_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    async with open_sampler(make_config(), transport=transport) as sampler:
        with trio.move_on_after(5) as scope:
            await run_turn_via_sampler(sampler, REQUEST)
        assert scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
        assert await sampler.active_count() == 0
    assert transport.closed_bodies == 1


async def test_callback_exception_cancels_and_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])

    def broken(event: SamplingEvent) -> None:
        if isinstance(event, ChannelToken):
            raise KeyError("ui bug")

    async with open_sampler(make_config(), transport=transport) as sampler:
        with pytest.raises(KeyError):
            await run_turn_via_sampler(sampler, REQUEST, on_event=broken)
        await trio.testing.wait_all_tasks_blocked()
        assert await sampler.active_count() == 0
