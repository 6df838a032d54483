"""Reading response headers: the shapes they come in, and the times they carry.

Shared by the error classifier (:mod:`.errors`) and the rate-limit parser
(:mod:`._ratelimit`), which both read ``Retry-After``. Pure: an absolute time is read
against the ``now`` the caller gives, else the response's own ``Date`` header; with
neither, it cannot be turned into a wait and is dropped (the wire layer reads no clock).
Servers send ``Date`` on every response (RFC 9110, section 6.6.1), and the client passes
``now`` where it classifies a response.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping, Sequence

__all__ = ["Headers", "normalize_headers", "parse_http_date", "parse_retry_after", "reference_time"]

#: Response headers as a mapping or as (name, value) pairs.
Headers = Mapping[str, str] | Sequence[tuple[str, str]]


def normalize_headers(headers: Headers) -> dict[str, str]:
    """Lower-cased names; for a repeated header the first value wins."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in items:
        out.setdefault(name.lower(), value)
    return out


def reference_time(lowered: Mapping[str, str], now: float | None) -> float | None:
    """The Unix time absolute values are read against: ``now``, else the ``Date``
    header; ``None`` when there is neither."""
    return now if now is not None else parse_http_date(lowered.get("date", ""))


def parse_retry_after(headers: Mapping[str, str], now: float | None) -> float | None:
    """Seconds to wait: ``retry-after-ms`` first, then ``retry-after`` as seconds or an
    HTTP date. A date is taken relative to :func:`reference_time` (and dropped without
    one). Negative waits become 0; garbage and non-finite values, None."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms.strip())
        except ValueError:
            ms = math.nan
        if math.isfinite(ms):
            return max(ms / 1000.0, 0.0)
    raw = headers.get("retry-after")
    if raw is None or not raw.strip():
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    when = parse_http_date(raw)
    reference = reference_time(headers, now)
    if when is None or reference is None:
        return None
    return max(when - reference, 0.0)


def parse_http_date(value: str) -> float | None:
    """An HTTP date as a Unix time; ``None`` for anything else."""
    try:
        parsed = email.utils.parsedate_tz(value)
    except (TypeError, ValueError):  # pragma: no cover - parsedate_tz returns None on garbage
        return None
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed))
