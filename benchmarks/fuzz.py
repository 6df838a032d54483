"""Fuzzing of everything that parses untrusted bytes, with fast structured generators.

Targets (each checks its own contract; anything else escaping is a finding):

* ``sse``: :class:`SSEDecoder` on SSE-shaped random bytes with a small event bound. Only
  :class:`SSEDecodeError` may be raised, and feeding whole or split anywhere gives the same
  events (or the same error).
* ``replay_chat_completions``, ``replay_responses``, ``replay_messages``: the three
  transforms via :func:`trio_sampler.wire.replay` on mutated real bodies (event-level
  mutations of emulator-rendered streams, JSON value mutations, byte flips, truncation).
  Never raises; exactly one terminal, and it is last; never an ``internal`` error (malformed
  data is caught by explicit validation); split-invariant.
* ``http_error``: :func:`classify_http_error` on arbitrary status, headers and body. Never
  raises; the message is bounded; ``retry_after`` is ``None`` or finite and >= 0.
* ``stream_error``: :func:`classify_stream_error` on arbitrary JSON objects. Never raises.
* ``parse_chat_completions``, ``parse_responses``, ``parse_messages``:
  :func:`trio_sampler.wire.parse_request` on mutated valid bodies, arbitrary JSON and raw
  bytes. Only ``ValueError`` may be raised.

Usage::

    python benchmarks/fuzz.py --n 1000000               # every target, 10^6 inputs each
    python benchmarks/fuzz.py --n 20000 --target sse --seed 3
    python benchmarks/fuzz.py --n 1000000 --jobs 2 --json benchmarks/results/fuzz.json

Exit status is non-zero when any target had a finding. The generators are also used by
``tests/fuzz/test_fuzz.py`` (driven by hypothesis's ``randoms()``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from trio_sampler.types import ApiBackend, Cancelled, Completed, Failed, SamplingErrorKind
from trio_sampler.wire import (
    ServerSentEvent,
    SSEDecodeError,
    SSEDecoder,
    classify_stream_error,
    parse_request,
    replay,
)
from trio_sampler.wire.errors import MAX_USER_MESSAGE_CHARS, classify_http_error

__all__ = [
    "TARGETS",
    "Finding",
    "check_http_error",
    "check_parse_request",
    "check_replay",
    "check_sse",
    "check_stream_error",
    "gen_http_error",
    "gen_parse_body",
    "gen_replay_body",
    "gen_sse_bytes",
    "gen_stream_error",
    "run_target",
]

_TERMINALS = (Completed, Failed, Cancelled)
_BACKENDS = {
    "chat_completions": ApiBackend.CHAT_COMPLETIONS,
    "responses": ApiBackend.RESPONSES,
    "messages": ApiBackend.MESSAGES,
}


class Finding(AssertionError):
    """A target broke its contract for one input."""


# -- random values -----------------------------------------------------------------------

_NASTY_STRINGS = (
    "",
    " ",
    "null",
    "[DONE]",
    "0",
    "-1",
    "1e309",
    "NaN",
    "\u2028",
    "\u0000",
    "\ufeff",
    "é",
    "🙂",
    "a" * 300,
    "<html><body>x</body></html>",
    "sk-ant-LEAK0123456789",
    "Bearer abcdefgh",
    "{}",
)


def rand_str(rng: random.Random, vocab: Sequence[str] = ()) -> str:
    r = rng.random()
    if vocab and r < 0.45:
        return rng.choice(vocab)
    if r < 0.7:
        return rng.choice(_NASTY_STRINGS)
    n = rng.choice((1, 2, 5, 20))
    return "".join(
        chr(rng.choice((rng.randint(32, 126), rng.randint(0, 0xD7FF)))) for _ in range(n)
    )


def rand_scalar(rng: random.Random, vocab: Sequence[str] = ()) -> Any:
    r = rng.randrange(9)
    if r == 0:
        return None
    if r == 1:
        return rng.random() < 0.5
    if r == 2:
        return rng.choice((0, 1, -1, 2**31, 2**63 - 1, -(2**63), 16, 1024, 10**18))
    if r == 3:
        return rng.choice((0.5, -0.0, 1e308, -1e-300, 3.14))
    return rand_str(rng, vocab)


def rand_json(rng: random.Random, vocab: Sequence[str] = (), depth: int = 3) -> Any:
    r = rng.random()
    if depth <= 0 or r < 0.5:
        return rand_scalar(rng, vocab)
    if r < 0.75:
        return [rand_json(rng, vocab, depth - 1) for _ in range(rng.randint(0, 4))]
    return {
        rand_str(rng, vocab): rand_json(rng, vocab, depth - 1) for _ in range(rng.randint(0, 5))
    }


def mutate_json(value: Any, rng: random.Random, vocab: Sequence[str], rate: float = 0.08) -> Any:
    """A copy of ``value`` with a few random changes (replace, delete, add, retype)."""
    if rng.random() < rate:
        return rand_json(rng, vocab, 2)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, child in value.items():
            if rng.random() < rate / 2:
                continue  # delete
            out[key] = mutate_json(child, rng, vocab, rate)
        if rng.random() < rate:
            out[rand_str(rng, vocab)] = rand_json(rng, vocab, 2)
        return out
    if isinstance(value, list):
        items = [mutate_json(child, rng, vocab, rate) for child in value if rng.random() > rate / 2]
        if items and rng.random() < rate:
            items.append(rng.choice(items))
        return items
    return value


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # e.g. a lone surrogate or a huge int
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            buf[pos:pos] = rng.choice(
                (b"\r", b"\n", b"\r\n", b"\n\n", b":", b"data: ", b"\xff", b"\xc3", b"\xef\xbb\xbf")
            )
        elif op == 2:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 3:
            del buf[pos:]
        elif op == 4 and buf:
            start = rng.randint(0, len(buf) - 1)
            buf[pos:pos] = buf[start : start + rng.randint(1, 64)]
        else:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(buf)


def split(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random points (sometimes byte by byte)."""
    if len(data) < 2:
        return [data]
    if rng.random() < 0.05 and len(data) < 4000:
        return [data[i : i + 1] for i in range(len(data))]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


# -- seeds -------------------------------------------------------------------------------


class Seeds:
    """Valid bodies to mutate: streamed responses and request bodies per backend."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.responses: dict[str, list[list[tuple[str, str]]]] = {
            backend: [[(e, d) for e, d in body] for body in bodies]
            for backend, bodies in data["responses"].items()
        }
        self.requests: dict[str, list[Any]] = data["requests"]
        words: set[str] = set()

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                for key, child in value.items():
                    words.add(key)
                    walk(child)
            elif isinstance(value, list):
                for child in value:
                    walk(child)
            elif isinstance(value, str) and len(value) < 40:
                words.add(value)

        for bodies in self.responses.values():
            for body in bodies:
                for event, payload in body:
                    words.add(event)
                    try:
                        walk(orjson.loads(payload))
                    except orjson.JSONDecodeError:
                        pass
        walk(self.requests)
        self.vocab = tuple(sorted(words))

    @classmethod
    def load(cls) -> Seeds:
        """The seeds, rendered once per process (about a second)."""
        global _LOADED
        if _LOADED is None:
            _LOADED = cls(_render_seeds())
        return _LOADED


_LOADED: Seeds | None = None


def _render_seeds() -> dict[str, Any]:
    """Render seed bodies with the emulator (in memory) and the request builders."""
    import httpx2
    import trio

    from trio_sampler.config import SamplerConfig
    from trio_sampler.testing import EmulatorTransport, script_headers
    from trio_sampler.types import (
        Assistant,
        ConversationRequest,
        ImagePart,
        ReasoningEffort,
        System,
        TextPart,
        ToolCall,
        ToolResult,
        ToolSpec,
        User,
    )
    from trio_sampler.wire import build_request

    tool = ToolSpec(
        name="search",
        description="Search",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    )
    requests = [
        ConversationRequest(items=[User("hi")]),
        ConversationRequest(
            items=[
                System("be brief"),
                User([TextPart("look"), ImagePart("https://example.com/a.png", detail="low")]),
                Assistant("", tool_calls=[ToolCall("call_1", "search", '{"q": "trio"}')]),
                ToolResult("call_1", "found"),
                User("thanks"),
            ],
            tools=[tool],
            temperature=0.5,
            max_output_tokens=4096,
            reasoning_effort=ReasoningEffort.MEDIUM,
            stop_sequences=["END"],
            metadata={"k": "v"},
        ),
    ]
    scripts: list[dict[str, Any]] = [
        {"text": "Hello there, world."},
        {"text": "Let me check.", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]},
        {"text": "Thinking done.", "reasoning": "Step one. Step two.", "chunk_chars": 3},
        {"text": "Found it.", "hosted_tool": {"name": "web_search", "query": "trio"}},
        {"text": "cut", "stop": "length"},
        {"text": "no", "stop": "content_filter"},
        {"text": "x", "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 4}},
        {"text": "err", "faults": [{"type": "stream_error", "after_events": 2}]},
        {"text": "bad", "faults": [{"type": "malformed", "after_events": 1}]},
        {"text": "", "faults": [{"type": "empty"}]},
    ]
    out: dict[str, Any] = {"responses": {}, "requests": {}}

    async def render() -> None:
        async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
            for name, backend in _BACKENDS.items():
                config = SamplerConfig(
                    base_url="http://emulator.local/v1", backend=backend, model="fuzz-model"
                )
                wires = [build_request(backend, r, config.build_options()) for r in requests]
                out["requests"][name] = [orjson.loads(w.body) for w in wires]
                bodies: list[list[tuple[str, str]]] = []
                for script in scripts:
                    wire = wires[1] if script.get("tool_calls") else wires[0]
                    response = await client.post(
                        f"{config.base_url}/{wire.path.lstrip('/')}",
                        content=wire.body,
                        headers={**dict(wire.headers), **script_headers(**script)},
                    )
                    decoder = SSEDecoder()
                    events = decoder.feed(response.content) + decoder.close()
                    bodies.append([(e.event, e.data) for e in events])
                out["responses"][name] = bodies

    trio.run(render)
    return out


def encode_events(events: Sequence[tuple[str, str]]) -> bytes:
    parts: list[str] = []
    for event, data in events:
        if event != "message":
            parts.append(f"event: {event}\n")
        parts.extend(f"data: {line}\n" for line in data.split("\n"))
        parts.append("\n")
    return "".join(parts).encode("utf-8", "surrogatepass")


# -- generators --------------------------------------------------------------------------

_SSE_TOKENS = (
    b"data:",
    b"data: ",
    b"event: ",
    b"id: ",
    b"id: \x00x",
    b"retry: ",
    b"retry: 100",
    b":",
    b": ping",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\xef\xbb\xbf",
    b"\xff",
    b"\xc3\xa9",
    b"\xe2\x80\xa8",
    b"{}",
    b"x",
    b"data",
    b"field",
)


def gen_sse_bytes(rng: random.Random) -> tuple[bytes, int]:
    """SSE-shaped bytes and a small event bound."""
    if rng.random() < 0.2:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    else:
        data = b"".join(
            rng.choice(_SSE_TOKENS) if rng.random() < 0.8 else b"y" * rng.randint(1, 300)
            for _ in range(rng.randint(0, 60))
        )
    return data, rng.choice((8, 64, 256, 4096, 1 << 20))


def gen_replay_body(rng: random.Random, seeds: Seeds, backend: str) -> bytes:
    """A mutated stream body for ``backend``."""
    events = list(rng.choice(seeds.responses[backend]))
    others = [e for bodies in seeds.responses.values() for body in bodies for e in body]
    for _ in range(rng.randint(0, 4)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(events))
        if op == 0 and events:
            del events[min(pos, len(events) - 1)]
        elif op == 1 and events:
            events.insert(pos, rng.choice(events))
        elif op == 2:
            events.insert(pos, rng.choice(others))
        elif op == 3 and len(events) > 1:
            i, j = rng.randrange(len(events)), rng.randrange(len(events))
            events[i], events[j] = events[j], events[i]
        elif op == 4 and events:
            i = min(pos, len(events) - 1)
            name, data = events[i]
            try:
                mutated = dumps(mutate_json(orjson.loads(data), rng, seeds.vocab, 0.15))
                events[i] = (name, mutated.decode("utf-8", "surrogatepass"))
            except orjson.JSONDecodeError:
                events[i] = (name, rand_str(rng, seeds.vocab))
        elif op == 5 and events:
            i = min(pos, len(events) - 1)
            events[i] = (rand_str(rng, seeds.vocab), events[i][1])
        else:
            events.insert(pos, ("message", dumps(rand_json(rng, seeds.vocab)).decode()))
    body = encode_events(events)
    if rng.random() < 0.3:
        body = mutate_bytes(body, rng)
    return body


_HEADER_NAMES = (
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "x-request-id",
    "request-id",
    "date",
    "x-ratelimit-remaining-requests",
    "anthropic-ratelimit-tokens-reset",
    "content-type",
    "Retry-After",
)
_HEADER_VALUES = (
    "1",
    "0",
    "-5",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "99999999999999999999",
    "true",
    "false",
    " TRUE ",
    "Wed, 21 Oct 2015 07:28:00 GMT",
    "Mon, 01 Jan 1 00:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Thu, 01 Jan 1970 00:00:00 +9999",
    "Tue, 15 Nov 1994 08:12:31 -2400",
    "garbage",
    "",
    "\x00\x01",
    "é",
    "sk-LEAKCHECK-0123456789",
)


def gen_http_error(rng: random.Random, seeds: Seeds) -> tuple[int, list[tuple[str, str]], bytes]:
    status = rng.choice(
        (
            rng.randint(100, 599),
            rng.choice((400, 401, 403, 404, 408, 409, 413, 429, 500, 503, 525, 529)),
            rng.randint(-10, 10**6),
        )
    )
    headers = [
        (
            rng.choice(_HEADER_NAMES) if rng.random() < 0.85 else rand_str(rng),
            rng.choice(_HEADER_VALUES) if rng.random() < 0.8 else rand_str(rng, seeds.vocab),
        )
        for _ in range(rng.randint(0, 5))
    ]
    r = rng.random()
    if r < 0.5:
        shape = rng.choice(
            (
                {"error": {"message": "m", "type": "t", "code": "c", "param": None}},
                {"type": "error", "error": {"type": "overloaded_error", "message": "m"}},
                {"error": "text", "request_id": "req_1"},
            )
        )
        body = dumps(mutate_json(shape, rng, seeds.vocab, 0.3))
    elif r < 0.7:
        body = dumps(rand_json(rng, seeds.vocab))
    elif r < 0.85:
        body = rand_str(rng, seeds.vocab).encode("utf-8", "surrogatepass")
    else:
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 100)))
    if rng.random() < 0.2:
        body = mutate_bytes(body, rng)
    return status, headers, body


def gen_stream_error(rng: random.Random, seeds: Seeds) -> dict[Any, Any]:
    shape = rng.choice(
        (
            {"error": {"message": "m", "type": "server_error", "code": None, "param": None}},
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"type": "response.failed", "response": {"error": {"code": "x", "message": "y"}}},
            {},
        )
    )
    value = mutate_json(shape, rng, seeds.vocab, 0.3)
    if not isinstance(value, dict):
        value = {"error": value}
    return value


def gen_parse_body(rng: random.Random, seeds: Seeds, backend: str) -> bytes | dict[Any, Any]:
    r = rng.random()
    if r < 0.7:
        value = mutate_json(rng.choice(seeds.requests[backend]), rng, seeds.vocab, 0.1)
    elif r < 0.85:
        value = rand_json(rng, seeds.vocab, 4)
    else:
        value = None
    if value is None:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if isinstance(value, dict) and rng.random() < 0.5:
        return value
    body = dumps(value)
    return mutate_bytes(body, rng) if rng.random() < 0.1 else body


# -- checks ------------------------------------------------------------------------------


def _events_key(events: Sequence[Any]) -> Any:
    return [repr(e) for e in events]


def check_sse(data: bytes, limit: int, chunks: Sequence[bytes]) -> None:
    def run(parts: Sequence[bytes]) -> tuple[str, Any]:
        decoder = SSEDecoder(limit)
        out: list[ServerSentEvent] = []
        try:
            for part in parts:
                out.extend(decoder.feed(part))
            out.extend(decoder.close())
        except SSEDecodeError as exc:
            return ("error", type(exc).__name__)
        return ("ok", [(e.event, e.data, e.id, e.retry) for e in out])

    whole = run([data])
    pieces = run(chunks)
    if whole != pieces:
        raise Finding(f"SSE not split-invariant: whole={whole!r} split={pieces!r}")


def check_replay(backend: str, body: bytes, chunks: Sequence[bytes]) -> None:
    events = replay(_BACKENDS[backend], body, request_id="fuzz")
    terminals = [e for e in events if isinstance(e, _TERMINALS)]
    if len(terminals) != 1 or events[-1] is not terminals[0]:
        raise Finding(f"{len(terminals)} terminals, last={events[-1]!r}")
    end = terminals[0]
    if isinstance(end, Failed) and end.error.kind is SamplingErrorKind.INTERNAL:
        # Malformed provider data must be caught by explicit validation, not by accident.
        raise Finding(f"provider data reached an internal error: {end.error.message}")
    again = replay(_BACKENDS[backend], chunks, request_id="fuzz")
    if _events_key(events) != _events_key(again):
        raise Finding("replay is not split-invariant")


def check_http_error(status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    info = classify_http_error(status, headers, body, now=1_700_000_000.0)
    if not isinstance(info.kind, SamplingErrorKind) or not isinstance(info.message, str):
        raise Finding(f"bad info {info!r}")
    if len(info.message) > MAX_USER_MESSAGE_CHARS + 1:
        raise Finding(f"message not bounded: {len(info.message)} chars")
    if info.retry_after is not None and not (
        math.isfinite(info.retry_after) and info.retry_after >= 0
    ):
        raise Finding(f"retry_after {info.retry_after!r}")
    # ``rate_limit`` holds rate-limit headers as sent, by design; everything else is cleaned.
    shown = (info.message, info.error_type, info.error_code, info.provider_request_id)
    if any("LEAKCHECK" in (text or "") for text in shown):
        raise Finding(f"a key-shaped value survived: {info!r}")


def check_stream_error(payload: dict[Any, Any]) -> None:
    info = classify_stream_error(payload)
    if not isinstance(info.kind, SamplingErrorKind) or not isinstance(info.message, str):
        raise Finding(f"bad info {info!r}")


def check_parse_request(backend: str, body: bytes | dict[Any, Any]) -> None:
    try:
        parse_request(_BACKENDS[backend], body)
    except ValueError:
        pass


# -- running -----------------------------------------------------------------------------

TARGETS = (
    "sse",
    "replay_chat_completions",
    "replay_responses",
    "replay_messages",
    "http_error",
    "stream_error",
    "parse_chat_completions",
    "parse_responses",
    "parse_messages",
)


def _case(
    target: str, rng: random.Random, seeds: Seeds
) -> tuple[Callable[..., None], tuple[Any, ...]]:
    if target == "sse":
        data, limit = gen_sse_bytes(rng)
        return check_sse, (data, limit, split(data, rng))
    if target.startswith("replay_"):
        backend = target.removeprefix("replay_")
        body = gen_replay_body(rng, seeds, backend)
        return check_replay, (backend, body, split(body, rng))
    if target == "http_error":
        return check_http_error, gen_http_error(rng, seeds)
    if target == "stream_error":
        return check_stream_error, (gen_stream_error(rng, seeds),)
    backend = target.removeprefix("parse_")
    return check_parse_request, (backend, gen_parse_body(rng, seeds, backend))


def run_target(
    target: str, n: int, seed: int, *, max_seconds: float | None = None
) -> dict[str, Any]:
    """Run ``n`` inputs (or until ``max_seconds``) and return counts and findings."""
    seeds = Seeds.load()
    rng = random.Random(f"{target}:{seed}")
    findings: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    done = 0
    for done in range(1, n + 1):
        case_seed = rng.getrandbits(64)
        check, args = _case(target, random.Random(case_seed), seeds)
        try:
            check(*args)
        except Exception as exc:
            key = f"{type(exc).__name__}: {str(exc)[:120]}"
            where = traceback.extract_tb(exc.__traceback__)[-1]
            key = f"{key} @ {Path(where.filename).name}:{where.lineno}"
            entry = findings.setdefault(key, {"count": 0, "case_seed": case_seed, "args": None})
            entry["count"] += 1
            if entry["args"] is None:
                entry["args"] = repr(args)[:2000]
        if (
            max_seconds is not None
            and done % 256 == 0
            and time.perf_counter() - started > max_seconds
        ):
            break
    elapsed = time.perf_counter() - started
    return {
        "target": target,
        "inputs": done,
        "seed": seed,
        "elapsed_s": round(elapsed, 1),
        "inputs_per_s": round(done / elapsed) if elapsed > 0 else None,
        "findings": findings,
    }


def reproduce(target: str, case_seed: int) -> tuple[Callable[..., None], tuple[Any, ...]]:
    """The check and arguments of one input, from its ``case_seed`` in a report."""
    return _case(target, random.Random(case_seed), Seeds.load())


def _run_one(job: tuple[str, int, int, float | None]) -> dict[str, Any]:
    target, n, seed, max_seconds = job
    return run_target(target, n, seed, max_seconds=max_seconds)


def iter_results(
    targets: Sequence[str], n: int, seed: int, jobs: int, max_seconds: float | None
) -> Iterator[dict[str, Any]]:
    work = [(t, n, seed, max_seconds) for t in targets]
    if jobs <= 1:
        yield from map(_run_one, work)
        return
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        yield from pool.imap_unordered(_run_one, work)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="inputs per target")
    parser.add_argument("--target", action="append", choices=TARGETS, help="default: all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="processes (one target each)")
    parser.add_argument("--max-seconds", type=float, default=None, help="per-target time cap")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for result in iter_results(
        args.target or TARGETS, args.n, args.seed, args.jobs, args.max_seconds
    ):
        results.append(result)
        count = sum(f["count"] for f in result["findings"].values())
        print(
            f"{result['target']:<26} {result['inputs']:>9,} inputs {result['elapsed_s']:>8} s "
            f"{result['inputs_per_s']:>7}/s  findings: {count}",
            flush=True,
        )
        for key, entry in result["findings"].items():
            print(f"    {entry['count']} x {key} (case_seed={entry['case_seed']})", flush=True)
    report = {
        "command": " ".join(["python", "benchmarks/fuzz.py", *(argv or sys.argv[1:])]),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "results": sorted(results, key=lambda r: TARGETS.index(r["target"])),
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 1 if any(r["findings"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
