"""A load test described in words, for the printed tables and the HTML report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "length_words",
    "limits_words",
    "machine_words",
    "shared_read_words",
    "slo_words",
    "tokens_words",
    "workload_words",
]


def length_words(spec: str | None) -> str:
    """A length distribution's ``describe()`` text (``256``, ``uniform:64:512``, ...) in
    words."""
    if spec is None:
        return "the dataset's own"
    kind, _, rest = spec.partition(":")
    if not rest:
        return f"{int(kind):,}"
    parts = rest.split(":")
    if kind == "uniform":
        return f"{int(parts[0]):,} to {int(parts[1]):,} (uniform)"
    if kind == "normal":
        return f"{float(parts[0]):,g} ± {float(parts[1]):,g} (normal)"
    buckets = [pair.split("=") for pair in rest.split(",")]
    total = sum(float(weight) for _, weight in buckets) or 1.0
    shares = ", ".join(f"{int(n):,} ({float(w) / total:.0%})" for n, w in buckets)
    return f"one of {shares}"


def workload_words(workload: Mapping[str, Any]) -> str:
    """What was sent, in a sentence."""
    output = length_words(workload.get("output_tokens"))
    if workload.get("kind") == "dataset":
        limit = workload.get("limit")
        first = f"the first {limit:,} " if limit else ""
        return (
            f"{first}conversations of the dataset {workload.get('path')}, output tokens "
            f"{output} at most"
        )
    words = (
        f"synthetic prompts of {length_words(workload.get('input_tokens'))} input tokens, "
        f"output tokens {output} at most"
    )
    prefix = workload.get("prefix_tokens") or 0
    if prefix:
        groups = workload.get("prefix_groups") or 1
        words += (
            f"; each starts with one of {groups:,} shared prefixes of {prefix:,} tokens"
            if groups > 1
            else f"; all start with the same {prefix:,}-token prefix"
        )
    if workload.get("system"):
        words += "; with a system prompt"
    return words


def limits_words(limits: Mapping[str, Any]) -> str:
    """How long each stage ran, in a sentence."""
    warm = []
    if limits.get("warmup_s"):
        warm.append(f"{limits['warmup_s']:g} s")
    if limits.get("warmup_requests"):
        warm.append(f"{limits['warmup_requests']:,} requests")
    stop = []
    if limits.get("duration_s") is not None:
        stop.append(f"{limits['duration_s']:g} s")
    if limits.get("requests") is not None:
        stop.append(f"{limits['requests']:,} requests")
    start = f"a warm-up of {' and '.join(warm)} not measured, then " if warm else ""
    first = " (whichever comes first)" if len(stop) > 1 else ""
    return (
        f"each stage: {start}measured for {' or '.join(stop)}{first}, "
        f"then up to {limits.get('drain_timeout_s', 0):g} s for the requests in flight"
    )


def slo_words(slo: Mapping[str, Any]) -> str:
    """The objectives behind goodput, in a sentence."""
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
    bounds = [f"{names[key]} ≤ {value:,g} ms" for key, value in slo.items() if key in names]
    if not bounds:
        return "no SLO given: goodput is not reported (--slo-ttft, --slo-tpot, --slo-e2e)"
    return "goodput counts the completed requests with " + " and ".join(bounds)


def machine_words(machine: Mapping[str, Any] | None) -> str:
    """Cores, load and versions, in a sentence (empty for results without them)."""
    if not machine:
        return ""

    def load(values: list[float] | None) -> str:
        return "unknown" if not values else " / ".join(f"{v:.2f}" for v in values)

    versions = ", ".join(
        f"{name} {version}" for name, version in machine.get("versions", {}).items() if version
    )
    cores = machine.get("cores")
    usable = machine.get("usable_cores")
    usable_text = f" ({usable} usable)" if usable and usable != cores else ""
    return (
        f"{cores} cores{usable_text}, load average (1 / 5 / 15 min) "
        f"{load(machine.get('load_average_before'))} before and "
        f"{load(machine.get('load_average_after'))} after; {machine.get('platform')}, "
        f"Python {machine.get('python')}; {versions}"
    )


_TOKEN_SOURCES = {
    "server": "the server's usage",
    "counted": "counted events",
    "planned": "planned lengths",
    "mixed": "partly the server's",
    "none": "none completed",
}


def tokens_words(tokens: Mapping[str, Any]) -> str:
    """Where a stage's token counts came from."""
    output = str(tokens.get("output_source", "none"))
    given = str(tokens.get("input_source", "none"))
    if output == given:
        return _TOKEN_SOURCES.get(output, output)
    return (
        f"output: {_TOKEN_SOURCES.get(output, output)}, input: {_TOKEN_SOURCES.get(given, given)}"
    )


#: The share of zero ITL gaps from which a stage's note says so.
SHARED_READS_NOTED = 0.01


def shared_read_words(summary: Mapping[str, Any]) -> str:
    """A note when many output events arrived in one read with the event before (empty
    otherwise): their gaps read 0 and the gap before them is stamped one read late."""
    fraction = summary.get("itl_shared_read_fraction")
    if not isinstance(fraction, float) or fraction < SHARED_READS_NOTED:
        return ""
    return (
        f"{fraction:.1%} of the token gaps are 0: those events came in one network read "
        "with the event before (sent together, or read late); a read is stamped with its "
        "last bytes, so the gap before such a pair counts both"
    )
