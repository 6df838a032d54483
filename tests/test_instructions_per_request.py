"""``benchmarks/instructions_per_request.py``: one request's instructions, counted by
valgrind's callgrind as the difference of two runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_actor import RawServer
from benchmarks.instructions_per_request import drive, main, read_total


def test_the_total_is_read_from_either_line() -> None:
    assert read_total("version: 1\ncreator: callgrind\nsummary: 123456\n") == 123456
    assert read_total("events: Ir\ntotals: 987 0\n") == 987
    with pytest.raises(ValueError, match="no summary"):
        read_total("events: Ir\n")


def test_the_driver_runs_each_contender_to_its_end() -> None:
    server = RawServer()
    try:
        for impl in ("ours", "skeleton", "floor"):
            drive(impl, server.origin, 3, 1, 2)
    finally:
        server.close()


def test_a_run_under_callgrind_counts_one_requests_instructions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "instructions.json"
    argv = ["--tokens", "1", "--requests", "4", "--warmup", "2", "--impls", "floor"]
    assert main([*argv, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["requests"] == [4, 12]
    row = results["sizes"]["1"]["floor"]
    # The longer run counted more, and the difference is one request's worth per request:
    # an HTTP exchange in Python is hundreds of thousands of instructions at least, and
    # far fewer than the start-up's (the imports alone), which the difference takes out.
    assert row["totals"]["12"] > row["totals"]["4"]
    assert 1e5 < row["instructions_per_request"] < row["totals"]["4"] / 10
    assert "| deltas | impl | instructions/req | × floor |" in capsys.readouterr().out


def test_bad_arguments_say_what_to_write(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--impls", "ours,sdk"])
    assert "--impls a list of ours, skeleton, floor" in capsys.readouterr().err
