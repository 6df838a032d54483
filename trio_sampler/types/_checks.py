"""Checks of the values a caller writes into a request, run where the request is made.

Each check raises ``TypeError`` (a value of the wrong kind) or ``ValueError`` (the right
kind, out of range) naming the field and saying what to write instead. A value that
passes is one every backend can encode: JSON has no lone surrogates, no integers past 64
bits, no NaN, no sets; HTTP header values are ASCII. Values are echoed only where they
cannot be credentials (numbers); text is described, never quoted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_TOKENS",
    "check_header_map",
    "check_json_value",
    "check_text",
    "elements_of",
    "headers_repr",
    "json_schema",
    "optional_bool",
    "optional_instance",
    "optional_text",
    "optional_tokens",
    "optional_unit_interval",
    "string_map",
    "temperature",
    "text",
    "tool_call_fields",
    "tool_parameters",
]

#: The most tokens a count in a request may say (``max_output_tokens``, thinking budgets):
#: far above any model's output, far below where JSON integers stop being portable.
MAX_TOKENS = 2**31 - 1


def check_text(name: str, value: str) -> None:
    """``value`` is text JSON can carry: no lone surrogate (as ``"\\ud800"`` from
    ``surrogateescape`` decoding or a bad slice of a UTF-16 string)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{name} holds a lone surrogate ({value[exc.start]!a} at character "
                f"{exc.start}), which no JSON request can carry; decode the text with "
                "errors='replace' (or fix the slice that split a character)"
            ) from None


def optional_text(name: str) -> Any:
    """An attrs validator: ``None`` or a ``str`` JSON can carry."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, not a {type(value).__name__}")
        check_text(name, value)

    return check


def optional_bool(name: str) -> Any:
    """An attrs validator: ``None``, ``True`` or ``False``."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be True, False or None, not a {type(value).__name__}")

    return check


def optional_tokens(name: str) -> Any:
    """An attrs validator: ``None`` or a whole number of tokens from 1 to
    :data:`MAX_TOKENS`."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"{name} must be a whole number of tokens (or None), e.g. {name}=1024; "
                f"got a {type(value).__name__}"
            )
        if not 1 <= value <= MAX_TOKENS:
            shown = value if abs(value) < 10**12 else f"a {len(str(abs(value)))}-digit number"
            raise ValueError(
                f"{name} must be from 1 to {MAX_TOKENS} tokens (or None for the default), "
                f"e.g. {name}=1024; got {shown}"
            )

    return check


def _number(name: str, value: Any, example: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{name} must be a number or None, e.g. {example}; got a {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number or None, e.g. {example}; got {value}")
    return float(value)


def temperature(_instance: Any, _attribute: Any, value: Any) -> None:
    """An attrs validator: ``None`` or a finite number from 0 (the backends' own upper
    bounds differ: 2 for OpenAI, 1 for Anthropic; the server says which)."""
    number = _number("temperature", value, "temperature=0.7")
    if number is not None and number < 0:
        raise ValueError(f"temperature must be 0 or more, e.g. temperature=0.7; got {number}")


def optional_unit_interval(name: str) -> Any:
    """An attrs validator: ``None`` or a finite number from 0 to 1."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        number = _number(name, value, f"{name}=0.9")
        if number is not None and not 0 <= number <= 1:
            raise ValueError(f"{name} must be from 0 to 1, e.g. {name}=0.9; got {number}")

    return check


def string_map(name: str) -> Any:
    """An attrs validator: a mapping of ``str`` to ``str``, all text JSON can carry."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(
                f'{name} must be a dict of str to str, e.g. {name}={{"team": "search"}}; '
                f"got a {type(value).__name__}"
            )
        for key, item in value.items():
            if not isinstance(key, str) or not isinstance(item, str):
                raise TypeError(
                    f"{name} maps str to str; an entry is a {type(key).__name__} -> "
                    f"{type(item).__name__} (write str(value))"
                )
            check_text(f"{name} key", key)
            check_text(f"{name}[{key!r}]", item)

    return check


def check_header_map(_instance: Any, _attribute: Any, value: Any) -> None:
    """An attrs validator for ``extra_headers``: ``str`` names that are HTTP tokens and
    ASCII ``str`` values without line breaks (the values are not shown: they may be
    credentials)."""
    if not isinstance(value, Mapping):
        raise TypeError(
            'extra_headers must be a dict of header name to value, e.g. extra_headers={"x-team": '
            f'"search"}}; got a {type(value).__name__}'
        )
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(
                f"extra_headers maps str to str; an entry is a {type(key).__name__} -> "
                f"{type(item).__name__}"
            )
        if not key or not key.isascii() or any(c in key for c in " :\t\r\n\0"):
            raise ValueError(
                f"extra header name {key!a} is not a valid HTTP token (letters, digits and "
                "!#$%&'*+-.^_`|~ only)"
            )
        if not item.isascii():
            raise ValueError(
                f"extra header {key!r} has a non-ASCII value; HTTP header values are ASCII: "
                "percent-encode it (urllib.parse.quote) or send it in the body"
            )
        if any(c in item for c in "\r\n\0"):
            raise ValueError(
                f"extra header {key!r} has a value containing CR, LF or NUL, which would "
                "split the request (header injection); remove the line breaks"
            )


def check_json_value(name: str, value: Any, depth: int = 0) -> None:
    """``value`` is JSON every backend can send: dicts with ``str`` keys, lists and
    tuples, ``str`` without lone surrogates, 64-bit integers, finite floats, booleans and
    ``None``; nested at most 64 deep. Raises naming the path inside ``name``."""
    if depth > 64:
        raise ValueError(f"{name} is nested more than 64 levels deep; flatten it")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        check_text(name, value)
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise ValueError(f"{name} is an integer past 64 bits, which JSON cannot carry")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} is {value}, which JSON cannot carry; write a finite number")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{name} has a key of type {type(key).__name__}; JSON object keys are str"
                )
            check_json_value(f"{name}[{key!r}]", item, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_json_value(f"{name}[{index}]", item, depth + 1)
    else:
        hint = "; write a sorted list" if isinstance(value, set | frozenset) else ""
        raise TypeError(
            f"{name} is of type {type(value).__name__}, which JSON cannot carry (dicts, "
            f"lists, str, int, float, bool and None only){hint}"
        )


def headers_repr(value: Mapping[str, str]) -> str:
    """A request's own headers in a repr: the names, every value shown as ``'***'`` (a
    per-request header is as often a credential as not: a gateway key, a signed token)."""
    return "{" + ", ".join(f"{name!r}: '***'" for name in value) + "}"


def tool_parameters(instance: Any, _attribute: Any, value: Any) -> None:
    """An attrs validator for ``ToolSpec.parameters``: a JSON Schema object (a dict)
    every backend can encode."""
    name = f"ToolSpec({getattr(instance, 'name', '?')!r}).parameters"
    if not isinstance(value, Mapping):
        raise TypeError(
            f'{name} must be a JSON Schema object (a dict), e.g. {{"type": "object", '
            f'"properties": {{"city": {{"type": "string"}}}}}}; got a {type(value).__name__}'
        )
    check_json_value(name, value)


def text(name: str) -> Any:
    """An attrs validator: a ``str`` JSON can carry."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not a {type(value).__name__}")
        check_text(name, value)

    return check


def elements_of(name: str, kind: type, example: str) -> Any:
    """An attrs validator: a tuple whose elements are all ``kind``."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        for index, element in enumerate(value):
            if not isinstance(element, kind):
                raise TypeError(
                    f"{name}[{index}] is of type {type(element).__name__}; e.g. {name}={example}"
                )

    return check


def optional_instance(name: str, kind: type, example: str) -> Any:
    """An attrs validator: ``None`` or a ``kind``."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{name} must be a {kind.__name__} or None, e.g. {name}={example}; got a "
                f"{type(value).__name__}"
            )

    return check


def json_schema(name: str) -> Any:
    """An attrs validator: a JSON Schema object (a dict) every backend can encode."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(
                f'{name} must be a JSON Schema object (a dict), e.g. {{"type": "object"}}; '
                f"got a {type(value).__name__}"
            )
        check_json_value(name, value)

    return check


def tool_call_fields(_instance: Any, _attribute: Any, items: Any) -> None:
    """An attrs validator for a request's ``items``: the tool calls of its assistant turns
    have ``str`` ids, names and arguments (checked here rather than by ``ToolCall``
    itself, which the stream transforms build from what the server sent)."""
    for index, item in enumerate(items):
        for number, call in enumerate(getattr(item, "tool_calls", ())):
            for field in ("id", "name", "arguments"):
                value = getattr(call, field, None)
                if not isinstance(value, str):
                    raise TypeError(
                        f"items[{index}].tool_calls[{number}].{field} must be a str, not a "
                        f'{type(value).__name__}; e.g. ToolCall("call_1", "lookup", '
                        '\'{"city": "Paris"}\')'
                    )
            caller = getattr(call, "caller", None)
            where = f"items[{index}].tool_calls[{number}].caller"
            if caller is not None and not isinstance(caller, Mapping):
                raise TypeError(
                    f"{where} must be the caller object the server sent (a dict) or None, "
                    f"not a {type(caller).__name__}"
                )
            check_json_value(where, caller)


#: The lifetimes Anthropic takes for a cache entry (``cache_control.ttl``).
CACHE_TTLS = ("5m", "1h")


def cache_breakpoint(_instance: Any, attribute: Any, value: Any) -> None:
    """An attrs validator for ``cache_breakpoint``: ``True`` / ``False``, or one of the
    lifetimes Anthropic accepts."""
    if isinstance(value, bool) or value in CACHE_TTLS:
        return
    shown = repr(value) if isinstance(value, str) and len(value) <= 8 else type(value).__name__
    raise ValueError(
        f"{attribute.name} must be True, False or a cache lifetime ({', '.join(CACHE_TTLS)}), "
        f'e.g. cache_breakpoint=True or cache_breakpoint="1h"; got {shown}'
    )
