"""The command line as a user runs it: subprocesses, their output and exit codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import orjson
import trio

from trio_sampler.testing import EmulatorFixture


def run(
    *args: str, stdin: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trio_sampler.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
        env=env,
    )


async def test_chat_one_shot_against_the_emulator(emulator: EmulatorFixture) -> None:
    args = ("chat", "Say hello", "--base-url", emulator.base_url, "--model", "emulator-1")
    result = await trio.to_thread.run_sync(lambda: run(*args))
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode().strip()) > 10
    assert len(emulator.requests()) == 1


async def test_chat_json_lines(emulator: EmulatorFixture) -> None:
    args = (
        "chat",
        "hi",
        "--base-url",
        emulator.base_url,
        "--model",
        "m",
        "--backend",
        "messages",
        "--json",
    )
    result = await trio.to_thread.run_sync(lambda: run(*args))
    assert result.returncode == 0, result.stderr.decode()
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "StreamStarted" and events[-1]["type"] == "Completed"


async def test_chat_interactive_keeps_the_conversation(emulator: EmulatorFixture) -> None:
    args = ("chat", "--base-url", emulator.base_url, "--model", "m", "--system", "be brief")
    result = await trio.to_thread.run_sync(lambda: run(*args, stdin=b"first\n\nsecond\n"))
    assert result.returncode == 0, result.stderr.decode()
    bodies = [r["body"] for r in emulator.requests()]
    assert len(bodies) == 2
    second = bodies[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]


def test_chat_missing_key_is_a_clear_error() -> None:
    env_key = "OPENAI_API_KEY"
    saved = os.environ.pop(env_key, None)
    try:
        result = run("chat", "hi", "--provider", "openai")
    finally:
        if saved is not None:
            os.environ[env_key] = saved
    assert result.returncode == 2
    assert b"OPENAI_API_KEY" in result.stderr


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_chat_connection_refused_fails_fast_with_the_address() -> None:
    port = closed_port()
    args = ("chat", "hi", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m")
    started = time.monotonic()
    result = await trio.to_thread.run_sync(lambda: run(*args))
    took = time.monotonic() - started
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert f"127.0.0.1:{port}" in stderr and "connection refused" in stderr, stderr
    assert "retrying" not in stderr and "Traceback" not in stderr, stderr
    assert took < 5.0  # not four retries and their backoff (~9 s); the interpreter's start


async def test_chat_404_on_a_base_url_without_v1_says_so(emulator: EmulatorFixture) -> None:
    without_v1 = emulator.base_url.removesuffix("/v1")
    args = ("chat", "hi", "--base-url", without_v1, "--model", "m")
    result = await trio.to_thread.run_sync(lambda: run(*args))
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert "404" in stderr and f"--base-url {without_v1}/v1" in stderr, stderr


def test_serve_prints_its_address_first_and_answers() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "trio_sampler.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as process:
        _check_serving(process)


def test_serve_closes_idle_connections_after_its_keep_alive_timeout() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "trio_sampler.cli", "serve", "--port", "0",
         "--keep-alive-timeout", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as process:  # fmt: skip
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline().decode().strip().rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
                # Closed by the server long before the default 5 s (a generous bound).
                start = time.monotonic()
                assert idle.recv(1) == b""
                assert time.monotonic() - start < 4.0
        finally:
            process.terminate()
            process.wait(timeout=10)


def _check_serving(process: subprocess.Popen[bytes]) -> None:
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode().strip()
        assert first.startswith("listening on http://127.0.0.1:")
        port = int(first.rsplit(":", 1)[1])
        import httpx2

        models = httpx2.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_serve_on_a_busy_port_says_so_without_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trio_sampler.cli", "serve", "--port", str(port)],
            capture_output=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}".encode() in result.stderr
    assert b"Traceback" not in result.stderr


def test_serve_reuse_port_processes_share_a_port() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "trio_sampler.cli", "serve", "--port", "0", "--reuse-port"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as first:
        try:
            assert first.stdout is not None
            line = first.stdout.readline().decode().strip()
            port = line.rsplit(":", 1)[1]
            with subprocess.Popen(
                [sys.executable, "-m", "trio_sampler.cli", "serve", "--port", port, "--reuse-port"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            ) as second:
                _check_serving(second)
        finally:
            first.terminate()
            first.wait(timeout=10)
