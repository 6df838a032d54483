"""The per-stream accumulator every backend transform is built on. Pure.

A transform's job is to map its wire events onto the calls of :class:`StreamAccumulator`;
the accumulator owns everything the three backends share: event construction,
``FirstToken`` once per attempt, ``chunk_index``, the numbering of output items in wire
order, tool-call slots keyed per backend, reasoning blocks with their opaque state, hosted
tools, usage, and the one terminal.

It keeps no output of its own: every event it emits goes into its
:class:`~trio_sampler.wire._fold.ResponseFold` (the one fold, also behind ``collect`` and
the bridge), and the response of ``Completed`` or the ``partial`` of ``Failed`` is that
fold's. So a stream's response and the fold of its events are equal by construction.

What the fold holds is bounded by its ``max_held_bytes`` (the actor sets it to
``max_response_bytes``): a delta that would pass it fails the stream with
``error_code="response_too_large"`` instead of growing the text, and is not emitted.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import count, repeat
from typing import Any

import attrs

from ..types import (
    ApiBackend,
    BackendToolCall,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    ChannelToken,
    Citation,
    CitationReceived,
    Completed,
    ConversationResponse,
    Failed,
    FirstToken,
    OpaqueItem,
    OpaqueItemReceived,
    Reasoning,
    ReasoningCompleted,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    ServerTextDiffers,
    ServerTextTaken,
    StopReason,
    ToolCall,
    ToolCallCompleted,
    ToolCallDelta,
    Usage,
)
from ._fold import ResponseFold, _Text, arguments_complete

__all__ = ["StreamAccumulator", "held_too_much"]

_TEXT = SamplingChannel.TEXT
_REASONING = SamplingChannel.REASONING
_REFUSAL = SamplingChannel.REFUSAL


def held_too_much(limit: int) -> SamplingErrorInfo:
    """The error of a stream whose text would take more than ``limit`` bytes to hold."""
    return SamplingErrorInfo(
        kind=SamplingErrorKind.HTTP,
        message=(
            f"the response's text would take more than max_response_bytes ({limit} bytes) "
            "to hold; raise SamplerConfig.max_response_bytes if this is expected"
        ),
        retryable=False,
        error_code="response_too_large",
    )


class _ToolSlot:
    __slots__ = ("caller", "final_arguments", "id", "index", "name", "namespace")

    def __init__(self, index: int, call_id: str | None, name: str | None) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.final_arguments: str | None = None
        self.caller: dict[str, Any] | None = None
        self.namespace: str | None = None


class StreamAccumulator:
    """Per-attempt state shared by the three transforms.

    Every method appends the events it produces to ``out`` and folds them. After
    :meth:`complete` or :meth:`fail` the accumulator is finished and every method becomes
    a no-op, which makes "exactly one terminal" hold by construction.
    """

    def __init__(self, request_id: str, origin: ApiBackend | None) -> None:
        self.request_id = request_id
        self.origin = origin
        self.fold = ResponseFold()
        self.finished = False
        #: How the attempt ended, once it has: the ``Completed`` or ``Failed`` that
        #: :meth:`complete` or :meth:`fail` also appended, last, to its ``out``.
        self.outcome: Completed | Failed | None = None
        self.first_token_sent = False
        self.chunk_index = 0
        # Output items in wire order: the next index, and the open run of text (-1: none).
        self._next_item = 0
        self._text_item = -1
        self._text = _Text()  # the open run's text (a placeholder until one opens)
        self._text_parts = self._text.parts
        self._tools: dict[Hashable, _ToolSlot] = {}
        self._tool_order: list[_ToolSlot] = []
        self._reasoning: dict[Hashable, int] = {}
        self._reasoning_done: dict[int, Reasoning] = {}
        self._backend_index: dict[str, int] = {}
        # Hosted calls amended since their last event (sent at the end of the stream).
        self._backend_pending: dict[str, BackendToolCall] = {}
        self.usage: Usage | None = None
        self.cost_usd_ticks: int | None = None
        self.stop_reason: StopReason | None = None
        self.raw_stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.message_id: str | None = None
        #: The id of the audio answer (Chat Completions ``delta.audio.id``): the next turn
        #: refers to it (``Assistant.audio_id``).
        self.audio_id: str | None = None
        #: Doom-loop trigger labels reported by the server (deduplicated, first-seen
        #: order; a tuple, as the fold's warnings).
        self.doom_loop_signals: tuple[str, ...] = ()

    @property
    def text_chunks(self) -> int:
        return self.fold.text_chunks

    @property
    def held_bytes(self) -> int:
        """Bytes of text this attempt holds (see :class:`ResponseFold`)."""
        return self.fold.held_bytes

    def _refused(self, out: list[SamplingEvent]) -> None:
        self.fail(held_too_much(self.fold.max_held_bytes), out)

    # -- content ---------------------------------------------------------------------

    def _first(self, out: list[SamplingEvent]) -> None:
        self.first_token_sent = True
        out.append(FirstToken(self.request_id))

    def _open_item(self) -> int:
        index = self._next_item
        self._next_item = index + 1
        self._text_item = -1
        return index

    def text(self, delta: str, out: list[SamplingEvent]) -> None:
        """A piece of answer text (empty deltas are ignored)."""
        if not delta or self.finished:
            return
        fold = self.fold
        item = self._text_item
        if item < 0:
            item = self._open_item()
            self._text_item = item
            self._text = fold.text_slot(item)
            self._text_parts = self._text.parts
        # ResponseFold.text, inlined for the per-token path.
        held = fold.held_bytes + len(delta)
        if held <= fold.settle_bytes:
            self._text_parts.append(delta)
            fold.held_bytes = held
        elif not fold.append(self._text, delta):
            self._refused(out)
            return
        fold.text_chunks += 1
        if not self.first_token_sent:
            self._first(out)
        chunk = self.chunk_index + 1
        self.chunk_index = chunk
        out.append(ChannelToken(self.request_id, _TEXT, delta, chunk, item))

    def texts(self, deltas: list[str], out: list[SamplingEvent]) -> None:
        """:meth:`text` for each of ``deltas`` in turn, in one call: the same events and
        the same fold (a delta past ``max_held_bytes`` fails the stream there, and the
        deltas after it are ignored), for a transform that has a run of text at once."""
        if self.finished:
            return
        item = self._text_item
        if item >= 0 and self.first_token_sent and all(deltas):
            # The usual run: more text of the open item that fits while pending.
            fold = self.fold
            size = fold.held_bytes + sum(map(len, deltas))
            if size <= fold.settle_bytes:
                self._text_parts.extend(deltas)
                fold.held_bytes = size
                fold.text_chunks += len(deltas)
                chunk = self.chunk_index
                self.chunk_index = chunk + len(deltas)
                if len(deltas) == 1:  # one token per read: no iterators for one event
                    out.append(ChannelToken(self.request_id, _TEXT, deltas[0], chunk + 1, item))
                    return
                out.extend(
                    map(
                        ChannelToken,
                        repeat(self.request_id),
                        repeat(_TEXT),
                        deltas,
                        count(chunk + 1),
                        repeat(item),
                    )
                )
                return
        # Anything else (the first token, a new item, a delta past the pending bound, an
        # empty delta): one delta at a time (a refusal ends the stream, and :meth:`text`
        # ignores what comes after it).
        for delta in deltas:
            self.text(delta, out)

    def streamed_text(self) -> str:
        """All answer text streamed so far."""
        return self.fold.build().text

    def refusal(self, delta: str, out: list[SamplingEvent]) -> None:
        """A piece of refusal text: kept as the response's refusal, not as answer text.

        An empty ``delta`` records that a refusal started (a refusal part before its text).
        """
        if self.finished:
            return
        if not self.fold.refusal(delta):
            self._refused(out)
            return
        if delta and not self.first_token_sent:
            self._first(out)
        out.append(ChannelToken(self.request_id, _REFUSAL, delta, self.chunk_index))

    def _reasoning_item(self, key: Hashable) -> int:
        index = self._reasoning.get(key)
        if index is None:
            index = self._reasoning[key] = self._open_item()
        return index

    def reasoning(
        self, key: Hashable, delta: str, out: list[SamplingEvent], *, summary_index: int = -1
    ) -> None:
        """A piece of reasoning for block ``key``; ``summary_index >= 0`` marks summary text."""
        if not delta or self.finished:
            return
        item = self._reasoning_item(key)
        if not self.fold.reasoning(item, delta, summary_index):
            self._refused(out)
            return
        if not self.first_token_sent:
            self._first(out)
        self.chunk_index += 1
        out.append(
            ChannelToken(self.request_id, _REASONING, delta, self.chunk_index, item, summary_index)
        )

    def begin_reasoning(self, key: Hashable, out: list[SamplingEvent], *, first: bool) -> None:
        """Open reasoning block ``key`` (keeps its place in the output order).

        ``first=True`` counts the opening itself as first content (Anthropic thinking
        blocks), so a model that thinks silently still reports a time to first token.
        """
        if self.finished:
            return
        self._reasoning_item(key)
        if first and not self.first_token_sent:
            self._first(out)

    @property
    def reasoning_opened(self) -> bool:
        """Whether a reasoning block was opened (every reasoning token opens one first)."""
        return bool(self._reasoning)

    def has_reasoning(self, key: Hashable) -> bool:
        return key in self._reasoning

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
        replace: bool = False,
    ) -> Reasoning | None:
        """Close block ``key`` with its round-trip state; emits ``ReasoningCompleted``.

        ``text`` / ``summary`` given by the server replace what was streamed (the server's
        final item is authoritative); otherwise the streamed pieces are used. A block is
        completed once, unless ``replace`` (a server's final output amending it).
        """
        if self.finished:
            return None
        index = self._reasoning_item(key)
        done = self._reasoning_done.get(index)
        if done is not None and not replace:
            return done
        streamed = done or self.fold.streamed_reasoning(index)
        item = Reasoning(
            text=text if text is not None else streamed.text,
            summary=summary if summary is not None else streamed.summary,
            id=item_id if item_id is not None or done is None else done.id,
            encrypted_content=encrypted_content
            if encrypted_content is not None or done is None
            else done.encrypted_content,
            signature=signature,
            redacted_data=redacted_data,
            origin=self.origin,
        )
        if item == done:
            return done
        self._reasoning_done[index] = item
        self.fold.reasoning_completed(index, item)
        out.append(ReasoningCompleted(self.request_id, item, index))
        return item

    # -- local tool calls ------------------------------------------------------------

    def has_tool(self, key: Hashable) -> bool:
        return key in self._tools

    def tool_so_far(self, key: Hashable) -> tuple[str | None, str]:
        """Tool call ``key``'s name and its arguments streamed so far."""
        slot = self._tools.get(key)
        if slot is None:
            return None, ""
        return slot.name, self.fold.tool_arguments(slot.index)

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
                self.fold.tool_delta(slot.index, call_id, name, "")
                out.append(ToolCallDelta(self.request_id, slot.index, call_id, name, ""))
            return slot.index
        new_id = call_id if call_id and call_id != slot.id else None
        new_name = name if name and name != slot.name else None
        if new_id:
            slot.id = new_id
        if new_name:
            slot.name = new_name
        if (new_id or new_name) and not self.finished:
            self.fold.tool_delta(slot.index, new_id, new_name, "")
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
        if not self.fold.tool_delta(slot.index, None, None, delta):
            self._refused(out)
            return
        out.append(ToolCallDelta(self.request_id, slot.index, None, None, delta))

    def tool_caller(self, key: Hashable, caller: dict[str, Any]) -> None:
        """Who made call ``key``, as the server said (Anthropic ``caller``)."""
        slot = self._tools.get(key)
        if slot is not None:
            slot.caller = caller

    def tool_namespace(self, key: Hashable, namespace: str) -> None:
        """The namespace of call ``key``'s tool, as the server said (Responses, for a
        tool loaded by tool search)."""
        slot = self._tools.get(key)
        if slot is not None:
            slot.namespace = namespace

    def tool_finish(self, key: Hashable, arguments: str | None) -> None:
        """The server's complete arguments for ``key`` (authoritative over the fragments)."""
        slot = self._tools.get(key)
        if slot is not None and arguments is not None:
            slot.final_arguments = arguments

    # -- hand-over state ------------------------------------------------------------

    def citation(self, citation: Citation, out: list[SamplingEvent]) -> None:
        """A source the open run of text cites (a run opens if none is)."""
        if self.finished:
            return
        item = self._text_item
        if item < 0:
            item = self._open_item()
            self._text_item = item
            self._text = self.fold.text_slot(item)
            self._text_parts = self._text.parts
        self.fold.citation(item, citation)
        out.append(CitationReceived(self.request_id, citation, item))

    def end_text_run(self) -> None:
        """The next text opens an item of its own (a new message)."""
        self._text_item = -1

    def server_text(self, final: str, out: list[SamplingEvent]) -> None:
        """The server's final text of the open run: where it differs from the streamed
        deltas, it replaces them in the response, with a warning (the events stay)."""
        if self.finished or not final:
            return
        item = self._text_item
        streamed = self.fold.text_of(item) if item >= 0 else ""
        if streamed == final:
            return
        if item < 0:
            self.text(final, out)  # nothing was streamed: the server's text is the text
            return
        warning = ServerTextDiffers(item, streamed, final)
        if not self.fold.server_text(warning):
            self._refused(out)
            return
        out.append(ServerTextTaken(self.request_id, warning))

    def message_phase(self, phase: str) -> None:
        """The ``phase`` of the message whose text run is open (Responses)."""
        if self._text_item >= 0:
            self.fold.phases[self._text_item] = phase

    def opaque(self, raw: dict[str, Any], out: list[SamplingEvent]) -> None:
        """A block or item the neutral model keeps verbatim, in its place (see
        :class:`~trio_sampler.types.OpaqueItem`); it needs the transform's ``origin``."""
        if self.finished or self.origin is None:
            return
        item = OpaqueItem(raw=raw, origin=self.origin)
        index = self._open_item()
        self.fold.opaque(index, item)
        out.append(OpaqueItemReceived(self.request_id, item, index))

    # -- hosted tools ----------------------------------------------------------------

    def backend_tool_started(self, call_id: str, name: str, out: list[SamplingEvent]) -> None:
        if self.finished or call_id in self._backend_index:
            return
        index = self._backend_index[call_id] = self._open_item()
        self.fold.backend_started(index, call_id, name)
        out.append(BackendToolCallStarted(self.request_id, call_id, name, index))

    def backend_tool_completed(self, call: BackendToolCall, out: list[SamplingEvent]) -> None:
        if self.finished:
            return
        index = self._backend_index.get(call.id)
        if index is None:
            self.backend_tool_started(call.id, call.name, out)
            index = self._backend_index[call.id]
        self._backend_pending.pop(call.id, None)
        if self.fold.backend_call(index) == call:
            return  # the same call again (a final output repeating it): nothing new
        self.fold.backend_completed(index, call)
        out.append(
            BackendToolCallCompleted(self.request_id, call.id, call.name, call.result, index, call)
        )

    def backend_tool(self, call_id: str) -> BackendToolCall | None:
        """The hosted call ``call_id`` as it stands (amendments included)."""
        pending = self._backend_pending.get(call_id)
        if pending is not None:
            return pending
        index = self._backend_index.get(call_id)
        return None if index is None else self.fold.backend_call(index)

    def update_backend_tool(self, call_id: str, **changes: Any) -> BackendToolCall | None:
        """Amend a hosted-tool call already started (e.g. attach its assembled input).

        The amended call reaches the consumer with its ``BackendToolCallCompleted``, or at
        the end of the stream if no result follows.
        """
        current = self.backend_tool(call_id)
        if current is None:
            return None
        updated = attrs.evolve(current, **changes)
        self._backend_pending[call_id] = updated
        return updated

    def _flush_backend(self, out: list[SamplingEvent]) -> None:
        for call in list(self._backend_pending.values()):
            self.backend_tool_completed(call, out)

    # -- the terminal ----------------------------------------------------------------

    def has_content(self) -> bool:
        return self.fold.has_content()

    def build_response(self) -> ConversationResponse:
        """The response as folded so far (also the ``partial`` on failure)."""
        return self.fold.build(
            stop_reason=self.stop_reason,
            raw_stop_reason=self.raw_stop_reason,
            usage=self.usage,
            cost_usd_ticks=self.cost_usd_ticks,
            model=self.model,
            response_id=self.response_id,
            message_id=self.message_id,
            stop_sequence=self.stop_sequence,
            audio_id=self.audio_id,
            doom_loop_signals=self.doom_loop_signals,
        )

    def _complete_tools(self, out: list[SamplingEvent]) -> None:
        """``ToolCallCompleted`` for each local call: the server's final arguments win."""
        for slot in self._tool_order:
            arguments = slot.final_arguments
            if arguments is None:
                arguments = self.fold.tool_arguments(slot.index)
            call = ToolCall(
                id=slot.id or f"call_{slot.index}",
                name=slot.name or "",
                arguments=arguments,
                arguments_complete=arguments_complete(arguments),
                caller=slot.caller,
                namespace=slot.namespace,
            )
            self.fold.tool_completed(slot.index, call)
            out.append(ToolCallCompleted(self.request_id, slot.index, call))

    def complete(self, out: list[SamplingEvent]) -> None:
        """Emit ``Completed`` (once), after closing every reasoning block still open."""
        if self.finished:
            return
        for key, index in list(self._reasoning.items()):
            if index not in self._reasoning_done:
                streamed = self.fold.streamed_reasoning(index)
                if streamed.text or streamed.summary:
                    self.finish_reasoning(key, out)
        self._flush_backend(out)
        self._complete_tools(out)
        response = self.build_response()
        self.finished = True
        self.outcome = Completed(self.request_id, response)
        out.append(self.outcome)

    def fail(self, error: SamplingErrorInfo, out: list[SamplingEvent]) -> None:
        """Emit ``Failed`` (once), with what was received so far as ``partial``."""
        if self.finished:
            return
        self._flush_backend(out)
        partial = self.build_response() if self.has_content() or self.usage else None
        self.finished = True
        self.outcome = Failed(self.request_id, error, partial)
        out.append(self.outcome)
