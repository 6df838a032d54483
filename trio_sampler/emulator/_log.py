"""The emulator's request log: what it received, bounded in count and in bytes.

A server a test fleet talks to for days must not keep every body it was sent: the log
holds at most ``max_entries`` requests and ``max_bytes`` of them in all (oldest dropped
first), and of each body at most ``max_body_bytes``. Bodies are kept as the bytes that
arrived (a parsed JSON document costs several times its size) and parsed when read.
Credential headers are stored as ``"REDACTED"``.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Final

import attrs
import orjson

from .._redact import is_credential_name

__all__ = [
    "DEFAULT_MAX_RECORDED_BODY_BYTES",
    "DEFAULT_MAX_RECORDED_BYTES",
    "DEFAULT_MAX_RECORDED_REQUESTS",
    "REDACTED",
    "RequestLog",
    "redact_headers",
]

REDACTED: Final = "REDACTED"
_MIB = 1024 * 1024
DEFAULT_MAX_RECORDED_REQUESTS: Final = 10_000
DEFAULT_MAX_RECORDED_BYTES: Final = 64 * _MIB
DEFAULT_MAX_RECORDED_BODY_BYTES: Final = 1 * _MIB
# What one entry costs beyond its strings (the entry object, its dict when read).
_ENTRY_OVERHEAD = 256


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with every credential value (``authorization``, ``x-api-key``,
    ``x-auth-token``, ``openai-api-key``, cookies, ...: any name that looks like a
    credential) replaced by ``"REDACTED"``."""
    return {k: (REDACTED if is_credential_name(k) else v) for k, v in headers.items()}


@attrs.define
class _Entry:
    scenario: str
    path: str
    headers: dict[str, str]
    #: The body as received, or its first ``max_body_bytes`` when ``truncated``.
    body: bytes
    body_bytes: int
    truncated: bool
    size: int

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {
            "path": self.path,
            "headers": dict(self.headers),
            "body": None if self.truncated else orjson.loads(self.body),
            "body_bytes": self.body_bytes,
            "body_truncated": self.truncated,
        }
        if self.truncated:
            view["body_head"] = self.body.decode("utf-8", "replace")
        return view


class RequestLog:
    """Requests received, oldest first, within ``max_entries`` and ``max_bytes``.

    An entry is charged the bytes of its path, headers and kept body plus a small
    overhead; adding one drops the oldest until both bounds hold again. A body longer than
    ``max_body_bytes`` is kept as its first ``max_body_bytes`` (``body`` is then ``None``
    and ``body_head`` that text).
    """

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_RECORDED_REQUESTS,
        max_bytes: int = DEFAULT_MAX_RECORDED_BYTES,
        max_body_bytes: int = DEFAULT_MAX_RECORDED_BODY_BYTES,
    ) -> None:
        for name, value in (
            ("max_entries", max_entries),
            ("max_bytes", max_bytes),
            ("max_body_bytes", max_body_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RequestLog {name} must be an int >= 0; got {value!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_body_bytes = max_body_bytes
        self._entries: collections.deque[_Entry] = collections.deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """Bytes charged by the entries held now (at most ``max_bytes``)."""
        return self._bytes

    def add(self, scenario: str, path: str, headers: Mapping[str, str], body: bytes) -> None:
        """Record one request (its headers redacted, its body cut to the cap)."""
        truncated = len(body) > self.max_body_bytes
        kept = body[: self.max_body_bytes] if truncated else body
        redacted = redact_headers(headers)
        size = (
            len(kept)
            + len(path)
            + sum(len(k) + len(v) for k, v in redacted.items())
            + _ENTRY_OVERHEAD
        )
        if size > self.max_bytes or self.max_entries == 0:
            return  # could never fit: recording it would only evict everything else
        self._entries.append(_Entry(scenario, path, redacted, kept, len(body), truncated, size))
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._bytes -= self._entries.popleft().size

    def entries(self, scenario: str | None = None) -> list[dict[str, Any]]:
        """The entries for ``scenario`` (all when ``None``), oldest first, as plain data:
        ``path``, ``headers``, ``body`` (parsed JSON, or ``None`` when truncated),
        ``body_bytes``, ``body_truncated`` and, when truncated, ``body_head``."""
        return [e.view() for e in self._entries if scenario is None or e.scenario == scenario]

    def forget(self, scenario: str) -> None:
        """Drop every entry of ``scenario``."""
        kept = [e for e in self._entries if e.scenario != scenario]
        self._entries = collections.deque(kept)
        self._bytes = sum(e.size for e in kept)
