"""Hand-written HTTP/1.1 servers on a free loopback port, for the tests that need a server
to answer byte by byte (hostile replies, captured bodies, a toy protocol): the emulator is
too well behaved for them. :func:`read_request` is the benchmarks' own; :func:`take_all`
reads a body over socket reads as the actor's read loop does."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from benchmarks.common import read_request
from trio_sampler._http import SocketReads

__all__ = ["read_request", "serve", "take_all", "take_next"]


@asynccontextmanager
async def serve(handler: Callable[[trio.SocketStream], Awaitable[None]]) -> AsyncIterator[int]:
    """Run ``handler`` for every connection to ``127.0.0.1`` on a free port (yielded). The
    connection is closed after it; a client that goes away meanwhile is not an error."""

    async def on_connection(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def take_next(reads: SocketReads) -> bytes | None:
    """The next ``take`` of a body over socket reads, waiting for the socket while it
    answers ``b""``: a chunk, or ``None`` at the body's end."""
    chunk = reads.take(False)
    while chunk == b"":
        await trio.lowlevel.wait_readable(reads.fileno)
        chunk = reads.take(True)
    return chunk


async def take_all(reads: SocketReads) -> list[bytes | None]:
    """Every ``take`` of a body over socket reads, the closing ``None`` last."""
    taken: list[bytes | None] = []
    while not taken or taken[-1] is not None:
        taken.append(await take_next(reads))
    return taken
