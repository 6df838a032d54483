"""The emulator's billing record: what it billed for every response it served.

A provider bills what it generated, whatever the client made of it. The emulator keeps
the same account, one :class:`BillingEntry` per sampling request (keyed by the request
id it sends back, ``x-request-id`` or ``request-id``), so a client can check its own
usage ledger against it. The rule, stated once (also in ``docs/emulator.md``):

* **refused** (an error status: a scripted ``status`` fault, a 429 of the rate limits, a
  400, a 503 of the reply budget): nothing was generated, nothing is billed.
* **completed** (the whole reply was sent): the reply's usage.
* **cut** (a scripted ``drop``, ``stream_error``, ``malformed`` or ``no_terminator``
  fault ended the stream): the prompt in full (input, cache read and write) and the output
  generated up to the cut: the reply's output tokens in proportion to the content deltas
  sent (never less than the output the stream had reported). A non-streamed body is
  generated whole before it is sent: a cut body bills the whole reply.
* **client_gone** (the client closed the stream or the connection mid-way: a cancel, a
  timeout, a lost hedge): as a cut, at the point it went. A non-streamed reply whose
  client left before its body was sent bills nothing.
* **background** (Responses ``background: true``): the generation runs whether a client
  reads it or not, so the reply's usage in full, or, once cancelled, the prompt and the
  output of the deltas generated before the cancel.

Beside what it billed, each entry says what the client could read of it (``reported``):
the usage the frames sent before the end carried, as the API puts it (a Messages stream
reports its input and one output token in ``message_start``, the whole in
``message_delta``; Chat Completions only in its final usage chunk, and only with
``stream_options.include_usage``; Responses in ``response.completed`` or
``response.incomplete``). A frame after a malformed one cannot be read, so it reports
nothing. ``billed`` minus ``reported`` is what a client cannot know it was billed.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import attrs

from ._api_error import ApiError
from ._reply import ReplyUsage
from ._sse import is_token_frame

__all__ = [
    "DEFAULT_MAX_BILLED",
    "BilledUsage",
    "BillingBook",
    "BillingEntry",
    "BillingOutcome",
    "StreamProgress",
    "settle_body",
    "settle_stream",
]

#: Entries kept (the oldest dropped first).
DEFAULT_MAX_BILLED: Final = 10_000


class BillingOutcome(enum.Enum):
    """How a response ended, for its bill."""

    #: Still being served.
    OPEN = "open"
    COMPLETED = "completed"
    REFUSED = "refused"
    CUT = "cut"
    CLIENT_GONE = "client_gone"
    BACKGROUND = "background"


@attrs.frozen
class BilledUsage:
    """Token counts in neutral terms: ``input_tokens`` is the whole prompt, its cached
    part included (``cache_read_tokens``, ``cache_write_tokens`` say how much)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @classmethod
    def of(cls, usage: ReplyUsage, output_tokens: int | None = None) -> BilledUsage:
        """``usage`` (with ``output_tokens`` instead of its own, when given)."""
        return cls(
            usage.input_tokens,
            usage.output_tokens if output_tokens is None else output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        )

    def as_json(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.define
class BillingEntry:
    """What the emulator billed for one sampling request, and what the client could read
    of it. Updated while the response is served; final once ``outcome`` is not ``open``."""

    #: The id sent back in ``x-request-id`` (OpenAI) or ``request-id`` (Anthropic).
    request_id: str
    #: ``chat_completions``, ``responses`` or ``messages``.
    backend: str
    #: The script's ``scenario`` (``""``: none).
    scenario: str = ""
    model: str | None = None
    #: The status the response was answered with (``None``: none was sent).
    status: int | None = None
    outcome: BillingOutcome = BillingOutcome.OPEN
    #: What was billed (``None``: nothing).
    billed: BilledUsage | None = None
    #: The usage the client could read from what was sent (``None``: none).
    reported: BilledUsage | None = None
    #: Content deltas (text, reasoning, tool arguments) sent, and in the whole reply.
    deltas_sent: int = 0
    deltas: int = 0
    #: The Responses id, for a background response (its cancel updates the bill).
    response_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "backend": self.backend,
            "scenario": self.scenario,
            "model": self.model,
            "status": self.status,
            "outcome": self.outcome.value,
            "billed": None if self.billed is None else self.billed.as_json(),
            "reported": None if self.reported is None else self.reported.as_json(),
            "deltas_sent": self.deltas_sent,
            "deltas": self.deltas,
        }


@attrs.define
class StreamProgress:
    """How far a streamed reply got: frames handed to the connection, and the first frame
    the client can no longer read (after a malformed one)."""

    sent: int = 0
    readable: int | None = None
    #: The end of the stream was sent.
    done: bool = False
    #: The scripted outcome fault fired (the stream was cut by the server).
    faulted: bool = False


def _reported_in(
    backend: str, frames: Sequence[bytes], usage: ReplyUsage, include_usage: bool
) -> BilledUsage | None:
    """The usage the client can read from ``frames`` (all of them sent), as each API
    reports it."""
    if backend == "messages":
        if any(frame.startswith(b"event: message_delta") for frame in frames):
            return BilledUsage.of(usage)
        if any(frame.startswith(b"event: message_start") for frame in frames):
            return BilledUsage.of(usage, min(1, usage.output_tokens))
        return None
    if backend == "responses":
        ends = (b"event: response.completed", b"event: response.incomplete")
        return BilledUsage.of(usage) if any(f.startswith(ends) for f in frames) else None
    if include_usage and any(b'"choices":[],"usage":{' in frame for frame in frames):
        return BilledUsage.of(usage)
    return None


def settle_stream(
    entry: BillingEntry,
    frames: Sequence[bytes],
    progress: StreamProgress,
    usage: ReplyUsage,
    include_usage: bool,
) -> None:
    """Bill a streamed reply as far as it got (the table of the module's docstring)."""
    complete = progress.done and not progress.faulted
    readable = frames[: progress.sent if progress.readable is None else progress.readable]
    if entry.outcome is BillingOutcome.BACKGROUND:  # billed as generated, read or not
        entry.reported = _reported_in(entry.backend, readable, usage, include_usage)
        return
    if complete:  # every API's whole stream reports its usage (Chat: when asked to)
        entry.outcome = BillingOutcome.COMPLETED
        entry.billed = BilledUsage.of(usage)
        reports = include_usage or entry.backend != "chat_completions"
        entry.reported = entry.billed if reports else None
        return
    entry.outcome = BillingOutcome.CUT if progress.faulted else BillingOutcome.CLIENT_GONE
    entry.reported = _reported_in(entry.backend, readable, usage, include_usage)
    entry.deltas = sum(map(is_token_frame, frames))
    entry.deltas_sent = sum(map(is_token_frame, frames[: progress.sent]))
    if entry.deltas:
        output = usage.output_tokens * entry.deltas_sent // entry.deltas
    else:
        output = usage.output_tokens if progress.sent else 0
    if entry.reported is not None:
        output = max(output, entry.reported.output_tokens)
    entry.billed = BilledUsage.of(usage, output)


def settle_body(entry: BillingEntry, usage: ReplyUsage, *, cut: bool) -> None:
    """Bill a non-streamed reply whose body was sent (``cut``: cut short or malformed,
    so the client could read none of it): it was generated whole before it was sent."""
    entry.reported = None if cut else BilledUsage.of(usage)
    if entry.outcome is BillingOutcome.BACKGROUND:
        return
    entry.outcome = BillingOutcome.CUT if cut else BillingOutcome.COMPLETED
    entry.billed = BilledUsage.of(usage)


class BillingBook:
    """Every sampling request's :class:`BillingEntry`, by request id, oldest first; at
    most ``max_entries`` (the oldest dropped first)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_BILLED) -> None:
        if not (isinstance(max_entries, int) and max_entries > 0):
            raise ValueError(
                f"max_billed must be a positive integer (entries kept); got {max_entries!r}"
            )
        self.max_entries = max_entries
        self._entries: OrderedDict[str, BillingEntry] = OrderedDict()
        self._background: dict[str, str] = {}

    def open(self, request_id: str, backend: str) -> BillingEntry:
        """The entry of a request being served (billed nothing yet)."""
        entry = BillingEntry(request_id, backend)
        self._entries[request_id] = entry
        while len(self._entries) > self.max_entries:
            _, dropped = self._entries.popitem(last=False)
            if dropped.response_id is not None:
                self._background.pop(dropped.response_id, None)
        return entry

    @contextmanager
    def serving(self, request_id: str, backend: str) -> Iterator[BillingEntry]:
        """The entry of a request while it is served, settled whatever ends it: an error
        status bills nothing (refused), a client gone before anything was billed is
        recorded as gone."""
        entry = self.open(request_id, backend)
        try:
            yield entry
        except ApiError as error:  # answered with an error status: nothing generated
            entry.status, entry.outcome = error.status, BillingOutcome.REFUSED
            raise
        finally:
            if entry.outcome is BillingOutcome.OPEN:  # left before anything was billed
                entry.outcome = BillingOutcome.CLIENT_GONE

    def kept(self, entry: BillingEntry, response_id: str, usage: ReplyUsage) -> None:
        """``entry`` is a background response: billed in full as it is generated."""
        entry.outcome = BillingOutcome.BACKGROUND
        entry.billed = BilledUsage.of(usage)
        entry.response_id = response_id
        self._background[response_id] = entry.request_id

    def background_cancelled(self, response_id: str, generated: int, deltas: int) -> None:
        """A background response was cancelled with ``generated`` of its ``deltas``
        content deltas generated: its output is billed that far."""
        entry = self._entries.get(self._background.get(response_id, ""))
        if entry is None or entry.billed is None:
            return
        billed = entry.billed
        output = billed.output_tokens * generated // deltas if deltas else billed.output_tokens
        entry.billed = attrs.evolve(billed, output_tokens=output)
        entry.deltas, entry.deltas_sent = deltas, generated

    def discard(self, request_id: str) -> None:
        """Forget a request's entry (a bench-mode answer: not recorded)."""
        self._entries.pop(request_id, None)

    def find(self, request_id: str) -> BillingEntry | None:
        return self._entries.get(request_id)

    def entries(self, scenario: str | None = None) -> list[BillingEntry]:
        """The entries of ``scenario`` (every one when ``None``), oldest first."""
        if scenario is None:
            return list(self._entries.values())
        return [entry for entry in self._entries.values() if entry.scenario == scenario]

    def clear(self) -> None:
        self._entries.clear()
        self._background.clear()
