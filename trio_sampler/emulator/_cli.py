"""``trio-sampler serve``: the emulator as a command-line server."""

from __future__ import annotations

import functools
import sys

import trio

from ._serve import serve

__all__ = ["main_serve", "run_serve"]


def run_serve(
    argv_host: str,
    argv_port: int,
    *,
    bench: bool = False,
    backlog: int = 1024,
    reuse_port: bool = False,
) -> int:
    """Serve on ``argv_host:argv_port`` until interrupted; returns the exit status.

    Ctrl-C propagates as ``KeyboardInterrupt`` (possibly inside an exception group); the
    ``trio-sampler`` command turns it into one line and exit status 130.

    The first line on stdout is exactly ``listening on http://HOST:PORT`` (flushed), with
    the bound port when ``argv_port`` is 0, so scripts can wait for it and parse it.
    """

    async def main() -> OSError | ValueError | None:
        async with trio.open_nursery() as nursery:
            try:
                server = await nursery.start(
                    functools.partial(
                        serve,
                        host=argv_host,
                        port=argv_port,
                        bench=bench,
                        backlog=backlog,
                        reuse_port=reuse_port,
                    )
                )
            except (OSError, ValueError) as exc:  # returned: the nursery would wrap it
                return exc
            print(f"listening on {server.origin}", flush=True)
        return None

    failure = trio.run(main)  # Ctrl-C raises KeyboardInterrupt (the CLI: exit status 130)
    if failure is not None:
        print(
            f"trio-sampler serve: cannot listen on {argv_host}:{argv_port}: {failure}",
            file=sys.stderr,
        )
        return 1
    return 0


def main_serve(host: str, port: int) -> int:
    """Alias of :func:`run_serve` (the name the design uses)."""
    return run_serve(host, port)
