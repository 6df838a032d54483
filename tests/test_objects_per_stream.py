"""``benchmarks/objects_per_stream.py``: the objects it writes are one stream's, by type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.objects_per_stream import main


def test_it_counts_each_contenders_objects_per_stream_in_flight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "objects.json"
    argv = ["--streams", "2,6", "--settle", "0.6", "--impls", "raw,direct"]
    assert main([*argv, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["streams"] == [2, 6]
    raw, ours = results["contenders"]["raw"], results["contenders"]["direct"]
    for row in (raw, ours):
        low, high = row["totals"]["2"], row["totals"]["6"]
        # The difference of the two counts over the four streams added.
        assert row["objects_per_stream"] == pytest.approx((high - low) / 4)
        assert sum(row["by_type"].values()) == pytest.approx(row["objects_per_stream"], abs=8)
    # A raw stream holds its task's coroutines and its socket; ours holds the request's
    # state, two tasks and an HTTP connection besides.
    assert 0 < raw["objects_per_stream"] < ours["objects_per_stream"]
    assert raw["by_type"]["builtins.coroutine"] >= 1
    assert ours["by_type"]["trio_sampler.actor._stream.RequestState"] == 1
    assert "| impl | objects/stream |" in capsys.readouterr().out
