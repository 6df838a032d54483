"""Leases: a process takes a batch of each limit from Redis and spends it locally.

The book (what a process holds) is tested under the mock clock; the LEASE script and
the limiter against the private redis-server of the session (windows long enough that
the refill during a test is under one unit, so the counts are exact)."""

from __future__ import annotations

import math
import signal
import uuid

import pytest
import trio
import trio.testing

from benchmarks.redis_proxy import running_proxy
from benchmarks.redis_server import RedisServer
from trio_sampler import ConversationRequest, SamplerConfig, User
from trio_sampler.actor import open_sampler
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.fleet import (
    AdmissionRefusedError,
    Cost,
    FailurePolicy,
    FleetAdmission,
    FleetLimits,
    LeasePolicy,
    LimiterSpec,
    RetryBudgetSpec,
    open_limiter,
)
from trio_sampler.fleet._lease import LeaseBook
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import Completed, SamplingErrorKind

HOUR = 3600.0


def _spec(limits: FleetLimits, policy: LeasePolicy | None = None, **kw: object) -> LimiterSpec:
    kw.setdefault("on_failure", FailurePolicy.FAIL_CLOSED)
    kw.setdefault("admission_timeout", 2.0)
    return LimiterSpec(
        f"leases-{uuid.uuid4().hex[:12]}",
        limits,
        leases=policy or LeasePolicy(),
        **kw,  # type: ignore[arg-type]
    )


async def _drain(limiter: object, cost: Cost | None = None, within: float = 0.02) -> int:
    """Admit ``cost`` until the limiter refuses; how many it admitted."""
    from trio_sampler.fleet import FleetLimiter

    assert isinstance(limiter, FleetLimiter)
    admitted = 0
    while True:
        try:
            await limiter.acquire(cost or Cost(), deadline=trio.current_time() + within)
        except AdmissionRefusedError:
            return admitted
        admitted += 1


# -- configuration ------------------------------------------------------------------------


def test_lease_policy_is_checked() -> None:
    with pytest.raises(ValueError, match=r"LeasePolicy.share is a share in \(0, 1\]"):
        LeasePolicy(share=0)
    with pytest.raises(ValueError, match=r"LeasePolicy\.hold must be a positive number"):
        LeasePolicy(hold=-1)
    with pytest.raises(ValueError, match=r"LeasePolicy\.max_slots must be an int >= 1"):
        LeasePolicy(max_slots=0)
    with pytest.raises(TypeError, match=r"LimiterSpec\.leases must be a LeasePolicy"):
        LimiterSpec("acct", FleetLimits(requests_per_minute=1), on_failure="fail_closed", leases=5)  # type: ignore[arg-type]


# -- the book, under the mock clock --------------------------------------------------------


def _book(policy: LeasePolicy | None = None, slots: bool = False) -> LeaseBook:
    # requests and tokens limited; input and output tokens not
    return LeaseBook(policy or LeasePolicy(horizon=0.1), [1.0, 0.0, 0.0, 1.0], slots)


async def test_the_batch_follows_the_rate(autojump_clock: trio.testing.MockClock) -> None:
    book = _book()
    cost = Cost(1, 100, 50)
    assert book.want(cost, trio.current_time()) == [1, 0, 0, 150]  # no rate yet: one request
    book.granted([1, 0, 0, 150], [], trio.current_time())
    for _ in range(10):  # 100 requests a second
        await trio.sleep(0.01)
        assert book.covers(cost)
        book.take(cost)
        book.granted([1, 0, 0, 150], [], trio.current_time())
    want = book.want(cost, trio.current_time())
    assert 4 <= want[0] <= 10  # smoothed towards 100/s x 0.1 s
    # Quiet for a while: the batch shrinks back.
    await trio.sleep(1.0)
    assert book.want(cost, trio.current_time())[0] < want[0]
    capped = _book(LeasePolicy(horizon=10.0, max_requests=3))
    capped.want(Cost(1, 0, 0), 0.0)  # a refill: the rate is measured from here
    capped.granted([1000, 0, 0, 1000], [], 0.0)
    for _ in range(1000):
        capped.take(Cost(1, 0, 0))
    assert capped.want(Cost(1, 0, 0), 0.5)[0] == 3


async def test_a_request_needs_all_it_lacks(autojump_clock: trio.testing.MockClock) -> None:
    book = _book()
    book.granted([2, 0, 0, 100], [], 0.0)
    assert not book.covers(Cost(1, 80, 40))
    assert book.need(Cost(1, 80, 40)) == [0, 0, 0, 20]
    assert book.covers(Cost(1, 60, 40))


async def test_settling_refunds_into_the_book_and_owes_overuse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = _book(slots=True)
    book.granted([2, 0, 0, 300], ["slot:1"], 0.0)
    reserved = Cost(1, 100, 100)
    slot = book.take(reserved)
    assert slot == "slot:1" and not book.covers(reserved)  # its slot is in use
    book.settle(reserved, Cost(1, 100, 20), slot, 0.0)
    assert book.balance == [1, 0, 0, 180] and book.free_slots == ["slot:1"]
    book.take(reserved)
    book.settle(reserved, Cost(1, 100, 250), "slot:1", 0.0)  # used more than reserved
    assert book.balance[3] == 180 - 350  # reserved 200, used 350
    book.take(Cost(0, 0, 0))
    back = book.give_back("id-1")
    assert back is not None and back.units == [0, 0, 0, -170]  # owed: charged on give-back
    assert book.give_back("id-2") is back  # pending until Redis confirms, same id


async def test_what_is_granted_while_a_give_back_is_pending_stays_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A give-back Redis has not confirmed goes first; a batch granted meanwhile (a late
    # reply) keeps its time to go back, rather than waiting for a request to settle
    # (none may come: its slots would be renewed with the others, held for good).
    book = _book(slots=True)
    book.granted([1, 0, 0, 0], ["slot:1"], 0.0)
    first = book.give_back("id-1")
    assert first is not None and math.isinf(book.expires)  # nothing left in the book
    book.granted([0, 0, 0, 0], ["slot:2"], 1.0)
    assert book.give_back("id-2") is first  # the pending one is sent again first
    assert book.expires == 1.0 + book.policy.hold and book.free_slots == ["slot:2"]
    book.pending = None  # Redis confirmed it
    second = book.give_back("id-3")
    assert second is not None and second.slots == ["slot:2"] and math.isinf(book.expires)


async def test_slots_asked_for_are_the_requests_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = _book(LeasePolicy(max_slots=4), slots=True)
    book.waiting = 1
    assert book.slots_wanted() == (1, 1)
    book.waiting = 10
    assert book.slots_wanted() == (4, 1)
    book.granted([0, 0, 0, 0], ["a", "b"], 0.0)
    book.waiting = 3
    assert book.slots_wanted() == (1, 0)


async def test_while_the_fleet_is_full_what_is_freed_goes_back_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Another process waits for a slot (the fleet refused a refill): a slot this process
    # frees goes back now, not ``hold`` later; once a refill is granted, hold again.
    book = _book(LeasePolicy(hold=5.0), slots=True)
    book.granted([0, 0, 0, 0], ["slot:1", "slot:2"], 0.0)
    held = book.take(Cost(0, 0, 0))
    book.take(Cost(0, 0, 0))
    assert book.expires == 5.0
    book.fleet_full(1.0)
    assert book.expires == 1.0  # the idle rest (none here) goes back now
    book.give_back("id-1")
    book.pending = None
    assert math.isinf(book.expires)
    book.settle(Cost(0, 0, 0), None, held, 2.0)
    assert book.expires == 2.0 and book.wake.is_set()  # the freed slot: now
    book.give_back("id-2")
    book.pending = None
    book.granted([0, 0, 0, 0], ["slot:3"], 3.0)
    slot = book.take(Cost(0, 0, 0))
    book.give_back("id-3")
    book.pending = None
    book.settle(Cost(0, 0, 0), None, slot, 4.0)
    assert book.expires == 4.0 + 5.0  # room again: held for hold


# -- against Redis -------------------------------------------------------------------------


async def test_admissions_spend_the_lease_without_a_round_trip_each(
    redis_server: RedisServer,
) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1e6, tokens_per_minute=1e9, max_in_flight=100))
    async with open_limiter(spec, redis_server.url) as limiter:

        async def task() -> None:
            for _ in range(200):
                permit = await limiter.acquire(Cost(1, 100, 50))
                await limiter.release(permit, Cost(1, 100, 10))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(task)
        stats = limiter.statistics()
        assert stats.admitted == 2000
        assert stats.lease_refills < 200  # batches, not one call per admission
        assert stats.leases <= 10  # slots held: no more than the tasks running


async def test_the_fleet_limit_is_exact_across_processes(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=100, window_s=HOUR))
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        admitted = [0, 0]
        for turn in range(400):
            try:
                await (first, second)[turn % 2].acquire(Cost(), deadline=trio.current_time() + 0.02)
            except AdmissionRefusedError:
                continue
            admitted[turn % 2] += 1
        assert sum(admitted) == 100  # not one more, not one less
        assert min(admitted) >= 25


async def test_one_batch_takes_at_most_a_share_of_the_room(redis_server: RedisServer) -> None:
    policy = LeasePolicy(share=0.25, horizon=60.0, hold=60.0, max_requests=10_000)
    spec = _spec(FleetLimits(requests_per_minute=1000, window_s=HOUR), policy)
    async with (
        open_limiter(spec, redis_server.url) as greedy,
        open_limiter(spec, redis_server.url) as other,
    ):
        for _ in range(50):  # a high rate: it wants far more than the room
            await greedy.acquire(Cost())
        assert greedy._book is not None
        assert greedy._book.balance[0] <= 0.25 * 1000
        # The other process still finds the rest: 1000 - 50 admitted - what greedy holds.
        held = greedy._book.balance[0]
        assert await _drain(other) == 1000 - 50 - held


async def test_the_rest_goes_back_on_close_and_after_hold(redis_server: RedisServer) -> None:
    # A window of 100 hours: under 0.1 token refills while the test runs.
    limits = FleetLimits(requests_per_minute=100, tokens_per_minute=10_000, window_s=100 * HOUR)
    spec = _spec(limits, LeasePolicy(hold=0.2, horizon=60.0))
    # Usage reconciled in the book: 10 requests of 100 + 400 reserved, using 100 + 50.
    async with open_limiter(spec, redis_server.url) as limiter:
        for _ in range(10):
            permit = await limiter.acquire(Cost(1, 100, 400))
            await limiter.release(permit, Cost(1, 100, 50))
        assert limiter._book is not None and limiter._book.balance[0] > 0
        await trio.sleep(0.4)  # past hold: the rest went back
        assert limiter._book.balance == [0, 0, 0, 0]
        for _ in range(5):  # and on close
            await limiter.acquire(Cost(1, 100, 400))
    without = LimiterSpec(spec.name, limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with open_limiter(without, redis_server.url) as plain:
        # 15 requests and 10 x 150 + 5 x 500 tokens were charged; the rest is there.
        assert await _drain(plain, Cost(1, 0, 0)) == 100 - 15
    async with open_limiter(without, redis_server.url) as plain:
        refused = await _drain(plain, Cost(0, 0, 10_000 - 4000 + 1))
        assert refused == 0
        assert await _drain(plain, Cost(0, 0, 10_000 - 4000)) == 1


async def test_in_flight_slots_are_not_held_beyond_use(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(max_in_flight=10), LeasePolicy(hold=0.2))
    async with (
        open_limiter(spec, redis_server.url) as first,
        open_limiter(spec, redis_server.url) as second,
    ):
        held = [await first.acquire(Cost()) for _ in range(3)]
        assert first.statistics().leases == 3
        others = [
            await second.acquire(Cost(), deadline=trio.current_time() + 0.5) for _ in range(7)
        ]
        with pytest.raises(AdmissionRefusedError):
            await second.acquire(Cost(), deadline=trio.current_time() + 0.05)
        for permit in held:
            await first.release(permit, None)
        # Idle in the first process's book for at most ``hold``, then back to the fleet.
        await second.acquire(Cost(), deadline=trio.current_time() + 1.0)
        assert first.statistics().leases == 0
        del others


async def test_a_dead_process_lease_expires(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(max_in_flight=2), lease_ttl=0.3)
    async with open_limiter(spec, redis_server.url) as survivor:
        async with open_limiter(spec, redis_server.url) as doomed:
            await doomed.acquire(Cost())
            await doomed.acquire(Cost())
            doomed._leases.clear()  # what dying amounts to: nobody renews or gives back
            assert doomed._book is not None
            doomed._book.free_slots.clear()
        start = trio.current_time()
        await survivor.acquire(Cost(), deadline=start + 2.0)
        assert 0.15 < trio.current_time() - start < 1.0


async def test_a_give_back_sent_twice_counts_once(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=100, window_s=HOUR), LeasePolicy(horizon=60.0))
    async with open_limiter(spec, redis_server.url) as limiter:
        for _ in range(20):
            await limiter.acquire(Cost())
        book = limiter._book
        assert book is not None
        back = book.give_back("twice")
        assert back is not None and back.units[0] > 0
        for _ in range(2):  # the first reply lost: sent again with the same id
            book.pending = back
            await limiter._lease_call([0] * 4, [0] * 4, 0, 0, prefix="", abandoned=None)
    without = LimiterSpec(spec.name, spec.limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with open_limiter(without, redis_server.url) as plain:
        assert await _drain(plain) == 100 - 20


async def test_redis_down_applies_the_policy_when_the_lease_runs_out(
    redis_server: RedisServer,
) -> None:
    spec = _spec(
        FleetLimits(requests_per_minute=1000, window_s=HOUR),
        LeasePolicy(horizon=60.0, hold=60.0),
        admission_timeout=0.2,
        probe_interval=0.1,
        retry_budget=RetryBudgetSpec(ratio=0.5, max_tokens=2),
    )
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        for _ in range(20):
            await limiter.acquire(Cost())
        assert limiter._book is not None
        held = limiter._book.balance[0]
        assert held > 0
        proxy.cut()
        # What the lease holds was charged: spent without Redis, exactly.
        for _ in range(held):
            await limiter.acquire(Cost())
        with (
            trio.fail_after(spec.admission_timeout + 0.5),
            pytest.raises(AdmissionRefusedError) as refused,
        ):
            await limiter.acquire(Cost())
        assert refused.value.info.kind is SamplingErrorKind.FLEET_UNAVAILABLE
        assert limiter.statistics().redis_failures >= 1
        proxy.heal()
        await trio.sleep(spec.probe_interval)
        await limiter.acquire(Cost(), deadline=trio.current_time() + 2.0)
        assert not limiter.degraded


async def test_a_shared_retry_after_is_not_spent_through(redis_server: RedisServer) -> None:
    spec = _spec(FleetLimits(requests_per_minute=1000, window_s=HOUR), LeasePolicy(hold=60.0))
    async with open_limiter(spec, redis_server.url) as limiter:
        for _ in range(5):
            await limiter.acquire(Cost())
        assert limiter._book is not None and limiter._book.balance[0] > 0
        await limiter.note_retry_after(0.3)
        start = trio.current_time()
        await limiter.acquire(Cost())
        assert trio.current_time() - start >= 0.29  # waited for the window's end


async def test_the_sampler_with_leases_keeps_the_emulator_within_its_limits(
    redis_server: RedisServer,
) -> None:
    # 20 requests and 4000 tokens per (scaled) 1 s window at the emulator; the fleet at 95 %.
    app = EmulatorApp(
        cache=PromptCache(),
        rate_limits=RateLimits(requests_per_minute=20, tokens_per_minute=4000, window_s=1.0),
    )
    limits = FleetLimits(requests_per_minute=19, tokens_per_minute=3800, window_s=1.0)
    spec = _spec(limits)
    config = SamplerConfig(base_url="http://emulator.test/v1", model="emulator-1", api_key="k")
    request = ConversationRequest(items=[User("hello")], max_output_tokens=50)
    terminals: list[object] = []
    start = trio.current_time()
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(
            config, transport=transport, admission=FleetAdmission(redis_server.url, spec)
        ) as sampler,
    ):

        async def one() -> None:
            stream = await sampler.submit(request)
            terminals.append([event async for event in stream][-1])

        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(one)
    assert all(isinstance(t, Completed) for t in terminals), terminals
    assert app.rate_limits is not None and app.rate_limits.refusals == {}
    assert trio.current_time() - start > 0.55  # 19 at once, then 11 more at 19 per second


async def test_a_batch_granted_after_its_call_timed_out_goes_back_at_once(
    redis_server: RedisServer,
) -> None:
    # The refill's reply comes after its call gave up: the request applied the policy,
    # nobody wants the batch. It goes back when it comes, not after ``hold`` (an hour).
    spec = _spec(
        FleetLimits(requests_per_minute=100, window_s=HOUR),
        LeasePolicy(hold=HOUR),
        admission_timeout=0.2,
    )
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        proxy.delay = 0.4  # the reply comes after the call gave up
        with pytest.raises(AdmissionRefusedError):
            await limiter.acquire(Cost())
        proxy.delay = 0.0
        assert limiter._book is not None
        # The late reply (0.2 s on), then the give-back's round trip.
        await trio.sleep(0.3)
        assert limiter._book.balance == [0, 0, 0, 0] and limiter._book.pending is None
        assert limiter.statistics().lease_refills == 1
    without = LimiterSpec(spec.name, spec.limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with open_limiter(without, redis_server.url) as plain:
        assert await _drain(plain) == 100


async def test_a_give_back_that_failed_while_degraded_goes_when_redis_answers(
    redis_server: RedisServer,
) -> None:
    # The lease's rest is due while Redis is cut off: its give-back fails and would be
    # sent again one admission timeout (here 2 s) later. The first call Redis answers
    # sends it at once: another process has every slot back within a round trip or two.
    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=2)
    spec = _spec(limits, LeasePolicy(hold=0.1), probe_interval=0.05)
    other_spec = LimiterSpec(spec.name, limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
        open_limiter(other_spec, redis_server.url) as other,
    ):
        permits = [await limiter.acquire(Cost()) for _ in range(2)]  # a lease of 2 slots
        for permit in permits:
            await limiter.release(permit, None)
        proxy.cut()
        await trio.sleep(0.2)  # the hold ends: the give-back fails
        assert limiter._book is not None and limiter._book.pending is not None
        proxy.heal()
        await limiter.renew_leases()  # a call Redis answers: recovered
        assert not limiter.degraded
        with trio.fail_after(0.2):  # not the 2 s retry
            while True:
                try:
                    held = [
                        await other.acquire(Cost(), deadline=trio.current_time() + 0.01)
                        for _ in range(2)
                    ]
                    break
                except AdmissionRefusedError:
                    await trio.sleep(0.01)
        for permit in held:
            await other.release(permit, None)


@pytest.mark.parametrize("lost", ["cut", "garbled"])
@pytest.mark.parametrize("policy", [LeasePolicy(), None], ids=["leased", "per-request"])
async def test_a_slot_granted_on_a_connection_lost_before_its_reply_is_released(
    redis_server: RedisServer, policy: LeasePolicy | None, lost: str
) -> None:
    # Redis grants an in-flight slot this process never hears of: the admission times
    # out (its reply is slow) and the connection is cut before the reply comes, or the
    # reply comes garbled. The slot is released once Redis answers again, within about
    # one admission timeout, not held until lease_ttl (30 s) where another process
    # would wait for it.
    limits = FleetLimits(requests_per_minute=100_000, max_in_flight=1)
    timeout = 0.1
    spec = LimiterSpec(
        f"leases-{uuid.uuid4().hex[:12]}",
        limits,
        on_failure=FailurePolicy.FAIL_CLOSED,
        admission_timeout=timeout,
        probe_interval=0.05,
        leases=policy,
    )
    other_spec = LimiterSpec(spec.name, limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
        open_limiter(other_spec, redis_server.url) as other,
    ):
        if lost == "cut":
            proxy.delay = 0.5
        else:
            proxy.wrong = b"+OK\r\n"
        with pytest.raises(AdmissionRefusedError):  # timed out, or not understood
            await limiter.acquire(Cost())
        if lost == "cut":
            proxy.cut()  # the reply is lost with the connection
            await trio.sleep(0.05)
        proxy.delay, proxy.wrong = 0.0, None
        proxy.heal()
        permit = await other.acquire(Cost(), deadline=trio.current_time() + 3 * timeout)
        assert permit.shared
        await other.release(permit, None)
        assert limiter.statistics().leases == 0


@pytest.mark.parametrize("lost", ["cut", "garbled"])
async def test_the_units_of_a_refill_whose_reply_was_lost_are_given_back(
    redis_server: RedisServer, lost: str
) -> None:
    # Redis grants a refill (a unit of an hour's 100, and a slot) whose reply never
    # reaches the process: what it granted is given back once Redis answers again, so
    # the fleet has its whole burst, not 99 until the unit refills an hour later.
    limits = FleetLimits(requests_per_minute=100, window_s=HOUR, max_in_flight=1)
    timeout = 0.1
    spec = _spec(limits, admission_timeout=timeout, probe_interval=0.05)
    other_spec = LimiterSpec(spec.name, limits, on_failure=FailurePolicy.FAIL_CLOSED)
    async with (
        running_proxy(str(redis_server.socket_path)) as proxy,
        open_limiter(spec, proxy.url) as limiter,
    ):
        if lost == "cut":
            proxy.delay = 0.5
        else:
            proxy.wrong = b"+OK\r\n"
        with pytest.raises(AdmissionRefusedError):  # timed out, or not understood
            await limiter.acquire(Cost())
        if lost == "cut":
            proxy.cut()  # the reply is lost with the connection
            await trio.sleep(0.05)
        proxy.delay, proxy.wrong = 0.0, None
        proxy.heal()
        await trio.sleep(3 * timeout)  # the reclaim goes when Redis answers
        assert limiter._unsettled == {}
        assert limiter._book is not None and limiter._book.balance == [0, 0, 0, 0]
        async with open_limiter(other_spec, redis_server.url) as other:
            assert await _drain(other) == 1  # the slot is free
        plain = LimiterSpec(
            spec.name,
            FleetLimits(requests_per_minute=100, window_s=HOUR),
            on_failure=FailurePolicy.FAIL_CLOSED,
            leases=None,
        )
        async with open_limiter(plain, redis_server.url) as other:
            assert await _drain(other) == 99  # and the unit: 100 less the one drained


async def test_a_reclaim_sent_twice_gives_back_once(redis_server: RedisServer) -> None:
    from trio_sampler.fleet._limiter import _RECLAIM

    limits = FleetLimits(requests_per_minute=100, window_s=HOUR)
    spec = _spec(limits)
    plain = LimiterSpec(spec.name, limits, on_failure=FailurePolicy.FAIL_CLOSED, leases=None)
    async with (
        open_limiter(spec, redis_server.url) as limiter,
        open_limiter(plain, redis_server.url) as other,
    ):
        await limiter.acquire(Cost())  # a refill of one unit, recorded (and spent)
        for _ in range(10):
            await other.acquire(Cost())
        prefix = limiter._answered_refill
        keys = [limiter._keys_admit[0], *limiter._keys_admit[3:], limiter._granted_prefix + prefix]
        args = [*(repr(i) for i in limiter._intervals), prefix]
        assert await limiter._call(_RECLAIM, keys, args) == 1
        assert await limiter._call(_RECLAIM, keys, args) == 0  # the record went with it
        # 100 - 1 - 10, and the unit back once (twice: 91).
        assert await _drain(other) == 90


async def test_a_refill_behind_a_give_back_decides_within_one_admission_timeout(
    redis_server: RedisServer,
) -> None:
    # Redis hangs while the lease's rest is being given back; a request that needs a
    # refill waits for that give-back, but the policy applies within one admission
    # timeout of its asking, not the give-back's timeout and then its own.
    timeout = 0.3
    spec = _spec(
        FleetLimits(requests_per_minute=100_000, window_s=HOUR),
        LeasePolicy(horizon=60.0),
        admission_timeout=timeout,
    )
    process = redis_server.process
    assert process is not None
    async with open_limiter(spec, redis_server.url) as limiter:
        for _ in range(3):  # a rate: the last batch is large, and mostly held
            await limiter.acquire(Cost())
            await trio.sleep(0.01)
        assert limiter._book is not None and limiter._book.balance[0] > 0
        process.send_signal(signal.SIGSTOP)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(limiter.close_lease)  # the give-back, on the wire
                await trio.sleep(0.05)
                start = trio.current_time()
                with pytest.raises(AdmissionRefusedError):
                    await limiter.acquire(Cost())  # the lease is empty: a refill
                took = trio.current_time() - start
        finally:
            process.send_signal(signal.SIGCONT)
    assert took < timeout + 0.15  # not 0.25 s of the give-back, then 0.3 s
