"""When bytes read from a TCP socket arrived: the kernel's receive timestamp.

A read returns when the reading task gets to it, which on a busy or idle-cold machine can
be long after the bytes came: the process was waiting for a CPU, or the task for its turn.
Linux stamps every segment it receives and, with ``SO_TIMESTAMPNS`` set on the socket,
hands a read the stamp of the last segment it returned (``recvmsg`` control data; TCP
too, since Linux 4.x). :class:`StampedSocketStream` reads that way and keeps the stamp,
moved onto trio's clock. A read that returns several segments has the stamp of the last:
exact while the reader keeps up, and when it falls behind never later than the read.
Where there is no such stamp (another platform, a socket that refused the option) it
keeps when the read returned.

Used by the emulator (when a request's last bytes arrived, which starts a paced
stream's clock) and by the client when ``SamplerConfig.receive_timestamps`` is on (when
a response's bytes arrived: the load generator's timestamps).
"""

from __future__ import annotations

import contextvars
import errno
import math
import os
import platform
import socket
import struct
import sys
import time
from typing import NoReturn

import trio

from .types import TrioSamplerError

__all__ = [
    "LAST_RECEIVED",
    "LAST_SENT",
    "NothingWritten",
    "StampedSocketStream",
    "hold_kernel_timestamps",
    "kernel_timestamps_available",
]

#: Linux's option (and control message) for a nanosecond receive timestamp on each read,
#: ``SO_TIMESTAMPNS``, which the ``socket`` module does not name: 35 where Linux takes its
#: socket options from ``asm-generic`` (not on Alpha, MIPS, PA-RISC or SPARC). ``None``:
#: no kernel timestamps, the reads' own times.
_SO_TIMESTAMPNS: int | None = (
    35
    if sys.platform == "linux"
    and platform.machine() in {"x86_64", "aarch64", "arm64", "i386", "i686", "armv7l", "riscv64"}
    else None
)
_TIMESPEC = struct.Struct("@ll")  # the control message's struct timespec (the "old" one)
_ANCILLARY_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_DEFAULT_RECEIVE_SIZE = 65536  # as ``trio.SocketStream``

#: When the current task's last write to a :class:`StampedSocketStream` was handed to the
#: kernel whole (trio's clock).
LAST_SENT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "trio_sampler_last_sent", default=None
)
#: When the bytes of the current task's last stamped read arrived (trio's clock). A read
#: of HTTP/1.1 runs in the task that reads the response, so after a body chunk is read the
#: task finds here when the bytes that made it came.
LAST_RECEIVED: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "trio_sampler_last_received", default=None
)


class NothingWritten(TrioSamplerError, trio.BrokenResourceError):
    """A write the connection refused whole: not one byte of it reached the kernel (the
    connection was broken before it). The one failure after which a request provably
    did not reach the server."""


#: ``os.write`` errors that say only "not now": the write is retried by waiting.
_NOT_NOW = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})


def kernel_timestamps_available() -> bool:
    """Whether this platform stamps reads in the kernel (else reads are timed when they
    return)."""
    return _SO_TIMESTAMPNS is not None


def hold_kernel_timestamps() -> socket.socket | None:
    """A socket that asks for receive timestamps, to keep open while they are wanted
    (``None``: the platform has none to ask for).

    Linux stamps received segments only while some socket on the machine asks it to, and
    turns the stamping on a moment after the first one asks (a deferred switch): until
    then a read is stamped when it is read. A connection that asked just before its first
    read would have that read timed so; holding this open from the start keeps the
    stamping on for every connection."""
    option = _SO_TIMESTAMPNS
    if option is None:
        return None
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, option, 1)
    except OSError:
        holder.close()
        return None
    return holder


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float:
    """When a read's last segment arrived, on trio's clock: the kernel's timestamp (on
    the wall clock) moved by how long ago it was; when the read returned, without one."""
    now = trio.current_time()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            ago = time.time() - (int(seconds) + int(nanoseconds) / 1e9)
            # A wall clock stepped meanwhile would say the future, or long ago.
            if 0.0 <= ago < 60.0:
                return now - ago
    return now


def _raise_stream_error(exc: OSError) -> NoReturn:
    """Raise what ``trio.SocketStream`` raises for a read that failed with ``exc``."""
    if exc.errno == errno.EBADF:
        raise trio.ClosedResourceError("this socket was already closed") from None
    raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


class StampedSocketStream(trio.abc.HalfCloseableStream):
    """A ``trio.SocketStream`` whose reads note when their bytes arrived, and whose
    writes note when the kernel took them.

    ``received_at`` is the arrival of the last read's bytes (``None`` before any), and each
    read sets :data:`LAST_RECEIVED` in the reading task; each write sets :data:`LAST_SENT`
    (see :meth:`send_all`). With ``stamp_reads`` off, reads are the wrapped stream's and
    note nothing (``received_at`` stays ``None``): what is left is the write, tried at
    once on the socket's descriptor (a system call and a schedule point, where
    ``trio.SocketStream`` goes through its socket wrapper's layers). EOF and closing go
    to the wrapped stream; ``socket`` is its socket.
    """

    def __init__(self, inner: trio.SocketStream, *, stamp_reads: bool = True) -> None:
        self._inner = inner
        self.socket = inner.socket
        self.received_at: float | None = None
        self._stamped = False
        #: Reads go to the wrapped stream untouched.
        self._plain_reads = not stamp_reads
        option = _SO_TIMESTAMPNS
        if option is not None and stamp_reads:
            try:
                inner.socket.setsockopt(socket.SOL_SOCKET, option, 1)
                self._stamped = True
            except OSError:
                pass
        #: The standard-library socket under trio's, for a stamped read made once the
        #: socket is readable (trio's ``recvmsg`` tries first; see :meth:`receive_some`).
        #: ``None`` where trio keeps none: its ``recvmsg`` then.
        raw = getattr(inner.socket, "_sock", None)
        self._raw: socket.socket | None = raw if isinstance(raw, socket.socket) else None

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """A read, as ``trio.SocketStream``'s (its errors too); a stamped one notes when
        its bytes arrived.

        A plain read waits for the socket first and reads once, and so does a stamped one
        (one ``recvmsg``: :meth:`_stamped_read`). ``trio.SocketStream``
        tries the read first and waits only when it fails; with one token per read (a
        model server's pace) the bytes are never there yet, so every read was two
        ``recv`` calls, a ``BlockingIOError`` and four coroutines of the socket wrapper
        alive across the wait. Waiting first costs nothing when the bytes are there (the
        wait returns at the next scheduler pass) and makes a read one system call: 396 k
        → 327 k instructions per token over the httptools transport, under callgrind
        (``benchmarks/bench_per_token.py --instructions --cells 2:50 --tokens 20``)."""
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE_SIZE
        elif max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._plain_reads:
            while True:
                fd = self.socket.fileno()
                if fd < 0:
                    raise trio.ClosedResourceError("this socket was already closed")
                await trio.lowlevel.wait_readable(fd)
                try:
                    return os.read(fd, max_bytes)
                except BlockingIOError:  # woken for nothing (a spurious wake)
                    continue
                except OSError as exc:
                    _raise_stream_error(exc)
        if not self._stamped:
            data = await self._inner.receive_some(max_bytes)
            at = trio.current_time()
        else:
            at, data = await self._stamped_read(max_bytes)
        if data:
            self.received_at = at
            LAST_RECEIVED.set(at)
        return data

    @property
    def reads_now(self) -> bool:
        """Whether :meth:`read_now` reads as :meth:`receive_some` does (a stamped read
        needs the standard-library socket under trio's)."""
        return not self._stamped or self._raw is not None

    def read_now(self, max_bytes: int = _DEFAULT_RECEIVE_SIZE) -> bytes | None:
        """One read of a socket found readable, without waiting: what
        :meth:`receive_some` reads once ``trio.lowlevel.wait_readable`` returned (its
        errors and its stamp too); ``None``: nothing to read after all (a spurious wake:
        wait again). For a reader that waits itself
        (:class:`~trio_sampler._http.SocketReads`), with no coroutine per read."""
        fd = self.socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("this socket was already closed")
        raw = self._raw
        try:
            if self._plain_reads:
                return os.read(fd, max_bytes)
            if self._stamped and raw is not None:
                data, ancillary, _, _ = raw.recvmsg(max_bytes, _ANCILLARY_SPACE)
                at = _arrival(ancillary)
            else:
                data, at = os.read(fd, max_bytes), trio.current_time()
        except BlockingIOError:
            return None
        except OSError as exc:
            _raise_stream_error(exc)
        if data:
            self.received_at = at
            LAST_RECEIVED.set(at)
        return data

    async def _stamped_read(self, max_bytes: int) -> tuple[float, bytes]:
        """When the bytes arrived, and the bytes: one ``recvmsg`` once the socket is
        readable, as a plain read (trio's ``recvmsg`` tried first and failed with one
        token per read: a second system call and a ``BlockingIOError`` a read)."""
        raw = self._raw
        try:
            if raw is None:
                data, ancillary, _, _ = await self.socket.recvmsg(max_bytes, _ANCILLARY_SPACE)
                return _arrival(ancillary), data
            while True:
                fd = raw.fileno()
                if fd < 0:
                    raise trio.ClosedResourceError("this socket was already closed")
                await trio.lowlevel.wait_readable(fd)
                try:
                    data, ancillary, _, _ = raw.recvmsg(max_bytes, _ANCILLARY_SPACE)
                except BlockingIOError:  # woken for nothing (a spurious wake)
                    continue
                return _arrival(ancillary), data
        except OSError as exc:
            _raise_stream_error(exc)

    async def send_all(
        self,
        data: bytes | bytearray | memoryview,
        *,
        wait_s: float = math.inf,
        schedule: bool = True,
    ) -> None:
        """Send ``data``, and set :data:`LAST_SENT` to when the kernel took its last byte.

        As ``trio.SocketStream`` does, but the write is tried at once, timed by the clock
        read just before it: a write the socket takes whole was taken during that system
        call. A time read after it would be late by whatever ran first: the schedule point
        after the write, or the process the write woke (a server on the same machine gets
        the bytes inside the call and can take the CPU before the call returns; measured
        at 0.45 ms with the server at a higher priority). What the socket does not take
        (or a full socket) goes through the wrapped stream, and is timed when that returns.
        A connection already broken (the write refused whole) raises
        :class:`NothingWritten`.

        ``wait_s`` bounds the wait for the socket to take the rest: ``trio.TooSlowError``
        past it. A write the socket takes whole waits for nothing, so its bound needs no
        cancel scope (see :meth:`_send_rest`). ``schedule=False``: such a write is a cancel
        point only, no schedule point, for a caller whose next step is one (the read of
        the answer to the request written)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        with memoryview(data) as view:
            written = 0
            if view:
                before = trio.current_time()
                try:
                    written = os.write(self.socket.fileno(), view)
                except OSError as exc:
                    if exc.errno not in _NOT_NOW and exc.errno != errno.EBADF:
                        raise NothingWritten(f"socket connection broken: {exc}") from exc
                    written = 0  # full, or closed: the wrapped stream waits or says so
            if not view or written < len(view):
                await self._send_rest(view[written:], wait_s)
                LAST_SENT.set(trio.current_time())
                return
        LAST_SENT.set(before)
        if schedule:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _send_rest(self, rest: memoryview, wait_s: float) -> None:
        """What the socket did not take, through the wrapped stream, waiting at most
        ``wait_s``. The scope of that bound is made here, only for a write that waits:
        a request the socket takes whole (the usual one) makes none, where a scope around
        every write cost about 66,000 machine instructions a request of one text delta
        (``benchmarks/instructions_per_request.py``)."""
        if wait_s == math.inf:
            await self._inner.send_all(rest)
            return
        with trio.CancelScope(relative_deadline=wait_s) as scope:
            await self._inner.send_all(rest)
        if scope.cancelled_caught:
            raise trio.TooSlowError

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()
