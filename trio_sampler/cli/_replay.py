"""``trio-sampler replay FILE --backend B [--events]``: a recorded body through the wire layer."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from ..recording import Cassette, CassetteError, is_cassette_line
from ..types import (
    ApiBackend,
    Completed,
    ConversationResponse,
    Failed,
    SamplingEvent,
    to_jsonable,
)
from ..wire import collect, new_transform, replay
from ..wire._replay import decode_failure
from ..wire.sse import SSEDecodeError, SSEDecoder, SSEEventTooLarge
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
    parser.add_argument(
        "file",
        help="the recorded body (raw bytes as received), or a cassette (trio-sampler record); "
        "- for stdin",
    )
    parser.add_argument(
        "--backend",
        type=backend_choice,
        choices=[b.value for b in ApiBackend],
        help="the wire protocol the body speaks (a cassette says it itself)",
    )
    parser.add_argument("--events", action="store_true", help="print every event, one per line")
    parser.add_argument(
        "--timing",
        choices=["fast", "original"],
        default="fast",
        help="a cassette's reads at once (fast, the default) or each at its recorded time",
    )
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
    if is_cassette_line(body.split(b"\n", 1)[0]):
        return _replay_cassette(args, body)
    if args.backend is None:
        spoken = sniff_backend(body)
        hint = f" (this one looks like --backend {spoken.value})" if spoken is not None else ""
        raise UsageError(f"--backend is required for a recorded body{hint}")
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


def _replay_cassette(args: argparse.Namespace, text: bytes) -> int:
    """Every exchange of a cassette through the wire layer, in order; exit 1 if one failed."""
    try:
        exchanges = Cassette.parse(text, args.file).exchanges
    except CassetteError as exc:
        raise UsageError(str(exc)) from None
    status = 0
    for number, exchange in enumerate(exchanges, start=1):
        where = f"exchange {number} ({exchange.method} {exchange.url})"
        backend = exchange.backend or (ApiBackend(args.backend) if args.backend else None)
        if backend is None:
            raise UsageError(f"{where}: not an API path this knows; pass --backend")
        if exchange.status >= 400:
            detail = exchange.body[:300].decode("utf-8", errors="replace")
            message = f"trio-sampler replay: {where}: HTTP {exchange.status}: {detail}"
            print(message, file=sys.stderr)
            status = 1
            continue
        try:
            chunks = exchange.decoded_chunks()
        except CassetteError as exc:
            raise UsageError(f"{where}: {exc}") from None
        events = _paced(backend, chunks, dict(exchange.response_headers), args)
        if not isinstance(events[-1], Completed):
            status = 1
    return status


def _paced(
    backend: ApiBackend,
    chunks: list[tuple[float, bytes]],
    headers: dict[str, str],
    args: argparse.Namespace,
) -> list[SamplingEvent]:
    """One recorded body through the wire layer (as :func:`~trio_sampler.wire.replay` does),
    printed; with ``--timing original`` each read is fed, and its events printed, at its
    recorded time."""
    original = args.timing == "original"
    transform = new_transform(backend, "replay")
    decoder = SSEDecoder()
    events = transform.start(headers)
    _print(events, args)
    started = time.monotonic()
    try:
        for at, data in chunks:
            if original:
                time.sleep(max(0.0, started + at - time.monotonic()))
            new = transform.feed_payloads(decoder.feed_payloads(data))
            events += _print(new, args)
            if transform.finished:
                break
        else:
            events += _print(transform.feed_payloads(decoder.close_payloads()), args)
            events += _print(transform.close(), args)
    except SSEDecodeError as exc:
        events += _print(transform.abort(decode_failure(exc)), args)
    if not args.events:
        summary = response_summary(collect(events))
        sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()
    terminal = events[-1]
    if isinstance(terminal, Failed):
        print(f"trio-sampler replay: stream failed: {terminal.error}", file=sys.stderr)
    return events


def _print(events: list[SamplingEvent], args: argparse.Namespace) -> list[SamplingEvent]:
    if args.events:
        out = sys.stdout.buffer
        for event in events:
            out.write(orjson.dumps(to_jsonable(event)) + b"\n")
        out.flush()
    return events
