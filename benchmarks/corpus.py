"""Where the real-stream corpora are: one rule for the test suite and the benchmarks.

The corpora (real response bodies captured from the providers, each folder with a
``manifest.json``) are test data kept beside the project, never inside it. The folders are, in
order:

1. the pytest option ``--real-streams=DIR[:DIR...]`` (the suite's ``conftest.py`` copies it into
   the environment variable below, so everything started from the run agrees);
2. the environment variable ``TRIO_SAMPLER_REAL_STREAMS`` (one folder, or several separated by
   ``os.pathsep``);
3. ``../shared/fixtures/real-streams``, ``real-streams-2`` and ``real-streams-3`` beside the
   project root.

The first folder is *the* corpus of the tests that name one capture (`root`, `manifest`,
`files`); `captures` lists the entries of every folder present, so the differential and
equivalence tests run over all of them. Tests that read a corpus carry the ``real_streams``
marker (``corpus=`` names the folder; the first when absent); a test whose folder is missing is
deselected, one summary line per missing folder, and under ``CI=true`` a missing folder is an
error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_VAR = "TRIO_SAMPLER_REAL_STREAMS"
OPTION = "--real-streams"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = PROJECT_ROOT.parent / "shared" / "fixtures"
NAMES = ("real-streams", "real-streams-2", "real-streams-3")
DEFAULT = FIXTURES / NAMES[0]


def roots() -> list[Path]:
    """Every corpus folder, configured or default (some may not exist: see `available`)."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return [Path(p).expanduser().resolve() for p in configured.split(os.pathsep) if p]
    return [(FIXTURES / name).resolve() for name in NAMES]


def root() -> Path:
    """The first corpus folder: the one tests naming a single capture read."""
    return roots()[0]


def available(folder: Path | None = None) -> bool:
    """Whether a corpus folder (the first by default) is there (its ``manifest.json``)."""
    return ((folder or root()) / "manifest.json").is_file()


def missing() -> list[Path]:
    """The corpus folders that are absent."""
    return [folder for folder in roots() if not available(folder)]


def manifest(backend: str | None = None) -> list[dict[str, Any]]:
    """The first corpus's entries (of one backend if given); empty when it is absent."""
    return _entries(root(), backend)


def captures(backend: str | None = None) -> list[dict[str, Any]]:
    """The entries of every corpus present (of one backend if given).

    Each entry is its manifest object plus ``corpus`` (the folder's name), ``path`` (the
    body's absolute path) and ``id`` (``<corpus>/<file>``: file names repeat across folders).
    """
    return [entry for folder in roots() for entry in _entries(folder, backend)]


def path(relative: str) -> Path:
    """A file of the first corpus, by its manifest name (``"messages/<name>.sse"``)."""
    return root() / relative


def files(pattern: str) -> list[Path]:
    """The first corpus's files matching a glob (``"messages/*.sse"``), sorted."""
    return sorted(root().glob(pattern)) if available() else []


def all_files(pattern: str) -> list[Path]:
    """The files matching a glob in every corpus present, sorted per folder."""
    return [p for folder in roots() if available(folder) for p in sorted(folder.glob(pattern))]


def _entries(folder: Path, backend: str | None) -> list[dict[str, Any]]:
    if not available(folder):
        return []
    entries: list[dict[str, Any]] = json.loads((folder / "manifest.json").read_text())
    return [
        {**e, "corpus": folder.name, "path": folder / e["file"], "id": f"{folder.name}/{e['file']}"}
        for e in entries
        if backend is None or e["backend"] == backend
    ]


def params(backend: str | None = None, skip: frozenset[str] = frozenset()) -> list[Any]:
    """`captures` as pytest parameters: id ``<corpus>/<file>``, marked with their corpus.

    ``skip`` leaves out entries by ``file`` or ``id``.
    """
    import pytest  # only the test suite calls this

    entries = [
        pytest.param(e, id=e["id"], marks=pytest.mark.real_streams(corpus=e["corpus"]))
        for e in captures(backend)
        if e["file"] not in skip and e["id"] not in skip
    ]
    if entries:
        return entries
    # No capture to read: one parameter marked with an absent folder, which the corpus
    # rule deselects (an empty parameter set would be a skip). With every folder there,
    # it runs, and a test given no capture fails.
    gone = missing()
    mark = pytest.mark.real_streams(corpus=gone[0].name) if gone else pytest.mark.real_streams
    return [pytest.param(None, id="no-captures", marks=mark)]
