"""Sleeping until a paced event is due, to the microsecond where the platform allows.

Trio's run loop waits in ``epoll_wait``, whose timeout is a whole number of milliseconds
(rounded up), so ``trio.sleep_until`` wakes between 0 and 1 ms after its deadline, half a
millisecond on average, before any wake-up latency. A paced stream sent that way is late
by that much, which a load generator then reports as its own error. On Linux, under trio's
real clock, :class:`DeadlineTimer` arms a ``timerfd`` (nanosecond resolution) for each
deadline and waits for it to become readable, so the run loop wakes when the deadline is
due; elsewhere (other platforms, or the tests' mock clock, which only ``trio.sleep_until``
follows) it is ``trio.sleep_until``.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from typing import Any

import trio
import trio.testing

__all__ = ["DeadlineTimer"]

_CLOCK_MONOTONIC = 1  # trio's real clock is time.perf_counter: CLOCK_MONOTONIC on Linux
# Below this a relative timerfd value would round to 0, which disarms the timer.
_MIN_ARM = 1e-6


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.POINTER(_Itimerspec),
    ]
    settime.restype = ctypes.c_int
    return libc


_LIBC = _load_libc()


class DeadlineTimer:
    """Sleeps until deadlines on trio's clock; one per task that paces (not shared).

    Use it as a context manager (the ``timerfd``, if one was opened, is closed on exit).
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._precise = _LIBC is not None and not isinstance(
            trio.lowlevel.current_clock(), trio.testing.MockClock
        )

    def __enter__(self) -> DeadlineTimer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``trio.current_time()`` has reached ``deadline`` (a checkpoint even
        when it already has, like ``trio.sleep_until``)."""
        if not self._precise or deadline == math.inf:
            await trio.sleep_until(deadline)
            return
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            await trio.lowlevel.checkpoint()
            return
        fd = self._timerfd()
        if fd is None:
            await trio.sleep_until(deadline)
            return
        while remaining > 0:
            if not _arm(fd, max(remaining, _MIN_ARM)):
                self._precise = False
                await trio.sleep_until(deadline)
                return
            await trio.lowlevel.wait_readable(fd)
            try:
                os.read(fd, 8)  # the expiration count; reading it clears readiness
            except BlockingIOError:
                pass
            remaining = deadline - trio.current_time()

    def _timerfd(self) -> int | None:
        if self._fd is None:
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:  # out of descriptors, say: the millisecond timer still works
                self._precise = False
                return None
            self._fd = fd
        return self._fd


def _arm(fd: int, seconds: float) -> bool:
    """Arm ``fd`` to expire once, ``seconds`` from now; whether the kernel accepted it."""
    whole = int(seconds)
    value = _Itimerspec(_Timespec(0, 0), _Timespec(whole, int((seconds - whole) * 1e9)))
    return bool(_LIBC.timerfd_settime(fd, 0, ctypes.byref(value), None) == 0)
