"""Plain data: the conversation model, events, errors and usage. No I/O, no imports of ours."""

from ._conversation import IMAGE_STRIP_PLACEHOLDER as IMAGE_STRIP_PLACEHOLDER
from ._conversation import ApiBackend as ApiBackend
from ._conversation import Assistant as Assistant
from ._conversation import BackendToolCall as BackendToolCall
from ._conversation import Citation as Citation
from ._conversation import CodeExecution as CodeExecution
from ._conversation import ContentPart as ContentPart
from ._conversation import ConversationItem as ConversationItem
from ._conversation import ConversationRequest as ConversationRequest
from ._conversation import ConversationResponse as ConversationResponse
from ._conversation import FileSearch as FileSearch
from ._conversation import HostedTool as HostedTool
from ._conversation import ImagePart as ImagePart
from ._conversation import MCPServer as MCPServer
from ._conversation import NamedToolChoice as NamedToolChoice
from ._conversation import OpaqueItem as OpaqueItem
from ._conversation import OpaquePart as OpaquePart
from ._conversation import ProviderFields as ProviderFields
from ._conversation import ProviderTool as ProviderTool
from ._conversation import Reasoning as Reasoning
from ._conversation import ReasoningEffort as ReasoningEffort
from ._conversation import ServerTextDiffers as ServerTextDiffers
from ._conversation import StopReason as StopReason
from ._conversation import SyntheticReason as SyntheticReason
from ._conversation import System as System
from ._conversation import TextPart as TextPart
from ._conversation import ToolCall as ToolCall
from ._conversation import ToolChoice as ToolChoice
from ._conversation import ToolChoiceSpec as ToolChoiceSpec
from ._conversation import ToolResult as ToolResult
from ._conversation import ToolSpec as ToolSpec
from ._conversation import Usage as Usage
from ._conversation import UsageViolation as UsageViolation
from ._conversation import User as User
from ._conversation import WebFetch as WebFetch
from ._conversation import WebSearch as WebSearch
from ._errors import TrioSamplerError as TrioSamplerError
from ._events import AttemptOutcome as AttemptOutcome
from ._events import AttemptRecord as AttemptRecord
from ._events import BackendToolCallCompleted as BackendToolCallCompleted
from ._events import BackendToolCallStarted as BackendToolCallStarted
from ._events import Cancelled as Cancelled
from ._events import ChannelToken as ChannelToken
from ._events import CitationReceived as CitationReceived
from ._events import Completed as Completed
from ._events import ContextEdited as ContextEdited
from ._events import Failed as Failed
from ._events import FirstToken as FirstToken
from ._events import ImagesStripped as ImagesStripped
from ._events import LedgerEntry as LedgerEntry
from ._events import ModelMetadata as ModelMetadata
from ._events import OpaqueItemReceived as OpaqueItemReceived
from ._events import OutputDelta as OutputDelta
from ._events import Paced as Paced
from ._events import ReasoningCompleted as ReasoningCompleted
from ._events import RequestMetrics as RequestMetrics
from ._events import Resumed as Resumed
from ._events import Retrying as Retrying
from ._events import SamplingChannel as SamplingChannel
from ._events import SamplingError as SamplingError
from ._events import SamplingErrorInfo as SamplingErrorInfo
from ._events import SamplingErrorKind as SamplingErrorKind
from ._events import SamplingEvent as SamplingEvent
from ._events import ServedModelChanged as ServedModelChanged
from ._events import ServerTextTaken as ServerTextTaken
from ._events import StreamStarted as StreamStarted
from ._events import StripReason as StripReason
from ._events import TerminalEvent as TerminalEvent
from ._events import ToolArgumentsDelta as ToolArgumentsDelta
from ._events import ToolCallCompleted as ToolCallCompleted
from ._events import ToolCallDelta as ToolCallDelta
from ._json import to_jsonable as to_jsonable
from ._partial import JSONChange as JSONChange
from ._partial import JSONChangeKind as JSONChangeKind
from ._partial import JSONPath as JSONPath
from ._ratelimit import RateLimitBudget as RateLimitBudget
from ._ratelimit import RateLimitSnapshot as RateLimitSnapshot
from ._structured import OutputError as OutputError
from ._structured import OutputErrorKind as OutputErrorKind
from ._structured import ResponseSchema as ResponseSchema
from ._structured import StructuredOutput as StructuredOutput
from ._structured import structured_output as structured_output

__all__ = [
    "IMAGE_STRIP_PLACEHOLDER",
    "ApiBackend",
    "Assistant",
    "AttemptOutcome",
    "AttemptRecord",
    "BackendToolCall",
    "BackendToolCallCompleted",
    "BackendToolCallStarted",
    "Cancelled",
    "ChannelToken",
    "Citation",
    "CitationReceived",
    "CodeExecution",
    "Completed",
    "ContentPart",
    "ContextEdited",
    "ConversationItem",
    "ConversationRequest",
    "ConversationResponse",
    "Failed",
    "FileSearch",
    "FirstToken",
    "HostedTool",
    "ImagePart",
    "ImagesStripped",
    "JSONChange",
    "JSONChangeKind",
    "JSONPath",
    "LedgerEntry",
    "MCPServer",
    "ModelMetadata",
    "NamedToolChoice",
    "OpaqueItem",
    "OpaqueItemReceived",
    "OpaquePart",
    "OutputDelta",
    "OutputError",
    "OutputErrorKind",
    "Paced",
    "ProviderFields",
    "ProviderTool",
    "RateLimitBudget",
    "RateLimitSnapshot",
    "Reasoning",
    "ReasoningCompleted",
    "ReasoningEffort",
    "RequestMetrics",
    "ResponseSchema",
    "Resumed",
    "Retrying",
    "SamplingChannel",
    "SamplingError",
    "SamplingErrorInfo",
    "SamplingErrorKind",
    "SamplingEvent",
    "ServedModelChanged",
    "ServerTextDiffers",
    "ServerTextTaken",
    "StopReason",
    "StreamStarted",
    "StripReason",
    "StructuredOutput",
    "SyntheticReason",
    "System",
    "TerminalEvent",
    "TextPart",
    "ToolArgumentsDelta",
    "ToolCall",
    "ToolCallCompleted",
    "ToolCallDelta",
    "ToolChoice",
    "ToolChoiceSpec",
    "ToolResult",
    "ToolSpec",
    "TrioSamplerError",
    "Usage",
    "UsageViolation",
    "User",
    "WebFetch",
    "WebSearch",
    "structured_output",
    "to_jsonable",
]
