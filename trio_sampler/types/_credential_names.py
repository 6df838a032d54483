"""Which names carry credentials, and URLs with their credentials hidden.

A leaf of the types (it imports nothing of the package), so that every layer can hide a
credential in its reprs: the types' reprs use it as much as :mod:`trio_sampler._redact`
does.
"""

from __future__ import annotations

import functools
import re

__all__ = ["is_credential_name", "redact_url"]

# Names whose values are credentials (headers, query parameters): hidden in reprs and in
# logged URLs, checked like keys, scrubbed wherever they are echoed. Over-matching only
# hides a harmless value. ``code`` is an OAuth authorization code.
_SENSITIVE_NAME = re.compile(
    r"auth|key|token|secret|cookie|signature|sig$|password|passwd|credential|^code$", re.I
)
_QUERY_PAIR = re.compile(r"([?&;])([^=&#;]*)=([^&#;]*)")
# ``scheme://user:password@host``: the password (or a lone ``:token``) before the ``@``.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#@:]*):([^/?#@]*)@")


@functools.lru_cache(maxsize=1024)
def is_credential_name(name: str) -> bool:
    """True when a header or query parameter called ``name`` carries a credential.

    Cached: the same few names come with every request, and the case-insensitive search
    is microseconds each time."""
    return _SENSITIVE_NAME.search(name) is not None


def redact_url(url: object) -> str:
    """``url`` as text with its credentials replaced by ``***``: the password of its
    user information (``redis://user:***@host``) and the values of credential query
    parameters (``?key=...`` auth, signed URLs; names :func:`is_credential_name`
    accepts)."""

    def hide(match: re.Match[str]) -> str:
        sep, name, value = match.groups()
        return f"{sep}{name}={'***' if is_credential_name(name) else value}"

    text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", str(url))
    return _QUERY_PAIR.sub(hide, text)
