"""Request validation the way the real APIs do it, and extraction of a :class:`RequestView`.

Each ``view_*`` function takes the decoded JSON body, raises :class:`ApiError` (status,
message, ``param``/``code`` for OpenAI) for what the real API rejects with a 400, and
otherwise returns the facts the reply needs, including the prompt's size and cache result.
The checks are the ones clients get wrong in practice (see ``docs/emulator.md``); this is
not a full schema validator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..wire._cache import MAX_CACHE_BREAKPOINTS, OPENAI_MARKS, explicit_prompt_caching
from ._api_error import ApiError
from ._cache import CacheResult, PromptCache
from ._reply import RequestView, ToolOffer
from ._structured import output_request

__all__ = ["ApiError", "view_chat", "view_messages", "view_responses"]


def _canonical(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


#: The most output tokens a request may ask for (every model the emulator plays has this
#: ceiling, the largest of the real ones'): a larger ``max_tokens`` is a 400, as it is from
#: the real APIs, and an ``ignore_eos`` reply is never longer.
MAX_OUTPUT_TOKENS = 128_000


def _int_field(
    body: Mapping[str, Any],
    key: str,
    minimum: int,
    *,
    anthropic: bool = False,
    maximum: int | None = None,
) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if anthropic:
            raise ApiError(f"{key}: Input should be a valid integer")
        raise ApiError(
            f"Invalid type for '{key}': expected an integer, but got {type(value).__name__}.",
            param=key,
            code="invalid_type",
        )
    if value < minimum:
        if anthropic:
            raise ApiError(f"{key}: Input should be greater than or equal to {minimum}")
        raise ApiError(
            f"Invalid '{key}': integer below minimum value. Expected a value >= {minimum}, "
            f"but got {value} instead.",
            param=key,
            code="integer_below_min_value",
        )
    if maximum is not None and value > maximum:
        if anthropic:
            raise ApiError(
                f"{key}: {value} > {maximum}, which is the maximum allowed number of output tokens"
            )
        raise ApiError(
            f"Invalid '{key}': integer above maximum value. Expected a value <= {maximum}, "
            f"but got {value} instead.",
            param=key,
            code="integer_above_max_value",
        )
    return value


def _openai_common(body: Mapping[str, Any]) -> tuple[str, bool]:
    model = body.get("model")
    if model is None:
        raise ApiError("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise ApiError("Invalid type for 'model': expected a string.", param="model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(
            "Invalid type for 'stream': expected a boolean.", param="stream", code="invalid_type"
        )
    return model, bool(stream)


def _text_of(content: Any) -> str:
    """The text of a string-or-parts content value."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


# --------------------------------------------------------------------- Chat Completions


def view_chat(body: Mapping[str, Any], cache: PromptCache) -> RequestView:
    """Validate a Chat Completions body."""
    model, stream = _openai_common(body)
    messages = body.get("messages")
    if messages is None:
        raise ApiError(
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    pending: dict[str, int] = {}
    answered: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ApiError(
                f"Invalid type for 'messages[{index}]': expected an object.",
                param=f"messages[{index}]",
                code="invalid_type",
            )
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise ApiError(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'function', 'tool', and 'developer'.",
                param=f"messages[{index}].role",
                code="invalid_value",
            )
        if role != "tool" and pending:
            _unanswered_chat(pending)
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                    pending[call["id"]] = index
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ApiError(
                    f"Missing required parameter: 'messages[{index}].tool_call_id'.",
                    param=f"messages[{index}].tool_call_id",
                    code="missing_required_parameter",
                )
            if call_id not in pending and call_id not in answered:
                raise ApiError(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            pending.pop(call_id, None)
            answered.add(call_id)
    if pending:
        _unanswered_chat(pending)
    max_tokens = _int_field(body, "max_completion_tokens", 1, maximum=MAX_OUTPUT_TOKENS)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 1, maximum=MAX_OUTPUT_TOKENS)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    tools = _chat_tools(body.get("tools"))
    choice = body.get("tool_choice")
    forced = None
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        forced = choice["function"].get("name")
    last = messages[-1]
    effort = body.get("reasoning_effort")
    head = [_canonical(t) for t in body.get("tools") or ()]
    return RequestView(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        include_usage=include_usage,
        reasoning=effort is not None and effort != "none",
        tools=tools,
        forced_tool=forced if isinstance(forced, str) else None,
        tools_disabled=choice == "none",
        last_is_user=last.get("role") == "user",
        prefill=last.get("role") == "assistant" and not last.get("tool_calls"),
        tool_result=_text_of(last.get("content")) if last.get("role") == "tool" else None,
        prompt=_openai_prompt(cache, model, body, head, messages, "text"),
        output=output_request("chat_completions", body),
    )


#: OpenAI explicit caching: the breakpoints a read looks back over.
OPENAI_READ_LOOKBACK = 50


def _openai_prompt(
    cache: PromptCache,
    model: str,
    body: Mapping[str, Any],
    head: list[str],
    messages: list[Any],
    text_type: str,
) -> CacheResult:
    """The cache result of a Chat Completions or Responses prompt (see ``_cache``)."""
    namespace = f"openai\0{model}"
    if not explicit_prompt_caching(model):
        return cache.automatic(namespace, [*head, *(_canonical(m) for m in messages)])
    blocks = [(text, False) for text in head]
    for message in messages:
        blocks += _openai_blocks(message, text_type)
    options = body.get("prompt_cache_options")
    mode = options.get("mode") if isinstance(options, Mapping) else None
    if mode != "explicit" and blocks:
        blocks[-1] = (blocks[-1][0], True)  # the implicit breakpoint: the latest message
    return cache.breakpoints(
        namespace, blocks, max_writes=MAX_CACHE_BREAKPOINTS, lookback=OPENAI_READ_LOOKBACK
    )


def _openai_blocks(message: Any, text_type: str) -> list[tuple[str, bool]]:
    """A message as (canonical text, marked) blocks: its fields, then each content part
    without its mark (string content counts as one text part, as the API tokenizes it)."""
    if not isinstance(message, Mapping) or "content" not in message:
        return [(_canonical(message), False)]
    content = message["content"]
    parts = [{"type": text_type, "text": content}] if isinstance(content, str) else content
    blocks = [(_canonical({k: v for k, v in message.items() if k != "content"}), False)]
    for part in parts if isinstance(parts, list) else [parts]:
        marked = isinstance(part, Mapping) and part.get(OPENAI_MARKS.key) is not None
        if isinstance(part, Mapping):
            part = {k: v for k, v in part.items() if k != OPENAI_MARKS.key}
        blocks.append((_canonical(part), marked))
    return blocks


def _unanswered_chat(pending: Mapping[str, int]) -> None:
    ids = ", ".join(pending)
    index = min(pending.values())
    raise ApiError(
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        f"to each 'tool_call_id'. The following tool_call_ids did not have response "
        f"messages: {ids}",
        param=f"messages.[{index}].role",
    )


def _chat_tools(tools: Any) -> tuple[ToolOffer, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ApiError("Invalid type for 'tools': expected an array.", param="tools")
    offers = []
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping) and tool.get("type", "function") != "function":
            continue  # a server's own tool (openrouter:web_search, ...): accepted, not offered
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ApiError(
                f"Missing required parameter: 'tools[{index}].function'.",
                param=f"tools[{index}].function",
                code="missing_required_parameter",
            )
        offers.append(ToolOffer(function["name"], function.get("parameters") or {}))
    return tuple(offers)


# ------------------------------------------------------------------------------ Responses

_ECHOED = (
    "instructions",
    "max_output_tokens",
    "previous_response_id",
    "prompt_cache_key",
    "temperature",
    "top_p",
    "tool_choice",
    "parallel_tool_calls",
    "truncation",
    "metadata",
    "store",
    "text",
    "reasoning",
    "background",
)


def view_responses(body: Mapping[str, Any], cache: PromptCache) -> RequestView:
    """Validate a Responses body."""
    model, stream = _openai_common(body)
    items = body.get("input")
    if items is None:
        raise ApiError(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError("Invalid type for 'input': expected a string or an array.", param="input")
    continued = body.get("previous_response_id") is not None
    calls: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ApiError(
                f"Invalid type for 'input[{index}]': expected an object.", param=f"input[{index}]"
            )
        kind = item.get("type", "message")
        if kind == "function_call" and isinstance(item.get("call_id"), str):
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ApiError(
                    f"Missing required parameter: 'input[{index}].call_id'.",
                    param=f"input[{index}].call_id",
                    code="missing_required_parameter",
                )
            if call_id not in calls and not continued:
                raise ApiError(
                    f"No tool call found for function call output with call_id {call_id}.",
                    param="input",
                )
        elif kind == "message" and item.get("role") not in (
            "user",
            "assistant",
            "system",
            "developer",
        ):
            raise ApiError(
                f"Invalid value: '{item.get('role')}'. Supported values are: 'assistant', "
                "'system', 'developer', and 'user'.",
                param=f"input[{index}].role",
                code="invalid_value",
            )
    max_tokens = _int_field(body, "max_output_tokens", 16, maximum=MAX_OUTPUT_TOKENS)
    reasoning = body.get("reasoning")
    include = body.get("include") or ()
    tools: list[ToolOffer] = []
    for tool in body.get("tools") or ():
        if isinstance(tool, Mapping) and tool.get("type") == "function":
            if not isinstance(tool.get("name"), str):
                raise ApiError(
                    "Missing required parameter: 'tools[0].name'.",
                    param="tools[0].name",
                    code="missing_required_parameter",
                )
            tools.append(ToolOffer(tool["name"], tool.get("parameters") or {}))
    choice = body.get("tool_choice")
    forced = choice.get("name") if isinstance(choice, Mapping) else None
    last = items[-1] if items else {}
    last_kind = last.get("type", "message")
    tool_result = None
    if last_kind == "function_call_output":
        output = last.get("output")
        tool_result = output if isinstance(output, str) else _text_of(output)
    head = [_canonical(body.get("instructions") or ""), _canonical(body.get("tools") or [])]
    return RequestView(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        reasoning=isinstance(reasoning, Mapping) and reasoning.get("effort") != "none",
        include_encrypted="reasoning.encrypted_content" in include,
        tools=tuple(tools),
        forced_tool=forced if isinstance(forced, str) else None,
        tools_disabled=choice == "none",
        last_is_user=last_kind == "message" and last.get("role") == "user",
        prefill=last_kind == "message" and last.get("role") == "assistant",
        tool_result=tool_result,
        prompt=_openai_prompt(cache, model, body, head, items, "input_text"),
        output=output_request("responses", body),
        echo={key: body[key] for key in _ECHOED if key in body}
        | {"tools": body.get("tools") or []},
    )


# ------------------------------------------------------------------------------- Messages


def view_messages(body: Mapping[str, Any], cache: PromptCache) -> RequestView:
    """Validate a Messages body."""
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise ApiError(f"{key}: Field required")
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise ApiError("model: Input should be a valid string")
    max_tokens = _int_field(body, "max_tokens", 1, anthropic=True, maximum=MAX_OUTPUT_TOKENS)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("stream: Input should be a valid boolean")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise ApiError("messages: Input should be a valid list")
    marks = _check_messages(messages)
    system = body.get("system")
    system_blocks: list[Any] = (
        [{"type": "text", "text": system}] if isinstance(system, str) else list(system or ())
    )
    raw_tools = body.get("tools") or []
    marks += sum(1 for b in [*system_blocks, *raw_tools] if _marked(b))
    automatic = body.get("cache_control") is not None
    if marks + automatic > 4:
        raise ApiError(
            f"A maximum of 4 blocks with cache_control may be provided. Found {marks + automatic}."
        )
    thinking = body.get("thinking")
    reasoning = isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")
    choice = body.get("tool_choice")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            raise ApiError(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            )
        if max_tokens is not None and budget >= max_tokens:
            raise ApiError("`max_tokens` must be greater than `thinking.budget_tokens`.")
    if reasoning and isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
        raise ApiError("Thinking may not be enabled when `tool_choice` forces tool use.")
    tools = tuple(
        ToolOffer(tool["name"], tool.get("input_schema") or {})
        for tool in raw_tools
        if isinstance(tool, Mapping) and "type" not in tool and isinstance(tool.get("name"), str)
    )
    blocks = [(_canonical(_unmarked(t)), _marked(t)) for t in raw_tools]
    blocks += [(_canonical(_unmarked(b)), _marked(b)) for b in system_blocks]
    for message in messages:
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks.append((message.get("role", "") + ":", False))
        blocks += [(_canonical(_unmarked(b)), _marked(b)) for b in parts]
    if automatic and blocks:
        blocks[-1] = (blocks[-1][0], True)
    last = messages[-1] if messages else {}
    content = last.get("content")
    last_parts: list[Any] = content if isinstance(content, list) else []
    results = [b for b in last_parts if isinstance(b, Mapping) and b.get("type") == "tool_result"]
    return RequestView(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        reasoning=reasoning,
        tools=tools,
        forced_tool=choice.get("name") if isinstance(choice, Mapping) else None,
        tools_disabled=isinstance(choice, Mapping) and choice.get("type") == "none",
        last_is_user=last.get("role") == "user" and not results,
        prefill=last.get("role") == "assistant",
        tool_result=" ".join(_text_of(b.get("content")) for b in results) if results else None,
        prompt=cache.breakpoints(f"anthropic\0{model}", blocks),
        output=output_request("messages", body),
    )


def _marked(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("cache_control") is not None


def _unmarked(block: Any) -> Any:
    if isinstance(block, Mapping) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _check_messages(messages: list[Any]) -> int:
    """Roles, content shapes, tool_use/tool_result pairing; returns the cache mark count."""
    marks = 0
    expected: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise ApiError(f"messages.{index}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            parts: list[Any] = []
        elif isinstance(content, list):
            parts = content
        else:
            raise ApiError(f"messages.{index}.content: Input should be a valid list")
        for number, part in enumerate(parts):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise ApiError(f"messages.{index}.content.{number}: Input should be an object")
            marks += _marked(part)
        results = [p.get("tool_use_id") for p in parts if p.get("type") == "tool_result"]
        for number, result in enumerate(results):
            if result not in expected:
                raise ApiError(
                    f"messages.{index}.content.{number}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {result}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        missing = [call for call in expected if call not in results]
        if missing:
            raise ApiError(
                f"messages.{index - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        expected = []
        if message["role"] == "assistant":
            expected = [p.get("id") for p in parts if p.get("type") == "tool_use"]
    return marks
