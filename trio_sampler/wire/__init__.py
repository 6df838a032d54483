"""The sans-I/O protocol core: SSE decoding, stream transforms, request builders,
``collect`` and error classification. No awaits, no sockets, no clocks.
"""

from ._fold import ResponseFold as ResponseFold
from ._registry import build_request as build_request
from ._registry import new_transform as new_transform
from ._registry import parse_request as parse_request
from ._registry import transform_class as transform_class
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
from .sse import ServerSentEvent as ServerSentEvent
from .sse import SSEDecodeError as SSEDecodeError
from .sse import SSEDecoder as SSEDecoder
from .sse import SSEEventTooLarge as SSEEventTooLarge

__all__ = [
    "BuildOptions",
    "ConversionAction",
    "ConversionError",
    "ConversionNote",
    "ConversionReport",
    "ResponseFold",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEventTooLarge",
    "ServerSentEvent",
    "StreamTransform",
    "WireRequest",
    "build_request",
    "classify_stream_error",
    "collect",
    "new_transform",
    "parse_request",
    "replay",
    "transform_class",
]
