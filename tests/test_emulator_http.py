"""The emulator over real loopback HTTP: every route, streaming and not, validation, faults."""

from __future__ import annotations

import functools
from typing import Any

import httpx2
import orjson
import pytest
import trio

from trio_sampler.emulator import EmulatorApp, EmulatorServer, serve
from trio_sampler.testing import EmulatorFixture, emulator, script_headers
from trio_sampler.wire.sse import ServerSentEvent, SSEDecoder

__all__ = ["emulator"]  # the fixture, imported for tests when the plugin is not registered

CHAT: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES: dict[str, Any] = {"model": "gpt-test", "input": "hi"}
MESSAGES: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "hi"}],
}
BODIES = {"chat_completions": CHAT, "responses": RESPONSES, "messages": MESSAGES}
WEATHER_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}


def sse(body: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.close()


def payloads(body: bytes) -> list[Any]:
    return [orjson.loads(e.data) for e in sse(body) if e.data != "[DONE]"]


async def post(
    emu: EmulatorFixture, backend: str, body: dict[str, Any], **script: Any
) -> httpx2.Response:
    headers = script_headers(**script) if script else {}
    async with httpx2.AsyncClient(timeout=10) as client:
        return await client.post(emu.url_for(backend), json=body, headers=headers)


async def test_chat_stream_shape(emulator: EmulatorFixture) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = await post(emulator, "chat_completions", body, text="Hello there, world")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.content)
    assert events[-1].data == "[DONE]"
    assert all(e.event == "message" for e in events)  # data-only
    chunks = payloads(response.content)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello there, world"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["usage"] is None for c in chunks[:-1])
    assert {c["model"] for c in chunks} == {"gpt-test"}


async def test_chat_stream_without_include_usage_has_no_usage_chunk(
    emulator: EmulatorFixture,
) -> None:
    response = await post(emulator, "chat_completions", {**CHAT, "stream": True})
    chunks = payloads(response.content)
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_chat_non_streaming_with_tools_and_reasoning(emulator: EmulatorFixture) -> None:
    body = {
        **CHAT,
        "reasoning_effort": "low",
        "tools": [
            {"type": "function", "function": {"name": "weather", "parameters": WEATHER_TOOL_SCHEMA}}
        ],
    }
    data = (await post(emulator, "chat_completions", body)).json()
    choice = data["choices"][0]
    assert data["object"] == "chat.completion"
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather"
    arguments = orjson.loads(call["function"]["arguments"])
    assert set(arguments) == {"city", "unit"} and arguments["unit"] == "c"
    assert choice["message"]["reasoning_content"]
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_chat_reply_after_tool_result_mentions_it(emulator: EmulatorFixture) -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny and 21C"},
    ]
    data = (await post(emulator, "chat_completions", {**CHAT, "messages": messages})).json()
    assert "sunny and 21C" in data["choices"][0]["message"]["content"]


async def test_default_reply_is_deterministic_and_follows_max_tokens(
    emulator: EmulatorFixture,
) -> None:
    first = (await post(emulator, "chat_completions", CHAT)).json()
    second = (await post(emulator, "chat_completions", CHAT)).json()
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    cut = (await post(emulator, "chat_completions", {**CHAT, "max_tokens": 3})).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] <= 3


async def test_responses_stream_shape(emulator: EmulatorFixture) -> None:
    body = {
        **RESPONSES,
        "stream": True,
        "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"],
    }
    response = await post(emulator, "responses", body, text="pong")
    events = sse(response.content)
    kinds = [e.event for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds
    data = [orjson.loads(e.data) for e in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert all(d["type"] == e.event for d, e in zip(data, events, strict=True))
    final = data[-1]["response"]
    assert final["status"] == "completed" and final["model"] == "gpt-test"
    reasoning, message = final["output"]
    added = next(d for d in data if d["type"] == "response.output_item.added")["item"]
    assert reasoning["encrypted_content"] != added["encrypted_content"]
    assert message["content"][0]["text"] == "pong"
    assert (
        final["usage"]["output_tokens"]
        >= final["usage"]["output_tokens_details"]["reasoning_tokens"]
    )
    assert b"[DONE]" not in response.content


async def test_responses_function_call_and_length(emulator: EmulatorFixture) -> None:
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER_TOOL_SCHEMA}]
    data = (await post(emulator, "responses", {**RESPONSES, "tools": tools})).json()
    (call,) = data["output"]
    assert call["type"] == "function_call" and call["call_id"].startswith("call_")
    assert orjson.loads(call["arguments"])["unit"] == "c"
    long = (await post(emulator, "responses", {**RESPONSES, "max_output_tokens": 16})).json()
    assert long["status"] == "incomplete"
    assert long["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_messages_stream_shape(emulator: EmulatorFixture) -> None:
    body = {
        **MESSAGES,
        "max_tokens": 4096,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    response = await post(emulator, "messages", body, text="Hi!", reasoning="Hmm.")
    events = sse(response.content)
    kinds = [e.event for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "ping" in kinds
    data = [orjson.loads(e.data) for e in events]
    deltas = [d["delta"] for d in data if d["type"] == "content_block_delta"]
    assert (
        deltas[-3:-1]
        == [
            {"type": "thinking_delta", "thinking": ""},
            {"type": "signature_delta", "signature": deltas[-2]["signature"]},
        ]
        or deltas[1]["type"] == "thinking_delta"
    )
    assert {"type": "thinking_delta", "thinking": ""} in deltas
    assert any(d["type"] == "signature_delta" for d in deltas)
    final = next(d for d in data if d["type"] == "message_delta")
    assert final["delta"]["stop_reason"] == "end_turn"


async def test_messages_tool_use_non_streaming(emulator: EmulatorFixture) -> None:
    tools = [{"name": "weather", "input_schema": WEATHER_TOOL_SCHEMA}]
    data = (await post(emulator, "messages", {**MESSAGES, "tools": tools})).json()
    assert data["stop_reason"] == "tool_use"
    (block,) = data["content"]
    assert block["type"] == "tool_use" and block["input"]["unit"] == "c"
    assert data["model"] == "claude-test"


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
async def test_content_filter_shapes(emulator: EmulatorFixture, backend: str) -> None:
    data = (await post(emulator, backend, BODIES[backend], text="no", stop="content_filter")).json()
    if backend == "chat_completions":
        assert data["choices"][0]["finish_reason"] == "content_filter"
    elif backend == "responses":
        assert data["incomplete_details"] == {"reason": "content_filter"}
    else:
        assert data["stop_reason"] == "refusal"


async def test_models_and_recorded_requests_redact_keys(emulator: EmulatorFixture) -> None:
    async with httpx2.AsyncClient() as client:
        models = (await client.get(emulator.base_url + "/models")).json()
        assert models["object"] == "list" and models["data"]
        headers = {"authorization": "Bearer sk-very-secret", "x-api-key": "sk-ant-secret"}
        headers |= script_headers(scenario="rec")
        await client.post(emulator.url_for("chat_completions"), json=CHAT, headers=headers)
        recorded = (
            await client.get(emulator.base_url + "/emulator/requests", params={"scenario": "rec"})
        ).json()
    (entry,) = recorded
    assert entry["path"] == "/v1/chat/completions" and entry["body"] == CHAT
    assert entry["headers"]["authorization"] == "REDACTED"
    assert entry["headers"]["x-api-key"] == "REDACTED"
    assert b"secret" not in orjson.dumps(recorded)
    assert "secret" not in repr(emulator.app)


async def test_require_key() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve(require_key="sk-right", task_status=task_status)
        )
        async with httpx2.AsyncClient() as client:
            url = server.url_for("chat_completions")
            wrong = await client.post(url, json=CHAT, headers={"authorization": "Bearer sk-wrong"})
            right = await client.post(url, json=CHAT, headers={"authorization": "Bearer sk-right"})
        assert wrong.status_code == 401 and b"sk-wrong" not in wrong.content
        assert right.status_code == 200
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------- validation

VALIDATION_CASES = [
    ("chat_completions", b"{not json", "could not parse the JSON body"),
    ("messages", b"{not json", "could not parse the JSON body"),
    (
        "chat_completions",
        orjson.dumps(
            {
                **CHAT,
                "messages": [
                    *CHAT["messages"],
                    {"role": "tool", "tool_call_id": "x", "content": "r"},
                ],
            }
        ),
        "must be a response to a preceeding message with 'tool_calls'",
    ),
    (
        "chat_completions",
        orjson.dumps(
            {
                **CHAT,
                "messages": [
                    *CHAT["messages"],
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_9",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "user", "content": "hm"},
                ],
            }
        ),
        "did not have response messages: call_9",
    ),
    (
        "responses",
        orjson.dumps(
            {
                **RESPONSES,
                "input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}],
            }
        ),
        "No tool call found for function call output with call_id call_x",
    ),
    (
        "messages",
        orjson.dumps({k: v for k, v in MESSAGES.items() if k != "max_tokens"}),
        "max_tokens: Field required",
    ),
    (
        "messages",
        orjson.dumps(
            {
                **MESSAGES,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
                        ],
                    },
                    {"role": "user", "content": "no result"},
                ],
            }
        ),
        "tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
    ),
    (
        "messages",
        orjson.dumps(
            {
                **MESSAGES,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": str(n), "cache_control": {"type": "ephemeral"}}
                            for n in range(5)
                        ],
                    }
                ],
            }
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
]


@pytest.mark.parametrize(("backend", "body", "message"), VALIDATION_CASES)
async def test_validation_errors(
    emulator: EmulatorFixture, backend: str, body: bytes, message: str
) -> None:
    async with httpx2.AsyncClient() as client:
        response = await client.post(
            emulator.url_for(backend), content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    data = response.json()
    if backend == "messages":
        assert data["type"] == "error"
        assert data["error"]["type"] == "invalid_request_error"
        assert message in data["error"]["message"]
    else:
        assert set(data["error"]) == {"message", "type", "param", "code"}
        assert data["error"]["type"] == "invalid_request_error"
        assert message in data["error"]["message"]


async def test_function_call_output_allowed_with_previous_response_id(
    emulator: EmulatorFixture,
) -> None:
    body = {
        **RESPONSES,
        "previous_response_id": "resp_123",
        "input": [{"type": "function_call_output", "call_id": "call_x", "output": "42"}],
    }
    data = (await post(emulator, "responses", body)).json()
    assert "42" in data["output"][0]["content"][0]["text"]


@pytest.mark.parametrize(
    ("script", "fragment"),
    [
        ("{", "not valid JSON"),
        ('{"txt": "x"}', "unknown key(s) txt"),
        ('{"stop": "halt"}', "stop must be one of"),
        ('{"faults": [{"type": "status"}]}', "faults[0] (status) needs status"),
        ('{"faults": [{"type": "nope"}]}', "faults[0].type must be one of"),
        ('{"faults": [{"type": "drop", "after_events": -1}]}', "after_events must be >= 0"),
    ],
)
async def test_bad_script_is_a_400(emulator: EmulatorFixture, script: str, fragment: str) -> None:
    async with httpx2.AsyncClient() as client:
        response = await client.post(
            emulator.url_for("chat_completions"), json=CHAT, headers={"x-emulator-script": script}
        )
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


# --------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
async def test_status_fault_twice_then_success(emulator: EmulatorFixture, backend: str) -> None:
    script = {
        "scenario": f"flaky-{backend}",
        "faults": [{"type": "status", "status": 503, "retry_after": 1.5, "times": 2}],
    }
    statuses = []
    for _ in range(3):
        response = await post(emulator, backend, BODIES[backend], **script)
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1.5"
            assert response.headers["retry-after-ms"] == "1500"
    assert statuses == [503, 503, 200]
    assert len(emulator.requests(f"flaky-{backend}")) == 3


async def test_status_error_bodies(emulator: EmulatorFixture) -> None:
    rate = await post(
        emulator, "chat_completions", CHAT, faults=[{"type": "status", "status": 429}]
    )
    assert rate.json()["error"]["code"] == "rate_limit_exceeded"
    overloaded = await post(
        emulator, "messages", MESSAGES, faults=[{"type": "status", "status": 529}]
    )
    assert overloaded.json()["error"]["type"] == "overloaded_error"
    assert overloaded.headers["request-id"].startswith("req_")
    limited = await post(emulator, "messages", MESSAGES, faults=[{"type": "status", "status": 429}])
    assert limited.json()["error"]["type"] == "rate_limit_error"
    custom = await post(
        emulator,
        "responses",
        RESPONSES,
        faults=[{"type": "status", "status": 400, "body": {"error": {"message": "custom"}}}],
    )
    assert custom.json() == {"error": {"message": "custom"}}


async def test_stream_error_shapes(emulator: EmulatorFixture) -> None:
    fault = [{"type": "stream_error", "after_events": 2}]
    chat = await post(emulator, "chat_completions", {**CHAT, "stream": True}, faults=fault)
    chunks = payloads(chat.content)
    assert chunks[-1]["error"]["type"] == "server_error" and len(chunks) == 3
    responses = await post(emulator, "responses", {**RESPONSES, "stream": True}, faults=fault)
    events = sse(responses.content)
    assert [e.event for e in events[-2:]] == ["error", "response.failed"]
    assert orjson.loads(events[-2].data)["error"]["code"] == "server_error"
    assert orjson.loads(events[-1].data)["sequence_number"] == 3
    messages = await post(emulator, "messages", {**MESSAGES, "stream": True}, faults=fault)
    last = sse(messages.content)[-1]
    assert last.event == "error"
    assert orjson.loads(last.data)["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
async def test_drop_closes_mid_body(emulator: EmulatorFixture, backend: str) -> None:
    headers = script_headers(faults=[{"type": "drop", "after_events": 3}])
    received = b""
    async with httpx2.AsyncClient() as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            async with client.stream(
                "POST",
                emulator.url_for(backend),
                json={**BODIES[backend], "stream": True},
                headers=headers,
            ) as response:
                async for chunk in response.aiter_raw():
                    received += chunk
    assert len(sse(received)) == 3  # every SSE event of the reply counts, pings included


async def test_stall_then_continue(emulator: EmulatorFixture) -> None:
    headers = script_headers(
        text="a b c", faults=[{"type": "stall", "after_events": 1, "seconds": 0.3}]
    )
    async with httpx2.AsyncClient() as client:
        start = trio.current_time()
        arrivals = []
        async with client.stream(
            "POST",
            emulator.url_for("chat_completions"),
            json={**CHAT, "stream": True},
            headers=headers,
        ) as response:
            async for _ in response.aiter_raw():
                arrivals.append(trio.current_time() - start)
    assert arrivals[0] < 0.25 and arrivals[-1] >= 0.3


async def test_malformed_empty_and_pings(emulator: EmulatorFixture) -> None:
    malformed = await post(
        emulator,
        "chat_completions",
        {**CHAT, "stream": True},
        faults=[{"type": "malformed", "after_events": 1}],
    )
    events = sse(malformed.content)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(events[1].data)
    assert events[-1].data == "[DONE]"
    empty = (await post(emulator, "messages", MESSAGES, faults=[{"type": "empty"}])).json()
    assert empty["content"] == [] and empty["usage"]["output_tokens"] == 0
    pinged = await post(
        emulator,
        "chat_completions",
        {**CHAT, "stream": True},
        faults=[{"type": "pings", "count": 3, "interval_ms": 1}],
    )
    assert pinged.content.startswith(b": keep-alive\n\n" * 3)
    pings = await post(
        emulator, "messages", {**MESSAGES, "stream": True}, faults=[{"type": "pings", "count": 2}]
    )
    assert pings.content.startswith(b'event: ping\ndata: {"type": "ping"}\n\n' * 2)


async def test_delay_paces_events(emulator: EmulatorFixture) -> None:
    headers = script_headers(text="one two three", delay_ms=50)
    async with httpx2.AsyncClient() as client:
        start = trio.current_time()
        async with client.stream(
            "POST",
            emulator.url_for("chat_completions"),
            json={**CHAT, "stream": True},
            headers=headers,
        ) as response:
            chunks = [chunk async for chunk in response.aiter_raw()]
    assert len(chunks) >= 4
    assert trio.current_time() - start >= 0.2


async def test_bench_mode_serves_cached_bodies(emulator: EmulatorFixture) -> None:
    headers = {"x-emulator-bench": "1"} | script_headers(text="fast")
    async with httpx2.AsyncClient() as client:
        url = emulator.url_for("responses")
        first = await client.post(url, json={**RESPONSES, "stream": True}, headers=headers)
        second = await client.post(
            url, json={**RESPONSES, "stream": True, "input": "other"}, headers=headers
        )
    assert first.content == second.content  # the second is the pre-rendered body
    assert emulator.requests() == []  # bench requests are not recorded


async def test_reuse_port_processes_share_one_port() -> None:
    """Two servers bound with ``reuse_port`` on one port: the kernel spreads new
    connections over both (40 fresh connections all landing on one: odds 2**-39)."""
    apps = (EmulatorApp(), EmulatorApp())
    async with trio.open_nursery() as nursery:
        first: EmulatorServer = await nursery.start(
            functools.partial(serve, app=apps[0], reuse_port=True)
        )
        second: EmulatorServer = await nursery.start(
            functools.partial(serve, app=apps[1], port=first.port, reuse_port=True)
        )
        assert second.port == first.port
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(40):
            async with httpx2.AsyncClient() as client:  # a new connection each time
                response = await client.post(first.url_for("chat_completions"), json=body)
                assert response.status_code == 200
        counts = [len(app.requests()) for app in apps]
        assert sum(counts) == 40
        assert all(counts), counts
        nursery.cancel_scope.cancel()


async def test_port_in_use_without_reuse_port_fails() -> None:
    """Without ``reuse_port`` a second server on a bound port is an ``OSError``."""
    async with trio.open_nursery() as nursery:
        first = await nursery.start(functools.partial(serve, reuse_port=True))
        with pytest.raises(OSError, match="in use"):
            await nursery.start(functools.partial(serve, port=first.port))
        nursery.cancel_scope.cancel()


async def test_keep_alive_timeout_closes_idle_connections() -> None:
    """A connection that sends nothing is closed after ``keep_alive_timeout``."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, keep_alive_timeout=0.2))
        stream = await trio.open_tcp_stream(server.host, server.port)
        async with stream:
            started = trio.current_time()
            with trio.fail_after(10):
                assert await stream.receive_some() == b""  # closed by the server
            assert trio.current_time() - started >= 0.15
        nursery.cancel_scope.cancel()
