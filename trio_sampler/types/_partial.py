"""The changes an incremental JSON reader reports (see :class:`trio_sampler.wire.PartialJSON`)."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, TypeAlias

__all__ = ["JSONChange", "JSONChangeKind", "JSONPath"]

#: Where a value sits in the document: object keys and array indexes from the root.
JSONPath: TypeAlias = tuple[str | int, ...]


class JSONChangeKind(enum.Enum):
    """What a :class:`JSONChange` did."""

    #: A value appeared at ``path``: a complete number or ``true``/``false``/``null``; a
    #: string, object or array read whole at once (its ``CLOSE`` follows); or an open
    #: one, ``""``, ``{}`` or ``[]``, that later changes fill.
    SET = "set"
    #: ``value`` (text) was appended to the string at ``path``.
    APPEND = "append"
    #: The string, object or array at ``path`` is complete; ``value`` is it, final.
    CLOSE = "close"


class JSONChange(NamedTuple):
    """One change to the partial document, in the order of the text."""

    kind: JSONChangeKind
    path: JSONPath
    value: Any
