"""The SamplerActor: runs sampling requests inside the application's structured concurrency.

``open_sampler`` opens the sampler's nursery; every accepted request is a task in it, with
a cancel scope created at once (so a cancel that races the request's start still wins);
its helper tasks (hedged attempts) run in a nursery it opens inside that scope while they
race. Requests never raise into the sampler: a request's failure touches no other request.

Every operation on the sampler (submit, cancel, update_config, the queries) is a
synchronous step in the caller's own task: Trio runs one task at a time, so the sampler's
state needs no messages to stay consistent, and doing the step in place is what makes
``submit`` atomic (the caller gets the stream, or nothing was started) and ``cancel``
immediate (no round trip through another task's queue).

Usage::

    async with open_sampler(config) as sampler:
        stream = await sampler.submit(request)
        async for event in stream:
            ...
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import httpx2
import trio

from .._by_identity import ByIdentity
from .._http import Transport
from .._redact import Redactor, is_credential_name, redactor_for
from ..admission import Admission, AdmissionGate
from ..client import SamplingClient
from ..config import RetryPolicy, SamplerConfig
from ..doom_loop import DoomLoopPolicy
from ..models import ModelCatalog
from ..routing import Route, RouteSnapshot, RoutingPolicy
from ..tokens import TokenCount
from ..types import ConversationRequest, ConversationResponse, TrioSamplerError
from ._count import count_tokens
from ._memory import DEFAULT_MAX_BUFFERED_RESPONSE_BYTES, ResponseMemory
from ._request import RequestRunner
from ._stream import RequestState, RequestStream

__all__ = [
    "DuplicateRequestError",
    "SamplerClosedError",
    "SamplerHandle",
    "open_sampler",
]

#: Batches (network reads) a request may buffer before its HTTP read waits for the consumer.
DEFAULT_MAX_BUFFERED_BATCHES = 16

#: Where generated request ids come from: a generator of their own, seeded from
#: ``os.urandom`` (the source of ``uuid.uuid4``) once per process, and again in a forked
#: child so that it does not repeat its parent's ids. An id has to be unique, not secret:
#: it names the request in its events and in ``cancel``, and is never sent to a server.
#: ``os.urandom`` per id was a ``getrandom`` system call per request.
_IDS = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.seed)


def new_request_id() -> str:
    """A generated request id: ``req_`` and 64 random bits in hex."""
    return f"req_{_IDS.getrandbits(64):016x}"


class SamplerClosedError(TrioSamplerError, RuntimeError):
    """The sampler was shut down; no more requests can be submitted."""


class DuplicateRequestError(TrioSamplerError, ValueError):
    """A request with this id is still running."""


class _SamplerActor:
    """The sampler's state: the requests' nursery and the table of live requests."""

    def __init__(
        self,
        config: SamplerConfig,
        runner: RequestRunner,
        nursery: trio.Nursery,
        *,
        max_buffered_batches: int,
        routing: RoutingPolicy | None = None,
    ) -> None:
        self.config = config
        self.routing = routing
        self.runner = runner
        self.nursery = nursery
        self.max_buffered_batches = max_buffered_batches
        self.token = trio.lowlevel.current_trio_token()
        #: Requests whose terminal is not recorded yet.
        self.live: dict[str, RequestState] = {}
        self.closed = False
        #: Per (config, chain): the redactor of requests without credential headers of
        #: their own, beside the chain it was made for.
        self._redactors: ByIdentity[tuple[tuple[Route, ...] | None, Redactor]] = ByIdentity()

    def submit(
        self,
        request_id: str,
        request: ConversationRequest,
        config: SamplerConfig | None,
        chain: tuple[Route, ...] | None = None,
    ) -> RequestStream:
        """Register the request and start its task. Synchronous: nothing between the
        request starting and the caller holding its stream can be interrupted."""
        if self.closed:
            raise SamplerClosedError("the sampler is shut down; open a new one to submit")
        if request_id in self.live:
            raise DuplicateRequestError(
                f"request id {request_id!r} is already running; use a unique id "
                "per request (or omit it to get a generated one)"
            )
        if config is None and chain is None and self.routing is not None:
            chain = self.routing.routes
        config = config or self.config  # a snapshot: later updates don't apply
        state = RequestState(
            request_id=request_id,
            request=request,
            config=config,
            scope=trio.CancelScope(),
            credit=self.max_buffered_batches,
            submitted_at=trio.current_time(),
            live=self.live,
            redactor=self._redactor(config, chain, request.extra_headers),
            chain=chain,
        )
        state.metrics.catalog = self.runner.catalog
        try:
            self.nursery.start_soon(
                self.runner.serve, state, name=f"trio_sampler request {request_id}"
            )
        except RuntimeError:  # the nursery has closed: the sampler is gone
            raise SamplerClosedError("the sampler is shut down; open a new one to submit") from None
        self.live[request_id] = state
        return RequestStream(state, self.token)

    def _redactor(
        self,
        config: SamplerConfig,
        chain: tuple[Route, ...] | None,
        extra_headers: Mapping[str, str],
    ) -> Redactor:
        """The redactor of every credential the request may carry: its config's, each
        route's, and credential-named headers of its own. Without credential-named
        headers of its own (none, or others such as a trace id), the same one for every
        request of a config and chain (both immutable), found by identity (the sampler's
        config and its routing's chain come again each time), unless a config's
        credentials change (SigV4: a refreshed session token)."""
        configs = (config, *(route.config for route in chain or ()))
        own = any(map(is_credential_name, extra_headers))
        cacheable = not own and not any(c.credentials_change for c in configs)
        if cacheable:
            found = self._redactors.get(config, id(chain))
            if found is not None and found[0] is chain:
                return found[1]
        headers = extra_headers.items()
        credentials = list(config.credentials(headers))
        for route in chain or ():
            credentials += route.config.credentials(headers)
        redactor = redactor_for(tuple(credentials))
        if cacheable:
            self._redactors.put(config, (chain, redactor), id(chain))
        return redactor

    def shutdown(self) -> None:
        """Synchronous: usable from a cancelled context (leaving ``open_sampler``)."""
        self.closed = True
        for state in list(self.live.values()):
            state.cancel("the sampler was shut down")
        # Connections still being drained after a completed stream are closed.
        self.runner.drains.close()


@attrs.frozen(eq=False)
class SamplerHandle:
    """The way in to a running sampler: cheap to copy, safe to use from any task.

    Each method is one synchronous step on the sampler's state plus a checkpoint, so
    none of them can be left half done by a cancellation.
    """

    _actor: _SamplerActor

    @property
    def config(self) -> SamplerConfig:
        """The default configuration of later submits (see :meth:`update_config`)."""
        return self._actor.config

    @property
    def routing(self) -> RoutingPolicy | None:
        """The sampler's routing policy (``None`` without routing)."""
        return self._actor.routing

    async def submit(
        self,
        request: ConversationRequest,
        *,
        config: SamplerConfig | None = None,
        request_id: str | None = None,
        chain: Sequence[str | Route] | None = None,
    ) -> RequestStream:
        """Start a request; returns its event stream at once (the request runs meanwhile).

        ``config`` overrides the sampler's configuration for this request only (it then
        goes to that endpoint alone, without routing). ``chain`` names the routes of the
        sampler's :class:`~trio_sampler.routing.RoutingPolicy` this request runs along, in
        order (default: the policy's chain); an unknown name raises ``ValueError``. A
        :class:`~trio_sampler.routing.Route` in ``chain`` stands, for this request, in place
        of the policy's route of that name (e.g. the same route with fresh credentials).
        Raises :class:`DuplicateRequestError` if ``request_id`` is still running, and
        :class:`SamplerClosedError` once the sampler is shutting down.

        Atomic: if the calling task is cancelled, ``submit`` raises ``trio.Cancelled`` and
        no request was started; if it returns, the caller holds the stream (and dropping
        the stream cancels the request).
        """
        if not isinstance(request, ConversationRequest):
            raise TypeError(
                "submit() takes a ConversationRequest, e.g. "
                f'ConversationRequest(items=[User("hello")]); got {type(request).__name__}'
            )
        if config is not None and not isinstance(config, SamplerConfig):
            raise TypeError(
                f"config must be a SamplerConfig (or None), not {type(config).__name__}"
            )
        routes = self._chain(chain, config)
        # The one checkpoint comes first: a cancellation lands before anything started.
        await trio.lowlevel.checkpoint()
        return self._actor.submit(request_id or new_request_id(), request, config, routes)

    def _chain(
        self, chain: Sequence[str | Route] | None, config: SamplerConfig | None
    ) -> tuple[Route, ...] | None:
        if chain is None:
            return None
        routing = self._actor.routing
        if routing is None:
            raise ValueError(
                "chain= names routes of the sampler's routing policy; open the sampler "
                'with open_sampler(config, routing=RoutingPolicy([Route("primary", ...), ...]))'
            )
        if config is not None:
            raise ValueError(
                "pass either config= (one endpoint, no routing) or chain= (routes of the "
                "sampler's routing policy), not both"
            )
        if isinstance(chain, str):
            return routing.chain(chain)  # refused there, with what to write
        names = [link.name if isinstance(link, Route) else link for link in chain]
        standing_in = {link.name: link for link in chain if isinstance(link, Route)}
        return tuple(standing_in.get(route.name, route) for route in routing.chain(names))

    async def count_tokens(
        self, request: ConversationRequest, *, config: SamplerConfig | None = None
    ) -> TokenCount:
        """``request``'s input tokens before it is sent, on the sampler's endpoint (or
        ``config``'s): the provider's count where it has a counting endpoint (Messages
        ``count_tokens``, Responses ``input_tokens``; ``exact``), else the body's length
        over 4 (``exact=False``, saying why). Not paced nor admitted: counting is not
        sampling. Raises :class:`~trio_sampler.types.SamplingError` when the endpoint
        fails, ``ValueError`` for a request the backend cannot carry."""
        if not isinstance(request, ConversationRequest):
            raise TypeError(
                "count_tokens() takes a ConversationRequest, e.g. "
                f'ConversationRequest(items=[User("hello")]); got {type(request).__name__}'
            )
        return await count_tokens(
            self._actor.runner.attempts.client, request, config or self._actor.config
        )

    async def route_stats(self) -> dict[str, RouteSnapshot]:
        """Per route of the sampler's routing policy: its circuit's state and counters
        (empty without routing), as they stand now."""
        await trio.lowlevel.checkpoint()
        return {name: state.snapshot() for name, state in self._actor.runner.routes.items()}

    async def submit_and_collect(
        self,
        request: ConversationRequest,
        *,
        config: SamplerConfig | None = None,
        chain: Sequence[str | Route] | None = None,
    ) -> ConversationResponse:
        """Run a request to its end and return the response.

        Raises :class:`SamplingError` (with the ``Failed`` info and partial output) or
        :class:`RequestCancelledError`. Cancelling the awaiting task cancels the request,
        and the call returns (raising ``trio.Cancelled``) only once the request is over.
        """
        stream = await self.submit(request, config=config, chain=chain)
        async with stream:  # no checkpoint between submit returning and entering
            result = await stream.result()
        return result.unwrap()

    async def cancel(self, request_id: str, reason: str = "cancelled by the caller") -> None:
        """Cancel a request; a no-op if it has finished, is unknown, or the sampler is
        shut down. The cancel is done before the checkpoint, so it happens even when the
        calling task is itself being cancelled."""
        state = self._actor.live.get(request_id)
        if state is not None:
            state.cancel(reason)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def update_config(self, config: SamplerConfig) -> None:
        """Replace the default configuration for later submits (in-flight ones keep theirs)."""
        if not isinstance(config, SamplerConfig):
            raise TypeError(f"update_config() takes a SamplerConfig, not {type(config).__name__}")
        if self._actor.closed:
            raise SamplerClosedError("the sampler is shut down; open a new one to submit")
        self._actor.config = config
        await trio.lowlevel.checkpoint()

    async def is_active(self, request_id: str) -> bool:
        """Whether the request is running (its terminal is not recorded yet)."""
        await trio.lowlevel.checkpoint()
        return request_id in self._actor.live

    async def active_count(self) -> int:
        """How many requests are running (0 once the sampler is shut down)."""
        await trio.lowlevel.checkpoint()
        return len(self._actor.live)


def open_sampler(
    config: SamplerConfig | None = None,
    *,
    retry_policy: RetryPolicy | None = None,
    doom_loop: DoomLoopPolicy | None = None,
    max_concurrency: int | None = None,
    max_buffered_batches: int = DEFAULT_MAX_BUFFERED_BATCHES,
    transport: Transport | httpx2.AsyncBaseTransport | None = None,
    seed: int | None = None,
    models: ModelCatalog | None = None,
    admission: Admission | None = None,
    routing: RoutingPolicy | None = None,
    max_buffered_response_bytes: int | None = DEFAULT_MAX_BUFFERED_RESPONSE_BYTES,
) -> AbstractAsyncContextManager[SamplerHandle]:
    """Run a sampler for the duration of the block: ``async with open_sampler(config) as
    sampler:``.

    The sampler's nursery lives inside the block. Leaving the block (normally, by an
    exception, or because the enclosing scope was cancelled) gives every in-flight request
    its ``Cancelled`` terminal at once and waits for their tasks to finish; from then on
    ``submit`` raises :class:`SamplerClosedError` and ``cancel`` is a no-op.

    Bad arguments raise here, at the call, not when the block is entered.

    Args:
        config: the default configuration (see :class:`SamplerConfig`). Optional with
            ``routing``: the sampler then has no endpoint of its own (its default is the
            first route's config without a ``Timeouts.total``; ``docs/routing.md``).
        retry_policy: replaces ``config.retry`` for every request; on a routed sampler,
            every route's (allowed only when no route sets its own).
        doom_loop: doom-loop detection and resampling (on by default).
        max_concurrency: at most this many attempts talk to the server at once (a hedge
            is one more; a request waiting out its retry backoff holds none); the rest
            wait their turn (cancellable, inside ``Timeouts.total``). ``None``: no limit.
        max_buffered_batches: network reads a request may buffer for a slow consumer.
        transport: what replaces the network: a transport of the library's seam
            (``trio_sampler._http.Transport``: the emulator's in-memory
            ``EmulatorTransport``, a scripted one in tests), or an ``httpx2`` transport,
            run through ``httpx2.AsyncClient``. The same actor code runs over any.
        seed: seeds the jitter so runs are reproducible.
        models: prices used to compute a response's cost when the server reports none
            (default: the shipped ``default_models.json``).
        admission: asked before every attempt and told after it (see
            :mod:`trio_sampler.admission`), e.g. limits shared by a fleet of processes
            (:class:`trio_sampler.fleet.FleetAdmission`); opened and closed with the sampler.
        routing: run requests along a chain of routes, with fail-over, circuit breakers
            and optional hedging (:class:`~trio_sampler.routing.RoutingPolicy`,
            ``docs/routing.md``). A ``config`` given beside it bounds every request end to
            end with its ``Timeouts.total``, and is what ``submit(config=...)`` overrides.
        max_buffered_response_bytes: response text all in-flight requests may hold
            together (1 GiB by default; ``None``: no sampler-wide limit). Past it the
            largest streams end in ``Failed`` (``error_code="sampler_memory_cap"``, not
            retried) until the total is back under it. One stream alone never holds more
            than its ``max_response_bytes``.
    """
    _check_type("retry_policy", retry_policy, RetryPolicy | None, "RetryPolicy(max_retries=2)")
    _check_type(
        "routing",
        routing,
        RoutingPolicy | None,
        'RoutingPolicy([Route("primary", config), Route("fallback", other)])',
    )
    config = sampler_config(config, routing, retry_policy)
    _check_type("doom_loop", doom_loop, DoomLoopPolicy | None, "DoomLoopPolicy()")
    _check_limits(max_buffered_batches, max_concurrency, max_buffered_response_bytes)
    _check_type(
        "transport",
        transport,
        Transport | httpx2.AsyncBaseTransport | None,
        "an httpx2.AsyncBaseTransport or a trio_sampler._http.Transport",
    )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, not {seed!r}")
    _check_type("models", models, ModelCatalog | None, "ModelCatalog.load()")
    if admission is not None and not isinstance(admission, Admission):
        raise TypeError(
            "admission must be an Admission such as trio_sampler.fleet.FleetAdmission(...), "
            f"not a {type(admission).__name__}"
        )
    if admission is not None:  # one with limits per route checks their names
        admission.check_routes(None if routing is None else routing.names)
    for own, names in _route_admissions(routing):  # each route's own, with its routes
        own.check_routes(tuple(names))
    return _open_sampler(
        config,
        retry_policy=retry_policy,
        doom_loop=doom_loop,
        max_concurrency=max_concurrency,
        max_buffered_batches=max_buffered_batches,
        transport=transport,
        seed=seed,
        models=models,
        admission=admission,
        routing=routing,
        max_buffered_response_bytes=max_buffered_response_bytes,
    )


def sampler_config(
    config: SamplerConfig | None, routing: RoutingPolicy | None, retry_policy: RetryPolicy | None
) -> SamplerConfig:
    """The sampler's own config, and the precedence of sampler-level over route-level
    policies, checked (``docs/routing.md``, "What applies where"):

    * without ``config``, a routed sampler's default is its first route's config with no
      ``Timeouts.total`` of its own: each route's bounds the attempts made on it;
    * ``retry_policy=`` replaces every route's ``config.retry``, so a route that sets its
      own is refused (which one would win is not for us to guess);
    * a base ``config`` at no route's endpoint whose ``retry`` is not the default is
      refused: routed requests would never use it.
    """
    if config is None:
        if routing is None:
            raise TypeError(
                "open_sampler needs an endpoint: open_sampler(config) or open_sampler(routing="
                'RoutingPolicy([Route("primary", config), ...]))'
            )
        first = routing.routes[0].config
        config = first.evolve(timeouts=attrs.evolve(first.timeouts, total=None))
    _check_type("config", config, SamplerConfig, "SamplerConfig(base_url=..., model=...)")
    if routing is None:
        return config
    default = RetryPolicy()
    own = [route.name for route in routing.routes if route.config.retry != default]
    if retry_policy is not None and own:
        raise ValueError(
            f"retry_policy= would replace the retry policy route {own[0]!r} sets its own; "
            f"set it on each route instead (Route({own[0]!r}, config.evolve(retry="
            "RetryPolicy(...)))), or leave every route's at the default"
        )
    at_a_route = any(
        (route.config.base_url, route.config.backend) == (config.base_url, config.backend)
        for route in routing.routes
    )
    if not at_a_route and config.retry != default:
        raise ValueError(
            "the sampler's config.retry applies to no routed request (each route's "
            "config.retry does); set it on the routes, or pass retry_policy= to apply one "
            "policy to every route"
        )
    return config


def _check_type(name: str, value: object, expected: Any, example: str) -> None:
    if not isinstance(value, expected):
        # The value itself is not shown: a config-like dict may hold a key.
        raise TypeError(f"{name} must be {example}, not a {type(value).__name__}")


def _check_limits(
    max_buffered_batches: object, max_concurrency: object, max_buffered_response_bytes: object
) -> None:
    _check_count("max_buffered_batches", max_buffered_batches, "16")
    if max_concurrency is not None:
        _check_count("max_concurrency", max_concurrency, "100 (or None for no limit)")
    if max_buffered_response_bytes is not None:
        _check_count(
            "max_buffered_response_bytes",
            max_buffered_response_bytes,
            "1 << 30 (or None for no limit)",
        )


def _check_count(name: str, value: object, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be a whole number of at least 1, e.g. {name}={example}; got {value!r}"
        )


def _route_admissions(routing: RoutingPolicy | None) -> list[tuple[Admission, list[str]]]:
    """The admissions the routes carry (``Route(admission=...)``), each once (by
    identity), with the names of the routes that carry it."""
    found: dict[int, tuple[Admission, list[str]]] = {}
    for route in () if routing is None else routing.routes:
        if route.admission is not None:
            found.setdefault(id(route.admission), (route.admission, []))[1].append(route.name)
    return list(found.values())


@asynccontextmanager
async def _open_gates(
    admission: Admission | None, routing: RoutingPolicy | None
) -> AsyncIterator[tuple[AdmissionGate | None, dict[str, AdmissionGate]]]:
    """The sampler's admission gate, and the gate of each route that carries its own
    admission (by route name), all open for the sampler's lifetime."""
    async with AsyncExitStack() as stack:
        gate = None if admission is None else await stack.enter_async_context(admission.open())
        by_route: dict[str, AdmissionGate] = {}
        for own, names in _route_admissions(routing):
            opened = await stack.enter_async_context(own.open())
            by_route.update(dict.fromkeys(names, opened))
        yield gate, by_route


@asynccontextmanager
async def _open_sampler(
    config: SamplerConfig,
    *,
    retry_policy: RetryPolicy | None,
    doom_loop: DoomLoopPolicy | None,
    max_concurrency: int | None,
    max_buffered_batches: int,
    transport: Transport | httpx2.AsyncBaseTransport | None,
    seed: int | None,
    models: ModelCatalog | None,
    admission: Admission | None,
    routing: RoutingPolicy | None,
    max_buffered_response_bytes: int | None,
) -> AsyncIterator[SamplerHandle]:
    rng = random.Random(seed)
    limiter = trio.CapacityLimiter(max_concurrency) if max_concurrency else None
    async with (
        SamplingClient(config, transport=transport) as client,
        _open_gates(admission, routing) as (gate, route_gates),
    ):
        runner = RequestRunner(
            client,
            retry_policy,
            doom_loop or DoomLoopPolicy(),
            rng=rng,
            limiter=limiter,
            catalog=models if models is not None else ModelCatalog.load(),
            admission=gate,
            route_admissions=route_gates,
            routing=routing,
            memory=None
            if max_buffered_response_bytes is None
            else ResponseMemory(max_buffered_response_bytes),
        )
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            runner.drains.open(nursery)
            actor = _SamplerActor(
                config,
                runner,
                nursery,
                max_buffered_batches=max_buffered_batches,
                routing=routing,
            )
            try:
                yield SamplerHandle(actor)
            except BaseException as exc:
                # Re-raised below, outside the nursery: the caller gets their own
                # exception back, not wrapped in an ExceptionGroup by our nursery. (A
                # Cancelled still surfaces at the nursery's exit, inside its scope.)
                body_error = exc
            finally:
                # Every request still running gets its Cancelled terminal now; the
                # nursery then waits for their tasks to close their connections.
                actor.shutdown()
        if body_error is not None:
            raise body_error
