"""The small protocol every backend's stream transform follows. Pure.

A transform is a state machine for one attempt::

    transform = ChatCompletionsTransform(request_id)
    events = transform.start(headers)          # StreamStarted (+ ModelMetadata)
    for sse in decoder.feed(chunk):
        events += transform.feed(sse)           # tokens, tool-call deltas, ...
    # (or, a read at a time: transform.feed_payloads(decoder.feed_payloads(chunk)))
    events += transform.close()                 # end of body: the terminal
    # or, on a transport / decoder failure:
    events += transform.abort(error_info)       # Failed, with the partial output

It never raises on input. Provider data is validated explicitly: data that breaks the
documented shape raises :class:`ProviderDataError` inside a subclass, which ends the
stream with a typed ``Failed`` (kind ``serialization``, retryable) carrying the partial
output. Any other exception is a bug of ours: the stream ends with ``Failed`` kind
``internal`` (code ``internal_error``, never retried), logged once with its traceback.
After the terminal every call returns ``[]``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import orjson

from ..providers import CostField, profile_for
from ..types import (
    ApiBackend,
    Completed,
    ConversationResponse,
    Failed,
    ModelMetadata,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    ServedModelChanged,
    StreamStarted,
    TrioSamplerError,
    Usage,
)
from ._accumulate import StreamAccumulator
from ._ratelimit import parse_lowered_rate_limits
from .errors import classify_stream_error, error_info, internal_error
from .sse import ServerSentEvent, SSEPayload, payload_event

__all__ = [
    "ProviderDataError",
    "StreamTransform",
    "reported_cost",
    "str_field",
    "truncated_stream_error",
]


class ProviderDataError(TrioSamplerError, ValueError):
    """Provider data that does not have the documented shape (a field of the wrong type,
    a required field missing). Raised by a transform's explicit checks; it becomes a
    ``Failed`` of kind ``serialization``, never an exception out of the transform."""


def str_field(obj: Mapping[str, Any], field: str, label: str | None = None) -> str:
    """A provider's text field: absent or null is ``""``; any type but a string is
    malformed (:class:`ProviderDataError`, named ``<obj[label]>.<field>`` when ``label``
    is given, e.g. the event's ``type``)."""
    value = obj.get(field)
    if type(value) is str:
        return value
    if value is None:
        return ""
    name = f"{obj.get(label)}.{field}" if label is not None else field
    raise ProviderDataError(f"{name} is {type(value).__name__}, not a string")


def truncated_stream_error(what: str) -> SamplingErrorInfo:
    """The error for a body that ended before the protocol's terminator."""
    return error_info(
        SamplingErrorKind.TRANSPORT,
        f"the stream ended before {what} (connection closed early?)",
    )


# A reported cost beyond this many USD ticks (a million dollars) is not a cost.
_MAX_COST_TICKS = 10**16


def reported_cost(usage: Mapping[str, Any], fields: tuple[CostField, ...]) -> int | None:
    """The cost in USD ticks a ``usage`` object reports in one of ``fields`` (the profile's
    :attr:`~trio_sampler.providers.ProviderProfile.cost_fields`): the first positive, finite
    number, or ``None``. Zero, negative, boolean, string and absurd values are not a cost."""
    for field in fields:
        value = usage.get(field.name)
        if type(value) is int or type(value) is float:
            ticks = value * field.ticks_per_unit
            if 0 < ticks <= _MAX_COST_TICKS:  # also false for NaN; infinity is too large
                return max(1, round(ticks))
    return None


# The model-limit headers read when the profile names none: xAI's, the only ones in use
# (any server may send them; reading them costs nothing when absent).
_CONTEXT_HEADER = "x-grok-context-window"
_MAX_OUTPUT_HEADER = "x-grok-max-completion-tokens"


def _int_header(lowered: Mapping[str, str], name: str) -> int | None:
    """The integer value of header ``name`` in ``lowered`` (names lower-cased)."""
    value = lowered.get(name.lower())
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


class StreamTransform(abc.ABC):
    """Base class: totality, ``[DONE]`` handling, JSON decoding and the terminal guard.

    Subclasses implement :meth:`_on_json` (one decoded event) and :meth:`_on_end`
    (end of body without a terminal so far) using ``self.acc``.
    """

    #: The built-in backend this transforms (``None`` for one added with
    #: ``register_backend``): the ``origin`` of round-trip state it produces.
    backend: ClassVar[ApiBackend | None] = None

    #: The event names a subclass that overrides ``_feed_data`` takes there itself
    #: (``None``: any name; every named event then goes through it).
    taken_events: ClassVar[frozenset[str] | None] = None

    def __init__(self, request_id: str = "stream", *, provider: str | None = None) -> None:
        self.request_id = request_id
        self.provider = provider
        #: How an error event inside the 200 stream is classified: the backend's
        #: :meth:`~trio_sampler.wire.Backend.classify_stream_error` (set by
        #: :meth:`~trio_sampler.wire.WireBackend.new_transform`; the shared one otherwise).
        self.classify_stream_error: Callable[[Mapping[str, Any]], SamplingErrorInfo] = (
            classify_stream_error
        )
        #: The provider's quirks (validated: an unknown name raises ``ValueError`` here).
        self.profile = profile_for(provider)
        self.acc = StreamAccumulator(request_id, self.backend)
        #: Events of types this transform does not know (ignored: forward compatibility).
        self.unknown_events = 0
        #: ``data: [DONE]`` was seen.
        self.done_marker = False
        #: The provider's server-side fallback hops delivered so far, with their usage
        #: when the server said (a request's ledger bills each model its share).
        self.served_hops: list[ServedModelChanged] = []
        self._started = False

    @property
    def protocol(self) -> str:
        """The protocol's name, for messages."""
        return self.backend.value if self.backend is not None else type(self).__name__

    @property
    def finished(self) -> bool:
        """True once the terminal event was produced."""
        return self.acc.finished

    @property
    def usage(self) -> Usage | None:
        """The usage the server has reported so far (``None`` before any report)."""
        return self.acc.usage

    @property
    def reasoning_opened(self) -> bool:
        """True once the stream opened a reasoning block: until then none of its events
        is reasoning."""
        return self.acc.reasoning_opened

    #: Bytes a transform holds of its own, outside the fold (a hosted tool's input being
    #: assembled): a transform that keeps such state adds to it as it grows.
    state_bytes = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the response the stream holds: its text, as CPython stores it, and
        its transform's own state (what a sampler's memory account counts)."""
        return self.acc.held_bytes + self.state_bytes

    @property
    def max_held_bytes(self) -> int:
        """The most text the stream may hold (see :attr:`held_bytes`); a delta past it
        ends the stream with ``Failed`` (``response_too_large``). No bound by default."""
        return self.acc.fold.max_held_bytes

    @max_held_bytes.setter
    def max_held_bytes(self, limit: int) -> None:
        self.acc.fold.max_held_bytes = limit

    @property
    def outcome(self) -> Completed | Failed | None:
        """How the stream ended, as a value of its own (``None`` until it has): the
        terminal event, which is also the last event of the call that produced it, so a
        caller that forwards events can hold it back without looking at every event."""
        return self.acc.outcome

    def start(
        self,
        headers: Mapping[str, str] | None = None,
        *,
        attempt: int = 1,
        now: float | None = None,
    ) -> list[SamplingEvent]:
        """Headers are in: ``StreamStarted`` (with the rate-limit state they report), then
        ``ModelMetadata`` if headers carry any. ``now`` (a Unix time) is what absolute
        reset times are read against when the headers carry no ``Date``."""
        if self._started:
            return []
        self._started = True
        # Names lower-cased once (a repeated header: its first value), for every lookup.
        lowered: dict[str, str] = {}
        for name, value in (headers or {}).items():
            lowered.setdefault(name.lower(), value)
        snapshot = parse_lowered_rate_limits(lowered, now=now) if lowered else None
        out: list[SamplingEvent] = [StreamStarted(self.request_id, attempt, snapshot)]
        profile = self.profile
        if lowered:
            window = _int_header(lowered, profile.context_window_header or _CONTEXT_HEADER)
            max_out = _int_header(lowered, profile.max_output_tokens_header or _MAX_OUTPUT_HEADER)
            model = lowered.get("openai-model") or lowered.get("x-model")
            if window is not None or max_out is not None or model is not None:
                out.append(
                    ModelMetadata(
                        self.request_id,
                        model=model,
                        context_window=window,
                        max_completion_tokens=max_out,
                    )
                )
        return out

    def feed(self, event: ServerSentEvent) -> list[SamplingEvent]:
        """Map one SSE event; never raises."""
        out: list[SamplingEvent] = []
        self._feed_data(event.event, event.data, out)
        return out

    def feed_payloads(self, items: list[SSEPayload]) -> list[SamplingEvent]:
        """Map the events of one read, as :meth:`SSEDecoder.feed_payloads
        <trio_sampler.wire.SSEDecoder.feed_payloads>` gives them; never raises.

        The same events as :meth:`feed` on each of them (raw data standing for the
        event of that data), at less cost per event: the raw data is parsed as it is,
        without a ``str`` or an event object of its own.
        """
        out: list[SamplingEvent] = []
        if type(self).feed is not StreamTransform.feed:  # a subclass that maps events itself
            for item in items:
                out.extend(self.feed(payload_event(item)))
            return out
        acc = self.acc
        if items and not self._started and not acc.finished:
            out.extend(self.start())
        map_json = self._map_json
        # The names a subclass takes in its own ``_feed_data`` (``None``: it may take any).
        taken: frozenset[str] | None = frozenset()
        if type(self)._feed_data is not StreamTransform._feed_data:
            taken = self.taken_events
        raw: bytes
        for item in items:
            kind = type(item)
            if kind is bytes:
                name = "message"
                raw = item  # type: ignore[assignment]
            elif kind is tuple:
                name, raw = item  # type: ignore[misc, assignment]
                if taken is None or name in taken:
                    self._feed_data(name, raw.decode("utf-8", "replace"), out)
                    continue
            else:
                event = payload_event(item)
                self._feed_data(event.event, event.data, out)
                continue
            if acc.finished:
                self._feed_data(name, raw.decode("utf-8", "replace"), out)
                continue
            try:
                payload = orjson.loads(raw)
            except orjson.JSONDecodeError:
                # Not JSON (``[DONE]``, a blank field, garbage) or not UTF-8: the one path
                # for such data, on its text.
                self._feed_data(name, raw.decode("utf-8", "replace"), out)
                continue
            map_json(name, payload, out)
        return out

    def _feed_data(self, name: str, data: str, out: list[SamplingEvent]) -> None:
        """One event (its name, its data) into ``out``. A subclass may take events of
        a name of its own here (every event named other than ``"message"`` comes through
        it); a data-only ``"message"`` event may go straight to :meth:`_on_json`."""
        if self.acc.finished:
            if data[:6] == "[DONE]":
                self.done_marker = True
            return
        if not self._started:
            out.extend(self.start())
        # ``[DONE]`` (no JSON text starts so) before parsing: the data comes here after the
        # raw bytes already failed to parse, and a failed parse builds an exception.
        if data[:6] == "[DONE]":
            self.done_marker = True
            self._on_done(out)
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            if not data.strip():
                # A blank data field carries nothing (seen from some proxies): skip it.
                return
            self._serialization_failure(f"a stream event is not valid JSON: {data[:80]!r}", out)
            return
        self._map_json(name, payload, out)

    def _map_json(self, name: str, payload: object, out: list[SamplingEvent]) -> None:
        """One parsed event into ``out``: an object goes to :meth:`_on_json`; any other
        JSON, or a shape the provider should not send, is a serialization failure; a bug
        of ours is an internal error (never retried)."""
        try:
            if type(payload) is not dict:
                self._serialization_failure("a stream event is JSON but not an object", out)
            else:
                self._on_json(name, payload, out)
        except ProviderDataError as exc:
            self._serialization_failure(
                f"a {self.protocol} stream event has an unexpected shape: {exc}", out
            )
        except Exception as exc:  # a bug of ours: reported as ours, never retried
            self.acc.fail(internal_error(exc, f"mapping a {self.protocol} event"), out)

    def close(self) -> list[SamplingEvent]:
        """End of body: the terminal (``Completed``, or ``Failed`` if the stream was cut)."""
        if self.acc.finished:
            return []
        out: list[SamplingEvent] = []
        if not self._started:
            out.extend(self.start())
        try:
            self._on_end(out)
        except ProviderDataError as exc:
            self._serialization_failure(f"the {self.protocol} stream is malformed: {exc}", out)
        except Exception as exc:  # a bug of ours: reported as ours, never retried
            self.acc.fail(internal_error(exc, f"ending a {self.protocol} stream"), out)
        if not self.acc.finished:  # a subclass that forgot its terminal still ends the stream
            self.acc.fail(truncated_stream_error("its terminal event"), out)
        return out

    def abort(self, error: SamplingErrorInfo) -> list[SamplingEvent]:
        """End the stream with ``Failed(error)`` and the partial output (transport, limits)."""
        if self.acc.finished:
            return []
        out: list[SamplingEvent] = []
        if not self._started:
            out.extend(self.start())
        self.acc.fail(error, out)
        return out

    def partial(self) -> ConversationResponse | None:
        """What this attempt produced so far, or ``None`` if nothing (no content, no usage)."""
        acc = self.acc
        if not (acc.has_content() or acc.usage):
            return None
        return acc.build_response()

    # -- for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    def _on_json(self, event_name: str, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        """Map one decoded JSON event onto ``self.acc``."""

    @abc.abstractmethod
    def _on_end(self, out: list[SamplingEvent]) -> None:
        """End of body: complete or fail ``self.acc``."""

    def _on_done(self, out: list[SamplingEvent]) -> None:  # noqa: B027 (optional hook)
        """``data: [DONE]``. Default: nothing (the end of body decides)."""

    def _stream_error(self, payload: Mapping[str, Any], out: list[SamplingEvent]) -> None:
        """An error event inside the 200 stream → ``Failed`` with the partial output."""
        self.acc.fail(self.classify_stream_error(payload), out)

    def _serialization_failure(self, message: str, out: list[SamplingEvent]) -> None:
        self.acc.fail(error_info(SamplingErrorKind.SERIALIZATION, message), out)
