"""Hosted tools on Responses: rendering each modeled tool, and reading them back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...types._conversation import (
    ApiBackend,
    CodeExecution,
    FileSearch,
    HostedTool,
    MCPServer,
    ProviderTool,
    WebFetch,
    WebSearch,
)
from .._hosted import drop, keep_or_passthrough, passthrough
from .._render import JsonObject, ReportCollector, as_list, as_object, opt_int, opt_str

__all__ = ["parse_hosted_tool", "render_hosted_tool"]

BACKEND = ApiBackend.RESPONSES


def render_hosted_tool(tool: HostedTool, report: ReportCollector) -> JsonObject | None:
    """The ``tools`` entry for ``tool``, or ``None`` (reported) when Responses has none."""
    if isinstance(tool, WebSearch):
        return _web_search(tool, report)
    if isinstance(tool, CodeExecution):
        return _code_interpreter(tool, report)
    if isinstance(tool, FileSearch):
        wire: JsonObject = {"type": "file_search", "vector_store_ids": list(tool.vector_store_ids)}
        if tool.max_num_results is not None:
            wire["max_num_results"] = tool.max_num_results
        return wire
    if isinstance(tool, MCPServer):
        return _mcp(tool)
    if isinstance(tool, ProviderTool):
        return passthrough(tool, BACKEND, report)
    if isinstance(tool, WebFetch):
        drop(report, tool, "Responses has no page-fetch tool (its web_search opens pages itself)")
        return None
    raise TypeError(f"not a hosted tool: {tool!r}")


def _web_search(tool: WebSearch, report: ReportCollector) -> JsonObject:
    wire: JsonObject = {"type": "web_search"}
    if tool.allowed_domains:
        wire["filters"] = {"allowed_domains": list(tool.allowed_domains)}
    if tool.search_context_size is not None:
        wire["search_context_size"] = tool.search_context_size
    if tool.max_uses is not None:
        drop(report, tool, "OpenAI web search has no use limit (max_uses not sent)")
    return wire


def _code_interpreter(tool: CodeExecution, report: ReportCollector) -> JsonObject:
    container: str | JsonObject
    if tool.container is not None:
        container = tool.container
        if tool.file_ids:
            drop(report, tool, "file_ids go into an automatic container only (not sent)")
    else:
        container = {"type": "auto"}
        if tool.file_ids:
            container["file_ids"] = list(tool.file_ids)
    return {"type": "code_interpreter", "container": container}


def _mcp(tool: MCPServer) -> JsonObject:
    wire: JsonObject = {"type": "mcp", "server_label": tool.name, "server_url": tool.url}
    if tool.description is not None:
        wire["server_description"] = tool.description
    if tool.allowed_tools is not None:
        wire["allowed_tools"] = list(tool.allowed_tools)
    if tool.authorization is not None:
        wire["authorization"] = tool.authorization
    if tool.require_approval is not None:
        wire["require_approval"] = tool.require_approval
    return wire


def parse_hosted_tool(raw: Mapping[str, Any], where: str) -> HostedTool:
    """A non-function ``tools`` entry as a modeled tool, or kept as a :class:`ProviderTool`."""
    return keep_or_passthrough(BACKEND, raw, lambda: _model(raw, where), render_hosted_tool)


def _strings(value: Any, where: str) -> list[str]:
    items = as_list(value or [], where)
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{where} must be a list of strings")
    return items


def _model(tool: Mapping[str, Any], w: str) -> HostedTool | None:
    kind = tool.get("type")
    if kind == "web_search":
        filters = as_object(tool.get("filters") or {}, f"{w}.filters")
        return WebSearch(
            allowed_domains=_strings(
                filters.get("allowed_domains"), f"{w}.filters.allowed_domains"
            ),
            search_context_size=opt_str(tool, "search_context_size", w),
        )
    if kind == "code_interpreter":
        container = tool.get("container")
        if isinstance(container, str):
            return CodeExecution(container=container)
        box = as_object(container or {}, f"{w}.container")
        return CodeExecution(file_ids=_strings(box.get("file_ids"), f"{w}.container.file_ids"))
    if kind == "file_search":
        return FileSearch(
            vector_store_ids=_strings(tool.get("vector_store_ids"), f"{w}.vector_store_ids"),
            max_num_results=opt_int(tool, "max_num_results", w),
        )
    if kind == "mcp":
        allowed = tool.get("allowed_tools")
        return MCPServer(
            name=opt_str(tool, "server_label", w) or "",
            url=opt_str(tool, "server_url", w) or "",
            description=opt_str(tool, "server_description", w),
            allowed_tools=None if allowed is None else _strings(allowed, f"{w}.allowed_tools"),
            authorization=opt_str(tool, "authorization", w),
            require_approval=opt_str(tool, "require_approval", w),
        )
    return None
