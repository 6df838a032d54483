"""The neutral conversation model: what an application says, whatever the backend.

Every class here is a frozen attrs value: safe to share between tasks, hashable where
its fields are, and compared by value. Sequences are tuples so that a request built
once can be reused turn after turn without anyone mutating it underneath.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import attrs

from . import _checks
from ._credential_names import redact_url
from ._structured import OutputError, ResponseSchema, StructuredOutput, structured_output

__all__ = [
    "IMAGE_STRIP_PLACEHOLDER",
    "ApiBackend",
    "Assistant",
    "BackendToolCall",
    "Citation",
    "CodeExecution",
    "ContentPart",
    "ConversationItem",
    "ConversationRequest",
    "ConversationResponse",
    "FileSearch",
    "HostedTool",
    "ImagePart",
    "MCPServer",
    "NamedToolChoice",
    "OpaqueItem",
    "OpaquePart",
    "ProviderTool",
    "Reasoning",
    "ReasoningEffort",
    "ResponseSchema",
    "ServerTextDiffers",
    "StopReason",
    "SyntheticReason",
    "System",
    "TextPart",
    "ToolCall",
    "ToolChoice",
    "ToolChoiceSpec",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "User",
    "WebFetch",
    "WebSearch",
]

#: Text that replaces an image the server could not process (image-strip recovery).
IMAGE_STRIP_PLACEHOLDER = "[image removed — the server could not process it; continue without it]"


_Enum = TypeVar("_Enum", bound=enum.Enum)


def coerce_enum(cls: type[_Enum], value: object, what: str) -> _Enum:
    """``value`` as a member of ``cls``: the member itself, or its value or name as a
    string (any case, ``-`` for ``_``). An unknown name is a ``ValueError`` listing the
    valid ones; any other type a ``TypeError`` saying what to write."""
    if isinstance(value, cls):
        return value
    members = list(cls)
    valid = ", ".join(repr(member.value) for member in members)
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        for member in members:
            if key in (str(member.value).lower(), member.name.lower()):
                return member
        # A long string may be a credential passed in the wrong place: not echoed.
        shown = repr(value) if len(value) <= 24 else f"a {len(value)}-character string"
        raise ValueError(
            f"{what} must be one of {valid} (or a member of {cls.__name__}); got {shown}"
        )
    raise TypeError(
        f"{what} must be a member of {cls.__name__} or its name, e.g. "
        f"{cls.__name__}.{members[0].name} or {members[0].value!r} (one of {valid}); "
        f"got a {type(value).__name__}"
    )


class ApiBackend(enum.Enum):
    """The three wire protocols the runtime speaks."""

    CHAT_COMPLETIONS = "chat_completions"
    RESPONSES = "responses"
    MESSAGES = "messages"


def _origin(value: ApiBackend | str | None) -> ApiBackend | None:
    return None if value is None else coerce_enum(ApiBackend, value, "origin")


class StopReason(enum.Enum):
    """Why the model stopped, normalized across backends.

    The verbatim wire value is kept beside it in
    :attr:`ConversationResponse.raw_stop_reason`.
    """

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"


class ReasoningEffort(enum.Enum):
    """How hard a reasoning model should think (rendered per backend by the builders)."""

    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


class SyntheticReason(enum.Enum):
    """Why a :class:`User` item was injected by the system rather than typed by a person."""

    COMPACTION_SUMMARY = "compaction_summary"
    SYSTEM_REMINDER = "system_reminder"
    PROJECT_INSTRUCTIONS = "project_instructions"
    AUTO_CONTINUE = "auto_continue"
    AUTO_RECOVERY = "auto_recovery"
    INTERJECTION = "interjection"
    TASK_COMPLETED = "task_completed"
    SUBAGENT_COMPLETED = "subagent_completed"
    NOTIFICATION_DRAIN = "notification_drain"
    GOAL_SUMMARY = "goal_summary"
    GOAL_CLASSIFIER_NUDGE = "goal_classifier_nudge"
    SCHEDULER_FIRED = "scheduler_fired"
    STOP_HOOK_FEEDBACK = "stop_hook_feedback"
    WORKING_DIRECTORY_SWITCH = "working_directory_switch"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: str) -> SyntheticReason:
        """Map a stored string to a member; unknown strings become :attr:`UNKNOWN`."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


def _tuple(value: Sequence[Any] | None) -> tuple[Any, ...]:
    return () if value is None else tuple(value)


# ---------------------------------------------------------------------------
# Content parts and items
# ---------------------------------------------------------------------------


def _fields_backend(value: ApiBackend | str) -> ApiBackend:
    return coerce_enum(ApiBackend, value, "ProviderFields.backend")


def _field_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not value:
        raise TypeError(
            "ProviderFields.fields is the wire fields as read, a non-empty mapping "
            '(e.g. {"cache_control": {"type": "ephemeral"}})'
        )
    return value


@attrs.frozen
class ProviderFields:
    """Wire fields of one message or content part that the neutral model does not type,
    kept verbatim: a gateway's own on Chat Completions (OpenRouter's and Vercel's
    ``cache_control``, ``reasoning_details`` on an assistant message), a message's
    ``name``. They go back, merged into the object they came on, to the backend they
    came from (``backend``); another backend does not get them, and the conversion
    report says so.
    """

    backend: ApiBackend = attrs.field(converter=_fields_backend)
    fields: Mapping[str, Any] = attrs.field(converter=_field_map)


def _provider_fields(value: ProviderFields | None) -> ProviderFields | None:
    if value is not None and not isinstance(value, ProviderFields):
        raise TypeError(
            "provider_fields is a ProviderFields(backend, {...}) or None; got a "
            f"{type(value).__name__}"
        )
    return value


@attrs.frozen
class TextPart:
    """A run of text inside a user message or tool result.

    ``cache_breakpoint=True`` ends a cached prompt prefix here (Anthropic ``cache_control``,
    OpenAI ``prompt_cache_breakpoint``); a string is the entry's lifetime as Anthropic
    spells it (``"5m"``, ``"1h"``; OpenAI sets one per request, ``BuildOptions.prompt_cache_ttl``).
    See :doc:`/wire`, "Prompt-cache breakpoints".
    """

    text: str = attrs.field(validator=_checks.text("TextPart.text"))
    cache_breakpoint: bool | str = attrs.field(default=False, validator=_checks.cache_breakpoint)
    #: The part's wire fields the neutral model does not type (see :class:`ProviderFields`).
    provider_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )


@attrs.frozen
class ImagePart:
    """An image, by ``https://`` URL or by ``data:<mime>;base64,...`` URI."""

    url: str = attrs.field(validator=_checks.text("ImagePart.url"), repr=redact_url)
    #: Optional fidelity hint (``"low"``, ``"high"``, ``"auto"``), where the backend has one.
    detail: str | None = attrs.field(default=None, validator=_checks.optional_text("detail"))
    #: End a cached prompt prefix after this image (as on :class:`TextPart`).
    cache_breakpoint: bool | str = attrs.field(default=False, validator=_checks.cache_breakpoint)

    @property
    def is_data_uri(self) -> bool:
        return self.url.startswith("data:")


def _required_origin(value: ApiBackend | str) -> ApiBackend:
    return coerce_enum(ApiBackend, value, "origin")


def _raw_object(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # A value of the wrong kind is a TypeError; a mapping without its "type" string is a
    # bad value (what a request body's parser reports as the body's ValueError).
    hint = (
        "OpaqueItem.raw / OpaquePart.raw must be the provider's object as received, a "
        'mapping with a "type" string (e.g. {"type": "compaction", ...})'
    )
    if not isinstance(value, Mapping):
        raise TypeError(f"{hint}; got {type(value).__name__}")
    if not isinstance(value.get("type"), str):
        raise ValueError(f'{hint}; its "type" is a {type(value.get("type")).__name__}')
    return value


@attrs.frozen
class OpaquePart:
    """A content part the neutral model does not type, kept verbatim.

    A Messages ``document`` block, a Chat Completions ``input_audio`` or ``file`` part, a
    Responses ``input_file``, a part type newer than this library: ``raw`` is the
    provider's object as read. It goes back exactly, in its place, to the backend it came
    from (``origin``); another backend cannot take it, and the conversion report says it
    was left out.
    """

    raw: Mapping[str, Any] = attrs.field(converter=_raw_object)
    origin: ApiBackend = attrs.field(converter=_required_origin)

    @property
    def kind(self) -> str:
        """The part's wire ``type`` (``"document"``, ``"input_audio"``, ...)."""
        return str(self.raw["type"])


ContentPart: TypeAlias = TextPart | ImagePart | OpaquePart


def _parts(value: str | Sequence[ContentPart]) -> tuple[ContentPart, ...]:
    if isinstance(value, str):
        _checks.check_text("User content", value)
        return (TextPart(value),)
    if isinstance(value, Mapping) or not isinstance(value, Sequence):
        raise TypeError(
            'User content is a str or a list of TextPart / ImagePart, e.g. User("hello") or '
            f'User([TextPart("look"), ImagePart("https://...")]); got a {type(value).__name__}'
        )
    parts: list[ContentPart] = []
    for index, part in enumerate(value):
        if not isinstance(part, TextPart | ImagePart | OpaquePart):
            raise TypeError(
                f'User content[{index}] is of type {type(part).__name__}; write TextPart("...") or '
                'ImagePart("https://...") (a plain str is also fine for text-only content)'
            )
        parts.append(part)
    return tuple(parts)


@attrs.frozen
class System:
    """Instructions from the application.

    ``developer=True`` marks developer instructions (OpenAI's ``developer`` role); backends
    without that role render them as system instructions.
    """

    content: str
    developer: bool = False
    #: End a cached prompt prefix after these instructions (as on :class:`TextPart`).
    cache_breakpoint: bool | str = attrs.field(default=False, validator=_checks.cache_breakpoint)
    #: The message's wire fields the neutral model does not type (:class:`ProviderFields`).
    provider_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )
    #: The wire fields of its one text part, when the content came as a part list whose
    #: part carried fields of its own (a gateway's ``cache_control``).
    part_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise TypeError(
                f'System content is a str, e.g. System("be brief"); got a '
                f"{type(self.content).__name__}"
            )
        _checks.check_text("System content", self.content)


@attrs.frozen
class User:
    """A user turn: text and images, possibly injected by the system (``synthetic_reason``)."""

    content: tuple[ContentPart, ...] = attrs.field(converter=_parts)
    synthetic_reason: SyntheticReason | None = None
    #: The message's wire fields the neutral model does not type (:class:`ProviderFields`).
    provider_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )

    @property
    def text(self) -> str:
        """The text parts joined with newlines (images left out)."""
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.content if isinstance(p, ImagePart))


@attrs.frozen
class ToolCall:
    """A call of a local tool requested by the model.

    ``arguments`` is the JSON text exactly as the model produced it (an object, normally);
    use :meth:`parsed_arguments` to decode it. ``arguments_complete`` is ``False`` when the
    stream ended before the arguments were complete JSON (cut by ``max_tokens`` or a
    dropped connection): such a call must not be run as if it were valid.
    """

    id: str
    name: str
    arguments: str = "{}"
    arguments_complete: bool = True
    #: Who made the call, as the server said (Anthropic ``caller``: ``{"type": "direct"}``,
    #: or a code-execution tool for programmatic calls): sent back as received.
    caller: Mapping[str, Any] | None = None
    #: The namespace of a tool loaded by tool search, as the server said (Responses
    #: ``function_call.namespace``): sent back as received.
    namespace: str | None = attrs.field(
        default=None, validator=_checks.optional_text("ToolCall.namespace"), kw_only=True
    )

    def parsed_arguments(self) -> Any:
        """The arguments decoded as JSON (raises ``ValueError`` if the model sent invalid JSON)."""
        import orjson

        return orjson.loads(self.arguments or "{}")

    @property
    def partial_arguments(self) -> Any:
        """The arguments read as far as they are JSON: the whole value when complete, what
        arrived when cut short (``arguments_complete`` false: an open string as far as
        it goes, a number only if complete), ``None`` when nothing is readable. Never
        raises; while the call streams, ``RequestStream.partial_arguments`` is the same
        view kept current."""
        from ._partial_json import PartialJSON

        reader = PartialJSON()
        reader.push(self.arguments)
        return reader.finish()


def _span(value: tuple[int, int] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    start, end = value
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
        raise ValueError(
            f"Citation.span must be (start, end) with 0 <= start <= end; got {value!r}"
        )
    return (start, end)


@attrs.frozen
class Citation:
    """A source the answer text cites (Responses annotation, Messages citation, Chat
    Completions annotation).

    ``source`` is what is cited: a URL, a file id or a document's title or index;
    ``title`` its title when the provider gave one; ``span`` the cited range of the
    answer text, ``(start, end)`` in characters, when the provider gives one (OpenAI's
    ``start_index`` / ``end_index``; Anthropic's character locations point into the
    *document* and are left in ``raw``); ``cited_text`` the quoted passage (Anthropic).
    ``raw`` is the provider's object as received: it goes back, exactly, on the next turn
    to the backend it came from (``origin``).
    """

    source: str | None = None
    title: str | None = None
    span: tuple[int, int] | None = attrs.field(default=None, converter=_span)
    cited_text: str | None = None
    raw: Mapping[str, Any] = attrs.field(factory=dict)
    origin: ApiBackend | None = attrs.field(default=None, converter=_origin)


@attrs.frozen
class Assistant:
    """A model turn: its visible text and the local tool calls it asked for.

    Reasoning is never stored here: it is a sibling :class:`Reasoning` item placed before
    the assistant item it belongs to, so interleavings survive byte for byte.
    """

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(
        default=(),
        converter=_tuple,
        validator=_checks.elements_of(
            "tool_calls", ToolCall, '[ToolCall("call_1", "lookup", "{}")]'
        ),
    )
    #: The refusal text, when the model declined (OpenAI ``refusal``).
    refusal: str | None = None
    #: The model that produced this turn, as the server named it.
    model: str | None = None
    #: Opaque per-turn id some backends return (Responses message item id).
    id: str | None = None
    #: Responses ``phase`` of the message (``commentary`` or ``final_answer``): sent back
    #: as received, since the server reads it on the next turn.
    phase: str | None = None
    #: The sources this turn's text cites, in the order the server sent them.
    citations: tuple[Citation, ...] = attrs.field(
        default=(),
        converter=_tuple,
        validator=_checks.elements_of(
            "citations", Citation, '[Citation(source="https://example.com/page")]'
        ),
    )
    #: Chat Completions: the id of an earlier audio answer this turn stands for (the
    #: assistant message's ``audio: {"id": ...}``), sent back so the model hears it
    #: again; other backends have no such reference.
    audio_id: str | None = attrs.field(
        default=None, validator=_checks.optional_text("Assistant.audio_id"), kw_only=True
    )
    #: The message's wire fields the neutral model does not type (:class:`ProviderFields`),
    #: such as a gateway's ``reasoning_details``.
    provider_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )


@attrs.frozen
class ToolResult:
    """The result of running a local tool, answering :attr:`ToolCall.id`."""

    call_id: str = attrs.field(validator=_checks.text("ToolResult.call_id"))
    content: str
    images: tuple[ImagePart, ...] = attrs.field(
        default=(),
        converter=_tuple,
        validator=_checks.elements_of("images", ImagePart, '[ImagePart("https://...")]'),
    )
    is_error: bool = False
    #: End a cached prompt prefix after this result (as on :class:`TextPart`; Messages).
    cache_breakpoint: bool | str = attrs.field(default=False, validator=_checks.cache_breakpoint)
    #: The message's wire fields the neutral model does not type (:class:`ProviderFields`).
    provider_fields: ProviderFields | None = attrs.field(
        default=None, converter=_provider_fields, kw_only=True
    )


@attrs.frozen
class BackendToolCall:
    """A tool the server ran itself (web search, code interpreter, ...).

    ``raw`` keeps the provider's own item(s) so the call can be replayed byte for byte to
    the backend that produced it (``origin``); other backends get a text summary.
    """

    id: str
    name: str
    #: The call's input as JSON text (e.g. ``{"query": "..."}``).
    arguments: str = "{}"
    status: str | None = None
    #: The provider's result payload, as decoded JSON, when one was sent.
    result: Any = None
    origin: ApiBackend | None = attrs.field(default=None, converter=_origin)
    raw: tuple[Mapping[str, Any], ...] = attrs.field(default=(), converter=_tuple)

    def text_summary(self) -> str:
        """A one-line rendering for backends that cannot carry the native item."""
        return f"[backend {self.name}] {self.arguments}"


@attrs.frozen
class Reasoning:
    """The model's reasoning, as a sibling item before the assistant turn it led to.

    ``text`` is the full reasoning where the server sent it (Anthropic thinking, raw
    reasoning text, Chat Completions ``reasoning_content``); ``summary`` holds summary parts
    (Responses). The opaque round-trip state is kept exactly as received:
    ``encrypted_content`` and ``id`` (Responses), ``signature`` (Anthropic thinking) or
    ``redacted_data`` (Anthropic redacted thinking). ``origin`` records which backend
    produced the opaque state, since no other backend can accept it.
    """

    text: str = ""
    summary: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    id: str | None = None
    encrypted_content: str | None = None
    signature: str | None = None
    redacted_data: str | None = None
    origin: ApiBackend | None = attrs.field(default=None, converter=_origin)

    @property
    def display_text(self) -> str:
        """Full text when present, else the summary parts joined with newlines."""
        return self.text if self.text else "\n".join(self.summary)

    @property
    def is_opaque(self) -> bool:
        """True when the item carries provider state that must be replayed unmodified."""
        return bool(self.encrypted_content or self.signature or self.redacted_data)


@attrs.frozen
class OpaqueItem:
    """State the server handed over that the neutral model does not type, kept verbatim.

    A compaction item or block (its ``encrypted_content``), an Anthropic ``fallback`` block,
    a Responses ``shell_call`` or ``apply_patch_call``, a block type newer than this
    library: ``raw`` is the provider's object exactly as the stream finished it (deltas
    applied). It goes back, byte for byte, in its place on the next turn to the backend it
    came from (``origin``); another backend cannot take it, and the conversion report says
    it was left out.
    """

    raw: Mapping[str, Any] = attrs.field(converter=_raw_object)
    origin: ApiBackend = attrs.field(converter=_required_origin)

    @property
    def kind(self) -> str:
        """The object's wire ``type`` (``"compaction"``, ``"fallback"``, ...)."""
        return str(self.raw["type"])


ConversationItem: TypeAlias = (
    System | User | Assistant | ToolResult | BackendToolCall | Reasoning | OpaqueItem
)


# ---------------------------------------------------------------------------
# Tools and the request
# ---------------------------------------------------------------------------


@attrs.frozen
class ToolSpec:
    """A local tool the model may call. ``parameters`` is a JSON Schema object."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, validator=_checks.tool_parameters
    )
    #: Ask for strict schema adherence where the backend supports it (``None``: backend default).
    strict: bool | None = None
    #: Send the definition only when a tool search finds it (Anthropic and OpenAI tool
    #: search, ``defer_loading``); backends without tool search get the tool itself.
    defer_loading: bool = False
    #: End a cached prompt prefix after this definition (Anthropic ``cache_control``; OpenAI
    #: takes no breakpoint on tools, and a later one covers them). See :class:`TextPart`.
    cache_breakpoint: bool | str = attrs.field(default=False, validator=_checks.cache_breakpoint)


def _strings(value: Sequence[str] | None) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(
            f"expected a sequence of strings, got the string {value!r}; write [{value!r}]"
        )
    return () if value is None else tuple(value)


def _optional_strings(value: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if value is None else _strings(value)


def _positive(name: str) -> Any:
    def check(_instance: Any, _attribute: Any, value: int | None) -> None:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")

    return check


def _version(_instance: Any, _attribute: Any, value: str | None) -> None:
    if value is not None and not (value.isdigit() and len(value) == 8):
        raise ValueError(
            f"version must be the date suffix of the provider's tool type, such as "
            f"'20250910', or None for the newest this library knows; got {value!r}"
        )


@attrs.frozen
class WebSearch:
    """Server-hosted web search (OpenAI Responses ``web_search``, Anthropic
    ``web_search_*``). Chat Completions has no hosted tools."""

    max_uses: int | None = attrs.field(default=None, validator=_positive("max_uses"))
    allowed_domains: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: ``"low" | "medium" | "high"`` on OpenAI.
    search_context_size: str | None = None
    #: Anthropic tool version (the date in ``web_search_20250305``); ``None``: the default.
    version: str | None = attrs.field(default=None, validator=_version)


@attrs.frozen
class WebFetch:
    """Server-hosted fetching of whole pages by URL (Anthropic ``web_fetch_*``)."""

    max_uses: int | None = attrs.field(default=None, validator=_positive("max_uses"))
    allowed_domains: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    blocked_domains: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Ask for citations of the fetched pages (``citations: {"enabled": ...}``).
    citations: bool | None = None
    #: A cap on the tokens of fetched content put in the context.
    max_content_tokens: int | None = attrs.field(
        default=None, validator=_positive("max_content_tokens")
    )
    #: Anthropic tool version (the date in ``web_fetch_20250910``); ``None``: the default.
    version: str | None = attrs.field(default=None, validator=_version)


@attrs.frozen
class CodeExecution:
    """Server-hosted code execution in a sandbox (OpenAI Responses ``code_interpreter``,
    Anthropic ``code_execution_*``)."""

    #: Responses: the id of an existing container (``None``: an automatic one).
    container: str | None = None
    #: Responses: files to put in the automatic container.
    file_ids: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Anthropic tool version (the date in ``code_execution_20250825``); ``None``: the default.
    version: str | None = attrs.field(default=None, validator=_version)


@attrs.frozen
class FileSearch:
    """Server-hosted search over uploaded files (OpenAI Responses ``file_search``)."""

    vector_store_ids: tuple[str, ...] = attrs.field(converter=_strings)
    max_num_results: int | None = attrs.field(default=None, validator=_positive("max_num_results"))

    def __attrs_post_init__(self) -> None:
        if not self.vector_store_ids:
            raise ValueError("FileSearch needs a vector store id: FileSearch(['vs_...'])")


@attrs.frozen
class MCPServer:
    """A remote MCP server whose tools the provider calls itself (OpenAI Responses ``mcp``
    tool, Anthropic ``mcp_servers``). The calls come back as :class:`BackendToolCall` s."""

    #: The server's label (Responses ``server_label``, Anthropic ``name``).
    name: str
    url: str = attrs.field(repr=redact_url)
    #: Only these of the server's tools (``None``: all of them).
    allowed_tools: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_strings)
    #: Sent to the MCP server as its bearer token; never shown in ``repr``.
    authorization: str | None = attrs.field(default=None, repr=False)
    #: Responses ``require_approval`` (``"never"`` or ``"always"``; ``None``: the provider's
    #: default). This runtime does not answer approval requests: use ``"never"``.
    require_approval: str | None = None
    #: Responses ``server_description``.
    description: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ValueError("MCPServer needs a name (its label), e.g. MCPServer('deepwiki', url)")
        if not self.url.startswith(("https://", "http://")):
            raise ValueError(f"MCPServer url must be an http(s) URL, got {redact_url(self.url)!r}")


def _provider_tool_backend(value: ApiBackend | str) -> ApiBackend:
    return coerce_enum(ApiBackend, value, "ProviderTool.backend")


@attrs.frozen
class ProviderTool:
    """A provider tool this library does not model, sent verbatim to one backend.

    ``tool`` is the raw JSON object as that backend's ``tools`` array takes it (e.g.
    ``{"type": "image_generation"}`` on Responses, ``{"type": "tool_search_tool_bm25_20251119",
    "name": "tool_search_tool_bm25"}`` on Messages). Other backends drop it and say so in
    the conversion report. ``parse_request`` keeps every tool it cannot model this way.
    """

    #: An :class:`ApiBackend`, or its name (``"responses"``, ...).
    backend: ApiBackend = attrs.field(converter=_provider_tool_backend)
    tool: Mapping[str, Any]

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.tool, Mapping) or not self.tool:
            raise ValueError(
                "ProviderTool.tool must be the tool's JSON object, e.g. {'type': 'mcp', ...}"
            )


#: Every tool the server runs itself, plus the verbatim passthrough.
HostedTool: TypeAlias = WebSearch | WebFetch | CodeExecution | FileSearch | MCPServer | ProviderTool


class ToolChoice(enum.Enum):
    """Whether the model may, must or must not call tools."""

    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"


@attrs.frozen
class NamedToolChoice:
    """Force a call of one named local tool."""

    name: str


ToolChoiceSpec: TypeAlias = ToolChoice | NamedToolChoice


_ITEM_TYPES = (System, User, Assistant, ToolResult, BackendToolCall, Reasoning, OpaqueItem)
#: What to write instead of an OpenAI-style ``{"role": ..., "content": ...}`` dict.
_ROLE_HINTS = {
    "system": 'System("...")',
    "developer": 'System("...", developer=True)',
    "user": 'User("...")',
    "assistant": 'Assistant("...")',
    "tool": 'ToolResult(call_id="...", content="...")',
}


def _items(value: Sequence[ConversationItem]) -> tuple[ConversationItem, ...]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(
            'items is a list of conversation items, e.g. items=[User("hello")]; '
            f"got a {type(value).__name__}"
        )
    items = tuple(value)
    for index, item in enumerate(items):
        if not isinstance(item, _ITEM_TYPES):
            raise TypeError(_item_hint(index, item))
    return items


def _item_hint(index: int, item: object) -> str:
    kinds = "System, User, Assistant, ToolResult, BackendToolCall, Reasoning or OpaqueItem"
    if isinstance(item, Mapping):
        role = item.get("role")
        hint = _ROLE_HINTS.get(role, 'User("...")') if isinstance(role, str) else 'User("...")'
        return (
            f"items[{index}] is a dict (a provider's message format?); write {hint} instead: "
            f"items are {kinds}"
        )
    if isinstance(item, str):
        return f'items[{index}] is a str; write User("...") (or System("...")): items are {kinds}'
    return f"items[{index}] is of type {type(item).__name__}; items are {kinds}"


def _checked_tuple(
    name: str, value: Sequence[Any] | None, types: tuple[type, ...], example: str
) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{name} is a list, e.g. {name}={example}; got a {type(value).__name__}")
    values = tuple(value)
    for index, element in enumerate(values):
        if not isinstance(element, types):
            raise TypeError(
                f"{name}[{index}] is of type {type(element).__name__}; e.g. {name}={example}"
            )
    return values


def _tools(value: Sequence[ToolSpec] | None) -> tuple[ToolSpec, ...]:
    return _checked_tuple("tools", value, (ToolSpec,), '[ToolSpec("lookup", "what it does")]')


_HOSTED_CLASSES = (WebSearch, WebFetch, CodeExecution, FileSearch, MCPServer, ProviderTool)


def _hosted_tools(value: Sequence[Any] | None) -> tuple[HostedTool, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(
            f"hosted_tools is a list, e.g. hosted_tools=[WebSearch()]; got a {type(value).__name__}"
        )
    tools = tuple(value)
    for index, tool in enumerate(tools):
        if not isinstance(tool, _HOSTED_CLASSES):
            names = ", ".join(c.__name__ for c in _HOSTED_CLASSES)
            raise TypeError(
                f"hosted_tools[{index}] is of type {type(tool).__name__}; e.g. "
                f"hosted_tools=[WebSearch()]: hosted tools are {names} (a local function tool "
                "is a ToolSpec in tools; any other provider tool is ProviderTool(backend, {...}))"
            )
    return tools


#: The two kinds of entry of :attr:`ConversationRequest.tool_order`.
TOOL_ORDER_KINDS = ("function", "hosted")


def _tool_order(value: Sequence[str] | None) -> tuple[str, ...]:
    order = _checked_tuple("tool_order", value, (str,), '["hosted", "function"]')
    for index, kind in enumerate(order):
        if kind not in TOOL_ORDER_KINDS:
            raise ValueError(
                f'tool_order[{index}] is {kind!r}; each entry is "function" (the next of '
                'tools) or "hosted" (the next of hosted_tools)'
            )
    return order


def _tool_choice(value: ToolChoiceSpec | str | None) -> ToolChoiceSpec | None:
    if value is None or isinstance(value, NamedToolChoice):
        return value
    if not isinstance(value, ToolChoice | str):
        raise TypeError(
            "tool_choice is a ToolChoice (or its name: 'auto', 'none', 'required') or "
            f'NamedToolChoice("tool_name"); got a {type(value).__name__}'
        )
    return coerce_enum(ToolChoice, value, "tool_choice")


def _reasoning_effort(value: ReasoningEffort | str | None) -> ReasoningEffort | None:
    return None if value is None else coerce_enum(ReasoningEffort, value, "reasoning_effort")


def _stop_sequences(value: Sequence[str] | None) -> tuple[str, ...]:
    return _checked_tuple("stop_sequences", value, (str,), '["END"]')


@attrs.frozen
class ConversationRequest:
    """One sampling call, said in neutral terms.

    It says what the call means, not what any endpoint's JSON looks like; the builders in
    :mod:`trio_sampler.wire` render it per backend. ``model`` may be left ``None`` to use
    the configured model.
    """

    items: tuple[ConversationItem, ...] = attrs.field(
        converter=_items, validator=_checks.tool_call_fields
    )
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_tools)
    hosted_tools: tuple[HostedTool, ...] = attrs.field(default=(), converter=_hosted_tools)
    #: The order of the wire ``tools`` list where function and hosted tools interleave
    #: (a tool search tool first, say): one entry per tool, ``"function"`` for the next
    #: of :attr:`tools`, ``"hosted"`` for the next of :attr:`hosted_tools`.
    #: ``parse_request`` records it when the order is not the default; empty (the
    #: default): function tools first, then hosted tools. Tools the record does not
    #: reach follow in the default order; entries past the end of a list are skipped.
    tool_order: tuple[str, ...] = attrs.field(default=(), converter=_tool_order, kw_only=True)
    #: A :class:`ToolChoice` (or its name: ``"auto"``, ``"none"``, ``"required"``) or a
    #: :class:`NamedToolChoice`.
    tool_choice: ToolChoiceSpec | None = attrs.field(default=None, converter=_tool_choice)
    parallel_tool_calls: bool | None = attrs.field(
        default=None, validator=_checks.optional_bool("parallel_tool_calls")
    )
    model: str | None = attrs.field(default=None, validator=_checks.optional_text("model"))
    temperature: float | None = attrs.field(default=None, validator=_checks.temperature)
    top_p: float | None = attrs.field(
        default=None, validator=_checks.optional_unit_interval("top_p")
    )
    max_output_tokens: int | None = attrs.field(
        default=None, validator=_checks.optional_tokens("max_output_tokens")
    )
    #: A :class:`ReasoningEffort`, or its name (``"low"``, ``"high"``, ...).
    reasoning_effort: ReasoningEffort | None = attrs.field(
        default=None, converter=_reasoning_effort
    )
    #: Anthropic extended-thinking budget; derived from the effort when ``None``.
    thinking_budget_tokens: int | None = attrs.field(
        default=None, validator=_checks.optional_tokens("thinking_budget_tokens")
    )
    response_schema: ResponseSchema | None = attrs.field(
        default=None,
        validator=_checks.optional_instance(
            "response_schema", ResponseSchema, 'ResponseSchema("answer", {"type": "object"})'
        ),
    )
    stop_sequences: tuple[str, ...] = attrs.field(default=(), converter=_stop_sequences)
    prompt_cache_key: str | None = attrs.field(
        default=None, validator=_checks.optional_text("prompt_cache_key")
    )
    #: End-user id for abuse monitoring (``user`` / ``safety_identifier`` / ``metadata.user_id``).
    user_id: str | None = attrs.field(default=None, validator=_checks.optional_text("user_id"))
    #: Tracing metadata sent where the backend accepts it (string values only).
    metadata: Mapping[str, str] = attrs.field(
        factory=dict, validator=_checks.string_map("metadata")
    )
    #: Headers of this request only (credential-named ones are redacted in the repr).
    extra_headers: Mapping[str, str] = attrs.field(
        factory=dict, validator=_checks.check_header_map, repr=_checks.headers_repr
    )
    #: Structured output: a JSON Schema, a :class:`ResponseSchema` or a Python type (a
    #: pydantic model, a dataclass, an attrs class, a ``TypedDict``), held as a
    #: :class:`~trio_sampler.types.StructuredOutput`. It sets ``response_schema`` when that
    #: is not given, and the response's answer is read into ``output_parsed``.
    output: StructuredOutput | None = attrs.field(
        default=None, converter=structured_output, kw_only=True
    )
    #: Run the response in the background on the server (Responses ``background: true``):
    #: it keeps running when the stream drops, and a cut stream resumes from the last
    #: event delivered (``GET /v1/responses/{id}?stream=true&starting_after=N``) instead
    #: of starting over; cancelling the request cancels the response on the server. The
    #: server keeps the response (``store``). Other backends drop it (the conversion
    #: report says so): their cut streams are retried.
    background: bool = attrs.field(
        default=False, validator=_checks.optional_bool("background"), kw_only=True
    )
    #: Server-side state (``docs/stateful-requests.md``). ``store``: keep the response on
    #: the server (Responses; stored completions on Chat Completions); ``None``: not sent,
    #: the API's default. ``previous_response_id``: continue a stored Responses response.
    #: ``conversation``: the id of a Responses conversation the turn is appended to. A
    #: request with ``store=True``, a ``previous_response_id`` or a ``conversation`` is
    #: not replay-safe: it is retried only when the failure proves the server did not
    #: process it (:attr:`replay_safe`).
    store: bool | None = attrs.field(
        default=None, kw_only=True, validator=_checks.optional_bool("store")
    )
    previous_response_id: str | None = attrs.field(
        default=None, kw_only=True, validator=_checks.optional_text("previous_response_id")
    )
    conversation: str | None = attrs.field(
        default=None, kw_only=True, validator=_checks.optional_text("conversation")
    )

    @property
    def replay_safe(self) -> bool:
        """Whether sending the request twice leaves the server as sending it once would:
        a stateless request is; a stored, chained or background one is not (a second send
        stores a second response, appends the turn to the conversation twice, or starts a
        second background response the server runs and bills)."""
        return not (self.store or self.background or self.previous_response_id or self.conversation)

    def __attrs_post_init__(self) -> None:
        if self.output is not None and self.response_schema is None:
            object.__setattr__(self, "response_schema", self.output.schema)

    def strip_images(self) -> tuple[ConversationRequest, tuple[str, ...]]:
        """Replace user images by placeholder text and drop tool-result images.

        Returns the new request and the URLs removed; never adds or removes items.
        """
        stripped: list[str] = []
        new_items: list[ConversationItem] = []
        for item in self.items:
            if isinstance(item, User) and item.images:
                parts: list[ContentPart] = []
                for part in item.content:
                    if isinstance(part, ImagePart):
                        stripped.append(part.url)
                        parts.append(TextPart(IMAGE_STRIP_PLACEHOLDER))
                    else:
                        parts.append(part)
                new_items.append(attrs.evolve(item, content=parts))
            elif isinstance(item, ToolResult) and item.images:
                stripped.extend(p.url for p in item.images)
                new_items.append(attrs.evolve(item, images=()))
            else:
                new_items.append(item)
        return attrs.evolve(self, items=new_items), tuple(stripped)


# ---------------------------------------------------------------------------
# Usage and the response
# ---------------------------------------------------------------------------


#: More tokens than any one response has used or could (a model's context is at most a
#: few million tokens): a count past it is a server's error, flagged and never priced.
MAX_PLAUSIBLE_TOKENS = _checks.MAX_TOKENS


@attrs.frozen
class Usage:
    """Token usage, normalized the same way on every backend.

    * ``input_tokens``: the whole prompt, cached or not (Anthropic: its ``input_tokens``
      plus cache reads plus cache writes).
    * ``cache_read_tokens``: the part of the prompt served from cache.
    * ``cache_write_tokens``: the part written to cache (Anthropic, OpenAI's explicit
      caching; 0 where the server reports none).
    * ``output_tokens``: everything generated, reasoning included.
    * ``reasoning_tokens``: the reasoning part of ``output_tokens``, where reported.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    #: How many counts the server sent in a form the protocol does not allow (a string,
    #: say); each was read as 0.
    malformed: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def priceable(self) -> bool:
        """Whether its counts are counts at all: none malformed, none past
        :data:`MAX_PLAUSIBLE_TOKENS` (a usage that breaks only the other invariants is
        priced, its counts clamped at zero)."""
        return not self.malformed and (
            max(
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
                self.reasoning_tokens,
            )
            <= MAX_PLAUSIBLE_TOKENS
        )

    @property
    def violations(self) -> tuple[UsageViolation, ...]:
        """The invariants this usage breaks, as reported (kept as sent, never priced as such):
        every count a number the protocol allows, none past :data:`MAX_PLAUSIBLE_TOKENS`,
        every count non-negative, cache reads and writes within the input, reasoning within
        the output."""
        found: list[UsageViolation] = []
        if self.malformed:
            found.append(UsageViolation.MALFORMED_COUNT)
        counts = (
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.reasoning_tokens,
        )
        if any(count > MAX_PLAUSIBLE_TOKENS for count in counts):
            found.append(UsageViolation.IMPLAUSIBLE_COUNT)
        if any(count < 0 for count in counts):
            found.append(UsageViolation.NEGATIVE_COUNT)
        given, out, read, write, reasoning = (max(count, 0) for count in counts)
        if read + write > given:
            found.append(UsageViolation.CACHE_EXCEEDS_INPUT)
        if reasoning > out:
            found.append(UsageViolation.REASONING_EXCEEDS_OUTPUT)
        return tuple(found)


class UsageViolation(enum.Enum):
    """A usage invariant the server's report breaks (see :attr:`Usage.violations`)."""

    #: A count sent as something other than a number (a string, a list, ...).
    MALFORMED_COUNT = "malformed_count"
    #: A count past :data:`MAX_PLAUSIBLE_TOKENS` (``1e30`` tokens): not a real usage.
    IMPLAUSIBLE_COUNT = "implausible_count"
    NEGATIVE_COUNT = "negative_count"
    CACHE_EXCEEDS_INPUT = "cache_exceeds_input"
    REASONING_EXCEEDS_OUTPUT = "reasoning_exceeds_output"


@attrs.frozen
class ServerTextDiffers:
    """A warning: the server's final text of an output item (a Responses
    ``output_item.done``) disagreed with the deltas it streamed. The response holds the
    server's text (``final``); the streamed events stay as they were received (``streamed``
    is their text). ``item_index`` is the item's place in the output."""

    item_index: int
    streamed: str
    final: str


@attrs.frozen
class ConversationResponse:
    """What a finished (or partial) sampling call produced.

    ``items`` is the ordered output, in the order of the wire: reasoning, backend tool
    calls and text (an :class:`Assistant` per run of text) as they arrived, ending with an
    :class:`Assistant` that holds the local tool calls and the refusal (without text when
    the last thing on the wire was not text). :attr:`text` joins every assistant item's
    text; :attr:`tool_calls` collects every assistant item's calls.
    """

    items: tuple[ConversationItem, ...] = attrs.field(default=(), converter=_tuple)
    stop_reason: StopReason | None = None
    #: The verbatim wire stop/finish reason (``end_turn``, ``refusal``, ``incomplete``, ...).
    raw_stop_reason: str | None = None
    usage: Usage | None = None
    #: Cost in ticks (1 USD = 10**10 ticks), as reported by the server or computed.
    cost_usd_ticks: int | None = None
    model: str | None = None
    response_id: str | None = None
    #: Number of text chunks streamed (detects text lost between deltas and the final item).
    chunk_count: int = 0
    stop_sequence: str | None = None
    #: Doom-loop signals attached by the server or the local detector.
    doom_loop_signals: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    #: The structured answer, parsed and validated (a request with ``output=``; ``None``
    #: otherwise, or when it could not be read: see :attr:`output_error`).
    output_parsed: Any = attrs.field(default=None, kw_only=True)
    #: Why a structured answer has no ``output_parsed`` (the raw text kept in it).
    output_error: OutputError | None = attrs.field(default=None, kw_only=True)
    #: What the server's own final word corrected (see :class:`ServerTextDiffers`).
    warnings: tuple[ServerTextDiffers, ...] = attrs.field(default=(), converter=_tuple)

    @property
    def assistant(self) -> Assistant:
        """The trailing assistant item (an empty one if the response has none)."""
        for item in reversed(self.items):
            if isinstance(item, Assistant):
                return item
        return Assistant()

    @property
    def text(self) -> str:
        """The answer: the text of every assistant item, in order."""
        return "".join(i.content for i in self.items if isinstance(i, Assistant))

    @property
    def refusal(self) -> str | None:
        refusals = [
            i.refusal for i in self.items if isinstance(i, Assistant) and i.refusal is not None
        ]
        return "".join(refusals) if refusals else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for i in self.items if isinstance(i, Assistant) for c in i.tool_calls)

    @property
    def citations(self) -> tuple[Citation, ...]:
        """Every citation of the answer, in order (each assistant item's ``citations``)."""
        return tuple(c for i in self.items if isinstance(i, Assistant) for c in i.citations)

    @property
    def reasoning_items(self) -> tuple[Reasoning, ...]:
        return tuple(i for i in self.items if isinstance(i, Reasoning))

    @property
    def backend_tool_calls(self) -> tuple[BackendToolCall, ...]:
        return tuple(i for i in self.items if isinstance(i, BackendToolCall))

    @property
    def reasoning_text(self) -> str:
        """All reasoning text (full text, else summaries), blocks joined with newlines."""
        return "\n".join(r.display_text for r in self.reasoning_items if r.display_text)

    @property
    def usage_violations(self) -> tuple[UsageViolation, ...]:
        """The usage invariants the server's report breaks (empty when none, or no usage)."""
        return () if self.usage is None else self.usage.violations

    @property
    def is_empty(self) -> bool:
        """No visible text, no refusal and no tool calls."""
        return not self.text and not self.tool_calls and not self.refusal
