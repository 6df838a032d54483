"""The API reference (``docs/api.rst``) lists every public name exactly once.

Sphinx (``autosummary``) generates one page per listed name at every build, from the
docstrings; this test keeps the list and ``trio_sampler.__all__`` the same.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import trio_sampler

API = Path(__file__).resolve().parent.parent / "docs" / "api.rst"


def listed() -> list[str]:
    names: list[str] = []
    in_block = False
    for line in API.read_text(encoding="utf-8").splitlines():
        if line.startswith(".. autosummary::"):
            in_block = True
        elif in_block and line and not line.startswith(" "):
            in_block = False
        elif in_block and re.fullmatch(r"   [A-Za-z_][\w.]*", line):
            names.append(line.strip())
    return names


def test_every_public_name_has_exactly_one_page() -> None:
    top_level = [name for name in listed() if "." not in name]
    assert sorted(top_level) == sorted(trio_sampler.__all__)
    assert not [name for name, count in Counter(listed()).items() if count > 1]


def test_listed_submodule_names_exist() -> None:
    import importlib

    for dotted in (name for name in listed() if "." in name):
        module, _, attribute = dotted.rpartition(".")
        assert hasattr(importlib.import_module(f"trio_sampler.{module}"), attribute), dotted
