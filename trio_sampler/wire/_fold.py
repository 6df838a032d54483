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
"""

from __future__ import annotations

import attrs
import orjson

from ..types import (
    Assistant,
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationItem,
    ConversationResponse,
    Failed,
    ModelMetadata,
    Reasoning,
    ReasoningCompleted,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    StopReason,
    ToolCall,
    ToolCallCompleted,
    ToolCallDelta,
    Usage,
)

__all__ = ["ResponseFold", "arguments_complete"]

_TEXT = SamplingChannel.TEXT
_REASONING = SamplingChannel.REASONING


def arguments_complete(arguments: str) -> bool:
    """Whether tool-call arguments are complete JSON (empty means ``{}``: complete)."""
    if not arguments.strip():
        return True
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True


class _Text:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []


class _Thought:
    __slots__ = ("item", "summary", "text")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.summary: dict[int, list[str]] = {}
        self.item: Reasoning | None = None

    def streamed(self) -> Reasoning:
        summary = tuple("".join(parts) for _, parts in sorted(self.summary.items()))
        return Reasoning(text="".join(self.text), summary=summary)


class _Tool:
    __slots__ = ("final", "id", "name", "parts")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.parts: list[str] = []
        self.final: ToolCall | None = None

    def to_call(self, index: int) -> ToolCall:
        if self.final is not None:
            return self.final
        arguments = "".join(self.parts)
        return ToolCall(
            id=self.id or f"call_{index}",
            name=self.name or "",
            arguments=arguments,
            arguments_complete=arguments_complete(arguments),
        )


_Slot = _Text | _Thought | BackendToolCall | None


class ResponseFold:
    """Folds one request's events into its :class:`ConversationResponse`.

    Feed events with :meth:`add` (a ``Retrying(discard_partial=True)`` starts over, so
    only the last attempt counts); read the result with :meth:`response`. The typed
    methods (:meth:`text`, :meth:`reasoning`, ...) are what :meth:`add` dispatches to;
    the transforms' accumulator calls them directly with the fields of the events it emits.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the output so far (a retry that discards the partial output)."""
        self._slots: list[_Slot] = []
        self._tools: list[_Tool] = []
        self._refusal: list[str] | None = None
        self.text_chunks = 0
        self.model: str | None = None
        self.response_id: str | None = None
        #: The terminal event's own response (``Completed.response`` or a ``partial``).
        self.terminal_response: ConversationResponse | None = None
        self.terminal: Completed | Failed | Cancelled | None = None

    # -- the content -----------------------------------------------------------------

    def _slot(self, index: int) -> _Slot:
        slots = self._slots
        if index < len(slots):
            return slots[index]
        slots.extend([None] * (index + 1 - len(slots)))
        return None

    def text(self, index: int, delta: str) -> None:
        self.text_parts(index).append(delta)
        self.text_chunks += 1

    def text_parts(self, index: int) -> list[str]:
        """The pieces of text item ``index`` (opened if new). The accumulator appends to
        this list directly on its per-token path, counting ``text_chunks`` as it goes."""
        slot = self._slots[index] if index < len(self._slots) else self._slot(index)
        if type(slot) is not _Text:
            slot = self._slots[index] = _Text()
        return slot.parts

    def refusal(self, delta: str) -> None:
        if self._refusal is None:
            self._refusal = []
        if delta:
            self._refusal.append(delta)

    def _thought(self, index: int) -> _Thought:
        slot = self._slot(index)
        if type(slot) is not _Thought:
            slot = self._slots[index] = _Thought()
        return slot

    def reasoning(self, index: int, delta: str, summary_index: int = -1) -> None:
        thought = self._thought(index)
        if summary_index >= 0:
            thought.summary.setdefault(summary_index, []).append(delta)
        else:
            thought.text.append(delta)

    def streamed_reasoning(self, index: int) -> Reasoning:
        """Reasoning block ``index`` as streamed so far (its deltas, not its final item)."""
        return self._thought(index).streamed()

    def reasoning_completed(self, index: int, item: Reasoning) -> None:
        self._thought(index).item = item

    def backend_started(self, index: int, call_id: str, name: str) -> None:
        if self._slot(index) is None:
            self._slots[index] = BackendToolCall(id=call_id, name=name)

    def backend_completed(self, index: int, call: BackendToolCall) -> None:
        self._slot(index)
        self._slots[index] = call

    def backend_call(self, index: int) -> BackendToolCall | None:
        slot = self._slots[index] if index < len(self._slots) else None
        return slot if isinstance(slot, BackendToolCall) else None

    def _tool(self, index: int) -> _Tool:
        tools = self._tools
        while len(tools) <= index:
            tools.append(_Tool())
        return tools[index]

    def tool_delta(self, index: int, call_id: str | None, name: str | None, delta: str) -> None:
        tool = self._tools[index] if index < len(self._tools) else self._tool(index)
        if call_id:
            tool.id = call_id
        if name:
            tool.name = name
        if delta:
            tool.parts.append(delta)

    def tool_completed(self, index: int, call: ToolCall) -> None:
        self._tool(index).final = call

    def tool_arguments(self, index: int) -> str:
        """The streamed arguments of local tool call ``index``."""
        return "".join(self._tool(index).parts)

    def has_content(self) -> bool:
        return bool(
            self._tools or self._refusal is not None or any(s is not None for s in self._slots)
        )

    # -- events ----------------------------------------------------------------------

    def add(self, event: SamplingEvent) -> None:
        """Fold one event (content, metadata, a retry or the terminal)."""
        kind = type(event)
        if kind is ChannelToken:
            assert isinstance(event, ChannelToken)
            if event.channel is _TEXT:
                self.text(event.item_index, event.text)
            elif event.channel is _REASONING:
                self.reasoning(event.item_index, event.text, event.summary_index)
            else:
                self.refusal(event.text)
        elif kind is ToolCallDelta:
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
    ) -> ConversationResponse:
        """The response from what was folded so far, with the terminal's metadata."""
        items: list[ConversationItem] = []
        last_is_text = False
        for slot in self._slots:
            if slot is None:
                continue
            kind = type(slot)
            if kind is _Text:
                assert isinstance(slot, _Text)
                items.append(Assistant(content="".join(slot.parts), model=model))
                last_is_text = True
                continue
            if kind is _Thought:
                assert isinstance(slot, _Thought)
                reasoning = slot.item or slot.streamed()
                if not (reasoning.text or reasoning.summary or reasoning.is_opaque or reasoning.id):
                    continue  # an empty block (an id is round-trip state: kept)
                items.append(reasoning)
            else:
                assert isinstance(slot, BackendToolCall)
                items.append(slot)
            last_is_text = False
        calls = tuple(tool.to_call(index) for index, tool in enumerate(self._tools))
        refusal = None if self._refusal is None else "".join(self._refusal)
        if last_is_text:
            last = items[-1]
            assert isinstance(last, Assistant)
            items[-1] = attrs.evolve(last, tool_calls=calls, refusal=refusal, id=message_id)
        else:
            items.append(Assistant(tool_calls=calls, refusal=refusal, model=model, id=message_id))
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
        )
