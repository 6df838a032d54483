"""The one percentile the library computes from kept values: nearest rank."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence (``fraction`` in
    (0, 1]): the smallest value with at least that fraction of the values at or below it."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]
