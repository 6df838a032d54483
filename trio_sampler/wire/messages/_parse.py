"""Parsing a Messages request body back into a ``ConversationRequest`` (the emulator
and the round-trip tests use it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ...types._conversation import (
    Assistant,
    BackendToolCall,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    HostedTool,
    ImagePart,
    MCPServer,
    NamedToolChoice,
    OpaqueItem,
    OpaquePart,
    Reasoning,
    ResponseSchema,
    System,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceSpec,
    ToolResult,
    ToolSpec,
    User,
)
from .._citations import citation_from_wire
from .._hosted import order_record
from .._render import (
    JsonObject,
    as_list,
    as_object,
    data_uri,
    dumps,
    load_body,
    opt_bool,
    opt_int,
    opt_number,
    opt_str,
    opt_str_list,
    req_str,
    unmodeled_fields,
)
from ._fields import BACKEND, KNOWN_FIELDS
from ._tools import parse_hosted_tool, parse_mcp_server

__all__ = ["parse_request", "unmodeled_request_fields"]


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def parse_request(body: bytes | Mapping[str, Any]) -> ConversationRequest:
    """Read a Messages body back into a :class:`ConversationRequest`.

    System blocks become leading :class:`System` items (one per block); each assistant
    turn is split into Reasoning / Assistant / BackendToolCall items in block order; a
    user turn into its ToolResults and User items. A ``cache_control`` marker on a
    system, text or image block is its ``cache_breakpoint``.
    A field of the wrong shape raises ``ValueError`` naming it.
    """
    data = load_body(body)
    items: list[ConversationItem] = [
        System(text, cache_breakpoint=marked) for text, marked in _system_texts(data.get("system"))
    ]
    if "messages" not in data:
        raise ValueError("messages is required")
    for n, raw in enumerate(as_list(data["messages"], "messages")):
        where = f"messages[{n}]"
        message = as_object(raw, where)
        role = message.get("role")
        blocks = _blocks(message.get("content"), where)
        if role == "user":
            items.extend(_parse_user_turn(blocks, where))
        elif role == "assistant":
            items.extend(_parse_assistant_turn(blocks, where))
        else:
            raise ValueError(f"{where}.role must be user or assistant")
    tools, hosted, tool_order = _parse_tools(data.get("tools"))
    hosted.extend(_parse_mcp_servers(data.get("mcp_servers")))
    choice, parallel = _parse_tool_choice(data.get("tool_choice"))
    thinking = as_object(data.get("thinking") or {}, "thinking")
    metadata = as_object(data.get("metadata") or {}, "metadata")
    output_config = as_object(data.get("output_config") or {}, "output_config")
    return ConversationRequest(
        items=items,
        tools=tools,
        hosted_tools=hosted,
        tool_order=tool_order,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        model=opt_str(data, "model", "body"),
        temperature=opt_number(data, "temperature", "body"),
        top_p=opt_number(data, "top_p", "body"),
        max_output_tokens=opt_int(data, "max_tokens", "body"),
        thinking_budget_tokens=(
            opt_int(thinking, "budget_tokens", "thinking")
            if thinking.get("type") == "enabled"
            else None
        ),
        response_schema=_parse_output_format(output_config.get("format")),
        stop_sequences=opt_str_list(data, "stop_sequences", "body"),
        user_id=opt_str(metadata, "user_id", "metadata"),
    )


def unmodeled_request_fields(body: bytes | Mapping[str, Any]) -> JsonObject:
    """Top-level fields of ``body`` that :func:`parse_request` cannot represent."""
    return unmodeled_fields(
        load_body(body),
        KNOWN_FIELDS,
        {
            "tools": lambda tools: all(_tool_modelable(t) for t in tools),
            "mcp_servers": _mcp_servers_modelable,
            "thinking": lambda t: (
                isinstance(t, Mapping)
                and t.get("type") in ("enabled", "disabled")
                and set(t) <= {"type", "budget_tokens"}
            ),
            "metadata": lambda m: isinstance(m, Mapping) and set(m) <= {"user_id"},
            "output_config": lambda c: isinstance(c, Mapping) and set(c) == {"format"},
        },
    )


def _tool_modelable(tool: Any) -> bool:
    if not isinstance(tool, Mapping):
        return False
    keys = {k for k, v in tool.items() if v is not None}
    if tool.get("type", "custom") == "custom":
        return keys <= {
            "type",
            "name",
            "description",
            "input_schema",
            "strict",
            "defer_loading",
            "cache_control",
        }
    return True  # every server tool is kept, modeled or verbatim (ProviderTool)


def _mcp_servers_modelable(servers: Any) -> bool:
    return isinstance(servers, list) and all(
        isinstance(s, Mapping) and parse_mcp_server(s, "mcp_servers") is not None for s in servers
    )


def _system_texts(value: Any) -> list[tuple[str, bool | str]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [(value, False)]
    texts: list[tuple[str, bool | str]] = []
    for n, raw in enumerate(as_list(value, "system")):
        block = as_object(raw, f"system[{n}]")
        if block.get("type") != "text":
            raise ValueError(f"system[{n}].type must be 'text'")
        texts.append((req_str(block, "text", f"system[{n}]"), _marked(block)))
    return texts


def _marked(block: Mapping[str, Any]) -> bool | str:
    """A block's ``cache_control`` as a ``cache_breakpoint``: its ``ttl``, else whether set."""
    mark = block.get("cache_control")
    ttl = mark.get("ttl") if isinstance(mark, Mapping) else None
    return ttl if isinstance(ttl, str) else mark is not None


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [
        as_object(b, f"{where}.content[{n}]")
        for n, b in enumerate(as_list(content, f"{where}.content"))
    ]


def _parse_image(block: Mapping[str, Any], where: str) -> ImagePart:
    source = as_object(block.get("source"), f"{where}.source")
    if source.get("type") == "base64":
        return ImagePart(
            data_uri(
                req_str(source, "media_type", f"{where}.source"),
                req_str(source, "data", f"{where}.source"),
            )
        )
    if source.get("type") == "url":
        return ImagePart(req_str(source, "url", f"{where}.source"))
    raise ValueError(f"{where}.source.type must be base64 or url")


def _parse_user_turn(blocks: list[Mapping[str, Any]], where: str) -> list[ConversationItem]:
    out: list[ConversationItem] = []
    parts: list[ContentPart] = []
    for n, block in enumerate(blocks):
        w = f"{where}.content[{n}]"
        kind = block.get("type")
        if kind == "tool_result":
            if parts:
                out.append(User(parts))
                parts = []
            out.append(_parse_tool_result(block, w))
        elif kind == "text":
            parts.append(TextPart(req_str(block, "text", w), cache_breakpoint=_marked(block)))
        elif kind == "image":
            parts.append(attrs.evolve(_parse_image(block, w), cache_breakpoint=_marked(block)))
        else:
            # document, search_result, newer block types: kept as read.
            parts.append(OpaquePart(block, BACKEND))
    if parts:
        out.append(User(parts))
    return out


def _parse_tool_result(block: Mapping[str, Any], where: str) -> ToolResult:
    content = block.get("content")
    texts: list[str] = []
    images: list[ImagePart] = []
    for n, inner in enumerate(_blocks(content, where) if content is not None else []):
        w = f"{where}.content[{n}]"
        if inner.get("type") == "text":
            texts.append(req_str(inner, "text", w))
        elif inner.get("type") == "image":
            images.append(_parse_image(inner, w))
        else:
            raise ValueError(f"{w}.type must be text or image")
    return ToolResult(
        call_id=req_str(block, "tool_use_id", where),
        content="".join(texts),
        images=images,
        is_error=bool(opt_bool(block, "is_error", where)),
        cache_breakpoint=_marked(block),
    )


def _parse_assistant_turn(blocks: list[Mapping[str, Any]], where: str) -> list[ConversationItem]:
    out: list[ConversationItem] = []
    open_assistant: int | None = None  # index in ``out`` of the Assistant still being filled
    for n, block in enumerate(blocks):
        w = f"{where}.content[{n}]"
        kind = block.get("type")
        current = out[open_assistant] if open_assistant is not None else None
        if kind == "text":
            text = req_str(block, "text", w)
            cited = tuple(
                citation_from_wire(as_object(c, f"{w}.citations[{m}]"), BACKEND)
                for m, c in enumerate(as_list(block.get("citations") or [], f"{w}.citations"))
            )
            if isinstance(current, Assistant) and not current.content and not current.tool_calls:
                out[open_assistant] = attrs.evolve(  # type: ignore[index]
                    current, content=text, citations=(*current.citations, *cited)
                )
            else:
                out.append(Assistant(content=text, citations=cited))
                open_assistant = len(out) - 1
        elif kind == "tool_use":
            caller = block.get("caller")
            call = ToolCall(
                id=req_str(block, "id", w),
                name=req_str(block, "name", w),
                arguments=dumps(as_object(block.get("input", {}), f"{w}.input")).decode(),
                caller=as_object(caller, f"{w}.caller") if caller is not None else None,
            )
            if isinstance(current, Assistant):
                out[open_assistant] = attrs.evolve(  # type: ignore[index]
                    current, tool_calls=(*current.tool_calls, call)
                )
            else:
                out.append(Assistant(tool_calls=(call,)))
                open_assistant = len(out) - 1
        else:
            open_assistant = None
            out.extend(_parse_other_assistant_block(kind, block, out, w))
    return out


def _parse_other_assistant_block(
    kind: Any, block: Mapping[str, Any], out: list[ConversationItem], where: str
) -> list[ConversationItem]:
    if kind == "thinking":
        return [
            Reasoning(
                text=req_str(block, "thinking", where),
                signature=req_str(block, "signature", where),
                origin=BACKEND,
            )
        ]
    if kind == "redacted_thinking":
        return [Reasoning(redacted_data=req_str(block, "data", where), origin=BACKEND)]
    if kind in ("server_tool_use", "mcp_tool_use"):
        return [
            BackendToolCall(
                id=req_str(block, "id", where),
                name=req_str(block, "name", where),
                arguments=dumps(block.get("input") or {}).decode(),
                origin=BACKEND,
                raw=(dict(block),),
            )
        ]
    if isinstance(kind, str) and kind.endswith("_tool_result"):
        use_id = block.get("tool_use_id")
        for i in range(len(out) - 1, -1, -1):
            call = out[i]
            if isinstance(call, BackendToolCall) and call.id == use_id and len(call.raw) == 1:
                out[i] = attrs.evolve(call, result=block.get("content"), raw=(*call.raw, block))
                return []
        return [
            BackendToolCall(id=str(use_id or ""), name=kind, origin=BACKEND, raw=(dict(block),))
        ]
    if isinstance(kind, str):
        # compaction, fallback, container_upload, newer block types: kept verbatim.
        return [OpaqueItem(raw=dict(block), origin=BACKEND)]
    raise ValueError(f"{where}.type must be a string naming the content block type")


def _parse_tools(value: Any) -> tuple[list[ToolSpec], list[HostedTool], tuple[str, ...]]:
    """Custom tools as :class:`ToolSpec` s; every server tool kept (see ``_hosted``); the
    order record of the two."""
    tools: list[ToolSpec] = []
    hosted: list[HostedTool] = []
    kinds: list[str] = []
    for n, raw in enumerate(as_list(value or [], "tools")):
        w = f"tools[{n}]"
        tool = as_object(raw, w)
        if tool.get("type", "custom") != "custom":
            hosted.append(parse_hosted_tool(tool, w))
            kinds.append("hosted")
            continue
        kinds.append("function")
        tools.append(
            ToolSpec(
                name=req_str(tool, "name", w),
                description=opt_str(tool, "description", w),
                parameters=as_object(tool.get("input_schema"), f"{w}.input_schema"),
                strict=opt_bool(tool, "strict", w),
                defer_loading=bool(opt_bool(tool, "defer_loading", w)),
                cache_breakpoint=_marked(tool),
            )
        )
    return tools, hosted, order_record(kinds)


def _parse_mcp_servers(value: Any) -> list[MCPServer]:
    """The ``mcp_servers`` entries :class:`MCPServer` can hold (the others stay in
    :func:`unmodeled_request_fields`)."""
    servers = []
    for n, raw in enumerate(as_list(value or [], "mcp_servers")):
        server = parse_mcp_server(as_object(raw, f"mcp_servers[{n}]"), f"mcp_servers[{n}]")
        if server is not None:
            servers.append(server)
    return servers


def _parse_tool_choice(value: Any) -> tuple[ToolChoiceSpec | None, bool | None]:
    if value is None:
        return None, None
    obj = as_object(value, "tool_choice")
    disable = opt_bool(obj, "disable_parallel_tool_use", "tool_choice")
    parallel = None if disable is None else not disable
    kind = obj.get("type")
    if kind == "tool":
        return NamedToolChoice(req_str(obj, "name", "tool_choice")), parallel
    modes = {"auto": ToolChoice.AUTO, "any": ToolChoice.REQUIRED, "none": ToolChoice.NONE}
    if kind not in modes:
        raise ValueError("tool_choice.type must be auto, any, tool or none")
    return modes[kind], parallel


def _parse_output_format(value: Any) -> ResponseSchema | None:
    if value is None:
        return None
    fmt = as_object(value, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise ValueError("output_config.format.type must be json_schema")
    # The wire has no name; this is the one the builders of the other backends send.
    return ResponseSchema(
        name="structured_output",
        schema=as_object(fmt.get("schema"), "output_config.format.schema"),
    )
