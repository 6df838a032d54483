"""Where the real-stream corpus is: one rule for the test suite and the benchmarks.

The corpus (real response bodies captured from the providers, with a ``manifest.json``) is
test data kept beside the project, never inside it. Its directory is, in order:

1. the pytest option ``--real-streams=DIR`` (the suite's ``conftest.py`` copies it into the
   environment variable below, so everything started from the run agrees);
2. the environment variable ``TRIO_SAMPLER_REAL_STREAMS``;
3. ``../shared/fixtures/real-streams`` beside the project root.

Tests that read the corpus carry the ``real_streams`` marker; when the corpus is absent they are
deselected with one summary line naming the option, and under ``CI=true`` its absence is an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_VAR = "TRIO_SAMPLER_REAL_STREAMS"
OPTION = "--real-streams"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT = PROJECT_ROOT.parent / "shared" / "fixtures" / "real-streams"


def root() -> Path:
    """The corpus directory (it may not exist: see `available`)."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured).expanduser().resolve() if configured else DEFAULT.resolve()


def available() -> bool:
    """Whether the corpus is there (its ``manifest.json`` is the mark)."""
    return (root() / "manifest.json").is_file()


def manifest(backend: str | None = None) -> list[dict[str, Any]]:
    """The manifest's entries (of one backend if given); empty when the corpus is absent."""
    if not available():
        return []
    entries: list[dict[str, Any]] = json.loads((root() / "manifest.json").read_text())
    return [e for e in entries if backend is None or e["backend"] == backend]


def path(relative: str) -> Path:
    """A file of the corpus, by its manifest name (``"messages/<name>.sse"``)."""
    return root() / relative


def files(pattern: str) -> list[Path]:
    """The corpus files matching a glob (``"messages/*.sse"``), sorted; empty when absent."""
    return sorted(root().glob(pattern)) if available() else []
