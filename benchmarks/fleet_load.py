"""Fleet load: K worker processes, each a sampler with many tasks, behind one shared limit.

Each worker is a separate OS process (``python -m benchmarks.fleet_load``) running one
``open_sampler`` with a :class:`~trio_sampler.fleet.FleetAdmission` on the shared Redis;
it prints ``ready`` once its sampler is open, reads the common start time (wall clock)
from stdin, and its tasks then submit requests back to back until that start plus
``--duration``. Last, it prints one JSON line: per request, the wall-clock time it
completed, its terminal, how many retries and 429s it saw, and the tokens it used. The
fleet tests use it against an emulator that enforces the same limits.

``--estimator count`` reserves each request's prompt by its count rather than the body
estimate (bytes / 4): the worker counts the request once with
:meth:`~trio_sampler.SamplerHandle.count_tokens` (the provider's counting endpoint, so
``--backend`` must be ``responses`` or ``messages``), and the fleet's estimator
(``LimiterSpec(estimator=...)``) returns that count for every attempt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import trio

from trio_sampler import ApiBackend, ConversationRequest, SamplerConfig, User
from trio_sampler.actor import SamplerHandle, open_sampler
from trio_sampler.config import RetryPolicy
from trio_sampler.fleet import (
    FailurePolicy,
    FleetAdmission,
    FleetEvent,
    FleetLimits,
    LeasePolicy,
    LimiterSpec,
    RetryBudgetSpec,
)
from trio_sampler.types import Completed, Failed, Retrying, SamplingErrorKind, StreamStarted
from trio_sampler.wire import WireRequest, build_request

__all__ = ["run_worker", "worker_command"]

REQUEST = ConversationRequest(items=[User("How are you today?")], max_output_tokens=40)


def worker_command(**options: Any) -> list[str]:
    """The argv of one worker process (options as in :func:`_parser`, ``_`` for ``-``)."""
    argv = [sys.executable, "-m", "benchmarks.fleet_load"]
    for key, value in options.items():
        if value is None:
            continue
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--name", required=True, help="the shared limiter's name")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--burst", type=float, default=1.0)
    parser.add_argument("--rpm", type=float)
    parser.add_argument("--tpm", type=float)
    parser.add_argument("--max-retries", type=int, default=4)
    parser.add_argument("--budget-ratio", type=float)
    parser.add_argument("--budget-tokens", type=float, default=10.0)
    parser.add_argument("--script", help="x-emulator-script for every request")
    parser.add_argument("--max-requests", type=int, help="per task (default: until the end)")
    parser.add_argument(
        "--leases",
        choices=("on", "off"),
        default="on",
        help="admit from leases (on: LeasePolicy(), the default) or one round trip each",
    )
    parser.add_argument(
        "--backend", choices=[b.value for b in ApiBackend], default="chat_completions"
    )
    parser.add_argument(
        "--estimator",
        choices=("body", "count"),
        default="body",
        help="the fleet's prompt estimate: body bytes / 4, or the request's count",
    )
    return parser


class CountingEstimator:
    """The fleet's prompt estimate from counts taken ahead of time with
    ``count_tokens`` (the provider's own count), keyed by the rendered request's prompt
    (its input or messages, with its instructions, system prompt and tools)."""

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}

    @staticmethod
    def key(data: Any) -> bytes:
        fields = ("input", "instructions", "messages", "system", "tools")
        return json.dumps([data.get(name) for name in fields], sort_keys=True).encode()

    def __call__(self, wire: WireRequest) -> int | None:
        return self.counts.get(self.key(wire.data))

    async def count(
        self, sampler: SamplerHandle, request: ConversationRequest, config: SamplerConfig
    ) -> int:
        """Count ``request`` with the provider and keep the count for its attempts."""
        counted = await sampler.count_tokens(request)
        if not counted.exact:
            raise SystemExit(f"no counting endpoint: {counted.detail}")
        wire = build_request(config.backend, request, config.build_options())
        self.counts[self.key(wire.data)] = counted.tokens
        return counted.tokens


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    budget = (
        RetryBudgetSpec(ratio=args.budget_ratio, max_tokens=args.budget_tokens)
        if args.budget_ratio
        else None
    )
    counting = CountingEstimator()
    spec = LimiterSpec(
        args.name,
        FleetLimits(
            requests_per_minute=args.rpm,
            tokens_per_minute=args.tpm,
            window_s=args.window,
            burst=args.burst,
        ),
        on_failure=FailurePolicy.FAIL_CLOSED,
        # Generous: the tests run this on a shared machine; a Redis outage is not the
        # subject here (the admission timeout has tests of its own).
        admission_timeout=10.0,
        retry_budget=budget,
        leases=LeasePolicy() if args.leases == "on" else None,
        estimator=counting if args.estimator == "count" else None,
    )
    headers = {"x-emulator-script": args.script} if args.script else {}
    config = SamplerConfig(
        base_url=args.base_url,
        backend=ApiBackend(args.backend),
        model="emulator-1",
        api_key="fleet-test-key",
        extra_headers=headers,
        retry=RetryPolicy(max_retries=args.max_retries, base_delay=0.02, max_delay=0.05),
    )
    records: list[dict[str, Any]] = []
    events: list[FleetEvent] = []
    end_at = 0.0

    async def task(sampler: SamplerHandle) -> None:
        sent = 0
        while time.time() < end_at and (args.max_requests is None or sent < args.max_requests):
            sent += 1
            stream = await sampler.submit(REQUEST)
            retries = rate_limited = 0
            started: float | None = None
            async with stream:
                async for event in stream:
                    if isinstance(event, StreamStarted) and started is None:
                        started = time.time()  # its headers: the server has charged it
                    elif isinstance(event, Retrying):
                        retries += 1
                        rate_limited += event.kind is SamplingErrorKind.RATE_LIMITED
                    elif isinstance(event, Completed | Failed):
                        records.append(
                            {
                                "done": time.time(),
                                "started": started,
                                "ok": isinstance(event, Completed),
                                "error": None if isinstance(event, Completed) else str(event.error),
                                "retries": retries,
                                "rate_limited": rate_limited,
                                "tokens": _tokens(event),
                                "input_tokens": _input_tokens(event),
                            }
                        )

    admission = FleetAdmission(args.redis, spec, on_event=events.append)
    counted = None
    async with open_sampler(config, admission=admission) as sampler:
        if args.estimator == "count":
            counted = await counting.count(sampler, REQUEST, config)
        print("ready", flush=True)
        start_at = float(await trio.to_thread.run_sync(sys.stdin.readline))
        end_at = start_at + args.duration
        await trio.sleep(max(0.0, start_at - time.time()))
        async with trio.open_nursery() as nursery:
            for _ in range(args.tasks):
                nursery.start_soon(task, sampler)
    return {
        "records": records,
        "events": [type(e).__name__ for e in events],
        "counted_prompt_tokens": counted,
    }


def _tokens(event: Completed | Failed) -> int:
    """The tokens a completed request used (input and output), as the provider counts."""
    if not isinstance(event, Completed) or event.response.usage is None:
        return 0
    usage = event.response.usage
    return usage.input_tokens + usage.output_tokens


def _input_tokens(event: Completed | Failed) -> int | None:
    """The prompt tokens a completed request was billed (``None``: not completed)."""
    if not isinstance(event, Completed) or event.response.usage is None:
        return None
    return event.response.usage.input_tokens


def main() -> None:
    args = _parser().parse_args()
    result = trio.run(run_worker, args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
