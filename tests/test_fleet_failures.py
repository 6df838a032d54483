"""The fleet limiter when Redis fails: wrong answers, a herd while degraded, slow versus
down, fail-open's bound, and the reservations an outage leaves behind (a real
redis-server, private to the session; the wrong answers come through a loopback proxy)."""

from __future__ import annotations

import signal
import uuid

import pytest
import trio

from benchmarks.redis_proxy import running_proxy
from benchmarks.redis_server import RedisServer
from trio_sampler.fleet import (
    AdmissionRefusedError,
    Cost,
    FailurePolicy,
    FleetEvent,
    FleetLimits,
    LimiterDegraded,
    LimiterSpec,
    RetryBudgetSpec,
    open_limiter,
)
from trio_sampler.types import SamplingErrorKind


def _spec(limits: FleetLimits, **kw: object) -> LimiterSpec:
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    kw.setdefault("admission_timeout", 1.0)
    return LimiterSpec(f"failures-{uuid.uuid4().hex[:12]}", limits, **kw)  # type: ignore[arg-type]


# Replies of the wrong shape for every script: a status, an integer, an array of strings,
# a nested array, an error-free noise line.
WRONG = {
    "ok": b"+OK\r\n",
    "integer": b":7\r\n",
    "strings": b"*2\r\n$1\r\na\r\n$1\r\nb\r\n",
    "short": b"*1\r\n:1\r\n",
    "unknown_status": b"*3\r\n:9\r\n:0\r\n:0\r\n",
    "nil": b"_\r\n",
}


@pytest.mark.parametrize("wrong", list(WRONG), ids=list(WRONG))
async def test_a_reply_of_the_wrong_shape_is_a_redis_failure(
    redis_server: RedisServer, wrong: str
) -> None:
    events: list[FleetEvent] = []
    spec = _spec(FleetLimits(requests_per_minute=1000, max_in_flight=4), probe_interval=0.05)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url, on_event=events.append) as limiter,
    ):
        proxy.wrong = WRONG[wrong]
        with trio.fail_after(spec.admission_timeout + 0.5):  # never a poll loop
            with pytest.raises(AdmissionRefusedError) as refused:
                await limiter.acquire(Cost())
        assert refused.value.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE
        assert limiter.degraded
        [degraded] = events
        assert isinstance(degraded, LimiterDegraded)
        assert "reply" in degraded.reason
        stats = limiter.statistics()
        assert stats.redis_failures == 1 and stats.malformed_replies == 1
        assert stats.leases == 0
        proxy.wrong = None
        await trio.sleep(0.06)
        permit = await limiter.acquire(Cost())  # the probe: Redis answers right again
        assert permit.shared and not limiter.statistics().degraded
        await limiter.release(permit, None)


async def test_noise_on_the_connection_is_a_redis_failure(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1000))
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        proxy.wrong = b"\x00\xffnot redis at all\r\n"
        with trio.fail_after(spec.admission_timeout + 0.5):
            with pytest.raises(AdmissionRefusedError) as refused:
                await limiter.acquire(Cost())
        assert refused.value.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE
        assert limiter.degraded


@pytest.mark.parametrize("wrong", ["ok", "strings"])
async def test_wrong_replies_to_the_other_scripts_apply_the_policy(
    redis_server: RedisServer, wrong: str
) -> None:
    spec = _spec(
        FleetLimits(requests_per_minute=1000, max_in_flight=4),
        retry_budget=RetryBudgetSpec(ratio=0.5, max_tokens=3),
        leases=None,  # the release is a script of its own (a lease's: at its give-back)
    )
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        permit = await limiter.acquire(Cost())
        proxy.wrong = WRONG[wrong]
        with trio.fail_after(spec.admission_timeout + 0.5):
            await limiter.release(permit, None)  # only the correction is lost
            assert not await limiter.try_retry()  # fail closed: no retries
            await limiter.note_retry_after(1.0)
        assert limiter.degraded
        assert limiter.statistics().leases == 0


# -- degraded: one probe at a time; slow is not down ------------------------------------------


async def test_while_degraded_one_call_probes_and_the_others_decide_at_once(
    redis_server: RedisServer,
) -> None:
    spec = _spec(FleetLimits(requests_per_minute=100_000), admission_timeout=0.25)
    process = redis_server.process
    assert process is not None
    async with open_limiter(spec, redis_server.url) as limiter:
        await limiter.acquire(Cost())
        process.send_signal(signal.SIGSTOP)  # connections hang: each probe takes 0.25 s
        try:
            for _ in range(3):  # slow three times in a row: degraded
                with pytest.raises(AdmissionRefusedError):
                    await limiter.acquire(Cost())
            assert limiter.degraded
            await trio.sleep(spec.probe_interval)  # a probe is due
            took: list[float] = []

            async def one() -> None:
                start = trio.current_time()
                with pytest.raises(AdmissionRefusedError):
                    await limiter.acquire(Cost())
                took.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
        finally:
            process.send_signal(signal.SIGCONT)
    took.sort()
    # One caller probes (within the admission timeout); 199 decide without waiting.
    assert took[-1] < spec.admission_timeout + 0.15
    assert took[-2] < 0.05


async def test_one_slow_round_trip_is_not_an_outage(redis_server: RedisServer) -> None:
    events: list[FleetEvent] = []
    spec = _spec(FleetLimits(requests_per_minute=100_000), admission_timeout=0.1)
    process = redis_server.process
    assert process is not None
    async with open_limiter(spec, redis_server.url, on_event=events.append) as limiter:
        await limiter.acquire(Cost())
        process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(AdmissionRefusedError):  # this one call: the policy
                await limiter.acquire(Cost())
        finally:
            process.send_signal(signal.SIGCONT)
        assert not limiter.degraded and events == []
        permit = await limiter.acquire(Cost())  # the next goes to Redis as usual
        assert permit.shared
        await limiter.release(permit, None)
        stats = limiter.statistics()
        assert stats.redis_failures == 1 and stats.degradations == 0


async def test_a_reconnect_that_hangs_is_bounded_by_the_admission_timeout(
    redis_server: RedisServer,
) -> None:
    # The connection is lost, and the new one hangs in its handshake (the connect timeout
    # is 1 s): each admission decides within its own admission timeout, and while the
    # limiter is degraded one call at a time probes (the others decide at once).
    # Per-request admissions: the probes are theirs (a lease's give-back would probe too).
    spec = _spec(
        FleetLimits(requests_per_minute=100_000),
        admission_timeout=0.2,
        probe_interval=0.05,
        leases=None,
    )
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        await limiter.release(await limiter.acquire(Cost()), None)
        proxy.stalled = True
        proxy.cut()
        proxy.heal()
        took: list[float] = []

        async def one() -> None:
            start = trio.current_time()
            with pytest.raises(AdmissionRefusedError):
                await limiter.acquire(Cost())
            took.append(trio.current_time() - start)

        for _ in range(3):  # the connection is found lost; then probes reconnect
            await one()
            await trio.sleep(spec.probe_interval)
        probes, took = took, []
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(one)
        assert limiter.degraded
    assert max(probes) > spec.admission_timeout - 0.01  # a reconnect hung: bounded
    took.sort()
    assert max(probes + took) < spec.admission_timeout + 0.1
    assert took[-2] < 0.05  # one call probes, the others decide at once


async def test_a_refused_connection_is_down_at_once() -> None:
    from benchmarks.redis_server import running_redis

    events: list[FleetEvent] = []
    with running_redis() as server:
        spec = _spec(FleetLimits(requests_per_minute=100))
        async with open_limiter(spec, server.url, on_event=events.append) as limiter:
            await limiter.acquire(Cost())
            server.stop()
            with pytest.raises(AdmissionRefusedError):
                await limiter.acquire(Cost())
            assert limiter.degraded
            assert [type(e) for e in events] == [LimiterDegraded]


# -- fail open: the overshoot is one process's share ------------------------------------------


async def test_fail_open_overshoots_by_at_most_its_share_of_a_burst() -> None:
    from benchmarks.redis_server import running_redis

    share = 1 / 8
    limits = FleetLimits(requests_per_minute=800, window_s=60.0)  # a burst of 800
    with running_redis() as server:
        spec = _spec(limits, on_failure=FailurePolicy.FAIL_OPEN, fallback_share=share)
        async with open_limiter(spec, server.url) as limiter:
            for _ in range(800):  # the whole shared burst, counted in Redis
                await limiter.acquire(Cost())
            server.stop()
            start = trio.current_time()
            admitted = 0
            with trio.move_on_after(0.5):
                while True:
                    await limiter.acquire(Cost(), deadline=trio.current_time() + 0.6)
                    admitted += 1
            elapsed = trio.current_time() - start
    # The local floor: its share of the burst, then its share of the rate.
    bound = share * 800 + share * 800 / 60.0 * elapsed + 1
    assert 0 < admitted <= bound


async def test_what_fail_open_admitted_locally_is_charged_when_redis_returns(
    redis_server: RedisServer,
) -> None:
    # A burst of 200 a minute; one process (share 1/2) admits 100 locally during a
    # partition. When Redis is back it counts them: about 100 of the shared burst are
    # left, not a fresh 200 on top of the 100.
    limits = FleetLimits(requests_per_minute=200, window_s=60.0)
    spec = _spec(
        limits,
        on_failure=FailurePolicy.FAIL_OPEN,
        fallback_share=0.5,
        admission_timeout=0.2,
        probe_interval=0.05,
    )
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        await limiter.acquire(Cost())
        proxy.cut()
        for _ in range(99):
            await limiter.acquire(Cost(), deadline=trio.current_time() + 0.5)
        assert limiter.statistics().admitted_locally == 99
        proxy.heal()
        await trio.sleep(spec.probe_interval)
        await limiter.acquire(Cost())  # the probe: Redis is back
        await trio.sleep(spec.admission_timeout)  # the local spending is charged
        admitted = 0
        with trio.move_on_after(2.0):
            while True:
                try:
                    await limiter.acquire(Cost(), deadline=trio.current_time() + 0.01)
                except AdmissionRefusedError:
                    break
                admitted += 1
    # 200 - 1 - 99 - 1 left, and a few refilled meanwhile (3.3 a second).
    assert 95 <= admitted <= 110, admitted


# -- every reservation has an owner ------------------------------------------------------------


async def test_admissions_that_timed_out_leave_no_slot_behind(redis_server: RedisServer) -> None:
    # Four admissions time out while Redis is paused; their scripts run when it resumes.
    # Their leases have no owner: they are given back, not held until lease_ttl (30 s).
    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=4)
    spec = _spec(limits, admission_timeout=0.1, probe_interval=0.05)
    process = redis_server.process
    assert process is not None
    async with open_limiter(spec, redis_server.url) as limiter:
        await limiter.release(await limiter.acquire(Cost()), None)
        process.send_signal(signal.SIGSTOP)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(_refused, limiter)
        finally:
            process.send_signal(signal.SIGCONT)
        await trio.sleep(spec.admission_timeout + spec.probe_interval)
        with trio.fail_after(spec.admission_timeout * 3):
            permits = [await limiter.acquire(Cost()) for _ in range(4)]
        assert all(p.shared for p in permits)
        for permit in permits:
            await limiter.release(permit, None)


async def _refused(limiter: object) -> None:
    from trio_sampler.fleet import FleetLimiter

    assert isinstance(limiter, FleetLimiter)
    with pytest.raises(AdmissionRefusedError):
        await limiter.acquire(Cost())


async def test_a_release_that_failed_is_sent_again_when_redis_is_back(
    redis_server: RedisServer,
) -> None:
    # A partition while two requests end: their releases fail, Redis keeps their leases.
    # Once Redis is reachable, the releases go again: the slots are back within one
    # admission timeout (not lease_ttl, 30 s).
    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=2)
    # Per-request releases (a lease gives its slots back together: the lease tests).
    spec = _spec(limits, admission_timeout=0.1, probe_interval=0.05, leases=None)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        permits = [await limiter.acquire(Cost()) for _ in range(2)]
        proxy.cut()
        for permit in permits:
            await limiter.release(permit, None)
        assert limiter.degraded
        await trio.sleep(0.3)
        proxy.heal()
        await trio.sleep(2 * spec.admission_timeout)  # the releases go again
        with trio.fail_after(spec.admission_timeout):
            again = [await limiter.acquire(Cost()) for _ in range(2)]
        assert all(p.shared for p in again)
        for permit in again:
            await limiter.release(permit, None)


async def test_a_settlement_sent_twice_refunds_once(redis_server: RedisServer) -> None:
    from trio_sampler.fleet._limiter import _SETTLE

    limits = FleetLimits(output_tokens_per_minute=1000, window_s=60.0, max_in_flight=4)
    spec = _spec(limits, leases=None)  # SETTLE's own idempotence
    async with open_limiter(spec, redis_server.url) as limiter:
        permit = await limiter.acquire(Cost(1, 0, 600))
        await limiter.release(permit, Cost(1, 0, 0))  # 600 refunded
        held = await limiter.acquire(Cost(1, 0, 1000))  # the whole burst again
        changes = [permit.lease, 0, 0, repr(-600 * 60.0 * 1_000_000 / 1000), 0]
        changes += ["x"] * 4
        await limiter._call(_SETTLE, limiter._keys_settle, changes)  # the same, again
        with pytest.raises(AdmissionRefusedError):  # no second refund: no room
            await limiter.acquire(Cost(1, 0, 100), deadline=trio.current_time() + 0.2)
        await limiter.release(held, None)


# -- reserve what will run, when it runs ---------------------------------------------------------


async def test_queued_requests_do_not_sit_on_the_token_budget(redis_server: RedisServer) -> None:
    # 1000 output tokens a second; each request reserves 500 and uses 50. Booked for their
    # future starts at admission, ten requests took 4.5 s (two a second); asking again
    # when their turn comes, the refunds of those done let them in at once.
    limits = FleetLimits(output_tokens_per_minute=1000, window_s=1.0)
    spec = _spec(limits)
    async with open_limiter(spec, redis_server.url) as limiter:
        start = trio.current_time()

        async def one() -> None:
            permit = await limiter.acquire(Cost(1, 0, 500))
            await trio.sleep(0.02)  # the request runs
            await limiter.release(permit, Cost(1, 0, 50))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
        took = trio.current_time() - start
    # 10 × 50 tokens used: half a second's budget, plus the asking again.
    assert took < 1.5


async def test_after_slow_replies_capacity_is_back_within_one_admission_timeout(
    redis_server: RedisServer,
) -> None:
    # A second of replies slower than the admission timeout: every admission meanwhile
    # is refused (fail closed) within the timeout, and the grants Redis made for them
    # come back; then all four slots are free within one admission timeout.
    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=4)
    # Each admission its own round trip: every one meets the slow reply (a late lease
    # grant joins the lease and is spent: tests/test_fleet_leases.py).
    spec = _spec(limits, admission_timeout=0.1, probe_interval=0.05, leases=None)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        await limiter.release(await limiter.acquire(Cost()), None)
        proxy.delay = 0.15
        took: list[float] = []

        async def asking() -> None:
            with trio.move_on_after(1.0):
                while True:
                    start = trio.current_time()
                    with pytest.raises(AdmissionRefusedError):
                        await limiter.acquire(Cost())
                    took.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(asking)
        proxy.delay = 0.0
        assert took and max(took) < spec.admission_timeout + 0.05
        # The last slow replies arrive; the grants in them go back.
        await trio.sleep(0.15 + spec.admission_timeout + spec.probe_interval)
        with trio.fail_after(spec.admission_timeout * 2):
            permits = [await limiter.acquire(Cost()) for _ in range(4)]
        assert all(p.shared for p in permits)
        for permit in permits:
            await limiter.release(permit, None)


async def test_a_redis_restarted_empty_gives_its_capacity_back_at_once() -> None:
    from benchmarks.redis_server import running_redis

    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=2)
    spec = _spec(limits, admission_timeout=0.2, probe_interval=0.05)
    with running_redis() as server:
        async with open_limiter(spec, server.url) as limiter:
            held = [await limiter.acquire(Cost()) for _ in range(2)]
            server.stop()
            server.start()  # empty: no lease, no script
            for permit in held:
                await limiter.release(permit, None)
            await trio.sleep(spec.probe_interval)
            with trio.fail_after(spec.admission_timeout):
                again = [await limiter.acquire(Cost()) for _ in range(2)]
            assert all(p.shared for p in again)


# -- in the sampler: every request one terminal ---------------------------------------------


@pytest.mark.parametrize("policy", [FailurePolicy.FAIL_CLOSED, FailurePolicy.FAIL_OPEN])
async def test_a_redis_answering_garbage_gives_every_request_one_terminal(
    redis_server: RedisServer, policy: FailurePolicy
) -> None:
    from trio_sampler import ConversationRequest, SamplerConfig, User
    from trio_sampler.actor import open_sampler
    from trio_sampler.emulator import EmulatorApp, PromptCache
    from trio_sampler.fleet import FleetAdmission
    from trio_sampler.testing import EmulatorTransport
    from trio_sampler.types import Completed, Failed

    events: list[FleetEvent] = []
    spec = _spec(
        FleetLimits(requests_per_minute=100_000, max_in_flight=50),
        on_failure=policy,
        fallback_share=1.0 if policy is FailurePolicy.FAIL_OPEN else None,
        admission_timeout=0.25,
    )
    config = SamplerConfig(base_url="http://emulator.test/v1", model="m", api_key="test-key")
    request = ConversationRequest(items=[User("hello")], max_output_tokens=20)
    terminals: list[object] = []
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        EmulatorTransport(EmulatorApp(cache=PromptCache())) as transport,
        open_sampler(
            config,
            transport=transport,
            admission=FleetAdmission(proxy.url, spec, on_event=events.append),
        ) as sampler,
    ):
        proxy.wrong = WRONG["ok"]

        async def one() -> None:
            stream = await sampler.submit(request)
            terminals.extend([e async for e in stream if isinstance(e, Completed | Failed)])

        with trio.fail_after(spec.admission_timeout + 1.0):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one)
    assert len(terminals) == 20
    if policy is FailurePolicy.FAIL_CLOSED:
        assert all(isinstance(t, Failed) for t in terminals)
        kinds = {t.error.kind for t in terminals if isinstance(t, Failed)}
        assert kinds == {SamplingErrorKind.FLEET_UNAVAILABLE}
    else:
        assert all(isinstance(t, Completed) for t in terminals)
    assert [type(e) for e in events][:1] == [LimiterDegraded]


async def test_a_late_reply_is_read_from_a_timed_out_coredis_request(
    redis_server: RedisServer,
) -> None:
    # The one read of coredis's private state (its request's ``_result``): a coredis
    # upgrade that changes it fails here, by name.
    from trio_sampler.fleet._limiter import late_reply, redis_client

    process = redis_server.process
    assert process is not None
    async with redis_client(redis_server.url) as client:
        connection = await client.connection_pool.get_connection()
        try:
            process.send_signal(signal.SIGSTOP)
            try:
                request = connection.create_request(b"ECHO", b"late", timeout=0.05)
                with pytest.raises(TimeoutError):
                    await request
                assert late_reply(request) is None and not request.complete
            finally:
                process.send_signal(signal.SIGCONT)
            with trio.fail_after(5):
                while not request.complete:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert late_reply(request) == b"late"
        finally:
            client.connection_pool.release(connection)
