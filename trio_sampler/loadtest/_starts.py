"""Starting requests a few at a time, so that reads never wait behind a burst of starts.

A closed loop starts all its streams at once, and streams of one length stay in step: every
request's duration later, they all end and start again together. Starting a request costs
the client far more than reading a token (building its body, the sampler's request task,
the connection's write: about a quarter to three quarters of a millisecond), and Trio runs
every task that is ready in one scheduler round before it looks at the sockets again. So
1,000 starts ready together are one round of most of a second, and every token that
arrives meanwhile is read that much later: at 5,000 tokens per second (C = 1,000, one token
every 200 ms), such a read also carries the next token, and TTFT and ITL at p99 read one
interval too high.

:class:`StartGate` gives each scheduler round :data:`STARTS_PER_ROUND` turns to start a
request: a start goes at once while the round has a turn left, and waits for a later
round's otherwise, so a round holds a bounded amount of start work beside the reads that
came due, which run every round. Measured with ``python benchmarks/bench_loadtest.py
--accuracy-cells 1000:200 --ramp 0`` (the streams started together, 5,000 tokens per second,
one worker): without the gate, TTFT and ITL p99 were +200 ms off the server's record and the
loop lagged 200 ms at p99; with it they are within the 5 ms target. A start that waits at
the gate is not yet sent: its latencies count from its sending, and in an open loop the
wait shows as the arrival's send lag. A start alone goes at once (an open loop's arrival
between bursts does not wait for a scheduler round).

The number per round is a trade between a round's length and the starts a busy client
makes. With one-token answers at C = 1,000 (a client at a full core): without the gate
2,374–2,500 requests a second and a loop lag p99 of 153–158 ms; 8 per round 2,064–2,325
and 7–8 ms; 64 per round 2,261–2,293 and 54–57 ms; an earlier gate that made every start
wait for a round, one a round, about 2,000 (``docs/benchmarks.md``, the load generator's
latest run).
"""

from __future__ import annotations

from typing import NoReturn

import trio

__all__ = ["STARTS_PER_ROUND", "StartGate"]

#: The turns to start a request each scheduler round gives (see the module).
STARTS_PER_ROUND = 8


class StartGate:
    """Hands out turns to start a request, about ``per_round`` in a scheduler round.

    A turn goes at once while the round has turns left; the others wait, and :meth:`open`
    (a task of the stage's own, for as long as the gate is used) gives each round its
    ``per_round`` turns again and hands them to the waiting starts, in order of arrival.
    A start alone (an open loop's arrival between bursts) never waits."""

    def __init__(self, per_round: int = STARTS_PER_ROUND) -> None:
        if per_round < 1:
            raise ValueError(f"per_round must be at least 1, got {per_round}")
        self.per_round = per_round
        #: The turns the current round has left.
        self._left = per_round
        self._waiting = trio.lowlevel.ParkingLot()
        self._used = trio.Event()

    async def turn(self) -> None:
        """Wait for this start's turn: no wait while the round has a turn left, else
        until a later round gives it one."""
        self._used.set()  # the gate's task gives the next round its turns
        if self._left > 0 and not self._waiting:
            self._left -= 1
            return
        await self._waiting.park()

    async def open(self) -> NoReturn:
        """Give every round its turns, to the waiting starts first; idle (no task step)
        while no start comes."""
        while True:
            self._left = self.per_round
            if self._waiting:
                self._left -= len(self._waiting.unpark(count=self.per_round))
            if self._waiting or self._left < self.per_round:
                # The ones let through run in the next round, and the next turns with them.
                await trio.lowlevel.checkpoint()
            else:
                self._used = trio.Event()
                await self._used.wait()
