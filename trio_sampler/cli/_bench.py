"""``trio-sampler bench``: the benchmarks at a small size, their tables printed."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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
        print(
            "trio-sampler bench: the benchmarks ship with the source repository, not the "
            "package; run this from a checkout installed with `pip install -e .`",
            file=sys.stderr,
        )
        return 2
    names = [n if n.endswith(".py") else f"{n}.py" for n in args.names] or list(SCRIPTS)
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for index, name in enumerate(names, 1):
            script = folder / name
            if not script.is_file():
                print(f"trio-sampler bench: no benchmark {name} in {folder}", file=sys.stderr)
                status = 2
                continue
            print(f"== [{index}/{len(names)}] {name}", flush=True)
            command = [sys.executable, str(script), "--json", str(Path(tmp) / f"{name}.json")]
            if not args.full:
                command.append("--quick")
            code = subprocess.call(command)
            if code != 0:
                print(f"trio-sampler bench: {name} exited with {code}", file=sys.stderr)
                status = 1
    return status
