"""Suite-wide checks and the real-stream corpus.

The corpora of real captured streams are found by one rule (``benchmarks/corpus.py``): the
``--real-streams=DIR[:DIR...]`` option, else the ``TRIO_SAMPLER_REAL_STREAMS`` environment
variable, else ``../shared/fixtures/real-streams``, ``real-streams-2`` and ``real-streams-3``
beside the project root. Tests that read one carry the ``real_streams`` marker (``corpus=`` names
the folder, the first by default); a test whose folder is absent is deselected (one summary line
per missing folder), and under ``CI=true`` a missing folder is an error.

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
# How many corpus tests this run deselected, per missing folder (for the summary lines).
_DESELECTED = pytest.StashKey[dict[str, int]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        corpus.OPTION,
        metavar="DIR",
        help=(
            f"the real-stream corpora (directories with a manifest.json, separated by "
            f"{os.pathsep!r}); default: ${corpus.ENV_VAR}, else "
            f"../shared/fixtures/{{{','.join(corpus.NAMES)}}} beside the project"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "real_streams(corpus=NAME): reads a real-stream corpus folder, the first by default "
        "(deselected when it is absent)",
    )
    chosen = config.getoption(corpus.OPTION)
    if chosen:
        # Test modules read the corpora at import (their parameters are its files): the
        # environment is the one place every module, and every child process, reads it from.
        os.environ[corpus.ENV_VAR] = os.pathsep.join(
            str(Path(p).expanduser().resolve()) for p in chosen.split(os.pathsep) if p
        )
    if corpus.missing() and os.environ.get("CI", "").lower() == "true":
        raise pytest.UsageError(
            f"no real-stream corpus at {', '.join(map(str, corpus.missing()))} (CI=true "
            f"requires every one): pass {corpus.OPTION}=DIR or set {corpus.ENV_VAR}"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The corpus rule: a test reading an absent corpus folder is deselected."""
    absent: dict[str, list[pytest.Item]] = {folder.name: [] for folder in corpus.missing()}
    if not absent:
        return
    for item in items:
        marks = list(item.iter_markers("real_streams"))
        named = [m.kwargs["corpus"] for m in marks if "corpus" in m.kwargs]
        folder = named[0] if named else corpus.root().name if marks else None
        if folder in absent:
            absent[folder].append(item)
    deselected = {id(item) for skipped in absent.values() for item in skipped}
    if deselected:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in deselected])
        items[:] = [i for i in items if id(i) not in deselected]
    config.stash[_DESELECTED] = {folder: len(skipped) for folder, skipped in absent.items()}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for folder, count in terminalreporter.config.stash.get(_DESELECTED, {}).items():
        terminalreporter.write_line(
            f"real-stream corpus {folder} absent: {count} tests deselected, its captures not "
            f"collected (pass {corpus.OPTION}=DIR[{os.pathsep}DIR...] or set {corpus.ENV_VAR})"
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
