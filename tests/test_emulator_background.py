"""The emulator's Responses background mode: a response generated once, kept for
retrieval (``GET /v1/responses/{id}``, streamed from ``starting_after``) and cancel."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import trio
import trio.testing

from trio_sampler.emulator import EmulatorApp, PromptCache, script_headers
from trio_sampler.testing import EmulatorTransport

BODY = {"model": "m", "input": "hi", "stream": True, "background": True}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_dropped_stream_is_retrieved_from_where_it_stopped() -> None:
    app = EmulatorApp(cache=PromptCache())
    headers = script_headers(
        text="one two three four five six", faults=[{"type": "drop", "after_events": 6}]
    )
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        whole: list[dict[str, Any]] = []
        try:
            async with client.stream(
                "POST", "http://emulator/v1/responses", json=BODY, headers=headers
            ) as response:
                text = ""
                async for chunk in response.aiter_text():
                    text += chunk
        except httpx2.HTTPError:
            pass
        first = _events(text)
        assert [event["sequence_number"] for event in first] == list(range(6))
        response_id = first[0]["response"]["id"]
        resumed = await client.get(
            f"http://emulator/v1/responses/{response_id}",
            params={"stream": "true", "starting_after": "5"},
        )
        rest = _events(resumed.text)
        whole = first + rest
        assert [event["sequence_number"] for event in whole] == list(range(len(whole)))
        assert whole[-1]["type"] == "response.completed"
        record = app.background.records[response_id]
        assert (record.generations, record.retrievals) == (1, 1)
        deltas = [event for event in whole if event["type"] == "response.output_text.delta"]
        assert record.generated_deltas == len(deltas)
        final = await client.get(f"http://emulator/v1/responses/{response_id}")
        assert final.json()["status"] == "completed"


async def test_unknown_or_expired_response_is_404() -> None:
    app = EmulatorApp(cache=PromptCache())
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        assert (await client.get("http://emulator/v1/responses/resp_nope")).status_code == 404
        answer = await client.post("http://emulator/v1/responses", json={**BODY, "stream": False})
        response_id = answer.json()["id"]
        app.background.ttl_s = 0.0
        gone = await client.get(
            f"http://emulator/v1/responses/{response_id}?stream=true&starting_after=2"
        )
        assert gone.status_code == 404


async def test_store_false_is_refused() -> None:
    app = EmulatorApp(cache=PromptCache())
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        refused = await client.post("http://emulator/v1/responses", json={**BODY, "store": False})
        assert refused.status_code == 400
        assert "store=true" in refused.text
        missing = await client.post("http://emulator/v1/responses/resp_nope/cancel")
        assert missing.status_code == 404


async def test_generation_goes_on_without_a_reader_and_stops_when_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = EmulatorApp(cache=PromptCache())
    # 10 ms between events; the client's stream is cut after event 4.
    headers = script_headers(
        text="a b c d e f g h i j k l", delay_ms=10, faults=[{"type": "drop", "after_events": 5}]
    )
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        text = ""
        try:
            async with client.stream(
                "POST", "http://emulator/v1/responses", json=BODY, headers=headers
            ) as response:
                async for chunk in response.aiter_text():
                    text += chunk
        except httpx2.HTTPError:
            pass
        response_id = _events(text)[0]["response"]["id"]
        stored = app.background.find(response_id, trio.current_time())
        assert stored is not None
        running = await client.get(f"http://emulator/v1/responses/{response_id}")
        assert running.json()["status"] == "in_progress"
        # Nobody reads it for a while: the generation goes on meanwhile, until cancelled.
        await trio.sleep(stored.due(12) - trio.current_time())
        assert stored.due(len(stored.frames) - 1) > trio.current_time()
        cancelled = await client.post(f"http://emulator/v1/responses/{response_id}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        resumed = await client.get(
            f"http://emulator/v1/responses/{response_id}?stream=true&starting_after=4"
        )
        # Every event generated after the cut and before the cancel, once, in order.
        numbers = [event["sequence_number"] for event in _events(resumed.text)]
        assert numbers == list(range(5, 13))
    record = app.background.records[response_id]
    assert (record.generations, record.cancelled) == (1, True)


async def test_kept_responses_are_held_in_the_reply_budget() -> None:
    """A kept response's frames count in the reply budget while kept: past it, a new
    background response is refused (503, retry-after) as a reply is; once the kept ones
    expire, one is taken again."""
    limit = 1024 * 1024
    app = EmulatorApp(cache=PromptCache(), max_reply_bytes=limit)
    headers = script_headers(text="word " * 200)
    body = {**BODY, "stream": False}
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        first = await client.post("http://emulator/v1/responses", json=body, headers=headers)
        assert first.status_code == 200
        held = app.background.held_bytes
        assert held > 200 * len("word ") and app.replies.held == held
        answers = [
            await client.post("http://emulator/v1/responses", json=body, headers=headers)
            for _ in range(limit // held)
        ]
        refused = answers[-1]
        assert refused.status_code == 503, [a.status_code for a in answers]
        assert refused.headers["retry-after"] == "1"
        assert app.replies.held == app.background.held_bytes <= limit
        app.background.ttl_s = 0.0  # every kept response expires: the budget frees
        again = await client.post("http://emulator/v1/responses", json=body, headers=headers)
        assert again.status_code == 200
        assert app.replies.held == app.background.held_bytes == held
