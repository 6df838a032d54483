"""Structured output in the emulator: the schema a request asks its answer to match, the
check the providers' strict modes make of it, and an answer that matches it.

Where each backend says it:

=================  ===========================================  ==================
backend            field                                        strict
=================  ===========================================  ==================
Chat Completions   ``response_format.json_schema.schema``       ``.strict``
Responses          ``text.format.schema``                       ``.strict``
Messages           ``output_config.format.schema``              always
=================  ===========================================  ==================

A strict schema a strict mode would reject (an object not closed, a keyword outside the
subset, and on OpenAI a property not required) is answered with a 400, as the providers
do. The
answer is the schema's minimal value (every required property, the first enum value, a
word for a string), written with spaces so that it streams in small deltas; a script's
``text`` replaces it, which is how a test scripts malformed output.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import attrs

from ..types._schema import strict_problems
from ._api_error import ApiError
from ._words import WORDS

__all__ = ["OutputRequest", "answer_for", "output_request"]


@attrs.frozen
class OutputRequest:
    """The schema a request's answer must match."""

    schema: Mapping[str, Any]
    strict: bool


def _format(body: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    node: Any = body
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping) and node.get("type") == "json_schema":
        return node
    return None


def output_request(backend: str, body: Mapping[str, Any]) -> OutputRequest | None:
    """The structured output ``body`` asks for (``None``: plain text), checked as the
    backend checks it (raises :class:`~trio_sampler.emulator._validate.ApiError`, as the
    provider answers)."""

    if backend == "chat_completions":
        found = _format(body, ("response_format",))
        holder = found.get("json_schema") if found is not None else None
        where = "response_format"
    elif backend == "responses":
        holder = _format(body, ("text", "format"))
        where = "text.format"
    else:
        holder = _format(body, ("output_config", "format"))
        where = "output_config.format"
    if not isinstance(holder, Mapping):
        return None
    schema = holder.get("schema")
    if not isinstance(schema, Mapping):
        raise ApiError(
            f"Missing required parameter: '{where}.schema'.",
            param=f"{where}.schema",
            code="missing_required_parameter",
        )
    strict = backend == "messages" or holder.get("strict") is True
    if strict:
        problems = strict_problems(schema, "schema", all_required=backend != "messages")
        if problems:
            name = holder.get("name", "output")
            raise ApiError(
                f"Invalid schema for {where} '{name}': {problems[0]}.",
                param=where,
                code="invalid_json_schema",
            )
    return OutputRequest(schema, strict)


def _inline(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """``node`` with its ``$ref`` s to ``#/$defs/...`` replaced by what they name."""
    if isinstance(node, list):
        return [_inline(n, root, depth) for n in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < 8:
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        return _inline(target, root, depth + 1)
    return {k: _inline(v, root, depth) for k, v in node.items() if k != "$defs"}


def answer_for(request: OutputRequest, rng: random.Random) -> str:
    """A JSON answer that matches the request's schema, with spaces between tokens."""

    value = minimal_value(_inline(request.schema, request.schema), rng)
    # json's default separators (", " and ": ") make the word-by-word deltas small.
    return json.dumps(value, ensure_ascii=False)


def minimal_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A minimal JSON value valid for ``schema``: required properties, types, enums."""
    if not isinstance(schema, Mapping) or depth > 8:
        return {}
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return minimal_value(options[0], rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: minimal_value(properties.get(name, {}), rng, depth + 1) for name in names}
    if kind == "array":
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and 0 <= count <= 16 else 0
        return [minimal_value(schema.get("items", {}), rng, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = schema.get("minimum", 1)
        return low if isinstance(low, int) and not isinstance(low, bool) else 1
    if kind == "number":
        low = schema.get("minimum", 1.5)
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 1.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    length = schema.get("minLength", 0)
    word = rng.choice(WORDS)
    if isinstance(length, int) and length > len(word):
        word = (word * (length // len(word) + 1))[:length]
    return word
