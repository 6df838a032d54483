"""How ``trio-sampler demo`` is drawn: live lanes on a terminal, plain lines otherwise.

On a terminal the lanes are redrawn in place with ``rich`` (side by side when the
terminal is wide enough for three readable columns, stacked otherwise), each showing its
newest lines while the conversations run and everything once they have ended; text wraps
at word boundaries to the terminal's current width. Anywhere else (a pipe, a file, a dumb
terminal, ``--plain``) every entry is printed once, whole and unwrapped, when it is
complete, prefixed with its lane, so the output greps and diffs well. Both end with the same
table of the numbers and a legend that explains each column.

``rich`` does what hand-made ANSI handling gets wrong: the width of wide and combining
characters, wrapping at words, redrawing a region in place without garbling it, colour only
where the terminal supports it (and never with ``NO_COLOR``), and the cursor restored
however the program ends.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import IO

import attrs
import trio
from rich import box
from rich.cells import cell_len
from rich.console import (
    Console,
    ConsoleOptions,
    Group,
    JustifyMethod,
    RenderableType,
    RenderResult,
)
from rich.live import Live
from rich.measure import Measurement
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..types import Usage
from ._demo_lanes import STREAMED, Entry, EntryKind, Lane, View

__all__ = [
    "COLUMNS",
    "Board",
    "LiveView",
    "PlainView",
    "Summary",
    "choose_view",
    "plain_summary",
]

#: Three lanes go side by side from this many columns (each then ~42 wide: room for a
#: tool call such as `read_file(path="notes.txt")` on one line).
SIDE_BY_SIDE_MIN_WIDTH = 128
#: How often the live board is redrawn (when something changed), per second.
REFRESH_PER_SECOND = 20
#: A tool result longer than this many lines shows its first ones in a lane.
RESULT_LINES = 6

LANE_STYLES = {
    "Chat Completions": "green",
    "Responses": "cyan",
    "Messages": "magenta",
}
LABEL_STYLES = {
    EntryKind.USER: "bold",
    EntryKind.THINKING: "dim",
    EntryKind.ANSWER: "bold",
    EntryKind.REFUSAL: "bold red",
    EntryKind.TOOL_CALL: "yellow",
    EntryKind.TOOL_RESULT: "yellow",
    EntryKind.SERVER_TOOL: "blue",
    EntryKind.RETRY: "bold yellow",
    EntryKind.CANCEL: "bold red",
    EntryKind.DONE: "bold green",
    EntryKind.FAILED: "bold red",
}
TEXT_STYLES = {
    EntryKind.THINKING: "dim italic",
    EntryKind.REFUSAL: "red",
    EntryKind.TOOL_CALL: "yellow",
    EntryKind.SERVER_TOOL: "blue",
    EntryKind.RETRY: "yellow",
    EntryKind.CANCEL: "red",
    EntryKind.DONE: "green",
    EntryKind.FAILED: "red",
}
LABEL_WIDTH = max(len(kind.value) for kind in EntryKind)


def choose_view(*, plain: bool = False, console: Console | None = None) -> View:
    """The live board on a terminal that can redraw; plain lines otherwise."""
    console = console or Console(highlight=False)
    if plain or not console.is_terminal or console.is_dumb_terminal:
        return PlainView(console.file)
    return LiveView(console)


# -- the numbers --------------------------------------------------------------------------


@attrs.frozen
class Column:
    """A column of the final table: its header, what it means, its value for a lane."""

    name: str
    meaning: str
    value: Callable[[Lane], str]
    justify: JustifyMethod = "right"


def _attempts(lane: Lane) -> str:
    records = [record for request in lane.attempts for record in request]
    failed = [
        str(record.status_code) if record.status_code else record.kind.value
        for record in records
        if record.kind is not None
    ]
    total = sum(lane.attempt_counts)
    return f"{total} ({', '.join(failed)})" if failed else str(total)


def _usage(lane: Lane) -> Usage | None:
    return lane.result.usage if lane.result is not None else None


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _outcome(lane: Lane) -> str:
    if lane.result is None:
        return "did not end"
    mark = "✓" if lane.behaved else f"✗ expected {lane.scene.expected.value}"
    return f"{lane.result.stop.value} {mark}"


COLUMNS: tuple[Column, ...] = (
    Column(
        "lane",
        "the conversation, named by the protocol it spoke",
        lambda lane: lane.title,
        "left",
    ),
    Column(
        "requests",
        "requests the agent loop submitted, one per model response (a tool's result goes "
        "back in a new request); each ended with exactly one terminal event",
        lambda lane: str(lane.requests),
    ),
    Column(
        "attempts",
        "HTTP attempts over those requests, a retry being one more; in brackets the status "
        "(or error kind) of each attempt that failed",
        _attempts,
    ),
    Column(
        "first token ms",
        "milliseconds from the first submit to the first token, any retry's wait included",
        lambda lane: "-" if lane.ttft_ms is None else f"{lane.ttft_ms:,.0f}",
    ),
    Column(
        "input",
        "input tokens over all the requests (the whole conversation is sent each time)",
        lambda lane: _count(usage.input_tokens if (usage := _usage(lane)) else None),
    ),
    Column(
        "cached",
        "of those, read from the prompt cache (prompts of 1,024 tokens or more are cached, "
        "as the providers do)",
        lambda lane: _count(usage.cache_read_tokens if (usage := _usage(lane)) else None),
    ),
    Column(
        "output",
        "output tokens, thinking included (a cancelled request counts what it had produced)",
        lambda lane: _count(usage.output_tokens if (usage := _usage(lane)) else None),
    ),
    Column(
        "cost $",
        "US dollars: as the server reported it, else at the model's list prices in the "
        "built-in model catalog",
        lambda lane: "-" if lane.cost_ticks is None else f"{lane.cost_ticks / 1e10:.6f}",
    ),
    Column(
        "outcome",
        "how the turn ended, ✓ when as the demo expects: an answer, or for the cancelled "
        "one its partial answer kept exactly as it streamed",
        _outcome,
        "left",
    ),
)


def verdict(lanes: list[Lane]) -> tuple[str, bool]:
    """One line on the whole run, and whether it went as expected."""
    wrong = [lane.title for lane in lanes if not lane.behaved]
    if wrong:
        return f"not as expected: {', '.join(wrong)}", False
    requests = sum(lane.requests for lane in lanes)
    return (
        f"everything behaved as expected: {requests} requests, each ended by exactly one "
        "terminal event",
        True,
    )


def _wide_table(lanes: list[Lane]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in COLUMNS:
        table.add_column(column.name, justify=column.justify)
    for lane in lanes:
        table.add_row(*(column.value(lane) for column in COLUMNS))
    return table


def _longest_word(texts: Iterable[str]) -> int:
    return max(cell_len(word) for text in texts for word in text.split())


def _tall_table(lanes: list[Lane]) -> Table:
    """The same numbers turned a quarter: one row per column, one column per lane.

    Each lane's column is as wide as its longest word (so a value wraps between words, never
    inside one); the names take the rest."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    first, *rest = COLUMNS
    table.add_column(first.name, justify="left", min_width=_longest_word(c.name for c in rest))
    for lane in lanes:
        width = _longest_word([lane.title, *(column.value(lane) for column in rest)])
        table.add_column(lane.title, justify="right", width=width)
    for column in rest:
        table.add_row(column.name, *(column.value(lane) for lane in lanes))
    return table


def _tall_table_width(lanes: list[Lane]) -> int:
    """The narrowest the turned table can be without cutting a word."""
    rest = COLUMNS[1:]
    widths = [_longest_word(c.name for c in rest)]
    widths += [_longest_word([lane.title, *(c.value(lane) for c in rest)]) for lane in lanes]
    return sum(widths) + 3 * (len(widths) - 1)  # padding, divider, padding between columns


def _legend() -> Table:
    legend = Table.grid(padding=(0, 1))
    legend.add_column(style="bold", no_wrap=True)
    legend.add_column(ratio=1)
    for column in COLUMNS:
        legend.add_row(column.name, column.meaning)
    return legend


def _lane_lists(lanes: list[Lane]) -> Group:
    """The same numbers for a terminal too narrow for any table: a paragraph per lane."""
    paragraphs = []
    for lane in lanes:
        text = Text(lane.title, style="bold")
        for column in COLUMNS[1:]:
            text.append("  ")
            text.append(f"{column.name} ", style="dim")
            text.append(column.value(lane))
        paragraphs.append(text)
    return Group(*paragraphs)


class Summary:
    """The numbers, their legend and the verdict. The table has a row per lane where it
    fits; turned a quarter (a row per column) where that fits; else a paragraph per lane."""

    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes

    def numbers(self, console: Console, options: ConsoleOptions) -> RenderableType:
        # (Measured unconstrained: a measurement is clamped to the width it is given.)
        unconstrained = options.update(width=10_000)
        wide = _wide_table(self.lanes)
        if Measurement.get(console, unconstrained, wide).maximum <= options.max_width:
            return wide
        if _tall_table_width(self.lanes) <= options.max_width:
            return _tall_table(self.lanes)
        return _lane_lists(self.lanes)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text, ok = verdict(self.lanes)
        yield self.numbers(console, options)
        yield Text("")
        yield _legend()
        yield Text("")
        yield Text(text, style="bold green" if ok else "bold red")


def plain_summary(lanes: list[Lane], out: IO[str]) -> None:
    """The table and its legend as plain text: nothing wrapped, no colour."""
    console = Console(width=10_000, color_system=None, highlight=False)
    with console.capture() as capture:
        console.print(_wide_table(lanes))
    table = [line.rstrip() for line in capture.get().splitlines()]
    name_width = max(len(column.name) for column in COLUMNS)
    legend = [f"{column.name:<{name_width}}  {column.meaning}" for column in COLUMNS]
    for line in [*table, "", *legend, "", verdict(lanes)[0]]:
        out.write(line + "\n")
    out.flush()


# -- the live board -----------------------------------------------------------------------


def _entry_text(entry: Entry) -> Text:
    text = entry.text
    if entry.kind is EntryKind.TOOL_RESULT:
        lines = text.splitlines() or [""]
        if len(lines) > RESULT_LINES:
            lines = [*lines[: RESULT_LINES - 1], f"… {len(lines) - RESULT_LINES + 1} more lines"]
        text = "\n".join(lines)
    style = TEXT_STYLES.get(entry.kind, "")
    if entry.kind is EntryKind.TOOL_RESULT and entry.error:
        style = "red"
    shown = Text(text, style=style)
    if not entry.done:
        shown.append("▌" if entry.kind in STREAMED else " …")
    return shown


def lane_body(lane: Lane) -> RenderableType:
    """A lane's content: where it sends, then one labelled row per entry."""
    intro = Text(f"{lane.scene.model} · {lane.endpoint}", style="dim")
    if lane.scene.scripted:
        intro.append(f" · scripted: {lane.scene.scripted}", style="dim")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, min_width=LABEL_WIDTH)
    grid.add_column(ratio=1, overflow="fold")
    for entry in lane.entries:
        grid.add_row(Text(entry.kind.value, style=LABEL_STYLES[entry.kind]), _entry_text(entry))
    return Group(intro, grid)


class _Tail:
    """The last ``height`` lines of a renderable (all of it when ``height`` is None)."""

    def __init__(self, renderable: RenderableType, height: int | None) -> None:
        self.renderable = renderable
        self.height = height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options, pad=False)
        if self.height is not None and len(lines) > self.height:
            keep = max(self.height - 1, 1)
            yield Text(f"⋮ {len(lines) - keep} earlier lines", style="dim")
            lines = lines[-keep:]
        for line in lines:
            yield from line
            yield Segment.line()


def lane_panel(lane: Lane, height: int | None = None) -> Panel:
    """A lane, framed in its colour, titled with its protocol, its state underneath."""
    colour = LANE_STYLES.get(lane.title, "white")
    return Panel(
        _Tail(lane_body(lane), height),
        title=Text(f" {lane.title} ", style=f"bold {colour}"),
        title_align="left",
        subtitle=Text(f" {lane.status} ", style=colour),
        subtitle_align="right",
        border_style=colour,
        padding=(0, 1),
    )


class Board:
    """Every lane under a header, fitted to the terminal's width and, while ``final`` is
    false, its height (each lane showing its newest lines)."""

    def __init__(self, header: str, lanes: list[Lane]) -> None:
        self.header = header
        self.lanes = lanes
        self.final = False

    def side_by_side(self, width: int) -> bool:
        return len(self.lanes) > 1 and width >= SIDE_BY_SIDE_MIN_WIDTH

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        header = Text(self.header, style="bold")
        width = options.max_width
        side = self.side_by_side(width)
        body_height: int | None = None
        if not self.final:
            # Live redraws in place only what fits on the screen: keep one line spare.
            rows = options.size.height - len(console.render_lines(header, options)) - 1
            per_lane = rows if side else rows // max(len(self.lanes), 1)
            body_height = max(per_lane - 2, 3)  # less the panel's borders
        panels = [lane_panel(lane, body_height) for lane in self.lanes]
        yield header
        if side:
            grid = Table.grid(expand=True)
            for _ in panels:
                grid.add_column(ratio=1)
            grid.add_row(*panels)
            yield grid
        else:
            yield from panels


class LiveView:
    """The board redrawn in place while the conversations run, then the numbers."""

    def __init__(self, console: Console) -> None:
        self.console = console

    async def run(
        self, lanes: list[Lane], work: Callable[[], Awaitable[None]], header: str
    ) -> None:
        board = Board(header, lanes)
        # Redrawn from this task, not rich's refresh thread: the lanes change in this
        # thread only, so a redraw never sees one half-updated.
        with Live(
            board,
            console=self.console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_redraw, live, lanes)
                await work()
                nursery.cancel_scope.cancel()
            board.final = True  # the last frame (drawn on leaving Live) shows everything
        self.console.print()
        self.console.print(Summary(lanes))


async def _redraw(live: Live, lanes: list[Lane]) -> None:
    seen: tuple[int, ...] = ()
    while True:
        versions = tuple(lane.version for lane in lanes)
        if versions != seen:
            seen = versions
            live.refresh()
        await trio.sleep(1 / REFRESH_PER_SECOND)


# -- plain lines --------------------------------------------------------------------------


class PlainView:
    """Each entry printed once, whole, when complete, prefixed with its lane; then the
    numbers. No colour, no wrapping: what a pipe or a log wants."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self._printed: dict[int, int] = {}
        self._width = 0

    def _write(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.out.write(line + "\n")
        self.out.flush()

    def _label(self, lane: Lane) -> str:
        return f"[{lane.title}]".ljust(self._width)

    def _intro(self, lane: Lane) -> str:
        scripted = f"; scripted: {lane.scene.scripted}" if lane.scene.scripted else ""
        return f"{self._label(lane)} {lane.endpoint}, model {lane.scene.model}{scripted}"

    def _entry(self, lane: Lane, entry: Entry) -> list[str]:
        label = self._label(lane)
        first, *more = entry.text.splitlines() or [""]
        lines = [f"{label} {entry.kind.value}: {first}"]
        indent = " " * (len(entry.kind.value) + 2)
        lines.extend(f"{label} {indent}{line}" for line in more)
        if entry.kind is EntryKind.TOOL_CALL and len(entry.steps) > 1:
            # The arguments as the live view showed them filling in, read as they streamed.
            name = entry.text.split("(", 1)[0]
            filled = " → ".join(step[len(name) + 1 :] for step in entry.steps)
            lines.append(f"{label} {indent}as it streamed: {filled}")
        return lines

    def _flush(self, lanes: list[Lane]) -> None:
        for lane in lanes:
            start = self._printed.setdefault(id(lane), 0)
            done = start
            while done < len(lane.entries) and lane.entries[done].done:
                done += 1
            for entry in lane.entries[start:done]:
                self._write(self._entry(lane, entry))
            self._printed[id(lane)] = done

    async def run(
        self, lanes: list[Lane], work: Callable[[], Awaitable[None]], header: str
    ) -> None:
        self._width = max(len(f"[{lane.title}]") for lane in lanes)
        self._write([header, *(self._intro(lane) for lane in lanes)])
        async with trio.open_nursery() as nursery:

            async def follow() -> None:
                while True:
                    self._flush(lanes)
                    await trio.sleep(1 / REFRESH_PER_SECOND)

            nursery.start_soon(follow)
            await work()
            nursery.cancel_scope.cancel()
        for lane in lanes:
            for entry in lane.entries:
                entry.done = True
        self._flush(lanes)
        self._write([""])
        plain_summary(lanes, self.out)
