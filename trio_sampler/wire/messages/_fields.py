"""Constants of the Messages protocol shared by the builder and the parser."""

from __future__ import annotations

from ...types import ApiBackend

__all__ = ["BACKEND", "KNOWN_FIELDS", "WEB_SEARCH_TYPE"]

BACKEND = ApiBackend.MESSAGES
WEB_SEARCH_TYPE = "web_search_20250305"

#: Top-level body fields the neutral model expresses.
KNOWN_FIELDS = (
    "model",
    "max_tokens",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "thinking",
    "temperature",
    "top_p",
    "stop_sequences",
    "output_config",
    "metadata",
    "stream",
)
