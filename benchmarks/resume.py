"""Stream resume: a 2,000-delta Responses answer cut at random points, read on each time.

Each run asks the embedded emulator (in process, no sockets) for the same background
answer with a ``drop`` fault at a random event; the sampler resumes it from the last
event it delivered. Reported over ``--drops`` runs: how many resumed (a ``Resumed``
event, no ``Retrying``), how many final texts are byte-identical to an uninterrupted run,
how many answers the emulator generated (its background record: one per run means each
token was generated once), and the wall time per run. Prints a table and writes
``benchmarks/results/resume.json``.

    python benchmarks/resume.py [--drops 100] [--seed 35]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results
from trio_sampler import ApiBackend, ConversationRequest, Retrying, SamplerConfig, User
from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import EmulatorApp, PromptCache, script_headers
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Completed, Resumed, SamplingEvent

TEXT = "".join(f"{i:04d} " for i in range(2000))
CONFIG = SamplerConfig(
    base_url="http://emulator/v1",
    backend=ApiBackend.RESPONSES,
    model="emulator-1",
    api_key="sk-emulator-bench",
    retry=RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.01, jitter=0.0),
    timeouts=Timeouts(first_token=10.0, idle=10.0, response_headers=10.0),
)


async def _run(app: EmulatorApp, scenario: str, drop_after: int | None) -> list[SamplingEvent]:
    faults = [] if drop_after is None else [{"type": "drop", "after_events": drop_after}]
    headers = script_headers(text=TEXT, chunk_chars=5, scenario=scenario, faults=faults)
    request = ConversationRequest([User("count")], extra_headers=headers, background=True)
    events: list[SamplingEvent] = []
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(CONFIG, transport=transport) as sampler,
    ):
        async for event in await sampler.submit(request):
            events.append(event)
    return events


async def main(drops: int, seed: int) -> dict[str, object]:
    app = EmulatorApp(cache=PromptCache())
    whole = await _run(app, "whole", None)
    assert isinstance(whole[-1], Completed)
    reference = whole[-1].response.text.encode()
    rng = random.Random(seed)
    resumed = identical = retried = 0
    seconds: list[float] = []
    for n in range(drops):
        started = time.perf_counter()
        events = await _run(app, f"drop-{n}", rng.randrange(5, 2004))
        seconds.append(time.perf_counter() - started)
        resumed += any(isinstance(e, Resumed) for e in events)
        retried += any(isinstance(e, Retrying) for e in events)
        end = events[-1]
        identical += isinstance(end, Completed) and end.response.text.encode() == reference
    records = list(app.background.records.values())[1:]  # the uninterrupted run first
    seconds.sort()
    return {
        "drops": drops,
        "resumed": resumed,
        "retried": retried,
        "identical": identical,
        "generations": sum(r.generations for r in records),
        "deltas_generated": sum(r.generated_deltas for r in records),
        "retrievals": sum(r.retrievals for r in records),
        "median_run_ms": round(1000 * seconds[len(seconds) // 2], 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=100)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    results = trio.run(main, args.drops, args.seed)
    for key, value in results.items():
        print(f"{key:>18}  {value}")
    write_results(Path(__file__).parent / "results" / "resume.json", results)
