"""The package as a new user gets it: the sdist, the wheel, a fresh environment with no extras.

One module-scoped build: the sdist is built from this checkout, unpacked, and the wheel is
built from the unpacked sdist (so the sdist is known to be complete). The wheel goes into a
fresh virtual environment whose only other packages are the runtime dependencies (the
closure of ``Requires-Dist`` without extras, linked from this environment: offline, and
nothing from the test extra, not pytest). There ``trio-sampler demo`` and every documented
example must run. The unpacked sdist must collect exactly the tests this checkout collects.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from packaging.requirements import Requirement
from test_cli_demo import check_plain_output
from test_docs_examples import EXAMPLES, Example

from benchmarks import corpus

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 900.0  # generous: collecting the whole suite on a loaded machine
# What a documented example may import beyond the runtime dependencies, and which extra
# brings it (an example that needs one says so by importing it).
# Modules of an extra, which need it to import.
EXTRA_MODULES = {
    "trio_sampler.testing": "test",
    "trio_sampler.fleet": "fleet",
    "trio_sampler.loadtest": "loadtest",
    "trio_sampler._http._httptools": "fast",
}
_LEAKY = frozenset({"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"})
EXTRA_PACKAGES = {
    "openai": "test",
    "anthropic": "test",
    "pytest": "test",
    "opentelemetry": "otel",
    "coredis": "fleet",
    "hdrh": "loadtest",
    "pydantic": "structured",
}


@attrs.frozen
class Installed:
    python: Path  # the fresh environment's interpreter
    scripts: Path  # its bin/ (Scripts\\ on Windows)
    sdist_tree: Path  # the unpacked sdist


def _run(
    args: list[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # Nothing of this environment leaks into the fresh one (no PYTHONPATH, no pytest state).
    base = os.environ if env is None else env
    clean = {k: v for k, v in base.items() if k not in _LEAKY and not k.startswith("PYTEST")}
    completed = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert completed.returncode == 0, (
        f"{args} exited with {completed.returncode}\n"
        f"--- stdout ---\n{completed.stdout[-3000:]}\n--- stderr ---\n{completed.stderr[-3000:]}"
    )
    return completed


def runtime_closure(name: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``name`` needs at run time (no extras), itself excluded."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = [name]
    while pending:
        dist = importlib.metadata.distribution(pending.pop())
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            key = re.sub(r"[-_.]+", "-", requirement.name).lower()
            if key not in seen:
                seen[key] = importlib.metadata.distribution(requirement.name)
                pending.append(requirement.name)
    return list(seen.values())


def link_distributions(dists: list[importlib.metadata.Distribution], target: Path) -> None:
    """Symlink each distribution's top-level modules and its metadata into ``target``."""
    target.mkdir()
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = base / top
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)


def _environment(tmp: Path, wheel: Path, tree: Path) -> Installed:
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site = Path(purelib.stdout.strip())
    deps = tmp / "runtime-deps"
    link_distributions(runtime_closure("trio-sampler"), deps)
    (site / "runtime-deps.pth").write_text(f"{deps}\n")
    # This environment's pip installs into the fresh one (which has no pip of its own).
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel])
    return Installed(python=python, scripts=bin_dir, sdist_tree=tree)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("install")
    dist = tmp / "dist"
    # The sdist from a copy of the tree: building in place would leave egg-info behind.
    _run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.build_sdist(sys.argv[1]))",
            dist,
        ],
        cwd=ROOT,
    )
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "sdist", filter="data")
    (tree,) = (tmp / "sdist").iterdir()
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "-w", dist, tree])
    (wheel,) = dist.glob("*.whl")
    yield _environment(tmp, wheel, tree)


def test_no_test_dependency_is_importable(installed: Installed) -> None:
    probe = "import importlib.util as u; print([m for m in ('pytest', 'openai') if u.find_spec(m)])"
    assert _run([installed.python, "-c", probe]).stdout.strip() == "[]"


def test_every_module_imports_without_test_dependencies(installed: Installed) -> None:
    # Every module but those of an extra; those fail with an ImportError (the fleet's names
    # the extra to install).
    code = (
        "import importlib, pkgutil, sys, trio_sampler\n"
        "extras = sys.argv[1].split(',')\n"
        "names = [m.name for m in pkgutil.walk_packages(trio_sampler.__path__, 'trio_sampler.')]\n"
        "for name in names:\n"
        "    if name.endswith('__main__'):\n"
        "        continue\n"
        "    if any(name == e or name.startswith(e + '.') for e in extras):\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except ImportError as exc:\n"
        "            print('needs an extra:', name, '|', exc)\n"
        "        else:\n"
        "            raise SystemExit(f'{name} imported without its extra')\n"
        "    else:\n"
        "        importlib.import_module(name)\n"
        "print(len(names), 'modules')\n"
    )
    result = _run([installed.python, "-c", code, ",".join(EXTRA_MODULES)])
    assert int(result.stdout.splitlines()[-1].split()[0]) > 20
    assert "trio-sampler[fleet]" in result.stdout


def test_demo_runs(installed: Installed, tmp_path: Path) -> None:
    # Piped, so plain lines: all three protocols, tools, the retry, the cancel, the table.
    result = _run([installed.scripts / "trio-sampler", "demo"], cwd=tmp_path)
    check_plain_output(result.stdout)


def test_version_and_module_entry(installed: Installed) -> None:
    version = importlib.metadata.version("trio-sampler")
    assert _run([installed.scripts / "trio-sampler", "--version"]).stdout.strip().endswith(version)
    assert version in _run([installed.python, "-m", "trio_sampler", "--version"]).stdout


def _needs_extra(example: Example) -> str | None:
    for match in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_][\w.]*)", example.source, re.M):
        module = match[1]
        if module.split(".")[0] in EXTRA_PACKAGES:
            return EXTRA_PACKAGES[module.split(".")[0]]
        for name, extra in EXTRA_MODULES.items():
            if module == name or module.startswith(name + "."):
                return extra
    return None


RUNNABLE = [e for e in EXAMPLES if _needs_extra(e) is None]


def test_examples_needing_an_extra_say_so() -> None:
    # The examples left out below are exactly those importing an extra's package; the rest
    # (most of them: the README's and the tutorial's) must run without one.
    assert len(RUNNABLE) >= len(EXAMPLES) // 2
    assert any(e.path.name == "README.md" for e in RUNNABLE)


@pytest.mark.parametrize("example", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_example_runs_without_extras(
    installed: Installed, example: Example, tmp_path: Path
) -> None:
    script = tmp_path / "example.py"
    script.write_text(example.source, encoding="utf-8")
    _run([installed.python, script], cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})


def _collected(cwd: Path, env: dict[str, str]) -> list[str]:
    result = _run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=cwd,
        env=env,
    )
    return sorted(line for line in result.stdout.splitlines() if "::" in line)


def test_sdist_collects_the_whole_suite(installed: Installed) -> None:
    env = dict(os.environ)
    if corpus.available():
        env[corpus.ENV_VAR] = str(corpus.root())
    assert (installed.sdist_tree / "LICENSE").is_file()
    assert _collected(installed.sdist_tree, env) == _collected(ROOT, env)


def test_sdist_runs_tests(installed: Installed) -> None:
    env = dict(os.environ)
    env[corpus.ENV_VAR] = str(corpus.root())
    quick = ["tests/test_sse.py", "tests/test_exports.py", "tests/test_stream_messages.py"]
    result = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *quick],
        cwd=installed.sdist_tree,
        env=env,
    )
    assert re.search(r"\d+ passed", result.stdout)
