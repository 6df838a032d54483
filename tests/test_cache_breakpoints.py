"""One cache-breakpoint model: Anthropic ``cache_control`` and OpenAI's explicit prompt
caching (``prompt_cache_breakpoint``, ``prompt_cache_options``), in the builders, the
price list and the emulator."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

from trio_sampler.models import TICKS_PER_USD, ModelCatalog
from trio_sampler.testing import EmulatorFixture, emulator
from trio_sampler.types import (
    Assistant,
    ConversationItem,
    ConversationRequest,
    ImagePart,
    System,
    TextPart,
    ToolSpec,
    Usage,
    User,
)
from trio_sampler.wire import build_request
from trio_sampler.wire._cache import explicit_prompt_caching
from trio_sampler.wire._request import BuildOptions, ConversionAction

__all__ = ["emulator"]

MARK = {"mode": "explicit"}
OPENAI = BuildOptions(provider="openai", model="gpt-6-luna")


def _parts(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [
        part
        for message in body[key]
        if isinstance(message.get("content"), list)
        for part in message["content"]
    ]


def _marked(body: dict[str, Any], key: str, mark: str) -> list[Any]:
    return [p.get("text", p.get("type")) for p in _parts(body, key) if mark in p]


def _two_turns(system: str) -> tuple[ConversationRequest, ConversationRequest]:
    first: list[ConversationItem] = [System(system), User("first question")]
    second = [*first, Assistant("first answer"), User("second question")]
    return ConversationRequest(first), ConversationRequest(second)


def test_responses_marks_the_tip_and_the_previous_tip_with_explicit_mode() -> None:
    _, second = _two_turns("be brief")
    wire = build_request("responses", second, OPENAI)
    body = orjson.loads(wire.body)
    # Instructions take no breakpoint: the tip and the previous request's tip are marked.
    assert _marked(body, "input", "prompt_cache_breakpoint") == [
        "first question",
        "second question",
    ]
    assert all(p.get("prompt_cache_breakpoint", MARK) == MARK for p in _parts(body, "input"))
    assert body["prompt_cache_options"] == {"mode": "explicit"}
    assert wire.report.lossless


def test_chat_marks_system_tip_and_previous_tip_and_sends_the_ttl() -> None:
    _, second = _two_turns("be brief")
    options = BuildOptions(provider="openai", model="gpt-5.6-sol", prompt_cache_ttl="30m")
    body = orjson.loads(build_request("chat_completions", second, options).body)
    assert _marked(body, "messages", "prompt_cache_breakpoint") == [
        "be brief",
        "first question",
        "second question",
    ]
    assert body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}


@pytest.mark.parametrize(
    "options",
    [
        BuildOptions(provider="openai", model="gpt-4o"),  # caches automatically
        BuildOptions(model="gpt-6-luna"),  # no provider: a compatible server
        BuildOptions(provider="openai", model="gpt-6-luna", cache_breakpoints=False),
    ],
)
def test_no_openai_breakpoints_where_they_do_not_apply(options: BuildOptions) -> None:
    _, second = _two_turns("be brief")
    for backend, key in (("responses", "input"), ("chat_completions", "messages")):
        body = orjson.loads(build_request(backend, second, options).body)
        assert _marked(body, key, "prompt_cache_breakpoint") == []
        assert "prompt_cache_options" not in body


def test_caller_marks_come_first_and_past_four_are_dropped_and_reported() -> None:
    parts = [TextPart(f"part {n}", cache_breakpoint=True) for n in range(5)]
    request = ConversationRequest([User([*parts, ImagePart("https://example.com/a.png")])])
    for backend, key, mark in (
        ("responses", "input", "prompt_cache_breakpoint"),
        ("chat_completions", "messages", "prompt_cache_breakpoint"),
        ("messages", "messages", "cache_control"),
    ):
        wire = build_request(backend, request, OPENAI)
        body = orjson.loads(wire.body)
        assert _marked(body, key, mark) == ["part 0", "part 1", "part 2", "part 3"], backend
        (note,) = wire.report.notes
        assert note.what == "cache breakpoints" and note.action is ConversionAction.DROPPED


def test_messages_tool_marks_count_towards_the_four() -> None:
    tools = [ToolSpec(f"t{n}", cache_breakpoint=True) for n in range(3)]
    parts = [TextPart("a", cache_breakpoint=True), TextPart("b", cache_breakpoint=True)]
    wire = build_request(
        "messages", ConversationRequest([System("rules"), User(parts)], tools=tools), OPENAI
    )
    body = orjson.loads(wire.body)
    assert [t.get("cache_control") is not None for t in body["tools"]] == [True] * 3
    assert "cache_control" not in body["system"][0]  # no free slot left for the strategy
    assert _marked(body, "messages", "cache_control") == ["a"]
    assert [n.what for n in wire.report.notes] == ["cache breakpoints"]


def test_caller_marks_are_dropped_and_reported_where_the_model_caches_automatically() -> None:
    request = ConversationRequest([User([TextPart("stable prefix", cache_breakpoint=True)])])
    wire = build_request("responses", request, BuildOptions(provider="openai", model="gpt-4o"))
    (part,) = orjson.loads(wire.body)["input"][0]["content"]
    assert part == {"type": "input_text", "text": "stable prefix"}
    assert [n.what for n in wire.report.notes] == ["cache breakpoints"]


def test_messages_caller_mark_is_cache_control_and_the_strategy_fills_free_slots() -> None:
    request = ConversationRequest(
        [System("rules"), User([TextPart("document", cache_breakpoint=True), TextPart("q")])]
    )
    body = orjson.loads(build_request("messages", request, BuildOptions(model="c")).body)
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert [b.get("cache_control") is not None for b in body["messages"][0]["content"]] == [
        True,
        True,
    ]


def test_cache_writes_are_priced_at_one_and_a_quarter_input_on_gpt_6() -> None:
    catalog = ModelCatalog.load()
    usage = Usage(input_tokens=2_000_000, cache_write_tokens=1_000_000)
    # 1M uncached at $0.10 + 1M written at $0.125.
    assert catalog.cost_ticks("gpt-6-luna", usage) == round(0.225 * TICKS_PER_USD)
    prices = catalog.get("gpt-6-luna")
    assert prices is not None and prices.prices.cache_write == 1.25 * prices.prices.input


LONG = "a stable system prompt with many words in it. " * 250  # about 3,000 tokens


async def _send(
    client: httpx2.AsyncClient, emulator: EmulatorFixture, backend: str, wire: Any
) -> tuple[dict[str, Any], str]:
    response = await client.post(
        emulator.url_for(backend),
        content=wire.body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    details_key = "input_tokens_details" if backend == "responses" else "prompt_tokens_details"
    return body["usage"][details_key], response.headers["x-emulator-prompt-cache"]


@pytest.mark.parametrize("backend", ["responses", "chat_completions"])
@pytest.mark.parametrize("breakpoints", [True, False])
async def test_emulator_openai_cache_hit_on_turn_two_only_with_breakpoints(
    emulator: EmulatorFixture, backend: str, breakpoints: bool
) -> None:
    first, second = _two_turns(f"{backend} {breakpoints} {LONG}")
    options = BuildOptions(
        provider="openai", model="gpt-6-luna", stream=False, cache_breakpoints=breakpoints
    )
    async with httpx2.AsyncClient() as client:
        turn1, header1 = await _send(
            client, emulator, backend, build_request(backend, first, options)
        )
        turn2, header2 = await _send(
            client, emulator, backend, build_request(backend, second, options)
        )
    assert turn1["cached_tokens"] == 0 and turn1["cache_write_tokens"] > 1024
    assert header1.startswith("miss;")
    written = set(header1.rpartition("prefixes=")[2].split(","))
    prefixes = set(header2.rpartition("prefixes=")[2].split(","))
    if breakpoints:
        # Turn 2 marks where turn 1 ended, so it reads what turn 1 wrote.
        assert turn2["cached_tokens"] >= turn1["cache_write_tokens"]
        assert header2.startswith("hit;") and written & prefixes
    else:
        # Only the implicit breakpoint on the latest message: turn 2 ends elsewhere, and
        # there is no fallback to the longest shared prefix.
        assert turn2["cached_tokens"] == 0 and turn2["cache_write_tokens"] > 1024
        assert header2.startswith("miss;") and not written & prefixes


@pytest.mark.parametrize(
    ("model", "explicit"),
    [
        ("gpt-5.6-sol", True),
        ("gpt-5.10", True),
        ("gpt-6-luna", True),
        ("gpt-6.1-sol", True),
        ("us.openai.gpt-5.6-sol", True),
        ("ft:gpt-6-luna:acme::abc", True),
        ("gpt-5", False),
        ("gpt-5.4", False),
        ("gpt-4o", False),
        ("gpt-4.1-nano", False),
        ("claude-sonnet-5-5", False),
        ("my-gpt-6", False),
        (None, False),
    ],
)
def test_which_models_cache_explicitly(model: str | None, explicit: bool) -> None:
    assert explicit_prompt_caching(model) is explicit
