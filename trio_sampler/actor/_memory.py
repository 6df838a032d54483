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
lets the memory cancel its scope (its reads, and the parse of what they bring) when the
attempt is the one to stop. So the total is exact at every read, and exceeds the limit by
at most what each stream's last read added.

A read's tool arguments or structured answer, parsed as JSON, can make far more than the
read brought: 64 KiB of ``[{},{},...]`` makes about 1.5 MB of values and 5.5 MB of changes
for the consumer. So the parse reports too, every ``GUARD_SLICE`` characters
(``RequestState.emit`` over ``PartialOutputs.parse``): a stream is stopped partway
through the read that takes it past the limit.

A stream stopped holds its memory until it ends (its task unwinds, its consumer takes its
terminal): the account counts it as :attr:`ResponseMemory.unwinding` from the stop to its
release. While that does not fit beside what the live streams hold
(:attr:`ResponseMemory.short`), a stream about to hold more (a read, the next slice of a
parse) waits for the stopped ones to end (:meth:`Holding.room`): without it, the 20
streams of ``benchmarks/memory_cap.py`` each parsed a read into fresh memory in the
scheduling round the ones stopped took to end, and the process grew to 4.8 times the cap
with ``[{},{},...]``.
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
        #: What the attempts stopped and not yet ended held when they were stopped: still
        #: in memory until they end (within a scheduling round, as a rule).
        self.unwinding = 0
        self._unwound = trio.Event()
        self._unwound.set()

    @property
    def short(self) -> bool:
        """Whether the stopped attempts still hold what the limit has no room for: an
        attempt that would hold more waits for them to end (:meth:`Holding.room`)."""
        return self.unwinding > 0 and self.total + self.unwinding > self.limit

    async def unwound(self) -> None:
        """Wait until every stopped attempt has ended."""
        await self._unwound.wait()

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
            # Counted as released once stopped (it ends within a scheduling round, and
            # waiting for that would stop more streams than needed), but as unwinding until
            # it ends: the others wait for it before they hold more (:attr:`short`).
            held = victim.bytes
            self.release(victim)
            victim.unwinding = held
            if held and not self.unwinding:
                self._unwound = trio.Event()
            self.unwinding += held
            victim.stop()

    def release(self, holding: Holding) -> None:
        """The attempt ended (or was stopped): what it held is no longer counted, but
        for its passing buffers, which the allocator keeps (:attr:`retained`)."""
        if holding.unwinding:  # a stopped attempt has ended
            self.unwinding -= holding.unwinding
            holding.unwinding = 0
            if not self.unwinding:
                self._unwound.set()
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

    The attempt calls :meth:`reading` before every body read (:meth:`report` between
    the slices of its parse), handing over the cancel scope it runs in (its reads' own
    timer scope, so a read needs no second scope), which :meth:`stop` cancels wherever
    the attempt waits (a read, the consumer's credit, :meth:`room`); :meth:`read_done`
    after the read turns a stop into the memory's error."""

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
        #: What it held when it was stopped, until it ends (:attr:`ResponseMemory.unwinding`).
        self.unwinding = 0
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
        """Before a read: :meth:`report`, and ``scope`` is the attempt's, which
        :meth:`stop` cancels wherever the attempt waits (a read, the consumer's credit,
        :meth:`room`). One call a read, where a report, a check and a guard were three
        (``benchmarks/bench_per_token.py``)."""
        self._scope = scope
        if self._transform.finished:
            self.release()
        else:
            self._memory.update(self, *self.held())
        if self.stopped:
            raise SamplingClientError(self._memory.error())

    @property
    def short(self) -> bool:
        """Whether the memory is short (:attr:`ResponseMemory.short`): the attempt is to
        wait (:meth:`room`) before it holds more."""
        return self._memory.short

    async def room(self) -> None:
        """Wait while the attempts the memory stopped have not ended and hold what the
        limit has no room for (this attempt holds no more meanwhile), reporting again
        after each: the memory's error if this attempt is stopped meanwhile."""
        memory = self._memory
        while memory.short:
            await memory.unwound()
            self.report()

    def read_done(self) -> None:
        """After a read: :meth:`check`."""
        if self.stopped:
            raise SamplingClientError(self._memory.error())

    def check(self) -> None:
        """Raise the memory's error (a :class:`SamplingClientError`) if stopped."""
        if self.stopped:
            raise SamplingClientError(self._memory.error())
