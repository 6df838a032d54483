"""The model catalog: context windows, output limits and prices, and cost in ticks.

The package ships ``default_models.json``; a user's file with the same format is merged
over it (field by field, so a file can change one price). Reading a file is the only I/O
here, and only in :meth:`ModelCatalog.load`.

File format::

    {"version": 1,
     "models": {
       "gpt-4o": {"provider": "openai", "backend": "responses",
                  "base_url": "https://api.openai.com/v1",
                  "context_window": 128000, "max_output_tokens": 16384,
                  "prices": {"input": 2.5, "cache_read": 1.25, "cache_write": null,
                             "output": 10.0}}}}

Prices are USD per million tokens. ``cache_read``/``cache_write`` may be ``null``: the
provider has no such price, and those tokens are charged at the input price.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import os
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

import attrs
import orjson

from .types import ApiBackend, TrioSamplerError, Usage
from .types._conversation import coerce_enum
from .types._credential_names import redact_url

__all__ = [
    "TICKS_PER_USD",
    "ModelCatalog",
    "ModelCatalogError",
    "ModelInfo",
    "ModelPrices",
]

#: 1 USD = 10**10 ticks (xAI's unit, used for every cost in this library).
TICKS_PER_USD = 10**10
# Ticks per token for a price of 1 USD per million tokens.
_TICKS_PER_TOKEN_PER_PRICE = Fraction(TICKS_PER_USD, 1_000_000)
# Dated or "-latest" snapshots resolve to their family: gpt-4o-2024-08-06 → gpt-4o.
_SNAPSHOT_SUFFIX = re.compile(r"^(.+?)-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_ENTRY_FIELDS = frozenset({"provider", "backend", "context_window", "max_output_tokens", "prices"})
_OPTIONAL_FIELDS = frozenset({"base_url"})
_PRICE_FIELDS = ("input", "cache_read", "cache_write", "output")


class ModelCatalogError(TrioSamplerError, ValueError):
    """A models file is missing, not JSON, or has a field of the wrong shape."""


@attrs.frozen
class ModelPrices:
    """USD per million tokens. ``None`` for a cache price means "charged as input"."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


def _model_backend(value: ApiBackend | str) -> ApiBackend:
    return coerce_enum(ApiBackend, value, "ModelInfo.backend")


@attrs.frozen
class ModelInfo:
    """One model: who serves it, over which protocol, its limits and prices."""

    name: str
    provider: str
    #: An :class:`ApiBackend`, or its name (``"responses"``, ...).
    backend: ApiBackend = attrs.field(converter=_model_backend)
    context_window: int
    max_output_tokens: int
    prices: ModelPrices
    #: Where the provider serves it (``None``: the provider profile's address).
    base_url: str | None = attrs.field(default=None, repr=redact_url)


def _fail(source: str, where: str, problem: str) -> ModelCatalogError:
    return ModelCatalogError(f"{source}: {where}: {problem}")


def _positive_int(source: str, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(source, where, f"must be a positive integer, got {value!r}")
    return value


def _price(source: str, where: str, value: Any, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(source, where, f"must be a number (USD per million tokens), got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise _fail(source, where, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _parse_entry(source: str, name: str, entry: Mapping[str, Any]) -> ModelInfo:
    where = f"models.{name}"
    unknown = set(entry) - _ENTRY_FIELDS - _OPTIONAL_FIELDS
    if unknown:
        fields = sorted(_ENTRY_FIELDS | _OPTIONAL_FIELDS)
        raise _fail(source, where, f"unknown field(s) {sorted(unknown)}; known: {fields}")
    base_url = entry.get("base_url")
    if base_url is not None and (
        not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
    ):
        raise _fail(source, f"{where}.base_url", f"must be an http(s) URL, got {base_url!r}")
    missing = _ENTRY_FIELDS - set(entry)
    if missing:
        raise _fail(source, where, f"missing field(s) {sorted(missing)}")
    provider = entry["provider"]
    if not isinstance(provider, str) or not provider:
        raise _fail(source, f"{where}.provider", f"must be a non-empty string, got {provider!r}")
    try:
        backend = ApiBackend(entry["backend"])
    except ValueError:
        known = ", ".join(b.value for b in ApiBackend)
        raise _fail(
            source, f"{where}.backend", f"must be one of {known}, got {entry['backend']!r}"
        ) from None
    prices = entry["prices"]
    if not isinstance(prices, Mapping):
        raise _fail(source, f"{where}.prices", "must be an object with input/output prices")
    for field in ("input", "output"):
        if field not in prices:
            raise _fail(source, f"{where}.prices", f"missing {field!r}")
    extra = set(prices) - set(_PRICE_FIELDS)
    if extra:
        raise _fail(source, f"{where}.prices", f"unknown field(s) {sorted(extra)}")
    parsed = {
        field: _price(source, f"{where}.prices.{field}", prices.get(field), optional=True)
        for field in _PRICE_FIELDS
    }
    return ModelInfo(
        name=name,
        provider=provider,
        backend=backend,
        context_window=_positive_int(source, f"{where}.context_window", entry["context_window"]),
        max_output_tokens=_positive_int(
            source, f"{where}.max_output_tokens", entry["max_output_tokens"]
        ),
        prices=ModelPrices(
            input=_price(source, f"{where}.prices.input", prices["input"], optional=False) or 0.0,
            output=_price(source, f"{where}.prices.output", prices["output"], optional=False)
            or 0.0,
            cache_read=parsed["cache_read"],
            cache_write=parsed["cache_write"],
        ),
        base_url=base_url,
    )


def _read_models(source: str, data: bytes) -> dict[str, dict[str, Any]]:
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ModelCatalogError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("models"), dict):
        raise ModelCatalogError(f'{source}: expected an object {{"models": {{name: entry}}}}')
    version = document.get("version", 1)
    if version != 1:
        raise ModelCatalogError(f"{source}: unsupported version {version!r} (this library reads 1)")
    models: dict[str, dict[str, Any]] = {}
    for name, entry in document["models"].items():
        if not isinstance(entry, dict):
            raise _fail(source, f"models.{name}", "must be an object")
        models[name] = entry
    return models


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if key == "prices" and isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return merged


@attrs.frozen
class ModelCatalog:
    """Known models by name. Build with :meth:`load`."""

    models: Mapping[str, ModelInfo] = attrs.field(factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ModelCatalog:
        """The shipped catalog, with the file at ``path`` (if given) merged over it.

        A user entry for a known model overrides field by field (``prices`` too); a new
        model needs every field. Raises :class:`ModelCatalogError` naming the file and the
        field for a malformed file, and for a missing one.
        """
        resource = importlib.resources.files("trio_sampler").joinpath("default_models.json")
        entries = _read_models("default_models.json", resource.read_bytes())
        source = "default_models.json"
        if path is not None:
            source = os.fspath(path)
            try:
                with open(source, "rb") as handle:
                    user = _read_models(source, handle.read())
            except OSError as exc:
                raise ModelCatalogError(
                    f"{source}: cannot read models file ({exc.strerror})"
                ) from None
            for name, entry in user.items():
                entries[name] = _merge(entries.get(name, {}), entry)
        return cls({name: _parse_entry(source, name, entry) for name, entry in entries.items()})

    @classmethod
    def shipped(cls) -> ModelCatalog:
        """The catalog shipped with the package (read once, then shared)."""
        return _shipped()

    def get(self, model: str) -> ModelInfo | None:
        """The entry for ``model``; a dated or ``-latest`` snapshot name
        (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) falls back to its family."""
        info = self.models.get(model)
        if info is None:
            match = _SNAPSHOT_SUFFIX.match(model)
            if match:
                info = self.models.get(match.group(1))
        return info

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.get(model) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def cost_ticks(self, model: str, usage: Usage) -> int | None:
        """Cost of ``usage`` on ``model`` in ticks (1 USD = 10**10), ``None`` if unknown.

        Uncached input (``input_tokens - cache_read_tokens - cache_write_tokens``) is
        charged at the input price, cache reads and writes at theirs (the input price when
        the model has none), all output (reasoning included) at the output price. Computed
        exactly and rounded once, half up. A usage that breaks its invariants
        (:attr:`Usage.violations`: a negative count, say) is priced with each count clamped
        at zero: never a negative cost. A usage whose counts are not counts (a string, 1e30
        tokens: not :attr:`Usage.priceable`) is not priced at all (``None``).
        """
        info = self.get(model)
        if info is None or not usage.priceable:
            return None
        (uncached_rate, read_rate, write_rate, output_rate), denominator = _tick_rates(info.prices)
        cache_read = max(usage.cache_read_tokens, 0)
        cache_write = max(usage.cache_write_tokens, 0)
        uncached = max(usage.input_tokens - cache_read - cache_write, 0)
        total = (
            uncached * uncached_rate
            + cache_read * read_rate
            + cache_write * write_rate
            + max(usage.output_tokens, 0) * output_rate
        )
        # floor(total / denominator + 1/2), in integers.
        return (2 * total + denominator) // (2 * denominator)


@functools.lru_cache(maxsize=1024)
def _tick_rates(prices: ModelPrices) -> tuple[tuple[int, int, int, int], int]:
    """Ticks per token at each price (uncached input, cache read, cache write, output)
    as numerators over one common denominator: the decimal prices exactly, so a cost is
    integer arithmetic (building the fractions took most of a priced request's cost)."""
    rates = [
        Fraction(str(price)) * _TICKS_PER_TOKEN_PER_PRICE
        for price in (
            prices.input,
            _or(prices.cache_read, prices.input),
            _or(prices.cache_write, prices.input),
            prices.output,
        )
    ]
    denominator = math.lcm(*(rate.denominator for rate in rates))
    uncached, read, write, output = (
        rate.numerator * (denominator // rate.denominator) for rate in rates
    )
    return (uncached, read, write, output), denominator


@functools.cache
def _shipped() -> ModelCatalog:
    return ModelCatalog.load()


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
