"""EmulatorTransport: the emulator in-process, streaming, under the mock clock."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

from trio_sampler.emulator import EmulatorTransport, script_headers
from trio_sampler.wire import collect, replay

BASE = "http://emulator.test/v1"
CHAT: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


async def test_streams_chunks_as_sent_with_instant_delays(autojump_clock: trio.abc.Clock) -> None:
    headers = script_headers(text="one two three four", delay_ms=1000)
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        start = trio.current_time()
        arrivals: list[float] = []
        async with client.stream(
            "POST", BASE + "/chat/completions", json=CHAT, headers=headers
        ) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                arrivals.append(trio.current_time() - start)
    # One chunk per event, a (virtual) second apart: streamed, not buffered.
    assert len(arrivals) >= 6
    assert arrivals[1] - arrivals[0] == pytest.approx(1.0)
    assert arrivals[-1] >= 5


async def test_stall_fault_under_mock_clock(autojump_clock: trio.abc.Clock) -> None:
    headers = script_headers(
        text="a b", faults=[{"type": "stall", "after_events": 1, "seconds": 600}]
    )
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        start = trio.current_time()
        response = await client.post(BASE + "/chat/completions", json=CHAT, headers=headers)
    assert trio.current_time() - start == pytest.approx(600)
    assert response.content.endswith(b"data: [DONE]\n\n")


async def test_drop_raises_remote_protocol_error() -> None:
    headers = script_headers(faults=[{"type": "drop", "after_events": 2}])
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.post(
                BASE + "/messages",
                json={"model": "c", "max_tokens": 50, "stream": True, "messages": CHAT["messages"]},
                headers=headers,
            )


async def test_closing_early_cancels_the_app(autojump_clock: trio.abc.Clock) -> None:
    headers = script_headers(text="x " * 50, delay_ms=1000)
    transport = EmulatorTransport()
    async with httpx2.AsyncClient(transport=transport) as client:
        start = trio.current_time()
        async with (
            client.stream(
                "POST", BASE + "/chat/completions", json=CHAT, headers=headers
            ) as response,
            contextlib.aclosing(response.aiter_raw()) as chunks,
        ):
            async for _ in chunks:
                break
        await trio.testing.wait_all_tasks_blocked()
        # The app task is gone at once: no waiting out the remaining 50 virtual seconds.
        assert transport._nursery is not None and not transport._nursery.child_tasks
        assert trio.current_time() - start < 1


async def test_status_faults_and_json_routes() -> None:
    transport = EmulatorTransport()
    async with httpx2.AsyncClient(transport=transport) as client:
        script = script_headers(
            scenario="s", faults=[{"type": "status", "status": 429, "retry_after": 3, "times": 1}]
        )
        first = await client.post(BASE + "/chat/completions", json=CHAT, headers=script)
        second = await client.post(BASE + "/chat/completions", json=CHAT, headers=script)
        models = await client.get(BASE + "/models")
    assert (first.status_code, first.headers["retry-after"], second.status_code) == (429, "3", 200)
    assert models.json()["data"]
    assert len(transport.app.requests("s")) == 2


async def test_not_entered_is_a_clear_error() -> None:
    transport = EmulatorTransport()
    with pytest.raises(RuntimeError, match="async with"):
        await transport.handle_async_request(httpx2.Request("GET", BASE + "/models"))


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
async def test_client_transforms_understand_the_output(backend: str) -> None:
    """The library's own stream transforms collect what the emulator streamed."""
    paths = {
        "chat_completions": "/chat/completions",
        "responses": "/responses",
        "messages": "/messages",
    }
    body: dict[str, Any] = {
        "chat_completions": {**CHAT, "stream_options": {"include_usage": True}},
        "responses": {"model": "m", "stream": True, "input": "hi"},
        "messages": {"model": "m", "stream": True, "max_tokens": 200, "messages": CHAT["messages"]},
    }[backend]
    headers = script_headers(
        text="Hello from the emulator.",
        reasoning="Brief thought." if backend != "messages" else None,
        tool_calls=[{"name": "lookup", "arguments": {"q": "trio"}}],
    )
    async with (
        httpx2.AsyncClient(transport=EmulatorTransport()) as client,
        client.stream("POST", BASE + paths[backend], json=body, headers=headers) as response,
    ):
        chunks = [chunk async for chunk in response.aiter_raw()]
    response_value = collect(replay(backend, chunks))
    assistant = response_value.items[-1]
    assert getattr(assistant, "content", None) == "Hello from the emulator."
    calls: tuple[Any, ...] = getattr(assistant, "tool_calls", ())
    (call,) = calls
    assert call.name == "lookup" and call.arguments.replace(" ", "") == '{"q":"trio"}'
    assert response_value.usage is not None and response_value.usage.output_tokens > 0
