"""The per-request script (header ``x-emulator-script``): schema, parsing and validation.

A script is a JSON object. Every key is optional; an empty script (or no header) means the
emulator's default, deterministic behaviour. Unknown keys and wrongly typed values are
rejected with a :class:`ScriptError` whose message names the offending key, so a typo in a
test fails loudly (400) instead of silently running the default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import attrs
import orjson

from ..types import TrioSamplerError

__all__ = [
    "HOSTED_TOOL_INPUTS",
    "STOP_VALUES",
    "USAGE_KEYS",
    "ContentFilterFault",
    "ContextLengthFault",
    "DropFault",
    "EmptyFault",
    "Fault",
    "HostedToolScript",
    "MalformedFault",
    "NoTerminatorFault",
    "PingsFault",
    "Script",
    "ScriptError",
    "ScriptToolCall",
    "SilentFault",
    "SlowFirstTokenFault",
    "StallFault",
    "StatusFault",
    "StreamErrorFault",
    "TimeWindow",
    "TokenPacing",
    "merge_scripts",
    "parse_script",
    "script_headers",
]

#: Neutral stop values a script may force.
STOP_VALUES = ("stop", "length", "tool_calls", "content_filter")
#: Usage override keys (the neutral :class:`trio_sampler.types.Usage` names).
USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)

Stop: TypeAlias = Literal["stop", "length", "tool_calls", "content_filter"]


class ScriptError(TrioSamplerError, ValueError):
    """The script header is not valid; the message says what is wrong."""


@attrs.frozen
class ScriptToolCall:
    """A client tool call the reply makes: the tool's name and its arguments object."""

    name: str
    arguments: Mapping[str, Any]


@attrs.frozen
class AfterToolResult:
    """What to answer once the tools have run (``after_tool_result`` in the script)."""

    text: str | None = None
    reasoning: str | None = None


@attrs.frozen
class HostedToolScript:
    """A server-side (hosted) tool the reply runs before its text.

    ``name`` is one of :data:`HOSTED_TOOL_INPUTS`; the other fields are its input (unused
    ones keep their defaults).
    """

    name: str
    #: ``web_search``, ``file_search``: what is searched for.
    query: str = ""
    #: ``web_fetch``: the page fetched.
    url: str = "https://example.com/"
    #: ``code_execution``: the program run.
    code: str = "print(1 + 1)"
    #: ``mcp``: the server label, the tool called and its arguments.
    server: str = "emulated"
    tool: str = "lookup"
    arguments: Mapping[str, Any] = attrs.field(factory=dict)


#: Each scriptable hosted tool and the input keys it takes (with their JSON types).
HOSTED_TOOL_INPUTS: Mapping[str, Mapping[str, type]] = {
    "web_search": {"query": str},
    "web_fetch": {"url": str},
    "code_execution": {"code": str},
    "file_search": {"query": str},
    "mcp": {"server": str, "tool": str, "arguments": dict},
}


@attrs.frozen
class TimeWindow:
    """When a fault is active, on the emulator's clock (seconds since its first request).

    Active while ``start <= t < end``; with ``period``, the window repeats every
    ``period`` seconds (``t`` is taken modulo ``period``), which makes a flapping route.
    """

    start: float = 0.0
    end: float = math.inf
    period: float | None = None

    def contains(self, t: float) -> bool:
        if self.period is not None:
            t %= self.period
        return self.start <= t < self.end


@attrs.frozen
class StatusFault:
    """Answer with an HTTP error status instead of a reply."""

    status: int
    retry_after: float | None = None
    body: Mapping[str, Any] | None = None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class StreamErrorFault:
    """After ``after_events`` stream events, send the backend's in-stream error and end.

    ``after_events=None``: in the middle of the stream.
    """

    after_events: int | None
    error_type: str | None = None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class DropFault:
    """After ``after_events`` stream events (``None``: mid-stream), close the connection
    with no terminator: the stream is cut."""

    after_events: int | None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class StallFault:
    """After ``after_events`` stream events (``None``: mid-stream), go silent for
    ``seconds`` (``None``: until the client goes away), then carry on."""

    after_events: int | None
    seconds: float | None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class MalformedFault:
    """After ``after_events`` stream events (``None``: mid-stream), send one data line
    that is not JSON."""

    after_events: int | None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class EmptyFault:
    """Answer 200 with a well-formed reply that has no content."""

    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class PingsFault:
    """Send ``count`` keep-alives, ``interval_ms`` apart, before any content."""

    count: int
    interval_ms: int = 0
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class SilentFault:
    """Read the request, then send nothing, not even the status line, for ``seconds``
    (``None``: until the client goes away); then answer as otherwise planned."""

    seconds: float | None = None
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class SlowFirstTokenFault:
    """Send the headers at once but the first content delta ``seconds`` after the request
    was read (a non-streaming answer is delayed as much)."""

    seconds: float
    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class NoTerminatorFault:
    """Stream the whole reply but its terminator (Chat's ``[DONE]``, Responses'
    ``response.completed``, Messages' ``message_stop``), then end the body cleanly."""

    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class ContextLengthFault:
    """Answer the backend's real "context length exceeded" 400, whatever the prompt's size."""

    times: int | None = None
    window: TimeWindow | None = None


@attrs.frozen
class ContentFilterFault:
    """Answer with the content filter's stop (Chat ``content_filter``, Responses
    ``incomplete``/``content_filter``, Messages ``refusal`` with ``stop_details``)."""

    times: int | None = None
    window: TimeWindow | None = None


Fault: TypeAlias = (
    StatusFault
    | StreamErrorFault
    | DropFault
    | StallFault
    | MalformedFault
    | EmptyFault
    | PingsFault
    | SilentFault
    | SlowFirstTokenFault
    | NoTerminatorFault
    | ContextLengthFault
    | ContentFilterFault
)


@attrs.frozen
class Script:
    """A parsed script. ``None`` fields mean "the default behaviour"."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ScriptToolCall, ...] | None = None
    hosted_tool: HostedToolScript | None = None
    chunk_chars: int | None = None
    delay_ms: float = 0
    #: Token pacing: the first content delta is sent this long after the request was read
    #: (``None``: no first-token pacing).
    first_token_ms: float | None = None
    #: Token pacing: each later content delta this long after the one before it.
    token_interval_ms: float | None = None
    #: Fill ``max_tokens`` exactly (stop ``length``), like vLLM's ``ignore_eos``.
    ignore_eos: bool = False
    stop: Stop | None = None
    usage: Mapping[str, int] = attrs.field(factory=dict)
    scenario: str | None = None
    faults: tuple[Fault, ...] = ()
    #: Text and reasoning for a request whose last item is a tool result (an agent loop's
    #: second step); when set, such a request gets no tool calls and no hosted tool.
    after_tool_result: AfterToolResult | None = None
    #: ``False``: a request whose last message is the assistant's (a prefill) gets the
    #: 400 newer models answer.
    accepts_prefill: bool = True
    #: The model's context window in tokens: a longer prompt gets the backend's
    #: "context length exceeded" 400.
    context_window: int | None = None
    #: The model declines, with this text: OpenAI's refusal (Chat ``delta.refusal``,
    #: Responses' refusal content part), Anthropic's ``stop_reason: "refusal"`` with it as
    #: the ``stop_details`` explanation. No text, reasoning or tool calls then.
    refusal: str | None = None
    #: The header's exact text: the bench-mode cache key and the implicit scenario.
    source: str = ""


@attrs.frozen
class TokenPacing:
    """When each content delta of a paced stream is due (``trio.current_time()`` values).

    The k-th delta (k from 0) is due at ``arrived + first_token + k * interval``: an
    absolute schedule, so the timing a load generator measures can be compared with the
    programmed one to the millisecond.
    """

    arrived: float
    first_token: float
    interval: float

    @classmethod
    def of(cls, script: Script, arrived: float) -> TokenPacing | None:
        """The pacing ``script`` asks for, counted from ``arrived`` (when the request
        arrived); ``None`` if it asks for none."""
        if script.first_token_ms is None and script.token_interval_ms is None:
            return None
        first = (script.first_token_ms or 0) / 1000
        return cls(arrived, first, (script.token_interval_ms or 0) / 1000)

    def deadline(self, token_number: int) -> float:
        return self.arrived + self.first_token + token_number * self.interval


_SCRIPT_KEYS = frozenset(
    {
        "text",
        "reasoning",
        "tool_calls",
        "hosted_tool",
        "chunk_chars",
        "delay_ms",
        "first_token_ms",
        "token_interval_ms",
        "ignore_eos",
        "stop",
        "usage",
        "scenario",
        "faults",
        "after_tool_result",
        "accepts_prefill",
        "context_window",
        "refusal",
    }
)

# fault type -> (required keys, optional keys); "type", "times" and the window keys
# ("from_s", "until_s", "period_s") are always allowed.
_FAULT_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "status": (frozenset({"status"}), frozenset({"retry_after", "body"})),
    "stream_error": (frozenset(), frozenset({"after_events", "error_type"})),
    "drop": (frozenset(), frozenset({"after_events"})),
    "stall": (frozenset(), frozenset({"after_events", "seconds"})),
    "malformed": (frozenset(), frozenset({"after_events"})),
    "empty": (frozenset(), frozenset()),
    "pings": (frozenset({"count"}), frozenset({"interval_ms"})),
    "silent": (frozenset(), frozenset({"seconds"})),
    "slow_first_token": (frozenset({"seconds"}), frozenset()),
    "no_terminator": (frozenset(), frozenset()),
    "context_length": (frozenset(), frozenset()),
    "content_filter": (frozenset(), frozenset()),
}
_WINDOW_KEYS = frozenset({"from_s", "until_s", "period_s"})


def script_headers(**script: Any) -> dict[str, str]:
    """The ``x-emulator-script`` header carrying ``script`` (keyword arguments of the schema).

    Non-ASCII text is escaped (``\\uXXXX``): header values must be ASCII.
    """
    return {"x-emulator-script": json.dumps(script, separators=(",", ":"), ensure_ascii=True)}


def parse_script(raw: str | bytes | None) -> Script:
    """Parse and validate the ``x-emulator-script`` header value.

    ``None`` or an empty value gives the default :class:`Script`.

    Raises:
        ScriptError: the value is not a JSON object of the documented schema.
    """
    if raw is None:
        return Script()
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not text.strip():
        return Script()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ScriptError(f"x-emulator-script is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ScriptError("x-emulator-script must be a JSON object")
    return script_of(data, text)


def merge_scripts(base: Mapping[str, Any], override: str | bytes | None) -> Script:
    """``base`` (a script object) with the keys of the ``override`` header value on top:
    a key the header gives replaces the base's value (lists such as ``faults`` included).

    Raises:
        ScriptError: either is not a valid script.
    """
    if override is None:
        return script_of(base, orjson.dumps(dict(base)).decode())
    text = override.decode("utf-8", "replace") if isinstance(override, bytes) else override
    if not text.strip():
        return script_of(base, orjson.dumps(dict(base)).decode())
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ScriptError(f"x-emulator-script is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ScriptError("x-emulator-script must be a JSON object")
    merged = {**base, **data}
    return script_of(merged, orjson.dumps(merged).decode())


def script_of(data: Mapping[str, Any], source: str) -> Script:
    """The :class:`Script` of a parsed script object; ``source`` is its text (the cache and
    scenario key).

    Raises:
        ScriptError: ``data`` is not of the documented schema.
    """
    unknown = sorted(set(data) - _SCRIPT_KEYS)
    if unknown:
        raise ScriptError(
            f"x-emulator-script: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(_SCRIPT_KEYS))}"
        )
    stop = _opt(data, "stop", str, "script")
    if stop is not None and stop not in STOP_VALUES:
        raise ScriptError(f"x-emulator-script: stop must be one of {', '.join(STOP_VALUES)}")
    chunk_chars = _opt_int(data, "chunk_chars", "script", minimum=1)
    delay_ms = _opt_number(data, "delay_ms", "script")
    first_token_ms = _opt_number(data, "first_token_ms", "script")
    token_interval_ms = _opt_number(data, "token_interval_ms", "script")
    if delay_ms and (first_token_ms is not None or token_interval_ms is not None):
        raise ScriptError(
            "x-emulator-script: delay_ms paces every event and cannot be combined with "
            "first_token_ms / token_interval_ms (token pacing); use one or the other"
        )
    return Script(
        text=_opt(data, "text", str, "script"),
        reasoning=_opt(data, "reasoning", str, "script"),
        tool_calls=_tool_calls(data.get("tool_calls")),
        hosted_tool=_hosted_tool(data.get("hosted_tool")),
        chunk_chars=chunk_chars,
        delay_ms=delay_ms or 0,
        first_token_ms=first_token_ms,
        token_interval_ms=token_interval_ms,
        ignore_eos=bool(_opt(data, "ignore_eos", bool, "script")),
        stop=stop,  # checked against STOP_VALUES above
        usage=_usage(data.get("usage")),
        scenario=_opt(data, "scenario", str, "script"),
        faults=_faults(data.get("faults")),
        after_tool_result=_after_tool_result(data.get("after_tool_result")),
        accepts_prefill=_opt(data, "accepts_prefill", bool, "script") is not False,
        context_window=_opt_int(data, "context_window", "script", minimum=1),
        refusal=_opt(data, "refusal", str, "script"),
        source=source,
    )


def _after_tool_result(value: Any) -> AfterToolResult | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ScriptError("x-emulator-script: after_tool_result must be an object")
    unknown = sorted(set(value) - {"text", "reasoning"})
    if unknown:
        raise ScriptError(
            f"x-emulator-script: after_tool_result: unknown key(s) {', '.join(unknown)}; "
            "allowed: reasoning, text"
        )
    return AfterToolResult(
        text=_opt(value, "text", str, "after_tool_result"),
        reasoning=_opt(value, "reasoning", str, "after_tool_result"),
    )


def _where(where: str, key: str) -> str:
    return f"x-emulator-script: {key}" if where == "script" else f"x-emulator-script: {where}.{key}"


def _opt(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ScriptError(f"{_where(where, key)} must be a {kind.__name__}")
    return value


def _opt_number(
    data: Mapping[str, Any], key: str, where: str, *, required: bool = False
) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ScriptError(f"{_where(where, key)} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScriptError(f"{_where(where, key)} must be a finite number")
    if value < 0:
        raise ScriptError(f"{_where(where, key)} must not be negative")
    return float(value)


def _opt_int(
    data: Mapping[str, Any], key: str, where: str, *, required: bool = False, minimum: int = 0
) -> int | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ScriptError(f"{_where(where, key)} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScriptError(f"{_where(where, key)} must be an integer")
    if value < minimum:
        raise ScriptError(f"{_where(where, key)} must be >= {minimum}")
    return value


def _tool_calls(value: Any) -> tuple[ScriptToolCall, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ScriptError("x-emulator-script: tool_calls must be a list")
    calls = []
    for index, call in enumerate(value):
        where = f"tool_calls[{index}]"
        if not isinstance(call, dict) or set(call) - {"name", "arguments"}:
            raise ScriptError(
                f"x-emulator-script: {where} must be an object with 'name' and 'arguments'"
            )
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise ScriptError(f"x-emulator-script: {where}.name must be a non-empty string")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ScriptError(f"x-emulator-script: {where}.arguments must be a JSON object")
        calls.append(ScriptToolCall(name, arguments))
    return tuple(calls)


def _hosted_tool(value: Any) -> HostedToolScript | None:
    if value is None:
        return None
    names = ", ".join(HOSTED_TOOL_INPUTS)
    if not isinstance(value, dict) or value.get("name") not in HOSTED_TOOL_INPUTS:
        raise ScriptError(
            f"x-emulator-script: hosted_tool must be an object whose name is one of {names}"
        )
    name = value["name"]
    inputs = HOSTED_TOOL_INPUTS[name]
    extra = set(value) - {"name", *inputs}
    if extra:
        raise ScriptError(
            f"x-emulator-script: hosted_tool {name!r} takes {', '.join(inputs)}; "
            f"remove {', '.join(sorted(extra))}"
        )
    for key, kind in inputs.items():
        if key in value and not isinstance(value[key], kind):
            what = "an object" if kind is dict else "a string"
            raise ScriptError(f"x-emulator-script: hosted_tool.{key} must be {what}")
    fields = {k: v for k, v in value.items() if k != "name"}
    return HostedToolScript(name, **fields)


def _usage(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScriptError("x-emulator-script: usage must be an object")
    out: dict[str, int] = {}
    for key in value:
        if key not in USAGE_KEYS:
            raise ScriptError(
                f"x-emulator-script: usage.{key} is not a usage field; "
                f"allowed: {', '.join(USAGE_KEYS)}"
            )
        checked = _opt_int(value, key, "usage")
        if checked is not None:
            out[key] = checked
    return out


def _faults(value: Any) -> tuple[Fault, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ScriptError("x-emulator-script: faults must be a list")
    return tuple(_fault(index, fault) for index, fault in enumerate(value))


def _fault(index: int, data: Any) -> Fault:
    where = f"faults[{index}]"
    if not isinstance(data, dict):
        raise ScriptError(f"x-emulator-script: {where} must be an object")
    kind = data.get("type")
    if kind not in _FAULT_KEYS:
        raise ScriptError(
            f"x-emulator-script: {where}.type must be one of {', '.join(_FAULT_KEYS)}"
        )
    required, optional = _FAULT_KEYS[kind]
    missing = sorted(required - set(data))
    if missing:
        raise ScriptError(f"x-emulator-script: {where} ({kind}) needs {', '.join(missing)}")
    unknown = sorted(set(data) - required - optional - _WINDOW_KEYS - {"type", "times"})
    if unknown:
        raise ScriptError(f"x-emulator-script: {where} ({kind}) has unknown key(s) {unknown}")
    times = _opt_int(data, "times", where, minimum=1)
    window = _window(data, where)
    if kind == "status":
        status = _opt_int(data, "status", where, required=True, minimum=400)
        assert status is not None
        if status > 599:
            raise ScriptError(f"x-emulator-script: {where}.status must be 400..599")
        body = data.get("body")
        if body is not None and not isinstance(body, dict):
            raise ScriptError(f"x-emulator-script: {where}.body must be a JSON object")
        retry_after = _opt_number(data, "retry_after", where)
        return StatusFault(status, retry_after, body, times, window)
    if kind == "pings":
        count = _opt_int(data, "count", where, required=True)
        interval = _opt_int(data, "interval_ms", where) or 0
        assert count is not None
        return PingsFault(count, interval, times, window)
    if kind == "silent":
        return SilentFault(_opt_number(data, "seconds", where), times, window)
    if kind == "slow_first_token":
        seconds = _opt_number(data, "seconds", where, required=True)
        assert seconds is not None
        return SlowFirstTokenFault(seconds, times, window)
    simple: dict[
        str, type[EmptyFault | NoTerminatorFault | ContextLengthFault | ContentFilterFault]
    ] = {
        "empty": EmptyFault,
        "no_terminator": NoTerminatorFault,
        "context_length": ContextLengthFault,
        "content_filter": ContentFilterFault,
    }
    if kind in simple:
        return simple[kind](times, window)
    after = _opt_int(data, "after_events", where)
    if kind == "stream_error":
        error_type = _opt(data, "error_type", str, where)
        return StreamErrorFault(after, error_type, times, window)
    if kind == "drop":
        return DropFault(after, times, window)
    if kind == "malformed":
        return MalformedFault(after, times, window)
    return StallFault(after, _opt_number(data, "seconds", where), times, window)


def _window(data: Mapping[str, Any], where: str) -> TimeWindow | None:
    if not _WINDOW_KEYS & set(data):
        return None
    start = _opt_number(data, "from_s", where) or 0.0
    end = _opt_number(data, "until_s", where)
    period = _opt_number(data, "period_s", where)
    end = math.inf if end is None else end
    if end <= start:
        raise ScriptError(f"x-emulator-script: {where}.until_s must be greater than from_s")
    if period is not None and (period == 0 or end > period):
        raise ScriptError(
            f"x-emulator-script: {where}.period_s must be positive and at least until_s "
            "(the window repeats every period_s seconds)"
        )
    return TimeWindow(start, end, period)
