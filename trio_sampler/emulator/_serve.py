"""Serving the emulator over loopback HTTP with Hypercorn's Trio server.

Hypercorn's own ``serve`` builds its listeners and connection streams itself; here its
Trio connection handler (``TCPServer``) is driven from our listener instead, so that each
connection's stream is an :class:`~trio_sampler.emulator._arrival.ArrivalStream` and a
paced request's clock starts at the read of its last bytes (see ``_arrival``). Hypercorn
still parses, runs the app and writes every byte; only who accepts the connection differs.

Each connection is isolated: an exception out of one connection's handling (Hypercorn's
HTTP/2 protocol raises ``KeyError(<stream id>)`` when a client goes on sending the body of
a stream it has already answered, as after a 408 at the body timeout) is logged and ends
that connection only, never the server whose nursery runs every connection.

HTTP/2 rapid reset (CVE-2023-44487: open a stream, reset it, repeat) is bounded per
connection, as the servers patched for it do: a stream opened and reset within one read
never reaches the app (its work is cancelled before it starts), and a connection that
resets more than :data:`MAX_RESETS` streams within :data:`RESET_WINDOW` seconds is sent
GOAWAY with ``ENHANCE_YOUR_CALM`` and closed. A flood then costs the server the parsing of
its frames only, and normal requests are answered while it lasts.

This is the one module that touches Hypercorn's internals: its Trio ``TCPServer``, the
``H2Protocol`` it builds (its h2 connection and the handling of each read's events, for
the reset bound) and, to reset an HTTP/2 stream for the ``drop`` fault, the
``HTTPStream`` behind an ASGI ``send`` (``tests/test_emulator_hostile_clients.py`` fails
if an upgrade moves them).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, cast

import attrs
import h2.errors
import h2.events
import h2.exceptions
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

from ..types import ApiBackend
from ._app import DEFAULT_BODY_TIMEOUT, STREAM_CONTROL, EmulatorApp, StreamControl
from ._arrival import CONNECTION, ArrivalStream

__all__ = ["BACKEND_PATHS", "EmulatorServer", "serve"]

#: The path of each backend's endpoint under ``base_url``.
BACKEND_PATHS = {
    "chat_completions": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
}


@attrs.frozen
class EmulatorServer:
    """A running emulator: where it listens, and its app (for recorded requests)."""

    host: str
    port: int
    app: EmulatorApp = attrs.field(repr=False)

    @property
    def origin(self) -> str:
        """``http://HOST:PORT`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The base URL every SDK takes: ``http://HOST:PORT/v1``."""
        return self.origin + "/v1"

    def url_for(self, backend: ApiBackend | str) -> str:
        """The full endpoint URL for ``backend``: an :class:`ApiBackend` or its name
        (``chat_completions``, ``responses``, ``messages``, any case)."""
        name = (
            backend.value
            if isinstance(backend, ApiBackend)
            else str(backend).strip().lower().replace("-", "_")
        )
        try:
            return self.base_url + BACKEND_PATHS[name]
        except KeyError:
            raise ValueError(
                f"unknown backend {backend!r}; expected one of {', '.join(BACKEND_PATHS)}"
            ) from None


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[EmulatorServer] = trio.TASK_STATUS_IGNORED,
    bench: bool = False,
    require_key: str | None = None,
    app: EmulatorApp | None = None,
    backlog: int = 1024,
    reuse_port: bool = False,
    keep_alive_timeout: float = 5.0,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
) -> None:
    """Serve the emulator until cancelled.

    Use it with ``server = await nursery.start(serve)``: the value is an
    :class:`EmulatorServer` whose ``port`` is the bound port (``port=0`` picks a free one),
    and the server is accepting connections by the time ``start`` returns.

    Args:
        host: the address to bind; loopback by default.
        port: the port; 0 for any free port.
        bench: pre-rendered bodies for benchmarks (see :class:`EmulatorApp`).
        require_key: reject requests without this API key (401).
        app: serve this app instead of a new one.
        backlog: the listen queue; thousands of clients connecting at once need a long
            one (Hypercorn's default of 100 drops connections at 10,000). The kernel caps
            it (``net.core.somaxconn``, often 4096).
        reuse_port: bind with ``SO_REUSEPORT``, so several emulator processes can listen
            on the same port and the kernel spreads new connections over them, each with
            its own listen queue: one Python process accepts (and serves) only so fast,
            and at 10,000 simultaneous connects a single queue overflows. Start the first
            with ``port=0`` and ``reuse_port=True``, the others on the port it bound. Not
            available on Windows (``ValueError``).
        keep_alive_timeout: seconds a connection may sit idle (before its first request,
            or between requests) before the server closes it. Hypercorn's 5 s default is
            fine for a test; a client saturated by thousands of streams can take longer
            than that to write a request on a connection it just opened, and then sees
            "server disconnected" (the benchmark uses 300). It is also the request-head
            timeout: a connection must deliver a complete request head within it
            (slowloris clients are cut off), and heads are capped at 16 KiB.
        body_timeout: seconds a request body may take to arrive in full; slower ones get
            a 408 and their connection is closed (see :class:`EmulatorApp`; used when
            ``app`` is not given).

    While it serves, "out of file descriptors" reports from the accept loop (trio retries
    ``accept`` ten times a second and logs each failure with a traceback) are let through
    once per 10 seconds, with a count of those suppressed.
    """
    if app is None:
        app = EmulatorApp(bench=bench, require_key=require_key, body_timeout=body_timeout)
    # The socket is bound here rather than by Hypercorn: a failed bind ("address in use")
    # is then a plain OSError raised before anything starts.
    listener = _bound_socket(host, port, reuse_port=reuse_port)
    try:
        config = Config()
        config.accesslog = None
        config.loglevel = "WARNING"
        config.graceful_timeout = 0.5
        config.backlog = backlog
        config.keep_alive_timeout = keep_alive_timeout
        listener.listen(backlog)
        with _accept_errors_rate_limited():
            async with trio.open_nursery() as nursery:
                await nursery.start(_serve_hypercorn, app, config, listener)
                bound_port = int(listener.getsockname()[1])
                task_status.started(EmulatorServer(host, bound_port, app))
    finally:
        listener.close()


async def _serve_hypercorn(
    app: EmulatorApp,
    config: Config,
    listener: socket.socket,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Hypercorn's Trio worker (its lifespan, then a ``TCPServer`` per connection) on
    ``listener``, each connection's stream an :class:`ArrivalStream`."""
    wrapped = wrap_app(cast(Any, app), config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)

    async def connection(stream: trio.SocketStream) -> None:
        peer = _peer(stream)
        timed = ArrivalStream(stream)
        CONNECTION.set(timed)  # this task's context: the app's tasks start from it
        STREAM_CONTROL.set(_STREAM_CONTROL)
        try:
            # (Hypercorn annotates the stream as TLS; a plain one is what it serves.)
            await _Connection(wrapped, config, context, dict(lifespan_state), cast(Any, timed))
        except* Exception as group:
            # Hypercorn has closed the connection on its way out (``TCPServer.run``).
            _LOGGER.warning("connection %s ended by an exception", peer, exc_info=group)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        try:
            async with trio.open_nursery() as server_nursery:
                listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(listener))]
                server_nursery.start_soon(
                    functools.partial(
                        trio.serve_listeners, connection, listeners, handler_nursery=server_nursery
                    )
                )
                task_status.started()
                await trio.sleep_forever()
        finally:
            # Only a cancel ends serving: idle connections stop waiting at once.
            await context.terminated.set()


_LOGGER = logging.getLogger("trio_sampler.emulator")

#: Stream resets one HTTP/2 connection may send within :data:`RESET_WINDOW` seconds; one
#: more and the server answers GOAWAY (``ENHANCE_YOUR_CALM``) and closes the connection.
#: A client cancelling its requests (hedging, timeouts) stays far below it; Netty's
#: bound for the same attack is 200 resets in 30 seconds.
MAX_RESETS = 200
#: The window, in seconds, over which :data:`MAX_RESETS` counts a connection's resets.
RESET_WINDOW = 30.0


class _Connection(TCPServer):
    """Hypercorn's connection handler, with each HTTP/2 connection's resets bounded.

    The protocol (HTTP/1.1 first, HTTP/2 once the client's preface arrives) is chosen
    inside Hypercorn; a new ``H2Protocol`` sends its settings before it handles any
    frame, so it is guarded on its first send, before its first read is handled."""

    _guarded: object = None

    async def protocol_send(self, event: Event) -> None:
        protocol = self.protocol.protocol
        if isinstance(protocol, H2Protocol) and protocol is not self._guarded:
            self._guarded = protocol
            guard = _ResetGuard(protocol, protocol._handle_events)
            protocol._handle_events = guard.handle_events  # type: ignore[method-assign]
        await super().protocol_send(event)


@attrs.define
class _ResetGuard:
    """Handles one HTTP/2 connection's events in Hypercorn's stead once the streams
    opened and reset in the same read are taken out, and counts the connection's
    resets (see :data:`MAX_RESETS`)."""

    protocol: H2Protocol
    handle: Callable[[list[h2.events.Event]], Awaitable[None]]
    resets: collections.deque[float] = attrs.field(factory=collections.deque)

    async def handle_events(self, events: list[h2.events.Event]) -> None:
        now = trio.current_time()
        self.resets.extend(now for e in events if isinstance(e, h2.events.StreamReset))
        while self.resets and self.resets[0] <= now - RESET_WINDOW:
            self.resets.popleft()
        if len(self.resets) > MAX_RESETS:
            await self._calm_down()
            return
        await self.handle(self._without_stillborn(events))

    def _without_stillborn(self, events: Sequence[h2.events.Event]) -> list[h2.events.Event]:
        """``events`` without those of the streams both opened and reset among them
        (their received data still handed back to the flow-control window)."""
        opened = {e.stream_id for e in events if isinstance(e, h2.events.RequestReceived)}
        stillborn = opened & {e.stream_id for e in events if isinstance(e, h2.events.StreamReset)}
        if not stillborn:
            return list(events)
        kept: list[h2.events.Event] = []
        for event in events:
            if getattr(event, "stream_id", None) not in stillborn:
                kept.append(event)
            elif isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self.protocol.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
        return kept

    async def _calm_down(self) -> None:
        _LOGGER.warning(
            "HTTP/2 connection %s reset more than %d streams in %g s: closed",
            self.protocol.client,
            MAX_RESETS,
            RESET_WINDOW,
        )
        self.protocol.connection.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        await self.protocol.send(RawData(data=self.protocol.connection.data_to_send()))
        await self.protocol.send(Closed())


def _peer(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername())
    except OSError:
        return "(gone)"


async def _reset_h2_stream(send: Any) -> None:
    """Reset the HTTP/2 stream whose ASGI ``send`` this is (RST_STREAM with
    ``INTERNAL_ERROR``) once the body sent so far has gone out; nothing over HTTP/1.1,
    whose connection Hypercorn closes when the app returns mid-body."""
    stream = getattr(send, "__self__", None)
    protocol = getattr(getattr(stream, "send", None), "__self__", None)
    if not isinstance(stream, HTTPStream) or not isinstance(protocol, H2Protocol):
        return
    stream_id = stream.stream_id
    buffer = protocol.stream_buffers.get(stream_id)
    if buffer is not None:
        await buffer.drain()
    try:
        protocol.connection.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
    except h2.exceptions.ProtocolError:
        return  # the stream or the connection is already closed
    await protocol.send(RawData(data=protocol.connection.data_to_send()))
    if buffer is not None:
        # Its sender finds the buffer complete, fails to end the reset stream and
        # forgets it (``H2Protocol._send_data``).
        await buffer.close()
        protocol.priority.unblock(stream_id)
        await protocol.has_data.set()


def _stream_closed(send: Any) -> bool:
    """Whether Hypercorn has closed the stream whose ASGI ``send`` this is (the client
    closed or reset it)."""
    stream = getattr(send, "__self__", None)
    return isinstance(stream, HTTPStream) and stream.closed


_STREAM_CONTROL = StreamControl(reset=_reset_h2_stream, closed=_stream_closed)

_ACCEPT_LOGGER = "trio.serve_listeners"
_ACCEPT_REPORT_INTERVAL = 10.0


class _OncePerInterval(logging.Filter):
    """Lets a record through once per ``interval`` seconds per message template, and
    says how many like it were suppressed since."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self._interval = interval
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)
        last, suppressed = self._seen.get(key, (-math.inf, 0))
        if now - last < self._interval:
            self._seen[key] = (last, suppressed + 1)
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} like it suppressed)"
        self._seen[key] = (now, 0)
        return True


@contextlib.contextmanager
def _accept_errors_rate_limited() -> Iterator[None]:
    log_filter = _OncePerInterval(_ACCEPT_REPORT_INTERVAL)
    logger = logging.getLogger(_ACCEPT_LOGGER)
    logger.addFilter(log_filter)
    try:
        yield
    finally:
        logger.removeFilter(log_filter)


def _bound_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening); ``SO_REUSEPORT`` on request."""
    option = getattr(socket, "SO_REUSEPORT", None)
    if reuse_port and option is None:
        raise ValueError("reuse_port needs SO_REUSEPORT, which this platform does not have")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port and option is not None:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock
