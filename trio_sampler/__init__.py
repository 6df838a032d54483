"""trio_sampler: a Trio-native runtime for sampling from large language models.

Describe a conversation once; stream it over OpenAI Chat Completions, OpenAI Responses or
Anthropic Messages; get one event vocabulary, one response shape and exactly one terminal
event per request.
"""

import typing as _typing
from importlib.metadata import PackageNotFoundError, version

from .actor import RequestCancelledError as RequestCancelledError
from .actor import RequestResult as RequestResult
from .actor import RequestStream as RequestStream
from .actor import SamplerHandle as SamplerHandle
from .actor import open_sampler as open_sampler
from .agent import ToolRegistry as ToolRegistry
from .agent import process_conversation_turn as process_conversation_turn
from .config import RetryPolicy as RetryPolicy
from .config import SamplerConfig as SamplerConfig
from .config import Secret as Secret
from .config import Timeouts as Timeouts
from .routing import Route as Route
from .routing import RoutingPolicy as RoutingPolicy
from .types import ApiBackend as ApiBackend
from .types import Assistant as Assistant
from .types import Cancelled as Cancelled
from .types import ChannelToken as ChannelToken
from .types import Completed as Completed
from .types import ConversationRequest as ConversationRequest
from .types import ConversationResponse as ConversationResponse
from .types import Failed as Failed
from .types import ImagePart as ImagePart
from .types import ResponseSchema as ResponseSchema
from .types import Retrying as Retrying
from .types import SamplingError as SamplingError
from .types import SamplingErrorKind as SamplingErrorKind
from .types import SamplingEvent as SamplingEvent
from .types import StopReason as StopReason
from .types import System as System
from .types import TerminalEvent as TerminalEvent
from .types import TextPart as TextPart
from .types import ToolCall as ToolCall
from .types import ToolCallCompleted as ToolCallCompleted
from .types import ToolCallDelta as ToolCallDelta
from .types import ToolResult as ToolResult
from .types import ToolSpec as ToolSpec
from .types import TrioSamplerError as TrioSamplerError
from .types import Usage as Usage
from .types import User as User
from .wire import collect as collect

try:
    __version__ = version("trio-sampler")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "ApiBackend",
    "Assistant",
    "Cancelled",
    "ChannelToken",
    "Completed",
    "ConversationRequest",
    "ConversationResponse",
    "Failed",
    "ImagePart",
    "RequestCancelledError",
    "RequestResult",
    "RequestStream",
    "ResponseSchema",
    "RetryPolicy",
    "Retrying",
    "Route",
    "RoutingPolicy",
    "SamplerConfig",
    "SamplerHandle",
    "SamplingError",
    "SamplingErrorKind",
    "SamplingEvent",
    "Secret",
    "StopReason",
    "System",
    "TerminalEvent",
    "TextPart",
    "Timeouts",
    "ToolCall",
    "ToolCallCompleted",
    "ToolCallDelta",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "TrioSamplerError",
    "Usage",
    "User",
    "collect",
    "open_sampler",
    "process_conversation_turn",
]

#: Names this package exported before its surface was cut to what an application needs,
#: and the subpackage each is imported from now (see CHANGELOG.md).
_MOVED: dict[str, str] = {
    "DuplicateRequestError": "trio_sampler.actor",
    "SamplerClosedError": "trio_sampler.actor",
    "AgentResult": "trio_sampler.agent",
    "AgentStop": "trio_sampler.agent",
    "ToolError": "trio_sampler.agent",
    "builtin_tools": "trio_sampler.agent",
    "SamplerTurnOutcome": "trio_sampler.bridge",
    "TurnCancelled": "trio_sampler.bridge",
    "TurnCompactAndResubmit": "trio_sampler.bridge",
    "TurnFatal": "trio_sampler.bridge",
    "TurnRefreshAuthAndResubmit": "trio_sampler.bridge",
    "TurnResponse": "trio_sampler.bridge",
    "run_turn_via_sampler": "trio_sampler.bridge",
    "DoomLoopPolicy": "trio_sampler.doom_loop",
    "ModelCatalog": "trio_sampler.models",
    "AuthScheme": "trio_sampler.providers",
    "ProviderProfile": "trio_sampler.providers",
    "RateLimitPacing": "trio_sampler.ratelimit",
    "BreakerPolicy": "trio_sampler.routing",
    "HedgePolicy": "trio_sampler.routing",
    "RouteCapabilities": "trio_sampler.routing",
    "AttemptOutcome": "trio_sampler.types",
    "AttemptRecord": "trio_sampler.types",
    "BackendToolCall": "trio_sampler.types",
    "BackendToolCallCompleted": "trio_sampler.types",
    "BackendToolCallStarted": "trio_sampler.types",
    "CodeExecution": "trio_sampler.types",
    "ContentPart": "trio_sampler.types",
    "ConversationItem": "trio_sampler.types",
    "FileSearch": "trio_sampler.types",
    "FirstToken": "trio_sampler.types",
    "HostedTool": "trio_sampler.types",
    "IMAGE_STRIP_PLACEHOLDER": "trio_sampler.types",
    "ImagesStripped": "trio_sampler.types",
    "MCPServer": "trio_sampler.types",
    "ModelMetadata": "trio_sampler.types",
    "NamedToolChoice": "trio_sampler.types",
    "ProviderTool": "trio_sampler.types",
    "RateLimitBudget": "trio_sampler.types",
    "RateLimitSnapshot": "trio_sampler.types",
    "Reasoning": "trio_sampler.types",
    "ReasoningCompleted": "trio_sampler.types",
    "ReasoningEffort": "trio_sampler.types",
    "RequestMetrics": "trio_sampler.types",
    "SamplingChannel": "trio_sampler.types",
    "SamplingErrorInfo": "trio_sampler.types",
    "StreamStarted": "trio_sampler.types",
    "StripReason": "trio_sampler.types",
    "SyntheticReason": "trio_sampler.types",
    "ToolChoice": "trio_sampler.types",
    "ToolChoiceSpec": "trio_sampler.types",
    "UsageViolation": "trio_sampler.types",
    "WebFetch": "trio_sampler.types",
    "WebSearch": "trio_sampler.types",
    "replay": "trio_sampler.wire",
}


# Outside the type checker's view, so that it still flags an import of a moved name.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _MOVED.get(name)
        if module is None:
            raise AttributeError(f"module 'trio_sampler' has no attribute {name!r}")
        raise AttributeError(
            f"trio_sampler.{name} is not exported at the top level: import it from {module} "
            f"(`from {module} import {name}`)"
        )
