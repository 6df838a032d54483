"""Shared pieces of the three request builders and parsers. Pure functions, no I/O.

Everything a builder does the same way on every backend lives here, so that the
per-backend modules only say what differs: canonical JSON encoding, the conversion report
(with strict mode), the model and extra-body rules, data-URI handling, grouping of items
into wire turns, and the field readers the parsers use to reject bad shapes with a message
that names the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from ..types._checks import check_json_value
from ..types._conversation import (
    ApiBackend,
    Assistant,
    ContentPart,
    ConversationItem,
    ConversationRequest,
    OpaquePart,
    Reasoning,
    ReasoningEffort,
)
from ._request import (
    BuildOptions,
    ConversionAction,
    ConversionError,
    ConversionNote,
    ConversionReport,
    WireRequest,
)

__all__ = [
    "JsonObject",
    "ReportCollector",
    "as_list",
    "as_object",
    "data_uri",
    "dumps",
    "finish_request",
    "gate_tool_controls",
    "group_runs",
    "indexed",
    "load_body",
    "opt_bool",
    "opt_int",
    "opt_number",
    "opt_str",
    "opt_str_list",
    "own_parts",
    "parse_arguments",
    "parse_effort",
    "reasoning_is_native",
    "req_str",
    "resolve_model",
    "sanitize_id",
    "split_data_uri",
    "string_metadata",
    "unmodeled_fields",
]

JsonObject = dict[str, Any]
T = TypeVar("T")
K = TypeVar("K")


# ---------------------------------------------------------------------------
# Encoding and the finished request
# ---------------------------------------------------------------------------


def dumps(data: Any) -> bytes:
    """Compact JSON, keys in insertion order (never sorted), UTF-8 unescaped.

    Deterministic because every builder inserts keys in a fixed order and never iterates
    a set; the same data therefore always gives the same bytes.
    """
    return orjson.dumps(data)


def resolve_model(request: ConversationRequest, options: BuildOptions) -> str:
    """The request's model, else the configured one; neither is a caller error."""
    model = request.model or options.model
    if not model:
        raise ValueError("no model to send: set ConversationRequest.model or BuildOptions.model")
    return model


def finish_request(
    path: str,
    data: JsonObject,
    options: BuildOptions,
    report: ReportCollector,
    headers: tuple[tuple[str, str], ...] = (),
) -> WireRequest:
    """Merge ``options.extra_body`` last (it wins over anything built) and encode."""
    for key, value in options.extra_body.items():
        data[key] = value
    return WireRequest(
        path=path, body=_encoded(data), data=data, headers=headers, report=report.report()
    )


def _encoded(data: JsonObject) -> bytes:
    """:func:`dumps` of a request body; what JSON cannot carry (a lone surrogate in a
    prompt, an integer past 64 bits, a set in a tool schema that came in through
    ``extra_body``) is the caller's ``ValueError``, naming where it is in the body."""
    try:
        return dumps(data)
    except orjson.JSONEncodeError as exc:
        try:
            check_json_value("body", data)
        except (TypeError, ValueError) as found:
            raise ValueError(str(found)) from None
        raise ValueError(f"the request body cannot be encoded as JSON ({exc})") from None


class ReportCollector:
    """Collects :class:`ConversionNote` s; in strict mode the first one raises instead."""

    def __init__(self, strict: bool) -> None:
        self._strict = strict
        self._notes: list[ConversionNote] = []

    def note(
        self, item_index: int | None, what: str, action: ConversionAction, detail: str
    ) -> None:
        """Record one lossy conversion (raises :class:`ConversionError` when strict)."""
        note = ConversionNote(item_index=item_index, what=what, action=action, detail=detail)
        if self._strict:
            raise ConversionError(note)
        self._notes.append(note)

    def report(self) -> ConversionReport:
        return ConversionReport(notes=tuple(self._notes))


def reasoning_is_native(item: Reasoning, backend: ApiBackend) -> bool:
    """Whether ``item`` carries state the ``backend`` produced (or plausibly did).

    An item with no recorded origin counts as native when it has opaque state, since
    only its own backend could have produced that state.
    """
    if item.origin is not None:
        return item.origin is backend
    return item.is_opaque


def group_runs(items: Iterable[T], key: Callable[[T], K]) -> list[tuple[K, list[T]]]:
    """Split ``items`` into maximal runs of consecutive elements with the same key."""
    runs: list[tuple[K, list[T]]] = []
    for item in items:
        k = key(item)
        if runs and runs[-1][0] == k:
            runs[-1][1].append(item)
        else:
            runs.append((k, [item]))
    return runs


def indexed(items: Sequence[ConversationItem]) -> list[tuple[int, ConversationItem]]:
    """``(index, item)`` pairs, so notes can point back into ``request.items``."""
    return list(enumerate(items))


# ---------------------------------------------------------------------------
# Data URIs and ids
# ---------------------------------------------------------------------------

_DATA_URI = re.compile(r"^data:(?P<mime>[^;,]+)?(?P<params>(?:;[^;,]*)*),(?P<data>.*)$", re.S)


def split_data_uri(url: str) -> tuple[str, str] | None:
    """``(media_type, base64_data)`` for a base64 ``data:`` URI, else ``None``."""
    match = _DATA_URI.match(url)
    if match is None or ";base64" not in match.group("params"):
        return None
    return match.group("mime") or "application/octet-stream", match.group("data")


def data_uri(media_type: str, data: str) -> str:
    """The inverse of :func:`split_data_uri`."""
    return f"data:{media_type};base64,{data}"


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitize_id(value: str) -> str:
    """Map an id onto ``[A-Za-z0-9_-]+`` deterministically (Anthropic's id alphabet)."""
    return _ID_UNSAFE.sub("_", value) or "_"


def string_metadata(value: Any, where: str) -> dict[str, str]:
    obj = as_object(value, where)
    for key, val in obj.items():
        if not isinstance(val, str):
            raise ValueError(f"{where}.{key} must be a string")
    return dict(obj)


# ---------------------------------------------------------------------------
# Parsing: field readers with messages that name the field
# ---------------------------------------------------------------------------


def load_body(body: bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    """Decode a request body; it must be a JSON object."""
    if isinstance(body, bytes | bytearray | memoryview):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"request body is not valid JSON: {exc}") from None
    else:
        data = body
    if not isinstance(data, Mapping):
        raise ValueError("request body must be a JSON object")
    return data


def as_object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where} must be an array")
    return list(value)


def req_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} is required and must be a string")
    return value


def opt_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string")
    return value


def opt_bool(obj: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be a boolean")
    return value


def opt_int(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{where}.{key} must be an integer")
    return value


def opt_number(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}.{key} must be a number")
    return float(value)


def opt_str_list(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    """A string or an array of strings (as ``stop`` allows); missing gives ``()``."""
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    items = as_list(value, f"{where}.{key}")
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{where}.{key} must contain only strings")
    return tuple(items)


def unmodeled_fields(
    data: Mapping[str, Any],
    known: Iterable[str],
    checks: Mapping[str, Callable[[Any], bool]] | None = None,
) -> JsonObject:
    """Top-level fields of a wire body that the neutral model cannot express.

    Unknown keys, plus known keys whose value fails its entry in ``checks`` (for example
    a ``tools`` array holding a tool type the neutral model has no class for). Null values
    are left out: a null field means "unset" on every backend. Passing the result as
    :attr:`BuildOptions.extra_body` to a rebuild reproduces those fields verbatim.
    """
    known_set = frozenset(known)
    checks = checks or {}
    out: JsonObject = {}
    for key, value in data.items():
        if value is None:
            continue
        check = checks.get(key)
        if key not in known_set or (check is not None and not check(value)):
            out[key] = value
    if "tools" in out:
        # Tool controls go with the tools: without them the builder would drop them.
        for key in ("tool_choice", "parallel_tool_calls"):
            if data.get(key) is not None:
                out[key] = data[key]
    return out


def gate_tool_controls(
    request: ConversationRequest, has_tools: bool, report: ReportCollector
) -> bool:
    """Whether ``tool_choice`` / ``parallel_tool_calls`` may be sent.

    The servers reject them when the request offers no tools, so without tools they are
    dropped, and said so.
    """
    if has_tools:
        return True
    if request.tool_choice is not None:
        report.note(None, "tool_choice", ConversionAction.DROPPED, "the request offers no tools")
    if request.parallel_tool_calls is not None:
        report.note(
            None,
            "parallel_tool_calls",
            ConversionAction.DROPPED,
            "the request offers no tools",
        )
    return False


def parse_effort(value: Any, where: str) -> ReasoningEffort | None:
    """A :class:`ReasoningEffort` from its wire string (``None`` passes through)."""
    if value is None:
        return None
    try:
        return ReasoningEffort(value)
    except ValueError:
        allowed = ", ".join(e.value for e in ReasoningEffort)
        raise ValueError(f"{where} must be one of {allowed}") from None


def parse_arguments(text: str) -> Any:
    """Decode tool-call arguments; ``None`` when they are not valid JSON."""
    try:
        return orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return None


def own_parts(
    index: int, parts: Sequence[ContentPart], backend: ApiBackend, report: ReportCollector
) -> list[ContentPart]:
    """``parts`` without the verbatim parts another backend handed over, each noted as
    dropped (a provider's part object is its own)."""
    kept: list[ContentPart] = []
    for part in parts:
        if isinstance(part, OpaquePart) and part.origin is not backend:
            report.note(
                index,
                f"{part.kind} part from {part.origin.value}",
                ConversionAction.DROPPED,
                "only the backend it came from can take it back",
            )
        else:
            kept.append(part)
    return kept


def own_citations(
    index: int, item: Assistant, backend: ApiBackend, report: ReportCollector
) -> list[Mapping[str, Any]]:
    """The provider objects of ``item``'s citations that ``backend`` takes back (its own);
    the others are noted as dropped (each backend's citation objects are its own)."""
    own = [c.raw for c in item.citations if c.origin is backend and c.raw]
    if len(own) < len(item.citations):
        report.note(
            index,
            "citations",
            ConversionAction.DROPPED,
            f"{len(item.citations) - len(own)} citation(s) from another backend; "
            f"{backend.value} takes back only its own",
        )
    return own
