"""The messages backend: ``build_request``, ``parse_request`` and the stream transform."""

from ._request import build_request as build_request
from ._request import parse_request as parse_request
from ._stream import MessagesTransform as MessagesTransform

__all__ = ["MessagesTransform", "build_request", "parse_request"]
