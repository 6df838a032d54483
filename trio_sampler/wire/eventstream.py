"""AWS event-stream decoding (``application/vnd.amazon.eventstream``), sans-I/O.

Amazon Bedrock streams a model's answer (``InvokeModelWithResponseStream``) in AWS's
binary event-stream framing, not SSE. Each message is::

    total length (4 bytes, big-endian) | headers length (4) | prelude CRC-32 (4)
    headers | payload | message CRC-32 (4)

The prelude CRC covers the two lengths, the message CRC everything before it. A header is
its name's length (1 byte), the name, a value type (1 byte) and the value (see
:data:`_FIXED_WIDTH`; strings and byte arrays carry a 2-byte length). Reference:
https://docs.aws.amazon.com/AmazonS3/latest/API/RESTSelectObjectAppendix.html (the
format) and https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html
(the events).

:class:`EventStreamDecoder` has the interface of :class:`~trio_sampler.wire.SSEDecoder`
that a stream's reader uses (``feed_payloads``, ``close_payloads``, ``buffered_bytes``),
so the same transform reads either framing. A Bedrock ``chunk`` event's payload is
``{"bytes": "<base64>"}``; the decoded bytes are one event of the model's own protocol
(an Anthropic Messages stream event, a JSON object with its ``type``), handed on as
such. An exception message (``:message-type: exception``, such as
``throttlingException``) becomes an ``error`` event of that protocol, typed by the
exception's name (``trio_sampler.wire.errors`` classifies it). A frame that breaks the
format (a bad CRC, a length out of bounds, a header of an unknown type) raises
:class:`EventStreamDecodeError`, which ends the stream in a typed ``Failed``.
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Final, Protocol

import orjson

from .sse import DEFAULT_MAX_EVENT_BYTES, SSEDecodeError, SSEDecoder, SSEPayload

__all__ = [
    "EVENT_STREAM_MEDIA_TYPE",
    "EventStreamDecodeError",
    "EventStreamDecoder",
    "StreamDecoder",
    "encode_chunk",
    "encode_exception",
    "encode_message",
    "stream_decoder",
]

#: The media type of an AWS event stream.
EVENT_STREAM_MEDIA_TYPE: Final = "application/vnd.amazon.eventstream"

_PRELUDE = 12  # the two lengths and the prelude CRC
_MIN_MESSAGE = _PRELUDE + 4  # no headers, no payload, the message CRC
_MAX_HEADERS = 128 * 1024  # the format's own bound on the headers section

#: Value type → the width of its value (``None``: a 2-byte length, then that many bytes).
_FIXED_WIDTH: Final[dict[int, int | None]] = {
    0: 0,  # true
    1: 0,  # false
    2: 1,  # byte
    3: 2,  # short
    4: 4,  # integer
    5: 8,  # long
    6: None,  # byte array
    7: None,  # string
    8: 8,  # timestamp (milliseconds)
    9: 16,  # UUID
}
_STRING = 7


class StreamDecoder(Protocol):
    """What a stream's reader needs of a body decoder, SSE or event stream."""

    @property
    def buffered_bytes(self) -> int: ...

    def feed_payloads(self, chunk: bytes) -> list[SSEPayload]: ...

    def close_payloads(self) -> list[SSEPayload]: ...


def stream_decoder(
    media_type: str = "text/event-stream", max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
) -> StreamDecoder:
    """The decoder of a streamed body of ``media_type`` (a provider profile's
    ``stream_media_type``): :class:`EventStreamDecoder` for an AWS event stream,
    :class:`~trio_sampler.wire.SSEDecoder` otherwise."""
    if media_type == EVENT_STREAM_MEDIA_TYPE:
        return EventStreamDecoder(max_event_bytes)
    return SSEDecoder(max_event_bytes)


class EventStreamDecodeError(SSEDecodeError):
    """The body breaks the AWS event-stream format (a bad CRC, a length out of bounds,
    a header of an unknown type, a chunk that is not base64 JSON)."""


def _headers(block: bytes) -> dict[str, str]:
    """The string headers of a message (other value types are read past)."""
    headers: dict[str, str] = {}
    at = 0
    while at < len(block):
        name_length = block[at]
        name = block[at + 1 : at + 1 + name_length].decode("utf-8", "replace")
        at += 1 + name_length
        if at >= len(block):
            raise EventStreamDecodeError(f"event-stream header {name!r} has no value type")
        kind = block[at]
        at += 1
        if kind not in _FIXED_WIDTH:
            raise EventStreamDecodeError(f"event-stream header {name!r} has unknown type {kind}")
        width = _FIXED_WIDTH[kind]
        if width is None:
            if at + 2 > len(block):
                raise EventStreamDecodeError(f"event-stream header {name!r} is cut short")
            (width,) = struct.unpack_from(">H", block, at)
            at += 2
        if at + width > len(block):
            raise EventStreamDecodeError(f"event-stream header {name!r} is cut short")
        if kind == _STRING:
            headers[name] = block[at : at + width].decode("utf-8", "replace")
        at += width
    return headers


def _error_event(exception_type: str, payload: bytes) -> bytes:
    """What an exception message becomes: an ``error`` event whose type is the
    exception's name (``throttlingException``, ``modelStreamErrorException``, ...)."""
    message = ""
    try:
        body = orjson.loads(payload) if payload else {}
    except orjson.JSONDecodeError:
        body = {}
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]
    elif isinstance(body, dict) and isinstance(body.get("Message"), str):
        message = body["Message"]
    error = {"type": exception_type, "message": message or f"Bedrock {exception_type}"}
    return orjson.dumps({"type": "error", "error": error})


def _chunk(payload: bytes) -> bytes:
    """The model's event inside a ``chunk`` payload (``{"bytes": "<base64>"}``)."""
    try:
        body = orjson.loads(payload)
        inner = body["bytes"] if isinstance(body, dict) else None
        if not isinstance(inner, str):
            raise EventStreamDecodeError('a Bedrock chunk\'s payload has no "bytes" string')
        return base64.b64decode(inner, validate=True)
    except ValueError as exc:  # not JSON, not base64 (binascii.Error), not ASCII
        raise EventStreamDecodeError(f"a Bedrock chunk's payload is malformed: {exc}") from None


class EventStreamDecoder:
    """Incremental AWS event-stream decoder with the reader interface of
    :class:`~trio_sampler.wire.SSEDecoder` (see the module).

    Feeding a body whole, byte by byte or split anywhere yields the same payloads. A
    message longer than ``max_event_bytes`` is refused before it is buffered.
    """

    __slots__ = ("_buffer", "_failed", "_max")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes <= 0:
            raise ValueError("max_event_bytes must be a positive number of bytes")
        self._max = max_event_bytes
        self._buffer = bytearray()
        self._failed = False

    @property
    def buffered_bytes(self) -> int:
        """The bytes held for the message in progress (what a memory account counts)."""
        return self._buffer.__sizeof__()

    def feed_payloads(self, chunk: bytes) -> list[SSEPayload]:
        """The model events the messages completed by ``chunk`` carry, as raw JSON
        ``bytes``. Raises :class:`EventStreamDecodeError` on a malformed frame (and on
        every call after that)."""
        if self._failed:
            raise EventStreamDecodeError("the event stream already failed to decode")
        buffer = self._buffer
        buffer += chunk
        out: list[SSEPayload] = []
        try:
            while len(buffer) >= _PRELUDE:
                total = self._check_prelude(buffer)
                if len(buffer) < total:
                    break
                message = bytes(buffer[:total])
                del buffer[:total]
                payload = self._message(message)
                if payload is not None:
                    out.append(payload)
        except EventStreamDecodeError:
            self._failed = True
            buffer.clear()
            raise
        return out

    def close_payloads(self) -> list[SSEPayload]:
        """The end of the body: a message cut short is dropped (the stream's transform
        then reports the body as ended early)."""
        self._buffer.clear()
        return []

    def _check_prelude(self, buffer: bytearray) -> int:
        total, headers_length, crc = struct.unpack_from(">III", buffer)
        if zlib.crc32(memoryview(buffer)[:8]) != crc:
            raise EventStreamDecodeError("event-stream prelude CRC mismatch (a corrupt frame)")
        if total < _MIN_MESSAGE or headers_length > min(_MAX_HEADERS, total - _MIN_MESSAGE):
            raise EventStreamDecodeError(
                f"event-stream lengths out of bounds (message {total}, headers {headers_length})"
            )
        if total > self._max:
            raise EventStreamDecodeError(
                f"an event-stream message of {total} bytes exceeds the {self._max}-byte limit "
                "(raise max_sse_event_bytes in the config if the server legitimately sends "
                "messages this large)"
            )
        return int(total)

    def _message(self, message: bytes) -> bytes | None:
        (crc,) = struct.unpack_from(">I", message, len(message) - 4)
        if zlib.crc32(memoryview(message)[:-4]) != crc:
            raise EventStreamDecodeError("event-stream message CRC mismatch (a corrupt frame)")
        (headers_length,) = struct.unpack_from(">I", message, 4)
        headers = _headers(message[_PRELUDE : _PRELUDE + headers_length])
        payload = message[_PRELUDE + headers_length : -4]
        kind = headers.get(":message-type", "event")
        if kind == "exception":
            return _error_event(headers.get(":exception-type", "exception"), payload)
        if kind == "error":  # the format's own error message: code and text in headers
            error = {
                "type": headers.get(":error-code", "error"),
                "message": headers.get(":error-message", ""),
            }
            return orjson.dumps({"type": "error", "error": error})
        if headers.get(":event-type") == "chunk":
            return _chunk(payload)
        return None  # another event type: nothing of the model's (forward compatibility)


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string ``headers`` (how the emulator and tests
    write a stream)."""
    block = bytearray()
    for name, value in headers.items():
        name_bytes, value_bytes = name.encode(), value.encode()
        block += bytes([len(name_bytes)]) + name_bytes + bytes([_STRING])
        block += struct.pack(">H", len(value_bytes)) + value_bytes
    total = _PRELUDE + len(block) + len(payload) + 4
    prelude = struct.pack(">II", total, len(block))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + bytes(block) + payload
    return head + struct.pack(">I", zlib.crc32(head))


def encode_chunk(event: bytes) -> bytes:
    """A Bedrock ``chunk`` message carrying one model event (its JSON bytes)."""
    payload = orjson.dumps({"bytes": base64.b64encode(event).decode("ascii")})
    headers = {":event-type": "chunk", ":content-type": "application/json"}
    return encode_message({**headers, ":message-type": "event"}, payload)


def encode_exception(exception_type: str, message: str) -> bytes:
    """A Bedrock exception message (``throttlingException``, ...)."""
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, orjson.dumps({"message": message}))
