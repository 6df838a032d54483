"""Anthropic Messages stream transform: SSE events → :class:`SamplingEvent`. Pure.

One instance per attempt. The wire protocol (``docs/backends/messages.md``)::

    message_start → (content_block_start → content_block_delta* → content_block_stop)*
                  → message_delta+ → message_stop          (ping and error anywhere)

Everything is mapped onto :class:`~trio_sampler.wire._accumulate.StreamAccumulator`:

* ``text`` blocks → answer text (all text blocks concatenated, no separator added).
* ``thinking`` blocks → one :class:`Reasoning` item *each*, closed at
  ``content_block_stop`` with the signature (``signature_delta`` replaces, never appends).
* ``redacted_thinking`` blocks arrive whole → an opaque :class:`Reasoning` with
  ``redacted_data``, completed at once.
* ``tool_use`` blocks → local tool calls keyed by their block; the start block's
  ``input`` is ``{}`` and the real input comes from ``input_json_delta`` fragments (the
  first one is ``""``); an empty buffer means ``{}``.
* ``server_tool_use`` / ``mcp_tool_use`` → a hosted tool started; the matching
  ``*_tool_result`` block completes it. The :class:`BackendToolCall` keeps both raw blocks
  (the call block with its assembled ``input``, then the result block) for replay.
* Usage starts from ``message_start.message.usage``; ``message_delta.usage`` is
  *cumulative*: fields present and non-null overwrite, nothing is ever added.

Blocks that never get ``content_block_stop`` (cut by ``max_tokens``) are closed at
``message_delta`` / ``message_stop`` / end of body. A body that ends after a
``message_delta`` carrying a ``stop_reason`` completes even without ``message_stop``;
one that ends before is a truncated stream (``Failed``, retryable).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Final

import attrs
import orjson

from ...types import (
    ApiBackend,
    BackendToolCall,
    ContextEdited,
    SamplingEvent,
    ServedModelChanged,
    StopReason,
    Usage,
)
from .._citations import citation_from_wire
from .._transform import (
    ProviderDataError,
    StreamTransform,
    reported_cost,
    str_field,
    truncated_stream_error,
)
from .._usage import malformed_counts

__all__ = ["STOP_REASONS", "MessagesTransform"]

#: Wire ``stop_reason`` → normalized reason. Anything else maps to ``STOP`` (raw kept).
STOP_REASONS: Final[dict[str, StopReason]] = {
    "end_turn": StopReason.STOP,
    "stop_sequence": StopReason.STOP,
    "pause_turn": StopReason.STOP,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "tool_use": StopReason.TOOL_CALLS,
    "refusal": StopReason.CONTENT_FILTER,
}

#: Content blocks that start a server-executed (hosted) tool call.
_HOSTED_CALL_BLOCKS: Final = frozenset({"server_tool_use", "mcp_tool_use"})

# Block kinds (small ints: compared on the per-delta path).
_TEXT: Final = 0
_THINKING: Final = 1
_TOOL: Final = 2
_HOSTED: Final = 3
_OTHER: Final = 4
_OPAQUE: Final = 5  # a block kept verbatim (compaction, fallback, ...): an OpaqueItem

_Handler = Callable[[dict[str, Any], list[SamplingEvent]], None]
_DeltaHandler = Callable[["_Block | None", dict[str, Any], list[SamplingEvent]], None]


class _Block:
    """One open content block. Its identity is the accumulator key (no ``__eq__``)."""

    __slots__ = ("arguments", "has_input", "input_parts", "kind", "raw", "signature")

    def __init__(self, kind: int, raw: dict[str, Any]) -> None:
        self.kind = kind
        self.raw = raw
        self.signature: str | None = None
        #: ``tool_use``: a non-empty ``input_json_delta`` was seen.
        self.has_input = False
        #: Hosted calls: the ``input_json_delta`` fragments (no events are emitted for them).
        self.input_parts: list[str] = []
        #: Hosted calls: the assembled input as JSON text, once the call block is closed.
        self.arguments: str | None = None


def _count(value: Any) -> int | None:
    """A token count as sent (an int, or a finite float as some servers send), or
    ``None`` when absent, null or not a number (then named in the usage's ``malformed``,
    see ``wire._usage``)."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is float and math.isfinite(value):
        return int(value)
    return None


def _iteration_usage(entry: dict[str, Any]) -> Usage:
    """One ``usage.iterations`` entry as a :class:`Usage` (input counts cache reads and
    writes, as the top-level usage does)."""
    read = _count(entry.get("cache_read_input_tokens")) or 0
    write = _count(entry.get("cache_creation_input_tokens")) or 0
    return Usage(
        input_tokens=(_count(entry.get("input_tokens")) or 0) + read + write,
        output_tokens=_count(entry.get("output_tokens")) or 0,
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


def _input_object(text: str, fallback: Any) -> Any:
    """Decode an assembled ``input`` (``""`` means ``{}``); undecodable text is kept as is."""
    if not text:
        return fallback if isinstance(fallback, dict) else {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


class MessagesTransform(StreamTransform):
    """The Anthropic Messages (``POST /v1/messages``, ``stream: true``) transform.

    Besides :attr:`unknown_events` (unknown event or delta types), :attr:`unknown_blocks`
    counts content blocks of types it does not map (``compaction``, ``container_upload``,
    future types): each is kept verbatim, deltas applied, as an ``OpaqueItem``.
    """

    backend: ClassVar[ApiBackend] = ApiBackend.MESSAGES

    def __init__(self, request_id: str = "stream", *, provider: str | None = None) -> None:
        super().__init__(request_id, provider=provider)
        #: Content blocks of types not modelled (kept verbatim as ``OpaqueItem``).
        self.unknown_blocks = 0
        self._open: dict[int, _Block] = {}
        self._hosted: dict[str, _Block] = {}
        self._message_started = False
        self._stop_seen = False
        self._tool_blocks = 0
        # Raw Anthropic usage buckets (overwritten field by field, never summed).
        self._input = 0
        self._cache_read = 0
        self._cache_write = 0
        self._output = 0
        self._thinking: int | None = None
        #: Fallback hops seen, waiting for their usage (``usage.iterations``).
        self._hops: list[ServedModelChanged] = []
        self._malformed: tuple[str, ...] = ()
        self._events: dict[str, _Handler] = {
            "content_block_delta": self._on_block_delta,
            "content_block_start": self._on_block_start,
            "content_block_stop": self._on_block_stop,
            "ping": self._ignore,
            "message_start": self._on_message_start,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
            "error": self._stream_error,
        }
        self._deltas: dict[str, _DeltaHandler] = {
            "text_delta": self._on_text_delta,
            "input_json_delta": self._on_input_delta,
            "thinking_delta": self._on_thinking_delta,
            "signature_delta": self._on_signature_delta,
            "citations_delta": self._on_citations_delta,
            "compaction_delta": self._on_compaction_delta,
        }

    # -- dispatch --------------------------------------------------------------------

    def _on_json(self, event_name: str, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        kind = payload.get("type")
        if kind == "content_block_delta":
            # Fast path for the most frequent event: a text delta (equivalent to the full
            # path, which never looks at the block for text).
            delta = payload.get("delta")
            if type(delta) is dict and delta.get("type") == "text_delta":
                text = delta.get("text")
                if type(text) is str and "index" in payload:
                    self.acc.text(text, out)
                    return
        if kind is None:
            # As the official SDK does: an event without ``type`` takes the SSE event name.
            kind = event_name
        handler = self._events.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self.unknown_events += 1
            return
        handler(payload, out)

    def _ignore(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        pass

    def _on_done(self, out: list[SamplingEvent]) -> None:
        """``[DONE]`` (not sent by Anthropic; some gateways add it): the end of body decides."""

    def _on_end(self, out: list[SamplingEvent]) -> None:
        if self._stop_seen:
            # message_delta carried the stop reason; only message_stop is missing.
            self._finish(out)
        else:
            self.acc.fail(truncated_stream_error("message_delta and message_stop"), out)

    # -- message level ---------------------------------------------------------------

    def _on_message_start(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            message = {}
        message_id = message.get("id")
        acc = self.acc
        if self._message_started:
            if message_id == acc.message_id:
                return  # a proxy repeated message_start: nothing new
            # A new generation spliced in by a proxy: its block indexes start again at 0.
            self._close_open_blocks(out)
        self._message_started = True
        if isinstance(message_id, str):
            acc.message_id = acc.response_id = message_id
        model = message.get("model")
        if isinstance(model, str):
            acc.model = model
        content = message.get("content")
        if isinstance(content, list) and content:
            # The whole answer already inside message_start (programmatic tool-calling
            # continuations): each block as if it had been streamed, start then stop.
            for index, block in enumerate(content):
                self._on_block_start({"index": index, "content_block": block}, out)
                self._on_block_stop({"index": index}, out)
        self._take_stop(message, out)
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._input = _count(usage.get("input_tokens")) or 0
            self._cache_read = _count(usage.get("cache_read_input_tokens")) or 0
            self._cache_write = _count(usage.get("cache_creation_input_tokens")) or 0
            self._output = _count(usage.get("output_tokens")) or 0
            self._apply_usage_extras(usage)
            self._set_usage()

    def _on_message_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        # message_delta comes after every block: close any the server never stopped.
        self._close_open_blocks(out)
        management = payload.get("context_management")
        edits = management.get("applied_edits") if isinstance(management, dict) else None
        if edits and isinstance(edits, list):
            kept = tuple(e for e in edits if isinstance(e, dict))
            cleared = sum(_count(e.get("cleared_input_tokens")) or 0 for e in kept)
            out.append(ContextEdited(self.request_id, kept, cleared))
        delta = payload.get("delta")
        if isinstance(delta, dict):
            self._take_stop(delta, out)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # Cumulative totals: overwrite what is present and non-null, never add.
            output = _count(usage.get("output_tokens"))
            if output is not None:
                self._output = output
            value = _count(usage.get("input_tokens"))
            if value is not None:
                self._input = value
            value = _count(usage.get("cache_read_input_tokens"))
            if value is not None:
                self._cache_read = value
            value = _count(usage.get("cache_creation_input_tokens"))
            if value is not None:
                self._cache_write = value
            self._apply_usage_extras(usage)
            self._set_usage()
            if self._hops and "iterations" in usage:
                self._send_hops(usage["iterations"], out)

    def _take_stop(self, fields: dict[str, Any], out: list[SamplingEvent]) -> None:
        """A ``stop_reason`` (of ``message_delta.delta``, or of ``message_start.message``
        when the whole answer came in it), with its stop sequence and refusal details."""
        raw = fields.get("stop_reason")
        if not isinstance(raw, str):
            return
        acc = self.acc
        self._stop_seen = True
        acc.raw_stop_reason = raw
        acc.stop_reason = STOP_REASONS.get(raw, StopReason.STOP)
        sequence = fields.get("stop_sequence")
        acc.stop_sequence = sequence if isinstance(sequence, str) else None
        details = fields.get("stop_details")
        if raw == "refusal" and isinstance(details, dict):
            explanation = details.get("explanation")
            if isinstance(explanation, str) and explanation:
                acc.refusal(explanation, out)

    def _on_message_stop(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        self._finish(out)

    def _finish(self, out: list[SamplingEvent]) -> None:
        self._close_open_blocks(out)
        if self._hops:
            self._send_hops(None, out)  # no usage.iterations came
        acc = self.acc
        if acc.stop_reason is None:
            # No stop_reason at all (seen only from non-Anthropic gateways): infer it.
            acc.stop_reason = StopReason.TOOL_CALLS if self._tool_blocks else StopReason.STOP
        acc.complete(out)

    def _apply_usage_extras(self, usage: dict[str, Any]) -> None:
        malformed = malformed_counts(usage)
        if malformed:
            self._malformed = tuple(dict.fromkeys((*self._malformed, *malformed)))
        details = usage.get("output_tokens_details")
        if isinstance(details, dict):
            thinking = _count(details.get("thinking_tokens"))
            if thinking is not None:
                self._thinking = thinking
        # Gateways in front of it may report a cost; Anthropic itself sends none.
        cost = reported_cost(usage, self.profile.cost_fields)
        if cost is not None:
            self.acc.cost_usd_ticks = cost

    def _set_usage(self) -> None:
        self.acc.usage = Usage(
            input_tokens=self._input + self._cache_read + self._cache_write,
            output_tokens=self._output,
            cache_read_tokens=self._cache_read,
            cache_write_tokens=self._cache_write,
            reasoning_tokens=self._thinking or 0,
            malformed=len(self._malformed),
        )

    # -- content blocks --------------------------------------------------------------

    def _on_block_start(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        index = payload.get("index")
        block = payload.get("content_block")
        if not isinstance(block, dict) or type(index) is not int:
            self.unknown_events += 1
            return
        previous = self._open.pop(index, None)
        if previous is not None:  # the same index restarted: close what it held
            self._close_block(previous, out)
        block_type = block.get("type")
        acc = self.acc
        if block_type == "text":
            self._open[index] = _Block(_TEXT, block)
            text = block.get("text")
            if isinstance(text, str):
                acc.text(text, out)
        elif block_type == "thinking":
            state = self._open[index] = _Block(_THINKING, block)
            acc.begin_reasoning(state, out, first=True)
            thinking = block.get("thinking")
            if isinstance(thinking, str):
                acc.reasoning(state, thinking, out)
            signature = block.get("signature")
            state.signature = signature if isinstance(signature, str) and signature else None
        elif block_type == "tool_use":
            state = self._open[index] = _Block(_TOOL, block)
            self._tool_blocks += 1
            call_id = block.get("id")
            name = block.get("name")
            acc.tool_start(
                state,
                call_id if isinstance(call_id, str) else None,
                name if isinstance(name, str) else None,
                out,
            )
            caller = block.get("caller")
            if isinstance(caller, dict):
                acc.tool_caller(state, caller)
        elif block_type == "redacted_thinking":
            # Arrives whole: no deltas follow, only content_block_stop.
            state = _Block(_OTHER, block)
            data = block.get("data")
            acc.begin_reasoning(state, out, first=True)
            acc.finish_reasoning(state, out, redacted_data=data if isinstance(data, str) else "")
        elif block_type in _HOSTED_CALL_BLOCKS:
            self._start_hosted(index, block, out)
        elif isinstance(block_type, str) and block_type.endswith("_tool_result"):
            self._complete_hosted(block, block_type, out)
        else:
            # compaction, fallback, container_upload, future block types: kept verbatim
            # (their deltas applied) as an OpaqueItem when the block closes.
            self.unknown_blocks += 1
            self._open[index] = _Block(_OPAQUE, dict(block))

    def _on_block_stop(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        index = payload.get("index")
        block = self._open.pop(index, None) if type(index) is int else None
        if block is not None:
            self._close_block(block, out)

    def _close_open_blocks(self, out: list[SamplingEvent]) -> None:
        if self._open:
            for index in sorted(self._open):
                self._close_block(self._open[index], out)
            self._open.clear()

    def _close_block(self, block: _Block, out: list[SamplingEvent]) -> None:
        kind = block.kind
        if kind == _THINKING:
            self.acc.finish_reasoning(block, out, signature=block.signature)
        elif kind == _TOOL:
            if not block.has_input:
                # Only ``partial_json: ""`` (or nothing) was sent: the input is {} — or the
                # start block's own input, for gateways that send it there in full.
                initial = block.raw.get("input")
                arguments = orjson.dumps(initial).decode() if initial else "{}"
                self.acc.tool_finish(block, arguments)
        elif kind == _HOSTED:
            self._finish_hosted_input(block)
        elif kind == _OPAQUE:
            if not isinstance(block.raw.get("type"), str):  # the provider's object is typed
                raise ProviderDataError(
                    f"a content block's type is {type(block.raw.get('type')).__name__}"
                )
            self.acc.opaque(block.raw, out)
            if block.raw.get("type") == "fallback":
                self._fallback(block.raw, out)

    def _fallback(self, block: dict[str, Any], out: list[SamplingEvent]) -> None:
        """A server-side fallback hop: the rest of the answer comes from ``to.model``. Its
        event waits for the hop's usage (``usage.iterations``, in ``message_delta``)."""
        source, target = block.get("from"), block.get("to")
        from_model = source.get("model") if isinstance(source, dict) else None
        to_model = target.get("model") if isinstance(target, dict) else None
        trigger = block.get("trigger")
        if isinstance(to_model, str) and to_model:
            self.acc.model = to_model
        self._hops.append(
            ServedModelChanged(
                self.request_id,
                from_model if isinstance(from_model, str) else None,
                to_model if isinstance(to_model, str) else None,
                trigger if isinstance(trigger, str) else None,
            )
        )

    def _send_hops(self, iterations: Any, out: list[SamplingEvent]) -> None:
        """Each pending hop, with the usage of its ``fallback_message`` iteration (in
        order) when ``iterations`` lists them. Iterations are a breakdown of the request:
        the top-level usage is not changed by them (nothing is counted twice)."""
        served = [
            entry
            for entry in (iterations if isinstance(iterations, list) else ())
            if isinstance(entry, dict) and entry.get("type") == "fallback_message"
        ]
        for n, hop in enumerate(self._hops):
            usage = _iteration_usage(served[n]) if n < len(served) else None
            served_hop = attrs.evolve(hop, usage=usage)
            out.append(served_hop)
            self.served_hops.append(served_hop)
        self._hops.clear()

    # -- hosted (server-executed) tools ----------------------------------------------

    def _start_hosted(self, index: int, block: dict[str, Any], out: list[SamplingEvent]) -> None:
        call_id = block.get("id")
        name = block.get("name")
        if not isinstance(call_id, str):
            self.unknown_blocks += 1
            return
        state = self._open[index] = _Block(_HOSTED, block)
        self._hosted[call_id] = state
        self.acc.backend_tool_started(call_id, name if isinstance(name, str) else "", out)

    def _finish_hosted_input(self, state: _Block) -> str:
        """Assemble the call's ``input`` into its raw block (idempotent); returns the JSON text."""
        if state.arguments is None:
            text = "".join(state.input_parts)
            value = _input_object(text, state.raw.get("input"))
            state.raw = {**state.raw, "input": value}
            state.arguments = text or orjson.dumps(value).decode()
            self.acc.update_backend_tool(
                state.raw["id"], arguments=state.arguments, raw=(state.raw,)
            )
        return state.arguments

    def _complete_hosted(
        self, block: dict[str, Any], block_type: str, out: list[SamplingEvent]
    ) -> None:
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            self.unknown_blocks += 1
            return
        content = block.get("content")
        failed = block.get("is_error") is True or (
            isinstance(content, dict) and str(content.get("type", "")).endswith("_error")
        )
        state = self._hosted.get(call_id)
        if state is not None:
            arguments = self._finish_hosted_input(state)
            call_block = state.raw
            name = call_block.get("name")
            call = BackendToolCall(
                id=call_id,
                name=name if isinstance(name, str) else "",
                arguments=arguments,
                status="failed" if failed else "completed",
                result=content,
                origin=ApiBackend.MESSAGES,
                raw=(call_block, block),
            )
        else:  # a result without its call block: name it after the result type
            call = BackendToolCall(
                id=call_id,
                name=block_type.removesuffix("_tool_result"),
                status="failed" if failed else "completed",
                result=content,
                origin=ApiBackend.MESSAGES,
                raw=(block,),
            )
        self.acc.backend_tool_completed(call, out)

    # -- deltas (the hot path) -------------------------------------------------------

    def _on_block_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        delta = payload.get("delta")
        if type(delta) is not dict:
            raise ProviderDataError("content_block_delta without a delta object")
        delta_type = delta.get("type")
        handler = self._deltas.get(delta_type) if type(delta_type) is str else None
        if handler is None:
            self.unknown_events += 1
            return
        index = payload.get("index")
        handler(self._open.get(index) if type(index) is int else None, delta, out)

    def _on_text_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        self.acc.text(str_field(delta, "text", "type"), out)

    def _on_thinking_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        thinking = str_field(delta, "thinking", "type")
        if block is not None and block.kind == _THINKING:
            self.acc.reasoning(block, thinking, out)

    def _on_signature_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        signature = str_field(delta, "signature", "type")
        if block is not None and block.kind == _THINKING:
            # Replaces, never appends (the thinking text is complete by now).
            block.signature = signature or None

    def _on_input_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        partial = str_field(delta, "partial_json", "type")
        if block is None or not partial:
            return
        if block.kind == _TOOL:
            block.has_input = True
            self.acc.tool_arguments(block, partial, out)
        elif block.kind == _HOSTED:
            block.input_parts.append(partial)
            self.state_bytes += len(partial)

    def _ignore_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        pass

    def _on_citations_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        citation = delta.get("citation")
        if isinstance(citation, dict) and isinstance(citation.get("type"), str):
            self.acc.citation(citation_from_wire(citation, ApiBackend.MESSAGES), out)

    def _on_compaction_delta(
        self, block: _Block | None, delta: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        """A compaction block's summary: each delta *replaces* the fields it carries
        (``content``, ``encrypted_content``), as Anthropic's own accumulator does."""
        if block is not None and block.kind == _OPAQUE:
            block.raw.update((k, v) for k, v in delta.items() if k != "type")
