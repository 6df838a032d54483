"""Suite-wide checks and the real-stream corpus.

The corpus of real captured streams is found by one rule (``benchmarks/corpus.py``): the
``--real-streams=DIR`` option, else the ``TRIO_SAMPLER_REAL_STREAMS`` environment variable, else
``../shared/fixtures/real-streams`` beside the project root. Tests that read it carry the
``real_streams`` marker; without the corpus they are deselected (one summary line says so), and
under ``CI=true`` a missing corpus is an error.

Every test runs with a log handler at DEBUG on the root logger; afterwards no record
(ours, httpx2's, hypercorn's) may contain anything shaped like the fake API keys the suite
uses. The dedicated secret scan over the fault matrix is ``test_secrets.py``.

Hypothesis runs with no per-example deadline (the ``trio_sampler`` profile).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from log_capture import LogCapture, capture_root_logs

from benchmarks import corpus
from benchmarks.redis_server import RedisServer, RedisUnavailableError, running_redis

# Property tests judge behaviour, never speed (performance lives in benchmarks/): no
# per-example deadline, which a loaded machine would turn into a flaky failure.
settings.register_profile("trio_sampler", deadline=None)
settings.load_profile("trio_sampler")

# The library's pytest plugin (the ``emulator`` fixture) is opt-in, as for any user.
pytest_plugins = ["trio_sampler.testing"]

# The fake keys of this suite all look like provider keys: sk-..., xai-..., sk-ant-...
KEY_SHAPED = re.compile(r"\b(?:sk|xai)-[A-Za-z0-9_-]{6,}")
# How many corpus tests this run deselected (for the summary line).
_DESELECTED = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        corpus.OPTION,
        metavar="DIR",
        help=(
            f"the real-stream corpus (a directory with manifest.json); default: "
            f"${corpus.ENV_VAR}, else ../shared/fixtures/real-streams beside the project"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_streams: reads the real-stream corpus (deselected when it is absent)"
    )
    chosen = config.getoption(corpus.OPTION)
    if chosen:
        # Test modules read the corpus at import (their parameters are its files): the
        # environment is the one place every module, and every child process, reads it from.
        os.environ[corpus.ENV_VAR] = str(Path(chosen).expanduser().resolve())
    if not corpus.available() and os.environ.get("CI", "").lower() == "true":
        raise pytest.UsageError(
            f"no real-stream corpus at {corpus.root()} (CI=true requires it): pass "
            f"{corpus.OPTION}=DIR or set {corpus.ENV_VAR}"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if corpus.available():
        return
    needing = [item for item in items if item.get_closest_marker("real_streams")]
    if needing:
        config.hook.pytest_deselected(items=needing)
        items[:] = [item for item in items if not item.get_closest_marker("real_streams")]
        config.stash[_DESELECTED] = len(needing)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    count = terminalreporter.config.stash.get(_DESELECTED, 0)
    if count:
        terminalreporter.write_line(
            f"{count} real-stream tests deselected: no corpus at {corpus.root()} "
            f"(pass {corpus.OPTION}=DIR or set {corpus.ENV_VAR})"
        )


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


@pytest.fixture
def debug_logs() -> Iterator[LogCapture]:
    """Every record logged at DEBUG during the test, formatted and raw."""
    with capture_root_logs() as capture:
        yield capture


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server on a Unix socket for the whole session (persistence off).

    Tests that need it fail, never skip, when it cannot start: install the Debian
    package ``redis-server`` (``.ci/run`` does).
    """
    try:
        with running_redis() as server:
            yield server
    except RedisUnavailableError as exc:
        pytest.fail(f"the fleet tests need a local redis-server: {exc}")
