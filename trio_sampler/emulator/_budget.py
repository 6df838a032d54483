"""The bytes of replies the emulator holds at once, across every connection.

A streamed reply is rendered in full before its first byte goes out, and it is held until
its last byte has been handed to the connection. A client that asks for long replies and
never reads them holds each one for as long as it keeps its connection open: without a
bound, 300 such clients held about 1 GB. Past the bound a new reply is refused as the
real APIs refuse work when overloaded (503; Anthropic's 529), and every reply already
started goes on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

import attrs

from ._validate import ApiError

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "ReplyBudget", "frames_size"]

#: The default bound of :class:`ReplyBudget`: far above what ordinary load holds (a
#: thousand streams of a few kilobytes each), far below what non-reading clients reach.
DEFAULT_MAX_REPLY_BYTES = 256 * 1024 * 1024


#: What each frame costs beyond its bytes: the ``bytes`` object's header and its slot in
#: the list (a token's frame is about a hundred bytes, so this is a third again).
_FRAME_OVERHEAD = sys.getsizeof(b"") + 8


def frames_size(frames: Sequence[bytes]) -> int:
    """The memory a rendered stream's frames take, as the budget counts it."""
    return sum(map(len, frames)) + _FRAME_OVERHEAD * len(frames)


@attrs.define
class ReplyBudget:
    """At most ``limit`` bytes of replies held at once."""

    limit: int = DEFAULT_MAX_REPLY_BYTES
    held: int = 0

    def check(self, *, anthropic: bool) -> None:
        """Raise the overloaded error when the replies held already fill the limit (so
        a reply is not rendered only to be refused)."""
        if self.held >= self.limit:
            raise _overloaded(anthropic)

    @contextlib.contextmanager
    def holding(self, size: int, *, anthropic: bool) -> Iterator[None]:
        """Hold ``size`` bytes while the block runs.

        Raises:
            ApiError: 503 (529 for Anthropic), when ``size`` more bytes would pass the
                limit; a reply larger than the whole limit is still served when nothing
                else is held (the limit bounds the sum, not one reply).
        """
        if self.held and self.held + size > self.limit:
            raise _overloaded(anthropic)
        self.held += size
        try:
            yield
        finally:
            self.held -= size


def _overloaded(anthropic: bool) -> ApiError:
    return ApiError(
        "The server is overloaded: too many long replies are waiting for their clients to "
        "read them. Please try again later.",
        status=529 if anthropic else 503,
    )
