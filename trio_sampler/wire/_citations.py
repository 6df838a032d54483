"""Citations and annotations, read from the three wire formats into :class:`Citation`.

One table: the provider's object type → where its source, title, span and quoted text are.
``span`` is read only where the provider's indices point into the answer text (OpenAI's
``start_index`` / ``end_index``); Anthropic's locations point into the cited document and stay
in ``raw``. Unknown types are kept too (``raw`` only): nothing the server sends is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..types import ApiBackend, Citation

__all__ = ["citation_from_wire"]

#: type → (source field(s), title field(s), whether start_index/end_index are an answer span,
#: quoted-text field). The first present field of each tuple is used.
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool, str | None]] = {
    # OpenAI (Responses annotations; Chat Completions annotations nest it, see below).
    "url_citation": (("url",), ("title",), True, None),
    "file_citation": (("file_id",), ("filename",), False, None),
    "container_file_citation": (("file_id",), ("filename",), True, None),
    "file_path": (("file_id",), (), False, None),
    # Anthropic citations.
    "web_search_result_location": (("url",), ("title",), False, "cited_text"),
    "search_result_location": (("source",), ("title",), False, "cited_text"),
    "char_location": (("document_title", "file_id"), ("document_title",), False, "cited_text"),
    "page_location": (("document_title", "file_id"), ("document_title",), False, "cited_text"),
    "content_block_location": (
        ("document_title", "file_id"),
        ("document_title",),
        False,
        "cited_text",
    ),
}


def _first_str(obj: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = obj.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def citation_from_wire(raw: Mapping[str, Any], origin: ApiBackend) -> Citation:
    """The :class:`Citation` of one provider object (``raw`` kept as received)."""
    kind = raw.get("type")
    # Chat Completions (OpenRouter): {"type": "url_citation", "url_citation": {...}}.
    fields: Mapping[str, Any] = raw
    nested = raw.get(kind) if isinstance(kind, str) else None
    if isinstance(nested, Mapping):
        fields = nested
    source_names, title_names, has_span, quoted = _FIELDS.get(
        kind if isinstance(kind, str) else "", ((), (), False, None)
    )
    span = None
    start, end = fields.get("start_index"), fields.get("end_index")
    if has_span and type(start) is int and type(end) is int and 0 <= start <= end:
        span = (start, end)
    cited = fields.get(quoted) if quoted else fields.get("content")
    return Citation(
        source=_first_str(fields, source_names),
        title=_first_str(fields, title_names),
        span=span,
        cited_text=cited if isinstance(cited, str) else None,
        raw=dict(raw),
        origin=origin,
    )
