"""A pre-rendered Chat Completions SSE server, independent of the library, for client benchmarks.

Standard library only (``asyncio`` protocols): it shares no code with ``trio_sampler`` or
its emulator (Hypercorn), so what a client benchmark measures against it is the client.
Every ``POST`` gets a ``200`` with a streamed Chat Completions body, pre-rendered once per
event count and sent in one write:

* ``x-bench-events: N`` (default 200) text deltas of ``x-bench-chunk-chars`` characters (4),
  after a role chunk; then a chunk with ``finish_reason: "stop"``, a usage chunk
  (``choices: []``) and ``data: [DONE]``, each frame ended by a blank line
  (``docs/wire.md``'s format, as OpenAI sends it);
* ``transfer-encoding: chunked`` (one chunk for the body, then the last chunk), like the
  servers people run (vLLM, SGLang, llama.cpp behind uvicorn), with keep-alive.

The request is read to its end (headers, then ``content-length`` bytes) before the answer
goes out, and the request body is not looked at. Chunked request bodies are answered
``411`` and the connection is closed. Run ``python benchmarks/sse_server.py [--port P]``:
it prints ``listening on http://127.0.0.1:PORT`` and serves until terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Sequence

_PROSE = (
    "The weather in Edinburgh is mild today, with light rain expected after noon and a "
    "gentle westerly wind; temperatures stay near 14 degrees until the evening. "
)
_MAX_HEAD = 64 * 1024
_HEAD_END = b"\r\n\r\n"


def render_body(events: int, chunk_chars: int, model: str = "bench-model") -> bytes:
    """The SSE body: a role chunk, ``events`` text deltas, the finish and usage chunks,
    ``[DONE]``."""
    text = (_PROSE * (events * chunk_chars // len(_PROSE) + 1))[: events * chunk_chars]
    base = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
    }

    def frame(choices: list[object], **extra: object) -> bytes:
        payload = json.dumps({**base, "choices": choices, **extra}, separators=(",", ":"))
        return b"data: " + payload.encode() + b"\n\n"

    def choice(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    parts = [frame([choice({"role": "assistant", "content": ""})])]
    for start in range(0, len(text), chunk_chars):
        parts.append(frame([choice({"content": text[start : start + chunk_chars]})]))
    parts.append(frame([choice({}, "stop")]))
    usage = {"prompt_tokens": 12, "completion_tokens": events, "total_tokens": 12 + events}
    parts.append(frame([], usage=usage))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


class _Responses:
    """Rendered responses (status line, headers, chunked body), per (events, chunk size)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int], bytes] = {}

    def get(self, events: int, chunk_chars: int) -> bytes:
        key = (events, chunk_chars)
        found = self._cache.get(key)
        if found is None:
            body = render_body(events, chunk_chars)
            found = self._cache[key] = (
                b"HTTP/1.1 200 OK\r\n"
                b"content-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\n"
                b"x-request-id: req_bench\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
                + f"{len(body):x}\r\n".encode()
                + body
                + b"\r\n0\r\n\r\n"
            )
        return found


class _Connection(asyncio.Protocol):
    def __init__(self, responses: _Responses) -> None:
        self._responses = responses
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._answer_one():
            pass

    def _answer_one(self) -> bool:
        """Answer the first complete request in the buffer; whether there was one."""
        transport = self._transport
        assert transport is not None
        end = self._buffer.find(_HEAD_END)
        if end < 0:
            if len(self._buffer) > _MAX_HEAD:
                transport.close()
            return False
        head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        fields: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "chunked" in fields.get("transfer-encoding", "").lower():
            transport.write(b"HTTP/1.1 411 Length Required\r\ncontent-length: 0\r\n\r\n")
            transport.close()
            return False
        total = end + len(_HEAD_END) + int(fields.get("content-length", "0"))
        if len(self._buffer) < total:
            return False
        del self._buffer[:total]
        events = int(fields.get("x-bench-events", "200"))
        chunk_chars = int(fields.get("x-bench-chunk-chars", "4"))
        transport.write(self._responses.get(events, chunk_chars))
        return True


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    responses = _Responses()
    server = await loop.create_server(
        lambda: _Connection(responses), "127.0.0.1", port, backlog=4096, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="port to bind on 127.0.0.1 (any)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
