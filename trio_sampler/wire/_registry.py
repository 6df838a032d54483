"""Which module implements which backend: one line per backend.

Adding a fourth backend means one new subpackage with ``_stream.py`` (a
:class:`StreamTransform` subclass) and ``_request.py`` (``build_request`` and
``parse_request``), and one line here; nothing above the wire layer changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import attrs

from ..types import ApiBackend, ConversationRequest
from ._request import BuildOptions, WireRequest, validate_headers
from ._transform import StreamTransform

__all__ = ["build_request", "new_transform", "parse_request", "transform_class"]

_BACKENDS: dict[ApiBackend, tuple[str, str]] = {
    ApiBackend.CHAT_COMPLETIONS: ("chat_completions", "ChatCompletionsTransform"),
    ApiBackend.RESPONSES: ("responses", "ResponsesTransform"),
    ApiBackend.MESSAGES: ("messages", "MessagesTransform"),
}


def _module(backend: ApiBackend | str, part: str) -> Any:
    package, _ = _BACKENDS[ApiBackend(backend)]
    return importlib.import_module(f"{__package__}.{package}.{part}")


def transform_class(backend: ApiBackend | str) -> type[StreamTransform]:
    """The stream transform class for ``backend`` (an :class:`ApiBackend` or its value)."""
    _, class_name = _BACKENDS[ApiBackend(backend)]
    cls: type[StreamTransform] = getattr(_module(backend, "_stream"), class_name)
    return cls


def new_transform(
    backend: ApiBackend | str, request_id: str = "stream", *, provider: str | None = None
) -> StreamTransform:
    """A fresh transform for one attempt."""
    return transform_class(backend)(request_id, provider=provider)


def build_request(
    backend: ApiBackend | str, request: ConversationRequest, options: BuildOptions
) -> WireRequest:
    """Render ``request`` for ``backend`` (see each backend's ``build_request``).

    ``request.extra_headers`` are appended to the wire headers here, for every backend,
    checked like the config's extra headers (:func:`validate_headers`, ``ValueError``).
    """
    result: WireRequest = _module(backend, "_request").build_request(request, options)
    if request.extra_headers:
        extra = tuple(request.extra_headers.items())
        validate_headers(extra, what="request header")
        result = attrs.evolve(result, headers=(*result.headers, *extra))
    return result


def parse_request(
    backend: ApiBackend | str, body: bytes | Mapping[str, Any]
) -> ConversationRequest:
    """Parse a ``backend`` request body back into a :class:`ConversationRequest`."""
    result: ConversationRequest = _module(backend, "_request").parse_request(body)
    return result
