"""The prompt-cache simulation and token counting, directly and over HTTP."""

from __future__ import annotations

from typing import Any

import httpx2

from trio_sampler.emulator import PromptCache, count_tokens
from trio_sampler.testing import EmulatorFixture, emulator, script_headers

__all__ = ["emulator"]

LONG = "lorem ipsum dolor sit amet " * 400  # 10,800 characters: 2,700 tokens


def test_count_tokens_is_ceil_of_chars_over_four() -> None:
    assert [count_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]


def test_automatic_prefix_cache_in_128_token_steps_from_1024() -> None:
    cache = PromptCache()
    first = cache.automatic("m", [LONG])
    assert (first.total, first.read, first.write) == (2700, 0, 0)
    again = cache.automatic("m", [LONG])
    assert again.read == 1024 + 128 * ((2700 - 1024) // 128)  # 2688
    extended = cache.automatic("m", [LONG, "a new question"])
    assert extended.read == 2688
    other_model = cache.automatic("other", [LONG])
    assert other_model.read == 0
    short = PromptCache()
    short.automatic("m", ["x" * 4000])
    assert short.automatic("m", ["x" * 4000]).read == 0  # under 1,024 tokens: never cached


def test_breakpoint_cache_writes_then_reads() -> None:
    cache = PromptCache()
    blocks = [(LONG, True), ("question one", False)]
    first = cache.breakpoints("m", blocks)
    assert (first.read, first.write) == (0, 2700)
    second = cache.breakpoints("m", [(LONG, True), ("question two", False)])
    assert (second.read, second.write) == (2700, 0)
    grown = cache.breakpoints("m", [(LONG, True), (LONG, True)])
    assert (grown.read, grown.write) == (2700, 2700)
    unmarked = PromptCache().breakpoints("m", [(LONG, False)])
    assert (unmarked.read, unmarked.write) == (0, 0)
    small = PromptCache().breakpoints("m", [("tiny", True)])
    assert small.write == 0  # below the minimum cacheable length


async def test_openai_cached_tokens_over_http(emulator: EmulatorFixture) -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "q"}],
    }
    async with httpx2.AsyncClient() as client:
        url = emulator.url_for("chat_completions")
        first = (await client.post(url, json=body)).json()["usage"]
        second = (await client.post(url, json=body)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] >= 1024
    assert second["prompt_tokens_details"]["cached_tokens"] % 128 == 0
    assert second["prompt_tokens"] == first["prompt_tokens"]


async def test_anthropic_cache_usage_semantics_over_http(emulator: EmulatorFixture) -> None:
    system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    body: dict[str, Any] = {
        "model": "c",
        "max_tokens": 64,
        "system": system,
        "messages": [{"role": "user", "content": "q1"}],
    }
    async with httpx2.AsyncClient() as client:
        url = emulator.url_for("messages")
        first = (await client.post(url, json=body)).json()["usage"]
        body["messages"] = [{"role": "user", "content": "another question"}]
        second = (await client.post(url, json=body)).json()["usage"]
        scripted = (
            await client.post(
                url,
                json=body,
                headers=script_headers(usage={"cache_read_tokens": 7, "input_tokens": 10}),
            )
        ).json()["usage"]
    assert first["cache_creation_input_tokens"] > 2700 and first["cache_read_input_tokens"] == 0
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == 0
    # Anthropic input_tokens excludes the cached part.
    assert second["input_tokens"] < 20
    assert scripted["cache_read_input_tokens"] == 7 and scripted["input_tokens"] == 3
