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

The partial output a request keeps from a failed attempt while it tries again (for its
terminal, whatever the next attempt shows) is the earlier attempt's text, no longer in
any fold: the next attempt counts it (:class:`KeptPartial`, measured once with
:func:`response_bytes`).

What the process holds for a stream is more than its buffers, and the account counts it
as the process holds it, so that the limit bounds the resident memory, not only the text:

* every stream costs :data:`STREAM_OVERHEAD` however little it holds (its connection,
  the HTTP parser's state, its task and the attempt's own objects: about 40 KiB each,
  measured with a few hundred idle streams);
* the buffers a read passes through (the connection's reads, counted as eight times the
  longest read for its copies and the allocator's free memory between them, and the
  events waiting for the consumer: *passing* buffers, counted with ``passing=True``) are
  freed once the read is parsed, but the allocator keeps that memory for the next reads
  rather than returning it to the system. So the account counts the passing buffers at
  their highest sum while any stream is live (:attr:`ResponseMemory.retained` is that
  peak minus what the live streams hold now): a stream stopped by the cap does not leave
  its reads' share to the text of the others, which would grow in fresh memory beside
  what the allocator keeps. The peak is forgotten when no stream is left.

An attempt reports what it holds before every body read (:meth:`Holding.report`) and
lets the memory cancel the read's scope when the attempt is the one to stop. So the total
is exact at every read, and exceeds the limit by at most what each stream's last read
added.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from typing import Any, Protocol, cast

import attrs
import trio

from ..client import SamplingClientError
from ..types import ConversationResponse, SamplingErrorInfo, SamplingErrorKind
from ..wire import StreamTransform

__all__ = [
    "DEFAULT_MAX_BUFFERED_RESPONSE_BYTES",
    "STREAM_OVERHEAD",
    "Buffer",
    "Holding",
    "KeptPartial",
    "ResponseMemory",
    "response_bytes",
]

#: ``open_sampler(max_buffered_response_bytes=)`` by default: 1 GiB in all.
DEFAULT_MAX_BUFFERED_RESPONSE_BYTES = 1024 * 1024 * 1024

#: What a live stream costs before it holds any response: its connection and HTTP
#: parser, its task, cancel scopes and the attempt's objects (measured: about 40 KiB).
STREAM_OVERHEAD = 48 * 1024


class ResponseMemory:
    """Response text held across a sampler's in-flight attempts, bounded by ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: What the attempts not stopped hold, in bytes, as last reported, and what the
        #: allocator keeps of their passing buffers (:attr:`retained`).
        self.total = 0
        #: The highest ``total`` reported.
        self.peak = 0
        #: The passing buffers the live attempts hold, and the highest sum of them since
        #: the account was last empty.
        self.passing = 0
        self.passing_peak = 0
        self._sum = 0  # what the live attempts hold, passing buffers included
        self._live: set[Holding] = set()

    @property
    def retained(self) -> int:
        """Memory the passing buffers freed and the allocator keeps for later reads."""
        return self.passing_peak - self.passing

    def hold(self, transform: StreamTransform) -> Holding:
        """Start counting what the attempt behind ``transform`` holds."""
        holding = Holding(self, transform)
        self._live.add(holding)
        return holding

    def update(self, holding: Holding, held: int, passing: int = 0) -> None:
        """``holding`` holds ``held`` bytes now, ``passing`` of them in passing buffers;
        past the limit, stop the largest."""
        if holding not in self._live:
            return
        self._sum += held - holding.bytes
        self.passing += passing - holding.passing
        holding.bytes, holding.passing = held, passing
        if self.passing > self.passing_peak:
            self.passing_peak = self.passing
        self.total = self._sum + self.passing_peak - self.passing
        if self.total > self.peak:
            self.peak = self.total
        while self.total > self.limit and self._live:
            victim = max(self._live, key=_held)
            # Counted as released once stopped: it ends within a scheduling round, and
            # waiting for that would stop more streams than needed.
            self.release(victim)
            victim.stop()

    def release(self, holding: Holding) -> None:
        """The attempt ended (or was stopped): what it held is no longer counted, but
        for its passing buffers, which the allocator keeps (:attr:`retained`)."""
        if holding in self._live:
            self._live.discard(holding)
            self._sum -= holding.bytes
            self.passing -= holding.passing
            if not self._live:  # nothing left to share what the allocator keeps
                self._sum = self.passing = self.passing_peak = 0
            self.total = self._sum + self.passing_peak - self.passing
        holding.bytes = holding.passing = 0

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


def response_bytes(response: ConversationResponse | None) -> int:
    """The memory the strings of ``response``'s items take, as CPython holds them (text,
    reasoning and its summaries, tool names and arguments, refusal, ids)."""
    return 0 if response is None else _string_bytes(response.items, 0)


def _string_bytes(value: object, depth: int) -> int:
    if isinstance(value, str):
        return sys.getsizeof(value)
    values: Iterable[object]
    if depth > 4:  # the items' strings are a few levels down; nothing grows deeper
        return 0
    if isinstance(value, tuple | list):
        values = value
    elif isinstance(value, dict):
        values = itertools.chain(value.keys(), value.values())
    elif attrs.has(kind := cast(Any, type(value))):
        values = (getattr(value, field.name) for field in attrs.fields(kind))
    else:
        return 0
    return sum(_string_bytes(item, depth + 1) for item in values)


class KeptPartial:
    """The partial output a request keeps from an earlier attempt, as a counted buffer."""

    __slots__ = ("buffered_bytes",)

    def __init__(self, response: ConversationResponse | None) -> None:
        self.buffered_bytes = response_bytes(response)


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
        self._passing: tuple[Buffer, ...] = ()
        #: Bytes held as last reported (:data:`STREAM_OVERHEAD` included), and how many of
        #: them are in passing buffers.
        self.bytes = 0
        self.passing = 0
        #: Chosen to stop: every read from now on fails with the memory's error.
        self.stopped = False
        self._scope: trio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._scope is not None:
            self._scope.cancel()

    def release(self) -> None:
        self._memory.release(self)

    def count(self, buffer: Buffer, *, passing: bool = False) -> None:
        """Count what ``buffer`` holds too, from the next report on: a buffer that grows
        (the SSE decoder's event in progress), or with ``passing`` one that a read
        passes through (the connection's reads, the events the consumer has not taken)."""
        if passing:
            self._passing = (*self._passing, buffer)
        else:
            self._buffers = (*self._buffers, buffer)

    def held(self) -> tuple[int, int]:
        """Bytes held now (the stream's overhead, the fold's text and every counted
        buffer), and how many of them are in passing buffers."""
        passing = 0
        for buffer in self._passing:  # before every read: no generator
            passing += buffer.buffered_bytes
        held = STREAM_OVERHEAD + self._transform.held_bytes + passing
        for buffer in self._buffers:
            held += buffer.buffered_bytes
        return held, passing

    def report(self) -> None:
        """Before a read: report what the attempt holds now (the largest past the
        limit is stopped); raises the memory's error if this attempt is stopped."""
        if self._transform.finished:
            self.release()  # the response (or partial) is the consumer's now
        else:
            self._memory.update(self, *self.held())
        self.check()

    def reading(self, scope: trio.CancelScope) -> None:
        """Before a read: :meth:`report`, and ``scope`` is the read's (the memory's stop
        cancels it until :meth:`read_done`). One call a read, where a report, a check
        and a guard were three (``benchmarks/bench_per_token.py``)."""
        if self._transform.finished:
            self.release()
        else:
            self._memory.update(self, *self.held())
        if self.stopped:
            raise SamplingClientError(self._memory.error())
        self._scope = scope

    def read_done(self) -> None:
        """After a read: no scope to cancel, and :meth:`check`."""
        self._scope = None
        if self.stopped:
            raise SamplingClientError(self._memory.error())

    def check(self) -> None:
        """Raise the memory's error (a :class:`SamplingClientError`) if stopped."""
        if self.stopped:
            raise SamplingClientError(self._memory.error())
