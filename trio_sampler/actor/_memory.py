"""The sampler-wide bound on response text held by the attempts in flight.

One stream holds at most ``max_response_bytes`` (its fold refuses more), but a sampler
running many hostile streams at once would hold that many times over. A
:class:`ResponseMemory` adds up what every in-flight attempt holds and, past its limit,
stops the largest streams until the total is back under it: each then fails like a body
over ``max_response_bytes`` does, with its partial output and
``error_code="sampler_memory_cap"``, not retried.

What an attempt holds is every buffer that grows with what the server sends: the text,
reasoning, refusal and tool arguments its transform's fold holds, and what its SSE decoder
holds for the event in progress (up to ``max_sse_event_bytes`` each: an endless event
grows there, not in the fold). A buffer is counted once :meth:`Holding.count` is told of
it.

An attempt reports what it holds before every body read (:meth:`Holding.report`) and
lets the memory cancel the read's scope when the attempt is the one to stop. So the total
is exact at every read, and exceeds the limit by at most what each stream's last read
added.
"""

from __future__ import annotations

from typing import Protocol

import trio

from ..client import SamplingClientError
from ..types import SamplingErrorInfo, SamplingErrorKind
from ..wire import StreamTransform

__all__ = ["DEFAULT_MAX_BUFFERED_RESPONSE_BYTES", "Buffer", "Holding", "ResponseMemory"]

#: ``open_sampler(max_buffered_response_bytes=)`` by default: 1 GiB in all.
DEFAULT_MAX_BUFFERED_RESPONSE_BYTES = 1024 * 1024 * 1024


class ResponseMemory:
    """Response text held across a sampler's in-flight attempts, bounded by ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: What the attempts not stopped hold, in bytes, as last reported.
        self.total = 0
        #: The highest ``total`` reported.
        self.peak = 0
        self._live: set[Holding] = set()

    def hold(self, transform: StreamTransform) -> Holding:
        """Start counting what the attempt behind ``transform`` holds."""
        holding = Holding(self, transform)
        self._live.add(holding)
        return holding

    def update(self, holding: Holding, held: int) -> None:
        """``holding`` holds ``held`` bytes now; past the limit, stop the largest."""
        if holding not in self._live:
            return
        self.total += held - holding.bytes
        holding.bytes = held
        if self.total > self.peak:
            self.peak = self.total
        while self.total > self.limit:
            victim = max(self._live, key=_held)
            # Counted as released once stopped: it ends within a scheduling round, and
            # waiting for that would stop more streams than needed.
            self.release(victim)
            victim.stop()

    def release(self, holding: Holding) -> None:
        """The attempt ended (or was stopped): what it held is no longer counted."""
        if holding in self._live:
            self._live.discard(holding)
            self.total -= holding.bytes
        holding.bytes = 0

    def error(self) -> SamplingErrorInfo:
        return SamplingErrorInfo(
            kind=SamplingErrorKind.HTTP,
            message=(
                "the sampler's requests held more than max_buffered_response_bytes "
                f"({self.limit} bytes) of response text, and this was the largest stream; "
                "raise it in open_sampler() if this is expected"
            ),
            retryable=False,
            error_code="sampler_memory_cap",
        )


class Buffer(Protocol):
    """Something that holds bytes of a response outside the fold."""

    @property
    def buffered_bytes(self) -> int: ...


def _held(holding: Holding) -> int:
    return holding.bytes


class Holding:
    """What one attempt holds, and the way the memory stops it.

    The attempt calls :meth:`report` before every body read and runs the read in a
    cancel scope it hands over (:meth:`guard`: the read's own timer scope, so a read
    needs no second scope), which :meth:`stop` cancels; :meth:`check` after the read
    turns a stop into the memory's error."""

    def __init__(self, memory: ResponseMemory, transform: StreamTransform) -> None:
        self._memory = memory
        self._transform = transform
        self._buffers: tuple[Buffer, ...] = ()
        self.bytes = 0
        #: Chosen to stop: every read from now on fails with the memory's error.
        self.stopped = False
        self._scope: trio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._scope is not None:
            self._scope.cancel()

    def release(self) -> None:
        self._memory.release(self)

    def count(self, buffer: Buffer) -> None:
        """Count what ``buffer`` holds too, from the next report on (the SSE decoder)."""
        self._buffers = (*self._buffers, buffer)

    def held(self) -> int:
        """Bytes held now: the fold's text and every counted buffer."""
        held = self._transform.held_bytes
        for buffer in self._buffers:  # before every read: no generator
            held += buffer.buffered_bytes
        return held

    def report(self) -> None:
        """Before a read: report what the attempt holds now (the largest past the
        limit is stopped); raises the memory's error if this attempt is stopped."""
        if self._transform.finished:
            self.release()  # the response (or partial) is the consumer's now
        else:
            self._memory.update(self, self.held())
        self.check()

    def guard(self, scope: trio.CancelScope | None) -> None:
        """The scope of the read in progress (``None`` once it is over)."""
        self._scope = scope

    def check(self) -> None:
        """Raise the memory's error (a :class:`SamplingClientError`) if stopped."""
        if self.stopped:
            raise SamplingClientError(self._memory.error())
