"""Responses background mode: responses kept for retrieval, resume and cancel.

A request with ``background: true`` is generated once, as any other: its events are
rendered, numbered by ``sequence_number``, and kept here under the response's id. The
stream that asked for it may drop (a scripted ``drop`` fault cuts it at a chosen event);
the response is not lost with it: ``GET /v1/responses/{id}?stream=true&starting_after=N``
replays the kept events after ``N`` from the buffer, without generating anything again
(events not generated yet are sent as the generation reaches them: it goes on at the
script's pace whether a client reads it or not), and ``GET /v1/responses/{id}`` returns
the response object (``in_progress`` until its last event is generated). ``POST
/v1/responses/{id}/cancel`` cancels it (its status becomes ``cancelled``). As on the
OpenAI API, a kept response expires (``ttl_s`` on the emulator's clock): retrieval then
answers 404, and a client falls back to starting over.

:attr:`BackgroundStore.records` is the emulator's own account per response id: how many
times it was generated (always once), how many delta events that generation held, how
many times it was retrieved, and whether it was cancelled while it ran.

A kept response's frames are packed (:class:`~trio_sampler.emulator._budget.Frames`) and
held in the emulator's reply budget while they are kept: past it, a new background
request is refused as a reply is (503, Anthropic's 529, with ``retry-after``), after the
expired responses are let go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final

import attrs

from ._budget import Frames, ReplyBudget
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
    """A background response as kept: its events (by sequence number), its object, and
    its generation's schedule: event ``i`` is generated at ``kept_at + i * interval``
    (the script's ``delay_ms``), whether or not a client is reading it."""

    response_id: str
    frames: Frames
    body: dict[str, Any]
    kept_at: float
    interval: float = 0.0
    #: When it was cancelled (``None``: it was not); nothing is generated after.
    cancelled_at: float | None = None

    def due(self, sequence: int) -> float:
        """When event ``sequence`` is generated (trio's clock)."""
        return self.kept_at + sequence * self.interval

    def status(self, now: float) -> str:
        last = len(self.frames) - 1
        if self.cancelled_at is not None and self.due(last) > self.cancelled_at:
            return "cancelled"
        return "completed" if self.due(last) <= now else "in_progress"

    def response(self, now: float) -> dict[str, Any]:
        """The response object as ``GET /v1/responses/{id}`` returns it now (its output
        and usage only once it completed)."""
        status = self.status(now)
        if status == "completed":
            return {**self.body, "background": True}
        return {**self.body, "status": status, "output": [], "usage": None, "background": True}

    def cut(self, starting_after: int | None) -> range:
        """The sequence numbers a retrieval from ``starting_after`` sends (all:
        ``None``): those after it, up to the cancellation if there was one."""
        end = len(self.frames)
        if self.cancelled_at is not None:
            end = sum(1 for n in range(end) if self.due(n) <= self.cancelled_at)
        return range(0 if starting_after is None else starting_after + 1, end)


class BackgroundStore:
    """The background responses kept, by id, for ``ttl_s`` seconds each."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, budget: ReplyBudget | None = None) -> None:
        self.ttl_s = ttl_s
        #: Where the kept frames are held (``None``: not counted).
        self.budget = budget
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        #: The emulator's account of every background response (bounded like the store).
        self.records: OrderedDict[str, BackgroundRecord] = OrderedDict()

    def keep(
        self,
        response_id: str,
        frames: Iterable[bytes],
        body: dict[str, Any],
        now: float,
        interval: float = 0.0,
        *,
        anthropic: bool = False,
    ) -> None:
        """Keep a response whose generation starts now (``frames``: its stream, numbered;
        ``interval``: seconds between two events).

        Raises:
            ApiError: 503 (529 with ``anthropic``), when the budget cannot hold its frames.
        """
        packed = Frames(frames)
        self._expire(now)
        if self.budget is not None:
            self.budget.take(packed.nbytes, anthropic=anthropic)
        self._drop(response_id)
        self._kept[response_id] = StoredResponse(response_id, packed, body, now, interval)
        record = self.records.setdefault(response_id, BackgroundRecord(response_id))
        self.records.move_to_end(response_id)
        record.generations += 1
        record.generated_deltas += sum(map(is_token_frame, packed))
        while len(self._kept) > MAX_KEPT:
            self._drop(next(iter(self._kept)))
        while len(self.records) > MAX_KEPT:
            self.records.popitem(last=False)

    @property
    def held_bytes(self) -> int:
        """The memory the kept frames take (as the reply budget counts it)."""
        return sum(stored.frames.nbytes for stored in self._kept.values())

    def _drop(self, response_id: str) -> None:
        stored = self._kept.pop(response_id, None)
        if stored is not None and self.budget is not None:
            self.budget.give_back(stored.frames.nbytes)

    def _expire(self, now: float) -> None:
        """Let go of the expired responses (kept in the order they were kept)."""
        kept = self._kept
        while kept:
            oldest = next(iter(kept.values()))
            if now - oldest.kept_at < self.ttl_s:
                return
            self._drop(oldest.response_id)

    def find(self, response_id: str, now: float) -> StoredResponse | None:
        """The kept response ``response_id`` (``None``: unknown or expired)."""
        stored = self._kept.get(response_id)
        if stored is None:
            return None
        if now - stored.kept_at >= self.ttl_s:
            self._drop(response_id)
            return None
        return stored

    def retrieved(self, response_id: str) -> None:
        record = self.records.get(response_id)
        if record is not None:
            record.retrievals += 1

    def cancel(self, stored: StoredResponse, now: float) -> None:
        """Cancel ``stored``: its generation stops now (a response already finished
        keeps its status, as the API's does)."""
        if stored.status(now) != "in_progress":
            return
        stored.cancelled_at = now
        record = self.records.get(stored.response_id)
        if record is not None:
            record.cancelled = True
