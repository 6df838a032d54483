"""The network backend under :class:`~trio_sampler.client.SamplingClient`'s own pools.

``httpcore2.TrioBackend``'s connections, with three differences, through ``httpcore2``'s
public network-backend interface (errors are httpcore's, as ``TrioBackend`` maps them):

* **A request goes out in one write.** httpcore's HTTP/1.1 connection writes a request in
  pieces: its head, then each chunk of its body, then the end of the message (``b""``
  when the body has a ``Content-Length``). Each piece was a system call, a TCP segment
  (trio sets ``TCP_NODELAY``) and a wake-up of the server for a head it cannot act on
  alone. Here a piece of at most :data:`HOLD_MAX_BYTES` is held until the next one, and
  sent with it: a sampling request (a head and a JSON body) is one ``send``. What is held
  goes out no later than the next write, the end of the message, or a read (the
  response is only read once the request is sent), so nothing waits on it. A joined
  write (a sampling request whole) makes no schedule point of its own: what follows it
  is the end of the message (nothing to write for a body of known length) and the read
  of the answer, which is one; a yield between the two was a scheduler round (an
  ``epoll_wait``) a request for nothing: 9.0 -> 8.0 rounds a 200-delta request
  (``benchmarks/rounds_per_request.py``). A body streamed in many pieces yields at each
  piece written alone, and at any write the socket does not take whole. An HTTP/2
  connection (its first write is the connection preface) is written as it comes: its
  streams share the connection, and a held frame could wait on another stream's read.
* **A write is tried at once, and timed**: the TCP connection is a
  :class:`~trio_sampler._receive_time.StampedSocketStream` (under TLS too: the TLS stream
  writes through it), whose ``send_all`` is a system call and a schedule point where
  ``trio.SocketStream``'s goes through its socket wrapper's layers, and which sets
  ``LAST_SENT``: when the request was written, for its metrics.
* **Reads can be timed by their bytes' arrival** (``stamped``, from
  ``SamplerConfig.receive_timestamps``): every read then sets ``LAST_RECEIVED`` in the
  reading task.
* **What a request's connection and writes did is recorded** for the task sending it,
  in the :class:`Exchange` it put in :data:`EXCHANGE`: whether the connection was opened
  for it, whether a write of it was refused whole before any of it was written (the
  resend rule, ``DirectTransport._send_resending_unwritten``), and when its last byte
  was written. httpcore2 connects and writes in the task that sends the request, through
  this public network-backend interface, so nothing else is needed (httpcore2's ``trace``
  extension told the same at four callbacks a request: 1.4 % of the instructions of a
  one-delta request, 0.8 % of a 200-delta one's, ``benchmarks/instructions_per_request.py``).
"""

from __future__ import annotations

import contextvars
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import trio

from ._receive_time import LAST_SENT, NothingWritten, StampedSocketStream

__all__ = [
    "EXCHANGE",
    "HOLD_MAX_BYTES",
    "JOIN_MAX_BYTES",
    "Exchange",
    "TrioNetworkBackend",
    "is_stamped",
    "socket_for_reads",
]

#: The largest write held back to go out with the next one (a request's head is far
#: smaller; a larger piece, and whatever is held before it, is sent as it comes).
HOLD_MAX_BYTES = 16 * 1024
#: The largest piece a held one is joined to (copied after it, to go out in one write);
#: a larger one (a big body) goes out on its own, after what is held.
JOIN_MAX_BYTES = 4 * HOLD_MAX_BYTES
#: How every HTTP/2 connection starts (RFC 9113, 3.4).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n"


class Exchange:
    """What this backend's connections did for one request, in the task sending it (the
    task puts it in :data:`EXCHANGE` for the request's send).

    * ``connected``: a connection was opened for it (else it went out on a reused one);
    * ``sent_at``: when its last byte written so far was handed to the kernel (the
      write's own time, :data:`~trio_sampler._receive_time.LAST_SENT`); ``None`` while no
      byte of it has been written;
    * ``refused``: a write of it was refused whole
      (:class:`~trio_sampler._receive_time.NothingWritten`).

    ``unwritten`` (refused with no byte written before) is the one proof that the request
    did not reach the server."""

    __slots__ = ("connected", "refused", "sent_at")

    def __init__(self) -> None:
        self.connected = False
        self.refused = False
        self.sent_at: float | None = None

    @property
    def unwritten(self) -> bool:
        return self.refused and self.sent_at is None


#: The :class:`Exchange` of the request the current task is sending (``None``: nothing
#: records it).
EXCHANGE: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "trio_sampler_exchange", default=None
)


def _refused_whole(exc: BaseException) -> bool:
    """Whether ``exc`` (a failed write) is a write refused whole, itself or as the cause
    of a wrapping stream's error (a TLS stream's)."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 4:
        if isinstance(cause, NothingWritten):
            return True
        cause, seen = cause.__cause__, seen + 1
    return False


def _limit(timeout: float | None) -> float:
    return float("inf") if timeout is None else timeout


class _Connection(httpcore2.AsyncNetworkStream):
    """One connection: a socket stream (its reads stamped or not), or a TLS stream over
    one."""

    def __init__(
        self,
        stream: StampedSocketStream | trio.SSLStream[StampedSocketStream],
        *,
        stamped: bool,
    ) -> None:
        self._stream = stream
        self.stamped = stamped
        #: Written, not sent yet (see the module doc).
        self._held = b""
        #: Whether writes are held: decided by the first one (``None`` before it).
        self._holding: bool | None = None

    def _socket_stream(self) -> StampedSocketStream:
        stream = self._stream
        return stream.transport_stream if isinstance(stream, trio.SSLStream) else stream

    # ``timeout`` parameters: httpcore2's interface (ASYNC109).
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        held = self._held
        if held:
            # Never reached from httpcore's HTTP/1.1 (its end of message sends it): a
            # failure here is what httpcore does with a failed request write, ignored,
            # for the read to report the connection's state (or the server's answer).
            self._held = b""
            try:
                await self._send(held, timeout, schedule=False)
            except httpcore2.WriteError:
                pass
        try:
            limit = _limit(timeout)
            if trio.current_effective_deadline() < trio.current_time() + limit:
                # A deadline around the read comes first (the actor's read timer): this
                # one could not fire, and its scope (a generator context manager, a
                # cancel scope and a deadline, alive across the wait) is not made. With
                # the actor's one scope per attempt: 106.8 → 87.0 µs of CPU per token on
                # this transport, one token per read at C = 100
                # (``benchmarks/bench_per_token.py``, ``docs/benchmarks-actor.md``).
                return bytes(await self._stream.receive_some(max_bytes))
            with trio.fail_after(limit):
                return bytes(await self._stream.receive_some(max_bytes))
        except trio.TooSlowError as exc:
            raise httpcore2.ReadTimeout(exc) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore2.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        held = self._held
        if not buffer:  # httpcore's end of a message: send what it held
            if held:
                self._held = b""
                await self._send(held, timeout)
            return
        if self._holding is None:
            self._holding = not buffer.startswith(_HTTP2_PREFACE)
        if held:
            self._held = b""
            if len(buffer) <= JOIN_MAX_BYTES:  # one write; a large body is not copied
                # No schedule point after it: see the module doc.
                await self._send(held + buffer, timeout, schedule=False)
                return
            await self._send(held, timeout)
        elif self._holding and len(buffer) <= HOLD_MAX_BYTES:
            self._held = buffer
            return
        await self._send(buffer, timeout)

    async def _send(
        self,
        data: bytes,
        timeout: float | None,  # noqa: ASYNC109
        *,
        schedule: bool = True,
    ) -> None:
        """Write ``data``; ``schedule=False``: no schedule point after a write the socket
        takes whole (see the module doc)."""
        stream = self._stream
        limit = _limit(timeout)
        exchange = EXCHANGE.get()
        try:
            if type(stream) is StampedSocketStream:
                # Tried at once: only a write the socket does not take whole waits, and
                # only that one is bounded in a scope of its own (``send_all``).
                await stream.send_all(data, wait_s=limit, schedule=schedule)
            else:
                # A bare scope rather than ``fail_after`` (the same scope inside two
                # generator context managers).
                with trio.CancelScope(relative_deadline=limit) as scope:
                    await stream.send_all(data)
                if scope.cancelled_caught:
                    raise trio.TooSlowError
        except trio.TooSlowError as exc:
            raise httpcore2.WriteTimeout(exc) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if exchange is not None and _refused_whole(exc):
                exchange.refused = True
            raise httpcore2.WriteError(exc) from exc
        if exchange is not None:
            exchange.sent_at = LAST_SENT.get()

    async def aclose(self) -> None:
        self._held = b""
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore2.AsyncNetworkStream:
        stream = self._stream
        assert not isinstance(stream, trio.SSLStream)  # TLS over plain TCP only
        tls = trio.SSLStream(
            stream,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            https_compatible=True,
            server_side=False,
        )
        try:
            with trio.fail_after(_limit(timeout)):
                await tls.do_handshake()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, trio.TooSlowError):
                raise httpcore2.ConnectTimeout(exc) from exc
            if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                raise httpcore2.ConnectError(exc) from exc
            raise
        return _Connection(tls, stamped=self.stamped)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object" and isinstance(self._stream, trio.SSLStream):
            # The TLS stream itself: it forwards the ``ssl.SSLObject`` queries httpcore2
            # makes (``selected_alpn_protocol``, ``getpeercert``, ``version``, ...) through
            # trio's public interface, where ``TrioStream`` hands out trio's private one.
            return self._stream
        if info == "client_addr":
            return self._socket_stream().socket.getsockname()
        if info == "server_addr":
            return self._socket_stream().socket.getpeername()
        if info == "socket":
            return self._socket_stream().socket
        if info == "is_readable":
            return self._socket_stream().socket.is_readable()
        return None


def is_stamped(network_stream: object) -> bool:
    """Whether ``network_stream`` (a response's ``network_stream`` extension) times its
    reads: a connection of a :class:`TrioNetworkBackend` with ``stamped`` on."""
    return type(network_stream) is _Connection and network_stream.stamped


def socket_for_reads(network_stream: object) -> StampedSocketStream | None:
    """The socket stream under ``network_stream`` (a connection of a
    :class:`TrioNetworkBackend`) that a reader may read from itself (``read_now``, as the
    connection's ``read`` reads); ``None`` for anything else, a TLS connection (its reads
    go through ``trio.SSLStream``) or one holding a write back (sent by its next read)."""
    if type(network_stream) is not _Connection or network_stream._held:
        return None
    stream = network_stream._stream
    if type(stream) is not StampedSocketStream or not stream.reads_now:
        return None
    return stream


class TrioNetworkBackend(httpcore2.TrioBackend):
    """``httpcore2.TrioBackend`` whose TCP connections send a request in one write and,
    ``stamped``, time their reads (see module)."""

    def __init__(self, *, stamped: bool = False) -> None:
        self.stamped = stamped

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        exchange = EXCHANGE.get()
        if exchange is not None:
            exchange.connected = True
        try:
            with trio.fail_after(_limit(timeout)):
                # trio sets TCP_NODELAY on its TCP streams.
                stream = await trio.open_tcp_stream(host, port, local_address=local_address)
                for option in socket_options or ():
                    stream.setsockopt(*option)
        except trio.TooSlowError as exc:
            raise httpcore2.ConnectTimeout(exc) from exc
        except (OSError, trio.BrokenResourceError) as exc:
            raise httpcore2.ConnectError(exc) from exc
        stamped = self.stamped
        return _Connection(StampedSocketStream(stream, stamp_reads=stamped), stamped=stamped)
