"""What a load test sends: synthetic prompts or a JSONL dataset, and the length distributions.

A workload is a recipe, not a list: :meth:`Workload.items` turns it into an endless stream of
:class:`WorkItem` for one random generator, so each worker process draws its own requests
from the same recipe (seeded differently) and nothing large crosses process boundaries.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import attrs
import orjson

from ..types import Assistant, ConversationItem, ConversationRequest, System, TrioSamplerError, User

__all__ = [
    "CHARS_PER_TOKEN",
    "DatasetError",
    "DatasetWorkload",
    "Fixed",
    "Histogram",
    "LengthDistribution",
    "Normal",
    "SyntheticWorkload",
    "Uniform",
    "WorkItem",
    "Workload",
    "parse_length",
]

#: Characters per token when a length must be estimated from text (no tokenizer is used).
CHARS_PER_TOKEN = 4


@attrs.frozen
class Fixed:
    """Always ``value`` tokens."""

    value: int = attrs.field(validator=attrs.validators.ge(1))

    def sample(self, rng: random.Random) -> int:
        return self.value

    def describe(self) -> str:
        return str(self.value)


@attrs.frozen
class Uniform:
    """Uniformly from ``low`` to ``high`` tokens, both included."""

    low: int = attrs.field(validator=attrs.validators.ge(1))
    high: int

    def __attrs_post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"uniform:{self.low}:{self.high}: high must be at least low")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> str:
        return f"uniform:{self.low}:{self.high}"


@attrs.frozen
class Normal:
    """Normally distributed around ``mean`` with ``stddev``, rounded and clipped to
    ``[low, high]`` (``high=None``: no upper bound)."""

    mean: float
    stddev: float = attrs.field(validator=attrs.validators.ge(0))
    low: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    high: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"normal:{self.mean:g}:{self.stddev:g}: the mean must be >= 1")

    def sample(self, rng: random.Random) -> int:
        value = max(self.low, round(rng.gauss(self.mean, self.stddev)))
        return value if self.high is None else min(self.high, value)

    def describe(self) -> str:
        return f"normal:{self.mean:g}:{self.stddev:g}"


def _buckets(pairs: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    return tuple((int(length), float(weight)) for length, weight in pairs)


@attrs.frozen
class Histogram:
    """Lengths drawn from ``(length, weight)`` pairs (weights need not sum to 1)."""

    buckets: tuple[tuple[int, float], ...] = attrs.field(converter=_buckets)

    def __attrs_post_init__(self) -> None:
        if not self.buckets:
            raise ValueError("a histogram needs at least one length=weight pair")
        for length, weight in self.buckets:
            if length < 1 or weight < 0:
                raise ValueError(
                    f"histogram pair {length}={weight:g}: lengths must be >= 1, weights >= 0"
                )
        if sum(w for _, w in self.buckets) <= 0:
            raise ValueError("histogram weights must not all be zero")

    def sample(self, rng: random.Random) -> int:
        lengths = [length for length, _ in self.buckets]
        return rng.choices(lengths, weights=[w for _, w in self.buckets])[0]

    def describe(self) -> str:
        return "histogram:" + ",".join(f"{n}={w:g}" for n, w in self.buckets)


LengthDistribution: TypeAlias = Fixed | Uniform | Normal | Histogram


def parse_length(spec: str) -> LengthDistribution:
    """Parse a length distribution written on the command line.

    ``"256"`` (fixed), ``"uniform:64:512"``, ``"normal:300:80"`` and
    ``"histogram:128=0.5,1024=0.4,4096=0.1"``.

    Raises:
        ValueError: the spec is none of these; the message shows the forms.
    """
    forms = "write N, uniform:LOW:HIGH, normal:MEAN:STDDEV or histogram:N=W,N=W,..."
    kind, _, rest = spec.strip().partition(":")
    try:
        if not rest:
            return Fixed(int(kind))
        if kind == "uniform":
            low, high = rest.split(":")
            return Uniform(int(low), int(high))
        if kind == "normal":
            mean, stddev = rest.split(":")
            return Normal(float(mean), float(stddev))
        if kind == "histogram":
            pairs = [pair.split("=") for pair in rest.split(",") if pair]
            return Histogram([(int(n), float(w)) for n, w in pairs])
    except ValueError as exc:
        if "must" in str(exc) or "needs" in str(exc):
            raise
        raise ValueError(f"bad length distribution {spec!r}: {forms}") from None
    raise ValueError(f"bad length distribution {spec!r}: {forms}")


@attrs.frozen
class WorkItem:
    """One request to send, and what the workload expects of it.

    ``input_tokens`` is the planned (synthetic) or estimated (dataset, characters / 4)
    prompt length; ``output_tokens`` the ``max_output_tokens`` asked for, if any. Results
    use the server's reported usage when there is one, and say so.
    """

    request: ConversationRequest
    input_tokens: int
    output_tokens: int | None


class Workload(Protocol):
    """Anything that yields requests: :class:`SyntheticWorkload`, :class:`DatasetWorkload`."""

    def items(self, rng: random.Random) -> Iterator[WorkItem]:
        """An endless stream of requests drawn with ``rng``."""
        ...

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description, stored in the results."""
        ...


# Common English words, each one token (with its leading space) in the usual BPE
# vocabularies (cl100k, o200k, Llama 3, Qwen), so N words make a prompt of about N tokens.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "has",
    "been",
    "would",
    "will",
    "more",
    "if",
    "no",
    "when",
    "what",
    "so",
    "can",
    "out",
    "up",
    "them",
    "other",
    "into",
    "about",
    "time",
    "only",
    "new",
    "some",
    "could",
    "these",
    "two",
    "may",
    "first",
    "then",
    "do",
    "any",
    "like",
    "my",
    "now",
    "over",
    "such",
    "our",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(_WORDS, k=count))


@attrs.frozen
class SyntheticWorkload:
    """Random prompts of chosen lengths, optionally sharing prefixes.

    Args:
        input_tokens: prompt length distribution, the shared prefix included.
        output_tokens: ``max_output_tokens`` per request (``None``: the server's default).
            To have every request generate exactly that many tokens, also ask the server
            to ignore the end-of-sequence token (``extra_body={"ignore_eos": True}`` on
            vLLM and SGLang).
        prefix_tokens: the first this-many tokens of each prompt come from one of
            ``prefix_groups`` fixed prefixes (chosen at random per request), so a server
            with prefix caching can reuse them; 0 shares nothing.
        prefix_groups: how many distinct shared prefixes there are.
        system: an optional system prompt sent first (not counted in ``input_tokens``).
        seed: the prefixes' seed (each worker's requests are drawn with its own generator).

    Prompts are common English words, one token each in the usual vocabularies, so the
    planned length is close to what a server counts; the server's reported usage is what
    the results use when it is there.
    """

    input_tokens: LengthDistribution = Fixed(256)
    output_tokens: LengthDistribution | None = Fixed(128)
    prefix_tokens: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    prefix_groups: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    system: str | None = None
    seed: int = 0

    def items(self, rng: random.Random) -> Iterator[WorkItem]:
        prefix_rng = random.Random(self.seed)
        prefixes = [_words(prefix_rng, self.prefix_tokens) for _ in range(self.prefix_groups)]
        head: tuple[ConversationItem, ...] = (System(self.system),) if self.system else ()
        while True:
            length = self.input_tokens.sample(rng)
            shared = min(self.prefix_tokens, length)
            parts = []
            if shared:
                parts.append(" ".join(rng.choice(prefixes).split()[:shared]))
            if length > shared:
                parts.append(_words(rng, length - shared))
            output = None if self.output_tokens is None else self.output_tokens.sample(rng)
            request = ConversationRequest(
                items=(*head, User(" ".join(parts))), max_output_tokens=output
            )
            yield WorkItem(request, length, output)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "synthetic",
            "input_tokens": self.input_tokens.describe(),
            "output_tokens": None if self.output_tokens is None else self.output_tokens.describe(),
            "prefix_tokens": self.prefix_tokens,
            "prefix_groups": self.prefix_groups,
            "system": self.system is not None,
        }


class DatasetError(TrioSamplerError, ValueError):
    """A dataset line is not one of the accepted shapes; the message names the line."""


_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "model": "assistant",
}


def _estimate(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def parse_dataset_line(line: str | bytes, where: str) -> WorkItem:
    """One JSONL line as a :class:`WorkItem` (see :class:`DatasetWorkload` for the shapes)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: each line must be a JSON object")
    turns: list[tuple[str, str]]
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise DatasetError(f"{where}: 'prompt' must be a string")
        turns = [("user", prompt)]
    elif "messages" in record:
        turns = _turns(record["messages"], "role", "content", where, "messages")
    elif "conversations" in record:
        turns = _turns(record["conversations"], "from", "value", where, "conversations")
    else:
        raise DatasetError(
            f"{where}: expected a 'prompt', 'messages' or 'conversations' key; "
            f"found {', '.join(sorted(record)) or 'none'}"
        )
    output = record.get("output_tokens")
    if output is not None and (not isinstance(output, int) or output < 1):
        raise DatasetError(f"{where}: 'output_tokens' must be a positive integer")
    if turns and turns[-1][0] == "assistant":
        # The recorded reply is what the model is asked to produce: its length sets the
        # output budget (unless given), and it is not sent.
        reply = turns.pop()[1]
        output = output if output is not None else _estimate(reply)
    while turns and turns[-1][0] == "assistant":
        turns.pop()
    if not any(role == "user" for role, _ in turns):
        raise DatasetError(f"{where}: the conversation has no user turn to send")
    items: list[ConversationItem] = []
    for role, text in turns:
        if role == "system":
            items.append(System(text))
        elif role == "user":
            items.append(User(text))
        else:
            items.append(Assistant(text))
    request = ConversationRequest(items=tuple(items), max_output_tokens=output)
    return WorkItem(request, sum(_estimate(text) for _, text in turns), output)


def _turns(
    value: Any, role_key: str, text_key: str, where: str, field: str
) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: '{field}' must be a non-empty list")
    turns = []
    for index, turn in enumerate(value):
        if not isinstance(turn, Mapping):
            raise DatasetError(f"{where}: {field}[{index}] must be an object")
        role = _ROLES.get(str(turn.get(role_key, "")).lower())
        text = turn.get(text_key)
        if role is None:
            raise DatasetError(
                f"{where}: {field}[{index}].{role_key} must be one of {', '.join(_ROLES)}"
            )
        if not isinstance(text, str):
            raise DatasetError(f"{where}: {field}[{index}].{text_key} must be a string")
        turns.append((role, text))
    return turns


@attrs.frozen
class DatasetWorkload:
    """Conversations from a JSONL file, one per line, sent in a random order, cycling.

    Each line is a JSON object of one of these shapes (extra keys are ignored):

    * ``{"prompt": "..."}`` — one user turn;
    * ``{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}]}``;
    * ``{"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}]}``
      (ShareGPT).

    A trailing assistant turn is the recorded reply: it is not sent, and its length
    (characters / 4) becomes the request's ``max_output_tokens`` unless the line has an
    ``"output_tokens"`` integer. ``output_tokens`` (the argument) overrides both.

    Args:
        path: the JSONL file. Blank lines are skipped.
        output_tokens: a length distribution replacing each line's own output budget.
        limit: use only the first this-many conversations.
    """

    path: Path = attrs.field(converter=Path)
    output_tokens: LengthDistribution | None = None
    limit: int | None = None

    def load(self) -> list[WorkItem]:
        """Every conversation of the file, validated.

        Raises:
            DatasetError: a line is malformed (the message names the file and line), or
                the file has no conversation.
            OSError: the file cannot be read.
        """
        items: list[WorkItem] = []
        with self.path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                if self.limit is not None and len(items) >= self.limit:
                    break
                if line.strip():
                    items.append(parse_dataset_line(line, f"{self.path.name}:{number}"))
        if not items:
            raise DatasetError(f"{self.path.name}: no conversations in the file")
        return items

    def items(self, rng: random.Random) -> Iterator[WorkItem]:
        loaded = self.load()
        order: Sequence[WorkItem] = rng.sample(loaded, len(loaded))
        for item in itertools.cycle(order):
            if self.output_tokens is None:
                yield item
            else:
                output = self.output_tokens.sample(rng)
                request = attrs.evolve(item.request, max_output_tokens=output)
                yield WorkItem(request, item.input_tokens, output)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "dataset",
            "path": self.path.name,
            "output_tokens": None if self.output_tokens is None else self.output_tokens.describe(),
            "limit": self.limit,
        }
