"""The usage ledger against the emulator's own billing record: random faults, cancels,
hedges and fail-overs over the three APIs; each request's ledger must match what the
emulator recorded billing it, attempt by attempt.

The server is the emulator (``trio_sampler.emulator``), in process
(``EmulatorTransport``) under trio's mock clock, so a run costs CPU and no waiting. Three
routes, one per API (Chat Completions, Messages, Responses); each request starts on one of
them in turn and fails over to the next two. Every request carries its own script
(``x-emulator-script``, its scenario the request's number): its attempts meet, in order,
up to two random outcome faults (a 500, a 429, a dropped stream, an in-stream error, a
malformed event, a stream without its terminator), and its first attempt may stall
mid-stream (the client's idle timeout cuts it) or be slow to its first token (the hedge,
half a second without content, starts a second attempt on the next route meanwhile). A
share of the prompts share a long system prompt marked as a cache breakpoint (the
emulator's prompt cache then reports cache writes and reads), and a share of the
consumers cancel at a random moment.

The comparison (``docs/accounting.md``, "Checked against the provider's record"): the
emulator keeps, per request id, what it billed and what the client could read of it (the
usage the frames it sent carried). A ledger line carries the provider's request id of its
attempt. A request has a difference when

* an attempt the emulator billed has no ledger line, or a ledger line bills an attempt
  the emulator has no record of (or of another request);
* a line of server-reported usage differs from what the emulator reported to that
  attempt (input, output, cache read, cache write: exactly);
* a line is an estimate (``estimated``) while the emulator did report usage to that
  attempt, or reported none and sent content while the line bills nothing;
* the ledger's reported lines do not sum to what the emulator reported to the request.

What the emulator billed beyond what it reported (a stream cut before its usage, the
output generated after ``message_start``) no client can read: the report counts those
attempts, the tokens, and what the ledger's estimates made of them.

    python benchmarks/ledger_soak.py --requests 10000

prints a table and writes ``benchmarks/results/ledger_soak.json``. The test
(``tests/test_ledger_soak.py``) runs 300 requests.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import orjson
import trio
import trio.testing

try:
    from benchmarks.common import write_results
except ModuleNotFoundError:  # run as a script: python benchmarks/ledger_soak.py
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import write_results

from trio_sampler import ApiBackend, SamplerConfig
from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.actor._metrics import sum_usage
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.emulator import (
    BilledUsage,
    BillingEntry,
    EmulatorApp,
    EmulatorTransport,
    PromptCache,
)
from trio_sampler.routing import HedgePolicy, Route, RoutingPolicy
from trio_sampler.types import (
    ConversationRequest,
    LedgerEntry,
    System,
    TerminalEvent,
    Usage,
    User,
)

_ROUTES = (
    ("chat", ApiBackend.CHAT_COMPLETIONS, "gpt-4o-mini"),
    ("messages", ApiBackend.MESSAGES, "claude-haiku-4-5"),
    ("responses", ApiBackend.RESPONSES, "gpt-5-mini"),
)
#: A prompt prefix of about 1,500 tokens: requests that share it read it from the cache.
_SHARED_PREFIX = "You are a careful assistant. " * 200
_OUTCOMES = ("500", "429", "drop", "stream_error", "malformed", "no_terminator")


def _routing() -> RoutingPolicy:
    def route(name: str, backend: ApiBackend, model: str) -> Route:
        config = SamplerConfig(
            base_url=f"http://{name}.emulator/v1",
            backend=backend,
            model=model,
            api_key="sk-emulator",
            retry=RetryPolicy(max_retries=2, base_delay=0.05, max_delay=0.1),
            timeouts=Timeouts(first_token=3.0, idle=2.0),
        )
        return Route(name, config)

    # No breaker: the faults are the requests' own, and every route should keep serving.
    return RoutingPolicy(
        [route(*spec) for spec in _ROUTES], breaker=None, hedge=HedgePolicy(delay_s=0.5)
    )


def _outcome_fault(kind: str, rng: random.Random) -> dict[str, Any]:
    after = rng.randint(1, 40)
    table: dict[str, dict[str, Any]] = {
        "500": {"type": "status", "status": 500},
        "429": {"type": "status", "status": 429, "retry_after": 0.1},
        "drop": {"type": "drop", "after_events": after},
        "stream_error": {"type": "stream_error", "after_events": after},
        "malformed": {"type": "malformed", "after_events": after},
        "no_terminator": {"type": "no_terminator"},
    }
    return {**table[kind], "times": 1}


def _script(number: int, rng: random.Random, faults_seen: Counter[str]) -> dict[str, Any]:
    """Request ``number``'s script: its pace and the faults its attempts meet, in order."""
    faults: list[dict[str, Any]] = []
    for _ in range(rng.choices([0, 1, 2], [4, 3, 2])[0]):
        kind = rng.choice(_OUTCOMES)
        faults_seen[kind] += 1
        faults.append(_outcome_fault(kind, rng))
    pacing = rng.choices(["none", "stall", "slow_first_token"], [6, 2, 2])[0]
    faults_seen[pacing] += 1
    if pacing == "stall":  # past the idle timeout (2 s) or not
        seconds = rng.choice([rng.uniform(0.1, 1.5), rng.uniform(2.5, 6.0), None])
        faults.append(
            {"type": "stall", "after_events": rng.randint(1, 30), "seconds": seconds, "times": 1}
        )
    elif pacing == "slow_first_token":  # over the hedge's half second, or not
        faults.append({"type": "slow_first_token", "seconds": rng.uniform(0.2, 2.0), "times": 1})
    # A delay of a fraction of a millisecond apart: two streams' events never meet at the
    # same instant of the mock clock (a cancel's race with a frame is then never a tie).
    delay = rng.choice([2, 7, 13, 29]) + rng.random()
    return {"scenario": f"soak-{number}", "delay_ms": delay, "faults": faults}


async def _one(
    sampler: SamplerHandle,
    number: int,
    rng: random.Random,
    faults_seen: Counter[str],
    ends: dict[int, TerminalEvent],
) -> None:
    items: list[System | User] = [User(f"request-{number}: {rng.randint(0, 10**9)}")]
    if rng.random() < 0.3:  # a cached prefix: written once per API, then read
        items.insert(0, System(_SHARED_PREFIX, cache_breakpoint=True))
    script = orjson.dumps(_script(number, rng, faults_seen)).decode()
    first = number % len(_ROUTES)
    chain = [_ROUTES[(first + k) % len(_ROUTES)][0] for k in range(len(_ROUTES))]
    request = ConversationRequest(items=items, extra_headers={"x-emulator-script": script})
    cancel_at = rng.uniform(0.01, 3.0) + rng.random() * 1e-3 if rng.random() < 0.2 else None
    stream = await sampler.submit(request, chain=chain)
    async with stream:
        if cancel_at is not None:
            with trio.move_on_after(cancel_at):
                async for _ in stream:
                    pass
            stream.cancel()
        async for _ in stream:
            pass
    assert stream.terminal is not None
    ends[number] = stream.terminal


def _usage(billed: BilledUsage | None) -> Usage | None:
    if billed is None:
        return None
    return Usage(
        input_tokens=billed.input_tokens,
        output_tokens=billed.output_tokens,
        cache_read_tokens=billed.cache_read_tokens,
        cache_write_tokens=billed.cache_write_tokens,
    )


def _four(usage: Usage | None) -> tuple[int, int, int, int]:
    """The fields a provider bills (reasoning is a part of the output)."""
    if usage is None:
        return (0, 0, 0, 0)
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    )


def _attempt_problems(lines: list[LedgerEntry], entry: BillingEntry) -> list[str]:
    """What is wrong with one attempt's ledger lines against the emulator's entry."""
    used = sum_usage([line.usage for line in lines if line.usage is not None])
    if any(line.estimated for line in lines):
        if entry.reported is not None:
            return [f"{entry.request_id}: estimated, yet the emulator reported {entry.reported}"]
        if not entry.deltas_sent:
            return [f"{entry.request_id}: estimated, yet the emulator sent no content"]
        return []
    if _four(used) != _four(_usage(entry.reported)):
        return [f"{entry.request_id}: ledger {used}, emulator reported {entry.reported}"]
    if entry.reported is None and entry.deltas_sent and entry.billed is not None:
        return [f"{entry.request_id}: content sent, no usage reported, the ledger bills nothing"]
    return []


def _problems(end: TerminalEvent, entries: list[BillingEntry]) -> list[str]:
    """The differences of one request (empty: none)."""
    assert end.metrics is not None
    by_id: dict[str | None, list[LedgerEntry]] = defaultdict(list)
    for line in end.metrics.ledger:
        by_id[line.provider_request_id].append(line)
    problems: list[str] = []
    for line in by_id.pop(None, []):
        if line.usage is not None:
            problems.append(f"attempt {line.attempt}: bills {line.usage} with no request id")
    for entry in entries:
        lines = by_id.pop(entry.request_id, [])
        if not lines:
            if entry.billed is not None:
                problems.append(f"{entry.request_id}: billed {entry.billed}, no ledger line")
            continue
        problems += _attempt_problems(lines, entry)
    problems += [f"{rid}: a ledger line the emulator has no record of" for rid in by_id]
    reported = [line.usage for line in end.metrics.ledger if line.usage and not line.estimated]
    emulator = [_usage(entry.reported) for entry in entries if entry.reported is not None]
    if _four(sum_usage(reported)) != _four(sum_usage([u for u in emulator if u])):
        problems.append("the reported lines do not sum to what the emulator reported")
    return problems


class _Tally:
    """What the run saw, for the report."""

    def __init__(self) -> None:
        self.terminals: Counter[str] = Counter()
        self.lines: Counter[str] = Counter()
        self.billing: Counter[str] = Counter()
        self.backends: Counter[str] = Counter()
        self.exact_requests = 0
        self.unreported_attempts = 0
        self.unreported = [0, 0, 0, 0]  # billed beyond reported: input, output, read, write
        self.estimates = [0, 0]  # what the ledger's estimates billed: input, output
        self.estimated_billed = [0, 0]  # what the emulator billed those attempts
        self.cache_read = 0
        self.cache_write = 0

    def add(self, end: TerminalEvent, entries: list[BillingEntry]) -> None:
        assert end.metrics is not None
        self.terminals[type(end).__name__] += 1
        self.lines.update(line.outcome.value for line in end.metrics.ledger)
        estimated = {line.provider_request_id for line in end.metrics.ledger if line.estimated}
        for line in end.metrics.ledger:
            if line.estimated and line.usage is not None:
                self.estimates[0] += line.usage.input_tokens
                self.estimates[1] += line.usage.output_tokens
        for entry in entries:
            self.billing[entry.outcome.value] += 1
            self.backends[entry.backend] += 1
            billed, reported = _four(_usage(entry.billed)), _four(_usage(entry.reported))
            self.cache_read += billed[2]
            self.cache_write += billed[3]
            if billed != reported:
                self.unreported_attempts += 1
                for index in range(4):
                    self.unreported[index] += billed[index] - reported[index]
            if entry.request_id in estimated:
                self.estimated_billed[0] += billed[0]
                self.estimated_billed[1] += billed[1]
        total = sum_usage([u for u in (_usage(e.billed) for e in entries) if u is not None])
        if _four(end.metrics.total_usage) == _four(total):
            self.exact_requests += 1


async def run_ledger_soak(requests: int, *, seed: int = 35) -> dict[str, Any]:
    """Run ``requests`` requests against the emulator (under a mock clock, or any clock)
    and compare each request's ledger with the emulator's billing record."""
    app = EmulatorApp(cache=PromptCache(), max_billed=max(100_000, 4 * requests))
    rng = random.Random(seed)
    faults_seen: Counter[str] = Counter()
    ends: dict[int, TerminalEvent] = {}
    routing = _routing()
    config = routing.routes[0].config
    async with (
        EmulatorTransport(app) as transport,
        open_sampler(config, routing=routing, transport=transport) as sampler,
        trio.open_nursery() as nursery,
    ):
        for number in range(requests):
            nursery.start_soon(_one, sampler, number, rng, faults_seen, ends)
            await trio.sleep(rng.uniform(0.0, 0.05))
    differences: list[list[Any]] = []
    tally = _Tally()
    by_scenario: dict[str, list[BillingEntry]] = defaultdict(list)
    for entry in app.billed():
        by_scenario[entry.scenario].append(entry)
    for number, end in sorted(ends.items()):
        entries = by_scenario.get(f"soak-{number}", [])
        tally.add(end, entries)
        problems = _problems(end, entries)
        if problems:
            differences.append([number, problems])
    return {
        "requests": requests,
        "terminals": len(ends),
        "differences": len(differences),
        "examples": differences[:5],
        "terminals_by_kind": dict(tally.terminals),
        "ledger_lines_by_outcome": dict(tally.lines),
        "emulator_responses_by_outcome": dict(tally.billing),
        "emulator_responses_by_backend": dict(tally.backends),
        "faults_scripted": dict(faults_seen),
        "requests_ledger_equals_billed": tally.exact_requests,
        "attempts_billed_beyond_reported": tally.unreported_attempts,
        "billed_beyond_reported_tokens": dict(
            zip(("input", "output", "cache_read", "cache_write"), tally.unreported, strict=True)
        ),
        "estimated_lines_tokens": {"input": tally.estimates[0], "output": tally.estimates[1]},
        "estimated_attempts_billed_tokens": {
            "input": tally.estimated_billed[0],
            "output": tally.estimated_billed[1],
        },
        "cache_read_tokens_billed": tally.cache_read,
        "cache_write_tokens_billed": tally.cache_write,
    }


def _rows(report: dict[str, Any]) -> list[tuple[str, Any]]:
    def counts(prefix: str, key: str) -> list[tuple[str, Any]]:
        return [(f"{prefix}: {k}", v) for k, v in sorted(report[key].items())]

    return [
        ("requests", report["requests"]),
        ("terminals", report["terminals"]),
        *counts("terminals", "terminals_by_kind"),
        *counts("ledger lines", "ledger_lines_by_outcome"),
        *counts("emulator responses", "emulator_responses_by_outcome"),
        *counts("emulator responses", "emulator_responses_by_backend"),
        *counts("faults scripted", "faults_scripted"),
        ("cache read tokens billed", report["cache_read_tokens_billed"]),
        ("cache write tokens billed", report["cache_write_tokens_billed"]),
        ("requests whose ledger sum = billed", report["requests_ledger_equals_billed"]),
        ("attempts billed beyond reported", report["attempts_billed_beyond_reported"]),
        *counts("billed beyond reported", "billed_beyond_reported_tokens"),
        *counts("estimated lines", "estimated_lines_tokens"),
        *counts("their attempts billed", "estimated_attempts_billed_tokens"),
        ("differences", report["differences"]),
        ("wall seconds", report["wall_s"]),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--out", default="benchmarks/results/ledger_soak.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = trio.run(
        lambda: run_ledger_soak(args.requests, seed=args.seed),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    report["wall_s"] = round(time.perf_counter() - started, 2)
    rows = _rows(report)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for number, problems in report["examples"]:
        print(f"request {number}: {'; '.join(problems)}")
    write_results(args.out, report)
    return 0 if report["differences"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
