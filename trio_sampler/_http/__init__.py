"""The library's one HTTP seam and the transports behind it (see ``_base``).

``Transport`` and ``Body`` are the seam; ``DirectTransport`` (the default: httpcore2's
pools, the fast path), ``HttpxTransport`` (``httpx2.AsyncClient``'s public API) and
``MemoryTransport`` (a responder in the same process) carry the bytes.
"""

from __future__ import annotations

from ._base import (
    Body,
    HttpRequest,
    PreparedHeaders,
    SamplingClientError,
    SocketReads,
    Transport,
)
from ._direct import DirectTransport
from ._httpx import HttpxTransport, classify_transport_error
from ._memory import MemoryResponse, MemoryTransport

__all__ = [
    "Body",
    "DirectTransport",
    "HttpRequest",
    "HttpxTransport",
    "MemoryResponse",
    "MemoryTransport",
    "PreparedHeaders",
    "SamplingClientError",
    "SocketReads",
    "Transport",
    "classify_transport_error",
]
