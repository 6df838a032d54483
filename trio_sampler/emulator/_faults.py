"""Which scripted faults apply to this attempt: per-scenario attempt counting.

The rule, stated once (also in ``docs/emulator.md``):

* Faults are considered in list order. A fault with ``times: k`` applies to ``k``
  attempts and is then used up; a fault without ``times`` applies to every attempt.
* A fault with a time window (``from_s``, ``until_s``, ``period_s``) is considered only
  while the emulator's clock is inside the window; outside it, it neither fires nor
  counts a use.
* At most one *outcome* fault fires per attempt (``status``, ``stream_error``, ``drop``,
  ``malformed``, ``empty``, ``no_terminator``, ``context_length``, ``content_filter``):
  the first one in the list that is not used up. So
  ``[{"type":"status","status":503,"times":2}]`` fails attempts 1 and 2 and lets attempt 3
  succeed, and ``[{status, times 1}, {drop, times 1}]`` gives 503, then a dropped stream,
  then success.
* *Pacing* faults (``stall``, ``pings``, ``silent``, ``slow_first_token``) combine with
  the outcome fault and with each other; each one that is not used up applies, and counts one use.

Counters live per scenario key: the script's ``scenario``, or (without one) the script's
own text, so an SDK that retries by re-sending the same headers walks through the
schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs

from ._script import (
    ContentFilterFault,
    ContextLengthFault,
    DropFault,
    EmptyFault,
    Fault,
    MalformedFault,
    NoTerminatorFault,
    PingsFault,
    SilentFault,
    SlowFirstTokenFault,
    StallFault,
    StatusFault,
    StreamErrorFault,
)

__all__ = ["AttemptPlan", "FaultBook", "OutcomeFault"]

OutcomeFault = (
    StatusFault
    | StreamErrorFault
    | DropFault
    | MalformedFault
    | EmptyFault
    | NoTerminatorFault
    | ContextLengthFault
    | ContentFilterFault
)


@attrs.frozen
class AttemptPlan:
    """What happens to one attempt: its number, the outcome fault and the pacing faults."""

    attempt: int
    outcome: OutcomeFault | None = None
    stalls: tuple[StallFault, ...] = ()
    pings: tuple[PingsFault, ...] = ()
    silences: tuple[SilentFault, ...] = ()
    #: Seconds after the request was read before the first content delta (``None``: no
    #: such fault applies; the longest applies when several do).
    first_token_after: float | None = None


@attrs.define
class _ScenarioState:
    attempts: int = 0
    uses: dict[int, int] = attrs.field(factory=dict)


#: Scenarios whose state is kept; the least recently used is forgotten past this.
MAX_SCENARIOS = 10_000

_K = TypeVar("_K")
_V = TypeVar("_V")


def touch(store: dict[_K, _V], key: _K, make: Callable[[], _V]) -> _V:
    """``store[key]`` (made if missing), moved to the most recent end; the least recently
    used entries beyond :data:`MAX_SCENARIOS` are dropped (dict order is the recency order)."""
    value = store.pop(key, None)
    if value is None:
        value = make()
    store[key] = value
    while len(store) > MAX_SCENARIOS:
        del store[next(iter(store))]
    return value


@attrs.define
class FaultBook:
    """Per-scenario fault state: at most :data:`MAX_SCENARIOS` scenarios, least recently
    used forgotten first (a long-running server must not grow without bound)."""

    _states: dict[str, _ScenarioState] = attrs.field(factory=dict)

    def forget(self, key: str) -> None:
        """Drop ``key``'s counters: its faults start afresh."""
        self._states.pop(key, None)

    def plan(self, key: str, faults: tuple[Fault, ...], now: float = 0.0) -> AttemptPlan:
        """Count one attempt for ``key`` and decide which ``faults`` apply to it at ``now``
        (the emulator's clock, for faults with a time window)."""
        state = touch(self._states, key, _ScenarioState)
        state.attempts += 1
        outcome: OutcomeFault | None = None
        stalls: list[StallFault] = []
        pings: list[PingsFault] = []
        silences: list[SilentFault] = []
        first_token: float | None = None
        for index, fault in enumerate(faults):
            used = state.uses.get(index, 0)
            if fault.times is not None and used >= fault.times:
                continue
            if fault.window is not None and not fault.window.contains(now):
                continue
            if isinstance(fault, StallFault):
                stalls.append(fault)
            elif isinstance(fault, PingsFault):
                pings.append(fault)
            elif isinstance(fault, SilentFault):
                silences.append(fault)
            elif isinstance(fault, SlowFirstTokenFault):
                first_token = max(first_token or 0.0, fault.seconds)
            elif outcome is None:
                outcome = fault
            else:
                continue
            state.uses[index] = used + 1
        return AttemptPlan(
            state.attempts, outcome, tuple(stalls), tuple(pings), tuple(silences), first_token
        )

    def attempts(self, key: str) -> int:
        """How many attempts ``key`` has seen."""
        state = self._states.get(key)
        return 0 if state is None else state.attempts
