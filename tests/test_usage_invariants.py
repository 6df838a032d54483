"""Usage invariants: a report that breaks them is kept as sent but flagged (on the usage,
so on the response and in the metrics alike), never priced into a negative cost; and a
partial output is priced like a response."""

from __future__ import annotations

import pytest
from fakes import Reply, ScriptedTransport, chat_chunk, chat_usage, make_config

from trio_sampler import (
    ConversationRequest,
    ConversationResponse,
    Failed,
    Usage,
    User,
    open_sampler,
)
from trio_sampler.config import RetryPolicy
from trio_sampler.models import ModelCatalog
from trio_sampler.types import UsageViolation
from trio_sampler.wire._usage import malformed_counts


@pytest.mark.parametrize(
    ("usage", "violations"),
    [
        (Usage(input_tokens=10, output_tokens=5), ()),
        (Usage(input_tokens=10, cache_read_tokens=50), (UsageViolation.CACHE_EXCEEDS_INPUT,)),
        (
            Usage(input_tokens=-5, output_tokens=3),
            (UsageViolation.NEGATIVE_COUNT,),
        ),
        (Usage(output_tokens=3, reasoning_tokens=9), (UsageViolation.REASONING_EXCEEDS_OUTPUT,)),
        (
            Usage(input_tokens=1, cache_write_tokens=2, output_tokens=-1),
            (UsageViolation.NEGATIVE_COUNT, UsageViolation.CACHE_EXCEEDS_INPUT),
        ),
    ],
)
def test_violations_are_flagged_and_kept_as_reported(
    usage: Usage, violations: tuple[UsageViolation, ...]
) -> None:
    assert usage.violations == violations
    response = ConversationResponse(usage=usage)
    assert response.usage_violations == violations
    assert response.usage is usage  # kept as sent


def test_a_negative_count_is_never_priced_into_a_negative_cost() -> None:
    catalog = ModelCatalog.load()
    cost = catalog.cost_ticks("gpt-4o", Usage(input_tokens=10, output_tokens=-10_000))
    assert cost == catalog.cost_ticks("gpt-4o", Usage(input_tokens=10))
    assert cost is not None and cost >= 0
    negative_cache = Usage(input_tokens=10, cache_read_tokens=-100, cache_write_tokens=-5)
    assert catalog.cost_ticks("gpt-4o", negative_cache) == cost


async def test_a_failed_requests_partial_is_priced() -> None:
    # Text and usage arrive, then the connection drops: the partial is billed.
    body = [
        chunk.replace(b'"test-model"', b'"gpt-4o-mini"')
        for chunk in (chat_chunk({"content": "Hello"}), chat_usage(1000, 50))
    ]
    transport = ScriptedTransport([Reply(chunks=body, then="drop")])
    config = make_config(model="gpt-4o-mini", retry=RetryPolicy(max_retries=0))
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        events = [event async for event in stream]
    end = events[-1]
    assert isinstance(end, Failed) and end.partial is not None
    expected = ModelCatalog.load().cost_ticks("gpt-4o-mini", Usage(1000, 50))
    assert end.partial.usage == Usage(input_tokens=1000, output_tokens=50)
    assert end.partial.cost_usd_ticks == expected and expected


def _transform_usage(backend: str, usage: dict[str, object]) -> Usage | None:
    """The usage a backend's transform reads from a stream ending with ``usage``."""
    import json

    from trio_sampler.wire import new_transform
    from trio_sampler.wire.sse import SSEDecoder

    if backend == "chat_completions":
        chunk = {"id": "c", "model": "m", "choices": [], "usage": usage}
        body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    elif backend == "responses":
        response = {"id": "r", "status": "completed", "output": [], "usage": usage}
        event = {"type": "response.completed", "response": response}
        body = b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n"
    else:
        start = {"type": "message_start", "message": {"id": "m", "usage": usage}}
        stop = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}
        events: list[tuple[str, object]] = [
            ("message_start", start),
            ("message_delta", stop),
            ("message_stop", {"type": "message_stop"}),
        ]
        body = b"".join(
            b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"
            for name, data in events
        )
    transform = new_transform(backend, "req")
    decoder = SSEDecoder()
    for sse in decoder.feed(body) + decoder.close():
        transform.feed(sse)
    return transform.acc.usage


@pytest.mark.parametrize(
    ("backend", "usage", "named"),
    [
        ("chat_completions", {"prompt_tokens": "12", "completion_tokens": 5}, "prompt_tokens"),
        ("responses", {"input_tokens": 10, "output_tokens": [5]}, "output_tokens"),
        ("messages", {"input_tokens": "10", "output_tokens": 5}, "input_tokens"),
    ],
)
def test_a_count_sent_as_a_string_is_flagged_and_not_priced(
    backend: str, usage: dict[str, object], named: str
) -> None:
    read = _transform_usage(backend, usage)
    assert read is not None and read.malformed == 1
    assert malformed_counts(usage) == (named,)
    assert UsageViolation.MALFORMED_COUNT in read.violations
    assert ModelCatalog.load().cost_ticks("gpt-4o", read) is None


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
def test_an_absurd_count_is_flagged_and_not_priced(backend: str) -> None:
    huge = 10**30 if backend != "chat_completions" else 1e30
    names = {
        "chat_completions": ("prompt_tokens", "completion_tokens"),
        "responses": ("input_tokens", "output_tokens"),
        "messages": ("input_tokens", "output_tokens"),
    }[backend]
    read = _transform_usage(backend, {names[0]: 10, names[1]: huge})
    assert read is not None
    assert UsageViolation.IMPLAUSIBLE_COUNT in read.violations
    assert not read.priceable
    assert ModelCatalog.load().cost_ticks("gpt-4o", read) is None
    # A real usage is priced as ever.
    assert ModelCatalog.load().cost_ticks("gpt-4o", Usage(10, 5)) is not None
