"""Credentials: which names carry one, what a valid one looks like.

Plain functions over strings, no I/O and no imports of ours, so every layer can use them:
the config and the request builders check credential values with :func:`check_credential`,
reprs and logged URLs hide the values of names :func:`is_credential_name` accepts.
"""

from __future__ import annotations

import re

__all__ = ["check_credential", "is_credential_name"]

# Names whose values are credentials (headers, query parameters): hidden in reprs and in
# logged URLs, checked like keys, scrubbed wherever they are echoed. Over-matching only
# hides a harmless value. ``code`` is an OAuth authorization code.
_SENSITIVE_NAME = re.compile(
    r"auth|key|token|secret|cookie|signature|sig$|password|passwd|credential|^code$", re.I
)


def is_credential_name(name: str) -> bool:
    """True when a header or query parameter called ``name`` carries a credential."""
    return _SENSITIVE_NAME.search(name) is not None


def check_credential(value: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` when ``value`` cannot be a credential.

    Refused: leading or trailing whitespace (the commonest copy/paste slip: the server
    would reject the key, or the HTTP layer the header with a message quoting it), control
    characters anywhere (C0, DEL, C1), and characters outside ASCII (a typographic quote or
    dash picked up from a document). The message says where the problem is, never what
    the value is.
    """
    stripped = value.strip()
    if stripped != value:
        end = "starts" if value[:1].isspace() else "ends"
        raise ValueError(
            f"{what} {end} with whitespace (a space, tab or line break copied with it?); remove it"
        )
    for position, char in enumerate(value):
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0:
            raise ValueError(
                f"{what} contains a control character (U+{code:04X}) at position "
                f"{position}; copy the key again"
            )
        if code > 0x7F:
            raise ValueError(
                f"{what} contains the non-ASCII character U+{code:04X} at position "
                f"{position}; credentials are ASCII (a typographic quote or dash copied "
                "from a document?): copy the key again"
            )
