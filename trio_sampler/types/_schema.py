"""JSON Schemas from Python types, the strict-mode rules, and validation against a schema.

* :func:`schema_for` derives a schema from a pydantic model, a dataclass, an attrs class,
  a ``TypedDict`` or any annotation pydantic understands (``Literal``, ``Optional``,
  ``list[...]``, ``dict[str, ...]``). pydantic is imported only here, only then: a plain
  JSON Schema needs nothing but this module.
* :func:`strict_schema` lowers a derived schema to the subset the providers' strict modes
  accept (every object closed, every property required), as the official SDKs do;
  :func:`strict_problems` says what a hand-written schema must change to be accepted.
* :func:`schema_errors` checks a decoded JSON value against a schema (the keywords of
  the strict subset, plus the common bounds), returning one message per problem.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import typing
from collections.abc import Mapping
from typing import Annotated, Any

import attrs

__all__ = [
    "adapter_errors",
    "schema_errors",
    "schema_for",
    "strict_problems",
    "strict_schema",
    "subtree_check",
    "subtree_errors",
    "to_python",
]

#: Keywords a strict schema may not use (the providers reject them in strict mode).
_STRICT_UNSUPPORTED = (
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "patternProperties",
)


def _pydantic() -> Any:
    try:
        import pydantic
    except ImportError as exc:  # pragma: no cover - pydantic is in the test environment
        raise TypeError(
            "deriving a JSON Schema from a Python type needs pydantic "
            "(pip install 'trio-sampler[structured]'), or pass a JSON Schema dict instead"
        ) from exc
    return pydantic


def attrs_model(cls: type) -> Any:
    """A pydantic model with the fields of attrs class ``cls`` (pydantic does not read
    attrs classes): the schema is the model's, and a validated model becomes ``cls``."""
    pydantic = _pydantic()
    fields: dict[str, Any] = {}
    for field in attrs.fields(cls):
        annotation = field.type if field.type is not None else Any
        default: Any = ... if field.default is attrs.NOTHING else field.default
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = pydantic.Field(default_factory=field.default.factory)
        fields[field.alias or field.name] = (annotation, default)
    return pydantic.create_model(cls.__name__, __doc__=cls.__doc__, **fields)


def _adapter(target: Any) -> Any:
    """A pydantic ``TypeAdapter`` for ``target`` (an attrs class through
    :func:`attrs_model`)."""
    pydantic = _pydantic()
    if isinstance(target, type) and attrs.has(target):
        return pydantic.TypeAdapter(attrs_model(target))
    return pydantic.TypeAdapter(target)


def schema_for(target: Any) -> dict[str, Any]:
    """The JSON Schema of a Python type (see the module's documentation)."""
    try:
        schema: dict[str, Any] = _adapter(target).json_schema()
    except Exception as exc:
        raise TypeError(
            f"no JSON Schema can be derived from {target!r} ({exc}); use a pydantic model, "
            "a dataclass, an attrs class, a TypedDict or a JSON Schema dict"
        ) from exc
    return schema


def to_python(target: Any, value: Any) -> Any:
    """``value`` (decoded JSON) validated and turned into an instance of ``target``.

    Raises ``ValueError`` naming what does not validate."""
    adapter = _adapter(target)
    pydantic = _pydantic()
    try:
        result = adapter.validate_python(value)
    except pydantic.ValidationError as exc:
        raise ValueError(str(exc)) from exc
    if isinstance(target, type) and attrs.has(target):
        return target(**result.model_dump())
    return result


def subtree_check(target: Any, shape: tuple[str | None, ...]) -> Any | None:
    """A pydantic ``TypeAdapter`` for the part of pydantic model ``target`` at ``shape``
    (a path whose array indexes are ``None``), or ``None`` where no single type is known
    there: ``target`` is not a pydantic model, or the path goes through a union, a field
    it does not have, or anything but a model, a list or a ``dict[str, ...]``. The field's
    constraints (``Field(gt=0)``) are kept; a part that is a model brings its validators."""
    pydantic = _pydantic()
    if not (isinstance(target, type) and issubclass(target, pydantic.BaseModel)):
        return None
    return _subtree_check(target, shape)


@functools.lru_cache(maxsize=256)
def _subtree_check(target: Any, shape: tuple[str | None, ...]) -> Any | None:
    pydantic = _pydantic()
    node: Any = target
    for step in shape:
        base = typing.get_args(node)[0] if typing.get_origin(node) is Annotated else node
        origin, args = typing.get_origin(base), typing.get_args(base)
        if step is None and origin in (list, collections.abc.Sequence) and len(args) == 1:
            node = args[0]
        elif step is not None and origin is dict and len(args) == 2:
            node = args[1]
        elif step is not None and isinstance(base, type) and issubclass(base, pydantic.BaseModel):
            fields: dict[str, Any] = base.model_fields  # type: ignore[attr-defined]
            name = next((n for n, f in fields.items() if (f.alias or n) == step), None)
            if name is None:
                return None
            field = fields[name]
            node = field.annotation
            if field.metadata:
                node = Annotated[(node, *field.metadata)]
        else:
            return None
    try:
        return pydantic.TypeAdapter(node)
    except Exception:  # a type pydantic cannot check alone (an unresolved forward reference)
        return None  # the JSON Schema checks it, as where no single type is known


def adapter_errors(adapter: Any, value: Any, at: str) -> list[str]:
    """What ``adapter`` (from :func:`subtree_check`) finds wrong in ``value``, the value
    at ``at`` (``$.a[1]``), one message per problem, in :func:`schema_errors`' form."""
    pydantic = _pydantic()
    try:
        adapter.validate_python(value)
    except pydantic.ValidationError as exc:
        found = []
        for error in exc.errors(include_url=False):
            where = at + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
            found.append(f"{where}: {error['msg']}")
        return found
    return []


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with every object closed (``additionalProperties: false``) and every
    property required, and without ``default`` (what strict modes accept)."""

    def lower(node: Any) -> Any:
        if isinstance(node, list):
            return [lower(n) for n in node]
        if not isinstance(node, Mapping):
            return node
        out = {k: lower(v) for k, v in node.items() if k != "default"}
        if out.get("type") == "object" or "properties" in out:
            out.setdefault("properties", {})
            out["additionalProperties"] = False
            out["required"] = list(out["properties"])
        return out

    lowered: dict[str, Any] = lower(schema)
    return lowered


def strict_problems(schema: Any, path: str = "schema", *, all_required: bool = True) -> list[str]:
    """What ``schema`` must change for a strict mode to accept it (empty when nothing).

    ``all_required=False`` leaves out the rule that every property is required (OpenAI's;
    Anthropic's structured output asks only for closed objects)."""
    problems: list[str] = []
    if not isinstance(schema, Mapping):
        return problems
    for keyword in _STRICT_UNSUPPORTED:
        if keyword in schema:
            problems.append(f"{path} uses {keyword!r}, which strict mode rejects; remove it")
    properties = schema.get("properties")
    if schema.get("type") == "object" or isinstance(properties, Mapping):
        if schema.get("additionalProperties") is not False:
            problems.append(f'{path} is an object: add "additionalProperties": false')
        names = list(properties) if isinstance(properties, Mapping) else []
        missing = [n for n in names if n not in schema.get("required", ())]
        if missing and all_required:
            problems.append(
                f"{path}: every property must be required in strict mode; add "
                f"{missing} to 'required' (make a property optional with a null type: "
                '"type": ["string", "null"])'
            )
    for key, child in _children(schema, path):
        problems += strict_problems(child, key, all_required=all_required)
    return problems


def _children(schema: Mapping[str, Any], path: str) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for keyword in ("properties", "$defs", "definitions"):
        for name, child in (schema.get(keyword) or {}).items():
            found.append((f"{path}.{keyword}.{name}", child))
    if isinstance(schema.get("items"), Mapping):
        found.append((f"{path}.items", schema["items"]))
    for keyword in ("anyOf", "oneOf", "prefixItems"):
        for n, child in enumerate(schema.get(keyword) or ()):
            found.append((f"{path}.{keyword}[{n}]", child))
    return found


# -- validation -----------------------------------------------------------------------

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """What in ``value`` does not match ``schema``, one message per problem (empty when
    it matches). ``$ref`` is followed within the schema's ``$defs`` / ``definitions``."""
    errors: list[str] = []
    _check(value, schema, schema, "$", errors)
    return errors


def subtree_errors(value: Any, schema: Mapping[str, Any], path: tuple[str | int, ...]) -> list[str]:
    """What in ``value``, the value at ``path`` of a document, does not match the part of
    ``schema`` that describes it (empty when it matches, or when no single part does: a
    path under an ``anyOf`` is left to the whole document's check)."""
    node: Any = schema
    at = "$"
    for step in path:
        node = _resolve(node, schema) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return []
        if isinstance(step, int):
            node = node.get("items")
            at += f"[{step}]"
        else:
            node = (node.get("properties") or {}).get(step)
            at += f".{step}"
    errors: list[str] = []
    _check(value, node, schema, at, errors)
    return errors


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    while isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        node = target
        ref = node.get("$ref")
    return node


def _check(value: Any, node: Any, root: Mapping[str, Any], at: str, errors: list[str]) -> None:
    if not isinstance(node, Mapping):
        return
    node = _resolve(node, root)
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        if not any(_matches(value, option, root) for option in options):
            errors.append(f"{at}: {value!r:.60} matches none of the allowed shapes")
        return
    problem = _kind_problem(value, node)
    if problem is not None:
        errors.append(f"{at}: {problem}")
        return
    if isinstance(value, dict):
        _check_object(value, node, root, at, errors)
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for n, item in enumerate(value):
            _check(item, node["items"], root, f"{at}[{n}]", errors)


def _kind_problem(value: Any, node: Mapping[str, Any]) -> str | None:
    """What is wrong with ``value``'s type, enum or const under ``node`` (``None``: nothing)."""
    kinds = node.get("type")
    if kinds is not None:
        allowed = kinds if isinstance(kinds, list) else [kinds]
        if not any(_TYPES.get(k, lambda v: True)(value) for k in allowed):
            return f"expected {' or '.join(allowed)}, got {_json_type(value)}"
    if "enum" in node and value not in node["enum"]:
        return f"{value!r:.60} is not one of {list(node['enum'])!r:.120}"
    if "const" in node and value != node["const"]:
        return f"expected {node['const']!r:.60}"
    return None


def _matches(value: Any, node: Any, root: Mapping[str, Any]) -> bool:
    errors: list[str] = []
    _check(value, node, root, "$", errors)
    return not errors


def _check_object(
    value: dict[str, Any],
    node: Mapping[str, Any],
    root: Mapping[str, Any],
    at: str,
    errors: list[str],
) -> None:
    properties = node.get("properties") or {}
    for name in node.get("required", ()):
        if name not in value:
            errors.append(f"{at}: missing required property {name!r}")
    for name, item in value.items():
        if name in properties:
            _check(item, properties[name], root, f"{at}.{name}", errors)
        elif node.get("additionalProperties") is False:
            errors.append(f"{at}: unexpected property {name!r}")
        elif isinstance(node.get("additionalProperties"), Mapping):
            _check(item, node["additionalProperties"], root, f"{at}.{name}", errors)


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__
