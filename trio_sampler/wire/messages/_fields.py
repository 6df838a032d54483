"""Constants of the Messages protocol shared by the builder and the parser."""

from __future__ import annotations

from ...types import ApiBackend

__all__ = ["BACKEND", "KNOWN_FIELDS"]

BACKEND = ApiBackend.MESSAGES

#: Top-level body fields the neutral model expresses.
KNOWN_FIELDS = (
    "model",
    "max_tokens",
    "system",
    "messages",
    "tools",
    "mcp_servers",
    "tool_choice",
    "thinking",
    "temperature",
    "top_p",
    "stop_sequences",
    "output_config",
    "metadata",
    "stream",
)
