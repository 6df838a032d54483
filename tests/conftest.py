"""Suite-wide checks.

Every test runs with a log handler at DEBUG on the root logger; afterwards no record
(ours, httpx2's, hypercorn's) may contain anything shaped like the fake API keys the suite
uses. The dedicated secret scan over the fault matrix is ``test_secrets.py``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

# The fake keys of this suite all look like provider keys: sk-..., xai-..., sk-ant-...
KEY_SHAPED = re.compile(r"\b(?:sk|xai)-[A-Za-z0-9_-]{6,}")


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def _no_key_in_logs() -> Iterator[None]:
    collector = _Collector()
    root = logging.getLogger()
    previous = root.level
    root.addHandler(collector)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(collector)
        root.setLevel(previous)
    leaks = []
    for record in collector.records:
        try:
            text = record.getMessage()
        except Exception:  # a third-party record with bad args: check the raw parts
            text = f"{record.msg} {record.args}"
        if KEY_SHAPED.search(text):
            leaks.append(f"{record.name}: {text[:200]}")
    assert not leaks, f"API-key-shaped text in log records: {leaks}"
