"""The emulator's server-side rate limits: buckets per key, real headers, real 429s."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio

from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import SamplingErrorKind
from trio_sampler.wire.errors import classify_http_error

BASE = "http://emulator.test/v1"


def _chat(max_tokens: int | None = None, text: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "stream": False,
        "messages": [{"role": "user", "content": text}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def _app(limits: RateLimits) -> EmulatorApp:
    return EmulatorApp(cache=PromptCache(), rate_limits=limits)


async def _post(
    client: httpx2.AsyncClient,
    body: dict[str, Any],
    key: str = "k1",
    path: str = "/chat/completions",
) -> httpx2.Response:
    return await client.post(BASE + path, json=body, headers={"authorization": f"Bearer {key}"})


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimits(requests_per_minute=0)


async def test_requests_per_minute_answers_429_with_retry_after(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = _app(RateLimits(requests_per_minute=3))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        for remaining in (2, 1, 0):
            response = await _post(client, _chat())
            assert response.status_code == 200
            assert response.headers["x-ratelimit-limit-requests"] == "3"
            assert response.headers["x-ratelimit-remaining-requests"] == str(remaining)
        refused = await _post(client, _chat())
        assert refused.status_code == 429
        assert float(refused.headers["retry-after"]) == pytest.approx(20.0, abs=0.01)
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        info = classify_http_error(refused.status_code, refused.headers, refused.content)
        assert info.kind is SamplingErrorKind.RATE_LIMITED
        assert info.retry_after == pytest.approx(20.0, abs=0.01)
        # Another key has its own buckets.
        assert (await _post(client, _chat(), key="k2")).status_code == 200
        # The bucket refills continuously: one request's worth after 20 s.
        await trio.sleep(20.0)
        assert (await _post(client, _chat())).status_code == 200
        assert (await _post(client, _chat())).status_code == 429
        assert app.rate_limits is not None and app.rate_limits.refusals == {"requests": 2}


async def test_max_tokens_is_charged_up_front_and_unused_output_refunded(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = _app(RateLimits(output_tokens_per_minute=1000, tokens_per_minute=100_000))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        first = await _post(client, _chat(max_tokens=900))
        assert first.status_code == 200
        used = first.json()["usage"]["completion_tokens"]
        assert used < 900
        # The 900 charged were corrected to what was generated: room for 1000 - used, and a
        # request whose max_tokens exceeds that is refused, however little it would write.
        refused = await _post(client, _chat(max_tokens=1000 - used + 1))
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "tokens"
        assert (await _post(client, _chat(max_tokens=1000 - used))).status_code == 200


async def test_without_refunds_max_tokens_stays_charged(autojump_clock: trio.abc.Clock) -> None:
    app = _app(RateLimits(output_tokens_per_minute=1000, refund_unused=False))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        assert (await _post(client, _chat(max_tokens=900))).status_code == 200
        assert (await _post(client, _chat(max_tokens=200))).status_code == 429


async def test_input_tokens_count_the_prompt(autojump_clock: trio.abc.Clock) -> None:
    app = _app(RateLimits(input_tokens_per_minute=100))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        assert (await _post(client, _chat(text="x" * 200))).status_code == 200  # ~60 tokens
        refused = await _post(client, _chat(text="x" * 200))
        assert refused.status_code == 429
        assert "input tokens" in refused.json()["error"]["message"]


async def test_messages_carries_anthropic_headers(autojump_clock: trio.abc.Clock) -> None:
    app = _app(RateLimits(requests_per_minute=1, input_tokens_per_minute=10_000))
    body = {"model": "claude", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        response = await client.post(
            BASE + "/messages",
            json=body,
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        )
        assert response.status_code == 200
        assert response.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert response.headers["anthropic-ratelimit-input-tokens-limit"] == "10000"
        assert response.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
        refused = await client.post(
            BASE + "/messages",
            json=body,
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        )
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert float(refused.headers["retry-after"]) == pytest.approx(60.0, abs=0.01)


async def test_a_refused_request_is_not_charged(autojump_clock: trio.abc.Clock) -> None:
    app = _app(RateLimits(requests_per_minute=60, tokens_per_minute=1000))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        assert (await _post(client, _chat(max_tokens=2000))).status_code == 429  # never fits
        assert (await _post(client, _chat(max_tokens=900))).status_code == 200
        assert app.rate_limits is not None
        assert app.rate_limits.refusals == {"tokens": 1}
