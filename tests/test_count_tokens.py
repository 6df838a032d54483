"""``SamplerHandle.count_tokens``: the provider's count where it has a counting endpoint
(the emulator's agrees with what it bills), else an estimate that says it is one; and the
estimator hook of the pacer and the fleet."""

from __future__ import annotations

import pytest

from trio_sampler import (
    ApiBackend,
    Completed,
    ConversationRequest,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.emulator import EmulatorApp, PromptCache
from trio_sampler.fleet import FailurePolicy, FleetLimits, LimiterSpec
from trio_sampler.ratelimit import pacing_cost
from trio_sampler.testing import EmulatorTransport
from trio_sampler.tokens import TokenCount, TokenCountSource
from trio_sampler.types import SamplingError, System
from trio_sampler.wire import BuildOptions, WireRequest, build_request

REQUEST = ConversationRequest(
    [System("You count things carefully."), User("How many words are in this sentence? " * 40)]
)


def _config(backend: ApiBackend) -> SamplerConfig:
    return SamplerConfig(
        base_url="http://emulator/v1", backend=backend, model="emulator-1", api_key="sk-test"
    )


@pytest.mark.parametrize(
    ("backend", "source"),
    [
        (ApiBackend.MESSAGES, TokenCountSource.MESSAGES_COUNT_TOKENS),
        (ApiBackend.RESPONSES, TokenCountSource.RESPONSES_INPUT_TOKENS),
    ],
)
async def test_the_count_is_what_the_request_is_billed(
    backend: ApiBackend, source: TokenCountSource
) -> None:
    app = EmulatorApp(cache=PromptCache())
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(_config(backend), transport=transport) as sampler,
    ):
        count = await sampler.count_tokens(REQUEST)
        completed = (await (await sampler.submit(REQUEST)).result()).terminal
    assert isinstance(completed, Completed)
    assert completed.response.usage is not None
    assert count == TokenCount(completed.response.usage.input_tokens, True, source)


async def test_chat_completions_is_estimated_and_says_so() -> None:
    async with (
        EmulatorTransport(EmulatorApp(cache=PromptCache())) as transport,
        open_sampler(_config(ApiBackend.CHAT_COMPLETIONS), transport=transport) as sampler,
    ):
        count = await sampler.count_tokens(REQUEST)
    wire = build_request(ApiBackend.CHAT_COMPLETIONS, REQUEST, BuildOptions(model="emulator-1"))
    assert not count.exact
    assert count.source is TokenCountSource.BODY_ESTIMATE
    assert count.tokens == -(-len(wire.body) // 4)
    assert "no counting endpoint" in count.detail


async def test_a_server_without_the_endpoint_gets_an_estimate() -> None:
    # The emulator has no counting endpoint under this prefix: it answers 404.
    config = SamplerConfig(
        base_url="http://emulator/v1/elsewhere",
        backend=ApiBackend.MESSAGES,
        model="emulator-1",
        api_key="sk-test",
    )
    async with (
        EmulatorTransport(EmulatorApp(cache=PromptCache())) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        count = await sampler.count_tokens(REQUEST)
    assert (count.exact, count.source) == (False, TokenCountSource.BODY_ESTIMATE)
    assert "answered 404" in count.detail


async def test_a_failing_endpoint_raises_a_typed_error() -> None:
    app = EmulatorApp(cache=PromptCache(), require_key="sk-other")
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(_config(ApiBackend.MESSAGES), transport=transport) as sampler,
    ):
        with pytest.raises(SamplingError) as caught:
            await sampler.count_tokens(REQUEST)
    assert caught.value.info.status_code == 401


def test_the_pacer_and_the_fleet_use_the_estimator() -> None:
    wire = build_request(ApiBackend.RESPONSES, REQUEST, BuildOptions(model="m"))

    def counted(request: WireRequest) -> int | None:
        return 1234 if request is wire else None

    cost = pacing_cost(wire, default_max_output_tokens=10, estimator=counted)
    assert cost.input_tokens == 1234
    other = build_request(
        ApiBackend.RESPONSES, ConversationRequest([User("x")]), BuildOptions(model="m")
    )
    assert pacing_cost(other, default_max_output_tokens=10, estimator=counted).input_tokens == (
        -(-len(other.body) // 4)
    )
    spec = LimiterSpec(
        "openai:test",
        FleetLimits(tokens_per_minute=100_000),
        FailurePolicy.FAIL_CLOSED,
        estimator=counted,
    )
    assert spec.estimate_input_tokens(wire.body, wire) == 1234
    assert spec.estimate_input_tokens(other.body, other) == -(-len(other.body) // 4)
