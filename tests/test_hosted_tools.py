"""Hosted tools as a family: each backend renders what it supports, reports the rest, and
``parse_request`` keeps every tool it reads (modeled, or verbatim as a ``ProviderTool``).

The wire shapes are written from the documented request formats of each backend.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import orjson
import pytest

import trio_sampler
from trio_sampler import ApiBackend, ConversationRequest, ToolSpec, User
from trio_sampler.types import (
    CodeExecution,
    FileSearch,
    HostedTool,
    MCPServer,
    ProviderTool,
    ToolChoice,
    WebFetch,
    WebSearch,
)
from trio_sampler.wire._request import BuildOptions, ConversionAction, ConversionError
from trio_sampler.wire.chat_completions import _request as chat
from trio_sampler.wire.messages import _request as messages
from trio_sampler.wire.responses import _request as responses

MODULES: dict[ApiBackend, ModuleType] = {
    ApiBackend.CHAT_COMPLETIONS: chat,
    ApiBackend.RESPONSES: responses,
    ApiBackend.MESSAGES: messages,
}

MCP = MCPServer(
    "deepwiki",
    "https://mcp.deepwiki.com/mcp",
    allowed_tools=["ask_question"],
    authorization="secret-mcp-token",
)

#: (tool, Responses rendering, Messages rendering); ``None``: not supported there.
RENDERINGS: list[tuple[HostedTool, Any, Any]] = [
    (
        WebSearch(allowed_domains=["example.com"], max_uses=None),
        {"type": "web_search", "filters": {"allowed_domains": ["example.com"]}},
        {"type": "web_search_20250305", "name": "web_search", "allowed_domains": ["example.com"]},
    ),
    (
        WebFetch(
            max_uses=3,
            allowed_domains=["docs.example.com"],
            citations=True,
            max_content_tokens=5000,
            version="20260101",
        ),
        None,
        {
            "type": "web_fetch_20260101",
            "name": "web_fetch",
            "max_uses": 3,
            "allowed_domains": ["docs.example.com"],
            "citations": {"enabled": True},
            "max_content_tokens": 5000,
        },
    ),
    (
        WebFetch(blocked_domains=["private.example.com"]),
        None,
        {
            "type": "web_fetch_20250910",
            "name": "web_fetch",
            "blocked_domains": ["private.example.com"],
        },
    ),
    (
        CodeExecution(),
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "code_execution_20250825", "name": "code_execution"},
    ),
    (
        CodeExecution(file_ids=["file-abc"]),
        {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-abc"]}},
        None,  # Messages takes no files on the tool: see test_lossy_renderings_are_reported
    ),
    (
        CodeExecution(container="cntr_123"),
        {"type": "code_interpreter", "container": "cntr_123"},
        None,
    ),
    (
        FileSearch(["vs_1", "vs_2"], max_num_results=8),
        {"type": "file_search", "vector_store_ids": ["vs_1", "vs_2"], "max_num_results": 8},
        None,
    ),
    (
        MCPServer("deepwiki", "https://mcp.deepwiki.com/mcp", require_approval="never"),
        {
            "type": "mcp",
            "server_label": "deepwiki",
            "server_url": "https://mcp.deepwiki.com/mcp",
            "require_approval": "never",
        },
        None,  # Messages: an mcp_servers entry, see test_mcp_servers_on_messages
    ),
    (
        ProviderTool(ApiBackend.RESPONSES, {"type": "image_generation", "quality": "low"}),
        {"type": "image_generation", "quality": "low"},
        None,
    ),
    (
        ProviderTool(
            ApiBackend.MESSAGES,
            {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
        ),
        None,
        {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
    ),
]


def build(backend: ApiBackend, request: ConversationRequest, **options: Any) -> Any:
    return MODULES[backend].build_request(request, BuildOptions(model="m", **options))


def with_tools(*hosted: HostedTool, tools: tuple[ToolSpec, ...] = ()) -> ConversationRequest:
    return ConversationRequest(items=[User("hi")], tools=tools, hosted_tools=hosted)


def test_the_family_is_exported() -> None:
    for name in ("WebSearch", "WebFetch", "CodeExecution", "FileSearch", "MCPServer"):
        assert name in trio_sampler.types.__all__
    assert "ProviderTool" in trio_sampler.types.__all__


@pytest.mark.parametrize(("tool", "wire", "_"), RENDERINGS)
def test_responses_rendering(tool: HostedTool, wire: Any, _: Any) -> None:
    built = build(ApiBackend.RESPONSES, with_tools(tool))
    if wire is None:
        assert "tools" not in built.data
        assert [n.action for n in built.report.notes] == [ConversionAction.DROPPED]
    else:
        assert built.data["tools"] == [wire]
        assert built.report.lossless


@pytest.mark.parametrize(("tool", "_", "wire"), RENDERINGS)
def test_messages_rendering(tool: HostedTool, _: Any, wire: Any) -> None:
    built = build(ApiBackend.MESSAGES, with_tools(tool))
    if wire is not None:
        assert built.data["tools"] == [wire]
        assert built.report.lossless
    elif not isinstance(tool, MCPServer | CodeExecution):
        assert "tools" not in built.data
        assert [n.action for n in built.report.notes] == [ConversionAction.DROPPED]


@pytest.mark.parametrize(("tool", "_", "__"), RENDERINGS)
def test_chat_completions_drops_every_modeled_hosted_tool(
    tool: HostedTool, _: Any, __: Any
) -> None:
    built = build(ApiBackend.CHAT_COMPLETIONS, with_tools(tool))
    assert "tools" not in built.data
    (note,) = built.report.notes
    assert note.action is ConversionAction.DROPPED
    assert note.item_index is None


def test_chat_completions_passes_its_own_provider_tools() -> None:
    tool = ProviderTool(
        ApiBackend.CHAT_COMPLETIONS,
        {"type": "openrouter:web_search", "parameters": {"max_uses": 1}},
    )
    built = build(ApiBackend.CHAT_COMPLETIONS, with_tools(tool))
    assert built.data["tools"] == [{"type": "openrouter:web_search", "parameters": {"max_uses": 1}}]
    assert built.report.lossless


@pytest.mark.parametrize("backend", list(ApiBackend))
def test_strict_mode_refuses_an_unsupported_hosted_tool(backend: ApiBackend) -> None:
    foreign = ApiBackend.RESPONSES if backend is not ApiBackend.RESPONSES else ApiBackend.MESSAGES
    with pytest.raises(ConversionError, match="cannot be sent on this backend"):
        build(backend, with_tools(ProviderTool(foreign, {"type": "x"})), strict=True)


def test_lossy_renderings_are_reported() -> None:
    cases: list[tuple[ApiBackend, HostedTool, str]] = [
        (ApiBackend.RESPONSES, WebSearch(max_uses=2), "no use limit"),
        (ApiBackend.MESSAGES, WebSearch(search_context_size="high"), "no context size"),
        (ApiBackend.MESSAGES, CodeExecution(file_ids=["file-1"]), "no container or files"),
        (ApiBackend.RESPONSES, CodeExecution(container="c", file_ids=["f"]), "automatic"),
        (
            ApiBackend.MESSAGES,
            MCPServer("a", "https://a.example", require_approval="always"),
            "approval",
        ),
    ]
    for backend, tool, detail in cases:
        built = build(backend, with_tools(tool))
        (note,) = built.report.notes
        assert note.action is ConversionAction.DROPPED
        assert detail in note.detail, (backend, tool)


def test_mcp_servers_on_messages() -> None:
    built = build(ApiBackend.MESSAGES, with_tools(MCP))
    assert built.data["mcp_servers"] == [
        {
            "type": "url",
            "url": "https://mcp.deepwiki.com/mcp",
            "name": "deepwiki",
            "authorization_token": "secret-mcp-token",
            "tool_configuration": {"enabled": True, "allowed_tools": ["ask_question"]},
        }
    ]
    assert "tools" not in built.data
    assert ("anthropic-beta", "mcp-client-2025-04-04") in built.headers
    assert built.report.lossless


def test_tool_controls_are_kept_when_the_only_tools_are_mcp_servers() -> None:
    request = ConversationRequest(
        items=[User("hi")], hosted_tools=[MCP], tool_choice=ToolChoice.AUTO
    )
    built = build(ApiBackend.MESSAGES, request)
    assert built.data["tool_choice"] == {"type": "auto"}
    assert built.report.lossless


def test_mcp_authorization_is_sent_but_never_shown() -> None:
    assert "secret-mcp-token" not in repr(MCP)
    assert "secret-mcp-token" not in repr(with_tools(MCP))
    built = build(ApiBackend.RESPONSES, with_tools(MCP))
    assert built.data["tools"][0]["authorization"] == "secret-mcp-token"


@pytest.mark.parametrize("backend", [ApiBackend.RESPONSES, ApiBackend.MESSAGES])
def test_deferred_function_tools(backend: ApiBackend) -> None:
    spec = ToolSpec(
        "lookup", "Look it up.", {"type": "object", "properties": {}}, defer_loading=True
    )
    built = build(backend, with_tools(tools=(spec,)))
    assert built.data["tools"][0]["defer_loading"] is True
    parsed = MODULES[backend].parse_request(built.data)
    assert parsed.tools == (spec,)


def test_deferred_loading_is_reported_on_chat_completions() -> None:
    spec = ToolSpec("lookup", defer_loading=True)
    built = build(ApiBackend.CHAT_COMPLETIONS, with_tools(tools=(spec,)))
    assert "defer_loading" not in orjson.dumps(built.data).decode()
    (note,) = built.report.notes
    assert "defer_loading" in note.what


@pytest.mark.parametrize("backend", [ApiBackend.RESPONSES, ApiBackend.MESSAGES])
def test_every_supported_tool_survives_build_then_parse(backend: ApiBackend) -> None:
    column = 1 if backend is ApiBackend.RESPONSES else 2
    supported = [row[0] for row in RENDERINGS if row[column] is not None]
    if backend is ApiBackend.MESSAGES:
        supported.append(MCP)
    request = with_tools(*supported)
    built = build(backend, request)
    assert built.report.lossless
    assert MODULES[backend].parse_request(built.data).hosted_tools == tuple(supported)


@pytest.mark.parametrize(
    ("backend", "raw"),
    [
        # Fields the modeled classes do not have: kept whole, never trimmed to the model.
        (ApiBackend.RESPONSES, {"type": "web_search", "user_location": {"type": "approximate"}}),
        (ApiBackend.RESPONSES, {"type": "web_search_preview"}),
        (ApiBackend.RESPONSES, {"type": "file_search", "vector_store_ids": ["v"], "filters": {}}),
        (ApiBackend.RESPONSES, {"type": "file_search", "vector_store_ids": []}),
        (ApiBackend.RESPONSES, {"type": "mcp", "server_label": "x", "connector_id": "c"}),
        (
            ApiBackend.RESPONSES,
            {
                "type": "mcp",
                "server_label": "x",
                "server_url": "https://x.example",
                "allowed_tools": {"tool_names": ["a"], "read_only": True},
            },
        ),
        (ApiBackend.RESPONSES, {"type": "image_generation"}),
        (
            ApiBackend.MESSAGES,
            {"type": "web_search_20250305", "name": "web_search", "user_location": {}},
        ),
        (ApiBackend.MESSAGES, {"type": "web_fetch_20250910", "name": "fetcher"}),
        (ApiBackend.MESSAGES, {"type": "code_execution_latest", "name": "code_execution"}),
        (ApiBackend.MESSAGES, {"type": "bash_20250124", "name": "bash"}),
        (ApiBackend.CHAT_COMPLETIONS, {"type": "openrouter:web_search", "parameters": {}}),
    ],
)
def test_parse_keeps_what_it_cannot_model_verbatim(backend: ApiBackend, raw: Any) -> None:
    body: dict[str, Any] = {"model": "m", "tools": [raw]}
    body["messages" if backend is not ApiBackend.RESPONSES else "input"] = [
        {"role": "user", "content": "hi"}
    ]
    module = MODULES[backend]
    parsed = module.parse_request(body)
    assert parsed.hosted_tools == (ProviderTool(backend, raw),)
    assert "tools" not in module.unmodeled_request_fields(body)
    assert build(backend, parsed).data["tools"] == [raw]


def test_parse_reads_dated_anthropic_tool_versions() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
            {"type": "web_fetch_20260101", "name": "web_fetch"},
            {"type": "code_execution_20260120", "name": "code_execution"},
        ],
    }
    parsed = messages.parse_request(body)
    assert parsed.hosted_tools == (
        WebSearch(max_uses=2),
        WebFetch(version="20260101"),
        CodeExecution(version="20260120"),
    )


def test_mcp_servers_entries_messages_cannot_model_stay_unmodeled() -> None:
    server = {"type": "url", "url": "https://x.example", "name": "x", "headers": {"a": "b"}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "mcp_servers": [server]}
    assert messages.parse_request(body).hosted_tools == ()
    assert messages.unmodeled_request_fields(body)["mcp_servers"] == [server]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FileSearch([]), "vector store id"),
        (lambda: MCPServer("", "https://x.example"), "needs a name"),
        (lambda: MCPServer("x", "mcp.example"), "http"),
        (lambda: ProviderTool("respones", {"type": "x"}), "'chat_completions', 'responses'"),
        (lambda: ProviderTool(3, {"type": "x"}), "ApiBackend.CHAT_COMPLETIONS"),  # type: ignore[arg-type]
        (lambda: ProviderTool(ApiBackend.RESPONSES, {}), "JSON object"),
        (lambda: WebSearch(max_uses=0), "positive integer"),
        (lambda: WebFetch(max_content_tokens=-1), "positive integer"),
        (lambda: WebFetch(allowed_domains="example.com"), "write \\['example.com'\\]"),
        (lambda: CodeExecution(version="2025-08-25"), "date suffix"),
    ],
)
def test_bad_arguments_fail_at_construction(make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_hosted_tools_takes_only_the_family() -> None:
    with pytest.raises(TypeError, match="a local function tool is a ToolSpec in tools"):
        ConversationRequest(items=[User("hi")], hosted_tools=[ToolSpec("f")])
    with pytest.raises(TypeError, match="ProviderTool"):
        ConversationRequest(items=[User("hi")], hosted_tools=[{"type": "web_search"}])
