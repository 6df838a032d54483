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

:class:`StartGate` lets the waiting starts through :data:`STARTS_PER_ROUND` in each
scheduler round, so a round holds a bounded amount of start work beside the reads that came
due, which run every round. Measured with ``python benchmarks/bench_loadtest.py
--accuracy-cells 1000:200 --ramp 0`` (the streams started together, 5,000 tokens per second,
one worker): without the gate, TTFT and ITL p99 were +200 ms off the server's record and the
loop lagged 200 ms at p99; with it they are within the 5 ms target. A start that waits at
the gate is not yet sent: its latencies count from its sending, and in an open loop the
wait shows as the arrival's send lag.

The number per round is a trade between a round's length and the starts a busy client
makes: one start per round cost a fifth of the requests per second of a client at a full
core with one-token answers (C = 1,000); see :data:`STARTS_PER_ROUND`.
"""

from __future__ import annotations

from typing import NoReturn

import trio

__all__ = ["STARTS_PER_ROUND", "StartGate"]

#: How many waiting starts one scheduler round lets through (see the module).
STARTS_PER_ROUND = 8


class StartGate:
    """Hands out turns to start a request, at most ``per_round`` in a scheduler round.

    :meth:`open` does the handing out and runs for as long as the gate is used (a task of
    the stage's own); :meth:`turn` waits for one."""

    def __init__(self, per_round: int = STARTS_PER_ROUND) -> None:
        if per_round < 1:
            raise ValueError(f"per_round must be at least 1, got {per_round}")
        self.per_round = per_round
        self._waiting = trio.lowlevel.ParkingLot()
        self._someone = trio.Event()

    async def turn(self) -> None:
        """Wait for this start's turn (a later round's, at the earliest)."""
        self._someone.set()
        await self._waiting.park()

    async def open(self) -> NoReturn:
        """Let the waiting starts through, ``per_round`` in each scheduler round."""
        while True:
            if not self._waiting:
                self._someone = trio.Event()
                await self._someone.wait()
            self._waiting.unpark(count=self.per_round)
            # The next turns go in the next round: the ones let through run there first.
            await trio.lowlevel.checkpoint()
