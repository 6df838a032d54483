"""A local server that speaks Chat Completions, Responses and Messages, faithfully.

It validates requests the way the real APIs do, answers deterministically, simulates
prompt caching, and can be scripted per request (text, reasoning, tool calls, hosted
tools, usage, pacing and faults) with the ``x-emulator-script`` header. See
``docs/emulator.md``.
"""

from ._app import REDACTED as REDACTED
from ._app import EmulatorApp as EmulatorApp
from ._app import redact_headers as redact_headers
from ._billing import BilledUsage as BilledUsage
from ._billing import BillingEntry as BillingEntry
from ._billing import BillingOutcome as BillingOutcome
from ._cache import SHARED_CACHE as SHARED_CACHE
from ._cache import CacheResult as CacheResult
from ._cache import PromptCache as PromptCache
from ._cache import count_tokens as count_tokens
from ._cli import main_serve as main_serve
from ._cli import run_serve as run_serve
from ._log import RequestLog as RequestLog
from ._ratelimit import RateLimits as RateLimits
from ._script import Script as Script
from ._script import ScriptError as ScriptError
from ._script import parse_script as parse_script
from ._script import script_headers as script_headers
from ._serve import EmulatorServer as EmulatorServer
from ._serve import serve as serve
from ._transport import EmulatorTransport as EmulatorTransport

__all__ = [
    "REDACTED",
    "SHARED_CACHE",
    "BilledUsage",
    "BillingEntry",
    "BillingOutcome",
    "CacheResult",
    "EmulatorApp",
    "EmulatorServer",
    "EmulatorTransport",
    "PromptCache",
    "RateLimits",
    "RequestLog",
    "Script",
    "ScriptError",
    "count_tokens",
    "main_serve",
    "parse_script",
    "redact_headers",
    "run_serve",
    "script_headers",
    "serve",
]
