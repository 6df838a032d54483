"""The usage ledger under random faults, cancels, hedges and fail-overs, at test size
(``benchmarks/ledger_soak.py`` runs 10,000): for each request, the sum of its ledger equals
what the server recorded billing it, under the mock clock."""

from __future__ import annotations

import trio
import trio.testing

from benchmarks import ledger_soak


async def test_the_ledger_sums_to_what_the_server_billed_each_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    report = await ledger_soak.run_ledger_soak(500)
    assert report["requests"] == report["terminals"] == 500
    assert report["differences"] == 0, report["examples"]
    # The run exercised what it claims to: every way an attempt ends, every terminal.
    assert {"Completed", "Failed", "Cancelled"} <= set(report["terminals_by_kind"])
    assert {"completed", "failed", "cancelled", "lost_hedge"} <= set(
        report["ledger_lines_by_outcome"]
    )
    assert {"ok", "drop", "stall", "500", "429"} <= set(report["server_replies"])
