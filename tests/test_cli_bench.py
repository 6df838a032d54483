"""``trio-sampler bench``: tables on stdout, a corpus benchmark skipped without its corpus,
``--json`` one document; run over stand-in scripts (the real ones are benchmarks, not tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trio_sampler.cli import _bench, main

SCRIPT = """
import argparse, json, sys
parser = argparse.ArgumentParser()
parser.add_argument("--quick", action="store_true")
parser.add_argument("--json")
parser.add_argument("--no-json", action="store_true")
args, _ = parser.parse_known_args()
print("| cell | ev/s |")
print("|---|---|")
print("| ours | 100 |")
if not args.no_json:
    with open(args.json, "w") as out:
        json.dump({"quick": args.quick, "script": sys.argv[0].rsplit("/", 1)[-1]}, out)
"""

NO_CORPUS = """
ENV_VAR = "TRIO_SAMPLER_REAL_STREAMS"
def root():
    return "/nowhere/real-streams"
def available():
    return False
"""


@pytest.fixture
def benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in _bench.SCRIPTS:
        (tmp_path / name).write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "corpus.py").write_text(NO_CORPUS, encoding="utf-8")
    monkeypatch.setattr(_bench, "benchmarks_dir", lambda: tmp_path)
    return tmp_path


def test_bench_prints_tables_and_skips_what_needs_the_corpus(
    benchmarks: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench"]) == 0
    out, err = capfd.readouterr()
    assert out.count("| ours | 100 |") == 2  # bench_wire and bench_actor
    assert "{" not in out  # tables, not JSON
    assert "bench_json.py skipped: no real-stream corpus at /nowhere/real-streams" in err


def test_bench_json_is_one_document_on_stdout(
    benchmarks: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--json"]) == 0
    out, err = capfd.readouterr()
    results = json.loads(out)
    assert results == {
        "bench_wire": {"quick": True, "script": "bench_wire.py"},
        "bench_actor": {"quick": True, "script": "bench_actor.py"},
    }
    assert "| ours | 100 |" in err  # the tables went to stderr
