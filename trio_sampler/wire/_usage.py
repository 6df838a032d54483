"""Token counts a server sent in a form the protocols do not allow.

Every protocol sends a token count as a JSON integer (null where it has none). A string
(``"12"``), a boolean, a list or an object where a count belongs is not read as a
number: the count is taken as 0 and counted in :attr:`Usage.malformed`, so the usage is
flagged (:attr:`UsageViolation.MALFORMED_COUNT`) and never priced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["malformed_counts"]


def malformed_counts(usage: Mapping[Any, Any], prefix: str = "") -> tuple[str, ...]:
    """The names (``prompt_tokens_details.cached_tokens``) of the counts in ``usage``, and
    in its ``*_details`` objects, that are neither null nor a finite number."""
    found: list[str] = []
    for name, value in usage.items():
        if not isinstance(name, str):
            continue
        if name.endswith("_details") and isinstance(value, Mapping):
            found.extend(malformed_counts(value, f"{prefix}{name}."))
        elif name.endswith("_tokens") and value is not None and not _number(value):
            found.append(prefix + name)
    return tuple(found)


def _number(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))
