"""Results: the summary of each stage, the versioned JSON document, CSV, and reading back.

The JSON schema (``"schema": "trio-sampler.loadtest/1"``) is documented in
``docs/loadtest.md``; a reader checks the name and refuses other major versions.
"""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

from ._late import late_reads
from ._stats import HISTOGRAMS, LAG_PROBE_INTERVAL, LatencyHistogram, StageStats

__all__ = ["SCHEMA", "LoadTestResult", "StageResult", "summarize_stage"]

#: The name and major version of the results document.
SCHEMA = "trio-sampler.loadtest/2"
#: The versions :meth:`LoadTestResult.from_json` reads. Version 1 timed every latency
#: from the submit (no ``latency_timed_from``, no ``client.request_write_ms``).
READABLE_SCHEMAS = frozenset({"trio-sampler.loadtest/1", SCHEMA})

#: Latency metrics reported in milliseconds.
LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e")


def _source(from_server: int, completed: int, fallback: str, best: str = "server") -> str:
    if completed == 0:
        return "none"
    if from_server == completed:
        return best
    return fallback if from_server == 0 else "mixed"


def shared_reads(stats: StageStats) -> float | None:
    """The share of ITL gaps that were zero: events that arrived in one read with the
    event before. ``None`` without gaps."""
    gaps = stats.histograms["itl"].count
    return stats.shared_read_gaps / gaps if gaps else None


def _late_reads(
    stats: StageStats,
    loop_lag: Mapping[str, Any],
    lag_bound_ms: float,
    load: Mapping[str, Any],
) -> dict[str, Any] | None:
    """How far the stage's reads fell behind the tokens (see :mod:`._late`)."""
    itl = stats.histograms["itl"].summary(0.001)
    ttft_count = stats.histograms["ttft"].count
    return late_reads(
        interval_ms=itl["p50"],
        lag_p99_ms=loop_lag.get("p99"),
        lag_max_ms=loop_lag.get("max"),
        itl_shared=shared_reads(stats),
        ttft_shared=stats.shared_first_reads / ttft_count if ttft_count else None,
        floor_ms=lag_bound_ms,
        resolution_ms=LAG_PROBE_INTERVAL * 1000,
        started_together=load.get("kind") == "concurrency" and not load.get("ramp_s"),
    )


def summarize_stage(
    load: Mapping[str, Any],
    label: str,
    stats: StageStats,
    *,
    cpu_bound: float,
    lag_bound_ms: float,
    slo_given: bool,
    memory_cap: int | None = None,
) -> dict[str, Any]:
    """The JSON summary of one stage's (merged) statistics."""
    window = stats.window_s
    per_s = (lambda n: n / window) if window > 0 else (lambda n: 0.0)
    throughput = per_s(stats.window_completed)
    histograms = stats.histograms
    client_rows: list[dict[str, Any]] = [
        {
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_fraction": cpu / wall if wall > 0 else 0.0,
            "cpu_wait_fraction": None if waited is None or wall <= 0 else waited / wall,
            "peak_rss_bytes": rss,
        }
        for cpu, wall, rss, waited in stats.client
    ]
    loop_lag = histograms["loop_lag"].summary(0.001)
    send_lag = histograms["send_lag"].summary(0.001)
    reasons = []
    busiest = max((row["cpu_fraction"] for row in client_rows), default=0.0)
    if busiest >= cpu_bound:
        reasons.append(f"a worker used {busiest:.0%} of a core (bound: {cpu_bound:.0%})")
    lag_p99 = loop_lag.get("p99")
    if isinstance(lag_p99, float) and lag_p99 >= lag_bound_ms:
        reason = f"event-loop lag p99 {lag_p99:.1f} ms (bound: {lag_bound_ms:g} ms)"
        if busiest < cpu_bound:
            # Late wake-ups without a busy process: it was waiting for a CPU.
            waited = max(
                (w / wall for _, wall, _, w in stats.client if w is not None and wall > 0),
                default=None,
            )
            waiting = "" if waited is None else f" and waiting for a CPU {waited:.0%} of the time"
            reason += (
                f" while using only {busiest:.0%} of a core{waiting}: the machine's CPUs are "
                "oversubscribed (other processes, or the server itself)"
            )
        reasons.append(reason)
    send_p99 = send_lag.get("p99")
    if isinstance(send_p99, float) and send_p99 >= lag_bound_ms:
        reasons.append(f"arrivals sent late, p99 {send_p99:.1f} ms (bound: {lag_bound_ms:g} ms)")
    late = _late_reads(stats, loop_lag, lag_bound_ms, load)
    if late is not None:
        reasons.append(
            f"reads late by up to {late['late_by_max_ms']:.1f} ms, more than the token "
            f"interval ({late['interval_ms']:.1f} ms): the marked percentiles may be up to "
            "one interval too high"
        )
    stopped = stats.errors.get("memory_cap", 0)
    if stopped:
        reasons.append(
            f"the run's memory cap ({memory_cap or 0:,} bytes) stopped {stopped:,} "
            "streams holding the most response text (raise --memory-cap if the server's "
            "answers are that long)"
        )
    return {
        "load": dict(load),
        "label": label,
        "duration_s": stats.duration,
        "requests": {
            "started": stats.started,
            "completed": stats.completed,
            "failed": stats.failed,
            "dropped": stats.dropped,
            "unfinished": stats.unfinished,
            "errors": dict(sorted(stats.errors.items())),
            "error_examples": dict(sorted(stats.error_examples.items())),
        },
        "throughput": {
            "window_s": window,
            "completed": stats.window_completed,
            "requests_per_s": throughput,
            "input_tokens_per_s": per_s(stats.window_input_tokens),
            "output_tokens_per_s": per_s(stats.window_output_tokens),
        },
        "goodput": (
            {
                # The window's completions at the measured requests' share of good ones.
                "requests_per_s": throughput * stats.good / stats.completed
                if stats.completed
                else 0.0,
                "fraction": stats.good / stats.started if stats.started else 0.0,
            }
            if slo_given
            else None
        ),
        "tokens": {
            "input": stats.input_tokens,
            "input_source": _source(stats.input_from_server, stats.completed, "planned"),
            "output": stats.output_tokens,
            "output_source": _source(stats.output_from_server, stats.completed, "counted"),
        },
        "latency_ms": {name: histograms[name].summary(0.001) for name in LATENCY_METRICS},
        "latency_timed_from": _source(stats.wire_timed, stats.completed, "submit", "wire"),
        "itl_shared_read_fraction": shared_reads(stats),
        "late_reads": late,
        "stream_output_tokens_per_s": histograms["stream_output_tps"].summary(0.001),
        "open_loop": (
            {
                "pacing_error_ms": send_lag,
                "ttft_from_schedule_ms": histograms["ttft_from_schedule"].summary(0.001),
                "e2e_from_schedule_ms": histograms["e2e_from_schedule"].summary(0.001),
            }
            if load.get("kind") == "rate"
            else None
        ),
        "client": {
            "workers": client_rows,
            "loop_lag_ms": loop_lag,
            "send_lag_ms": send_lag,
            "request_write_ms": histograms["request_write"].summary(0.001),
            "memory_cap_bytes": memory_cap,
            "client_bound": bool(reasons),
            "reasons": reasons,
        },
        "timeline": stats.timeline_rows(),
        "histograms": {name: histograms[name].encode() for name in HISTOGRAMS},
    }


@attrs.frozen
class StageResult:
    """One stage of a result document, with its histograms decoded on demand."""

    summary: Mapping[str, Any]

    @property
    def label(self) -> str:
        return str(self.summary["label"])

    @property
    def load(self) -> Mapping[str, Any]:
        load: Mapping[str, Any] = self.summary["load"]
        return load

    def histogram(self, name: str) -> LatencyHistogram:
        return LatencyHistogram.decode(self.summary["histograms"][name])

    def latency(self, metric: str, statistic: str) -> float | None:
        value = self.summary["latency_ms"][metric][statistic]
        return None if value is None else float(value)

    @property
    def client_bound(self) -> bool:
        return bool(self.summary["client"]["client_bound"])


@attrs.frozen
class LoadTestResult:
    """A whole run: what was tested and each stage's summary. See ``docs/loadtest.md``."""

    test: Mapping[str, Any]
    stages: tuple[StageResult, ...]
    created: str = attrs.field(
        factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    )
    version: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "created": self.created,
            "trio_sampler_version": self.version,
            **self.test,
            "stages": [dict(stage.summary) for stage in self.stages],
        }

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2)

    def write_json(self, path: str | Path) -> None:
        Path(path).write_bytes(self.dumps() + b"\n")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoadTestResult:
        """Read a document written by :meth:`to_json`.

        Raises:
            ValueError: it is not a load-test result, or of an unsupported schema version.
        """
        schema = data.get("schema") if isinstance(data, Mapping) else None
        if not isinstance(schema, str) or not schema.startswith("trio-sampler.loadtest/"):
            raise ValueError("not a trio-sampler loadtest result (no 'schema' key)")
        if schema not in READABLE_SCHEMAS:
            raise ValueError(
                f"result schema {schema!r} is not supported; this reads "
                + ", ".join(sorted(READABLE_SCHEMAS))
            )
        test = {
            k: v
            for k, v in data.items()
            if k not in ("schema", "created", "trio_sampler_version", "stages")
        }
        return cls(
            test=test,
            stages=tuple(StageResult(stage) for stage in data["stages"]),
            created=str(data.get("created", "")),
            version=str(data.get("trio_sampler_version", "")),
        )

    @classmethod
    def read(cls, path: str | Path) -> LoadTestResult:
        """Read a results JSON file (``ValueError`` if it is not one)."""
        try:
            data = orjson.loads(Path(path).read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        return cls.from_json(data)

    def csv(self) -> str:
        """One row per stage: load, counts, throughput, goodput and the percentiles."""
        rows = [csv_row(stage.summary) for stage in self.stages]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["label"])
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def csv_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    load = summary["load"]
    row: dict[str, Any] = {
        "label": summary["label"],
        "load_kind": load["kind"],
        "streams": load.get("streams"),
        "rate_per_s": load.get("per_second"),
        "duration_s": round(summary["duration_s"], 3),
    }
    for key in ("started", "completed", "failed", "dropped", "unfinished"):
        row[key] = summary["requests"][key]
    throughput = summary["throughput"]
    for key in ("window_s", "requests_per_s", "input_tokens_per_s", "output_tokens_per_s"):
        value = throughput.get(key)  # version 1 and early version 2: no window_s
        row[key] = None if value is None else round(value, 3)
    goodput = summary["goodput"]
    row["goodput_requests_per_s"] = None if goodput is None else round(goodput["requests_per_s"], 3)
    for metric, values in summary["latency_ms"].items():
        for statistic in ("p50", "p90", "p95", "p99", "max", "mean"):
            value = values[statistic]
            row[f"{metric}_{statistic}_ms"] = None if value is None else round(value, 3)
    row["output_tokens_source"] = summary["tokens"]["output_source"]
    row["client_bound"] = summary["client"]["client_bound"]
    return row
