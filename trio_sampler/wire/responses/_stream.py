"""The OpenAI Responses stream transform (``POST /v1/responses``, ``stream: true``). Pure.

Wire events are dispatched on their JSON ``type`` through a dict of bound methods and mapped
onto :class:`~trio_sampler.wire._accumulate.StreamAccumulator`. The mapping table, the
quirks handled and the deliberate differences from the official SDK are in
``docs/backends/responses-stream.md``.

State is keyed per output item, never by "the current item": OpenRouter overlaps items
(a reasoning item's ``output_item.done`` arrives after the message's), so every delta is
routed by its ``item_id`` (through the key its ``output_item.added`` registered) or its
``output_index``.

The terminal ``response.completed`` carries the server's complete response; its ``output``
amends what was streamed through the same events (items not streamed are added, final
state replaces streamed state), so the fold of the events is the response; an empty final
``output`` (some providers) leaves what was streamed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeAlias

import orjson

from ...providers import NO_PROVIDER, CostField
from ...types import (
    ApiBackend,
    BackendToolCall,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
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

__all__ = ["HOSTED_TOOL_ITEMS", "ResponsesTransform"]

_Handler: TypeAlias = Callable[[dict[str, Any], list[SamplingEvent]], None]

#: Output item types the server executes itself → the ``BackendToolCall.name`` they get.
#: xAI runs its server-side ``x_search`` as a ``custom_tool_call``; the request builder
#: never declares custom (client-side) tools, so on this backend one is always hosted.
HOSTED_TOOL_ITEMS: dict[str, str] = {
    "web_search_call": "web_search",
    "file_search_call": "file_search",
    "code_interpreter_call": "code_interpreter",
    "image_generation_call": "image_generation",
    "mcp_call": "mcp",
    "mcp_list_tools": "mcp_list_tools",
    "custom_tool_call": "custom_tool",
}

# Progress events of hosted tools: ``response.<item type>.<phase>`` → tool started.
_HOSTED_PROGRESS: dict[str, tuple[str, ...]] = {
    "web_search_call": ("in_progress", "searching", "completed"),
    "file_search_call": ("in_progress", "searching", "completed"),
    "code_interpreter_call": ("in_progress", "interpreting", "completed"),
    "image_generation_call": ("in_progress", "generating", "partial_image", "completed"),
    "mcp_call": ("in_progress", "completed", "failed"),
    "mcp_list_tools": ("in_progress", "completed", "failed"),
}

# Known events that carry nothing we keep (the terminal's response has their content).
_IGNORED = (
    "response.output_text.done",
    "response.refusal.done",
    "response.content_part.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.done",
    "response.reasoning_text.done",
    "response.code_interpreter_call_code.delta",
    "response.code_interpreter_call_code.done",
    "response.mcp_call_arguments.delta",
    "response.mcp_call_arguments.done",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.audio.delta",
    "response.audio.done",
    "response.audio.transcript.delta",
    "response.audio.transcript.done",
    # Shell calls and compaction: the item itself (kept verbatim) comes at output_item.done.
    "response.shell_call_command.added",
    "response.shell_call_command.delta",
    "response.shell_call_command.done",
    "response.shell_call_output_content.delta",
    "response.shell_call_output_content.done",
    "response.compaction.compacting",
)

_DOOM_LOOP_EVENT = "response.doom_loop_check"

# ``incomplete_details.reason`` → stop reason; anything else is a truncation too.
_INCOMPLETE: dict[str, StopReason] = {
    "max_output_tokens": StopReason.LENGTH,
    "content_filter": StopReason.CONTENT_FILTER,
}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int:
    """A count as sent (int, or a finite float as some servers send) → int; else 0 (and
    named in the usage's ``malformed``, see ``wire._usage``)."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is float and math.isfinite(value):
        return int(value)
    return 0


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _texts(parts: Any, part_type: str, field: str = "text") -> list[str]:
    """The ``field`` strings of the parts of type ``part_type`` in a content/summary list."""
    if not isinstance(parts, list):
        return []
    out: list[str] = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") == part_type:
            text = part.get(field)
            if isinstance(text, str):
                out.append(text)
    return out


def usage_from_wire(
    usage: Mapping[str, Any], cost_fields: tuple[CostField, ...] = NO_PROVIDER.cost_fields
) -> tuple[Usage, int | None]:
    """Normalized :class:`Usage` and the cost in ticks from a Responses ``usage`` object.

    ``input_tokens`` already includes cache reads (and writes); ``output_tokens`` already
    includes reasoning. Cost: the first of ``cost_fields`` that reports one (by default
    xAI's ``cost_in_usd_ticks``, then OpenRouter's ``cost`` in USD), else ``None``.
    """
    input_details = _dict(usage.get("input_tokens_details"))
    output_details = _dict(usage.get("output_tokens_details"))
    cache_write = _int(input_details.get("cache_write_tokens")) or _int(
        usage.get("cache_write_tokens")
    )
    normalized = Usage(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(input_details.get("cached_tokens")),
        cache_write_tokens=cache_write,
        reasoning_tokens=_int(output_details.get("reasoning_tokens")),
        malformed=len(malformed_counts(usage)),
    )
    return normalized, reported_cost(usage, cost_fields)


def _hosted_arguments(item: Mapping[str, Any]) -> str:
    """The hosted call's input as JSON text: its ``arguments``, ``action``, queries or code."""
    arguments = item.get("arguments")
    if isinstance(arguments, str) and arguments:
        return arguments  # xAI web_search_call, mcp_call: already JSON text
    for field in ("action", "queries", "code", "input"):
        value = item.get(field)
        if value:
            data = value if field == "action" else {field: value}
            try:
                return orjson.dumps(data).decode()
            except TypeError:
                return "{}"
    return "{}"


def _hosted_result(item: Mapping[str, Any]) -> Any:
    for field in ("output", "outputs", "results", "result"):
        value = item.get(field)
        if value is not None:
            return value
    sources = _dict(item.get("action")).get("sources")
    return sources if sources is not None else None


def backend_tool_call(item: Mapping[str, Any], item_type: str) -> BackendToolCall:
    """A hosted-tool output item as a :class:`BackendToolCall` (``raw`` = the item)."""
    name = HOSTED_TOOL_ITEMS[item_type]
    if item_type in ("mcp_call", "custom_tool_call"):
        name = _str(item.get("name")) or name
    return BackendToolCall(
        id=_str(item.get("id")) or _str(item.get("call_id")) or "",
        name=name,
        arguments=_hosted_arguments(item),
        status=_str(item.get("status")),
        result=_hosted_result(item),
        origin=ApiBackend.RESPONSES,
        raw=(item,),
    )


class ResponsesTransform(StreamTransform):
    """Responses SSE events → sampling events (see the module docstring)."""

    backend = ApiBackend.RESPONSES
    #: The doom-loop check is taken in ``_feed_data``; every other event goes the fast way.
    taken_events = frozenset({_DOOM_LOOP_EVENT})

    def __init__(self, request_id: str = "stream", *, provider: str | None = None) -> None:
        super().__init__(request_id, provider=provider)
        #: Output items of types this transform does not model (compaction, ...): each is
        #: kept verbatim as an ``OpaqueItem`` in its place.
        self.unknown_items = 0
        #: ``response.doom_loop_check`` events that could not be parsed (never fatal).
        self.malformed_doom_loop_events = 0
        #: The highest ``sequence_number`` fed (-1: none yet): where a resumed stream
        #: starts after (``GET /v1/responses/{id}?stream=true&starting_after=N``).
        self.last_sequence = -1
        #: Events whose sequence number was already fed (a replay; skipped), and places
        #: where a number was skipped (an event missing): both stay 0 on a sound resume.
        self.replayed_events = 0
        self.sequence_gaps = 0
        # item id → the state key registered by its ``output_item.added``.
        self._keys: dict[str, Hashable] = {}
        handlers: dict[str, _Handler] = {
            "response.output_text.delta": self._on_text_delta,
            "response.refusal.delta": self._on_refusal_delta,
            "response.reasoning_summary_text.delta": self._on_summary_delta,
            "response.reasoning_text.delta": self._on_reasoning_text_delta,
            "response.function_call_arguments.delta": self._on_arguments_delta,
            "response.function_call_arguments.done": self._on_arguments_done,
            "response.output_item.added": self._on_item_added,
            "response.output_item.done": self._on_item_done,
            "response.content_part.added": self._on_part_added,
            "response.output_text.annotation.added": self._on_annotation,
            "response.created": self._on_lifecycle,
            "response.queued": self._on_lifecycle,
            "response.in_progress": self._on_lifecycle,
            "response.completed": self._on_completed,
            "response.incomplete": self._on_incomplete,
            "response.failed": self._on_failed,
            "error": self._on_error,
            _DOOM_LOOP_EVENT: self._on_doom_loop_check,
        }
        for name in _IGNORED:
            handlers[name] = self._ignore
        for item_type, phases in _HOSTED_PROGRESS.items():
            progress = functools.partial(self._on_hosted_progress, HOSTED_TOOL_ITEMS[item_type])
            for phase in phases:
                handlers[f"response.{item_type}.{phase}"] = progress
        self._handlers = handlers

    # -- the StreamTransform protocol ---------------------------------------------------

    def _feed_data(self, name: str, data: str, out: list[SamplingEvent]) -> None:
        # A doom-loop check is advisory: even a garbage payload must not fail the stream,
        # so it never reaches the base class's JSON/serialization handling.
        if name == _DOOM_LOOP_EVENT and not self.acc.finished:
            if not self._started:
                out.extend(self.start())
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                payload = None
            if isinstance(payload, dict):
                self._on_doom_loop_check(payload, out)
            else:
                self.malformed_doom_loop_events += 1
            return
        super()._feed_data(name, data, out)

    def _on_json(self, event_name: str, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        event_type = payload.get("type")
        if event_type is None:
            if payload.get("error"):
                self._stream_error(payload, out)  # an error envelope without a type
                return
            event_type = event_name  # data-only framing of a type-less event
        sequence = payload.get("sequence_number")
        if type(sequence) is int:
            if sequence <= self.last_sequence:
                self.replayed_events += 1  # already fed: a resumed read never repeats it
                return
            if sequence != self.last_sequence + 1 and self.last_sequence >= 0:
                self.sequence_gaps += 1
            self.last_sequence = sequence
        handler = self._handlers.get(event_type) if isinstance(event_type, str) else None
        if handler is None:
            self.unknown_events += 1
        else:
            handler(payload, out)

    def _on_end(self, out: list[SamplingEvent]) -> None:
        # No response.completed / .incomplete / .failed: the body was cut.
        self.acc.fail(truncated_stream_error("response.completed"), out)

    # -- keys -------------------------------------------------------------------------

    def _key(self, payload: Mapping[str, Any]) -> Hashable:
        item_id = payload.get("item_id")
        if item_id is not None:
            key = self._keys.get(item_id) if isinstance(item_id, str) else None
            if key is not None:
                return key
        index = payload.get("output_index")
        if isinstance(index, int):
            return index
        return item_id if isinstance(item_id, str) else None

    def _item_key(self, payload: Mapping[str, Any], item: Mapping[str, Any]) -> Hashable:
        item_id = item.get("id")
        if isinstance(item_id, str):
            key = self._keys.get(item_id)
            if key is not None:
                return key
        index = payload.get("output_index")
        key = index if isinstance(index, int) else item_id if isinstance(item_id, str) else None
        if isinstance(item_id, str):
            self._keys[item_id] = key
        return key

    # -- content ----------------------------------------------------------------------

    def _ignore(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        pass

    def _on_text_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        self.acc.text(str_field(payload, "delta", "type"), out)

    def _on_refusal_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        self.acc.refusal(str_field(payload, "delta", "type"), out)

    def _on_annotation(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        annotation = payload.get("annotation")
        if isinstance(annotation, dict) and isinstance(annotation.get("type"), str):
            self.acc.citation(citation_from_wire(annotation, ApiBackend.RESPONSES), out)

    def _on_part_added(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        if _dict(payload.get("part")).get("type") == "refusal":
            self.acc.refusal("", out)  # a refusal part, even before (or without) deltas

    def _on_summary_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        delta = str_field(payload, "delta", "type")
        if delta:
            index = payload.get("summary_index")
            index = index if isinstance(index, int) and index >= 0 else 0
            self.acc.reasoning(self._key(payload), delta, out, summary_index=index)

    def _on_reasoning_text_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        delta = str_field(payload, "delta", "type")
        if delta:
            self.acc.reasoning(self._key(payload), delta, out)

    # -- function calls ---------------------------------------------------------------

    def _on_arguments_delta(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        delta = str_field(payload, "delta", "type")
        if delta:
            self.acc.tool_arguments(self._key(payload), delta, out)

    def _on_arguments_done(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        key = self._key(payload)
        name = _str(payload.get("name"))  # absent from real 2025-2026 captures
        if name:
            self.acc.tool_start(key, None, name, out)
        self.acc.tool_finish(key, _str(payload.get("arguments")))

    # -- output items -----------------------------------------------------------------

    def _namespace(self, key: Hashable, item: dict[str, Any]) -> None:
        namespace = item.get("namespace")
        if namespace is not None:
            if type(namespace) is not str:
                raise ProviderDataError(
                    f"function_call.namespace is {type(namespace).__name__}, not a string"
                )
            self.acc.tool_namespace(key, namespace)

    def _on_item_added(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        item = payload.get("item")
        if not isinstance(item, dict):
            return
        item_type = item.get("type")
        key = self._item_key(payload, item)
        if item_type == "function_call":
            self.acc.tool_start(key, _str(item.get("call_id")), _str(item.get("name")), out)
        elif item_type == "reasoning":
            self.acc.begin_reasoning(key, out, first=False)
        elif item_type == "message":
            self.acc.message_id = _str(item.get("id")) or self.acc.message_id
            self.acc.end_text_run()  # each message is its own Assistant item
        elif isinstance(item_type, str) and item_type in HOSTED_TOOL_ITEMS:
            call = backend_tool_call(item, item_type)
            self.acc.backend_tool_started(call.id, call.name, out)

    def _on_item_done(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        item = payload.get("item")
        if not isinstance(item, dict):
            return
        item_type = item.get("type")
        key = self._item_key(payload, item)
        if item_type == "function_call":
            self.acc.tool_start(key, _str(item.get("call_id")), _str(item.get("name")), out)
            self.acc.tool_finish(key, _str(item.get("arguments")))
            self._namespace(key, item)
        elif item_type == "reasoning":
            # encrypted_content from .done: the one on .added differs and is not replayable.
            summary = _texts(item.get("summary"), "summary_text")
            text = _texts(item.get("content"), "reasoning_text")
            self.acc.finish_reasoning(
                key,
                out,
                item_id=_str(item.get("id")),
                encrypted_content=_str(item.get("encrypted_content")),
                summary=tuple(summary) if summary else None,
                text="".join(text) if text else None,
            )
        elif item_type == "message":
            self.acc.message_id = _str(item.get("id")) or self.acc.message_id
            # The server's final word: the message's text as the item holds it.
            self.acc.server_text("".join(_texts(item.get("content"), "output_text")), out)
            phase = _str(item.get("phase"))
            if phase:
                self.acc.message_phase(phase)
        elif isinstance(item_type, str) and item_type in HOSTED_TOOL_ITEMS:
            self.acc.backend_tool_completed(backend_tool_call(item, item_type), out)
        else:
            # compaction, shell and apply_patch calls, newer item types: kept verbatim.
            if not isinstance(item_type, str):  # kept as the provider's object: it is typed
                raise ProviderDataError(f"an output item's type is {type(item_type).__name__}")
            self.unknown_items += 1
            self.acc.opaque(item, out)

    def _on_hosted_progress(
        self, name: str, payload: dict[str, Any], out: list[SamplingEvent]
    ) -> None:
        item_id = _str(payload.get("item_id"))
        if item_id:
            self.acc.backend_tool_started(item_id, name, out)

    # -- response lifecycle -----------------------------------------------------------

    def _take_response(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """Record id, model, usage and doom-loop triggers of the event's ``response``."""
        response = _dict(payload.get("response"))
        if response:
            response_id = _str(response.get("id"))
            model = _str(response.get("model"))
            if response_id:
                self.acc.response_id = response_id
            if model:
                self.acc.model = model
            usage = response.get("usage")
            if isinstance(usage, dict):
                self.acc.usage, cost = usage_from_wire(usage, self.profile.cost_fields)
                if cost is not None:
                    self.acc.cost_usd_ticks = cost
            check = response.get("doom_loop_check")
            if isinstance(check, dict):
                self._add_doom_loop_triggers(check.get("triggers"))
        return response

    def _on_lifecycle(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        self._take_response(payload)

    def _on_completed(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        response = self._take_response(payload)
        self._finish(response, StopReason.STOP, _str(response.get("status")) or "completed", out)

    def _on_incomplete(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        response = self._take_response(payload)
        reason = _str(_dict(response.get("incomplete_details")).get("reason"))
        stop = _INCOMPLETE.get(reason or "", StopReason.LENGTH)
        self._finish(response, stop, reason or "incomplete", out)

    def _on_failed(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        response = self._take_response(payload)
        if isinstance(response.get("error"), dict):
            self._stream_error(payload, out)
        else:
            error = SamplingErrorInfo(
                kind=SamplingErrorKind.API,
                message="the response failed with no error details (response.failed)",
                retryable=True,
            )
            self.acc.fail(error, out)

    def _on_error(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        self._stream_error(payload, out)  # flat (documented) and nested (observed) shapes

    def _finish(
        self,
        response: Mapping[str, Any],
        stop: StopReason,
        raw: str,
        out: list[SamplingEvent],
    ) -> None:
        """Terminal: the final output amends the stream, then the stop reason, ``Completed``."""
        acc = self.acc
        output = response.get("output")
        if isinstance(output, list):
            self._amend(output, out)
        final = acc.build_response()
        if stop is StopReason.STOP:
            if final.tool_calls:
                stop = StopReason.TOOL_CALLS  # no finish reason on the wire: inferred
            elif final.refusal is not None:
                stop, raw = StopReason.CONTENT_FILTER, "refusal"
        acc.stop_reason = stop
        acc.raw_stop_reason = raw
        acc.complete(out)

    def _amend(self, output: list[Any], out: list[SamplingEvent]) -> None:
        """``response.output`` amends what was streamed, through the same events (so the
        fold of the events is the response): items that were not streamed are added in
        their order, and the final state of the others (encrypted reasoning, a call's
        arguments, a hosted result) replaces the streamed state. The answer text is the
        streamed text, or the final text when none was streamed."""
        acc = self.acc
        text: list[str] = []
        refusal: list[str] | None = None
        for index, item in enumerate(output):
            if not isinstance(item, dict):
                continue
            item_type = item.get("type")
            position = {"output_index": index}
            if item_type == "message":
                acc.message_id = _str(item.get("id")) or acc.message_id
                content = item.get("content")
                text.extend(_texts(content, "output_text"))
                refusals = _texts(content, "refusal", "refusal")
                if refusals:
                    refusal = (refusal or []) + refusals
            elif item_type == "function_call":
                key = self._item_key(position, item)
                call_id = _str(item.get("call_id")) or _str(item.get("id"))
                acc.tool_start(key, call_id, _str(item.get("name")), out)
                acc.tool_finish(key, _str(item.get("arguments")))
                self._namespace(key, item)
            elif item_type == "reasoning":
                key = self._item_key(position, item)
                summary = _texts(item.get("summary"), "summary_text")
                reasoning_text = _texts(item.get("content"), "reasoning_text")
                acc.finish_reasoning(
                    key,
                    out,
                    item_id=_str(item.get("id")),
                    encrypted_content=_str(item.get("encrypted_content")),
                    summary=tuple(summary) if summary else None,
                    text="".join(reasoning_text) if reasoning_text else None,
                    replace=True,
                )
            elif isinstance(item_type, str) and item_type in HOSTED_TOOL_ITEMS:
                acc.backend_tool_completed(backend_tool_call(item, item_type), out)
        if text or refusal is not None:
            streamed = acc.build_response()
            final_text = "".join(text)
            if final_text.startswith(streamed.text):
                acc.text(final_text[len(streamed.text) :], out)
            if refusal is not None and streamed.refusal is None:
                acc.refusal("".join(refusal), out)

    # -- doom loop --------------------------------------------------------------------

    def _on_doom_loop_check(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        check = payload.get("doom_loop_check")
        if isinstance(check, dict) and isinstance(check.get("triggers"), list):
            self._add_doom_loop_triggers(check["triggers"])
        else:
            self.malformed_doom_loop_events += 1

    def _add_doom_loop_triggers(self, triggers: Any) -> None:
        """Record trigger labels (cumulative on the wire: deduplicated, in first-seen order)."""
        if not isinstance(triggers, list):
            return
        acc = self.acc
        for label in triggers:
            if isinstance(label, str) and label not in acc.doom_loop_signals:
                acc.doom_loop_signals += (label,)
