"""When a request arrived: when its last bytes reached the server's socket.

A paced stream counts its ``first_token_ms`` from the request's arrival: the moment the
whole request was in, as a server that needs the whole prompt before it starts sees it,
and as a client that times from its request's last byte written (the load generator) sees
it. The app itself only has the request once the server has parsed the head, started the
app's task and handed it the body, which takes the better part of a millisecond on a quiet
machine and much longer when the server is busy (at 100 streams on two shared cores the
median was 7.6 ms). A client measuring TTFT sees all of that, so
:func:`~trio_sampler.emulator.serve` hands Hypercorn each connection wrapped in an
:class:`ArrivalStream`, which notes when each read's bytes of the current request came;
once the app has read the request's body it takes the last of those instants (the app's
task inherits the connection's context) and starts its clock there.

When the bytes came is the kernel's receive timestamp where the platform gives one for
TCP (``SO_TIMESTAMPNS`` on Linux: the arrival of the last segment a read returned), not
when the server's read returned them: the server reads a request's last bytes only once it
has parsed the head before them, and that time is the server's, to count against the
schedule. Elsewhere it is when the read returned.

The previous response is complete when the app hands the server its last body message.
An HTTP/1.1 client sends its next request only after reading that response, so the next
bytes read are the next request's. Two cases fall back to the moment the app has read the
body: a response sent before its request's body had arrived (the rest of that body would
otherwise be taken for the next request), and every connection without an
:class:`ArrivalStream` (the in-memory transport).
"""

from __future__ import annotations

import contextvars

import trio

from .._receive_time import StampedSocketStream

__all__ = ["CONNECTION", "ArrivalStream", "request_answered", "request_arrived"]


class ArrivalStream(StampedSocketStream):
    """A connection's socket stream that notes when a request's bytes arrived.

    Hypercorn's Trio server reads and writes its connection through this; it has the
    ``socket`` attribute Hypercorn looks for and no TLS handshake (plain HTTP).
    """

    def __init__(self, inner: trio.SocketStream) -> None:
        super().__init__(inner)
        self._arrived: float | None = None
        # Whether bytes read now are the current request's (a new connection's are).
        self._awaiting = True

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await super().receive_some(max_bytes)
        if data and self._awaiting:
            self._arrived = self.received_at
        return data

    def arrived(self) -> float | None:
        """When the current request's last bytes arrived, once its body has been read
        (``None``: not known). Later reads are not its bytes."""
        self._awaiting = False
        return self._arrived

    def answered(self, request_complete: bool) -> None:
        """The current response is about to end: the next bytes read start the next
        request, if ``request_complete`` (its whole body was read); otherwise which bytes
        start it is not known."""
        self._arrived = None
        self._awaiting = request_complete


#: The connection the current task's request came on (set in each connection's task;
#: Hypercorn starts the app's task from it, so the app's task sees it too).
CONNECTION: contextvars.ContextVar[ArrivalStream | None] = contextvars.ContextVar(
    "trio_sampler_emulator_connection", default=None
)


def request_arrived() -> float:
    """When the current request arrived, on trio's clock: the read of its last bytes, or
    now when that is not known. Called once the app has read the request's body."""
    connection = CONNECTION.get()
    at = None if connection is None else connection.arrived()
    return trio.current_time() if at is None else at


def request_answered(request_complete: bool) -> None:
    """The current response's last body message is being sent (see
    :meth:`ArrivalStream.answered`)."""
    connection = CONNECTION.get()
    if connection is not None:
        connection.answered(request_complete)
