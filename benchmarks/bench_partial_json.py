"""Keeping a parsed view of streamed JSON current: our incremental reader against the
re-parse of the whole prefix that the peers do.

One document arrives in 4-byte deltas; each contender keeps a partial value it can show.
CPU time per document (``time.process_time``, median of the runs), µs per delta, and the
growth of the time when the document doubles (the ratio per doubling, from one size to
the next: 2.0 is linear, 4.0 quadratic).

Contenders (all read every delta unless said):

* ``ours, every delta``: :meth:`PartialJSON.feed` per delta, its changes taken;
* ``ours, every 1 KiB``: :attr:`PartialJSON.push` per delta, the value read every 256
  deltas (a view refreshed by bytes, as a UI would);
* ``ours, sampler per read``: the path a stream takes: the deltas as ``ToolCallDelta``
  events (made before the clock starts: they are the transform's, not the reader's), in
  batches of ``READ_EVENTS`` (one network read each), through
  :meth:`PartialOutputs.batch`, which reads a run of fragments once and places its
  ``ToolArgumentsDelta`` after it. Why a read holds that many events is in
  ``docs/benchmarks.md``;
* ``jiter re-parse``: ``jiter.from_json(prefix, partial_mode="trailing-strings")`` on the
  whole prefix (openai-python's and anthropic's stream helpers);
* ``pydantic partial``: ``TypeAdapter(Any).validate_json(prefix,
  experimental_allow_partial=True)`` (pydantic-ai's output streaming);
* ``partial-json-parser``: ``partial_json_parser.loads(prefix)``;
* ``ijson push (no view)``: ijson's yajl2 C push parser fed each delta; it shows a value
  only once complete (no open strings), listed as the C tokenizer we measured against.

Two document shapes: ``records`` (an array of small objects: many short tokens) and
``file`` (a tool call writing a file: one long string with escapes). A contender whose run
at the previous size took more than ``--budget`` seconds, scaled by its growth, is not run
at the next ("-" in the table).

Run ``python benchmarks/bench_partial_json.py`` (``--quick`` for one run per cell); the
results go to ``benchmarks/results/bench_partial_json.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ijson
import jiter
import partial_json_parser
import pydantic

try:
    from benchmarks.common import write_results
except ModuleNotFoundError:  # run as a script: python benchmarks/bench_partial_json.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import write_results

from trio_sampler.types import ConversationRequest, SamplingEvent, ToolCallDelta, ToolSpec, User
from trio_sampler.wire import PartialJSON, PartialOutputs

DEFAULT_JSON = Path(__file__).parent / "results" / "bench_partial_json.json"
SIZES_KIB = (4, 16, 64, 128, 256)
DELTA = 4
#: Events per network read on the sampler's path: 1 KiB of JSON in 4-byte deltas, about
#: 40 KiB of SSE (a tool-argument event is ~150 bytes on the wire), within one 64 KiB read
#: of a stream that arrives faster than it is read.
READ_EVENTS = 256
#: The targets: 64 KiB in 4-byte deltas within 5 ms, and at most 2.2x per doubling.
TARGET_MS_64K = 5.0
TARGET_GROWTH = 2.2


def records(size: int) -> str:
    """An array of small records, ``size`` bytes or just more."""
    rnd = random.Random(size)
    items: list[dict[str, Any]] = []
    length = 2
    while length < size:
        item = {
            "id": len(items),
            "name": f"item {len(items)}",
            "price": round(rnd.random() * 100, 2),
            "tags": ["new", "sale"][: rnd.randint(0, 2)],
            "in_stock": rnd.random() < 0.5,
        }
        items.append(item)
        length += len(json.dumps(item)) + 2
    return json.dumps(items)


def file_call(size: int) -> str:
    """A tool call's arguments writing a file of about ``size`` bytes of Python."""
    line = 'def f{n}(x):\n    return "value: %s" % (x * {n},)\n'
    lines, length, n = [], 0, 0
    while length < size:
        lines.append(line.format(n=n))
        length += len(json.dumps(lines[-1])) - 2
        n += 1
    return json.dumps({"path": "src/generated.py", "content": "".join(lines)})


SHAPES: dict[str, Callable[[int], str]] = {"records": records, "file": file_call}


def ours_every_delta(deltas: list[str]) -> Any:
    reader = PartialJSON()
    for delta in deltas:
        reader.feed(delta)
    return reader.finish()


def ours_every_kib(deltas: list[str]) -> Any:
    reader = PartialJSON()
    push = reader.push
    for start in range(0, len(deltas), 256):
        for delta in deltas[start : start + 256]:
            push(delta)
        reader.value  # noqa: B018  # the view, refreshed
    return reader.finish()


_TOOL_REQUEST = ConversationRequest([User("x")], tools=[ToolSpec("t")])


def sampler_reads(deltas: list[str]) -> list[list[SamplingEvent]]:
    """The deltas as a stream's batches of tool-argument events (``READ_EVENTS`` a read)."""
    events: list[SamplingEvent] = [ToolCallDelta("b", 0, None, None, d) for d in deltas]
    return [events[i : i + READ_EVENTS] for i in range(0, len(events), READ_EVENTS)]


def ours_sampler_per_read(batches: list[list[SamplingEvent]]) -> Any:
    partials = PartialOutputs.for_request("b", _TOOL_REQUEST)
    assert partials is not None
    for batch in batches:
        partials.batch(batch)
    return partials.arguments(0)


def _reparse(parse: Callable[[str], Any]) -> Callable[[list[str]], Any]:
    def run(deltas: list[str]) -> Any:
        prefix = ""
        value = None
        for delta in deltas:
            prefix += delta
            try:
                value = parse(prefix)
            except ValueError:
                pass  # a prefix the parser cannot show yet
        return value

    return run


_ANY = pydantic.TypeAdapter(Any)


def _jiter(prefix: str) -> Any:
    return jiter.from_json(prefix.encode(), partial_mode="trailing-strings")


def _pydantic(prefix: str) -> Any:
    return _ANY.validate_json(prefix, experimental_allow_partial=True)


def ijson_push(deltas: list[str]) -> Any:
    events = ijson.sendable_list()
    coroutine = ijson.items_coro(events, "", use_float=True)
    for delta in deltas:
        coroutine.send(delta.encode())
    coroutine.close()
    return events[0]


CONTENDERS: dict[str, Callable[[Any], Any]] = {
    "ours, sampler per read": ours_sampler_per_read,
    "ours, every delta": ours_every_delta,
    "ours, every 1 KiB": ours_every_kib,
    "jiter re-parse": _reparse(_jiter),
    "pydantic partial": _reparse(_pydantic),
    "partial-json-parser": _reparse(partial_json_parser.loads),
    "ijson push (no view)": ijson_push,
}


#: What a contender reads, made from the deltas before the clock starts (else the deltas).
PREPARE: dict[str, Callable[[list[str]], Any]] = {"ours, sampler per read": sampler_reads}


def measure(run: Callable[[Any], Any], deltas: Any, repeat: int) -> tuple[float, Any]:
    """The median CPU seconds of ``repeat`` runs (one when a run takes over a second),
    and the value the first run read."""
    times = []
    value = None
    for n in range(repeat):
        start = time.process_time()
        result = run(deltas)
        times.append(time.process_time() - start)
        if n == 0:
            value = result
        if times[-1] > 1.0:
            break
    return statistics.median(times), value


def _predicted(previous: tuple[int, float], growth: float, kib: int) -> float:
    """The seconds a run at ``kib`` should take, from the last size's and the growth."""
    return float(previous[1] * growth ** math.log2(kib / previous[0]))


def bench(repeat: int, budget: float) -> list[dict[str, Any]]:
    rows = []
    for shape, make in SHAPES.items():
        for name, run in CONTENDERS.items():
            previous: tuple[int, float] | None = None
            growth = 2.0
            for kib in SIZES_KIB:
                doc = make(kib * 1024)
                deltas = [doc[i : i + DELTA] for i in range(0, len(doc), DELTA)]
                row: dict[str, Any] = {"shape": shape, "contender": name, "kib": kib}
                row.update(bytes=len(doc), deltas=len(deltas), cpu_ms=None)
                if previous is None or _predicted(previous, growth, kib) <= budget:
                    given = PREPARE[name](deltas) if name in PREPARE else deltas
                    seconds, value = measure(run, given, repeat)
                    assert value == json.loads(doc), (name, shape, kib)
                    if previous is not None:
                        growth = (seconds / previous[1]) ** (1 / math.log2(kib / previous[0]))
                        row["growth_per_doubling"] = round(growth, 2)
                    row["cpu_ms"] = round(seconds * 1000, 2)
                    row["us_per_delta"] = round(seconds / len(deltas) * 1e6, 3)
                    previous = (kib, seconds)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    cpu = "-" if row["cpu_ms"] is None else f"{row['cpu_ms']:,.2f} ms"
    per = "" if row["cpu_ms"] is None else f"{row['us_per_delta']:.2f} us/delta"
    growth = row.get("growth_per_doubling")
    grow = "" if growth is None else f"x{growth:.2f}/doubling"
    return (
        f"{row['shape']:<8} {row['contender']:<22} {row['kib']:>4} KiB "
        f"{row['deltas']:>7} deltas {cpu:>13} {per:>16} {grow:>15}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="incremental JSON reader vs re-parsing")
    parser.add_argument("--quick", action="store_true", help="one run per cell (else 3)")
    parser.add_argument("--budget", type=float, default=8.0, help="seconds per cell at most")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument("--no-json", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = bench(1 if args.quick else 3, args.budget)
    load_after = os.getloadavg()[0]
    ours = [r for r in rows if r["contender"].startswith("ours") and r["kib"] == 64]
    for row in ours:
        print(f"target: {row['shape']} {row['contender']} 64 KiB {row['cpu_ms']} ms", end=" ")
        print(f"(<= {TARGET_MS_64K} ms: {row['cpu_ms'] <= TARGET_MS_64K})")
    if not args.no_json:
        write_results(
            args.json,
            {
                "delta_bytes": DELTA,
                # The machine may be shared: the 1-minute load average, before and after.
                "load_average": [round(load_before, 2), round(load_after, 2)],
                "targets": {"cpu_ms_64kib": TARGET_MS_64K, "growth": TARGET_GROWTH},
                "versions": {
                    "python": sys.version.split()[0],
                    "jiter": getattr(jiter, "__version__", None),
                    "pydantic": pydantic.VERSION,
                    "ijson": ijson.__version__,
                },
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
