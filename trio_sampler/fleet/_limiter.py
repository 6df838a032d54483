"""A limiter shared by every process of a fleet, decided atomically in Redis.

One round trip admits a request: the ADMIT script checks every rate dimension, the
in-flight leases and the shared Retry-After window on Redis's clock, and either reserves
the request's cost (to start now or after a wait it returns) or changes nothing. One
round trip settles it: SETTLE releases its lease and corrects the reservation with the
usage the provider reported.

Redis being unreachable, answering wrongly (a reply of the wrong shape, or noise), or
slower than ``admission_timeout`` is never silent: the call that met it applies the
failure policy (admit under local limits, or refuse with ``FLEET_UNAVAILABLE``) and is
counted. Down (a refused or lost connection, a wrong answer) degrades the limiter at
once; slow degrades it after :data:`SLOW_CALLS_TO_DEGRADE` timeouts in a row (one slow
round trip on a loaded host is not an outage). Degraded (an event, a log warning, a
counter), every call applies the policy at once, and one call at a time probes Redis,
at most every ``probe_interval``. Nothing waits longer than one admission timeout for
Redis.

The call path is short because admission latency is the client's CPU, not Redis's: the
limiters of a client send their scripts on one connection of their own (built from the
client's URL settings, run in the client's pool), queueing ``EVALSHA`` on it directly
(``Connection.create_request``) rather than through the client's command layer, the
connection pool and the ``Script`` object. Concurrent calls share that connection: coredis
writes what they queue in one batch and reads the replies in order. The admission timeout
is the request's own timeout, so no cancel scope of ours wraps a call; a new connection
is only made (within the timeout) when the last one was lost.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import random
import socket
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import coredis
import coredis.exceptions
import trio
from coredis.connection import BaseConnection
from coredis.retry import NoRetryPolicy

from ..admission import AdmissionBusyError, AdmissionRefusedError
from ..retry import RetryBudget
from ..types import RateLimitSnapshot, SamplingErrorInfo, SamplingErrorKind, TrioSamplerError
from ._breaker import BREAKERS, SharedBreaker
from ._events import EventHook, FleetEvent, LimiterDegraded, LimiterRecovered, LimiterStatistics
from ._lease import LeaseBook
from ._local import LocalLimits
from ._scripts import ADMIT, LEASE, NOTE_RETRY_AFTER, RECLAIM, RENEW, SETTLE, SPEND_RETRY, Status
from ._spec import DIMENSIONS, Cost, FailurePolicy, LimiterSpec

__all__ = ["FleetLimiter", "Permit", "open_limiter", "open_limiters", "redis_client"]

logger = logging.getLogger("trio_sampler.fleet")

_US = 1_000_000
# While every in-flight slot is taken, ask again after this long (doubling, jittered).
_POLL_FIRST = 0.002
_POLL_MAX = 0.05
#: An admission reserves its cost only for a start this soon (seconds); one that must wait
#: longer holds nothing meanwhile and asks again (see ``FleetLimiter.acquire``).
RESERVE_AHEAD_S = 0.05
# The local retry budget of a fail-open limiter counts over this window (seconds).
_LOCAL_BUDGET_WINDOW = 10.0


@attrs.define(eq=False)
class Permit:
    """An admitted request: what it reserved, and where (Redis or the local floor)."""

    cost: Cost
    lease: str
    shared: bool
    settled: bool = False
    #: What the provider's answer to this request said of its rate limits, and when (trio's
    #: clock): the settlement clamps the shared state to it.
    rate_limit: RateLimitSnapshot | None = None
    observed_at: float = 0.0
    #: Spent from this process's lease (settled there, no round trip), in ``slot``.
    leased: bool = False
    slot: str = ""


def _refusal(kind: SamplingErrorKind, message: str, code: str) -> AdmissionRefusedError:
    return AdmissionRefusedError(
        SamplingErrorInfo(kind=kind, message=message, retryable=False, error_code=code)
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError | TimeoutError):
        return (
            f"Redis did not answer within the admission timeout, {SLOW_CALLS_TO_DEGRADE} "
            "calls in a row"
        )
    if isinstance(exc, MalformedReplyError):
        return f"Redis answered a script wrongly ({exc})"
    if isinstance(exc, coredis.exceptions.InvalidResponse):
        return f"Redis sent a reply that is not RESP ({exc})"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def _integers(reply: Any, count: int) -> bool:
    return (
        isinstance(reply, list | tuple)
        and len(reply) == count
        and all(type(value) is int for value in reply)
    )


def _admit_reply(reply: Any, _keys: int) -> bool:
    return _integers(reply, 3) and reply[0] in Status.ALL


def _lease_reply(reply: Any, _keys: int) -> bool:
    return _integers(reply, 8) and reply[0] in Status.ALL


def _pair(reply: Any, _keys: int) -> bool:
    return _integers(reply, 2)


def _integer(reply: Any, _keys: int) -> bool:
    return type(reply) is int


def _per_key(reply: Any, keys: int) -> bool:
    return _integers(reply, keys)


class MalformedReplyError(TrioSamplerError):
    """Redis answered a script with a reply of the wrong shape (not our scripts' answer:
    a proxy, another server on the port, a corrupted stream)."""


@attrs.frozen
class _Script:
    """A Lua script, called by its SHA1 (loaded on the first NOSCRIPT), and the shape its
    reply must have (``shape(reply, number of keys)``)."""

    source: str
    shape: Callable[[Any, int], bool]
    sha: str = attrs.field(init=False)

    @sha.default
    def _digest(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


def late_reply(request: Any) -> Any:
    """The reply that came for a coredis request after it timed out (``None``: none, the
    connection failed instead).

    coredis keeps a timed-out request in its connection's queue and resolves it when the
    reply comes, but awaiting it raises the timeout again: the reply is read from the
    request's private ``_result``. The one place the library reads coredis's private
    state (``tests/test_fleet_failures.py`` checks it against the installed coredis)."""
    return getattr(request, "_result", None)


def _left(until: float) -> float:
    """The time left before ``until`` (trio's clock), as a request timeout: coredis reads
    a timeout of 0 as none, so at least a microsecond."""
    return max(until - trio.current_time(), 1e-6)


class _Link:
    """The connection a client's limiters send their scripts on, made anew when lost.

    It is built and run as the client's pool builds its own (the same URL settings: Unix
    socket, TCP or TLS, credentials, database) but is kept out of the pool, so nothing
    else takes it over or queues a blocking command before the limiters' calls."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.connection: BaseConnection | None = None
        self._connecting = trio.Lock()

    async def connect(self) -> BaseConnection:
        async with self._connecting:
            connection = self.connection
            if connection is not None and connection.usable:
                return connection
            if connection is not None:
                connection.invalidate("lost; replaced by a new connection")
                self.connection = None
            pool = self._pool
            assert pool.location is not None
            made: BaseConnection = pool.connection_class(pool.location, **pool.connection_kwargs)
            await pool.task_group.start(made.run)
            self.connection = made
            return made


# Per client (weakly: a client's link goes with it).
_LINKS: weakref.WeakKeyDictionary[coredis.Redis[bytes], _Link] = weakref.WeakKeyDictionary()


def _link(client: coredis.Redis[bytes]) -> _Link:
    link = _LINKS.get(client)
    if link is None:
        link = _LINKS[client] = _Link(client.connection_pool)
    return link


_EVALSHA = b"EVALSHA"
_SCRIPT_LOAD = b"SCRIPT LOAD"
_ADMIT = _Script(ADMIT, _admit_reply)
_SETTLE = _Script(SETTLE, _pair)
_RENEW = _Script(RENEW, _integer)
_SPEND = _Script(SPEND_RETRY, _pair)
_RETRY_AFTER = _Script(NOTE_RETRY_AFTER, _integer)
_BREAKERS = _Script(BREAKERS, _per_key)
_LEASE = _Script(LEASE, _lease_reply)
_RECLAIM = _Script(RECLAIM, _integer)
_SCRIPTS = (_ADMIT, _SETTLE, _RENEW, _SPEND, _RETRY_AFTER, _BREAKERS, _LEASE, _RECLAIM)
#: What to do with the reply of a call given up on (cancelled, or timed out on our side):
#: the reply, or :data:`LOST` when the connection was lost before it came.
_OnLateReply = Callable[[Any], Awaitable[None]]
#: The reply of a call given up on whose connection was lost first: Redis may or may not
#: have run it, so what it may have granted is released (an idempotent release).
LOST: Any = object()
_NOTHING = Cost(0, 0, 0)


# Failures that mean "Redis is not available now"; anything else is a bug of ours.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    trio.TooSlowError,
    OSError,
    coredis.exceptions.ConnectionError,
    TimeoutError,
    coredis.exceptions.BusyLoadingError,
    coredis.exceptions.ReadOnlyError,
    coredis.exceptions.AuthenticationError,
    coredis.exceptions.InvalidResponse,
    MalformedReplyError,
)
#: Of those, the ones that mean slow rather than down.
_SLOW: tuple[type[BaseException], ...] = (trio.TooSlowError, TimeoutError)
#: Calls in a row that ran past the admission timeout before the limiter is degraded.
SLOW_CALLS_TO_DEGRADE = 3
#: The same, or a script the server refused to load.
_UNAVAILABLE_OR_REFUSED: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    coredis.exceptions.ResponseError,
)


class FleetLimiter:
    """Shared limits for one route or account (see :class:`LimiterSpec`).

    Build one with :func:`open_limiter` (which also renews in-flight leases), or let the
    sampler do it (:class:`trio_sampler.fleet.FleetAdmission`).
    """

    def __init__(
        self,
        spec: LimiterSpec,
        client: coredis.Redis[bytes],
        *,
        on_event: EventHook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.spec = spec
        self._client = client
        self._on_event = on_event
        # Per process: jitter must differ between the processes of a fleet.
        self._rng = rng or random.Random(os.urandom(16))
        self._process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._leases: set[str] = set()
        self._serial = 0
        prefix = f"trio_sampler:{{{spec.name}}}"
        self._keys_admit = [
            f"{prefix}:inflight",
            f"{prefix}:retry_after",
            f"{prefix}:retry_budget",
            *(f"{prefix}:gcra:{d}" for d in DIMENSIONS),
        ]
        self._keys_settle = [self._keys_admit[0], *self._keys_admit[3:]]
        self._breaker_prefix = f"{prefix}:breaker:"
        limits = spec.limits
        self._intervals = [
            0.0 if rate is None else limits.window_s * _US / rate for rate in limits.rates()
        ]
        self._tau = limits.window_s * limits.burst * _US
        # What every ADMIT sends the same: lease TTL, in-flight cap, budget deposit (a first
        # attempt's and a retry's), and per dimension its interval and tau.
        budget = spec.retry_budget
        fixed = [math.floor(spec.lease_ttl * _US), limits.max_in_flight or 0]
        self._admit_first = [*fixed, budget.ratio, budget.max_tokens] if budget else [*fixed, 0, 0]
        self._admit_retry = [*fixed, 0, 0]
        self._admit_rates = [(repr(interval), repr(self._tau)) for interval in self._intervals]
        self._lease_ttl_us = fixed[0]
        # The connection the scripts go on (see the module's docstring), shared by the
        # limiters of one client.
        self._link = _link(client)
        self._set_up_local_floor()
        self._degraded_since: float | None = None
        self._probe_at = -math.inf
        #: A call is probing Redis while degraded (the others apply the policy at once).
        self._probing = False
        #: Calls in a row that ran past the admission timeout.
        self._slow_calls = 0
        self._set_up_give_backs()
        self._stats: dict[str, Any] = attrs.asdict(LimiterStatistics())
        self._set_up_lease(prefix)

    def _set_up_lease(self, prefix: str) -> None:
        limits = self.spec.limits
        #: This process's lease (``spec.leases``), refilled one call at a time.
        self._book = (
            None
            if self.spec.leases is None
            else LeaseBook(self.spec.leases, self._intervals, bool(limits.max_in_flight))
        )
        self._refilling = trio.Lock()
        self._refill_on_wire: trio.Event | None = None
        self._refill_status: int | None = Status.ADMITTED
        self._returned_prefix = f"{prefix}:returned:"
        self._granted_prefix = f"{prefix}:granted:"
        #: The last refill Redis answered: its record is dropped with the next lease call.
        self._answered_refill = "-"

    def _set_up_give_backs(self) -> None:
        #: Calls that timed out on our side: their request (resolved when the late reply
        #: comes; None: the reply was lost) and what to do with that reply (a late grant
        #: is given back).
        self._late: list[tuple[Any, _OnLateReply]] = []
        #: Settlements that failed (a lease's release, a lost refill's reclaim), by lease:
        #: the script, keys and arguments, sent again until Redis has them.
        self._unsettled: dict[str, tuple[_Script, list[str], list[Any]]] = {}
        self._wake_give_backs = trio.Event()

    def _set_up_local_floor(self) -> None:
        """The limits a fail-open process keeps alone while Redis is out."""
        spec, budget = self.spec, self.spec.retry_budget
        share = spec.fallback_share or 1.0
        self._local = LocalLimits(spec.limits.scaled(share))
        self._local_budget = (
            None
            if budget is None
            else RetryBudget(
                budget.ratio, _LOCAL_BUDGET_WINDOW, max(1, math.floor(budget.max_tokens * share))
            )
        )
        self._local_retry_after = -math.inf
        #: What the local floor admitted while degraded (charged to Redis on its return).
        self._spent_locally = _NOTHING

    def __repr__(self) -> str:
        return f"FleetLimiter(name={self.spec.name!r}, degraded={self.degraded})"

    @property
    def degraded(self) -> bool:
        """True while Redis is considered unavailable (the failure policy applies)."""
        return self._degraded_since is not None

    def statistics(self) -> LimiterStatistics:
        """A snapshot of this process's counters (admissions, waits, failures, leases)."""
        return LimiterStatistics(
            **{**self._stats, "degraded": self.degraded, "leases": len(self._leases)}
        )

    # -- Redis, with the failure policy --------------------------------------------------

    async def _call(
        self,
        script: _Script,
        keys: Sequence[str],
        args: Sequence[Any],
        abandoned: _OnLateReply | None = None,
        until: float | None = None,
    ) -> Any:
        """Run one script, or return None when Redis is unavailable (the failure policy
        applies): degraded, one call at a time probes it (when ``probe_interval`` allows)
        and the others return None at once. ``until``: the call's deadline on trio's
        clock (by default one admission timeout from now)."""
        if self._degraded_since is None:
            return await self._round_trip(script, keys, args, abandoned, until)
        if self._probing or trio.current_time() < self._probe_at:
            return None
        self._probing = True
        try:
            return await self._round_trip(script, keys, args, abandoned, until)
        finally:
            self._probing = False

    async def _round_trip(
        self,
        script: _Script,
        keys: Sequence[str],
        args: Sequence[Any],
        abandoned: _OnLateReply | None,
        until: float | None = None,
    ) -> Any:
        """One script's round trip, within the admission timeout (or by ``until``); None
        on a failure.

        A call cancelled after its script was queued still runs it (coredis sends what is
        queued and reads its reply in order, so the connection stays in step). With
        ``abandoned`` (what to do with a grant nobody waits for), the cancelled call waits
        for that reply, shielded and within the admission timeout, and hands it over; a
        call that timed out leaves its request to :meth:`run_give_backs`, which hands
        over its late reply when it comes.
        """
        if until is None:
            until = trio.current_time() + self.spec.admission_timeout
        timeout = _left(until)
        request = None
        try:
            connection = self._link.connection
            if connection is None or not connection.usable:
                with trio.fail_after(timeout):
                    connection = await self._link.connect()
                timeout = _left(until)
            request = connection.create_request(
                _EVALSHA, script.sha, len(keys), *keys, *args, decode=False, timeout=timeout
            )
            try:
                reply: Any = await request
            except coredis.exceptions.NoScriptError:
                # Not loaded (Redis restarted or was flushed): load it, then call it again
                # (queued together: one more round trip), within the same admission timeout.
                timeout = _left(until)
                load = connection.create_request(
                    _SCRIPT_LOAD, script.source, decode=False, timeout=timeout
                )
                request = connection.create_request(
                    _EVALSHA, script.sha, len(keys), *keys, *args, decode=False, timeout=timeout
                )
                await load
                reply = await request
            if not script.shape(reply, len(keys)):
                raise MalformedReplyError(f"a reply of the wrong shape: {reply!r}"[:200])
        except trio.Cancelled:
            if abandoned is not None and request is not None:
                with trio.CancelScope(shield=True):
                    await self._give_back(request, abandoned)
            raise
        except _UNAVAILABLE as exc:
            if abandoned is not None and request is not None:
                # Sent: Redis may have run it. Timed out on our side, its late reply is
                # handed over when it comes; lost (the connection, a garbled reply), what
                # it may have granted is released.
                self._late.append((request if isinstance(exc, _SLOW) else None, abandoned))
                self._wake_give_backs.set()
            self._failed(exc)
            return None
        except coredis.exceptions.ResponseError as exc:
            if "script" in str(exc).lower():
                raise  # a broken script is our bug, not an outage
            self._failed(exc)
            return None
        self._answered()
        return reply

    def _answered(self) -> None:
        """Redis answered: slow calls are forgotten, and a degraded limiter recovers (what
        it admitted meanwhile charged to the shared state)."""
        self._slow_calls = 0
        if self._degraded_since is None:
            return
        degraded_for = trio.current_time() - self._degraded_since
        self._degraded_since = None
        logger.warning(
            "fleet limiter %r: Redis is back after %.3f s; shared limits apply again",
            self.spec.name,
            degraded_for,
        )
        self._emit(LimiterRecovered(self.spec.name, degraded_for))
        self._charge_local_spending()
        book = self._book
        if book is not None and book.pending is not None:
            # A give-back that failed while degraded goes now, not at its next retry.
            book.return_now(trio.current_time())

    def _charge_local_spending(self) -> None:
        """Back from an outage: what the local floor admitted meanwhile is charged to the
        shared state (by the give-back task), at most one burst per dimension (older
        admissions no longer weigh on a GCRA cell), so the fleet does not admit a fresh
        burst on top of it."""
        spent, self._spent_locally = self._spent_locally, _NOTHING
        if spent == _NOTHING:
            return
        changes: list[Any] = [""]
        for interval, amount in zip(self._intervals, spent.amounts(), strict=True):
            changes.append(repr(min(interval * amount, self._tau)) if interval else 0)
        changes += ["x"] * len(DIMENSIONS)
        self._unsettled[f"spent-locally:{self._next_lease()}"] = (
            _SETTLE,
            self._keys_settle,
            changes,
        )
        self._wake_give_backs.set()

    async def _give_back(self, request: Any, on_reply: _OnLateReply) -> None:
        """A call whose caller was cancelled mid-call: wait (within the admission
        timeout) for its reply and hand it over (what it reserved goes back)."""
        try:
            with trio.move_on_after(self.spec.admission_timeout) as waited:
                await on_reply(await request)
        except _UNAVAILABLE_OR_REFUSED:
            await on_reply(LOST)  # lost with the connection: released when Redis answers
            return
        if waited.cancelled_caught and not request.complete:  # handed over when it comes
            self._late.append((request, on_reply))
            self._wake_give_backs.set()

    async def _withdraw_granted(self, cost: Cost, lease: str, reply: Any) -> None:
        """The reply of an admission nobody waits for: a grant is given back. Lost (or
        garbled), its slot is released all the same when Redis answers (SETTLE refunds
        only a lease Redis still holds: nothing if the admission never ran)."""
        if reply is not LOST and _admit_reply(reply, 0):
            if reply[0] == Status.ADMITTED:
                await self.withdraw(Permit(cost, lease, shared=True))
        elif lease:
            self._release_when_back(lease, self._withdrawal(cost))

    def _withdrawal(self, cost: Cost) -> list[Any]:
        """SETTLE's changes that give back all of ``cost`` (no clamp)."""
        changes: list[Any] = [
            repr(-interval * amount) if interval else 0
            for interval, amount in zip(self._intervals, cost.amounts(), strict=True)
        ]
        return [*changes, *(["x"] * len(DIMENSIONS))]

    def _release_when_back(self, lease: str, changes: list[Any]) -> None:
        """Settle ``lease`` with ``changes`` as soon as Redis answers (retried every
        admission timeout by :meth:`run_give_backs`; idempotent)."""
        self._unsettled[lease] = (_SETTLE, self._keys_settle, [lease, *changes])
        self._wake_give_backs.set()

    def _failed(self, exc: BaseException) -> None:
        """A call failed: counted; degraded when Redis is down, or slow too many times in
        a row (see the module's documentation)."""
        now = trio.current_time()
        self._stats["redis_failures"] += 1
        if isinstance(exc, MalformedReplyError | coredis.exceptions.InvalidResponse):
            self._stats["malformed_replies"] += 1
        self._probe_at = now + self.spec.probe_interval
        if self._degraded_since is not None:
            return
        if isinstance(exc, _SLOW):
            self._slow_calls += 1
            if self._slow_calls < SLOW_CALLS_TO_DEGRADE:
                logger.info(
                    "fleet limiter %r: a Redis call ran past the admission timeout", self.spec.name
                )
                return
        self._degraded_since = now
        self._stats["degradations"] += 1
        reason = _describe(exc)
        logger.warning(
            "fleet limiter %r: Redis unavailable (%s); applying %s",
            self.spec.name,
            reason,
            self.spec.on_failure.value,
        )
        self._emit(LimiterDegraded(self.spec.name, self.spec.on_failure, reason))

    def _emit(self, event: FleetEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _unavailable(self) -> AdmissionRefusedError:
        self._stats["refused_unavailable"] += 1
        return _refusal(
            SamplingErrorKind.FLEET_UNAVAILABLE,
            f"the fleet limiter {self.spec.name!r} cannot reach Redis and fails closed; "
            "the request was not sent",
            "fleet_unavailable",
        )

    # -- admission -----------------------------------------------------------------------

    async def acquire(
        self,
        cost: Cost,
        *,
        deadline: float = math.inf,
        first_attempt: bool = True,
        within: float | None = None,
    ) -> Permit:
        """Wait until ``cost`` may be spent (cancellable), and reserve it.

        ``deadline`` is on trio's clock (``Timeouts.total``): a wait that would end after
        it is refused at once, without reserving anything. A ``first_attempt`` (not a
        retry) also deposits into the fleet retry budget. Raises :class:`AdmissionRefusedError`
        when refused (its ``info`` says why).

        With ``within`` (seconds), the limiter is asked once and waits at most that long:
        a wait past it, a shared Retry-After window, every in-flight slot taken, or a cost
        larger than one burst raise :class:`AdmissionBusyError` instead, with nothing
        reserved (a chain choosing a route passes this one over).
        """
        waited_from = trio.current_time()
        # A lease is not spent inside a Retry-After window this process heard of (the
        # shared ask waits for its end); other processes learn of it at their next refill.
        if (
            self._book is not None
            and deadline > waited_from
            and self._local_retry_after <= waited_from
        ):
            leased = await self._acquire_leased(cost, first_attempt=first_attempt)
            if isinstance(leased, Permit):
                return leased
            if leased is None:
                return await self._acquire_locally(
                    cost, deadline, waited_from, within, first_attempt=first_attempt
                )
        return await self._acquire_shared(cost, deadline, waited_from, within, first_attempt)

    async def _acquire_shared(
        self,
        cost: Cost,
        deadline: float,
        waited_from: float,
        within: float | None,
        first_attempt: bool,
    ) -> Permit:
        """Ask Redis for ``cost`` (one ADMIT per ask) until it is reserved or refused."""
        poll = _POLL_FIRST
        while True:
            now = trio.current_time()
            room = deadline - now
            if room <= 0:
                raise self._too_late(0.0, deadline)
            # Reserved only for a start this close: a request further back queues holding
            # nothing, and asks again when its turn should come (refunds meanwhile move
            # it up), so queued requests do not sit on the budget.
            ahead = RESERVE_AHEAD_S if within is None else max(within, 0.0)
            limit = min(room, ahead)
            lease = self._next_lease() if self.spec.limits.max_in_flight else ""
            args = self._admit_args(cost, limit, lease, first_attempt)
            given_up = functools.partial(self._withdraw_granted, cost, lease)
            reply = await self._call(_ADMIT, self._keys_admit, args, abandoned=given_up)
            if reply is None:
                return await self._acquire_locally(
                    cost, deadline, waited_from, within, first_attempt=first_attempt
                )
            status, value = int(reply[0]), int(reply[1])
            if status == Status.ADMITTED:
                if lease:
                    self._leases.add(lease)
                if first_attempt:
                    self.record_local_request()
                permit = Permit(cost, lease, shared=True)
                await self._wait_reserved(permit, value / _US)
                self._stats["admitted"] += 1
                self._stats["waited"] += trio.current_time() - waited_from
                return permit
            if within is not None:
                raise self._busy(status, value, cost)
            if status == Status.TOO_LARGE:
                raise self._too_large(cost, value - 1)
            if status == Status.REFUSED_WAIT and trio.current_time() + value / _US > deadline:
                raise self._too_late(value / _US, deadline)
            delay = self._delay(status, value, poll)
            if status == Status.IN_FLIGHT_FULL:
                poll = min(poll * 2, _POLL_MAX)
            if trio.current_time() + delay > deadline:
                raise self._too_late(delay, deadline)
            await trio.sleep(delay)

    def _admit_args(self, cost: Cost, limit: float, lease: str, first_attempt: bool) -> list[Any]:
        """ADMIT's arguments: reserve ``cost`` for a start within ``limit`` seconds."""
        args: list[Any] = [
            -1 if math.isinf(limit) else math.floor(limit * _US),
            lease,
            *(self._admit_first if first_attempt else self._admit_retry),
        ]
        for (interval, tau), amount in zip(self._admit_rates, cost.amounts(), strict=True):
            args += (interval, tau, amount)
        return args

    def _delay(self, status: int, value: int, poll: float) -> float:
        """How long to wait before asking again after ADMIT's refusal ``status``."""
        if status == Status.REFUSED_WAIT:
            # Ask again within the wait: the room may come sooner (refunds).
            return max(value / _US * (0.5 + 0.5 * self._rng.random()), _POLL_FIRST)
        if status == Status.RETRY_AFTER:
            window = value / _US
            return window * (1.0 + self.spec.retry_after_jitter * self._rng.random())
        return poll * (0.5 + self._rng.random())  # IN_FLIGHT_FULL

    def _busy(self, status: int, value: int, cost: Cost) -> AdmissionBusyError:
        """Why an ask ``within`` a bound found no room (ADMIT's reply), in words."""
        self._stats["passed_over"] += 1
        name = self.spec.name
        if status == Status.TOO_LARGE:
            return AdmissionBusyError(
                f"fleet limit too small ({name!r}: the request needs more than one burst of "
                f"{DIMENSIONS[value - 1]}, {cost.input_tokens} input + {cost.output_tokens} "
                "output tokens)"
            )
        if status == Status.RETRY_AFTER:
            why, wait = f"a shared Retry-After, {value / _US:.3g} s left", value / _US
        elif status == Status.IN_FLIGHT_FULL:
            why, wait = f"all {self.spec.limits.max_in_flight} in-flight slots taken", None
        else:
            why, wait = f"no room for {value / _US:.3g} s", value / _US
        return AdmissionBusyError(f"fleet rate limited ({name!r}: {why})", wait)

    async def _wait_reserved(self, permit: Permit, wait: float) -> None:
        """Sleep until a reservation's start; cancelled, give the reservation back."""
        try:
            if wait > 0:
                await trio.sleep(wait)
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            with trio.CancelScope(shield=True):
                # Never sent: everything comes back, whatever ``refund_unused`` says.
                await self.withdraw(permit)
            raise

    async def _acquire_locally(
        self,
        cost: Cost,
        deadline: float,
        waited_from: float,
        within: float | None = None,
        *,
        first_attempt: bool = True,
    ) -> Permit:
        # Decided without Redis, maybe at once: still a checkpoint (a caller asking in a
        # loop must not spin without yielding).
        await trio.lowlevel.checkpoint()
        if self.spec.on_failure is FailurePolicy.FAIL_CLOSED:
            raise self._unavailable()
        local = self._local
        poll = _POLL_FIRST
        name = self.spec.name
        while True:
            now = trio.current_time()
            wait = max(local.wait(cost, now), self._local_retry_after - now)
            if within is not None and wait > within:
                self._stats["passed_over"] += 1
                why = "more than one burst" if math.isinf(wait) else f"no room for {wait:.3g} s"
                raise AdmissionBusyError(
                    f"fleet rate limited ({name!r}, its local floor while Redis is "
                    f"unavailable: {why})",
                    wait,
                )
            if math.isinf(wait):
                raise self._too_large(cost, None)
            if now + wait > deadline:
                raise self._too_late(wait, deadline)
            if wait <= 0 and local.has_slot():
                local.take(cost, now)
                spent = self._spent_locally
                self._spent_locally = Cost(
                    spent.requests + cost.requests,
                    spent.input_tokens + cost.input_tokens,
                    spent.output_tokens + cost.output_tokens,
                )
                if first_attempt:
                    self.record_local_request()
                self._stats["admitted_locally"] += 1
                self._stats["waited"] += now - waited_from
                return Permit(cost, "", shared=False)
            if wait <= 0 and within is not None:
                self._stats["passed_over"] += 1
                limit = self.spec.limits.max_in_flight
                raise AdmissionBusyError(
                    f"fleet rate limited ({name!r}, its local floor while Redis is "
                    f"unavailable: all {limit} in-flight slots taken)"
                )
            if wait <= 0:
                wait = poll * (0.5 + self._rng.random())
                poll = min(poll * 2, _POLL_MAX)
            await trio.sleep(min(wait, max(deadline - now, 0.0)))

    def observe(self, permit: Permit, snapshot: RateLimitSnapshot, at: float) -> None:
        """The provider's answer to ``permit``'s request reported ``snapshot`` at ``at``
        (trio's clock): when the permit is settled, the shared state is tightened to it
        wherever the provider reports less room than the fleet counts (the header clamp;
        one round trip with the settlement)."""
        permit.rate_limit = snapshot
        permit.observed_at = at

    def _clamps(self, permit: Permit) -> list[str]:
        """Per dimension, the least TAT the provider's report allows, as an offset from
        Redis's now in microseconds ('x': nothing reported).

        A provider reporting ``remaining`` units left holds at most that much burst: the
        TAT is at least ``now + tau - remaining * interval``, counted from when the report
        was read (it has refilled since)."""
        snapshot = permit.rate_limit
        if snapshot is None:
            return ["x"] * len(DIMENSIONS)
        age = max(0.0, trio.current_time() - permit.observed_at) * _US
        out = []
        for dimension, interval in zip(DIMENSIONS, self._intervals, strict=True):
            budget = getattr(snapshot, dimension)
            if not interval or budget is None or budget.remaining is None:
                out.append("x")
                continue
            out.append(repr(self._tau - budget.remaining * interval - age))
        return out

    async def release(self, permit: Permit, actual: Cost | None) -> None:
        """End an admitted request: free its slot, correct its reservation by ``actual``
        (the usage reported; ``None`` keeps the reservation as charged). Idempotent."""
        await self._settle(permit, actual, refund=self.spec.refund_unused)

    async def withdraw(self, permit: Permit) -> None:
        """End an admitted request that was never sent: free its slot and give back all
        it reserved, whatever ``refund_unused`` says. Idempotent."""
        await self._settle(permit, _NOTHING, refund=True)

    async def _settle(self, permit: Permit, actual: Cost | None, *, refund: bool) -> None:
        if permit.settled:
            return
        permit.settled = True
        if actual is not None and not refund:
            held = permit.cost
            actual = Cost(
                max(actual.requests, held.requests),
                max(actual.input_tokens, held.input_tokens),
                max(actual.output_tokens, held.output_tokens),
            )
        if permit.leased:
            assert self._book is not None
            if permit.rate_limit is not None:
                self._book.clamps = self._clamps(permit)  # sent with the next lease call
            self._book.settle(permit.cost, actual, permit.slot, trio.current_time())
            return
        if not permit.shared:
            self._local.settle(permit.cost, actual, trio.current_time())
            return
        self._leases.discard(permit.lease)
        changes: list[Any] = [permit.lease]
        for interval, reserved, used in zip(
            self._intervals,
            permit.cost.amounts(),
            (actual or permit.cost).amounts(),
            strict=True,
        ):
            changes.append(repr(interval * (used - reserved)) if interval else 0)
        changes += self._clamps(permit)
        reply = await self._call(_SETTLE, self._keys_settle, changes)
        if reply is None and permit.lease:
            # Its lease must not hold a slot until lease_ttl: sent again (idempotent: the
            # script corrects only a lease it still holds) as soon as Redis answers.
            self._release_when_back(permit.lease, changes[1:])
        elif reply is not None and reply[1]:
            self._stats["clamped"] += reply[1]

    async def sync_breakers(self, breakers: Sequence[SharedBreaker]) -> bool:
        """Tell the fleet what ``breakers`` have to say (opened, closed) and read back how
        long it holds each route open: one round trip. False when Redis is unavailable
        (the breakers keep their local state)."""
        if not breakers:
            return True
        keys = [self._breaker_prefix + breaker.route for breaker in breakers]
        said = [breaker.take_pending() for breaker in breakers]
        reply = await self._call(_BREAKERS, keys, said)
        now = trio.current_time()
        if not isinstance(reply, list | tuple) or len(reply) != len(breakers):
            for breaker, what in zip(breakers, said, strict=True):
                if what != "-" and breaker.pending is None:
                    breaker.pending = ("c", 0.0) if what == "c" else ("o", int(what[1:]) / 1000)
            return False
        for breaker, held in zip(breakers, reply, strict=True):
            breaker.shared(int(held), now)
        return True

    def _next_lease(self) -> str:
        self._serial += 1
        return f"{self._process}:{self._serial}"

    def _too_late(self, wait: float, deadline: float) -> AdmissionRefusedError:
        self._stats["refused"] += 1
        return _refusal(
            SamplingErrorKind.RATE_LIMITED,
            f"the fleet limit {self.spec.name!r} admits this request in {wait:.3f} s, after "
            f"its deadline (in {max(deadline - trio.current_time(), 0.0):.3f} s)",
            "fleet_rate_limited",
        )

    def _too_large(self, cost: Cost, index: int | None) -> AdmissionRefusedError:
        self._stats["refused"] += 1
        names = DIMENSIONS if index is None else (DIMENSIONS[index],)
        return _refusal(
            SamplingErrorKind.INVALID_REQUEST,
            f"this request ({cost.input_tokens} input + {cost.output_tokens} output tokens) "
            f"needs more than one burst of the fleet limit {self.spec.name!r} "
            f"({', '.join(names)}); lower max_output_tokens or raise the limit",
            "exceeds_fleet_limit",
        )

    # -- retries ---------------------------------------------------------------------------

    async def try_retry(self) -> bool:
        """Take one retry from the fleet retry budget; False when it is spent.

        Without a budget configured, always True. Degraded: a per-process budget of
        ``fallback_share`` of the tokens (``FAIL_OPEN``), or no retries (``FAIL_CLOSED``).
        """
        budget = self.spec.retry_budget
        if budget is None:
            return True
        reply = await self._call(_SPEND, [self._keys_admit[2]], [budget.max_tokens])
        if reply is None:
            allowed = self._local_budget is not None and self._local_budget.try_spend(
                trio.current_time()
            )
            allowed = allowed and self.spec.on_failure is FailurePolicy.FAIL_OPEN
        else:
            allowed = bool(int(reply[0]))
        self._stats["retries_allowed" if allowed else "retries_refused"] += 1
        return allowed

    def record_local_request(self) -> None:
        """Count a first attempt in the local retry budget (used while degraded)."""
        if self._local_budget is not None:
            self._local_budget.record_request(trio.current_time())

    async def note_retry_after(self, seconds: float) -> None:
        """A provider said ``Retry-After: seconds``: no process of the fleet starts a
        request on this limiter before then (each waits a jittered moment longer)."""
        if not math.isfinite(seconds) or seconds <= 0:
            return
        now = trio.current_time()
        self._local_retry_after = max(self._local_retry_after, now + seconds)
        await self._call(_RETRY_AFTER, [self._keys_admit[1]], [math.floor(seconds * _US)])

    async def warm_up(self, within: float) -> None:
        """Connect and load the scripts, so the first admissions pay one round trip each.

        A Redis that is unreachable now is not an error: the limiter starts degraded (an
        event says so) and probes again as usual.
        """
        try:
            with trio.fail_after(within):
                connection = await self._link.connect()
                loads = [
                    connection.create_request(_SCRIPT_LOAD, script.source, decode=False)
                    for script in _SCRIPTS
                ]
                for load in loads:
                    await load
        except _UNAVAILABLE_OR_REFUSED as exc:
            self._failed(exc)

    # -- reservations without an owner -----------------------------------------------------

    async def run_give_backs(self) -> None:
        """Forever (run it in a nursery): give back the late grants of admissions that
        timed out, and send again the settlements that failed, every admission timeout
        (or ``probe_interval``, when shorter) while any wait, so capacity is back within
        one admission timeout of Redis. Degraded, a settlement sent again is a probe (at
        most one at a time, every ``probe_interval``)."""
        spec = self.spec
        every = min(spec.admission_timeout, spec.probe_interval)
        while True:
            await self._wake_give_backs.wait()
            self._wake_give_backs = trio.Event()
            while self._late or self._unsettled:
                await self._give_back_late()
                await self._settle_again()
                if self._late or self._unsettled:
                    await trio.sleep(every)

    async def _give_back_late(self) -> None:
        late, self._late = self._late, []
        for request, on_reply in late:
            if request is None:  # its reply was lost
                await on_reply(LOST)
                continue
            if not request.complete:
                self._late.append((request, on_reply))  # no reply yet
                continue
            reply = late_reply(request)
            await on_reply(LOST if reply is None else reply)  # None: the connection failed

    async def _settle_again(self) -> None:
        for lease, (script, keys, args) in list(self._unsettled.items()):
            degraded = self._degraded_since is not None
            if self._probing or (degraded and trio.current_time() < self._probe_at):
                return
            self._probing = True  # one call at a time probes a degraded Redis
            try:
                reply = await self._round_trip(script, keys, args, None)
            finally:
                self._probing = False
            if reply is None:
                return  # still unavailable: all wait for the next round
            del self._unsettled[lease]

    # -- a process's lease (spec.leases) ----------------------------------------------------

    async def _acquire_leased(self, cost: Cost, *, first_attempt: bool) -> Permit | int | None:
        """Spend ``cost`` from this process's lease, refilled first when short (one round
        trip for a batch, one refill at a time). None: Redis is unavailable (the failure
        policy applies); a status: the fleet has no room for a batch now (the request
        asks as it would without leases, waiting its turn)."""
        book = self._book
        assert book is not None
        await trio.lowlevel.checkpoint()
        book.waiting += 1
        try:
            while not book.covers(cost):
                on_wire = self._refill_on_wire
                if on_wire is None:
                    status = await self._refill_once(cost)
                elif self._degraded_since is not None:
                    return None  # the refill on the wire probes Redis: the others decide now
                else:  # everyone waits for the refill on the wire, and wakes at once
                    await on_wire.wait()
                    status = self._refill_status
                if status != Status.ADMITTED:
                    return status
        finally:
            book.waiting -= 1
        slot = book.take(cost)
        if first_attempt:
            book.first_attempts += 1
            self.record_local_request()
        self._stats["admitted"] += 1
        return Permit(cost, "", shared=True, leased=True, slot=slot)

    async def _refill_once(self, cost: Cost) -> int | None:
        """Refill the lease for ``cost``; the requests arriving meanwhile wait for it and
        read its status (a refiller cancelled midway leaves them to look again)."""
        book = self._book
        assert book is not None
        self._refill_on_wire = done = trio.Event()
        self._refill_status = Status.ADMITTED
        # Within one admission timeout, a give-back on the wire included.
        until = trio.current_time() + self.spec.admission_timeout
        try:
            with trio.move_on_at(until) as waiting:
                await self._refilling.acquire()  # not while the rest is being given back
            if waiting.cancelled_caught:  # not acquired: a give-back took the timeout
                self._refill_status = None
            else:
                try:
                    if not book.covers(cost):
                        self._refill_status = await self._refill(cost, until)
                finally:
                    self._refilling.release()
        finally:
            self._refill_on_wire = None
            done.set()
        return self._refill_status

    async def _refill(self, cost: Cost, until: float) -> int | None:
        """Take a batch: what this process's rate wants, at least what ``cost`` lacks
        (Redis asked by ``until``)."""
        book = self._book
        assert book is not None
        now = trio.current_time()
        prefix = self._next_lease()
        wanted = (book.want(cost, now), book.need(cost), *book.slots_wanted())
        given_up = functools.partial(self._lease_late, prefix)
        reply = await self._lease_call(*wanted, prefix=prefix, abandoned=given_up, until=until)
        if reply is None:
            return None
        status = int(reply[0])
        if status == Status.ADMITTED:
            self._lease_granted(reply, prefix)
        else:
            # The fleet is out of room: what this process holds idle goes back now.
            book.fleet_full(now)
        return status

    async def _lease_call(
        self,
        want: Sequence[int],
        need: Sequence[int],
        slots: int,
        slots_needed: int,
        *,
        prefix: str,
        abandoned: _OnLateReply | None,
        until: float | None = None,
    ) -> Any:
        """One LEASE round trip: the pending give-back, the retry-budget deposits and the
        last header clamp go with the batch asked for."""
        book = self._book
        assert book is not None
        back, budget = book.pending, self.spec.retry_budget
        first_attempts, clamps = book.first_attempts, book.clamps or ["x"] * len(DIMENSIONS)
        book.first_attempts, book.clamps = 0, None
        args: list[Any] = [
            self._lease_ttl_us,
            self.spec.limits.max_in_flight or 0,
            prefix,
            slots,
            slots_needed,
            repr(first_attempts * budget.ratio) if budget else 0,
            budget.max_tokens if budget else 0,
            repr(book.policy.share),
            "1" if back else "0",
        ]
        for index, (interval, tau) in enumerate(self._admit_rates):
            given = back.units[index] if back else 0
            args += (interval, tau, want[index], need[index], given, clamps[index])
        keys = [
            *self._keys_admit,
            self._returned_prefix + (back.ident if back else "-"),
            self._granted_prefix + (prefix or "-"),
            self._granted_prefix + self._answered_refill,
        ]
        slots_back = back.slots if back else ()
        reply = await self._call(_LEASE, keys, [*args, *slots_back], abandoned, until)
        if reply is None:
            book.first_attempts += first_attempts
            return None
        self._answered_refill = prefix or "-"
        if back is not None and book.pending is back:
            book.pending = None
            self._leases.difference_update(back.slots)
        return reply

    def _lease_granted(self, reply: Any, prefix: str) -> None:
        assert self._book is not None
        slots = [f"{prefix}:{j}" for j in range(1, int(reply[3]) + 1)]
        self._leases.update(slots)
        self._book.granted([int(units) for units in reply[4:8]], slots, trio.current_time())
        self._stats["lease_refills"] += 1

    async def _lease_late(self, prefix: str, reply: Any) -> None:
        """The reply of a lease call nobody waits for: a batch it granted is given back
        at once, with the lease's rest (nobody asked for it: the requests that wanted it
        have applied the policy). Lost with the connection (or garbled), what Redis
        recorded it granted (slots and units) is given back when Redis answers
        (:data:`RECLAIM`; nothing if it never ran)."""
        if reply is not LOST and _lease_reply(reply, 0):
            if reply[0] == Status.ADMITTED:
                self._lease_granted(reply, prefix)
                assert self._book is not None
                self._book.return_now(trio.current_time())
            return
        keys = [self._keys_admit[0], *self._keys_admit[3:], self._granted_prefix + prefix]
        intervals = [repr(interval) for interval in self._intervals]
        self._unsettled[f"reclaim:{prefix}"] = (_RECLAIM, keys, [*intervals, prefix])
        self._wake_give_backs.set()

    async def _give_back_rest(self) -> None:
        """Give back what the lease holds idle (units, owed usage, slots), once."""
        book = self._book
        assert book is not None
        async with self._refilling:
            if book.give_back(self._next_lease()) is None:
                return
            reply = await self._lease_call(
                [0] * len(DIMENSIONS), [0] * len(DIMENSIONS), 0, 0, prefix="", abandoned=None
            )
            if reply is None:  # sent again (same id: applied once) after a timeout
                book.expires = trio.current_time() + self.spec.admission_timeout

    async def run_lease_returns(self) -> None:
        """Forever (run it in a nursery): give back the lease's rest ``hold`` seconds
        after its last refill (see :class:`LeasePolicy`)."""
        book = self._book
        if book is None:
            return
        while True:
            # Woken when the time changes (a refill, or the rest due now), else at it.
            with trio.move_on_at(book.expires):
                await book.wake.wait()
            book.wake = trio.Event()
            if trio.current_time() >= book.expires:
                await self._give_back_rest()

    async def close_lease(self) -> None:
        """Give back the lease's rest now (shielded, within one admission timeout)."""
        if self._book is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self.spec.admission_timeout):
            await self._give_back_rest()

    # -- in-flight leases ------------------------------------------------------------------

    async def renew_leases(self) -> None:
        """Extend this process's in-flight leases by ``lease_ttl`` (one round trip)."""
        if self._leases:
            await self._call(
                _RENEW, [self._keys_admit[0]], [self._lease_ttl_us, *sorted(self._leases)]
            )

    async def run_renewals(self) -> None:
        """Renew leases every third of ``lease_ttl``, forever (run it in a nursery)."""
        while True:
            await trio.sleep(self.spec.lease_ttl / 3)
            await self.renew_leases()


def redis_client(
    url: str, *, connect_timeout: float = 1.0, max_connections: int | None = None
) -> coredis.Redis[bytes]:
    """A coredis client for ``url`` (``redis://host:port/db``, ``rediss://``, or
    ``unix:///path/to/redis.sock``), without client-side retries: the limiter's failure
    policy decides what a failure means."""
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            "the Redis URL must start with redis://, rediss:// or unix://, e.g. "
            f"'redis://localhost:6379/0' or 'unix:///run/redis/redis.sock'; got {url!r}"
        )
    kwargs: dict[str, Any] = {"connect_timeout": connect_timeout}
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    client: coredis.Redis[bytes] = coredis.Redis.from_url(
        url, retry_policy=NoRetryPolicy(), **kwargs
    )
    return client


@asynccontextmanager
async def open_limiter(
    spec: LimiterSpec,
    url: str,
    *,
    on_event: EventHook | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[FleetLimiter]:
    """A :class:`FleetLimiter` on its own coredis client, renewing its leases meanwhile.

    Opening connects and loads the scripts (within ``max(1 s, admission_timeout)``). Redis
    need not be reachable then: the limiter starts degraded, applies its failure policy
    and says so (an event), and probes again every ``probe_interval``.
    """
    async with open_limiters([spec], url, on_event=on_event, rng=rng) as limiters:
        yield limiters[0]


@asynccontextmanager
async def open_limiters(
    specs: Sequence[LimiterSpec],
    url: str,
    *,
    on_event: EventHook | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[list[FleetLimiter]]:
    """One :class:`FleetLimiter` per spec (in order), all on one coredis client, each
    renewing its leases meanwhile (see :func:`open_limiter`)."""
    if not specs:
        raise ValueError("open_limiters needs at least one LimiterSpec")
    connect_timeout = max(1.0, *(spec.admission_timeout for spec in specs))
    client = redis_client(url, connect_timeout=connect_timeout)
    body_error: BaseException | None = None
    async with client, trio.open_nursery() as nursery:
        limiters = [FleetLimiter(spec, client, on_event=on_event, rng=rng) for spec in specs]
        # Concurrently: a Redis that is down costs one connect timeout, not one per limiter.
        async with trio.open_nursery() as warming:
            for limiter in limiters:
                warming.start_soon(limiter.warm_up, connect_timeout)
        for limiter in limiters:
            nursery.start_soon(limiter.run_renewals)
            nursery.start_soon(limiter.run_give_backs)
            nursery.start_soon(limiter.run_lease_returns)
        try:
            yield limiters
        except BaseException as exc:
            # Re-raised outside the nurseries: the caller gets their exception back, not
            # wrapped in an ExceptionGroup (a Cancelled still surfaces inside its scope).
            body_error = exc
        finally:
            for limiter in limiters:
                await limiter.close_lease()
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
