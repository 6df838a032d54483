"""Every argument of the request-side public API, given wrong types, out-of-range values
and text JSON cannot carry: each fails as the caller's error, never as ours.

A value either fails where it is written (``TypeError`` or ``ValueError`` naming the
field) or, when it is accepted there, the request it makes ends as a value or as a typed
error that is not ``internal`` (the emulator answers each, in memory, on all three
backends). Regression: a lone surrogate in a prompt, ``max_output_tokens=10**30``, a set
in tool parameters and a non-ASCII header value failed as "internal error ... please
report it".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from trio_sampler import SamplerConfig, open_sampler
from trio_sampler.emulator import EmulatorApp
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import (
    Assistant,
    ConversationItem,
    ConversationRequest,
    ImagePart,
    ResponseSchema,
    SamplingError,
    SamplingErrorKind,
    System,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    User,
)

LONE = "a\ud800b"
#: Values of the wrong type, out of range, or not encodable, tried in every field.
BAD: tuple[Any, ...] = (
    object(),
    LONE,
    10**30,
    -1,
    float("nan"),
    float("inf"),
    {1, 2},
    b"\xff",
    {"k": {1}},
    [LONE],
    {"x-key": "é"},
)
TOOL = ToolSpec("lookup", "find a thing", {"type": "object", "properties": {}})

#: (class, the valid arguments other fields are tried against, how a request is made of it)
Maker = Callable[[Any], ConversationRequest]
CLASSES: list[tuple[type[Any], dict[str, Any], Maker]] = [
    (ConversationRequest, {"items": [User("hi")]}, lambda made: made),
    (ToolSpec, {"name": "lookup"}, lambda t: ConversationRequest(items=[User("hi")], tools=[t])),
    (User, {"content": "hi"}, lambda item: ConversationRequest(items=[item])),
    (System, {"content": "be brief"}, lambda s: ConversationRequest(items=[s, User("hi")])),
    (TextPart, {"text": "hi"}, lambda part: ConversationRequest(items=[User([part])])),
    (
        Assistant,
        {"content": "earlier"},
        lambda a: ConversationRequest(items=[User("hi"), a, User("again")]),
    ),
    (
        ToolCall,
        {"id": "call_1", "name": "lookup", "arguments": "{}"},
        lambda c: ConversationRequest(
            items=[User("hi"), Assistant(tool_calls=[c]), ToolResult("call_1", "ok")],
            tools=[TOOL],
        ),
    ),
    (
        ToolResult,
        {"call_id": "call_1", "content": "ok"},
        lambda r: ConversationRequest(
            items=[
                User("hi"),
                Assistant(tool_calls=[ToolCall("call_1", "lookup", "{}")]),
                r,
            ],
            tools=[TOOL],
        ),
    ),
    (
        ImagePart,
        {"url": "https://example.com/a.png"},
        lambda part: ConversationRequest(items=[User([TextPart("see"), part])]),
    ),
    (
        ResponseSchema,
        {"name": "answer", "schema": {"type": "object", "properties": {}}},
        lambda s: ConversationRequest(items=[User("hi")], response_schema=s),
    ),
]


def _cases() -> list[tuple[str, Maker, Callable[[], Any]]]:
    cases: list[tuple[str, Maker, Callable[[], Any]]] = []
    for cls, valid, to_request in CLASSES:
        for name in attrs.fields_dict(cls):
            for index, bad in enumerate(BAD):
                label = f"{cls.__name__}.{name}#{index}"
                make: Callable[[], Any] = functools.partial(cls, **{**valid, name: bad})  # type: ignore[misc]
                cases.append((label, to_request, make))
    return cases


def _config_cases() -> list[tuple[str, Callable[[], SamplerConfig]]]:
    valid = {"base_url": "http://emulator/v1", "model": "m", "api_key": "sk-test-abcdef0123"}
    cases: list[tuple[str, Callable[[], SamplerConfig]]] = []
    for field in attrs.fields(SamplerConfig):
        for index, bad in enumerate(BAD):
            arguments = {**valid, field.name: bad}
            label = f"SamplerConfig.{field.name}#{index}"
            cases.append((label, functools.partial(SamplerConfig, **arguments)))
    return cases


async def _outcome(config: SamplerConfig, request: ConversationRequest) -> str | None:
    """``None`` when the request ended as a value or a caller's error; else what went wrong."""
    try:
        async with (
            EmulatorTransport(EmulatorApp()) as transport,
            open_sampler(config, transport=transport) as sampler,
        ):
            handle = await sampler.submit(request)
            outcome = await handle.result()
            error = getattr(outcome, "error", None)  # an Error outcome, else a Value
            if error is not None:
                raise error
    except SamplingError as exc:
        if exc.info.kind is SamplingErrorKind.INTERNAL:
            return f"internal: {exc.info.message}"
    except (TypeError, ValueError) as exc:  # refused at submit (its own message)
        del exc
    except BaseException as exc:  # anything else escaped: ours
        return f"{type(exc).__name__}: {exc!r}"[:300]
    return None


@pytest.mark.parametrize("backend", ["chat_completions", "responses", "messages"])
async def test_no_bad_request_value_is_an_internal_error(backend: str) -> None:
    config = SamplerConfig(base_url="http://emulator/v1", model="m", backend=backend)
    wrong: list[str] = []
    for label, to_request, make in _cases():
        try:
            made = make()
            request = to_request(made)
        except (TypeError, ValueError):
            continue  # refused where it was written
        except Exception as exc:
            wrong.append(f"{label}: construction raised {type(exc).__name__}: {exc}")
            continue
        problem = await _outcome(config, request)
        if problem is not None:
            wrong.append(f"{label}: {problem}")
    assert wrong == []


async def test_no_bad_config_value_is_an_internal_error() -> None:
    wrong: list[str] = []
    request = ConversationRequest(items=[User("hi")])
    for label, make in _config_cases():
        try:
            config = make()
        except (TypeError, ValueError):
            continue
        except Exception as exc:
            wrong.append(f"{label}: construction raised {type(exc).__name__}: {exc}")
            continue
        problem = await _outcome(config, request)
        if problem is not None:
            wrong.append(f"{label}: {problem}")
    assert wrong == []


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (
            lambda: ConversationRequest(items=[User("hi")], max_output_tokens=10**30),
            "max_output_tokens",
        ),
        (lambda: ConversationRequest(items=[User("hi")], temperature=float("nan")), "temperature"),
        (lambda: ConversationRequest(items=[User("hi")], top_p=2), "top_p"),
        (lambda: ConversationRequest(items=[User("hi")], model=3), "model"),  # type: ignore[arg-type]
        (lambda: ConversationRequest(items=[User("hi")], metadata={"a": 1}), "metadata"),  # type: ignore[dict-item]
        (lambda: ConversationRequest(items=[User("hi")], extra_headers={"x-a": "é"}), "x-a"),
        (lambda: ToolSpec("f", None, {"type": "object", "enum": {1, 2}}), "parameters['enum']"),
        (lambda: SamplerConfig(base_url="http://x/v1", extra_headers={"x-a": "é"}), "x-a"),
        (lambda: SamplerConfig(base_url="http://x/v1", model=3), "model"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_value_is_refused_where_it_is_written_naming_the_field(
    make: Callable[[], object], field: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        make()
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: User(LONE), "User content"),
        (lambda: User([TextPart("ok"), TextPart(LONE)]), "TextPart.text"),
        (lambda: TextPart(LONE), "TextPart.text"),
        (lambda: System(LONE), "System content"),
    ],
)
def test_a_lone_surrogate_in_a_prompt_fails_where_it_is_written(
    make: Callable[[], object], field: str
) -> None:
    with pytest.raises(ValueError, match="lone surrogate") as info:
        make()
    assert str(info.value).startswith(field)
    assert "errors='replace'" in str(info.value)


async def test_a_lone_surrogate_in_a_replayed_turn_is_an_invalid_request_naming_where() -> None:
    """Text a caller hands back as a model's turn is the model's to write: it is checked
    when the request is built, still as the caller's error, naming where it was."""
    config = SamplerConfig(base_url="http://emulator/v1", model="m")
    items: list[ConversationItem] = [User("hi"), Assistant(LONE), User("and?")]
    async with (
        EmulatorTransport(EmulatorApp()) as transport,
        open_sampler(config, transport=transport) as sampler,
    ):
        handle = await sampler.submit(ConversationRequest(items=items))
        outcome = await handle.result()
    error = getattr(outcome, "error").info  # an Error outcome  # noqa: B009
    assert error.kind is SamplingErrorKind.INVALID_REQUEST
    assert "['messages'][1]" in error.message and "lone surrogate" in error.message


def test_an_undecodable_byte_in_argv_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trio_sampler.cli import EXIT_USAGE, main

    # How Python hands over argv bytes that are not text in the locale (surrogateescape).
    assert main(["chat", b"caf\xff".decode("utf-8", "surrogateescape")]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "argument 2 holds the byte 0xff" in error and "UTF-8" in error
