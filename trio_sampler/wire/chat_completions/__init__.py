"""The chat completions backend: ``build_request``, ``parse_request`` and the stream transform."""

from ._request import build_request as build_request
from ._request import parse_request as parse_request
from ._stream import ChatCompletionsTransform as ChatCompletionsTransform

__all__ = ["ChatCompletionsTransform", "build_request", "parse_request"]
