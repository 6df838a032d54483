"""Driving a transform over bytes (``replay``) and folding events into a response
(``collect``). Pure: this is the whole wire layer without a network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..types import (
    ApiBackend,
    ConversationResponse,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
)
from ._fold import ResponseFold
from ._registry import new_transform
from .eventstream import EVENT_STREAM_MEDIA_TYPE, stream_decoder
from .sse import DEFAULT_MAX_EVENT_BYTES, SSEDecodeError

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
    (``chunks`` may be a single ``bytes`` object too). The body is SSE, or an AWS event
    stream when the provider's profile streams one (``bedrock_messages``) or the
    ``content-type`` header says so.
    """
    transform = new_transform(backend, request_id, provider=provider)
    lowered = {name.lower(): value for name, value in (headers or {}).items()}
    media = transform.profile.stream_media_type
    if lowered.get("content-type", "").startswith(EVENT_STREAM_MEDIA_TYPE):
        media = EVENT_STREAM_MEDIA_TYPE
    decoder = stream_decoder(media, max_event_bytes)
    events = transform.start(headers)
    if isinstance(chunks, bytes | bytearray | memoryview):
        chunks = [bytes(chunks)]
    try:
        for chunk in chunks:
            events.extend(transform.feed_payloads(decoder.feed_payloads(chunk)))
            if transform.finished:
                return events
        events.extend(transform.feed_payloads(decoder.close_payloads()))
    except SSEDecodeError as exc:
        events.extend(transform.abort(decode_failure(exc)))
        return events
    events.extend(transform.close())
    return events


def collect(events: Iterable[SamplingEvent]) -> ConversationResponse:
    """Fold a request's events into its :class:`ConversationResponse`.

    The fold is :class:`~trio_sampler.wire.ResponseFold`, the one the transforms build
    their responses with, so the result is the terminal's own response
    (``Completed.response``, else the ``partial`` of ``Failed`` / ``Cancelled``) when one
    arrives, and the same fold of the deltas when none does. A
    ``Retrying(discard_partial=True)`` starts over, so only the last attempt counts.
    """
    fold = ResponseFold()
    add = fold.add
    for event in events:
        add(event)
        if fold.terminal is not None:
            break
    return fold.response()
