"""The load generator's start gate: a few starts per scheduler round, reads between them."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_sampler.loadtest._starts import StartGate


async def _runs_between_reads(per_round: int, starts: int) -> list[int]:
    """``starts`` tasks wait for a turn at once while a reader task is ready every
    scheduler round: how many starts ran between two consecutive reads, run by run.

    The order of the tasks within a round is not fixed (under pytest-trio, shuffled), so
    a reader splits a round's starts in two anywhere: the starts between two reads are
    those of the end of one round and the start of the next."""
    gate = StartGate(per_round)
    log: list[str] = []
    done = trio.Event()

    async def start() -> None:
        await gate.turn()
        log.append("start")
        if log.count("start") == starts:
            done.set()

    async def reader() -> None:
        while not done.is_set():
            log.append("read")
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for _ in range(starts):
            nursery.start_soon(start)
        await trio.testing.wait_all_tasks_blocked()  # every start waits for its turn
        nursery.start_soon(gate.open)
        nursery.start_soon(reader)
        await done.wait()
        nursery.cancel_scope.cancel()
    runs, run = [], 0
    for entry in log:
        if entry == "start":
            run += 1
        elif run:
            runs.append(run)
            run = 0
    if run:
        runs.append(run)
    return runs


async def test_a_burst_of_starts_is_spread_over_rounds_with_reads_between() -> None:
    runs = await _runs_between_reads(per_round=8, starts=100)
    assert sum(runs) == 100
    # A round lets 8 through: at most two rounds' worth between two reads.
    assert max(runs) <= 16
    assert len(runs) >= 100 // 16


async def test_without_a_limit_a_burst_would_run_in_one_round() -> None:
    # The behaviour the gate exists to prevent, shown by the same probe.
    runs = await _runs_between_reads(per_round=1000, starts=100)
    assert sum(runs) == 100
    assert len(runs) <= 2  # one round, which the reader may split


async def test_turns_go_round_by_round_in_order_of_arrival() -> None:
    gate = StartGate(3)
    order: list[int] = []

    async def start(n: int) -> None:
        await gate.turn()
        order.append(n)

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(start, n)
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(gate.open)
        while len(order) < 10:
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    # The first three waiters start in one round, the next three in the next, ... (the
    # order within a round is the scheduler's).
    assert [n // 3 for n in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


async def test_a_cancelled_waiter_leaves_and_the_others_still_start() -> None:
    gate = StartGate(1)
    started: list[int] = []

    async def start(n: int, scope: trio.CancelScope) -> None:
        with scope:
            await gate.turn()
            started.append(n)

    scopes = [trio.CancelScope() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for n, scope in enumerate(scopes):
            nursery.start_soon(start, n, scope)
            await trio.testing.wait_all_tasks_blocked()  # waiting in this order
        scopes[1].cancel()
        nursery.start_soon(gate.open)
        while len(started) < 2:
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert started == [0, 2]


async def test_the_gate_waits_without_spinning_when_nobody_waits() -> None:
    gate = StartGate()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.open)
        # Idle, the gate's task is blocked, not stepping every round (a gate that spun
        # would keep every task from being blocked: the wait would time out).
        with trio.fail_after(1):
            await trio.testing.wait_all_tasks_blocked()
        started = trio.Event()

        async def start() -> None:
            await gate.turn()
            started.set()

        nursery.start_soon(start)
        with trio.fail_after(1):
            await started.wait()
        nursery.cancel_scope.cancel()


def test_a_gate_that_lets_no_start_through_is_refused() -> None:
    with pytest.raises(ValueError, match="per_round must be at least 1"):
        StartGate(0)


async def test_a_start_alone_goes_at_once_and_a_burst_waits_beyond_the_rounds_turns() -> None:
    gate = StartGate(2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.open)
        await trio.testing.wait_all_tasks_blocked()
        # Turns the round has left are taken without waiting for another round (nothing
        # here yields to the scheduler: a cancelled scope would raise at a wait).
        with trio.CancelScope() as scope:
            scope.cancel()
            await gate.turn()
            await gate.turn()
        assert not scope.cancelled_caught
        # The round has none left: the third start waits for the next round's.
        with trio.CancelScope() as scope:
            scope.cancel()
            await gate.turn()
        assert scope.cancelled_caught
        # The next round gives two again.
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await gate.turn()
        assert not scope.cancelled_caught
        nursery.cancel_scope.cancel()
