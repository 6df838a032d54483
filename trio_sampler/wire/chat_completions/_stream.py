"""Chat Completions stream transform: ``chat.completion.chunk`` SSE events → SamplingEvents.

Sans-I/O and total (see :class:`~trio_sampler.wire._transform.StreamTransform`). The wire
format is data-only SSE ending in ``data: [DONE]``; every chunk is one JSON object with
``choices[].delta`` fragments, an optional ``usage`` object and, on error, an ``error``
object. The mapping, the provider quirks it handles and the deliberate differences from
the official ``openai`` SDK are documented in ``docs/backends/chat_completions-stream.md``.

Only choice index 0 is the answer: an ``n > 1`` stream is accepted, the other choices are
ignored (counted in :attr:`ChatCompletionsTransform.ignored_choices`).
"""

from __future__ import annotations

import math
import operator
from itertools import repeat, takewhile
from typing import Any, ClassVar, cast

import orjson

from ...types import (
    ApiBackend,
    BackendToolCall,
    SamplingEvent,
    StopReason,
    Usage,
)
from .._citations import citation_from_wire
from .._fold import arguments_complete
from .._transform import (
    ProviderDataError,
    StreamTransform,
    reported_cost,
    str_field,
    truncated_stream_error,
)
from .._usage import malformed_counts
from ..errors import internal_error
from ..sse import SSEPayload

__all__ = ["ChatCompletionsTransform"]

_FINISH_REASONS: dict[str, StopReason] = {
    "stop": StopReason.STOP,
    "length": StopReason.LENGTH,
    "tool_calls": StopReason.TOOL_CALLS,
    "function_call": StopReason.TOOL_CALLS,  # deprecated single-function form
    "content_filter": StopReason.CONTENT_FILTER,
    # Z.ai: the output was cut because the context window is full (a finish reason,
    # not an error): the output is truncated, like ``length``.
    "model_context_window_exceeded": StopReason.LENGTH,
}

_ORIGIN = ApiBackend.CHAT_COMPLETIONS

#: The methods that map an event: a subclass that overrides one of them gets every event
#: through it (``feed_payloads`` then takes the general path for every chunk).
_MAPPING_METHODS = ("feed", "_feed_data", "_map_json", "_on_json", "_on_chunk", "_on_delta")

_NOT_JSON = object()
_STR = {str}

#: How many times a stream looks for the bytes around its plain chunks' text (a server
#: whose chunks differ in more than their text, such as a per-chunk random field,
#: stops being looked at after this many).
_LEARN_CREDIT = 8

# The text put in the place of a plain chunk's text to check that place (see _learn_plain).
_PROBE = "\x00\x01"


def _plain_text(payload: Any) -> str | None:
    """The text of a plain text chunk (one choice, index 0, no finish reason, a delta of
    text alone; no usage, no error, no Groq extension: what the general path maps to one
    text delta and nothing else), or ``None`` for any other payload."""
    if (
        type(payload) is not dict
        or "error" in payload
        or "x_groq" in payload
        or payload.get("usage") is not None
    ):
        return None
    choices = payload.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("index") or choice.get("finish_reason"):
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    content = delta.get("content")
    return content if type(content) is str else None


def _int(value: Any) -> int:
    """A token count as sent (int, finite float or null) → int; anything else → 0 (and
    named in the usage's ``malformed``)."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is float and math.isfinite(value):
        return int(value)
    return 0


class _OpaqueReasoning:
    """Round-trip state of one OpenRouter ``reasoning_details`` block."""

    __slots__ = ("encrypted", "id", "redacted", "signature")

    def __init__(self) -> None:
        self.signature: list[str] = []
        self.encrypted: list[str] = []
        self.redacted: list[str] = []
        self.id: str | None = None


class ChatCompletionsTransform(StreamTransform):
    """One attempt of a streamed ``POST /chat/completions``."""

    backend: ClassVar[ApiBackend] = ApiBackend.CHAT_COMPLETIONS

    def __init__(self, request_id: str = "stream", *, provider: str | None = None) -> None:
        super().__init__(request_id, provider=provider)
        #: A ``finish_reason`` was seen on choice 0 (the stream may then end without [DONE]).
        self.finish_seen = False
        #: Choices other than index 0 (``n > 1``) that were skipped.
        self.ignored_choices = 0
        self._refused = False
        # Tool calls: wire index → [our key, the call id of the latest slot at that index].
        self._tool_at: dict[Any, list[Any]] = {}
        self._tool_latest: list[Any] | None = None
        self._tool_count = 0
        # Reasoning: the block key plain reasoning strings go to (the latest detail index).
        self._reasoning_key: Any = 0
        self._opaque: dict[Any, _OpaqueReasoning] = {}
        # Groq compound ``executed_tools``: wire index → [call id, completed?].
        self._hosted_at: dict[Any, list[Any]] = {}
        self._hosted_count = 0
        # The bytes around the text of the last plain chunk (see _learn_plain): a chunk
        # that is those bytes around another JSON string is the same chunk with that text.
        self._plain_prefix: bytes | None = None
        self._plain_suffix = b""
        self._learn_credit = _LEARN_CREDIT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(
            getattr(cls, name) is not getattr(ChatCompletionsTransform, name)
            for name in _MAPPING_METHODS
        ):
            cls._maps_text_inline = False

    #: Whether :meth:`feed_payloads` maps the plain text chunk in its own loop.
    _maps_text_inline: ClassVar[bool] = True

    # -- the StreamTransform protocol ------------------------------------------------

    def feed_payloads(self, items: list[SSEPayload]) -> list[SamplingEvent]:
        """:meth:`StreamTransform.feed_payloads`, with the chunk nearly every event of a
        stream is mapped in the loop itself: one choice (index 0, no finish reason)
        whose delta is only text, no usage, no error, no Groq extension, once an earlier
        chunk gave the model and the response id. A run of such chunks goes to the
        accumulator in one call (``StreamAccumulator.texts``); any other event takes the
        general path, in order. A chunk that is the last plain chunk's bytes around
        another JSON string (what most servers send: every field but the text alike) is
        parsed at that string alone (see :meth:`_learn_plain`). The events are the same."""
        acc = self.acc
        if not self._maps_text_inline or self.finished:
            return super().feed_payloads(items)
        out: list[SamplingEvent] = []
        if items and not self._started:
            out.extend(self.start())
        # Until the model and the id are known, every chunk goes the general way.
        ready = acc.model is not None and acc.response_id is not None
        texts: list[str] = []  # the text of the plain chunks not handed over yet
        loads = orjson.loads
        prefix = self._plain_prefix
        suffix = self._plain_suffix
        if prefix is not None:
            start = len(prefix)
            tail = len(suffix)
        position = 0
        count = len(items)
        runs = True  # the chunks alike that follow one are taken in one go (_alike_run)
        while position < count:
            item = items[position]
            position += 1
            payload: Any = _NOT_JSON
            if type(item) is bytes:
                # The plain chunk whose bytes around its text are the last one's: only
                # its text is parsed (it is the last chunk with this text in its place).
                if prefix is not None and item.startswith(prefix) and item.endswith(suffix):
                    try:
                        content = loads(item[start : len(item) - tail])
                    except orjson.JSONDecodeError:
                        content = None  # not one JSON value there: parsed whole, below
                    if type(content) is str:
                        texts.append(content)
                        # (Nothing after it, as with one token per read: no run to look
                        # for, and no iterators built for none.)
                        if runs and position < count:
                            taken = self._alike_run(items, position, texts)
                            runs = taken >= 0
                            position += max(taken, 0)
                        continue
                try:
                    # ``[DONE]`` (no JSON text starts so) is not parsed: a failed parse
                    # builds an exception, which costs more than a whole chunk's parse.
                    payload = loads(item) if item[:6] != b"[DONE]" else _NOT_JSON
                except orjson.JSONDecodeError:
                    pass  # not JSON (``[DONE]``, a blank field) or not UTF-8: below
                if payload is not _NOT_JSON:
                    content = _plain_text(payload) if ready else None
                    if content is not None:
                        texts.append(content)
                        if self._learn_credit:
                            self._learn_plain(item, content, payload)
                        else:  # no longer worth a look
                            self._plain_prefix = None
                        prefix = self._plain_prefix
                        if prefix is not None:
                            suffix = self._plain_suffix
                            start = len(prefix)
                            tail = len(suffix)
                        continue
            if texts:
                self._texts(texts, out)
                texts = []
            if payload is not _NOT_JSON and not acc.finished:
                self._map_json("message", payload, out)
            elif type(item) is bytes and not acc.finished:
                # [DONE], a blank field, garbage: the general path's way, on its text.
                self._feed_data("message", item.decode("utf-8", "replace"), out)
            else:  # any other event, or any after the end (a text run that failed)
                out.extend(super().feed_payloads([item]))
            if acc.finished:  # the rest only looks for ``[DONE]``: the general path
                if position < count:
                    out.extend(super().feed_payloads(items[position:]))
                return out
            ready = acc.model is not None and acc.response_id is not None
        if texts:
            self._texts(texts, out)
        return out

    def _alike_run(self, items: list[SSEPayload], position: int, texts: list[str]) -> int:
        """How many chunks from ``items[position]`` on are alike the last plain one
        (its bytes around another JSON string: see :meth:`_learn_plain`), their texts
        appended to ``texts``; ``-1`` (nothing appended) when one of them does not hold
        a lone JSON string there (the loop then takes them one by one, as it takes any
        chunk). The run is found and parsed in C: the loop runs about 60 bytecode
        instructions a chunk, 12,000 of the 81,000 of a 200-delta request before this
        (``benchmarks/calls_per_request.py --bytecode``). An item is looked at here at
        most twice (a failed run stops the runs for the read), so a read costs linear
        time whatever it holds."""
        prefix, suffix = self._plain_prefix, self._plain_suffix
        assert prefix is not None
        # Bytes, or an item ``bytes.startswith`` refuses (a named event, a whole one).
        # The items from ``position`` on are looked at in a copy of that part of the list
        # (its references alone): indexing the list instead cost two more calls an item.
        rest = cast("list[bytes]", items[position:])
        try:
            alike = takewhile(
                bool,
                map(
                    operator.and_,
                    map(bytes.startswith, rest, repeat(prefix)),
                    map(bytes.endswith, rest, repeat(suffix)),
                ),
            )
            run = len(list(alike))
        except TypeError:  # an item that is not bytes
            return -1
        if not run:
            return 0
        middle = operator.itemgetter(slice(len(prefix), -len(suffix) or None))
        try:
            contents = list(map(orjson.loads, map(middle, rest[:run])))
        except orjson.JSONDecodeError:
            return -1
        if set(map(type, contents)) != _STR:
            return -1
        texts += contents
        return run

    def _learn_plain(self, raw: bytes, content: str, payload: dict[str, Any]) -> None:
        """Remember the bytes of plain chunk ``raw`` around its text, ``content``, if
        they are exactly that: the bytes with another string in that place parse to the
        same chunk with that string as its text, and nothing else changed. Then a chunk
        that starts and ends with those bytes and holds a JSON string between them is
        that chunk (JSON is a context-free grammar: a value in the place of a value),
        mapped without parsing the rest again."""
        self._learn_credit -= 1
        self._plain_prefix = None
        # Encoded from a copy: encoding ``content`` itself would keep its UTF-8 form on
        # the string, which the fold's O(1) size of a string (``sys.getsizeof``) counts.
        literal = orjson.dumps(content.encode().decode())
        for key in (b'"content":', b'"content": '):
            at = raw.rfind(key + literal)
            if at >= 0:
                break
        else:
            return  # escaped otherwise than orjson escapes it: a later chunk may do
        start = at + len(key)
        prefix, suffix = raw[:start], raw[start + len(literal) :]
        try:
            probe = orjson.loads(prefix + orjson.dumps(_PROBE) + suffix)
        except orjson.JSONDecodeError:
            return
        choice = payload["choices"][0]
        if probe != {**payload, "choices": [{**choice, "delta": {"content": _PROBE}}]}:
            return  # that place was not the text (the same text elsewhere too)
        self._plain_prefix = prefix
        self._plain_suffix = suffix

    def _texts(self, texts: list[str], out: list[SamplingEvent]) -> None:
        """The text of a run of plain chunks into the accumulator (a bug of ours there is
        reported as ours, as :meth:`_map_json` reports one)."""
        try:
            self.acc.texts(texts, out)
        except Exception as exc:  # a bug of ours: reported as ours, never retried
            self.acc.fail(internal_error(exc, f"mapping a {self.protocol} event"), out)

    def _on_json(self, event_name: str, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        # Fast path for the most frequent chunk: one choice (index 0) whose delta is only
        # text, no finish reason, no usage, no error, once the model and id are known. It
        # does exactly what the general path below does with such a chunk.
        choices = payload.get("choices")
        if type(choices) is list and len(choices) == 1:
            choice = choices[0]
            if type(choice) is dict:
                delta = choice.get("delta")
                if type(delta) is dict and len(delta) == 1:
                    content = delta.get("content")
                    acc = self.acc
                    if (
                        type(content) is str
                        and acc.model is not None
                        and acc.response_id is not None
                        and event_name != "error"
                        and not choice.get("index")
                        and not choice.get("finish_reason")
                        and payload.get("usage") is None
                        and not payload.get("error")
                        and not payload.get("x_groq")
                    ):
                        acc.text(content, out)
                        return
        error = payload.get("error")
        if error or event_name == "error":
            # Keep what the error chunk carries (OpenRouter sends usage with it) as partial.
            if "choices" in payload or "usage" in payload:
                self._on_chunk(payload, out)
            self._stream_error(payload, out)
            return
        if "choices" in payload or "usage" in payload:
            self._on_chunk(payload, out)
        else:
            self.unknown_events += 1

    def _on_done(self, out: list[SamplingEvent]) -> None:
        self._complete(out)

    def _on_end(self, out: list[SamplingEvent]) -> None:
        if self.finish_seen:
            # Some servers omit [DONE]; a finish_reason is enough to know the answer ended.
            self._complete(out)
        else:
            self.acc.fail(truncated_stream_error("a finish_reason or data: [DONE]"), out)

    # -- chunks ----------------------------------------------------------------------

    def _on_chunk(self, payload: dict[str, Any], out: list[SamplingEvent]) -> None:
        acc = self.acc
        if acc.model is None:
            model = payload.get("model")
            if model and type(model) is str:
                acc.model = model
        if acc.response_id is None:
            response_id = payload.get("id")
            if response_id and type(response_id) is str:
                acc.response_id = response_id
        choices = payload.get("choices")
        if choices:
            if type(choices) is not list:
                raise ProviderDataError(f"choices is {type(choices).__name__}, not a list")
            for choice in choices:
                if type(choice) is not dict:
                    continue
                if choice.get("index"):  # n > 1: only choice 0 is the answer
                    self.ignored_choices += 1
                    continue
                delta = choice.get("delta")
                if delta:
                    if type(delta) is not dict:
                        raise ProviderDataError(f"delta is {type(delta).__name__}, not an object")
                    self._on_delta(delta, out)
                finish = choice.get("finish_reason")
                if finish and type(finish) is str:
                    self.finish_seen = True
                    acc.raw_stop_reason = finish
                    acc.stop_reason = _FINISH_REASONS.get(finish, StopReason.STOP)
        usage = payload.get("usage")
        if usage is None:
            x_groq = payload.get("x_groq")
            if x_groq and type(x_groq) is dict:
                usage = x_groq.get("usage")  # Groq: usage only inside its extension object
        if usage and type(usage) is dict:
            self._on_usage(usage)

    def _on_delta(self, delta: dict[str, Any], out: list[SamplingEvent]) -> None:
        acc = self.acc
        if len(delta) == 1:
            # Fast path for the most frequent chunk: a delta that holds only text.
            content = delta.get("content")
            if type(content) is str:
                acc.text(content, out)
                return
        # Reasoning first: within one chunk it precedes the answer it leads to.
        details = delta.get("reasoning_details")
        if not (details and self._on_reasoning_details(details, out)):
            reasoning = str_field(delta, "reasoning_content") or str_field(delta, "reasoning")
            if reasoning:
                acc.reasoning(self._reasoning_key, reasoning, out)
        content = delta.get("content")
        if type(content) is list:
            self._on_content_parts(content, out)
        elif content:
            if type(content) is not str:
                raise ProviderDataError(f"delta.content is {type(content).__name__}")
            acc.text(content, out)
        annotations = delta.get("annotations")
        if annotations and type(annotations) is list:
            for annotation in annotations:  # OpenRouter web plugin, OpenAI search models
                if type(annotation) is dict and type(annotation.get("type")) is str:
                    acc.citation(citation_from_wire(annotation, ApiBackend.CHAT_COMPLETIONS), out)
        audio = delta.get("audio")
        if audio and type(audio) is dict:
            # An audio answer: its transcript is the answer's text, its id what the next
            # turn refers to (the audio bytes are not kept).
            audio_id = audio.get("id")
            if audio_id and type(audio_id) is str:
                acc.audio_id = audio_id
            transcript = audio.get("transcript")
            if transcript and type(transcript) is str:
                acc.text(transcript, out)
        refusal = str_field(delta, "refusal")
        if refusal:
            self._refused = True
            acc.refusal(refusal, out)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            if type(tool_calls) is not list:
                raise ProviderDataError(f"delta.tool_calls is {type(tool_calls).__name__}")
            for fragment in tool_calls:
                self._on_tool_fragment(fragment, out)
        function_call = delta.get("function_call")
        if function_call and type(function_call) is dict:
            # The deprecated single-function form: its own slot, apart from any wire index.
            self._on_tool_fragment({"index": -1, "function": function_call}, out)
        executed = delta.get("executed_tools")
        if executed and type(executed) is list:
            for entry in executed:
                self._on_executed_tool(entry, out)

    def _on_content_parts(self, parts: list[Any], out: list[SamplingEvent]) -> None:
        """``delta.content`` as a list of parts (Mistral / Magistral, Databricks): ``text``
        parts are answer text; ``thinking`` parts (whose ``thinking`` is itself a list of
        text parts, or a string) and ``reasoning`` parts (whose ``summary`` is a list of
        ``summary_text`` parts) are reasoning, in the order sent."""
        acc = self.acc
        for part in parts:
            if type(part) is not dict:
                raise ProviderDataError(f"a delta.content part is {type(part).__name__}")
            kind = part.get("type")
            if kind == "text":
                acc.text(str_field(part, "text"), out)
            elif kind == "thinking":
                thinking = part.get("thinking")
                if type(thinking) is list:
                    for inner in thinking:
                        if type(inner) is dict and inner.get("type") == "text":
                            acc.reasoning(self._reasoning_key, str_field(inner, "text"), out)
                else:
                    acc.reasoning(self._reasoning_key, str_field(part, "thinking"), out)
            elif kind == "reasoning":
                # Databricks (gpt-oss): {type: reasoning, summary: [{type: summary_text, text}]}
                for inner in part.get("summary") or ():
                    if type(inner) is dict and inner.get("type") == "summary_text":
                        acc.reasoning(self._reasoning_key, str_field(inner, "text"), out)
            else:
                self.unknown_events += 1  # images, references, future part types

    # -- reasoning -------------------------------------------------------------------

    def _on_reasoning_details(self, details: Any, out: list[SamplingEvent]) -> bool:
        """OpenRouter's structured reasoning; returns True if it carried reasoning text.

        When it does, the plain ``delta.reasoning`` string of the same chunk is the same
        text again and is not used (no reasoning is emitted twice).
        """
        if type(details) is not list:
            return False
        acc = self.acc
        had_text = False
        for detail in details:
            if type(detail) is not dict:
                continue
            key = detail.get("index", 0)
            if type(key) is not int:
                key = 0
            self._reasoning_key = key
            kind = detail.get("type")
            if kind == "reasoning.summary":
                summary = detail.get("summary")
                if summary and type(summary) is str:
                    had_text = True
                    acc.reasoning(key, summary, out, summary_index=0)
            else:
                text = detail.get("text")
                if text and type(text) is str:
                    had_text = True
                    acc.reasoning(key, text, out)
            signature = detail.get("signature")
            data = detail.get("data")
            item_id = detail.get("id")
            if (
                (signature and type(signature) is str)
                or (data and type(data) is str)
                or (item_id and type(item_id) is str)
            ):
                state = self._opaque.get(key)
                if state is None:
                    state = self._opaque[key] = _OpaqueReasoning()
                    acc.begin_reasoning(key, out, first=False)
                if signature and type(signature) is str:
                    state.signature.append(signature)
                if data and type(data) is str:
                    fmt = detail.get("format")
                    # An Anthropic redacted-thinking block comes through OpenRouter as
                    # ``reasoning.encrypted`` with an ``anthropic-*`` format.
                    if type(fmt) is str and fmt.startswith("anthropic"):
                        state.redacted.append(data)
                    else:
                        state.encrypted.append(data)
                if item_id and type(item_id) is str:
                    state.id = item_id
        return had_text

    # -- tool calls ------------------------------------------------------------------

    def _on_tool_fragment(self, fragment: Any, out: list[SamplingEvent]) -> None:
        """Merge one ``delta.tool_calls[]`` fragment.

        Keyed by wire ``index``, except that a fragment carrying an ``id`` different from
        the id of the latest call at that index opens a new call (servers that reuse
        index 0 for every parallel call). Fragments without an id continue the latest call
        at their index; a fragment without an index continues the latest call overall.
        """
        if type(fragment) is not dict:
            return
        acc = self.acc
        index = fragment.get("index")
        if index is not None and type(index) is not int:
            raise ProviderDataError(f"tool_calls[].index is {type(index).__name__}, not an int")
        call_id = fragment.get("id")
        if not (call_id and type(call_id) is str):
            call_id = None
        # A custom (free-form) tool sends ``custom: {name, input}`` where a function tool
        # sends ``function: {name, arguments}``; its input is text, not JSON.
        function = fragment.get("function") or fragment.get("custom")
        name: str | None = None
        arguments: str | None = None
        if function and type(function) is dict:
            name = function.get("name")
            if not (name and type(name) is str):
                name = None
            arguments = function.get("arguments", function.get("input"))
            if type(arguments) is not str:
                arguments = None
        current = self._tool_latest if index is None else self._tool_at.get(index)
        if current is None or self._starts_new_call(current, call_id, name):
            key = self._tool_count
            self._tool_count += 1
            current = [key, call_id]
            if index is not None:
                self._tool_at[index] = current
            self._tool_latest = current
            acc.tool_start(key, call_id, name, out)
        else:
            key = current[0]
            if call_id is not None and current[1] is None:
                current[1] = call_id
            if call_id is not None or name is not None:
                acc.tool_start(key, call_id, name, out)
        if arguments:
            acc.tool_arguments(key, arguments, out)

    def _starts_new_call(self, current: list[Any], call_id: str | None, name: str | None) -> bool:
        """Whether a fragment opens a new call rather than continuing ``current``.

        A different id always does (servers that reuse index 0 for every parallel call,
        or send several whole calls in one chunk without an index). Without a usable id
        (``id: ""``, Gemini), a fragment that names a tool when the current call already
        has a name and complete JSON arguments is the next call: a continuation never
        restarts a finished call.
        """
        if call_id is not None:
            return current[1] is not None and current[1] != call_id
        if name is None or current[1] is not None:
            return False
        current_name, arguments = self.acc.tool_so_far(current[0])
        return bool(current_name and arguments.strip()) and arguments_complete(arguments)

    # -- hosted tools (Groq compound) ------------------------------------------------

    def _on_executed_tool(self, entry: Any, out: list[SamplingEvent]) -> None:
        if type(entry) is not dict:
            return
        index = entry.get("index", 0)
        if type(index) is not int:
            raise ProviderDataError(f"executed_tools[].index is {type(index).__name__}")
        output = entry.get("output")
        slot = self._hosted_at.get(index)
        if slot is None or (slot[1] and output is None):
            # A new execution (also when an index is reused after its call completed).
            call_id = entry.get("id")
            if not (call_id and type(call_id) is str):
                call_id = f"executed_tool_{self._hosted_count}"
            self._hosted_count += 1
            slot = self._hosted_at[index] = [call_id, False]
        name = entry.get("type") or entry.get("name")
        if type(name) is not str:
            name = "tool"
        call_id = slot[0]
        if output is None:
            self.acc.backend_tool_started(call_id, name, out)
            return
        arguments = entry.get("arguments")
        slot[1] = True
        self.acc.backend_tool_completed(
            BackendToolCall(
                id=call_id,
                name=name,
                arguments=arguments if type(arguments) is str and arguments else "{}",
                status="completed",
                result=output,
                origin=_ORIGIN,
                raw=(entry,),
            ),
            out,
        )

    # -- usage -----------------------------------------------------------------------

    def _on_usage(self, usage: dict[str, Any]) -> None:
        """Normalize a ``usage`` object (last write wins) and its cost, if any."""
        acc = self.acc
        prompt = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens"))
        cache_read = 0
        cache_write = 0
        details = usage.get("prompt_tokens_details")
        if details and type(details) is dict:
            cache_read = _int(details.get("cached_tokens"))
            cache_write = _int(details.get("cache_write_tokens"))
        if not cache_read:
            cache_read = _int(usage.get("prompt_cache_hit_tokens"))  # DeepSeek
        reasoning = 0
        details = usage.get("completion_tokens_details")
        if details and type(details) is dict:
            reasoning = _int(details.get("reasoning_tokens"))
        if not reasoning:
            reasoning = _int(usage.get("reasoning_tokens"))  # Azure-served DeepSeek: top level
        output = completion
        if reasoning and self._reasoning_outside_completion(usage, prompt, completion, reasoning):
            output = completion + reasoning
        acc.usage = Usage(
            input_tokens=prompt,
            output_tokens=output,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            reasoning_tokens=reasoning,
            malformed=len(malformed_counts(usage)),
        )
        cost = reported_cost(usage, self.profile.cost_fields)
        if cost is not None:
            acc.cost_usd_ticks = cost

    def _reasoning_outside_completion(
        self, usage: dict[str, Any], prompt: int, completion: int, reasoning: int
    ) -> bool:
        """xAI reports reasoning tokens outside ``completion_tokens``: detect it.

        ``total_tokens`` decides when it is sent (``prompt + completion + reasoning`` means
        outside, ``prompt + completion`` means inside, so OpenRouter-served Grok, already
        normalized, is not counted twice); without it, the provider profile
        (``reasoning_tokens_outside_completion``) or a ``grok*`` model name decides.
        """
        total = usage.get("total_tokens")
        if type(total) is int:
            if total == prompt + completion + reasoning:
                return True
            if total == prompt + completion:
                return False
        if self.profile.reasoning_tokens_outside_completion:
            return True
        model = self.acc.model
        return model is not None and model.startswith("grok")

    # -- the end ---------------------------------------------------------------------

    def _complete(self, out: list[SamplingEvent]) -> None:
        acc = self.acc
        for key, state in self._opaque.items():
            acc.finish_reasoning(
                key,
                out,
                item_id=state.id,
                encrypted_content="".join(state.encrypted) or None,
                signature="".join(state.signature) or None,
                redacted_data="".join(state.redacted) or None,
            )
        if self._refused:
            acc.stop_reason = StopReason.CONTENT_FILTER  # the wire value stays in raw_stop_reason
        # No finish_reason at all (the stream ended with [DONE] alone): the stop reason stays
        # unknown (None), never a guessed ``stop``.
        acc.complete(out)
