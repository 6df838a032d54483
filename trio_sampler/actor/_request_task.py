"""One request, from Submit to its terminal: attempts, retries, timeouts, doom loops.

Everything that can fail is caught *inside* an attempt and becomes data (a
:class:`SamplingErrorInfo`); the retry loop turns data into the next step; the terminal
is delivered synchronously from ``finally``. So nothing escapes into the actor, and the
"exactly one terminal" rule holds on every path, cancellation included.

Timers are deadlines on the body read, not watchdog tasks: before the first content
event the deadline is ``first_token`` after the headers; after it, ``idle`` after the last
content event (pings and SSE comments produce no content events, so they do not keep a
dead stream alive). Connect and response-header timeouts live in the client; the
optional ``total`` timeout is a cancel scope around all attempts.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator

import attrs
import trio

from ..admission import AdmissionGate, AdmissionRefusedError
from ..client import SamplingClient, SamplingClientError
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy, TailRepetitionDetector, parse_trigger
from ..models import ModelCatalog
from ..retry import RetryAction, RetryBudget, classify
from ..types import (
    ApiBackend,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    FirstToken,
    ImagesStripped,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    StripReason,
    TerminalEvent,
    ToolCallDelta,
    Usage,
)
from ..wire import SSEDecodeError, SSEDecoder, StreamTransform, build_request, new_transform
from ..wire._replay import decode_failure
from ..wire.errors import internal_error
from ._metrics import MetricsRecorder
from ._stream import RequestState

__all__ = ["RequestRunner"]

_CONTENT = frozenset(
    {ChannelToken, ToolCallDelta, FirstToken, BackendToolCallStarted, BackendToolCallCompleted}
)
_REASONING = SamplingChannel.REASONING
# After a completed stream, read at most this much more to reuse the connection.
_DRAIN_MAX_BYTES = 64 * 1024
_DRAIN_MAX_SECONDS = 1.0


@attrs.define
class _AttemptResult:
    """How one attempt ended: a response, or an error with what had arrived."""

    response: ConversationResponse | None = None
    error: SamplingErrorInfo | None = None
    partial: ConversationResponse | None = None
    #: Content events were forwarded to the consumer (a retry must discard them).
    emitted_output: bool = False
    doom_triggers: tuple[str, ...] = ()


def _error(
    kind: SamplingErrorKind, message: str, *, retryable: bool, code: str
) -> SamplingErrorInfo:
    return SamplingErrorInfo(kind=kind, message=message, retryable=retryable, error_code=code)


class RequestRunner:
    """Runs requests for one actor; shared state is the client, the budget and the RNG."""

    def __init__(
        self,
        client: SamplingClient,
        retry_policy: RetryPolicy | None,
        doom_policy: DoomLoopPolicy,
        *,
        rng: random.Random,
        limiter: trio.CapacityLimiter | None,
        catalog: ModelCatalog | None = None,
        admission: AdmissionGate | None = None,
    ) -> None:
        self._client = client
        self._admission = admission
        self._catalog = catalog
        self._retry_policy = retry_policy
        self._doom = doom_policy
        self._rng = rng
        self._limiter = limiter
        self._budgets: dict[tuple[float, float], RetryBudget] = {}

    def _budget(self, policy: RetryPolicy) -> RetryBudget | None:
        if policy.retry_budget_ratio is None:
            return None
        key = (policy.retry_budget_ratio, policy.retry_budget_window_s)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = RetryBudget(*key)
        return budget

    # -- the request ---------------------------------------------------------------------

    async def serve(self, state: RequestState) -> None:
        """The request task: exactly one terminal, whatever happens (see module doc)."""
        terminal: TerminalEvent | None = None
        try:
            with state.scope:
                # The request's own nursery: helper tasks of this request live and die
                # here, inside the request's cancel scope.
                async with trio.open_nursery() as nursery:
                    state.nursery = nursery
                    try:
                        terminal = await self._run(state)
                    except Exception as exc:  # a bug of ours: a typed terminal, no crash
                        terminal = self._internal_error(state, exc)
        except Exception as exc:  # a helper task's bug, arriving as an ExceptionGroup
            terminal = self._internal_error(state, exc)
        finally:
            # Cancelled: a cancel() recorded its terminal already (finish keeps the first).
            # Without a recorded reason the cancel came from a scope enclosing the
            # sampler: a shutdown too.
            if terminal is None:
                partial = self._priced(state.partial(), state.config)
                terminal = Cancelled(
                    state.request_id,
                    state.cancel_reason or "the sampler was shut down",
                    partial,
                    state.metrics.build(partial),
                )
            state.nursery = None
            state.finish(terminal)

    def _priced(
        self, response: ConversationResponse | None, config: SamplerConfig
    ) -> ConversationResponse | None:
        return None if response is None else self._with_cost(response, config)

    def _internal_error(self, state: RequestState, exc: Exception) -> Failed:
        return Failed(
            state.request_id,
            internal_error(exc, "running the request"),
            state.partial(),
            state.metrics.build(None),
        )

    async def _run(self, state: RequestState) -> TerminalEvent:
        """The slot wait and every attempt, under the one ``Timeouts.total`` deadline
        counted from submit: waiting for a ``max_concurrency`` slot, backoff sleeps and a
        consumer that stops reading all spend it."""
        total = state.config.timeouts.total
        deadline = state.submitted_at + total if total else math.inf
        with trio.CancelScope(deadline=deadline) as total_scope:
            if self._limiter is not None:
                async with self._limiter:
                    return await self._attempts(state, state.metrics)
            return await self._attempts(state, state.metrics)
        # Only reached when the total deadline fired.
        assert total_scope.cancelled_caught
        partial = self._priced(state.partial(), state.config) or state.last_partial
        return Failed(
            state.request_id,
            _error(
                SamplingErrorKind.IDLE_TIMEOUT,
                f"the request did not finish within its total timeout of {total:g} s",
                retryable=False,
                code="total_timeout",
            ),
            partial,
            state.metrics.build(partial),
        )

    def _with_cost(
        self, response: ConversationResponse, config: SamplerConfig
    ) -> ConversationResponse:
        """Fill in the cost from the model catalog when the server reported none."""
        if response.cost_usd_ticks is not None or response.usage is None or self._catalog is None:
            return response
        model = response.model or config.model
        cost = self._catalog.cost_ticks(model, response.usage) if model else None
        return response if cost is None else attrs.evolve(response, cost_usd_ticks=cost)

    async def _attempts(self, state: RequestState, metrics: MetricsRecorder) -> TerminalEvent:
        config = state.config
        policy = self._retry_policy or config.retry
        budget = self._budget(policy)
        request = state.request
        retries = 0
        resamples = 0
        consecutive_rate_limits = 0
        images_stripped = False
        doom_max = self._doom.max_resamples
        if not self._doom.enabled or policy.max_retries == 0:
            doom_max = 0
        if budget is not None:
            budget.record_request(trio.current_time())
        last_partial: ConversationResponse | None = None
        while True:
            armed = resamples < doom_max
            metrics.start_attempt(trio.current_time())
            admitted: list[object] = []
            result = None
            try:
                result = await self._attempt(
                    state,
                    request,
                    config,
                    metrics,
                    armed=armed,
                    attempt=retries + resamples + 1,
                    admitted=admitted,
                )
            finally:
                if admitted:
                    await self._settle(admitted[0], state, result)
            metrics.end_attempt(trio.current_time(), result.error)
            if result.response is not None:
                response = self._with_cost(result.response, config)
                return Completed(state.request_id, response, metrics.build(response))
            error = result.error
            assert error is not None
            # A partial is billed too: priced like a response.
            last_partial = state.last_partial = self._priced(result.partial, config)
            if error.kind is SamplingErrorKind.DOOM_LOOP_DETECTED and armed:
                resamples += 1
                await self._emit_retry(
                    state,
                    resamples,
                    doom_max,
                    error,
                    self._rng.uniform(0.0, 0.25),
                    result.emitted_output,
                    result.doom_triggers,
                )
                continue
            if result.emitted_output and not policy.retry_mid_stream:
                return Failed(state.request_id, error, last_partial, metrics.build(last_partial))
            decision = classify(
                error,
                retries,
                policy,
                consecutive_rate_limits=consecutive_rate_limits,
                images_stripped=images_stripped,
                uniform=self._rng.random,
            )
            if decision.action is RetryAction.STRIP_IMAGES:
                request, urls = request.strip_images()
                images_stripped = True
                if not urls:
                    return Failed(
                        state.request_id, error, last_partial, metrics.build(last_partial)
                    )
                reason = (
                    StripReason.SERVER_REJECTED
                    if (error.error_code or "") == "invalid_image" and error.status_code == 400
                    else StripReason.PAYLOAD_HEURISTIC
                )
                await state.emit([ImagesStripped(state.request_id, urls, reason)])
                retries += 1
                await self._emit_retry(
                    state, retries, policy.max_retries, error, 0.0, result.emitted_output, ()
                )
                continue
            if decision.action is RetryAction.FAIL:
                return Failed(state.request_id, error, last_partial, metrics.build(last_partial))
            if budget is not None and not budget.try_spend(trio.current_time()):
                budget_error = attrs.evolve(
                    error, message=f"{error.message} (not retried: the retry budget is spent)"
                )
                return Failed(
                    state.request_id, budget_error, last_partial, metrics.build(last_partial)
                )
            if self._admission is not None and not await self._admission.retry_allowed(error):
                budget_error = attrs.evolve(
                    error,
                    message=f"{error.message} (not retried: the fleet retry budget is spent)",
                )
                return Failed(
                    state.request_id, budget_error, last_partial, metrics.build(last_partial)
                )
            consecutive_rate_limits = (
                consecutive_rate_limits + 1 if error.kind is SamplingErrorKind.RATE_LIMITED else 0
            )
            retries += 1
            await self._emit_retry(
                state,
                retries,
                policy.max_retries,
                error,
                decision.delay,
                result.emitted_output,
                (),
            )

    async def _settle(
        self, ticket: object, state: RequestState, result: _AttemptResult | None
    ) -> None:
        """Tell the admission how an attempt ended (shielded: it runs on cancellation too;
        the admission bounds its own time)."""
        assert self._admission is not None
        usage: Usage | None = None
        if result is not None and result.response is not None:
            usage = result.response.usage
        elif result is not None and result.partial is not None:
            usage = result.partial.usage
        elif state.transform is not None:
            usage = state.transform.acc.usage
        with trio.CancelScope(shield=True):
            await self._admission.settle(ticket, usage)

    async def _emit_retry(
        self,
        state: RequestState,
        attempt: int,
        max_retries: int,
        error: SamplingErrorInfo,
        delay: float,
        discard: bool,
        triggers: tuple[str, ...],
    ) -> None:
        # The attempt's partial output is discarded once the Retrying is handed over.
        await state.emit_retry(
            [
                Retrying(
                    state.request_id,
                    attempt,
                    max_retries,
                    error.kind,
                    error.message,
                    delay,
                    discard,
                    triggers,
                )
            ]
        )
        await trio.sleep(delay)

    # -- one attempt ---------------------------------------------------------------------

    async def _attempt(
        self,
        state: RequestState,
        request: ConversationRequest,
        config: SamplerConfig,
        metrics: MetricsRecorder,
        *,
        armed: bool,
        attempt: int,
        admitted: list[object],
    ) -> _AttemptResult:
        try:
            wire = build_request(config.backend, request, config.build_options())
        except ValueError as exc:  # a request the backend cannot carry (anything else: ours)
            return _AttemptResult(
                error=_error(
                    SamplingErrorKind.INVALID_REQUEST,
                    str(exc),
                    retryable=False,
                    code="invalid_request",
                )
            )
        doom_header = config.profile.doom_loop_header if config.profile is not None else None
        if armed and doom_header and config.backend is ApiBackend.RESPONSES:
            wire = attrs.evolve(
                wire, headers=(*wire.headers, (doom_header, str(self._doom.window_tokens)))
            )
        if self._admission is not None:
            total = config.timeouts.total
            try:
                admitted.append(
                    await self._admission.admit(
                        wire,
                        config,
                        deadline=state.submitted_at + total if total else math.inf,
                        first_attempt=attempt == 1,
                    )
                )
            except AdmissionRefusedError as exc:
                return _AttemptResult(error=exc.info)
        transform = new_transform(config.backend, state.request_id, provider=config.provider)
        detector = TailRepetitionDetector(self._doom) if armed else None
        state.transform = transform
        timeouts = config.timeouts
        emitted = False
        triggers: tuple[str, ...] = ()
        terminal: list[SamplingEvent] = []
        try:
            async with self._client.open_stream(wire, config=config) as stream:
                now = trio.current_time()
                metrics.headers_at = now
                await state.emit(transform.start(stream.headers, attempt=attempt))
                decoder = SSEDecoder(config.max_sse_event_bytes)
                deadline = now + timeouts.first_token
                chunks = stream.__aiter__()
                body_done = False
                while not transform.finished:
                    chunk: bytes | None = None
                    timed_out = True
                    with trio.move_on_at(deadline):
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            chunk = None  # end of body
                        timed_out = False
                    if timed_out:
                        events = transform.abort(self._timeout_error(emitted))
                    elif chunk is None:
                        body_done = True
                        events = self._close(transform, decoder)
                    else:
                        events = self._feed(transform, decoder, chunk)
                    now = trio.current_time()
                    metrics.last_byte_at = now
                    batch, done, content, reasoning = self._split(events, terminal)
                    if content:
                        deadline = now + timeouts.idle
                        metrics.tokens(now, content)
                        emitted = True
                    if detector is not None and reasoning:
                        trigger = detector.feed(reasoning)
                        if trigger is not None and not done:
                            triggers = (trigger,)
                            batch_tail = transform.abort(
                                _error(
                                    SamplingErrorKind.DOOM_LOOP_DETECTED,
                                    "the reasoning is repeating itself; resampling",
                                    retryable=True,
                                    code="doom_loop",
                                )
                            )
                            extra, done, _, _ = self._split(batch_tail, terminal)
                            batch.extend(extra)
                    if batch:
                        await state.emit(batch)
                    if done:
                        break
                if not body_done and terminal and isinstance(terminal[0], Completed):
                    await self._drain(chunks)
        except SamplingClientError as exc:
            return _AttemptResult(error=exc.info, partial=state.partial(), emitted_output=emitted)
        return self._judge(terminal, emitted, armed, triggers)

    @staticmethod
    async def _drain(chunks: AsyncIterator[bytes]) -> None:
        """Read what little follows a completed stream (the end of a chunked body), so the
        connection goes back to the pool instead of being closed. Bounded in bytes and
        time; whatever is left after that is dropped with the connection."""
        left = _DRAIN_MAX_BYTES
        with trio.move_on_after(_DRAIN_MAX_SECONDS):
            try:
                while left > 0:
                    left -= len(await chunks.__anext__())
            except (StopAsyncIteration, SamplingClientError):
                pass

    @staticmethod
    def _timeout_error(emitted: bool) -> SamplingErrorInfo:
        if emitted:
            return _error(
                SamplingErrorKind.IDLE_TIMEOUT,
                "the stream went idle: no content within the idle timeout",
                retryable=True,
                code="idle_timeout",
            )
        return _error(
            SamplingErrorKind.IDLE_TIMEOUT,
            "no first token within the first-token timeout",
            retryable=True,
            code="first_token_timeout",
        )

    @staticmethod
    def _feed(transform: StreamTransform, decoder: SSEDecoder, chunk: bytes) -> list[SamplingEvent]:
        events: list[SamplingEvent] = []
        try:
            for sse in decoder.feed(chunk):
                events.extend(transform.feed(sse))
                if transform.finished:
                    break
        except SSEDecodeError as exc:
            events.extend(transform.abort(decode_failure(exc)))
        return events

    @staticmethod
    def _close(transform: StreamTransform, decoder: SSEDecoder) -> list[SamplingEvent]:
        events: list[SamplingEvent] = []
        for sse in decoder.close():
            events.extend(transform.feed(sse))
        events.extend(transform.close())
        return events

    @staticmethod
    def _split(
        events: list[SamplingEvent], terminal: list[SamplingEvent]
    ) -> tuple[list[SamplingEvent], bool, int, str]:
        """Forwardable events, whether the transform ended, content count, reasoning text."""
        batch: list[SamplingEvent] = []
        done = False
        content = 0
        reasoning: list[str] = []
        for event in events:
            kind = type(event)
            if kind is Completed or kind is Failed:
                terminal.append(event)
                done = True
                continue
            if kind in _CONTENT:
                content += 1
                if kind is ChannelToken and event.channel is _REASONING:  # type: ignore[union-attr]
                    reasoning.append(event.text)  # type: ignore[union-attr]
            batch.append(event)
        return batch, done, content, "".join(reasoning)

    def _judge(
        self,
        terminal: list[SamplingEvent],
        emitted: bool,
        armed: bool,
        triggers: tuple[str, ...],
    ) -> _AttemptResult:
        """Turn the transform's terminal into the attempt's result (empty, doom checks)."""
        end = terminal[0] if terminal else None
        if isinstance(end, Failed):
            return _AttemptResult(
                error=end.error, partial=end.partial, emitted_output=emitted, doom_triggers=triggers
            )
        assert isinstance(end, Completed)
        response = end.response
        confident = tuple(
            s for s in response.doom_loop_signals if self._doom.is_confident(parse_trigger(s))
        )
        if armed and confident:
            return _AttemptResult(
                error=_error(
                    SamplingErrorKind.DOOM_LOOP_DETECTED,
                    f"the server detected a doom loop ({', '.join(confident)})",
                    retryable=True,
                    code="doom_loop",
                ),
                partial=response,
                emitted_output=emitted,
                doom_triggers=confident,
            )
        if response.is_empty and response.stop_reason not in (
            StopReason.CONTENT_FILTER,
            StopReason.LENGTH,
        ):
            return _AttemptResult(
                error=_error(
                    SamplingErrorKind.EMPTY_RESPONSE,
                    "the model returned no text and no tool calls",
                    retryable=True,
                    code="empty_response",
                ),
                partial=response,
                emitted_output=emitted,
            )
        return _AttemptResult(response=response, emitted_output=emitted)
