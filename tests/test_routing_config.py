"""Routing configuration without surprises: a routed sampler needs no base config, and the
precedence between the sampler's policies and the routes' is a rule checked at construction."""

from __future__ import annotations

import pytest
import trio.testing
from fakes import Reply, ScriptedTransport, chat_stream, error_reply, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.routing import Route, RoutingPolicy
from trio_sampler.types import Completed, ConversationRequest, Failed, User

REQUEST = ConversationRequest(items=[User("hi")])
PRIMARY = make_config(base_url="http://primary.test/v1")
FALLBACK = make_config(base_url="http://fallback.test/v1")


async def test_a_routed_sampler_needs_no_base_config(
    autojump_clock: trio.testing.MockClock,
) -> None:
    routing = RoutingPolicy([Route("primary", PRIMARY), Route("fallback", FALLBACK)])
    transport = ScriptedTransport([Reply(chunks=chat_stream("hello"))])
    async with open_sampler(routing=routing, transport=transport) as sampler:
        stream = await sampler.submit(REQUEST)
        async with stream:
            events = [event async for event in stream]
        # The sampler's own default is no separate endpoint: no total of its own either.
        assert sampler.config.timeouts.total is None
    terminal = events[-1]
    assert isinstance(terminal, Completed)
    assert terminal.metrics is not None and terminal.metrics.route == "primary"
    assert transport.requests[0].url.host == "primary.test"


def test_a_sampler_needs_a_config_or_a_routing() -> None:
    with pytest.raises(TypeError, match=r"open_sampler\(config\) or open_sampler\(routing="):
        open_sampler()


def test_a_sampler_retry_policy_over_routes_with_their_own_is_refused() -> None:
    own = PRIMARY.evolve(retry=RetryPolicy(max_retries=5))
    routing = RoutingPolicy([Route("primary", own), Route("fallback", FALLBACK)])
    with pytest.raises(ValueError, match="route 'primary' sets its own") as caught:
        open_sampler(routing=routing, retry_policy=RetryPolicy(max_retries=1))
    assert "retry=RetryPolicy" in str(caught.value)  # says what to write instead


def test_a_base_config_retry_that_no_routed_request_would_use_is_refused() -> None:
    base = make_config(base_url="http://base.test/v1", retry=RetryPolicy(max_retries=7))
    routing = RoutingPolicy([Route("primary", PRIMARY)])
    with pytest.raises(ValueError, match=r"config\.retry"):
        open_sampler(base, routing=routing)


async def test_a_sampler_retry_policy_applies_to_routes_without_their_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    routing = RoutingPolicy([Route("primary", PRIMARY)], max_retry_wait_s=60.0)
    transport = ScriptedTransport([error_reply(503), Reply(chunks=chat_stream("late"))])
    no_retries = RetryPolicy(max_retries=0)
    async with open_sampler(routing=routing, transport=transport, retry_policy=no_retries) as s:
        stream = await s.submit(REQUEST)
        async with stream:
            events = [event async for event in stream]
    assert isinstance(events[-1], Failed)
    assert len(transport.requests) == 1


async def test_a_route_in_the_chain_stands_in_for_the_policys_route_of_that_name(
    autojump_clock: trio.testing.MockClock,
) -> None:
    routing = RoutingPolicy([Route("primary", PRIMARY), Route("fallback", FALLBACK)])
    fresh = Route("primary", PRIMARY.evolve(api_key="sk-fresh-key-0123456789"))
    transport = ScriptedTransport([Reply(chunks=chat_stream("hello"))])
    async with open_sampler(routing=routing, transport=transport) as sampler:
        response = await sampler.submit_and_collect(REQUEST, chain=[fresh, "fallback"])
        assert sampler.routing is routing  # the policy itself is unchanged
    assert response.text == "hello"
    assert transport.requests[0].headers["authorization"] == "Bearer sk-fresh-key-0123456789"
    with pytest.raises(ValueError, match="no route is named 'other'"):
        RoutingPolicy([Route("primary", PRIMARY)]).chain(["other"])
