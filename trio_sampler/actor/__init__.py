"""The runtime: a structured-concurrency actor that runs sampling requests."""

from ._actor import DuplicateRequestError as DuplicateRequestError
from ._actor import SamplerClosedError as SamplerClosedError
from ._actor import SamplerHandle as SamplerHandle
from ._actor import open_sampler as open_sampler
from ._stream import RequestCancelledError as RequestCancelledError
from ._stream import RequestResult as RequestResult
from ._stream import RequestStream as RequestStream

__all__ = [
    "DuplicateRequestError",
    "RequestCancelledError",
    "RequestResult",
    "RequestStream",
    "SamplerClosedError",
    "SamplerHandle",
    "open_sampler",
]
