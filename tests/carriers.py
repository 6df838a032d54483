"""Where a scripted transport's bytes come from: the carriers the contract suite runs over.

A :class:`~fakes.ScriptedTransport` answers each request with the next
:class:`~fakes.Reply` of its script. Which transport of the library's seam carries the
exchange is its ``carrier``:

* ``memory``: ``MemoryTransport``; the reply is the body's chunks themselves.
* ``httpx``: ``HttpxTransport`` over the script's ``httpx2`` interface.
* ``direct``: ``DirectTransport`` (the production default: httpcore2's pool, h11, the
  end-of-body probe) whose connections are in-memory streams to an HTTP/1.1 server in
  this process that serves the script byte by byte (:func:`serve_script`).
* ``loopback``: ``DirectTransport`` over real TCP to that server on ``127.0.0.1``.
* ``httptools``: ``HttptoolsTransport`` (llhttp over trio sockets) over real TCP to that
  server on ``127.0.0.1``.

Everything above the seam (the client, the actor) is the same code on every carrier; the
mock clock still drives the script's pauses (the servers sleep with ``trio.sleep``).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import httpcore2
import httpx2
import trio
import trio.testing

from benchmarks.common import read_request

if TYPE_CHECKING:
    from fakes import Reply, ScriptedTransport

__all__ = ["CARRIERS", "MemoryNetworkBackend", "current", "listen_for", "serve_script"]

CARRIERS = ("memory", "httpx", "direct", "loopback", "httptools")
#: The carrier of scripted transports made without one (the ``carrier`` fixture sets it).
current = "memory"


def _request_of(head: bytes, body: bytes) -> httpx2.Request:
    """A request as the server read it, as an ``httpx2.Request`` (what scripts see)."""
    line, *fields = head.split(b"\r\n")
    method, target, _ = line.split(b" ", 2)
    headers = [tuple(field.split(b":", 1)) for field in fields]
    pairs = [(name.strip(), value.strip()) for name, value in headers]
    host = {name.lower(): value for name, value in pairs}.get(b"host", b"fake.test")
    url = b"http://" + host + target
    return httpx2.Request(method.decode(), url.decode(), headers=pairs, content=body)


def _head(reply: Reply, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d X" % reply.status]
    if not keep_alive:
        lines.append(b"connection: close")
    for name, value in reply.headers.items():
        if name.lower() not in ("content-length", "transfer-encoding"):
            lines.append(f"{name}: {value}".encode("latin-1"))
    lines.append(b"transfer-encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _answer(stream: trio.abc.Stream, reply: Reply, keep_alive: bool) -> bool:
    """Send ``reply`` as a chunked HTTP/1.1 response; ``False``: the connection is to be
    dropped (the script says so)."""
    await stream.send_all(_head(reply, keep_alive))
    for item in reply.chunks:
        if isinstance(item, float | int):
            await trio.sleep(float(item))
        elif item:
            await stream.send_all(b"%x\r\n%s\r\n" % (len(item), item))
    if reply.then == "drop":
        return False
    if reply.then == "stall":
        await trio.sleep_forever()
    await stream.send_all(b"0\r\n\r\n")
    return keep_alive


async def serve_script(
    script: ScriptedTransport, stream: trio.abc.Stream, *, keep_alive: bool = True
) -> None:
    """Serve the script's replies on one connection, one per request read (kept alive,
    or closed after each answer: over loopback, where a pooled socket of a transport
    nobody closes would outlive the test). A reply's ``error`` (a failure the client
    meets before any response) closes the connection unanswered. Never raises: the peer
    going away just ends it."""
    try:
        while (request := await read_request(stream)) is not None:  # type: ignore[arg-type]
            try:
                reply = await script.reply_to(_request_of(*request))
            except Exception:
                return  # the script's error: no response at all
            if not await _answer(stream, reply, keep_alive):
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


class _MemoryConnection(httpcore2.AsyncNetworkStream):
    """One end of an in-memory connection, as httpcore2 reads and writes it."""

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                return bytes(await self._stream.receive_some(max_bytes))
        except trio.TooSlowError as exc:
            raise httpcore2.ReadTimeout(exc) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore2.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        try:
            await self._stream.send_all(buffer)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore2.WriteError(exc) from exc

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("no TLS in memory")

    def get_extra_info(self, info: str) -> Any:
        return None


class MemoryNetworkBackend(httpcore2.AsyncNetworkBackend):
    """An ``httpcore2`` network backend whose every connection is an in-memory stream to
    ``serve`` (run as a system task: it outlives the request that opened it, as a server
    does)."""

    def __init__(self, serve: Callable[[trio.abc.Stream], Awaitable[None]]) -> None:
        self._serve = serve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        client, server = trio.testing.memory_stream_pair()
        trio.lowlevel.spawn_system_task(self._serve, server, name="scripted server")
        await trio.lowlevel.checkpoint()
        return _MemoryConnection(client)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


async def listen_for(serve: Callable[[trio.abc.Stream], Awaitable[None]]) -> int:
    """Serve connections to a free port on ``127.0.0.1`` with ``serve`` (a system task,
    for the rest of the run); the port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    trio.lowlevel.spawn_system_task(trio.serve_listeners, serve, listeners, name="loopback")
    return int(listeners[0].socket.getsockname()[1])
