"""One cache-breakpoint model for every backend.

A *breakpoint* marks the end of a prompt prefix the server should cache. Anthropic
Messages and OpenAI's explicit prompt caching (GPT-5.6 and later, on Responses and Chat
Completions) share the model; only the mark differs:

* Messages: ``"cache_control": {"type": "ephemeral"}`` on a block;
* Responses and Chat Completions: ``"prompt_cache_breakpoint": {"mode": "explicit"}`` on a
  content part, and ``"prompt_cache_options": {"mode": "explicit", "ttl": ...}`` on the
  request.

The OpenAI shape is the one of the ``openai`` SDK's types (``ResponseInputText`` and the
Chat content parts carry ``prompt_cache_breakpoint: {"mode": "explicit"}``; the request
carries ``prompt_cache_options: {"mode", "ttl"}``); it is written here only, in
:data:`OPENAI_MARKS` and :func:`openai_cache_options`, so a correction is one edit.

A request carries at most :data:`MAX_CACHE_BREAKPOINTS` marks (each may write the cache).
Parts the caller marked (``TextPart(..., cache_breakpoint=True)``) come first; marks past
the limit are removed and noted as dropped in the conversion report. The builders' own
strategy then fills at most three of the free slots, in this order:

1. the last system part;
2. the tip: the last markable part of the conversation;
3. the previous request's tip: the last user message before the last assistant turn
   before the tip, so the entry the previous request wrote is read this time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from typing import Any

import attrs

from ._render import ReportCollector
from ._request import BuildOptions, ConversionAction

__all__ = [
    "ANTHROPIC_MARKS",
    "MAX_CACHE_BREAKPOINTS",
    "OPENAI_MARKS",
    "CacheMarks",
    "explicit_prompt_caching",
    "openai_cache_options",
    "place_breakpoints",
    "render_openai_cache",
    "strip_breakpoints",
]

JsonObject = dict[str, Any]

#: The most cache breakpoints one request may carry (both vendors).
MAX_CACHE_BREAKPOINTS = 4
#: The most the builders' own strategy places (the rest stay for the caller's marks).
_STRATEGY_MARKS = 3

_OPENAI_MODEL = re.compile(r"(?:^|[./:])gpt-(\d+)(?:\.(\d+))?")


def explicit_prompt_caching(model: str | None) -> bool:
    """OpenAI models that cache at breakpoints and bill writes: GPT-5.6 and later.

    Matches the model name anywhere after a ``/``, ``.`` or ``:`` (``us.openai.gpt-5.6``).
    """
    found = _OPENAI_MODEL.search(model or "")
    if found is None:
        return False
    return (int(found[1]), int(found[2] or 0)) >= (5, 6)


@attrs.frozen
class CacheMarks:
    """How one backend marks a breakpoint on a content part of its messages."""

    #: The part's key and its value (copied for every mark).
    key: str
    value: Mapping[str, Any]
    #: Part types that may carry the mark.
    markable: frozenset[str]
    #: A message whose content is a plain string is turned into one part of this type to
    #: carry a mark (``None``: such content is never marked).
    text_type: str | None
    #: Roles whose messages may carry a mark (``None``: every message with content).
    roles: frozenset[str] | None


ANTHROPIC_MARKS = CacheMarks(
    key="cache_control",
    value={"type": "ephemeral"},
    # Never thinking / redacted_thinking, never raw server-tool blocks.
    markable=frozenset({"text", "image", "tool_use", "tool_result", "document"}),
    text_type=None,
    roles=None,
)

OPENAI_MARKS = CacheMarks(
    key="prompt_cache_breakpoint",
    value={"mode": "explicit"},
    markable=frozenset({"text", "image_url", "input_audio", "file"})
    | frozenset({"input_text", "input_image", "input_file"}),
    text_type="text",
    roles=frozenset({"system", "developer", "user", "tool"}),
)


def openai_cache_options(explicit: bool, ttl: str | None) -> JsonObject:
    """The request-level ``prompt_cache_options``: ``explicit`` when breakpoints are sent
    (no write at the latest message besides them), else the default ``implicit``."""
    options: JsonObject = {"mode": "explicit" if explicit else "implicit"}
    if ttl is not None:
        options["ttl"] = ttl
    return options


def render_openai_cache(
    data: JsonObject,
    messages: Sequence[JsonObject],
    options: BuildOptions,
    report: ReportCollector,
    *,
    text_type: str,
) -> None:
    """Breakpoints and ``prompt_cache_options`` on a Responses or Chat Completions body.

    Sent only where the provider takes them (:attr:`ProviderProfile.prompt_cache_breakpoints`)
    and the model caches explicitly (:func:`explicit_prompt_caching`); elsewhere a caller's
    marks are removed and noted.
    """
    model = data.get("model")
    if not (
        options.profile.prompt_cache_breakpoints
        and explicit_prompt_caching(model if isinstance(model, str) else None)
    ):
        if strip_breakpoints(OPENAI_MARKS, messages):
            report.note(
                None,
                "cache breakpoints",
                ConversionAction.DROPPED,
                "this provider or model caches without breakpoints "
                "(OpenAI explicit prompt caching is GPT-5.6 and later)",
            )
        return
    count = place_breakpoints(
        OPENAI_MARKS, messages, report, strategy=options.cache_breakpoints, text_type=text_type
    )
    if count or options.prompt_cache_ttl is not None:
        data["prompt_cache_options"] = openai_cache_options(bool(count), options.prompt_cache_ttl)


# A markable place: a message and the index of its part (``None``: its string content).
_Slot = tuple[JsonObject, int | None]


def place_breakpoints(
    marks: CacheMarks,
    messages: Sequence[JsonObject],
    report: ReportCollector,
    *,
    strategy: bool,
    text_type: str | None = None,
    reserved: int = 0,
) -> int:
    """Keep at most four marks and, with ``strategy``, add the builders' own; returns the count.

    ``messages`` are rendered messages (a Messages ``system`` list goes in as one message
    with role ``system``); ``text_type`` overrides the marks' part type for string content
    (Responses: ``input_text``); ``reserved`` marks are already spent elsewhere (Messages
    tool definitions).
    """
    limit = MAX_CACHE_BREAKPOINTS - reserved
    marked = [
        (message, index)
        for message in messages
        for index, part in enumerate(_parts(message))
        if isinstance(part, Mapping) and part.get(marks.key) is not None
    ]
    for message, index in marked[max(limit, 0) :]:
        del message["content"][index][marks.key]
    if len(marked) > limit:
        report.note(
            None,
            "cache breakpoints",
            ConversionAction.DROPPED,
            f"{len(marked) - max(limit, 0)} past the first {MAX_CACHE_BREAKPOINTS} "
            f"(tools included): a request carries at most {MAX_CACHE_BREAKPOINTS}",
        )
    count = min(len(marked), max(limit, 0))
    if not strategy:
        return count
    free = min(_STRATEGY_MARKS, max(limit, 0) - count)
    for message, slot in _strategy(marks, messages)[:free]:
        _mark(marks, message, slot, text_type or marks.text_type)
        count += 1
    return count


def strip_breakpoints(marks: CacheMarks, messages: Sequence[JsonObject]) -> int:
    """Remove every mark; returns how many there were."""
    removed = 0
    for message in messages:
        for part in _parts(message):
            if isinstance(part, dict) and marks.key in part:
                del part[marks.key]
                removed += 1
    return removed


def _parts(message: Mapping[str, Any]) -> Sequence[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else ()


def _strategy(marks: CacheMarks, messages: Sequence[JsonObject]) -> list[_Slot]:
    """The unmarked slots the strategy picks, best first, each once."""
    picks: list[_Slot | None] = []
    leading = 0
    while leading < len(messages) and messages[leading].get("role") in ("system", "developer"):
        leading += 1
    if leading:
        picks.append(_last_markable(marks, messages[leading - 1]))
    tip = next(
        (
            (m, slot)
            for m in range(len(messages) - 1, -1, -1)
            if (slot := _last_markable(marks, messages[m])) is not None
        ),
        None,
    )
    if tip is not None:
        picks.append(tip[1])
        assistant = _last_index(messages, _is_assistant, before=tip[0])
        if assistant is not None:
            user = _last_index(messages, _is_user, before=assistant)
            if user is not None:
                picks.append(_last_markable(marks, messages[user]))
    chosen: list[_Slot] = []
    for pick in picks:
        if pick is not None and not any(pick[0] is m and pick[1] == i for m, i in chosen):
            chosen.append(pick)
    return [slot for slot in chosen if not _is_marked(marks, slot)]


def _last_markable(marks: CacheMarks, message: Mapping[str, Any]) -> _Slot | None:
    if marks.roles is not None and message.get("role") not in marks.roles:
        return None
    if "type" in message and message.get("type") != "message":
        return None  # a Responses item that is not a message
    content = message.get("content")
    if isinstance(content, str):
        return (message, None) if content and marks.text_type else None  # type: ignore[return-value]
    for index in range(len(content or ()) - 1, -1, -1):
        part = content[index]  # type: ignore[index]
        if isinstance(part, Mapping) and part.get("type") in marks.markable:
            return (message, index)  # type: ignore[return-value]
    return None


def _is_assistant(message: Mapping[str, Any]) -> bool:
    kind = message.get("type")
    return message.get("role") == "assistant" or (isinstance(kind, str) and kind.endswith("_call"))


def _is_user(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "user"


def _last_index(
    messages: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], bool], before: int
) -> int | None:
    for m in range(before - 1, -1, -1):
        if test(messages[m]):
            return m
    return None


def _is_marked(marks: CacheMarks, slot: _Slot) -> bool:
    message, index = slot
    return index is not None and message["content"][index].get(marks.key) is not None


def _mark(marks: CacheMarks, message: JsonObject, index: int | None, text_type: str | None) -> None:
    content: MutableSequence[JsonObject]
    if index is None:
        message["content"] = content = [{"type": text_type, "text": message["content"]}]
        index = 0
    else:
        content = message["content"]
    content[index][marks.key] = dict(marks.value)
