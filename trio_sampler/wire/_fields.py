"""Wire fields the neutral model does not type, kept verbatim where they came.

A gateway speaking Chat Completions adds fields of its own to messages and content parts
(OpenRouter's and Vercel's Anthropic-style ``cache_control``, ``reasoning_details`` on an
assistant message). A parser keeps each such field in a
:class:`~trio_sampler.types.ProviderFields` on the item or part it came on; the builder of
that same backend merges them back into the object it renders (the fields it renders
itself win), and the builders of other backends report them as dropped. The same goes for
an assistant turn's ``audio`` reference (:attr:`~trio_sampler.types.Assistant.audio_id`),
which only Chat Completions carries.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

from ..types._conversation import (
    ApiBackend,
    Assistant,
    ConversationRequest,
    ProviderFields,
    System,
    TextPart,
    User,
)
from ._render import JsonObject, ReportCollector
from ._request import ConversionAction

__all__ = ["merge_own", "note_foreign", "unknown_fields"]


def unknown_fields(
    wire: Mapping[str, Any], known: Collection[str], backend: ApiBackend
) -> ProviderFields | None:
    """The fields of ``wire`` outside ``known``, kept for ``backend`` (``None``: none).

    A null field means "unset" on every backend and is not kept.
    """
    extra = {k: v for k, v in wire.items() if k not in known and v is not None}
    return ProviderFields(backend, extra) if extra else None


def merge_own(wire: JsonObject, fields: ProviderFields | None, backend: ApiBackend) -> JsonObject:
    """``wire`` with the kept fields of ``backend`` added (a rendered field wins)."""
    if fields is not None and fields.backend is backend:
        for key, value in fields.fields.items():
            wire.setdefault(key, copy.deepcopy(value))
    return wire


def note_foreign(
    request: ConversationRequest, backend: ApiBackend, report: ReportCollector
) -> None:
    """Report every kept field, and every audio reference, ``backend`` does not take."""
    for index, item in enumerate(request.items):
        found: list[tuple[str, ProviderFields | None]] = [
            ("message", getattr(item, "provider_fields", None))
        ]
        if isinstance(item, System):
            found.append(("content part", item.part_fields))
        if isinstance(item, User):
            found.extend(
                ("content part", p.provider_fields) for p in item.content if isinstance(p, TextPart)
            )
        for where, fields in found:
            if fields is not None and fields.backend is not backend:
                report.note(
                    index,
                    f"{where} fields {', '.join(sorted(fields.fields))}",
                    ConversionAction.DROPPED,
                    f"kept from {fields.backend.value}; only that backend takes them back",
                )
        if (
            isinstance(item, Assistant)
            and item.audio_id is not None
            and backend is not ApiBackend.CHAT_COMPLETIONS
        ):
            report.note(
                index,
                "audio reference",
                ConversionAction.DROPPED,
                f"{backend.value} has no reference to an earlier audio answer",
            )
