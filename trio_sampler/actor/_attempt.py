"""One attempt: open the body, read it within its deadline, feed the transform, return
an :class:`AttemptResult`.

Everything that can fail is caught here and becomes data (a
:class:`~trio_sampler.types.SamplingErrorInfo` in the result). An attempt knows nothing of
routes, admission, pacing or budgets: what it tells about the wire goes to an
:class:`AttemptObserver` (the gates' ticket), and its events go to an
:class:`AttemptSink` (the request, or a lane of a race).

Timers are deadlines on the body read, not watchdog tasks: before the first content
event the deadline is ``first_token`` after the headers; after it, ``idle`` after the last
content event (pings and SSE comments produce no content events, so they do not keep a
dead stream alive). Connect and response-header timeouts live in the client.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Final, Protocol

import attrs
import trio

from .._by_identity import ByIdentity
from ..client import ResponseStream, SamplingClient, SamplingClientError
from ..config import SamplerConfig, Timeouts
from ..doom_loop import DoomLoopPolicy, TailRepetitionDetector, parse_trigger
from ..types import (
    ApiBackend,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    RateLimitSnapshot,
    Resumed,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    StreamStarted,
)
from ..wire import (
    BuildOptions,
    PartialOutputs,
    SSEDecodeError,
    StreamDecoder,
    StreamTransform,
    WireRequest,
    build_request,
    new_transform,
    stream_decoder,
)
from ..wire._replay import decode_failure
from ..wire.errors import provider_request_id
from ..wire.responses import ResponsesTransform
from ._memory import Holding
from ._metrics import AttemptMetrics
from ._plan import ResumePoint
from ._stream import CONTENT_EVENTS as _CONTENT

__all__ = [
    "AttemptObserver",
    "AttemptResult",
    "AttemptSink",
    "Attempts",
    "ConnectionDrains",
    "error_info",
]

_log = logging.getLogger("trio_sampler.actor")
_REASONING = SamplingChannel.REASONING
#: Until an attempt's first content event, a read is parsed this much at a time, and the
#: events up to the slice that holds the first content are handed to the consumer before
#: the rest is parsed: one read often holds a whole short answer (hundreds of events),
#: and the first token should not wait for all of them (time to first token). Feeding
#: the SSE decoder a read in pieces yields the same events as feeding it whole.
_FIRST_SLICE_BYTES = 1024
# After a completed stream, read at most this much more to reuse the connection.
_DRAIN_MAX_BYTES = 64 * 1024
_DRAIN_MAX_SECONDS = 1.0


def error_info(
    kind: SamplingErrorKind, message: str, *, retryable: bool, code: str
) -> SamplingErrorInfo:
    return SamplingErrorInfo(kind=kind, message=message, retryable=retryable, error_code=code)


@attrs.define
class AttemptResult:
    """How one attempt ended: a response, or an error with what had arrived."""

    response: ConversationResponse | None = None
    error: SamplingErrorInfo | None = None
    partial: ConversationResponse | None = None
    #: Content events were forwarded to the consumer (a retry must discard them).
    emitted_output: bool = False
    doom_triggers: tuple[str, ...] = ()
    #: The stream was cut where it can be read on from (Responses background mode).
    resume: ResumePoint | None = None
    #: A resumed read the server refused (it no longer has the response).
    resume_refused: bool = False

    @property
    def output(self) -> ConversationResponse | None:
        """What the attempt produced: its response, else its partial output."""
        return self.response if self.response is not None else self.partial


class AttemptSink(Protocol):
    """Where one attempt sends its events: the request itself, or a lane of a race."""

    request_id: str
    submitted_at: float
    transform: StreamTransform | None

    @property
    def last_partial(self) -> ConversationResponse | None:
        """The partial output kept from the request's last failed attempt (counted in the
        sampler's memory account while this attempt runs)."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the events sent and not yet taken by the consumer (counted in the
        sampler's memory account)."""

    @property
    def emit_may_wait(self) -> bool:
        """Whether :meth:`emit` may wait for the consumer (no credit left for it)."""

    @property
    def emit_is_quick(self) -> bool:
        """Whether :meth:`emit`, with credit left, hands the batch on with no schedule
        point at all (the attempt's read deadline may lag through it: ``_Body``)."""

    @property
    def partials(self) -> PartialOutputs | None:
        """The request's tool arguments and structured answer as parsed so far (``None``
        for a request with neither): their values grow with what the server sends, and
        the sampler's memory account counts them (``buffered_bytes``)."""

    async def emit(
        self,
        batch: list[SamplingEvent],
        received_at: float | None = None,
        holding: Holding | None = None,
    ) -> None:
        """Hand on ``batch``, produced by a read whose bytes arrived at ``received_at``;
        ``holding``: the attempt's memory share, to look at while the batch's tool
        arguments or answer are parsed (``RequestState.emit``)."""

    async def hand_over(self) -> None:
        """Let the consumer take what was sent before the rest of the read is parsed."""

    def partial(self) -> ConversationResponse | None: ...


class AttemptObserver(Protocol):
    """Told what the wire says of an attempt (the gates' hold: its memory share, pacer
    and admission)."""

    def share(self, transform: StreamTransform) -> Holding | None:
        """The attempt's share of the sampler's memory account, counting what
        ``transform`` holds (``None``: no account); the gates give it back."""

    def sending(self) -> None:
        """The request is about to be sent."""

    def headers(self, snapshot: RateLimitSnapshot | None) -> None:
        """The response headers arrived, with their rate-limit report."""

    def failed(self, error: SamplingErrorInfo) -> None:
        """The client failed the attempt (a 429's report is in ``error``)."""


class ConnectionDrains:
    """Reads the end of completed responses in the background, for connection reuse.

    A stream's terminator is usually followed by a few bytes (the last chunk of a chunked
    body) before the connection can go back to the pool. Reading them is not the
    request's business: its ``Completed`` is delivered as soon as the terminator is
    parsed, and the drain runs afterwards in a task of the sampler's nursery, off the
    request's clock and outside its cancel scope, bounded to ``_DRAIN_MAX_BYTES`` and
    ``_DRAIN_MAX_SECONDS`` (after that the connection is closed). :meth:`close` (the
    sampler shutting down) cancels every drain: their connections are closed at once.
    """

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._scopes: set[trio.CancelScope] = set()
        self._closed = False

    def open(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def start(self, stream: ResponseStream) -> None:
        """Take ``stream`` over and drain it in the background. Without a nursery (or once
        closed) the stream is left to its ``open_stream`` block, which closes it."""
        if self._nursery is None or self._closed:
            return
        self._nursery.start_soon(self._drain, stream.detach(), name="trio_sampler connection drain")

    async def _drain(self, stream: ResponseStream) -> None:
        try:
            # One scope: the drain's time bound, and what ``close`` cancels.
            with trio.CancelScope(relative_deadline=_DRAIN_MAX_SECONDS) as scope:
                if self._closed:
                    scope.cancel()
                self._scopes.add(scope)
                try:
                    await stream.drain(max_bytes=_DRAIN_MAX_BYTES)
                finally:
                    self._scopes.discard(scope)
        finally:
            await stream.aclose()

    def close(self) -> None:
        """Cancel every drain (their connections are closed); start no more."""
        self._closed = True
        for scope in self._scopes:
            scope.cancel()


#: What a read costs the process, in reads: the five copies it passes through (the
#: socket's read, the HTTP parser's buffer and the slice it hands on, the transport's
#: copy, the SSE decoder's events cut from it), and the free memory the allocator keeps
#: between such short-lived blocks, about three reads more (``benchmarks/memory_cap.py``:
#: with five, 20 endless streams grew the process by up to 1.15 times the sampler's cap).
_READ_COPIES = 8


class _Reads:
    """What an attempt's connection holds for its reads, as the memory account counts
    it: :data:`_READ_COPIES` times the longest read (a passing buffer: see
    :mod:`._memory`).
    (Its own object: counting the body itself would tie the body, and with it the
    attempt's text, in a reference cycle through the account.)"""

    __slots__ = ("longest",)

    def __init__(self) -> None:
        self.longest = 0

    @property
    def buffered_bytes(self) -> int:
        return _READ_COPIES * self.longest


class _Body:
    """The body read by read, turned into the transform's events.

    Behind :meth:`events`: the read's deadline, the sampler's memory share (reported
    before each read, allowed to stop it), and first-token slicing (until the first
    content, a read is parsed ``_FIRST_SLICE_BYTES`` at a time; the rest waits in
    ``pending``).

    The scope's deadline lags: content moves the read timer's :attr:`deadline` (a
    float), not the scope's, which stays earlier (never later) while the loop waits on
    the socket. When the earlier one fires, that wait (which can be made again) ends,
    the scope with it, and :meth:`lagged` makes a new scope with the timer's deadline for
    the loop to read on in: one new scope per ``idle`` seconds where moving the scope's
    deadline at each content read cost about 17,000 machine instructions a token
    (trio's deadline bookkeeping; ``benchmarks/bench_per_token.py --instructions``).
    Wherever else the loop may yield (the iterator's reads, :meth:`room`, an ``emit``
    that is not quick, the hand-over), the scope's deadline is made the timer's first
    (:meth:`settle`): a cancel there could not be taken back."""

    #: The scope of the attempt's reads (see :meth:`start_timer`, :meth:`_read`).
    scope: trio.CancelScope

    def __init__(
        self,
        stream: ResponseStream,
        transform: StreamTransform,
        config: SamplerConfig,
        holding: Holding | None,
    ) -> None:
        self.stream = stream
        self.chunks: AsyncIterator[bytes] = stream.__aiter__()
        #: Reads the loop makes itself where the transport offers them: ``stream.take`` a
        #: read, and while it says ``b""`` wait for ``fileno`` and take again; ``None``:
        #: read ``chunks`` (the body's end, or no such reads). What it buys: a waiting
        #: read is trio's wait alone, not a coroutine per transport layer made each read
        #: and alive until the next token (the collector walked them;
        #: ``docs/benchmarks.md``).
        stream.socket_reads()
        self.fileno = stream.fileno
        self.transform = transform
        self._decoder = stream_decoder(config.stream_media_type, config.max_sse_event_bytes)
        self._timeouts = config.timeouts
        #: The attempt's share of the memory account (``None``: no account); it may cancel
        #: :attr:`scope`, the reads' and the parse's (``RequestState.emit``).
        self.holding = holding
        self._reads = _Reads()
        if holding is not None:  # these grow with server input too
            holding.count(self._decoder)
            holding.count(self._reads, passing=True)
        #: Content has been produced (reads are parsed whole from then on).
        self.emitted = False
        #: The part of a read not parsed yet.
        self.pending = b""
        #: The body's end was read.
        self.ended = False
        #: The read timer: its length, and when it fires (a cut near it is a stall).
        self.timer, self.deadline = 0.0, math.inf
        #: The server keeps the response (background mode): a silent stream is cut
        #: (and resumed) rather than failed.
        self.resumable = False
        #: The read that ended the stream held its first content.
        self.first_content_at_end = False

    def start_timer(self, timer: float, since: float) -> None:
        """Start the read timer (``timer`` seconds from ``since``) and make the scope of
        the attempt's reads (:attr:`scope`, entered by the read loop) with its deadline.
        Made with it rather than given it at the first read: a deadline set on a scope
        not entered yet is a field, where setting one on the entered scope moved the
        run's registered deadlines again (about 7,000 machine instructions a request,
        ``benchmarks/instructions_per_request.py``)."""
        self.timer, self.deadline = timer, since + timer
        self.scope = trio.CancelScope(deadline=self.deadline)

    def received_at(self, now: float) -> float:
        """When the last read's bytes arrived (``now`` where the reads do not say)."""
        received = self.stream.received_at
        return now if received is None else received

    def read_due(self) -> bool:
        """Before a read: the memory account's report (its stop cancels the read, in the
        attempt's scope); whether the read timer still runs (``False``: it passed while
        ``emit`` waited, see :meth:`late_read`).

        A read is made within the read timer, in the attempt's scope (:attr:`scope`,
        entered by the read loop), whose deadline is the timer's. The deadline stays
        between reads (it moves with the timer when content restarts it), except while
        ``emit`` waits for credit (:meth:`before_emit`): the timer does not fire during a
        wait for the consumer (a scope per read did not cover it either). One scope per
        attempt whose deadline moves, not a scope per read: entering and leaving a scope
        costs about three deadline moves, and makes a scope and its cancel status that
        live across the wait (the collector's share); the read is awaited by the read
        loop itself, not in a coroutine of its own, for the same reason.
        Measured with ``benchmarks/bench_per_token.py`` (``docs/benchmarks-actor.md``)."""
        if self.holding is not None:
            self.holding.reading(self.scope)
        return self.scope.deadline <= self.deadline or self._rearm()

    @property
    def short(self) -> bool:
        """The memory is short: streams it stopped have not ended yet (:meth:`room`)."""
        holding = self.holding
        return holding is not None and holding.short

    async def room(self) -> None:
        """Wait until the streams the memory stopped have ended (after :attr:`short`)."""
        assert self.holding is not None
        self.settle()
        await self.holding.room()

    def events(self, read: bytes | None) -> list[SamplingEvent]:
        """The events of ``read`` (``None``: the body's end), after :meth:`read_due`."""
        if self.holding is not None:
            self.holding.read_done()
        if read is None:
            return self._end()
        self._reads.longest = max(self._reads.longest, len(read))
        return self._parse(read)

    def pending_events(self) -> list[SamplingEvent]:
        """The events of the rest of the last read (first-token slicing)."""
        chunk, self.pending = self.pending, b""
        return self._parse(chunk)

    def _parse(self, chunk: bytes) -> list[SamplingEvent]:
        if self.emitted:
            return _feed(self.transform, self._decoder, chunk)
        events, self.pending = _feed_to_content(self.transform, self._decoder, chunk)
        return events

    def _end(self) -> list[SamplingEvent]:
        """The events of the body's end (the decoder's last event, the transform's)."""
        self.ended = True
        events = self.transform.feed_payloads(self._decoder.close_payloads())
        events.extend(self.transform.close())
        return events

    def _rearm(self) -> bool:
        """Set the timer's deadline again after :meth:`before_emit` lifted it; ``False``: it passed
        while ``emit`` waited (the scope would be cancelled for good)."""
        if self.deadline <= trio.current_time():
            return False
        self.scope.deadline = self.deadline
        return True

    async def late_read(self) -> bytes | None:
        """A read whose timer ran out while ``emit`` waited for the consumer, as a scope
        per read made it: it fails at its first schedule point, and what is already
        buffered (a read that does not wait) is taken."""
        with trio.move_on_at(self.deadline):
            try:
                return await self.chunks.__anext__()
            except StopAsyncIteration:
                return None
        self.scope.cancel()  # the timer fired: the attempt's scope ends the read loop
        await trio.lowlevel.checkpoint()
        raise AssertionError("unreachable: the attempt's scope was cancelled")

    def before_emit(self, waits: bool, quick: bool) -> None:
        """Before ``emit``: if it ``waits`` for credit (the consumer is behind), the
        timer is lifted until the next read (:meth:`read_due` re-arms it); else the
        scope's deadline is no later than the timer's, and the timer's itself unless the
        ``emit`` is ``quick`` (no schedule point: the deadline may lag through it).

        Content moves only :attr:`deadline` (``_take``); the scope's follows here only
        where it must: when it lies later (the first content, a lifted timer) or the emit
        may yield. Each move is about 17,000 machine instructions of trio's bookkeeping."""
        scope = self.scope
        if waits:
            scope.deadline = math.inf
        elif scope.deadline > self.deadline or not quick:
            self.settle()

    def settle(self) -> None:
        """The scope's deadline is the timer's (see the class's note on the lag)."""
        if self.scope.deadline != self.deadline:
            self.scope.deadline = self.deadline

    def lagged(self) -> bool:
        """After the reads' scope ended: whether its deadline lagged the timer's (it
        fired before the timer ran out, and the memory did not stop the reads); then a
        new scope with the timer's deadline, for the loop to read on in."""
        scope = self.scope
        if not scope.cancelled_caught or scope.deadline >= self.deadline:
            return False
        if self.holding is not None and self.holding.stopped:
            return False
        if self.deadline <= trio.current_time():
            return False
        self.scope = trio.CancelScope(deadline=self.deadline)
        return True

    def timed_out(self) -> list[SamplingEvent]:
        """The events of a read the scope stopped: the memory's stop raises its error; the
        read timer fails the transform (a background stream is cut, to be read on)."""
        if self.holding is not None:
            self.holding.check()
        error = _timeout_error(self.emitted, self._timeouts)
        if self.resumable:  # the server keeps the response: a cut, read on later
            raise SamplingClientError(error)
        return self.transform.abort(error)


class _DoomWatch:
    """The local doom-loop detector over an attempt's reasoning text. Disarmed attempts
    run it too: an accepted response carries its trigger."""

    def __init__(self, policy: DoomLoopPolicy, armed: bool) -> None:
        self._policy = policy
        self._detector = TailRepetitionDetector(policy)
        self._armed = armed
        self.triggers: tuple[str, ...] = ()

    def abort_for(
        self, reasoning: str, transform: StreamTransform, done: bool
    ) -> SamplingErrorInfo | None:
        """Why the attempt must stop now (``None``: it goes on): its reasoning repeats
        itself, or the server reported a doom loop the policy trusts (acted on when it
        arrives, not at the end of the stream). A read that ended the stream is judged
        with the response: nothing is left to abort."""
        if reasoning and self.abort(reasoning, done):
            return _DOOM_ERROR
        signals = transform.acc.doom_loop_signals
        if done or not self._armed or not signals:
            return None
        confident = [s for s in signals if self._policy.is_confident(parse_trigger(s))]
        if not confident:
            return None
        return error_info(
            SamplingErrorKind.DOOM_LOOP_DETECTED,
            f"the server detected a doom loop ({', '.join(confident)})",
            retryable=True,
            code="doom_loop",
        )

    def abort(self, reasoning: str, done: bool) -> bool:
        """Feed ``reasoning``; whether the attempt must stop now. A trigger in the read
        that also ended the stream is judged with the response: nothing is left to abort."""
        trigger = self._detector.feed(reasoning)
        if trigger is None:
            return False
        self.triggers = (trigger,)
        return self._armed and not done


_DOOM_ERROR: Final = error_info(
    SamplingErrorKind.DOOM_LOOP_DETECTED,
    "the reasoning is repeating itself; resampling",
    retryable=True,
    code="doom_loop",
)


class Attempts:
    """Runs attempts for one sampler: its client, doom-loop policy and drains."""

    def __init__(
        self,
        client: SamplingClient,
        doom: DoomLoopPolicy,
        drains: ConnectionDrains,
    ) -> None:
        self._client = client
        self._doom = doom
        self._drains = drains
        #: Per config: the options its requests are built with.
        self._build_options: ByIdentity[BuildOptions] = ByIdentity()

    @property
    def client(self) -> SamplingClient:
        return self._client

    def wire(
        self, request: ConversationRequest, config: SamplerConfig, armed: bool
    ) -> WireRequest | SamplingErrorInfo:
        """The attempt's body, or why the backend cannot carry the request."""
        options = self._build_options.get(config)
        if options is None:  # made once per config (a few per sampler; bounded)
            options = self._build_options.put(config, config.build_options())
        try:
            wire = build_request(config.backend, request, options)
        except ValueError as exc:  # a request the backend cannot carry (anything else: ours)
            return error_info(
                SamplingErrorKind.INVALID_REQUEST, str(exc), retryable=False, code="invalid_request"
            )
        doom_header = config.profile.doom_loop_header if config.profile is not None else None
        if armed and doom_header and config.backend is ApiBackend.RESPONSES:
            wire = attrs.evolve(
                wire, headers=(*wire.headers, (doom_header, str(self._doom.window_tokens)))
            )
        return wire

    async def run(
        self,
        sink: AttemptSink,
        wire: WireRequest,
        config: SamplerConfig,
        metrics: AttemptMetrics,
        observer: AttemptObserver | None,
        *,
        armed: bool,
        resume: ResumePoint | None = None,
    ) -> AttemptResult:
        """Send ``wire``, stream its answer to ``sink``, and say how it ended. ``resume``:
        ``wire`` reads a cut stream on (:meth:`resume_wire`), into the sink's transform.
        A background attempt cancelled midway is cancelled on the server too."""
        if resume is not None and sink.transform is not None:
            transform = sink.transform
        else:
            transform = new_transform(config.backend, sink.request_id, provider=config.provider)
            # One stream holds at most what it may read; all of them together, the
            # sampler's memory account (the gates' share, ``AttemptObserver.share``).
            transform.max_held_bytes = config.max_response_bytes
        background = resume is not None or wire.data.get("background") is True
        try:
            return await self._run(sink, wire, transform, config, metrics, observer, armed, resume)
        except trio.Cancelled:
            if background:  # the server would go on generating it
                base = wire if resume is None else _base_wire(wire, resume)
                await self.cancel_remote(base, transform, config)
            raise

    async def _run(
        self,
        sink: AttemptSink,
        wire: WireRequest,
        transform: StreamTransform,
        config: SamplerConfig,
        metrics: AttemptMetrics,
        observer: AttemptObserver | None,
        armed: bool,
        resume: ResumePoint | None,
    ) -> AttemptResult:
        background = resume is not None or wire.data.get("background") is True
        holding = None if observer is None else observer.share(transform)
        sink.transform = metrics.transform = transform
        metrics.prompt_estimate = math.ceil(len(wire.body) / 4)
        if observer is not None:
            observer.sending()
        metrics.sent = True
        body: _Body | None = None
        watch = _DoomWatch(self._doom, armed) if self._doom.enabled else None
        try:
            async with self._client.open_stream(wire, config=config) as stream:
                body = _Body(stream, transform, config, holding)
                body.emitted = resume is not None and resume.emitted
                body.resumable = background
                headers_at = await self._start(sink, body, metrics, observer, resume)
                await self._read(sink, body, config, metrics, watch, headers_at)
        except SamplingClientError as exc:
            metrics.rate_limit = exc.info.rate_limit_snapshot or metrics.rate_limit
            metrics.provider_request_id = (
                exc.info.provider_request_id or metrics.provider_request_id
            )
            if observer is not None:
                observer.failed(exc.info)
            if body is None:
                return _refused(exc.info, sink.partial(), resume)
            error = _stall_close(exc.info, body.timer, body.deadline)
            point = _resume_point(transform, body.emitted, error) if background else None
            return AttemptResult(
                error=error, partial=sink.partial(), emitted_output=body.emitted, resume=point
            )
        triggers = () if watch is None else watch.triggers
        result = self._judge(transform.outcome, body.emitted, armed, triggers)
        if result.error is not None:
            result.error = _stall_close(result.error, body.timer, body.deadline)
        return result

    @staticmethod
    def resume_wire(wire: WireRequest, point: ResumePoint) -> WireRequest:
        """The read of a cut stream from ``point`` on: ``GET {path}/{id}?stream=true&
        starting_after=N`` with ``wire``'s headers (through the same client and seam)."""
        return attrs.evolve(
            wire,
            path=f"{wire.path}/{point.response_id}",
            body=b"",
            data={},
            method="GET",
            query=(("stream", "true"), ("starting_after", str(point.after_sequence))),
        )

    async def cancel_remote(
        self, wire: WireRequest, transform: StreamTransform | None, config: SamplerConfig
    ) -> None:
        """Cancel a background response on the server (``POST {path}/{id}/cancel``), once
        the request was cancelled: best effort, shielded from the cancel that got here,
        bounded by :data:`REMOTE_CANCEL_S`. Nothing to do before the response's id came."""
        if not isinstance(transform, ResponsesTransform) or not transform.acc.response_id:
            return
        cancel = attrs.evolve(
            wire, path=f"{wire.path}/{transform.acc.response_id}/cancel", body=b"", data={}
        )
        with trio.CancelScope(shield=True, deadline=trio.current_time() + REMOTE_CANCEL_S):
            try:
                await self._client.post_json(cancel, config=config)
            except SamplingClientError as exc:  # best effort: the server may be gone
                _log.debug("cancelling %s on the server failed: %s", cancel.path, exc.info)

    async def _start(
        self,
        sink: AttemptSink,
        body: _Body,
        metrics: AttemptMetrics,
        observer: AttemptObserver | None,
        resume: ResumePoint | None,
    ) -> float:
        """The response headers: the stream's first events (a resumed read's:
        ``Resumed``), the rate-limit report. Returns when they were read (the
        first-token deadline counts from it)."""
        stream = body.stream
        now = trio.current_time()
        metrics.request_sent_at = stream.request_sent_at
        metrics.provider_request_id = provider_request_id(stream.header_fields)
        # The metrics' times are the bytes' arrival where the reads say it.
        metrics.headers_at = body.received_at(now)
        if resume is not None:
            cut = resume.cut
            resumed = Resumed(
                sink.request_id,
                resume.response_id,
                resume.after_sequence,
                metrics.number,
                cut.kind,
                cut.message,
            )
            await sink.emit([resumed], metrics.headers_at)
            return now
        started = body.transform.start(
            stream.header_fields, attempt=metrics.number, now=time.time()
        )
        if started and isinstance(started[0], StreamStarted):
            metrics.rate_limit = started[0].rate_limit
            if observer is not None:
                observer.headers(started[0].rate_limit)
        await sink.emit(started, metrics.headers_at)
        return now

    async def _read(
        self,
        sink: AttemptSink,
        body: _Body,
        config: SamplerConfig,
        metrics: AttemptMetrics,
        watch: _DoomWatch | None,
        headers_at: float,
    ) -> None:
        """The read loop: events on to the sink until the transform ends. The reads run
        in the attempt's scope (``body.scope``, made again when its lagging deadline
        fired early: ``_Body.lagged``): when the read timer (or the memory) stops one,
        the loop ends there, and the failure is forwarded after it."""
        transform = body.transform
        timeouts = config.timeouts
        body.start_timer(timeouts.first_token, headers_at)
        # ``stream.take`` called as a method, not kept bound: a bound method alive across
        # every wait is one more object the collector walks (``objects_per_stream.py``).
        chunks, stream, fileno, quick = body.chunks, body.stream, body.fileno, sink.emit_is_quick
        wait_readable = trio.lowlevel.wait_readable
        while True:
            with body.scope:
                while not transform.finished:
                    if body.pending:
                        events = body.pending_events()
                    else:
                        read: bytes | None
                        due = body.read_due()
                        if body.short:  # the streams the memory stopped have not ended
                            await body.room()
                        if due:
                            read = stream.take(False)
                            while read == b"":  # nothing yet: wait (the deadline may lag)
                                await wait_readable(fileno)
                                read = stream.take(True)
                            if read is None:  # the end, or no socket reads: the iterator's
                                body.settle()
                                try:
                                    read = await chunks.__anext__()
                                except StopAsyncIteration:
                                    read = None
                        else:
                            read = await body.late_read()
                        if body.short:  # stopped during the read: parsed once they ended
                            await body.room()
                        events = body.events(read)
                    batch, at, done, content = _take(events, body, timeouts, metrics, watch)
                    if batch:
                        body.before_emit(sink.emit_may_wait, quick)
                        await sink.emit(batch, at, body.holding)
                    if done:
                        break
                    if content and body.pending:
                        body.settle()
                        await sink.hand_over()
                    # The batch is the consumer's now: not held by this frame across the
                    # next read's wait, where the collector's young passes would walk it
                    # and promote it (at C = 1,000, a list and its events a stream).
                    del events, batch
            if transform.finished or not body.lagged():  # else read on in a new scope
                break
        await self._after_reads(sink, body, timeouts, metrics, watch)

    async def _after_reads(
        self,
        sink: AttemptSink,
        body: _Body,
        timeouts: Timeouts,
        metrics: AttemptMetrics,
        watch: _DoomWatch | None,
    ) -> None:
        """After the read loop: the failure of a read the scope stopped (the read timer
        or the memory) on to the sink, and a completed stream's body end read."""
        if body.scope.cancelled_caught:
            batch, at, _, _ = _take(body.timed_out(), body, timeouts, metrics, watch)
            if batch:
                await sink.emit(batch, at)
        if not body.ended and isinstance(body.transform.outcome, Completed):
            await self._finish_body(sink, body.stream, body.first_content_at_end)

    async def _finish_body(
        self, sink: AttemptSink, stream: ResponseStream, first_content_at_end: bool
    ) -> None:
        """The end of a completed stream's body, read for connection reuse: here when it
        has arrived already (reading it waits for nothing, and the connection is back in
        the pool before the terminal is delivered), otherwise in the background
        (:class:`ConnectionDrains`: the terminal never waits for a server's last chunk).
        A first token sent in the same read is handed over before the reading."""
        if not stream.end_received():
            self._drains.start(stream)
            return
        if first_content_at_end:
            await sink.hand_over()
        await stream.drain(max_bytes=_DRAIN_MAX_BYTES)

    def _judge(
        self,
        end: Completed | Failed | None,
        emitted: bool,
        armed: bool,
        triggers: tuple[str, ...],
    ) -> AttemptResult:
        """Turn the transform's terminal into the attempt's result (empty, doom checks).

        ``triggers`` are the local detector's: on an armed attempt they resample like a
        confident server signal, and an accepted response carries them beside the
        server's in ``doom_loop_signals``."""
        if isinstance(end, Failed):
            return AttemptResult(
                error=end.error, partial=end.partial, emitted_output=emitted, doom_triggers=triggers
            )
        assert isinstance(end, Completed)
        response = end.response
        confident: tuple[str, ...] = ()
        local: tuple[str, ...] = ()
        if response.doom_loop_signals or triggers:  # the usual response has neither
            confident = tuple(
                s for s in response.doom_loop_signals if self._doom.is_confident(parse_trigger(s))
            )
            local = tuple(t for t in triggers if t not in response.doom_loop_signals)
        if local:
            response = attrs.evolve(
                response, doom_loop_signals=(*response.doom_loop_signals, *local)
            )
        if armed and (confident or triggers):
            reason = (
                f"the server detected a doom loop ({', '.join(confident)})"
                if confident
                else "the reasoning is repeating itself; resampling"
            )
            error = error_info(
                SamplingErrorKind.DOOM_LOOP_DETECTED, reason, retryable=True, code="doom_loop"
            )
            return AttemptResult(
                error=error,
                partial=response,
                emitted_output=emitted,
                doom_triggers=(*confident, *local),
            )
        if response.is_empty and response.stop_reason not in _MAY_BE_EMPTY:
            return AttemptResult(error=_EMPTY, partial=response, emitted_output=emitted)
        return AttemptResult(response=response, emitted_output=emitted)


def _base_wire(wire: WireRequest, resume: ResumePoint) -> WireRequest:
    """The request a resumed read (``{path}/{id}``) reads on."""
    return attrs.evolve(wire, path=wire.path.removesuffix(f"/{resume.response_id}"))


#: How long cancelling a background response on the server may take, at most.
REMOTE_CANCEL_S: Final = 2.0
_CUTS: Final = frozenset({SamplingErrorKind.TRANSPORT, SamplingErrorKind.IDLE_TIMEOUT})
#: The statuses of a server that no longer has a response (expired or never kept).
_GONE: Final = frozenset({404, 410})


def _resume_point(
    transform: StreamTransform, emitted: bool, error: SamplingErrorInfo
) -> ResumePoint | None:
    """Where a background stream cut by ``error`` can be read on from (``None``: it
    cannot: not a cut, the transform ended, or no response id nor event came yet)."""
    if error.kind not in _CUTS or transform.finished:
        return None
    if not isinstance(transform, ResponsesTransform) or transform.last_sequence < 0:
        return None
    response_id = transform.acc.response_id
    if not response_id:
        return None
    return ResumePoint(response_id, transform.last_sequence, emitted, error)


def _refused(
    error: SamplingErrorInfo, partial: ConversationResponse | None, resume: ResumePoint | None
) -> AttemptResult:
    """An attempt the server answered with an error status; a resumed read answered
    404/410 was refused (the request starts over)."""
    if resume is None:
        return AttemptResult(error=error, partial=partial)
    gone = error.status_code in _GONE
    return AttemptResult(
        error=error, partial=partial, emitted_output=resume.emitted, resume_refused=gone
    )


_MAY_BE_EMPTY: Final = (StopReason.CONTENT_FILTER, StopReason.LENGTH)
_EMPTY: Final = error_info(
    SamplingErrorKind.EMPTY_RESPONSE,
    "the model returned no text and no tool calls",
    retryable=True,
    code="empty_response",
)


def _timeout_error(emitted: bool, timeouts: Timeouts) -> SamplingErrorInfo:
    """Which of the two content timers fired, and after how long."""
    if emitted:
        return error_info(
            SamplingErrorKind.IDLE_TIMEOUT,
            f"idle timeout: no content within {timeouts.idle:g} s",
            retryable=True,
            code="idle_timeout",
        )
    return error_info(
        SamplingErrorKind.IDLE_TIMEOUT,
        f"first token timeout: no first token within {timeouts.first_token:g} s",
        retryable=True,
        code="first_token_timeout",
    )


#: A stream cut after this share of its read timer in silence was stalled: the server
#: closed it before the timer would have (routed as a stall, not retried in place).
STALL_CLOSE_SHARE: Final = 0.5


def _stall_close(error: SamplingErrorInfo, timer: float, deadline: float) -> SamplingErrorInfo:
    """``error`` as a stall when it is a cut that ended a silence of at least
    :data:`STALL_CLOSE_SHARE` of the read timer (``timer`` s, firing at ``deadline``)."""
    if error.kind is not SamplingErrorKind.TRANSPORT or not timer:
        return error
    silent = trio.current_time() - (deadline - timer)
    if silent < STALL_CLOSE_SHARE * timer:
        return error
    return attrs.evolve(
        error,
        kind=SamplingErrorKind.IDLE_TIMEOUT,
        message=f"the stream stalled: {silent:.3g} s without content, then it was cut "
        f"({error.message})",
        error_code="stall_closed",
    )


def _take(
    events: list[SamplingEvent],
    body: _Body,
    timeouts: Timeouts,
    metrics: AttemptMetrics,
    watch: _DoomWatch | None,
) -> tuple[list[SamplingEvent], float, bool, int]:
    """What a read's ``events`` give the sink: the batch, when its bytes arrived,
    whether the transform ended, and how many content events it holds. Content restarts
    the read timer (``idle``); reasoning text and a server's doom signal go to the doom
    watch (the usual read has neither)."""
    transform = body.transform
    now = trio.current_time()
    at = metrics.last_byte_at = body.received_at(now)
    batch, done, content, reasoning = _split(events, transform)
    if content:
        body.timer = timeouts.idle
        body.deadline = now + body.timer  # the scope's follows before emit (_Body.before_emit)
        metrics.tokens(at, content)
        body.first_content_at_end = not body.emitted
        body.emitted = True
    if watch is not None and (reasoning or transform.acc.doom_loop_signals):
        abort = watch.abort_for(reasoning, transform, done)
        if abort is not None:
            extra, done, _, _ = _split(transform.abort(abort), transform)
            batch.extend(extra)
    return batch, at, done, content


def _feed(transform: StreamTransform, decoder: StreamDecoder, chunk: bytes) -> list[SamplingEvent]:
    try:
        return transform.feed_payloads(decoder.feed_payloads(chunk))
    except SSEDecodeError as exc:
        return transform.abort(decode_failure(exc))


def _feed_to_content(
    transform: StreamTransform, decoder: StreamDecoder, chunk: bytes
) -> tuple[list[SamplingEvent], bytes]:
    """Feed ``chunk`` ``_FIRST_SLICE_BYTES`` at a time until an event is content (or
    the stream ends): the events so far, and the part of ``chunk`` not fed yet."""
    events: list[SamplingEvent] = []
    while chunk:
        head, chunk = chunk[:_FIRST_SLICE_BYTES], chunk[_FIRST_SLICE_BYTES:]
        fed = _feed(transform, decoder, head)
        events.extend(fed)
        if transform.finished or any(type(event) in _CONTENT for event in fed):
            break
    return events, chunk


def _split(
    events: list[SamplingEvent], transform: StreamTransform
) -> tuple[list[SamplingEvent], bool, int, str]:
    """Forwardable events, whether the transform ended, content count, reasoning text.

    The transform's terminal is its outcome (``transform.outcome``), not an event to
    forward: the request's own terminal comes later, from the plan. It is the last
    event of the call that ended the stream, so it is held back by position."""
    outcome = transform.outcome
    done = outcome is not None
    if done and events and events[-1] is outcome:
        events = events[:-1]
    # ``events`` is the transform's fresh list (or a copy without the terminal): the
    # batch itself. Its events are counted in C: a batch of tokens alone (the usual
    # one) costs no Python per event, nor does one of a stream without reasoning.
    kinds = list(map(type, events))
    tokens = kinds.count(ChannelToken)
    content = tokens if tokens == len(kinds) else sum(map(_CONTENT.__contains__, kinds))
    if not tokens or not transform.reasoning_opened:
        return events, done, content, ""
    reasoning = [
        event.text
        for event in events
        if type(event) is ChannelToken and event.channel is _REASONING
    ]
    return events, done, content, "".join(reasoning)
