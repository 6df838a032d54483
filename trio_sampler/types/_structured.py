"""Structured output: what ``ConversationRequest(output=...)`` asks for, and what the
response's answer is read into.

``output`` is a JSON Schema (a dict), a :class:`ResponseSchema`, or a Python type (a
pydantic model, a dataclass, an attrs class, a ``TypedDict``; pydantic is imported only
then). It becomes a :class:`StructuredOutput`: the schema sent (native per backend) and
how the answer is validated. A type's schema is lowered to the strict subset as the
official SDKs do; a hand-written strict schema that a strict mode would reject is refused
at construction with what to change.

At the end of the stream the answer text is parsed and validated once:
``response.output_parsed`` is the value (an instance of the type, or the decoded JSON for
a schema), else ``response.output_error`` says why (:class:`OutputError`, the raw text
kept). A refusal is an ``OutputError`` of kind ``REFUSED``, never a parse error.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from . import _checks
from ._partial_json import PartialJSON
from ._schema import schema_errors, schema_for, strict_problems, strict_schema, to_python

__all__ = [
    "OutputError",
    "OutputErrorKind",
    "ResponseSchema",
    "StructuredOutput",
    "structured_output",
]

_NAME = re.compile(r"[^A-Za-z0-9_-]")


@attrs.frozen
class ResponseSchema:
    """Ask for a JSON answer matching ``schema``."""

    name: str = attrs.field(validator=_checks.text("ResponseSchema.name"))
    schema: Mapping[str, Any] = attrs.field(validator=_checks.json_schema("ResponseSchema.schema"))
    strict: bool = True
    description: str | None = None


class OutputErrorKind(enum.Enum):
    """Why a structured answer has no parsed value."""

    #: The model declined (OpenAI ``refusal``, Anthropic ``stop_reason: refusal``).
    REFUSED = "refused"
    #: The answer is not JSON (or was cut off before its end).
    NOT_JSON = "not_json"
    #: The answer is JSON that does not validate against the schema or the type.
    INVALID = "invalid"


@attrs.frozen
class OutputError:
    """A structured answer that could not be read: ``kind``, what went wrong, and the
    raw text (and the refusal, for ``REFUSED``) kept as received."""

    kind: OutputErrorKind
    message: str
    text: str = ""
    refusal: str | None = None


@attrs.frozen
class StructuredOutput:
    """The answer's schema (``schema.schema`` is what is sent) and the Python type it is
    read into (``None``: the decoded JSON, checked against the schema)."""

    schema: ResponseSchema
    target: Any = None

    def parse(self, text: str) -> Any:
        """``text`` read and validated; raises ``ValueError`` naming the problem."""
        value = json.loads(text)
        return self.validate(value)

    def validate(self, value: Any) -> Any:
        """A decoded value validated (and turned into the target type, if any)."""
        if self.target is not None:
            return to_python(self.target, value)
        errors = schema_errors(value, self.schema.schema)
        if errors:
            raise ValueError("; ".join(errors[:5]))
        return value

    def read(self, text: str, refusal: str | None = None) -> tuple[Any, OutputError | None]:
        """``(value, None)`` for a valid answer, else ``(None, error)``."""
        if refusal is not None:
            return None, OutputError(OutputErrorKind.REFUSED, refusal, text, refusal)
        try:
            value = json.loads(text)
        except ValueError as exc:
            return None, OutputError(OutputErrorKind.NOT_JSON, _not_json(text, exc), text)
        try:
            return self.validate(value), None
        except ValueError as exc:
            return None, OutputError(OutputErrorKind.INVALID, str(exc), text)


def _not_json(text: str, exc: ValueError) -> str:
    """Why ``text`` is not JSON: cut short (a prefix of JSON: the stream or the length
    limit ended it), or ``json``'s message for where it goes wrong."""
    reader = PartialJSON()
    reader.feed(text)
    reader.finish()
    error = reader.error
    if error is not None and error.message.startswith("the text ended"):
        return f"the text ends before its JSON does (cut at character {error.position})"
    return str(exc)


def _name_of(target: Any) -> str:
    name = getattr(target, "__name__", None) or "output"
    return _NAME.sub("_", str(name))[:64] or "output"


def _description(target: Any) -> str | None:
    doc = (getattr(target, "__doc__", None) or "").strip()
    # A dataclass without a docstring gets its signature as one: not a description.
    return None if not doc or doc.startswith(f"{getattr(target, '__name__', '')}(") else doc


def structured_output(value: Any) -> StructuredOutput | None:
    """The :class:`StructuredOutput` for what ``ConversationRequest(output=...)`` was given."""
    if value is None or isinstance(value, StructuredOutput):
        return value
    if isinstance(value, ResponseSchema):
        schema = value
    elif isinstance(value, Mapping):
        schema = ResponseSchema(name=str(value.get("title") or "output"), schema=dict(value))
    else:
        try:
            derived = strict_schema(schema_for(value))
        except TypeError as exc:
            raise TypeError(f"output: {exc}") from exc
        schema = ResponseSchema(
            name=_name_of(value),
            schema=derived,
            description=_description(value),
        )
        return StructuredOutput(schema, value)
    if schema.strict:
        problems = strict_problems(schema.schema)
        if problems:
            raise ValueError(
                "output: the schema is strict and a strict mode would reject it: "
                + "; ".join(problems)
                + " (or pass ResponseSchema(..., strict=False))"
            )
    return StructuredOutput(schema)
