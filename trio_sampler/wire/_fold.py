"""The one fold from events to a response. Pure.

:class:`ResponseFold` is the only code that turns output into a
:class:`ConversationResponse`. The stream transforms build ``Completed.response`` and the
``partial`` of ``Failed`` with it (their accumulator feeds it exactly the events it emits);
:func:`~trio_sampler.wire.collect` and the bridge fold a request's events with it. So the
response of a stream and the fold of its events cannot disagree.

Output order is the order of the wire: every event names its output item
(``item_index``); a run of text is one :class:`Assistant`, each reasoning block one
:class:`Reasoning`, each hosted tool call one :class:`BackendToolCall`, in the order the
items opened. Everything comes from events: a reasoning block still streaming has no
``origin`` (its ``ReasoningCompleted`` brings the item with its round-trip state). The
local tool calls and the refusal go on the last :class:`Assistant`,
which is added (without text) when the last item is not text, so a response always ends
with an assistant item.

Text is held once. Each piece of text (a run of answer text, a reasoning block and each
of its summary parts, a tool call's arguments, the refusal) is one string that grows in
place: deltas wait in a short list (:data:`PENDING_BYTES`) and are then appended to the
string, which CPython resizes without copying while nothing else
refers to it. The response shares those strings, so building it (or the ``partial`` of a
failure) never joins a second copy of the text. :attr:`ResponseFold.held_bytes` counts
what is held, as CPython stores it, and :attr:`ResponseFold.max_held_bytes` bounds it:
a delta that would take it past the bound is refused (the method returns ``False``)
before anything grows, a wider character included (one character outside Latin-1 makes
CPython store a whole string at 2 or 4 bytes per character; while a quarter of the bound
is not reached, no delta can pass it, and deltas are only counted).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..types import (
    Assistant,
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    Citation,
    CitationReceived,
    Completed,
    ConversationItem,
    ConversationResponse,
    Failed,
    ModelMetadata,
    OpaqueItem,
    OpaqueItemReceived,
    Reasoning,
    ReasoningCompleted,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    ServedModelChanged,
    ServerTextDiffers,
    ServerTextTaken,
    StopReason,
    ToolCall,
    ToolCallCompleted,
    ToolCallDelta,
    Usage,
)

__all__ = ["PENDING_BYTES", "PENDING_PARTS", "ResponseFold", "arguments_complete"]

_TEXT = SamplingChannel.TEXT
_REASONING = SamplingChannel.REASONING


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


#: Longer arguments are checked without a copy (see :func:`arguments_complete`).
_LONG_ARGUMENTS = 1024 * 1024
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_DIGITS = "0123456789"


def _space_end(text: str, start: int) -> int:
    """Where the JSON whitespace from ``start`` ends."""
    match = _JSON_SPACE.match(text, start)
    assert match is not None  # an empty run matches
    return match.end()


#: The last character a complete JSON text can have, by its first character.
_JSON_END = {"{": "}", "[": "]", '"': '"', "t": "e", "f": "e", "n": "l", "-": _DIGITS}
_JSON_END.update(dict.fromkeys(_DIGITS, _DIGITS))


def arguments_complete(arguments: str) -> bool:
    """Whether tool-call arguments are complete JSON (empty means ``{}``: complete).

    Arguments whose first and last characters cannot begin and end one JSON text are
    incomplete without being parsed (a parse copies them: a hostile stream's endless
    arguments must not be held twice).
    """
    if not arguments or arguments.isspace():
        return True
    first, last = arguments[0], arguments[-1]
    if not (first.isspace() or last.isspace()) and last not in _JSON_END.get(first, ""):
        return False
    if len(arguments) > _LONG_ARGUMENTS:
        # orjson copies what it parses; the standard library's scanner reads the string
        # where it is and stops at the end of the first value.
        try:
            _, end = _DECODER.raw_decode(arguments, _space_end(arguments, 0))
        except (ValueError, RecursionError):
            return False
        return _space_end(arguments, end) == len(arguments)
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True


#: Deltas wait to be appended to their text's one string (one resize for many deltas
#: instead of one per delta) until this many bytes have arrived since the last append, or
#: (reasoning, refusal, tool arguments) this many deltas are waiting in that text.
PENDING_BYTES = 16 * 1024
PENDING_PARTS = 128


def _widest(text: str) -> int:
    """Bytes per character of ``text`` as CPython stores it (1, 2 or 4), by reading it."""
    if text.isascii():
        return 1
    widest = ord(max(text))
    return 1 if widest < 0x100 else 2 if widest < 0x10000 else 4


# A compact non-ASCII string takes a fixed header and (length + 1) × its width.
_WIDE_HEADER = sys.getsizeof("\xe9") - 2


def _width(text: str) -> int:
    """Bytes per character of ``text`` as CPython stores it (1, 2 or 4), in O(1) for
    text of one byte per character."""
    if text.isascii():  # a flag on the string
        return 1
    if (sys.getsizeof(text) - _WIDE_HEADER) // (len(text) + 1) == 1:
        return 1
    # The size also counts the string's UTF-8 form once something has made it (an
    # encoder's C API keeps it on the string), which makes it look wider: read it.
    return _widest(text)


if [_width(probe) for probe in ("a", "\xe9\xe9", "\u0100", "\U0001f600" * 3)] != [1, 1, 2, 4]:
    _width = _widest  # not CPython's layout: read the characters instead


class _Text:
    """One growing string (``value``) and the deltas not yet appended to it (``parts``).

    ``size`` is what ``value`` takes (characters × ``width``); pending deltas are counted
    a byte per character until appended.
    """

    __slots__ = ("parts", "size", "value", "width")

    def __init__(self) -> None:
        self.value = ""
        self.parts: list[str] = []
        self.size = 0
        self.width = 1


class _Thought:
    __slots__ = ("item", "summary", "text")

    def __init__(self) -> None:
        self.text = _Text()
        self.summary: dict[int, _Text] = {}
        self.item: Reasoning | None = None


class _Tool:
    __slots__ = ("arguments", "final", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = _Text()
        self.final: ToolCall | None = None


_Slot = _Text | _Thought | BackendToolCall | OpaqueItem | None


class ResponseFold:
    """Folds one request's events into its :class:`ConversationResponse`.

    Feed events with :meth:`add` (a ``Retrying(discard_partial=True)`` starts over, so
    only the last attempt counts); read the result with :meth:`response`. The typed
    methods (:meth:`text`, :meth:`reasoning`, ...) are what :meth:`add` dispatches to;
    the transforms' accumulator calls them directly with the fields of the events it emits.
    """

    def __init__(self) -> None:
        self.max_held_bytes = sys.maxsize
        self.reset()

    @property
    def max_held_bytes(self) -> int:
        """The most text this fold may hold, in bytes as CPython stores it (default: no
        bound); a delta past it is refused (see :meth:`append`)."""
        return self._max_held

    @max_held_bytes.setter
    def max_held_bytes(self, limit: int) -> None:
        self._max_held = limit
        #: Below this many bytes held, no delta can pass the bound, however wide its
        #: characters (each takes at most 4 bytes, and so would every character already
        #: held): deltas are then only counted. Above it, each is checked exactly.
        self.roomy_bytes = limit // 4
        self.settle_bytes = min(self.roomy_bytes, PENDING_BYTES)

    def reset(self) -> None:
        """Forget the output so far (a retry that discards the partial output)."""
        self._slots: list[_Slot] = []
        self._tools: list[_Tool] = []
        self._refusal: _Text | None = None
        self.text_chunks = 0
        #: Bytes of text held (answer, refusal, reasoning, tool arguments).
        self.held_bytes = 0
        #: Deltas wait while no more than this is held (then they are appended): at most
        #: :data:`PENDING_BYTES` more than at the last append, and never past ``roomy_bytes``.
        self.settle_bytes = min(self.roomy_bytes, PENDING_BYTES)
        self._exact = False  # past ``roomy_bytes``: every delta is checked
        self._run: _Text | None = None  # the run of text opened last
        #: Slot index of a text run → the ``phase`` of the message it belongs to.
        self.phases: dict[int, str] = {}
        #: The server's final word where it corrected the streamed text (a tuple: most
        #: responses have none, and an empty one is shared rather than a list per fold).
        self.warnings: tuple[ServerTextDiffers, ...] = ()
        #: Slot index of a text run → the sources its text cites.
        self.citations: dict[int, list[Citation]] = {}
        self.model: str | None = None
        self.response_id: str | None = None
        #: The terminal event's own response (``Completed.response`` or a ``partial``).
        self.terminal_response: ConversationResponse | None = None
        self.terminal: Completed | Failed | Cancelled | None = None

    # -- holding text ----------------------------------------------------------------

    def grow(self, text: _Text, delta: str) -> bool:
        """Add ``delta`` to ``text``; ``False`` if that would pass ``max_held_bytes``."""
        parts = text.parts
        held = self.held_bytes + len(delta)
        if held <= self.settle_bytes and len(parts) < PENDING_PARTS - 1:
            parts.append(delta)
            self.held_bytes = held
            return True
        return self.append(text, delta)

    def append(self, text: _Text, delta: str) -> bool:
        """Append ``text``'s pending deltas and ``delta`` to its string, in place.

        If that would hold more than ``max_held_bytes`` (a wider character widens the
        whole string), nothing changes and ``False`` is returned.
        """
        held = self.held_bytes + len(delta)
        if held <= self.roomy_bytes:
            text.parts.append(delta)
            self.held_bytes = held
            self._settled(text)
            run = self._run
            if run is not None and run.parts:
                self._settled(run)  # its deltas wait without a count of their own
            self.settle_bytes = min(self.roomy_bytes, self.held_bytes + PENDING_BYTES)
            return True
        if not self._exact:
            self._settle_all()
        # Checked exactly from now on, so nothing is pending anywhere.
        width = text.width if delta.isascii() else max(text.width, _width(delta))
        length = len(text.value) + len(delta)
        held = self.held_bytes - text.size + length * width
        if held > self._max_held:
            return False
        value = text.value
        text.value = ""  # ours is then the only reference: ``+=`` resizes it in place
        value += delta
        text.value = value
        text.size = length * width
        text.width = width
        self.held_bytes = held
        return True

    def _settle_all(self) -> None:
        """From now on every delta is checked: first append what is pending anywhere
        (it fits, however wide: at most a quarter of the bound is held)."""
        self._exact = True
        for slot in self._slots:
            if type(slot) is _Text:
                assert isinstance(slot, _Text)
                self._settled(slot)
            elif type(slot) is _Thought:
                assert isinstance(slot, _Thought)
                self._settled(slot.text)
                for part in slot.summary.values():
                    self._settled(part)
        for tool in self._tools:
            self._settled(tool.arguments)
        if self._refusal is not None:
            self._settled(self._refusal)

    def _settled(self, text: _Text) -> str:
        """The whole of ``text``, its pending deltas appended. Deltas are pending only
        while at most a quarter of the bound is held: joining them (a second copy of
        them, briefly) and widening the string both fit."""
        parts = text.parts
        if parts:
            tail = parts[0] if len(parts) == 1 else "".join(parts)
            parts.clear()
            width = text.width if tail.isascii() else max(text.width, _width(tail))
            value = text.value
            text.value = ""  # ours is then the only reference: ``+=`` resizes it in place
            value += tail
            text.value = value
            size = len(value) * width
            # The pending characters were counted a byte each.
            self.held_bytes += size - text.size - len(tail)
            text.size = size
            text.width = width
        return text.value

    # -- the content -----------------------------------------------------------------

    def _slot(self, index: int) -> _Slot:
        slots = self._slots
        if index < len(slots):
            return slots[index]
        slots.extend([None] * (index + 1 - len(slots)))
        return None

    def text(self, index: int, delta: str) -> bool:
        text = self.text_slot(index)
        # The accumulator's per-token path does the same (see StreamAccumulator.text).
        held = self.held_bytes + len(delta)
        if held <= self.settle_bytes:
            text.parts.append(delta)
            self.held_bytes = held
        elif not self.append(text, delta):
            return False
        self.text_chunks += 1
        return True

    def text_slot(self, index: int) -> _Text:
        """Text item ``index`` (opened if new). The accumulator grows it directly on its
        per-token path (as :meth:`text` does), counting ``text_chunks`` as it goes; its
        waiting deltas are appended whenever :data:`PENDING_BYTES` more have arrived."""
        slot = self._slots[index] if index < len(self._slots) else self._slot(index)
        if type(slot) is not _Text:
            slot = self._slots[index] = _Text()
        self._run = slot
        return slot

    def refusal(self, delta: str) -> bool:
        if self._refusal is None:
            self._refusal = _Text()
        return not delta or self.grow(self._refusal, delta)

    def _thought(self, index: int) -> _Thought:
        slot = self._slot(index)
        if type(slot) is not _Thought:
            slot = self._slots[index] = _Thought()
        return slot

    def reasoning(self, index: int, delta: str, summary_index: int = -1) -> bool:
        thought = self._thought(index)
        if summary_index < 0:
            return self.grow(thought.text, delta)
        part = thought.summary.get(summary_index)
        if part is None:
            part = thought.summary[summary_index] = _Text()
        return self.grow(part, delta)

    def streamed_reasoning(self, index: int) -> Reasoning:
        """Reasoning block ``index`` as streamed so far (its deltas, not its final item)."""
        return self._streamed(self._thought(index))

    def _streamed(self, thought: _Thought) -> Reasoning:
        summary = tuple(self._settled(part) for _, part in sorted(thought.summary.items()))
        return Reasoning(text=self._settled(thought.text), summary=summary)

    def reasoning_completed(self, index: int, item: Reasoning) -> None:
        self._thought(index).item = item

    def backend_started(self, index: int, call_id: str, name: str) -> None:
        if self._slot(index) is None:
            self._slots[index] = BackendToolCall(id=call_id, name=name)

    def backend_completed(self, index: int, call: BackendToolCall) -> None:
        self._slot(index)
        self._slots[index] = call

    def text_of(self, index: int) -> str:
        """The text of item ``index`` so far (``""`` if it is not text)."""
        slot = self._slots[index] if index < len(self._slots) else None
        return self._settled(slot) if isinstance(slot, _Text) else ""

    def replace_text(self, index: int, final: str) -> bool:
        """Text item ``index`` becomes ``final`` (the server's own final text)."""
        slot = self.text_slot(index)
        self._settled(slot)
        self.held_bytes -= slot.size
        slot.value, slot.size, slot.width = "", 0, 1
        return self.append(slot, final)

    def server_text(self, warning: ServerTextDiffers) -> bool:
        self.warnings += (warning,)
        return self.replace_text(warning.item_index, warning.final)

    def citation(self, index: int, citation: Citation) -> None:
        """A citation of text item ``index`` (opened, empty, if the text has not come yet)."""
        if not (index < len(self._slots) and type(self._slots[index]) is _Text):
            self.text_slot(index)
        self.citations.setdefault(index, []).append(citation)

    def opaque(self, index: int, item: OpaqueItem) -> None:
        self._slot(index)
        self._slots[index] = item

    def backend_call(self, index: int) -> BackendToolCall | None:
        slot = self._slots[index] if index < len(self._slots) else None
        return slot if isinstance(slot, BackendToolCall) else None

    def _tool(self, index: int) -> _Tool:
        tools = self._tools
        while len(tools) <= index:
            tools.append(_Tool())
        return tools[index]

    def tool_delta(self, index: int, call_id: str | None, name: str | None, delta: str) -> bool:
        tool = self._tools[index] if index < len(self._tools) else self._tool(index)
        if call_id:
            tool.id = call_id
        if name:
            tool.name = name
        return not delta or self.grow(tool.arguments, delta)

    def tool_completed(self, index: int, call: ToolCall) -> None:
        self._tool(index).final = call

    def tool_arguments(self, index: int) -> str:
        """The streamed arguments of local tool call ``index``."""
        return self._settled(self._tool(index).arguments)

    def _call(self, index: int, tool: _Tool) -> ToolCall:
        if tool.final is not None:
            return tool.final
        arguments = self._settled(tool.arguments)
        return ToolCall(
            id=tool.id or f"call_{index}",
            name=tool.name or "",
            arguments=arguments,
            arguments_complete=arguments_complete(arguments),
        )

    def has_content(self) -> bool:
        return bool(
            self._tools or self._refusal is not None or any(s is not None for s in self._slots)
        )

    # -- events ----------------------------------------------------------------------

    def add(self, event: SamplingEvent) -> None:
        """Fold one event (content, metadata, a retry or the terminal)."""
        if type(event) is ChannelToken:
            if event.channel is _TEXT:
                # ResponseFold.text, inlined for the per-token path.
                index = event.item_index
                slots = self._slots
                text = slots[index] if index < len(slots) else None
                if type(text) is not _Text:
                    text = self.text_slot(index)
                delta = event.text
                held = self.held_bytes + len(delta)
                if held <= self.settle_bytes:
                    text.parts.append(delta)
                    self.held_bytes = held
                    self.text_chunks += 1
                else:
                    self.text(index, delta)
            elif event.channel is _REASONING:
                self.reasoning(event.item_index, event.text, event.summary_index)
            else:
                self.refusal(event.text)
            return
        kind = type(event)
        if kind is ToolCallDelta:
            assert isinstance(event, ToolCallDelta)
            self.tool_delta(event.tool_index, event.id, event.name, event.arguments_delta)
        elif kind is ToolCallCompleted:
            assert isinstance(event, ToolCallCompleted)
            self.tool_completed(event.tool_index, event.call)
        elif kind is ReasoningCompleted:
            assert isinstance(event, ReasoningCompleted)
            self.reasoning_completed(event.item_index, event.item)
        elif kind is BackendToolCallStarted:
            assert isinstance(event, BackendToolCallStarted)
            self.backend_started(event.item_index, event.call_id, event.name)
        elif kind is BackendToolCallCompleted:
            assert isinstance(event, BackendToolCallCompleted)
            call = event.call or BackendToolCall(
                id=event.call_id, name=event.name, result=event.result
            )
            self.backend_completed(event.item_index, call)
        elif kind is ModelMetadata:
            assert isinstance(event, ModelMetadata)
            self.model = event.model or self.model
            self.response_id = event.response_id or self.response_id
        elif kind is Retrying:
            assert isinstance(event, Retrying)
            if event.discard_partial:
                self.reset()
        elif kind is Completed:
            assert isinstance(event, Completed)
            self.terminal = event
            self.terminal_response = event.response
        elif kind is Failed or kind is Cancelled:
            assert isinstance(event, Failed | Cancelled)
            self.terminal = event
            self.terminal_response = event.partial
        else:
            fold_state = _HANDED_OVER.get(kind)
            if fold_state is not None:
                fold_state(self, event)

    def response(self) -> ConversationResponse:
        """The terminal's response when it carried one, else the fold of the content."""
        if self.terminal_response is not None:
            return self.terminal_response
        return self.build(model=self.model, response_id=self.response_id)

    # -- the response ----------------------------------------------------------------

    def build(
        self,
        *,
        stop_reason: StopReason | None = None,
        raw_stop_reason: str | None = None,
        usage: Usage | None = None,
        cost_usd_ticks: int | None = None,
        model: str | None = None,
        response_id: str | None = None,
        message_id: str | None = None,
        stop_sequence: str | None = None,
        doom_loop_signals: tuple[str, ...] = (),
        audio_id: str | None = None,
    ) -> ConversationResponse:
        """The response from what was folded so far, with the terminal's metadata."""
        items, text = self._items(model)
        calls = tuple(self._call(index, tool) for index, tool in enumerate(self._tools))
        refusal = None if self._refusal is None else self._settled(self._refusal)
        # The final turn: the last text item when nothing followed it, else a turn of its
        # own. Built once, whole (one ``Assistant`` fewer than building the text item and
        # then this one: about 16,000 fewer machine instructions per response,
        # ``benchmarks/instructions_per_request.py``).
        content, phase, cited = ("", None, ()) if text is None else text
        items.append(
            Assistant(
                content=content,
                tool_calls=calls,
                refusal=refusal,
                model=model,
                id=message_id,
                phase=phase,
                citations=cited,
                audio_id=audio_id,
            )
        )
        return ConversationResponse(
            items=items,
            stop_reason=stop_reason,
            raw_stop_reason=raw_stop_reason,
            usage=usage,
            cost_usd_ticks=cost_usd_ticks,
            model=model,
            response_id=response_id,
            chunk_count=self.text_chunks,
            stop_sequence=stop_sequence,
            doom_loop_signals=doom_loop_signals,
            warnings=self.warnings,
        )

    def _items(self, model: str | None) -> tuple[list[ConversationItem], _TextTurn | None]:
        """The response's items in order, but a text item nothing followed: that one comes
        back as its ``(content, phase, citations)``, for :meth:`build` to make the final
        turn of."""
        items: list[ConversationItem] = []
        text: _TextTurn | None = None
        phases = self.phases
        citations = self.citations
        for index, slot in enumerate(self._slots):
            if slot is None:
                continue
            kind = type(slot)
            if kind is _Text:
                assert isinstance(slot, _Text)
                if text is not None:
                    items.append(_text_turn(text, model))
                phase = phases.get(index) if phases else None
                text = (self._settled(slot), phase, citations.get(index, ()) if citations else ())
                continue
            if kind is _Thought:
                assert isinstance(slot, _Thought)
                reasoning = slot.item or self._streamed(slot)
                if not (reasoning.text or reasoning.summary or reasoning.is_opaque or reasoning.id):
                    continue  # an empty block (an id is round-trip state: kept)
                item: ConversationItem = reasoning
            else:
                assert isinstance(slot, BackendToolCall | OpaqueItem)
                item = slot
            if text is not None:
                items.append(_text_turn(text, model))
                text = None
            items.append(item)
        return items, text


#: A text item's ``(content, phase, citations)``, before its ``Assistant`` is built.
_TextTurn = tuple[str, str | None, Sequence[Citation]]


def _text_turn(text: _TextTurn, model: str | None) -> Assistant:
    """The ``Assistant`` of a text item followed by another item."""
    content, phase, cited = text
    return Assistant(content=content, model=model, phase=phase, citations=cited)


#: The events of hand-over state, citations and the server's final word → how they fold.
_HANDED_OVER: dict[type, Callable[[ResponseFold, Any], object]] = {
    OpaqueItemReceived: lambda fold, e: fold.opaque(e.item_index, e.item),
    CitationReceived: lambda fold, e: fold.citation(e.item_index, e.citation),
    ServerTextTaken: lambda fold, e: fold.server_text(e.warning),
    ServedModelChanged: lambda fold, e: setattr(fold, "model", e.to_model or fold.model),
}
