"""A Redis that answers wrongly: a loopback proxy in front of a real redis-server which
forwards every command and, once told to, replaces each reply with bytes of the test's
choosing (a reply of the wrong shape, or noise). The connection handshake is the real
server's, so only the answers to the limiter's scripts are wrong."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

__all__ = ["RedisProxy", "reply_length", "running_proxy"]

_ONE_LINE = frozenset(b"+-:_,#(")
_BULK = frozenset(b"$!=")
_AGGREGATE = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}


def reply_length(data: bytes, start: int = 0) -> int | None:
    """The length of the RESP2/RESP3 reply at ``data[start:]``, ``None`` if incomplete."""
    end = data.find(b"\r\n", start)
    if end < 0:
        return None
    kind, head = data[start], data[start + 1 : end]
    position = end + 2
    if kind in _ONE_LINE:
        return position - start
    if kind in _BULK:
        size = int(head)
        if size < 0:
            return position - start
        return position + size + 2 - start if len(data) >= position + size + 2 else None
    if kind in _AGGREGATE:
        count = max(int(head), 0) * _AGGREGATE[kind]
        for _ in range(count):
            length = reply_length(data, position)
            if length is None:
                return None
            position += length
        return position - start
    raise ValueError(f"not a RESP reply: {data[start : start + 20]!r}")


class RedisProxy:
    """Forwards ``127.0.0.1:port`` to the Unix socket of a redis-server. With ``wrong``
    set, each whole reply of the server is replaced by ``wrong`` (counted in
    ``replaced``)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.port = 0
        self.wrong: bytes | None = None
        self.replaced = 0
        self._delay = 0.0
        self._delay_changed = trio.Event()
        #: While down, connections are cut and new ones closed at once (a partition).
        self.down = False
        #: While stalled, new connections are accepted and never answered (a server that
        #: hangs in the handshake); the connections made before are served as usual.
        self.stalled = False
        self._scopes: set[trio.CancelScope] = set()

    @property
    def delay(self) -> float:
        """Each reply is held this long before it is passed on (a slow Redis); a reply
        being held when the delay changes waits only the new delay from its arrival (set
        to 0, the replies held go at once: Redis is fast again)."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self._delay = seconds
        self._delay_changed.set()
        self._delay_changed = trio.Event()

    async def _hold(self, since: float) -> None:
        while trio.current_time() < since + self._delay:
            with trio.move_on_at(since + self._delay):
                await self._delay_changed.wait()

    def cut(self) -> None:
        """A partition: every connection is cut, and new ones are closed, until
        :meth:`heal`. The server keeps its state."""
        self.down = True
        for scope in self._scopes:
            scope.cancel()

    def heal(self) -> None:
        self.down = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def _serve(self, client: trio.SocketStream) -> None:
        if self.down:
            await client.aclose()
            return
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                if self.stalled:
                    await trio.sleep_forever()
                await self._forward(client)
            finally:
                self._scopes.discard(scope)
        await client.aclose()

    async def _forward(self, client: trio.SocketStream) -> None:
        server = await trio.open_unix_socket(self.socket_path)
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, client, server)
            await self._replies(server, client)
            nursery.cancel_scope.cancel()

    @staticmethod
    async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        while data := await source.receive_some():
            await sink.send_all(data)

    async def _replies(self, server: trio.abc.Stream, client: trio.abc.Stream) -> None:
        """Pass each whole reply on (or its replacement), held ``delay`` from its arrival."""
        send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pass_on, receive, client)
            async with send:
                pending = b""
                while data := await server.receive_some():
                    arrived = trio.current_time()
                    pending += data
                    while pending and (length := reply_length(pending)) is not None:
                        reply, pending = pending[:length], pending[length:]
                        if self.wrong is not None:
                            reply = self.wrong
                            self.replaced += 1
                        send.send_nowait((arrived, reply))

    async def _pass_on(
        self, replies: trio.MemoryReceiveChannel[tuple[float, bytes]], client: trio.abc.Stream
    ) -> None:
        async with replies:
            async for arrived, reply in replies:
                await self._hold(arrived)
                await client.send_all(reply)


@asynccontextmanager
async def running_proxy(socket_path: str) -> AsyncIterator[RedisProxy]:
    proxy = RedisProxy(socket_path)

    async def serve(stream: trio.SocketStream) -> None:
        try:
            await proxy._serve(stream)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # either side went away (both pipes may say so at once: a group)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        proxy.port = listeners[0].socket.getsockname()[1]
        yield proxy
        nursery.cancel_scope.cancel()
