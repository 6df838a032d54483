"""Responses request builder and parser (sans-I/O).

:func:`build_request` renders a :class:`ConversationRequest` as a ``POST /responses``
body for stateless use (the whole conversation goes in ``input``; reasoning is replayed
from ``encrypted_content``); :func:`parse_request` reads one back. The mapping and the
conversion notes are listed in ``docs/backends/request-mapping.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ...types._conversation import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    Citation,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    HostedTool,
    ImagePart,
    NamedToolChoice,
    OpaqueItem,
    OpaquePart,
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
)
from .._cache import OPENAI_MARKS, render_openai_cache
from .._citations import citation_from_wire
from .._fields import note_foreign
from .._hosted import in_order, order_record
from .._render import (
    JsonObject,
    ReportCollector,
    as_list,
    as_object,
    dumps,
    finish_request,
    gate_tool_controls,
    load_body,
    opt_bool,
    opt_int,
    opt_number,
    opt_str,
    own_citations,
    own_parts,
    parse_effort,
    reasoning_is_native,
    req_str,
    resolve_model,
    string_metadata,
    unmodeled_fields,
)
from .._request import BuildOptions, ConversionAction, WireRequest
from .._structured import lower_structured_output
from ._tools import parse_hosted_tool, render_hosted_tool

__all__ = ["KNOWN_FIELDS", "PATH", "build_request", "parse_request", "unmodeled_request_fields"]

PATH = "/responses"
BACKEND = ApiBackend.RESPONSES
ENCRYPTED_REASONING = "reasoning.encrypted_content"

#: Top-level fields :func:`parse_request` understands.
KNOWN_FIELDS = (
    "model",
    "instructions",
    "input",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "reasoning",
    "include",
    "text",
    "prompt_cache_key",
    "safety_identifier",
    "user",
    "metadata",
    "stream",
    "background",
    "store",
    "previous_response_id",
    "conversation",
)

# Input item types that may follow a reasoning item in the original output.
_FOLLOWERS = frozenset({"reasoning", "function_call", "message"})


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def build_request(request: ConversationRequest, options: BuildOptions) -> WireRequest:
    """Render ``request`` as a Responses body.

    A leading non-developer :class:`System` item becomes ``instructions``; every other
    item stays in place in ``input``. Reasoning from this backend is replayed as
    ``reasoning`` items (id, summary, ``encrypted_content``) right before the item that
    followed it, and ``include: ["reasoning.encrypted_content"]`` is asked for whenever
    reasoning is requested or replayed.
    """
    report = ReportCollector(options.strict)
    request = lower_structured_output(request, options, report)
    data: JsonObject = {"model": resolve_model(request, options)}
    items = list(enumerate(request.items))
    first = items[0][1] if items else None
    # Instructions take no cache breakpoint: a marked system message stays in the input.
    if isinstance(first, System) and not first.developer and not first.cache_breakpoint:
        data["instructions"] = first.content
        items = items[1:]
    input_items = _input(items, report)
    data["input"] = input_items
    _render_tools(data, request, report)
    note_foreign(request, BACKEND, report)
    _render_sampling(data, request, options, report, any_reasoning=_has_reasoning(input_items))
    # Instructions take no breakpoint: the strategy's system slot is not used here.
    render_openai_cache(data, input_items, options, report, text_type="input_text")
    return finish_request(PATH, data, options, report)


def _has_reasoning(input_items: Sequence[JsonObject]) -> bool:
    return any(item.get("type") == "reasoning" for item in input_items)


def _input(
    items: Sequence[tuple[int, ConversationItem]], report: ReportCollector
) -> list[JsonObject]:
    rendered: list[tuple[int, JsonObject]] = []
    for index, item in items:
        rendered.extend((index, wire) for wire in _render_item(index, item, report))
    return _drop_orphan_reasoning(rendered, report)


def _render_item(index: int, item: ConversationItem, report: ReportCollector) -> list[JsonObject]:
    if isinstance(item, System):
        content = _user_content([TextPart(item.content, item.cache_breakpoint)])
        return [{"role": "developer" if item.developer else "system", "content": content}]
    if isinstance(item, User):
        parts = own_parts(index, item.content, BACKEND, report)
        return [{"role": "user", "content": _user_content(parts)}]
    if isinstance(item, Assistant):
        return _assistant(index, item, report)
    if isinstance(item, ToolResult):
        return [_tool_output(index, item, report)]
    if isinstance(item, OpaqueItem):
        return _opaque(index, item, report)
    if isinstance(item, Reasoning):
        if reasoning_is_native(item, BACKEND):
            return [_reasoning(item)]
        report.note(
            index,
            "reasoning",
            ConversionAction.DROPPED,
            "reasoning from another backend cannot be replayed on Responses",
        )
        return []
    if item.origin is BACKEND and item.raw:
        return [dict(raw) for raw in item.raw]
    report.note(
        index,
        f"backend tool call {item.name}",
        ConversionAction.CONVERTED_TO_TEXT,
        "not produced by Responses; sent as assistant text",
    )
    return [_assistant_message(item.text_summary(), None, None)]


def _opaque(index: int, item: OpaqueItem, report: ReportCollector) -> list[JsonObject]:
    """Hand-over state goes back exactly as received, to the backend that sent it only."""
    if item.origin is BACKEND:
        return [dict(item.raw)]
    report.note(
        index,
        f"{item.kind} handed over by {item.origin.value}",
        ConversionAction.DROPPED,
        "only the backend that handed it over can take it back",
    )
    return []


def _drop_orphan_reasoning(
    rendered: list[tuple[int, JsonObject]], report: ReportCollector
) -> list[JsonObject]:
    """Remove reasoning items that no output item follows.

    The server rejects a replayed reasoning item "provided without its required following
    item"; that happens when what followed it rendered to nothing (an empty assistant
    turn) or the conversation ends on it.
    """
    out: list[JsonObject] = []
    for position, (index, wire) in enumerate(rendered):
        if wire.get("type") == "reasoning":
            following = rendered[position + 1][1] if position + 1 < len(rendered) else None
            if following is None or not _follows_reasoning(following):
                report.note(
                    index,
                    "reasoning",
                    ConversionAction.DROPPED,
                    "no output item follows it, and the server rejects it alone",
                )
                continue
        out.append(wire)
    return out


def _follows_reasoning(wire: Mapping[str, Any]) -> bool:
    kind = wire.get("type")
    if kind == "message":
        return wire.get("role") == "assistant"
    return kind in _FOLLOWERS or (isinstance(kind, str) and kind.endswith("_call"))


def _user_content(parts: Sequence[ContentPart]) -> str | list[JsonObject]:
    if len(parts) == 1 and isinstance(parts[0], TextPart) and not parts[0].cache_breakpoint:
        return parts[0].text
    return [_input_part(p) for p in parts]


def _input_part(part: ContentPart) -> JsonObject:
    wire: JsonObject
    if isinstance(part, OpaquePart):
        return dict(part.raw)  # its own backend's, as read (see own_parts)
    if isinstance(part, TextPart):
        wire = {"type": "input_text", "text": part.text}
    else:
        # ``detail`` is required by the API schema; ``auto`` is its documented default.
        wire = {"type": "input_image", "image_url": part.url, "detail": part.detail or "auto"}
    if part.cache_breakpoint:
        wire[OPENAI_MARKS.key] = dict(OPENAI_MARKS.value)
    return wire


def _assistant_message(
    text: str,
    refusal: str | None,
    item_id: str | None,
    phase: str | None = None,
    annotations: Sequence[Mapping[str, Any]] = (),
) -> JsonObject:
    content: list[JsonObject] = []
    if text:
        notes = [dict(a) for a in annotations]
        content.append({"type": "output_text", "text": text, "annotations": notes})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    message: JsonObject = {"type": "message", "role": "assistant"}
    if item_id is not None:
        message["id"] = item_id
    message["content"] = content
    if phase is not None:
        message["phase"] = phase
    return message


def _assistant(index: int, item: Assistant, report: ReportCollector) -> list[JsonObject]:
    out: list[JsonObject] = []
    # An empty assistant turn renders to nothing: the API rejects an empty message.
    if item.content or item.refusal is not None:
        annotations = own_citations(index, item, BACKEND, report)
        out.append(_assistant_message(item.content, item.refusal, item.id, item.phase, annotations))
    out.extend(_function_call(call) for call in item.tool_calls)
    return out


def _function_call(call: ToolCall) -> JsonObject:
    # Paired by call_id; the fc_… item id is not kept (it is optional on input).
    wire: JsonObject = {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }
    if call.namespace is not None:
        wire["namespace"] = call.namespace
    return wire


def _tool_output(index: int, item: ToolResult, report: ReportCollector) -> JsonObject:
    if item.is_error:
        report.note(
            index,
            "tool result error flag",
            ConversionAction.DROPPED,
            "function_call_output has no error flag",
        )
    output: str | list[JsonObject] = item.content
    if item.images:
        parts: list[ContentPart] = [TextPart(item.content)] if item.content else []
        output = [_input_part(p) for p in (*parts, *item.images)]
    return {"type": "function_call_output", "call_id": item.call_id, "output": output}


def _reasoning(item: Reasoning) -> JsonObject:
    wire: JsonObject = {"type": "reasoning"}
    if item.id is not None:
        wire["id"] = item.id
    wire["summary"] = [{"type": "summary_text", "text": s} for s in item.summary]
    if item.text:
        wire["content"] = [{"type": "reasoning_text", "text": item.text}]
    if item.encrypted_content is not None:
        wire["encrypted_content"] = item.encrypted_content
    return wire


def _render_tools(data: JsonObject, request: ConversationRequest, report: ReportCollector) -> None:
    tools: list[JsonObject] = []
    for tool in in_order(request):
        wire = (
            _function_tool(tool) if isinstance(tool, ToolSpec) else render_hosted_tool(tool, report)
        )
        if wire is not None:
            tools.append(wire)
    if tools:
        data["tools"] = tools
    if not gate_tool_controls(request, bool(tools), report):
        return
    if request.tool_choice is not None:
        data["tool_choice"] = _tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None:
        data["parallel_tool_calls"] = request.parallel_tool_calls


def _function_tool(spec: ToolSpec) -> JsonObject:
    tool: JsonObject = {"type": "function", "name": spec.name}
    if spec.description is not None:
        tool["description"] = spec.description
    tool["parameters"] = dict(spec.parameters)
    # Omitted strict means strict=true on Responses: say it whenever the caller did.
    if spec.strict is not None:
        tool["strict"] = spec.strict
    if spec.defer_loading:
        tool["defer_loading"] = True
    return tool


def _tool_choice(choice: ToolChoiceSpec) -> Any:
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "name": choice.name}
    return choice.value


def _render_sampling(
    data: JsonObject,
    request: ConversationRequest,
    options: BuildOptions,
    report: ReportCollector,
    *,
    any_reasoning: bool,
) -> None:
    if request.temperature is not None:
        data["temperature"] = request.temperature
    if request.top_p is not None:
        data["top_p"] = request.top_p
    if request.max_output_tokens is not None:
        data["max_output_tokens"] = request.max_output_tokens
    effort = request.reasoning_effort
    if effort is not None:
        data["reasoning"] = (
            {"effort": effort.value}
            if effort is ReasoningEffort.NONE
            else {"effort": effort.value, "summary": "auto"}
        )
    if (effort is not None and effort is not ReasoningEffort.NONE) or any_reasoning:
        # Stateless multi-turn reasoning needs the encrypted state back in every output.
        data["include"] = [ENCRYPTED_REASONING]
    if request.response_schema is not None:
        data["text"] = {"format": _text_format(request.response_schema)}
    if request.stop_sequences:
        report.note(
            None, "stop sequences", ConversionAction.DROPPED, "Responses has no stop parameter"
        )
    if request.prompt_cache_key is not None:
        data["prompt_cache_key"] = request.prompt_cache_key
    if request.background:
        data["background"] = True
    if request.user_id is not None:
        data["safety_identifier"] = request.user_id
    if request.metadata:
        data["metadata"] = dict(request.metadata)
    _render_state(data, request)
    if options.stream:
        data["stream"] = True


def _render_state(data: JsonObject, request: ConversationRequest) -> None:
    """The server-side state fields (``docs/stateful-requests.md``)."""
    if request.store is not None:
        data["store"] = request.store
    if request.previous_response_id is not None:
        data["previous_response_id"] = request.previous_response_id
    if request.conversation is not None:
        data["conversation"] = request.conversation


def _parse_conversation(value: Any) -> str | None:
    """``conversation``: an id, or an object with one."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("id"), str):
        return str(value["id"])
    raise ValueError('conversation must be an id string or {"id": "conv_..."}')


def _text_format(schema: ResponseSchema) -> JsonObject:
    fmt: JsonObject = {"type": "json_schema", "name": schema.name}
    if schema.description is not None:
        fmt["description"] = schema.description
    fmt["schema"] = dict(schema.schema)
    fmt["strict"] = schema.strict
    return fmt


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def parse_request(body: bytes | Mapping[str, Any]) -> ConversationRequest:
    """Read a Responses body back into a :class:`ConversationRequest`.

    ``instructions`` becomes a leading :class:`System`; ``input`` may be a string or a
    list of items (with or without ``type: "message"``). Function calls that follow an
    assistant message join it; hosted-tool items (``*_call``, ``mcp_*``) become
    :class:`BackendToolCall` s keeping the raw item. A field of the wrong shape raises
    ``ValueError`` naming it.
    """
    data = load_body(body)
    items: list[ConversationItem] = []
    instructions = opt_str(data, "instructions", "body")
    if instructions is not None:
        items.append(System(instructions))
    raw_input = data.get("input")
    if raw_input is None:
        raise ValueError("input is required")
    if isinstance(raw_input, str):
        items.append(User(raw_input))
    else:
        items.extend(_parse_input(as_list(raw_input, "input")))
    reasoning = as_object(data.get("reasoning") or {}, "reasoning")
    text = as_object(data.get("text") or {}, "text")
    tools, hosted, tool_order = _parse_tools(data)
    return ConversationRequest(
        items=items,
        tools=tools,
        hosted_tools=hosted,
        tool_order=tool_order,
        tool_choice=_parse_tool_choice(data.get("tool_choice")),
        parallel_tool_calls=opt_bool(data, "parallel_tool_calls", "body"),
        model=opt_str(data, "model", "body"),
        temperature=opt_number(data, "temperature", "body"),
        top_p=opt_number(data, "top_p", "body"),
        max_output_tokens=opt_int(data, "max_output_tokens", "body"),
        reasoning_effort=parse_effort(reasoning.get("effort"), "reasoning.effort"),
        response_schema=_parse_text_format(text.get("format")),
        prompt_cache_key=opt_str(data, "prompt_cache_key", "body"),
        user_id=opt_str(data, "safety_identifier", "body") or opt_str(data, "user", "body"),
        metadata=string_metadata(data.get("metadata") or {}, "metadata"),
        background=opt_bool(data, "background", "body") or False,
        store=opt_bool(data, "store", "body"),
        previous_response_id=opt_str(data, "previous_response_id", "body"),
        conversation=_parse_conversation(data.get("conversation")),
    )


def unmodeled_request_fields(body: bytes | Mapping[str, Any]) -> JsonObject:
    """Top-level fields of ``body`` that :func:`parse_request` cannot represent."""
    return unmodeled_fields(
        load_body(body),
        KNOWN_FIELDS,
        {
            "tools": lambda tools: all(_tool_modelable(t) for t in tools),
            "reasoning": lambda r: isinstance(r, Mapping) and set(r) <= {"effort", "summary"},
            "text": lambda t: (
                isinstance(t, Mapping)
                and set(t) == {"format"}
                and isinstance(t["format"], Mapping)
                and t["format"].get("type") == "json_schema"
            ),
            "tool_choice": lambda v: (
                isinstance(v, str) or (isinstance(v, Mapping) and v.get("type") == "function")
            ),
        },
    )


def _tool_modelable(tool: Any) -> bool:
    if not isinstance(tool, Mapping):
        return False
    keys = {k for k, v in tool.items() if v is not None}
    if tool.get("type") == "function":
        return keys <= {"type", "name", "description", "parameters", "strict", "defer_loading"}
    return True  # every other tool is kept, modeled or verbatim (ProviderTool)


def _parse_input(raw_items: list[Any]) -> list[ConversationItem]:
    out: list[ConversationItem] = []
    # Whether out[-1] is an Assistant that later function_call items may still join.
    open_assistant = False
    for n, raw in enumerate(raw_items):
        where = f"input[{n}]"
        item = as_object(raw, where)
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            out.append(_parse_assistant_message(item, where))
            open_assistant = True
            continue
        if kind == "function_call":
            call = ToolCall(
                id=req_str(item, "call_id", where),
                name=req_str(item, "name", where),
                arguments=req_str(item, "arguments", where),
                namespace=opt_str(item, "namespace", where),
            )
            last = out[-1] if out else None
            if open_assistant and isinstance(last, Assistant):
                out[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(Assistant(tool_calls=(call,)))
                open_assistant = True
            continue
        open_assistant = False
        out.append(_parse_other_item(kind, item, where))
    return out


def _parse_other_item(kind: Any, item: Mapping[str, Any], where: str) -> ConversationItem:
    if kind == "message":
        role = item.get("role")
        if role in ("system", "developer"):
            content = item.get("content")
            return System(
                _text_of(content, where),
                developer=role == "developer",
                cache_breakpoint=_any_marked(content),
            )
        if role == "user":
            return User(_parse_parts(item.get("content"), where))
        raise ValueError(f"{where}.role must be one of user, system, developer, assistant")
    if kind == "function_call_output":
        output = item.get("output")
        parts = [TextPart(output)] if isinstance(output, str) else _parse_parts(output, where)
        if any(isinstance(p, OpaquePart) for p in parts):
            raise ValueError(f"{where}.output may hold only input_text and input_image parts")
        return ToolResult(
            call_id=req_str(item, "call_id", where),
            content="".join(p.text for p in parts if isinstance(p, TextPart)),
            images=[p for p in parts if isinstance(p, ImagePart)],
        )
    if kind == "reasoning":
        return _parse_reasoning(item, where)
    if isinstance(kind, str) and (kind.endswith("_call") or kind.startswith("mcp_")):
        return _parse_hosted_call(kind, item)
    if isinstance(kind, str):
        # compaction, shell and apply_patch calls and outputs, item references, newer
        # types: kept verbatim, sent back as they are.
        return OpaqueItem(raw=dict(item), origin=BACKEND)
    raise ValueError(f"{where}.type must be a string naming the input item type")


def _text_of(value: Any, where: str) -> str:
    parts = [TextPart(value)] if isinstance(value, str) else _parse_parts(value, where)
    if not all(isinstance(p, TextPart) for p in parts):
        raise ValueError(f"{where}.content may hold only text here")
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def _parse_parts(value: Any, where: str) -> list[ContentPart]:
    if isinstance(value, str):
        return [TextPart(value)]
    parts: list[ContentPart] = []
    for n, raw in enumerate(as_list(value, f"{where}.content")):
        w = f"{where}.content[{n}]"
        part = as_object(raw, w)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append(TextPart(req_str(part, "text", w), _marked(part)))
        elif kind == "input_image":
            detail = opt_str(part, "detail", w)
            # ``auto`` is the API default, the same as saying nothing.
            parts.append(
                ImagePart(
                    req_str(part, "image_url", w),
                    None if detail == "auto" else detail,
                    _marked(part),
                )
            )
        else:
            # input_file, newer part types: kept as read.
            parts.append(OpaquePart(part, BACKEND))
    return parts


def _marked(part: Mapping[str, Any]) -> bool:
    return part.get(OPENAI_MARKS.key) is not None


def _any_marked(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and _marked(part) for part in content
    )


def _parse_assistant_message(item: Mapping[str, Any], where: str) -> Assistant:
    content = item.get("content")
    text, refusal = "", None
    citations: list[Citation] = []
    if isinstance(content, str):
        text = content
    else:
        for n, raw in enumerate(as_list(content or [], f"{where}.content")):
            part = as_object(raw, f"{where}.content[{n}]")
            if part.get("type") == "refusal":
                refusal = req_str(part, "refusal", f"{where}.content[{n}]")
            else:
                text += req_str(part, "text", f"{where}.content[{n}]")
                notes = as_list(part.get("annotations") or [], f"{where}.content[{n}]")
                for m, note in enumerate(notes):
                    raw_note = as_object(note, f"{where}.content[{n}].annotations[{m}]")
                    citations.append(citation_from_wire(raw_note, BACKEND))
    return Assistant(
        content=text,
        refusal=refusal,
        id=opt_str(item, "id", where),
        phase=opt_str(item, "phase", where),
        citations=citations,
    )


def _parse_reasoning(item: Mapping[str, Any], where: str) -> Reasoning:
    summary = [
        req_str(as_object(s, f"{where}.summary[{n}]"), "text", f"{where}.summary[{n}]")
        for n, s in enumerate(as_list(item.get("summary") or [], f"{where}.summary"))
    ]
    text = "".join(
        req_str(as_object(c, f"{where}.content[{n}]"), "text", f"{where}.content[{n}]")
        for n, c in enumerate(as_list(item.get("content") or [], f"{where}.content"))
    )
    return Reasoning(
        text=text,
        summary=summary,
        id=opt_str(item, "id", where),
        encrypted_content=opt_str(item, "encrypted_content", where),
        origin=BACKEND,
    )


def _parse_hosted_call(kind: str, item: Mapping[str, Any]) -> BackendToolCall:
    arguments = item.get("action", item.get("arguments"))
    if arguments is None:
        arguments = {}
    return BackendToolCall(
        id=str(item.get("id") or item.get("call_id") or ""),
        name=kind.removesuffix("_call"),
        arguments=arguments if isinstance(arguments, str) else dumps(arguments).decode(),
        status=item.get("status") if isinstance(item.get("status"), str) else None,
        origin=BACKEND,
        raw=(dict(item),),
    )


def _parse_tools(
    data: Mapping[str, Any],
) -> tuple[list[ToolSpec], list[HostedTool], tuple[str, ...]]:
    """Function tools as :class:`ToolSpec` s; every other tool kept (see ``_hosted``);
    the order record of the two."""
    tools: list[ToolSpec] = []
    hosted: list[HostedTool] = []
    kinds: list[str] = []
    for n, raw in enumerate(as_list(data.get("tools") or [], "tools")):
        w = f"tools[{n}]"
        tool = as_object(raw, w)
        if tool.get("type") != "function":
            hosted.append(parse_hosted_tool(tool, w))
            kinds.append("hosted")
            continue
        kinds.append("function")
        tools.append(
            ToolSpec(
                name=req_str(tool, "name", w),
                description=opt_str(tool, "description", w),
                parameters=as_object(
                    tool.get("parameters") or {"type": "object", "properties": {}},
                    f"{w}.parameters",
                ),
                strict=opt_bool(tool, "strict", w),
                defer_loading=bool(opt_bool(tool, "defer_loading", w)),
            )
        )
    return tools, hosted, order_record(kinds)


def _parse_tool_choice(value: Any) -> ToolChoiceSpec | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return ToolChoice(value)
        except ValueError:
            raise ValueError("tool_choice must be auto, none, required or an object") from None
    obj = as_object(value, "tool_choice")
    if obj.get("type") != "function":
        return None  # hosted-tool and allowed_tools selectors: outside the neutral model
    return NamedToolChoice(req_str(obj, "name", "tool_choice"))


def _parse_text_format(value: Any) -> ResponseSchema | None:
    if value is None:
        return None
    fmt = as_object(value, "text.format")
    if fmt.get("type") != "json_schema":
        return None
    return ResponseSchema(
        name=req_str(fmt, "name", "text.format"),
        schema=as_object(fmt.get("schema", {}), "text.format.schema"),
        # Like function tools, an omitted strict means strict on Responses.
        strict=opt_bool(fmt, "strict", "text.format") is not False,
        description=opt_str(fmt, "description", "text.format"),
    )
