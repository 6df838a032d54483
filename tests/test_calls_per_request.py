"""``benchmarks/calls_per_request.py``: the counts it writes are the calls a request made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.calls_per_request import main


def test_it_counts_each_contenders_calls_per_request_by_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "calls.json"
    # Forty deltas against one: the suite logs at DEBUG (conftest), so the counts here carry
    # the logging's calls too, which move by more than two or three deltas' worth.
    assert main(["--tokens", "1,40", "--requests", "10", "--top", "3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["requests"] == 10
    assert set(results["sizes"]) == {"1", "40"}
    for by_impl in results["sizes"].values():
        assert set(by_impl) == {"ours", "skeleton", "floor"}
        for impl, row in by_impl.items():
            # The groups add up to the total, and only ours runs the library's code.
            assert sum(row["by_group"].values()) == pytest.approx(row["calls_per_request"])
            assert (row["by_group"].get("trio_sampler", 0) > 0) == (impl == "ours")
            assert len(row["top"]) == 3
        # The floor goes through httpx2; the skeleton, like ours, straight to httpcore2.
        assert by_impl["floor"]["by_group"]["httpx2"] > by_impl["skeleton"]["by_group"].get(
            "httpx2", 0
        )
    # More text deltas are more calls, for every contender.
    for impl in ("ours", "skeleton", "floor"):
        one = results["sizes"]["1"][impl]["calls_per_request"]
        forty = results["sizes"]["40"][impl]["calls_per_request"]
        assert forty > one
    printed = capsys.readouterr().out
    assert "| deltas | impl | calls/req |" in printed
    assert "ours makes" in printed
