"""Wire-layer throughput: our ``replay`` + ``collect`` against the official SDKs.

For each backend a synthetic but realistic 2,000-token stream is built in that backend's
real wire shape (framing and field sets copied from the real-stream corpus, see
``benchmarks/corpus.py``): 1,950 text deltas, then one tool call whose
arguments arrive in 50 fragments, then usage and the backend's terminator. The same bytes,
cut into 4 KiB chunks, are consumed by

* **ours**: ``collect(replay(backend, chunks))``;
* **the official SDK** streaming helper over an in-memory ``httpx2.MockTransport`` serving
  those chunks: ``openai`` ``chat.completions.stream(...)`` / ``responses.stream(...)``, or
  ``anthropic`` ``messages.stream(...)``; every event is iterated, then the final
  completion / response / message is taken;
* **the floor**: split on ``b"\\n\\n"``, strip ``data: ``, ``orjson.loads``; nothing else.

Throughput is SSE events in the body per CPU second, best of N repetitions taken in
turns (see :func:`best_times`; garbage collection stays on: allocation is part of the
cost; a ``gc.collect()`` runs before every timed run). Before timing, each backend's
contenders are checked to agree on the final text and tool-call arguments, so a malformed
synthetic stream cannot pass silently.

A second table measures the SSE decoder alone on the inputs where a naive decoder goes
quadratic (see :func:`measure_decoder`): one huge event read in 16 KiB pieces, and one long
line trickled in 64-byte reads, each at several sizes so the cost per MiB shows whether the
work grows linearly with the bytes received.

Run ``python benchmarks/bench_wire.py`` (``--quick`` for a short run); see
``docs/benchmarks.md``. It prints PASS/FAIL per target and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson

from trio_sampler.types import ApiBackend, ConversationResponse
from trio_sampler.wire import SSEDecoder, collect, replay
from trio_sampler.wire.sse import DEFAULT_MAX_EVENT_BYTES

TEXT_TOKENS = 1950
ARGUMENT_FRAGMENTS = 50
CHUNK_BYTES = 4096
DEFAULT_JSON = Path(__file__).parent / "results" / "bench_wire.json"

#: ours ev/s >= this multiple of the SDK's (per SDK).
TARGET_VS_OPENAI = 20.0
TARGET_VS_ANTHROPIC = 8.0
#: ours time <= this multiple of the floor's time.
TARGET_VS_FLOOR = 3.0
#: one 16 MiB event read in 16 KiB pieces decodes in at most this many CPU seconds.
TARGET_BIG_EVENT_SECONDS = 0.2

MiB = 1024 * 1024
KiB = 1024
#: (case, payload bytes, read size): the decoder's large-input cases.
DECODER_CASES: tuple[tuple[str, int, int], ...] = (
    ("event", 1 * MiB, 16 * KiB),
    ("event", 4 * MiB, 16 * KiB),
    ("event", 16 * MiB, 16 * KiB),
    ("line", 256 * KiB, 64),
    ("line", 1 * MiB, 64),
)

_PROSE = (
    "The weather in Edinburgh is mild today , with light rain expected after noon and"
    " a gentle westerly wind ; temperatures stay near 14 ° C until the evening ."
    " Bring an umbrella if you walk along the Royal Mile , and note that the café"
    " on the corner closes early on Sundays . 🌧️ Overall it is a fine day for"
    " a museum visit or a short hike up Arthur 's Seat"
)
_TOOL_ARGUMENTS = json.dumps(
    {
        "location": "Edinburgh, Scotland",
        "unit": "celsius",
        "days": 7,
        "include": ["hourly", "precipitation", "wind", "uv_index", "air_quality"],
        "notes": "Forecast for a week-long walking trip; flag rain above 5 mm/h.",
        "filters": {"min_temp": 4, "max_temp": 22, "daylight_only": True},
    }
)
_TOOL_NAME = "get_weather_forecast"
_MODEL = "bench-model"


# -- synthetic streams ---------------------------------------------------------------


def text_tokens() -> list[str]:
    """The text deltas: words with their leading space (and a few non-ASCII ones)."""
    words = _PROSE.split()
    return [(" " if i else "") + words[i % len(words)] for i in range(TEXT_TOKENS)]


def argument_fragments() -> list[str]:
    """The tool-call arguments cut into ``ARGUMENT_FRAGMENTS`` pieces."""
    cuts = [len(_TOOL_ARGUMENTS) * i // ARGUMENT_FRAGMENTS for i in range(ARGUMENT_FRAGMENTS + 1)]
    return [_TOOL_ARGUMENTS[a:b] for a, b in itertools.pairwise(cuts)]


def _data(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def chat_completions_body() -> bytes:
    """OpenAI shape: role chunk, content chunks, tool-call chunks, finish, usage, [DONE]."""
    base = {
        "id": "chatcmpl-BENCH0000000000000000000000000",
        "object": "chat.completion.chunk",
        "created": 1727346176,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_7568d46099",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _data({**base, "choices": [choice]})

    parts = [chunk({"role": "assistant", "content": "", "refusal": None})]
    parts += [chunk({"content": token}) for token in text_tokens()]
    call = {
        "index": 0,
        "id": "call_c91SqDXlYFuETYv8mUHzz6pp",
        "type": "function",
        "function": {"name": _TOOL_NAME, "arguments": ""},
    }
    parts.append(chunk({"tool_calls": [call]}))
    for fragment in argument_fragments():
        parts.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}))
    parts.append(chunk({}, "tool_calls"))
    usage = {
        "prompt_tokens": 412,
        "completion_tokens": TEXT_TOKENS + ARGUMENT_FRAGMENTS,
        "total_tokens": 412 + TEXT_TOKENS + ARGUMENT_FRAGMENTS,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    parts.append(_data({**base, "choices": [], "usage": usage}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def responses_body() -> bytes:
    """OpenAI Responses shape: created ... text deltas ... function call ... completed."""
    seq = iter(range(1_000_000))
    text = "".join(text_tokens())
    msg_id = "msg_00592e63e61b66660169fab1bada8481a28ef92eb62c168ead"
    fc_id = "fc_00d64fa806f333310169fab1bf324481a0852cda3180856290"
    call_id = "call_sVidsfFJ6zlzRpelrPkTPlpd"
    usage = {
        "input_tokens": 412,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": TEXT_TOKENS + ARGUMENT_FRAGMENTS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 412 + TEXT_TOKENS + ARGUMENT_FRAGMENTS,
    }

    def response(status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        return {
            "id": "resp_00592e63e61b66660169fab1b9f8e481a2b321356198d7ac1b",
            "object": "response",
            "created_at": 1778037177,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "model": "gpt-5.5-2026-04-23",
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": "low", "summary": None},
            "service_tier": "default",
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 0.98,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    def event(kind: str, **fields: Any) -> bytes:
        return _data({"type": kind, **fields, "sequence_number": next(seq)}, kind)

    part_done = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    message = {
        "id": msg_id,
        "type": "message",
        "status": "completed",
        "content": [part_done],
        "role": "assistant",
    }
    call = {
        "id": fc_id,
        "type": "function_call",
        "status": "completed",
        "arguments": _TOOL_ARGUMENTS,
        "call_id": call_id,
        "name": _TOOL_NAME,
    }
    where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
    parts = [
        event("response.created", response=response("in_progress", [], None)),
        event("response.in_progress", response=response("in_progress", [], None)),
        event(
            "response.output_item.added",
            item={**message, "status": "in_progress", "content": []},
            output_index=0,
        ),
        event(
            "response.content_part.added",
            **where,
            part={**part_done, "text": ""},
        ),
    ]
    for token in text_tokens():
        parts.append(
            event(
                "response.output_text.delta",
                **where,
                delta=token,
                logprobs=[],
                obfuscation="mZhSFjZXJr0X",
            )
        )
    parts += [
        event("response.output_text.done", **where, logprobs=[], text=text),
        event("response.content_part.done", **where, part=part_done),
        event("response.output_item.done", item=message, output_index=0),
        event(
            "response.output_item.added",
            item={**call, "status": "in_progress", "arguments": ""},
            output_index=1,
        ),
    ]
    for fragment in argument_fragments():
        parts.append(
            event(
                "response.function_call_arguments.delta",
                delta=fragment,
                item_id=fc_id,
                obfuscation="ReLAoBL6oNRsXA",
                output_index=1,
            )
        )
    parts += [
        event(
            "response.function_call_arguments.done",
            arguments=_TOOL_ARGUMENTS,
            item_id=fc_id,
            output_index=1,
        ),
        event("response.output_item.done", item=call, output_index=1),
        event("response.completed", response=response("completed", [message, call], usage)),
    ]
    return b"".join(parts)


def messages_body() -> bytes:
    """Anthropic shape: message_start, text block, ping, tool_use block, delta, stop."""
    start: dict[str, Any] = {
        "model": "claude-haiku-4-5-20251001",
        "id": "msg_01T8kTq7cYyYJeQ5DxcVUc6D",
        "type": "message",
        "role": "assistant",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 412,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 2,
            "service_tier": "standard",
        },
    }

    def event(kind: str, **fields: Any) -> bytes:
        return _data({"type": kind, **fields}, kind)

    parts = [
        event("message_start", message=start),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("ping"),
    ]
    for token in text_tokens():
        parts.append(
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": token})
        )
    block = {"type": "tool_use", "id": "toolu_01LtHJmixrs9NcWQkK8hu8hj", "name": _TOOL_NAME}
    parts += [
        event("content_block_stop", index=0),
        event("content_block_start", index=1, content_block={**block, "input": {}}),
    ]
    for fragment in argument_fragments():
        delta = {"type": "input_json_delta", "partial_json": fragment}
        parts.append(event("content_block_delta", index=1, delta=delta))
    usage = {"output_tokens": TEXT_TOKENS + ARGUMENT_FRAGMENTS}
    parts += [
        event("content_block_stop", index=1),
        event(
            "message_delta",
            delta={"stop_reason": "tool_use", "stop_sequence": None},
            usage=usage,
        ),
        event("message_stop"),
    ]
    return b"".join(parts)


BODIES: dict[ApiBackend, Callable[[], bytes]] = {
    ApiBackend.CHAT_COMPLETIONS: chat_completions_body,
    ApiBackend.RESPONSES: responses_body,
    ApiBackend.MESSAGES: messages_body,
}


def split_chunks(body: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def count_events(body: bytes) -> int:
    """SSE events in the body (every block of lines carrying ``data:``)."""
    return sum(1 for block in body.split(b"\n\n") if b"data:" in block)


# -- contenders: each consumes the chunks and returns (text, tool arguments) -------------

Outcome = tuple[str, str]


def ours(backend: ApiBackend, chunks: list[bytes]) -> Outcome:
    response: ConversationResponse = collect(replay(backend, chunks))
    assistant = response.assistant
    return assistant.content, assistant.tool_calls[0].arguments if assistant.tool_calls else ""


def floor(chunks: list[bytes]) -> int:
    """Bytes split + JSON parse, nothing else; returns the number of payloads parsed."""
    loads = orjson.loads
    buffer = b""
    parsed = 0
    for chunk in chunks:
        buffer += chunk
        blocks = buffer.split(b"\n\n")
        buffer = blocks.pop()
        for block in blocks:
            for line in block.split(b"\n"):
                if line[:6] == b"data: " and line[6:7] != b"[":
                    loads(line[6:])
                    parsed += 1
    return parsed


def _mock_client(chunks: list[bytes]) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(chunks)
        )

    return httpx2.Client(transport=httpx2.MockTransport(handler))


class OpenAIChat:
    def __init__(self, chunks: list[bytes]) -> None:
        self.client = openai.OpenAI(
            api_key="sk-bench", base_url="http://bench.invalid/v1", http_client=_mock_client(chunks)
        )

    def __call__(self) -> Outcome:
        with self.client.chat.completions.stream(
            model=_MODEL, messages=[{"role": "user", "content": "weather?"}]
        ) as stream:
            for _ in stream:
                pass
            message = stream.get_final_completion().choices[0].message
        calls = message.tool_calls or []
        return message.content or "", calls[0].function.arguments if calls else ""


class OpenAIResponses:
    def __init__(self, chunks: list[bytes]) -> None:
        self.client = openai.OpenAI(
            api_key="sk-bench", base_url="http://bench.invalid/v1", http_client=_mock_client(chunks)
        )

    def __call__(self) -> Outcome:
        with self.client.responses.stream(model=_MODEL, input="weather?") as stream:
            for _ in stream:
                pass
            response = stream.get_final_response()
        arguments = ""
        for item in response.output:
            if item.type == "function_call":
                arguments = item.arguments
        return response.output_text, arguments


class AnthropicMessages:
    def __init__(self, chunks: list[bytes]) -> None:
        self.client = anthropic.Anthropic(
            api_key="sk-bench", base_url="http://bench.invalid", http_client=_mock_client(chunks)
        )

    def __call__(self) -> Outcome:
        with self.client.messages.stream(
            model=_MODEL, max_tokens=4096, messages=[{"role": "user", "content": "weather?"}]
        ) as stream:
            for _ in stream:
                pass
            message = stream.get_final_message()
        text = "".join(block.text for block in message.content if block.type == "text")
        arguments = ""
        for block in message.content:
            if block.type == "tool_use":
                arguments = json.dumps(block.input)
        return text, arguments


# -- the decoder on large inputs --------------------------------------------------------


def big_event_body(size: int, case: str) -> bytes:
    """One SSE event of exactly ``size`` bytes (its lines and their line ends).

    ``"event"``: a Messages ``input_json_delta`` whose ``partial_json`` is one huge string,
    then the blank line, as a server sends a very large tool argument in one event.
    ``"line"``: a single ``data:`` line, and nothing after it but its line end and the
    blank line, as a server trickling one long line sends it.
    """
    if case == "event":
        head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
        head += b'"delta":{"type":"input_json_delta","partial_json":"'
        tail = b'"}}\n'
    else:
        head = b"data: "
        tail = b"\n"
    filler = size - len(head) - len(tail) - 1  # the blank line ends the body
    return (
        head
        + (b"abcdefghijklmnopqrstuvwxyz0123456789" * (filler // 36 + 1))[:filler]
        + tail
        + b"\n"
    )


def decode_all(chunks: Sequence[bytes]) -> int:
    """Feed every chunk to a fresh decoder, close it; returns the data length of the event."""
    decoder = SSEDecoder(DEFAULT_MAX_EVENT_BYTES)
    feed = decoder.feed
    events = []
    for chunk in chunks:
        events += feed(chunk)
    events += decoder.close()
    if len(events) != 1:
        raise SystemExit(f"the decoder produced {len(events)} events instead of one")
    return len(events[0].data)


def measure_decoder(case: str, size: int, read: int, repeat: int) -> dict[str, Any]:
    """CPU seconds to decode one ``size``-byte event fed in ``read``-byte pieces.

    The decoder keeps its default size bound; the 16 MiB event is as large as that bound
    lets one event be, so the bound's bookkeeping is part of what is measured.
    """
    body = big_event_body(size, case)
    chunks = split_chunks(body, read)
    expected = len(body.split(b"\n")[-3]) - len(b"data: ")  # the data line, less its field
    if decode_all(chunks) != expected:
        raise SystemExit(f"{case} of {size} bytes: the decoded data has the wrong length")
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        decode_all(chunks)
        best = min(best, time.process_time() - start)
    row: dict[str, Any] = {
        "case": case,
        "bytes": len(body),
        "read_bytes": read,
        "reads": len(chunks),
        "seconds": best,
        "seconds_per_mib": best / (len(body) / MiB),
    }
    if case == "event" and size == 16 * MiB:
        row["targets"] = {
            f"cpu <= {TARGET_BIG_EVENT_SECONDS:g} s": {
                "value": best,
                "pass": best <= TARGET_BIG_EVENT_SECONDS,
            }
        }
    return row


def decoder_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ("input", "bytes", "read size", "reads", "CPU s", "CPU ms per MiB")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        what = "one event" if row["case"] == "event" else "one line"
        lines.append(
            "| "
            + " | ".join(
                (
                    what,
                    f"{row['bytes'] / MiB:g} MiB",
                    f"{row['read_bytes']:,} B",
                    f"{row['reads']:,}",
                    f"{row['seconds']:.3f}",
                    f"{row['seconds_per_mib'] * 1000:.1f}",
                )
            )
            + " |"
        )
    return "\n".join(lines)


# -- measurement -----------------------------------------------------------------------


def best_times(contenders: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best CPU time of ``repeat`` runs per contender, after one untimed warm-up each.

    CPU time of this process (``time.process_time``), not wall time, so other work on a
    shared machine does not count against whoever happened to run during it; the
    contenders take turns within each repetition so they see the same conditions.
    """
    for run in contenders.values():
        run()
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeat):
        for name, run in contenders.items():
            gc.collect()
            start = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - start)
    return best


def _same_arguments(a: str, b: str) -> bool:
    return bool(a) and json.loads(a) == json.loads(b)


def measure(backend: ApiBackend, repeat: int) -> dict[str, Any]:
    body = BODIES[backend]()
    chunks = split_chunks(body)
    events = count_events(body)
    sdk_name = "anthropic" if backend is ApiBackend.MESSAGES else "openai"
    sdk: Callable[[], Outcome]
    if backend is ApiBackend.CHAT_COMPLETIONS:
        sdk = OpenAIChat(chunks)
    elif backend is ApiBackend.RESPONSES:
        sdk = OpenAIResponses(chunks)
    else:
        sdk = AnthropicMessages(chunks)

    # Agreement first: a wrong synthetic stream must fail loudly, not benchmark nonsense.
    our_text, our_args = ours(backend, chunks)
    sdk_text, sdk_args = sdk()
    expected = "".join(text_tokens())
    if our_text != expected or sdk_text != expected:
        raise SystemExit(f"{backend.value}: text differs between contenders")
    if not (_same_arguments(our_args, _TOOL_ARGUMENTS) and _same_arguments(sdk_args, our_args)):
        raise SystemExit(f"{backend.value}: tool arguments differ between contenders")
    if floor(chunks) != events - (1 if backend is ApiBackend.CHAT_COMPLETIONS else 0):
        raise SystemExit(f"{backend.value}: the floor parsed an unexpected number of events")

    times = best_times(
        {"ours": lambda: ours(backend, chunks), "sdk": sdk, "floor": lambda: floor(chunks)},
        repeat,
    )
    target = TARGET_VS_ANTHROPIC if sdk_name == "anthropic" else TARGET_VS_OPENAI
    ratio_sdk = times["sdk"] / times["ours"]
    ratio_floor = times["ours"] / times["floor"]
    return {
        "backend": backend.value,
        "body_bytes": len(body),
        "chunks": len(chunks),
        "events": events,
        "sdk": sdk_name,
        "seconds": times,
        "events_per_second": {name: events / seconds for name, seconds in times.items()},
        "ours_over_sdk": ratio_sdk,
        "ours_time_over_floor": ratio_floor,
        "targets": {
            f"ours >= {target:g}x {sdk_name} SDK": {
                "value": ratio_sdk,
                "pass": ratio_sdk >= target,
            },
            f"ours time <= {TARGET_VS_FLOOR:g}x floor": {
                "value": ratio_floor,
                "pass": ratio_floor <= TARGET_VS_FLOOR,
            },
        },
    }


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "openai": openai.__version__,
        "anthropic": anthropic.__version__,
        "httpx2": httpx2.__version__,
        "orjson": orjson.__version__,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = (
        "backend",
        "ours ev/s",
        "openai SDK ev/s",
        "anthropic SDK ev/s",
        "floor ev/s",
        "ours/SDK ratio",
        "ours time / floor time",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        rate = row["events_per_second"]
        sdk = f"{rate['sdk']:,.0f}"
        lines.append(
            "| "
            + " | ".join(
                (
                    row["backend"],
                    f"{rate['ours']:,.0f}",
                    sdk if row["sdk"] == "openai" else "—",
                    sdk if row["sdk"] == "anthropic" else "—",
                    f"{rate['floor']:,.0f}",
                    f"{row['ours_over_sdk']:.1f}×",
                    f"{row['ours_time_over_floor']:.2f}×",
                )
            )
            + " |"
        )
    return "\n".join(lines)


def run(*, quick: bool = False, repeat: int | None = None) -> dict[str, Any]:
    """Measure every backend; returns the JSON-ready result (used by ``main``)."""
    n = repeat if repeat is not None else (3 if quick else 7)
    rows = [measure(backend, n) for backend in BODIES]
    decoder_repeat = 1 if quick else 3
    decoder_rows = [
        measure_decoder(case, size, read, decoder_repeat) for case, size, read in DECODER_CASES
    ]
    return {
        "benchmark": "bench_wire",
        "machine": machine(),
        "settings": {
            "text_tokens": TEXT_TOKENS,
            "argument_fragments": ARGUMENT_FRAGMENTS,
            "chunk_bytes": CHUNK_BYTES,
            "repeat": n,
            "quick": quick,
            "clock": "process_time (CPU seconds)",
        },
        "targets": {
            "ours_over_openai_sdk_min": TARGET_VS_OPENAI,
            "ours_over_anthropic_sdk_min": TARGET_VS_ANTHROPIC,
            "ours_time_over_floor_max": TARGET_VS_FLOOR,
            "big_event_seconds_max": TARGET_BIG_EVENT_SECONDS,
        },
        "results": rows,
        "decoder": {"repeat": decoder_repeat, "results": decoder_rows},
    }


def _iter_verdicts(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    for row in rows:
        where = row.get("backend") or f"{row['bytes'] / MiB:g} MiB {row['case']}"
        for name, verdict in row.get("targets", {}).items():
            mark = "PASS" if verdict["pass"] else "FAIL"
            yield f"{mark}  {where:<17} {name}: {verdict['value']:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else "")
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (3 instead of 7; decoder: 1)"
    )
    parser.add_argument("--repeat", type=int, help="repetitions per contender (best is kept)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument("--no-json", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, repeat=args.repeat)
    info = result["machine"]
    print(
        f"Python {info['python']}, {info['cpu_count']} CPUs; "
        f"{TEXT_TOKENS} text deltas + {ARGUMENT_FRAGMENTS} argument fragments, "
        f"{CHUNK_BYTES}-byte chunks, best of {result['settings']['repeat']}"
    )
    print(table(result["results"]))
    print()
    print(f"SSE decoder alone, best of {result['decoder']['repeat']}:")
    print(decoder_table(result["decoder"]["results"]))
    for line in _iter_verdicts([*result["results"], *result["decoder"]["results"]]):
        print(line)
    if not args.no_json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    missed = [
        name for row in result["results"] for name, v in row["targets"].items() if not v["pass"]
    ]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
