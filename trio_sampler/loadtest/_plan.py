"""What a load test is: the target, the workload, the load shapes, the limits and the SLOs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from ..actor._memory import STREAM_OVERHEAD
from ..config import SamplerConfig
from ..wire import backend_name
from ._stats import SLO
from ._workload import SyntheticWorkload, Workload

__all__ = [
    "LOADGEN_STREAM_BYTES",
    "MIN_STREAM_BYTES",
    "RUN_MEMORY_CAP",
    "Concurrency",
    "Limits",
    "Load",
    "LoadTest",
    "Rate",
    "minimum_memory_cap",
]

#: The response text a whole run may hold by default: 1 GiB (a sampler's own default).
RUN_MEMORY_CAP = 1 << 30

#: What the load generator holds per stream in flight beyond what its samplers' memory
#: accounts count: the request's record and timings, its task, the worker's
#: per-request state, and the memory the process keeps as the streams the cap stops are
#: replaced (their text freed in pieces the allocator keeps). Measured with
#: ``benchmarks/memory_cap.py --loadtest 1000`` against a server that never ends its
#: answers (the process's RSS growth less the samplers' part of the cap): 280 MiB at a
#: 256 MiB cap, where streams are stopped and replaced all the time, 156 MiB at 1 GiB.
#: The run's cap reserves this much per stream.
LOADGEN_STREAM_BYTES = 288 * 1024
#: The least a run's cap must give each stream it runs at once: the load generator's
#: part, the sampler's overhead and 16 KiB of response text.
MIN_STREAM_BYTES = LOADGEN_STREAM_BYTES + STREAM_OVERHEAD + 16 * 1024


def minimum_memory_cap(streams: int) -> int:
    """The smallest run memory cap that holds ``streams`` streams at once, rounded up to a
    whole MiB."""
    return -(-streams * MIN_STREAM_BYTES // (1 << 20)) * (1 << 20)


def _finite_seconds(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (isinstance(value, int | float) and 0 <= value < math.inf):
        raise ValueError(
            f"{attribute.name} must be a finite number of seconds, 0 or more; got {value!r}"
        )


@attrs.frozen
class Concurrency:
    """Closed loop: ``streams`` requests in flight at all times; each stream sends its next
    request as soon as the previous one ends.

    Args:
        streams: the requests in flight.
        ramp_s: the streams start evenly spread over this many seconds (stream ``k`` at
            ``k * ramp_s / streams``) instead of all at once. Started together, streams
            against a server with steady latencies stay in step: every request of a round
            is sent in the same instant and every token arrives in the same burst, so the
            client (and the server) see ``streams`` events at once where a steady load
            would spread them, and the latencies measured include that queueing. A ramp
            of about one request's duration spreads them evenly; set the warm-up
            (``Limits.warmup_s``) to at least the ramp plus one request so only the
            steady state is measured.
    """

    streams: int = attrs.field(validator=attrs.validators.ge(1))
    ramp_s: float = attrs.field(default=0.0, validator=_finite_seconds, kw_only=True)
    #: This worker's first start (seconds) and the gap between its streams' starts, when
    #: the streams are split over workers (see :meth:`share`); ``None``: ``ramp_s / streams``.
    phase: float = attrs.field(default=0.0, kw_only=True)
    spacing: float | None = attrs.field(default=None, kw_only=True)

    def share(self, worker: int, workers: int) -> Concurrency | None:
        """This worker's part (``None`` if it gets no stream). Worker ``w`` runs the streams
        ``w, w + workers, w + 2 * workers, ...`` of the whole, with their start times."""
        streams = self.streams // workers + (1 if worker < self.streams % workers else 0)
        if not streams:
            return None
        if not self.ramp_s:
            return Concurrency(streams)
        step = self.ramp_s / self.streams
        return Concurrency(streams, ramp_s=self.ramp_s, phase=worker * step, spacing=workers * step)

    def start_offset(self, stream: int) -> float:
        """Seconds after the stage's start at which stream ``stream`` (from 0) starts."""
        spacing = self.ramp_s / self.streams if self.spacing is None else self.spacing
        return self.phase + stream * spacing

    def participants(self, workers: int) -> int:
        """How many of ``workers`` get a share (the first this-many)."""
        return min(workers, self.streams)

    @property
    def peak_streams(self) -> int:
        return self.streams

    def describe(self) -> dict[str, Any]:
        return {"kind": "concurrency", "streams": self.streams, "ramp_s": self.ramp_s}

    def label(self) -> str:
        return f"C={self.streams}"


@attrs.frozen
class Rate:
    """Open loop: requests arrive at ``per_second`` on average, whether or not earlier ones
    have finished, so a server slower than the arrivals queues them (and TTFT rises).

    Args:
        per_second: the mean arrival rate.
        arrivals: ``"poisson"`` (exponential gaps: independent users) or ``"constant"``
            (evenly spaced).
        max_in_flight: a safety cap on requests in flight; arrivals beyond it are counted
            as dropped (never delayed, which would quietly close the loop). ``None``: no cap.
    """

    per_second: float = attrs.field(validator=attrs.validators.gt(0))
    arrivals: Literal["poisson", "constant"] = attrs.field(
        default="poisson", validator=attrs.validators.in_(("poisson", "constant"))
    )
    max_in_flight: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    #: This worker's phase (seconds) for constant arrivals split over workers.
    phase: float = 0.0

    def share(self, worker: int, workers: int) -> Rate:
        cap = None if self.max_in_flight is None else max(1, self.max_in_flight // workers)
        return Rate(
            self.per_second / workers,
            self.arrivals,
            cap,
            phase=worker / self.per_second if self.arrivals == "constant" else 0.0,
        )

    def participants(self, workers: int) -> int:
        return workers

    @property
    def peak_streams(self) -> int:
        return self.max_in_flight or 1024

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "rate",
            "per_second": self.per_second,
            "arrivals": self.arrivals,
            "max_in_flight": self.max_in_flight,
        }

    def label(self) -> str:
        return f"{self.per_second:g}/s"


Load: TypeAlias = Concurrency | Rate


def _positive_or_none(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive (or None for no limit)")


@attrs.frozen
class Limits:
    """How long each stage runs.

    A stage first warms up (requests sent during the first ``warmup_s`` seconds, and the
    first ``warmup_requests`` requests, are not measured), then measures until
    ``duration_s`` seconds have passed since its first measured request or ``requests``
    measured requests have been sent, whichever comes first. It then stops sending and
    waits up to ``drain_timeout_s`` for the requests in flight; those still running are
    cancelled and reported as ``unfinished``.
    """

    duration_s: float | None = attrs.field(default=30.0, validator=_positive_or_none)
    requests: int | None = attrs.field(default=None, validator=_positive_or_none)
    warmup_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    warmup_requests: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    drain_timeout_s: float = attrs.field(default=60.0, validator=attrs.validators.ge(0))

    def __attrs_post_init__(self) -> None:
        if self.duration_s is None and self.requests is None:
            raise ValueError("give a duration_s or a requests limit (or both); neither is set")

    def share(self, worker: int, workers: int) -> Limits | None:
        """This worker's part of the request counts (time limits are the same for all);
        ``None`` if a request limit leaves it nothing to send."""

        def part(total: int) -> int:
            return total // workers + (1 if worker < total % workers else 0)

        if self.requests is None:
            return attrs.evolve(self, warmup_requests=part(self.warmup_requests))
        requests = part(self.requests)
        if not requests:
            return None
        return attrs.evolve(self, requests=requests, warmup_requests=part(self.warmup_requests))

    def describe(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _bytes_or_none(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{attribute.name} must be a whole number of bytes, at least 1 (e.g. 1 << 30), "
            f"or None for no limit; got {value!r}"
        )


def _stages(stages: Iterable[Load]) -> tuple[Load, ...]:
    return tuple(stages)


@attrs.frozen
class LoadTest:
    """A whole load test: run each of ``stages`` in turn against ``config``.

    Args:
        config: the target (base URL, backend, model, key, headers, ``extra_body``).
            Retries are turned off and the connection pool sized for the load: a load
            test measures the server, not the client's recovery.
        stages: the load shapes, in order; several make a sweep.
        workload: what to send.
        limits: how long each stage runs.
        slo: the goodput objectives (none: goodput is not reported).
        workers: processes sharing the load, each running its own sampler; their
            histograms are merged.
        seed: seeds the workload draws and arrivals (worker ``i`` uses ``seed + i``).
        client_cpu_bound: a worker using at least this share of one core is saturated.
        client_lag_bound_ms: an event-loop lag p99 at or above this marks the client bound.
        request_usage: ask the server for its token counts on every backend, including
            Chat Completions profiles that leave ``stream_options.include_usage`` off
            (``openai_compatible``). Turn it off only for a strict server that rejects the
            field; the counts are then the client's (see ``docs/loadtest.md``).
        max_buffered_response_bytes: what all the run's streams may hold together (1 GiB;
            ``None``: no limit). Past it the largest streams fail (counted as
            ``memory_cap`` errors, and the stage marked client-bound). The load
            generator's own cost per stream (:data:`LOADGEN_STREAM_BYTES`) is reserved
            from it for the most streams a stage runs at once; a cap that cannot give
            each of them :data:`MIN_STREAM_BYTES` is refused (:func:`minimum_memory_cap`).
    """

    config: SamplerConfig
    stages: tuple[Load, ...] = attrs.field(converter=_stages)
    workload: Workload = attrs.field(factory=SyntheticWorkload)
    limits: Limits = attrs.field(factory=Limits)
    slo: SLO = attrs.field(factory=SLO)
    workers: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    seed: int = 0
    client_cpu_bound: float = attrs.field(default=0.9, validator=attrs.validators.gt(0))
    client_lag_bound_ms: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    request_usage: bool = True
    max_buffered_response_bytes: int | None = attrs.field(
        default=RUN_MEMORY_CAP,
        validator=_bytes_or_none,
    )

    def __attrs_post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a load test needs at least one stage, e.g. Concurrency(8)")
        for stage in self.stages:
            if not isinstance(stage, Concurrency | Rate):
                raise TypeError(f"a stage is a Concurrency or a Rate, not {stage!r}")
        cap = self.max_buffered_response_bytes
        streams = self.peak_streams
        if cap is not None and cap < streams * MIN_STREAM_BYTES:
            least = minimum_memory_cap(streams) >> 20
            raise ValueError(
                f"max_buffered_response_bytes (--memory-cap) of {cap:,} bytes cannot hold "
                f"{streams:,} streams at once: each costs the load generator and its sampler "
                f"{MIN_STREAM_BYTES >> 10} KiB before its response text; write at least "
                f"--memory-cap={least}MiB (max_buffered_response_bytes={least} << 20), or "
                "none for no cap"
            )

    @property
    def peak_streams(self) -> int:
        """The most streams the run holds at once: over the workers, the sum of each
        one's most streams in a stage (what the memory cap reserves for)."""
        total = 0
        for worker in range(self.workers):
            shares = [stage.share(worker, self.workers) for stage in self.stages]
            total += max((s.peak_streams for s in shares if s is not None), default=0)
        return max(total, 1)

    def describe(self) -> dict[str, Any]:
        """The test as stored in the results (no key, no header values)."""
        return {
            "target": {
                "base_url": self.config.base_url,
                "backend": backend_name(self.config.backend),
                "model": self.config.model,
                "extra_headers": sorted({name for name, _ in self.config.extra_headers}),
                "extra_body": _plain(self.config.extra_body),
            },
            "workload": self.workload.describe(),
            "limits": self.limits.describe(),
            "slo": self.slo.describe(),
            "workers": self.workers,
            "seed": self.seed,
            "max_buffered_response_bytes": self.max_buffered_response_bytes,
        }


def _plain(value: Mapping[str, Any] | Sequence[Any] | Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | None) else repr(value)
