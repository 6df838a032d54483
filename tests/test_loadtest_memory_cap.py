"""The load generator holds one memory cap for the whole run, and its report says when
streams were stopped by it.

Regression: each 100 streams had a 1 GiB cap of their own, so at C=1,000 against a server
sending endless data the generator passed 6 GiB.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_sampler import SamplerConfig
from trio_sampler.emulator import EmulatorApp
from trio_sampler.loadtest import (
    Concurrency,
    Fixed,
    Limits,
    LoadTest,
    SyntheticWorkload,
    run_load_test,
)
from trio_sampler.loadtest._plan import minimum_memory_cap
from trio_sampler.testing import EmulatorTransport

_MIB = 1024 * 1024


class EndlessEvent(EmulatorApp):
    """A server whose every answer is one SSE event that never ends."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: ", "more_body": True})
        while True:
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            await trio.sleep(0.001)


@pytest.mark.parametrize("streams", [4, 250])
async def test_one_cap_for_the_run_and_the_report_names_the_streams_it_stopped(
    autojump_clock: trio.abc.Clock, streams: int
) -> None:
    config = SamplerConfig(base_url="http://emulator.test/v1", model="m", api_key="sk-test")
    test = LoadTest(
        config,
        [Concurrency(streams)],
        SyntheticWorkload(Fixed(8), Fixed(3)),
        Limits(duration_s=None, requests=streams),
        max_buffered_response_bytes=minimum_memory_cap(streams) + 8 * _MIB,
    )
    async with EmulatorTransport(EndlessEvent()) as transport:
        result = await run_load_test(test, transport=transport)
    [stage] = result.stages
    assert stage.summary["requests"]["errors"] == {"memory_cap": streams}
    reasons = " ".join(stage.summary["client"]["reasons"])
    assert "the run's memory cap" in reasons and f"stopped {streams:,}" in reasons
