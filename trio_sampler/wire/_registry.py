"""The built-in backends in the table, and the functions that go through it.

Each subpackage defines its :class:`~trio_sampler.wire.WireBackend` (``BACKEND``); this
module registers the three and routes every request, parse and transform through
:func:`~trio_sampler.wire.get_backend`. Adding a fourth backend is one module with its
``WireBackend`` and one :func:`~trio_sampler.wire.register_backend` call; nothing above
the wire layer changes (see "Adding a backend" in the docs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..types import ApiBackend, ConversationRequest
from . import chat_completions, messages, responses
from ._backend import get_backend, register_backend
from ._request import BuildOptions, WireRequest, validate_headers
from ._transform import StreamTransform

__all__ = ["build_request", "new_transform", "parse_request"]

for _backend in (chat_completions.BACKEND, responses.BACKEND, messages.BACKEND):
    register_backend(_backend)


def new_transform(
    backend: ApiBackend | str, request_id: str = "stream", *, provider: str | None = None
) -> StreamTransform:
    """A fresh transform for one attempt."""
    return get_backend(backend).new_transform(request_id, provider=provider)


def build_request(
    backend: ApiBackend | str, request: ConversationRequest, options: BuildOptions
) -> WireRequest:
    """Render ``request`` for ``backend`` (see each backend's ``build_request``).

    ``request.extra_headers`` are appended to the wire headers here, for every backend,
    checked like the config's extra headers (:func:`validate_headers`, ``ValueError``).
    """
    result = get_backend(backend).build_request(request, options)
    if request.extra_headers:
        extra = tuple(request.extra_headers.items())
        validate_headers(extra, what="request header")
        result = result.with_headers(extra)
    return result


def parse_request(
    backend: ApiBackend | str, body: bytes | Mapping[str, Any]
) -> ConversationRequest:
    """Parse a ``backend`` request body back into a :class:`ConversationRequest`."""
    return get_backend(backend).parse_request(body)
