"""What ``trio-sampler demo`` shows: each conversation as a lane of labelled entries.

A :class:`Lane` is updated from its conversation's events, its tool results and its end;
the views of ``_demo_view`` read it (a live board, or plain lines). Nothing here draws.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import orjson

from ..agent import AgentResult, AgentStop
from ..types import (
    ApiBackend,
    AttemptRecord,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    Completed,
    Failed,
    JSONChangeKind,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    StreamStarted,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallCompleted,
    ToolCallDelta,
    ToolResult,
)
from ..wire import backend_name

__all__ = [
    "PROTOCOL_TITLES",
    "STREAMED",
    "Entry",
    "EntryKind",
    "Lane",
    "Scene",
    "View",
    "format_call",
    "protocol_title",
]

#: How each protocol is named in its lane.
PROTOCOL_TITLES: Mapping[str, str] = {
    ApiBackend.CHAT_COMPLETIONS.value: "Chat Completions",
    ApiBackend.RESPONSES.value: "Responses",
    ApiBackend.MESSAGES.value: "Messages",
}


def protocol_title(backend: ApiBackend | str) -> str:
    name = backend_name(backend)
    return PROTOCOL_TITLES.get(name, name)


@attrs.frozen
class Scene:
    """One conversation of the demo: what is asked, on which protocol, and what to expect."""

    backend: ApiBackend | str
    model: str
    prompt: str
    #: The emulator's script (``x-emulator-script``); empty against a real endpoint.
    script: Mapping[str, Any] = attrs.field(factory=dict)
    #: What the script makes the emulator do, in a few words (shown in the lane).
    scripted: str = ""
    expected: AgentStop = AgentStop.FINAL_ANSWER
    #: Whether a retry must be seen (``None``: either way, as against a real endpoint).
    expect_retry: bool | None = None
    #: Cancel the request after this many answer chunks.
    cancel_after_chunks: int | None = None

    @property
    def title(self) -> str:
        return protocol_title(self.backend)


# -- what a lane shows ------------------------------------------------------------------


class EntryKind(enum.Enum):
    """What a line of a lane is; the value is its label."""

    USER = "you"
    THINKING = "thinking"
    ANSWER = "answer"
    REFUSAL = "refusal"
    TOOL_CALL = "tool call"
    TOOL_RESULT = "result"
    SERVER_TOOL = "on server"
    RETRY = "retrying"
    CANCEL = "cancel"
    DONE = "done"
    FAILED = "failed"


#: Entries whose text streams in token by token.
STREAMED = frozenset({EntryKind.THINKING, EntryKind.ANSWER, EntryKind.REFUSAL})

_CHANNEL_KINDS = {
    SamplingChannel.REASONING: EntryKind.THINKING,
    SamplingChannel.TEXT: EntryKind.ANSWER,
    SamplingChannel.REFUSAL: EntryKind.REFUSAL,
}


@attrs.define
class Entry:
    """One labelled piece of a lane: a prompt, a thought, a tool call, a retry, ...

    ``done`` is ``False`` while it is still growing (tokens streaming in, a tool call's
    arguments arriving, a tool running).
    """

    kind: EntryKind
    text: str
    done: bool = True
    #: The request it belongs to (``None`` for the prompt and the conversation's end).
    request_id: str | None = None
    #: Which stream it is within the request: an output item, a tool call.
    key: object = None
    #: A tool result that is an error, a failure.
    error: bool = False
    #: A tool call's arguments as read so far (top-level members; ``None``: none yet),
    #: and the member whose string is still open.
    arguments: dict[str, Any] | None = None
    open_member: str | None = None
    #: A tool call as it was shown while its arguments streamed, one text per change.
    steps: list[str] = attrs.field(factory=list)


@attrs.define
class Lane:
    """A conversation as it is shown: its entries, its state, and its numbers.

    Updated from the conversation's events (:meth:`on_event`), the tool results
    (:meth:`tool_ran`) and its end (:meth:`finish`); the views read it.
    """

    scene: Scene
    #: Where its requests go, e.g. ``POST /v1/messages``.
    endpoint: str = ""
    entries: list[Entry] = attrs.field(factory=list)
    #: The lane's state in a few words ("streaming the answer", "answered", ...).
    status: str = "waiting"
    #: Every terminal event's attempt records, one tuple per request.
    attempts: list[tuple[AttemptRecord, ...]] = attrs.field(factory=list)
    #: HTTP attempts per request: the records, or the attempt a cancel cut short (its
    #: ``StreamStarted``), which the records of a ``Cancelled`` do not list.
    attempt_counts: list[int] = attrs.field(factory=list)
    _started: dict[str, int] = attrs.field(factory=dict)
    #: Requests seen (by any event), and the terminal events of each: exactly one, always.
    terminals: dict[str, int] = attrs.field(factory=dict)
    retries: int = 0
    ttft_ms: float | None = None
    cost_ticks: int | None = None
    answer_chunks: int = 0
    #: The answer text streamed by the current request (to compare with the kept partial).
    streamed_answer: str = ""
    result: AgentResult | None = None
    #: A change counter: views redraw when it moves.
    version: int = 0

    @property
    def title(self) -> str:
        return self.scene.title

    def add(self, entry: Entry) -> Entry:
        self._close_streams()
        self.entries.append(entry)
        self.version += 1
        return entry

    def _close_streams(self) -> None:
        for entry in self.entries:
            if entry.kind in STREAMED and not entry.done:
                entry.done = True

    def _find(self, request_id: str, key: object) -> Entry | None:
        for entry in reversed(self.entries):
            if entry.request_id == request_id and entry.key == key:
                return entry
        return None

    def start(self) -> None:
        self.add(Entry(EntryKind.USER, self.scene.prompt))
        self.status = "sending"

    def on_event(self, event: SamplingEvent) -> None:
        """Show one event of one of the conversation's requests."""
        self.version += 1
        self.terminals.setdefault(event.request_id, 0)
        if isinstance(event, ChannelToken):
            self._token(event)
        elif isinstance(event, ToolCallDelta):
            self._tool_delta(event)
        elif isinstance(event, ToolArgumentsDelta):
            self._tool_arguments(event)
        elif isinstance(event, ToolCallCompleted):
            self._tool_completed(event)
        elif isinstance(event, BackendToolCallStarted):
            self.add(
                Entry(
                    EntryKind.SERVER_TOOL,
                    f"{event.name} running",
                    done=False,
                    request_id=event.request_id,
                    key=event.call_id,
                )
            )
            self.status = f"the server runs {event.name}"
        elif isinstance(event, BackendToolCallCompleted):
            self._server_tool_completed(event)
        elif isinstance(event, Retrying):
            self._retrying(event)
        elif isinstance(event, StreamStarted):
            self._started[event.request_id] = event.attempt
        elif isinstance(event, Completed | Failed | Cancelled):
            self._terminal(event)

    def _token(self, event: ChannelToken) -> None:
        kind = _CHANNEL_KINDS.get(event.channel, EntryKind.ANSWER)
        key = (event.item_index, event.channel)
        entry = self._find(event.request_id, key)
        if entry is None or entry.done:
            entry = self.add(Entry(kind, "", done=False, request_id=event.request_id, key=key))
        entry.text += event.text
        if kind is EntryKind.ANSWER:
            self.answer_chunks += 1
            self.streamed_answer += event.text
            self.status = "streaming the answer"
        else:
            self.status = "thinking" if kind is EntryKind.THINKING else "refusing"

    def _tool_delta(self, event: ToolCallDelta) -> None:
        key = ("tool", event.tool_index)
        entry = self._find(event.request_id, key)
        if entry is None:
            name = event.name or "?"
            entry = self.add(
                Entry(
                    EntryKind.TOOL_CALL,
                    f"{name}(",
                    done=False,
                    request_id=event.request_id,
                    key=key,
                )
            )
            self.status = f"calling {name}"

    def _tool_arguments(self, event: ToolArgumentsDelta) -> None:
        """The call's arguments filled in from what the fragments changed (read by the
        sampler, never re-parsed here): ``name(key="value`` growing as it streams."""
        entry = self._find(event.request_id, ("tool", event.tool_index))
        if entry is None or entry.done:
            return
        arguments = entry.arguments if entry.arguments is not None else {}
        for kind, path, value in event.changes:
            if len(path) != 1 or not isinstance(path[0], str):
                continue  # deeper changes: the member shows whole when it closes
            member = path[0]
            if kind is JSONChangeKind.APPEND:
                arguments[member] += value
            else:
                arguments[member] = value
                opened = kind is JSONChangeKind.SET and isinstance(value, str)
                entry.open_member = member if opened else None
        entry.arguments = arguments
        name = entry.text.split("(", 1)[0]
        text = f"{name}({_members(arguments, entry.open_member)}"
        if text != entry.text:
            entry.text = text
            entry.steps.append(text)

    def _tool_completed(self, event: ToolCallCompleted) -> None:
        key = ("tool", event.tool_index)
        entry = self._find(event.request_id, key)
        if entry is None:
            entry = self.add(Entry(EntryKind.TOOL_CALL, "", request_id=event.request_id, key=key))
        entry.text = format_call(event.call.name, event.call.arguments)
        entry.done = True

    def _server_tool_completed(self, event: BackendToolCallCompleted) -> None:
        entry = self._find(event.request_id, event.call_id)
        if entry is None:
            entry = self.add(Entry(EntryKind.SERVER_TOOL, "", request_id=event.request_id))
        arguments = event.call.arguments if event.call is not None else ""
        entry.text = f"{format_call(event.name, arguments, skip=('type',))}: done"
        entry.done = True

    def _retrying(self, event: Retrying) -> None:
        self.retries += 1
        if event.discard_partial:
            # What this attempt streamed is void: the next attempt starts over.
            self.entries = [
                e for e in self.entries if not (e.request_id == event.request_id and not e.done)
            ]
            self.streamed_answer = ""
        discarded = "; its partial output discarded" if event.discard_partial else ""
        self.add(
            Entry(
                EntryKind.RETRY,
                f"in {event.delay:.1f} s (retry {event.attempt} of {event.max_retries}) "
                f"after {event.kind.value}: {event.reason}{discarded}",
                request_id=event.request_id,
            )
        )
        self.status = f"waiting {event.delay:.1f} s to retry"

    def _terminal(self, event: Completed | Failed | Cancelled) -> None:
        self.terminals[event.request_id] += 1
        self._close_streams()
        for entry in self.entries:
            if entry.request_id == event.request_id and not entry.done:
                entry.done = True  # a tool call cut off by a cancel or a failure
        metrics = event.metrics
        records = metrics.attempts if metrics is not None else ()
        self.attempts.append(records)
        self.attempt_counts.append(max(len(records), self._started.pop(event.request_id, 0)))
        if metrics is not None:
            if self.ttft_ms is None:
                self.ttft_ms = metrics.time_to_first_token_ms
            if metrics.cost_usd_ticks is not None:
                self.cost_ticks = (self.cost_ticks or 0) + metrics.cost_usd_ticks
        if isinstance(event, Failed):
            self.add(Entry(EntryKind.FAILED, str(event.error), request_id=event.request_id))
            self.status = "failed"
        elif isinstance(event, Completed) and event.response.tool_calls:
            self.status = "running tools"
        self.streamed_answer = self.streamed_answer if isinstance(event, Cancelled) else ""

    def tool_running(self, call: ToolCall) -> None:
        self.status = f"running {call.name}"
        self.version += 1

    def tool_ran(self, call: ToolCall, result: ToolResult) -> None:
        self.add(Entry(EntryKind.TOOL_RESULT, result.content, error=result.is_error))
        self.status = "sending the result back"

    def finish(self, result: AgentResult) -> None:
        """The conversation's turn ended with ``result``."""
        self.result = result
        if result.stop is AgentStop.CANCELLED:
            kept = result.final_text
            self.add(
                Entry(
                    EntryKind.CANCEL,
                    f"cancelled mid-stream after {self.answer_chunks} answer chunks; the "
                    f"partial answer is kept ({len(kept)} characters, as streamed)",
                )
            )
            self.status = "cancelled, partial answer kept"
        elif result.stop in (AgentStop.FINAL_ANSWER, AgentStop.STEP_LIMIT):
            self.add(Entry(EntryKind.DONE, result.message))
            self.status = "answered" if result.stop is AgentStop.FINAL_ANSWER else "step limit"
        elif not self.entries or self.entries[-1].kind is not EntryKind.FAILED:
            self.add(Entry(EntryKind.FAILED, result.message))  # the Failed event said it once
            self.status = "failed"

    @property
    def requests(self) -> int:
        """Requests of the conversation seen so far."""
        return len(self.terminals)

    @property
    def behaved(self) -> bool:
        """Whether the conversation ended as its scene expects (and every request with
        exactly one terminal event)."""
        result = self.result
        if result is None or result.stop is not self.scene.expected:
            return False
        if any(count != 1 for count in self.terminals.values()):
            return False
        if self.scene.expect_retry is not None and (self.retries > 0) != self.scene.expect_retry:
            return False
        if self.scene.cancel_after_chunks is not None:
            # The library's kept partial is exactly what streamed before the cancel.
            return bool(result.final_text) and result.final_text == self.streamed_answer
        return True


def _members(arguments: Mapping[str, Any], open_member: str | None) -> str:
    """``key=value, ...`` with the open string's closing quote left out."""
    shown = []
    for key, value in arguments.items():
        text = orjson.dumps(value).decode()
        shown.append(f"{key}={text[:-1] if key == open_member else text}")
    return ", ".join(shown)


def format_call(name: str, arguments: str, *, skip: tuple[str, ...] = ()) -> str:
    """``name(key="value", ...)`` from a call's JSON arguments (verbatim if not an object)."""
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return f"{name}({arguments})"
    if not isinstance(parsed, dict):
        return f"{name}({arguments})"
    shown = ", ".join(
        f"{key}={orjson.dumps(value).decode()}" for key, value in parsed.items() if key not in skip
    )
    return f"{name}({shown})"


class View(Protocol):
    """How the demo is shown: a live board on a terminal, plain lines otherwise."""

    async def run(
        self, lanes: list[Lane], work: Callable[[], Awaitable[None]], header: str
    ) -> None:
        """Show ``lanes`` while ``await work()`` runs, then the table of the numbers."""
        ...
