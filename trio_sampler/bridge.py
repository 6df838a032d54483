"""The bridge: one streamed request → one decision an agent loop can act on
(``docs/bridge-and-agent.md``).

:func:`run_turn_via_sampler` submits a request, forwards its events to an optional
``on_event`` callback as they arrive (the UI path), keeps its own accumulation of the turn,
and turns the terminal event into one of five outcomes:

==================================  ==================================================
outcome                             when
==================================  ==================================================
:class:`TurnResponse`               ``Completed`` (and the context did not overflow)
:class:`TurnCompactAndResubmit`     ``Failed`` with kind ``CONTEXT_LENGTH_EXCEEDED``, or a
                                    ``Completed`` whose raw stop reason is
                                    ``model_context_window_exceeded``
:class:`TurnRefreshAuthAndResubmit` ``Failed`` with kind ``AUTH`` *and* a credential
                                    refresher was passed
:class:`TurnFatal`                  any other ``Failed`` (``AUTH`` without a refresher too)
:class:`TurnCancelled`              ``Cancelled`` (another task cancelled the request, or
                                    the sampler shut down)
==================================  ==================================================

The bridge has no retry logic (that is the actor's, and has already run when ``Failed``
arrives) and no compaction or credential logic (those are the caller's): it only decides.
The outcome classes carry a ``Turn`` prefix so they never clash with the event types
``Completed`` / ``Failed`` / ``Cancelled`` in a ``match`` statement.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import attrs

from .types import (
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    RequestMetrics,
    Retrying,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    TerminalEvent,
)
from .wire import ResponseFold

if TYPE_CHECKING:
    from .actor import RequestStream, SamplerHandle
    from .config import SamplerConfig
    from .routing import Route
    from .telemetry import GenAITelemetry, RequestTelemetry

__all__ = [
    "CONTEXT_WINDOW_STOP_REASON",
    "CredentialRefresher",
    "EventCallback",
    "SamplerTurnOutcome",
    "TurnCancelled",
    "TurnCompactAndResubmit",
    "TurnFatal",
    "TurnRefreshAuthAndResubmit",
    "TurnResponse",
    "outcome_for_terminal",
    "run_turn_via_sampler",
]

#: The raw stop reason with which some servers (Z.ai, Anthropic) end a turn whose context
#: window filled up: the response completed, but it is cut and the conversation must shrink.
CONTEXT_WINDOW_STOP_REASON = "model_context_window_exceeded"

#: Receives every event of the turn, in order. May be a plain function or an ``async def``;
#: when it returns an awaitable, the bridge awaits it before reading the next event.
EventCallback: TypeAlias = Callable[[SamplingEvent], Awaitable[object] | object]

#: Produces a fresh configuration (new credentials) for the next submit.
CredentialRefresher: TypeAlias = Callable[[], Awaitable["SamplerConfig"]]


@attrs.frozen
class TurnResponse:
    """The turn completed: act on ``response`` (tool calls, final text)."""

    response: ConversationResponse
    metrics: RequestMetrics | None = None
    request_id: str = ""


@attrs.frozen
class TurnCompactAndResubmit:
    """The context window overflowed: compact the conversation and submit again.

    ``partial`` is what the model produced before the overflow, if anything (for a
    ``model_context_window_exceeded`` stop, the whole cut-off response).
    """

    error: SamplingErrorInfo
    partial: ConversationResponse | None = None
    metrics: RequestMetrics | None = None
    request_id: str = ""


@attrs.frozen
class TurnRefreshAuthAndResubmit:
    """Authentication failed and a refresher is configured: refresh, then submit again.

    The bridge does not call the refresher itself; the caller does, so it decides how many
    times and with which pacing.
    """

    error: SamplingErrorInfo
    metrics: RequestMetrics | None = None
    request_id: str = ""


@attrs.frozen
class TurnFatal:
    """The turn failed for good (retries, if any were allowed, are already spent)."""

    error: SamplingErrorInfo
    partial: ConversationResponse | None = None
    metrics: RequestMetrics | None = None
    request_id: str = ""


@attrs.frozen
class TurnCancelled:
    """The request was cancelled (not by the caller's own task: that raises instead).

    ``partial`` keeps what was received, usage included, so it can still be billed or shown.
    """

    reason: str
    partial: ConversationResponse | None = None
    metrics: RequestMetrics | None = None
    request_id: str = ""


SamplerTurnOutcome: TypeAlias = (
    TurnResponse | TurnCompactAndResubmit | TurnRefreshAuthAndResubmit | TurnFatal | TurnCancelled
)


def _context_window_error(response: ConversationResponse) -> SamplingErrorInfo:
    return SamplingErrorInfo(
        kind=SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
        message=(
            "the model stopped because its context window is full "
            f"(stop reason {CONTEXT_WINDOW_STOP_REASON!r}); compact the conversation"
        ),
        error_code=CONTEXT_WINDOW_STOP_REASON,
    )


def _is_permission(error: SamplingErrorInfo) -> bool:
    """403 / ``permission_error``: the credential is valid but not allowed; a fresh one of
    the same kind will not help, so it is fatal rather than a refresh (only a 401 is)."""
    return error.status_code == 403 or error.error_type == "permission_error"


def outcome_for_terminal(
    terminal: TerminalEvent,
    *,
    can_refresh_auth: bool,
    partial: ConversationResponse | None = None,
) -> SamplerTurnOutcome:
    """Translate a terminal event into the turn's outcome. Pure.

    ``partial`` is the caller's own accumulation, used when a ``Failed`` or ``Cancelled``
    carries none. ``can_refresh_auth`` says whether a credential refresher is configured.
    """
    if isinstance(terminal, Completed):
        response = terminal.response
        if response.raw_stop_reason == CONTEXT_WINDOW_STOP_REASON:
            return TurnCompactAndResubmit(
                _context_window_error(response), response, terminal.metrics, terminal.request_id
            )
        return TurnResponse(response, terminal.metrics, terminal.request_id)
    if isinstance(terminal, Cancelled):
        return TurnCancelled(
            terminal.reason, terminal.partial or partial, terminal.metrics, terminal.request_id
        )
    error = terminal.error
    kept = terminal.partial or partial
    if error.kind is SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED:
        return TurnCompactAndResubmit(error, kept, terminal.metrics, terminal.request_id)
    if error.kind is SamplingErrorKind.AUTH and can_refresh_auth and not _is_permission(error):
        return TurnRefreshAuthAndResubmit(error, terminal.metrics, terminal.request_id)
    return TurnFatal(error, kept, terminal.metrics, terminal.request_id)


class _TurnAccumulation:
    """The turn's events folded as they arrive, with the same
    :class:`~trio_sampler.wire.ResponseFold` as ``collect`` and the transforms (no list of
    events is kept). A ``Retrying`` with ``discard_partial`` starts over, exactly as
    ``collect`` does, so only the last attempt counts.
    """

    def __init__(self) -> None:
        self.fold = ResponseFold()
        self.seen = False

    def add(self, event: SamplingEvent) -> None:
        self.fold.add(event)
        if isinstance(event, Retrying):
            self.seen = self.seen and not event.discard_partial
        else:
            self.seen = True

    def response(self) -> ConversationResponse | None:
        """What the turn produced so far (``None`` if nothing)."""
        if not self.seen:
            return None
        return self.fold.response()


async def run_turn_via_sampler(
    handle: SamplerHandle,
    request: ConversationRequest,
    *,
    on_event: EventCallback | None = None,
    refresh_credentials: CredentialRefresher | None = None,
    config: SamplerConfig | None = None,
    telemetry: GenAITelemetry | None = None,
    request_id: str | None = None,
) -> SamplerTurnOutcome:
    """Run one request to its terminal and say what the agent loop should do next.

    Args:
        handle: the running sampler.
        request: the turn to sample.
        on_event: called with every event, terminal included, in order, from this task.
            A plain function or an ``async def``; an async callback is awaited before the
            next event is read, so a slow consumer slows the stream (backpressure) instead
            of growing a buffer. If it raises, the request is cancelled and the exception
            propagates to the caller.
        refresh_credentials: the caller's credential refresher. The bridge never calls it;
            its presence turns an ``AUTH`` failure into :class:`TurnRefreshAuthAndResubmit`
            instead of :class:`TurnFatal`.
        config: a per-request configuration (e.g. fresh credentials), else the sampler's.
            On a routed sampler the request still runs along the routing chain: ``config``
            stands in for every route at its endpoint (same ``base_url`` and ``backend``),
            and a config at no route's endpoint is a ``ValueError`` naming them.
        telemetry: records an OpenTelemetry span and GenAI metrics for the request
            (:mod:`trio_sampler.telemetry`, needs the ``otel`` extra), with the provider,
            model and server address of the endpoint that answered.
        request_id: the id to submit under (generated when ``None``).

    Returns:
        One of the five :data:`SamplerTurnOutcome` classes.

    Cancellation: if the calling task is cancelled, the request is cancelled too (the
    stream's context is left) and ``trio.Cancelled`` propagates; :class:`TurnCancelled` is
    only returned when the request was cancelled from elsewhere.
    """
    stream = await submit_turn(handle, request, config=config, request_id=request_id)
    return await follow_turn(
        handle,
        stream,
        request,
        config=config,
        on_event=on_event,
        telemetry=telemetry,
        can_refresh_auth=refresh_credentials is not None,
    )


async def submit_turn(
    handle: SamplerHandle,
    request: ConversationRequest,
    *,
    config: SamplerConfig | None = None,
    request_id: str | None = None,
) -> RequestStream:
    """Submit ``request`` the way :func:`run_turn_via_sampler` does: along the sampler's
    routing, with ``config`` standing in for the routes at its endpoint."""
    routing = handle.routing
    if config is None or routing is None:
        return await handle.submit(request, config=config, request_id=request_id)
    return await handle.submit(
        request, chain=_chain_with(routing.routes, config), request_id=request_id
    )


def _same_endpoint(one: SamplerConfig, other: SamplerConfig) -> bool:
    return one.base_url == other.base_url and one.backend is other.backend


def _chain_with(routes: tuple[Route, ...], config: SamplerConfig) -> list[Route]:
    """The routes, each at ``config``'s endpoint replaced by one with ``config``."""
    chain = [
        attrs.evolve(route, config=config) if _same_endpoint(route.config, config) else route
        for route in routes
    ]
    if all(new is old for new, old in zip(chain, routes, strict=True)):
        endpoints = ", ".join(f"{r.name!r} ({r.config.base_url})" for r in routes)
        raise ValueError(
            f"config= is for {config.base_url}, which no route of the sampler's routing "
            f"serves (the routes are {endpoints}); on a routed sampler config= replaces the "
            "config of the routes at its endpoint (e.g. fresh credentials for one of them)"
        )
    return chain


def telemetry_config(
    handle: SamplerHandle, config: SamplerConfig | None, route: str | None
) -> SamplerConfig | None:
    """The config of the endpoint a request went to, for its span: the route that served
    it, else ``config``, else the sampler's first route or its own config."""
    routing = handle.routing
    if routing is not None:
        by_name = {r.name: r.config for r in routing.routes}
        if route is not None and route in by_name:
            served = by_name[route]
            return config if config is not None and _same_endpoint(served, config) else served
        return config or routing.routes[0].config
    return config or handle.config


async def follow_turn(
    handle: SamplerHandle,
    stream: RequestStream,
    request: ConversationRequest,
    *,
    config: SamplerConfig | None = None,
    on_event: EventCallback | None = None,
    telemetry: GenAITelemetry | None = None,
    can_refresh_auth: bool = False,
) -> SamplerTurnOutcome:
    """Read ``stream`` to its terminal (forwarding events, recording telemetry) and return
    the outcome; the second half of :func:`run_turn_via_sampler`."""
    recorder: RequestTelemetry | None = None
    if telemetry is not None:
        recorder = telemetry.start_request(
            request,
            config=telemetry_config(handle, config, None),
            request_id=stream.request_id,
        )
    accumulation = _TurnAccumulation()
    terminal: TerminalEvent | None = None
    try:
        async with stream:
            async for event in stream:
                if isinstance(event, Completed | Failed | Cancelled):
                    terminal = event
                    if recorder is not None and event.metrics is not None:
                        recorder.served_by(telemetry_config(handle, config, event.metrics.route))
                else:
                    accumulation.add(event)
                if recorder is not None:
                    recorder.observe(event)
                if on_event is not None:
                    result = on_event(event)
                    if inspect.isawaitable(result):
                        await result
    finally:
        if recorder is not None and terminal is None:
            # The caller's task left early (cancelled, or on_event raised): the span still
            # ends, marked as cancelled by the caller.
            recorder.abort("cancelled by the caller")
    # The stream always ends with its terminal (contract 1); the fallback is defensive.
    terminal = terminal or stream.terminal
    if terminal is None:  # pragma: no cover - contract 1 makes this unreachable
        raise RuntimeError(f"request {stream.request_id} ended without a terminal event")
    return outcome_for_terminal(
        terminal, can_refresh_auth=can_refresh_auth, partial=accumulation.response()
    )
