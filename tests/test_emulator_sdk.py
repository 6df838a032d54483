"""Faithfulness: the official SDKs, unmodified, as clients of the emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from trio_sampler.testing import EmulatorFixture, emulator, script_headers

__all__ = ["emulator"]

# The SDKs stop iterating their SSE generators at the terminator (``[DONE]``,
# ``message_stop``) or an error event without closing them; under Trio the garbage-collected
# generators raise ResourceWarning (SDK internals, not the emulator). Everything else stays
# an error.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": "forecast", "parameters": SCHEMA}}]
RESPONSES_TOOLS: Any = [
    {"type": "function", "name": "forecast", "parameters": SCHEMA, "strict": False}
]
MESSAGES_TOOLS: Any = [{"name": "forecast", "description": "Forecast", "input_schema": SCHEMA}]
USER: Any = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
async def http_client() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient() as client:
        yield client


def openai_client(
    emu: EmulatorFixture, http: httpx2.AsyncClient, retries: int = 0
) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=emu.base_url, api_key="test-key", http_client=http, max_retries=retries
    )


def anthropic_client(
    emu: EmulatorFixture, http: httpx2.AsyncClient, retries: int = 0
) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=emu.base_url.removesuffix("/v1"),
        api_key="test-key",
        http_client=http,
        max_retries=retries,
    )


async def test_openai_chat_streaming_accumulator(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    script = script_headers(
        text="Sunny in Paris.",
        tool_calls=[{"name": "forecast", "arguments": {"city": "Paris", "days": 2}}],
        usage={"input_tokens": 40},
    )
    async with client.chat.completions.stream(
        model="gpt-4o-mini",
        messages=USER,
        tools=CHAT_TOOLS,
        stream_options={"include_usage": True},
        extra_headers=script,
    ) as stream:
        completion = await stream.get_final_completion()
    message = completion.choices[0].message
    assert message.content == "Sunny in Paris."
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.function.name == "forecast"
    assert orjson.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.prompt_tokens == 40
    assert completion.model == "gpt-4o-mini"


async def test_openai_chat_non_streaming_default_tool_call(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    completion = await client.chat.completions.create(
        model="gpt-4o-mini", messages=USER, tools=CHAT_TOOLS
    )
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert set(orjson.loads(call.function.arguments)) == {"city", "days"}  # type: ignore[union-attr]
    assert completion.usage is not None and completion.usage.total_tokens > 0


async def test_openai_chat_stream_error_raises(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    headers = script_headers(faults=[{"type": "stream_error", "after_events": 1}])
    stream = await client.chat.completions.create(
        model="m", messages=USER, stream=True, extra_headers=headers
    )
    with pytest.raises(openai.APIError, match="emulated stream error"):
        async for _ in stream:
            pass


async def test_openai_responses_streaming(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    headers = script_headers(
        text="Here you go.",
        reasoning="Think first.",
        tool_calls=[{"name": "forecast", "arguments": {"city": "Oslo", "days": 1}}],
    )
    async with client.responses.stream(
        model="gpt-5-mini",
        input=USER,
        tools=RESPONSES_TOOLS,
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        extra_headers=headers,
    ) as stream:
        text = ""
        async for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
        response = await stream.get_final_response()
    assert text == "Here you go." == response.output_text
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning = response.output[0]
    assert reasoning.summary[0].text == "Think first."  # type: ignore[union-attr]
    assert reasoning.encrypted_content  # type: ignore[union-attr]
    call = response.output[2]
    assert orjson.loads(getattr(call, "arguments", "")) == {"city": "Oslo", "days": 1}
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 3


async def test_openai_responses_non_streaming(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    response = await client.responses.create(
        model="gpt-5-mini", input="hi", extra_headers=script_headers(text="pong")
    )
    assert response.output_text == "pong"
    assert response.status == "completed"


async def test_openai_rate_limit_error_and_retry(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    fault = [{"type": "status", "status": 429, "retry_after": 0.01, "times": 1}]
    with pytest.raises(openai.RateLimitError) as caught:
        await openai_client(emulator, http_client).chat.completions.create(
            model="m", messages=USER, extra_headers=script_headers(scenario="once", faults=fault)
        )
    assert caught.value.response.headers["retry-after-ms"] == "10"
    # A fresh scenario; one retry honoring retry-after reaches the second attempt.
    completion = await openai_client(emulator, http_client, retries=1).chat.completions.create(
        model="m",
        messages=USER,
        extra_headers=script_headers(scenario="retried", faults=fault, text="ok"),
    )
    assert completion.choices[0].message.content == "ok"
    assert len(emulator.requests("retried")) == 2


async def test_openai_bad_request(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = openai_client(emulator, http_client)
    messages: Any = [*USER, {"role": "tool", "tool_call_id": "call_nope", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=messages)
    assert caught.value.code is None and caught.value.type == "invalid_request_error"


async def test_anthropic_streaming_thinking_and_tools(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = anthropic_client(emulator, http_client)
    headers = script_headers(
        text="Checking.",
        tool_calls=[{"name": "forecast", "arguments": {"city": "Rome", "days": 3}}],
    )
    async with client.messages.stream(
        model="claude-haiku-4-5",
        max_tokens=4096,
        messages=USER,
        tools=MESSAGES_TOOLS,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers=headers,
    ) as stream:
        message = await stream.get_final_message()
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "text", "tool_use"]
    thinking, text, tool = message.content
    assert thinking.thinking and thinking.signature  # type: ignore[union-attr]
    assert text.text == "Checking."  # type: ignore[union-attr]
    assert tool.input == {"city": "Rome", "days": 3}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0


async def test_anthropic_non_streaming_after_tool_result(
    emulator: EmulatorFixture, http_client: httpx2.AsyncClient
) -> None:
    client = anthropic_client(emulator, http_client)
    messages: Any = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "forecast",
                    "input": {"city": "Rome", "days": 1},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain all day"}
            ],
        },
    ]
    message = await client.messages.create(
        model="claude-haiku-4-5", max_tokens=512, messages=messages, tools=MESSAGES_TOOLS
    )
    assert message.stop_reason == "end_turn"
    assert "rain all day" in message.content[0].text  # type: ignore[union-attr]


async def test_anthropic_errors(emulator: EmulatorFixture, http_client: httpx2.AsyncClient) -> None:
    client = anthropic_client(emulator, http_client)
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.create(
            model="c",
            max_tokens=10,
            messages=USER,
            extra_headers=script_headers(faults=[{"type": "status", "status": 529}]),
        )
    assert caught.value.status_code == 529
    overloaded = getattr(anthropic, "OverloadedError", anthropic.InternalServerError)
    assert isinstance(caught.value, overloaded)
    with pytest.raises(anthropic.RateLimitError):
        await client.messages.create(
            model="c",
            max_tokens=10,
            messages=USER,
            extra_headers=script_headers(
                faults=[{"type": "status", "status": 429, "retry_after": 2}]
            ),
        )
    with pytest.raises(anthropic.BadRequestError, match="tool_use"):
        bad: Any = [
            *USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            *USER,
        ]
        await client.messages.create(model="c", max_tokens=10, messages=bad)
    stream_fault = script_headers(faults=[{"type": "stream_error", "after_events": 2}])
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        async with client.messages.stream(
            model="c", max_tokens=10, messages=USER, extra_headers=stream_fault
        ) as stream:
            await stream.get_final_message()
