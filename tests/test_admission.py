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
