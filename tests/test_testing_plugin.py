"""The pytest plugin ``trio_sampler.testing`` works as documented under ``-W error``.

The tutorial enables the plugin with ``pytest_plugins`` in a test module; importing
``EmulatorFixture`` from it for a type hint then imports the module before pytest registers
it as a plugin. pytest warns that it cannot rewrite a module already imported, and under
``-W error`` (this project's own setting, and many users') that warning is a collection error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TEST_MODULE = """
from trio_sampler.testing import EmulatorFixture

pytest_plugins = ["trio_sampler.testing"]


async def test_the_fixture_serves(emulator: EmulatorFixture) -> None:
    assert emulator.base_url.startswith("http://127.0.0.1:")
    assert emulator.requests() == []
"""


def test_the_plugin_as_the_tutorial_places_it_runs_under_warnings_as_errors(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_user.py").write_text(TEST_MODULE, encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-W", "error", "-p", "trio", "-o", "trio_mode=true",
         "-q", "-p", "no:cacheprovider", "test_user.py"],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
