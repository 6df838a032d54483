"""``trio-sampler bench``: the benchmarks at a small size, their tables printed.

Exit status 0 when every target is met, 1 when one is missed, 2 when a benchmark cannot run.
A benchmark that measures the real-stream corpus is skipped, with one line saying where the
corpus is looked for, when it is absent. ``--json`` prints one JSON document of every
script's results on stdout (the tables then go to stderr).

Each script runs in its own session, so Ctrl-C reaches only this command, which stops the
scripts (and their helpers) with SIGTERM before it reports the interrupt.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._errors import UsageError

__all__ = ["add_parser", "benchmarks_dir"]

#: The scripts run by default, in this order, with the arguments of their small size
#: (each script also takes ``--json PATH`` and ``--no-json``).
SMALL: dict[str, tuple[str, ...]] = {
    "bench_wire.py": ("--quick",),
    "bench_json.py": ("--quick",),
    # Two concurrency levels, ours against the floor; the SDKs, memory, cancel and
    # per-request cells are the full run's (python benchmarks/bench_actor.py).
    "bench_actor.py": (
        "--quick", "--concurrency", "1,50", "--impls", "ours,floor",
        "--no-memory", "--no-per-request", "--cancel-streams", "0",
    ),
}  # fmt: skip
SCRIPTS = tuple(SMALL)
#: Scripts that measure the real-stream corpus (skipped when it is absent).
NEEDS_CORPUS = frozenset({"bench_json.py"})


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "bench",
        help="run the benchmarks at a small size and print their tables",
        description=(
            "Run benchmarks/bench_wire.py, bench_json.py and bench_actor.py from a checkout of "
            "the repository at a small size, printing each table. For the full sizes, run the "
            "scripts themselves (see docs/benchmarks.md)."
        ),
    )
    parser.add_argument(
        "names", nargs="*", help=f"which scripts to run (default: {', '.join(SCRIPTS)})"
    )
    parser.add_argument("--full", action="store_true", help="the scripts' full default sizes")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON document on stdout (the tables go to stderr)",
    )
    parser.set_defaults(run=run)


def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` folder of the checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[2] / "benchmarks"
    return candidate if candidate.is_dir() else None


def _missing_corpus(folder: Path) -> str | None:
    """Where the corpus was looked for, when it is absent (the benchmarks' own rule)."""
    spec = importlib.util.spec_from_file_location("_bench_corpus", folder / "corpus.py")
    if spec is None or spec.loader is None:
        return "benchmarks/corpus.py is missing"
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    if corpus.available():
        return None
    return f"no real-stream corpus at {corpus.root()} (set {corpus.ENV_VAR}=DIR)"


def run(args: argparse.Namespace) -> int:
    folder = benchmarks_dir()
    if folder is None:
        raise UsageError(
            "the benchmarks ship with the source repository, not the package; run this "
            "from a checkout installed with `pip install -e .`"
        )
    names = [n if n.endswith(".py") else f"{n}.py" for n in args.names] or list(SCRIPTS)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"no benchmark {', '.join(missing)} in {folder}")
    tables = sys.stderr if args.json else sys.stdout
    results: dict[str, Any] = {}
    status = 0
    with tempfile.TemporaryDirectory(prefix="trio-sampler-bench-") as scratch:
        for index, name in enumerate(names, 1):
            print(f"== [{index}/{len(names)}] {name}", file=tables, flush=True)
            absent = _missing_corpus(folder) if name in NEEDS_CORPUS else None
            if absent is not None:
                print(f"trio-sampler bench: {name} skipped: {absent}", file=sys.stderr, flush=True)
                continue
            output = Path(scratch) / f"{Path(name).stem}.json"
            command = [sys.executable, str(folder / name)]
            command += ["--json", str(output)] if args.json else ["--no-json"]
            if not args.full:
                command += SMALL.get(name, ("--quick",))
            code = _run_script(command, tables)
            if code != 0:
                what = "missed a target" if code == 1 else f"exited with status {code}"
                print(f"trio-sampler bench: {name} {what}", file=sys.stderr, flush=True)
                status = max(status, 1 if code == 1 else 2)
            if args.json and output.is_file():
                results[Path(name).stem] = json.loads(output.read_text(encoding="utf-8"))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return status


def _run_script(command: list[str], tables: Any) -> int:
    # A Ctrl-C while the child is being started is held until it has started, so the child is
    # never left running on its own (it has its own session: nothing else would stop it).
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        process = subprocess.Popen(command, start_new_session=True, stdout=tables)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        if held:
            raise KeyboardInterrupt
        return process.wait()
    except BaseException:  # Ctrl-C (or anything else): stop the script's whole group first
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        process.wait()
        raise
