"""The usage ledger against the emulator's own billing record, under random faults,
cancels, hedges and fail-overs over the three APIs, at test size
(``benchmarks/ledger_soak.py`` runs 10,000): every request's ledger matches what the
emulator recorded billing it, attempt by attempt, under the mock clock."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from benchmarks import ledger_soak
from trio_sampler.emulator import BilledUsage, BillingEntry, BillingOutcome
from trio_sampler.types import (
    AttemptOutcome,
    Completed,
    ConversationResponse,
    LedgerEntry,
    RequestMetrics,
    Usage,
)


async def test_the_ledger_matches_the_emulators_billing_record_request_by_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    report = await ledger_soak.run_ledger_soak(300)
    assert report["requests"] == report["terminals"] == 300
    assert report["differences"] == 0, report["examples"]
    # The run exercised what it claims to: each way an attempt ends, on each API, with
    # cache writes and reads, and attempts billed beyond what the server reported (estimated lines).
    assert {"Completed", "Cancelled"} <= set(report["terminals_by_kind"])
    assert {"completed", "failed", "cancelled", "lost_hedge"} <= set(
        report["ledger_lines_by_outcome"]
    )
    assert {"completed", "refused", "cut", "client_gone"} <= set(
        report["emulator_responses_by_outcome"]
    )
    assert set(report["emulator_responses_by_backend"]) == {
        "chat_completions",
        "messages",
        "responses",
    }
    assert report["cache_read_tokens_billed"] > 0
    assert report["cache_write_tokens_billed"] > 0
    assert report["attempts_billed_beyond_reported"] > 0
    assert report["estimated_lines_tokens"]["output"] > 0


def _terminal(*lines: LedgerEntry) -> Completed:
    usage = [line.usage for line in lines if line.usage is not None]
    metrics = RequestMetrics(ledger=lines, total_usage=usage[0] if usage else None)
    return Completed("r", ConversationResponse(items=()), metrics=metrics)


def test_the_comparison_finds_each_kind_of_difference() -> None:
    """The soak's comparison is not vacuous: each way a ledger can disagree with the
    emulator's record is reported."""
    reported = BilledUsage(100, 7, 64, 0)
    entry = BillingEntry(
        "req_1",
        "chat_completions",
        status=200,
        outcome=BillingOutcome.COMPLETED,
        billed=reported,
        reported=reported,
    )
    good = LedgerEntry(
        1, AttemptOutcome.COMPLETED, "m", Usage(100, 7, 64), None, provider_request_id="req_1"
    )
    assert ledger_soak._problems(_terminal(good), [entry]) == []
    wrong = attrs.evolve(good, usage=Usage(100, 8, 64))
    missing = attrs.evolve(good, provider_request_id="req_2")
    estimated = attrs.evolve(good, estimated=True)
    for line in (wrong, missing, estimated):
        assert ledger_soak._problems(_terminal(line), [entry]), line
    assert ledger_soak._problems(_terminal(), [entry])  # billed, and no line
    silent = attrs.evolve(entry, outcome=BillingOutcome.CUT, reported=None, deltas_sent=3, deltas=9)
    nothing = attrs.evolve(good, usage=None)
    assert ledger_soak._problems(_terminal(nothing), [silent])
