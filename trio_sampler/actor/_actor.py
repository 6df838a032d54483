"""The SamplerActor: a task in the application's nursery that runs requests.

The actor owns a memory channel of commands (Submit, Cancel, UpdateConfig and two
queries). Each accepted Submit gets a cancel scope at once (so a Cancel that races the
request's start still wins) and a task in the actor's nursery that runs the request to
its one terminal event. Requests never raise into the actor: a request's failure touches
no other request.

Usage::

    async with open_sampler(config) as sampler:
        stream = await sampler.submit(request)
        async for event in stream:
            ...
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

import attrs
import httpx2
import trio

from ..admission import Admission, AdmissionGate
from ..client import SamplingClient
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy
from ..models import ModelCatalog
from ..types import ConversationRequest, ConversationResponse
from ._request_task import RequestRunner
from ._stream import RequestState, RequestStream, open_request_channel

__all__ = [
    "DuplicateRequestError",
    "SamplerClosedError",
    "SamplerHandle",
    "open_sampler",
]

#: Batches (network reads) a request may buffer before its HTTP read waits for the consumer.
DEFAULT_MAX_BUFFERED_BATCHES = 16


class SamplerClosedError(RuntimeError):
    """The sampler was shut down; no more requests can be submitted."""


class DuplicateRequestError(ValueError):
    """A request with this id is still running."""


# -- commands (private) ---------------------------------------------------------------


@attrs.define(eq=False)
class _Reply:
    event: trio.Event = attrs.field(factory=trio.Event)
    value: object = None

    def set(self, value: object) -> None:
        self.value = value
        self.event.set()


@attrs.frozen(eq=False)
class _Submit:
    request_id: str
    request: ConversationRequest
    config: SamplerConfig | None
    reply: _Reply


@attrs.frozen(eq=False)
class _Cancel:
    request_id: str
    reason: str


@attrs.frozen(eq=False)
class _UpdateConfig:
    config: SamplerConfig


@attrs.frozen(eq=False)
class _IsActive:
    request_id: str
    reply: _Reply


@attrs.frozen(eq=False)
class _ActiveCount:
    reply: _Reply


_Command = _Submit | _Cancel | _UpdateConfig | _IsActive | _ActiveCount


class _SamplerActor:
    def __init__(
        self,
        config: SamplerConfig,
        runner: RequestRunner,
        *,
        max_buffered_batches: int,
    ) -> None:
        self.config = config
        self.runner = runner
        self.max_buffered_batches = max_buffered_batches
        self.live: dict[str, RequestState] = {}
        self.closed = False
        self.loop_scope = trio.CancelScope()
        self.commands_send, self.commands_receive = trio.open_memory_channel[_Command](64)

    async def run(self, *, task_status: trio.TaskStatus[SamplerHandle]) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started(SamplerHandle(self))
            with self.loop_scope, self.commands_receive:
                async for command in self.commands_receive:
                    self.handle(command, nursery)
                    # Take whatever else is already queued in the same scheduling round: a
                    # burst of submits is handled at once, not one command per round.
                    while True:
                        try:
                            command = self.commands_receive.receive_nowait()
                        except trio.WouldBlock:
                            break
                        self.handle(command, nursery)
            # Leaving: every request still running ends with Cancelled; the nursery
            # waits for them (they finish within one scheduling round).
            for state in list(self.live.values()):
                state.cancel("the sampler was shut down")

    def handle(self, command: _Command, nursery: trio.Nursery) -> None:
        if isinstance(command, _Submit):
            self.submit(command, nursery)
        elif isinstance(command, _Cancel):
            state = self.live.get(command.request_id)
            if state is not None:
                state.cancel(command.reason)
        elif isinstance(command, _UpdateConfig):
            self.config = command.config
        elif isinstance(command, _IsActive):
            command.reply.set(command.request_id in self.live)
        else:
            command.reply.set(len(self.live))

    def submit(self, command: _Submit, nursery: trio.Nursery) -> None:
        if command.request_id in self.live:
            command.reply.set(
                DuplicateRequestError(
                    f"request id {command.request_id!r} is already running; use a unique id "
                    "per request (or omit it to get a generated one)"
                )
            )
            return
        send, receive, credits = open_request_channel(self.max_buffered_batches)
        state = RequestState(
            request_id=command.request_id,
            request=command.request,
            config=command.config or self.config,  # a snapshot: later updates don't apply
            scope=trio.CancelScope(),
            send=send,
            credits=credits,
            submitted_at=trio.current_time(),
        )
        self.live[state.request_id] = state
        command.reply.set(RequestStream(state, receive))
        nursery.start_soon(self.serve, state, name=f"trio_sampler request {state.request_id}")

    async def serve(self, state: RequestState) -> None:
        try:
            await self.runner.serve(state)
        finally:
            self.live.pop(state.request_id, None)

    def shutdown(self) -> None:
        """Synchronous: usable from a cancelled context (leaving ``open_sampler``)."""
        self.closed = True
        for state in list(self.live.values()):
            state.cancel("the sampler was shut down")
        self.loop_scope.cancel(reason="the sampler was shut down")


@attrs.frozen(eq=False)
class SamplerHandle:
    """The way in to a running sampler: cheap to copy, safe to use from any task.

    Every method sends a command to the actor task over a memory channel.
    """

    _actor: _SamplerActor

    async def _send(self, command: _Command) -> None:
        if self._actor.closed:
            raise SamplerClosedError("the sampler is shut down; open a new one to submit")
        try:
            await self._actor.commands_send.send(command)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise SamplerClosedError("the sampler is shut down; open a new one to submit") from None

    async def _ask(self, command: _Submit | _IsActive | _ActiveCount, reply: _Reply) -> object:
        await self._send(command)
        await reply.event.wait()
        return reply.value

    async def submit(
        self,
        request: ConversationRequest,
        *,
        config: SamplerConfig | None = None,
        request_id: str | None = None,
    ) -> RequestStream:
        """Start a request; returns its event stream at once (the request runs meanwhile).

        ``config`` overrides the sampler's configuration for this request only.
        Raises :class:`DuplicateRequestError` if ``request_id`` is still running, and
        :class:`SamplerClosedError` after shutdown.
        """
        reply = _Reply()
        request_id = request_id or f"req_{uuid.uuid4().hex[:16]}"
        result = await self._ask(_Submit(request_id, request, config, reply), reply)
        if isinstance(result, Exception):
            raise result
        assert isinstance(result, RequestStream)
        return result

    async def submit_and_collect(
        self, request: ConversationRequest, *, config: SamplerConfig | None = None
    ) -> ConversationResponse:
        """Run a request to its end and return the response.

        Raises :class:`SamplingError` (with the ``Failed`` info and partial output) or
        :class:`RequestCancelledError`. Cancelling the awaiting task cancels the request.
        """
        stream = await self.submit(request, config=config)
        async with stream:
            result = await stream.result()
        return result.unwrap()

    async def cancel(self, request_id: str, reason: str = "cancelled by the caller") -> None:
        """Cancel a request; a no-op if it has finished or is unknown."""
        await self._send(_Cancel(request_id, reason))

    async def update_config(self, config: SamplerConfig) -> None:
        """Replace the default configuration for later submits (in-flight ones keep theirs)."""
        await self._send(_UpdateConfig(config))

    async def is_active(self, request_id: str) -> bool:
        reply = _Reply()
        return bool(await self._ask(_IsActive(request_id, reply), reply))

    async def active_count(self) -> int:
        reply = _Reply()
        value = await self._ask(_ActiveCount(reply), reply)
        assert isinstance(value, int)
        return value


@asynccontextmanager
async def open_sampler(
    config: SamplerConfig,
    *,
    retry_policy: RetryPolicy | None = None,
    doom_loop: DoomLoopPolicy | None = None,
    max_concurrency: int | None = None,
    max_buffered_batches: int = DEFAULT_MAX_BUFFERED_BATCHES,
    transport: httpx2.AsyncBaseTransport | None = None,
    seed: int | None = None,
    models: ModelCatalog | None = None,
    admission: Admission | None = None,
) -> AsyncIterator[SamplerHandle]:
    """Run a sampler actor for the duration of the block.

    The actor starts in a nursery of its own (via ``nursery.start``, so it is ready when
    the block is entered). Leaving the block ends every in-flight request with
    ``Cancelled`` and waits for them.

    Args:
        config: the default configuration (see :class:`SamplerConfig`).
        retry_policy: overrides ``config.retry`` for every request.
        doom_loop: doom-loop detection and resampling (on by default).
        max_concurrency: at most this many requests talk to the server at once; the rest
            wait their turn (cancellable). ``None``: no limit.
        max_buffered_batches: network reads a request may buffer for a slow consumer.
        transport: an ``httpx2`` transport replacing the network (tests, the emulator's
            in-memory transport).
        seed: seeds the jitter so runs are reproducible.
        models: prices used to compute a response's cost when the server reports none
            (default: the shipped ``default_models.json``).
        admission: asked before every attempt and told after it (see
            :mod:`trio_sampler.admission`), e.g. limits shared by a fleet of processes
            (:class:`trio_sampler.fleet.FleetAdmission`); opened and closed with the sampler.
    """
    if max_buffered_batches < 1:
        raise ValueError("max_buffered_batches must be at least 1")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be at least 1 (or None for no limit)")
    rng = random.Random(seed)
    limiter = trio.CapacityLimiter(max_concurrency) if max_concurrency else None
    gate_context: AbstractAsyncContextManager[AdmissionGate | None] = (
        nullcontext() if admission is None else admission.open()
    )
    async with SamplingClient(config, transport=transport) as client, gate_context as gate:
        runner = RequestRunner(
            client,
            retry_policy,
            doom_loop or DoomLoopPolicy(),
            rng=rng,
            limiter=limiter,
            catalog=models if models is not None else ModelCatalog.load(),
            admission=gate,
        )
        actor = _SamplerActor(config, runner, max_buffered_batches=max_buffered_batches)
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            handle: SamplerHandle = await nursery.start(actor.run)
            try:
                yield handle
            except BaseException as exc:
                # Re-raised below, outside the nursery: the caller gets their own
                # exception back, not wrapped in an ExceptionGroup by our nursery. (A
                # Cancelled still surfaces at the nursery's exit, inside its scope.)
                body_error = exc
            finally:
                actor.shutdown()
        if body_error is not None:
            raise body_error
