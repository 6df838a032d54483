"""Every ```python block of README.md and docs/ runs as a script and exits 0.

The docs promise that each Python example is a complete program (the tutorial's run
against the in-process emulator, with no network and no key). This test holds them to it:
each block is written to a file in a fresh temporary directory and run with this
interpreter in a subprocess. A fragment that cannot run on its own fails here: make it a
whole script, or, if it is not an example but an excerpt of the library's own source shown
for explanation (as in ``docs/actor-internals.md``), mark it as such with a
```` ```{code-block} python ```` fence, which is highlighted but not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 60.0

# An opening fence of three or more backticks (or tildes) whose info string is python/py,
# and the matching closing fence: the same character, at least as long, nothing after it.
_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")


@attrs.frozen
class Example:
    path: Path
    line: int  # 1-based line of the opening fence
    source: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def python_blocks(path: Path) -> list[Example]:
    """The ```python blocks of one Markdown file, in order."""
    examples: list[Example] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = _OPEN.match(lines[index])
        if match is None:
            index += 1
            continue
        fence = match["fence"]
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines):
            stripped = lines[index].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            body.append(lines[index])
            index += 1
        index += 1  # past the closing fence (or the end of the file)
        if match["info"].lower() in ("python", "py", "python3"):
            examples.append(Example(path, start + 1, "\n".join(body) + "\n"))
    return examples


def documented_examples() -> list[Example]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [example for path in files if path.exists() for example in python_blocks(path)]


EXAMPLES = documented_examples()


def test_examples_are_found() -> None:
    # Guards the extraction itself: the tutorial alone has several complete scripts.
    tutorial = [e for e in EXAMPLES if e.path.name == "tutorial.md"]
    assert len(tutorial) >= 5
    assert any(e.path.name == "README.md" for e in EXAMPLES)


def test_block_extraction_handles_longer_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n````python\nprint('a')\n```\nprint('b')\n````\n\n```text\nx\n```\n"
        "```py\nprint('c')\n```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [b.source for b in blocks] == ["print('a')\n```\nprint('b')\n", "print('c')\n"]
    assert [b.line for b in blocks] == [3, 12]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_runs(example: Example, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example.source, encoding="utf-8")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    try:
        completed = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example.name}: still running after {TIMEOUT_SECONDS:g} s\n{exc.stdout!r}")
    assert completed.returncode == 0, (
        f"{example.name} exited with {completed.returncode}\n"
        f"--- stdout ---\n{completed.stdout[-4000:]}\n--- stderr ---\n{completed.stderr[-4000:]}"
    )
