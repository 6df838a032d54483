"""The ``trio-sampler`` command line.

Each subcommand is a module with ``add_parser(commands)``, which registers its parser and sets
``run`` (``args -> exit status``); adding a command is one entry in :data:`COMMANDS`. How every
command ends is decided here, once:

* a bad argument is one line on stderr and exit status 2 (argparse's errors, and
  :class:`UsageError` raised by a command);
* Ctrl-C ends any command at once with one line (``trio-sampler CMD: interrupted``) and exit
  status 130, whether it arrives in a blocking read or deep inside a nursery;
* a closed stdout (``trio-sampler chat ... | head``) ends quietly, exit status 141 (as if killed
  by SIGPIPE, what the shell's tools do).

Data goes to stdout; notices, progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import __version__
from . import _bench, _chat, _demo, _loadtest, _record, _replay, _serve
from ._errors import UsageError

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

#: The subcommands, in the order ``--help`` lists them.
COMMANDS: tuple[Any, ...] = (_demo, _chat, _record, _replay, _serve, _bench, _loadtest)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``PROG: MESSAGE (see PROG --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trio-sampler",
        description="A Trio-native runtime for sampling from large language models.",
    )
    parser.add_argument("--version", action="version", version=f"trio-sampler {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trio-sampler``; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    undecodable = _undecodable(arguments)
    if undecodable is not None:
        print(f"trio-sampler: {undecodable}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(arguments)
    prog = f"trio-sampler {args.command}"
    try:
        status: int = args.run(args)
    except BaseException as exc:  # sorted by _ended_by; anything else is re-raised
        return _ended_by(prog, exc)
    return status


def _undecodable(arguments: Sequence[str]) -> str | None:
    """Why an argument cannot be used, when one holds bytes that are not text in the
    locale's encoding (Python keeps them as lone surrogates, which no request, file name
    or JSON can carry); ``None`` when every argument is text."""
    for position, argument in enumerate(arguments, start=1):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = ord(argument[exc.start])  # an undecodable byte b is kept as U+DC00 + b
            shown = f"the byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else "a byte"
            return (
                f"argument {position} holds {shown} at character {exc.start} that is not "
                "text in this locale's encoding; pass it as UTF-8 (check the shell's and the "
                "terminal's encoding, e.g. LANG=C.UTF-8)"
            )
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _ended_by(prog: str, exc: BaseException) -> int:
    """The exit status for a command that raised ``exc`` (our own bugs are re-raised)."""
    leaves = _leaves(exc)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        _notice_on_fresh_line(f"{prog}: interrupted")
        return EXIT_INTERRUPTED
    if any(isinstance(leaf, BrokenPipeError) for leaf in leaves):
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    usage = next((leaf for leaf in leaves if isinstance(leaf, UsageError)), None)
    if usage is not None:
        print(f"{prog}: {usage}", file=sys.stderr)
        return EXIT_USAGE
    raise exc


def _notice_on_fresh_line(text: str) -> None:
    # On a terminal, stdout may have stopped mid-line (tokens streaming): start a new one.
    try:
        if sys.stdout.isatty() and sys.stderr.isatty():
            sys.stdout.write("\n")
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(text, file=sys.stderr, flush=True)


def _silence_stdout() -> None:
    # Python flushes stdout at exit; to a closed pipe that would print another error.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
