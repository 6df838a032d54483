"""The one base of every exception the library raises on purpose."""

from __future__ import annotations

__all__ = ["TrioSamplerError"]


class TrioSamplerError(Exception):
    """Base of every exception trio_sampler raises on purpose.

    ``except TrioSamplerError`` catches what the library reports — a request that
    failed or was cancelled (:class:`SamplingError`, ``RequestCancelledError``), a bad
    argument (``ConversionError``, ``ModelCatalogError``, ...), a closed sampler — and
    lets a bug of ours (``AssertionError``, ``TypeError`` from inside the library)
    through. Each subclass keeps the built-in base it had before (``ValueError`` for bad
    values, ``RuntimeError`` for misuse of a closed object), so existing ``except
    ValueError`` clauses still match.
    """
