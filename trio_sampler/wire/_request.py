"""What every request builder returns, and the options it takes. Pure data, no I/O."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._redact import check_credential, is_credential_name
from ..providers import ProviderProfile, get_profile, profile_for
from ..types import ConversationRequest, TrioSamplerError

__all__ = [
    "BuildOptions",
    "ConversionAction",
    "ConversionError",
    "ConversionNote",
    "ConversionReport",
    "WireRequest",
    "refuse_chained",
    "validate_headers",
]

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Headers the HTTP layer must own: overriding them breaks framing or routing.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te"}
)


def validate_headers(pairs: Iterable[tuple[str, str]], *, what: str) -> None:
    """Raise ``ValueError`` (naming ``what``) for a header that would break the request:
    a name that is not an HTTP token, one the HTTP layer owns, a value with CR, LF or
    NUL (header injection), or a credential value (a name :func:`is_credential_name`
    accepts) that :func:`check_credential` refuses."""
    for name, value in pairs:
        if not _TOKEN.match(name):
            raise ValueError(
                f"{what} name {name!r} is not a valid HTTP token "
                "(letters, digits and !#$%&'*+-.^_`|~ only, no spaces or colons)"
            )
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"{what} {name!r} is managed by the HTTP client; remove it")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(
                f"{what} {name!r} has a value containing CR, LF or NUL, which would "
                "split the request (header injection); remove the line breaks"
            )
        if is_credential_name(name):
            check_credential(value, f"{what} {name!r}")  # says which character, and why
        if not value.isascii():  # the value is not shown: it may be a credential
            raise ValueError(
                f"{what} {name!r} has a non-ASCII value; HTTP header values are ASCII: "
                "percent-encode it (urllib.parse.quote) or send it in the body"
            )


@attrs.frozen
class BuildOptions:
    """What a builder needs to know beyond the :class:`ConversationRequest`.

    :class:`trio_sampler.config.SamplerConfig` produces one of these; tests and scripts can
    build one directly.
    """

    #: Model used when the request does not name one.
    model: str | None = None
    #: Provider profile name (``"openai"``, ``"anthropic"``, ``"xai"``, ``"deepseek"``, ...);
    #: selects per-provider quirks (:attr:`profile`) such as DeepSeek's ``reasoning_content``
    #: replay. An unknown name fails here, listing the known ones.
    provider: str | None = attrs.field(default=None)
    #: Stream the answer (``"stream": true``).
    stream: bool = True
    #: Messages requires ``max_tokens``; this is sent when the request gives none.
    default_max_output_tokens: int = 8192
    #: Place prompt-cache breakpoints (at most three of the four a request may carry):
    #: Anthropic ``cache_control``, and OpenAI ``prompt_cache_breakpoint`` where the
    #: provider and model cache explicitly (GPT-5.6 and later). See :doc:`/wire`.
    cache_breakpoints: bool = True
    #: OpenAI ``prompt_cache_options.ttl`` (e.g. ``"30m"``) sent with explicit caching.
    prompt_cache_ttl: str | None = None
    #: Raise :class:`ConversionError` instead of converting what the backend cannot carry.
    strict: bool = False
    #: Send back Chat Completions ``reasoning_content`` on assistant turns
    #: (``None``: only for providers that require it, e.g. DeepSeek).
    replay_reasoning_content: bool | None = None
    #: Extra top-level JSON fields merged into the body last (provider-specific knobs).
    extra_body: Mapping[str, Any] = attrs.field(factory=dict)

    @provider.validator
    def _known_provider(self, attribute: Any, value: str | None) -> None:
        if value is not None:
            get_profile(value)

    @property
    def profile(self) -> ProviderProfile:
        """The provider's quirks (:data:`~trio_sampler.providers.NO_PROVIDER` without one)."""
        return profile_for(self.provider)


class ConversionAction(enum.Enum):
    """What a builder did with something the target backend cannot carry."""

    DROPPED = "dropped"
    CONVERTED_TO_TEXT = "converted_to_text"
    MERGED = "merged"
    ADJUSTED = "adjusted"


@attrs.frozen
class ConversionNote:
    """One lossy conversion: which item (index into ``request.items``, or ``None`` for a
    request-level field), what it was, what was done, and why."""

    item_index: int | None
    what: str
    action: ConversionAction
    detail: str


@attrs.frozen
class ConversionReport:
    """Everything a builder could not carry as-is. Empty means a faithful rendering."""

    notes: tuple[ConversionNote, ...] = ()

    @property
    def lossless(self) -> bool:
        return not self.notes

    def __bool__(self) -> bool:
        return bool(self.notes)


class ConversionError(TrioSamplerError, ValueError):
    """Raised in ``strict`` mode when the request cannot be rendered without loss."""

    def __init__(self, note: ConversionNote) -> None:
        where = f"item {note.item_index}" if note.item_index is not None else "request"
        super().__init__(
            f"{where}: {note.what} cannot be sent on this backend ({note.detail}); "
            "remove it, or build with strict=False to have it "
            f"{note.action.value.replace('_', ' ')}"
        )
        self.note = note


def _redacted_headers(pairs: tuple[tuple[str, str], ...]) -> str:
    return repr(tuple((k, "***" if is_credential_name(k) else v) for k, v in pairs))


@attrs.frozen
class WireRequest:
    """A rendered request: ``POST {base_url}{path}`` with ``headers`` and ``body``.

    ``body`` is the exact bytes to send; ``data`` the same JSON as Python values.
    """

    path: str
    body: bytes
    data: Mapping[str, Any]
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=_redacted_headers)
    report: ConversionReport = ConversionReport()
    method: str = "POST"
    #: Query parameters of this request, after the configuration's own
    #: (``SamplerConfig.query_params``): a retrieval's ``stream`` and ``starting_after``.
    query: tuple[tuple[str, str], ...] = ()

    def with_headers(self, extra: tuple[tuple[str, str], ...]) -> WireRequest:
        """This request with ``extra`` after its headers. Built field by field rather
        than by ``attrs.evolve``, which reads every field back through the class's field
        list (a request's own headers come this way on every attempt: 172 fewer bytecode
        instructions each, ``benchmarks/calls_per_request.py --bytecode``); a new field
        is passed on here too (``tests/test_wire_request.py`` holds the list)."""
        return WireRequest(
            path=self.path,
            body=self.body,
            data=self.data,
            headers=(*self.headers, *extra),
            report=self.report,
            method=self.method,
            query=self.query,
        )


def refuse_chained(request: ConversationRequest, api: str) -> None:
    """Refuse the Responses-only server-side state on ``api``: a chain dropped in
    conversion would silently lose the conversation it points to
    (``docs/stateful-requests.md``)."""
    for name in ("previous_response_id", "conversation"):
        if getattr(request, name) is not None:
            raise ValueError(
                f"{name} continues server-side state that only Responses keeps; {api} "
                "takes the whole conversation: send its items instead (or use the "
                "Responses backend)"
            )
