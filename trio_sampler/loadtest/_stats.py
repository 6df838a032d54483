"""Mergeable statistics of one stage: HDR histograms and counters.

Percentiles are never averaged: each worker records into its own histograms, the
histograms are merged (bucket counts added), and percentiles are read from the merged one.
Values are recorded as integers (microseconds for times) with three significant digits, so
a percentile is within 0.1 % of the exact sample value.
"""

from __future__ import annotations

import base64
import collections
import math
from collections.abc import Sequence
from typing import Any

import attrs
from hdrh.histogram import HdrHistogram

__all__ = [
    "HISTOGRAMS",
    "PERCENTILES",
    "SLO",
    "LatencyHistogram",
    "Second",
    "StageStats",
    "counter_percentile",
    "quantize",
]

#: How often the event-loop lag probe wakes (seconds): a loop held for ``B`` seconds shows
#: a lag between ``B - LAG_PROBE_INTERVAL`` and ``B``.
LAG_PROBE_INTERVAL = 0.01

#: The histograms of a stage, by name, with the unit of their integer values (each is
#: reported divided by 1,000: times in ms, rates in tokens/s).
HISTOGRAMS = {
    "ttft": "us",
    "itl": "us",
    "tpot": "us",
    "e2e": "us",
    "stream_output_tps": "milli_tokens_per_s",
    "send_lag": "us",
    "ttft_from_schedule": "us",
    "e2e_from_schedule": "us",
    "loop_lag": "us",
    "request_write": "us",
}

#: The percentiles reported for every histogram.
PERCENTILES = (50.0, 90.0, 95.0, 99.0)

# One hour in microseconds: the largest value kept (larger ones are clamped).
_HIGHEST = 3_600_000_000
# Three significant digits: 2,048 sub-buckets per power of two.
_SUB_BUCKET_BITS = 11
_SUB_BUCKETS = 1 << _SUB_BUCKET_BITS


def quantize(value: int) -> int:
    """``value`` rounded down to the HDR histogram's resolution (3 significant digits: 11
    bits of sub-bucket), clamped to ``[1, _HIGHEST]``; the histogram would store it there."""
    if value < _SUB_BUCKETS:
        return max(value, 1)
    value = min(value, _HIGHEST)
    shift = value.bit_length() - _SUB_BUCKET_BITS
    return (value >> shift) << shift


class LatencyHistogram:
    """An HDR histogram (``hdrhistogram``) with a cheap recording front and an exact mean.

    Recording straight into an HDR histogram costs a few microseconds per value in Python,
    as much as the client spends on a streamed token. Values are rounded to the
    histogram's own resolution and counted in a :class:`collections.Counter` (one C-level
    update per request's batch of values), and moved into the histogram by :meth:`flush`,
    once per distinct value (a few thousand at most). The sum is kept beside the counts, so
    the mean is exact and cheap (the library's walks every bucket in Python).
    """

    __slots__ = ("_hdr", "_pending", "total")

    def __init__(self) -> None:
        self._hdr = HdrHistogram(1, _HIGHEST, 3)
        self._pending: collections.Counter[int] = collections.Counter()
        #: The sum of the recorded values (before rounding), for the mean; ``None`` when
        #: unknown (a histogram decoded without it).
        self.total: int | None = 0

    def record(self, value: int) -> None:
        self._pending[quantize(value)] += 1
        if self.total is not None:
            self.total += value

    def record_many(self, values: Sequence[int]) -> None:
        self._pending.update(map(quantize, values))
        if self.total is not None:
            self.total += sum(values)

    def flush(self) -> HdrHistogram:
        """Move pending values into the HDR histogram; returns it."""
        if self._pending:
            for value, count in self._pending.items():
                self._hdr.record_value(value, count)
            self._pending.clear()
        return self._hdr

    @property
    def count(self) -> int:
        return int(self.flush().get_total_count())

    def merge(self, other: LatencyHistogram) -> None:
        self.flush().add(other.flush())
        self.total = None if self.total is None or other.total is None else self.total + other.total

    def encode(self) -> str:
        """The standard compressed HDR encoding, base64 text (what results store)."""
        return base64.b64encode(self.flush().encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str, total: int | None = None) -> LatencyHistogram:
        """A histogram from :meth:`encode`'s text; ``total`` is the sum of its values if
        known (else a mean is estimated from the buckets when asked for)."""
        histogram = cls()
        histogram._hdr = HdrHistogram.decode(base64.b64decode(text))
        histogram.total = total
        return histogram

    def value_at(self, percentile: float) -> int:
        return int(self.flush().get_value_at_percentile(percentile))

    def unflushed(self) -> collections.Counter[int]:
        """The values recorded since the last :meth:`flush` (rounded), by count.

        Nothing flushes during a stage, so while it runs this is everything recorded so
        far: the live display reads percentiles from it (:func:`counter_percentile`) in
        well under a millisecond, where the HDR histogram takes several per percentile.
        """
        return self._pending

    @classmethod
    def from_counts(cls, counts: collections.Counter[int]) -> LatencyHistogram:
        """A histogram whose unflushed values are ``counts`` (a live snapshot)."""
        histogram = cls()
        histogram._pending = counts
        histogram.total = None
        return histogram

    def summary(self, scale: float) -> dict[str, float | int | None]:
        """p50/p90/p95/p99/max/mean and count, each value multiplied by ``scale``."""
        hdr = self.flush()
        count = int(hdr.get_total_count())
        out: dict[str, float | int | None] = {"count": count}
        for p in PERCENTILES:
            out[f"p{p:g}"] = hdr.get_value_at_percentile(p) * scale if count else None
        out["max"] = hdr.get_max_value() * scale if count else None
        if not count:
            out["mean"] = None
        elif self.total is not None:
            out["mean"] = self.total / count * scale
        else:  # the library's estimate from the buckets (slow: it walks every one)
            out["mean"] = hdr.get_mean_value() * scale
        return out

    def cdf(self, points: int = 200) -> list[tuple[float, float]]:
        """``(value, fraction of values <= it)`` pairs for plotting, in value order."""
        hdr = self.flush()
        total = hdr.get_total_count()
        if not total:
            return []
        pairs = []
        seen = 0
        for item in hdr.get_recorded_iterator():
            seen += item.count_added_in_this_iter_step
            pairs.append((float(hdr.get_highest_equivalent_value(item.value_iterated_to)), seen))
        step = max(1, len(pairs) // points)
        kept = pairs[::step]
        if kept[-1] != pairs[-1]:
            kept.append(pairs[-1])
        return [(value, count / total) for value, count in kept]


def counter_percentile(counts: collections.Counter[int], percentile: float) -> int | None:
    """The value at ``percentile`` (0-100) of values counted in ``counts``, the way an HDR
    histogram reads it (the smallest value with at least that share at or below it)."""
    total = sum(counts.values())
    if not total:
        return None
    wanted = max(1, math.ceil(percentile / 100 * total))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= wanted:
            return value
    return max(counts)  # pragma: no cover - the loop always returns


@attrs.frozen
class SLO:
    """Service-level objectives a request must all meet to count towards goodput.

    Each bound is in milliseconds; ``None`` leaves that metric unbounded. A request that
    did not complete is never good.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in attrs.astuple(self))

    def describe(self) -> dict[str, float]:
        return {k: v for k, v in attrs.asdict(self).items() if v is not None}


@attrs.define
class Second:
    """One second of a stage's timeline (see :attr:`StageStats.timeline`)."""

    ttft: collections.Counter[int] = attrs.field(factory=collections.Counter)
    sent: int = 0
    completed: int = 0
    output_tokens: int = 0

    def merge(self, other: Second) -> None:
        self.ttft.update(other.ttft)
        self.sent += other.sent
        self.completed += other.completed
        self.output_tokens += other.output_tokens

    def to_wire(self) -> tuple[dict[int, int], int, int, int]:
        return dict(self.ttft), self.sent, self.completed, self.output_tokens

    @classmethod
    def from_wire(cls, data: Any) -> Second:
        ttft, sent, completed, output_tokens = data
        counts = collections.Counter({int(k): v for k, v in ttft.items()})
        return cls(counts, sent, completed, output_tokens)


@attrs.define
class StageStats:
    """Everything measured in one stage by one worker, or merged over workers.

    Times ``first_sent`` and ``last_done`` are on a clock shared by the machine's processes
    (``time.monotonic`` based), so merged stages span the union of the workers' windows.
    """

    histograms: dict[str, LatencyHistogram] = attrs.field(
        factory=lambda: {name: LatencyHistogram() for name in HISTOGRAMS}
    )
    started: int = 0
    completed: int = 0
    good: int = 0
    errors: dict[str, int] = attrs.field(factory=dict)
    #: The first message seen of each error kind.
    error_examples: dict[str, str] = attrs.field(factory=dict)
    #: Open loop: arrivals not sent because ``max_in_flight`` requests were in flight.
    dropped: int = 0
    #: Requests still running when the drain timed out (cancelled, not counted as errors).
    unfinished: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: How many completed requests' counts came from the server's usage (vs counted/planned).
    input_from_server: int = 0
    output_from_server: int = 0
    #: How many completed requests' latencies were timed from the wire (the request's
    #: write), not from the submit (a transport that does not report the write).
    wire_timed: int = 0
    #: ITL gaps of zero: an output event that arrived in the same network read as the one
    #: before it (the server sent them together, or the client read late).
    shared_read_gaps: int = 0
    #: Completed requests whose first two output events came in one network read: their
    #: TTFT is timed at the second one's arrival if the read was late.
    shared_first_reads: int = 0
    first_sent: float | None = None
    last_done: float | None = None
    #: The measured window (same clock): from the first measured send to the stop.
    window_start: float | None = None
    window_end: float | None = None
    #: Requests (measured or not) completed in the window, and their tokens.
    window_completed: int = 0
    window_input_tokens: int = 0
    window_output_tokens: int = 0
    #: Per worker: (CPU seconds, wall seconds, peak RSS bytes, seconds runnable but
    #: waiting for a CPU: ``None`` where the system does not say).
    client: list[tuple[float, float, int, float | None]] = attrs.field(factory=list)
    #: Per second of the stage (from its start): TTFT values (rounded µs, by count) of
    #: the requests sent in that second, and requests sent, completed and output tokens.
    timeline: dict[int, Second] = attrs.field(factory=dict)

    def second(self, index: int) -> Second:
        entry = self.timeline.get(index)
        if entry is None:
            entry = self.timeline[index] = Second()
        return entry

    def error(self, kind: str, example: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.error_examples.setdefault(kind, example)

    def in_window(self, input_tokens: int, output_tokens: int, *_: int) -> None:
        """A request completed in the measured window."""
        self.window_completed += 1
        self.window_input_tokens += input_tokens
        self.window_output_tokens += output_tokens

    @property
    def window_s(self) -> float:
        """The measured window's length in seconds (0 when nothing was measured)."""
        if self.window_start is None or self.window_end is None:
            return 0.0
        return max(self.window_end - self.window_start, 0.0)

    def window(self, sent: float, done: float) -> None:
        self.first_sent = sent if self.first_sent is None else min(self.first_sent, sent)
        self.last_done = done if self.last_done is None else max(self.last_done, done)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def duration(self) -> float:
        if self.first_sent is None or self.last_done is None:
            return 0.0
        return max(self.last_done - self.first_sent, 0.0)

    def merge(self, other: StageStats) -> None:
        for name, histogram in self.histograms.items():
            histogram.merge(other.histograms[name])
        for kind, count in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + count
        for kind, example in other.error_examples.items():
            self.error_examples.setdefault(kind, example)
        for field in (
            "started",
            "completed",
            "good",
            "dropped",
            "unfinished",
            "input_tokens",
            "output_tokens",
            "input_from_server",
            "output_from_server",
            "wire_timed",
            "shared_read_gaps",
            "shared_first_reads",
            "window_completed",
            "window_input_tokens",
            "window_output_tokens",
        ):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        if other.first_sent is not None and other.last_done is not None:
            self.window(other.first_sent, other.last_done)
        if other.window_start is not None and other.window_end is not None:
            # The workers' windows, which start at a barrier, make one: their union.
            starts = [t for t in (self.window_start, other.window_start) if t is not None]
            ends = [t for t in (self.window_end, other.window_end) if t is not None]
            self.window_start, self.window_end = min(starts), max(ends)
        self.client.extend(other.client)
        for index, entry in other.timeline.items():
            self.second(index).merge(entry)

    def to_wire(self) -> dict[str, Any]:
        """A picklable, JSON-ready form (histograms encoded) for crossing processes."""
        data = attrs.asdict(self, recurse=False)
        data["histograms"] = {name: (h.encode(), h.total) for name, h in self.histograms.items()}
        data["timeline"] = {index: entry.to_wire() for index, entry in self.timeline.items()}
        return data

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> StageStats:
        fields = dict(data)
        fields["histograms"] = {
            name: LatencyHistogram.decode(text, total)
            for name, (text, total) in data["histograms"].items()
        }
        fields["client"] = [tuple(c) for c in data["client"]]
        fields["timeline"] = {
            int(index): Second.from_wire(entry) for index, entry in data["timeline"].items()
        }
        return cls(**fields)

    def timeline_rows(self) -> list[dict[str, Any]]:
        """The per-second series stored in the results, in order."""
        rows = []
        for index in sorted(self.timeline):
            entry = self.timeline[index]
            p50 = counter_percentile(entry.ttft, 50.0)
            p99 = counter_percentile(entry.ttft, 99.0)
            rows.append(
                {
                    "second": index,
                    "sent": entry.sent,
                    "completed": entry.completed,
                    "output_tokens": entry.output_tokens,
                    "ttft_p50_ms": None if p50 is None else p50 / 1000,
                    "ttft_p99_ms": None if p99 is None else p99 / 1000,
                }
            )
        return rows
