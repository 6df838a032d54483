"""What the emulator answers, backend-neutral: the request facts it needs, and the reply.

:class:`RequestView` is what a validator extracts from a wire body; :func:`plan_reply`
turns it (and the script) into a :class:`Reply`, deterministically: every random choice
comes from a PRNG seeded with a hash of the request body.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ._cache import CHARS_PER_TOKEN, CacheResult, count_tokens
from ._script import HostedToolScript, Script
from ._structured import OutputRequest, answer_for, minimal_value
from ._words import WORDS

__all__ = [
    "PlannedToolCall",
    "Reply",
    "ReplyUsage",
    "RequestView",
    "ToolOffer",
    "chunk_text",
    "empty_reply",
    "minimal_value",
    "plan_reply",
    "random_id",
]


@attrs.frozen
class ToolOffer:
    """A client tool the request offers: its name and JSON schema."""

    name: str
    schema: Mapping[str, Any]


@attrs.frozen
class RequestView:
    """The facts of a validated request that shape the reply."""

    model: str
    stream: bool
    max_tokens: int | None = None
    include_usage: bool = False
    reasoning: bool = False
    include_encrypted: bool = False
    tools: tuple[ToolOffer, ...] = ()
    forced_tool: str | None = None
    tools_disabled: bool = False
    last_is_user: bool = True
    #: The last message is the assistant's (a prefill the reply would continue).
    prefill: bool = False
    tool_result: str | None = None
    #: The schema the answer must match (structured output), if any.
    output: OutputRequest | None = None
    prompt: CacheResult = attrs.field(factory=lambda: CacheResult(0))
    echo: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class PlannedToolCall:
    """A tool call the reply makes; ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ReplyUsage:
    """Usage in neutral terms (``input_tokens`` is the whole prompt, cached or not)."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@attrs.frozen
class Reply:
    """One reply, ready to render on any backend."""

    id_seed: str
    reasoning: str
    text: str
    tool_calls: tuple[PlannedToolCall, ...]
    hosted: HostedToolScript | None
    stop: str
    usage: ReplyUsage
    chunk_chars: int | None = None
    #: The model declined with this text (no text, reasoning or tool calls then).
    refusal: str = ""


def random_id(rng: random.Random, length: int, alphabet: str = string.ascii_letters) -> str:
    """``length`` characters from ``alphabet``, drawn from ``rng``."""
    alphabet = alphabet + string.digits
    return "".join(rng.choice(alphabet) for _ in range(length))


def chunk_text(text: str, chunk_chars: int | None) -> list[str]:
    """Split ``text`` into stream deltas: fixed ``chunk_chars`` slices, else word by word."""
    if not text:
        return []
    if chunk_chars:
        return [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)]
    pieces: list[str] = []
    current = ""
    for char in text:
        if char.isspace() and current and not current.isspace():
            pieces.append(current)
            current = ""
        current += char
    pieces.append(current)
    return pieces


def _sentences(rng: random.Random, tokens: int) -> str:
    words: list[str] = []
    chars = 0
    while chars < tokens * CHARS_PER_TOKEN:
        word = rng.choice(WORDS)
        if not words or words[-1].endswith("."):
            word = word.capitalize()
        if rng.random() < 0.12:
            word += "."
        words.append(word)
        chars += len(word) + 1
    text = " ".join(words)
    return text if text.endswith(".") else text + "."


def _cut(text: str, budget: int) -> tuple[str, bool]:
    """``text`` limited to ``budget`` tokens, and whether it was cut."""
    if count_tokens(text) <= budget:
        return text, False
    return text[: budget * CHARS_PER_TOKEN], True


def _tool_calls(
    view: RequestView, script: Script, rng: random.Random
) -> tuple[PlannedToolCall, ...]:
    if script.tool_calls is not None:
        calls = [(c.name, dict(c.arguments)) for c in script.tool_calls]
    elif (
        script.text is None
        and view.tools
        and view.last_is_user
        and not view.tools_disabled
        and script.stop in (None, "tool_calls")
    ):
        chosen = next((t for t in view.tools if t.name == view.forced_tool), view.tools[0])
        calls = [(chosen.name, minimal_value(chosen.schema, rng))]
    else:
        return ()
    return tuple(PlannedToolCall(random_id(rng, 24), name, _dumps(args)) for name, args in calls)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def plan_reply(view: RequestView, script: Script, body: bytes) -> Reply:
    """The reply to ``view`` under ``script``; the same body always gives the same reply."""
    after = script.after_tool_result
    if after is not None and view.tool_result is not None:
        script = attrs.evolve(
            script, text=after.text, reasoning=after.reasoning, tool_calls=(), hosted_tool=None
        )
    seed = hashlib.sha256(body).digest()
    rng = random.Random(seed)
    id_seed = seed.hex()
    if script.refusal is not None:
        return _refusal_reply(view, script, id_seed)
    budget = view.max_tokens if view.max_tokens is not None else 1 << 30
    cut = False
    reasoning = ""
    if script.reasoning is not None:
        reasoning = script.reasoning
    elif view.reasoning:
        reasoning = "Let me think. " + _sentences(rng, rng.randint(12, 30))
    reasoning, cut = _cut(reasoning, budget)
    budget -= count_tokens(reasoning)
    tool_calls = () if cut else _tool_calls(view, script, rng)
    if script.text is not None:
        text = script.text
    elif tool_calls:
        text = ""
    elif view.output is not None:
        text = answer_for(view.output, rng)
    elif view.tool_result is not None:
        result = view.tool_result.strip() or "(empty)"
        text = f"The tool returned {result[:400]}. " + _sentences(rng, rng.randint(6, 16))
    else:
        text = _sentences(rng, rng.randint(20, 60))
    # A server told to ignore the end-of-sequence token generates until max_tokens: the
    # default text is then exactly the remaining budget, and the stop is "length".
    fill = (
        script.ignore_eos
        and view.max_tokens is not None
        and script.text is None
        and not tool_calls
        and view.tool_result is None
    )
    if cut:
        text = ""
    elif fill:
        text = _sentences(rng, budget)[: budget * CHARS_PER_TOKEN] if budget > 0 else ""
        cut = True
    else:
        text, cut = _cut(text, budget)
    if cut:
        tool_calls = ()
    output_tokens = count_tokens(reasoning) + count_tokens(text)
    output_tokens += sum(count_tokens(c.name) + count_tokens(c.arguments) for c in tool_calls)
    if script.stop is not None:
        stop = script.stop
    elif cut:
        stop = "length"
    elif tool_calls:
        stop = "tool_calls"
    else:
        stop = "stop"
    usage = ReplyUsage(
        input_tokens=script.usage.get("input_tokens", view.prompt.total),
        output_tokens=script.usage.get("output_tokens", output_tokens),
        reasoning_tokens=script.usage.get("reasoning_tokens", count_tokens(reasoning)),
        cache_read_tokens=script.usage.get("cache_read_tokens", view.prompt.read),
        cache_write_tokens=script.usage.get("cache_write_tokens", view.prompt.write),
    )
    return Reply(
        id_seed, reasoning, text, tool_calls, script.hosted_tool, stop, usage, script.chunk_chars
    )


def _refusal_reply(view: RequestView, script: Script, id_seed: str) -> Reply:
    refusal = script.refusal or ""
    usage = ReplyUsage(
        input_tokens=script.usage.get("input_tokens", view.prompt.total),
        output_tokens=script.usage.get("output_tokens", count_tokens(refusal)),
        cache_read_tokens=script.usage.get("cache_read_tokens", view.prompt.read),
        cache_write_tokens=script.usage.get("cache_write_tokens", view.prompt.write),
    )
    stop = script.stop or "stop"
    return Reply(id_seed, "", "", (), None, stop, usage, script.chunk_chars, refusal)


def empty_reply(view: RequestView, body: bytes) -> Reply:
    """A well-formed reply with no content (the ``empty`` fault)."""
    seed = hashlib.sha256(body).hexdigest()
    usage = ReplyUsage(view.prompt.total, 0, 0, view.prompt.read, view.prompt.write)
    return Reply(seed, "", "", (), None, "stop", usage)
