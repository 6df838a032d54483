"""``trio-sampler serve [--host H] [--port N]``: the emulator as a server."""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from typing import Any

import trio

from ._errors import UsageError, port, positive_int, run_interruptibly

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="run the local emulator of the three APIs",
        description=(
            "Serve the emulator of Chat Completions, Responses and Messages on loopback. "
            "The first line printed is 'listening on http://HOST:PORT'; point a client at "
            "http://HOST:PORT/v1. Stop with Ctrl-C."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=port, default=0, help="port (0 picks a free one)")
    parser.add_argument(
        "--bench",
        action="store_true",
        help="bench mode: pre-rendered bodies, so client benchmarks measure the client",
    )
    parser.add_argument(
        "--backlog", type=positive_int, default=1024, help="listen queue length (default 1024)"
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help=(
            "bind with SO_REUSEPORT, so several 'serve' processes can share one port (start "
            "one with --port 0 --reuse-port, the others with --port N --reuse-port); the "
            "kernel spreads connections over them"
        ),
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help=(
            "close a connection idle this long, before its first request or between "
            "requests (default 5); a load generator opening thousands of connections at "
            "once can take longer than that to send its first request on each"
        ),
    )
    parser.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help=(
            "answer 408 and close the connection when a request body takes longer than "
            "this to arrive in full (default 30)"
        ),
    )
    parser.add_argument(
        "--models",
        metavar="FILE",
        help=(
            "a JSON file mapping model names to default scripts (the x-emulator-script "
            'schema), e.g. {"primary": {"faults": [{"type": "status", "status": 503}]}, '
            '"fallback": {}}: each model behaves and fails on its own'
        ),
    )
    parser.add_argument(
        "--gc",
        choices=("growth", "python"),
        default="growth",
        help=(
            "how this process collects cyclic garbage: 'growth' (default) once 200,000 "
            "objects were allocated and not freed since the last collection, so paced "
            "streams are not held up by the interpreter's frequent collections (which "
            "find next to nothing); 'python' for the interpreter's own"
        ),
    )
    parser.add_argument(
        "--cassette",
        metavar="FILE",
        help=(
            "serve a cassette (trio-sampler record) instead of the emulator: each request "
            "gets the next exchange recorded for its method and path"
        ),
    )
    parser.add_argument(
        "--timing",
        choices=("original", "fast"),
        default="original",
        help="with --cassette: each read at its recorded time (default) or at once",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..emulator._cli import serve_and_report
    from ..emulator._gc import DEFAULT_GROWTH

    if args.cassette is not None:
        return run_interruptibly(_serve_cassette, args.host, args.port, _cassette(args))

    models = _models(args.models) if args.models else None
    return run_interruptibly(
        functools.partial(
            serve_and_report,
            args.host,
            args.port,
            bench=args.bench,
            backlog=args.backlog,
            reuse_port=args.reuse_port,
            models=models,
            keep_alive_timeout=args.keep_alive_timeout,
            body_timeout=args.body_timeout,
            gc_growth=DEFAULT_GROWTH if args.gc == "growth" else None,
        )
    )


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _models(path: str) -> dict[str, Any]:
    """The ``--models`` table, checked (a bad script is a usage error naming the model)."""
    from ..emulator import EmulatorApp, ScriptError

    try:
        with open(path, encoding="utf-8") as file:
            table = json.load(file)
    except OSError as exc:
        raise UsageError(f"--models: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--models: {path} is not valid JSON: {exc}") from None
    if not isinstance(table, dict):
        raise UsageError(f"--models: {path} must hold a JSON object of model name -> script")
    try:
        EmulatorApp(models=table)
    except (ScriptError, ValueError, TypeError) as exc:
        raise UsageError(f"--models: {exc}") from None
    return table


def _cassette(args: argparse.Namespace) -> Any:
    from ..recording import Cassette, CassetteApp, CassetteError

    try:
        return CassetteApp(Cassette.load(args.cassette), timing=args.timing)
    except CassetteError as exc:
        raise UsageError(f"--cassette: {exc}") from None


async def _serve_cassette(host: str, port: int, app: Any) -> int:
    """Serve ``app`` until cancelled, printing the ``listening on`` line first."""
    from ..emulator import serve

    async with trio.open_nursery() as nursery:
        try:
            server = await nursery.start(functools.partial(serve, host=host, port=port, app=app))
        except (OSError, ValueError) as failure:
            print(f"trio-sampler serve: cannot listen on {host}:{port}: {failure}", file=sys.stderr)
            return 1
        print(f"listening on {server.origin}", flush=True)
    return 0
