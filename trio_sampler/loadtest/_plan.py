"""What a load test is: the target, the workload, the load shapes, the limits and the SLOs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from ..config import SamplerConfig
from ..wire import backend_name
from ._stats import SLO
from ._workload import SyntheticWorkload, Workload

__all__ = ["Concurrency", "Limits", "Load", "LoadTest", "Rate"]


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
        max_buffered_response_bytes: the response text (and SSE buffers) the whole run
            may hold at once, over every worker and sampler (1 GiB): each of the run's
            samplers gets its share. A stream stopped by it fails with
            ``sampler_memory_cap``, which the report's errors name.
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
    max_buffered_response_bytes: int = attrs.field(
        default=1024 * 1024 * 1024, validator=attrs.validators.gt(0)
    )

    def __attrs_post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a load test needs at least one stage, e.g. Concurrency(8)")
        for stage in self.stages:
            if not isinstance(stage, Concurrency | Rate):
                raise TypeError(f"a stage is a Concurrency or a Rate, not {stage!r}")

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
        }


def _plain(value: Mapping[str, Any] | Sequence[Any] | Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | None) else repr(value)
