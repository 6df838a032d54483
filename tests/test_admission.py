"""An admission of one's own: subclass the base classes and override what you need.

The sampler admits every attempt through the route's gate, tells the ticket what the
provider reported of its limits, settles it with the usage the attempt reached, and asks
the gate before each retry; the defaults admit everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import trio
from fakes import Reply, ScriptedTransport, chat_stream, make_config

from trio_sampler.actor import open_sampler
from trio_sampler.admission import Admission, AdmissionGate, AdmissionRefusedError, Ticket
from trio_sampler.config import RetryPolicy, SamplerConfig
from trio_sampler.fleet import FleetAdmission, FleetLimits, LimiterSpec
from trio_sampler.routing import CircuitBreaker, Route, RouteBreaker, RoutingPolicy
from trio_sampler.types import (
    Completed,
    ConversationRequest,
    Failed,
    RateLimitSnapshot,
    SamplingErrorInfo,
    SamplingErrorKind,
    Usage,
    User,
)
from trio_sampler.wire import WireRequest

REQUEST = ConversationRequest(items=[User("hi")])
LIMITED = {"content-type": "text/event-stream", "x-ratelimit-remaining-requests": "7"}


class Recorded(Ticket):
    def __init__(self, log: list[str], number: int) -> None:
        self.log = log
        self.number = number

    def observe(self, snapshot: RateLimitSnapshot, at: float) -> None:
        remaining = None if snapshot.requests is None else snapshot.requests.remaining
        self.log.append(f"observe {self.number} {remaining}")

    async def settle(self, usage: Usage | None) -> None:
        tokens = None if usage is None else usage.output_tokens
        self.log.append(f"settle {self.number} {tokens}")


class Gate(AdmissionGate):
    def __init__(self, *, allow_retries: bool = True, refuse: bool = False) -> None:
        self.log: list[str] = []
        self.allow_retries = allow_retries
        self.refuse = refuse

    async def admit(
        self, wire: WireRequest, config: SamplerConfig, *, deadline: float, first_attempt: bool
    ) -> Ticket:
        number = sum(entry.startswith("admit") for entry in self.log) + 1
        self.log.append(f"admit {number} first={first_attempt}")
        if self.refuse:
            raise AdmissionRefusedError(
                SamplingErrorInfo(SamplingErrorKind.OVERLOADED, "no room", error_code="full")
            )
        return Recorded(self.log, number)

    async def retry_allowed(self, error: SamplingErrorInfo) -> bool:
        self.log.append(f"retry? {error.kind.value}")
        return self.allow_retries


class Mine(Admission):
    def __init__(self, gate: AdmissionGate) -> None:
        self.gate = gate
        self.routes: list[Sequence[str] | None] = []

    def check_routes(self, routes: Sequence[str] | None) -> None:
        self.routes.append(routes)

    def open(self) -> AbstractAsyncContextManager[AdmissionGate]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[AdmissionGate]:
            yield self.gate

        return opened()


async def _run(admission: Admission, script: list[Reply], retries: int = 1) -> object:
    config = make_config(retry=RetryPolicy(max_retries=retries, base_delay=0.01, max_delay=0.01))
    transport = ScriptedTransport(script)
    async with open_sampler(config, transport=transport, admission=admission) as sampler:
        stream = await sampler.submit(REQUEST)
        return [event async for event in stream][-1]


async def test_every_attempt_is_admitted_observed_settled_and_its_retry_asked(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = Gate()
    admission = Mine(gate)
    end = await _run(
        admission,
        [
            Reply(status=503, headers={"x-ratelimit-remaining-requests": "3"}),
            Reply(headers=LIMITED, chunks=chat_stream("Hello")),
        ],
    )
    assert isinstance(end, Completed)
    assert admission.routes == [None]  # the sampler has no routing
    assert gate.log == [
        "admit 1 first=True",
        "observe 1 3",
        "settle 1 None",
        "retry? overloaded",
        "admit 2 first=False",
        "observe 2 7",
        f"settle 2 {end.response.usage.output_tokens if end.response.usage else None}",
    ]


async def test_a_gate_that_refuses_a_retry_ends_the_request(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = Gate(allow_retries=False)
    end = await _run(Mine(gate), [Reply(status=503)])
    assert isinstance(end, Failed)
    assert end.error.message.endswith("(not retried: the fleet retry budget is spent)")
    assert gate.log == ["admit 1 first=True", "settle 1 None", "retry? overloaded"]


async def test_a_refusal_is_the_requests_failure(autojump_clock: trio.abc.Clock) -> None:
    transport_replies = [Reply(chunks=chat_stream("never sent"))]
    end = await _run(Mine(Gate(refuse=True)), transport_replies)
    assert isinstance(end, Failed)
    assert end.error.error_code == "full"


async def test_the_defaults_admit_everything(autojump_clock: trio.abc.Clock) -> None:
    end = await _run(Admission(), [Reply(chunks=chat_stream("Hello"))])
    assert isinstance(end, Completed)
    gate = AdmissionGate()
    assert gate.for_route("any") is gate
    assert gate.name is None
    assert not gate.chooses_routes
    assert await gate.retry_allowed(SamplingErrorInfo(SamplingErrorKind.HTTP, "x"))


def test_a_gate_chooses_routes_by_overriding_try_admit() -> None:
    class Choosing(AdmissionGate):
        async def try_admit(
            self,
            wire: WireRequest,
            config: SamplerConfig,
            *,
            within: float,
            deadline: float,
            first_attempt: bool,
        ) -> Ticket:
            return Ticket()

    assert Choosing().chooses_routes
    assert not Gate().chooses_routes


def test_open_sampler_takes_an_admission_only() -> None:
    with pytest.raises(TypeError, match="admission must be an Admission"):
        open_sampler(make_config(), admission=Gate())  # type: ignore[arg-type]


# -- a route's own admission (``Route(admission=...)``) --------------------------------


class Sharing(Gate):
    """A gate that records which routes' breakers it was asked to share."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: list[str] = []

    def share_breaker(self, route: str, breaker: RouteBreaker) -> CircuitBreaker:
        self.shared.append(route)
        return breaker


class Counted(Mine):
    def __init__(self, gate: AdmissionGate) -> None:
        super().__init__(gate)
        self.opened = 0

    def open(self) -> AbstractAsyncContextManager[AdmissionGate]:
        self.opened += 1
        return super().open()


async def test_a_route_with_its_own_admission_is_admitted_by_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The route's own admission is opened with the sampler (once for the routes that
    share it), checked against their names, shares their breakers, and admits their
    attempts; a route without one goes through the sampler's."""
    own_gate, sampler_gate = Sharing(), Sharing()
    own, shared = Counted(own_gate), Counted(sampler_gate)
    config = make_config(retry=RetryPolicy(max_retries=0))
    routing = RoutingPolicy(
        [
            Route("primary", config, admission=own),
            Route("secondary", config, admission=own),
            Route("backup", config),
        ]
    )
    transport = ScriptedTransport(
        [Reply(status=503), Reply(status=503), Reply(chunks=chat_stream("Hello"))]
    )
    async with open_sampler(transport=transport, admission=shared, routing=routing) as sampler:
        end = [event async for event in await sampler.submit(REQUEST)][-1]
    assert isinstance(end, Completed) and end.route == "backup"
    assert (own.opened, shared.opened) == (1, 1)
    assert own.routes == [("primary", "secondary")]
    assert shared.routes == [("primary", "secondary", "backup")]
    assert own_gate.shared == ["primary", "secondary"]
    assert sampler_gate.shared == ["backup"]
    assert own_gate.log == [
        "admit 1 first=True",
        "settle 1 None",
        "admit 2 first=False",
        "settle 2 None",
    ]
    assert [entry.split()[0] for entry in sampler_gate.log] == ["admit", "settle"]


def test_a_routes_admission_is_an_admission() -> None:
    with pytest.raises(TypeError, match=r"Route\.admission is an Admission"):
        Route("primary", make_config(), admission=Gate())  # type: ignore[arg-type]


def test_a_routes_repr_names_its_admission_without_its_settings() -> None:
    fleet = FleetAdmission(
        "redis://:hunter2-SECRET@redis.test:6379/0",
        LimiterSpec("openai:org-abc", FleetLimits(requests_per_minute=60), "fail_closed"),
    )
    route = Route("primary", make_config(), admission=fleet)
    assert "admission=<FleetAdmission>" in repr(route)
    assert "SECRET" not in repr(route) and "SECRET" not in str(route)
