"""A fourth backend, "toy": a small made-up streaming protocol, added from outside.

The request is ``POST /toy/generate`` with ``{"model", "prompt"}``; the answer is
data-only SSE: ``{"text": "..."}`` pieces, then ``{"stop": "...", "usage": {"in", "out"}}``.
An ``{"error": {"reason": ...}}`` event fails the stream: ``busy`` is worth a retry, any
other reason is not. This module is the whole backend: a request builder, a request
parser, a stream transform, its in-stream error classifier, and one ``register_backend``
call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from trio_sampler import ConversationRequest, StopReason, Usage, User
from trio_sampler.types import SamplingErrorInfo, SamplingErrorKind, SamplingEvent
from trio_sampler.wire import BuildOptions, StreamTransform, WireBackend, WireRequest
from trio_sampler.wire import register_backend as register_backend

PATH = "/toy/generate"
_STOPS = {"done": StopReason.STOP, "limit": StopReason.LENGTH}


def build_request(request: ConversationRequest, options: BuildOptions) -> WireRequest:
    """The last user turn is the prompt; the toy protocol has no history."""
    users = [item for item in request.items if isinstance(item, User)]
    if not users:
        raise ValueError("the toy backend needs a User item to use as the prompt")
    data = {"model": request.model or options.model, "prompt": users[-1].text}
    return WireRequest(path=PATH, body=orjson.dumps(data), data=data)


def parse_request(body: bytes | Mapping[str, Any]) -> ConversationRequest:
    data = orjson.loads(body) if isinstance(body, bytes) else body
    prompt = data.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError("a toy request needs a string 'prompt'")
    return ConversationRequest(items=[User(prompt)], model=data.get("model"))


class ToyTransform(StreamTransform):
    """Toy SSE events onto the shared accumulator; the base class does the rest."""

    def _on_json(self, event_name: str, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        acc = self.acc
        if "error" in payload:
            self._stream_error(payload, out)
        elif "text" in payload:
            text = payload["text"]
            if not isinstance(text, str):
                self._serialization_failure("a toy text event whose text is not a string", out)
                return
            acc.text(text, out)
        elif "stop" in payload:
            usage = payload.get("usage") or {}
            acc.usage = Usage(input_tokens=usage.get("in", 0), output_tokens=usage.get("out", 0))
            acc.raw_stop_reason = str(payload["stop"])
            acc.stop_reason = _STOPS.get(acc.raw_stop_reason, StopReason.STOP)
            acc.complete(out)
        else:
            self.unknown_events += 1

    def _on_end(self, out: list[SamplingEvent]) -> None:
        # The body ended without a stop event: the base class fails it as truncated.
        pass


def classify_stream_error(payload: Mapping[str, Any]) -> SamplingErrorInfo:
    """The toy protocol's error event: ``{"error": {"reason": "busy" | ..., "detail"}}``."""
    error = payload.get("error")
    reason = error.get("reason") if isinstance(error, dict) else None
    detail = error.get("detail") if isinstance(error, dict) else None
    busy = reason == "busy"
    return SamplingErrorInfo(
        kind=SamplingErrorKind.OVERLOADED if busy else SamplingErrorKind.INVALID_REQUEST,
        message=detail if isinstance(detail, str) else f"the toy server failed ({reason})",
        retryable=busy,
        error_code=reason if isinstance(reason, str) else None,
    )


BACKEND = WireBackend(
    name="toy",
    build=build_request,
    parse=parse_request,
    transform=ToyTransform,
    default_headers=(("toy-version", "1"),),
    stream_errors=classify_stream_error,
)

register_backend(BACKEND)

__all__ = [
    "BACKEND",
    "PATH",
    "ToyTransform",
    "build_request",
    "classify_stream_error",
    "parse_request",
]
