"""``benchmarks/rounds_per_request.py``: the rounds and system calls it writes are a
request's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.rounds_per_request import main


def test_it_counts_each_contenders_rounds_and_system_calls_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rounds.json"
    argv = ["--tokens", "1", "--requests", "5", "--warmup", "2", "--impls", "ours,floor"]
    assert main([*argv, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["requests"] == 5
    by_impl = results["sizes"]["1"]
    assert set(by_impl) == {"ours", "floor"}
    # The floor runs a request in the consumer's task alone: one step a round. Ours has
    # the request's task beside the consumer, so more steps than rounds.
    floor, ours = by_impl["floor"], by_impl["ours"]
    assert floor["rounds"] == floor["steps"] > 0
    assert ours["steps"] > ours["rounds"] > 0
    for row in by_impl.values():
        assert row["user_ms"] >= 0 and row["sys_ms"] >= 0
        if shutil.which("strace") is not None:
            # Every round asks the kernel for I/O: one ``epoll_wait`` each.
            assert row["syscalls_by_name"]["epoll_wait"] == pytest.approx(row["rounds"], abs=1)
            assert row["syscalls"] == pytest.approx(sum(row["syscalls_by_name"].values()))
    assert "| deltas | impl | rounds/req |" in capsys.readouterr().out
