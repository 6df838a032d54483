"""JSON decoding of real stream payloads: ``orjson`` vs ``msgspec`` (untyped) vs ``json``.

The payloads are every ``data:`` line of every capture in the real-stream corpus (found as
the test suite finds it: ``TRIO_SAMPLER_REAL_STREAMS``, else ``../shared/fixtures/real-streams``
beside the project; see ``benchmarks/corpus.py``; ``[DONE]`` and anything that is not JSON left
out), grouped by backend. Each decoder parses the whole group once per pass; the best of N
passes divided by the number of payloads is the per-call time.

The transforms receive ``ServerSentEvent.data`` as ``str``, so ``str`` input is the one
that matters; ``bytes`` input is shown beside it. Run ``python benchmarks/bench_json.py``
(see ``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

try:
    from benchmarks import corpus as real_streams
except ModuleNotFoundError:  # run as a script: python benchmarks/bench_json.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import corpus as real_streams

DEFAULT_JSON = Path(__file__).parent / "results" / "bench_json.json"
#: msgspec must beat orjson by more than this to be worth a switch (see docs/benchmarks.md).
SWITCH_THRESHOLD = 0.20

_msgspec_decode = msgspec.json.decode
DECODERS: dict[str, Callable[[Any], object]] = {
    "orjson.loads(str)": orjson.loads,
    "msgspec.json.decode(str)": _msgspec_decode,
    "json.loads(str)": json.loads,
    "orjson.loads(bytes)": orjson.loads,
    "msgspec.json.decode(bytes)": _msgspec_decode,
}


def corpus(root: Path | None = None) -> dict[str, list[bytes]]:
    """Every JSON ``data:`` payload of every capture, by backend directory."""
    root = real_streams.root() if root is None else root
    groups: dict[str, list[bytes]] = {}
    for path in sorted(root.glob("*/*.sse")):
        payloads = groups.setdefault(path.parent.name, [])
        for raw in path.read_bytes().replace(b"\r\n", b"\n").split(b"\n"):
            if not raw.startswith(b"data:"):
                continue
            payload = raw[5:].removeprefix(b" ")
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue  # [DONE] and the like
            payloads.append(payload)
    return groups


def per_call_us(decode: Callable[[Any], object], payloads: Sequence[Any], repeat: int) -> float:
    for payload in payloads:  # warm-up
        decode(payload)
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        for payload in payloads:
            decode(payload)
        best = min(best, time.perf_counter() - start)
    return best / len(payloads) * 1e6


def measure(name: str, payloads: list[bytes], repeat: int) -> dict[str, Any]:
    texts = [payload.decode() for payload in payloads]
    results = {
        label: per_call_us(decode, texts if label.endswith("(str)") else payloads, repeat)
        for label, decode in DECODERS.items()
    }
    orjson_us = results["orjson.loads(str)"]
    msgspec_us = results["msgspec.json.decode(str)"]
    return {
        "corpus": name,
        "payloads": len(payloads),
        "mean_bytes": sum(map(len, payloads)) / len(payloads),
        "per_call_us": results,
        # > 0: msgspec is faster than orjson by this fraction of orjson's time.
        "msgspec_gain_over_orjson": 1 - msgspec_us / orjson_us,
        "json_over_orjson": results["json.loads(str)"] / orjson_us,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["corpus", "payloads", "mean B", *DECODERS, "msgspec gain vs orjson (str)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["corpus"], str(row["payloads"]), f"{row['mean_bytes']:,.0f}"]
        cells += [f"{row['per_call_us'][label]:.2f} µs" for label in DECODERS]
        cells.append(f"{row['msgspec_gain_over_orjson']:+.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(*, quick: bool = False, repeat: int | None = None) -> dict[str, Any]:
    n = repeat if repeat is not None else (3 if quick else 9)
    groups = corpus()
    everything = [payload for payloads in groups.values() for payload in payloads]
    rows = [measure(name, payloads, n) for name, payloads in groups.items()]
    rows.append(measure("all", everything, n))
    overall = rows[-1]["msgspec_gain_over_orjson"]
    return {
        "benchmark": "bench_json",
        "machine": {
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(),
            "orjson": orjson.__version__,
            "msgspec": msgspec.__version__,
        },
        "settings": {
            "repeat": n,
            "quick": quick,
            "corpus_files": len(real_streams.files("*/*.sse")),
        },
        "results": rows,
        "recommendation": (
            "msgspec (untyped) is more than 20 % faster than orjson: consider switching"
            if overall > SWITCH_THRESHOLD
            else "keep orjson: msgspec (untyped) is not more than 20 % faster"
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="orjson vs msgspec vs json on real payloads")
    parser.add_argument("--quick", action="store_true", help="fewer passes (3 instead of 9)")
    parser.add_argument("--repeat", type=int, help="passes per decoder (best is kept)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument("--no-json", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if not real_streams.available():
        print(
            f"bench_json: no real-stream corpus at {real_streams.root()}; "
            f"set {real_streams.ENV_VAR}=DIR",
            file=sys.stderr,
        )
        return 2
    result = run(quick=args.quick, repeat=args.repeat)
    info = result["machine"]
    print(
        f"Python {info['python']}, {info['cpu_count']} CPUs, orjson {info['orjson']}, "
        f"msgspec {info['msgspec']}; best of {result['settings']['repeat']} passes"
    )
    print(table(result["results"]))
    if not args.no_json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
