"""The same limits in one process: the floor a fail-open limiter keeps while Redis is out.

The GCRA here is the one of the Lua scripts, on the caller's clock instead of Redis's:
pure functions of ``now``, so it is tested under the mock clock.
"""

from __future__ import annotations

import math

from ._spec import Cost, FleetLimits

__all__ = ["GcraCell", "LocalLimits"]


class GcraCell:
    """One rate dimension: ``rate`` units per ``window`` seconds, ``burst`` of a window."""

    __slots__ = ("_tat", "interval", "tau")

    def __init__(self, rate: float, window: float, burst: float) -> None:
        self.interval = window / rate
        self.tau = window * burst
        self._tat = -math.inf

    def wait(self, cost: int, now: float) -> float:
        """Seconds until ``cost`` units may start; ``inf`` if they never fit the burst."""
        increment = self.interval * cost
        if increment > self.tau + 1e-9:
            return math.inf
        return max(0.0, max(self._tat, now) + increment - self.tau - now)

    def take(self, cost: int, start: float) -> None:
        self._tat = max(self._tat, start) + self.interval * cost

    def adjust(self, units: int, now: float) -> None:
        """Charge (``units > 0``) or refund (``< 0``) after the fact."""
        base = max(self._tat, now) if units > 0 else self._tat
        self._tat = base + self.interval * units


class LocalLimits:
    """Every dimension of :class:`FleetLimits` in memory, for one process."""

    def __init__(self, limits: FleetLimits) -> None:
        self.limits = limits
        self.cells: tuple[GcraCell | None, ...] = tuple(
            None if rate is None else GcraCell(rate, limits.window_s, limits.burst)
            for rate in limits.rates()
        )
        self.in_flight = 0

    def wait(self, cost: Cost, now: float) -> float:
        """Seconds until ``cost`` may start in every dimension (``inf``: never)."""
        return max(
            (c.wait(n, now) for c, n in zip(self.cells, cost.amounts(), strict=True) if c),
            default=0.0,
        )

    def has_slot(self) -> bool:
        maximum = self.limits.max_in_flight
        return maximum is None or self.in_flight < maximum

    def take(self, cost: Cost, start: float) -> None:
        for cell, amount in zip(self.cells, cost.amounts(), strict=True):
            if cell is not None:
                cell.take(amount, start)
        self.in_flight += 1

    def settle(self, reserved: Cost, actual: Cost | None, now: float) -> None:
        self.in_flight -= 1
        if actual is None:
            return
        deltas = (a - r for a, r in zip(actual.amounts(), reserved.amounts(), strict=True))
        for cell, delta in zip(self.cells, deltas, strict=True):
            if cell is not None and delta:
                cell.adjust(delta, now)
