"""``trio-sampler replay FILE --backend B [--events]``: a recorded body through the wire layer."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from ..types import ApiBackend, Completed, ConversationResponse, Failed, to_jsonable
from ..wire import collect, replay
from ..wire.sse import SSEDecoder, SSEEventTooLarge
from ._errors import UsageError, backend_choice

__all__ = ["add_parser", "response_summary"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "replay",
        help="decode a recorded SSE body and print the collected response",
        description=(
            "Decode a recorded SSE response body with the backend's stream transform. Prints "
            "the collected response as JSON (or, with --events, every event as one JSON line). "
            "Exit status 0 when the stream completed, 1 when it failed (error on stderr)."
        ),
    )
    parser.add_argument("file", help="the recorded body (raw bytes as received); - for stdin")
    parser.add_argument(
        "--backend",
        required=True,
        type=backend_choice,
        choices=[b.value for b in ApiBackend],
        help="the wire protocol the body speaks",
    )
    parser.add_argument("--events", action="store_true", help="print every event, one per line")
    parser.set_defaults(run=run)


def response_summary(response: ConversationResponse) -> dict[str, Any]:
    """The response as JSON data, with its derived views first."""
    return {
        "text": response.text,
        "reasoning_text": response.reasoning_text,
        "refusal": response.refusal,
        "tool_calls": [to_jsonable(c) for c in response.tool_calls],
        "stop_reason": response.stop_reason.value if response.stop_reason else None,
        "raw_stop_reason": response.raw_stop_reason,
        "usage": to_jsonable(response.usage),
        "cost_usd_ticks": response.cost_usd_ticks,
        "model": response.model,
        "response_id": response.response_id,
        "items": to_jsonable(response.items),
    }


_MESSAGES_TYPES = frozenset(
    {"message_start", "content_block_start", "content_block_delta", "message_delta", "ping"}
)


def sniff_backend(body: bytes) -> ApiBackend | None:
    """The protocol a recorded body speaks, judged from its first recognisable event."""
    decoder = SSEDecoder()
    try:
        events = [*decoder.feed(body), *decoder.close()]
    except SSEEventTooLarge:
        return None
    for event in events[:64]:
        try:
            payload = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict):
            continue
        kind = payload.get("type")
        if isinstance(kind, str) and kind.startswith("response."):
            return ApiBackend.RESPONSES
        if kind in _MESSAGES_TYPES or event.event in _MESSAGES_TYPES:
            return ApiBackend.MESSAGES
        if payload.get("object") == "chat.completion.chunk" or "choices" in payload:
            return ApiBackend.CHAT_COMPLETIONS
    return None


def run(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            body = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as handle:
                body = handle.read()
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    backend = ApiBackend(args.backend)
    spoken = sniff_backend(body)
    if spoken is not None and spoken is not backend:
        raise UsageError(
            f"{args.file} is a {spoken.value} stream, not {backend.value}: "
            f"pass --backend {spoken.value}"
        )
    events = replay(backend, [body])
    out = sys.stdout.buffer
    if args.events:
        for event in events:
            out.write(orjson.dumps(to_jsonable(event)) + b"\n")
    else:
        out.write(orjson.dumps(response_summary(collect(events)), option=orjson.OPT_INDENT_2))
        out.write(b"\n")
    out.flush()
    terminal = events[-1]
    if isinstance(terminal, Failed):
        print(f"trio-sampler replay: stream failed: {terminal.error}", file=sys.stderr)
        return 1
    return 0 if isinstance(terminal, Completed) else 1
