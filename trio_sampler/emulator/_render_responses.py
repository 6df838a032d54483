"""Responses rendering: ``event:`` + ``data:`` with ``type`` and ``sequence_number``.

Event order follows real captures (``fixtures/real-streams/responses``):
``response.created``, ``response.in_progress``, then per output item
``output_item.added`` … item events … ``output_item.done``, and one terminal
``response.completed`` / ``response.incomplete`` carrying the full response object with
``usage``. No ``[DONE]`` (api.openai.com sends none). In-stream errors use the nested
shape the real API sent (``error:{type,code,message,param}``) followed by
``response.failed``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ._render_chat import openai_error_body
from ._reply import Reply, RequestView, chunk_text
from ._script import HostedToolScript
from ._sse import argument_chunks, event_frame
from ._validate import ApiError

__all__ = ["ResponsesRenderer", "response_id"]


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


_RESPONSE_DEFAULTS: dict[str, Any] = {
    "background": False,
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": None,
    "user": None,
    "metadata": {},
}


def _usage(reply: Reply) -> dict[str, Any]:
    usage = reply.usage
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def response_id(reply: Reply) -> str:
    """The id of the response ``reply`` is rendered as."""
    return "resp_" + reply.id_seed[:48]


class _Builder:
    """Collects the payloads of one stream, numbering them as they are added."""

    def __init__(self, reply: Reply, view: RequestView) -> None:
        self.reply = reply
        self.view = view
        self.payloads: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        seed = reply.id_seed
        self.response_id = response_id(reply)
        kinds = ("msg", "rs", "fc", "ws", "fs", "ci", "mcpl", "mcp", "cntr")
        self.ids = {kind: f"{kind}_{seed[8:56]}" for kind in kinds}
        self.created_at = int(time.time())

    def add(self, kind: str, **fields: Any) -> None:
        self.payloads.append({"type": kind, **fields})

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": self.created_at if status != "in_progress" else None,
            **_RESPONSE_DEFAULTS,
            **self.view.echo,
            "reasoning": self._reasoning(),
            "model": self.view.model,
            "output": list(self.output),
            **fields,
        }

    def _reasoning(self) -> dict[str, Any]:
        echoed = self.view.echo.get("reasoning")
        return {**_RESPONSE_DEFAULTS["reasoning"], **(echoed if isinstance(echoed, dict) else {})}

    def item(self, item: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
        index = len(self.output)
        opening = {k: v for k, v in item.items() if k != "_done"}
        self.add("response.output_item.added", output_index=index, item=opening)
        for kind, fields in events:
            self.add(kind, output_index=index, **fields)
        done = item.get("_done", opening)
        self.add("response.output_item.done", output_index=index, item=done)
        self.output.append(done)

    def reasoning(self) -> None:
        reply, item_id = self.reply, self.ids["rs"]
        opening: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
        if self.view.include_encrypted:
            opening["encrypted_content"] = "gAAAAAB-emulated-" + reply.id_seed[:32]
        part = {"type": "summary_text", "text": reply.reasoning}
        common = {"item_id": item_id, "summary_index": 0}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.reasoning_summary_part.added", {**common, "part": {**part, "text": ""}})
        ]
        events += [
            ("response.reasoning_summary_text.delta", {**common, "delta": piece})
            for piece in chunk_text(reply.reasoning, reply.chunk_chars)
        ]
        events.append(("response.reasoning_summary_text.done", {**common, "text": reply.reasoning}))
        events.append(("response.reasoning_summary_part.done", {**common, "part": part}))
        done = {**opening, "summary": [part]}
        if self.view.include_encrypted:
            done["encrypted_content"] = "gAAAAAB-emulated-" + reply.id_seed[32:64]
        self.item({**opening, "_done": done}, events)

    def hosted(self, script: HostedToolScript) -> None:
        """The scripted hosted tool's output items, in the shapes of real captures;
        ``web_fetch`` has none on Responses and adds nothing."""
        if script.name == "web_search":
            self.web_search(script.query)
        elif script.name == "file_search":
            self.file_search(script.query)
        elif script.name == "code_execution":
            self.code_interpreter(script.code)
        elif script.name == "mcp":
            self.mcp(script.server, script.tool, _json(script.arguments))

    def file_search(self, query: str) -> None:
        item_id = self.ids["fs"]
        opening: dict[str, Any] = {
            "id": item_id,
            "type": "file_search_call",
            "status": "in_progress",
            "queries": [],
            "results": None,
        }
        events = [
            (f"response.file_search_call.{step}", {"item_id": item_id})
            for step in ("in_progress", "searching", "completed")
        ]
        done = {**opening, "status": "completed", "queries": [query]}
        self.item({**opening, "_done": done}, events)

    def code_interpreter(self, code: str) -> None:
        item_id = self.ids["ci"]
        opening: dict[str, Any] = {
            "id": item_id,
            "type": "code_interpreter_call",
            "status": "in_progress",
            "code": "",
            "container_id": self.ids["cntr"],
            "outputs": None,
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.code_interpreter_call.in_progress", {"item_id": item_id})
        ]
        events += [
            ("response.code_interpreter_call_code.delta", {"item_id": item_id, "delta": piece})
            for piece in argument_chunks(code, self.reply.chunk_chars)
        ]
        events += [
            ("response.code_interpreter_call_code.done", {"item_id": item_id, "code": code}),
            ("response.code_interpreter_call.interpreting", {"item_id": item_id}),
            ("response.code_interpreter_call.completed", {"item_id": item_id}),
        ]
        done = {**opening, "status": "completed", "code": code}
        self.item({**opening, "_done": done}, events)

    def mcp(self, server: str, tool: str, arguments: str) -> None:
        listing = {"id": self.ids["mcpl"], "type": "mcp_list_tools", "server_label": server}
        offered = {
            "annotations": {"read_only": False},
            "description": "An emulated MCP tool.",
            "input_schema": {"type": "object", "properties": {}},
            "name": tool,
        }
        steps = [
            (f"response.mcp_list_tools.{step}", {"item_id": self.ids["mcpl"]})
            for step in ("in_progress", "completed")
        ]
        self.item({**listing, "tools": [], "_done": {**listing, "tools": [offered]}}, steps)
        item_id = self.ids["mcp"]
        opening: dict[str, Any] = {
            "id": item_id,
            "type": "mcp_call",
            "status": "in_progress",
            "approval_request_id": None,
            "arguments": "",
            "error": None,
            "name": tool,
            "output": None,
            "server_label": server,
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.mcp_call.in_progress", {"item_id": item_id})
        ]
        events += [
            ("response.mcp_call_arguments.delta", {"item_id": item_id, "delta": piece})
            for piece in argument_chunks(arguments, self.reply.chunk_chars)
        ]
        events += [
            ("response.mcp_call_arguments.done", {"item_id": item_id, "arguments": arguments}),
            ("response.mcp_call.completed", {"item_id": item_id}),
        ]
        output = f"Emulated result of {tool} on {server}."
        done = {**opening, "status": "completed", "arguments": arguments, "output": output}
        self.item({**opening, "_done": done}, events)

    def web_search(self, query: str) -> None:
        item_id = self.ids["ws"]
        opening = {"id": item_id, "type": "web_search_call", "status": "in_progress"}
        events = [
            (f"response.web_search_call.{step}", {"item_id": item_id})
            for step in ("in_progress", "searching", "completed")
        ]
        action = {"type": "search", "query": query}
        done = {**opening, "status": "completed", "action": action}
        self.item({**opening, "_done": done}, events)

    def message(self, status: str) -> None:
        reply, item_id = self.reply, self.ids["msg"]
        opening = {
            "id": item_id,
            "type": "message",
            "status": "in_progress",
            "content": [],
            "role": "assistant",
        }
        common = {"item_id": item_id, "content_index": 0}
        events: list[tuple[str, dict[str, Any]]]
        part: dict[str, Any]
        if reply.refusal:
            part = {"type": "refusal", "refusal": reply.refusal}
            events = [("response.content_part.added", {**common, "part": {**part, "refusal": ""}})]
            events += [
                ("response.refusal.delta", {**common, "delta": piece})
                for piece in chunk_text(reply.refusal, reply.chunk_chars)
            ]
            events.append(("response.refusal.done", {**common, "refusal": reply.refusal}))
        else:
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": reply.text}
            events = [("response.content_part.added", {**common, "part": {**part, "text": ""}})]
            events += [
                ("response.output_text.delta", {**common, "delta": piece, "logprobs": []})
                for piece in chunk_text(reply.text, reply.chunk_chars)
            ]
            events.append(
                ("response.output_text.done", {**common, "text": reply.text, "logprobs": []})
            )
        events.append(("response.content_part.done", {**common, "part": part}))
        done = {**opening, "status": status, "content": [part]}
        self.item({**opening, "_done": done}, events)

    def function_calls(self) -> None:
        for number, call in enumerate(self.reply.tool_calls):
            item_id = f"{self.ids['fc']}{number}" if number else self.ids["fc"]
            opening = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": "call_" + call.id,
                "name": call.name,
            }
            events: list[tuple[str, dict[str, Any]]] = [
                ("response.function_call_arguments.delta", {"item_id": item_id, "delta": piece})
                for piece in argument_chunks(call.arguments, self.reply.chunk_chars)
            ]
            events.append(
                (
                    "response.function_call_arguments.done",
                    {"item_id": item_id, "arguments": call.arguments},
                )
            )
            done = {**opening, "status": "completed", "arguments": call.arguments}
            self.item({**opening, "_done": done}, events)

    def build(self) -> dict[str, Any]:
        """Add every event; return the final response object."""
        reply = self.reply
        self.add("response.created", response=self.response("in_progress"))
        self.add("response.in_progress", response=self.response("in_progress"))
        if reply.reasoning:
            self.reasoning()
        if reply.hosted is not None:
            self.hosted(reply.hosted)
        incomplete = reply.stop in ("length", "content_filter")
        if reply.text or reply.refusal or (incomplete and not (self.output or reply.tool_calls)):
            self.message("incomplete" if incomplete else "completed")
        self.function_calls()
        if incomplete:
            reason = "max_output_tokens" if reply.stop == "length" else "content_filter"
            final = self.response(
                "incomplete", incomplete_details={"reason": reason}, usage=_usage(reply)
            )
            self.add("response.incomplete", response=final)
        else:
            final = self.response("completed", usage=_usage(reply))
            self.add("response.completed", response=final)
        return final


class ResponsesRenderer:
    """The Responses renderer."""

    backend = "responses"

    def stream(self, reply: Reply, view: RequestView) -> list[bytes]:
        builder = _Builder(reply, view)
        builder.build()
        return [
            event_frame(payload["type"], {**payload, "sequence_number": number})
            for number, payload in enumerate(builder.payloads)
        ]

    def body(self, reply: Reply, view: RequestView) -> dict[str, Any]:
        return _Builder(reply, view).build()

    def stream_error(
        self, reply: Reply, view: RequestView, error_type: str | None, sequence: int
    ) -> list[bytes]:
        code = error_type or "server_error"
        message = "The server had an error processing your request. (emulated stream error)"
        error = {"type": code, "code": code, "message": message, "param": None}
        builder = _Builder(reply, view)
        failed = builder.response("failed", error={"code": code, "message": message})
        return [
            event_frame("error", {"type": "error", "sequence_number": sequence, "error": error}),
            event_frame(
                "response.failed",
                {"type": "response.failed", "sequence_number": sequence + 1, "response": failed},
            ),
        ]

    def error_body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        return openai_error_body(error)

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"

    def malformed(self) -> bytes:
        return (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","de\n\n'
        )

    def request_id_header(self) -> bytes:
        return b"x-request-id"
