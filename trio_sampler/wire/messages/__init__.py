"""The messages backend: ``build_request``, ``parse_request`` and the stream transform."""

from .._backend import WireBackend
from ._request import build_request as build_request
from ._request import parse_request as parse_request
from ._stream import MessagesTransform as MessagesTransform

#: The ``anthropic-version`` every Messages request carries (``SamplerConfig.anthropic_version``
#: overrides it).
ANTHROPIC_VERSION = "2023-06-01"

BACKEND = WireBackend(
    name="messages",
    build=build_request,
    parse=parse_request,
    transform=MessagesTransform,
    default_headers=(("anthropic-version", ANTHROPIC_VERSION),),
)

__all__ = ["ANTHROPIC_VERSION", "BACKEND", "MessagesTransform", "build_request", "parse_request"]
