"""Soak/load harness: many requests through ONE sampler actor against the emulator.

Every request is scripted (``x-emulator-script``) with a known final text; a share of them
get a fault of every emulator type (``status``, ``stream_error``, ``drop``, ``stall``,
``malformed``, ``empty``, ``pings``), some persistent (so retries run out and the request
fails), and a share are cancelled by the consumer at a random point. The harness checks
the contract (``docs/contract.md``) on every request and the process's health over the run:

* exactly one terminal per request, last, and the stream ends right after it (must be 0
  violations);
* a ``Completed`` request's text, as the consumer assembled it from the deltas (dropping
  output on ``Retrying(discard_partial=True)``) and as the terminal carries it, equals the
  scripted text; a ``Failed``/``Cancelled`` one saw a prefix of it (must be 0 mismatches);
* no request still active when all consumers are done (must be 0);
* resident memory (VmRSS) at start, after warm-up (10 %), middle and end: flat after
  warm-up (growth under 5 %);
* open file descriptors and trio tasks back to their starting counts once the sampler is
  closed.

Usage::

    python benchmarks/soak.py                       # 100,000 requests over loopback HTTP
    python benchmarks/soak.py --requests 5000 --in-process --json /tmp/soak.json

The exit status is non-zero when any check fails. The core, :func:`run_soak`, is also
used by ``tests/test_soak.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio
import trio.lowlevel

from trio_sampler.actor import RequestStream, open_sampler
from trio_sampler.config import RetryPolicy, SamplerConfig, Timeouts
from trio_sampler.emulator import EmulatorApp, EmulatorServer, EmulatorTransport, PromptCache, serve
from trio_sampler.types import (
    ApiBackend,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    User,
)

__all__ = ["FAULT_TYPES", "SoakOptions", "main", "run_soak"]

FAULT_TYPES = ("status", "stream_error", "drop", "stall", "malformed", "empty", "pings")
_TERMINALS = (Completed, Failed, Cancelled)
_BACKENDS = (ApiBackend.CHAT_COMPLETIONS, ApiBackend.RESPONSES, ApiBackend.MESSAGES)
_WORDS = (
    "trio",
    "nursery",
    "cancel",
    "scope",
    "stream",
    "token",
    "actor",
    "retry",
    "soak",
    "étude",
    "naïve",
    "日本語",
    "emoji🙂",
    "λ",
)
_REQUEST = ConversationRequest(items=[User("Say the scripted text.")])
_DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "soak.json"


@attrs.frozen
class SoakOptions:
    requests: int = 100_000
    concurrency: int = 200
    fault_rate: float = 0.10
    cancel_rate: float = 0.02
    seed: int = 0
    in_process: bool = False
    #: Share of faulted requests whose fault never goes away (retries run out: ``Failed``).
    persistent_rate: float = 0.2
    #: Idle and first-token timeout; a ``stall`` fault is silent for twice as long.
    idle_timeout: float = 2.0
    max_retries: int = 2


@attrs.frozen
class _Plan:
    index: int
    backend: ApiBackend
    text: str
    script: dict[str, Any]
    fault: str | None
    #: Cancel after this many events (0: right after submit); None: no cancel.
    cancel_after: int | None


def _plan(opts: SoakOptions, index: int) -> _Plan:
    rng = random.Random(opts.seed * 1_000_003 + index)
    backend = _BACKENDS[index % len(_BACKENDS)]
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 30))]
    text = f"r{index} " + " ".join(words)
    scenario = f"soak-{opts.seed}-{index}"
    script: dict[str, Any] = {"text": text, "scenario": scenario}
    chunk = rng.choice((None, None, 1, 4, 16))
    if chunk is not None:
        script["chunk_chars"] = chunk
    fault: str | None = None
    if rng.random() < opts.fault_rate:
        fault = rng.choice(FAULT_TYPES)
        spec: dict[str, Any] = {"type": fault}
        after = rng.randint(0, 6)
        if fault == "status":
            status, retry_after = rng.choice(
                ((429, 0.01), (500, None), (503, None), (529, None), (400, None), (401, None))
            )
            spec["status"] = status
            if retry_after is not None:
                spec["retry_after"] = retry_after
        elif fault in ("stream_error", "drop", "malformed"):
            spec["after_events"] = after
        elif fault == "stall":
            spec["after_events"] = after
            spec["seconds"] = opts.idle_timeout * 2
        elif fault == "pings":
            spec["count"] = rng.randint(1, 5)
            spec["interval_ms"] = rng.choice((0, 1, 5))
        if rng.random() >= opts.persistent_rate:
            spec["times"] = rng.randint(1, opts.max_retries)
        script["faults"] = [spec]
    cancel_after: int | None = None
    if rng.random() < opts.cancel_rate:
        cancel_after = rng.randint(0, 8)
    return _Plan(index, backend, text, script, fault, cancel_after)


# -- process health ----------------------------------------------------------------------


def rss_kib() -> int:
    """Resident memory (VmRSS) in KiB, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def trio_tasks() -> int:
    """Every task in this trio run (the root task's tree)."""
    count = 0
    root = trio.lowlevel.current_root_task()
    stack = [root] if root is not None else []
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


def _forget(app: EmulatorApp, scenario: str) -> None:
    # The emulator keeps fault counters and recorded requests per scenario (up to a cap);
    # a soak of 10^5 unique scenarios would measure the emulator's bookkeeping, not the
    # sampler's memory. Drop what a finished request left behind.
    app.forget(scenario)


# -- the run -----------------------------------------------------------------------------


@attrs.define
class _Tally:
    terminals: Counter[str] = attrs.field(factory=Counter)
    failed_kinds: Counter[str] = attrs.field(factory=Counter)
    faults: Counter[str] = attrs.field(factory=Counter)
    retries: int = 0
    events: int = 0
    cancels_requested: int = 0
    one_terminal_violations: int = 0
    text_mismatches: int = 0
    clean_not_completed: int = 0
    examples: list[str] = attrs.field(factory=list)
    done: int = 0

    def note(self, message: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(message)


def _check(plan: _Plan, events: list[SamplingEvent], stream_ended: bool, tally: _Tally) -> None:
    tally.events += len(events)
    terminals = [e for e in events if isinstance(e, _TERMINALS)]
    if len(terminals) != 1 or events[-1] is not terminals[0] or not stream_ended:
        tally.one_terminal_violations += 1
        tally.note(f"request {plan.index}: {len(terminals)} terminals, ended={stream_ended}")
    if not terminals:
        return
    terminal = terminals[-1]
    tally.terminals[type(terminal).__name__] += 1
    seen: list[str] = []
    for event in events:
        if isinstance(event, ChannelToken) and event.channel is SamplingChannel.TEXT:
            seen.append(event.text)
        elif isinstance(event, Retrying):
            tally.retries += 1
            if event.discard_partial:
                seen.clear()
    text = "".join(seen)
    if isinstance(terminal, Completed):
        if text != plan.text or terminal.response.text != plan.text:
            tally.text_mismatches += 1
            tally.note(
                f"request {plan.index}: completed with {terminal.response.text!r} "
                f"(deltas {text!r}), scripted {plan.text!r}"
            )
        return
    partial = terminal.partial.text if terminal.partial is not None else ""
    if not plan.text.startswith(text) or not plan.text.startswith(partial):
        tally.text_mismatches += 1
        tally.note(f"request {plan.index}: partial {partial!r} / {text!r} vs {plan.text!r}")
    if isinstance(terminal, Failed):
        tally.failed_kinds[terminal.error.kind.value] += 1
        if plan.fault is None and plan.cancel_after is None:
            tally.clean_not_completed += 1
            tally.note(f"request {plan.index}: no fault but failed: {terminal.error}")
    elif plan.cancel_after is None:
        tally.clean_not_completed += 1
        tally.note(f"request {plan.index}: cancelled without a cancel: {terminal.reason}")


async def _consume(stream: RequestStream, plan: _Plan) -> tuple[list[SamplingEvent], bool]:
    events: list[SamplingEvent] = []
    async with stream:
        if plan.cancel_after == 0:
            stream.cancel("soak: cancelled right after submit")
        async for event in stream:
            events.append(event)
            if plan.cancel_after is not None and len(events) == plan.cancel_after:
                stream.cancel("soak: cancelled mid-stream")
        # The loop ended: the stream is exhausted. A further read must end at once too.
        ended = True
        async for extra in stream:
            events.append(extra)
            ended = False
    return events, ended


class _Borrowed(httpx2.AsyncBaseTransport):
    """A transport the sampler may use but not close: its owner closes it.

    ``SamplingClient.aclose`` closes its transport from inside a shielded cancel scope;
    ``EmulatorTransport.aclose`` exits the nursery it opened in ``__aenter__`` and so
    corrupts trio's cancel-scope stack when called there (reported; see
    ``tests/test_soak.py::test_emulator_transport_survives_open_sampler``).
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass


@asynccontextmanager
async def _emulator(in_process: bool) -> AsyncIterator[tuple[str, EmulatorApp, Any]]:
    """(base_url, app, transport or None) for the run's emulator."""
    if in_process:
        transport = EmulatorTransport(EmulatorApp(cache=PromptCache()))
        async with transport:
            yield "http://emulator.local/v1", transport.app, _Borrowed(transport)
        return
    async with trio.open_nursery() as nursery:
        app = EmulatorApp(cache=PromptCache())
        server: EmulatorServer = await nursery.start(_serve_app, app)
        yield server.base_url, app, None
        nursery.cancel_scope.cancel()


async def _serve_app(
    app: EmulatorApp, *, task_status: trio.TaskStatus[EmulatorServer] = trio.TASK_STATUS_IGNORED
) -> None:
    await serve(app=app, task_status=task_status)


async def _settle(target_tasks: int, target_fds: int) -> tuple[int, int]:
    """Let closing connections finish: poll until tasks and fds are back (at most 5 s)."""
    for _ in range(100):
        if trio_tasks() <= target_tasks and open_fds() <= target_fds:
            break
        await trio.sleep(0.05)
    return trio_tasks(), open_fds()


async def run_soak(opts: SoakOptions) -> dict[str, Any]:
    """Run the soak and return the report (see the module docstring)."""
    if opts.requests < 1 or opts.concurrency < 1:
        raise ValueError("requests and concurrency must be at least 1")
    gc.collect()
    rss: dict[str, int] = {"start": rss_kib()}
    tally = _Tally()
    checkpoints = {
        max(1, opts.requests // 10): "warmup",
        max(1, opts.requests // 2): "middle",
    }
    started = time.perf_counter()
    async with _emulator(opts.in_process) as (base_url, app, transport):
        await trio.lowlevel.checkpoint()
        tasks_start, fds_start = trio_tasks(), open_fds()
        config = SamplerConfig(
            base_url=base_url,
            model="soak-model",
            api_key="sk-soak-0123456789abcdef",
            timeouts=Timeouts(
                connect=5.0,
                response_headers=5.0,
                first_token=opts.idle_timeout,
                idle=opts.idle_timeout,
                total=60.0,
            ),
            retry=RetryPolicy(max_retries=opts.max_retries, base_delay=0.01, max_delay=0.05),
        )
        next_index = 0
        leaked = 0
        async with open_sampler(config, transport=transport, seed=opts.seed) as sampler:

            async def worker() -> None:
                nonlocal next_index
                while next_index < opts.requests:
                    plan = _plan(opts, next_index)
                    next_index += 1
                    tally.faults[plan.fault or "none"] += 1
                    if plan.cancel_after is not None:
                        tally.cancels_requested += 1
                    request_config = config.evolve(
                        backend=plan.backend,
                        extra_headers={"x-emulator-script": json.dumps(plan.script)},  # ASCII
                    )
                    stream = await sampler.submit(
                        _REQUEST, config=request_config, request_id=f"soak-{plan.index}"
                    )
                    events, ended = await _consume(stream, plan)
                    _check(plan, events, ended, tally)
                    _forget(app, plan.script["scenario"])
                    tally.done += 1
                    label = checkpoints.get(tally.done)
                    if label is not None:
                        gc.collect()
                        rss[label] = rss_kib()

            async with trio.open_nursery() as nursery:
                for _ in range(min(opts.concurrency, opts.requests)):
                    nursery.start_soon(worker)
            gc.collect()
            rss["end"] = rss_kib()
            leaked = await sampler.active_count()
        tasks_end, fds_end = await _settle(tasks_start, fds_start)
    elapsed = time.perf_counter() - started
    warm = rss.get("warmup", rss["start"])
    growth = 100.0 * (rss["end"] - warm) / warm if warm > 0 else math.nan
    terminals = sum(tally.terminals.values())
    report: dict[str, Any] = {
        "options": attrs.asdict(opts),
        "transport": "in-process" if opts.in_process else "loopback-http",
        "requests": opts.requests,
        "terminals": terminals,
        "terminals_by_kind": dict(sorted(tally.terminals.items())),
        "failed_by_kind": dict(sorted(tally.failed_kinds.items())),
        "faults_injected": dict(sorted(tally.faults.items())),
        "cancels_requested": tally.cancels_requested,
        "retries": tally.retries,
        "events": tally.events,
        "one_terminal_violations": tally.one_terminal_violations,
        "text_mismatches": tally.text_mismatches,
        "leaked_requests": leaked,
        "clean_requests_not_completed": tally.clean_not_completed,
        "rss_kib": rss,
        "rss_growth_after_warmup_pct": round(growth, 2),
        "fds": {"start": fds_start, "end": fds_end},
        "trio_tasks": {"start": tasks_start, "end": tasks_end},
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(opts.requests / elapsed, 1) if elapsed > 0 else None,
        "examples": tally.examples,
    }
    report["checks"] = {
        "one_terminal_violations == 0": tally.one_terminal_violations == 0,
        "text_mismatches == 0": tally.text_mismatches == 0,
        "leaked_requests == 0": leaked == 0,
        "terminals == requests": terminals == opts.requests,
        "rss growth after warm-up < 5%": growth < 5.0,
        "fds back to start": fds_end <= fds_start,
        "trio tasks back to start": tasks_end <= tasks_start,
    }
    report["ok"] = all(report["checks"].values())
    return report


def format_table(report: dict[str, Any]) -> str:
    rss = report["rss_kib"]
    rows: list[tuple[str, str]] = [
        ("transport", report["transport"]),
        ("requests", f"{report['requests']:,}"),
        ("terminals", f"{report['terminals']:,}"),
        *((f"  {k}", f"{v:,}") for k, v in report["terminals_by_kind"].items()),
        ("failed by kind", ", ".join(f"{k}={v}" for k, v in report["failed_by_kind"].items())),
        ("faults injected", ", ".join(f"{k}={v}" for k, v in report["faults_injected"].items())),
        ("cancels requested", f"{report['cancels_requested']:,}"),
        ("retries (Retrying events)", f"{report['retries']:,}"),
        ("events", f"{report['events']:,}"),
        ("one-terminal violations (must be 0)", str(report["one_terminal_violations"])),
        ("final-text mismatches (must be 0)", str(report["text_mismatches"])),
        ("requests still active (must be 0)", str(report["leaked_requests"])),
        ("clean requests not completed", str(report["clean_requests_not_completed"])),
        (
            "RSS KiB start/warm-up/middle/end",
            " / ".join(
                f"{rss.get(k, '-'):,}" if k in rss else "-"
                for k in ("start", "warmup", "middle", "end")
            ),
        ),
        ("RSS growth after warm-up", f"{report['rss_growth_after_warmup_pct']} %"),
        ("open fds start/end", f"{report['fds']['start']} / {report['fds']['end']}"),
        (
            "trio tasks start/end",
            f"{report['trio_tasks']['start']} / {report['trio_tasks']['end']}",
        ),
        ("elapsed", f"{report['elapsed_s']} s ({report['requests_per_s']} req/s)"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"check: {name}: {'ok' if ok else 'FAILED'}" for name, ok in report["checks"].items()]
    lines += [f"example: {text}" for text in report["examples"][:5]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--fault-rate", type=float, default=0.10)
    parser.add_argument("--cancel-rate", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=2.0,
        help="first-token and idle timeout in seconds; a stall fault lasts twice as long",
    )
    parser.add_argument("--json", type=Path, default=_DEFAULT_JSON)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="use the in-memory EmulatorTransport instead of loopback HTTP",
    )
    args = parser.parse_args(argv)
    opts = SoakOptions(
        requests=args.requests,
        concurrency=args.concurrency,
        fault_rate=args.fault_rate,
        cancel_rate=args.cancel_rate,
        seed=args.seed,
        in_process=args.in_process,
        idle_timeout=args.idle_timeout,
    )
    report = trio.run(run_soak, opts)
    report["command"] = " ".join(["python", "benchmarks/soak.py", *(argv or sys.argv[1:])])
    print(format_table(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
