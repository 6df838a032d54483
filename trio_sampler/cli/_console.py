"""Colour for ``trio-sampler chat``'s streamed text: only on a terminal, never with NO_COLOR.

(The demo draws with ``rich``; ``chat`` writes tokens straight to stdout as they come, so
it needs no more than a style around a piece of text.)
"""

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
    """Where ``chat`` writes, and whether it may colour what it writes."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty() and not os.environ.get("NO_COLOR")

    def style(self, text: str, *styles: str) -> str:
        """``text`` wrapped in the SGR codes of ``styles`` (unchanged without colour)."""
        if not self.color or not styles:
            return text
        codes = ";".join(_STYLES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"
