"""``trio-sampler bench``: the benchmarks at a small size, their tables printed.

Exit status 0 when every target is met, 1 when one is missed, 2 when a benchmark cannot run.
Each script runs in its own session, so Ctrl-C reaches only this command, which stops the
scripts (and their helpers) with SIGTERM before it reports the interrupt.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._errors import UsageError

__all__ = ["add_parser", "benchmarks_dir"]

#: The scripts run by default, in this order (each supports ``--quick`` and ``--json``).
SCRIPTS = ("bench_wire.py", "bench_json.py", "bench_actor.py")


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "bench",
        help="run the benchmarks at a small size and print their tables",
        description=(
            "Run benchmarks/bench_wire.py, bench_json.py and bench_actor.py from a checkout of "
            "the repository with --quick, printing each table. For the full sizes, run the "
            "scripts themselves (see docs/benchmarks.md)."
        ),
    )
    parser.add_argument(
        "names", nargs="*", help=f"which scripts to run (default: {', '.join(SCRIPTS)})"
    )
    parser.add_argument("--full", action="store_true", help="the scripts' full default sizes")
    parser.set_defaults(run=run)


def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` folder of the checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[2] / "benchmarks"
    return candidate if candidate.is_dir() else None


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
    status = 0
    for index, name in enumerate(names, 1):
        print(f"== [{index}/{len(names)}] {name}", flush=True)
        command = [sys.executable, str(folder / name), "--no-json"]
        if not args.full:
            command.append("--quick")
        code = _run_script(command)
        if code != 0:
            what = "missed a target" if code == 1 else f"exited with status {code}"
            print(f"trio-sampler bench: {name} {what}", file=sys.stderr, flush=True)
            status = max(status, 1 if code == 1 else 2)
    return status


def _run_script(command: list[str]) -> int:
    # A Ctrl-C while the child is being started is held until it has started, so the child is
    # never left running on its own (it has its own session: nothing else would stop it).
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        process = subprocess.Popen(command, start_new_session=True)
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
