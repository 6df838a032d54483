"""Reads that fell behind the tokens: which reported percentiles they make too high.

A read is timed by the kernel's receive timestamp of its bytes, which stays exact however
late the read is, with one exception: a read that returns several segments has the stamp
of the LAST one (Linux, TCP). When the client's event loop falls behind by a whole token
interval, the read of a token also carries the next one, and both are stamped with the
second's arrival: the gap before them reads two intervals and the gap between them 0, and
a first token read with the second makes that request's TTFT one interval long. So the
top of the ITL and TTFT distributions moves up by up to one interval, and by as many
values as there were such reads: a percentile whose share of values above it is smaller
than the share of such reads is one of those values.

A stage is marked when the event loop was late by at least the token interval (the lag
probe's maximum, plus the probe's period, against the ITL median; and by at least the
client's lag bound, so that tokens sent together, an interval of about 0, mark nothing)
and some reads did carry two output events; the marked statistics are those that share
reaches. Two events in one read with a loop that kept up are the server's (it sent them
together) and are not marked: they are what arrived."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MARK", "affected_words", "late_reads", "late_words", "marked"]

#: The sign after a statistic the late reads make too high, in the tables.
MARK = "*"
#: The statistics reported, with the share of values above each (``max``: none).
_ABOVE = {"p50": 0.5, "p90": 0.1, "p95": 0.05, "p99": 0.01, "max": 0.0}


def _affected(share: float) -> list[str]:
    """The statistics whose value is among the top ``share`` of the values."""
    return [name for name, above in _ABOVE.items() if share > above] if share > 0 else []


def late_reads(
    *,
    interval_ms: float | None,
    lag_p99_ms: float | None,
    lag_max_ms: float | None,
    itl_shared: float | None,
    ttft_shared: float | None,
    floor_ms: float = 0.0,
    started_together: bool = False,
    resolution_ms: float = 0.0,
) -> dict[str, Any] | None:
    """How far the client's reads fell behind and what it did to the numbers; ``None``
    when it kept up (its loop never late by a whole token interval, or no read carried
    two output events).

    ``interval_ms`` is the token interval (the ITL median), ``lag_*`` the event loop's
    lateness, ``itl_shared`` the share of token gaps that were 0 (two events in one read)
    and ``ttft_shared`` the share of requests whose first two output events came in one
    read. A loop late by less than ``floor_ms`` (the client's lag bound) kept up whatever
    the interval. ``started_together``: a closed loop whose streams all started at once
    (no ramp), which keeps them in step. ``resolution_ms``: the lag probe's period, by
    which a read can have waited longer than the lag it measured (a loop held from just
    after the probe's sleep began)."""
    if interval_ms is None or lag_max_ms is None or lag_max_ms <= 0:
        return None
    if lag_max_ms < floor_ms or lag_max_ms + resolution_ms < interval_ms:
        return None
    itl = itl_shared or 0.0
    ttft = ttft_shared or 0.0
    if itl <= 0 and ttft <= 0:
        return None
    return {
        "late_by_max_ms": lag_max_ms,
        "probe_resolution_ms": resolution_ms,
        "late_by_p99_ms": lag_p99_ms,
        "interval_ms": interval_ms,
        "itl_shared_fraction": itl,
        "ttft_shared_fraction": ttft,
        # Each may be high by up to one interval (and the ITL's low tail that much low).
        "too_high_by_up_to_ms": interval_ms,
        "affected": {"ttft": _affected(ttft), "itl": _affected(itl)},
        "streams_started_together": started_together,
    }


def marked(summary: Mapping[str, Any], metric: str, statistic: str) -> bool:
    """Whether a stage's ``metric`` (``ttft``, ``itl``, ...) ``statistic`` (``p99``,
    ``max``, ...) is one the late reads made too high."""
    late = summary.get("late_reads")
    if not late:
        return False
    return statistic in late["affected"].get(metric, ())


def affected_words(late: Mapping[str, Any], comma: str = ", ") -> list[str]:
    """The statistics a stage's ``late_reads`` marks, a metric each: ``TTFT p99, max``."""
    return [
        f"{metric.upper()} {comma.join(late['affected'][metric])}"
        for metric in ("ttft", "itl")
        if late["affected"][metric]
    ]


def late_words(summary: Mapping[str, Any]) -> str:
    """The note under a stage's latencies when its reads fell behind (empty otherwise)."""
    late = summary.get("late_reads")
    if not late:
        return ""
    lists = affected_words(late)
    p99 = late["late_by_p99_ms"]
    at_p99 = "" if p99 is None else f", p99 {p99:,.1f} ms"
    return (
        f"the client fell behind: its event loop was up to {late['late_by_max_ms']:,.1f} ms "
        f"late{at_p99}, more than the token interval ({late['interval_ms']:,.1f} ms, the ITL "
        f"p50), and {late['itl_shared_fraction']:.1%} of the token gaps and "
        f"{late['ttft_shared_fraction']:.1%} of the first tokens came in one read with the "
        "next token, stamped with its arrival; the statistics marked "
        f"{MARK} ({'; '.join(lists) or 'none'}) may be up to one interval "
        f"({late['too_high_by_up_to_ms']:,.1f} ms) too high: "
        + (_IN_STEP if late.get("streams_started_together") else "")
        + "use more workers, or fewer streams"
    )


#: The remedy for streams started together, which measured the most of the lateness.
_IN_STEP = (
    "the streams started together (no ramp) and stay in step, their tokens arriving in "
    "bursts: start them over about one request's duration (--ramp), "
)
