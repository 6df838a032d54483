"""Sphinx configuration for trio_sampler's documentation."""

from __future__ import annotations

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
