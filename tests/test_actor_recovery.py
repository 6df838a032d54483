"""Recovery paths of the actor: doom-loop resampling, image stripping, empty replies,
the retry budget, and the mid-stream switch."""

from __future__ import annotations

import httpx2
import orjson
import pytest
import trio
import trio.testing
from fakes import DONE, Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config
from test_actor_contract import drain, one_terminal

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.doom_loop import DoomLoopPolicy, TailRepetitionDetector, parse_trigger
from trio_sampler.types import (
    ApiBackend,
    Completed,
    ConversationRequest,
    Failed,
    ImagePart,
    ImagesStripped,
    Retrying,
    SamplingErrorKind,
    StripReason,
    TextPart,
    User,
)

REQUEST = ConversationRequest(items=[User("think")])
LOOP = "I should check the premise again before answering. "


def in_one_read(chunks: list[bytes | float]) -> bytes:
    """The whole body as one network read."""
    return b"".join(chunk for chunk in chunks if isinstance(chunk, bytes))


def looping_reasoning(repeats: int) -> list[bytes | float]:
    chunks: list[bytes | float] = [chat_chunk({"reasoning_content": LOOP}) for _ in range(repeats)]
    return [*chunks, *chat_stream("answer")]


# -- the detector ---------------------------------------------------------------------


def test_detector_fires_on_tail_repetition() -> None:
    detector = TailRepetitionDetector(DoomLoopPolicy())
    assert detector.feed("Let me think about the problem from the start. ") is None
    trigger = None
    for _ in range(5):
        trigger = trigger or detector.feed(LOOP)
    assert trigger == "tail_repetition:4@reasoning"


def test_detector_quiet_on_varied_text() -> None:
    detector = TailRepetitionDetector(DoomLoopPolicy())
    words = [f"step {i} considers case {i * 7 % 13} and moves on. " for i in range(300)]
    assert all(detector.feed(w) is None for w in words)


def test_detector_ignores_short_stutter_but_not_a_long_one() -> None:
    detector = TailRepetitionDetector(DoomLoopPolicy())
    assert detector.feed("Well, " + "ha" * 30) is None  # repeated span under min_span_chars
    # Hundreds of characters of the same syllable are degenerate output, however short the unit.
    assert detector.feed("ha" * 200) == "tail_repetition:4@reasoning"


@pytest.mark.parametrize(
    ("label", "confident"),
    [
        ("tail_repetition:8@thinking", True),
        ("tail_repetition:80@thinking", False),
        ("tail_repetition:8@response", False),
        ("low_logprob@thinking", False),
        ("garbage", False),
    ],
)
def test_server_trigger_confidence(label: str, confident: bool) -> None:
    assert DoomLoopPolicy().is_confident(parse_trigger(label)) is confident


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="window_tokens"):
        DoomLoopPolicy(window_tokens=10)


# -- the actor ------------------------------------------------------------------------


async def test_doom_loop_resamples_then_accepts_disarmed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=looping_reasoning(6))])
    async with open_sampler(make_config(), transport=transport, seed=1) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert [r.kind for r in retrying] == [SamplingErrorKind.DOOM_LOOP_DETECTED] * 2
    assert all(0.0 <= r.delay <= 0.25 and r.discard_partial for r in retrying)
    assert retrying[0].doom_loop_triggers == ("tail_repetition:4@reasoning",)
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "answer"
    assert len(transport.requests) == 3  # two resamples, then the disarmed attempt
    # The disarmed attempt looped too: it is accepted, carrying the local trigger.
    assert terminal.response.doom_loop_signals == ("tail_repetition:4@reasoning",)


async def test_doom_loop_can_be_disabled(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([Reply(chunks=looping_reasoning(6))])
    async with open_sampler(
        make_config(), transport=transport, doom_loop=DoomLoopPolicy(enabled=False)
    ) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert not [e for e in events if isinstance(e, Retrying)]
    assert isinstance(one_terminal(events), Completed)


async def test_doom_loop_completed_in_the_final_read_is_judged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The whole looping stream, terminator included, arrives in one network read.
    transport = ScriptedTransport([Reply(chunks=[in_one_read(looping_reasoning(6))])])
    async with open_sampler(make_config(), transport=transport, seed=1) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert [r.kind for r in retrying] == [SamplingErrorKind.DOOM_LOOP_DETECTED] * 2
    assert all(r.doom_loop_triggers == ("tail_repetition:4@reasoning",) for r in retrying)
    assert all(r.discard_partial for r in retrying)
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "answer"
    assert terminal.response.doom_loop_signals == ("tail_repetition:4@reasoning",)
    assert len(transport.requests) == 3


@pytest.mark.parametrize("one_read", [False, True])
async def test_accepted_response_records_the_local_trigger_without_resampling(
    autojump_clock: trio.testing.MockClock, one_read: bool
) -> None:
    chunks = looping_reasoning(6)
    transport = ScriptedTransport([Reply(chunks=[in_one_read(chunks)] if one_read else chunks)])
    doom = DoomLoopPolicy(max_resamples=0)
    async with open_sampler(make_config(), transport=transport, doom_loop=doom) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert not [e for e in events if isinstance(e, Retrying)]
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed)
    assert terminal.response.doom_loop_signals == ("tail_repetition:4@reasoning",)
    assert len(transport.requests) == 1


async def test_disabled_detection_records_no_local_trigger(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=looping_reasoning(6))])
    doom = DoomLoopPolicy(enabled=False)
    async with open_sampler(make_config(), transport=transport, doom_loop=doom) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.doom_loop_signals == ()


def _responses_looping_body(*, server_triggers: list[str]) -> bytes:
    """A Responses stream: looping reasoning text, a server doom-loop check, an answer."""

    def event(payload: dict[str, object]) -> bytes:
        return (
            b"event: "
            + str(payload["type"]).encode()
            + b"\ndata: "
            + orjson.dumps(payload)
            + b"\n\n"
        )

    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "answer", "annotations": []}],
    }
    payloads: list[dict[str, object]] = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "m", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        *(
            {
                "type": "response.reasoning_text.delta",
                "item_id": "rs_1",
                "output_index": 0,
                "content_index": 0,
                "delta": LOOP,
            }
            for _ in range(6)
        ),
        {"type": "response.doom_loop_check", "doom_loop_check": {"triggers": server_triggers}},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**answer, "content": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "delta": "answer",
        },
        {"type": "response.output_item.done", "output_index": 1, "item": answer},
        {
            "type": "response.completed",
            "response": {"id": "resp_1", "model": "m", "status": "completed", "output": []},
        },
    ]
    return b"".join(event(p) for p in payloads)


async def test_accepted_response_carries_server_and_local_triggers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = _responses_looping_body(server_triggers=["low_logprob@response"])
    transport = ScriptedTransport([Reply(chunks=[body])])
    config = make_config(backend=ApiBackend.RESPONSES)
    doom = DoomLoopPolicy(max_resamples=0)
    async with open_sampler(config, transport=transport, doom_loop=doom) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "answer"
    assert terminal.response.doom_loop_signals == (
        "low_logprob@response",
        "tail_repetition:4@reasoning",
    )


async def test_images_stripped_once_on_413(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([error_reply(413), Reply(chunks=chat_stream("seen"))])
    request = ConversationRequest(
        items=[User([TextPart("look"), ImagePart("data:image/png;base64,AAAA")])]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(request))
    stripped = [e for e in events if isinstance(e, ImagesStripped)]
    assert stripped and stripped[0].stripped_urls == ("data:image/png;base64,AAAA",)
    assert stripped[0].reason is StripReason.PAYLOAD_HEURISTIC
    second = orjson.loads(transport.requests[1].content)
    assert "image_url" not in orjson.dumps(second).decode()
    assert isinstance(one_terminal(events), Completed)


async def test_image_rejected_without_images_fails(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport([error_reply(413)])
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.status_code == 413
    assert len(transport.requests) == 1


async def test_empty_reply_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport(
        [Reply(chunks=[chat_chunk({}, "stop"), DONE]), Reply(chunks=chat_stream("full"))]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert [e.kind for e in events if isinstance(e, Retrying)] == [SamplingErrorKind.EMPTY_RESPONSE]
    assert isinstance(one_terminal(events), Completed)


async def test_mid_stream_retry_can_be_switched_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "half"})], then="drop")])
    config = make_config(retry=RetryPolicy(retry_mid_stream=False))
    async with open_sampler(config, transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.error.kind is SamplingErrorKind.TRANSPORT
    assert terminal.partial is not None and terminal.partial.text == "half"


async def test_retry_budget_is_shared_across_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([error_reply(503)])
    policy = RetryPolicy(max_retries=10, retry_budget_ratio=0.1, retry_budget_window_s=1000.0)
    async with open_sampler(make_config(), transport=transport, retry_policy=policy) as sampler:
        streams = [await sampler.submit(REQUEST) for _ in range(5)]
        results = [one_terminal(await drain(s)) for s in streams]
    assert all(isinstance(r, Failed) for r in results)
    assert any("retry budget" in r.error.message for r in results if isinstance(r, Failed))
    # 5 first attempts + at most 10 retries (the budget's floor), far below 5 × 11.
    assert len(transport.requests) <= 15


async def test_malformed_chunk_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    transport = ScriptedTransport(
        [
            Reply(chunks=[chat_chunk({"content": "a"}), b"data: {not json\n\n"]),
            Reply(chunks=chat_stream("b")),
        ]
    )
    async with open_sampler(make_config(), transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    assert [e.kind for e in events if isinstance(e, Retrying)] == [SamplingErrorKind.SERIALIZATION]
    terminal = one_terminal(events)
    assert isinstance(terminal, Completed) and terminal.response.text == "b"


async def test_read_error_before_any_content_keeps_no_partial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport([Reply(error=httpx2.ConnectTimeout("slow"))])
    config = make_config(retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        events = await drain(await sampler.submit(REQUEST))
    terminal = one_terminal(events)
    assert isinstance(terminal, Failed) and terminal.partial is None


async def test_a_server_doom_signal_aborts_the_attempt_when_it_arrives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The server's confident check, then two seconds more of the looping stream: the
    # attempt ends at the check (no local trigger yet: the check comes first).
    body = _responses_looping_body(server_triggers=["tail_repetition:2@reasoning"])
    head, tail = body.split(b"event: response.output_item.done", 1)
    check_at = head.index(b"event: response.doom_loop_check")
    before, check = head[:check_at], head[check_at:]
    first = before.split(b"event: response.reasoning_text.delta", 2)
    chunks: list[bytes | float] = [
        first[0],
        check,
        2.0,
        b"event: response.output_item.done" + tail,
    ]
    transport = ScriptedTransport(
        [Reply(chunks=chunks), Reply(chunks=[_responses_looping_body(server_triggers=[])])]
    )
    config = make_config(backend=ApiBackend.RESPONSES)
    doom = DoomLoopPolicy(max_resamples=1)
    async with open_sampler(config, transport=transport, doom_loop=doom) as sampler:
        start = trio.current_time()
        stream = await sampler.submit(REQUEST)
        timed = []
        async for event in stream:
            timed.append((trio.current_time() - start, event))
    [(at, retry)] = [(at, e) for at, e in timed if isinstance(e, Retrying)]
    assert retry.kind is SamplingErrorKind.DOOM_LOOP_DETECTED
    assert "server detected" in retry.reason
    assert at < 1.0  # not 2 s later, at the end of the attempt
    assert isinstance(timed[-1][1], Completed)
