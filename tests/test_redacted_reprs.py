"""Every ``repr`` and ``str`` of an object that can hold a credential shows it redacted.

The walk: every public class (the ``__all__`` of ``trio_sampler`` and of each of its
public modules and subpackages) whose constructor takes something that can carry a
credential (a key, a header, a URL, a transport, a config, ...) is either built below with
a secret in every such place, or listed as holding none, with the reason. A new class of
either kind fails the walk until it is placed. Regression: ``repr(ConversationRequest)``
showed per-request credential headers, ``repr(FleetAdmission)`` the Redis password.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import pytest

import trio_sampler
from trio_sampler.agent import AgentResult, AgentStop
from trio_sampler.client import SamplingClient
from trio_sampler.config import SamplerConfig
from trio_sampler.emulator import EmulatorApp, EmulatorServer
from trio_sampler.fleet import FleetAdmission, FleetLimits, LimiterSpec
from trio_sampler.loadtest import Concurrency, LoadTest
from trio_sampler.models import ModelInfo, ModelPrices
from trio_sampler.providers import ProviderProfile
from trio_sampler.recording import Exchange
from trio_sampler.routing import Route, RoutingPolicy
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import (
    ApiBackend,
    ConversationRequest,
    ImagePart,
    ImagesStripped,
    MCPServer,
    StripReason,
    User,
)
from trio_sampler.wire import WireRequest

SECRET = "sk-REPRLEAK-5e1f0c3a9b7d4e2f8a6c"
MARKER = "REPRLEAK"


def _config() -> SamplerConfig:
    return SamplerConfig(
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key=SECRET,
        extra_headers={"x-api-key": SECRET, "Authorization": f"Bearer {SECRET}"},
        query_params={"key": SECRET},
    )


def _spec() -> LimiterSpec:
    return LimiterSpec("acct", FleetLimits(requests_per_minute=60), "fail_closed")


#: How to build each class with a secret in every place that can hold one.
BUILT: dict[type, Callable[[], object]] = {
    SamplerConfig: _config,
    ConversationRequest: lambda: ConversationRequest(
        items=[User("hi")],
        extra_headers={"authorization": f"Bearer {SECRET}", "x-gateway-key": SECRET},
    ),
    ImagePart: lambda: ImagePart(f"https://img.example.com/a.png?X-Amz-Signature={SECRET}"),
    ImagesStripped: lambda: ImagesStripped(
        "req", (f"https://img.example.com/a.png?sig={SECRET}",), StripReason.SERVER_REJECTED
    ),
    MCPServer: lambda: MCPServer(
        "tools", f"https://mcp.example.com/sse?token={SECRET}", authorization=SECRET
    ),
    ProviderProfile: lambda: ProviderProfile(
        name="p", base_url=f"https://api.example.com/v1?key={SECRET}", backend="responses"
    ),
    ModelInfo: lambda: ModelInfo(
        "m",
        "p",
        ApiBackend.RESPONSES,
        1000,
        100,
        ModelPrices(input=1.0, output=2.0),
        base_url=f"https://api.example.com/v1?api_key={SECRET}",
    ),
    Route: lambda: Route(
        "primary",
        _config(),
        admission=FleetAdmission(f"redis://default:{SECRET}@redis.example.com:6379/0", _spec()),
    ),
    RoutingPolicy: lambda: RoutingPolicy([Route("primary", _config()), Route("backup", _config())]),
    FleetAdmission: lambda: FleetAdmission(
        f"redis://default:{SECRET}@redis.example.com:6379/0", _spec()
    ),
    EmulatorApp: lambda: EmulatorApp(require_key=SECRET),
    EmulatorServer: lambda: EmulatorServer("127.0.0.1", 8080, EmulatorApp(require_key=SECRET)),
    EmulatorTransport: lambda: EmulatorTransport(EmulatorApp(require_key=SECRET)),
    SamplingClient: lambda: SamplingClient(_config()),
    WireRequest: lambda: WireRequest(
        "/chat/completions",
        b"{}",
        {},
        headers=(("Authorization", f"Bearer {SECRET}"), ("x-api-key", SECRET)),
    ),
    LoadTest: lambda: LoadTest(_config(), [Concurrency(1)]),
    AgentResult: lambda: AgentResult(AgentStop.FINAL_ANSWER, (User("hi"),), config=_config()),
    Exchange: lambda: Exchange(
        "POST",
        f"https://api.example.com/v1/chat/completions?key={SECRET}",
        (("authorization", f"Bearer {SECRET}"), ("x-api-key", SECRET)),
        b"{}",
        200,
        (),
        0.0,
        (),
        0.0,
    ),
}

#: Classes whose constructor names something credential-like that holds none.
HOLDS_NONE: dict[str, str] = {
    "Timeouts": "response_headers is a number of seconds",
    "WireBackend": "default_headers are a protocol's fixed headers (anthropic-version)",
    "LimiterSpec": "admission_timeout is a number of seconds",
    "FleetGate": "routes map route names to limiters, which hold no URL",
    "LimiterDegraded": "routes are route names",
    "LimiterRecovered": "routes are route names",
    "RouteSnapshot": "admission is a count of attempts",
    "RequestTelemetry": "built by the sampler around a config, whose repr is covered",
    "AgentTurn": "its repr is the default object repr: it shows none of its fields",
}

_CAN_HOLD = re.compile(
    r"api_key|^key$|secret|password|authorization|headers?$|url$|urls$|query|transport"
    r"|credential|^config$|require_key|^routes$|admission|^app$",
    re.I,
)


def _public_classes() -> dict[str, type]:
    modules = [trio_sampler.__name__] + [
        f"{trio_sampler.__name__}.{info.name}"
        for info in pkgutil.iter_modules(trio_sampler.__path__)
        if not info.name.startswith("_")
    ]
    found: dict[str, type] = {}
    for name in modules:
        module = importlib.import_module(name)
        for export in getattr(module, "__all__", ()):
            value = getattr(module, export, None)
            if inspect.isclass(value):
                found.setdefault(value.__qualname__, value)
    return found


def _parameters(cls: type) -> list[str]:
    try:
        return list(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return []


def test_every_public_class_that_can_hold_a_credential_is_walked() -> None:
    classes = _public_classes()
    unplaced = [
        name
        for name, cls in sorted(classes.items())
        if any(_CAN_HOLD.search(p) for p in _parameters(cls))
        and cls not in BUILT
        and name not in HOLDS_NONE
    ]
    assert unplaced == [], "build these in BUILT, or say in HOLDS_NONE why they hold none"
    assert set(HOLDS_NONE) <= set(classes), "HOLDS_NONE names a class that is gone"


@pytest.mark.parametrize("cls", list(BUILT), ids=lambda cls: cls.__name__)
def test_repr_and_str_show_the_secret_redacted(cls: type) -> None:
    instance: Any = BUILT[cls]()
    assert isinstance(instance, cls)
    for text in (repr(instance), str(instance)):
        assert MARKER not in text, text
