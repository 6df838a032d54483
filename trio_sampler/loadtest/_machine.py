"""The machine a load test ran on, stored in its results: a report is read elsewhere."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

__all__ = ["load_average", "machine"]

#: The packages whose versions a result records (the client's stack).
_PACKAGES = ("trio-sampler", "trio", "httpx2", "httpcore2", "h11", "hdrhistogram")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the platform has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(load_before: list[float] | None) -> dict[str, Any]:
    """Cores, the load averages before and after the run, the platform and the versions."""
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {package: _version(package) for package in _PACKAGES},
    }
