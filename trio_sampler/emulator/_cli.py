"""``trio-sampler serve``: the emulator as a command-line server."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

import trio

from ._app import DEFAULT_BODY_TIMEOUT, EmulatorApp
from ._gc import collect_by_growth
from ._serve import serve

__all__ = ["main_serve", "run_serve", "serve_and_report"]


def run_serve(
    argv_host: str,
    argv_port: int,
    *,
    bench: bool = False,
    backlog: int = 1024,
    reuse_port: bool = False,
) -> int:
    """Serve on ``argv_host:argv_port`` until interrupted; returns the exit status.

    The first line on stdout is exactly ``listening on http://HOST:PORT`` (flushed), with
    the bound port when ``argv_port`` is 0, so scripts can wait for it and parse it.
    Ctrl-C propagates as ``KeyboardInterrupt`` (the ``trio-sampler serve`` command runs
    :func:`serve_and_report` under a signal receiver instead, so it always gets one).
    """
    return trio.run(
        functools.partial(
            serve_and_report,
            argv_host,
            argv_port,
            bench=bench,
            backlog=backlog,
            reuse_port=reuse_port,
        )
    )


async def serve_and_report(
    host: str,
    port: int,
    *,
    bench: bool = False,
    backlog: int = 1024,
    reuse_port: bool = False,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    keep_alive_timeout: float = 5.0,
    gc_growth: int | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
) -> int:
    """Serve until cancelled, printing the ``listening on`` line; 1 when it cannot listen.

    ``models`` is :class:`~trio_sampler.emulator.EmulatorApp`'s table of per-model scripts;
    ``keep_alive_timeout`` and ``body_timeout`` are :func:`~trio_sampler.emulator.serve`'s.
    With ``gc_growth`` the process collects cyclic garbage once that many container
    objects were allocated and not freed, instead of by the interpreter's policy (see
    ``_gc``): for a process that does nothing else, as the ``trio-sampler serve`` command.
    """
    app = EmulatorApp(bench=bench, models=models, body_timeout=body_timeout) if models else None
    async with trio.open_nursery() as nursery:
        try:
            server = await nursery.start(
                functools.partial(
                    serve,
                    host=host,
                    port=port,
                    bench=bench,
                    backlog=backlog,
                    reuse_port=reuse_port,
                    app=app,
                    keep_alive_timeout=keep_alive_timeout,
                    body_timeout=body_timeout,
                )
            )
        except (OSError, ValueError) as failure:  # handled here: the nursery would wrap it
            print(f"trio-sampler serve: cannot listen on {host}:{port}: {failure}", file=sys.stderr)
            return 1
        print(f"listening on {server.origin}", flush=True)
        if gc_growth is not None:
            nursery.start_soon(collect_by_growth, gc_growth)
    return 0


def main_serve(host: str, port: int) -> int:
    """Alias of :func:`run_serve` (the name the design uses)."""
    return run_serve(host, port)
