"""How punctual the emulator's paced streams were: what a client should have measured.

A paced stream promises its first content delta ``first_token_ms`` after the request
arrived and one every ``token_interval_ms`` after that. A server on a busy machine keeps
that promise only so well: its event loop is running another task when a delta falls due,
or the process is waiting for a CPU. A load generator measured against it reports the
server's lateness too, as it should; to judge the load generator itself, compare what it
reported with what the server did. :class:`Punctuality` keeps what the server did, for
every paced delta: when its write was handed to the kernel (the connection's
``StampedSocketStream``; when the transport does not say, when the send returned),
against when it was due, and the time to first token and the gaps between deltas those
writes made.

Kept per process (each emulator process serves its own connections), as the most recent
:data:`MAX_SAMPLES` values of each kind, exact: percentiles are read from the values
themselves. Read over HTTP at ``GET /v1/emulator/pacing`` (``?values=1``: with the
values) and cleared with ``DELETE`` (see ``docs/emulator.md``).
"""

from __future__ import annotations

import collections
import os
from typing import Any, Final

from .._percentile import percentile

__all__ = ["MAX_SAMPLES", "PERCENTILES", "Punctuality"]

#: Of each kind, the most recent values kept (a float each, about 32 bytes with its slot:
#: some 13 MB for the four kinds when full); older ones are dropped. A benchmark's window
#: of 1,000 tokens a second for 15 s is 15,000.
MAX_SAMPLES: Final = 100_000
#: The percentiles reported.
PERCENTILES: Final = (50.0, 90.0, 95.0, 99.0)
_KINDS: Final = ("first_token_late", "token_late", "ttft", "itl")


class Punctuality:
    """The paced deltas' write times against their schedule, in seconds.

    - ``first_token_late``: a stream's first delta, written minus due (``arrived +
      first_token_ms``); negative never (a delta is not sent early), zero at best.
    - ``token_late``: every later delta, written minus due.
    - ``ttft``: a stream's first delta written minus the request's arrival.
    - ``itl``: a delta written minus the delta before it written.
    """

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        if not (isinstance(max_samples, int) and max_samples > 0):
            raise ValueError(f"max_samples must be a positive int; got {max_samples!r}")
        self.max_samples = max_samples
        self._values: dict[str, collections.deque[float]] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every value (a benchmark clears them once its warm-up is over)."""
        self._values = {kind: collections.deque(maxlen=self.max_samples) for kind in _KINDS}

    def delta_written(
        self, token_number: int, due: float, written: float, arrived: float, previous: float
    ) -> None:
        """The paced delta ``token_number`` (from 0), due at ``due``, was written at
        ``written``; the request arrived at ``arrived`` and the delta before it (if any)
        was written at ``previous``. All on trio's clock."""
        values = self._values
        if token_number == 0:
            values["first_token_late"].append(written - due)
            values["ttft"].append(written - arrived)
        else:
            values["token_late"].append(written - due)
            values["itl"].append(written - previous)

    def report(self, *, values: bool = False) -> dict[str, Any]:
        """Per kind: ``count`` and, in milliseconds, ``p50`` ... ``p99`` and ``max``
        (``null`` with no values), and with ``values`` the values themselves (ms, oldest
        first: several processes' values are merged, never their percentiles); plus
        ``max_samples`` and this process's ``pid``."""
        out: dict[str, Any] = {"pid": os.getpid(), "max_samples": self.max_samples}
        for kind, kept in self._values.items():
            out[kind] = _summary(kept)
            if values:
                out[kind]["values"] = [round(value * 1000, 4) for value in kept]
        return out


def _summary(values: collections.deque[float]) -> dict[str, Any]:
    ordered = sorted(values)
    summary: dict[str, Any] = {"count": len(ordered)}
    for wanted in PERCENTILES:
        summary[f"p{wanted:g}"] = _ms(percentile(ordered, wanted / 100) if ordered else None)
    summary["max"] = _ms(ordered[-1] if ordered else None)
    return summary


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 4)
