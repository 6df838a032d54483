"""No runtime function of the request runtime, the client or the fleet runs over 60 lines.

Ruff's C901 / PLR0912 / PLR0915 hold its branches and statements (``pyproject.toml``);
this walks the syntax tree of the same modules and holds the length, counted from the
``def`` line (decorators excluded) to the last line of the body, less the docstring (a
public function's arguments are documented there, at whatever length they need).
"""

from __future__ import annotations

import ast
from pathlib import Path

import trio_sampler

MAX_LINES = 60
_PACKAGE = Path(trio_sampler.__file__).parent
#: The modules held to the rule.
MODULES = sorted(
    [
        *(_PACKAGE / "actor").glob("*.py"),
        *(_PACKAGE / "fleet").glob("*.py"),
        *(_PACKAGE / "_http").glob("*.py"),
        _PACKAGE / "routing.py",
        _PACKAGE / "admission.py",
        _PACKAGE / "client.py",
        _PACKAGE / "_network.py",
    ]
)


def _functions(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of every function in ``path``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                length = end - child.lineno + 1
                if ast.get_docstring(child, clean=False) is not None:
                    doc = child.body[0]
                    length -= (doc.end_lineno or doc.lineno) - doc.lineno + 1
                found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")
    return found


def test_the_modules_are_found() -> None:
    names = {path.name for path in MODULES}
    assert {"_request.py", "_attempt.py", "_plan.py", "routing.py", "admission.py"} <= names


def test_no_function_is_longer_than_60_lines() -> None:
    too_long = [
        f"{path.relative_to(_PACKAGE.parent)}:{line} {name} ({length} lines)"
        for path in MODULES
        for name, line, length in _functions(path)
        if length > MAX_LINES
    ]
    assert not too_long, f"functions over {MAX_LINES} lines: " + "; ".join(too_long)


def test_the_walk_measures_a_long_function(tmp_path: Path) -> None:
    statements = "".join(f"        x = {i}\n" for i in range(MAX_LINES))
    source = tmp_path / "long.py"
    source.write_text(
        f'class C:\n    def f(self) -> None:\n        """Two\n        lines."""\n{statements}'
    )
    [(name, line, length)] = _functions(source)
    assert (name, line, length) == ("C.f", 2, MAX_LINES + 1)
