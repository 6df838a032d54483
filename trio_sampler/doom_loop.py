"""Doom-loop detection: a model stuck repeating itself while it reasons. Pure.

Two sources of signal, both best-effort and never failing a stream:

* **the xAI server signal**: with the request header ``x-grok-doom-loop-check: <window>``,
  the server sends ``response.doom_loop_check`` events whose ``triggers`` are labels such
  as ``tail_repetition:8@thinking`` (cumulative: re-sent as the set grows);
  :func:`parse_trigger` reads them and :meth:`DoomLoopPolicy.is_confident` decides.
* **a local detector** for every backend: :class:`TailRepetitionDetector` watches the
  reasoning channel and fires when its tail is one unit of text repeated back to back.

The actor aborts an attempt on a confident trigger and resamples on a separate, small
budget; the last attempt runs disarmed and is accepted with the signals attached.
"""

from __future__ import annotations

import attrs

__all__ = [
    "DOOM_LOOP_HEADER",
    "DoomLoopPolicy",
    "DoomLoopSignal",
    "TailRepetitionDetector",
    "parse_trigger",
]

#: Request header that opts into the xAI server-side check (value: window in tokens).
DOOM_LOOP_HEADER = "x-grok-doom-loop-check"


@attrs.frozen
class DoomLoopSignal:
    """A parsed trigger label: ``kind`` (``tail_repetition``, ``low_logprob``, or the
    unknown head), the repetition ``threshold`` where given, the ``channel``, and ``raw``."""

    kind: str
    channel: str
    raw: str
    threshold: int | None = None


def parse_trigger(label: str) -> DoomLoopSignal:
    """Parse ``kind[:threshold]@channel``; never raises (unknown shapes are kept as-is)."""
    head, _, channel = label.partition("@")
    kind, _, value = head.partition(":")
    threshold = int(value) if value.isdigit() else None
    return DoomLoopSignal(kind=kind or "unknown", channel=channel, raw=label, threshold=threshold)


@attrs.frozen
class DoomLoopPolicy:
    """When to resample, and how the local detector looks for repetition.

    A server trigger is confident when it is a tail repetition on the thinking channel
    with a threshold at most ``max_threshold``. The local detector fires when the last
    ``min_repeats`` units of the reasoning text are identical, for a unit between
    ``min_unit_chars`` and ``max_unit_chars`` long (and ``min_repeats * unit`` at least
    ``min_span_chars``).
    """

    enabled: bool = True
    max_resamples: int = 2
    window_tokens: int = 1024
    max_threshold: int = 64
    min_unit_chars: int = 12
    max_unit_chars: int = 400
    min_repeats: int = 4
    min_span_chars: int = 160

    def __attrs_post_init__(self) -> None:
        if self.max_resamples < 0:
            raise ValueError("DoomLoopPolicy.max_resamples must be 0 or more")
        if not 512 <= self.window_tokens <= 4096:
            raise ValueError("DoomLoopPolicy.window_tokens must be between 512 and 4096")
        if self.min_unit_chars < 1 or self.max_unit_chars < self.min_unit_chars:
            raise ValueError("DoomLoopPolicy needs 1 <= min_unit_chars <= max_unit_chars")
        if self.min_repeats < 2:
            raise ValueError("DoomLoopPolicy.min_repeats must be at least 2")

    def is_confident(self, signal: DoomLoopSignal) -> bool:
        return (
            signal.kind == "tail_repetition"
            and signal.channel in ("thinking", "reasoning")
            and signal.threshold is not None
            and signal.threshold <= self.max_threshold
        )


class TailRepetitionDetector:
    """Fires when the reasoning text ends in one unit repeated ``min_repeats`` times.

    Fed per network read (not per token); keeps only a bounded tail of the text.
    """

    def __init__(self, policy: DoomLoopPolicy) -> None:
        self.policy = policy
        self._tail = ""
        self._keep = policy.max_unit_chars * policy.min_repeats
        self.trigger: str | None = None

    def feed(self, text: str) -> str | None:
        """Add reasoning text; returns a trigger label the first time repetition is seen."""
        if self.trigger is not None or not text:
            return None
        tail = self._tail + text
        if len(tail) > self._keep:
            tail = tail[-self._keep :]
        self._tail = tail
        policy = self.policy
        repeats = policy.min_repeats
        size = len(tail)
        probe_len = policy.min_unit_chars
        if size < max(policy.min_span_chars, probe_len * repeats):
            return None
        probe = tail[-probe_len:]
        # Candidate unit lengths are the distances back to earlier copies of the last
        # few characters: normal prose has very few, so this stays cheap per read.
        end = size - 1
        while True:
            found = tail.rfind(probe, 0, end)
            if found < 0:
                return None
            unit_len = size - probe_len - found
            if unit_len > policy.max_unit_chars or unit_len * repeats > size:
                return None
            end = found + probe_len - 1
            if unit_len < policy.min_unit_chars or unit_len * repeats < policy.min_span_chars:
                continue
            unit = tail[-unit_len:]
            if tail.endswith(unit * repeats):
                self.trigger = f"tail_repetition:{repeats}@reasoning"
                return self.trigger
