"""Pass or fail for CI: a stage where every request failed, and ``--fail-if`` thresholds.

A threshold is ``METRIC OP VALUE``: ``ttft.p99>500ms``, ``error_rate>1%``,
``itl.p95>50ms``, ``goodput<95%``, ``throughput<20``. It names a failure: the run fails
when, in any stage, the metric is on the wrong side of the value.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ._results import LoadTestResult, StageResult

__all__ = ["Threshold", "verdict"]

#: The latency metrics a threshold can name, and their statistics.
_LATENCIES = ("ttft", "itl", "tpot", "e2e")
_STATISTICS = ("p50", "p90", "p95", "p99", "max", "mean")

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}


def _error_rate(summary: Mapping[str, Any]) -> float | None:
    requests = summary["requests"]
    ended = requests["completed"] + requests["failed"]
    return requests["failed"] / ended if ended else None


def _goodput(summary: Mapping[str, Any]) -> float | None:
    goodput = summary["goodput"]
    return None if goodput is None else float(goodput["fraction"])


#: The metrics that are not latencies: how to read them from a stage, and their unit
#: (``"%"``: a fraction written as a percentage; ``""``: a plain number).
_RATIOS: dict[str, tuple[Callable[[Mapping[str, Any]], float | None], str]] = {
    "error_rate": (_error_rate, "%"),
    "goodput": (_goodput, "%"),
    "throughput": (lambda s: float(s["throughput"]["requests_per_s"]), ""),
    "output_tps": (lambda s: float(s["throughput"]["output_tokens_per_s"]), ""),
}

_EXPRESSION = re.compile(
    r"^\s*(?P<metric>[a-z_0-9]+(?:\.[a-z0-9]+)?)\s*(?P<op>>=|<=|>|<)\s*"
    r"(?P<value>[0-9]*\.?[0-9]+)\s*(?P<unit>ms|s|%)?\s*$"
)
_EXAMPLES = "e.g. ttft.p99>500ms, itl.p95>50ms, e2e.max>30s, error_rate>1%, goodput<95%"
_UNITS = {"ms": 1.0, "s": 1000.0}


@attrs.frozen
class Threshold:
    """A failure condition: the stage fails when ``metric`` ``op`` ``value``.

    ``metric`` is ``ttft``, ``itl``, ``tpot`` or ``e2e`` with a statistic (``ttft.p99``;
    ``value`` in ms), or ``error_rate`` / ``goodput`` (fractions), ``throughput``
    (requests/s) or ``output_tps`` (output tokens/s). Build one with :meth:`parse`.
    """

    metric: str
    op: str
    value: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """``ttft.p99>500ms``, ``error_rate>1%``, ...

        Raises:
            ValueError: not of that form; the message says what to write.
        """
        match = _EXPRESSION.match(text.lower())
        if match is None:
            raise ValueError(f"--fail-if {text!r}: write METRIC>VALUE, {_EXAMPLES}")
        metric, op, unit = match["metric"], match["op"], match["unit"]
        value = float(match["value"])
        if "." in metric:
            name, statistic = metric.split(".")
            if name not in _LATENCIES or statistic not in _STATISTICS:
                raise ValueError(
                    f"--fail-if {text!r}: a latency is one of {', '.join(_LATENCIES)} with "
                    f"a statistic ({', '.join(_STATISTICS)}), {_EXAMPLES}"
                )
            if unit not in _UNITS:
                raise ValueError(f"--fail-if {text!r}: give the time in ms or s, e.g. 500ms")
            return cls(metric, op, value * _UNITS[unit], text.strip())
        if metric not in _RATIOS:
            known = ", ".join([*(f"{m}.p99" for m in _LATENCIES), *_RATIOS])
            raise ValueError(f"--fail-if {text!r}: unknown metric {metric!r}; known: {known}")
        wanted = _RATIOS[metric][1]
        if (unit or "") != wanted:
            example = f"{metric}>1%" if wanted == "%" else f"{metric}<20"
            raise ValueError(f"--fail-if {text!r}: write {metric} as in {example}")
        return cls(metric, op, value / 100 if wanted == "%" else value, text.strip())

    def measure(self, stage: StageResult) -> float | None:
        """The stage's value of the metric (``None``: it has none)."""
        if "." in self.metric:
            name, statistic = self.metric.split(".")
            return stage.latency(name, statistic)
        return _RATIOS[self.metric][0](stage.summary)

    def failure(self, stage: StageResult) -> str | None:
        """Why ``stage`` fails this threshold, in one line; ``None`` if it does not."""
        value = self.measure(stage)
        if value is None or not _OPERATORS[self.op](value, self.value):
            return None
        return f"{stage.label}: {self.metric} {self._show(value)} ({self.text})"

    def _show(self, value: float) -> str:
        if "." in self.metric:
            return f"{value:,.1f} ms"
        if _RATIOS[self.metric][1] == "%":
            return f"{value:.2%}"
        return f"{value:,.2f}"


def _all_failed(stage: StageResult) -> str | None:
    requests = stage.summary["requests"]
    if requests["completed"] or not requests["failed"]:
        return None
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in requests["errors"].items())
    return f"{stage.label}: every request failed ({kinds})"


def verdict(result: LoadTestResult, thresholds: Iterable[Threshold] = ()) -> list[str]:
    """Why the run fails, one line per reason (empty: it passes).

    A stage fails when it completed no request and some failed, and when any of
    ``thresholds`` holds for it.
    """
    reasons = []
    thresholds = tuple(thresholds)
    for stage in result.stages:
        every = _all_failed(stage)
        if every is not None:
            reasons.append(every)
        reasons += [r for t in thresholds if (r := t.failure(stage)) is not None]
    return reasons
