"""The chat completions backend: ``build_request``, ``parse_request`` and the stream transform."""

from .._backend import WireBackend
from ._request import build_request as build_request
from ._request import parse_request as parse_request
from ._stream import ChatCompletionsTransform as ChatCompletionsTransform

BACKEND = WireBackend(
    name="chat_completions",
    build=build_request,
    parse=parse_request,
    transform=ChatCompletionsTransform,
)

__all__ = ["BACKEND", "ChatCompletionsTransform", "build_request", "parse_request"]
