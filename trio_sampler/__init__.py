"""trio_sampler: a Trio-native runtime for sampling from large language models.

Describe a conversation once; stream it over OpenAI Chat Completions, OpenAI Responses or
Anthropic Messages; get one event vocabulary, one response shape and exactly one terminal
event per request.
"""

from importlib.metadata import PackageNotFoundError, version

from .actor import DuplicateRequestError as DuplicateRequestError
from .actor import RequestCancelledError as RequestCancelledError
from .actor import RequestStream as RequestStream
from .actor import SamplerClosedError as SamplerClosedError
from .actor import SamplerHandle as SamplerHandle
from .actor import open_sampler as open_sampler
from .agent import AgentResult as AgentResult
from .agent import AgentStop as AgentStop
from .agent import ToolError as ToolError
from .agent import ToolRegistry as ToolRegistry
from .agent import builtin_tools as builtin_tools
from .agent import process_conversation_turn as process_conversation_turn
from .bridge import SamplerTurnOutcome as SamplerTurnOutcome
from .bridge import TurnCancelled as TurnCancelled
from .bridge import TurnCompactAndResubmit as TurnCompactAndResubmit
from .bridge import TurnFatal as TurnFatal
from .bridge import TurnRefreshAuthAndResubmit as TurnRefreshAuthAndResubmit
from .bridge import TurnResponse as TurnResponse
from .bridge import run_turn_via_sampler as run_turn_via_sampler
from .config import RetryPolicy as RetryPolicy
from .config import SamplerConfig as SamplerConfig
from .config import Secret as Secret
from .config import Timeouts as Timeouts
from .doom_loop import DoomLoopPolicy as DoomLoopPolicy
from .models import ModelCatalog as ModelCatalog
from .providers import AuthScheme as AuthScheme
from .providers import ProviderProfile as ProviderProfile
from .ratelimit import RateLimitPacing as RateLimitPacing
from .routing import BreakerPolicy as BreakerPolicy
from .routing import HedgePolicy as HedgePolicy
from .routing import Route as Route
from .routing import RouteCapabilities as RouteCapabilities
from .routing import RoutingPolicy as RoutingPolicy
from .types import IMAGE_STRIP_PLACEHOLDER as IMAGE_STRIP_PLACEHOLDER
from .types import ApiBackend as ApiBackend
from .types import Assistant as Assistant
from .types import AttemptOutcome as AttemptOutcome
from .types import AttemptRecord as AttemptRecord
from .types import BackendToolCall as BackendToolCall
from .types import BackendToolCallCompleted as BackendToolCallCompleted
from .types import BackendToolCallStarted as BackendToolCallStarted
from .types import Cancelled as Cancelled
from .types import ChannelToken as ChannelToken
from .types import CodeExecution as CodeExecution
from .types import Completed as Completed
from .types import ContentPart as ContentPart
from .types import ConversationItem as ConversationItem
from .types import ConversationRequest as ConversationRequest
from .types import ConversationResponse as ConversationResponse
from .types import Failed as Failed
from .types import FileSearch as FileSearch
from .types import FirstToken as FirstToken
from .types import HostedTool as HostedTool
from .types import ImagePart as ImagePart
from .types import ImagesStripped as ImagesStripped
from .types import MCPServer as MCPServer
from .types import ModelMetadata as ModelMetadata
from .types import NamedToolChoice as NamedToolChoice
from .types import ProviderTool as ProviderTool
from .types import RateLimitBudget as RateLimitBudget
from .types import RateLimitSnapshot as RateLimitSnapshot
from .types import Reasoning as Reasoning
from .types import ReasoningCompleted as ReasoningCompleted
from .types import ReasoningEffort as ReasoningEffort
from .types import RequestMetrics as RequestMetrics
from .types import ResponseSchema as ResponseSchema
from .types import Retrying as Retrying
from .types import SamplingChannel as SamplingChannel
from .types import SamplingError as SamplingError
from .types import SamplingErrorInfo as SamplingErrorInfo
from .types import SamplingErrorKind as SamplingErrorKind
from .types import SamplingEvent as SamplingEvent
from .types import StopReason as StopReason
from .types import StreamStarted as StreamStarted
from .types import StripReason as StripReason
from .types import SyntheticReason as SyntheticReason
from .types import System as System
from .types import TerminalEvent as TerminalEvent
from .types import TextPart as TextPart
from .types import ToolCall as ToolCall
from .types import ToolCallCompleted as ToolCallCompleted
from .types import ToolCallDelta as ToolCallDelta
from .types import ToolChoice as ToolChoice
from .types import ToolChoiceSpec as ToolChoiceSpec
from .types import ToolResult as ToolResult
from .types import ToolSpec as ToolSpec
from .types import Usage as Usage
from .types import UsageViolation as UsageViolation
from .types import User as User
from .types import WebFetch as WebFetch
from .types import WebSearch as WebSearch
from .wire import collect as collect
from .wire import replay as replay

try:
    __version__ = version("trio-sampler")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "IMAGE_STRIP_PLACEHOLDER",
    "AgentResult",
    "AgentStop",
    "ApiBackend",
    "Assistant",
    "AttemptOutcome",
    "AttemptRecord",
    "AuthScheme",
    "BackendToolCall",
    "BackendToolCallCompleted",
    "BackendToolCallStarted",
    "BreakerPolicy",
    "Cancelled",
    "ChannelToken",
    "CodeExecution",
    "Completed",
    "ContentPart",
    "ConversationItem",
    "ConversationRequest",
    "ConversationResponse",
    "DoomLoopPolicy",
    "DuplicateRequestError",
    "Failed",
    "FileSearch",
    "FirstToken",
    "HedgePolicy",
    "HostedTool",
    "ImagePart",
    "ImagesStripped",
    "MCPServer",
    "ModelCatalog",
    "ModelMetadata",
    "NamedToolChoice",
    "ProviderProfile",
    "ProviderTool",
    "RateLimitBudget",
    "RateLimitPacing",
    "RateLimitSnapshot",
    "Reasoning",
    "ReasoningCompleted",
    "ReasoningEffort",
    "RequestCancelledError",
    "RequestMetrics",
    "RequestStream",
    "ResponseSchema",
    "RetryPolicy",
    "Retrying",
    "Route",
    "RouteCapabilities",
    "RoutingPolicy",
    "SamplerClosedError",
    "SamplerConfig",
    "SamplerHandle",
    "SamplerTurnOutcome",
    "SamplingChannel",
    "SamplingError",
    "SamplingErrorInfo",
    "SamplingErrorKind",
    "SamplingEvent",
    "Secret",
    "StopReason",
    "StreamStarted",
    "StripReason",
    "SyntheticReason",
    "System",
    "TerminalEvent",
    "TextPart",
    "Timeouts",
    "ToolCall",
    "ToolCallCompleted",
    "ToolCallDelta",
    "ToolChoice",
    "ToolChoiceSpec",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "TurnCancelled",
    "TurnCompactAndResubmit",
    "TurnFatal",
    "TurnRefreshAuthAndResubmit",
    "TurnResponse",
    "Usage",
    "UsageViolation",
    "User",
    "WebFetch",
    "WebSearch",
    "builtin_tools",
    "collect",
    "open_sampler",
    "process_conversation_turn",
    "replay",
    "run_turn_via_sampler",
]
