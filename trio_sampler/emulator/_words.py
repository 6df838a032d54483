"""The words the emulator's answers are made of: plain text and schema-valid strings."""

from __future__ import annotations

__all__ = ["WORDS"]

WORDS = (
    "the",
    "model",
    "considers",
    "your",
    "request",
    "carefully",
    "and",
    "answers",
    "with",
    "a",
    "short",
    "plausible",
    "reply",
    "about",
    "trio",
    "structured",
    "concurrency",
    "nurseries",
    "cancel",
    "scopes",
    "channels",
    "streams",
    "tokens",
    "events",
    "retries",
    "backoff",
    "deadlines",
    "tasks",
    "checkpoints",
    "emulated",
    "sampling",
)
