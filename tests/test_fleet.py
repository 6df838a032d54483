"""The fleet limiter against a real redis-server (Unix socket, private to the session).

Windows are scaled down (a "minute" of 1-2 s) so rates show in a fraction of a second;
the logic is the one that runs with 60 s windows. Each test uses its own limiter name,
so tests sharing the server do not see each other's state.
"""

from __future__ import annotations

import math
import random
import signal
import socket
import subprocess
import sys
import uuid

import pytest
import trio

from benchmarks.redis_server import RedisServer, running_redis
from trio_sampler.fleet import (
    AdmissionRefusedError,
    Cost,
    FailurePolicy,
    FleetEvent,
    FleetLimits,
    LimiterDegraded,
    LimiterRecovered,
    LimiterSpec,
    RetryBudgetSpec,
    open_limiter,
    open_limiters,
)
from trio_sampler.fleet._limiter import SLOW_CALLS_TO_DEGRADE
from trio_sampler.fleet._local import GcraCell, LocalLimits
from trio_sampler.types import SamplingErrorKind


def _spec(limits: FleetLimits, **kw: object) -> LimiterSpec:
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    # Generous unless a test is about it: the suite shares two cores with other work.
    kw.setdefault("admission_timeout", 2.0)
    return LimiterSpec(f"test-{uuid.uuid4().hex[:12]}", limits, **kw)  # type: ignore[arg-type]


# -- configuration ---------------------------------------------------------------------


def test_limits_must_limit_something() -> None:
    with pytest.raises(ValueError, match="limits nothing"):
        FleetLimits()
    with pytest.raises(ValueError, match="requests_per_minute must be a positive"):
        FleetLimits(requests_per_minute=0)
    with pytest.raises(ValueError, match="burst"):
        FleetLimits(requests_per_minute=10, burst=1.5)
    with pytest.raises(ValueError, match="max_in_flight"):
        FleetLimits(max_in_flight=0)


def test_fail_open_needs_a_fallback_share() -> None:
    limits = FleetLimits(requests_per_minute=10)
    with pytest.raises(ValueError, match=r"fallback_share=1/8 for 8 processes"):
        LimiterSpec("acct", limits, on_failure=FailurePolicy.FAIL_OPEN)
    with pytest.raises(ValueError, match="fail_open"):
        LimiterSpec("acct", limits, on_failure="sometimes")
    with pytest.raises(ValueError, match="without braces"):
        LimiterSpec("a{b}", limits, on_failure="fail_closed")
    spec = LimiterSpec("acct", limits, on_failure="fail_open", fallback_share=0.25)
    assert spec.on_failure is FailurePolicy.FAIL_OPEN


def test_scaled_limits_keep_at_least_one_slot() -> None:
    limits = FleetLimits(requests_per_minute=80, tokens_per_minute=8000, max_in_flight=4)
    part = limits.scaled(1 / 8)
    assert part.requests_per_minute == 10
    assert part.tokens_per_minute == 1000
    assert part.max_in_flight == 1


def test_redis_url_is_checked() -> None:
    from trio_sampler.fleet import redis_client

    with pytest.raises(ValueError, match="unix://"):
        redis_client("localhost:6379")


# -- the local GCRA (the fail-open floor), under the mock clock --------------------------


async def test_gcra_cell_burst_then_steady_rate(autojump_clock: trio.testing.MockClock) -> None:
    cell = GcraCell(rate=60, window=60.0, burst=0.5)  # 1/s, bursts of 30
    now = trio.current_time()
    for _ in range(30):
        assert cell.wait(1, now) == 0
        cell.take(1, now)
    assert cell.wait(1, now) == pytest.approx(1.0)
    assert cell.wait(31, now) == math.inf  # more than one burst: never
    cell.adjust(-5, now)  # a refund makes room at once
    assert cell.wait(5, now) == 0


async def test_local_limits_settle_corrects_tokens(autojump_clock: trio.testing.MockClock) -> None:
    local = LocalLimits(FleetLimits(output_tokens_per_minute=1000, max_in_flight=1))
    now = trio.current_time()
    reserved = Cost(1, 0, 1000)
    local.take(reserved, now)
    assert not local.has_slot()
    assert local.wait(Cost(1, 0, 1), now) > 0
    local.settle(reserved, Cost(1, 0, 100), now)  # used 100 of 1000
    assert local.has_slot()
    assert local.wait(Cost(1, 0, 900), now) == 0


# -- shared limits in Redis ---------------------------------------------------------------


async def test_requests_beyond_the_burst_wait_for_the_rate(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=10, window_s=1.0, burst=0.5))  # 5 at once
    async with open_limiter(spec, redis_server.url) as limiter:
        start = trio.current_time()
        for _ in range(5):
            await limiter.release(await limiter.acquire(Cost()), None)
        assert trio.current_time() - start < 0.3
        for _ in range(4):
            await limiter.release(await limiter.acquire(Cost()), None)
        elapsed = trio.current_time() - start
        # 4 more at 10 per second: 0.4 s after the start (Redis's clock and trio's agree to
        # well under a millisecond per second; the upper bound allows for a loaded machine).
        assert 0.38 < elapsed < 1.0
        assert limiter.statistics().admitted == 9


async def test_two_limiters_share_one_budget(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=6, window_s=60.0))
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        for limiter in (first, second, first, second, first, second):
            await limiter.acquire(Cost(), deadline=trio.current_time() + 0.05)
        with pytest.raises(AdmissionRefusedError) as refused:
            await second.acquire(Cost(), deadline=trio.current_time() + 1.0)
        assert refused.value.info.kind is SamplingErrorKind.RATE_LIMITED
        assert refused.value.info.error_code == "fleet_rate_limited"
        assert second.statistics().refused == 1


async def test_a_refused_admission_reserves_nothing(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=2, window_s=1.0, burst=0.5))  # 1 at once, 2/s
    async with open_limiter(spec, redis_server.url) as limiter:
        await limiter.acquire(Cost())
        for _ in range(5):  # each would wait 0.5 s, past a 0.1 s deadline
            with pytest.raises(AdmissionRefusedError):
                await limiter.acquire(Cost(), deadline=trio.current_time() + 0.1)
        # Nothing was reserved by the refusals: the next one waits one interval, not six.
        start = trio.current_time()
        await limiter.acquire(Cost())
        assert trio.current_time() - start < 1.2  # six reservations would be 3 s


async def test_a_cost_above_the_burst_is_an_invalid_request(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(tokens_per_minute=1000, window_s=60.0, burst=0.5))
    async with open_limiter(spec, redis_server.url) as limiter:
        with pytest.raises(AdmissionRefusedError) as refused:
            await limiter.acquire(Cost(1, 400, 200))
        assert refused.value.info.kind is SamplingErrorKind.INVALID_REQUEST
        assert "tokens" in refused.value.info.message
        await limiter.acquire(Cost(1, 300, 200))


async def test_unused_output_tokens_are_refunded(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(output_tokens_per_minute=1000, window_s=60.0))
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost(1, 0, 1000))
        with pytest.raises(AdmissionRefusedError):  # 10 tokens refill in 0.6 s
            await limiter.acquire(Cost(1, 0, 10), deadline=trio.current_time() + 0.2)
        await limiter.release(permit, Cost(1, 0, 100))
        await limiter.acquire(Cost(1, 0, 900), deadline=trio.current_time() + 0.05)


async def test_usage_above_the_reservation_is_charged(redis_server: RedisServer) -> None:
    # Charged by this release's own round trip (a lease charges it with its next call).
    spec = _spec(FleetLimits(input_tokens_per_minute=1000, window_s=60.0), leases=None)
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost(1, 100, 0))
        await limiter.release(permit, Cost(1, 800, 0))  # the estimate was low
        with pytest.raises(AdmissionRefusedError):
            await limiter.acquire(Cost(1, 300, 0), deadline=trio.current_time() + 0.2)
        await limiter.acquire(Cost(1, 200, 0), deadline=trio.current_time() + 0.05)


async def test_release_is_idempotent(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(output_tokens_per_minute=1000, window_s=60.0))
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost(1, 0, 500))
        await limiter.acquire(Cost(1, 0, 500))
        await limiter.release(permit, Cost(1, 0, 0))
        await limiter.release(permit, Cost(1, 0, 0))  # no second refund
        await limiter.acquire(Cost(1, 0, 500), deadline=trio.current_time() + 0.05)
        with pytest.raises(AdmissionRefusedError):
            await limiter.acquire(Cost(1, 0, 10), deadline=trio.current_time() + 0.05)


async def test_cancelled_while_waiting_gives_the_reservation_back(
    redis_server: RedisServer,
) -> None:
    spec = _spec(FleetLimits(requests_per_minute=2, window_s=1.0, burst=0.5))
    async with open_limiter(spec, redis_server.url) as limiter:
        await limiter.acquire(Cost())
        with trio.move_on_after(0.05) as scope:
            await limiter.acquire(Cost())  # reserved for t+0.5 s, then cancelled
        assert scope.cancelled_caught
        start = trio.current_time()
        await limiter.acquire(Cost())  # takes the returned slot (t+0.5 s), not t+1 s
        assert trio.current_time() - start < 0.8


# -- in-flight leases ---------------------------------------------------------------------


async def test_in_flight_slots_are_shared_and_released(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(max_in_flight=2))
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        held = [await first.acquire(Cost()), await second.acquire(Cost())]
        with pytest.raises(AdmissionRefusedError):
            await first.acquire(Cost(), deadline=trio.current_time() + 0.1)
        admitted_at: list[float] = []

        async def third() -> None:
            await second.acquire(Cost())
            admitted_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.sleep(0.1)
            released_at = trio.current_time()
            await first.release(held[0], None)
        assert admitted_at[0] - released_at < 0.3  # noticed within the poll interval
        assert first.statistics().leases == 0
        assert second.statistics().leases == 2


async def test_a_dead_process_slot_expires(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(max_in_flight=1), lease_ttl=0.3)
    async with open_limiter(spec, redis_server.url) as survivor:
        # A process that took the slot and died: its lease is never renewed or released.
        async with open_limiter(spec, redis_server.url) as doomed:
            await doomed.acquire(Cost())
            doomed._leases.clear()  # what dying amounts to: nobody renews it
        start = trio.current_time()
        await survivor.acquire(Cost(), deadline=start + 2.0)
        assert 0.15 < trio.current_time() - start < 1.0


async def test_live_leases_are_renewed(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(max_in_flight=1), lease_ttl=0.3)
    async with (
        open_limiter(spec, redis_server.url) as holder,
        open_limiter(spec, redis_server.url) as other,
    ):
        await holder.acquire(Cost())
        with pytest.raises(AdmissionRefusedError):  # three lease lifetimes later, still held
            await other.acquire(Cost(), deadline=trio.current_time() + 0.9)


# -- retry budget and Retry-After ---------------------------------------------------------


async def test_fleet_retry_budget_is_shared(redis_server: RedisServer) -> None:
    budget = RetryBudgetSpec(ratio=0.5, max_tokens=2)
    # Each admission deposits on its own round trip (a lease's deposits go with its next
    # call, see tests/test_fleet_leases.py).
    spec = _spec(FleetLimits(requests_per_minute=1000), retry_budget=budget, leases=None)
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        assert await first.try_retry()
        assert await second.try_retry()
        assert not await first.try_retry()  # the bucket started with 2 tokens
        for _ in range(2):  # two first attempts deposit 0.5 each
            await second.acquire(Cost())
        await first.acquire(Cost(), first_attempt=False)  # a retry deposits nothing
        assert await first.try_retry()
        assert not await second.try_retry()
        assert first.statistics().retries_refused == 1


async def test_retry_after_holds_the_whole_fleet(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1000), retry_after_jitter=0.5)
    async with (
        open_limiter(spec, redis_server.url, rng=random.Random(1)) as first,
        open_limiter(spec, redis_server.url, rng=random.Random(2)) as second,
    ):
        await first.note_retry_after(0.2)
        starts: list[float] = []
        start = trio.current_time()

        async def one(limiter: object) -> None:
            assert limiter is first or limiter is second
            await limiter.acquire(Cost())
            starts.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, first)
            nursery.start_soon(one, second)
        assert all(0.19 < s < 0.5 for s in starts), starts
        assert abs(starts[0] - starts[1]) > 0.005  # jittered per process, not in lockstep
        await first.note_retry_after(5.0)
        start = trio.current_time()
        with pytest.raises(AdmissionRefusedError):  # a window past the deadline: refused at once
            await second.acquire(Cost(), deadline=start + 1.0)
        assert trio.current_time() - start < 0.1


# -- failure policy -----------------------------------------------------------------------


async def test_fail_closed_refuses_within_the_admission_timeout() -> None:
    events: list[FleetEvent] = []
    with running_redis() as server:
        spec = _spec(
            FleetLimits(requests_per_minute=100),
            admission_timeout=0.2,
            retry_budget=RetryBudgetSpec(),
        )
        async with open_limiter(spec, server.url, on_event=events.append) as limiter:
            await limiter.acquire(Cost())
            server.stop()
            start = trio.current_time()
            with pytest.raises(AdmissionRefusedError) as refused:
                await limiter.acquire(Cost())
            assert trio.current_time() - start < spec.admission_timeout + 0.1
            assert refused.value.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE
            assert limiter.degraded
            assert [type(e) for e in events] == [LimiterDegraded]
            assert isinstance(events[0], LimiterDegraded)
            assert events[0].policy is FailurePolicy.FAIL_CLOSED
            # While degraded, refusals are immediate (no Redis call until the next probe).
            with pytest.raises(AdmissionRefusedError):
                await limiter.acquire(Cost())
            assert limiter.statistics().refused_unavailable == 2
            assert not await limiter.try_retry()  # no retries without the shared budget


async def test_fail_open_admits_under_local_limits_and_recovers() -> None:
    events: list[FleetEvent] = []
    with running_redis() as server:
        spec = _spec(
            FleetLimits(requests_per_minute=80, window_s=60.0),
            on_failure=FailurePolicy.FAIL_OPEN,
            fallback_share=1 / 8,
            probe_interval=0.1,
        )
        async with open_limiter(spec, server.url, on_event=events.append) as limiter:
            await limiter.acquire(Cost())
            server.stop()
            for _ in range(10):  # the local floor: 80 / 8 = 10 per window
                await limiter.acquire(Cost(), deadline=trio.current_time() + 0.3)
            with pytest.raises(AdmissionRefusedError) as refused:
                await limiter.acquire(Cost(), deadline=trio.current_time() + 0.3)
            assert refused.value.info.kind is SamplingErrorKind.RATE_LIMITED
            assert limiter.statistics().admitted_locally == 10
            assert [type(e) for e in events] == [LimiterDegraded]
            server.start()
            await trio.sleep(0.15)
            await limiter.acquire(Cost())
            assert not limiter.degraded
            assert [type(e) for e in events] == [LimiterDegraded, LimiterRecovered]
            recovered = events[1]
            assert isinstance(recovered, LimiterRecovered) and recovered.degraded_for > 0
            assert limiter.statistics().admitted == 2


async def test_a_hung_redis_is_a_timeout_not_a_hang(redis_server: RedisServer) -> None:
    events: list[FleetEvent] = []
    spec = _spec(FleetLimits(requests_per_minute=100), admission_timeout=0.1)
    async with open_limiter(spec, redis_server.url, on_event=events.append) as limiter:
        await limiter.acquire(Cost())
        assert redis_server.process is not None
        redis_server.process.send_signal(19)  # SIGSTOP: the socket accepts, nobody answers
        try:
            # Each call ends within the admission timeout; three in a row: degraded.
            for _ in range(SLOW_CALLS_TO_DEGRADE):
                start = trio.current_time()
                with pytest.raises(AdmissionRefusedError):
                    await limiter.acquire(Cost())
                assert trio.current_time() - start < spec.admission_timeout + 0.1
        finally:
            redis_server.process.send_signal(18)  # SIGCONT
        assert isinstance(events[0], LimiterDegraded)
        assert "admission timeout" in events[0].reason


def test_importing_the_library_does_not_need_coredis() -> None:
    code = "import sys, trio_sampler; assert 'coredis' not in sys.modules, 'coredis imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_without_refunds_only_overuse_is_settled(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(output_tokens_per_minute=1000, window_s=60.0), refund_unused=False)
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost(1, 0, 600))
        await limiter.release(permit, Cost(1, 0, 10))  # the provider keeps the 600
        with pytest.raises(AdmissionRefusedError):
            await limiter.acquire(Cost(1, 0, 500), deadline=trio.current_time() + 0.2)
        with trio.move_on_after(0.05) as scope:  # a request never sent gives all back
            await limiter.acquire(Cost(1, 0, 500))  # reserved to start in 6 s, cancelled
        assert scope.cancelled_caught
        await limiter.acquire(Cost(1, 0, 400), deadline=trio.current_time() + 0.05)


# -- the connection: cancellation, timeouts, URLs -------------------------------------------


async def test_cancelled_mid_call_gives_its_reservation_back(redis_server: RedisServer) -> None:
    # One request at once and one in-flight slot: a reservation or a lease left behind by
    # the cancelled call would hold the next admission back (0.5 s, or the 30 s lease).
    limits = FleetLimits(requests_per_minute=2, window_s=1.0, burst=0.5, max_in_flight=1)
    # The per-request slot (a lease keeps an idle slot for ``hold``: the lease tests).
    spec = _spec(limits, leases=None)
    async with open_limiter(spec, redis_server.url) as limiter:
        process = redis_server.process
        assert process is not None
        process.send_signal(signal.SIGSTOP)  # the call is sent; the reply waits for SIGCONT
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_continue_after, process, 0.3)
                with trio.move_on_after(0.1) as scope:
                    await limiter.acquire(Cost())
                assert scope.cancelled_caught
        finally:
            process.send_signal(signal.SIGCONT)
        assert not limiter.degraded
        permit = await limiter.acquire(Cost(), deadline=trio.current_time() + 0.2)
        assert permit.shared
        assert limiter.statistics().leases == 1
        await limiter.release(permit, None)
        assert limiter.statistics().leases == 0


async def _continue_after(process: subprocess.Popen[bytes], delay: float) -> None:
    await trio.sleep(delay)
    process.send_signal(signal.SIGCONT)


async def test_a_late_reply_is_not_taken_for_the_next_ones(redis_server: RedisServer) -> None:
    spec = _spec(
        FleetLimits(requests_per_minute=1000, max_in_flight=10),
        admission_timeout=0.1,
        probe_interval=0.05,
        retry_budget=RetryBudgetSpec(ratio=0.5, max_tokens=3),
        leases=None,  # each script's own reply (a lease call's: the lease tests)
    )
    async with open_limiter(spec, redis_server.url) as limiter:
        process = redis_server.process
        assert process is not None
        process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(AdmissionRefusedError):  # timed out: its reply comes later
                await limiter.acquire(Cost())
        finally:
            process.send_signal(signal.SIGCONT)
        assert not limiter.degraded  # one slow call is not an outage
        # Each call reads its own reply (shaped differently per script), not the stale one.
        assert await limiter.try_retry()
        permit = await limiter.acquire(Cost())
        assert permit.shared
        await limiter.release(permit, None)
        assert await limiter.try_retry()
        stats = limiter.statistics()
        assert not stats.degraded and stats.redis_failures == 1 and stats.leases == 0


async def test_scripts_are_loaded_again_after_a_flush(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1000))
    async with open_limiter(spec, redis_server.url) as limiter:
        await limiter.acquire(Cost())
        redis_server.flush()
        await trio.run_process(
            ["redis-cli", "-s", str(redis_server.socket_path), "SCRIPT", "FLUSH"],
            capture_stdout=True,
        )
        permit = await limiter.acquire(Cost())
        await limiter.release(permit, None)
        assert limiter.statistics().redis_failures == 0


async def test_a_tcp_url_works_like_a_unix_socket() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with running_redis(port) as server:
        spec = _spec(FleetLimits(requests_per_minute=2, window_s=1.0, burst=0.5))
        async with open_limiter(spec, server.tcp_url) as limiter:
            await limiter.acquire(Cost())
            with pytest.raises(AdmissionRefusedError):  # the burst is shared over TCP too
                await limiter.acquire(Cost(), deadline=trio.current_time() + 0.1)
            assert limiter.statistics().redis_failures == 0


async def test_an_unreachable_tcp_redis_degrades_within_the_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here
    events: list[FleetEvent] = []
    spec = _spec(FleetLimits(requests_per_minute=100), admission_timeout=0.2)
    start = trio.current_time()
    async with open_limiter(spec, f"redis://127.0.0.1:{port}/0", on_event=events.append) as lim:
        with pytest.raises(AdmissionRefusedError) as refused:
            await lim.acquire(Cost())
        assert refused.value.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE
    assert trio.current_time() - start < 1.5
    assert [type(e) for e in events] == [LimiterDegraded]


def test_the_connection_is_built_from_the_url() -> None:
    from coredis.connection import TCPConnection, UnixDomainSocketConnection

    from trio_sampler.fleet import redis_client

    tls = redis_client("rediss://:secret@127.0.0.1:6380/2?ssl_cert_reqs=none").connection_pool
    assert tls.connection_class is TCPConnection
    assert tls.connection_kwargs.get("ssl_context") is not None
    assert tls.connection_kwargs.get("password") == "secret"
    assert tls.connection_kwargs.get("db") == 2
    plain = redis_client("redis://127.0.0.1:6379/0").connection_pool
    assert plain.connection_kwargs.get("ssl_context") is None
    unix = redis_client("unix:///run/redis/redis.sock").connection_pool
    assert unix.connection_class is UnixDomainSocketConnection


async def test_the_limiters_of_a_client_share_one_connection() -> None:
    specs = [_spec(FleetLimits(requests_per_minute=1000)) for _ in range(3)]
    with running_redis() as server:
        async with open_limiters(specs, server.url) as limiters:
            async with trio.open_nursery() as nursery:
                for limiter in limiters:
                    for _ in range(5):
                        nursery.start_soon(limiter.acquire, Cost())
            listed = await trio.run_process(
                ["redis-cli", "-s", str(server.socket_path), "CLIENT", "LIST"],
                capture_stdout=True,
            )
            clients = listed.stdout.decode().splitlines()
            assert len(clients) == 2, clients  # the limiters' connection and redis-cli
            assert all(limiter.statistics().admitted == 5 for limiter in limiters)
