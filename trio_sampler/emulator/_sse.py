"""SSE framing and the small shared pieces of the three renderers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from ._reply import Reply, RequestView
    from ._validate import ApiError

__all__ = [
    "Renderer",
    "argument_chunks",
    "data_frame",
    "dumps",
    "event_frame",
    "is_token_frame",
    "retry_after_headers",
]


def dumps(value: Any) -> bytes:
    """Compact JSON, as the real APIs send it."""
    return orjson.dumps(value)


def data_frame(payload: Any) -> bytes:
    """A data-only SSE event (Chat Completions)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def event_frame(event: str, payload: Any) -> bytes:
    """An SSE event with an ``event:`` line (Responses, Messages)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def argument_chunks(arguments: str, chunk_chars: int | None) -> list[str]:
    """Tool-call arguments split the way servers stream them (a few characters each)."""
    size = chunk_chars or 8
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def is_token_frame(frame: bytes) -> bool:
    """Whether an SSE event carries generated output: a non-empty text, reasoning or
    tool-argument delta, on any of the three backends (what token pacing paces)."""
    start = frame.find(b"data: ")
    if start < 0:
        return False
    try:
        payload = orjson.loads(frame[start + 6 :])
    except orjson.JSONDecodeError:
        return False
    if not isinstance(payload, dict):
        return False
    kind = payload.get("type")
    if kind == "content_block_delta":  # Messages
        delta = payload.get("delta") or {}
        return any(delta.get(k) for k in ("text", "thinking", "partial_json"))
    if isinstance(kind, str) and kind.endswith(".delta"):  # Responses
        return bool(payload.get("delta"))
    choices = payload.get("choices")  # Chat Completions
    if not choices:
        return False
    delta = choices[0].get("delta") or {}
    if delta.get("content") or delta.get("reasoning_content"):
        return True
    calls = delta.get("tool_calls") or ()
    return any((call.get("function") or {}).get("arguments") for call in calls)


def retry_after_headers(seconds: float | None) -> list[tuple[bytes, bytes]]:
    """``retry-after`` (seconds) and ``retry-after-ms`` headers, when a delay is given."""
    if seconds is None:
        return []
    whole = f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))
    return [
        (b"retry-after", whole.encode()),
        (b"retry-after-ms", str(round(seconds * 1000)).encode()),
    ]


class Renderer(Protocol):
    """What each backend's renderer provides to the app."""

    #: The backend's name (``chat_completions``, ``responses``, ``messages``).
    backend: str

    def stream(self, reply: Reply, view: RequestView) -> list[bytes]:
        """The whole SSE body as a list of complete events (the fault-counting unit)."""
        ...

    def body(self, reply: Reply, view: RequestView) -> dict[str, Any]:
        """The non-streaming JSON body."""
        ...

    def stream_error(
        self, reply: Reply, view: RequestView, error_type: str | None, sequence: int
    ) -> list[bytes]:
        """The in-stream error event(s) sent after ``sequence`` events."""
        ...

    def error_body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        """The HTTP error body for ``error``."""
        ...

    def keepalive(self) -> bytes:
        """One keep-alive (an SSE comment, or a ``ping`` event)."""
        ...

    def malformed(self) -> bytes:
        """One event whose data line is not JSON."""
        ...

    def request_id_header(self) -> bytes:
        """The header the backend carries its request id in."""
        ...
