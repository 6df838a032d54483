"""The ``trio-sampler`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import _bench, _chat, _demo, _replay, _serve

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-sampler",
        description="A Trio-native runtime for sampling from large language models.",
    )
    parser.add_argument("--version", action="version", version=f"trio-sampler {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo.add_parser(commands)
    _chat.add_parser(commands)
    _replay.add_parser(commands)
    _serve.add_parser(commands)
    _bench.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trio-sampler``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
