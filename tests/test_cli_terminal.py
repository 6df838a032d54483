"""``trio-sampler demo`` on a real terminal emulator (tmux), as a user sees it.

tmux keeps the screen and its scrollback the way a terminal does, wrapping any line wider
than the window, so the captured text is what was on the screen: the live board redrawn in
place (its header once, not once per frame), nothing wider than the window, the final
frame and the table at the end; Ctrl-C mid-demo ends it with one line, exit status 130 and
the cursor shown again.

Each test runs its own tmux server on a private socket (nothing shared with a user's tmux).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.cells import cell_len

from trio_sampler.cli._demo_view import SIDE_BY_SIDE_MIN_WIDTH

DEADLINE_S = 60.0  # generous: the machine may be loaded
INTERRUPTED = 130
LANES = ("Chat Completions", "Responses", "Messages")


class Tmux:
    """One window of a private tmux server running one command."""

    def __init__(self, directory: Path) -> None:
        if shutil.which("tmux") is None:
            pytest.fail("the terminal tests need tmux (Debian: apt-get install tmux)")
        self.socket = directory / "tmux.sock"
        self.status_file = directory / "status"

    def __call__(self, *args: str) -> str:
        completed = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=True,
            # The window's size is the terminal's: no COLUMNS/LINES (readline, loaded by
            # the test runner, puts them in the process's C environment, which a child
            # inherits unless given an environment of its own).
            env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
        )
        return completed.stdout

    def start(self, command: list[str], *, width: int, height: int) -> None:
        # The exit status goes to a file, and the shell then stays (asleep) so the window
        # keeps the command's last screen and modes, cursor included. The shell outlives
        # a Ctrl-C: a trapped signal is the default again in the command it starts.
        status = shlex.quote(str(self.status_file))
        wrapped = (
            f"trap : INT; {shlex.join(command)}; echo $? > {status}.part; "
            f"mv {status}.part {status}; exec sleep 600"
        )
        self(
            "-f",
            os.devnull,
            "new-session",
            "-d",
            "-s",
            "demo",
            "-x",
            str(width),
            "-y",
            str(height),
            wrapped,
        )

    def screen(self) -> str:
        """Everything the window showed, scrollback included, wrapped lines joined."""
        return self("capture-pane", "-p", "-J", "-t", "demo", "-S", "-", "-E", "-")

    def field(self, name: str) -> str:
        return self("display-message", "-p", "-t", "demo", f"#{{{name}}}").strip()

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.screen()}"
            time.sleep(0.05)

    def exit_status(self) -> int:
        """Wait for the command to end; its exit status."""
        self.wait_for(self.status_file.exists, "the command to exit")
        return int(self.status_file.read_text())


@contextmanager
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    session = Tmux(tmp_path)
    try:
        yield session
    finally:
        subprocess.run(
            ["tmux", "-S", str(session.socket), "kill-server"], capture_output=True, check=False
        )


DEMO = [sys.executable, "-m", "trio_sampler", "demo"]


@pytest.mark.parametrize(("width", "height"), [(60, 24), (100, 30), (160, 40)])
def test_the_live_board_on_a_terminal(tmp_path: Path, width: int, height: int) -> None:
    with tmux(tmp_path) as term:
        term.start(DEMO, width=width, height=height)
        status = term.exit_status()
        screen = term.screen()
    assert status == 0, screen
    lines = screen.rstrip("\n").splitlines()
    # Redrawn in place: one header, one frame of lanes, one table.
    assert screen.count("trio_sampler demo:") == 1, screen
    assert screen.count("everything behaved as expected") == 1, screen
    # Nothing ever went past the right edge (a longer line would have wrapped: joined
    # here, it would be longer than the window).
    assert all(cell_len(line) <= width for line in lines), screen
    # Each lane framed whole: every line of a frame ends with its border.
    framed = [line.rstrip() for line in lines if line.startswith(("│", "╭", "╰"))]
    assert framed and all(line[-1] in "│╮╯" for line in framed), screen
    for name in LANES:
        assert f" {name} " in screen
    # The last frame: every lane at its end (its state on its frame's bottom edge).
    assert len(re.findall(r"─ +answered +─╯", screen)) == 2, screen
    assert len(re.findall(r"─ +cancelled, partial answer kept +─╯", screen)) == 1, screen
    titles = next(line for line in lines if " Chat Completions " in line)
    side_by_side = all(f" {name} " in titles for name in LANES)
    assert side_by_side == (width >= SIDE_BY_SIDE_MIN_WIDTH), screen
    assert "Traceback" not in screen


def test_ctrl_c_mid_demo_is_one_line_and_130(tmp_path: Path) -> None:
    with tmux(tmp_path) as term:
        term.start(DEMO, width=100, height=30)
        term.wait_for(lambda: "thinking" in term.screen(), "the first thoughts")
        term("send-keys", "-t", "demo", "C-c")
        status = term.exit_status()
        screen = term.screen()
        cursor_shown = term.field("cursor_flag")
    assert status == INTERRUPTED, screen
    shown = [line for line in screen.splitlines() if line.strip()]
    assert shown[-1] == "trio-sampler demo: interrupted", screen
    assert "Traceback" not in screen and "everything behaved" not in screen
    assert screen.count("trio-sampler demo: interrupted") == 1
    assert cursor_shown == "1"  # the live board hid the cursor; it is back
