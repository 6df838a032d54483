"""GenAI spans and metrics, checked with the OpenTelemetry SDK's in-memory exporter/reader."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from fakes import Reply, ScriptedTransport, chat_chunk, chat_stream, error_reply, make_config
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from trio_sampler.actor import open_sampler
from trio_sampler.bridge import TurnFatal, TurnResponse, run_turn_via_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.telemetry import INSTALL_HINT, GenAITelemetry
from trio_sampler.types import (
    Assistant,
    Completed,
    ConversationRequest,
    ConversationResponse,
    RequestMetrics,
    SamplingEvent,
    StopReason,
    Usage,
    User,
)

REQUEST = ConversationRequest(items=[User("hello")], temperature=0.2, max_output_tokens=100)


@attrs.define
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: GenAITelemetry

    def span(self) -> ReadableSpan:
        finished = self.spans.get_finished_spans()
        assert len(finished) == 1, finished
        return finished[0]

    def points(self, name: str) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        assert data is not None
        found: list[HistogramDataPoint] = []
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(p for p in metric.data.data_points)  # type: ignore[misc]
        return found


def labels(point: HistogramDataPoint) -> Mapping[str, Any]:
    return point.attributes or {}


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = GenAITelemetry(
        tracer_provider=tracer_provider, meter_provider=meter_provider, provider_name="openai"
    )
    yield Otel(spans, reader, telemetry)
    meter_provider.shutdown()
    tracer_provider.shutdown()


async def run(otel: Otel, script: list[Reply]) -> Any:
    transport = ScriptedTransport(script)
    async with open_sampler(make_config(), transport=transport) as sampler:
        return await run_turn_via_sampler(
            sampler, REQUEST, telemetry=otel.telemetry, config=make_config()
        )


async def test_completed_request(otel: Otel, autojump_clock: trio.testing.MockClock) -> None:
    outcome = await run(otel, [Reply(chunks=chat_stream("Hel", "lo", pause=0.5))])
    assert isinstance(outcome, TurnResponse)
    span = otel.span()
    assert span.name == "chat test-model"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.system"] == "openai"
    assert attributes["gen_ai.request.model"] == "test-model"
    assert attributes["gen_ai.request.temperature"] == 0.2
    assert attributes["gen_ai.request.max_tokens"] == 100
    assert attributes["gen_ai.response.model"] == "test-model"
    assert attributes["gen_ai.response.id"] == "chatcmpl-test"
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.input_tokens"] == 10
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 0
    assert attributes["server.address"] == "fake.test"
    assert attributes["server.port"] == 80
    assert attributes["trio_sampler.attempts"] == 1
    assert "error.type" not in attributes

    usage = {labels(p)["gen_ai.token.type"]: p for p in otel.points("gen_ai.client.token.usage")}
    assert usage["input"].sum == 10 and usage["output"].sum == 5
    assert labels(usage["input"])["gen_ai.response.model"] == "test-model"
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert duration.count == 1 and duration.sum == pytest.approx(1.0)  # two 0.5 s pauses
    assert "error.type" not in labels(duration)
    (ttfc,) = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(0.0, abs=1e-6)


async def test_failed_request(otel: Otel, autojump_clock: trio.testing.MockClock) -> None:
    outcome = await run(otel, [error_reply(404)])
    assert isinstance(outcome, TurnFatal)
    span = otel.span()
    assert span.status.status_code is StatusCode.ERROR
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == outcome.error.kind.value
    assert attributes["http.response.status_code"] == 404
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert labels(duration)["error.type"] == outcome.error.kind.value
    assert otel.points("gen_ai.client.token.usage") == []


async def test_retries_are_span_events(otel: Otel, autojump_clock: trio.testing.MockClock) -> None:
    await run(otel, [error_reply(503), Reply(chunks=chat_stream("ok"))])
    span = otel.span()
    (retry,) = [e for e in span.events if e.name == "trio_sampler.retry"]
    assert retry.attributes is not None and retry.attributes["trio_sampler.attempt"] == 1
    assert (span.attributes or {})["trio_sampler.attempts"] == 2


async def test_the_route_that_served_is_a_span_attribute(
    otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    from trio_sampler.routing import Route, RoutingPolicy

    def reply(request: Any, _index: int) -> Reply:
        if request.url.host == "primary.test":
            return error_reply(503)
        return Reply(chunks=chat_stream("ok"))

    no_retry = make_config(retry=RetryPolicy(max_retries=0))
    routing = RoutingPolicy(
        [
            Route("primary", no_retry.evolve(base_url="http://primary.test/v1")),
            Route("fallback", no_retry.evolve(base_url="http://fallback.test/v1")),
        ]
    )
    transport = ScriptedTransport(reply)
    async with open_sampler(routing=routing, transport=transport) as sampler:
        outcome = await run_turn_via_sampler(sampler, REQUEST, telemetry=otel.telemetry)
    assert isinstance(outcome, TurnResponse)
    attributes = dict(otel.span().attributes or {})
    assert attributes["trio_sampler.route"] == "fallback"
    assert attributes["trio_sampler.attempts"] == 2


async def test_caller_cancel_ends_the_span(
    otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([Reply(chunks=[chat_chunk({"content": "a"})], then="stall")])
    async with open_sampler(make_config(), transport=transport) as sampler:
        with trio.move_on_after(3):
            await run_turn_via_sampler(sampler, REQUEST, telemetry=otel.telemetry)
    span = otel.span()
    assert (span.attributes or {})["error.type"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET  # a cancel is not a fault
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert duration.sum == pytest.approx(3.0)


async def test_instrument_wraps_an_async_callback(
    otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[SamplingEvent] = []

    async def on_event(event: SamplingEvent) -> None:
        seen.append(event)

    transport = ScriptedTransport([Reply(chunks=chat_stream("ok"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        callback = otel.telemetry.instrument(REQUEST, on_event)
        await run_turn_via_sampler(sampler, REQUEST, on_event=callback)
    assert isinstance(seen[-1], Completed)
    assert otel.span().name == "chat"  # no model on the request and no config given


def test_record_terminal_after_the_fact(otel: Otel) -> None:
    usage = Usage(input_tokens=100, output_tokens=20, cache_read_tokens=80, reasoning_tokens=7)
    response = ConversationResponse(
        items=[Assistant("hi")], stop_reason=StopReason.TOOL_CALLS, usage=usage, model="m-1"
    )
    metrics = RequestMetrics(time_to_first_token_ms=250.0, time_to_last_byte_ms=1500.0)
    config = make_config(provider="xai")
    otel.telemetry.record_terminal(Completed("r9", response, metrics), REQUEST, config=config)
    attributes = dict(otel.span().attributes or {})
    assert attributes["gen_ai.provider.name"] == "x_ai"
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 80
    assert attributes["gen_ai.usage.reasoning.output_tokens"] == 7
    assert attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert attributes["gen_ai.response.time_to_first_chunk"] == 0.25
    assert attributes["trio_sampler.request_id"] == "r9"
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert duration.sum == pytest.approx(1.5)
    (ttfc,) = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert ttfc.sum == pytest.approx(0.25)


def test_missing_opentelemetry_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"trio-sampler\[otel\]") as info:
        GenAITelemetry()
    assert INSTALL_HINT in str(info.value)


def test_the_package_never_imports_opentelemetry() -> None:
    code = (
        "import sys\n"
        "import trio_sampler, trio_sampler.bridge, trio_sampler.agent, trio_sampler.telemetry\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the required attributes, whatever the bridge is given ----------------------------------

REQUIRED = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")


def two_routes() -> Any:
    from trio_sampler.routing import Route, RoutingPolicy

    no_retry = make_config(retry=RetryPolicy(max_retries=0))
    return RoutingPolicy(
        [
            Route("primary", no_retry.evolve(base_url="http://primary.test:8443/v1")),
            Route("fallback", no_retry.evolve(base_url="http://fallback.test/v1")),
        ]
    )


def primary_fails(request: Any, _index: int) -> Reply:
    if request.url.host == "primary.test":
        return error_reply(503)
    return Reply(chunks=chat_stream("ok"))


@pytest.fixture
def unnamed_otel() -> Iterator[Otel]:
    """An exporter whose telemetry has no ``provider_name``: the config must say."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = GenAITelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Otel(spans, reader, telemetry)
    meter_provider.shutdown()
    tracer_provider.shutdown()


async def test_without_config_the_span_has_the_required_attributes(
    unnamed_otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport([Reply(chunks=chat_stream("ok"))])
    async with open_sampler(make_config(), transport=transport) as sampler:
        outcome = await run_turn_via_sampler(sampler, REQUEST, telemetry=unnamed_otel.telemetry)
    assert isinstance(outcome, TurnResponse)
    attributes = dict(unnamed_otel.span().attributes or {})
    for key in REQUIRED:
        assert key in attributes, key
    assert attributes["gen_ai.provider.name"] == "openai"  # the Chat Completions family
    assert attributes["gen_ai.request.model"] == "test-model"
    assert attributes["server.address"] == "fake.test"
    assert attributes["server.port"] == 80


async def test_under_routing_the_span_names_the_endpoint_that_answered(
    unnamed_otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    transport = ScriptedTransport(primary_fails)
    async with open_sampler(routing=two_routes(), transport=transport) as sampler:
        outcome = await run_turn_via_sampler(sampler, REQUEST, telemetry=unnamed_otel.telemetry)
    assert isinstance(outcome, TurnResponse)
    attributes = dict(unnamed_otel.span().attributes or {})
    for key in REQUIRED:
        assert key in attributes, key
    assert attributes["server.address"] == "fallback.test"
    assert attributes["server.port"] == 80
    assert attributes["trio_sampler.route"] == "fallback"


async def test_config_under_routing_does_not_bypass_the_routes(
    unnamed_otel: Otel, autojump_clock: trio.testing.MockClock
) -> None:
    """A fresh key for the primary: the primary fails, the fallback still answers."""
    routing = two_routes()
    fresh = routing.routes[0].config.evolve(api_key="sk-fresh-key-0123456789")
    transport = ScriptedTransport(primary_fails)
    async with open_sampler(routing=routing, transport=transport) as sampler:
        outcome = await run_turn_via_sampler(
            sampler, REQUEST, telemetry=unnamed_otel.telemetry, config=fresh
        )
    assert isinstance(outcome, TurnResponse), outcome
    assert transport.requests[0].headers["authorization"] == "Bearer sk-fresh-key-0123456789"
    attributes = dict(unnamed_otel.span().attributes or {})
    for key in REQUIRED:
        assert key in attributes, key
    assert attributes["server.address"] == "fallback.test"


async def test_a_config_at_no_route_is_refused_naming_the_routes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport(primary_fails)
    async with open_sampler(routing=two_routes(), transport=transport) as sampler:
        with pytest.raises(ValueError, match=r"'primary' .*'fallback'"):
            await run_turn_via_sampler(sampler, REQUEST, config=make_config())


def test_a_resume_is_a_span_event(otel: Otel) -> None:
    from trio_sampler.types import Cancelled, Resumed, SamplingErrorKind

    recorder = otel.telemetry.start_request(REQUEST)
    recorder.observe(Resumed("r", "resp_1", 41, 2, SamplingErrorKind.TRANSPORT, "cut"))
    recorder.observe(Cancelled("r", "done", None))
    (resume,) = [e for e in otel.span().events if e.name == "trio_sampler.resume"]
    assert resume.attributes is not None
    assert resume.attributes["trio_sampler.resume.after_sequence"] == 41
    assert resume.attributes["error.type"] == "transport"
