"""What the commands share about bad input: the usage error and argument types."""

from __future__ import annotations

import argparse
import os
from urllib.parse import urlsplit

__all__ = ["UsageError", "api_key_or_fail", "port", "positive_int", "url"]


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 2.

    The message names flags and environment variables, never Python parameters.
    """


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0 to 65535)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def url(text: str) -> str:
    """An argparse type: an absolute ``http://`` or ``https://`` URL with a host."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"not an http:// or https:// URL: {text!r} (e.g. http://127.0.0.1:8080/v1)"
        )
    return text


def api_key_or_fail(env_var: str | None, *, needed: bool) -> None:
    """Fail with the variable to set when a provider needs a key and none is in the environment."""
    if needed and env_var and not os.environ.get(env_var):
        raise UsageError(f"no API key: set the environment variable {env_var}")
