"""Errors, metrics and the one event vocabulary every backend is turned into.

Per attempt, in order::

    StreamStarted            headers read, body not yet
    ModelMetadata?           model info from response headers
    FirstToken?              first text, refusal or reasoning of the attempt
    ChannelToken*            channel = TEXT | REASONING | REFUSAL
    ToolCallDelta*           tool_index, id?, name?, arguments_delta
    ToolArgumentsDelta*      after a run of ToolCallDelta: what it changed in the arguments
    OutputDelta*             after a run of answer text (a request with ``output=``): the same
    ReasoningCompleted?      a reasoning block is complete (signature / encrypted state known)
    BackendToolCallStarted/Completed*
    ToolCallCompleted*       each local tool call, whole, just before ``Completed``
    Retrying / ImagesStripped   before a new attempt
    Resumed                  a cut stream goes on from its last event (nothing discarded)
    exactly one of: Completed | Failed | Cancelled

The events carry everything the response is made of: :func:`trio_sampler.wire.collect`
folds them with the same :class:`~trio_sampler.wire.ResponseFold` the transforms build
``Completed.response`` with. ``item_index`` places an event's output item in the
response, in wire order (text, reasoning and hosted tool calls share one numbering).

The per-token events (:class:`ChannelToken`, :class:`ToolCallDelta`) are slotted but not
frozen: frozen attrs construction costs about 2.5x more and these are built once per token.
Treat every event as immutable all the same.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeAlias

import attrs

from ._conversation import (
    BackendToolCall,
    Citation,
    ConversationResponse,
    OpaqueItem,
    Reasoning,
    ServerTextDiffers,
    ToolCall,
    Usage,
)
from ._credential_names import redact_url
from ._errors import TrioSamplerError
from ._partial import JSONChange
from ._ratelimit import RateLimitSnapshot

__all__ = [
    "AttemptOutcome",
    "AttemptRecord",
    "BackendToolCallCompleted",
    "BackendToolCallStarted",
    "Cancelled",
    "ChannelToken",
    "CitationReceived",
    "Completed",
    "ContextEdited",
    "Failed",
    "FirstToken",
    "ImagesStripped",
    "LedgerEntry",
    "ModelMetadata",
    "OpaqueItemReceived",
    "OutputDelta",
    "ReasoningCompleted",
    "RequestMetrics",
    "Resumed",
    "Retrying",
    "SamplingChannel",
    "SamplingError",
    "SamplingErrorInfo",
    "SamplingErrorKind",
    "SamplingEvent",
    "ServedModelChanged",
    "ServerTextTaken",
    "StreamStarted",
    "StripReason",
    "TerminalEvent",
    "ToolArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallDelta",
]


class SamplingChannel(enum.Enum):
    """Which stream a token belongs to."""

    TEXT = "text"
    REASONING = "reasoning"
    #: The model's refusal text (OpenAI ``refusal``), kept apart from the answer.
    REFUSAL = "refusal"


class SamplingErrorKind(enum.Enum):
    """What went wrong, precisely enough to decide on a retry without parsing messages."""

    AUTH = "auth"
    HTTP = "http"
    API = "api"
    SERIALIZATION = "serialization"
    IDLE_TIMEOUT = "idle_timeout"
    RATE_LIMITED = "rate_limited"
    EMPTY_RESPONSE = "empty_response"
    MAX_TOKENS_TRUNCATION = "max_tokens_truncation"
    DOOM_LOOP_DETECTED = "doom_loop_detected"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    OVERLOADED = "overloaded"
    INVALID_REQUEST = "invalid_request"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    CONTENT_FILTER = "content_filter"
    TRANSPORT = "transport"
    #: A shared fleet limiter could not reach Redis and fails closed: nothing was sent.
    FLEET_UNAVAILABLE = "fleet_unavailable"
    #: A bug in this library (never the server's fault): not retried, logged once.
    INTERNAL = "internal"


@attrs.frozen
class SamplingErrorInfo:
    """A classified failure: plain data, safe to log (never contains a secret)."""

    kind: SamplingErrorKind
    #: A user-facing message: trimmed, never an HTML page, never a secret.
    message: str
    status_code: int | None = None
    retryable: bool = False
    #: Server-requested delay (``retry-after-ms`` / ``retry-after``), in seconds.
    retry_after: float | None = None
    #: The ``x-should-retry`` header, when sent.
    should_retry: bool | None = None
    #: Provider error type (``overloaded_error``, ``invalid_request_error``, ...).
    error_type: str | None = None
    #: Provider error code (``context_length_exceeded``, ``invalid_image``, ...).
    error_code: str | None = None
    #: The provider's request id (``x-request-id`` / ``request-id``), for support tickets.
    provider_request_id: str | None = None
    #: Rate-limit headers as sent (``x-ratelimit-*``, ``anthropic-ratelimit-*``,
    #: ``ratelimit*``, ``retry-after*``), names lower-cased.
    rate_limit: Mapping[str, str] = attrs.field(factory=dict)
    #: The same headers, parsed (:func:`trio_sampler.wire.parse_rate_limits`); ``None``
    #: when the response reported no rate limit.
    rate_limit_snapshot: RateLimitSnapshot | None = None

    def __str__(self) -> str:
        status = f" (HTTP {self.status_code})" if self.status_code is not None else ""
        return f"{self.kind.value}{status}: {self.message}"


class SamplingError(TrioSamplerError):
    """Raised by :meth:`SamplerHandle.submit_and_collect` when a request ends in ``Failed``.

    ``info`` is the classified error; ``partial`` what was received before it.
    """

    def __init__(
        self, info: SamplingErrorInfo, partial: ConversationResponse | None = None
    ) -> None:
        super().__init__(str(info))
        self.info = info
        self.partial = partial

    @property
    def kind(self) -> SamplingErrorKind:
        return self.info.kind


class StripReason(enum.Enum):
    """Why images were stripped before a retry."""

    SERVER_REJECTED = "server_rejected"
    PAYLOAD_HEURISTIC = "payload_heuristic"


class AttemptOutcome(enum.Enum):
    """How one attempt ended."""

    #: It produced the request's ``Completed``.
    COMPLETED = "completed"
    #: It failed (``AttemptRecord.kind`` says how); a retry or another route may follow.
    FAILED = "failed"
    #: It was cut short by the request's cancel or its ``Timeouts.total``.
    CANCELLED = "cancelled"
    #: A hedged attempt that lost the race and was cancelled.
    LOST_HEDGE = "lost_hedge"


@attrs.frozen
class AttemptRecord:
    """One attempt of a request: where it went, how it ended (``kind`` ``None`` = no
    error), and what it cost. Failed and cancelled attempts are billed too: their
    ``usage`` is what the server reported (or counted) before the end."""

    attempt: int
    kind: SamplingErrorKind | None
    status_code: int | None = None
    duration_ms: float = 0.0
    outcome: AttemptOutcome = AttemptOutcome.COMPLETED
    #: The route's name (``None`` for a sampler without routing).
    route: str | None = None
    #: The model asked for (the route's or the request's).
    model: str | None = None
    #: Milliseconds from submit to the attempt's start, its headers and first content.
    started_ms: float = 0.0
    #: Milliseconds from submit until the attempt's request was written to its connection
    #: (its last byte handed to the socket). ``None`` when the transport does not say (a
    #: mock or the in-memory emulator) or the request was never written.
    time_to_request_sent_ms: float | None = None
    time_to_headers_ms: float | None = None
    time_to_first_token_ms: float | None = None
    usage: Usage | None = None
    cost_usd_ticks: int | None = None
    #: What the attempt's response (headers, or error) said of the rate limits.
    rate_limit: RateLimitSnapshot | None = None
    #: Milliseconds the rate-limit pacer held the attempt before it was sent.
    rate_limit_wait_ms: float = 0.0


@attrs.frozen
class LedgerEntry:
    """One line of a request's usage ledger: what one attempt was billed, or, after a
    provider's server-side fallback (:class:`ServedModelChanged`), what one model of it
    was billed. Every attempt that was sent has its lines, whatever ended it (completed,
    failed, cancelled, a lost hedge); the request's ``total_usage`` and
    ``total_cost_usd_ticks`` are the ledger's sum (``docs/accounting.md``)."""

    attempt: int
    outcome: AttemptOutcome
    #: The model billed (the one that served; the one asked for when the server did not say).
    model: str | None
    #: What the server reported (``None``: nothing before the end, and no content came).
    usage: Usage | None
    #: The server's cost, else the model catalog's price of ``usage`` (``None``: unknown).
    cost_usd_ticks: int | None
    #: The share of a fallback hop: the part of the attempt's usage the model it was
    #: handed to served (a part of the attempt's usage, never more of it).
    hop: bool = False
    #: ``usage`` is the library's estimate, not the server's report: content arrived (so
    #: the server processed the request) but no usage was reported before the end. The
    #: prompt as the pacer estimates it (body bytes / 4), the output as the count of the
    #: attempt's content events (text pieces, tool-call deltas, the first-token mark): a
    #: rough count, there to keep a processed attempt from being billed nothing.
    estimated: bool = False
    #: The provider's id of the attempt's request (``x-request-id`` / ``request-id``, or
    #: an error body's ``request_id``): what the provider's own billing records are keyed
    #: by. ``None`` when no response head or error came (a connection that failed, an
    #: attempt cancelled before its headers).
    provider_request_id: str | None = None


@attrs.frozen
class RequestMetrics:
    """Latency and accounting of one request, attached to every terminal event.

    Times are milliseconds from submit. ``None`` means the point was never reached
    (e.g. no first token in a tools-only turn, or a cancel before headers).

    They describe the attempt that produced the terminal. ``time_to_request_sent_ms`` is
    when its request's last byte was written to the connection (``None`` when the
    transport does not say); the headers, the first token and the last byte are when the
    network read that brought them returned, so ``time_to_first_token_ms -
    time_to_request_sent_ms`` is the server's time to first token as the wire saw it,
    without the client's own path before the write.
    """

    time_to_request_sent_ms: float | None = None
    time_to_headers_ms: float | None = None
    time_to_first_token_ms: float | None = None
    time_to_last_byte_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_max_ms: float | None = None
    chunk_count: int = 0
    attempts: tuple[AttemptRecord, ...] = ()
    #: Every attempt's bill, line by line (:class:`LedgerEntry`), in attempt order.
    ledger: tuple[LedgerEntry, ...] = ()
    #: The usage and cost of the response delivered (``Completed``), or of the partial.
    usage: Usage | None = None
    cost_usd_ticks: int | None = None
    #: The sum of the ledger (retries, fail-overs, cancelled attempts and lost hedges
    #: included): what the request was billed. ``None`` when no attempt reported usage
    #: (or cost).
    total_usage: Usage | None = None
    total_cost_usd_ticks: int | None = None
    #: The route that served the response (``None`` without routing or without one).
    route: str | None = None
    #: Routes the chain passed over without an attempt, with why (an open circuit, a
    #: capability the request needs), in order.
    skipped_routes: tuple[tuple[str, str], ...] = ()
    #: The last rate-limit state an attempt's response reported (``None`` if none did).
    rate_limit: RateLimitSnapshot | None = None
    #: Milliseconds the rate-limit pacer held the attempts, all together.
    rate_limit_wait_ms: float = 0.0


# ---------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------


@attrs.frozen
class StreamStarted:
    """Response headers were read (status 2xx); the body has not been read yet.

    ``rate_limit`` is what the headers said of the provider's rate limits (``None`` when
    they said nothing).
    """

    request_id: str
    attempt: int = 1
    rate_limit: RateLimitSnapshot | None = None


@attrs.frozen
class ModelMetadata:
    """Model information from response headers or the stream's first event."""

    request_id: str
    model: str | None = None
    response_id: str | None = None
    context_window: int | None = None
    max_completion_tokens: int | None = None


@attrs.frozen
class FirstToken:
    """The first text or reasoning content of this attempt arrived (tool calls do not count)."""

    request_id: str


@attrs.define
class ChannelToken:
    """A piece of text on one channel. ``chunk_index`` counts text and reasoning, from 1.

    ``item_index`` is the output item the text belongs to (consecutive text is one item;
    each reasoning block is its own); ``summary_index`` (0, 1, ...) marks reasoning
    summary text (Responses), ``-1`` full text.
    """

    request_id: str
    channel: SamplingChannel
    text: str
    chunk_index: int
    item_index: int = 0
    summary_index: int = -1


@attrs.define
class ToolCallDelta:
    """A fragment of a local tool call.

    ``tool_index`` identifies the call within the attempt (0, 1, ... in order of first
    appearance). ``id`` and ``name`` are sent on the first fragment; ``arguments_delta`` is a
    fragment of JSON text, not valid JSON on its own.
    """

    request_id: str
    tool_index: int
    id: str | None = None
    name: str | None = None
    arguments_delta: str = ""


@attrs.define
class ToolArgumentsDelta:
    """What a run of :class:`ToolCallDelta` changed in the call's arguments, read as JSON.

    Sent right after the run it reads (the consecutive fragments of one call that one
    network read brought), by a sampler's request stream, for a request with tools.
    ``changes`` says what changed, never the whole document: a value set at a path, text
    appended to the string at a path, a string or container closed.
    The arguments so far are ``RequestStream.partial_arguments(tool_index)``.
    """

    request_id: str
    tool_index: int
    changes: tuple[JSONChange, ...]


@attrs.define
class OutputDelta:
    """What a run of answer text changed in the structured answer, read as JSON.

    Sent right after the run of ``ChannelToken`` it reads, for a request with ``output=``; the
    answer so far is ``RequestStream.partial_output()``. ``problems`` says what in the
    strings, objects and arrays this run closed does not match the schema (checked as they
    close, each problem reported once: a consumer may stop the request at the first),
    empty when all do. With a pydantic model as ``output``, a subtree whose type the model
    names is validated by that type instead (its ``Field`` constraints, and a nested
    model's validators). The whole answer is checked at the end (``output_parsed``).
    """

    request_id: str
    changes: tuple[JSONChange, ...]
    problems: tuple[str, ...] = ()


@attrs.frozen
class ToolCallCompleted:
    """A local tool call is whole (sent for each call just before ``Completed``).

    ``call`` is authoritative over the fragments (a server's final arguments win);
    ``call.arguments_complete`` is ``False`` when the arguments are not complete JSON.
    """

    request_id: str
    tool_index: int
    call: ToolCall


@attrs.frozen
class ReasoningCompleted:
    """A reasoning block is complete; ``item`` carries its round-trip state (signature, ...)."""

    request_id: str
    item: Reasoning
    item_index: int = 0

    @property
    def signature(self) -> str | None:
        return self.item.signature


@attrs.frozen
class ServerTextTaken:
    """The server's final text of an item replaced what its deltas said (the warning
    says both); the deltas already sent are not taken back."""

    request_id: str
    warning: ServerTextDiffers


@attrs.frozen
class ContextEdited:
    """The server edited the conversation's context before answering (Anthropic context
    management: old tool uses or thinking cleared). ``edits`` are its ``applied_edits``
    objects as received; ``cleared_input_tokens`` their total."""

    request_id: str
    edits: tuple[Mapping[str, Any], ...]
    cleared_input_tokens: int = 0


@attrs.frozen
class ServedModelChanged:
    """The server handed the request to another model inside one stream (Anthropic's
    server-side ``fallback`` block): from which model, to which, and why. The response's
    ``model`` is the last one that served; the block itself stays in the response as an
    :class:`~trio_sampler.types.OpaqueItem` and goes back on the next turn. Sent when the
    usage of the hop is known (the ``message_delta`` that reports ``usage.iterations``),
    else at the end of the message."""

    request_id: str
    from_model: str | None
    to_model: str | None
    trigger: str | None = None
    #: What the serving model's attempt used (the ``fallback_message`` entry of
    #: ``usage.iterations``), when the server said: a part of the response's usage, not
    #: more of it.
    usage: Usage | None = None


@attrs.frozen
class CitationReceived:
    """The answer text cites a source (see :class:`~trio_sampler.types.Citation`);
    ``item_index`` is the text item it belongs to."""

    request_id: str
    citation: Citation
    item_index: int = 0


@attrs.frozen
class OpaqueItemReceived:
    """The server handed over an object the neutral model keeps verbatim (an
    :class:`~trio_sampler.types.OpaqueItem`: a compaction item, a fallback block, ...)."""

    request_id: str
    item: OpaqueItem
    item_index: int = 0


@attrs.frozen
class BackendToolCallStarted:
    """The server started running a hosted tool."""

    request_id: str
    call_id: str
    name: str
    item_index: int = 0


@attrs.frozen
class BackendToolCallCompleted:
    """A hosted tool finished; ``result`` is the provider's payload (decoded JSON).

    ``call`` is the whole call (arguments, status, raw provider items for replay). It is
    also sent, as the call stands, for a hosted call still open when the stream ends.
    """

    request_id: str
    call_id: str
    name: str
    result: Any = None
    item_index: int = 0
    call: BackendToolCall | None = None


@attrs.frozen
class Retrying:
    """Another attempt follows. If ``discard_partial``, drop what this request streamed so far."""

    request_id: str
    attempt: int
    max_retries: int
    kind: SamplingErrorKind
    reason: str
    delay: float
    discard_partial: bool
    doom_loop_triggers: tuple[str, ...] = ()
    #: The route the next attempt goes to (``None`` without routing).
    route: str | None = None


@attrs.frozen
class Resumed:
    """The stream was cut and picks up where it stopped: the server kept the response
    (Responses background mode), and the events after ``after_sequence`` (the last one
    delivered) are read from it. Nothing is discarded and nothing is generated again:
    what the consumer holds stays, and the stream goes on with the next event."""

    request_id: str
    #: The server's response id the stream is read from.
    response_id: str
    #: The sequence number of the last event delivered before the cut.
    after_sequence: int
    #: The attempt number of the resumed read (the cut attempt's, counted on).
    attempt: int
    #: Why the stream was cut (the error kind and message of the cut).
    kind: SamplingErrorKind
    reason: str


def _redacted_urls(urls: tuple[str, ...]) -> str:
    return repr(tuple(redact_url(url) for url in urls))


@attrs.frozen
class Paced:
    """The attempt waits before it is sent, for the provider's rate limit as the sampler's
    pacer counts it (``trio_sampler.ratelimit``): nothing was sent yet."""

    request_id: str
    #: Why, in words: the dimension with no room (``"tokens"``...) or a 429's hold.
    reason: str
    #: How long it waits, in seconds, and until when (``trio.current_time()``).
    wait_s: float
    until: float
    #: The route the attempt goes to (``None`` without routing).
    route: str | None = None


@attrs.frozen
class ImagesStripped:
    """Images were replaced by placeholder text before a retry."""

    request_id: str
    stripped_urls: tuple[str, ...] = attrs.field(repr=_redacted_urls)
    reason: StripReason


@attrs.frozen
class Completed:
    """Terminal: the request finished. ``metrics`` is ``None`` outside the actor (replay).

    ``route`` and ``model`` name what served it: the route (``None`` without routing) and
    the model (the server's name for it, else the one asked for)."""

    request_id: str
    response: ConversationResponse
    metrics: RequestMetrics | None = None
    route: str | None = None
    model: str | None = None


@attrs.frozen
class Failed:
    """Terminal: the request failed. ``partial`` is what arrived before the failure."""

    request_id: str
    error: SamplingErrorInfo
    partial: ConversationResponse | None = None
    metrics: RequestMetrics | None = None


@attrs.frozen
class Cancelled:
    """Terminal: the request was cancelled; ``partial`` keeps what was already received."""

    request_id: str
    reason: str
    partial: ConversationResponse | None = None
    metrics: RequestMetrics | None = None


TerminalEvent: TypeAlias = Completed | Failed | Cancelled

SamplingEvent: TypeAlias = (
    StreamStarted
    | ModelMetadata
    | FirstToken
    | ChannelToken
    | ToolCallDelta
    | ToolArgumentsDelta
    | OutputDelta
    | ToolCallCompleted
    | ReasoningCompleted
    | BackendToolCallStarted
    | BackendToolCallCompleted
    | OpaqueItemReceived
    | CitationReceived
    | ServedModelChanged
    | ContextEdited
    | ServerTextTaken
    | Retrying
    | Resumed
    | Paced
    | ImagesStripped
    | Completed
    | Failed
    | Cancelled
)
