"""Record an exchange to a cassette and serve it back: the same events, the same timing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

from trio_sampler.actor import open_sampler
from trio_sampler.config import SamplerConfig
from trio_sampler.emulator import EmulatorTransport, script_headers
from trio_sampler.recording import (
    Cassette,
    CassetteError,
    RecordingTransport,
    ReplayTransport,
    Timing,
)
from trio_sampler.testing import CassetteServer
from trio_sampler.types import ApiBackend, ConversationRequest, Failed, User, to_jsonable

KEY = "sk-emulator-recording-0123456789"
CONFIG = SamplerConfig(
    base_url="http://emulator.test/v1",
    backend=ApiBackend.MESSAGES,
    model="emulator-1",
    api_key=KEY,
)
SCRIPT = script_headers(text="one two three four five six", chunk_chars=4, delay_ms=37)
REQUEST = ConversationRequest(items=[User("count")], extra_headers=SCRIPT)


async def sample(transport: httpx2.AsyncBaseTransport) -> list[tuple[float, dict[str, Any]]]:
    """Every event with when it arrived (seconds from the submit)."""
    async with open_sampler(CONFIG, transport=transport, seed=1) as sampler:
        stream = await sampler.submit(REQUEST, request_id="req_recorded")
        start = trio.current_time()
        async with stream:
            return [(trio.current_time() - start, to_jsonable(event)) async for event in stream]


async def record(path: Path) -> list[tuple[float, dict[str, Any]]]:
    async with EmulatorTransport() as emulator:
        return await sample(RecordingTransport(path, inner=emulator))


async def test_a_recorded_exchange_replays_to_the_same_events_and_timing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "run.cassette"
    recorded = await record(path)
    assert recorded[-1][1]["type"] == "Completed"
    assert recorded[-1][0] > 0.2  # paced: the timing is worth checking

    replayed = await sample(ReplayTransport(path))
    assert len(replayed) == len(recorded)
    for (then, before), (now, after) in zip(recorded, replayed, strict=True):
        assert now == pytest.approx(then, abs=0.005)
        assert_same_event(before, after)


def assert_same_event(before: Any, after: Any, where: str = "event") -> None:
    """Equal, but for the times the metrics measured (milliseconds): within 5 ms."""
    if isinstance(before, dict) and isinstance(after, dict):
        assert before.keys() == after.keys(), where
        for key in before:
            assert_same_event(before[key], after[key], f"{where}.{key}")
    elif isinstance(before, list) and isinstance(after, list):
        assert len(before) == len(after), where
        for index, (one, other) in enumerate(zip(before, after, strict=True)):
            assert_same_event(one, other, f"{where}[{index}]")
    elif isinstance(before, float) and where.endswith("_ms"):
        assert after == pytest.approx(before, abs=5.0), where
    else:
        assert before == after, where


async def test_fast_timing_serves_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "run.cassette"
    recorded = await record(path)
    replayed = await sample(ReplayTransport(path, timing=Timing.FAST))
    assert replayed[-1][0] < 0.001
    assert replayed[-1][1]["response"] == recorded[-1][1]["response"]


async def test_the_cassette_holds_the_exchange_without_credentials(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "run.cassette"
    await record(path)
    text = path.read_text(encoding="utf-8")
    assert KEY not in text
    (exchange,) = Cassette.load(path).exchanges
    headers = dict(exchange.request_headers)
    assert headers["authorization"] == "<removed>"
    assert exchange.method == "POST" and exchange.url.endswith("/v1/messages")
    assert exchange.status == 200
    assert b'"text":"count"' in exchange.request_body
    assert b"event: message_stop" in exchange.body
    times = [at for at, _ in exchange.chunks]
    assert times == sorted(times) and exchange.headers_at <= times[0] <= exchange.end_at


async def test_a_request_past_the_cassette_is_an_error_naming_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "run.cassette"
    await record(path)
    transport = ReplayTransport(path, timing="fast")
    async with open_sampler(CONFIG, transport=transport) as sampler:
        await sampler.submit_and_collect(REQUEST)
        stream = await sampler.submit(REQUEST)
        async with stream:
            events = [event async for event in stream]
    terminal = events[-1]
    assert isinstance(terminal, Failed) and terminal.error.status_code == 404
    assert "no exchange left for POST /v1/messages (1 of 1 served)" in terminal.error.message


def test_a_file_that_is_not_a_cassette_says_so(tmp_path: Path) -> None:
    path = tmp_path / "body.sse"
    path.write_bytes(b"data: {}\n\n")
    with pytest.raises(CassetteError, match="not a cassette"):
        Cassette.load(path)
    path.write_bytes(b'{"format": "trio-sampler.cassette/1"}\n{"request": 1}\n')
    with pytest.raises(CassetteError, match="line 2"):
        Cassette.load(path)
    with pytest.raises(ValueError, match="'original' or 'fast'"):
        ReplayTransport(Cassette(), timing="slow")


async def test_the_pytest_plugin_serves_a_cassette_over_http(
    cassette_server: CassetteServer, tmp_path: Path
) -> None:
    """Recorded in memory, served on a real loopback port: the same answer, the same ids."""
    path = tmp_path / "run.cassette"
    recorded = await record(path)
    server = await cassette_server(path, timing="fast")
    config = CONFIG.evolve(base_url=server.base_url)
    async with open_sampler(config, seed=1) as sampler:
        stream = await sampler.submit(REQUEST, request_id="req_recorded")
        async with stream:
            served = [to_jsonable(event) async for event in stream]
    assert [e["type"] for e in served] == [e["type"] for _, e in recorded]
    assert served[-1]["response"] == recorded[-1][1]["response"]
