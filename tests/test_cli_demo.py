"""``trio-sampler demo``: what it shows, piped (plain lines) and on a terminal (rich).

The plain output is checked as a user reads it: every line labelled with its lane's
protocol, thinking apart from the answer, each tool call whole and followed by its result,
the 429 and its retry, the cancel and the partial answer it kept, the table and a legend
line for each column. The rich board is rendered at fixed widths: no line wider than the
terminal, no word broken, side by side only when there is room, and while it runs no
taller than the terminal. How it behaves on a real terminal (redrawn in place, Ctrl-C) is
``test_cli_terminal.py``.
"""

from __future__ import annotations

import functools
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from rich.cells import cell_len
from rich.console import Console

from trio_sampler.agent import AgentResult, AgentStop
from trio_sampler.cli import _demo, _demo_view
from trio_sampler.cli._demo_lanes import EntryKind, Lane, Scene, format_call
from trio_sampler.emulator import serve
from trio_sampler.models import ModelCatalog
from trio_sampler.types import (
    Assistant,
    ChannelToken,
    Completed,
    ConversationResponse,
    Failed,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallCompleted,
    ToolCallDelta,
)
from trio_sampler.wire import PartialJSON

ROOT = Path(__file__).resolve().parent.parent
LANES = ("Chat Completions", "Responses", "Messages")
LABEL = re.compile(r"^\[(Chat Completions|Responses|Messages)\] +(.*)$")
BOX = re.compile(r"[│╭╮╰╯─┃━┏┓┗┛]")


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_sampler", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def lane_lines(out: str) -> dict[str, list[str]]:
    """Each lane's lines (without the label), in order: everything up to the table."""
    lanes: dict[str, list[str]] = {name: [] for name in LANES}
    body = out.split("\n\n", 1)[0].splitlines()[1:]  # the header line, then the lanes
    for line in body:
        match = LABEL.match(line)
        assert match, f"a line of the lanes without its lane's label: {line!r}"
        lanes[match[1]].append(match[2])
    return lanes


def check_plain_output(out: str) -> None:
    """What the piped demo must show (also run against the installed wheel)."""
    assert "\x1b[" not in out  # no escape sequences into a pipe
    assert out.startswith("trio_sampler demo: ") and "embedded emulator at http://127.0.0.1:" in out
    lanes = lane_lines(out)
    endpoints = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
    for name, endpoint in zip(LANES, endpoints, strict=True):
        lines = lanes[name]
        assert lines[0].startswith(f"POST {endpoint}, model "), lines[0]
        assert lines[1].startswith("you: "), lines
        # Thinking apart from the answer: their own lines, and before the answer.
        thinking = [i for i, line in enumerate(lines) if line.startswith("thinking: ")]
        answers = [i for i, line in enumerate(lines) if line.startswith("answer: ")]
        assert thinking and answers and thinking[0] < answers[0], lines
    chat, responses, messages = (lanes[name] for name in LANES)
    # A tool call is shown whole, then how its arguments filled in as they streamed
    # (when they took more than one read), then its result.
    for lines, call, result in (
        (chat, 'calculate(expression="17 * 23 + 4")', "395"),
        (responses, 'read_file(path="notes.txt")', "trio_sampler: every request ends"),
        (messages, 'list_directory(path=".")', ".: 1 entries"),
    ):
        at = lines.index(f"tool call: {call}") + 1
        if lines[at].startswith("as it streamed: "):
            steps = lines[at][len("as it streamed: ") :].split(" → ")
            assert steps[-1] == call[call.index("(") + 1 : -1], lines[at]
            at += 1
        assert lines[at].startswith(f"result: {result}"), lines
    # The calculator's arguments arrive 6 characters every 40 ms: read, they fill in.
    filled = chat[chat.index('tool call: calculate(expression="17 * 23 + 4")') + 1]
    assert filled.startswith('as it streamed: expression="17') and " → " in filled, chat
    assert 'on server: web_search(query="python trio structured concurrency"): done' in responses
    # The 429 and its retry, before the conversation went on.
    retry = next(i for i, line in enumerate(chat) if line.startswith("retrying: "))
    assert chat[retry].startswith("retrying: in 0.8 s (retry 1 of 3) after rate_limited: ")
    assert retry < chat.index('tool call: calculate(expression="17 * 23 + 4")')
    assert chat[-1] == "done: answered after 2 step(s)"
    # The cancel, and the partial answer it kept: exactly what streamed before it.
    partial = next(line for line in messages if line.startswith("answer: "))[len("answer: ") :]
    cancel = messages[-1]
    assert cancel.startswith("cancel: cancelled mid-stream after 12 answer chunks"), messages
    assert f"the partial answer is kept ({len(partial)} characters" in cancel
    assert partial.startswith("The directory holds notes.txt.") and len(partial) < 200
    # The table: a header naming every column, a row per lane, a legend line per column.
    rest = out.split("\n\n", 1)[1]
    table, legend, verdict = rest.strip("\n").split("\n\n")
    header, _rule, *rows = table.splitlines()
    for column in _demo_view.COLUMNS:
        assert column.name in header
        assert any(line.startswith(f"{column.name} ") for line in legend.splitlines()), column
    assert [row.split("  ")[0] for row in rows] == list(LANES)
    assert all(re.search(r" \d+\.\d{6} ", row) for row in rows), rows  # every lane priced
    assert "3 (429)" in rows[0] and "final_answer ✓" in rows[0]
    assert "final_answer ✓" in rows[1] and "cancelled ✓" in rows[2]
    assert verdict == (
        "everything behaved as expected: 6 requests, each ended by exactly one terminal event"
    )
    assert all(line == line.rstrip() for line in out.splitlines())


@pytest.fixture(scope="module")
def piped() -> subprocess.CompletedProcess[str]:
    """The demo with its output to a pipe (run once for the module)."""
    return run_demo()


def test_piped_demo_is_plain_labelled_lines(piped: subprocess.CompletedProcess[str]) -> None:
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert piped.stderr == ""
    check_plain_output(piped.stdout)


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md"])
def test_the_documented_output_is_what_the_demo_prints(
    piped: subprocess.CompletedProcess[str], page: str
) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    documented = [line for line in text.splitlines() if LABEL.match(line)]
    assert len(documented) >= 5
    printed = set(piped.stdout.splitlines())
    assert [line for line in documented if line not in printed] == []


def test_plain_flag_on_a_terminal_is_the_same_plain_output() -> None:
    # FORCE_COLOR makes rich take the pipe for a terminal; --plain still prints lines.
    result = run_demo("--plain", env={"FORCE_COLOR": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    check_plain_output(result.stdout)


# -- the rich board -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_lanes() -> Iterator[list[Lane]]:
    """The three conversations, run once on the embedded emulator."""

    async def main() -> list[Lane]:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve)
            config = _demo.emulator_config(server.base_url)
            lanes = _demo.lanes_for(_demo.scenes(), config)
            with tempfile.TemporaryDirectory() as tmp:
                _demo.write_workspace(Path(tmp))
                await _demo.run_scenes(lanes, config, Path(tmp))
            nursery.cancel_scope.cancel()
        return lanes

    yield trio.run(main)


def render(renderable: object, width: int, height: int = 50) -> list[str]:
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None)
    with console.capture() as capture:
        console.print(renderable)
    return capture.get().splitlines()


def words(lines: list[str]) -> set[str]:
    return {word for line in lines for word in BOX.sub(" ", line).split()}


@pytest.mark.parametrize("width", [44, 50, 60, 80, 100, 120, 128, 160, 200])
def test_the_board_fits_the_width_without_breaking_words(
    finished_lanes: list[Lane], width: int
) -> None:
    def screen(at: int) -> list[str]:
        board = _demo_view.Board("trio_sampler demo: a header", finished_lanes)
        board.final = True
        return render(board, at) + render(_demo_view.Summary(finished_lanes), at)

    lines = screen(width)
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, too_wide
    # Rendered where nothing needs to wrap, every word is whole; a word broken (or cut
    # with an ellipsis) at this width would be a piece missing from there.
    broken = words(lines) - words(screen(1000))
    assert not broken, broken
    text = "\n".join(lines)
    for lane in finished_lanes:
        for entry in lane.entries:
            for word in entry.text.split()[:20]:
                assert word in text, (lane.title, word)
    # Side by side when there is room for three readable columns, else one under another.
    titled = [line for line in lines if any(f" {name} " in line for name in LANES)]
    if width >= _demo_view.SIDE_BY_SIDE_MIN_WIDTH:
        assert all(f" {name} " in titled[0] for name in LANES), titled
    else:
        assert all(sum(f" {name} " in line for name in LANES) == 1 for line in titled[:3])
    for column in _demo_view.COLUMNS:
        assert column.name.split()[0] in text  # every column is in the legend


@pytest.mark.parametrize(("width", "height"), [(60, 24), (100, 30), (160, 14)])
def test_while_running_the_board_fits_the_terminal(
    finished_lanes: list[Lane], width: int, height: int
) -> None:
    board = _demo_view.Board("trio_sampler demo: a header", finished_lanes)
    lines = render(board, width, height)
    assert len(lines) < height  # redrawn in place: it must fit on the screen
    # Each lane shows its newest lines: the end of each conversation is on screen.
    text = "\n".join(lines)
    assert "earlier lines" in text
    assert text.count("cancelled mid-stream") == 1
    assert text.count("answered after 2 step(s)") == 2


def test_a_streaming_answer_shows_a_cursor() -> None:
    lane = Lane(Scene(backend="messages", model="m", prompt="hi"), endpoint="POST /v1/messages")
    lane.start()
    lane.on_event(ChannelToken("r1", SamplingChannel.REASONING, "Let me think", 1))
    lane.on_event(ChannelToken("r1", SamplingChannel.TEXT, "Hello", 2, item_index=1))
    text = "\n".join(render(_demo_view.lane_panel(lane), 60))
    assert "Let me think" in text and "Hello▌" in text and "thinking" in text


# -- the lanes ----------------------------------------------------------------------------


def test_every_scene_names_a_catalog_model_of_its_protocol() -> None:
    # So the table prices every lane (a model missing from the catalog has no cost).
    catalog = ModelCatalog.shipped()
    for scene in _demo.scenes():
        info = catalog.get(scene.model)
        assert info is not None, f"{scene.model} is not in the shipped model catalog"
        assert info.backend is scene.backend, scene


def test_a_retry_that_discards_partial_output_removes_it_from_the_lane() -> None:
    lane = Lane(Scene(backend="responses", model="m", prompt="hi"))
    lane.start()
    lane.on_event(ChannelToken("r1", SamplingChannel.TEXT, "half an ans", 1))
    lane.on_event(Retrying("r1", 1, 3, SamplingErrorKind.TRANSPORT, "connection reset", 0.5, True))
    lane.on_event(ChannelToken("r1", SamplingChannel.TEXT, "A whole answer.", 1))
    shown = [(entry.kind, entry.text) for entry in lane.entries]
    assert (EntryKind.ANSWER, "half an ans") not in shown
    assert shown[-1] == (EntryKind.ANSWER, "A whole answer.")
    assert "partial output discarded" in shown[-2][1]
    assert lane.streamed_answer == "A whole answer."


def test_a_tool_call_fills_in_as_its_arguments_stream_then_is_whole() -> None:
    """The arguments are shown read (``name(key="value``), never as raw JSON, each
    ``ToolArgumentsDelta`` filling them in; the steps are kept for the piped view."""
    lane = Lane(Scene(backend="chat_completions", model="m", prompt="hi"))
    pieces = ['{"exp', 'ression": "1 ', '+ 1", "ro', 'und": 2}']
    reader = PartialJSON()
    shown = []
    for n, piece in enumerate(pieces):
        name = "calculate" if n == 0 else None
        lane.on_event(ToolCallDelta("r1", 0, id="c1", name=name, arguments_delta=piece))
        lane.on_event(ToolArgumentsDelta("r1", 0, tuple(reader.feed(piece))))
        shown.append(lane.entries[-1].text)
    assert shown == [
        "calculate(",
        'calculate(expression="1 ',
        'calculate(expression="1 + 1"',
        'calculate(expression="1 + 1", round=2',
    ]
    assert not lane.entries[-1].done
    call = ToolCall(id="c1", name="calculate", arguments="".join(pieces))
    lane.on_event(ToolCallCompleted("r1", 0, call))
    entry = lane.entries[-1]
    assert entry.text == 'calculate(expression="1 + 1", round=2)' and entry.done
    assert entry.steps == shown[1:]  # the call as it was shown while it streamed


def test_format_call_keeps_arguments_that_are_not_an_object() -> None:
    assert format_call("f", '{"a": 1, "b": "x"}') == 'f(a=1, b="x")'
    assert format_call("f", "[1, 2]") == "f([1, 2])"
    assert format_call("f", '{"cut": ') == 'f({"cut": )'
    assert format_call("f", "") == "f()"


def test_a_request_with_a_second_terminal_event_did_not_behave() -> None:
    lane = Lane(Scene(backend="messages", model="m", prompt="hi"))
    lane.start()
    lane.on_event(ChannelToken("r1", SamplingChannel.TEXT, "Hello.", 1))
    response = ConversationResponse(items=(Assistant("Hello."),))
    lane.on_event(Completed("r1", response))
    lane.finish(AgentResult(AgentStop.FINAL_ANSWER, (), response=response, steps=1))
    assert lane.behaved and lane.requests == 1
    lane.on_event(Completed("r1", response))
    assert not lane.behaved


def test_a_failure_is_shown_once() -> None:
    lane = Lane(Scene(backend="messages", model="m", prompt="hi"))
    lane.start()
    error = SamplingErrorInfo(SamplingErrorKind.AUTH, "invalid x-api-key", status_code=401)
    lane.on_event(Failed("r1", error))
    lane.finish(AgentResult(AgentStop.AUTH_FAILED, (), error=error))
    failures = [entry for entry in lane.entries if entry.kind is EntryKind.FAILED]
    assert len(failures) == 1 and "invalid x-api-key" in failures[0].text
    assert not lane.behaved


async def test_demo_against_a_failing_endpoint_says_so_once() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, require_key="sk-test-the-right-key"))
        args = ("--base-url", server.base_url, "--model", "emulator-1")
        env = {"OPENAI_API_KEY": "sk-test-a-wrong-key"}
        result = await trio.to_thread.run_sync(lambda: run_demo(*args, env=env))
        nursery.cancel_scope.cancel()
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if " failed: " in line]
    assert len(failed) == 1, result.stdout
    assert failed[0].startswith("[Chat Completions] failed: auth (HTTP 401): "), failed
    assert "Traceback" not in result.stdout + result.stderr
    assert "sk-test-a-wrong-key" not in result.stdout + result.stderr


def test_demo_with_a_bad_base_url_is_one_line_and_status_2() -> None:
    result = run_demo("--base-url", "ftp://example.com")
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "--base-url" in result.stderr and "http://" in result.stderr
