"""The responses backend: ``build_request``, ``parse_request`` and the stream transform."""

from .._backend import WireBackend
from ._request import build_request as build_request
from ._request import parse_request as parse_request
from ._stream import ResponsesTransform as ResponsesTransform

BACKEND = WireBackend(
    name="responses",
    build=build_request,
    parse=parse_request,
    transform=ResponsesTransform,
)

__all__ = ["BACKEND", "ResponsesTransform", "build_request", "parse_request"]
