"""Anthropic Messages request builder and parser (sans-I/O).

:func:`build_request` renders a :class:`ConversationRequest` as a ``POST /messages`` body:
the leading system items become the top-level ``system`` blocks, the other items become
strictly alternating user/assistant turns, and up to three ``cache_control`` breakpoints
are placed. :func:`parse_request` reads one back. The mapping and the conversion notes
are listed in ``docs/backends/request-mapping.md``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence

from ...types._conversation import (
    Assistant,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    MCPServer,
    NamedToolChoice,
    OpaqueItem,
    OpaquePart,
    Reasoning,
    ReasoningEffort,
    ResponseSchema,
    System,
    TextPart,
    ToolChoiceSpec,
    ToolResult,
    ToolSpec,
    User,
)
from .._cache import ANTHROPIC_MARKS, place_breakpoints
from .._fields import note_foreign
from .._hosted import in_order
from .._render import (
    JsonObject,
    ReportCollector,
    finish_request,
    gate_tool_controls,
    group_runs,
    own_citations,
    own_parts,
    parse_arguments,
    reasoning_is_native,
    resolve_model,
    sanitize_id,
    split_data_uri,
)
from .._request import BuildOptions, ConversionAction, WireRequest, refuse_chained
from .._structured import lower_structured_output
from ._fields import BACKEND, KNOWN_FIELDS
from ._parse import parse_request as parse_request
from ._parse import unmodeled_request_fields as unmodeled_request_fields
from ._tools import MCP_BETA, render_hosted_tool, render_mcp_server

__all__ = [
    "EFFORT_THINKING_BUDGET",
    "KNOWN_FIELDS",
    "PATH",
    "build_request",
    "parse_request",
    "unmodeled_request_fields",
]

PATH = "/messages"
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
    refuse_chained(request, "Messages")
    if request.store:
        raise ValueError(
            "store=True keeps the response on the server, which Messages never does; "
            "leave store unset (or False) on the Messages backend"
        )
    report = ReportCollector(options.strict)
    request = lower_structured_output(request, options, report)
    items = list(enumerate(request.items))
    system: list[JsonObject] = []
    while items and isinstance(items[0][1], System):
        instructions: System = items.pop(0)[1]  # type: ignore[assignment]
        block: JsonObject = {"type": "text", "text": instructions.content}
        if instructions.cache_breakpoint:
            block["cache_control"] = _cache_control(instructions.cache_breakpoint)
        system.append(block)
    messages = _messages(items, report)
    # The system blocks take part as one leading message, so their last block is a slot.
    place_breakpoints(
        ANTHROPIC_MARKS,
        [{"role": "system", "content": system}, *messages],
        report,
        strategy=options.cache_breakpoints,
        reserved=sum(1 for spec in request.tools if spec.cache_breakpoint),
    )

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
    note_foreign(request, BACKEND, report)
    if budget is not None:
        data["thinking"] = {"type": "enabled", "budget_tokens": budget}
    _render_sampling(data, request, options, report, thinking=budget is not None)
    beta = (("anthropic-beta", MCP_BETA),) if "mcp_servers" in data else ()
    if beta and options.profile.beta_in_body:
        data["anthropic_beta"] = [value for _, value in beta]
        beta = ()
    return finish_request(_path(data, options), data, options, report, beta)


def _path(data: JsonObject, options: BuildOptions) -> str:
    """``/messages``, or the model's own path on a cloud that serves Messages under it
    (Vertex AI, Bedrock: the model leaves the body, ``anthropic_version`` joins it, and
    on Bedrock ``stream`` leaves it too: the path says it)."""
    profile = options.profile
    if profile.messages_path is None:
        return PATH
    # A model id with a slash (an inference profile's ARN) is one path segment.
    model = urllib.parse.quote(str(data.pop("model")), safe=":@")
    if profile.anthropic_version_body is not None:
        data["anthropic_version"] = profile.anthropic_version_body
    if not profile.stream_in_body:
        data.pop("stream", None)
    streaming, plain = profile.messages_methods
    return profile.messages_path.format(model=model, method=streaming if options.stream else plain)


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
        parts = own_parts(index, item.content, BACKEND, report)
        return "user", [(index, b) for p in parts for b in _part(index, p, report)]
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
    if isinstance(item, OpaqueItem):
        if item.origin is BACKEND:  # exactly as received, in its place
            return "assistant", [(index, dict(item.raw))]
        report.note(
            index,
            f"{item.kind} handed over by {item.origin.value}",
            ConversionAction.DROPPED,
            "only the backend that handed it over can take it back",
        )
        return "assistant", []
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
    if isinstance(part, OpaquePart):
        return [dict(part.raw)]  # its own backend's, as read (see own_parts)
    mark = {"cache_control": _cache_control(part.cache_breakpoint)} if part.cache_breakpoint else {}
    if isinstance(part, TextPart):
        # The API rejects empty text blocks; an empty part carries nothing anyway.
        return [{"type": "text", "text": part.text, **mark}] if part.text else []
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
    return [{"type": "image", "source": source, **mark}]


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
    if item.cache_breakpoint:
        block["cache_control"] = _cache_control(item.cache_breakpoint)
    return block


def _assistant(index: int, item: Assistant, report: ReportCollector) -> list[JsonObject]:
    blocks: list[JsonObject] = []
    citations = own_citations(index, item, BACKEND, report)
    if item.content or citations:
        text: JsonObject = {"type": "text", "text": item.content}
        if citations:
            text["citations"] = [dict(c) for c in citations]
        blocks.append(text)
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
        block: JsonObject = {
            "type": "tool_use",
            "id": _tool_id(index, call.id, report),
            "name": call.name,
            "input": arguments,
        }
        if call.caller is not None:
            block["caller"] = dict(call.caller)
        blocks.append(block)
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


def _cache_control(breakpoint: bool | str) -> JsonObject:
    """A caller's mark: ephemeral, with its ``ttl`` when it names one."""
    if isinstance(breakpoint, str):
        return {"type": "ephemeral", "ttl": breakpoint}
    return dict(EPHEMERAL)


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
    tools: list[JsonObject] = []
    servers: list[JsonObject] = []
    for tool in in_order(request):
        if isinstance(tool, ToolSpec):
            tools.append(_custom_tool(tool))
        elif isinstance(tool, MCPServer):
            servers.append(render_mcp_server(tool, report))
        elif (wire := render_hosted_tool(tool, report)) is not None:
            tools.append(wire)
    if tools:
        data["tools"] = tools
    if servers:
        data["mcp_servers"] = servers
    if not gate_tool_controls(request, bool(tools or servers), report):
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
    elif request.parallel_tool_calls is True and choice is not None and choice["type"] != "none":
        choice["disable_parallel_tool_use"] = False  # said explicitly: sent explicitly
    if choice is not None:
        data["tool_choice"] = choice


def _custom_tool(spec: ToolSpec) -> JsonObject:
    tool: JsonObject = {"name": spec.name}
    if spec.description is not None:
        tool["description"] = spec.description
    tool["input_schema"] = dict(spec.parameters)
    if spec.strict is not None:
        tool["strict"] = spec.strict
    if spec.defer_loading:
        tool["defer_loading"] = True
    if spec.cache_breakpoint:
        tool["cache_control"] = _cache_control(spec.cache_breakpoint)
    return tool


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
    if request.background:
        report.note(None, "background", ConversionAction.DROPPED, "Messages has no background mode")
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
