"""Hostile servers that echo the key back: no form of it may leave the library.

Each server is a ``trio.serve_tcp`` on 127.0.0.1 that writes raw HTTP/1.1 bytes by hand
(not the emulator). For every key format × every echo path, the request runs through the
bridge with telemetry on (the events it forwards, its outcome, the span and the metrics),
then again through ``submit_and_collect`` (the exception: ``str``, ``repr``, ``args``, the
formatted traceback), and once through the bare client (its exception). Every DEBUG
record of ``trio_sampler``, ``httpx2`` and ``httpcore2`` is captured on the root logger.
Everything is searched for the key in every form: raw, upper and lower case, URL-encoded,
base64 (at any alignment, both alphabets), JSON- and repr-escaped, and any 16 consecutive
characters of it.
"""

from __future__ import annotations

import base64
import gzip
import json
import traceback
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import orjson
import trio
from log_capture import LogCapture
from loopback import read_request, serve
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trio_sampler.actor import open_sampler
from trio_sampler.bridge import run_turn_via_sampler
from trio_sampler.client import SamplingClient, SamplingClientError
from trio_sampler.config import AuthScheme, RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.telemetry import GenAITelemetry
from trio_sampler.types import (
    ConversationRequest,
    Failed,
    SamplingError,
    SamplingEvent,
    User,
    to_jsonable,
)
from trio_sampler.wire import BuildOptions, build_request

REQUEST = ConversationRequest(items=[User("hello")])


@attrs.frozen
class KeyFormat:
    name: str
    key: str
    #: How the config carries it.
    place: str  # "bearer", "x-api-key", "header:<name>", "query:<name>"

    def config(self, base_url: str) -> SamplerConfig:
        fields: dict[str, Any] = {}
        if self.place == "bearer":
            fields = {"api_key": self.key}
        elif self.place == "x-api-key":
            fields = {"api_key": self.key, "auth_scheme": AuthScheme.X_API_KEY}
        elif self.place.startswith("header:"):
            fields = {"extra_headers": {self.place[7:]: self.key}}
        else:
            fields = {"query_params": {self.place[6:]: self.key}}
        return SamplerConfig(
            base_url=base_url,
            model="m",
            timeouts=Timeouts(connect=2.0, response_headers=2.0, first_token=2.0, idle=2.0),
            retry=RetryPolicy(max_retries=0),
            **fields,
        )


_JWT = ".".join(
    base64.urlsafe_b64encode(part).decode().rstrip("=")
    for part in (
        b'{"alg":"HS256","typ":"JWT"}',
        b'{"sub":"svc-7f3a","aud":"llm-gateway","exp":1893456000}',
        bytes(range(200, 232)),
    )
)

KEYS = [
    KeyFormat("openai-project", "sk-proj-Xq7LmN2pR9tV4wZ8bC1dE6fG3hJ5kA0sQ_u-YiOo", "bearer"),
    KeyFormat("anthropic-slash", "sk-ant-api03-Qw3rTy7UiOp/As9DfGh2JkL4ZxCv-8BnM1aa", "x-api-key"),
    KeyFormat("azure-hex", "9f86d081884c7d659a2feaa0c55ad015", "header:api-key"),
    KeyFormat("google", "AIzaSyD3x7Kq9LmPz2Vb8Nc4Wr6Ty1Ue5Io0Pa", "header:x-goog-api-key"),
    KeyFormat("google-query", "AIzaSyQ8w2Er4Ty6Ui8Op0As2Df4Gh6Jk8Lz0X", "query:key"),
    KeyFormat("jwt", _JWT, "bearer"),
    KeyFormat("gateway-dots", "gw.live.4f2a9c.b81d3e7a55c0", "bearer"),
    KeyFormat("base64-chars", "Zm9v+YmFy/cXV4+Y29ycGdy/YXVsdA==", "header:x-auth-token"),
    KeyFormat("punctuation", "K3y!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~9z", "bearer"),
    KeyFormat("xai", "xai-Lp0Ok9Ij8Uh7Yg6Tf5Rd4Es3Wa2Qz1Xc", "bearer"),
    KeyFormat("groq", "gsk_Mn8Bv7Cx6Zl5Kj4Hg3Fd2Sa1Qw0Er9Ty", "bearer"),
]


def forms(key: str) -> set[str]:
    """Every form of ``key`` that must not appear anywhere."""
    raw = key.encode()
    out = {
        key,
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key),
        json.dumps(key)[1:-1],
        repr(key)[1:-1],
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode(),
    }
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        core = encoded[4 if offset else 0 : 4 * ((offset + len(raw)) // 3)]
        out |= {core, core.replace("+", "-").replace("/", "_")}
    out |= {key[i : i + 16] for i in range(len(key) - 15)}
    return {form.lower() for form in out if len(form) >= 12}


def leaks(key: str, texts: list[str]) -> list[str]:
    wanted = forms(key)
    found = []
    for text in texts:
        lowered = text.lower()
        for form in wanted:
            if form in lowered:
                at = lowered.index(form)
                found.append(f"{form!r} in …{text[max(0, at - 60) : at + 80]!r}")
                break
    return found


# -- the echo paths -------------------------------------------------------------------


def _response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", "connection: close"]
    head += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _json_error(key: str) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": f"Incorrect API key provided: {key}. You can find your key at ...",
                "type": key,
                "code": key,
                "param": None,
            },
            "request_id": key,
        }
    )


def _chunk(text: str, key: str) -> bytes:
    data = {
        "id": key,
        "object": "chat.completion.chunk",
        "model": key,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def echo_json_401(key: str) -> bytes:
    headers = [("content-type", "application/json"), ("x-request-id", key)]
    return _response("401 Unauthorized", headers, _json_error(key))


def echo_text_dump(key: str) -> bytes:
    basic = base64.b64encode(f"user:{key}".encode()).decode()
    body = (
        "upstream rejected the request; headers received:\n"
        f"x-api-key: {key}\nauthorization: Bearer {key}\nproxy-authorization: Basic {basic}\n"
        f"url: /v1/chat/completions?key={urllib.parse.quote(key, safe='')}\n"
        f"token {key[: len(key) // 2]}… (truncated)\n"
    ).encode()
    return _response("400 Bad Request", [("content-type", "text/plain")], body)


def echo_gzip(key: str) -> bytes:
    headers = [("content-type", "application/json"), ("content-encoding", "gzip")]
    return _response("401 Unauthorized", headers, gzip.compress(_json_error(key)))


def echo_stream_error(key: str) -> bytes:
    error = orjson.dumps({"error": {"message": f"key {key} was revoked", "type": key, "code": key}})
    body = _chunk("hi", key) + b"data: " + error + b"\n\n"
    return _response("200 OK", [("content-type", "text/event-stream")], body)


def echo_rate_limit_headers(key: str) -> bytes:
    headers = [
        ("content-type", "application/json"),
        ("retry-after", "0"),
        ("x-ratelimit-limit-requests", key),
        ("x-ratelimit-remaining-tokens", key),
        ("anthropic-ratelimit-requests-reset", key),
        (f"x-ratelimit-{key[:20].lower()}", "1"),
        ("x-request-id", key),
    ]
    return _response("429 Too Many Requests", headers, b'{"error": {"message": "slow down"}}')


def echo_redirect(key: str) -> bytes:
    location = f"https://evil.example/steal?key={urllib.parse.quote(key, safe='')}&t={key}"
    body = f"Redirecting to {location}".encode()
    return _response("302 Found", [("location", location), ("content-type", "text/plain")], body)


def echo_model_header(key: str) -> bytes:
    finish = {
        "id": key,
        "object": "chat.completion.chunk",
        "model": key,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    body = _chunk("hello", key) + b"data: " + orjson.dumps(finish) + b"\n\ndata: [DONE]\n\n"
    headers = [
        ("content-type", "text/event-stream"),
        ("openai-model", key),
        ("x-model", key),
        ("x-request-id", key),
        ("x-ratelimit-remaining-requests", key),
    ]
    return _response("200 OK", headers, body)


ECHOES: dict[str, Callable[[str], bytes]] = {
    "json-401": echo_json_401,
    "text-dump-400": echo_text_dump,
    "gzip-401": echo_gzip,
    "stream-error": echo_stream_error,
    "rate-limit-headers-429": echo_rate_limit_headers,
    "redirect-location": echo_redirect,
    "model-header": echo_model_header,
}


# -- servers and capture --------------------------------------------------------------


@asynccontextmanager
async def hostile(reply: bytes) -> AsyncIterator[str]:
    """A loopback server answering every request with ``reply``; yields its base URL."""

    async def on_connection(stream: trio.SocketStream) -> None:
        if await read_request(stream) is not None:
            await stream.send_all(reply)

    async with serve(on_connection) as port:
        yield f"http://127.0.0.1:{port}/v1"


def _telemetry() -> tuple[GenAITelemetry, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = GenAITelemetry(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        provider_name="openai",
    )
    return telemetry, spans, reader


def _telemetry_texts(spans: InMemorySpanExporter, reader: InMemoryMetricReader) -> list[str]:
    texts = []
    for span in spans.get_finished_spans():
        texts += [span.to_json(), repr(dict(span.attributes or {})), str(span.status)]
        texts += [repr(event.attributes) for event in span.events]
    data = reader.get_metrics_data()
    if data is not None:
        texts.append(data.to_json())
    return texts


def _exception_texts(exc: BaseException) -> list[str]:
    return [
        str(exc),
        repr(exc),
        repr(exc.args),
        "".join(traceback.format_exception(exc)),
        *(repr(v) for v in vars(exc).values()),
    ]


async def _one_cell(key: KeyFormat, echo: Callable[[str], bytes]) -> tuple[list[str], bool]:
    """Run the echo path for the key; the texts that left the library, and whether the
    request ended in ``Failed`` (every path but the model header does)."""
    texts: list[str] = []
    telemetry, spans, reader = _telemetry()
    async with hostile(echo(key.key)) as base_url:
        config = key.config(base_url)
        events: list[SamplingEvent] = []
        async with open_sampler(config) as sampler:
            outcome = await run_turn_via_sampler(
                sampler, REQUEST, on_event=events.append, telemetry=telemetry
            )
            texts += [repr(outcome), str(outcome)]
            for event in events:
                texts += [repr(event), str(event), orjson.dumps(to_jsonable(event)).decode()]
            try:
                await sampler.submit_and_collect(REQUEST)
            except SamplingError as exc:
                texts += _exception_texts(exc)
                texts.append(orjson.dumps(to_jsonable(exc.info)).decode())
        async with SamplingClient(config) as client:
            wire = build_request(config.backend, REQUEST, BuildOptions(model="m"))
            try:
                async with client.open_stream(wire) as stream:
                    async for _ in stream:
                        pass
            except SamplingClientError as exc:
                texts += _exception_texts(exc)
    texts += _telemetry_texts(spans, reader)
    return texts, isinstance(events[-1], Failed)


async def test_no_echoed_key_leaves_in_any_form(debug_logs: LogCapture) -> None:
    assert len(KEYS) >= 8 and len(ECHOES) >= 6
    found: dict[str, list[str]] = {}
    for key in KEYS:
        for echo_name, echo in ECHOES.items():
            start = len(debug_logs.texts)
            texts, failed = await _one_cell(key, echo)
            assert failed is (echo_name != "model-header"), (key.name, echo_name)
            cell = leaks(key.key, [*texts, *debug_logs.texts[start:]])
            if cell:
                found[f"{key.name} × {echo_name}"] = cell[:3]
    # The records of all three loggers were really there to be searched (the request
    # line, which httpx2 logs for what it sends, is the client's own on the direct path).
    assert {"trio_sampler.http", "httpcore2.http11", "httpcore2.connection"} <= debug_logs.names
    assert found == {}, f"{len(found)} of {len(KEYS) * len(ECHOES)} cells leaked: {found}"
