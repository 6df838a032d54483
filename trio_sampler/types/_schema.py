"""JSON Schemas from Python types, the strict-mode rules, and validation against a schema.

* :func:`schema_for` derives a schema from a Python type. What the standard library can
  say is read here, with no dependency: ``str``, ``int``, ``float``, ``bool``, ``None``,
  ``Any``, ``Literal``, ``Optional`` / ``Union``, ``list`` / ``Sequence`` / ``tuple`` /
  ``set``, ``dict[str, ...]`` / ``Mapping[str, ...]``, ``enum.Enum`` subclasses,
  dataclasses, attrs classes and ``TypedDict`` (``Annotated[T, "text"]`` and a class's
  docstring are descriptions), in the shapes pydantic gives them. pydantic is imported
  only for a pydantic model, or a type only pydantic reads (``datetime``, ...), and only
  then (the ``structured`` extra).
* :func:`to_python` turns decoded JSON into the type: checked against the derived schema,
  then built into dataclass, attrs and enum instances (a ``TypedDict`` is a dict).
* :func:`strict_schema` lowers a derived schema to the subset the providers' strict modes
  accept (every object closed, every property required), as the official SDKs do;
  :func:`strict_problems` says what a hand-written schema must change to be accepted.
* :func:`schema_errors` checks a decoded JSON value against a schema (the keywords of
  the strict subset, plus the common bounds), returning one message per problem.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union

import attrs

from ._errors import TrioSamplerError

__all__ = [
    "NeedsPydantic",
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

_EXTRA = "pip install 'trio-sampler[structured]'"
_PLAIN_TYPES = (
    "str, int, float, bool, None, Any, Literal, Optional, list, tuple, dict[str, ...], "
    "an Enum, a dataclass, an attrs class or a TypedDict"
)


class NeedsPydantic(TrioSamplerError):
    """``target`` is not read by the plain derivation: a pydantic model (``model``), or a
    type only pydantic reads."""

    def __init__(self, target: Any, *, model: bool) -> None:
        super().__init__(target)
        self.target = target
        self.model = model

    def without_pydantic(self, where: str) -> TypeError:
        """The error for when pydantic is not installed; ``where`` names what was derived."""
        if self.model:
            return TypeError(f"{where}: {self.target!r} is a pydantic model, which needs {_EXTRA}")
        return TypeError(
            f"{where}: no JSON Schema can be derived from {self.target!r} without pydantic; "
            f"use {_PLAIN_TYPES} (e.g. str for a date, with the format in a description), "
            f"or {_EXTRA} for the types pydantic reads"
        )


def _pydantic(need: NeedsPydantic | None = None, where: str = "") -> Any:
    try:
        import pydantic
    except ImportError as exc:
        if need is not None:
            raise need.without_pydantic(where) from exc
        raise TypeError(
            f"this needs pydantic ({_EXTRA}), or pass a JSON Schema dict instead"
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


def _adapter(target: Any, need: NeedsPydantic) -> Any:
    """A pydantic ``TypeAdapter`` for ``target`` (an attrs class through
    :func:`attrs_model`)."""
    pydantic = _pydantic(need, f"deriving a JSON Schema from {target!r}")
    if isinstance(target, type) and attrs.has(target):
        return pydantic.TypeAdapter(attrs_model(target))
    return pydantic.TypeAdapter(target)


def schema_for(target: Any) -> dict[str, Any]:
    """The JSON Schema of a Python type (see the module's documentation)."""
    try:
        return plain_schema(target)
    except NeedsPydantic as need:
        pending = need
    _pydantic(pending, f"deriving a JSON Schema from {target!r}")  # names the extra
    try:
        schema: dict[str, Any] = _adapter(target, pending).json_schema()
    except Exception as exc:  # pydantic's own errors for a type it cannot read
        raise TypeError(
            f"no JSON Schema can be derived from {target!r} ({exc}); use {_PLAIN_TYPES}, "
            "a pydantic model, or a JSON Schema dict"
        ) from exc
    return schema


def to_python(target: Any, value: Any) -> Any:
    """``value`` (decoded JSON) validated and turned into an instance of ``target``.

    Raises ``ValueError`` naming what does not validate."""
    try:
        schema = _checked_schema(target)
    except NeedsPydantic as need:
        return _pydantic_to_python(target, value, need)
    errors = schema_errors(value, schema)
    if errors:
        raise ValueError("; ".join(errors[:5]))
    return convert(target, value)


def _pydantic_to_python(target: Any, value: Any, need: NeedsPydantic) -> Any:
    adapter = _adapter(target, need)
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
    if not _is_pydantic(target):  # asked without importing pydantic: plain types need none
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


# -- the plain derivation ---------------------------------------------------------------

_MISSING: Any = object()
_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    None: {"type": "null"},
    type(None): {"type": "null"},
    Any: {},
}
_ARRAYS: tuple[type, ...] = (list, tuple, set, frozenset, collections.abc.Iterable)
_ARRAYS += (collections.abc.Sequence, collections.abc.MutableSequence)
_ARRAYS += (collections.abc.Set, collections.abc.MutableSet)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_KEY_MARKS = {"Required", "NotRequired", "ReadOnly"}  # a TypedDict key's wrappers
_JSON_TYPE_OF = {str: "string", bool: "boolean", int: "integer", float: "number"}


@attrs.frozen
class Field:
    """One property of an object: a class's field or a function's parameter."""

    key: str  # the JSON property, and the keyword the class or function takes
    annotation: Any
    required: bool = True
    default: Any = _MISSING  # the Python default, shown in the schema when JSON can say it
    description: str | None = None


def _origin(target: Any) -> Any:
    return typing.get_origin(target) or target


def _is_pydantic(target: Any) -> bool:
    # Without importing pydantic: a type can only be pydantic's when pydantic is loaded.
    return isinstance(target, type) and hasattr(target, "__pydantic_fields__")


def _is_scalar(target: Any) -> bool:
    try:
        return target in _SCALARS
    except TypeError:  # unhashable: not a type
        return False


def _is_typeddict(target: Any) -> bool:
    # typing's and typing_extensions' alike (the latter is not one to typing.is_typeddict).
    return (
        isinstance(target, type)
        and issubclass(target, dict)
        and hasattr(target, "__required_keys__")
        and hasattr(target, "__total__")
    )


def _is_enum(target: Any) -> bool:
    return isinstance(target, type) and issubclass(target, enum.Enum)


def _is_class_with_fields(target: Any) -> bool:
    if not isinstance(target, type):
        return False
    return dataclasses.is_dataclass(target) or attrs.has(target) or _is_typeddict(target)


def _unannotated(target: Any) -> tuple[Any, str | None]:
    """``Annotated[T, ...]`` as ``T`` and its description (text metadata); metadata only
    pydantic reads (``Field(...)``, ``annotated_types``) needs pydantic."""
    description = None
    while typing.get_origin(target) is Annotated:
        for meta in target.__metadata__:
            if isinstance(meta, str):
                description = meta
            elif type(meta).__module__.split(".")[0] in ("pydantic", "annotated_types"):
                raise NeedsPydantic(target, model=False)
        target = target.__origin__
    return target, description


def _explicit_doc(cls: type) -> str | None:
    doc = cls.__doc__
    if not doc or (dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}(")):
        return None  # none, or the one dataclasses generates from the signature
    return inspect.cleandoc(doc)


def _json_default(value: Any) -> Any:
    """``value`` as JSON (``_MISSING`` when JSON cannot say it)."""

    def plain(item: Any) -> Any:
        if isinstance(item, enum.Enum):
            return item.value
        if attrs.has(type(item)):
            return attrs.asdict(item)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return dataclasses.asdict(item)
        if isinstance(item, set | frozenset):
            return list(item)
        raise TypeError(item)

    try:
        return json.loads(json.dumps(value, default=plain))
    except (TypeError, ValueError):
        return _MISSING


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # an unresolvable forward reference: the raw annotations
        return dict(getattr(cls, "__annotations__", {}))


def fields_of(cls: type) -> list[Field]:
    """The fields of a dataclass, an attrs class or a ``TypedDict``, as ``__init__`` (or
    the dict) takes them."""
    hints = _hints(cls)
    if _is_typeddict(cls):
        return [_typeddict_field(cls, key, hint) for key, hint in hints.items()]
    if attrs.has(cls):
        return [
            _field(f.alias or f.name, hints.get(f.name, f.type or Any), f.default, f.default)
            for f in attrs.fields(cls)
            if f.init
        ]
    return [
        _field(f.name, hints.get(f.name, f.type), f.default, f.default_factory)
        for f in dataclasses.fields(cls)
        if f.init
    ]


def _field(key: str, annotation: Any, default: Any, factory: Any) -> Field:
    nothing = (dataclasses.MISSING, attrs.NOTHING)
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default, factory = attrs.NOTHING, default
    required = default in nothing and factory in nothing
    return Field(key, annotation, required, _MISSING if default in nothing else default)


def _typeddict_field(cls: Any, key: str, annotation: Any) -> Field:
    required = key in getattr(cls, "__required_keys__", ())
    while getattr(_origin(annotation), "_name", None) in _KEY_MARKS:
        required = _origin(annotation)._name != "NotRequired" and (
            required or _origin(annotation)._name == "Required"
        )
        annotation = typing.get_args(annotation)[0]
    return Field(key, annotation, required)


@attrs.define
class _Deriver:
    """One derivation: the named schemas (``$defs``) of the classes met so far."""

    defs: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    names: dict[Any, str] = attrs.field(factory=dict)

    def schema(self, target: Any) -> dict[str, Any]:
        target, description = _unannotated(target)
        for applies, derive in _DERIVATIONS:
            if applies(target):
                node = derive(self, target)
                break
        else:
            raise NeedsPydantic(target, model=False)
        return node if description is None else {**node, "description": description}

    def object(self, fields: list[Field]) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for field in fields:
            node = dict(self.schema(field.annotation))
            shown = _MISSING if field.default is _MISSING else _json_default(field.default)
            if shown is not _MISSING:
                node["default"] = shown
            if field.description is not None:
                node["description"] = field.description
            properties[field.key] = node
        node = {"type": "object", "properties": properties}
        required = [field.key for field in fields if field.required]
        return {**node, "required": required} if required else node

    def named(self, cls: type, build: Callable[[type], dict[str, Any]]) -> dict[str, Any]:
        """A ``$ref`` to ``cls``'s schema in ``$defs`` (built once; recursion allowed)."""
        name = self.names.get(cls)
        if name is None:
            name = cls.__name__
            if name in self.defs:  # two classes of one name
                name = f"{cls.__module__}__{cls.__qualname__}".replace(".", "__")
            self.names[cls] = name
            self.defs[name] = {}
            self.defs[name] = build(cls)
        return {"$ref": f"#/$defs/{name}"}

    def finish(self, root: dict[str, Any]) -> dict[str, Any]:
        """``root`` with the ``$defs`` it refers to; a lone reference to a class that
        does not refer to itself is inlined, as pydantic does."""
        ref = root.get("$ref", "")
        name = ref.removeprefix("#/$defs/")
        if len(root) == 1 and name in self.defs and f'"{ref}"' not in json.dumps(self.defs):
            root = self.defs.pop(name)
        return {**root, "$defs": self.defs} if self.defs else root


def _class_schema(deriver: _Deriver, cls: type) -> dict[str, Any]:
    def build(cls: type) -> dict[str, Any]:
        node = {**deriver.object(fields_of(cls)), "title": cls.__name__}
        doc = _explicit_doc(cls)
        return node if doc is None else {**node, "description": doc}

    return deriver.named(cls, build)


def _enum_schema(deriver: _Deriver, cls: type) -> dict[str, Any]:
    def build(cls: Any) -> dict[str, Any]:
        values = [member.value for member in cls]
        node = {"enum": values, "title": cls.__name__, **_common_type(values)}
        doc = _explicit_doc(cls)
        return node if doc is None else {**node, "description": doc}

    return deriver.named(cls, build)


def _common_type(values: list[Any]) -> dict[str, Any]:
    """``{"type": ...}`` when every value has the same JSON type, else nothing."""
    kinds = {"null" if v is None else _JSON_TYPE_OF.get(type(v), "?") for v in values}
    return {"type": kinds.pop()} if len(kinds) == 1 and "?" not in kinds else {}


def _literal_schema(deriver: _Deriver, target: Any) -> dict[str, Any]:
    values = [v.value if isinstance(v, enum.Enum) else v for v in typing.get_args(target)]
    shape = {"const": values[0]} if len(values) == 1 else {"enum": values}
    return {**shape, **_common_type(values)}


def _union_schema(deriver: _Deriver, target: Any) -> dict[str, Any]:
    return {"anyOf": [deriver.schema(arm) for arm in typing.get_args(target)]}


def _array_schema(deriver: _Deriver, target: Any) -> dict[str, Any]:
    origin, args = _origin(target), typing.get_args(target)
    node: dict[str, Any] = {"type": "array"}
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [deriver.schema(arg) for arg in args]
        node.update(prefixItems=items, minItems=len(items), maxItems=len(items))
        return node
    node["items"] = deriver.schema(args[0]) if args else {}
    if issubclass(origin, collections.abc.Set):
        node["uniqueItems"] = True
    return node


def _object_schema(deriver: _Deriver, target: Any) -> dict[str, Any]:
    key, value = typing.get_args(target) or (str, Any)
    if key not in (str, Any):
        raise TypeError(
            f"no JSON Schema can be derived from {target!r}: JSON object keys are strings; "
            "use dict[str, ...] or a list of pairs"
        )
    values = deriver.schema(value)
    return {"type": "object", "additionalProperties": values or True}


def _refuse_pydantic(deriver: _Deriver, target: Any) -> dict[str, Any]:
    raise NeedsPydantic(target, model=True)


_UNIONS = (Union, types.UnionType)

#: Which derivation reads a type: the first row that applies.
_DERIVATIONS: tuple[tuple[Callable[[Any], bool], Callable[[_Deriver, Any], dict[str, Any]]], ...]
_DERIVATIONS = (
    (_is_pydantic, _refuse_pydantic),
    (_is_enum, _enum_schema),
    (_is_class_with_fields, _class_schema),
    (_is_scalar, lambda deriver, t: dict(_SCALARS[t])),
    (lambda t: typing.get_origin(t) is Literal, _literal_schema),
    (lambda t: typing.get_origin(t) in _UNIONS, _union_schema),
    (lambda t: isinstance(_origin(t), type) and _origin(t) in _ARRAYS, _array_schema),
    (lambda t: isinstance(_origin(t), type) and _origin(t) in _MAPPINGS, _object_schema),
)


def plain_schema(target: Any) -> dict[str, Any]:
    """The JSON Schema of ``target`` without pydantic; raises :class:`NeedsPydantic` for
    a type only pydantic reads."""
    deriver = _Deriver()
    return deriver.finish(deriver.schema(target))


def _checked_schema(target: Any) -> Mapping[str, Any]:
    """:func:`plain_schema`, kept for the types values are read into (not to be changed)."""
    try:
        return _schema_cache(target)
    except TypeError:  # an unhashable annotation: derived each time
        return plain_schema(target)


_schema_cache = functools.lru_cache(maxsize=256)(plain_schema)


def object_schema(fields: list[Field]) -> dict[str, Any]:
    """The closed object schema of ``fields`` (a function's parameters), without pydantic;
    raises :class:`NeedsPydantic` as :func:`plain_schema` does."""
    deriver = _Deriver()
    return deriver.finish({**deriver.object(fields), "additionalProperties": False})


# -- decoded JSON into Python values ---------------------------------------------------


def convert(target: Any, value: Any) -> Any:
    """``value``, decoded JSON already checked against ``target``'s plain schema, built
    into ``target``: dataclass, attrs and enum instances, tuples and sets."""
    target, _ = _unannotated(target)
    for applies, build in _CONVERSIONS:
        if applies(target):
            return build(target, value)
    return value


def _convert_fields(cls: Any, value: Any) -> Any:
    fields = {field.key: field.annotation for field in fields_of(cls)}
    given = {key: convert(fields[key], item) for key, item in value.items() if key in fields}
    return given if _is_typeddict(cls) else cls(**given)


def _convert_union(target: Any, value: Any) -> Any:
    for arm in typing.get_args(target):
        if not schema_errors(value, _checked_schema(arm)):
            return convert(arm, value)
    return value


def _convert_array(target: Any, value: Any) -> Any:
    origin, args = _origin(target), typing.get_args(target)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return tuple(convert(arg, item) for arg, item in zip(args, value, strict=False))
    items = [convert(args[0], item) for item in value] if args else list(value)
    if origin in (tuple, set, frozenset):
        return origin(items)
    return set(items) if issubclass(origin, collections.abc.Set) else items


def _convert_mapping(target: Any, value: Any) -> Any:
    args = typing.get_args(target)
    return {key: convert(args[1], item) for key, item in value.items()} if args else value


def _convert_number(target: Any, value: Any) -> Any:
    return target(value) if type(value) in (int, float) else value


#: How a checked value is built into a type: the first row that applies (else as is).
_CONVERSIONS: tuple[tuple[Callable[[Any], bool], Callable[[Any, Any], Any]], ...] = (
    (_is_enum, lambda cls, value: cls(value)),
    (_is_class_with_fields, _convert_fields),
    (lambda t: t in (int, float), _convert_number),
    (lambda t: typing.get_origin(t) in _UNIONS, _convert_union),
    (lambda t: isinstance(_origin(t), type) and _origin(t) in _ARRAYS, _convert_array),
    (lambda t: isinstance(_origin(t), type) and _origin(t) in _MAPPINGS, _convert_mapping),
)


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
