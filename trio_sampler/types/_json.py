"""Plain-JSON views of events and responses (for the CLI, logs and JSON-lines output)."""

from __future__ import annotations

import enum
from typing import Any

import attrs

__all__ = ["to_jsonable"]


def _value(_inst: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return value


def to_jsonable(value: Any) -> Any:
    """Turn an event, response or any attrs value into JSON-ready data.

    attrs instances become dicts with a leading ``"type"`` key naming their class; enums
    become their values; tuples become lists. Mappings and plain values pass through.
    """
    if attrs.has(type(value)):
        data: dict[str, Any] = {"type": type(value).__name__}
        for field in attrs.fields(type(value)):
            data[field.name] = to_jsonable(getattr(value, field.name))
        return data
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if hasattr(value, "items") and callable(value.items):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value
