"""A tool's JSON Schema from its Python signature, and its arguments checked against it.

``def add(a: int, b: int = 0) -> int`` becomes ``{"type": "object", "properties": {"a":
{"type": "integer"}, "b": {"type": "integer", "default": 0}}, "required": ["a"]}``, the
parameter descriptions taken from the docstring (``Args:`` / ``Parameters`` sections or
``:param name:`` lines). Annotations may be anything pydantic reads (``Literal``,
``Optional``, ``list[...]``, ``dict[str, ...]``, pydantic models, dataclasses,
``TypedDict``) and attrs classes; pydantic is imported here only. A parameter without an
annotation, ``*args`` or ``**kwargs`` leaves no schema to derive: registration fails
saying what to write.

At call time the arguments are validated by the same model, so a pydantic model, a
dataclass or an attrs class parameter receives an instance, not a dict.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .types._schema import _pydantic, attrs_model

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
    model: Any = None  # the pydantic model of the parameters (None: no parameters)
    #: Parameters whose annotation is an attrs class: built from the validated mapping.
    attrs_classes: Mapping[str, type] = attrs.field(factory=dict)

    def arguments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` validated and converted; raises ``ValueError`` saying what is wrong."""
        if self.model is None:
            return dict(values)
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
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{function!r} has no signature to derive a schema from; pass parameters="
        ) from exc
    if not parameters:
        return Signature({"type": "object", "properties": {}})
    try:
        hints = inspect.get_annotations(function, eval_str=True)
    except Exception:
        hints = {}
    docs = parameter_docs(inspect.getdoc(function) or "")
    pydantic = _pydantic()
    fields: dict[str, Any] = {}
    attrs_classes: dict[str, type] = {}
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise _missing_annotation(label, name, "it takes *args / **kwargs")
        annotation = hints.get(name, parameter.annotation)
        if annotation is inspect.Parameter.empty:
            raise _missing_annotation(label, name, "no annotation on parameter")
        if isinstance(annotation, type) and attrs.has(annotation):
            attrs_classes[name] = annotation
            annotation = attrs_model(annotation)
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[name] = (annotation, pydantic.Field(default, description=docs.get(name)))
    try:
        model = pydantic.create_model(
            f"{label}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
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
    return Signature(schema, model, attrs_classes)
