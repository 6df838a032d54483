"""Circuit breakers shared by a fleet: one process seeing a route fail opens it for all.

Each process keeps its own :class:`~trio_sampler.routing.RouteBreaker` for the counting
(consecutive failures, the failure ratio); a :class:`SharedBreaker` wraps it and adds the
fleet's word. When the local breaker opens, the route is published as open, for the
breaker's open time, in Redis; every process of the fleet reads the shared state (one
round trip for all its routes, every ``sync_s`` and at once after a local change) and
routes around a route the fleet holds open. When the shared window ends, each process
lets one probe through (its own half-open state); a probe's success closes the route for
the fleet, a failure opens it again with the breaker's back-off.

The breaker interface is synchronous (the actor asks it without awaiting), so Redis is
only ever touched by the sync task: a process whose Redis is unavailable keeps routing by
its local breaker, and the limiter's failure policy and events report the outage.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ..breaker import BreakerState, RouteBreaker

__all__ = ["BREAKERS", "SharedBreaker"]

# KEYS: one per route.  ARGV: per route, what this process has to say: 'o<ms>' (opened
# for ms), 'c' (closed by a successful probe) or '-' (nothing).  Returns, per route, the
# milliseconds the fleet still holds it open (0: not open).
BREAKERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local say = ARGV[i]
  if string.sub(say, 1, 1) == 'o' then
    local until_ = now + tonumber(string.sub(say, 2))
    local current = tonumber(redis.call('GET', KEYS[i]) or '0')
    if until_ > current then
      redis.call('SET', KEYS[i], string.format('%.0f', until_), 'PX', until_ - now + 1)
    end
  elseif say == 'c' then
    redis.call('DEL', KEYS[i])
  end
  local held = tonumber(redis.call('GET', KEYS[i]) or '0') - now
  if held < 0 then held = 0 end
  out[i] = held
end
return out
"""


class SharedBreaker:
    """A route's :class:`~trio_sampler.routing.CircuitBreaker` with the fleet's word
    added (see the module documentation). Built by ``FleetAdmission(share_breakers=...)``."""

    def __init__(self, local: RouteBreaker, notify: Callable[[], None] | None = None) -> None:
        self.local = local
        self.route = local.route
        #: Until when (trio's clock) the fleet holds the route open.
        self._shared_until = -math.inf
        #: The fleet held it open since this process last probed it: one probe at a time.
        self._after_shared = False
        self._probing = False
        #: When this process's probe of a fleet-held route was let through.
        self._probe_at = 0.0
        #: How long a failed probe of a fleet-held route opens it for (backing off).
        self._open_for = local.policy.open_s
        #: What to tell the fleet at the next sync: ('o', seconds) or ('c', 0).
        self.pending: tuple[str, float] | None = None
        self._notify = notify

    def __repr__(self) -> str:
        return f"SharedBreaker(route={self.route!r}, state={self.state.value})"

    @property
    def opened(self) -> int:
        return self.local.opened

    @property
    def state(self) -> BreakerState:
        if trio.current_time() < self._shared_until:
            return BreakerState.OPEN
        if self._after_shared:
            return BreakerState.HALF_OPEN
        return self.local.state

    def reopens_in(self, now: float) -> float:
        return max(0.0, self._shared_until - now, self.local.reopens_in(now))

    def allow(self, now: float) -> bool:
        if now < self._shared_until:
            return False
        if self._after_shared:
            if self._probing:
                return False
            self._probing = True
            self._probe_at = now
            return True
        return self.local.allow(now)

    def record_success(self, now: float) -> None:
        was = self.local.state
        self.local.record_success(now)
        if self._after_shared or was is not BreakerState.CLOSED:
            self._after_shared = self._probing = False
            self._shared_until = -math.inf
            self._open_for = self.local.policy.open_s
            self._tell(("c", 0.0))

    def record_failure(self, now: float) -> None:
        was = self.local.state
        if self._after_shared:
            # The probe of a route the fleet held open failed: open it again for the
            # fleet, backing off as the local breaker would; then one probe again.
            policy = self.local.policy
            self._probing = False
            self._open_for = min(policy.max_open_s, self._open_for * policy.backoff)
            # Counted from the probe's start, as the local breaker counts.
            self._shared_until = min(self._probe_at, now) + self._open_for
            self._tell(("o", self._shared_until - now))
            return
        self.local.record_failure(now)
        if self.local.state is BreakerState.OPEN and was is not BreakerState.OPEN:
            self._tell(("o", self.local.reopens_in(now)))

    def record_abandoned(self, now: float) -> None:
        if self._after_shared:
            self._probing = False
        self.local.record_abandoned(now)

    # -- the sync task's side ----------------------------------------------------------

    def _tell(self, what: tuple[str, float]) -> None:
        self.pending = what
        if self._notify is not None:
            self._notify()

    def take_pending(self) -> str:
        """What to send at this sync (``ARGV`` of :data:`BREAKERS`), and forget it."""
        pending, self.pending = self.pending, None
        if pending is None:
            return "-"
        if pending[0] == "c":
            return "c"
        return f"o{max(1, math.ceil(pending[1] * 1000))}"

    def shared(self, held_ms: int, now: float) -> None:
        """The fleet holds the route open for ``held_ms`` more (0: it does not)."""
        if held_ms > 0:
            self._shared_until = now + held_ms / 1000
            if self.local.state is not BreakerState.OPEN:
                self._after_shared = True  # when the window ends: one probe first
        elif self._shared_until > -math.inf:
            self._shared_until = -math.inf
