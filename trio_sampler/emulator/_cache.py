"""Token counting and the prompt-cache simulation.

Token counting is a deterministic approximation: one token per four characters of text,
rounded up (``count_tokens("hello") == 2``). Prompts are counted over a canonical
rendering of the request (each tool, system text and message serialized as compact JSON
with sorted keys, concatenated), so the same conversation prefix always has the same
token positions.

Two cache models, one store:

* **OpenAI-style automatic prefix caching** (Chat Completions and Responses): every
  request stores its prompt's prefixes at 1,024 tokens and every 128 tokens after; a later
  request with the same model reads the longest stored prefix it shares
  (``cached_tokens``). Nothing is reported as written.
* **Anthropic-style explicit breakpoints** (Messages): a prefix ends at each block marked
  with ``cache_control`` (and at the last block when the request sets a top-level
  ``cache_control``). The longest marked prefix already in the store is read
  (``cache_read_input_tokens``); everything from there up to the last marked prefix is
  written (``cache_creation_input_tokens``) when that prefix is at least 1,024 tokens
  (shorter prefixes are silently not cached, as on the real API).

* **OpenAI explicit caching** (GPT-5.6 and later, on Chat Completions and Responses): the
  same breakpoint model, with OpenAI's marks (``prompt_cache_breakpoint`` on a content
  part) and rules: with ``prompt_cache_options.mode`` ``implicit`` (the default) the latest
  message is a breakpoint too, with ``explicit`` only the marks are; a read is the longest
  prefix, among the request's latest 50 breakpoints, that ends at a breakpoint an earlier
  request wrote (no fallback to the longest unmarked prefix); at most the 4 latest
  breakpoints are written, reported as ``cache_write_tokens``.

Every result names its breakpoint prefixes by a short digest (:attr:`CacheResult.prefixes`),
which the emulator sends in the ``x-emulator-prompt-cache`` response header: a turn that
missed shows prefixes none of which an earlier turn wrote.

The store is a bounded LRU of SHA-256 prefix digests (no prompt text is kept).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import attrs

__all__ = [
    "ANTHROPIC_MIN_CACHEABLE_TOKENS",
    "CHARS_PER_TOKEN",
    "OPENAI_CACHE_MIN_TOKENS",
    "OPENAI_CACHE_STEP_TOKENS",
    "SHARED_CACHE",
    "CacheResult",
    "PromptCache",
    "count_tokens",
]

CHARS_PER_TOKEN = 4
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128
ANTHROPIC_MIN_CACHEABLE_TOKENS = 1024


def count_tokens(text: str) -> int:
    """The emulator's token count: ``ceil(len(text) / 4)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


@attrs.frozen
class CacheResult:
    """A prompt's size and what the cache did with it (all in tokens).

    ``total`` is the whole prompt; ``read`` and ``write`` are parts of it. ``prefixes``
    names each breakpoint prefix (automatic caching: the longest cacheable prefix) by the
    first 16 hex digits of its SHA-256, in prompt order.
    """

    total: int
    read: int = 0
    write: int = 0
    prefixes: tuple[str, ...] = ()

    def header(self) -> str:
        """The ``x-emulator-prompt-cache`` value: ``hit``/``miss``/``none``, the counts and
        the prefix digests (``none``: no prefix long enough to cache)."""
        state = "hit" if self.read else ("miss" if self.prefixes else "none")
        prefixes = ",".join(self.prefixes)
        return f"{state}; read={self.read}; write={self.write}; prefixes={prefixes}"


class PromptCache:
    """A bounded store of prompt-prefix digests shared by every request of an app."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, None] = OrderedDict()

    def clear(self) -> None:
        """Forget everything (tests)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _has(self, digest: bytes) -> bool:
        if digest in self._entries:
            self._entries.move_to_end(digest)
            return True
        return False

    def _put(self, digest: bytes) -> None:
        self._entries[digest] = None
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def automatic(self, namespace: str, blocks: Sequence[str]) -> CacheResult:
        """OpenAI-style prefix caching over the concatenation of ``blocks``."""
        text = "".join(blocks)
        total = count_tokens(text)
        digests: list[tuple[int, bytes]] = []
        hasher = hashlib.sha256(namespace.encode() + b"\0")
        position = 0
        boundary = OPENAI_CACHE_MIN_TOKENS
        # A prefix of k tokens is the first 4k characters: hash incrementally, O(n).
        while boundary * CHARS_PER_TOKEN <= len(text):
            end = boundary * CHARS_PER_TOKEN
            hasher.update(text[position:end].encode())
            position = end
            digests.append((boundary, hasher.copy().digest()))
            boundary += OPENAI_CACHE_STEP_TOKENS
        read = 0
        for tokens, digest in digests:
            if self._has(digest):
                read = tokens
        for _, digest in digests:
            self._put(digest)
        return CacheResult(total, read, 0, tuple(d.hex()[:16] for _, d in digests[-1:]))

    def breakpoints(
        self,
        namespace: str,
        blocks: Sequence[tuple[str, bool]],
        *,
        max_writes: int | None = None,
        lookback: int | None = None,
    ) -> CacheResult:
        """Breakpoint caching: ``blocks`` are ``(text, marked)`` in prompt order.

        Reads consider the latest ``lookback`` marks (all by default); at most the latest
        ``max_writes`` marks are written (all by default).
        """
        hasher = hashlib.sha256(namespace.encode() + b"\0")
        chars = 0
        marks: list[tuple[int, bytes]] = []
        for text, marked in blocks:
            hasher.update(text.encode())
            chars += len(text)
            if marked:
                marks.append((-(-chars // CHARS_PER_TOKEN), hasher.copy().digest()))
        total = -(-chars // CHARS_PER_TOKEN)
        read = 0
        for tokens, digest in marks[-lookback if lookback else 0 :]:
            if self._has(digest):
                read = tokens
        write = 0
        if marks:
            last_tokens = marks[-1][0]
            if last_tokens >= ANTHROPIC_MIN_CACHEABLE_TOKENS:
                write = max(0, last_tokens - read)
                for tokens, digest in marks[-max_writes if max_writes else 0 :]:
                    if tokens >= ANTHROPIC_MIN_CACHEABLE_TOKENS:
                        self._put(digest)
        return CacheResult(total, read, write, tuple(d.hex()[:16] for _, d in marks))


#: The process-wide store every :class:`EmulatorApp` uses unless given its own.
SHARED_CACHE = PromptCache()
