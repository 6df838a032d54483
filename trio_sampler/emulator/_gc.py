"""The emulator's own process collects cyclic garbage by heap growth, not by allocations.

CPython's collector runs a generation-0 pass every 700 net allocations of container
objects, a generation-1 pass every 10 of those and a full pass whenever the objects that
reached the oldest generation have grown by a quarter, each pass stopping the process for
as long as it takes. A server holding 500 paced streams spends those pauses finding next
to nothing (measured: passes of up to 15 ms in generation 0, 35 ms in generation 1 and
180 ms in full, collecting no objects in almost all of them), and each pause makes every
delta that falls due meanwhile late: a paced stream's schedule kept only until the next
collection. Nearly all of the emulator's garbage is freed by reference counting the moment
it is dropped; what the collector is for is the rest, reference cycles.

So ``trio-sampler serve`` turns the automatic collector off and runs a full collection
only when the interpreter's count of container objects allocated and not freed since the
last collection reaches :data:`DEFAULT_GROWTH` (checked every second): garbage kept in
cycles, or a heap that really grew (more connections), not churn. What it costs is that
cyclic garbage waits for that threshold, a bounded amount of memory. The objects alive at
startup (modules, classes) are moved out of the collector's view first (``gc.freeze``):
they live as long as the process, and a full collection then walks only what serving
made. ``--gc python`` keeps the interpreter's own policy.

Only the command's process does this: :func:`~trio_sampler.emulator.serve` inside an
application's own process leaves the application's collector as it is.
"""

from __future__ import annotations

import gc
from typing import Final

import trio

__all__ = ["CHECK_INTERVAL", "DEFAULT_GROWTH", "collect_by_growth"]

#: Net new container objects since the last collection that start the next one.
DEFAULT_GROWTH: Final = 200_000
#: How often the count is read, in seconds.
CHECK_INTERVAL: Final = 1.0


async def collect_by_growth(growth: int = DEFAULT_GROWTH, interval: float = CHECK_INTERVAL) -> None:
    """Until cancelled: the automatic collector off, the objects alive on entry frozen,
    and every ``interval`` seconds a full collection if at least ``growth`` container
    objects were allocated and not freed since the last one. On exit the collector is as
    it was (the frozen objects thawed, unless some were frozen before)."""
    if not (isinstance(growth, int) and growth > 0):
        raise ValueError(f"growth must be a positive int; got {growth!r}")
    was_enabled = gc.isenabled()
    frozen_already = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        while True:
            await trio.sleep(interval)
            if gc.get_count()[0] >= growth:
                gc.collect()
    finally:
        if was_enabled:
            gc.enable()
        if not frozen_already:
            gc.unfreeze()
