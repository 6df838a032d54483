"""Messages rendering: ``message_start`` … ``message_stop``, the JSON body, errors.

Shapes follow real captures (``fixtures/real-streams/messages``): ``message_start`` with
the input usage, a ``ping`` after the first ``content_block_start``, thinking blocks that
end with an empty ``thinking_delta`` then a ``signature_delta``, tool input as
``input_json_delta`` starting with ``""``, and a ``message_delta`` whose usage is
cumulative. Usage follows Anthropic's semantics: ``input_tokens`` excludes the cached
parts (``cache_read_input_tokens``, ``cache_creation_input_tokens``).
"""

from __future__ import annotations

from typing import Any

import orjson

from ._reply import Reply, RequestView, chunk_text
from ._script import HostedToolScript
from ._sse import argument_chunks, event_frame
from ._validate import ApiError

__all__ = ["MessagesRenderer"]

_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

#: The ``stop_details`` of a refusal (``stop_reason: "refusal"``), in the API's shape.
REFUSAL_DETAILS = {
    "type": "refusal",
    "category": "general_harms",
    "explanation": "The request was declined by the emulated safety filter.",
}


def _stop(reply: Reply) -> str:
    return "refusal" if reply.refusal else _STOP[reply.stop]


def _refusal_details(reply: Reply) -> dict[str, Any]:
    """``stop_details`` of a refusal: the scripted refusal is its explanation."""
    if reply.refusal:
        return {**REFUSAL_DETAILS, "explanation": reply.refusal}
    return dict(REFUSAL_DETAILS)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_ERROR_MESSAGES = {
    "overloaded_error": "Overloaded",
    "rate_limit_error": "Number of request tokens has exceeded your rate limit (emulated).",
    "api_error": "Internal server error",
    "authentication_error": "invalid x-api-key",
}


def _usage(reply: Reply, *, final: bool) -> dict[str, Any]:
    usage = reply.usage
    fields: dict[str, Any] = {
        "input_tokens": max(
            0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens
        ),
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
    }
    if not final:
        fields["cache_creation"] = {
            "ephemeral_5m_input_tokens": usage.cache_write_tokens,
            "ephemeral_1h_input_tokens": 0,
        }
    fields["output_tokens"] = usage.output_tokens if final else min(1, usage.output_tokens)
    if reply.hosted is not None:
        fields["server_tool_use"] = _server_tool_use(reply.hosted)
    if not final:
        fields["service_tier"] = "standard"
    return fields


def _blocks(reply: Reply) -> list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """Each content block: (start form, final form, its deltas)."""
    seed = reply.id_seed
    blocks: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = []
    if reply.reasoning:
        signature = "EqQBCkYIBxgCKkB" + seed[:40] + "=="
        deltas: list[dict[str, Any]] = [
            {"type": "thinking_delta", "thinking": piece}
            for piece in chunk_text(reply.reasoning, reply.chunk_chars)
        ]
        deltas += [
            {"type": "thinking_delta", "thinking": ""},
            {"type": "signature_delta", "signature": signature},
        ]
        final = {"type": "thinking", "thinking": reply.reasoning, "signature": signature}
        blocks.append(({"type": "thinking", "thinking": "", "signature": ""}, final, deltas))
    if reply.hosted is not None:
        blocks += _hosted_blocks(reply.hosted, seed, reply.chunk_chars)
    if reply.text:
        deltas = [
            {"type": "text_delta", "text": piece}
            for piece in chunk_text(reply.text, reply.chunk_chars)
        ]
        blocks.append(({"type": "text", "text": ""}, {"type": "text", "text": reply.text}, deltas))
    for call in reply.tool_calls:
        start = {
            "type": "tool_use",
            "id": "toolu_01" + call.id[:22],
            "name": call.name,
            "input": {},
        }
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in argument_chunks(call.arguments, reply.chunk_chars)
        ]
        blocks.append((start, {**start, "input": _loads(call.arguments)}, deltas))
    return blocks


_Block = tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]


def _server_tool_use(script: HostedToolScript) -> dict[str, int]:
    """``usage.server_tool_use``: the counts real streams carry (MCP and code execution
    are not counted there)."""
    return {
        "web_search_requests": int(script.name == "web_search"),
        "web_fetch_requests": int(script.name == "web_fetch"),
    }


def _tool_use(start: dict[str, Any], arguments: Any, chunk_chars: int | None) -> _Block:
    """A tool-use block that streams its input as ``input_json_delta`` s, ``""`` first."""
    deltas = [{"type": "input_json_delta", "partial_json": ""}]
    deltas += [
        {"type": "input_json_delta", "partial_json": piece}
        for piece in argument_chunks(_json(arguments), chunk_chars)
    ]
    return start, {**start, "input": arguments}, deltas


def _hosted_blocks(script: HostedToolScript, seed: str, chunk_chars: int | None) -> list[_Block]:
    """The scripted hosted tool as real Messages streams send it: its call block, then its
    result block complete in ``content_block_start``. File search has no Messages form."""
    tool_id = "srvtoolu_01" + seed[:22]
    result: dict[str, Any]
    if script.name == "web_search":
        call = {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {}}
        arguments: Any = {"query": script.query}
        result = {
            "type": "web_search_tool_result",
            "tool_use_id": tool_id,
            "content": [
                {
                    "type": "web_search_result",
                    "title": f"Emulated result for {script.query}",
                    "url": "https://example.com/emulated-search-result",
                    "encrypted_content": "EqgfCioIARgBIiQ" + seed[:24],
                    "page_age": None,
                }
            ],
        }
    elif script.name == "web_fetch":
        call = {"type": "server_tool_use", "id": tool_id, "name": "web_fetch", "input": {}}
        arguments = {"url": script.url}
        page = {"type": "text", "media_type": "text/plain", "data": f"Emulated page {script.url}"}
        result = {
            "type": "web_fetch_tool_result",
            "tool_use_id": tool_id,
            "content": {
                "type": "web_fetch_result",
                "url": script.url,
                "retrieved_at": "2026-01-01T00:00:00.000000+00:00",
                "content": {"type": "document", "source": page, "title": "Emulated page"},
            },
        }
    elif script.name == "code_execution":
        call = {
            "type": "server_tool_use",
            "id": tool_id,
            "name": "bash_code_execution",
            "input": {},
        }
        arguments = {"command": script.code}
        result = {
            "type": "bash_code_execution_tool_result",
            "tool_use_id": tool_id,
            "content": {
                "type": "bash_code_execution_result",
                "stdout": "2\n",
                "stderr": "",
                "return_code": 0,
                "content": [],
            },
        }
    elif script.name == "mcp":
        tool_id = "mcptoolu_01" + seed[:22]
        call = {
            "type": "mcp_tool_use",
            "id": tool_id,
            "name": script.tool,
            "input": {},
            "server_name": script.server,
        }
        arguments = dict(script.arguments)
        text = f"Emulated result of {script.tool} on {script.server}."
        result = {
            "type": "mcp_tool_result",
            "tool_use_id": tool_id,
            "is_error": False,
            "content": [{"type": "text", "text": text}],
        }
    else:
        return []
    return [_tool_use(call, arguments, chunk_chars), (result, result, [])]


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: str) -> Any:
    return orjson.loads(text)


class MessagesRenderer:
    """The Messages renderer."""

    backend = "messages"

    def _message(self, reply: Reply, view: RequestView) -> dict[str, Any]:
        return {
            "model": view.model,
            "id": "msg_01" + reply.id_seed[:22],
            "type": "message",
            "role": "assistant",
        }

    def stream(self, reply: Reply, view: RequestView) -> list[bytes]:
        start = {
            **self._message(reply, view),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(reply, final=False),
        }
        frames = [event_frame("message_start", {"type": "message_start", "message": start})]
        for index, (opening, _, deltas) in enumerate(_blocks(reply)):
            frames.append(
                event_frame(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opening},
                )
            )
            if index == 0:
                frames.append(self.keepalive())
            frames += [
                event_frame(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
                for delta in deltas
            ]
            frames.append(
                event_frame("content_block_stop", {"type": "content_block_stop", "index": index})
            )
        delta: dict[str, Any] = {"stop_reason": _stop(reply), "stop_sequence": None}
        if _stop(reply) == "refusal":
            delta["stop_details"] = _refusal_details(reply)
        if reply.hosted is not None and reply.hosted.name == "code_execution":
            # Code execution runs in a container; the stream names it here (real captures).
            delta["container"] = {
                "id": "container_011C" + reply.id_seed[:20],
                "expires_at": "2026-01-01T01:00:00.000000Z",
            }
        frames.append(
            event_frame(
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": _usage(reply, final=True)},
            )
        )
        frames.append(event_frame("message_stop", {"type": "message_stop"}))
        return frames

    def body(self, reply: Reply, view: RequestView) -> dict[str, Any]:
        usage = _usage(reply, final=False)
        usage["output_tokens"] = reply.usage.output_tokens
        return {
            **self._message(reply, view),
            "content": [final for _, final, _ in _blocks(reply)],
            "stop_reason": _stop(reply),
            "stop_sequence": None,
            **({"stop_details": _refusal_details(reply)} if _stop(reply) == "refusal" else {}),
            "usage": usage,
        }

    def stream_error(
        self, reply: Reply, view: RequestView, error_type: str | None, sequence: int
    ) -> list[bytes]:
        kind = error_type or "overloaded_error"
        error = {"type": kind, "message": _ERROR_MESSAGES.get(kind, "Emulated stream error")}
        return [event_frame("error", {"type": "error", "error": error})]

    def error_body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        kind = error.error_type or _ERROR_TYPES.get(
            error.status, "api_error" if error.status >= 500 else "invalid_request_error"
        )
        message = error.message or _ERROR_MESSAGES.get(kind, "Emulated error")
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": request_id,
        }

    def keepalive(self) -> bytes:
        return b'event: ping\ndata: {"type": "ping"}\n\n'

    def malformed(self) -> bytes:
        return (
            b"event: content_block_delta\n"
            b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_del\n\n'
        )

    def request_id_header(self) -> bytes:
        return b"request-id"
