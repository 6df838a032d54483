"""The bytes of replies the emulator holds at once, across every connection.

A streamed reply is rendered in full before its first byte goes out, and it is held until
its last byte has been handed to the connection. A client that asks for long replies and
never reads them holds each one for as long as it keeps its connection open: without a
bound, 300 such clients held about 1 GB. Past the bound a new reply is refused as the
real APIs refuse work when overloaded (503; Anthropic's 529), and every reply already
started goes on.

What is held is what the process holds. A rendered stream is packed into one buffer
(:class:`Frames`) before it is counted: a list of tens of thousands of small ``bytes``,
each allocated between the rendering's temporaries, would hold about twice its bytes in
a process's memory once those temporaries are freed (and the allocator keeps such
half-used memory). The connection's own buffers hold no more than a message or two: a
write to a client that does not read waits (Hypercorn writes each body message to the
socket before the app's ``send`` returns; HTTP/2 stops taking a stream's data past a
small buffer, Hypercorn's ``BUFFER_HIGH_WATER``, until its flow-control window opens),
so the reply's producer is held back, not buffered.

A background response (Responses background mode) is kept after its stream ends, for
retrieval: its frames are packed and held in the budget too, from when it is kept until
it expires or is dropped (``_background``), and a new one that would not fit is refused
as a reply is.

A reply that would not fit is refused before it is rendered: its size is estimated from
its deltas (:func:`stream_deltas`) at the bytes per delta of the last stream rendered for
the same API (:meth:`ReplyBudget.check`). Rendering a long reply takes a good part of a
second; refusing it only afterwards made every refused request cost that, and left the
server busy for a minute behind 300 of them.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import attrs

from ._reply import Reply
from ._validate import ApiError

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "Frames", "ReplyBudget", "frames_size", "stream_deltas"]

#: The default bound of :class:`ReplyBudget`: far above what ordinary load holds (a
#: thousand streams of a few kilobytes each), far below what non-reading clients reach.
DEFAULT_MAX_REPLY_BYTES = 256 * 1024 * 1024


#: What each frame costs beyond its bytes: the ``bytes`` object's header and its slot in
#: the list (a token's frame is about a hundred bytes, so this is a third again).
_FRAME_OVERHEAD = sys.getsizeof(b"") + 8


def frames_size(frames: Sequence[bytes]) -> int:
    """The memory a rendered stream's frames take, as the budget counts it."""
    return sum(map(len, frames)) + _FRAME_OVERHEAD * len(frames)


class Frames(Sequence[bytes]):
    """A rendered stream's frames packed in one buffer (each frame read out as it is
    sent): what it holds is :attr:`nbytes`, its bytes and one offset per frame."""

    __slots__ = ("_data", "_ends")

    def __init__(self, frames: Iterable[bytes]) -> None:
        frames = list(frames)
        self._data = b"".join(frames)
        #: Where each frame ends in ``_data``.
        self._ends = array("Q", itertools.accumulate(map(len, frames)))

    @property
    def data(self) -> bytes:
        """Every frame, in order, as one ``bytes``."""
        return self._data

    @property
    def nbytes(self) -> int:
        """The memory the frames take, as the budget counts it."""
        return sys.getsizeof(self._data) + sys.getsizeof(self._ends)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Frames: ...

    def __getitem__(self, index: int | slice) -> bytes | Frames:
        if isinstance(index, slice):
            return Frames(self[i] for i in range(*index.indices(len(self))))
        ends = self._ends
        if index < 0:
            index += len(ends)
        end = ends[index]  # raises IndexError past the end
        return self._data[ends[index - 1] if index > 0 else 0 : end]

    def __iter__(self) -> Iterator[bytes]:
        data = self._data
        start = 0
        for end in self._ends:
            yield data[start:end]
            start = end


def stream_deltas(reply: Reply) -> int:
    """About how many events a stream of ``reply`` carries: one per word of its text,
    reasoning and refusal (or per ``chunk_chars`` slice), and per slice of its tools'
    arguments (counted without splitting anything: this sizes a reply before it exists)."""
    texts = (reply.text, reply.reasoning, reply.refusal)
    if reply.chunk_chars:
        deltas = sum(-(-len(text) // reply.chunk_chars) for text in texts)
    else:
        deltas = sum(text.count(" ") + text.count("\n") + 1 for text in texts if text)
    size = reply.chunk_chars or 8
    deltas += sum(-(-len(call.arguments) // size) for call in reply.tool_calls)
    return deltas + 1


@attrs.define
class ReplyBudget:
    """At most ``limit`` bytes of replies held at once."""

    limit: int = DEFAULT_MAX_REPLY_BYTES
    held: int = 0
    #: Per API, the bytes per delta of the last stream held (what sizes the next one).
    per_delta: dict[str, float] = attrs.field(factory=dict)

    def check(self, *, anthropic: bool, api: str = "", deltas: int = 0) -> None:
        """Raise the overloaded error when the replies held already fill the limit, or
        when a stream of ``deltas`` deltas for ``api`` would pass it at the size per delta
        of the last one held (so a reply is not rendered only to be refused)."""
        estimate = deltas * self.per_delta.get(api, 0.0)
        if self.held >= self.limit or (self.held and self.held + estimate > self.limit):
            raise _overloaded(anthropic)

    @contextlib.contextmanager
    def holding(
        self, size: int, *, anthropic: bool, api: str = "", deltas: int = 0
    ) -> Iterator[None]:
        """Hold ``size`` bytes while the block runs (a stream of ``deltas`` deltas for
        ``api``: its size per delta sizes the next one, see :meth:`check`).

        Raises:
            ApiError: 503 (529 for Anthropic), when ``size`` more bytes would pass the
                limit; a reply larger than the whole limit is still served when nothing
                else is held (the limit bounds the sum, not one reply).
        """
        if deltas:
            self.per_delta[api] = size / deltas
        self.take(size, anthropic=anthropic)
        try:
            yield
        finally:
            self.held -= size

    def take(self, size: int, *, anthropic: bool) -> None:
        """Hold ``size`` bytes until :meth:`give_back` (what :meth:`holding` does for a
        block: a background response is held while it is kept). Refused as
        :meth:`holding` refuses."""
        if self.held and self.held + size > self.limit:
            raise _overloaded(anthropic)
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size


#: The ``retry-after`` of a reply refused as overloaded, in seconds: replies are let go
#: as their clients read them or leave, which the server cannot foresee.
OVERLOADED_RETRY_AFTER = 1.0


def _overloaded(anthropic: bool) -> ApiError:
    return ApiError(
        "The server is overloaded: too many long replies are waiting for their clients to "
        "read them. Please try again later.",
        status=529 if anthropic else 503,
        retry_after=OVERLOADED_RETRY_AFTER,
    )
