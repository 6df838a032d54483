"""``ProviderProfile`` is the only home of provider quirks: one test per quirk, run for
every profile (each asserts the behaviour its own declaration calls for), and no module
but ``providers.py`` compares a provider's name."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import orjson
import pytest

import trio_sampler
from trio_sampler import ApiBackend, Assistant, ConversationRequest, System, User
from trio_sampler.providers import (
    COST_IN_TICKS,
    COST_IN_USD,
    NO_PROVIDER,
    PROFILES,
    AuthScheme,
    ProviderProfile,
    get_profile,
)
from trio_sampler.types import ModelMetadata, Reasoning
from trio_sampler.wire import BuildOptions, build_request, new_transform, replay
from trio_sampler.wire._transform import reported_cost

ALL = [None, *PROFILES]
#: The profiles whose streams are Server-Sent Events: the tests that replay an SSE body.
#: (An AWS event stream's framing around the same events: tests/test_bedrock_messages.py.)
SSE = [p for p in ALL if p is None or PROFILES[p].stream_media_type == "text/event-stream"]


def profile(name: str | None) -> ProviderProfile:
    return NO_PROVIDER if name is None else PROFILES[name]


def chat_body(request: ConversationRequest, provider: str | None) -> dict[str, object]:
    wire = build_request(ApiBackend.CHAT_COMPLETIONS, request, BuildOptions(provider=provider))
    body: dict[str, object] = orjson.loads(wire.body)
    return body


@pytest.mark.parametrize("provider", ALL)
def test_max_tokens_field(provider: str | None) -> None:
    request = ConversationRequest(items=[User("hi")], model="m", max_output_tokens=77)
    body = chat_body(request, provider)
    field = profile(provider).max_tokens_field
    other = {"max_tokens", "max_completion_tokens"} - {field}
    assert body[field] == 77
    assert not other & set(body)


@pytest.mark.parametrize("provider", ALL)
def test_stream_usage_option(provider: str | None) -> None:
    body = chat_body(ConversationRequest(items=[User("hi")], model="m"), provider)
    assert ("stream_options" in body) is profile(provider).supports_stream_usage


@pytest.mark.parametrize("provider", ALL)
def test_developer_role(provider: str | None) -> None:
    request = ConversationRequest(items=[System("rules", developer=True), User("hi")], model="m")
    messages = chat_body(request, provider)["messages"]
    assert isinstance(messages, list)
    expected = "developer" if profile(provider).developer_role else "system"
    assert messages[0]["role"] == expected


@pytest.mark.parametrize("provider", ALL)
def test_reasoning_content_replay(provider: str | None) -> None:
    request = ConversationRequest(
        items=[User("hi"), Reasoning(text="because"), Assistant("ok"), User("again")], model="m"
    )
    messages = chat_body(request, provider)["messages"]
    assert isinstance(messages, list)
    assistant = messages[1]
    quirks = profile(provider)
    if quirks.reasoning_content_replay:
        assert assistant[quirks.reasoning_field] == "because"
    else:
        assert "reasoning_content" not in assistant and "reasoning" not in assistant


@pytest.mark.parametrize("provider", SSE)
def test_reasoning_tokens_outside_completion(provider: str | None) -> None:
    # No total_tokens: only the profile can say where the reasoning tokens are.
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "reasoning_tokens": 20}
    chunk = {"id": "c", "model": "m", "choices": [], "usage": usage}
    done = {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}],
    }
    body = (
        b"data: "
        + orjson.dumps(done)
        + b"\n\ndata: "
        + orjson.dumps(chunk)
        + b"\n\ndata: [DONE]\n\n"
    )
    events = replay(ApiBackend.CHAT_COMPLETIONS, body, provider=provider)
    response = events[-1].response  # type: ignore[union-attr]
    assert response.usage is not None
    outside = profile(provider).reasoning_tokens_outside_completion
    assert response.usage.output_tokens == (25 if outside else 5)


@pytest.mark.parametrize("provider", ALL)
def test_model_limit_headers(provider: str | None) -> None:
    quirks = profile(provider)
    window = quirks.context_window_header or "x-grok-context-window"
    cap = quirks.max_output_tokens_header or "x-grok-max-completion-tokens"
    transform = new_transform(ApiBackend.RESPONSES, provider=provider)
    events = transform.start({window: "131072", cap: "8192"})
    metadata = [e for e in events if isinstance(e, ModelMetadata)]
    assert [(m.context_window, m.max_completion_tokens) for m in metadata] == [(131072, 8192)]


def _sse(*payloads: tuple[str | None, dict[str, object]]) -> bytes:
    out = b""
    for name, payload in payloads:
        out += (b"event: " + name.encode() + b"\n" if name else b"") + b"data: "
        out += orjson.dumps(payload) + b"\n\n"
    return out


def _stream_reporting(backend: ApiBackend, cost: dict[str, float]) -> bytes:
    """A whole one-word answer on ``backend`` whose usage carries ``cost``'s fields."""
    if backend is ApiBackend.CHAT_COMPLETIONS:
        return (
            _sse(
                (
                    None,
                    {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "x"}}]},
                ),
                (
                    None,
                    {
                        "id": "c",
                        "model": "m",
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    },
                ),
                (
                    None,
                    {
                        "id": "c",
                        "model": "m",
                        "choices": [],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, **cost},
                    },
                ),
            )
            + b"data: [DONE]\n\n"
        )
    if backend is ApiBackend.RESPONSES:
        usage = {"input_tokens": 1, "output_tokens": 1, **cost}
        message = {
            "type": "message",
            "id": "m1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "x", "annotations": []}],
        }
        return _sse(
            (
                "response.created",
                {
                    "type": "response.created",
                    "response": {"id": "r", "model": "m", "status": "in_progress", "output": []},
                },
            ),
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": "m1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "x",
                },
            ),
            (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {
                        "id": "r",
                        "model": "m",
                        "status": "completed",
                        "output": [message],
                        "usage": usage,
                    },
                },
            ),
        )
    return _sse(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "usage": {"input_tokens": 1, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "x"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 1, **cost},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )


@pytest.mark.parametrize("backend", list(ApiBackend))
@pytest.mark.parametrize("provider", SSE)
def test_cost_fields(provider: str | None, backend: ApiBackend) -> None:
    # Both known fields at once: the profile decides which is read, first one first.
    cost: dict[str, float] = {COST_IN_TICKS.name: 1234, COST_IN_USD.name: 0.5}
    events = replay(backend, _stream_reporting(backend, cost), provider=provider)
    response = events[-1].response  # type: ignore[union-attr]
    fields = profile(provider).cost_fields
    expected = None if not fields else round(cost[fields[0].name] * fields[0].ticks_per_unit)
    assert response.cost_usd_ticks == expected


@pytest.mark.parametrize(
    ("usage", "ticks"),
    [
        ({"cost_in_usd_ticks": 1466250}, 1466250),
        ({"cost_in_usd_ticks": 0, "cost": 1.13e-05}, 113000),  # zero is no report: read on
        ({"cost": 0.0012}, 12_000_000),
        ({"cost": 0}, None),
        ({"cost": -1.0, "cost_in_usd_ticks": -3}, None),
        ({"cost": True, "cost_in_usd_ticks": True}, None),
        ({"cost": "1"}, None),
        ({"cost": float("inf")}, None),
        ({"cost": float("nan")}, None),
        ({"cost": 1e300}, None),
        ({}, None),
    ],
)
def test_a_reported_cost_is_a_positive_finite_number(
    usage: dict[str, object], ticks: int | None
) -> None:
    assert reported_cost(usage, NO_PROVIDER.cost_fields) == ticks


@pytest.mark.parametrize("provider", ALL)
def test_telemetry_name(provider: str | None) -> None:
    quirks = profile(provider)
    assert quirks.telemetry_name == (quirks.otel_name or quirks.name)


def test_an_unknown_provider_fails_at_construction_with_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"known providers: .*deepseek"):
        BuildOptions(provider="not-a-provider")


def test_the_generic_profile_agrees_with_what_the_builder_sends() -> None:
    # It used to declare max_tokens while the builder sent max_completion_tokens.
    request = ConversationRequest(items=[User("hi")], model="m", max_output_tokens=5)
    body = chat_body(request, "openai_compatible")
    assert body["max_tokens"] == 5 and "max_completion_tokens" not in body
    assert "stream_options" not in body


def _names_compared(tree: ast.AST) -> set[str]:
    """String constants naming a profile in ``==`` / ``!=`` / ``in`` comparisons."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                for sub in ast.walk(operand):
                    if isinstance(sub, ast.Constant) and sub.value in PROFILES:
                        names.add(sub.value)
    return names


def test_no_module_but_providers_compares_a_provider_name() -> None:
    package = Path(trio_sampler.__file__).parent
    offenders = {
        str(path.relative_to(package)): found
        for path in sorted(package.rglob("*.py"))
        if path.name != "providers.py" and (found := _names_compared(ast.parse(path.read_text())))
    }
    assert offenders == {}


def test_vertex_serves_messages_under_the_models_own_path() -> None:
    """Vertex AI: the model is in the path (``:streamRawPredict``), not the body, and the
    body names the API version (``anthropic_version``)."""
    request = ConversationRequest(items=[User("hi")], model="claude-haiku-4-5@20251001")
    wire = build_request(ApiBackend.MESSAGES, request, BuildOptions(provider="vertex", stream=True))
    assert wire.path == "/publishers/anthropic/models/claude-haiku-4-5@20251001:streamRawPredict"
    body = json.loads(wire.body)
    assert "model" not in body and body["anthropic_version"] == "vertex-2023-10-16"
    unary = build_request(
        ApiBackend.MESSAGES, request, BuildOptions(provider="vertex", stream=False)
    )
    assert unary.path.endswith(":rawPredict")
    profile = get_profile("vertex")
    assert profile.auth_scheme is AuthScheme.BEARER and profile.base_url is None


def test_bedrock_is_chat_completions_with_a_bedrock_api_key() -> None:
    profile = get_profile("bedrock")
    assert profile.backend is ApiBackend.CHAT_COMPLETIONS
    assert profile.auth_scheme is AuthScheme.BEARER
    assert profile.api_key_env == "AWS_BEARER_TOKEN_BEDROCK"
    request = ConversationRequest(items=[User("hi")], model="openai.gpt-oss-20b-1:0")
    wire = build_request(ApiBackend.CHAT_COMPLETIONS, request, BuildOptions(provider="bedrock"))
    assert (
        wire.path == "/chat/completions"
        and json.loads(wire.body)["model"] == "openai.gpt-oss-20b-1:0"
    )
