"""Driving a transform over bytes (``replay``) and folding events into a response
(``collect``). Pure: this is the whole wire layer without a network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..types import (
    ApiBackend,
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
    Reasoning,
    ReasoningCompleted,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    ToolCall,
    ToolCallDelta,
)
from ._registry import new_transform
from .sse import DEFAULT_MAX_EVENT_BYTES, SSEDecodeError, SSEDecoder

__all__ = ["collect", "decode_failure", "replay"]


def decode_failure(exc: SSEDecodeError) -> SamplingErrorInfo:
    """The error for a body that cannot be decoded within the bounds."""
    return SamplingErrorInfo(kind=SamplingErrorKind.HTTP, message=str(exc), retryable=False)


def replay(
    backend: ApiBackend | str,
    chunks: Iterable[bytes] | bytes,
    *,
    request_id: str = "replay",
    headers: Mapping[str, str] | None = None,
    provider: str | None = None,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> list[SamplingEvent]:
    """Decode and transform a recorded body, then close it.

    Always ends with exactly one terminal event and never raises, whatever the bytes
    (``chunks`` may be a single ``bytes`` object too).
    """
    transform = new_transform(backend, request_id, provider=provider)
    decoder = SSEDecoder(max_event_bytes)
    events = transform.start(headers)
    if isinstance(chunks, bytes | bytearray | memoryview):
        chunks = [bytes(chunks)]
    # Bound methods hoisted out of the per-event loop (it runs once per SSE event).
    feed_bytes = decoder.feed
    feed_event = transform.feed
    extend = events.extend
    try:
        for chunk in chunks:
            for sse in feed_bytes(chunk):
                extend(feed_event(sse))
            if transform.finished:
                return events
        for sse in decoder.close():
            extend(feed_event(sse))
    except SSEDecodeError as exc:
        events.extend(transform.abort(decode_failure(exc)))
        return events
    events.extend(transform.close())
    return events


class _DeltaAssembly:
    """Rebuilds a response from deltas (when no terminal carries one)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_items: list[Reasoning] = []
        self.backend: dict[str, BackendToolCall] = {}
        self.tools: dict[int, list[str | None]] = {}
        self.tool_args: dict[int, list[str]] = {}
        self.chunks = 0

    def add(self, event: SamplingEvent) -> None:
        if isinstance(event, ChannelToken):
            if event.channel is SamplingChannel.TEXT:
                self.text.append(event.text)
                self.chunks += 1
            else:
                self.reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            slot = self.tools.setdefault(event.tool_index, [None, None])
            if event.id:
                slot[0] = event.id
            if event.name:
                slot[1] = event.name
            if event.arguments_delta:
                self.tool_args.setdefault(event.tool_index, []).append(event.arguments_delta)
        elif isinstance(event, ReasoningCompleted):
            self.reasoning_items.append(event.item)
        elif isinstance(event, BackendToolCallStarted):
            self.backend.setdefault(event.call_id, BackendToolCall(event.call_id, event.name))
        elif isinstance(event, BackendToolCallCompleted):
            self.backend[event.call_id] = BackendToolCall(
                event.call_id, event.name, result=event.result
            )

    def response(self) -> ConversationResponse:
        items: list[ConversationItem] = []
        if self.reasoning_items:
            items.extend(self.reasoning_items)
        elif self.reasoning:
            items.append(Reasoning(text="".join(self.reasoning)))
        items.extend(self.backend.values())
        calls = tuple(
            ToolCall(
                id=slot[0] or f"call_{index}",
                name=slot[1] or "",
                arguments="".join(self.tool_args.get(index, ())),
            )
            for index, slot in sorted(self.tools.items())
        )
        items.append(Assistant(content="".join(self.text), tool_calls=calls))
        return ConversationResponse(items=items, chunk_count=self.chunks)


def collect(events: Iterable[SamplingEvent]) -> ConversationResponse:
    """Fold a request's events into its :class:`ConversationResponse`.

    The terminal's own response is preferred: ``Completed.response`` (which, on the
    Responses backend, is the server's complete response), else the ``partial`` of
    ``Failed`` / ``Cancelled``. Without a terminal carrying one, the response is
    assembled from the deltas. A ``Retrying(discard_partial=True)`` resets the assembly,
    so only the last attempt counts.
    """
    # The deltas are only folded when no terminal carries a response, which is rare: one
    # cheap type check per event, and the (much costlier) assembly only when needed.
    pending: list[SamplingEvent] = []
    keep = pending.append
    for event in events:
        if not isinstance(event, _CONTROL):
            keep(event)
        elif isinstance(event, Completed):
            return event.response
        elif isinstance(event, Retrying):
            if event.discard_partial:
                pending.clear()
        elif event.partial is not None:  # Failed | Cancelled
            return event.partial
        else:
            break
    return _assemble(pending)


#: Events that steer ``collect`` rather than carry output.
_CONTROL = (Completed, Failed, Cancelled, Retrying)


def _assemble(events: list[SamplingEvent]) -> ConversationResponse:
    assembly = _DeltaAssembly()
    for event in events:
        assembly.add(event)
    return assembly.response()
