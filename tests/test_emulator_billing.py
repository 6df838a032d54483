"""The emulator's billing record: what it billed for each response, however it ended, and
what the client could read of it (``docs/emulator.md``, "Billing")."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest
import trio
import trio.testing

from trio_sampler import ApiBackend, SamplerConfig
from trio_sampler.actor import open_sampler
from trio_sampler.emulator import (
    BilledUsage,
    BillingOutcome,
    EmulatorApp,
    EmulatorTransport,
    PromptCache,
    script_headers,
)
from trio_sampler.types import Completed, ConversationRequest, User

BASE = "http://emulator.test/v1"
MESSAGES: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 200,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}
CHAT: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "hi"}],
}
TEXT = " ".join(f"word{n}" for n in range(40))


def _app() -> EmulatorApp:
    return EmulatorApp(cache=PromptCache())


async def _post(
    app: EmulatorApp, path: str, body: dict[str, Any], headers: dict[str, str]
) -> httpx2.Response:
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        return await client.post(BASE + path, json=body, headers=headers)


async def test_a_completed_stream_bills_its_usage_and_reports_all_of_it() -> None:
    app = _app()
    response = await _post(app, "/chat/completions", CHAT, script_headers(text=TEXT))
    [entry] = app.billed()
    assert entry.request_id == response.headers["x-request-id"]
    assert (entry.backend, entry.status, entry.outcome) == (
        "chat_completions",
        200,
        BillingOutcome.COMPLETED,
    )
    usage = orjson.loads(response.text.split("data: ")[-2])["usage"]
    billed = BilledUsage(usage["prompt_tokens"], usage["completion_tokens"])
    assert entry.billed == entry.reported == billed


async def test_a_chat_stream_without_include_usage_bills_what_it_never_reports() -> None:
    app = _app()
    body = {key: value for key, value in CHAT.items() if key != "stream_options"}
    await _post(app, "/chat/completions", body, script_headers(text=TEXT))
    [entry] = app.billed()
    assert entry.billed is not None and entry.billed.output_tokens > 0
    assert entry.reported is None


async def test_a_refused_request_bills_nothing() -> None:
    app = _app()
    faults = [{"type": "status", "status": 503}]
    response = await _post(app, "/messages", MESSAGES, script_headers(faults=faults))
    [entry] = app.billed()
    assert entry.request_id == response.headers["request-id"]
    assert (entry.status, entry.outcome, entry.billed, entry.reported) == (
        503,
        BillingOutcome.REFUSED,
        None,
        None,
    )


async def test_a_dropped_messages_stream_bills_the_output_sent_and_reports_message_start() -> None:
    app = _app()
    full = await _post(app, "/messages", MESSAGES, script_headers(text=TEXT))
    whole = app.billed()[-1].billed
    assert whole is not None and full.status_code == 200
    faults = [{"type": "drop", "after_events": 20}]
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        try:
            await client.post(
                BASE + "/messages", json=MESSAGES, headers=script_headers(text=TEXT, faults=faults)
            )
        except httpx2.RemoteProtocolError:
            pass
    entry = app.billed()[-1]
    assert entry.outcome is BillingOutcome.CUT
    # message_start reported the prompt and one output token; more was generated.
    assert entry.reported == BilledUsage(whole.input_tokens, 1)
    assert entry.billed is not None
    assert entry.billed.input_tokens == whole.input_tokens
    assert 1 < entry.billed.output_tokens < whole.output_tokens
    assert 0 < entry.deltas_sent < entry.deltas


async def test_a_malformed_event_hides_the_usage_sent_after_it() -> None:
    app = _app()
    faults = [{"type": "malformed", "after_events": 1}]
    await _post(app, "/chat/completions", CHAT, script_headers(text=TEXT, faults=faults))
    [entry] = app.billed()
    # Every frame went out, the usage chunk too, but after a frame no client can parse.
    assert entry.outcome is BillingOutcome.CUT
    assert entry.reported is None


async def test_a_client_that_leaves_mid_stream_is_billed_what_was_generated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _app()
    headers = script_headers(text=TEXT, delay_ms=100)
    await _post(app, "/messages", MESSAGES, headers)
    whole = app.billed()[-1].billed
    assert whole is not None
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        async with client.stream("POST", BASE + "/messages", json=MESSAGES, headers=headers) as r:
            with trio.move_on_after(1.05):
                async for _ in r.aiter_raw():
                    pass
        await trio.sleep(1)  # the app sees the disconnect
    entry = app.billed()[-1]
    assert entry.outcome is BillingOutcome.CLIENT_GONE
    assert entry.billed is not None and entry.reported is not None
    assert 0 < entry.deltas_sent < entry.deltas
    assert entry.billed.input_tokens == whole.input_tokens
    assert 1 < entry.billed.output_tokens < whole.output_tokens
    assert entry.reported == BilledUsage(whole.input_tokens, 1)


async def test_the_ledger_line_names_the_request_id_the_billing_record_is_keyed_by() -> None:
    app = _app()
    config = SamplerConfig(
        base_url="http://emulator.test/v1",
        backend=ApiBackend.RESPONSES,
        model="gpt-5-mini",
        api_key="sk-emulator",
    )
    faults = [{"type": "status", "status": 500, "times": 1}]
    request = ConversationRequest(
        items=[User("hello")], extra_headers=script_headers(text=TEXT, faults=faults)
    )
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        stream = await sampler.submit(request)
        async with stream:
            async for _ in stream:
                pass
    end = stream.terminal
    assert isinstance(end, Completed) and end.metrics is not None
    refused, completed = app.billed()
    assert [line.provider_request_id for line in end.metrics.ledger] == [
        refused.request_id,
        completed.request_id,
    ]
    assert completed.reported is not None
    line = end.metrics.ledger[-1]
    assert line.usage is not None
    assert (line.usage.input_tokens, line.usage.output_tokens) == (
        completed.reported.input_tokens,
        completed.reported.output_tokens,
    )


async def test_the_record_over_http_and_its_reset() -> None:
    app = _app()
    await _post(app, "/messages", MESSAGES, script_headers(text="hi", scenario="one"))
    await _post(app, "/chat/completions", CHAT, script_headers(text="hi"))
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        every = (await client.get(BASE + "/emulator/billing")).json()
        one = (await client.get(BASE + "/emulator/billing?scenario=one")).json()
        cleared = (await client.delete(BASE + "/emulator/billing")).json()
    assert [entry["backend"] for entry in every] == ["messages", "chat_completions"]
    assert [entry["scenario"] for entry in one] == ["one"]
    assert one[0]["outcome"] == "completed" and one[0]["billed"] == one[0]["reported"]
    assert cleared == [] and app.billed() == []


async def test_a_cancelled_background_response_bills_what_was_generated_before_the_cancel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _app()
    body = {"model": "gpt-5-mini", "input": "hi", "background": True, "store": True}
    response = await _post(app, "/responses", body, script_headers(text=TEXT, delay_ms=100))
    [entry] = app.billed()
    assert entry.outcome is BillingOutcome.BACKGROUND
    assert entry.billed is not None
    whole = entry.billed.output_tokens
    await trio.sleep(1.05)
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        await client.post(BASE + f"/responses/{response.json()['id']}/cancel")
    assert entry.billed.output_tokens < whole
    assert 0 < entry.deltas_sent < entry.deltas


async def test_the_record_is_bounded_oldest_dropped_first() -> None:
    app = EmulatorApp(cache=PromptCache(), max_billed=2)
    ids = [
        (await _post(app, "/chat/completions", CHAT, script_headers(text="hi"))).headers[
            "x-request-id"
        ]
        for _ in range(3)
    ]
    assert [entry.request_id for entry in app.billed()] == ids[1:]
    with pytest.raises(ValueError, match="max_billed"):
        EmulatorApp(max_billed=0)
