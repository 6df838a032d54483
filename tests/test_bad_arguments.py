"""Bad values fail where they are written, with a message that says what to write instead.

Regression: ``max_buffered_batches=1.5`` crashed the actor; ``ConversationRequest(items=
"hello")`` and OpenAI-style dict items failed at submit as "internal error".
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from trio_sampler import (
    ApiBackend,
    Assistant,
    ConversationRequest,
    SamplerConfig,
    System,
    TextPart,
    User,
    open_sampler,
)
from trio_sampler.emulator import EmulatorApp, EmulatorServer
from trio_sampler.providers import AuthScheme, ProviderProfile
from trio_sampler.types import NamedToolChoice, ProviderTool, Reasoning, ReasoningEffort, ToolChoice
from trio_sampler.wire import get_backend, new_transform

URL = "http://127.0.0.1:9/v1"
CONFIG = SamplerConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-test-abcdef")


@pytest.mark.parametrize(
    ("items", "hint"),
    [
        ("hello", r'items=\[User\("hello"\)\]'),
        (b"hello", r'items=\[User\("hello"\)\]'),
        ({"role": "user", "content": "hi"}, r'items=\[User\("hello"\)\]'),
        ([{"role": "user", "content": "hi"}], r'items\[0\] is a dict .*write User\("\.\.\."\)'),
        ([{"role": "system", "content": "x"}], r'write System\("\.\.\."\)'),
        ([{"role": "developer", "content": "x"}], r"developer=True"),
        ([{"role": "assistant", "content": "x"}], r'write Assistant\("\.\.\."\)'),
        ([{"role": "tool", "content": "x"}], r"write ToolResult\(call_id="),
        ([User("a"), "b"], r'items\[1\] is a str; write User\("\.\.\."\)'),
        ([User("a"), 3], r"items\[1\] is of type int; items are System, User"),
        (42, r"got a int"),
    ],
)
def test_conversation_items_are_checked(items: object, hint: str) -> None:
    with pytest.raises(TypeError, match=hint):
        ConversationRequest(items=items)  # type: ignore[arg-type]


def test_a_message_in_the_error_does_not_echo_the_content() -> None:
    with pytest.raises(TypeError) as info:
        ConversationRequest(items=[{"role": "user", "content": "sk-test-SECRET-0123456789"}])  # type: ignore[list-item]
    assert "SECRET" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "hint"),
    [
        ("stop_sequences", "END", r'stop_sequences=\["END"\]; got a str'),
        ("stop_sequences", ["END", 3], r"stop_sequences\[1\] is of type int"),
        ("tools", {"name": "lookup"}, r"tools=\[ToolSpec\("),
        ("tools", [{"type": "function"}], r"tools\[0\] is of type dict"),
        ("hosted_tools", ["web_search"], r"hosted_tools\[0\] is of type str; e.g. .*WebSearch\(\)"),
    ],
)
def test_request_collections_are_checked(field: str, value: object, hint: str) -> None:
    with pytest.raises(TypeError, match=hint):
        ConversationRequest(items=[User("hi")], **{field: value})  # type: ignore[arg-type]


def test_item_contents_are_checked() -> None:
    with pytest.raises(TypeError, match=r'User\("hello"\)'):
        User({"type": "text", "text": "hi"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"content\[0\] is of type dict; write TextPart"):
        User([{"type": "text", "text": "hi"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r'System\("be brief"\)'):
        System(["be", "brief"])  # type: ignore[arg-type]
    # What is right keeps working.
    assert User([TextPart("a"), TextPart("b")]).text == "a\nb"
    assert ConversationRequest(items=(System("s"), User("u"), Assistant("a"))).items[1] == User("u")


@pytest.mark.parametrize("name", ["chat_completions", "responses", "messages", "Responses"])
def test_backends_accept_their_names(name: str) -> None:
    config = SamplerConfig(base_url="http://127.0.0.1:9/v1", backend=name)
    assert config.backend is ApiBackend(name.lower())


def test_an_unknown_backend_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'chat_completions', 'responses', 'messages'"):
        SamplerConfig(base_url="http://127.0.0.1:9/v1", backend="chat")
    with pytest.raises(TypeError, match="ApiBackend or its name"):
        SamplerConfig(base_url="http://127.0.0.1:9/v1", backend=3)  # type: ignore[arg-type]


# -- every enum-typed argument takes its name ----------------------------------------


@pytest.mark.parametrize(
    ("make", "given", "expected"),
    [
        (
            lambda v: SamplerConfig(base_url=URL, backend=v).backend,
            "chat-completions",
            ApiBackend.CHAT_COMPLETIONS,
        ),
        (lambda v: SamplerConfig(base_url=URL, backend=v).backend, "MESSAGES", ApiBackend.MESSAGES),
        (
            lambda v: SamplerConfig(base_url=URL, auth_scheme=v).auth_scheme,
            "x_api_key",
            AuthScheme.X_API_KEY,
        ),
        (
            lambda v: SamplerConfig(base_url=URL, auth_scheme=v).auth_scheme,
            "X-API-Key",
            AuthScheme.X_API_KEY,
        ),
        (lambda v: SamplerConfig(base_url=URL, auth_scheme=v).auth_scheme, "none", AuthScheme.NONE),
        (
            lambda v: ConversationRequest(items=[User("hi")], reasoning_effort=v).reasoning_effort,
            "High",
            ReasoningEffort.HIGH,
        ),
        (
            lambda v: ConversationRequest(items=[User("hi")], tool_choice=v).tool_choice,
            "required",
            ToolChoice.REQUIRED,
        ),
        (
            lambda v: ProviderTool(v, {"type": "image_generation"}).backend,
            "responses",
            ApiBackend.RESPONSES,
        ),
        (
            lambda v: ProviderProfile(name="p", base_url=None, backend=v).backend,
            "messages",
            ApiBackend.MESSAGES,
        ),
        (
            lambda v: (
                ProviderProfile(
                    name="p", base_url=None, backend=ApiBackend.MESSAGES, auth_scheme=v
                ).auth_scheme
            ),
            "x_api_key",
            AuthScheme.X_API_KEY,
        ),
        (lambda v: Reasoning(text="t", origin=v).origin, "messages", ApiBackend.MESSAGES),
        (lambda v: new_transform(v, "r").__class__.__name__, "Responses", "ResponsesTransform"),
        (lambda v: get_backend(v).name, "CHAT-COMPLETIONS", "chat_completions"),
    ],
)
def test_enum_arguments_accept_their_names(
    make: Callable[[object], object], given: str, expected: object
) -> None:
    assert make(given) == expected


@pytest.mark.parametrize(
    ("make", "valid"),
    [
        (lambda v: SamplerConfig(base_url=URL, auth_scheme=v), "'bearer', 'x_api_key', 'none'"),
        (
            lambda v: ConversationRequest(items=[User("hi")], reasoning_effort=v),
            "'none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max'",
        ),
        (
            lambda v: ConversationRequest(items=[User("hi")], tool_choice=v),
            "'auto', 'none', 'required'",
        ),
        (lambda v: ProviderTool(v, {"type": "x"}), "'chat_completions', 'responses', 'messages'"),
    ],
)
def test_an_unknown_name_lists_the_valid_ones(make: Callable[[object], object], valid: str) -> None:
    with pytest.raises(ValueError, match=re.escape(valid)):
        make("bogus")
    with pytest.raises(TypeError, match=re.escape(valid)):
        make(3)


def test_an_unknown_name_that_may_be_a_key_is_not_echoed() -> None:
    key = "sk-test-SECRET-0123456789abcdef"
    with pytest.raises(ValueError) as info:
        SamplerConfig(base_url=URL, auth_scheme=key)
    assert "SECRET" not in str(info.value) and f"{len(key)}-character string" in str(info.value)


def test_tool_choice_says_how_to_name_a_tool() -> None:
    with pytest.raises(TypeError, match=r'NamedToolChoice\("tool_name"\)'):
        ConversationRequest(items=[User("hi")], tool_choice={"type": "function", "name": "f"})  # type: ignore[arg-type]
    named = NamedToolChoice("lookup")
    assert ConversationRequest(items=[User("hi")], tool_choice=named).tool_choice is named


def test_the_emulator_url_takes_a_backend_or_its_name() -> None:
    server = EmulatorServer(host="127.0.0.1", port=8080, app=EmulatorApp())
    assert server.url_for(ApiBackend.RESPONSES) == server.url_for("Responses")
    assert server.url_for("chat-completions").endswith("/v1/chat/completions")
    with pytest.raises(ValueError, match="chat_completions, responses, messages"):
        server.url_for("chat")


@pytest.mark.parametrize(
    ("kwargs", "error", "hint"),
    [
        ({"max_buffered_batches": 1.5}, ValueError, r"max_buffered_batches=16; got 1\.5"),
        ({"max_buffered_batches": 0}, ValueError, "at least 1"),
        ({"max_buffered_batches": True}, ValueError, "whole number"),
        ({"max_concurrency": 0}, ValueError, r"max_concurrency=100 \(or None"),
        ({"max_concurrency": "8"}, ValueError, "whole number"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"retry_policy": {"max_retries": 2}}, TypeError, r"RetryPolicy\(max_retries=2\)"),
    ],
)
def test_open_sampler_checks_its_arguments_at_the_call(
    kwargs: dict[str, object], error: type[Exception], hint: str
) -> None:
    # Raised by the call itself, before any ``async with``: no event loop involved.
    with pytest.raises(error, match=hint):
        open_sampler(CONFIG, **kwargs)  # type: ignore[arg-type]


def test_open_sampler_wants_a_config_and_does_not_echo_it() -> None:
    with pytest.raises(TypeError, match=r"SamplerConfig\(base_url=") as info:
        open_sampler({"base_url": "x", "api_key": "sk-test-SECRET-0123456789"})  # type: ignore[arg-type]
    assert "SECRET" not in str(info.value)


async def test_submit_checks_its_arguments() -> None:
    async with open_sampler(CONFIG) as sampler:
        with pytest.raises(TypeError, match=r'ConversationRequest\(items=\[User\("hello"\)\]\)'):
            await sampler.submit([User("hello")])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="config must be a SamplerConfig"):
            await sampler.submit(ConversationRequest(items=[User("x")]), config={})  # type: ignore[arg-type]
        assert await sampler.active_count() == 0
