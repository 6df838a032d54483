"""Chat Completions request builder and parser (sans-I/O).

:func:`build_request` renders a :class:`ConversationRequest` as a ``POST /chat/completions``
body; :func:`parse_request` reads one back (the emulator's entry point). The mapping, the
normalizations and every conversion note are listed in ``docs/backends/request-mapping.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ...types._conversation import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    HostedTool,
    ImagePart,
    NamedToolChoice,
    OpaqueItem,
    OpaquePart,
    ProviderFields,
    ProviderTool,
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
from .._cache import OPENAI_MARKS, render_openai_cache
from .._fields import merge_own, note_foreign, unknown_fields
from .._hosted import drop, in_order, order_record, passthrough
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
    opt_str_list,
    own_parts,
    parse_effort,
    reasoning_is_native,
    req_str,
    resolve_model,
    string_metadata,
    unmodeled_fields,
)
from .._request import BuildOptions, ConversionAction, WireRequest, refuse_chained
from .._structured import lower_structured_output

__all__ = ["KNOWN_FIELDS", "PATH", "build_request", "parse_request", "unmodeled_request_fields"]

PATH = "/chat/completions"
BACKEND = ApiBackend.CHAT_COMPLETIONS


#: Top-level fields :func:`parse_request` understands.
KNOWN_FIELDS = (
    "messages",
    "model",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_completion_tokens",
    "max_tokens",
    "reasoning_effort",
    "response_format",
    "stop",
    "prompt_cache_key",
    "user",
    "safety_identifier",
    "metadata",
    "stream",
    "stream_options",
    "store",
)


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------


def build_request(request: ConversationRequest, options: BuildOptions) -> WireRequest:
    """Render ``request`` as a Chat Completions body.

    Items keep their order, one wire message each, except that reasoning is folded into
    the following assistant message (only when reasoning is replayed) and tool-result
    images move to one user message after the run of tool messages. Anything the
    protocol cannot carry is converted or dropped and recorded in the report
    (``options.strict`` raises :class:`ConversionError` instead).
    """
    report = ReportCollector(options.strict)
    request = lower_structured_output(request, options, report)
    data: JsonObject = {
        "model": resolve_model(request, options),
        "messages": _messages(request.items, options, report),
    }
    note_foreign(request, BACKEND, report)
    _render_tools(data, request, report)
    _render_sampling(data, request, options, report)
    render_openai_cache(data, data["messages"], options, report, text_type="text")
    return finish_request(PATH, data, options, report)


def _replays_reasoning(options: BuildOptions) -> bool:
    if options.replay_reasoning_content is not None:
        return options.replay_reasoning_content
    return options.profile.reasoning_content_replay


def _messages(
    items: Sequence[ConversationItem], options: BuildOptions, report: ReportCollector
) -> list[JsonObject]:
    replay = _replays_reasoning(options)
    developer_role = options.profile.developer_role
    messages: list[JsonObject] = []
    pending_reasoning: list[tuple[int, Reasoning]] = []
    pending_images: list[tuple[int, ToolResult]] = []

    def drop_reasoning(reason: str) -> None:
        for index, _ in pending_reasoning:
            report.note(index, "reasoning", ConversionAction.DROPPED, reason)
        pending_reasoning.clear()

    for index, item in enumerate(items):
        if pending_images and not isinstance(item, ToolResult):
            messages.append(_tool_images_message(pending_images, report))
            pending_images.clear()
        if isinstance(item, Reasoning):
            pending_reasoning.append((index, item))
        elif isinstance(item, OpaqueItem):
            report.note(
                index,
                f"{item.kind} handed over by {item.origin.value}",
                ConversionAction.DROPPED,
                "only the backend that handed it over can take it back",
            )
        elif isinstance(item, BackendToolCall):
            # Like the reference, a hosted call between reasoning and its answer does not
            # break the fold: the reasoning still belongs to the assistant turn.
            report.note(
                index,
                f"backend tool call {item.name}",
                ConversionAction.CONVERTED_TO_TEXT,
                "Chat Completions has no hosted-tool items; sent as assistant text",
            )
            messages.append({"role": "assistant", "content": item.text_summary()})
        elif isinstance(item, Assistant):
            if item.citations:
                report.note(
                    index,
                    "citations",
                    ConversionAction.DROPPED,
                    "Chat Completions takes no citations in a request",
                )
            messages.append(
                _assistant(item, pending_reasoning, replay, report, options.profile.reasoning_field)
            )
            pending_reasoning.clear()
        else:
            drop_reasoning("no assistant turn follows it before the next message")
            if isinstance(item, System):
                role = "developer" if item.developer and developer_role else "system"
                part = TextPart(
                    item.content, item.cache_breakpoint, provider_fields=item.part_fields
                )
                message = {"role": role, "content": _user_content([part])}
                messages.append(merge_own(message, item.provider_fields, BACKEND))
            elif isinstance(item, User):
                parts = own_parts(index, item.content, BACKEND, report)
                message = {"role": "user", "content": _user_content(parts)}
                messages.append(merge_own(message, item.provider_fields, BACKEND))
            else:
                message = _tool_message(index, item, report)
                messages.append(merge_own(message, item.provider_fields, BACKEND))
                if item.images:
                    pending_images.append((index, item))
    if pending_images:
        messages.append(_tool_images_message(pending_images, report))
    drop_reasoning("no assistant turn follows it")
    return messages


def _user_content(parts: Sequence[ContentPart]) -> str | list[JsonObject]:
    # A lone text part is sent as a plain string: what every client sends, and what
    # servers without content-part support accept.
    if len(parts) == 1 and _plain_text(parts[0]):
        return parts[0].text
    return [_content_part(p) for p in parts]


def _plain_text(part: ContentPart) -> TypeGuard[TextPart]:
    if not isinstance(part, TextPart) or part.cache_breakpoint:
        return False
    return part.provider_fields is None or part.provider_fields.backend is not BACKEND


def _content_part(part: ContentPart) -> JsonObject:
    wire: JsonObject
    if isinstance(part, OpaquePart):
        return dict(part.raw)  # its own backend's, as read (see own_parts)
    if isinstance(part, TextPart):
        wire = {"type": "text", "text": part.text}
    else:
        image: JsonObject = {"url": part.url}
        if part.detail is not None:
            image["detail"] = part.detail
        wire = {"type": "image_url", "image_url": image}
    if part.cache_breakpoint:
        wire[OPENAI_MARKS.key] = dict(OPENAI_MARKS.value)
    if isinstance(part, TextPart):
        merge_own(wire, part.provider_fields, BACKEND)
    return wire


def _tool_message(index: int, item: ToolResult, report: ReportCollector) -> JsonObject:
    if item.is_error:
        report.note(
            index,
            "tool result error flag",
            ConversionAction.DROPPED,
            "Chat Completions tool messages have no error flag",
        )
    return {"role": "tool", "tool_call_id": item.call_id, "content": item.content}


def _tool_images_message(
    results: Sequence[tuple[int, ToolResult]], report: ReportCollector
) -> JsonObject:
    """One user message carrying the images of a run of tool results.

    A ``tool`` message cannot hold images, and a user message between tool messages
    would break the "tool_calls must be followed by tool messages" rule, so the images
    follow the whole run.
    """
    parts: list[JsonObject] = []
    for index, item in results:
        report.note(
            index,
            "tool result images",
            ConversionAction.ADJUSTED,
            "a tool message cannot carry images; sent in a user message after the tool messages",
        )
        parts.append({"type": "text", "text": f"Images returned by tool call {item.call_id}:"})
        parts.extend(_content_part(image) for image in item.images)
    return {"role": "user", "content": parts}


def _assistant(
    item: Assistant,
    reasoning: Sequence[tuple[int, Reasoning]],
    replay: bool,
    report: ReportCollector,
    reasoning_field: str = "reasoning_content",
) -> JsonObject:
    # ``content: null`` with tool calls is what the official clients send.
    # (or with an audio reference: the audio is the content).
    stands_in = item.tool_calls or item.refusal or item.audio_id is not None
    content = item.content if item.content or not stands_in else None
    message: JsonObject = {"role": "assistant", "content": content}
    texts: list[str] = []
    for index, r in reasoning:
        if not replay:
            report.note(
                index,
                "reasoning",
                ConversionAction.DROPPED,
                "Chat Completions takes no reasoning back unless replay_reasoning_content",
            )
            continue
        if not reasoning_is_native(r, BACKEND):
            report.note(
                index,
                "reasoning",
                ConversionAction.CONVERTED_TO_TEXT,
                "opaque reasoning state from another backend cannot be replayed; "
                "its text is sent as reasoning_content",
            )
        if r.display_text:
            texts.append(r.display_text)
    if texts:
        message[reasoning_field] = "\n".join(texts)
    if item.refusal is not None:
        message["refusal"] = item.refusal
    if item.tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in item.tool_calls]
    if item.audio_id is not None:
        message["audio"] = {"id": item.audio_id}
    return merge_own(message, item.provider_fields, BACKEND)


def _tool_call(call: ToolCall) -> JsonObject:
    # Arguments go out byte for byte as the model produced them: rewriting invalid JSON
    # (as the reference does) would show the model arguments it never wrote.
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _render_tools(data: JsonObject, request: ConversationRequest, report: ReportCollector) -> None:
    tools: list[JsonObject] = []
    for tool in in_order(request):
        if isinstance(tool, ToolSpec):
            tools.append(_function_tool(tool, report))
        elif isinstance(tool, ProviderTool):
            if (wire := passthrough(tool, BACKEND, report)) is not None:
                tools.append(wire)
        else:
            drop(
                report,
                tool,
                "Chat Completions has no hosted tools (a server's own, such as OpenRouter's "
                "openrouter:web_search, goes in a ProviderTool)",
            )
    if tools:
        data["tools"] = tools
    if not gate_tool_controls(request, bool(tools), report):
        return
    if request.tool_choice is not None:
        data["tool_choice"] = _tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None:
        data["parallel_tool_calls"] = request.parallel_tool_calls


def _function_tool(spec: ToolSpec, report: ReportCollector) -> JsonObject:
    if spec.defer_loading:
        report.note(
            None,
            f"tool {spec.name!r} defer_loading",
            ConversionAction.DROPPED,
            "Chat Completions has no tool search; the tool is sent whole",
        )
    function: JsonObject = {"name": spec.name}
    if spec.description is not None:
        function["description"] = spec.description
    function["parameters"] = dict(spec.parameters)
    if spec.strict is not None:
        function["strict"] = spec.strict
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoiceSpec) -> Any:
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice.value


def _render_sampling(
    data: JsonObject,
    request: ConversationRequest,
    options: BuildOptions,
    report: ReportCollector,
) -> None:
    if request.temperature is not None:
        data["temperature"] = request.temperature
    if request.top_p is not None:
        data["top_p"] = request.top_p
    if request.max_output_tokens is not None:
        data[options.profile.max_tokens_field] = request.max_output_tokens
    if request.reasoning_effort is not None:
        data["reasoning_effort"] = request.reasoning_effort.value
    if request.response_schema is not None:
        data["response_format"] = _response_format(request.response_schema)
    if request.stop_sequences:
        data["stop"] = list(request.stop_sequences)
    if request.prompt_cache_key is not None:
        data["prompt_cache_key"] = request.prompt_cache_key
    if request.background:
        report.note(
            None,
            "background",
            ConversionAction.DROPPED,
            "Chat Completions has no background mode",
        )
    if request.user_id is not None:
        data["user"] = request.user_id
    if request.store is not None:
        data["store"] = request.store
    if request.metadata and request.store:
        data["metadata"] = dict(request.metadata)
    elif request.metadata:
        report.note(
            None,
            "metadata",
            ConversionAction.DROPPED,
            "Chat Completions accepts metadata only for stored completions; "
            "set store=True to keep it",
        )
    refuse_chained(request, "Chat Completions")
    if options.stream:
        data["stream"] = True
        if options.profile.supports_stream_usage:
            data["stream_options"] = {"include_usage": True}


def _response_format(schema: ResponseSchema) -> JsonObject:
    inner: JsonObject = {"name": schema.name}
    if schema.description is not None:
        inner["description"] = schema.description
    inner["schema"] = dict(schema.schema)
    inner["strict"] = schema.strict
    return {"type": "json_schema", "json_schema": inner}


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def parse_request(body: bytes | Mapping[str, Any]) -> ConversationRequest:
    """Read a Chat Completions body back into a :class:`ConversationRequest`.

    Tolerant of what real clients send (string or part-list content, ``content: null``,
    ``reasoning_content`` or ``reasoning``, ``max_tokens`` or ``max_completion_tokens``);
    fields outside the neutral model are ignored here (see
    :func:`unmodeled_request_fields`). A field of the wrong shape raises ``ValueError``
    naming it.
    """
    data = load_body(body)
    if "messages" not in data:
        raise ValueError("messages is required")
    items: list[ConversationItem] = []
    for n, raw in enumerate(as_list(data["messages"], "messages")):
        items.extend(_parse_message(as_object(raw, f"messages[{n}]"), f"messages[{n}]"))
    tools, hosted, tool_order = _parse_tools(data)
    tool_choice = _parse_tool_choice(data.get("tool_choice"))
    max_tokens = opt_int(data, "max_completion_tokens", "body")
    if max_tokens is None:
        max_tokens = opt_int(data, "max_tokens", "body")
    user = opt_str(data, "user", "body") or opt_str(data, "safety_identifier", "body")
    return ConversationRequest(
        items=items,
        tools=tools,
        hosted_tools=hosted,
        tool_order=tool_order,
        tool_choice=tool_choice,
        parallel_tool_calls=opt_bool(data, "parallel_tool_calls", "body"),
        model=opt_str(data, "model", "body"),
        temperature=opt_number(data, "temperature", "body"),
        top_p=opt_number(data, "top_p", "body"),
        max_output_tokens=max_tokens,
        reasoning_effort=parse_effort(data.get("reasoning_effort"), "reasoning_effort"),
        response_schema=_parse_response_format(data.get("response_format")),
        stop_sequences=opt_str_list(data, "stop", "body"),
        prompt_cache_key=opt_str(data, "prompt_cache_key", "body"),
        user_id=user,
        metadata=string_metadata(data.get("metadata") or {}, "metadata"),
        store=opt_bool(data, "store", "body"),
    )


def unmodeled_request_fields(body: bytes | Mapping[str, Any]) -> JsonObject:
    """Top-level fields of ``body`` that :func:`parse_request` cannot represent."""
    return unmodeled_fields(
        load_body(body),
        KNOWN_FIELDS,
        {
            "tools": _tools_modelable,
            "response_format": lambda v: isinstance(v, Mapping) and v.get("type") == "json_schema",
            "tool_choice": lambda v: (
                isinstance(v, str) or (isinstance(v, Mapping) and v.get("type") == "function")
            ),
        },
    )


def _tools_modelable(tools: Any) -> bool:
    return all(_tool_modelable(t) for t in tools)


def _tool_modelable(tool: Any) -> bool:
    if not isinstance(tool, Mapping):
        return False
    if tool.get("type") != "function":
        return True  # kept verbatim as a ProviderTool
    function = tool.get("function")
    return (
        set(tool) <= {"type", "function"}
        and isinstance(function, Mapping)
        and set(function) <= {"name", "description", "parameters", "strict"}
    )


def _text_content(value: Any, where: str) -> str:
    """String content, or the text of a list of text parts; ``null`` is empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    texts = []
    for n, raw in enumerate(as_list(value, f"{where}.content")):
        part = as_object(raw, f"{where}.content[{n}]")
        if part.get("type") != "text":
            raise ValueError(f"{where}.content[{n}].type must be 'text' here")
        texts.append(req_str(part, "text", f"{where}.content[{n}]"))
    return "".join(texts)


#: The message fields each role's item types; any other is kept verbatim
#: (:class:`ProviderFields`: a gateway's ``cache_control``, ``reasoning_details``, ...).
_MESSAGE_FIELDS = {
    "system": ("role", "content"),
    "developer": ("role", "content"),
    "user": ("role", "content"),
    "assistant": (
        "role",
        "content",
        "refusal",
        "tool_calls",
        "reasoning_content",
        "reasoning",
        "audio",
    ),
    "tool": ("role", "tool_call_id", "content"),
}
#: The fields of a text part the neutral model types; any other is kept verbatim.
_TEXT_PART_FIELDS = ("type", "text", OPENAI_MARKS.key)


def _parse_message(msg: Mapping[str, Any], where: str) -> list[ConversationItem]:
    role = msg.get("role")
    fields = unknown_fields(msg, _MESSAGE_FIELDS.get(str(role), ()), BACKEND)
    if role in ("system", "developer"):
        content = msg.get("content")
        return [
            System(
                _text_content(content, where),
                developer=role == "developer",
                cache_breakpoint=_any_marked(content),
                provider_fields=fields,
                part_fields=_lone_part_fields(content),
            )
        ]
    if role == "user":
        return [User(_parse_user_content(msg.get("content"), where), provider_fields=fields)]
    if role == "assistant":
        return _parse_assistant(msg, where, fields)
    if role == "tool":
        return [
            ToolResult(
                call_id=req_str(msg, "tool_call_id", where),
                content=_text_content(msg.get("content"), where),
                provider_fields=fields,
            )
        ]
    raise ValueError(f"{where}.role must be one of system, developer, user, assistant, tool")


def _parse_user_content(value: Any, where: str) -> list[ContentPart]:
    if isinstance(value, str):
        return [TextPart(value)]
    parts: list[ContentPart] = []
    for n, raw in enumerate(as_list(value, f"{where}.content")):
        w = f"{where}.content[{n}]"
        part = as_object(raw, w)
        kind = part.get("type")
        if kind == "text":
            extra = unknown_fields(part, _TEXT_PART_FIELDS, BACKEND)
            parts.append(TextPart(req_str(part, "text", w), _marked(part), provider_fields=extra))
        elif kind == "image_url":
            image = part.get("image_url")
            if isinstance(image, str):
                parts.append(ImagePart(image, cache_breakpoint=_marked(part)))
            else:
                obj = as_object(image, f"{w}.image_url")
                parts.append(
                    ImagePart(
                        req_str(obj, "url", f"{w}.image_url"),
                        opt_str(obj, "detail", w),
                        _marked(part),
                    )
                )
        else:
            # input_audio, file, newer part types: kept as read.
            parts.append(OpaquePart(part, BACKEND))
    return parts


def _lone_part_fields(content: Any) -> ProviderFields | None:
    """The kept fields of a system message's one text part (a list of several: none)."""
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping):
        return unknown_fields(content[0], _TEXT_PART_FIELDS, BACKEND)
    return None


def _marked(part: Mapping[str, Any]) -> bool:
    return part.get(OPENAI_MARKS.key) is not None


def _any_marked(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and _marked(part) for part in content
    )


def _parse_assistant(
    msg: Mapping[str, Any], where: str, fields: ProviderFields | None
) -> list[ConversationItem]:
    out: list[ConversationItem] = []
    # DeepSeek, xAI and old vLLM say reasoning_content; Ollama and new vLLM say reasoning.
    reasoning = opt_str(msg, "reasoning_content", where) or opt_str(msg, "reasoning", where)
    if reasoning:
        out.append(Reasoning(text=reasoning, origin=BACKEND))
    content = msg.get("content")
    refusal = opt_str(msg, "refusal", where)
    text = ""
    if isinstance(content, list):
        for n, raw in enumerate(content):
            part = as_object(raw, f"{where}.content[{n}]")
            if part.get("type") == "refusal":
                refusal = req_str(part, "refusal", f"{where}.content[{n}]")
            else:
                text += _text_content([part], where)
    else:
        text = _text_content(content, where)
    calls = []
    for n, raw in enumerate(as_list(msg.get("tool_calls") or [], f"{where}.tool_calls")):
        w = f"{where}.tool_calls[{n}]"
        call = as_object(raw, w)
        function = as_object(call.get("function"), f"{w}.function")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = dumps(arguments).decode()
        calls.append(
            ToolCall(
                id=req_str(call, "id", w),
                name=req_str(function, "name", f"{w}.function"),
                arguments=arguments,
            )
        )
    audio = msg.get("audio")
    audio_id = (
        None
        if audio is None
        else req_str(as_object(audio, f"{where}.audio"), "id", f"{where}.audio")
    )
    out.append(
        Assistant(
            content=text,
            tool_calls=calls,
            refusal=refusal,
            audio_id=audio_id,
            provider_fields=fields,
        )
    )
    return out


def _parse_tools(
    data: Mapping[str, Any],
) -> tuple[list[ToolSpec], list[HostedTool], tuple[str, ...]]:
    """Function tools as :class:`ToolSpec` s; any other (a server's own, such as
    ``openrouter:web_search``) kept verbatim as a :class:`ProviderTool`; the order record
    of the two."""
    tools: list[ToolSpec] = []
    hosted: list[HostedTool] = []
    kinds: list[str] = []
    for n, raw in enumerate(as_list(data.get("tools") or [], "tools")):
        tool = as_object(raw, f"tools[{n}]")
        if tool.get("type") != "function":
            hosted.append(ProviderTool(BACKEND, dict(tool)))
            kinds.append("hosted")
            continue
        kinds.append("function")
        function = as_object(tool.get("function"), f"tools[{n}].function")
        w = f"tools[{n}].function"
        tools.append(
            ToolSpec(
                name=req_str(function, "name", w),
                description=opt_str(function, "description", w),
                parameters=as_object(
                    function.get("parameters", {"type": "object", "properties": {}}),
                    f"{w}.parameters",
                ),
                strict=opt_bool(function, "strict", w),
            )
        )
    return tools, hosted, order_record(kinds)


def _parse_tool_choice(value: Any) -> ToolChoiceSpec | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            # Mistral spells "required" "any" (and takes "required" too).
            return ToolChoice("required" if value == "any" else value)
        except ValueError:
            raise ValueError("tool_choice must be auto, none, required or an object") from None
    obj = as_object(value, "tool_choice")
    if obj.get("type") != "function":
        return None  # allowed_tools and custom selectors are outside the neutral model
    function = as_object(obj.get("function"), "tool_choice.function")
    return NamedToolChoice(req_str(function, "name", "tool_choice.function"))


def _parse_response_format(value: Any) -> ResponseSchema | None:
    if value is None:
        return None
    obj = as_object(value, "response_format")
    if obj.get("type") != "json_schema":
        return None  # json_object / text: outside the neutral model
    inner = as_object(obj.get("json_schema"), "response_format.json_schema")
    w = "response_format.json_schema"
    return ResponseSchema(
        name=req_str(inner, "name", w),
        schema=as_object(inner.get("schema", {}), f"{w}.schema"),
        # Chat Completions defaults strict to false when it is omitted.
        strict=bool(opt_bool(inner, "strict", w)),
        description=opt_str(inner, "description", w),
    )
