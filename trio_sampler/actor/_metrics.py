"""Latency bookkeeping for one request, turned into :class:`RequestMetrics` at the end."""

from __future__ import annotations

import math

from ..types import AttemptRecord, ConversationResponse, RequestMetrics, SamplingErrorInfo

__all__ = ["MetricsRecorder", "percentile"]


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (``fraction`` in (0, 1])."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class MetricsRecorder:
    """Times are ``trio.current_time()`` values; reported in ms from submit.

    Per-attempt values (headers, first token, token arrival times) describe the attempt
    that produced the terminal: earlier attempts' output was discarded.
    """

    def __init__(self, submitted_at: float) -> None:
        self.submitted_at = submitted_at
        self.attempts: list[AttemptRecord] = []
        self._attempt_started = submitted_at
        self.headers_at: float | None = None
        self.first_token_at: float | None = None
        self.last_byte_at: float | None = None
        self.token_times: list[float] = []
        self.token_count = 0

    def start_attempt(self, now: float) -> None:
        self._attempt_started = now
        self.headers_at = None
        self.first_token_at = None
        self.last_byte_at = None
        self.token_times = []
        self.token_count = 0

    def end_attempt(self, now: float, error: SamplingErrorInfo | None) -> None:
        self.attempts.append(
            AttemptRecord(
                attempt=len(self.attempts) + 1,
                kind=None if error is None else error.kind,
                status_code=None if error is None else error.status_code,
                duration_ms=(now - self._attempt_started) * 1000.0,
            )
        )

    def tokens(self, now: float, count: int) -> None:
        """``count`` content events arrived in one network read at ``now``."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.token_times.append(now)
        self.token_count += count

    def _ms(self, at: float | None) -> float | None:
        return None if at is None else (at - self.submitted_at) * 1000.0

    def build(self, response: ConversationResponse | None) -> RequestMetrics:
        gaps = sorted(
            (later - earlier) * 1000.0
            for earlier, later in zip(self.token_times, self.token_times[1:], strict=False)
        )
        return RequestMetrics(
            time_to_headers_ms=self._ms(self.headers_at),
            time_to_first_token_ms=self._ms(self.first_token_at),
            time_to_last_byte_ms=self._ms(self.last_byte_at),
            itl_p50_ms=percentile(gaps, 0.5) if gaps else None,
            itl_p99_ms=percentile(gaps, 0.99) if gaps else None,
            itl_max_ms=gaps[-1] if gaps else None,
            chunk_count=self.token_count,
            attempts=tuple(self.attempts),
            usage=None if response is None else response.usage,
            cost_usd_ticks=None if response is None else response.cost_usd_ticks,
        )
