"""Terminal output shared by the interactive commands: live, labelled, readable when piped."""

from __future__ import annotations

import os
import sys
from typing import TextIO

__all__ = ["Console"]

_STYLES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Console:
    """Writes labelled lines for several concurrent streams without garbling them.

    Each stream (``label``) accumulates its text and prints whole lines, prefixed with its
    label; ``flush_label`` prints what is pending. Colours only on a terminal (and never
    with ``NO_COLOR`` set).
    """

    def __init__(self, out: TextIO | None = None, *, width: int = 88) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty() and not os.environ.get("NO_COLOR")
        self.width = width
        self._pending: dict[tuple[str, str], str] = {}
        self._styles: dict[tuple[str, str], tuple[str, ...]] = {}
        self._last_kind: dict[str, str] = {}

    def style(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(_STYLES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def line(self, label: str, text: str, *styles: str) -> None:
        prefix = self.style(f"[{label}]", "bold") if label else ""
        body = self.style(text, *styles)
        self.out.write(f"{prefix} {body}\n" if prefix else f"{body}\n")
        self.out.flush()

    def stream(self, label: str, kind: str, text: str, *styles: str) -> None:
        """Add streamed ``text`` of ``kind`` (e.g. ``thinking``/``answer``) to ``label``."""
        key = (label, kind)
        if self._last_kind.get(label, kind) != kind:
            self.flush_label(label)  # keep the order: what came first is printed first
        self._last_kind[label] = kind
        self._styles[key] = styles
        pending = self._pending.get(key, "") + text
        while "\n" in pending or len(pending) >= self.width:
            cut = pending.find("\n")
            if cut < 0 or cut > self.width:
                cut = pending.rfind(" ", 0, self.width)
                if cut <= 0:
                    cut = self.width
            piece, pending = pending[:cut], pending[cut:].lstrip("\n ")
            self.line(label, f"{kind}: {piece}", *styles)
        self._pending[key] = pending

    def flush_label(self, label: str) -> None:
        for (owner, kind), pending in list(self._pending.items()):
            if owner != label:
                continue
            if pending.strip():
                self.line(label, f"{kind}: {pending}", *self._styles.get((owner, kind), ()))
            del self._pending[(owner, kind)]
        self._last_kind.pop(label, None)
