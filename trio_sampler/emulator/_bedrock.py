"""Amazon Bedrock's Anthropic Messages endpoints, served by the Messages renderer.

``POST /model/{modelId}/invoke-with-response-stream`` (and ``/invoke``, not streamed)
take a Messages body without ``model`` and ``stream`` and with ``anthropic_version:
"bedrock-2023-05-31"``
(https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html).
The app checks that shape, turns the body into the Messages body it stands for and
samples it as ``/v1/messages`` would; a streamed answer goes out in AWS event-stream
framing (:class:`EventStreamSend`): each SSE event the Messages renderer writes becomes a
``chunk`` message carrying it base64-encoded, and an ``error`` event becomes an exception
message named as Bedrock names it (``throttlingException``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import orjson

from ..wire.eventstream import EVENT_STREAM_MEDIA_TYPE, encode_chunk, encode_exception
from ..wire.sse import SSEDecoder, payload_event
from ._validate import ApiError

__all__ = ["BEDROCK_PATH", "BEDROCK_VERSION", "EventStreamSend", "messages_body"]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

#: The two routes (a ``/v1`` prefix is allowed, so one emulator base URL serves all);
#: the model id may hold slashes once decoded (an inference profile's ARN).
BEDROCK_PATH: Final = re.compile(
    r"^(?:/v1)?/model/(?P<model>.+)/(?P<method>invoke-with-response-stream|invoke)$"
)
#: The ``anthropic_version`` Bedrock takes in the body.
BEDROCK_VERSION: Final = "bedrock-2023-05-31"

#: An Anthropic error type → the exception Bedrock streams for it.
_EXCEPTIONS: Final = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "api_error": "internalServerException",
    "invalid_request_error": "validationException",
}


def messages_body(body: bytes, model: str, streaming: bool) -> bytes:
    """The Messages body a Bedrock body stands for (``ApiError`` for a body Bedrock
    refuses: not a JSON object, a ``model`` or ``stream`` key, another version)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError("Malformed input request: the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError("Malformed input request: the body must be a JSON object")
    for key in ("model", "stream"):
        if key in data:
            raise ApiError(
                f"Malformed input request: extraneous key [{key}] is not permitted",
                param=key,
            )
    if data.get("anthropic_version") != BEDROCK_VERSION:
        raise ApiError(
            f'Malformed input request: anthropic_version must be "{BEDROCK_VERSION}"',
            param="anthropic_version",
        )
    del data["anthropic_version"]
    data.pop("anthropic_beta", None)  # Bedrock's spelling of the anthropic-beta header
    return orjson.dumps({"model": model, **data, "stream": streaming})


class EventStreamSend:
    """An ASGI ``send`` that re-frames a streamed SSE body as an AWS event stream."""

    __slots__ = ("_decoder", "_send", "_streaming")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._decoder = SSEDecoder()
        #: The answer is a 200 stream (an error answer's JSON body goes out as it is).
        self._streaming = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 200:
            self._streaming = True
            headers = [(k, v) for k, v in message["headers"] if k.lower() != b"content-type"]
            headers.append((b"content-type", EVENT_STREAM_MEDIA_TYPE.encode()))
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and self._streaming:
            frames = [self._frame(item) for item in self._decoder.feed_payloads(message["body"])]
            message = {**message, "body": b"".join(frames)}
        await self._send(message)

    @staticmethod
    def _frame(item: Any) -> bytes:
        event = payload_event(item)
        if event.event == "error":
            try:
                error = orjson.loads(event.data)["error"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                error = {}
            kind = _EXCEPTIONS.get(str(error.get("type")), "modelStreamErrorException")
            return encode_exception(kind, str(error.get("message", "")))
        return encode_chunk(event.data.encode())
