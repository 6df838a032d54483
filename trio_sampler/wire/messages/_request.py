"""Anthropic Messages request builder and parser (sans-I/O).

:func:`build_request` renders a :class:`ConversationRequest` as a ``POST /messages`` body:
the leading system items become the top-level ``system`` blocks, the other items become
strictly alternating user/assistant turns, and up to three ``cache_control`` breakpoints
are placed. :func:`parse_request` reads one back. The mapping and the conversion notes
are listed in ``docs/backends/request-mapping.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ...types._conversation import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    ImagePart,
    NamedToolChoice,
    Reasoning,
    ReasoningEffort,
    ResponseSchema,
    System,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceSpec,
    ToolResult,
    ToolSpec,
    User,
    WebSearch,
)
from .._render import (
    JsonObject,
    ReportCollector,
    as_list,
    as_object,
    data_uri,
    dumps,
    finish_request,
    gate_tool_controls,
    group_runs,
    load_body,
    opt_bool,
    opt_int,
    opt_number,
    opt_str,
    opt_str_list,
    parse_arguments,
    reasoning_is_native,
    req_str,
    resolve_model,
    sanitize_id,
    split_data_uri,
    unmodeled_fields,
)
from .._request import BuildOptions, ConversionAction, WireRequest

__all__ = [
    "EFFORT_THINKING_BUDGET",
    "KNOWN_FIELDS",
    "PATH",
    "build_request",
    "parse_request",
    "unmodeled_request_fields",
]

PATH = "/messages"
BACKEND = ApiBackend.MESSAGES
WEB_SEARCH_TYPE = "web_search_20250305"
EPHEMERAL: JsonObject = {"type": "ephemeral"}

#: Thinking budget used when the request gives an effort but no ``thinking_budget_tokens``.
#: ``none`` and ``minimal`` turn thinking off. 1024 is the API's minimum budget.
EFFORT_THINKING_BUDGET: Mapping[ReasoningEffort, int] = {
    ReasoningEffort.LOW: 1024,
    ReasoningEffort.MEDIUM: 4096,
    ReasoningEffort.HIGH: 16384,
    ReasoningEffort.XHIGH: 32768,
    ReasoningEffort.MAX: 65536,
}

#: Block types that may carry ``cache_control`` (never thinking / redacted_thinking, and
#: never raw server-tool blocks, which are replayed untouched).
_MARKABLE = frozenset({"text", "image", "tool_use", "tool_result", "document"})

KNOWN_FIELDS = (
    "model",
    "max_tokens",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "thinking",
    "temperature",
    "top_p",
    "stop_sequences",
    "output_config",
    "metadata",
    "stream",
)

# A block with the index of the item it came from, so notes can point back.
_Block = tuple[int, JsonObject]


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def build_request(request: ConversationRequest, options: BuildOptions) -> WireRequest:
    """Render ``request`` as a Messages body.

    Roles strictly alternate (consecutive same-role turns are merged, as the API would
    do anyway), tool_result blocks come first in their user turn, and thinking blocks are
    replayed unmodified before the text/tool_use they led to. With
    ``options.cache_breakpoints`` the body carries at most three ``cache_control``
    markers: the last system block, the tip of the conversation, and the end of the
    previous request; these markers move as the conversation grows.
    """
    report = ReportCollector(options.strict)
    items = list(enumerate(request.items))
    system: list[JsonObject] = []
    while items and isinstance(items[0][1], System):
        system.append({"type": "text", "text": items.pop(0)[1].content})  # type: ignore[union-attr]
    messages = _messages(items, report)
    if options.cache_breakpoints:
        _place_cache_breakpoints(system, messages)

    budget = _thinking_budget(request)
    max_tokens = request.max_output_tokens or options.default_max_output_tokens
    if budget is not None and max_tokens <= budget:
        report.note(
            None,
            "max_output_tokens",
            ConversionAction.ADJUSTED,
            f"max_tokens must exceed the thinking budget ({budget}); "
            f"raised to {budget + max_tokens}",
        )
        max_tokens = budget + max_tokens
    data: JsonObject = {"model": resolve_model(request, options), "max_tokens": max_tokens}
    if system:
        data["system"] = system
    data["messages"] = messages
    _render_tools(data, request, report, thinking=budget is not None)
    if budget is not None:
        data["thinking"] = {"type": "enabled", "budget_tokens": budget}
    _render_sampling(data, request, options, report, thinking=budget is not None)
    return finish_request(PATH, data, options, report)


def _messages(
    items: Sequence[tuple[int, ConversationItem]], report: ReportCollector
) -> list[JsonObject]:
    turns = [(role, blocks) for role, blocks in (_item_turn(i, it, report) for i, it in items)]
    # Items that render to nothing vanish before grouping, so their neighbours merge.
    runs = group_runs((t for t in turns if t[1]), key=lambda t: t[0])
    messages: list[JsonObject] = []
    for role, run in runs:
        blocks = [block for _, run_blocks in run for block in run_blocks]
        if role == "user":
            blocks = _tool_results_first(blocks, report)
        messages.append({"role": role, "content": [block for _, block in blocks]})
    return messages


def _tool_results_first(blocks: list[_Block], report: ReportCollector) -> list[_Block]:
    results = [b for b in blocks if b[1]["type"] == "tool_result"]
    others = [b for b in blocks if b[1]["type"] != "tool_result"]
    ordered = results + others
    if ordered != blocks:
        moved = next(b for b, o in zip(blocks, ordered, strict=True) if b is not o)
        report.note(
            moved[0],
            "user turn order",
            ConversionAction.ADJUSTED,
            "tool_result blocks must come first in their user turn; moved ahead of the text",
        )
    return ordered


def _item_turn(
    index: int, item: ConversationItem, report: ReportCollector
) -> tuple[str, list[_Block]]:
    if isinstance(item, User):
        return "user", [(index, b) for p in item.content for b in _part(index, p, report)]
    if isinstance(item, ToolResult):
        return "user", [(index, _tool_result(index, item, report))]
    if isinstance(item, System):
        report.note(
            index,
            "system instructions after the start",
            ConversionAction.CONVERTED_TO_TEXT,
            "Messages has system only at the top; sent in place as user text so the "
            "cached prefix stays valid",
        )
        return "user", [(index, {"type": "text", "text": f"<system>\n{item.content}\n</system>"})]
    if isinstance(item, Assistant):
        return "assistant", [(index, b) for b in _assistant(index, item, report)]
    if isinstance(item, Reasoning):
        return "assistant", [(index, b) for b in _reasoning(index, item, report)]
    if item.origin is BACKEND and item.raw:
        return "assistant", [(index, dict(raw)) for raw in item.raw]
    report.note(
        index,
        f"backend tool call {item.name}",
        ConversionAction.CONVERTED_TO_TEXT,
        "not produced by Messages; sent as assistant text",
    )
    return "assistant", [(index, {"type": "text", "text": item.text_summary()})]


def _part(index: int, part: ContentPart, report: ReportCollector) -> list[JsonObject]:
    if isinstance(part, TextPart):
        # The API rejects empty text blocks; an empty part carries nothing anyway.
        return [{"type": "text", "text": part.text}] if part.text else []
    if part.detail is not None:
        report.note(index, "image detail", ConversionAction.DROPPED, "Messages has no image detail")
    if part.is_data_uri:
        split = split_data_uri(part.url)
        if split is None:
            report.note(index, "image", ConversionAction.DROPPED, "a data URI that is not base64")
            return []
        media_type, payload = split
        source: JsonObject = {"type": "base64", "media_type": media_type, "data": payload}
    else:
        source = {"type": "url", "url": part.url}
    return [{"type": "image", "source": source}]


def _tool_id(index: int, value: str, report: ReportCollector) -> str:
    safe = sanitize_id(value)
    if safe != value:
        report.note(
            index,
            f"tool call id {value!r}",
            ConversionAction.ADJUSTED,
            f"Messages ids allow only [A-Za-z0-9_-]; sent as {safe!r}",
        )
    return safe


def _tool_result(index: int, item: ToolResult, report: ReportCollector) -> JsonObject:
    block: JsonObject = {
        "type": "tool_result",
        "tool_use_id": _tool_id(index, item.call_id, report),
    }
    if item.images:
        content = [{"type": "text", "text": item.content}] if item.content else []
        content.extend(b for image in item.images for b in _part(index, image, report))
        block["content"] = content
    elif item.content:
        block["content"] = item.content
    if item.is_error:
        block["is_error"] = True
    return block


def _assistant(index: int, item: Assistant, report: ReportCollector) -> list[JsonObject]:
    blocks: list[JsonObject] = []
    if item.content:
        blocks.append({"type": "text", "text": item.content})
    if item.refusal is not None:
        report.note(
            index,
            "refusal",
            ConversionAction.CONVERTED_TO_TEXT,
            "Messages has no refusal field; sent as assistant text",
        )
        blocks.append({"type": "text", "text": item.refusal})
    for call in item.tool_calls:
        arguments = parse_arguments(call.arguments)
        if not isinstance(arguments, dict):
            report.note(
                index,
                f"arguments of tool call {call.id}",
                ConversionAction.ADJUSTED,
                "tool_use input must be a JSON object; sent as {}",
            )
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": _tool_id(index, call.id, report),
                "name": call.name,
                "input": arguments,
            }
        )
    return blocks


def _reasoning(index: int, item: Reasoning, report: ReportCollector) -> list[JsonObject]:
    if reasoning_is_native(item, BACKEND):
        if item.redacted_data is not None:
            return [{"type": "redacted_thinking", "data": item.redacted_data}]
        if item.signature is not None:
            return [{"type": "thinking", "thinking": item.text, "signature": item.signature}]
    report.note(
        index,
        "reasoning",
        ConversionAction.DROPPED,
        "only thinking blocks with their Anthropic signature can be sent back",
    )
    return []


def _place_cache_breakpoints(system: list[JsonObject], messages: list[JsonObject]) -> None:
    """Mark at most three blocks with ``cache_control`` (the fourth slot stays free).

    1. the last system block;
    2. the tip: the last markable block of the conversation, walking back past thinking
       blocks and messages with nothing markable;
    3. the previous request's tip: the last user message before the last assistant
       message before the tip, where the previous request ended, so its cache entry is
       read even when a turn appends more than the API's 20-block lookback.

    A block picked twice is marked once.
    """
    if system:
        system[-1]["cache_control"] = dict(EPHEMERAL)
    tip = None
    for m in range(len(messages) - 1, -1, -1):
        tip = _last_markable(messages[m])
        if tip is not None:
            _mark(tip)
            break
    else:
        return
    assistant = _last_index(messages, "assistant", before=m)
    user = _last_index(messages, "user", before=assistant) if assistant is not None else None
    if user is not None:
        previous = _last_markable(messages[user])
        if previous is not None:
            _mark(previous)


def _last_markable(message: Mapping[str, Any]) -> JsonObject | None:
    for block in reversed(message["content"]):
        if block.get("type") in _MARKABLE:
            return block  # type: ignore[no-any-return]
    return None


def _last_index(messages: Sequence[Mapping[str, Any]], role: str, before: int) -> int | None:
    for m in range(before - 1, -1, -1):
        if messages[m]["role"] == role:
            return m
    return None


def _mark(block: JsonObject) -> None:
    block["cache_control"] = dict(EPHEMERAL)


def _thinking_budget(request: ConversationRequest) -> int | None:
    effort = request.reasoning_effort
    if effort in (ReasoningEffort.NONE, ReasoningEffort.MINIMAL):
        return None
    if request.thinking_budget_tokens is not None:
        return request.thinking_budget_tokens
    return None if effort is None else EFFORT_THINKING_BUDGET[effort]


def _render_tools(
    data: JsonObject, request: ConversationRequest, report: ReportCollector, *, thinking: bool
) -> None:
    tools: list[JsonObject] = [_custom_tool(spec) for spec in request.tools]
    tools.extend(_web_search(tool, report) for tool in request.hosted_tools)
    if tools:
        data["tools"] = tools
    if not gate_tool_controls(request, bool(tools), report):
        return
    choice = _tool_choice(request.tool_choice) if request.tool_choice is not None else None
    if thinking and choice is not None and choice["type"] in ("any", "tool"):
        report.note(
            None,
            "tool_choice",
            ConversionAction.ADJUSTED,
            "forcing a tool is incompatible with extended thinking; sent as auto",
        )
        choice = {"type": "auto"}
    if request.parallel_tool_calls is False:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        data["tool_choice"] = choice


def _custom_tool(spec: ToolSpec) -> JsonObject:
    tool: JsonObject = {"name": spec.name}
    if spec.description is not None:
        tool["description"] = spec.description
    tool["input_schema"] = dict(spec.parameters)
    if spec.strict is not None:
        tool["strict"] = spec.strict
    return tool


def _web_search(tool: WebSearch, report: ReportCollector) -> JsonObject:
    wire: JsonObject = {"type": WEB_SEARCH_TYPE, "name": "web_search"}
    if tool.max_uses is not None:
        wire["max_uses"] = tool.max_uses
    if tool.allowed_domains:
        wire["allowed_domains"] = list(tool.allowed_domains)
    if tool.search_context_size is not None:
        report.note(
            None,
            "web search context size",
            ConversionAction.DROPPED,
            "Anthropic web search has no context size",
        )
    return wire


def _tool_choice(choice: ToolChoiceSpec) -> JsonObject:
    if isinstance(choice, NamedToolChoice):
        return {"type": "tool", "name": choice.name}
    return {"type": {"auto": "auto", "none": "none", "required": "any"}[choice.value]}


def _render_sampling(
    data: JsonObject,
    request: ConversationRequest,
    options: BuildOptions,
    report: ReportCollector,
    *,
    thinking: bool,
) -> None:
    temperature, top_p = request.temperature, request.top_p
    # Extended thinking accepts only temperature 1 and top_p in [0.95, 1].
    if thinking and temperature is not None and temperature != 1.0:
        report.note(
            None, "temperature", ConversionAction.DROPPED, "thinking requires temperature 1"
        )
        temperature = None
    if thinking and top_p is not None and top_p < 0.95:
        report.note(None, "top_p", ConversionAction.DROPPED, "thinking requires top_p >= 0.95")
        top_p = None
    if temperature is not None:
        data["temperature"] = temperature
    if top_p is not None:
        data["top_p"] = top_p
    if request.stop_sequences:
        data["stop_sequences"] = list(request.stop_sequences)
    if request.response_schema is not None:
        data["output_config"] = {"format": _output_format(request.response_schema, report)}
    if request.user_id is not None:
        data["metadata"] = {"user_id": request.user_id}
    if request.metadata:
        report.note(
            None, "metadata", ConversionAction.DROPPED, "Messages metadata holds only user_id"
        )
    if request.prompt_cache_key is not None:
        report.note(
            None,
            "prompt_cache_key",
            ConversionAction.DROPPED,
            "Messages caches by cache_control breakpoints, not by key",
        )
    if options.stream:
        data["stream"] = True


def _output_format(schema: ResponseSchema, report: ReportCollector) -> JsonObject:
    if schema.description is not None:
        report.note(
            None,
            "response schema description",
            ConversionAction.DROPPED,
            "output_config.format has no description",
        )
    return {"type": "json_schema", "schema": dict(schema.schema)}


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def parse_request(body: bytes | Mapping[str, Any]) -> ConversationRequest:
    """Read a Messages body back into a :class:`ConversationRequest`.

    System blocks become leading :class:`System` items (one per block); each assistant
    turn is split into Reasoning / Assistant / BackendToolCall items in block order; a
    user turn into its ToolResults and User items. ``cache_control`` markers are ignored.
    A field of the wrong shape raises ``ValueError`` naming it.
    """
    data = load_body(body)
    items: list[ConversationItem] = [System(text) for text in _system_texts(data.get("system"))]
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
    tools, hosted = _parse_tools(data.get("tools"))
    choice, parallel = _parse_tool_choice(data.get("tool_choice"))
    thinking = as_object(data.get("thinking") or {}, "thinking")
    metadata = as_object(data.get("metadata") or {}, "metadata")
    output_config = as_object(data.get("output_config") or {}, "output_config")
    return ConversationRequest(
        items=items,
        tools=tools,
        hosted_tools=hosted,
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
    kind = tool.get("type", "custom")
    if kind == "custom":
        return keys <= {"type", "name", "description", "input_schema", "strict"}
    if kind == WEB_SEARCH_TYPE:
        return keys <= {"type", "name", "max_uses", "allowed_domains"}
    return False


def _system_texts(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    texts = []
    for n, raw in enumerate(as_list(value, "system")):
        block = as_object(raw, f"system[{n}]")
        if block.get("type") != "text":
            raise ValueError(f"system[{n}].type must be 'text'")
        texts.append(req_str(block, "text", f"system[{n}]"))
    return texts


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
            parts.append(TextPart(req_str(block, "text", w)))
        elif kind == "image":
            parts.append(_parse_image(block, w))
        else:
            raise ValueError(f"{w}.type {kind!r} is not supported in a user turn")
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
            if isinstance(current, Assistant) and not current.content and not current.tool_calls:
                out[open_assistant] = attrs.evolve(current, content=text)  # type: ignore[index]
            else:
                out.append(Assistant(content=text))
                open_assistant = len(out) - 1
        elif kind == "tool_use":
            call = ToolCall(
                id=req_str(block, "id", w),
                name=req_str(block, "name", w),
                arguments=dumps(as_object(block.get("input", {}), f"{w}.input")).decode(),
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
    raise ValueError(f"{where}.type {kind!r} is not supported in an assistant turn")


def _parse_tools(value: Any) -> tuple[list[ToolSpec], list[WebSearch]]:
    tools: list[ToolSpec] = []
    hosted: list[WebSearch] = []
    for n, raw in enumerate(as_list(value or [], "tools")):
        w = f"tools[{n}]"
        tool = as_object(raw, w)
        kind = tool.get("type", "custom")
        if kind == "custom":
            tools.append(
                ToolSpec(
                    name=req_str(tool, "name", w),
                    description=opt_str(tool, "description", w),
                    parameters=as_object(tool.get("input_schema"), f"{w}.input_schema"),
                    strict=opt_bool(tool, "strict", w),
                )
            )
        elif kind == WEB_SEARCH_TYPE:
            domains = as_list(tool.get("allowed_domains") or [], f"{w}.allowed_domains")
            hosted.append(
                WebSearch(
                    max_uses=opt_int(tool, "max_uses", w),
                    allowed_domains=[str(d) for d in domains],
                )
            )
    return tools, hosted


def _parse_tool_choice(value: Any) -> tuple[ToolChoiceSpec | None, bool | None]:
    if value is None:
        return None, None
    obj = as_object(value, "tool_choice")
    parallel = False if opt_bool(obj, "disable_parallel_tool_use", "tool_choice") else None
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
