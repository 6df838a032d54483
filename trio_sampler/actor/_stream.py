"""One request's event stream: the hand-over between its task and its consumer.

Design:

* Events travel as **batches**, one per network read, and the consumer-side iterator
  flattens them: a hop from one task to another costs a few microseconds, a token event
  well under one, so the hop is paid per read, not per token.
* A batch goes to the consumer waiting for it, else into the request's **queue**, which
  has no bound of its own; every data batch needs a **credit** that the consumer gives
  back as it takes one. That bounds what a request buffers (``max_buffered_batches``
  reads) and makes a slow consumer slow down the HTTP read.
* The terminal event needs no credit: it is handed over synchronously (never blocks, no
  checkpoint, so it works from a cancelled context), and nothing is handed over after
  it. Consumers see end-of-stream right after the terminal.
* The queue, the credits and the waits are the request's own fields, not a trio memory
  channel and semaphore (which did the same): those were 11 objects and 4.5 µs to make a
  request, and about 0.45 µs a batch to pass through (``objects_per_stream.py``,
  ``docs/actor-internals.md``).
* A cancel records the ``Cancelled`` terminal **at once**, in the task that cancels
  (``RequestState.cancel``): the request's scope is cancelled and the terminal is final
  before ``cancel()`` returns, whatever the request task is waiting on. The consumer's
  next read returns it (batches not yet read are dropped). The request task, unwinding,
  finds the terminal already recorded and only closes its connection.
* The consumer going away is a cancel in every form: ``aclose()``, leaving ``async with``
  (both return only once the request's task has finished, shielded and bounded), and
  dropping the stream object (its finalizer asks the run loop, via
  ``TrioToken.run_sync_soon``, to cancel the request: a finalizer may run in the middle
  of Trio's own bookkeeping, so it must not touch a cancel scope itself).
"""

from __future__ import annotations

import collections
import operator
import weakref
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .._redact import Redactor
from ..types import (
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    CitationReceived,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    FirstToken,
    OpaqueItemReceived,
    SamplingError,
    SamplingEvent,
    ServerTextTaken,
    TerminalEvent,
    ToolCallDelta,
    TrioSamplerError,
)
from ..wire._partial_output import PartialOutputs
from ._memory import Holding
from ._metrics import MetricsRecorder

if TYPE_CHECKING:
    from ..config import SamplerConfig
    from ..routing import Route
    from ..wire import StreamTransform

__all__ = ["CONTENT_EVENTS", "RequestCancelledError", "RequestResult", "RequestStream"]

#: The events that are an attempt's content: they reset the idle timer, make a retry
#: discard what was shown, and win a hedged attempt's race.
CONTENT_EVENTS: Final = frozenset(
    {
        ChannelToken,
        ToolCallDelta,
        FirstToken,
        BackendToolCallStarted,
        BackendToolCallCompleted,
        OpaqueItemReceived,
        CitationReceived,
        ServerTextTaken,
    }
)

_TERMINALS = (Completed, Failed, Cancelled)
#: A batch on its way to the consumer: its events, when the bytes of the read that
#: produced it arrived (``None``: not from a read, or not known), and its bytes
#: (:func:`batch_bytes`; 0 for the terminal's).
Entry = tuple[list[SamplingEvent], float | None, int]
_TOKENS_ONLY: Final = {ChannelToken}
_NO_EVENTS: Final[list[SamplingEvent]] = []

#: What a queued event costs beyond its text, as the memory account counts it: the event
#: object (88 bytes for a ``ChannelToken``), its string's header (49) and its list slot.
_EVENT_OVERHEAD: Final = 88 + 49 + 8


_TEXT: Final = operator.attrgetter("text")


def batch_bytes(batch: list[SamplingEvent]) -> int:
    """The memory a batch waiting for the consumer holds: the text of its deltas (no
    longer the fold's: the fold has appended it to a string of its own), and each event."""
    size = _EVENT_OVERHEAD * len(batch)
    if set(map(type, batch)) == _TOKENS_ONLY:
        # The usual batch, text deltas alone, summed in C: the loop below runs 17
        # bytecode instructions a token, 3,400 of the 81,000 of a 200-delta request
        # before this (``benchmarks/calls_per_request.py --bytecode``).
        return size + sum(map(len, map(_TEXT, batch)))
    for event in batch:
        if isinstance(event, ChannelToken):
            size += len(event.text)
        elif isinstance(event, ToolCallDelta):
            size += len(event.arguments_delta)
    return size


#: How long leaving ``async with stream`` (or ``aclose()``) waits, shielded, for the
#: request's task to finish after the cancel. The task has nothing left to wait on but
#: closing its connection, which the client bounds at 5 s; this is the backstop.
EXIT_WAIT_S: Final = 10.0


class RequestCancelledError(TrioSamplerError):
    """The outcome of a request that ended in ``Cancelled``; ``partial`` keeps what arrived."""

    def __init__(self, request_id: str, reason: str, partial: ConversationResponse | None) -> None:
        super().__init__(f"request {request_id} was cancelled: {reason}")
        self.request_id = request_id
        self.reason = reason
        self.partial = partial


@attrs.frozen
class RequestResult:
    """How a request ended, as :meth:`RequestStream.result` returns it.

    ``terminal`` is the request's one terminal event. :meth:`unwrap` gives the response
    of a ``Completed`` request, or raises what its ending means: :class:`SamplingError`
    for ``Failed``, :class:`RequestCancelledError` for ``Cancelled`` (each carrying the
    partial response). ``partial`` reads that partial without raising.
    """

    terminal: TerminalEvent

    @property
    def ok(self) -> bool:
        """Whether the request completed."""
        return isinstance(self.terminal, Completed)

    @property
    def response(self) -> ConversationResponse | None:
        """The response of a ``Completed`` request; ``None`` otherwise."""
        return self.terminal.response if isinstance(self.terminal, Completed) else None

    @property
    def partial(self) -> ConversationResponse | None:
        """What a ``Failed`` or ``Cancelled`` request had received; ``None`` when it
        completed (read :attr:`response`) or received nothing."""
        return None if isinstance(self.terminal, Completed) else self.terminal.partial

    @property
    def error(self) -> SamplingError | RequestCancelledError | None:
        """The exception :meth:`unwrap` raises; ``None`` for a completed request.

        A new exception object on each read: raise it, do not keep it as state."""
        terminal = self.terminal
        if isinstance(terminal, Completed):
            return None
        if isinstance(terminal, Failed):
            return SamplingError(terminal.error, terminal.partial)
        return RequestCancelledError(terminal.request_id, terminal.reason, terminal.partial)

    def unwrap(self) -> ConversationResponse:
        """The response of a ``Completed`` request; raises :attr:`error` otherwise."""
        error = self.error
        if error is not None:
            raise error
        assert isinstance(self.terminal, Completed)
        return self.terminal.response


@attrs.define(eq=False)
class RequestState:
    """Bookkeeping the actor, the request task and the stream share for one request."""

    request_id: str
    request: ConversationRequest
    config: SamplerConfig
    #: Created when the Submit is accepted: a cancel that races the task's start still
    #: wins. It encloses the request's nursery, so cancelling it cancels the request and
    #: every helper task it runs.
    scope: trio.CancelScope
    #: How many more data batches may wait for the consumer (``max_buffered_batches``
    #: less those waiting): ``emit`` waits at 0 until the consumer takes one.
    credit: int
    submitted_at: float
    #: The sampler's table of requests without a terminal; ``finish`` removes this one.
    live: dict[str, RequestState] = attrs.field(factory=dict, repr=False)
    metrics: MetricsRecorder = attrs.field(
        default=attrs.Factory(lambda self: MetricsRecorder(self.submitted_at), takes_self=True),
        repr=False,
    )
    #: Scrubs every event on its way to the consumer: the one place events leave the
    #: request, so the credentials of its config appear in none (``trio_sampler._redact``).
    redactor: Redactor = attrs.field(factory=Redactor)
    terminal: TerminalEvent | None = None
    #: The request's task has finished (its connection is closed).
    task_finished: bool = False
    #: :attr:`done` and :attr:`task_done`, made when first asked for.
    done_event: trio.Event | None = attrs.field(default=None, init=False, repr=False)
    task_done_event: trio.Event | None = attrs.field(default=None, init=False, repr=False)
    cancel_reason: str | None = None
    #: The transform of the attempt in progress (its accumulation is the partial output).
    transform: StreamTransform | None = None
    #: Batches handed over (straight or through the queue), and taken by the consumer.
    sent: int = 0
    read: int = 0
    #: The batches handed over and not taken yet, in order (the terminal's is last),
    #: each with when the bytes of the read that produced it arrived and its bytes.
    queue: collections.deque[Entry] = attrs.field(factory=collections.deque, repr=False)
    #: The tasks waiting for credit, and those reading beside the one in ``waiter`` (a
    #: second task reading the stream at once): each made when first needed.
    wanting_credit: trio.lowlevel.ParkingLot | None = attrs.field(default=None, repr=False)
    readers: trio.lowlevel.ParkingLot | None = attrs.field(default=None, repr=False)
    #: The bytes of the batches handed over and not taken, and of the one the consumer
    #: is going through (:func:`batch_bytes`). A consumer slower than the server leaves
    #: up to ``max_buffered_batches`` batches queued, each a whole read's text: the
    #: sampler's memory account counts them.
    buffered_bytes: int = 0
    #: The bytes of the batch the consumer took last (it holds it until the next).
    taken_bytes: int = 0
    #: The routes the request runs along (``None``: the sampler's config alone).
    chain: tuple[Route, ...] | None = None
    #: The config of the route in use (prices the partial output of a cancel).
    serving: SamplerConfig | None = None
    #: The partial output of the last failed attempt (reported by a total timeout).
    last_partial: ConversationResponse | None = None
    #: ``(batch number of a Retrying, the transform it discarded)``: until the consumer
    #: has read that ``Retrying``, the attempt it is looking at is the discarded one.
    #: A tuple: most requests retry nothing, and an empty one is shared.
    discards: tuple[tuple[int, StreamTransform | None], ...] = attrs.field(default=(), repr=False)
    #: The structured answer and tool arguments read as they stream (``None`` for a
    #: request with neither ``output=`` nor tools): it adds ``OutputDelta`` /
    #: ``ToolArgumentsDelta`` after their sources and reads the answer at the end.
    partials: PartialOutputs | None = attrs.field(
        default=attrs.Factory(
            lambda self: PartialOutputs.for_request(self.request_id, self.request),
            takes_self=True,
        ),
        repr=False,
    )
    #: The request's stream (weakly: dropping it is a cancel): a ``Cancelled``
    #: terminal drops the batch it is going through (``RequestStream.drop_batch``).
    consumer: weakref.ReferenceType[RequestStream] | None = attrs.field(default=None, repr=False)
    #: The consumer's task while it waits for the next batch with none queued
    #: (``RequestStream.__anext__``), and the batch handed to it straight (``None``
    #: with the task woken: its stream was closed).
    waiter: trio.lowlevel.Task | None = attrs.field(default=None, repr=False)
    handed: Entry | None = attrs.field(default=None, repr=False)

    @property
    def done(self) -> trio.Event:
        """Set when the terminal is recorded. Made when first asked for: a request
        nobody waits on does not keep an event and its task set for its whole life
        (the collector's share, ``benchmarks/objects_per_stream.py``)."""
        event = self.done_event
        if event is None:
            event = self.done_event = trio.Event()
            if self.terminal is not None:
                event.set()
        return event

    @property
    def task_done(self) -> trio.Event:
        """Set when the request's task has finished (made when first asked for, as
        :attr:`done`)."""
        event = self.task_done_event
        if event is None:
            event = self.task_done_event = trio.Event()
            if self.task_finished:
                event.set()
        return event

    def finish_task(self) -> None:
        """The request's task has finished: its last act."""
        self.task_finished = True
        if self.task_done_event is not None:
            self.task_done_event.set()

    def cancel(self, reason: str) -> None:
        """Cancel the request and record its ``Cancelled`` terminal now (a no-op once it
        has ended). Synchronous and never raises: usable from any task, a cancelled
        context, or a ``run_sync_soon`` callback."""
        if self.terminal is not None:
            return
        self.cancel_reason = reason
        self.scope.cancel(reason=reason)
        partial = self.metrics.price(self.partial())
        self.finish(Cancelled(self.request_id, reason, partial, self.metrics.build(partial)))

    def partial(self) -> ConversationResponse | None:
        """The output of the attempt the consumer is looking at: the current attempt's,
        or, while a ``Retrying`` that discarded an earlier attempt is still unread, that
        earlier attempt's (the consumer has seen its events and not yet been told to
        drop them)."""
        transform = self.transform
        for number, discarded in self.discards:
            if number > self.read:
                transform = discarded
                break
        return partial_output(transform)

    @property
    def emit_may_wait(self) -> bool:
        """Whether :meth:`emit` would wait for credit (the consumer is behind)."""
        return self.credit == 0

    @property
    def emit_is_quick(self) -> bool:
        """Whether :meth:`emit`, with credit left, has no schedule point: none but the
        parse of tool arguments and answers (with the memory's share) has one."""
        return self.partials is None

    async def emit(
        self,
        batch: list[SamplingEvent],
        received_at: float | None = None,
        holding: Holding | None = None,
    ) -> None:
        """Send one batch of non-terminal events, waiting for buffer credit (backpressure);
        ``received_at`` is when the bytes of the read that produced it arrived.

        Not a checkpoint while credit is left: every attempt's read that produced the
        batch was one already, so yielding here too would only add a scheduling round
        per read. With the attempt's memory share (``holding``), the batch's tool
        arguments and answer are parsed a slice at a time (``PartialOutputs.parse``), the
        account told between slices: what one read's text makes once parsed (24 bytes of
        values and 70 of changes a byte, for ``[{},{},...]``) is bounded as it is made,
        the stream stopped midway if it is the largest, or waiting while the streams
        stopped have not ended yet (a checkpoint only then)."""
        if self.credit:
            self.credit -= 1
        else:
            await self._wait_for_credit()
        if self.partials is not None:
            if holding is None:
                batch = self.partials.batch(batch)
            else:
                try:
                    batch = await _parse(self.partials, batch, holding)
                except BaseException:  # the memory stopped the stream, or a cancel
                    self.give_credit()
                    raise
        if self.terminal is not None:
            # The request has ended: a consumer that closed its stream cancelled it first
            # (contract 3). Nothing more is handed over; the checkpoint takes the cancel.
            self.give_credit()
            await trio.lowlevel.checkpoint()
            return
        batch = self.redactor.events(batch)
        size = batch_bytes(batch)
        if self.partials is not None:  # the changes its parsed deltas carry
            size += self.partials.delta_bytes
        self._deliver((batch, received_at, size))
        self.buffered_bytes += size
        self.sent += 1

    async def _wait_for_credit(self) -> None:
        """Wait until the consumer has taken a batch and given its credit back, and take
        it (backpressure: the request stops reading its body meanwhile)."""
        waiting = self.wanting_credit
        if waiting is None:
            waiting = self.wanting_credit = trio.lowlevel.ParkingLot()
        while not self.credit:
            await waiting.park()
        self.credit -= 1

    def give_credit(self) -> None:
        """A data batch was taken (or not sent after all): one more may wait."""
        self.credit += 1
        waiting = self.wanting_credit
        if waiting:
            waiting.unpark()

    def _deliver(self, entry: Entry) -> None:
        """Hand a batch to the consumer waiting for it, else queue it (and wake a task
        reading beside, if one waits)."""
        if self.waiter is not None:
            self.hand(entry)
            return
        self.queue.append(entry)
        readers = self.readers
        if readers:
            readers.unpark()

    def hand(self, entry: Entry | None) -> None:
        """Wake the consumer waiting for a batch with ``entry`` (``None``: its stream was
        closed). The queue is empty while it waits, so the order of the batches holds.

        Per token (one token per read) the consumer waits for every batch: waking it
        here, where trio's channel ``receive`` raised a ``WouldBlock`` per wait, entered
        its cancel check twice and registered the task in two tables, costs a reschedule
        and no object but the batch (``benchmarks/bench_per_token.py``)."""
        waiter = self.waiter
        assert waiter is not None
        self.waiter = None
        self.handed = entry
        trio.lowlevel.reschedule(waiter)

    async def hand_over(self) -> None:
        """Let the consumer take the batch just sent before the attempt parses the rest
        of its read: yield until it has read every batch sent, at most twice (Trio runs
        the ready tasks of a round in either order, so one yield may resume this task
        first)."""
        for _ in range(2):
            if self.read >= self.sent:
                return
            await trio.lowlevel.checkpoint()

    async def emit_retry(self, retrying: list[SamplingEvent]) -> None:
        """Hand over a ``Retrying`` (the end of an attempt) and forget that attempt's
        output. The order matters: until the consumer can see the ``Retrying``, a cancel
        reports the attempt it has seen as the partial output."""
        discarded = self.transform
        await self.emit(retrying)
        self.discards += ((self.sent, discarded),)
        self.transform = None

    @trio.lowlevel.enable_ki_protection
    def finish(self, terminal: TerminalEvent) -> None:
        """Record the terminal, deliver it and close the stream; the first call wins.

        Synchronous: never awaits, so it works from a cancelled context."""
        if self.terminal is not None:
            return
        kept = self.last_partial
        if (
            isinstance(terminal, Failed | Cancelled)
            and terminal.partial is None
            and kept is not None
        ):
            # Content was shown (an attempt a retry discarded): the partial keeps it.
            terminal = attrs.evolve(terminal, partial=kept)
        if self.partials is not None:
            terminal = self.partials.finish(terminal)
        terminal = self.redactor.event(terminal)
        self.terminal = terminal
        if type(terminal) is Cancelled and self.consumer is not None:
            consumer = self.consumer()
            if consumer is not None:
                consumer.drop_batch()
        self.transform = None
        if self.live.get(self.request_id) is self:
            del self.live[self.request_id]
        self._deliver(([terminal], None, 0))
        if self.readers:  # a task reading beside: nothing more will come
            self.readers.unpark_all()
        if self.done_event is not None:
            self.done_event.set()


def partial_output(transform: StreamTransform | None) -> ConversationResponse | None:
    """What ``transform`` has accumulated, or ``None`` if nothing (no content, no usage)."""
    return None if transform is None else transform.partial()


class _EndWait:
    """What ends the consumer's wait for a batch when the wait is cancelled (trio's
    abort function): the request forgets its waiter. One per stream: a bound method
    made for each wait lived across it, one more object a token for the collector's
    young passes to walk and promote. Not the stream's own bound method either: that
    would be a reference cycle, and a dropped stream would wait for the collector to
    be cancelled."""

    __slots__ = ("_state",)

    def __init__(self, state: RequestState) -> None:
        self._state = state

    def __call__(self, raise_cancel: object) -> trio.lowlevel.Abort:
        self._state.waiter = None
        return trio.lowlevel.Abort.SUCCEEDED


class RequestStream:
    """The events of one submitted request.

    * ``async for event in stream`` yields every event and ends right after the terminal
      (``Completed``, ``Failed`` or ``Cancelled``), which is always last.
    * :meth:`cancel` cancels the request from any task, synchronously: the ``Cancelled``
      terminal is recorded before it returns (``stream.terminal``), and it is the next
      event the iterator yields (events not yet read are dropped; ``partial`` keeps what
      the attempt received).
    * ``async with stream:`` — leaving the block early cancels the request (so does
      :meth:`aclose`). Either returns only once the request is over: ``stream.terminal``
      is set, the sampler no longer counts it as active, its task has finished, and the
      iterator yields nothing more.
    * Dropping the stream without closing it cancels the request too (when the object is
      garbage collected), and so does a consumer that stops reading for longer than the
      request's ``Timeouts.total``.
    * ``await stream.result()`` reads what is left of the stream and returns a
      :class:`RequestResult`: its ``unwrap()`` gives the response, or raises
      :class:`SamplingError` / :class:`RequestCancelledError` carrying the partial output.
    """

    def __init__(self, state: RequestState, token: trio.lowlevel.TrioToken) -> None:
        self._state = state
        self._token = token
        self._batch: list[SamplingEvent] = []
        self._position = 0
        self._size = 0  # len(self._batch); 0 once dropped (a cancel)
        #: Nothing more will be received (the terminal was taken, or the stream closed).
        self._ended = False
        self._received_at: float | None = None
        self._abort = _EndWait(state)
        state.consumer = weakref.ref(self)

    @property
    def request_id(self) -> str:
        return self._state.request_id

    @property
    def terminal(self) -> TerminalEvent | None:
        """The terminal event, once the request has ended (``None`` before)."""
        return self._state.terminal

    def partial_output(self) -> Any:
        """The structured answer so far, read as JSON (a request with ``output=``; else
        ``None``): objects and arrays as they fill, strings as they grow, numbers once
        complete. Never re-parsed: reading it costs nothing. It is the live value, and
        may be ahead of the events read by the batches still buffered. The validated
        answer is the response's ``output_parsed``."""
        partials = self._state.partials
        return None if partials is None else partials.output()

    def partial_arguments(self, tool_index: int) -> Any:
        """Tool call ``tool_index``'s arguments so far, read as JSON (``None`` before its
        first value); see :meth:`partial_output`."""
        partials = self._state.partials
        return None if partials is None else partials.arguments(tool_index)

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel the request now; a no-op once it has ended."""
        self._state.cancel(reason)

    @property
    def received_at(self) -> float | None:
        """When the bytes of the network read that produced the event last yielded
        arrived (``trio.current_time()``): the kernel's receive timestamp with
        ``SamplerConfig.receive_timestamps`` on, else when the read returned. ``None``
        for events that come from no read (``Retrying``, ``ImagesStripped``, a
        terminal) and before the first event."""
        return self._received_at

    def __aiter__(self) -> AsyncIterator[SamplingEvent]:
        return self

    async def __anext__(self) -> SamplingEvent:
        # Per event: the next of the batch in hand (a cancel drops it: ``drop_batch``).
        position = self._position
        if position < self._size:
            self._position = position + 1
            return self._batch[position]
        state = self._state
        if self._ended:
            raise StopAsyncIteration
        if type(state.terminal) is Cancelled:
            return self._take_cancelled()
        try:
            # A batch already queued is taken without a schedule point (the request task
            # yields at every read anyway), but a cancelled consumer still stops here.
            # None queued: the consumer's task waits to be handed the next batch
            # (``RequestState.hand``), waited on here, not in a coroutine of its own
            # alive across the wait; a second task reading the stream at once waits
            # beside it. The terminal recorded and none queued: another task took it.
            queue = state.queue
            if queue:
                await trio.lowlevel.checkpoint_if_cancelled()
                batch, received_at, size = queue.popleft()
            elif state.terminal is not None:
                raise trio.EndOfChannel
            elif state.waiter is None:
                state.waiter = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort)
                batch, received_at, size = self._handed()
            else:
                batch, received_at, size = await self._beside()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended = True
            raise StopAsyncIteration from None
        state.read += 1
        if type(batch[-1]) in _TERMINALS:
            self._ended = True
            self._received_at = None
        else:
            self._received_at = received_at
            state.buffered_bytes -= state.taken_bytes
            state.taken_bytes = size
            state.give_credit()
            if type(state.terminal) is Cancelled:  # cancelled while this batch waited
                return self._take_cancelled()
        # A batch of one event is not kept: its list would live across the wait for the
        # next read, for nothing.
        self._size = size = len(batch)
        self._batch = batch if size > 1 else _NO_EVENTS
        self._position = 1
        return batch[0]

    def _handed(self) -> Entry:
        """The batch handed over while the consumer waited (its stream closed: none)."""
        state = self._state
        entry, state.handed = state.handed, None
        if entry is None:
            raise trio.ClosedResourceError
        return entry

    async def _beside(self) -> Entry:
        """The next batch queued, for a task reading this stream while another waits to
        be handed one: it waits until one is queued, or the stream ends."""
        state = self._state
        readers = state.readers
        if readers is None:
            readers = state.readers = trio.lowlevel.ParkingLot()
        while True:
            await readers.park()
            if self._ended:
                raise trio.ClosedResourceError
            if state.queue:
                return state.queue.popleft()
            if state.terminal is not None:
                raise trio.EndOfChannel

    def drop_batch(self) -> None:
        """The request was cancelled: the rest of the batch in hand is not yielded, the
        next event is the ``Cancelled``. (Told by the request's state rather than asked
        per event: the check was 9 of the iterator's 29 bytecode instructions an event,
        ``benchmarks/calls_per_request.py --bytecode``.)"""
        self._size = 0

    def _take_cancelled(self) -> SamplingEvent:
        terminal = self._state.terminal
        assert terminal is not None
        self._received_at = None
        self._end()
        return terminal

    def _end(self) -> None:
        self._ended = True
        self._batch = []
        self._size = 0
        self._position = 0
        state = self._state
        state.queue.clear()
        if state.waiter is not None:  # read by another task, waiting: it ends
            state.hand(None)

    async def result(self) -> RequestResult:
        """Read the rest of the stream; return how the request ended."""
        async for _ in self:
            pass
        await self._state.done.wait()
        assert self._state.terminal is not None
        return RequestResult(self._state.terminal)

    async def aclose(self) -> None:
        """Stop reading: cancels the request if it is still running, and returns once it
        has ended (``terminal`` is set, its task has finished)."""
        self._state.cancel("the consumer closed the stream")
        self._end()
        if not await self._wait_for_task():
            await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state.cancel("the consumer left the stream")
        self._end()
        await self._wait_for_task()

    async def _wait_for_task(self) -> bool:
        """Wait (shielded, bounded) for the request's task to finish; whether it waited.

        The terminal is already recorded (a cancel records it at once); what is left is
        the task unwinding and closing its connection, so the block the consumer leaves
        really is the end of the request: no task of it outlives the block."""
        state = self._state
        if state.task_finished:
            return False
        with trio.move_on_after(EXIT_WAIT_S, shield=True):
            await state.task_done.wait()
        return True

    def __del__(self) -> None:
        # Dropped without being closed: the consumer is gone, so cancel the request. A
        # finalizer can run anywhere, including inside Trio's scheduler, so it only asks
        # the run loop to do it (run_sync_soon is safe from signal handlers and threads).
        state = self._state
        if state.terminal is None:
            try:
                self._token.run_sync_soon(state.cancel, "the consumer dropped the stream")
            except trio.RunFinishedError:
                pass


async def _parse(
    partials: PartialOutputs, batch: list[SamplingEvent], holding: Holding
) -> list[SamplingEvent]:
    """``partials.batch(batch)``, the attempt's memory share told of what the parse has
    made at each of its stops (see ``RequestState.emit``). Its first slice waits too
    while the memory is short: it was not when the attempt read, but the memory may have
    stopped streams since (each of the others parsing its read's first slice)."""
    if holding.short:
        await holding.room()
    parse = partials.parse(batch)
    try:
        while True:
            next(parse)
            holding.report()  # the memory's error if this stream is the one stopped
            if holding.short:
                await holding.room()
    except StopIteration as end:
        out: list[SamplingEvent] = end.value
    return out
