"""``trio-sampler loadtest``: benchmark a model server; ``loadtest compare`` / ``report``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from ..types import ApiBackend
from ._errors import backend_choice

__all__ = ["add_parser"]

_EXTRA = "needs the loadtest extra: pip install 'trio-sampler[loadtest]'"
_LOADTEST_MODULES = ("hdrh", "rich", "matplotlib")


def _numbers(kind: type, text: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write a comma-separated list of numbers, e.g. 1,8,64"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be positive")
    return values


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _size(text: str) -> int | None:
    """``1GiB``, ``512MiB``, ``65536`` (bytes) or ``none`` (no cap)."""
    spec = text.strip().lower()
    if spec == "none":
        return None
    number = spec.rstrip("kmgib")
    unit = spec[len(number) :]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: write a size such as 1GiB, 512MiB or 65536 (bytes), or none"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the cap must be at least one byte")
    return int(value)


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME:VALUE")
    return name.strip(), value.strip()


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON; write e.g. '{{\"min_tokens\": 8}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--extra-body must be a JSON object")
    return value


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "loadtest",
        help="benchmark a model server (closed or open loop) and report its latencies",
        description=(
            "Send a workload to a model server at fixed concurrencies (closed loop) or "
            "arrival rates (open loop) and report TTFT, ITL, TPOT, end-to-end latency, "
            "throughput and goodput per stage. See docs/loadtest.md."
        ),
    )
    target = parser.add_argument_group("target")
    target.add_argument("--provider", help="a provider profile (default: openai_compatible)")
    target.add_argument("--base-url", help="the endpoint, e.g. http://127.0.0.1:8000/v1")
    target.add_argument("--backend", type=backend_choice, choices=[b.value for b in ApiBackend])
    target.add_argument("--model", help="the model name the server expects")
    target.add_argument(
        "--api-key-env", metavar="VAR", help="read the API key from this environment variable"
    )
    target.add_argument(
        "--header",
        type=_header,
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="an extra request header (repeatable)",
    )
    target.add_argument(
        "--extra-body",
        type=_json_object,
        metavar="JSON",
        help="extra top-level fields for every request body, e.g. '{\"min_tokens\": 8}'",
    )
    target.add_argument(
        "--ignore-eos",
        action="store_true",
        help='send "ignore_eos": true (vLLM, SGLang): generate exactly max_tokens',
    )
    target.add_argument(
        "--no-usage",
        action="store_true",
        help=(
            "do not send stream_options.include_usage (only for a strict server that "
            "rejects it): token counts are then counted events and planned lengths"
        ),
    )
    load = parser.add_argument_group("load (one of)")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument(
        "--concurrency",
        type=lambda t: _numbers(int, t),
        metavar="N[,N...]",
        help="closed loop: streams in flight; several values sweep (default: 8)",
    )
    shape.add_argument(
        "--rate",
        type=lambda t: _numbers(float, t),
        metavar="R[,R...]",
        help="open loop: requests per second; several values sweep",
    )
    load.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=(
            "closed loop: start the streams evenly over this many seconds instead of all at "
            "once (about one request's duration; keep --warmup above ramp + one request)"
        ),
    )
    load.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson")
    load.add_argument(
        "--max-in-flight", type=int, help="open loop: drop (and count) arrivals beyond this"
    )
    limits = parser.add_argument_group("limits, per stage")
    limits.add_argument("--duration", type=float, help="seconds measured (default: 30)")
    limits.add_argument("--requests", type=int, help="requests measured")
    limits.add_argument("--warmup", type=float, default=0.0, help="seconds not measured first")
    limits.add_argument("--warmup-requests", type=int, default=0, help="requests not measured")
    limits.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to wait at the end"
    )
    work = parser.add_argument_group("workload")
    work.add_argument(
        "--input-tokens",
        default="256",
        metavar="DIST",
        help="N, uniform:LO:HI, normal:MEAN:SD or histogram:N=W,... (default 256)",
    )
    work.add_argument(
        "--output-tokens",
        metavar="DIST",
        help="max_tokens per request, same forms (default 128; dataset: its own)",
    )
    work.add_argument("--prefix-tokens", type=int, default=0, help="shared prefix length")
    work.add_argument("--prefix-groups", type=int, default=1, help="distinct shared prefixes")
    work.add_argument("--dataset", type=Path, help="a JSONL file of conversations instead")
    work.add_argument("--dataset-limit", type=int, help="use the first N conversations")
    slo = parser.add_argument_group("goodput objectives (ms)")
    slo.add_argument("--slo-ttft", type=float, metavar="MS")
    slo.add_argument("--slo-tpot", type=float, metavar="MS")
    slo.add_argument("--slo-e2e", type=float, metavar="MS")
    run = parser.add_argument_group("running and output")
    run.add_argument("--workers", type=int, default=1, help="processes sharing the load")
    run.add_argument(
        "--http-transport",
        choices=("direct", "httptools", "httpx"),
        help=(
            "the samplers' HTTP transport (default: httptools where installed, about half "
            "the client CPU per token of direct; else direct)"
        ),
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--memory-cap",
        type=_size,
        default=1 << 30,
        metavar="SIZE",
        help=(
            "what all streams of the run may hold together (default 1GiB; none: no cap), "
            "at least 352KiB per stream at once; past it the largest streams fail as "
            "memory_cap errors"
        ),
    )
    run.add_argument("--json", type=Path, metavar="PATH", help="write the results JSON")
    run.add_argument("--csv", type=Path, metavar="PATH", help="write one CSV row per stage")
    run.add_argument("--html", type=Path, metavar="PATH", help="write the HTML report")
    run.add_argument("--no-progress", action="store_true", help="no live display")
    run.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="CONDITION",
        help=(
            "exit 1 when a stage meets CONDITION (repeatable), e.g. ttft.p99>500ms, "
            "itl.p95>50ms, error_rate>1%%, goodput<95%%, throughput<20; a stage where every "
            "request failed always exits 1"
        ),
    )
    parser.set_defaults(run=run_loadtest)

    tools = parser.add_subparsers(dest="loadtest_command", metavar="[compare | report]")
    compare = tools.add_parser("compare", help="two results side by side")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    compare.add_argument("--html", type=Path, metavar="PATH", help="write a comparison report")
    compare.set_defaults(run=run_compare)
    report = tools.add_parser("report", help="the HTML report of a results JSON")
    report.add_argument("results", type=Path)
    report.add_argument("--html", type=Path, required=True, metavar="PATH")
    report.set_defaults(run=run_report)


def _missing_extra() -> str | None:
    import importlib.util

    for module in _LOADTEST_MODULES:
        if importlib.util.find_spec(module) is None:
            return f"{_EXTRA} ({module} is not installed)"
    return None


def _fail(message: str, status: int = 2) -> int:
    print(f"trio-sampler loadtest: {message}", file=sys.stderr)
    return status


def _fastest_transport() -> str:
    """``httptools`` where it is installed (the ``fast`` or ``loadtest`` extra), else
    ``direct``. At 1,000 streams and 5,000 tokens a second it let one worker keep up
    (0.47 of a core, no read late by a token interval) where the default transport's
    could not (``docs/benchmarks.md``)."""
    import importlib.util

    return "httptools" if importlib.util.find_spec("httptools") is not None else "direct"


def _build(args: argparse.Namespace) -> Any:
    import os

    from ..config import SamplerConfig
    from ..loadtest import (
        SLO,
        Concurrency,
        DatasetWorkload,
        Fixed,
        Limits,
        LoadTest,
        Rate,
        SyntheticWorkload,
        parse_length,
    )

    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["backend"] = ApiBackend(args.backend)
    if args.header:
        overrides["extra_headers"] = tuple(args.header)
    extra_body = dict(args.extra_body or {})
    if args.ignore_eos:
        extra_body["ignore_eos"] = True
    if extra_body:
        overrides["extra_body"] = extra_body
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "").strip()
        if not api_key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that variable is empty or unset")
    overrides["http_transport"] = args.http_transport or _fastest_transport()
    provider = args.provider or "openai_compatible"
    config = SamplerConfig.for_provider(
        provider, model=args.model, base_url=args.base_url, api_key=api_key, **overrides
    )
    if config.model is None:
        raise ValueError(f"provider {provider!r} has no default model: pass --model")
    output = None if args.output_tokens is None else parse_length(args.output_tokens)
    workload: Any
    if args.dataset is not None:
        workload = DatasetWorkload(args.dataset, output_tokens=output, limit=args.dataset_limit)
        workload.load()  # a malformed file fails here, before anything is sent
    else:
        workload = SyntheticWorkload(
            input_tokens=parse_length(args.input_tokens),
            output_tokens=output if output is not None else Fixed(128),
            prefix_tokens=args.prefix_tokens,
            prefix_groups=args.prefix_groups,
            seed=args.seed,
        )
    stages: list[Any]
    if args.rate and args.ramp:
        raise ValueError(
            "--ramp spreads the start of closed-loop streams (--concurrency); an open loop "
            "(--rate) has no streams to spread: drop --ramp"
        )
    if args.rate:
        stages = [Rate(r, args.arrivals, args.max_in_flight) for r in args.rate]
    else:
        stages = [Concurrency(c, ramp_s=args.ramp) for c in (args.concurrency or [8])]
    duration = args.duration if args.duration is not None else (None if args.requests else 30.0)
    limits = Limits(
        duration_s=duration,
        requests=args.requests,
        warmup_s=args.warmup,
        warmup_requests=args.warmup_requests,
        drain_timeout_s=args.drain_timeout,
    )
    slo = SLO(ttft_ms=args.slo_ttft, tpot_ms=args.slo_tpot, e2e_ms=args.slo_e2e)
    return LoadTest(
        config,
        stages,
        workload,
        limits,
        slo,
        workers=args.workers,
        seed=args.seed,
        request_usage=not args.no_usage,
        max_buffered_response_bytes=args.memory_cap,
    )


def run_loadtest(args: argparse.Namespace) -> int:
    missing = _missing_extra()
    if missing is not None:
        return _fail(missing, 1)
    from rich.console import Console

    from ..loadtest import DatasetError, LoadTestError, Threshold, run, verdict
    from ..loadtest._display import LiveDisplay, errors_table, summary_table
    from ..loadtest._report import write_report

    try:
        test = _build(args)
        thresholds = [Threshold.parse(text) for text in args.fail_if]
    except (ValueError, TypeError, DatasetError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    console = Console(stderr=True)
    labels = [stage.label() for stage in test.stages]
    try:
        if args.no_progress:
            result = run(test)
        else:
            with LiveDisplay(console, labels) as display:
                result = run(test, on_progress=display.update)
    except LoadTestError as exc:
        return _fail(str(exc), 1)
    out = _stdout_console()
    out.print(summary_table(result))
    errors = errors_table(result)
    if errors is not None:
        out.print(errors)
    if args.json:
        result.write_json(args.json)
    if args.csv:
        args.csv.write_text(result.csv(), encoding="utf-8")
    if args.html:
        write_report(args.html, [("run", result)])
    failures = verdict(result, thresholds)
    for reason in failures:
        _fail(f"failed: {reason}")
    return 1 if failures else 0


def _stdout_console() -> Any:
    from rich.console import Console

    console = Console()
    # Piped or redirected: no terminal width to fit, so keep the table's columns whole.
    return console if console.is_terminal else Console(width=200)


def _read(path: Path) -> Any:
    from ..loadtest import LoadTestResult

    return LoadTestResult.read(path)


def run_compare(args: argparse.Namespace) -> int:
    missing = _missing_extra()
    if missing is not None:
        return _fail(missing, 1)

    from ..loadtest._display import compare_table, pair_stages
    from ..loadtest._report import write_report

    try:
        a, b = _read(args.a), _read(args.b)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    names = (args.a.stem, args.b.stem)
    if names[0] == names[1]:
        names = (str(args.a), str(args.b))
    pairs, warnings = pair_stages(a, b, names)
    for warning in warnings:
        _fail(f"warning: {warning}")
    if not pairs:
        return _fail(f"{names[0]} and {names[1]} have no stage at the same load to compare", 1)
    _stdout_console().print(compare_table(pairs, names))
    if args.html:
        write_report(args.html, [(names[0], a), (names[1], b)], warnings=warnings)
    return 0


def run_report(args: argparse.Namespace) -> int:
    missing = _missing_extra()
    if missing is not None:
        return _fail(missing, 1)
    from ..loadtest._report import write_report

    try:
        result = _read(args.results)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    write_report(args.html, [(args.results.stem, result)])
    return 0
