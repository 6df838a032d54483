"""The sans-I/O protocol core: SSE and AWS event-stream decoding, stream transforms,
request builders, ``collect`` and error classification. No awaits, no sockets, no clocks.
"""

from ..types import JSONChange as JSONChange
from ..types import JSONChangeKind as JSONChangeKind
from ..types import JSONPath as JSONPath
from ..types._partial_json import PartialJSON as PartialJSON
from ..types._partial_json import PartialJSONError as PartialJSONError
from ._backend import Backend as Backend
from ._backend import WireBackend as WireBackend
from ._backend import backend_name as backend_name
from ._backend import backends as backends
from ._backend import get_backend as get_backend
from ._backend import register_backend as register_backend
from ._fold import ResponseFold as ResponseFold
from ._partial_output import PartialOutputs as PartialOutputs
from ._partial_output import read_output as read_output
from ._ratelimit import parse_duration as parse_duration
from ._ratelimit import parse_rate_limits as parse_rate_limits
from ._registry import build_request as build_request
from ._registry import new_transform as new_transform
from ._registry import parse_request as parse_request
from ._replay import collect as collect
from ._replay import replay as replay
from ._request import BuildOptions as BuildOptions
from ._request import ConversionAction as ConversionAction
from ._request import ConversionError as ConversionError
from ._request import ConversionNote as ConversionNote
from ._request import ConversionReport as ConversionReport
from ._request import WireRequest as WireRequest
from ._transform import StreamTransform as StreamTransform
from .errors import classify_stream_error as classify_stream_error
from .eventstream import EventStreamDecodeError as EventStreamDecodeError
from .eventstream import EventStreamDecoder as EventStreamDecoder
from .eventstream import StreamDecoder as StreamDecoder
from .eventstream import stream_decoder as stream_decoder
from .sse import ServerSentEvent as ServerSentEvent
from .sse import SSEDecodeError as SSEDecodeError
from .sse import SSEDecoder as SSEDecoder
from .sse import SSEEventTooLarge as SSEEventTooLarge

__all__ = [
    "Backend",
    "BuildOptions",
    "ConversionAction",
    "ConversionError",
    "ConversionNote",
    "ConversionReport",
    "EventStreamDecodeError",
    "EventStreamDecoder",
    "JSONChange",
    "JSONChangeKind",
    "JSONPath",
    "PartialJSON",
    "PartialJSONError",
    "PartialOutputs",
    "ResponseFold",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEventTooLarge",
    "ServerSentEvent",
    "StreamDecoder",
    "StreamTransform",
    "WireBackend",
    "WireRequest",
    "backend_name",
    "backends",
    "build_request",
    "classify_stream_error",
    "collect",
    "get_backend",
    "new_transform",
    "parse_duration",
    "parse_rate_limits",
    "parse_request",
    "read_output",
    "register_backend",
    "replay",
    "stream_decoder",
]
