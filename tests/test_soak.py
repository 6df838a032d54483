"""The soak harness (``benchmarks/soak.py``) at test size: a few thousand requests through
one sampler actor against the in-process emulator, with every fault type and random
cancels. The full run (10^5 requests over loopback HTTP) is documented in
``docs/reliability.md``.

The test runs under the mock clock: the in-process emulator paces, stalls and pings on
``trio.sleep``, so the 0.3 s first-token and idle timeouts count virtual time, and only a
``stall`` fault (silent for 0.6 s) trips them. On the wall clock a loaded machine made
clean requests miss a 0.3 s first token, and the check that every clean request
completes failed for the machine's sake, not the library's.
"""

from __future__ import annotations

import trio
import trio.lowlevel
import trio.testing

from benchmarks import soak
from trio_sampler.actor import open_sampler
from trio_sampler.config import SamplerConfig
from trio_sampler.emulator import EmulatorTransport, script_headers
from trio_sampler.types import Completed, ConversationRequest, User


async def test_soak_in_process(autojump_clock: trio.testing.MockClock) -> None:
    opts = soak.SoakOptions(
        requests=2000,
        concurrency=100,
        fault_rate=0.2,
        cancel_rate=0.05,
        seed=7,
        in_process=True,
        idle_timeout=0.3,
    )
    report = await soak.run_soak(opts)
    assert report["requests"] == report["terminals"] == 2000
    assert report["one_terminal_violations"] == 0, report["examples"]
    assert report["text_mismatches"] == 0, report["examples"]
    assert report["leaked_requests"] == 0
    assert report["clean_requests_not_completed"] == 0, report["examples"]
    assert set(report["faults_injected"]) == {*soak.FAULT_TYPES, "none"}
    assert report["terminals_by_kind"].get("Cancelled", 0) > 0
    assert report["terminals_by_kind"].get("Failed", 0) > 0
    assert report["fds"]["end"] <= report["fds"]["start"]
    assert report["trio_tasks"]["end"] <= report["trio_tasks"]["start"]
    # Memory: a loose bound at this size (the flat-after-warm-up check is the full run's).
    assert report["rss_kib"]["end"] - report["rss_kib"]["warmup"] < 50 * 1024


async def test_emulator_transport_survives_open_sampler() -> None:
    # Bug (reported): the sampler's client closes its transport from inside a shielded
    # cancel scope, and EmulatorTransport.aclose exits the nursery it opened in
    # __aenter__ there: "Cancel scope stack corrupted" when the sampler closes.
    config = SamplerConfig(
        base_url="http://emulator.local/v1",
        model="m",
        extra_headers=script_headers(text="hello"),
    )
    async with (
        EmulatorTransport() as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        stream = await sampler.submit(ConversationRequest(items=[User("hi")]))
        events = [event async for event in stream]
    assert isinstance(events[-1], Completed)
    await trio.lowlevel.checkpoint()
