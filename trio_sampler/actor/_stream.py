"""One request's event stream: the channel between its task and its consumer.

Design (trio-notes A.2, A.5):

* Events travel as **batches**, one channel message per network read, and the
  consumer-side iterator flattens them: a trio channel hop costs a few microseconds, a
  token event well under one, so the hop is paid per read, not per token.
* The channel's buffer is unbounded, but every data batch needs a **credit** from a
  semaphore that the consumer gives back as it reads. That bounds what a request buffers
  (``max_buffered_batches`` reads) and makes a slow consumer slow down the HTTP read.
* The terminal event needs no credit: it is handed over with ``send_nowait`` (which never
  blocks and is not a checkpoint, so it works from a cancelled context) and the send side
  is closed right after it. Consumers see end-of-stream right after the terminal.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING

import attrs
import outcome
import trio

from .._redact import Redactor
from ..types import (
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    SamplingError,
    SamplingEvent,
    TerminalEvent,
)

if TYPE_CHECKING:
    from ..config import SamplerConfig
    from ..wire import StreamTransform

__all__ = ["RequestCancelledError", "RequestStream"]

_TERMINALS = (Completed, Failed, Cancelled)


class RequestCancelledError(Exception):
    """The outcome of a request that ended in ``Cancelled``; ``partial`` keeps what arrived."""

    def __init__(self, request_id: str, reason: str, partial: ConversationResponse | None) -> None:
        super().__init__(f"request {request_id} was cancelled: {reason}")
        self.request_id = request_id
        self.reason = reason
        self.partial = partial


def terminal_outcome(terminal: TerminalEvent) -> outcome.Outcome[ConversationResponse]:
    """``Value(response)`` for ``Completed``, ``Error(...)`` for ``Failed``/``Cancelled``."""
    if isinstance(terminal, Completed):
        return outcome.Value(terminal.response)
    if isinstance(terminal, Failed):
        return outcome.Error(SamplingError(terminal.error, terminal.partial))
    return outcome.Error(
        RequestCancelledError(terminal.request_id, terminal.reason, terminal.partial)
    )


@attrs.define(eq=False)
class RequestState:
    """Bookkeeping the actor and the stream share for one request."""

    request_id: str
    request: ConversationRequest
    config: SamplerConfig
    #: Created when the Submit is accepted: a cancel that races the task's start still wins.
    scope: trio.CancelScope
    send: trio.MemorySendChannel[list[SamplingEvent]]
    credits: trio.Semaphore
    submitted_at: float
    #: Scrubs every event on its way to the consumer: the one place events leave the
    #: request, so the credentials of its config appear in none (``trio_sampler._redact``).
    redactor: Redactor = attrs.field(factory=Redactor)
    done: trio.Event = attrs.field(factory=trio.Event)
    terminal: TerminalEvent | None = None
    cancel_reason: str | None = None
    #: The transform of the attempt in progress (its accumulation is the partial output).
    transform: StreamTransform | None = None

    def cancel(self, reason: str) -> None:
        """Cancel the request (idempotent; the first reason is kept)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.scope.cancel(reason=reason)

    async def emit(self, batch: list[SamplingEvent]) -> None:
        """Send one batch of non-terminal events, waiting for buffer credit (backpressure)."""
        await self.credits.acquire()
        try:
            self.send.send_nowait(self.redactor.events(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The consumer closed its stream: that is a cancel (contract 3).
            self.credits.release()
            self.cancel("the consumer closed the stream")
            await trio.lowlevel.checkpoint()

    @trio.lowlevel.enable_ki_protection
    def finish(self, terminal: TerminalEvent) -> None:
        """Deliver the terminal and close the stream. Synchronous: never awaits, so it
        works from a cancelled context; called exactly once per request."""
        terminal = self.redactor.event(terminal)
        self.terminal = terminal
        self.transform = None
        with self.send:
            try:
                self.send.send_nowait([terminal])
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                pass  # the consumer is gone; ``result()`` still reads ``terminal``
        self.done.set()


def open_request_channel(
    max_buffered_batches: int,
) -> tuple[
    trio.MemorySendChannel[list[SamplingEvent]],
    trio.MemoryReceiveChannel[list[SamplingEvent]],
    trio.Semaphore,
]:
    send, receive = trio.open_memory_channel[list[SamplingEvent]](math.inf)
    return send, receive, trio.Semaphore(max_buffered_batches)


class RequestStream:
    """The events of one submitted request.

    * ``async for event in stream`` yields every event and ends right after the terminal
      (``Completed``, ``Failed`` or ``Cancelled``), which is always last.
    * ``async with stream:`` — leaving the block early cancels the request (so does
      :meth:`aclose`); the request still ends with its ``Cancelled`` terminal.
    * ``await stream.result()`` reads what is left of the stream and returns an
      :class:`outcome.Outcome`: ``Value(response)``, or ``Error(SamplingError)`` /
      ``Error(RequestCancelledError)`` carrying the partial output.
    * :meth:`cancel` cancels the request from any task, synchronously.
    """

    def __init__(
        self,
        state: RequestState,
        receive: trio.MemoryReceiveChannel[list[SamplingEvent]],
    ) -> None:
        self._state = state
        self._receive = receive
        self._batch: list[SamplingEvent] = []
        self._position = 0
        self._ended = False

    @property
    def request_id(self) -> str:
        return self._state.request_id

    @property
    def terminal(self) -> TerminalEvent | None:
        """The terminal event, once the request has ended (``None`` before)."""
        return self._state.terminal

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel the request; a no-op once it has ended."""
        if self._state.terminal is None:
            self._state.cancel(reason)

    def __aiter__(self) -> AsyncIterator[SamplingEvent]:
        return self

    async def __anext__(self) -> SamplingEvent:
        if self._position < len(self._batch):
            event = self._batch[self._position]
            self._position += 1
            return event
        if self._ended:
            raise StopAsyncIteration
        try:
            batch = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended = True
            raise StopAsyncIteration from None
        if not isinstance(batch[-1], _TERMINALS):
            self._state.credits.release()
        self._batch = batch
        self._position = 1
        return batch[0]

    async def result(self) -> outcome.Outcome[ConversationResponse]:
        """Read the rest of the stream; return the request's outcome."""
        async for _ in self:
            pass
        await self._state.done.wait()
        assert self._state.terminal is not None
        return terminal_outcome(self._state.terminal)

    async def aclose(self) -> None:
        """Stop reading: cancels the request if it is still running."""
        self.cancel("the consumer closed the stream")
        self._ended = True
        self._receive.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: this runs in cancelled contexts too.
        if self._state.terminal is None:
            self._state.cancel("the consumer left the stream")
        self._ended = True
        self._receive.close()
