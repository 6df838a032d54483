"""The per-stream accumulator every backend transform is built on. Pure.

A transform's job is to map its wire events onto the calls of :class:`StreamAccumulator`;
the accumulator owns everything the three backends share: event construction,
``FirstToken`` once per attempt, ``chunk_index``, tool-call slots keyed per backend,
reasoning blocks with their opaque state, hosted tools, usage, and the one terminal.

Output order of the final response: reasoning items and backend tool calls in the order
they started, then exactly one trailing :class:`Assistant` holding the text (all text
blocks concatenated as streamed, with no separator added, so ``collect`` over the deltas
and the final response agree), the refusal and the tool calls in order of first appearance.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

from ..types import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    ChannelToken,
    Completed,
    ConversationItem,
    ConversationResponse,
    Failed,
    FirstToken,
    Reasoning,
    ReasoningCompleted,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingEvent,
    StopReason,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = ["StreamAccumulator"]

_TEXT = SamplingChannel.TEXT
_REASONING = SamplingChannel.REASONING


class _ToolSlot:
    __slots__ = ("arguments", "final_arguments", "id", "index", "name")

    def __init__(self, index: int, call_id: str | None, name: str | None) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.arguments: list[str] = []
        self.final_arguments: str | None = None

    def to_call(self) -> ToolCall:
        args = self.final_arguments
        if args is None:
            args = "".join(self.arguments)
        return ToolCall(id=self.id or f"call_{self.index}", name=self.name or "", arguments=args)


class _ReasoningSlot:
    __slots__ = ("done", "item", "summary", "text")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.summary: dict[int, list[str]] = {}
        self.item: Reasoning | None = None
        self.done = False

    def to_item(self, origin: ApiBackend) -> Reasoning:
        if self.item is not None:
            return self.item
        summary = tuple("".join(parts) for _, parts in sorted(self.summary.items()))
        return Reasoning(text="".join(self.text), summary=summary, origin=origin)


class StreamAccumulator:
    """Per-attempt state shared by the three transforms.

    Every method appends the events it produces to ``out``. After :meth:`complete` or
    :meth:`fail` the accumulator is finished and every method becomes a no-op, which
    makes "exactly one terminal" hold by construction.
    """

    def __init__(self, request_id: str, origin: ApiBackend) -> None:
        self.request_id = request_id
        self.origin = origin
        self.finished = False
        self.first_token_sent = False
        self.chunk_index = 0
        self.text_chunks = 0
        self._text: list[str] = []
        self._refusal: list[str] | None = None
        self._tools: dict[Hashable, _ToolSlot] = {}
        self._tool_order: list[_ToolSlot] = []
        # Reasoning blocks and backend tool calls share one ordered list of output slots.
        self._outputs: list[_ReasoningSlot | BackendToolCall] = []
        self._reasoning: dict[Hashable, _ReasoningSlot] = {}
        self._backend_index: dict[str, int] = {}
        self.usage: Usage | None = None
        self.cost_usd_ticks: int | None = None
        self.stop_reason: StopReason | None = None
        self.raw_stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.message_id: str | None = None
        #: Set by transforms that receive the server's complete response (Responses).
        self.server_items: list[ConversationItem] | None = None
        #: Doom-loop trigger labels reported by the server (deduplicated, first-seen order).
        self.doom_loop_signals: list[str] = []

    # -- content ---------------------------------------------------------------------

    def _first(self, out: list[SamplingEvent]) -> None:
        self.first_token_sent = True
        out.append(FirstToken(self.request_id))

    def text(self, delta: str, out: list[SamplingEvent]) -> None:
        """A piece of answer text (empty deltas are ignored)."""
        if not delta or self.finished:
            return
        if not self.first_token_sent:
            self._first(out)
        self.chunk_index += 1
        self.text_chunks += 1
        self._text.append(delta)
        out.append(ChannelToken(self.request_id, _TEXT, delta, self.chunk_index))

    def refusal(self, delta: str, out: list[SamplingEvent]) -> None:
        """A piece of refusal text: kept as the response's refusal, not as answer text."""
        if self.finished:
            return
        if self._refusal is None:
            self._refusal = []
        if delta:
            if not self.first_token_sent:
                self._first(out)
            self._refusal.append(delta)

    def reasoning(
        self, key: Hashable, delta: str, out: list[SamplingEvent], *, summary_index: int = -1
    ) -> None:
        """A piece of reasoning for block ``key``; ``summary_index >= 0`` marks summary text."""
        if not delta or self.finished:
            return
        slot = self._reasoning_slot(key)
        if summary_index >= 0:
            slot.summary.setdefault(summary_index, []).append(delta)
        else:
            slot.text.append(delta)
        if not self.first_token_sent:
            self._first(out)
        self.chunk_index += 1
        out.append(ChannelToken(self.request_id, _REASONING, delta, self.chunk_index))

    def begin_reasoning(self, key: Hashable, out: list[SamplingEvent], *, first: bool) -> None:
        """Open reasoning block ``key`` (keeps its place in the output order).

        ``first=True`` counts the opening itself as first content (Anthropic thinking
        blocks), so a model that thinks silently still reports a time to first token.
        """
        if self.finished:
            return
        self._reasoning_slot(key)
        if first and not self.first_token_sent:
            self._first(out)

    def finish_reasoning(
        self,
        key: Hashable,
        out: list[SamplingEvent],
        *,
        item_id: str | None = None,
        encrypted_content: str | None = None,
        signature: str | None = None,
        redacted_data: str | None = None,
        text: str | None = None,
        summary: tuple[str, ...] | None = None,
    ) -> Reasoning | None:
        """Close block ``key`` with its round-trip state; emits ``ReasoningCompleted``.

        ``text`` / ``summary`` given by the server replace what was streamed (the server's
        final item is authoritative); otherwise the streamed pieces are used.
        """
        if self.finished:
            return None
        slot = self._reasoning_slot(key)
        if slot.done:
            return slot.item
        streamed = slot.to_item(self.origin)
        item = Reasoning(
            text=text if text is not None else streamed.text,
            summary=summary if summary is not None else streamed.summary,
            id=item_id,
            encrypted_content=encrypted_content,
            signature=signature,
            redacted_data=redacted_data,
            origin=self.origin,
        )
        slot.item = item
        slot.done = True
        out.append(ReasoningCompleted(self.request_id, item))
        return item

    def _reasoning_slot(self, key: Hashable) -> _ReasoningSlot:
        slot = self._reasoning.get(key)
        if slot is None:
            slot = self._reasoning[key] = _ReasoningSlot()
            self._outputs.append(slot)
        return slot

    # -- local tool calls ------------------------------------------------------------

    def has_tool(self, key: Hashable) -> bool:
        return key in self._tools

    def tool_start(
        self, key: Hashable, call_id: str | None, name: str | None, out: list[SamplingEvent]
    ) -> int:
        """Open (or re-address) the tool call ``key``; returns its ``tool_index``."""
        slot = self._tools.get(key)
        if slot is None:
            slot = _ToolSlot(len(self._tool_order), call_id, name)
            self._tools[key] = slot
            self._tool_order.append(slot)
            if not self.finished:
                out.append(ToolCallDelta(self.request_id, slot.index, call_id, name, ""))
            return slot.index
        new_id = call_id if call_id and call_id != slot.id else None
        new_name = name if name and name != slot.name else None
        if new_id:
            slot.id = new_id
        if new_name:
            slot.name = new_name
        if (new_id or new_name) and not self.finished:
            out.append(ToolCallDelta(self.request_id, slot.index, new_id, new_name, ""))
        return slot.index

    def tool_arguments(self, key: Hashable, delta: str, out: list[SamplingEvent]) -> None:
        """Append an argument fragment to tool call ``key`` (opened if unknown)."""
        if not delta or self.finished:
            return
        slot = self._tools.get(key)
        if slot is None:
            self.tool_start(key, None, None, out)
            slot = self._tools[key]
        slot.arguments.append(delta)
        out.append(ToolCallDelta(self.request_id, slot.index, None, None, delta))

    def tool_finish(self, key: Hashable, arguments: str | None) -> None:
        """The server's complete arguments for ``key`` (authoritative over the fragments)."""
        slot = self._tools.get(key)
        if slot is not None and arguments is not None:
            slot.final_arguments = arguments

    # -- hosted tools ----------------------------------------------------------------

    def backend_tool_started(self, call_id: str, name: str, out: list[SamplingEvent]) -> None:
        if self.finished or call_id in self._backend_index:
            return
        self._backend_index[call_id] = len(self._outputs)
        self._outputs.append(BackendToolCall(id=call_id, name=name, origin=self.origin))
        out.append(BackendToolCallStarted(self.request_id, call_id, name))

    def backend_tool_completed(self, call: BackendToolCall, out: list[SamplingEvent]) -> None:
        if self.finished:
            return
        position = self._backend_index.get(call.id)
        if position is None:
            self.backend_tool_started(call.id, call.name, out)
            position = self._backend_index[call.id]
        self._outputs[position] = call
        out.append(BackendToolCallCompleted(self.request_id, call.id, call.name, call.result))

    def update_backend_tool(self, call_id: str, **changes: Any) -> BackendToolCall | None:
        """Amend a hosted-tool call already started (e.g. attach its result block)."""
        position = self._backend_index.get(call_id)
        if position is None:
            return None
        current = self._outputs[position]
        assert isinstance(current, BackendToolCall)
        updated = attrs.evolve(current, **changes)
        self._outputs[position] = updated
        return updated

    # -- the terminal ----------------------------------------------------------------

    def has_content(self) -> bool:
        return bool(self._text or self._tool_order or self._outputs or self._refusal)

    def build_response(self) -> ConversationResponse:
        """The response as accumulated so far (also used as ``partial`` on failure)."""
        items: list[ConversationItem]
        if self.server_items is not None:
            items = list(self.server_items)
        else:
            items = []
            for output in self._outputs:
                if isinstance(output, _ReasoningSlot):
                    reasoning = output.to_item(self.origin)
                    if reasoning.text or reasoning.summary or reasoning.is_opaque:
                        items.append(reasoning)
                else:
                    items.append(output)
            refusal = None if self._refusal is None else "".join(self._refusal)
            items.append(
                Assistant(
                    content="".join(self._text),
                    tool_calls=tuple(slot.to_call() for slot in self._tool_order),
                    refusal=refusal,
                    model=self.model,
                    id=self.message_id,
                )
            )
        return ConversationResponse(
            items=items,
            stop_reason=self.stop_reason,
            raw_stop_reason=self.raw_stop_reason,
            usage=self.usage,
            cost_usd_ticks=self.cost_usd_ticks,
            model=self.model,
            response_id=self.response_id,
            chunk_count=self.text_chunks,
            stop_sequence=self.stop_sequence,
            doom_loop_signals=tuple(self.doom_loop_signals),
        )

    def complete(self, out: list[SamplingEvent]) -> None:
        """Emit ``Completed`` (once)."""
        if self.finished:
            return
        response = self.build_response()
        self.finished = True
        out.append(Completed(self.request_id, response))

    def fail(self, error: SamplingErrorInfo, out: list[SamplingEvent]) -> None:
        """Emit ``Failed`` (once), with what was received so far as ``partial``."""
        if self.finished:
            return
        partial = self.build_response() if self.has_content() or self.usage else None
        self.finished = True
        out.append(Failed(self.request_id, error, partial))
