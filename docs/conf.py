"""Sphinx configuration for trio_sampler's documentation."""

from __future__ import annotations

import sys
from pathlib import Path

# The benchmark charts are drawn from the committed results JSON at every build.
_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
from benchmarks import plot as _plot  # noqa: E402

_plot.render(_ROOT / "benchmarks" / "results", _ROOT / "docs" / "_generated")

project = "trio_sampler"
author = "trio_sampler developers"
copyright = "2026, trio_sampler developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "_templates"]
html_theme = "furo"
html_title = "trio_sampler"
# The API reference: one page per public name (docs/api.rst), generated at every build.
autosummary_generate = True
templates_path = ["_templates"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
# The docstrings write their parameters Google style (Args:, Returns:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Console prompts and outputs are not copied by the copy buttons.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
# Cross-references into trio and attrs need network access; keep the build offline.
intersphinx_mapping: dict[str, tuple[str, None]] = {}
suppress_warnings = ["myst.xref_missing"]
# The reference documents the opt-in pytest plugin (trio_sampler.testing) without running it:
# pytest is a test dependency, not a docs one, so `pip install -e '.[docs]'` builds the docs
# alone. Sphinx stands in a mock for it while it imports the modules (decorators pass the
# function through, so the ``emulator`` fixture keeps its docstring and signature).
autodoc_mock_imports = ["pytest"]
