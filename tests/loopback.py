"""Hand-written HTTP/1.1 servers on a free loopback port, for the tests that need a server
to answer byte by byte (hostile replies, captured bodies, a toy protocol): the emulator is
too well behaved for them. :func:`read_request` is the benchmarks' own."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from benchmarks.common import read_request

__all__ = ["read_request", "serve"]


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
