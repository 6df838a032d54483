"""The emulator playing several models, and the faults a fallback chain is tested against:
silent, slow first token, cut, stall, no terminator, time windows, persistent status,
prefill rejection, context length exceeded, content filter."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from trio_sampler.emulator import EmulatorApp, PromptCache, ScriptError, script_headers, serve
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Failed, SamplingErrorKind, StopReason
from trio_sampler.wire import collect, replay
from trio_sampler.wire.errors import classify_http_error

BASE = "http://emulator.test/v1"
PATHS = {
    "chat_completions": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
}
USER = [{"role": "user", "content": "hi"}]


def _body(backend: str, model: str, *, stream: bool = True, messages: Any = None) -> dict[str, Any]:
    messages = USER if messages is None else messages
    if backend == "responses":
        return {"model": model, "stream": stream, "input": messages}
    body: dict[str, Any] = {"model": model, "stream": stream, "messages": messages}
    if backend == "messages":
        body["max_tokens"] = 200
    return body


def _app(**models: dict[str, Any]) -> EmulatorApp:
    return EmulatorApp(cache=PromptCache(), models=models)


async def _post(
    client: httpx2.AsyncClient, backend: str, model: str, **kwargs: Any
) -> httpx2.Response:
    headers = kwargs.pop("headers", None)
    return await client.post(
        BASE + PATHS[backend], json=_body(backend, model, **kwargs), headers=headers
    )


# --- several models ---------------------------------------------------------------------


async def test_each_model_runs_its_own_script() -> None:
    app = _app(
        primary={"faults": [{"type": "status", "status": 503}]},
        fallback={"text": "from the fallback"},
    )
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        down = await _post(client, "chat_completions", "primary", stream=False)
        up = await _post(client, "chat_completions", "fallback", stream=False)
        other = await _post(client, "chat_completions", "unlisted", stream=False)
    assert down.status_code == 503
    assert up.json()["choices"][0]["message"]["content"] == "from the fallback"
    assert other.status_code == 200 and other.json()["model"] == "unlisted"


async def test_fault_counters_are_kept_apart_per_model() -> None:
    # The same scenario name on two models: each model's first attempt fails.
    once = {"scenario": "s", "faults": [{"type": "status", "status": 500, "times": 1}]}
    app = _app(a=once, b=once)
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        statuses = [
            (await _post(client, "messages", model, stream=False)).status_code
            for model in ("a", "b", "a", "b")
        ]
    assert statuses == [500, 500, 200, 200]
    app.forget("s")  # forgets every model's counters of the scenario
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        assert (await _post(client, "messages", "a", stream=False)).status_code == 500


async def test_a_request_header_overrides_the_models_keys() -> None:
    app = _app(primary={"text": "default", "faults": [{"type": "status", "status": 529}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        failed = await _post(
            client, "messages", "primary", stream=False, headers=script_headers(text="own")
        )
        healed = await _post(
            client, "messages", "primary", stream=False, headers=script_headers(faults=[])
        )
    assert failed.status_code == 529  # the header replaced the text, not the faults
    assert healed.json()["content"][0]["text"] == "default"


async def test_the_model_list_includes_the_table() -> None:
    app = _app(primary={}, fallback={})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        listed = (await client.get(BASE + "/models")).json()
    names = [model["id"] for model in listed["data"]]
    assert "primary" in names and "fallback" in names


@pytest.mark.parametrize(
    ("models", "match"),
    [
        ({"primary": {"faults": [{"type": "sulk"}]}}, r"models\['primary'\].*faults\[0\]\.type"),
        ({"primary": {"txt": "x"}}, r"models\['primary'\].*unknown key.*txt"),
        ({"primary": "503"}, r"models\['primary'\] must be a script object"),
    ],
)
def test_a_bad_model_script_fails_at_construction(models: Any, match: str) -> None:
    with pytest.raises(ScriptError, match=match):
        EmulatorApp(models=models)


def test_cli_models_file_is_checked(tmp_path: Path) -> None:
    from trio_sampler.cli import UsageError
    from trio_sampler.cli._serve import _models

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"primary": {"faults": [{"type": "silent"}]}}))
    assert _models(str(good)) == {"primary": {"faults": [{"type": "silent"}]}}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"primary": {"faults": [{"type": "silent", "secs": 1}]}}))
    with pytest.raises(UsageError, match=r"--models: .*primary.*secs"):
        _models(str(bad))
    with pytest.raises(UsageError, match="cannot read"):
        _models(str(tmp_path / "missing.json"))


# --- silent -----------------------------------------------------------------------------


async def test_silent_sends_no_headers_until_the_client_gives_up(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = _app(primary={"faults": [{"type": "silent"}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        start = trio.current_time()
        with trio.move_on_after(3600) as scope:
            await _post(client, "chat_completions", "primary")
        assert scope.cancelled_caught
        assert trio.current_time() - start == pytest.approx(3600)
        # The next attempt is served normally once the silent one is given up.
        fine = await _post(client, "chat_completions", "other", stream=False)
    assert fine.status_code == 200


async def test_silent_for_a_while_then_answers(autojump_clock: trio.abc.Clock) -> None:
    app = _app(primary={"faults": [{"type": "silent", "seconds": 45, "times": 1}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        start = trio.current_time()
        first = await _post(client, "responses", "primary", stream=False)
        took = trio.current_time() - start
        second = await _post(client, "responses", "primary", stream=False)
    assert first.status_code == 200 and took == pytest.approx(45)
    assert second.headers["x-emulator-attempt"] == "2"


async def test_silent_over_loopback_times_out_the_client() -> None:
    # A real connection: accepted, the request read, and not a byte of answer.
    app = _app(primary={"faults": [{"type": "silent"}]})
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app))
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(5.0, read=0.5)) as client:
            with pytest.raises(httpx2.ReadTimeout):
                await client.post(
                    server.url_for("chat_completions"), json=_body("chat_completions", "primary")
                )
            fine = await client.post(
                server.url_for("chat_completions"),
                json=_body("chat_completions", "other", stream=False),
            )
        assert fine.status_code == 200
        nursery.cancel_scope.cancel()


# --- slow first token, cut, stall, no terminator -------------------------------------


@pytest.mark.parametrize("backend", list(PATHS))
async def test_slow_first_token_sends_headers_at_once(
    backend: str, autojump_clock: trio.abc.Clock
) -> None:
    app = _app(primary={"faults": [{"type": "slow_first_token", "seconds": 20, "times": 1}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        for attempt, expected in ((1, 20.0), (2, 0.0)):
            start = trio.current_time()
            request = client.build_request(
                "POST", BASE + PATHS[backend], json=_body(backend, "primary")
            )
            response = await client.send(request, stream=True)
            assert trio.current_time() - start == pytest.approx(0)  # headers at once
            first_token_at = None
            body = b""
            async for chunk in response.aiter_raw():
                body += chunk
                if first_token_at is None and _has_token(body):
                    first_token_at = trio.current_time() - start
            await response.aclose()
            assert response.headers["x-emulator-attempt"] == str(attempt)
            assert first_token_at == pytest.approx(expected)


_TOKEN = re.compile(rb'"content":"[^"]|"text_delta","text":"[^"]|response\.output_text\.delta')


def _has_token(body: bytes) -> bool:
    return _TOKEN.search(body) is not None


async def test_slow_first_token_on_a_non_streaming_request(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = _app(primary={"faults": [{"type": "slow_first_token", "seconds": 20}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        start = trio.current_time()
        response = await _post(client, "chat_completions", "primary", stream=False)
    assert response.status_code == 200 and trio.current_time() - start == pytest.approx(20)


@pytest.mark.parametrize("backend", list(PATHS))
async def test_cut_mid_answer(backend: str) -> None:
    # No after_events: the connection is closed in the middle of the answer.
    app = _app(primary={"text": "one two three four five six seven", "faults": [{"type": "drop"}]})
    received = b""
    async with (
        httpx2.AsyncClient(transport=EmulatorTransport(app)) as client,
        client.stream("POST", BASE + PATHS[backend], json=_body(backend, "primary")) as response,
    ):
        with pytest.raises(httpx2.RemoteProtocolError):
            async for chunk in response.aiter_raw():
                received += chunk
    events = replay(backend, received)
    text = collect(events).text
    assert text and "one two three four five six seven".startswith(text)
    assert text != "one two three four five six seven"


@pytest.mark.parametrize("backend", list(PATHS))
async def test_stall_mid_stream_until_the_client_gives_up(
    backend: str, autojump_clock: trio.abc.Clock
) -> None:
    app = _app(primary={"text": "one two three four five six", "faults": [{"type": "stall"}]})
    received = b""
    async with (
        httpx2.AsyncClient(transport=EmulatorTransport(app)) as client,
        client.stream("POST", BASE + PATHS[backend], json=_body(backend, "primary")) as response,
    ):
        with trio.move_on_after(600) as scope:
            async for chunk in response.aiter_raw():
                received += chunk
    assert scope.cancelled_caught
    text = collect(replay(backend, received)).text
    assert text and text != "one two three four five six"  # some tokens, then nothing


TERMINATORS = {
    "chat_completions": b"data: [DONE]",
    "responses": b"response.completed",
    "messages": b"message_stop",
}


@pytest.mark.parametrize("backend", list(PATHS))
async def test_no_terminator_ends_the_body_cleanly_without_it(backend: str) -> None:
    app = _app(primary={"text": "all of it", "faults": [{"type": "no_terminator", "times": 1}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        cut = await _post(client, backend, "primary")
        whole = await _post(client, backend, "primary")
    assert cut.status_code == 200 and TERMINATORS[backend] not in cut.content
    assert TERMINATORS[backend] in whole.content
    assert b"all of it" in cut.content or b'"all' in cut.content
    if backend == "responses":
        # Responses ends only with its terminator: the stream is truncated.
        assert isinstance(replay(backend, cut.content)[-1], Failed)


# --- time windows and persistent status -------------------------------------------------


async def test_status_during_a_time_window_then_healthy(autojump_clock: trio.abc.Clock) -> None:
    app = _app(primary={"faults": [{"type": "status", "status": 503, "until_s": 60}]})
    statuses = []
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        for _ in range(20):  # one request every 4 s for 80 s
            statuses.append((await _post(client, "messages", "primary", stream=False)).status_code)
            await trio.sleep(4)
    assert statuses == [503] * 15 + [200] * 5


async def test_a_window_can_start_later_and_repeat(autojump_clock: trio.abc.Clock) -> None:
    # 500 during [10, 20) of every 30 s: a flapping route.
    fault = {"type": "status", "status": 500, "from_s": 10, "until_s": 20, "period_s": 30}
    app = _app(primary={"faults": [fault]})
    start = trio.current_time()
    app.start_clock()
    seen = {}
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        for second in (0, 5, 10, 15, 20, 25, 30, 40, 45, 50):
            await trio.sleep_until(start + second)
            response = await _post(client, "chat_completions", "primary", stream=False)
            seen[second] = response.status_code
    assert [s for s, status in seen.items() if status == 500] == [10, 15, 40, 45]


async def test_a_status_fault_without_times_is_persistent() -> None:
    app = _app(primary={"faults": [{"type": "status", "status": 503}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        statuses = {
            (await _post(client, "chat_completions", "primary")).status_code for _ in range(8)
        }
    assert statuses == {503}


# --- prefill rejection, context length, content filter --------------------------------


PREFILL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The"}]


@pytest.mark.parametrize("backend", list(PATHS))
async def test_prefill_rejected_by_a_model_that_does_not_accept_it(backend: str) -> None:
    app = _app(strict={"accepts_prefill": False}, lenient={})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        rejected = await _post(client, backend, "strict", messages=PREFILL)
        accepted = await _post(client, backend, "lenient", messages=PREFILL)
        plain = await _post(client, backend, "strict")
    assert rejected.status_code == 400
    message = (
        "This model does not support assistant message prefill. "
        "The conversation must end with a user message."
    )
    error = rejected.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] == message
    if backend == "messages":
        assert rejected.json()["type"] == "error"
    info = classify_http_error(400, rejected.headers, rejected.content)
    assert info.kind is SamplingErrorKind.INVALID_REQUEST and not info.retryable
    assert accepted.status_code == plain.status_code == 200


@pytest.mark.parametrize("backend", list(PATHS))
async def test_context_length_exceeded_has_each_backends_real_error(backend: str) -> None:
    long = [{"role": "user", "content": "word " * 400}]  # well over 100 tokens
    app = _app(small={"context_window": 100}, forced={"faults": [{"type": "context_length"}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        too_long = await _post(client, backend, "small", messages=long)
        fits = await _post(client, backend, "small")
        forced = await _post(client, backend, "forced")
    assert fits.status_code == 200
    for response in (too_long, forced):
        assert response.status_code == 400
        error = response.json()["error"]
        if backend == "messages":
            assert error["type"] == "invalid_request_error"
            assert error["message"].startswith("prompt is too long: ")
        else:
            assert error["code"] == "context_length_exceeded"
            assert error["param"] == ("input" if backend == "responses" else "messages")
        info = classify_http_error(400, response.headers, response.content)
        assert info.kind is SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED
    if backend == "messages":
        message = too_long.json()["error"]["message"]
        tokens = int(message.split()[4])
        assert tokens > 100 and message.endswith("> 100 maximum")
    elif backend == "chat_completions":
        assert "maximum context length is 100 tokens" in too_long.json()["error"]["message"]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("backend", list(PATHS))
async def test_content_filter_stops_as_the_real_apis_do(backend: str, stream: bool) -> None:
    app = _app(filtered={"faults": [{"type": "content_filter", "times": 1}]})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        filtered = await _post(client, backend, "filtered", stream=stream)
        normal = await _post(client, backend, "filtered", stream=stream)
    assert filtered.status_code == 200
    if not stream:
        data = filtered.json()
        if backend == "chat_completions":
            assert data["choices"][0]["finish_reason"] == "content_filter"
        elif backend == "responses":
            assert data["status"] == "incomplete"
            assert data["incomplete_details"] == {"reason": "content_filter"}
        else:
            assert data["stop_reason"] == "refusal"
            assert data["stop_details"]["type"] == "refusal"
        return
    response = collect(replay(backend, filtered.content))
    assert response.stop_reason is StopReason.CONTENT_FILTER
    if backend == "messages":
        assert b'"stop_details":{"type":"refusal"' in filtered.content
        assert response.refusal  # the explanation, as the refusal
    assert collect(replay(backend, normal.content)).stop_reason is StopReason.STOP


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("backend", list(PATHS))
async def test_a_scripted_refusal_in_each_backends_shape(backend: str, stream: bool) -> None:
    refusal = "I can't help with that request."
    app = _app(careful={"refusal": refusal, "chunk_chars": 6})
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        response = await _post(client, backend, "careful", stream=stream)
    assert response.status_code == 200
    if stream:
        if backend == "chat_completions":
            assert b'"content":null,"refusal":""' in response.content
            assert b'"finish_reason":"stop"' in response.content  # the wire's own stop
        collected = collect(replay(backend, response.content))
        assert collected.refusal == refusal and collected.text == ""
        assert collected.stop_reason is StopReason.CONTENT_FILTER  # how the library reads it
        return
    data = response.json()
    if backend == "chat_completions":
        message = data["choices"][0]["message"]
        assert message["content"] is None and message["refusal"] == refusal
        assert data["choices"][0]["finish_reason"] == "stop"
    elif backend == "responses":
        assert data["output"][0]["content"] == [{"type": "refusal", "refusal": refusal}]
        assert data["status"] == "completed"
    else:
        assert data["content"] == [] and data["stop_reason"] == "refusal"
        assert data["stop_details"]["explanation"] == refusal
