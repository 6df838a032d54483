"""``trio-sampler replay`` as a user runs it: a subprocess, real files, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import trio

from benchmarks import corpus
from trio_sampler.testing import EmulatorFixture

CORPUS = corpus.root()


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "trio_sampler.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


@pytest.mark.real_streams
def test_replay_prints_collected_response() -> None:
    path = CORPUS / "chat_completions" / "openai-gpt-4o-parallel-tool-calls.sse"
    result = run("replay", str(path), "--backend", "chat_completions")
    assert result.returncode == 0, result.stderr
    data = orjson.loads(result.stdout)
    assert data["stop_reason"] == "tool_calls"
    assert len(data["tool_calls"]) >= 2
    assert all(orjson.loads(call["arguments"]) is not None for call in data["tool_calls"])
    assert data["usage"]["input_tokens"] > 0


@pytest.mark.real_streams
def test_replay_events_one_json_per_line() -> None:
    path = CORPUS / "messages" / sorted(p.name for p in (CORPUS / "messages").glob("*.sse"))[0]
    result = run("replay", str(path), "--backend", "messages", "--events")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    events = [orjson.loads(line) for line in lines]
    assert events[0]["type"] == "StreamStarted"
    assert events[-1]["type"] == "Completed"


def test_replay_failed_stream_exits_1_with_error_on_stderr() -> None:
    body = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'  # no terminator
    result = run("replay", "-", "--backend", "chat_completions", stdin=body)
    assert result.returncode == 1
    assert b"stream failed" in result.stderr
    assert orjson.loads(result.stdout)["text"] == "hi"


def test_replay_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run("replay", str(tmp_path / "nope.sse"), "--backend", "responses")
    assert result.returncode == 2
    assert b"cannot read" in result.stderr


# -- cassettes: trio-sampler record, then replay ---------------------------------------------


async def test_record_then_replay_a_cassette(emulator: EmulatorFixture, tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette"
    script = "x-emulator-script: " + orjson.dumps({"text": "Recorded answer."}).decode()
    record = (
        sys.executable, "-m", "trio_sampler", "record", "hi", "--out", str(cassette),
        "--base-url", emulator.base_url, "--model", "m", "-H", script,
        "-H", "Authorization: Bearer sk-recorded-0123456789",
    )  # fmt: skip
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(record, capture_output=True, check=False, timeout=120)
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "Recorded answer."
    assert "1 exchange(s) recorded" in done.stderr.decode()
    assert b"sk-recorded" not in cassette.read_bytes()

    replay = (sys.executable, "-m", "trio_sampler", "replay", str(cassette), "--timing", "original")
    replayed = await trio.to_thread.run_sync(
        lambda: subprocess.run(replay, capture_output=True, check=False, timeout=120)
    )
    assert replayed.returncode == 0, replayed.stderr.decode()
    assert orjson.loads(replayed.stdout)["text"] == "Recorded answer."


async def test_serve_a_cassette(emulator: EmulatorFixture, tmp_path: Path) -> None:
    """`serve --cassette` answers as the recording did: a client of its own (httpx2) sees the
    recorded body; a bad file is one line and exit 2."""
    import httpx2

    cassette = tmp_path / "run.cassette"
    record = (
        sys.executable, "-m", "trio_sampler", "record", "hi", "--out", str(cassette),
        "--base-url", emulator.base_url, "--model", "m",
    )  # fmt: skip
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(record, capture_output=True, check=False, timeout=120)
    )
    assert done.returncode == 0, done.stderr.decode()
    serve = (sys.executable, "-m", "trio_sampler", "serve", "--cassette", str(cassette))
    process = await trio.lowlevel.open_process(serve, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await process.stdout.receive_some(1)
        origin = line.decode().removeprefix("listening on ").strip()
        async with httpx2.AsyncClient() as client:
            response = await client.post(f"{origin}/v1/chat/completions", json={})
        assert response.status_code == 200
        assert b"data: [DONE]" in response.content
    finally:
        process.terminate()
        await process.wait()
    bad = await trio.to_thread.run_sync(
        lambda: run("serve", "--cassette", str(tmp_path / "missing.cassette"))
    )
    assert bad.returncode == 2 and b"--cassette: cannot read" in bad.stderr
