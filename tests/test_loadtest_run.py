"""The load generator against the emulator under the mock clock: what it reports is what
the server was programmed to do."""

from __future__ import annotations

import functools
import gc
import io
import itertools
import os
from typing import Any

import orjson
import pytest
import trio
from rich.console import Console

from trio_sampler import SamplerConfig
from trio_sampler._receive_time import kernel_timestamps_available
from trio_sampler.emulator import EmulatorApp, serve
from trio_sampler.loadtest import (
    SLO,
    Concurrency,
    DatasetWorkload,
    Fixed,
    Limits,
    LoadTest,
    LoadTestResult,
    Progress,
    Rate,
    StageResult,
    SyntheticWorkload,
    run_load_test,
)
from trio_sampler.loadtest._display import summary_table
from trio_sampler.loadtest._plan import LOADGEN_STREAM_BYTES, MIN_STREAM_BYTES, minimum_memory_cap
from trio_sampler.loadtest._runner import _NEVER, STAGE_YOUNG_THRESHOLD, cpu_wait
from trio_sampler.loadtest._words import shared_read_words
from trio_sampler.testing import EmulatorTransport

BASE = "http://emulator.test/v1"


def _config(**script: Any) -> SamplerConfig:
    return SamplerConfig(
        base_url=BASE,
        model="gpt-4o-mini",
        api_key="sk-test",
        extra_headers={"x-emulator-script": orjson.dumps(script).decode()},
    )


def _paced(first_ms: float, interval_ms: float, **more: Any) -> SamplerConfig:
    return _config(
        ignore_eos=True,
        chunk_chars=4,
        first_token_ms=first_ms,
        token_interval_ms=interval_ms,
        **more,
    )


class LimitedApp(EmulatorApp):
    """The emulator serving at most ``slots`` requests at once; the rest wait (a server at
    capacity queues them)."""

    def __init__(self, slots: int) -> None:
        super().__init__()
        self.slots = trio.Semaphore(slots)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        async with self.slots:
            await super().__call__(scope, receive, send)


async def _run(test: LoadTest, app: EmulatorApp | None = None, **kw: Any) -> LoadTestResult:
    async with EmulatorTransport(app) as transport:
        return await run_load_test(test, transport=transport, **kw)


# 250 streams run on three samplers (STREAMS_PER_SAMPLER), their results merged.
@pytest.mark.parametrize("streams", [1, 100, 250])
async def test_reported_ttft_and_itl_match_the_programmed_pacing(
    autojump_clock: trio.abc.Clock, streams: int
) -> None:
    test = LoadTest(
        _paced(120, 15),
        [Concurrency(streams)],
        SyntheticWorkload(Fixed(16), Fixed(12)),
        Limits(duration_s=None, requests=2 * streams, warmup_requests=streams),
    )
    [stage] = (await _run(test)).stages
    ttft, itl, tpot = (stage.summary["latency_ms"][m] for m in ("ttft", "itl", "tpot"))
    assert stage.summary["requests"]["completed"] == 2 * streams
    assert stage.summary["requests"]["failed"] == 0
    for values, expected in ((ttft, 120.0), (itl, 15.0), (tpot, 15.0)):
        assert values["p50"] == pytest.approx(expected, abs=1.0)
        assert values["p99"] == pytest.approx(expected, abs=5.0)
    # 12 tokens: 11 gaps per request, each token in a read of its own.
    assert itl["count"] == 11 * 2 * streams
    assert stage.summary["itl_shared_read_fraction"] == 0.0
    # The emulator reports usage, and the results say the counts are the server's.
    assert stage.summary["tokens"]["output"] == 12 * 2 * streams
    assert stage.summary["tokens"]["output_source"] == "server"
    e2e = stage.summary["latency_ms"]["e2e"]
    assert e2e["p50"] == pytest.approx(120 + 11 * 15, abs=1.0)
    # The in-memory transport does not report the request's write: timed from the submit.
    assert stage.summary["latency_timed_from"] == "submit"
    assert stage.summary["client"]["request_write_ms"]["count"] == 0


async def test_over_a_connection_latencies_are_timed_from_the_requests_write() -> None:
    # The real network and clock, one stream, a few requests: TTFT runs from the request's
    # last byte written (which the emulator's clock starts from too) to the read of the
    # first token, so it is the programmed 100 ms plus the two processes' wake-ups and the
    # loopback, whatever the client spent before the write (reported on its own). The
    # bounds are wide: this checks the timestamps, not the machine (the benchmark
    # measures the error on a quiet one).
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        config = _paced(100, 10).evolve(base_url=f"http://127.0.0.1:{server.port}/v1")
        test = LoadTest(
            config,
            [Concurrency(1)],
            SyntheticWorkload(Fixed(16), Fixed(4)),
            Limits(duration_s=None, requests=4, warmup_requests=1),
        )
        with trio.fail_after(60):
            [stage] = (await run_load_test(test)).stages
        nursery.cancel_scope.cancel()
    summary = stage.summary
    assert summary["requests"]["completed"] == 4
    assert summary["latency_timed_from"] == "wire"
    ttft = summary["latency_ms"]["ttft"]
    assert ttft["count"] == 4
    # The server may read the last bytes a schedule point before the client notes them.
    assert 95.0 <= ttft["p50"] < 150.0
    e2e = summary["latency_ms"]["e2e"]
    assert 95.0 + 3 * 10 <= e2e["p50"] < 250.0
    write = summary["client"]["request_write_ms"]
    assert write["count"] == 4
    assert 0.0 < write["p50"] < 1000.0


async def test_over_a_connection_it_reports_what_the_server_did() -> None:
    # The real network and clock, four streams: whatever this machine's delays, the load
    # generator's TTFT and ITL are the server's own record of its writes (the emulator's
    # punctuality record, timed at its write system calls against the arrival of each
    # request's last bytes), to within a millisecond at the median and a few at the
    # worst, because both sides take their times from the kernel. Where the kernel gives
    # no receive timestamps the client's are its reads', a little later.
    app = EmulatorApp()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app))
        config = _paced(60, 15).evolve(base_url=f"http://127.0.0.1:{server.port}/v1")
        test = LoadTest(
            config,
            [Concurrency(4, ramp_s=0.1)],
            SyntheticWorkload(Fixed(16), Fixed(6)),
            # Nothing left out on either side: the server records every request.
            Limits(duration_s=None, requests=16, warmup_requests=0),
        )
        with trio.fail_after(60):
            [stage] = (await run_load_test(test)).stages
        nursery.cancel_scope.cancel()
    record = app.punctuality.report()
    latency = stage.summary["latency_ms"]
    assert stage.summary["latency_timed_from"] == "wire"
    assert latency["ttft"]["count"] == record["ttft"]["count"] == 16
    assert latency["itl"]["count"] == record["itl"]["count"] == 16 * 5
    median, worst = (1.0, 5.0) if kernel_timestamps_available() else (5.0, 20.0)
    for kind in ("ttft", "itl"):
        assert abs(latency[kind]["p50"] - record[kind]["p50"]) <= median, kind
        assert abs(latency[kind]["max"] - record[kind]["max"]) <= worst, kind


class CollectorApp(EmulatorApp):
    """The emulator noting, at each request, the collector's young and full-collection
    thresholds and how many objects are frozen out of its sight."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, int, bool]] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        young, _, old = gc.get_threshold()
        self.seen.add((young, old, gc.get_freeze_count() > 0))
        await super().__call__(scope, receive, send)


async def test_a_stage_runs_without_full_collections_and_restores_the_collector(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A full collection walks the whole heap (0.3 s of CPU at 1,000 streams): none runs
    # while a stage does, and young ones only when the heap grows; the collector is as it
    # was afterwards.
    before = gc.get_threshold()
    app = CollectorApp()
    test = LoadTest(
        _paced(10, 1),
        [Concurrency(2), Concurrency(2)],
        SyntheticWorkload(Fixed(8), Fixed(4)),
        Limits(duration_s=None, requests=4),
    )
    await _run(test, app)
    assert app.seen == {(max(before[0], STAGE_YOUNG_THRESHOLD), _NEVER, True)}
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


class ArrivalsApp(EmulatorApp):
    """The emulator noting when each request arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.arrivals.append(trio.current_time())
        await super().__call__(scope, receive, send)


@pytest.mark.parametrize("workers_share", [False, True])
async def test_a_ramp_spreads_the_streams_and_they_stay_spread(
    autojump_clock: trio.abc.Clock, workers_share: bool
) -> None:
    # 4 streams over a ramp of one request's duration (100 + 15 * 10 = 250 ms): they
    # start 62.5 ms apart and, the server's latencies being steady, their later requests
    # keep that spacing (started together, all four would arrive at once every round).
    load = Concurrency(4, ramp_s=0.25)
    if workers_share:  # one worker's share of the whole is the whole
        share = load.share(0, 1)
        assert share is not None
        load = share
    app = ArrivalsApp()
    test = LoadTest(
        _paced(100, 10),
        [load],
        SyntheticWorkload(Fixed(8), Fixed(16)),
        Limits(duration_s=2.0, warmup_s=0.5),
    )
    start = trio.current_time()
    [stage] = (await _run(test, app)).stages
    arrivals = sorted(at - start for at in app.arrivals)
    assert arrivals[:4] == pytest.approx([0.0, 0.0625, 0.125, 0.1875], abs=0.001)
    # Every later request keeps its stream's phase: none arrives with another.
    phases = [at % 0.0625 for at in arrivals]
    assert all(phase < 0.001 or phase > 0.0615 for phase in phases)
    assert len({round(at, 3) for at in arrivals}) == len(arrivals) > 30
    assert stage.latency("ttft", "p99") == pytest.approx(100, abs=1.0)


async def test_open_loop_above_capacity_shows_queueing(autojump_clock: trio.abc.Clock) -> None:
    # 4 slots, 0.25 s per request: capacity 16 requests/s.
    test = LoadTest(
        _paced(100, 10),
        [Rate(8, "constant"), Rate(32, "constant")],
        SyntheticWorkload(Fixed(16), Fixed(16)),
        Limits(duration_s=5.0, drain_timeout_s=600),
    )
    under, over = (await _run(test, LimitedApp(4))).stages
    # Below capacity the first token comes when the server paces it.
    assert under.latency("ttft", "p99") == pytest.approx(100, abs=1.0)
    # Above it, arrivals keep coming on schedule (the loop does not close: 32/s for 5 s
    # are all sent) and they queue: TTFT climbs far above the programmed 100 ms.
    assert over.summary["requests"]["started"] == 160
    assert over.summary["client"]["send_lag_ms"]["max"] < 1
    p50, p99 = over.latency("ttft", "p50"), over.latency("ttft", "p99")
    assert p50 is not None and p99 is not None
    assert p50 > 1000
    assert p99 > 4000
    # ITL is the server's pacing once a request is being served.
    assert over.latency("itl", "p50") == pytest.approx(10, abs=1.0)
    # Over time: arrivals hold 32/s, completions plateau at the capacity (16/s), and the
    # TTFT of the requests sent in each second keeps climbing.
    timeline = over.summary["timeline"]
    assert [row["sent"] for row in timeline[:5]] == [32] * 5
    assert all(row["completed"] <= 17 for row in timeline)
    ttft = [row["ttft_p50_ms"] for row in timeline[:5]]
    assert all(later > earlier + 500 for earlier, later in itertools.pairwise(ttft))
    assert all(row["ttft_p99_ms"] < 101 for row in under.summary["timeline"][:5])


async def test_poisson_arrivals_average_the_rate(autojump_clock: trio.abc.Clock) -> None:
    test = LoadTest(
        _paced(10, 1),
        [Rate(20, "poisson")],
        SyntheticWorkload(Fixed(8), Fixed(2)),
        Limits(duration_s=10.0),
        seed=7,
    )
    [stage] = (await _run(test)).stages
    started = stage.summary["requests"]["started"]
    # 200 expected; a Poisson count has a standard deviation of ~14.
    assert 150 < started < 250
    assert stage.summary["requests"]["completed"] == started


async def test_max_in_flight_drops_arrivals_instead_of_delaying_them(
    autojump_clock: trio.abc.Clock,
) -> None:
    test = LoadTest(
        _paced(1000, 10),
        [Rate(10, "constant", max_in_flight=5)],
        SyntheticWorkload(Fixed(8), Fixed(2)),
        Limits(duration_s=3.0),
    )
    [stage] = (await _run(test)).stages
    requests = stage.summary["requests"]
    # Each request lasts ~1 s: 5 in flight at a time, the rest of 30 arrivals dropped.
    assert requests["dropped"] > 0
    assert requests["started"] + requests["dropped"] == 30


async def test_warmup_and_request_limits(autojump_clock: trio.abc.Clock) -> None:
    progress = Progress()
    test = LoadTest(
        _paced(5, 1),
        [Concurrency(2)],
        SyntheticWorkload(Fixed(8), Fixed(3)),
        Limits(duration_s=None, requests=10, warmup_requests=3),
    )
    [stage] = (await _run(test, progress=progress)).stages
    assert stage.summary["requests"]["started"] == 10
    assert stage.summary["requests"]["completed"] == 10
    assert progress.sent == 13  # the warm-up requests were sent, not measured


async def test_errors_are_counted_by_the_samplers_kinds_without_retries(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = EmulatorApp()
    test = LoadTest(
        _config(scenario="limited", faults=[{"type": "status", "status": 429}]),
        [Concurrency(2)],
        SyntheticWorkload(Fixed(8), Fixed(3)),
        Limits(duration_s=None, requests=6),
    )
    [stage] = (await _run(test, app)).stages
    assert stage.summary["requests"]["errors"] == {"rate_limited": 6}
    assert stage.summary["requests"]["completed"] == 0
    # A load test measures the server: no retries.
    assert len(app.requests("limited")) == 6


@pytest.mark.parametrize(("bound", "good"), [(130.0, 1.0), (90.0, 0.0)])
async def test_goodput_against_slos(
    autojump_clock: trio.abc.Clock, bound: float, good: float
) -> None:
    test = LoadTest(
        _paced(100, 10),
        [Concurrency(4)],
        SyntheticWorkload(Fixed(8), Fixed(5)),
        Limits(duration_s=None, requests=20),
        slo=SLO(ttft_ms=bound, tpot_ms=20),
    )
    [stage] = (await _run(test)).stages
    assert stage.summary["goodput"]["fraction"] == good
    throughput = stage.summary["throughput"]["requests_per_s"]
    assert throughput > 0
    assert stage.summary["goodput"]["requests_per_s"] == pytest.approx(good * throughput)


async def test_drain_timeout_cancels_and_counts_unfinished(
    autojump_clock: trio.abc.Clock,
) -> None:
    test = LoadTest(
        _paced(50, 2000),
        [Concurrency(3)],
        SyntheticWorkload(Fixed(8), Fixed(100)),
        Limits(duration_s=1.0, drain_timeout_s=5.0),
    )
    start = trio.current_time()
    [stage] = (await _run(test)).stages
    assert trio.current_time() - start == pytest.approx(6.0, abs=0.2)
    assert stage.summary["requests"]["unfinished"] == 3
    assert stage.summary["requests"]["failed"] == 0


async def test_dataset_workload_runs_its_conversations(
    autojump_clock: trio.abc.Clock, tmp_path: Any
) -> None:
    path = tmp_path / "chats.jsonl"
    lines = [
        {
            "conversations": [
                {"from": "human", "value": "hello there"},
                {"from": "gpt", "value": "x" * 40},
            ]
        },
        {"messages": [{"role": "user", "content": "count to three"}], "output_tokens": 7},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    test = LoadTest(
        _paced(5, 1),
        [Concurrency(1)],
        DatasetWorkload(path),
        Limits(duration_s=None, requests=4),
    )
    [stage] = (await _run(test)).stages
    # ignore_eos: each request generates its own budget (10 and 7 tokens), twice each.
    assert stage.summary["tokens"]["output"] == 2 * (10 + 7)


async def test_result_document_round_trips(autojump_clock: trio.abc.Clock, tmp_path: Any) -> None:
    test = LoadTest(
        _paced(20, 5),
        [Concurrency(1), Concurrency(4)],
        SyntheticWorkload(Fixed(8), Fixed(4)),
        Limits(duration_s=None, requests=8),
    )
    result = await _run(test)
    path = tmp_path / "run.json"
    result.write_json(path)
    again = LoadTestResult.read(path)
    assert again.to_json() == result.to_json()
    data = orjson.loads(path.read_bytes())
    assert data["schema"] == "trio-sampler.loadtest/2"
    assert data["target"]["extra_headers"] == ["x-emulator-script"]
    # The machine it ran on: a report is read elsewhere.
    # How long the client was runnable but waited for a CPU, where the system says.
    [worker] = data["stages"][0]["client"]["workers"]
    assert (worker["cpu_wait_fraction"] is None) == (cpu_wait() is None)
    machine = data["machine"]
    assert machine["cores"] == os.cpu_count()
    assert machine["versions"]["trio"] == trio.__version__
    assert "sk-test" not in path.read_text()
    stage = StageResult(data["stages"][1])
    assert stage.histogram("ttft").count == 8
    rows = result.csv().splitlines()
    assert len(rows) == 3 and rows[1].startswith("C=1,concurrency,1,")


class CompletionsApp(LimitedApp):
    """The emulator noting when it finished each response (its completion rate is the
    truth a load generator's throughput is checked against)."""

    def __init__(self, slots: int = 10_000) -> None:
        super().__init__(slots)
        self.completions: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def noting_the_end(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.completions.append(trio.current_time())

        await super().__call__(scope, receive, noting_the_end)


def _server_rate(app: CompletionsApp, start: float, end: float) -> float:
    """Responses the server finished per second between ``start`` and ``end``."""
    return sum(start <= at < end for at in app.completions) / (end - start)


@pytest.mark.parametrize(
    ("load", "warmup_s"),
    [
        # 10 streams, 285 ms per request (120 + 11 * 15): 35.1 requests/s. Reported over
        # "first send to last end", it was 5 % low (the last requests' E2E in the window).
        (Concurrency(10, ramp_s=0.3), 1.0),
        # Below capacity an open loop completes what arrives: 20/s.
        (Rate(20, "poisson"), 1.0),
        # Past capacity (4 slots: 14 requests/s) it completes what the server can.
        (Rate(30, "constant", max_in_flight=400), 2.0),
    ],
)
async def test_throughput_is_the_servers_completion_rate(
    autojump_clock: trio.abc.Clock, load: Concurrency | Rate, warmup_s: float
) -> None:
    app = CompletionsApp(slots=4 if isinstance(load, Rate) and load.per_second == 30 else 10_000)
    test = LoadTest(
        _paced(120, 15),
        [load],
        SyntheticWorkload(Fixed(16), Fixed(12)),
        Limits(duration_s=10.0, warmup_s=warmup_s, drain_timeout_s=600),
        seed=3,
    )
    start = trio.current_time()
    [stage] = (await _run(test, app)).stages
    throughput = stage.summary["throughput"]
    assert throughput["window_s"] == pytest.approx(10.0, abs=0.06)
    server = _server_rate(app, start + warmup_s, start + warmup_s + 10.0)
    assert throughput["requests_per_s"] == pytest.approx(server, rel=0.02)
    assert throughput["output_tokens_per_s"] == pytest.approx(12 * server, rel=0.02)


async def test_a_short_open_loop_reports_the_rate_it_offered(
    autojump_clock: trio.abc.Clock,
) -> None:
    # 0.2 requests/s for 10 s: two requests of 0.3 s each. Divided by first send to last
    # end of one request it read 2.8 requests/s; over the window it is what happened.
    test = LoadTest(
        _paced(120, 15),
        [Rate(0.2, "constant")],
        SyntheticWorkload(Fixed(16), Fixed(12)),
        Limits(duration_s=10.0),
    )
    [stage] = (await _run(test)).stages
    assert stage.summary["requests"]["completed"] == 2
    assert stage.summary["throughput"]["requests_per_s"] == pytest.approx(0.2)


async def test_open_loop_reports_latency_from_the_schedule_and_the_pacing_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    # One slot, 0.285 s per request, arrivals every 0.25 s: each waits a little longer in
    # the server's queue. Sent on time, the latency from the schedule is the latency.
    test = LoadTest(
        _paced(120, 15),
        [Rate(4, "constant")],
        SyntheticWorkload(Fixed(16), Fixed(12)),
        Limits(duration_s=2.0, drain_timeout_s=60),
    )
    [stage] = (await _run(test, LimitedApp(1))).stages
    open_loop = stage.summary["open_loop"]
    assert open_loop["pacing_error_ms"]["count"] == 8
    assert open_loop["pacing_error_ms"]["p99"] < 0.01
    for metric in ("ttft", "e2e"):
        scheduled = open_loop[f"{metric}_from_schedule_ms"]
        actual = stage.summary["latency_ms"][metric]
        assert scheduled["count"] == actual["count"] == 8
        assert scheduled["p99"] == pytest.approx(actual["p99"], abs=0.5)
    longest = stage.latency("ttft", "max")
    assert longest is not None and longest > 300  # queued behind the others


async def test_open_loop_latency_from_the_schedule_counts_a_late_send(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client that falls behind its schedule: every send is 50 ms late. The server's
    # latency does not show it; the latency from the schedule (what a user whose request
    # waited in the client's queue sees) and the pacing error do.
    from trio_sampler.loadtest import _runner

    real = _runner.StageRunner.one

    async def late(self: Any, sampler: Any, item: Any, measured: bool, due: Any) -> None:
        await trio.sleep(0.05)
        await real(self, sampler, item, measured, due)

    monkeypatch.setattr(_runner.StageRunner, "one", late)
    test = LoadTest(
        _paced(100, 10),
        [Rate(4, "constant")],
        SyntheticWorkload(Fixed(16), Fixed(4)),
        Limits(duration_s=2.0),
    )
    [stage] = (await _run(test)).stages
    open_loop = stage.summary["open_loop"]
    assert open_loop["pacing_error_ms"]["p50"] == pytest.approx(50, abs=0.1)
    assert stage.latency("ttft", "p50") == pytest.approx(100, abs=0.5)
    assert open_loop["ttft_from_schedule_ms"]["p50"] == pytest.approx(150, abs=0.5)
    assert stage.summary["open_loop"] is not None


async def test_a_closed_loop_has_no_schedule(autojump_clock: trio.abc.Clock) -> None:
    test = LoadTest(
        _paced(10, 1),
        [Concurrency(1)],
        SyntheticWorkload(Fixed(8), Fixed(2)),
        Limits(duration_s=None, requests=2),
    )
    [stage] = (await _run(test)).stages
    assert stage.summary["open_loop"] is None


@pytest.mark.parametrize("request_usage", [True, False])
async def test_token_counts_are_the_servers_on_the_generic_provider(
    autojump_clock: trio.abc.Clock, request_usage: bool
) -> None:
    # The generic profile leaves stream_options off (strict servers reject unknown fields);
    # a load test asks for usage anyway unless told not to, so the counts are the server's.
    app = EmulatorApp()
    config = SamplerConfig.for_provider(
        "openai_compatible",
        base_url=BASE,
        model="gpt-4o-mini",
        extra_headers={"x-emulator-script": orjson.dumps({"scenario": "usage"}).decode()},
    )
    test = LoadTest(
        config,
        [Concurrency(1)],
        SyntheticWorkload(Fixed(16), Fixed(4)),
        Limits(duration_s=None, requests=2),
        request_usage=request_usage,
    )
    [stage] = (await _run(test, app)).stages
    [body, _] = [r["body"] for r in app.requests("usage")]
    tokens = stage.summary["tokens"]
    if request_usage:
        assert body["stream_options"] == {"include_usage": True}
        assert (tokens["input_source"], tokens["output_source"]) == ("server", "server")
    else:
        assert "stream_options" not in body
        assert (tokens["input_source"], tokens["output_source"]) == ("planned", "counted")


async def test_one_memory_cap_for_the_run_reported_when_it_stops_streams(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The smallest cap for four streams leaves each 16 KiB of text; four streams of 6,000
    # tokens (4 characters each) hold 24,000 bytes each at the end: the cap stops the
    # largest until the rest fit.
    cap = 4 * MIN_STREAM_BYTES
    test = LoadTest(
        _paced(10, 1),
        [Concurrency(4)],
        SyntheticWorkload(Fixed(8), Fixed(6000)),
        Limits(duration_s=None, requests=4),
        max_buffered_response_bytes=cap,
    )
    [stage] = (await _run(test)).stages
    requests = stage.summary["requests"]
    assert requests["errors"]["memory_cap"] >= 1
    assert "max_buffered_response_bytes" in requests["error_examples"]["memory_cap"]
    client = stage.summary["client"]
    assert client["memory_cap_bytes"] == cap
    assert client["client_bound"]
    stopped = requests["errors"]["memory_cap"]
    prefix = f"the run's memory cap ({cap:,} bytes) stopped {stopped} "
    assert any(reason.startswith(prefix) for reason in client["reasons"])


def test_the_runs_memory_cap_is_shared_by_its_samplers() -> None:
    from trio_sampler.loadtest._runner import sampler_cap, worker_peaks

    # One GiB for 1,000 streams over two workers: the load generator's own cost per
    # stream is kept aside, and each worker's 500 streams run on five samplers of 100,
    # each with a tenth of the rest (one cap, not one per 100 streams).
    gib = 1 << 30
    rest = gib - 1000 * LOADGEN_STREAM_BYTES
    assert sampler_cap(gib, worker_streams=500, all_streams=1000, samplers=5) == rest // 10
    assert sampler_cap(gib, worker_streams=8, all_streams=8, samplers=1) == (
        gib - 8 * LOADGEN_STREAM_BYTES
    )
    assert sampler_cap(None, worker_streams=8, all_streams=8, samplers=1) is None
    assert sampler_cap(10, worker_streams=1, all_streams=1000, samplers=1) == 1
    # The workers' most streams at once add up to the whole: closed loop, and an open
    # loop (without a cap on the requests in flight, 1,024 a worker) split over two.
    three = LoadTest(_config(), [Concurrency(8), Concurrency(1000)], workers=3)
    assert worker_peaks(three) == [334, 333, 333]
    two = LoadTest(_config(), [Rate(50)], workers=2)
    assert worker_peaks(two) == [1024, 1024]
    rest = gib - 2048 * LOADGEN_STREAM_BYTES
    assert sampler_cap(gib, worker_streams=1024, all_streams=2048, samplers=11) == rest // 2 // 11


def test_a_cap_that_cannot_hold_the_streams_is_refused_with_the_least_to_write() -> None:
    # 1,000 streams at once cost 352 KiB each before any text: 344 MiB at least.
    with pytest.raises(ValueError, match="--memory-cap=344MiB") as refused:
        LoadTest(
            _config(), [Concurrency(8), Concurrency(1000)], max_buffered_response_bytes=1 << 20
        )
    assert "max_buffered_response_bytes" in str(refused.value)
    assert minimum_memory_cap(1000) == 344 << 20
    LoadTest(_config(), [Concurrency(1000)], max_buffered_response_bytes=344 << 20)
    LoadTest(_config(), [Concurrency(1000)], max_buffered_response_bytes=None)
    # An open loop without a bound on the requests in flight counts 1,024 a worker.
    with pytest.raises(ValueError, match="2,048 streams"):
        LoadTest(_config(), [Rate(50)], workers=2, max_buffered_response_bytes=400 << 20)


async def test_events_that_share_a_read_are_counted_and_noted(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Every token at once: each comes with the one before it, its gap 0.
    test = LoadTest(
        _paced(50, 0),
        [Concurrency(2)],
        SyntheticWorkload(Fixed(8), Fixed(6)),
        Limits(duration_s=None, requests=4),
    )
    result = await _run(test)
    [stage] = result.stages
    assert stage.summary["itl_shared_read_fraction"] == 1.0
    assert shared_read_words(stage.summary).startswith("100.0% of the token gaps are 0")
    # The server sent them together and the client kept up: what arrived, not marked.
    assert stage.summary["late_reads"] is None
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(summary_table(result))
    assert "C=2: 100.0% of the token gaps are 0" in console.export_text()
