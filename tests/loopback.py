"""Hand-written HTTP/1.1 servers on a free loopback port, for the tests that need a server
to answer byte by byte (hostile replies, captured bodies, a toy protocol): the emulator is
too well behaved for them."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

__all__ = ["read_request", "serve"]

# A request head longer than this is not a request these tests send.
_MAX_HEAD = 1 << 20


async def read_request(stream: trio.SocketStream) -> tuple[bytes, bytes] | None:
    """One request's head (without the blank line) and its ``content-length`` body;
    ``None`` when the peer closes (or sends a megabyte of head) first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk or len(data) > _MAX_HEAD:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


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
