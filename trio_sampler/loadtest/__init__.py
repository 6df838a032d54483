"""Load testing a model server: closed and open loops, honest percentiles, reports.

Point it at any OpenAI-compatible (or Responses / Messages) server and measure time to
first token, inter-token latency, time per output token, end-to-end latency, throughput
and goodput, with the client measuring its own CPU and event-loop lag so a saturated load
generator is flagged rather than mistaken for a slow server. See ``docs/loadtest.md``.

Needs the ``loadtest`` extra: ``pip install 'trio-sampler[loadtest]'``.
"""

from ._plan import Concurrency as Concurrency
from ._plan import Limits as Limits
from ._plan import Load as Load
from ._plan import LoadTest as LoadTest
from ._plan import Rate as Rate
from ._results import SCHEMA as SCHEMA
from ._results import LoadTestResult as LoadTestResult
from ._results import StageResult as StageResult
from ._run import LoadTestError as LoadTestError
from ._run import run as run
from ._run import run_load_test as run_load_test
from ._runner import Progress as Progress
from ._stats import SLO as SLO
from ._stats import LatencyHistogram as LatencyHistogram
from ._stats import StageStats as StageStats
from ._verdict import Threshold as Threshold
from ._verdict import verdict as verdict
from ._workload import DatasetError as DatasetError
from ._workload import DatasetWorkload as DatasetWorkload
from ._workload import Fixed as Fixed
from ._workload import Histogram as Histogram
from ._workload import LengthDistribution as LengthDistribution
from ._workload import Normal as Normal
from ._workload import SyntheticWorkload as SyntheticWorkload
from ._workload import Uniform as Uniform
from ._workload import WorkItem as WorkItem
from ._workload import Workload as Workload
from ._workload import parse_length as parse_length

__all__ = [
    "SCHEMA",
    "SLO",
    "Concurrency",
    "DatasetError",
    "DatasetWorkload",
    "Fixed",
    "Histogram",
    "LatencyHistogram",
    "LengthDistribution",
    "Limits",
    "Load",
    "LoadTest",
    "LoadTestError",
    "LoadTestResult",
    "Normal",
    "Progress",
    "Rate",
    "StageResult",
    "StageStats",
    "SyntheticWorkload",
    "Threshold",
    "Uniform",
    "WorkItem",
    "Workload",
    "parse_length",
    "run",
    "run_load_test",
    "verdict",
]
