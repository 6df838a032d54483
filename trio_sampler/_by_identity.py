"""Values made once per object, found by the object's identity.

A sampler's requests come with the same few configs (and chains) again and again: what
depends on one alone (build options, prepared headers, a redactor, a pacer's key) is made
once and found again by ``id``, which costs nothing, where hashing a config by value would
cost more than most of what is cached. Each entry keeps its object alive, so an ``id`` is
never reused while its entry exists; a cache that reaches its bound starts over (a
sampler has a handful of configs, so that happens only to a program making new ones
without end).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["ByIdentity"]

_V = TypeVar("_V")

#: Entries a cache holds before it starts over.
DEFAULT_LIMIT = 64


class ByIdentity(Generic[_V]):
    """Values by ``(the identity of an object, a hashable detail)``."""

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._entries: dict[tuple[int, Hashable], tuple[object, _V]] = {}
        self._limit = limit

    def get(self, owner: object, detail: Hashable = None) -> _V | None:
        """The value stored for ``owner`` (this very object) and ``detail``, or ``None``."""
        found = self._entries.get((id(owner), detail))
        if found is not None and found[0] is owner:
            return found[1]
        return None

    def put(self, owner: object, value: _V, detail: Hashable = None) -> _V:
        """Store ``value`` for ``owner`` and ``detail``; returns ``value``."""
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[(id(owner), detail)] = (owner, value)
        return value
