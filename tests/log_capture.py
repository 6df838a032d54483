"""Every log record the root logger sees at DEBUG, in every form a secret could hide in."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LogCapture", "capture_root_logs"]


class LogCapture(logging.Handler):
    """Keeps each record, its formatted line, its arguments' repr and its whole ``__dict__``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.records: list[logging.LogRecord] = []
        self.texts: list[str] = []
        self.names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.names.add(record.name)
        self.texts += [self.format(record), repr(record.args), repr(record.__dict__)]


@contextmanager
def capture_root_logs() -> Iterator[LogCapture]:
    """A :class:`LogCapture` on the root logger at DEBUG for the block's duration."""
    root = logging.getLogger()
    handler = LogCapture()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
