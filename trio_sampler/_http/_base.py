"""The library's own HTTP seam: what a transport is asked, and what it answers.

Everything above this seam (the client's header building, redaction and status
classification, the actor's attempts) is the same code whatever carries the bytes; only
what is below it differs:

========================  ==============================================================
transport                 where the bytes come from
========================  ==============================================================
``DirectTransport``       the network, through httpcore2's pools (the default)
``HttpxTransport``        an ``httpx2.AsyncClient``, public API only (any ``httpx2``
                          transport, e.g. ``httpx2.MockTransport``, is run through it)
``MemoryTransport``       a Python responder in the same process (scripted tests, the
                          in-memory emulator)
========================  ==============================================================

A :class:`Transport` opens one streamed exchange for an :class:`HttpRequest` and
answers with a :class:`Body`: the status, the header fields, the times it knows, the
body's bytes as they arrive, and whether the end of the body is already here. Every
failure leaves a transport as a :class:`SamplingClientError` carrying a classified
:class:`~trio_sampler.types.SamplingErrorInfo`; trio cancellation passes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from ..types import SamplingErrorInfo, SamplingErrorKind, TrioSamplerError

__all__ = [
    "Body",
    "HttpRequest",
    "PreparedHeaders",
    "SamplingClientError",
    "SocketReads",
    "Transport",
    "timeout_error",
]


class SamplingClientError(TrioSamplerError):
    """A request failed before or while its body was read. ``info`` says how.

    ``str()`` is ``str(info)``: kind, status and a scrubbed, user-facing message.
    """

    def __init__(self, info: SamplingErrorInfo) -> None:
        super().__init__(str(info))
        self.info = info

    @property
    def kind(self) -> SamplingErrorKind:
        return self.info.kind


def timeout_error(which: str, what: str, seconds: float) -> SamplingClientError:
    """A timeout's failure, saying which of the five fired and after how long
    (``connect`` is a ``TRANSPORT`` failure; the waits for the server, ``IDLE_TIMEOUT``)."""
    return SamplingClientError(
        SamplingErrorInfo(
            kind=SamplingErrorKind.TRANSPORT
            if which == "connect"
            else SamplingErrorKind.IDLE_TIMEOUT,
            message=f"{which} timeout: {what} within {seconds:g} s",
            retryable=True,
        )
    )


@attrs.define(eq=False)
class PreparedHeaders:
    """What every request of one config and header set carries, made once: the header
    fields (as bytes, names as given, ``Host`` and ``Content-Length`` left to the
    transport) and the socket timeouts. ``memo`` is for a transport's own per-header-set
    work (keyed by the transport), so that it too is done once."""

    fields: list[tuple[bytes, bytes]]
    #: The fields' names, lower-cased.
    names: frozenset[str]
    #: ``connect``, ``read``, ``write`` and ``pool`` (``None``: unbounded), in seconds.
    timeout: Mapping[str, float | None]
    memo: dict[object, object] = attrs.field(factory=dict)


@attrs.define(eq=False, slots=True)
class HttpRequest:
    """One request as a transport sends it: ``base_url/path?params``, the prepared
    headers and the body."""

    method: str
    base_url: str
    path: str
    params: tuple[tuple[str, str], ...]
    headers: PreparedHeaders
    body: bytes

    @property
    def url(self) -> str:
        """The URL without its query (the query is ``params``)."""
        return f"{self.base_url}/{self.path.lstrip('/')}"


class Body(Protocol):
    """A response whose head has arrived and whose body is still to be read.

    ``end_received`` may always answer ``False`` (it is an optimisation: reading the end
    of a body now rather than in the background); ``True`` promises that reading the body
    to its end waits for nothing."""

    @property
    def status(self) -> int: ...

    @property
    def http_version(self) -> str:
        """``"HTTP/1.1"``, ``"HTTP/2"``, ..."""
        ...

    @property
    def header_fields(self) -> Mapping[str, str]:
        """Names lower-cased, the values of a repeated name joined with ``", "``."""
        ...

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    @property
    def request_sent_at(self) -> float | None:
        """When the request's last byte was written (trio's clock); ``None``: unknown."""
        ...

    @property
    def received_at(self) -> float | None:
        """When the bytes of the last read arrived (trio's clock), if the transport times
        its reads by their bytes' arrival; else ``None``. Read it in the reading task."""
        ...

    @property
    def ended_at(self) -> float | None:
        """When the body's end was read (trio's clock); ``None`` before."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The undecoded body, chunk by chunk. A failure raises
        :class:`SamplingClientError`, or one of :attr:`read_errors`, which
        :meth:`read_failure` classifies (a transport may hand out its library's own
        iterator, with no layer added per chunk)."""
        ...

    @property
    def read_errors(self) -> tuple[type[BaseException], ...]:
        """What :meth:`chunks` may raise unclassified (often nothing)."""
        ...

    def read_failure(self, exc: BaseException) -> SamplingClientError:
        """One of :attr:`read_errors`, classified."""
        ...

    def end_received(self, downloaded: int) -> bool:
        """Whether what is left of the body (after ``downloaded`` undecoded bytes) has
        arrived already. ``False`` is always a correct answer."""
        ...

    def socket_reads(self) -> SocketReads | None:
        """The body's reads as its reader makes them itself (see :class:`SocketReads`);
        ``None`` (always a correct answer): read :meth:`chunks`. Asked before the first
        read, once."""
        ...

    async def aclose(self) -> None:
        """Close the response (and its connection, if the body is unfinished); give the
        connection back if it ended. Idempotent. Local work (a socket close, an h2
        ``RST_STREAM``): the caller shields and bounds it when it must."""
        ...


class SocketReads(Protocol):
    """A body's reads with no coroutine of their own: the reader waits until
    :attr:`fileno` is readable (``trio.lowlevel.wait_readable``) and :meth:`take` reads.

    Why: a read awaited through the transport's layers (an async generator, the
    connection's ``read``, the socket stream's ``receive_some``) keeps a coroutine per
    layer alive across the wait for the next token, new each read; with hundreds of
    streams waiting, the garbage collector's young generations are mostly those frames,
    walked again at every pass. Here a waiting read is trio's wait alone. Its state is
    the object's, not a suspended frame's, so a read the reader's cancel scope stopped
    can be made again (or continued through :meth:`Body.chunks`: both read the same
    parser's state).

    A transport offers it only where it reads the socket itself (plain HTTP/1.1, no TLS)
    and the read needs no time bound of its own."""

    @property
    def fileno(self) -> int:
        """The socket to wait on."""
        ...

    def take(self, ready: bool) -> bytes | None:
        """The next body bytes: a chunk, or ``b""`` when there is none without waiting
        (wait for :attr:`fileno`, then ``take(True)``); ``None``: the body's end was read
        (the connection is given back when the body is closed). ``ready``: the socket was
        found readable, and one read of it is made if nothing is parsed already (a
        ``take(False)`` makes no system call); a ``take(True)`` follows the wait a
        ``b""`` asked for, with no other read of the body between. Failures raise
        :class:`SamplingClientError`."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Opens streamed exchanges. ``open`` sends ``request`` and returns its response
    once the head arrived (any status); the caller closes the body. Connect failures,
    resets and the transport's own timeouts raise :class:`SamplingClientError`."""

    async def open(self, request: HttpRequest) -> Body: ...

    async def aclose(self) -> None:
        """Close what the transport owns (a transport given by the caller stays open)."""
        ...
