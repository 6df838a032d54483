"""A request's structured answer and tool arguments, read as JSON while they stream. Pure.

:class:`PartialOutputs` follows one request's events: each piece of answer text (for a
request with ``output=``) and each tool-call fragment is pushed once to a
:class:`~trio_sampler.wire.PartialJSON`, and what a run of them changed (the fragments of
one document in a row, within a batch: one network read) follows the run as an
:class:`~trio_sampler.types.OutputDelta` or :class:`~trio_sampler.types.ToolArgumentsDelta`.
The values so far are :meth:`PartialOutputs.output` and :meth:`PartialOutputs.arguments`,
never re-parsed. At the end, :meth:`PartialOutputs.finish` reads the response's answer
into ``output_parsed`` (or ``output_error``). Where the answer is a forced tool call
(the tool-forcing strategy of ``trio_sampler.wire._structured``), the call named after
the schema is the answer. A sampler's request stream runs one per request with tools or
``output=``; anything that has a request's events can run one.

The values it holds grow with what the server sends (a text of ``[{},{},...]`` makes
24 bytes of dictionaries per byte): :attr:`PartialOutputs.buffered_bytes` is their
estimate (each reader's :attr:`~trio_sampler.wire.PartialJSON.held_bytes`, kept as a
running sum), which a sampler's memory account counts while an attempt runs. The
changes a batch's deltas carry are as large again (a change and its path for each value
placed: ``[{},{},...]`` makes about 70 bytes of them per byte of text), held while the
batch waits for its consumer: :attr:`PartialOutputs.delta_bytes` estimates them for the
last batch read, for the channel's account of the batch. One read can hold 64 KiB of such
text, about 7 MB once parsed: :meth:`PartialOutputs.parse` reads a batch a step at a
time, stopping every :data:`GUARD_SLICE` characters with what it has made so far in
``buffered_bytes``, for a caller that looks at its account there (a sampler's request
stream does, and stops the stream partway through the read).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import attrs

from ..types import (
    Assistant,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    JSONChange,
    JSONChangeKind,
    JSONPath,
    OutputDelta,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    StopReason,
    StructuredOutput,
    TerminalEvent,
    ToolArgumentsDelta,
    ToolCallDelta,
)
from ..types._partial_json import PartialJSON
from ..types._schema import adapter_errors, subtree_check, subtree_errors

__all__ = ["CHANGE_BYTES", "GUARD_SLICE", "READER_BYTES", "PartialOutputs", "read_output"]

#: What a reader costs before it holds a value (the reader, its lists, its entry here:
#: measured with ``tracemalloc``, about 1 KiB).
READER_BYTES = 1024
#: What one change of a delta holds: its tuple, its path and the path's index (measured
#: with ``tracemalloc``: 106 to 155 bytes, from records to arrays of numbers).
CHANGE_BYTES = 128
#: The text :meth:`PartialOutputs.parse` reads between two stops (characters): read, it
#: makes at most about 115 bytes of values and changes a character (``[{},{},...]``), so
#: a caller that looks at its memory account at each stop overshoots it by at most
#: that much (about 460 KB) for the stream being parsed.
GUARD_SLICE = 4096

_TEXT = SamplingChannel.TEXT
_CLOSE = JSONChangeKind.CLOSE
#: The document of the answer (tool calls are numbered from 0).
_ANSWER = -1


def _merged(
    events: list[SamplingEvent], inserts: list[tuple[int, SamplingEvent]]
) -> list[SamplingEvent]:
    """``events`` with each delta of ``inserts`` placed before the event it names (the
    same list when there is none), built from slices."""
    if not inserts:
        return events
    if len(inserts) == 1 and inserts[0][0] == len(events):  # the usual: one run, at the end
        return [*events, inserts[0][1]]
    out: list[SamplingEvent] = []
    done = 0
    for position, delta in inserts:
        out += events[done:position]
        out.append(delta)
        done = position
    out += events[done:]
    return out


def read_output(output: StructuredOutput, response: ConversationResponse) -> ConversationResponse:
    """``response`` with its answer read by ``output``: ``output_parsed`` set, or
    ``output_error`` (a refusal, text that is not JSON, JSON that does not validate).

    Where the answer is the forced call of the tool-forcing strategy, the response reads
    as a native answer does: the call's arguments become the answer's text and the call
    is no longer a tool call (nothing runs it: not the agent loop, not ``collect``)."""
    if not response.text.strip():
        response = _answer_call_as_text(response, output.schema.name)
    refusal = response.refusal
    text = response.text
    if refusal is None and response.raw_stop_reason == "refusal":
        refusal = text  # Anthropic: a refusal stop, its text the explanation
    value, error = output.read(text, refusal)
    return attrs.evolve(response, output_parsed=value, output_error=error)


def _answer_call_as_text(response: ConversationResponse, name: str) -> ConversationResponse:
    """``response`` with the call of the answer's tool ``name`` turned into text (the
    same response when there is none)."""
    items = list(response.items)
    for position in range(len(items) - 1, -1, -1):
        item = items[position]
        if not isinstance(item, Assistant):
            continue
        call = next((c for c in item.tool_calls if c.name == name), None)
        if call is None:
            continue
        others = tuple(c for c in item.tool_calls if c is not call)
        items[position] = attrs.evolve(
            item, content=item.content + call.arguments, tool_calls=others
        )
        stop = response.stop_reason
        if stop is StopReason.TOOL_CALLS and not any(
            isinstance(i, Assistant) and i.tool_calls for i in items
        ):
            stop = StopReason.STOP  # the model answered; no call is left to run
        return attrs.evolve(response, items=tuple(items), stop_reason=stop)
    return response


class PartialOutputs:
    """The partial structured answer and tool arguments of one request (see the module)."""

    def __init__(self, request_id: str, output: StructuredOutput | None) -> None:
        self.request_id = request_id
        self.structured = output
        self._answer: PartialJSON | None = None
        self._arguments: dict[int, PartialJSON] = {}
        self._answer_call = -1  # the forced tool call that carries the answer (-1: none)
        self._reported: set[str] = set()  # the schema problems reported so far
        self._held = 0  # what the readers and their values hold
        self._parsing = 0  # the changes of the batch being parsed, at its last stop
        self._unchecked = 0  # the characters read since the last stop of the parse
        #: An estimate of the bytes of the changes the last :meth:`batch` added.
        self.delta_bytes = 0
        self.reset()

    def reset(self) -> None:
        """Forget what was read (a retry that discards the attempt's output)."""
        self._restart()
        self._answer_call = -1

    def _restart(self) -> None:
        """The readers start over (a batch's runs are found first, then read: the forced
        answer call is forgotten where the runs are found, :meth:`_runs`)."""
        self._answer = PartialJSON() if self.structured is not None else None
        self._held = 0 if self._answer is None else READER_BYTES
        self._arguments = {}
        self._reported = set()

    @property
    def buffered_bytes(self) -> int:
        """An estimate of the bytes the readers and their values hold, with the changes
        a :meth:`parse` stopped midway has made so far."""
        return self._held + self._parsing

    @classmethod
    def for_request(cls, request_id: str, request: ConversationRequest) -> PartialOutputs | None:
        """One for ``request``, or ``None`` when it has neither tools nor ``output``."""
        if request.output is None and not request.tools:
            return None
        return cls(request_id, request.output)

    def output(self) -> Any:
        """The structured answer so far (``None`` before its first value, or without
        ``output=``). The live value: copy it to keep it."""
        return None if self._answer is None else self._answer.value

    def arguments(self, tool_index: int) -> Any:
        """Tool call ``tool_index``'s arguments so far (``None`` before any)."""
        reader = self._arguments.get(tool_index)
        return None if reader is None else reader.value

    def batch(self, events: list[SamplingEvent]) -> list[SamplingEvent]:
        """``events`` with what each run of answer or argument fragments changed after the
        run (the same list when nothing did). A run is read once, at its end: a batch of
        events (one network read) costs one scan per document it touches.

        This loop runs once per event of every request with tools or ``output=``: it
        makes no call for an event (the source is read inline) and builds the new list
        from slices: a 64 KiB tool call in 4-byte deltas, 256 events a read, went from
        6.6 to 5.0 ms of CPU (records) and from 4.0 to 2.5 ms (one long string), under a
        load average of 5 to 9 on 2 cores (``benchmarks/bench_partial_json.py``,
        "ours, sampler per read"). A batch of one tool call's fragments alone skips the
        loop (:meth:`_one_call`): 5.0 to 4.2 ms and 2.6 to 2.0 ms more, back to back."""
        self.delta_bytes = self._unchecked = 0
        inserts: list[tuple[int, SamplingEvent]] = []  # (before which event, the delta)
        for run in self._runs(events):
            if run is None:
                self._restart()
                continue
            sliced = self._end_run(*run, inserts)
            if sliced is not None:  # a run of more than a slice: read without stops
                for _ in sliced:
                    pass
        return _merged(events, inserts)

    def parse(self, events: list[SamplingEvent]) -> Generator[None, None, list[SamplingEvent]]:
        """:meth:`batch` a step at a time: the generator stops (yields) before it reads
        more text once :data:`GUARD_SLICE` characters were read since its start or its
        last stop, and returns the new list. What it has made so far is in
        :attr:`buffered_bytes` at each stop: a caller that bounds memory looks at its
        account there (and may wait, or drop the generator to end the stream)."""
        self.delta_bytes = self._unchecked = 0
        inserts: list[tuple[int, SamplingEvent]] = []
        try:
            for run in self._runs(events):
                if run is None:
                    self._restart()
                    continue
                sliced = self._end_run(*run, inserts)
                if sliced is not None:
                    yield from sliced
        finally:
            self._parsing = 0
        return _merged(events, inserts)

    def _runs(self, events: list[SamplingEvent]) -> list[tuple[int, list[str], int] | None]:
        """The runs of ``events`` to read, in order, each as ``(document, its fragments,
        the position of the event after it)``; ``None`` where a ``Retrying`` discards
        what was read (the readers start over there)."""
        if self.structured is None and events and type(events[0]) is ToolCallDelta:
            whole = self._one_call(events)
            if whole is not None:
                return whole
        runs: list[tuple[int, list[str], int] | None] = []
        run: int | None = None  # the document of the run in progress (_ANSWER or a call)
        pieces: list[str] = []  # the run's text
        answer = self._answer
        name = None if self.structured is None else self.structured.schema.name
        for position, event in enumerate(events):
            document: int | None = None
            if isinstance(event, ToolCallDelta):
                if name is not None and event.name == name:
                    self._answer_call = event.tool_index
                if event.arguments_delta:
                    index = event.tool_index
                    document = _ANSWER if index == self._answer_call else index
                    text = event.arguments_delta
            elif (
                isinstance(event, ChannelToken)
                and event.channel is _TEXT
                and answer is not None
                and event.text
            ):
                document = _ANSWER
                text = event.text
            if run is not None and document != run:
                runs.append((run, pieces, position))
                run = None
                pieces = []
            if document is not None:
                pieces.append(text)
                run = document
            elif isinstance(event, Retrying) and event.discard_partial:
                self._answer_call = -1
                runs.append(None)
        if run is not None:
            runs.append((run, pieces, len(events)))
        return runs

    def _one_call(
        self, events: list[SamplingEvent]
    ) -> list[tuple[int, list[str], int] | None] | None:
        """The run of a batch of nothing but one tool call's fragments (a burst's usual
        read, its first event one of them), found with one comprehension instead of the
        loop; ``None`` for any other batch. (One pass, not three, a set of types, one of
        indexes and the list of fragments: 14 to 9 µs for a read of 256 fragments.)"""
        index = events[0].tool_index  # type: ignore[union-attr]  # the caller checked
        pieces = [
            e.arguments_delta for e in events if type(e) is ToolCallDelta and e.tool_index == index
        ]
        if len(pieces) != len(events):
            return None
        return [(index, pieces, len(events))]

    def _reader(self, document: int) -> PartialJSON:
        if document == _ANSWER:
            assert self._answer is not None
            return self._answer
        reader = self._arguments.get(document)
        if reader is None:
            reader = self._arguments[document] = PartialJSON()
            self._held += READER_BYTES
        return reader

    def _end_run(
        self,
        document: int,
        pieces: list[str],
        position: int,
        inserts: list[tuple[int, SamplingEvent]],
    ) -> Generator[None, None, None] | None:
        """Read the run that ended before event ``position``; its changes go there. The
        usual run is read at once (``None``); a run that would take the batch past
        :data:`GUARD_SLICE` characters since its last stop is returned as a generator to
        drive (``yield from``: :meth:`parse` stops before each slice)."""
        text = pieces[0] if len(pieces) == 1 else "".join(pieces)
        reader = self._reader(document)
        unchecked = self._unchecked + len(text)
        if unchecked > GUARD_SLICE:
            return self._sliced_run(reader, document, text, position, inserts)
        self._unchecked = unchecked
        held = reader.held_bytes
        changes = reader.feed(text)
        self._held += reader.held_bytes - held
        self._deliver(document, changes, position, inserts)
        return None

    def _sliced_run(
        self,
        reader: PartialJSON,
        document: int,
        text: str,
        position: int,
        inserts: list[tuple[int, SamplingEvent]],
    ) -> Generator[None, None, None]:
        """:meth:`_end_run` for a run read in slices, stopping before each slice once
        :data:`GUARD_SLICE` characters were read since the last stop (what the values and
        the changes so far take counted in :attr:`buffered_bytes` there)."""
        changes: list[JSONChange] = []
        at = 0
        while at < len(text):
            room = GUARD_SLICE - self._unchecked
            if room <= 0:
                self._parsing = self.delta_bytes + len(changes) * CHANGE_BYTES
                yield
                self._unchecked = 0
                room = GUARD_SLICE
            piece = text[at : at + room]
            at += len(piece)
            self._unchecked += len(piece)
            held = reader.held_bytes
            changes += reader.feed(piece)
            self._held += reader.held_bytes - held
        self._deliver(document, changes, position, inserts)

    def _deliver(
        self,
        document: int,
        changes: list[JSONChange],
        position: int,
        inserts: list[tuple[int, SamplingEvent]],
    ) -> None:
        """The delta of a run's ``changes``, to go before event ``position``."""
        self.delta_bytes += len(changes) * CHANGE_BYTES
        if not changes:
            return
        if document == _ANSWER:
            delta: SamplingEvent = OutputDelta(
                self.request_id, tuple(changes), self._problems(changes)
            )
        else:
            delta = ToolArgumentsDelta(self.request_id, document, tuple(changes))
        inserts.append((position, delta))

    def _problems(self, changes: list[JSONChange]) -> tuple[str, ...]:
        """What the subtrees these changes closed break of the answer's type or schema
        (the document itself is checked in full at the end, by ``output_parsed``)."""
        found: list[str] = []
        for kind, path, value in changes:
            if kind is _CLOSE and path:
                for problem in self._subtree_problems(value, path):
                    if problem not in self._reported:  # an enclosing subtree repeats it
                        self._reported.add(problem)
                        found.append(problem)
        return tuple(found)

    def _subtree_problems(self, value: Any, path: JSONPath) -> list[str]:
        """A pydantic model's own type for the subtree validates it (its constraints and
        validators) where one is known for ``path``; the JSON Schema checks the rest."""
        assert self.structured is not None
        target = self.structured.target
        if target is not None:
            shape = tuple(None if type(step) is int else step for step in path)
            adapter = subtree_check(target, shape)  # type: ignore[arg-type]
            if adapter is not None:
                at = "$" + "".join(f"[{s}]" if type(s) is int else f".{s}" for s in path)
                return adapter_errors(adapter, value, at)
        return subtree_errors(value, self.structured.schema.schema, path)

    def finish(self, terminal: TerminalEvent) -> TerminalEvent:
        """The terminal, its response's answer read (a request with ``output=``): the
        ``Completed`` response's, or the ``partial`` of a ``Failed`` or ``Cancelled``
        (a stream cut anywhere says ``NOT_JSON`` there, the text kept)."""
        if self.structured is None:
            return terminal
        if isinstance(terminal, Completed):
            return attrs.evolve(terminal, response=read_output(self.structured, terminal.response))
        if terminal.partial is None:
            return terminal
        return attrs.evolve(terminal, partial=read_output(self.structured, terminal.partial))
