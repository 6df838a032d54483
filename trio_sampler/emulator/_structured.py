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
    from ._validate import ApiError

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
    from ._reply import minimal_value

    value = minimal_value(_inline(request.schema, request.schema), rng)
    # json's default separators (", " and ": ") make the word-by-word deltas small.
    return json.dumps(value, ensure_ascii=False)
