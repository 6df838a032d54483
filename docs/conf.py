"""Sphinx configuration for trio_sampler's documentation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The benchmark charts are drawn from the committed results JSON at every build.
_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_bench_plot", _ROOT / "benchmarks" / "plot.py")
if _spec is not None and _spec.loader is not None:
    _plot = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_plot)
    _plot.render(_ROOT / "benchmarks" / "results", _ROOT / "docs" / "_generated")

project = "trio_sampler"
author = "trio_sampler developers"
copyright = "2026, trio_sampler developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Cross-references into trio and attrs need network access; keep the build offline.
intersphinx_mapping: dict[str, tuple[str, None]] = {}
suppress_warnings = ["myst.xref_missing"]
