"""Chat Completions rendering: data-only chunks and ``data: [DONE]``, the JSON body, errors.

Shapes follow real captures (``fixtures/real-streams/chat_completions``): a first chunk with
``role``, content (or ``reasoning_content``, or ``tool_calls`` fragments whose first
fragment carries ``id``/``type``/``name`` and ``arguments: ""``), a chunk with an empty
``delta`` and the ``finish_reason``, then (only with ``stream_options.include_usage``) a
usage chunk with ``choices: []`` while every other chunk carries ``"usage": null``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from ._reply import Reply, ReplyUsage, RequestView, chunk_text
from ._sse import argument_chunks, data_frame
from ._validate import ApiError

__all__ = ["ChatRenderer", "openai_error_body"]

_DONE = b"data: [DONE]\n\n"
_FINGERPRINT = "fp_emulator"

# status -> (type, code) of OpenAI error bodies.
_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_denied", None),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("conflict", None),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}

_OPENAI_MESSAGES: dict[int, str] = {
    401: "Incorrect API key provided. You can find your API key at "
    "https://platform.openai.com/account/api-keys.",
    429: "Rate limit reached for requests (emulated). Please try again later.",
    500: "The server had an error while processing your request. Sorry about that!",
    503: "The engine is currently overloaded, please try again later.",
}


def openai_error_body(error: ApiError) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}`` with OpenAI's type for the status."""
    default_type, default_code = _OPENAI_ERRORS.get(
        error.status, ("server_error" if error.status >= 500 else "invalid_request_error", None)
    )
    return {
        "error": {
            "message": error.message or _OPENAI_MESSAGES.get(error.status, "Emulated error."),
            "type": error.error_type or default_type,
            "param": error.param,
            "code": error.code if error.code is not None else default_code,
        }
    }


def chat_usage(usage: ReplyUsage) -> dict[str, Any]:
    """Chat Completions usage: ``prompt_tokens`` includes the cached part."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _executed_search(reply: Reply) -> list[dict[str, Any]]:
    """A hosted web search the way Groq's compound models stream it: ``executed_tools``
    first with the arguments and no results, then again with the output and the results
    (Chat Completions has no other hosted-tool shape; the other tools are not sent)."""
    assert reply.hosted is not None
    query = reply.hosted.query
    started = {
        "index": 0,
        "type": "search",
        "arguments": orjson.dumps({"query": query}).decode(),
        "search_results": {"results": []},
    }
    result = {
        "title": f"Emulated result for {query}",
        "url": "https://example.com/emulated-search-result",
        "content": f"Emulated page content about {query}.",
        "score": 0.97,
    }
    output = f"Title: {result['title']}\nURL: {result['url']}\nContent: {result['content']}"
    return [started, {**started, "output": output, "search_results": {"results": [result]}}]


class ChatRenderer:
    """The Chat Completions renderer."""

    backend = "chat_completions"

    def _id(self, reply: Reply) -> str:
        return "chatcmpl-" + reply.id_seed[:29]

    def stream(self, reply: Reply, view: RequestView) -> list[bytes]:
        head: dict[str, Any] = {
            "id": self._id(reply),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": view.model,
            "service_tier": "default",
            "system_fingerprint": _FINGERPRINT,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            payload = {**head, "choices": [choice]}
            if view.include_usage:
                payload["usage"] = None
            return data_frame(payload)

        if reply.refusal:
            # A refusal's first chunk: content null, refusal "" (real captures).
            frames = [chunk({"role": "assistant", "content": None, "refusal": ""})]
            frames += [
                chunk({"refusal": piece}) for piece in chunk_text(reply.refusal, reply.chunk_chars)
            ]
            return self._end(frames, chunk, reply, view, head)
        content: str | None = "" if reply.text or reply.reasoning or not reply.tool_calls else None
        frames = [chunk({"role": "assistant", "content": content, "refusal": None})]
        if reply.hosted is not None and reply.hosted.name == "web_search":
            frames += [chunk({"executed_tools": [tool]}) for tool in _executed_search(reply)]
        frames += [
            chunk({"reasoning_content": piece})
            for piece in chunk_text(reply.reasoning, reply.chunk_chars)
        ]
        frames += [chunk({"content": piece}) for piece in chunk_text(reply.text, reply.chunk_chars)]
        for index, call in enumerate(reply.tool_calls):
            first = {
                "index": index,
                "id": "call_" + call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            frames.append(chunk({"tool_calls": [first]}))
            frames += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in argument_chunks(call.arguments, reply.chunk_chars)
            ]
        return self._end(frames, chunk, reply, view, head)

    @staticmethod
    def _end(
        frames: list[bytes],
        chunk: Callable[..., bytes],
        reply: Reply,
        view: RequestView,
        head: dict[str, Any],
    ) -> list[bytes]:
        """The finish chunk, the usage chunk when asked for, and ``[DONE]``."""
        frames.append(chunk({}, reply.stop))
        if view.include_usage:
            frames.append(data_frame({**head, "choices": [], "usage": chat_usage(reply.usage)}))
        frames.append(_DONE)
        return frames

    def body(self, reply: Reply, view: RequestView) -> dict[str, Any]:
        content: str | None = reply.text if reply.text or not reply.tool_calls else None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if reply.refusal else content,
            "refusal": reply.refusal or None,
            "annotations": [],
        }
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.hosted is not None and reply.hosted.name == "web_search":
            message["executed_tools"] = _executed_search(reply)[-1:]
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": "call_" + call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in reply.tool_calls
            ]
        return {
            "id": self._id(reply),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": view.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.stop}
            ],
            "usage": chat_usage(reply.usage),
            "service_tier": "default",
            "system_fingerprint": _FINGERPRINT,
        }

    def stream_error(
        self, reply: Reply, view: RequestView, error_type: str | None, sequence: int
    ) -> list[bytes]:
        error = {
            "message": "The server had an error processing your request. Sorry about that! "
            "(emulated stream error)",
            "type": error_type or "server_error",
            "param": None,
            "code": None,
        }
        return [data_frame({"error": error})]

    def error_body(self, error: ApiError, request_id: str) -> dict[str, Any]:
        return openai_error_body(error)

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"

    def malformed(self) -> bytes:
        return b'data: {"id":"chatcmpl-emulator","choices":[{"index":0,"delta":{"content":"tr\n\n'

    def request_id_header(self) -> bytes:
        return b"x-request-id"
