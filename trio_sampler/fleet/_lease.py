"""A process's lease: units of each limit and in-flight slots, charged in Redis, spent here.

The book is pure bookkeeping on the caller's clock (tested under the mock clock); the
limiter sends what it asks for and gives back in the LEASE script (``_scripts.py``).
A unit in the book was charged to the fleet's bucket when the lease was taken, so
spending it needs no round trip and keeps the fleet's limits exact; what was not spent
``hold`` seconds after the last refill goes back (once: the give-back carries an id).
"""

from __future__ import annotations

import math

import trio

from ._spec import Cost, LeasePolicy

__all__ = ["GiveBack", "LeaseBook"]

# The weight of the newest rate sample in the smoothed rate.
_SMOOTHING = 0.5


class GiveBack:
    """What one give-back returns: units per dimension (< 0: used beyond the lease, to
    charge) and idle slots, under an id Redis applies once."""

    __slots__ = ("ident", "slots", "units")

    def __init__(self, ident: str, units: list[int], slots: list[str]) -> None:
        self.ident = ident
        self.units = units
        self.slots = slots


class LeaseBook:
    """This process's lease of one limiter: what it holds, spends, and gives back."""

    def __init__(self, policy: LeasePolicy, intervals: list[float], slots: bool) -> None:
        self.policy = policy
        self.limited = [interval > 0 for interval in intervals]
        self.uses_slots = slots
        self.balance = [0, 0, 0, 0]
        self.free_slots: list[str] = []
        #: Requests waiting for a refill (each may need a slot).
        self.waiting = 0
        #: First attempts since the last lease call (their retry-budget deposit).
        self.first_attempts = 0
        #: The header clamp of the last report, sent with the next lease call.
        self.clamps: list[str] | None = None
        #: A give-back Redis has not confirmed (sent again, same id, until it is).
        self.pending: GiveBack | None = None
        #: When the rest goes back (trio's clock; inf: nothing held).
        self.expires = math.inf
        #: The fleet said it has no room (others wait): what is freed here goes back at
        #: once, not after ``hold``, until a refill is granted again.
        self.contended = False
        self.wake = trio.Event()
        self._rates = [0.0, 0.0, 0.0, 0.0]
        self._spent = [0, 0, 0, 0]
        self._since: float | None = None

    # -- spending ------------------------------------------------------------------------

    def covers(self, cost: Cost) -> bool:
        """The book holds ``cost`` in every limited dimension, and a slot if needed."""
        if self.uses_slots and not self.free_slots:
            return False
        return all(
            not limited or held >= amount
            for limited, held, amount in zip(
                self.limited, self.balance, cost.amounts(), strict=True
            )
        )

    def take(self, cost: Cost) -> str:
        """Spend ``cost`` (which :meth:`covers`); the slot it runs in ('' for none)."""
        for index, amount in enumerate(cost.amounts()):
            if self.limited[index]:
                self.balance[index] -= amount
                self._spent[index] += amount
        return self.free_slots.pop() if self.uses_slots else ""

    def settle(self, reserved: Cost, actual: Cost | None, slot: str, now: float) -> None:
        """A request spent from the book ended: its slot comes back to the book, and what
        it reserved beyond ``actual`` too (used beyond: owed, charged with the next call)."""
        if slot:
            self.free_slots.append(slot)
        if actual is not None:
            for index, (held, used) in enumerate(
                zip(reserved.amounts(), actual.amounts(), strict=True)
            ):
                if self.limited[index]:
                    self.balance[index] += held - used
        if self.contended:
            self.return_now(now)
        elif math.isinf(self.expires):
            self.expires = now + self.policy.hold
            self.wake.set()

    # -- refilling -----------------------------------------------------------------------

    def need(self, cost: Cost) -> list[int]:
        """Per dimension, the units ``cost`` lacks (all or nothing in the next lease)."""
        return [
            max(0, amount - held) if limited else 0
            for limited, held, amount in zip(
                self.limited, self.balance, cost.amounts(), strict=True
            )
        ]

    def want(self, cost: Cost, now: float) -> list[int]:
        """Per dimension, the batch to ask for: this process's smoothed rate times
        ``horizon``, at least what ``cost`` lacks, at most ``max_requests`` requests' worth."""
        if self._since is not None and now > self._since:
            elapsed = now - self._since
            for index, spent in enumerate(self._spent):
                sample = spent / elapsed
                self._rates[index] += _SMOOTHING * (sample - self._rates[index])
        self._spent = [0, 0, 0, 0]
        self._since = now
        need = self.need(cost)
        cap = self.policy.max_requests
        return [
            max(lacking, min(math.ceil(rate * self.policy.horizon), cap * max(amount, 1)))
            if limited
            else 0
            for limited, lacking, rate, amount in zip(
                self.limited, need, self._rates, cost.amounts(), strict=True
            )
        ]

    def slots_wanted(self) -> tuple[int, int]:
        """(slots to ask for, slots needed): no more than the requests waiting for one."""
        if not self.uses_slots:
            return 0, 0
        needed = 0 if self.free_slots else 1
        return min(self.policy.max_slots, max(self.waiting - len(self.free_slots), needed)), needed

    def granted(self, units: list[int], slots: list[str], now: float) -> None:
        for index, amount in enumerate(units):
            self.balance[index] += amount
        self.free_slots.extend(slots)
        self.contended = False
        self.expires = now + self.policy.hold
        self.wake.set()

    # -- giving back ---------------------------------------------------------------------

    def return_now(self, now: float) -> None:
        """Give back the rest (and a give-back not confirmed yet) now, not after ``hold``."""
        self.expires = min(self.expires, now)
        self.wake.set()

    def fleet_full(self, now: float) -> None:
        """The fleet has no room for a refill: what this process holds idle goes back
        now, and what it frees from now on at once (:attr:`contended`)."""
        self.contended = True
        self.return_now(now)

    def give_back(self, ident: str) -> GiveBack | None:
        """The rest to give back (moved out of the book into :attr:`pending`): the
        pending one when there is one, else every unit held or owed and every idle slot
        (and, with nothing held, a header clamp not sent yet)."""
        if self.pending is None and (
            any(self.balance) or self.free_slots or self.clamps is not None
        ):
            self.pending = GiveBack(ident, self.balance, self.free_slots)
            self.balance, self.free_slots = [0, 0, 0, 0], []
        if not any(self.balance) and not self.free_slots:
            self.expires = math.inf
        # Else the pending one went first: what was granted since stays due (its time
        # is kept), so it goes back once the pending one is confirmed.
        return self.pending
