"""Responses background mode: responses kept for retrieval, resume and cancel.

A request with ``background: true`` is generated once, as any other: its events are
rendered, numbered by ``sequence_number``, and kept here under the response's id. The
stream that asked for it may drop (a scripted ``drop`` fault cuts it at a chosen event);
the response is not lost with it: ``GET /v1/responses/{id}?stream=true&starting_after=N``
replays the kept events after ``N`` from the buffer, without generating anything again,
and ``GET /v1/responses/{id}`` returns the response object. ``POST
/v1/responses/{id}/cancel`` cancels it (its status becomes ``cancelled``). As on the
OpenAI API, a kept response expires (``ttl_s`` on the emulator's clock): retrieval then
answers 404, and a client falls back to starting over.

:attr:`BackgroundStore.records` is the emulator's own account per response id: how many
times it was generated (always once), how many delta events that generation held, how
many times it was retrieved, and whether it was cancelled.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

import attrs

from ._sse import is_token_frame

__all__ = ["BackgroundRecord", "BackgroundStore", "StoredResponse"]

#: How long a background response is kept for retrieval (the OpenAI API keeps them for
#: about ten minutes).
DEFAULT_TTL_S: Final = 600.0
#: At most this many responses are kept (the oldest dropped first).
MAX_KEPT: Final = 1024


@attrs.define
class BackgroundRecord:
    """What the emulator did with one background response."""

    response_id: str
    #: Times its answer was generated (a resumed stream does not generate it again).
    generations: int = 0
    #: Content deltas its generation produced.
    generated_deltas: int = 0
    #: Streaming retrievals (resumes) served.
    retrievals: int = 0
    cancelled: bool = False


@attrs.define
class StoredResponse:
    """A background response as kept: its events (by sequence number) and its object."""

    response_id: str
    frames: list[bytes]
    body: dict[str, Any]
    kept_at: float
    status: str = "completed"

    def response(self) -> dict[str, Any]:
        """The response object as ``GET /v1/responses/{id}`` returns it."""
        return {**self.body, "status": self.status, "background": True}

    def frames_after(self, starting_after: int | None) -> list[bytes]:
        """The events with a sequence number above ``starting_after`` (all: ``None``);
        sequence numbers are the frames' positions."""
        return self.frames if starting_after is None else self.frames[starting_after + 1 :]


class BackgroundStore:
    """The background responses kept, by id, for ``ttl_s`` seconds each."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        #: The emulator's account of every background response (bounded like the store).
        self.records: OrderedDict[str, BackgroundRecord] = OrderedDict()

    def keep(self, response_id: str, frames: list[bytes], body: dict[str, Any], now: float) -> None:
        """Keep a response just generated (``frames``: its stream, numbered)."""
        self._kept[response_id] = StoredResponse(response_id, frames, body, now)
        self._kept.move_to_end(response_id)
        record = self.records.setdefault(response_id, BackgroundRecord(response_id))
        self.records.move_to_end(response_id)
        record.generations += 1
        record.generated_deltas += sum(map(is_token_frame, frames))
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
        while len(self.records) > MAX_KEPT:
            self.records.popitem(last=False)

    def find(self, response_id: str, now: float) -> StoredResponse | None:
        """The kept response ``response_id`` (``None``: unknown or expired)."""
        stored = self._kept.get(response_id)
        if stored is None:
            return None
        if now - stored.kept_at >= self.ttl_s:
            del self._kept[response_id]
            return None
        return stored

    def retrieved(self, response_id: str) -> None:
        record = self.records.get(response_id)
        if record is not None:
            record.retrievals += 1

    def cancel(self, stored: StoredResponse) -> None:
        """Cancel ``stored`` (a response already finished keeps its status)."""
        record = self.records.get(stored.response_id)
        if record is not None:
            record.cancelled = True
        if stored.status in ("queued", "in_progress"):
            stored.status = "cancelled"
