"""``docs/architecture.md`` lists every module of the package, by its path."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trio_sampler"
MAP = ROOT / "docs" / "architecture.md"


def test_every_module_is_on_the_map() -> None:
    text = MAP.read_text(encoding="utf-8")
    modules = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent.name == "cli"
    )
    missing = [module for module in modules if f"`{module}`" not in text]
    assert missing == [], f"add these to docs/architecture.md: {missing}"
