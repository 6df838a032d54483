"""Rate-limit headers of every common spelling into one :class:`RateLimitSnapshot`. Pure
(given ``now``).

Read, per dimension (requests, tokens, input tokens, output tokens):

* OpenAI (and Azure, Groq, xAI, OpenAI-compatible servers):
  ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as Go-style durations
  (``"6m0s"``, ``"1s"``, ``"20ms"``, ``"1h2m3.5s"``) or plain seconds;
* Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``, resets as RFC 3339 times;
* the IETF fields: ``ratelimit-limit`` / ``ratelimit-remaining`` / ``ratelimit-reset``
  (older drafts), ``ratelimit: limit=100, remaining=50, reset=30`` and the structured
  ``ratelimit: "policy";r=50;t=30`` with ``ratelimit-policy: "policy";q=100;w=60``;
* gateways' bare ``x-ratelimit-limit`` / ``-remaining`` / ``-reset`` (requests; a reset
  may be seconds, or a Unix time in seconds or milliseconds);
* ``retry-after-ms``, then ``retry-after`` (seconds or an HTTP date).

Absolute times (RFC 3339, HTTP dates, Unix times) become seconds from ``now``, else from
the response's ``Date`` header (so a client whose clock is off still reads the server's
intent); with neither they are dropped, since the wire layer reads no clock. A value that
cannot be read is dropped, never an exception: the parser never raises on header content.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Mapping

from ..types import RateLimitBudget, RateLimitSnapshot
from ._headers import Headers, normalize_headers, parse_http_date, parse_retry_after, reference_time

__all__ = ["parse_duration", "parse_rate_limits"]

_OPENAI_DIMENSIONS = {"requests": "requests", "tokens": "tokens"}
_ANTHROPIC_DIMENSIONS = {
    "requests": "requests",
    "tokens": "tokens",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# Values above these are Unix times, not durations (no real window lasts 30 years).
_UNIX_SECONDS = 1e9
_UNIX_MILLISECONDS = 1e12
_MAX_VALUE_CHARS = 64


def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``"6m0s"``, ``"1.5s"``, ``"20ms"``, ``"1h2m"``) or
    a plain number of seconds; ``None`` when it is neither (or negative, or not finite)."""
    text = text.strip().lower()
    if not text or len(text) > _MAX_VALUE_CHARS:
        return None
    number = _number(text)
    if number is not None:
        return number if number >= 0 else None
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match[1]) * _UNITS[match[2]]
        position = match.end()
    if position != len(text) or position == 0:
        return None
    return total if math.isfinite(total) else None


def _names(dimensions: Mapping[str, str], template: str) -> tuple[tuple[str, str, str, str], ...]:
    """The names read per dimension, ``(dimension, limit, remaining, reset)``, from
    ``template`` (``{0}``: the provider's suffix for the dimension, ``{1}``: the field)."""
    return tuple(
        (
            dimension,
            template.format(suffix, "limit"),
            template.format(suffix, "remaining"),
            template.format(suffix, "reset"),
        )
        for suffix, dimension in dimensions.items()
    )


_OPENAI_NAMES = _names(_OPENAI_DIMENSIONS, "x-ratelimit-{1}-{0}")
_ANTHROPIC_NAMES = _names(_ANTHROPIC_DIMENSIONS, "anthropic-ratelimit-{0}-{1}")
_OPENAI_PREFIX = "x-ratelimit-"
_ANTHROPIC_PREFIX = "anthropic-ratelimit-"
#: Every other header :func:`parse_rate_limits` reads starts with one of these.
_OTHER_PREFIXES = ("ratelimit", "retry-after")

Clock = Callable[[], float | None]


def parse_rate_limits(headers: Headers, *, now: float | None = None) -> RateLimitSnapshot | None:
    """The rate-limit state ``headers`` report, or ``None`` when they report none.

    ``now`` is the Unix time the headers were received (default: their ``Date``, else the
    local clock); it turns absolute reset times into seconds from then.
    """
    return parse_lowered_rate_limits(normalize_headers(headers), now=now)


def parse_lowered_rate_limits(
    lowered: Mapping[str, str], *, now: float | None = None
) -> RateLimitSnapshot | None:
    """:func:`parse_rate_limits` of headers whose names are lower-cased already (a
    repeated header: one value). A family of headers none of whose names is there is
    not looked up, and the ``Date`` header is parsed only for a value that needs it."""
    openai = anthropic = other = False
    for name in lowered:
        if name.startswith(_OPENAI_PREFIX):
            openai = True
        elif name.startswith(_ANTHROPIC_PREFIX):
            anthropic = True
        elif name.startswith(_OTHER_PREFIXES):
            other = True
    if not (openai or anthropic or other):
        return None  # most responses: no header below is there to read
    clock = _clock(lowered, now)
    found: dict[str, RateLimitBudget] = {}
    if openai:
        for dimension, limit, remaining, reset in _OPENAI_NAMES:
            budget = _budget(
                lowered.get(limit), lowered.get(remaining), _reset(lowered.get(reset), clock)
            )
            if budget is not None:
                found[dimension] = budget
    if anthropic:
        for dimension, limit, remaining, reset in _ANTHROPIC_NAMES:
            budget = _budget(
                lowered.get(limit), lowered.get(remaining), _reset_at(lowered.get(reset), clock)
            )
            if budget is not None:
                found.setdefault(dimension, budget)
    if "requests" not in found and (openai or other):
        generic = _generic(lowered, clock)
        if generic is not None:
            found["requests"] = generic
    retry_after = parse_retry_after(lowered, now) if other else None
    if not found and retry_after is None:
        return None
    return RateLimitSnapshot(retry_after=retry_after, **found)


def _clock(lowered: Mapping[str, str], now: float | None) -> Clock:
    """The Unix time absolute values are read against (``now``, else the ``Date``
    header; ``None`` with neither), found the first time one needs it."""
    found: list[float | None] = []

    def read() -> float | None:
        if not found:
            found.append(reference_time(lowered, now))
        return found[0]

    return read


def _generic(headers: Mapping[str, str], clock: Clock) -> RateLimitBudget | None:
    """The IETF fields, then the gateways' bare ``x-ratelimit-*`` (both count requests)."""
    structured = _structured(headers.get("ratelimit"), headers.get("ratelimit-policy"))
    if structured is not None:
        return structured
    for prefix in ("ratelimit-", "x-ratelimit-"):
        budget = _budget(
            headers.get(prefix + "limit"),
            headers.get(prefix + "remaining"),
            _reset(headers.get(prefix + "reset"), clock),
        )
        if budget is not None:
            return budget
    return None


def _structured(field: str | None, policy: str | None) -> RateLimitBudget | None:
    """``RateLimit``: the draft's ``limit=, remaining=, reset=`` list, or the structured
    ``"name";r=;t=`` item (its limit from the ``RateLimit-Policy`` item of that name)."""
    if not field or len(field) > 4 * _MAX_VALUE_CHARS:
        return None
    params = _params(field)
    if "limit" in params or "remaining" in params:
        return _budget(params.get("limit"), params.get("remaining"), _seconds(params.get("reset")))
    if "r" not in params:
        return None
    limit = None
    if policy and len(policy) <= 4 * _MAX_VALUE_CHARS:
        name = field.split(";", 1)[0].strip()
        for item in policy.split(","):
            if item.split(";", 1)[0].strip() == name:
                limit = _params(item).get("q")
                break
    return _budget(limit, params.get("r"), _seconds(params.get("t")))


def _params(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in re.split(r"[;,]", text):
        key, sep, value = part.partition("=")
        if sep:
            out.setdefault(key.strip().lower(), value.strip().strip('"'))
    return out


def _budget(
    limit: str | None, remaining: str | None, reset: float | None
) -> RateLimitBudget | None:
    parsed_limit = _count(limit)
    parsed_remaining = _count(remaining)
    if parsed_limit is None and parsed_remaining is None and reset is None:
        return None
    return RateLimitBudget(parsed_limit, parsed_remaining, reset)


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    number = _number(text.strip())
    if number is None or number < 0:
        return None
    return int(number)


def _number(text: str) -> float | None:
    if not text or len(text) > _MAX_VALUE_CHARS:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _seconds(text: str | None) -> float | None:
    number = None if text is None else _number(text.strip())
    return number if number is not None and number >= 0 else None


def _reset(text: str | None, clock: Clock) -> float | None:
    """A reset that is a duration, or a Unix time in seconds or milliseconds."""
    if text is None:
        return None
    seconds = parse_duration(text)
    if seconds is None:
        return _reset_at(text, clock)
    if seconds >= _UNIX_MILLISECONDS:
        return _until(seconds / 1000, clock)
    if seconds >= _UNIX_SECONDS:
        return _until(seconds, clock)
    return seconds


def _until(when: float, clock: Clock) -> float | None:
    """Seconds from the reference time to ``when``; ``None`` without a reference."""
    reference = clock()
    return None if reference is None else max(when - reference, 0.0)


def _reset_at(text: str | None, clock: Clock) -> float | None:
    """An RFC 3339 time (Anthropic), or an HTTP date, as seconds from ``clock``."""
    if text is None or not text.strip() or len(text) > _MAX_VALUE_CHARS:
        return None
    value = text.strip()
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        at = parse_http_date(value)
        return None if at is None else _until(at, clock)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return _until(when.timestamp(), clock)
