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


# -- the docs build from the documented extra, and say what is true ----------------------

DOCS = API.parent
ROOT = DOCS.parent
#: Installed by the ``test`` extra but not by ``docs``: the reference must not need them.
NOT_IN_THE_DOCS_EXTRA = ("pytest", "_pytest", "pytest_trio", "hypothesis", "opentelemetry")


def test_the_reference_imports_with_the_docs_extra_alone() -> None:
    """autosummary imports every listed module; with the test extra's packages hidden,
    docs/conf.py's mocks must be enough (``pip install -e '.[docs]'`` has no pytest)."""
    import subprocess
    import sys

    modules = sorted({f"trio_sampler.{n.rpartition('.')[0]}" for n in listed() if "." in n})
    script = f"""
import runpy, sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_IN_THE_DOCS_EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
        return None
sys.meta_path.insert(0, Hide())
from sphinx.ext.autodoc.mock import mock
mocked = runpy.run_path({str(DOCS / "conf.py")!r}).get("autodoc_mock_imports", [])
import importlib
with mock(mocked):
    for module in {modules!r}:
        importlib.import_module(module)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _toctree_captions(index: str) -> list[str]:
    return re.findall(r"^:caption: (.+)$", index, flags=re.MULTILINE)


def test_the_index_is_organised_the_way_users_look() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert _toctree_captions(index) == ["Tutorial", "How-to guides", "Reference", "Explanation"]
    explanation = index.split(":caption: Explanation", 1)[1]
    for page in ("actor-internals", "benchmarks", "benchmarks-actor", "architecture"):
        assert re.search(rf"^{page}$", explanation, flags=re.MULTILINE), page


def test_the_command_line_page_lists_every_command() -> None:
    from trio_sampler.cli import COMMANDS

    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    names = [module.__name__.rpartition("._")[2] for module in COMMANDS]
    for name in names:
        assert f"| `trio-sampler {name}" in page, name
    assert not re.search(r"\b(five|six|seven|eight) commands\b", page)


def test_the_loadtest_results_table_names_the_current_schema() -> None:
    from trio_sampler.loadtest import SCHEMA

    page = (DOCS / "loadtest.md").read_text(encoding="utf-8")
    version = SCHEMA.rpartition("/")[2]
    assert f"Version {version}:" in page
    assert f'`"{SCHEMA}"`' in page


def test_the_docs_cite_only_what_is_in_the_repository() -> None:
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "trio-notes" not in text, page.name
        assert "not a dependency" not in text or "h2" not in text, page.name


def test_the_readme_says_what_the_test_command_needs_and_takes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for need in ("redis-server", "tmux", "valgrind"):
        assert f"`{need}`" in readme, need
    assert re.search(r"~?\d+ minutes", readme)
