"""The fault matrix over real loopback HTTP against the emulator:
3 backends × every emulator fault type × {no cancel, cancel mid-stream, cancel in backoff}.

Each case checks the contract: exactly one terminal, last; a ``Retrying`` before every new
attempt; the final text is what the server last sent; a cancel returns promptly with the
partial output.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_sampler import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Retrying,
    SamplerConfig,
    SamplingEvent,
    User,
    open_sampler,
)
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.testing import EmulatorFixture
from trio_sampler.types import StreamStarted

TEXT = "The quick brown fox jumps over the lazy dog, twice over, for good measure."

FAULTS: dict[str, dict[str, Any]] = {
    "status": {"type": "status", "status": 503, "times": 1},
    "stream_error": {"type": "stream_error", "after_events": 3, "times": 1},
    "drop": {"type": "drop", "after_events": 3, "times": 1},
    "stall": {"type": "stall", "after_events": 3, "seconds": 30, "times": 1},
    "malformed": {"type": "malformed", "after_events": 3, "times": 1},
    "empty": {"type": "empty", "times": 1},
    "pings": {"type": "pings", "count": 3, "interval_ms": 5},
}
RETRIED = {name for name in FAULTS if name != "pings"}

CASES = [
    pytest.param(backend, fault, mode, id=f"{backend.value}-{fault}-{mode}")
    for backend in ApiBackend
    for fault in FAULTS
    for mode in ("none", "cancel-mid-stream", "cancel-in-backoff")
    if mode != "cancel-in-backoff" or fault in RETRIED
]


def config_for(emulator: EmulatorFixture, backend: ApiBackend, backoff: float) -> SamplerConfig:
    return SamplerConfig(
        base_url=emulator.base_url,
        backend=backend,
        model="emulator-1",
        api_key="sk-emulator-test",
        retry=RetryPolicy(max_retries=2, base_delay=backoff, max_delay=backoff, jitter=0.0),
        timeouts=Timeouts(first_token=5.0, idle=1.0, response_headers=5.0),
    )


@pytest.mark.parametrize(("backend", "fault", "mode"), CASES)
async def test_fault_matrix(
    emulator: EmulatorFixture, backend: ApiBackend, fault: str, mode: str
) -> None:
    scenario = f"{backend.value}-{fault}-{mode}"
    headers = emulator.script(
        text=TEXT, chunk_chars=6, delay_ms=5, scenario=scenario, faults=[FAULTS[fault]]
    )
    request = ConversationRequest(items=[User("tell me")], extra_headers=headers)
    backoff = 30.0 if mode == "cancel-in-backoff" else 0.01
    events: list[SamplingEvent] = []
    with trio.fail_after(20):
        async with open_sampler(config_for(emulator, backend, backoff)) as sampler:
            stream = await sampler.submit(request)
            async for event in stream:
                events.append(event)
                if mode == "cancel-mid-stream" and isinstance(event, ChannelToken):
                    stream.cancel()
                if mode == "cancel-in-backoff" and isinstance(event, Retrying):
                    cancelled_at = trio.current_time()
                    stream.cancel()
            if mode == "cancel-in-backoff":
                assert trio.current_time() - cancelled_at < 1.0  # not the 30 s backoff

    terminals = [e for e in events if isinstance(e, Completed | Cancelled)] + [
        e for e in events if type(e).__name__ == "Failed"
    ]
    assert len(terminals) == 1, events
    terminal = events[-1]
    assert terminal is terminals[0]
    attempts = len(emulator.requests(scenario))
    retries = sum(isinstance(e, Retrying) for e in events)
    assert sum(isinstance(e, StreamStarted) for e in events) <= retries + 1
    assert attempts <= retries + 1

    if mode == "none":
        assert isinstance(terminal, Completed), terminal
        assert terminal.response.text == TEXT
        assert retries == (1 if fault in RETRIED else 0)
        assert terminal.metrics is not None and len(terminal.metrics.attempts) == retries + 1
    else:
        assert isinstance(terminal, Cancelled), terminal
        if mode == "cancel-in-backoff":
            assert attempts == 1
        elif terminal.partial is not None:
            assert TEXT.startswith(terminal.partial.text)
