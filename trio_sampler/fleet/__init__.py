"""Limits and retry budgets shared by every process of a fleet, over Redis.

Many processes behind one provider account share one set of limits: requests, input and
output tokens per minute, and requests in flight. Each admission is one atomic Lua script
on Redis's clock (GCRA per dimension, tokens reserved up front and corrected with the
reported usage afterwards); in-flight slots are leases that expire if a process dies. A
fleet-wide retry budget and a shared ``Retry-After`` window keep an outage from turning
into a retry storm. When Redis is unreachable, each limiter applies its declared failure
policy and says so. See ``docs/fleet.md``.

Needs the ``fleet`` extra (``pip install 'trio-sampler[fleet]'``, which brings
``coredis``); ``import trio_sampler`` does not.
"""

try:
    import coredis as _coredis  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "trio_sampler.fleet needs coredis: pip install 'trio-sampler[fleet]'"
    ) from exc

from ..admission import AdmissionRefusedError as AdmissionRefusedError
from ._admission import FleetAdmission as FleetAdmission
from ._admission import FleetGate as FleetGate
from ._admission import LimiterGate as LimiterGate
from ._events import FleetEvent as FleetEvent
from ._events import LimiterDegraded as LimiterDegraded
from ._events import LimiterRecovered as LimiterRecovered
from ._events import LimiterStatistics as LimiterStatistics
from ._limiter import FleetLimiter as FleetLimiter
from ._limiter import Permit as Permit
from ._limiter import open_limiter as open_limiter
from ._limiter import open_limiters as open_limiters
from ._limiter import redis_client as redis_client
from ._spec import Cost as Cost
from ._spec import FailurePolicy as FailurePolicy
from ._spec import FleetLimits as FleetLimits
from ._spec import LeasePolicy as LeasePolicy
from ._spec import LimiterSpec as LimiterSpec
from ._spec import RetryBudgetSpec as RetryBudgetSpec

__all__ = [
    "AdmissionRefusedError",
    "Cost",
    "FailurePolicy",
    "FleetAdmission",
    "FleetEvent",
    "FleetGate",
    "FleetLimiter",
    "FleetLimits",
    "LeasePolicy",
    "LimiterDegraded",
    "LimiterGate",
    "LimiterRecovered",
    "LimiterSpec",
    "LimiterStatistics",
    "Permit",
    "RetryBudgetSpec",
    "open_limiter",
    "open_limiters",
    "redis_client",
]
