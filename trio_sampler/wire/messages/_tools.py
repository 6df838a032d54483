"""Hosted tools on Messages: rendering each modeled tool, and reading them back.

Anthropic's server tools carry a dated version in their type (``web_fetch_20250910``);
a tool's ``version`` field picks it, ``None`` the default below. MCP servers are not
tools on this wire but entries of the top-level ``mcp_servers`` list, sent with the
``anthropic-beta: mcp-client-2025-04-04`` header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...types._conversation import (
    CodeExecution,
    FileSearch,
    HostedTool,
    MCPServer,
    ProviderTool,
    WebFetch,
    WebSearch,
)
from .._hosted import drop, keep_or_passthrough, passthrough
from .._render import JsonObject, ReportCollector, as_list, as_object, opt_bool, opt_int, opt_str
from ._fields import BACKEND

__all__ = [
    "MCP_BETA",
    "parse_hosted_tool",
    "parse_mcp_server",
    "render_hosted_tool",
    "render_mcp_server",
]

#: The default version of each server tool (the date in its ``type``).
WEB_SEARCH_VERSION = "20250305"
WEB_FETCH_VERSION = "20250910"
CODE_EXECUTION_VERSION = "20250825"
#: The beta the ``mcp_servers`` parameter needs.
MCP_BETA = "mcp-client-2025-04-04"


def render_hosted_tool(tool: HostedTool, report: ReportCollector) -> JsonObject | None:
    """The ``tools`` entry for ``tool``; ``None`` for an MCP server (it goes in
    ``mcp_servers``, see :func:`render_mcp_server`) and, reported, for what Messages lacks."""
    if isinstance(tool, WebSearch):
        wire: JsonObject = {
            "type": f"web_search_{tool.version or WEB_SEARCH_VERSION}",
            "name": "web_search",
        }
        if tool.max_uses is not None:
            wire["max_uses"] = tool.max_uses
        if tool.allowed_domains:
            wire["allowed_domains"] = list(tool.allowed_domains)
        if tool.search_context_size is not None:
            drop(report, tool, "Anthropic web search has no context size (not sent)")
        return wire
    if isinstance(tool, WebFetch):
        wire = {"type": f"web_fetch_{tool.version or WEB_FETCH_VERSION}", "name": "web_fetch"}
        if tool.max_uses is not None:
            wire["max_uses"] = tool.max_uses
        if tool.allowed_domains:
            wire["allowed_domains"] = list(tool.allowed_domains)
        if tool.blocked_domains:
            wire["blocked_domains"] = list(tool.blocked_domains)
        if tool.citations is not None:
            wire["citations"] = {"enabled": tool.citations}
        if tool.max_content_tokens is not None:
            wire["max_content_tokens"] = tool.max_content_tokens
        return wire
    if isinstance(tool, CodeExecution):
        if tool.container is not None or tool.file_ids:
            drop(report, tool, "Messages takes no container or files on the tool (not sent)")
        return {
            "type": f"code_execution_{tool.version or CODE_EXECUTION_VERSION}",
            "name": "code_execution",
        }
    if isinstance(tool, ProviderTool):
        return passthrough(tool, BACKEND, report)
    if isinstance(tool, FileSearch):
        drop(report, tool, "Messages has no file search tool")
        return None
    if isinstance(tool, MCPServer):
        return None
    raise TypeError(f"not a hosted tool: {tool!r}")


def render_mcp_server(tool: MCPServer, report: ReportCollector) -> JsonObject:
    """One ``mcp_servers`` entry."""
    wire: JsonObject = {"type": "url", "url": tool.url, "name": tool.name}
    if tool.authorization is not None:
        wire["authorization_token"] = tool.authorization
    if tool.allowed_tools is not None:
        wire["tool_configuration"] = {"enabled": True, "allowed_tools": list(tool.allowed_tools)}
    if tool.require_approval not in (None, "never"):
        drop(report, tool, "Anthropic runs MCP tools without approval (require_approval not sent)")
    if tool.description is not None:
        drop(report, tool, "Anthropic MCP servers have no description (not sent)")
    return wire


def parse_hosted_tool(raw: Mapping[str, Any], where: str) -> HostedTool:
    """A server-tool ``tools`` entry as a modeled tool, or kept as a :class:`ProviderTool`."""
    return keep_or_passthrough(BACKEND, raw, lambda: _model(raw, where), render_hosted_tool)


def parse_mcp_server(raw: Mapping[str, Any], where: str) -> MCPServer | None:
    """An ``mcp_servers`` entry, or ``None`` when it has fields :class:`MCPServer` lacks."""

    def model() -> MCPServer | None:
        if raw.get("type") != "url":
            return None
        config = as_object(raw.get("tool_configuration") or {}, f"{where}.tool_configuration")
        allowed = config.get("allowed_tools")
        return MCPServer(
            name=opt_str(raw, "name", where) or "",
            url=opt_str(raw, "url", where) or "",
            authorization=opt_str(raw, "authorization_token", where),
            allowed_tools=(
                None if allowed is None else _strings(allowed, f"{where}.allowed_tools")
            ),
        )

    def render(tool: HostedTool, report: ReportCollector) -> JsonObject | None:
        return render_mcp_server(tool, report) if isinstance(tool, MCPServer) else None

    kept = keep_or_passthrough(BACKEND, raw, model, render)
    return kept if isinstance(kept, MCPServer) else None


def _strings(value: Any, where: str) -> list[str]:
    items = as_list(value or [], where)
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{where} must be a list of strings")
    return items


def _version(kind: str, prefix: str) -> str | None:
    return kind.removeprefix(prefix) if kind.startswith(prefix) else None


def _model(tool: Mapping[str, Any], w: str) -> HostedTool | None:
    kind = tool.get("type")
    if not isinstance(kind, str):
        return None
    if (version := _version(kind, "web_search_")) is not None:
        return WebSearch(
            max_uses=opt_int(tool, "max_uses", w),
            allowed_domains=_strings(tool.get("allowed_domains"), f"{w}.allowed_domains"),
            version=None if version == WEB_SEARCH_VERSION else version,
        )
    if (version := _version(kind, "web_fetch_")) is not None:
        citations = as_object(tool.get("citations") or {}, f"{w}.citations")
        return WebFetch(
            max_uses=opt_int(tool, "max_uses", w),
            allowed_domains=_strings(tool.get("allowed_domains"), f"{w}.allowed_domains"),
            blocked_domains=_strings(tool.get("blocked_domains"), f"{w}.blocked_domains"),
            citations=opt_bool(citations, "enabled", f"{w}.citations"),
            max_content_tokens=opt_int(tool, "max_content_tokens", w),
            version=None if version == WEB_FETCH_VERSION else version,
        )
    if (version := _version(kind, "code_execution_")) is not None:
        return CodeExecution(version=None if version == CODE_EXECUTION_VERSION else version)
    return None
