"""Optional OpenTelemetry spans and metrics, following the GenAI semantic conventions.

An observer: it consumes a request's events and terminal and records

* one ``CLIENT`` span per request, named ``chat {model}``, with ``gen_ai.operation.name``,
  ``gen_ai.provider.name`` (and the older ``gen_ai.system``), ``gen_ai.request.*``,
  ``gen_ai.response.model`` / ``.id`` / ``.finish_reasons``, ``gen_ai.usage.*`` (cached and
  reasoning tokens included), ``server.address`` / ``server.port`` and, on failure or
  cancel, ``error.type``; every ``Retrying`` and ``Resumed`` becomes a span event;
* the metrics ``gen_ai.client.token.usage`` (histogram, ``{token}``, one record per token
  type), ``gen_ai.client.operation.duration`` (s) and
  ``gen_ai.client.operation.time_to_first_chunk`` (s).

Nothing here runs unless you use it: the package never imports this module, and this
module imports ``opentelemetry`` only when a :class:`GenAITelemetry` is built. Without the
extra that raises an ``ImportError`` naming it: ``pip install 'trio-sampler[otel]'``.

Usage::

    telemetry = GenAITelemetry()                 # global providers, or pass your own
    outcome = await run_turn_via_sampler(handle, request, telemetry=telemetry)

    # or with a raw stream:
    recorder = telemetry.start_request(request, config=config)
    async for event in stream:
        recorder.observe(event)                  # the terminal ends the span

Usage on ``Failed`` and ``Cancelled`` is recorded too (from the partial): the server bills
for it. A cancel sets ``error.type = "cancelled"`` but leaves the span status unset, since
a cancel is the caller's decision rather than a fault; a failure sets the status to ERROR.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .types import (
    ApiBackend,
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    FirstToken,
    ModelMetadata,
    RequestMetrics,
    Resumed,
    Retrying,
    SamplingEvent,
    TerminalEvent,
    Usage,
)
from .wire import backend_name

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from .config import SamplerConfig

__all__ = ["INSTALL_HINT", "GenAITelemetry", "RequestTelemetry"]

#: What to install when OpenTelemetry is missing.
INSTALL_HINT = "pip install 'trio-sampler[otel]'"

_INSTRUMENTATION_NAME = "trio_sampler"
_OPERATION = "chat"

# Bucket boundaries advised by the semantic conventions for these two histograms.
_TOKEN_BUCKETS: Sequence[float] = [4.0**n for n in range(14)]  # 1, 4, 16, ... 67108864
_DURATION_BUCKETS: Sequence[float] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
]  # fmt: skip


def _load_otel() -> tuple[Any, Any]:
    """Import the OpenTelemetry API lazily; a clear ImportError names the extra."""
    try:
        from opentelemetry import metrics, trace
    except ImportError as exc:
        raise ImportError(
            "trio_sampler.telemetry needs the OpenTelemetry API, which is not installed; "
            f"install the extra: {INSTALL_HINT}"
        ) from exc
    return trace, metrics


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trio-sampler")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def _now() -> float:
    """Trio's clock inside a Trio run (so the mock clock applies), else a monotonic clock."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


#: ``gen_ai.provider.name`` by protocol, for an endpoint without a provider profile.
_PROTOCOL_FAMILY: dict[ApiBackend, str] = {
    ApiBackend.CHAT_COMPLETIONS: "openai",
    ApiBackend.RESPONSES: "openai",
    ApiBackend.MESSAGES: "anthropic",
}


def _server(base_url: str) -> tuple[str | None, int | None]:
    parts = urllib.parse.urlsplit(base_url)
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    return parts.hostname, port


class GenAITelemetry:
    """Records GenAI spans and metrics for the requests it is shown.

    Args:
        tracer_provider: where spans go (default: the global provider).
        meter_provider: where metrics go (default: the global provider).
        provider_name: ``gen_ai.provider.name`` when a request's config does not say
            (config ``provider`` profiles map to the conventions' names, e.g. ``xai`` →
            ``x_ai``; otherwise the profile name itself is used).

    Raises:
        ImportError: OpenTelemetry is not installed (``pip install 'trio-sampler[otel]'``).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        provider_name: str | None = None,
    ) -> None:
        trace, metrics = _load_otel()
        version = _package_version()
        self.provider_name = provider_name
        self._trace = trace
        self.tracer = trace.get_tracer(
            _INSTRUMENTATION_NAME, version, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter(_INSTRUMENTATION_NAME, version, meter_provider=meter_provider)
        self.token_usage: Histogram = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.operation_duration: Histogram = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.time_to_first_chunk: Histogram = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from issuing the request to the first chunk of content.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )

    def _provider_for(self, config: SamplerConfig | None) -> str | None:
        """``gen_ai.provider.name``: the config's provider profile, else ``provider_name``,
        else the family of the config's protocol (``openai`` for Chat Completions and
        Responses, ``anthropic`` for Messages), so the required attribute is never absent
        when a config is known."""
        if config is not None and config.provider is not None:
            profile = config.profile
            return profile.telemetry_name if profile is not None else config.provider
        if self.provider_name is not None or config is None:
            return self.provider_name
        return _PROTOCOL_FAMILY[ApiBackend(config.backend)]

    def start_request(
        self,
        request: ConversationRequest,
        *,
        config: SamplerConfig | None = None,
        request_id: str | None = None,
    ) -> RequestTelemetry:
        """Open the span of one request (a child of the current span, if any).

        Feed every event to :meth:`RequestTelemetry.observe`; the terminal ends the span.
        """
        return RequestTelemetry(self, request, config, request_id)

    def instrument(
        self,
        request: ConversationRequest,
        on_event: Callable[[SamplingEvent], Any] | None = None,
        *,
        config: SamplerConfig | None = None,
        request_id: str | None = None,
    ) -> Callable[[SamplingEvent], Any]:
        """An event callback that records, then forwards to ``on_event`` (if any).

        Returns whatever ``on_event`` returns, so an async callback stays awaitable.
        """
        recorder = self.start_request(request, config=config, request_id=request_id)

        def observe_then_forward(event: SamplingEvent) -> Any:
            recorder.observe(event)
            return on_event(event) if on_event is not None else None

        return observe_then_forward

    def record_terminal(
        self,
        terminal: TerminalEvent,
        request: ConversationRequest,
        *,
        config: SamplerConfig | None = None,
    ) -> None:
        """Record a request after the fact, from its terminal alone.

        The span is opened and closed at once; durations come from the terminal's
        metrics (``time_to_last_byte_ms``) when the actor measured them.
        """
        recorder = self.start_request(request, config=config, request_id=terminal.request_id)
        recorder.use_metrics_duration = True
        recorder.observe(terminal)


class RequestTelemetry:
    """The span and measurements of one request. Built by :meth:`GenAITelemetry.start_request`.

    Idempotent at the end: after the terminal (or :meth:`abort`) further calls are no-ops.
    """

    def __init__(
        self,
        telemetry: GenAITelemetry,
        request: ConversationRequest,
        config: SamplerConfig | None,
        request_id: str | None,
    ) -> None:
        self._telemetry = telemetry
        self._started = _now()
        self._first_chunk_at: float | None = None
        self.finished = False
        #: Take the operation duration from the terminal's metrics, not from our clock.
        self.use_metrics_duration = False
        self._request = request
        self._base: dict[str, Any] = {"gen_ai.operation.name": _OPERATION}
        self._base.update(self._endpoint(config))
        model = self._base.get("gen_ai.request.model")
        self._response_model: str | None = None
        attributes = {**self._base, **self._legacy()}
        for key, value in (
            ("gen_ai.request.temperature", request.temperature),
            ("gen_ai.request.top_p", request.top_p),
            ("gen_ai.request.max_tokens", request.max_output_tokens),
        ):
            if value is not None:
                attributes[key] = value
        if request.stop_sequences:
            attributes["gen_ai.request.stop_sequences"] = list(request.stop_sequences)
        if request_id is not None:
            attributes["trio_sampler.request_id"] = request_id
        if config is not None:
            attributes["trio_sampler.backend"] = backend_name(config.backend)
        name = f"{_OPERATION} {model}" if model else _OPERATION
        self.span: Span = telemetry.tracer.start_span(
            name, kind=telemetry._trace.SpanKind.CLIENT, attributes=attributes
        )

    def _endpoint(self, config: SamplerConfig | None) -> dict[str, Any]:
        """The attributes that name where the request goes: provider, model, server."""
        found: dict[str, Any] = {}
        provider = self._telemetry._provider_for(config)
        if provider is not None:
            found["gen_ai.provider.name"] = provider
        model = self._request.model or (config.model if config is not None else None)
        if model is not None:
            found["gen_ai.request.model"] = model
        if config is not None:
            address, port = _server(config.base_url)
            if address is not None:
                found["server.address"] = address
            if port is not None:
                found["server.port"] = port
        return found

    def _legacy(self) -> dict[str, Any]:
        provider = self._base.get("gen_ai.provider.name")
        # gen_ai.system: the pre-1.37 name of the provider, still widely read.
        return {} if provider is None else {"gen_ai.system": provider}

    def served_by(self, config: SamplerConfig | None) -> None:
        """The request was answered at ``config``'s endpoint (a route other than the one
        the span was opened for): its provider, model and server replace the span's."""
        if self.finished or config is None:
            return
        endpoint = self._endpoint(config)
        for key in ("server.address", "server.port"):
            if key not in endpoint:
                self._base.pop(key, None)
        self._base.update(endpoint)
        backend = {"trio_sampler.backend": backend_name(config.backend)}
        self.span.set_attributes({**endpoint, **self._legacy(), **backend})
        model = self._base.get("gen_ai.request.model")
        self.span.update_name(f"{_OPERATION} {model}" if model else _OPERATION)

    def observe(self, event: SamplingEvent) -> None:
        """Record one event; a terminal event ends the span and records the metrics."""
        if self.finished:
            return
        if isinstance(event, FirstToken):
            if self._first_chunk_at is None:
                self._first_chunk_at = _now()
        elif isinstance(event, ModelMetadata):
            if event.model:
                self._response_model = event.model
        elif isinstance(event, Retrying):
            self.span.add_event(
                "trio_sampler.retry",
                {
                    "trio_sampler.attempt": event.attempt,
                    "error.type": event.kind.value,
                    "trio_sampler.retry.reason": event.reason,
                    "trio_sampler.retry.delay_s": event.delay,
                    "trio_sampler.retry.discard_partial": event.discard_partial,
                },
            )
        elif isinstance(event, Resumed):
            self.span.add_event(
                "trio_sampler.resume",
                {
                    "trio_sampler.attempt": event.attempt,
                    "error.type": event.kind.value,
                    "trio_sampler.resume.after_sequence": event.after_sequence,
                },
            )
        elif isinstance(event, Completed | Failed | Cancelled):
            self._finish(event)

    def abort(self, reason: str) -> None:
        """End the span without a terminal (the consumer left): recorded as a cancel."""
        if self.finished:
            return
        self._end(error_type="cancelled", description=reason, response=None, metrics=None)

    # -- the end ---------------------------------------------------------------------

    def _finish(self, terminal: TerminalEvent) -> None:
        if isinstance(terminal, Completed):
            self._end(None, None, terminal.response, terminal.metrics)
        elif isinstance(terminal, Failed):
            span = self.span
            span.set_attribute("trio_sampler.error.message", terminal.error.message)
            if terminal.error.status_code is not None:
                span.set_attribute("http.response.status_code", terminal.error.status_code)
            if terminal.error.provider_request_id is not None:
                span.set_attribute(
                    "trio_sampler.provider_request_id", terminal.error.provider_request_id
                )
            error = terminal.error
            self._end(
                error.kind.value, error.message, terminal.partial, terminal.metrics, failed=True
            )
        else:
            self._end("cancelled", terminal.reason, terminal.partial, terminal.metrics)

    def _end(
        self,
        error_type: str | None,
        description: str | None,
        response: ConversationResponse | None,
        metrics: RequestMetrics | None,
        *,
        failed: bool = False,
    ) -> None:
        self.finished = True
        span = self.span
        usage = (response.usage if response is not None else None) or (
            metrics.usage if metrics is not None else None
        )
        if response is not None:
            self._response_model = response.model or self._response_model
            if response.response_id:
                span.set_attribute("gen_ai.response.id", response.response_id)
            if response.stop_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason.value])
        if self._response_model:
            span.set_attribute("gen_ai.response.model", self._response_model)
        if usage is not None:
            span.set_attributes(_usage_attributes(usage))
        ttfc = self._time_to_first_chunk(metrics)
        if ttfc is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", ttfc)
        if metrics is not None and metrics.attempts:
            span.set_attribute("trio_sampler.attempts", len(metrics.attempts))
        if metrics is not None and metrics.route is not None:
            span.set_attribute("trio_sampler.route", metrics.route)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
        if failed:
            status = self._telemetry._trace.Status(
                self._telemetry._trace.StatusCode.ERROR, description
            )
            span.set_status(status)
        span.end()
        self._record_metrics(error_type, usage, metrics, ttfc)

    def _time_to_first_chunk(self, metrics: RequestMetrics | None) -> float | None:
        if metrics is not None and metrics.time_to_first_token_ms is not None:
            return metrics.time_to_first_token_ms / 1000.0
        if self._first_chunk_at is not None:
            return self._first_chunk_at - self._started
        return None

    def _record_metrics(
        self,
        error_type: str | None,
        usage: Usage | None,
        metrics: RequestMetrics | None,
        ttfc: float | None,
    ) -> None:
        telemetry = self._telemetry
        attributes = dict(self._base)
        if self._response_model:
            attributes["gen_ai.response.model"] = self._response_model
        if usage is not None:
            telemetry.token_usage.record(
                usage.input_tokens, {**attributes, "gen_ai.token.type": "input"}
            )
            telemetry.token_usage.record(
                usage.output_tokens, {**attributes, "gen_ai.token.type": "output"}
            )
        if ttfc is not None:
            telemetry.time_to_first_chunk.record(ttfc, attributes)
        if error_type is not None:
            attributes["error.type"] = error_type
        duration = _now() - self._started
        if self.use_metrics_duration:
            measured = metrics.time_to_last_byte_ms if metrics is not None else None
            duration = measured / 1000.0 if measured is not None else 0.0
        telemetry.operation_duration.record(max(duration, 0.0), attributes)


def _usage_attributes(usage: Usage) -> dict[str, int]:
    """``gen_ai.usage.*``: input is the whole prompt, cached part included (as ``Usage``
    counts it)."""
    attributes = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
    }
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return attributes
