"""A tool's JSON Schema from its Python signature, and its arguments checked against it.

``def add(a: int, b: int = 0) -> int`` becomes ``{"type": "object", "properties": {"a":
{"type": "integer"}, "b": {"type": "integer", "default": 0}}, "required": ["a"]}``, the
parameter descriptions taken from the docstring (``Args:`` / ``Parameters`` sections or
``:param name:`` lines) or from ``Annotated[T, "text"]``. Annotations the standard library
can say (``str``, ``Literal``, ``Optional``, ``list[...]``, ``dict[str, ...]``, enums,
dataclasses, attrs classes, ``TypedDict``) need no dependency
(``types._schema.object_schema``); a pydantic model (or a type only
pydantic reads) makes the whole signature a pydantic model, pydantic imported then only.
A parameter without an annotation, ``*args`` or ``**kwargs`` leaves no schema to derive:
registration fails saying what to write.

At call time the arguments are checked against the schema (by the pydantic model, when
there is one) and built into the annotations' types, so a dataclass, attrs, enum or
pydantic parameter receives an instance, not a dict.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .types._schema import (
    _MISSING,
    Field,
    NeedsPydantic,
    _pydantic,
    attrs_model,
    convert,
    object_schema,
    schema_errors,
)

__all__ = ["Signature", "signature_of"]

# ``name: text`` / ``name (type): text`` under an ``Args:`` heading (Google style), or
# ``:param name: text`` (Sphinx style), or ``name : type`` then indented text (NumPy).
_GOOGLE = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")
_SPHINX = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.+)$")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:?\s*$")


def parameter_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions found in a docstring, by name."""
    found: dict[str, str] = {}
    in_section = False
    for line in doc.splitlines():
        sphinx = _SPHINX.match(line)
        if sphinx:
            found[sphinx.group(1)] = sphinx.group(2).strip()
            continue
        if _SECTION.match(line):
            in_section = True
            continue
        if in_section:
            google = _GOOGLE.match("  " + line.strip()) if line.startswith(" ") else None
            if google:
                found[google.group(1)] = google.group(2).strip()
            elif line.strip() and not line.startswith(" "):
                in_section = False
    return found


@attrs.frozen
class Signature:
    """What a registered function takes: its JSON Schema and how to turn a call's
    arguments (decoded JSON) into keyword arguments."""

    schema: Mapping[str, Any]
    #: The parameters' annotations, by name (the plain derivation; empty: none).
    annotations: Mapping[str, Any] = attrs.field(factory=dict)
    model: Any = None  # the pydantic model of the parameters, when pydantic derived them
    #: Parameters whose annotation is an attrs class: built from the validated model.
    attrs_classes: Mapping[str, type] = attrs.field(factory=dict)

    def arguments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` validated and converted; raises ``ValueError`` saying what is wrong."""
        if self.model is not None:
            return self._pydantic_arguments(values)
        errors = schema_errors(dict(values), self.schema)
        if errors:
            raise ValueError("; ".join(_where(error) for error in errors[:5]))
        return {
            name: convert(self.annotations[name], value) if name in self.annotations else value
            for name, value in values.items()
        }

    def _pydantic_arguments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        pydantic = _pydantic()
        try:
            validated = self.model.model_validate(dict(values))
        except pydantic.ValidationError as exc:
            raise ValueError(_short(exc)) from exc
        out = {name: getattr(validated, name) for name in values}
        for name, cls in self.attrs_classes.items():
            if name in out and out[name] is not None:
                out[name] = cls(**out[name].model_dump())
        return out


def _where(error: str) -> str:
    """A validation message with the argument's path as the model wrote it (``$.a.b:``
    reads ``a.b:``; the arguments as a whole, ``arguments:``)."""
    if error.startswith("$."):
        return error[2:]
    return "arguments" + error[1:] if error.startswith("$") else error


def _short(exc: Any) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def _missing_annotation(label: str, name: str, kind: str) -> TypeError:
    return TypeError(
        f"no JSON Schema can be derived for tool {label!r}: {kind} {name!r}; annotate every "
        f"parameter (e.g. def {label}({name}: str) -> ...) or pass parameters= (a JSON "
        "Schema object) to register()"
    )


def signature_of(function: Callable[..., Any], name: str | None = None) -> Signature:
    """The schema of ``function``'s parameters (see the module's documentation);
    ``name`` is the tool's, for messages (default: the function's)."""
    label = name or str(getattr(function, "__name__", "tool"))
    fields = _parameters(function, label)
    if not fields:
        return Signature({"type": "object", "properties": {}})
    try:
        schema = object_schema(fields)
    except NeedsPydantic as need:
        return _pydantic_signature(fields, label, need)
    return Signature(schema, {field.key: field.annotation for field in fields})


def _parameters(function: Callable[..., Any], label: str) -> list[Field]:
    """``function``'s parameters as the properties of its arguments object."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{function!r} has no signature to derive a schema from; pass parameters="
        ) from exc
    try:
        hints = inspect.get_annotations(function, eval_str=True)
    except Exception:
        hints = {}
    docs = parameter_docs(inspect.getdoc(function) or "")
    fields: list[Field] = []
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise _missing_annotation(label, name, "it takes *args / **kwargs")
        annotation = hints.get(name, parameter.annotation)
        if annotation is inspect.Parameter.empty:
            raise _missing_annotation(label, name, "no annotation on parameter")
        required = parameter.default is inspect.Parameter.empty
        default = _MISSING if required else parameter.default
        fields.append(Field(name, annotation, required, default, docs.get(name)))
    return fields


def _pydantic_signature(fields: list[Field], label: str, need: NeedsPydantic) -> Signature:
    """The parameters as a pydantic model (a parameter is one, or of a type only pydantic
    reads)."""
    pydantic = _pydantic(need, f"deriving the schema of tool {label!r}")
    model_fields: dict[str, Any] = {}
    attrs_classes: dict[str, type] = {}
    for field in fields:
        annotation = field.annotation
        if isinstance(annotation, type) and attrs.has(annotation):
            attrs_classes[field.key] = annotation
            annotation = attrs_model(annotation)
        default = ... if field.required else field.default
        model_fields[field.key] = (
            annotation,
            pydantic.Field(default, description=field.description),
        )
    try:
        model = pydantic.create_model(
            f"{label}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **model_fields
        )
        schema = model.model_json_schema()
    except (TypeError, pydantic.PydanticUserError) as exc:  # a type pydantic cannot read
        raise TypeError(
            f"no JSON Schema can be derived for tool {label!r} ({str(exc).splitlines()[0]}); "
            "use annotations pydantic reads (str, int, Literal, list, dict, pydantic models, "
            "dataclasses, TypedDict, attrs classes as a whole annotation) or pass parameters="
        ) from exc
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return Signature(schema, model=model, attrs_classes=attrs_classes)
