"""The backend protocol: one small explicit interface per wire protocol, and the table.

A backend is an object with a name, a request builder, a request parser, a transform
factory, its default headers and its in-stream error classifier (:class:`Backend`). The
three built-in ones are :class:`WireBackend` values defined by their subpackages;
:func:`register_backend` adds another (a fourth protocol is one module plus one call).
The client, the actor, the emulator and :func:`~trio_sampler.wire.replay` look backends up
only here (:func:`get_backend`): no string imports, no ``getattr``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from ..types import ApiBackend, ConversationRequest, SamplingErrorInfo
from ._request import BuildOptions, WireRequest
from ._transform import StreamTransform
from .errors import classify_stream_error

__all__ = ["Backend", "WireBackend", "backend_name", "backends", "get_backend", "register_backend"]


@runtime_checkable
class Backend(Protocol):
    """What the library needs from a wire protocol."""

    @property
    def name(self) -> str:
        """The name configs use (``SamplerConfig(backend=...)``): ``"chat_completions"``, ..."""
        ...

    @property
    def default_headers(self) -> tuple[tuple[str, str], ...]:
        """Headers every request of this protocol carries (``anthropic-version``, ...)."""
        ...

    def build_request(self, request: ConversationRequest, options: BuildOptions) -> WireRequest:
        """Render ``request`` as this protocol's HTTP request (``ValueError`` if it cannot)."""
        ...

    def parse_request(self, body: bytes | Mapping[str, Any]) -> ConversationRequest:
        """Read a request body of this protocol back (``ValueError`` on a malformed one)."""
        ...

    def new_transform(self, request_id: str, *, provider: str | None = None) -> StreamTransform:
        """A fresh stream transform for one attempt."""
        ...

    def classify_stream_error(self, payload: Mapping[str, Any]) -> SamplingErrorInfo:
        """What an error event inside a 200 stream of this protocol means: its kind and
        whether a retry may help (the transform ends the stream with it)."""
        ...


@attrs.frozen
class WireBackend:
    """A :class:`Backend` made of its parts (how the built-in backends are defined)."""

    name: str
    build: Callable[[ConversationRequest, BuildOptions], WireRequest]
    parse: Callable[[bytes | Mapping[str, Any]], ConversationRequest]
    transform: Callable[..., StreamTransform]
    default_headers: tuple[tuple[str, str], ...] = ()
    #: The in-stream error classifier (by default the one the built-in protocols share,
    #: :func:`trio_sampler.wire.classify_stream_error`); every new transform uses it.
    stream_errors: Callable[[Mapping[str, Any]], SamplingErrorInfo] = classify_stream_error

    def build_request(self, request: ConversationRequest, options: BuildOptions) -> WireRequest:
        return self.build(request, options)

    def parse_request(self, body: bytes | Mapping[str, Any]) -> ConversationRequest:
        return self.parse(body)

    def new_transform(self, request_id: str, *, provider: str | None = None) -> StreamTransform:
        transform = self.transform(request_id, provider=provider)
        transform.classify_stream_error = self.stream_errors
        return transform

    def classify_stream_error(self, payload: Mapping[str, Any]) -> SamplingErrorInfo:
        return self.stream_errors(payload)


_TABLE: dict[str, Backend] = {}
_BUILT_IN_NAMES = frozenset(backend.value for backend in ApiBackend)


def register_backend(backend: Backend) -> None:
    """Add ``backend`` to the table (its name must be new)."""
    if not isinstance(backend, Backend):
        raise TypeError(
            f"{backend!r} is not a Backend: it needs name, default_headers, build_request, "
            "parse_request, new_transform and classify_stream_error "
            "(see trio_sampler.wire.WireBackend)"
        )
    if backend.name in _TABLE:
        raise ValueError(f"a backend named {backend.name!r} is already registered")
    _TABLE[backend.name] = backend


def backend_name(backend: ApiBackend | str) -> str:
    """The table key of ``backend``: an :class:`ApiBackend`, a built-in backend's name in
    any case (``"Responses"``, ``"chat-completions"``), or a registered name as given."""
    if isinstance(backend, ApiBackend):
        return backend.value
    if isinstance(backend, str) and backend not in _TABLE:
        key = backend.strip().lower().replace("-", "_")
        if key in _BUILT_IN_NAMES:
            return key
    return backend


def get_backend(backend: ApiBackend | str) -> Backend:
    """The registered backend called ``backend``; ``ValueError`` lists the known names."""
    name = backend_name(backend)
    found = _TABLE.get(name)
    if found is None:
        known = ", ".join(repr(known) for known in _TABLE)
        raise ValueError(f"unknown backend {name!r}; known backends: {known}")
    return found


def backends() -> tuple[Backend, ...]:
    """Every registered backend, built-in ones first."""
    return tuple(_TABLE.values())
