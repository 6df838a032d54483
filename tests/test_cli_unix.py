"""The command line as a Unix tool: Ctrl-C, closed pipes, bad arguments, stdout vs stderr.

Ctrl-C is what a terminal does: SIGINT to the command's whole process group. Each command
runs in its own session on a pseudo-terminal (so ``chat`` sees an interactive stdin), and the
test waits until the command is at the point named (at the prompt, mid-stream, serving,
blocked reading stdin) before it sends the signal. Then: one line, exit status 130, no
traceback, at once.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from trio_sampler.testing import EmulatorFixture

DEADLINE_S = 60.0  # generous: the machine may be loaded; a hang fails well before pytest's
INTERRUPTED = 130


#: Starts ``python -m trio_sampler ARGS`` with SIGINT at its default disposition, as a
#: shell at a terminal starts a command. A test run launched in the background by a script
#: inherits SIGINT ignored (POSIX: an asynchronous list ignores it), and so would every
#: command it starts; one that keeps Python's own Ctrl-C handling (``replay`` reading
#: stdin) would then rightly ignore the test's Ctrl-C. ``exec`` keeps the process id.
_AT_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'trio_sampler', *sys.argv[1:]])"
)


class Terminal:
    """A command on a pseudo-terminal: everything it writes, collected as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _AT_A_TERMINAL, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        os.close(slave)
        self.output = b""

    def read_until(self, done: Callable[[bytes], bool], *, to_the_end: bool = False) -> None:
        """Read until ``done(output)``, or with ``to_the_end`` until the command exits."""
        deadline = time.monotonic() + DEADLINE_S
        while not done(self.output):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; output so far: {self.output[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the command exited and closed the terminal
                    chunk = b""
                if not chunk:
                    assert to_the_end or done(self.output), f"exited early: {self.output!r}"
                    return
                self.output += chunk

    def interrupt(self) -> tuple[int, bytes]:
        """Ctrl-C; returns the exit status and what was written after the signal."""
        before = len(self.output)
        os.killpg(self.process.pid, signal.SIGINT)
        started = time.monotonic()
        self.read_until(lambda _: False, to_the_end=True)
        status = self.process.wait(timeout=DEADLINE_S)
        assert time.monotonic() - started < DEADLINE_S
        return status, self.output[before:]

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self.master)


@contextmanager
def terminal(*args: str, env: dict[str, str] | None = None) -> Iterator[Terminal]:
    term = Terminal(*args, env=env)
    try:
        yield term
    finally:
        term.close()


def assert_one_interrupted_line(status: int, after: bytes, command: str) -> None:
    text = after.decode(errors="replace").replace("\r", "")
    assert status == INTERRUPTED, text
    assert "Traceback" not in text and "Error" not in text, text
    lines = [line for line in text.split("\n") if line.strip() and line.strip() != "^C"]
    assert lines == [f"trio-sampler {command}: interrupted"], text


def blocked_reading_stdin(pid: int) -> bool:
    """Whether the process's main thread is in read(0, ...) (Linux: /proc/PID/syscall)."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 0


def slow_script(**extra: object) -> str:
    script = {"text": "word " * 400, "chunk_chars": 5, "delay_ms": 50, **extra}
    return "x-emulator-script: " + json.dumps(script)


# -- Ctrl-C ---------------------------------------------------------------------------


def test_ctrl_c_in_serve() -> None:
    with terminal("serve", "--port", "0") as term:
        term.read_until(lambda out: b"listening on http://" in out)
        assert_one_interrupted_line(*term.interrupt(), "serve")


async def test_ctrl_c_in_chat_at_the_prompt(emulator: EmulatorFixture) -> None:
    def scenario() -> None:
        args = ("chat", "--base-url", emulator.base_url, "--model", "m")
        with terminal(*args, env={"NO_COLOR": "1"}) as term:
            term.read_until(lambda out: b"you> " in out)
            assert_one_interrupted_line(*term.interrupt(), "chat")

    await trio.to_thread.run_sync(scenario)


async def test_ctrl_c_in_chat_mid_stream(emulator: EmulatorFixture) -> None:
    def scenario() -> None:
        args = ("chat", "hi", "--base-url", emulator.base_url, "--model", "m")
        with terminal(*args, "-H", slow_script(), env={"NO_COLOR": "1"}) as term:
            term.read_until(lambda out: out.count(b"word") >= 3)
            status, after = term.interrupt()
            assert b"word " * 400 not in term.output  # it stopped mid-stream
            assert_one_interrupted_line(status, after.replace(b"word", b""), "chat")

    await trio.to_thread.run_sync(scenario)


async def test_ctrl_c_mid_answer_in_an_interactive_chat_returns_to_the_prompt(
    emulator: EmulatorFixture,
) -> None:
    """The first Ctrl-C ends the answer and the chat goes on; the second quits."""

    def scenario() -> None:
        args = ("chat", "--base-url", emulator.base_url, "--model", "m", "-H", slow_script())
        with terminal(*args, env={"NO_COLOR": "1"}) as term:
            term.read_until(lambda out: b"you> " in out)
            os.write(term.master, b"tell me\n")
            term.read_until(lambda out: out.count(b"word") >= 3)
            os.killpg(term.process.pid, signal.SIGINT)
            term.read_until(lambda out: out.rstrip().endswith(b"you>"))
            assert term.process.poll() is None  # still running, at the prompt
            assert b"word " * 400 not in term.output  # the answer was cut
            assert b"Ctrl-C again quits" in term.output
            assert_one_interrupted_line(*term.interrupt(), "chat")

    await trio.to_thread.run_sync(scenario)


def test_ctrl_c_in_demo() -> None:
    # On a terminal the demo is a live board (rich), which hides the cursor while it runs.
    with terminal("demo", env={"NO_COLOR": "1"}) as term:
        term.read_until(lambda out: b"thinking" in out)  # mid-demo: the models are streaming
        status, after = term.interrupt()
        # The board's last frame is drawn as it stops; after it, one line.
        tail = after.decode(errors="replace").replace("\r", "").rstrip("\n").split("\n")[-1]
        assert status == INTERRUPTED and tail == "trio-sampler demo: interrupted", after
        assert b"Traceback" not in after and b"everything behaved" not in after
        assert b"\x1b[?25h" in after  # the cursor shown again


def test_ctrl_c_in_the_plain_demo() -> None:
    with terminal("demo", "--plain") as term:
        term.read_until(lambda out: b"thinking: " in out)
        status, after = term.interrupt()
        # Lane lines may still have been on their way when the signal went; they are whole
        # lines, labelled with their lane. Then: one line.
        text = after.decode(errors="replace").replace("\r", "")
        rest = "\n".join(line for line in text.split("\n") if not line.startswith("["))
        assert_one_interrupted_line(status, rest.encode(), "demo")


def test_ctrl_c_in_replay_from_stdin() -> None:
    with terminal("replay", "-", "--backend", "messages") as term:
        deadline = time.monotonic() + DEADLINE_S
        while not blocked_reading_stdin(term.process.pid):
            assert time.monotonic() < deadline, "replay never read its stdin"
            time.sleep(0.05)
        assert_one_interrupted_line(*term.interrupt(), "replay")


def test_ctrl_c_in_bench() -> None:
    with terminal("bench", "bench_actor") as term:
        term.read_until(lambda out: b"bench_actor.py" in out)
        status, after = term.interrupt()
        assert status == INTERRUPTED
        text = after.decode(errors="replace").replace("\r", "")
        assert "Traceback" not in text
        assert text.rstrip("\n").split("\n")[-1] == "trio-sampler bench: interrupted"


# -- pipes, streams, arguments --------------------------------------------------------


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "trio_sampler", *args],
        input=stdin,
        capture_output=True,
        timeout=DEADLINE_S,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )


async def test_closed_pipe_ends_quietly(emulator: EmulatorFixture) -> None:
    def scenario() -> tuple[int, bytes]:
        args = ["chat", "hi", "--json", "--base-url", emulator.base_url, "--model", "m"]
        process = subprocess.Popen(
            [sys.executable, "-m", "trio_sampler", *args, "-H", slow_script()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None and process.stderr is not None
        for _ in range(3):  # what `| head -3` reads
            process.stdout.readline()
        process.stdout.close()
        status = process.wait(timeout=DEADLINE_S)
        with process.stderr:
            return status, process.stderr.read()

    status, stderr = await trio.to_thread.run_sync(scenario)
    assert stderr == b""
    assert status == 141


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "--port", "99999"], "port 99999 is out of range"),
        (["serve", "--port", "eighty"], "not a port number"),
        (["serve", "--backlog", "0"], "must be at least 1"),
        (["serve", "--keep-alive-timeout", "0"], "must be a positive number of seconds"),
        (["serve", "--keep-alive-timeout", "soon"], "not a number of seconds"),
        (["replay", "no-such-file.sse", "--backend", "messages"], "cannot read no-such-file.sse"),
        (["replay", "-", "--backend", "smoke-signals"], "invalid choice"),
        (["chat", "hi", "--base-url", "localhost:8080", "--model", "m"], "not an http://"),
        (["chat", "hi", "--provider", "no-such-provider"], "--provider"),
        (["chat", "hi", "--provider", "openai_compatible"], "--base-url is required"),
        (
            ["chat", "hi", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-H", "x"],
            "Name: value",
        ),
        (
            ["chat", "hi", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-H", "Host: x"],
            "--header",
        ),
        (["bench", "no_such_bench"], "no benchmark no_such_bench.py"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_argument_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    result = run(*args, stdin=b"")
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and says in lines[0], lines
    assert result.stdout == b""


def test_missing_key_names_the_environment_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    result = subprocess.run(
        [sys.executable, "-m", "trio_sampler", "chat", "hi", "--provider", "anthropic"],
        capture_output=True,
        timeout=DEADLINE_S,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "trio-sampler chat: no API key: set the environment variable ANTHROPIC_API_KEY\n"
    )


def test_replay_with_the_wrong_backend_names_the_right_one(tmp_path: Path) -> None:
    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":'
        b'"message","role":"assistant","model":"x","content":[],"usage":{"input_tokens":1,'
        b'"output_tokens":0}}}\n\n'
    )
    path = tmp_path / "body.sse"
    path.write_bytes(body)
    result = run("replay", str(path), "--backend", "chat_completions")
    assert result.returncode == 2
    assert (
        result.stderr.decode()
        .strip()
        .endswith("is a messages stream, not chat_completions: pass --backend messages")
    )


async def test_notices_on_stderr_data_on_stdout(emulator: EmulatorFixture) -> None:
    script = {
        "text": "the answer",
        "scenario": "notice-429",
        "faults": [{"type": "status", "status": 429, "times": 1, "retry_after": 0}],
    }
    args = ("chat", "hi", "--base-url", emulator.base_url, "--model", "m")
    header = "x-emulator-script: " + json.dumps(script)
    result = await trio.to_thread.run_sync(lambda: run(*args, "-H", header))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "the answer\n"
    assert "trio-sampler chat: retrying in" in result.stderr.decode()


async def test_piped_chat_keeps_reasoning_apart(emulator: EmulatorFixture) -> None:
    script = {"reasoning": "first think\nthen decide", "text": "the answer"}
    args = ("chat", "hi", "--base-url", emulator.base_url, "--model", "m")
    header = "x-emulator-script: " + json.dumps(script)
    result = await trio.to_thread.run_sync(lambda: run(*args, "-H", header))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "thinking: first think\nthinking: then decide\n\nthe answer\n"


def test_version() -> None:
    from trio_sampler import __version__

    for command in (
        [sys.executable, "-m", "trio_sampler"],
        [sys.executable, "-m", "trio_sampler.cli"],
    ):
        result = subprocess.run([*command, "--version"], capture_output=True, check=False)
        assert result.returncode == 0
        assert result.stdout.decode() == f"trio-sampler {__version__}\n"
