"""No secret leaks (``docs/contract.md`` §7): the fault matrix through the actor against the
emulator with a recognisable fake key, and every place a key could surface scanned for it.

Scanned: every event (``repr`` and ``to_jsonable``), every exception (``str`` and
``repr``), every log record at DEBUG on the root logger (message, args, traceback), the
emulator's request log (``GET /v1/emulator/requests``) and everything written to stdout
and stderr.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx2
import orjson
import pytest
from log_capture import LogCapture

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    Failed,
    SamplingError,
    SamplingErrorKind,
    User,
    to_jsonable,
)

KEY = "sk-LEAKCHECK-7f3a9c1e5b2d4068ae91"
QUERY_KEY = "sk-LEAKCHECK-QUERY-0a1b2c3d4e5f6789"
MARKER = "LEAKCHECK"
REQUEST = ConversationRequest(items=[User("hello")])

FAULTS: list[dict[str, Any] | None] = [
    None,
    {"type": "status", "status": 401},
    {"type": "status", "status": 429, "retry_after": 0.01, "times": 1},
    {"type": "status", "status": 500},
    {"type": "status", "status": 529, "times": 1},
    {"type": "stream_error", "after_events": 2},
    {"type": "drop", "after_events": 2},
    {"type": "stall", "after_events": 2, "seconds": 1.0},
    {"type": "malformed", "after_events": 1},
    {"type": "empty"},
    {"type": "pings", "count": 3, "interval_ms": 1},
]


def _config(base_url: str, backend: ApiBackend, **changes: Any) -> SamplerConfig:
    return SamplerConfig(
        base_url=base_url,
        backend=backend,
        model="leak-model",
        api_key=KEY,
        timeouts=Timeouts(response_headers=2.0, first_token=0.3, idle=0.3),
        retry=RetryPolicy(max_retries=1, base_delay=0.01, max_delay=0.02),
        **changes,
    )


def _scan(texts: list[str]) -> list[str]:
    return [t[:300] for t in texts if MARKER in t or KEY in t or QUERY_KEY in t]


async def _run_matrix(emulator: EmulatorFixture, **changes: Any) -> list[str]:
    texts: list[str] = []
    for backend in ApiBackend:
        config = _config(emulator.base_url, backend, **changes)
        texts.append(repr(config))
        async with open_sampler(config) as sampler:
            for index, fault in enumerate(FAULTS):
                script = {
                    "text": "the reply",
                    "scenario": f"leak-{backend.value}-{index}",
                    "faults": [fault] if fault else [],
                }
                request_config = config.evolve(extra_headers=emulator.script(**script))
                stream = await sampler.submit(REQUEST, config=request_config)
                async for event in stream:
                    texts.append(repr(event))
                    texts.append(orjson.dumps(to_jsonable(event)).decode())
                    texts.append(str(event))
                # The same request as an exception (submit_and_collect raises on Failed).
                try:
                    await sampler.submit_and_collect(REQUEST, config=request_config)
                except SamplingError as exc:
                    texts += [str(exc), repr(exc), repr(exc.info), repr(exc.partial)]
                    texts.append(orjson.dumps(to_jsonable(exc.info)).decode())
    async with httpx2.AsyncClient() as client:
        recorded = await client.get(f"{emulator.base_url}/emulator/requests")
    assert recorded.status_code == 200
    texts.append(recorded.text)
    texts.append(repr(emulator.requests()))
    texts.append(repr(emulator.app))
    return texts


async def test_fault_matrix_leaks_no_key(
    emulator: EmulatorFixture, debug_logs: LogCapture, capfd: pytest.CaptureFixture[str]
) -> None:
    texts = await _run_matrix(emulator)
    assert len(emulator.requests()) >= 3 * len(FAULTS)
    out, err = capfd.readouterr()
    leaks = _scan([*texts, *debug_logs.texts, out, err])
    assert leaks == []


async def test_fault_matrix_with_key_in_query_leaks_no_key(
    emulator: EmulatorFixture, debug_logs: LogCapture, capfd: pytest.CaptureFixture[str]
) -> None:
    texts = await _run_matrix(emulator, query_params={"key": QUERY_KEY})
    out, err = capfd.readouterr()
    leaks = _scan([*texts, *debug_logs.texts, out, err])
    assert leaks == []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_query_key_redacted_in_connect_error(
    debug_logs: LogCapture, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config(
        f"http://127.0.0.1:{_closed_port()}/v1",
        ApiBackend.CHAT_COMPLETIONS,
        query_params={"key": QUERY_KEY, "api_key": QUERY_KEY},
    )
    texts = [repr(config), str(config)]
    async with open_sampler(config) as sampler:
        stream = await sampler.submit(REQUEST)
        events = [event async for event in stream]
        texts += [repr(e) for e in events] + [str(e) for e in events]
        texts += [orjson.dumps(to_jsonable(e)).decode() for e in events]
        try:
            await sampler.submit_and_collect(REQUEST)
        except SamplingError as exc:
            texts += [str(exc), repr(exc)]
    terminal = events[-1]
    assert isinstance(terminal, Failed)
    assert terminal.error.kind is SamplingErrorKind.TRANSPORT
    out, err = capfd.readouterr()
    assert _scan([*texts, *debug_logs.texts, out, err]) == []
