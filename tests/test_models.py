"""ModelCatalog: the shipped file, user overrides, malformed files, cost in ticks."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_sampler.models import (
    TICKS_PER_USD,
    ModelCatalog,
    ModelCatalogError,
    ModelInfo,
    ModelPrices,
)
from trio_sampler.providers import PROFILES
from trio_sampler.types import ApiBackend, Usage

SHIPPED = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-5",
    "gpt-5-mini",
    "o4-mini",
    "claude-sonnet-4-5",
    "claude-opus-4-1",
    "claude-haiku-4-5",
    "grok-4.7",
    "grok-4.3",
    "grok-build-0.1",
    "deepseek-flash",
    "deepseek-v4-pro",
    "emulator-1",
]


def write(tmp_path: Path, document: Any) -> Path:
    path = tmp_path / "models.json"
    path.write_bytes(document if isinstance(document, bytes) else orjson.dumps(document))
    return path


def test_shipped_catalog() -> None:
    catalog = ModelCatalog.load()
    assert set(SHIPPED) <= set(catalog)
    for name in catalog:
        info = catalog.get(name)
        assert info is not None
        assert info.provider in PROFILES
        assert info.max_output_tokens <= info.context_window
    emulator = catalog.get("emulator-1")
    assert emulator is not None and emulator.provider == "emulator"
    assert catalog.cost_ticks("emulator-1", Usage(input_tokens=10**6, output_tokens=10**6)) == 0
    sonnet = catalog.get("claude-sonnet-4-5")
    assert sonnet is not None and sonnet.backend is ApiBackend.MESSAGES


def test_snapshot_names_fall_back_to_family() -> None:
    catalog = ModelCatalog.load()
    info = catalog.get("gpt-4o-2024-08-06")
    assert info is not None and info.name == "gpt-4o"
    assert catalog.get("claude-sonnet-4-5-20250929") is not None
    assert catalog.get("grok-4.7-latest") is not None
    assert catalog.get("gpt-5-nano") is None  # not a snapshot suffix: no guessing
    assert "gpt-4o" in catalog and "nope" not in catalog


def test_cost_ticks_anthropic_with_cache() -> None:
    catalog = ModelCatalog.load()
    # 1M uncached input at $3 + 2M cache reads at $0.30 + 1M cache writes at $3.75
    # + 1M output at $15 = 3 + 0.6 + 3.75 + 15 = $22.35
    usage = Usage(
        input_tokens=4_000_000,
        cache_read_tokens=2_000_000,
        cache_write_tokens=1_000_000,
        output_tokens=1_000_000,
    )
    assert catalog.cost_ticks("claude-sonnet-4-5", usage) == 22.35 * TICKS_PER_USD


def test_cost_ticks_small_and_exact() -> None:
    catalog = ModelCatalog.load()
    # gpt-4o-mini: 1 input token = 0.15 / 1e6 USD = 1500 ticks; 1 output token = 6000.
    assert catalog.cost_ticks("gpt-4o-mini", Usage(input_tokens=1, output_tokens=1)) == 7500
    # openai has no cache-write price: such tokens are charged as input.
    usage = Usage(input_tokens=10, cache_write_tokens=10)
    assert catalog.cost_ticks("gpt-4o-mini", usage) == 15000
    assert catalog.cost_ticks("unknown-model", Usage(input_tokens=1)) is None
    # inconsistent usage (cache larger than input) never gives a negative cost
    assert catalog.cost_ticks("gpt-4o", Usage(input_tokens=1, cache_read_tokens=5)) == 5 * 12500


def test_user_file_merges_over_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "models": {
                "gpt-4o": {"prices": {"input": 1.0}},
                "my-local": {
                    "provider": "vllm",
                    "backend": "chat_completions",
                    "context_window": 32768,
                    "max_output_tokens": 4096,
                    "prices": {"input": 0, "output": 0},
                },
            }
        },
    )
    catalog = ModelCatalog.load(path)
    gpt = catalog.get("gpt-4o")
    assert gpt is not None
    assert gpt.prices.input == 1.0 and gpt.prices.output == 10.0  # only input changed
    local = catalog.get("my-local")
    assert local is not None and local.prices.cache_read is None
    assert "claude-haiku-4-5" in catalog


@pytest.mark.parametrize(
    ("document", "match"),
    [
        (b"{not json", "not valid JSON"),
        ([], "expected an object"),
        ({"models": []}, "expected an object"),
        ({"version": 2, "models": {}}, "unsupported version 2"),
        ({"models": {"m": 5}}, r"models\.m: must be an object"),
        ({"models": {"m": {"provider": "x"}}}, r"models\.m: missing field"),
        (
            {"models": {"gpt-4o": {"context_window": "big"}}},
            r"gpt-4o\.context_window: must be a positive integer",
        ),
        (
            {"models": {"gpt-4o": {"backend": "grpc"}}},
            r"gpt-4o\.backend: must be one of chat_completions",
        ),
        (
            {"models": {"gpt-4o": {"prices": {"input": -1}}}},
            r"prices\.input: must be a finite number >= 0",
        ),
        ({"models": {"gpt-4o": {"prices": {"input": "free"}}}}, r"prices\.input: must be a number"),
        ({"models": {"gpt-4o": {"prices": {"inptu": 1}}}}, "unknown field"),
        ({"models": {"gpt-4o": {"colour": "red"}}}, r"unknown field\(s\) \['colour'\]"),
    ],
)
def test_malformed_files(tmp_path: Path, document: Any, match: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(ModelCatalogError, match=match) as info:
        ModelCatalog.load(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelCatalogError, match="cannot read models file"):
        ModelCatalog.load(tmp_path / "absent.json")


CURRENT = ["gpt-6.1-sol", "gpt-6-luna", "claude-sonnet-5-5", "claude-opus-5-5"]


def test_current_models_are_shipped_with_address_and_limits() -> None:
    catalog = ModelCatalog.load()
    for name in CURRENT:
        info = catalog.get(name)
        assert info is not None, name
        profile = PROFILES[info.provider]
        assert info.base_url == profile.base_url
        assert info.backend is profile.backend
        assert info.context_window >= 1_000_000 and info.max_output_tokens == 128_000
        assert info.prices.output > info.prices.input > 0


def test_profile_default_models_are_in_the_catalog_and_not_end_of_life() -> None:
    from anthropic._data import DEPRECATED_MODELS  # the SDK's end-of-life table

    catalog = ModelCatalog.load()
    for profile in PROFILES.values():
        if profile.default_model is not None:
            info = catalog.get(profile.default_model)
            assert info is not None and info.provider == profile.name, profile.name
    assert PROFILES["anthropic"].default_model not in DEPRECATED_MODELS


def test_naming_a_model_picks_its_backend_address_and_output_cap() -> None:
    from trio_sampler import SamplerConfig

    env = {"DEEPSEEK_API_KEY": "sk-test-key-000", "OPENAI_API_KEY": "sk-test-key-000"}
    config = SamplerConfig.for_provider("openai", model="gpt-6-luna", env=env)
    assert config.backend is ApiBackend.RESPONSES
    assert config.base_url == "https://api.openai.com/v1"
    assert config.default_max_output_tokens == 8192  # min(8192, 128000)
    # Overridable: a keyword, or the base URL.
    chat = SamplerConfig.for_provider(
        "openai", model="gpt-6-luna", env=env, backend=ApiBackend.CHAT_COMPLETIONS
    )
    assert chat.backend is ApiBackend.CHAT_COMPLETIONS
    proxy = SamplerConfig.for_provider(
        "openai", model="gpt-6-luna", env=env, base_url="https://proxy.example/v1"
    )
    assert proxy.base_url == "https://proxy.example/v1"
    # A catalog model of another provider changes nothing of this provider's profile.
    other = SamplerConfig.for_provider("deepseek", model="gpt-6-luna", env=env)
    assert other.backend is PROFILES["deepseek"].backend
    assert other.base_url == PROFILES["deepseek"].base_url


def test_catalog_entry_picks_backend_from_a_user_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "version": 1,
            "models": {"gpt-6-luna": {"backend": "chat_completions", "max_output_tokens": 4096}},
        },
    )
    info = ModelCatalog.load(path).get("gpt-6-luna")
    assert info is not None
    assert info.backend is ApiBackend.CHAT_COMPLETIONS and info.max_output_tokens == 4096
    assert info.base_url == "https://api.openai.com/v1"  # merged field by field


def test_bad_base_url_in_a_models_file_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, {"version": 1, "models": {"gpt-6-luna": {"base_url": "ftp://x"}}})
    with pytest.raises(ModelCatalogError, match=r"models\.gpt-6-luna\.base_url"):
        ModelCatalog.load(path)


_prices = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False) | st.sampled_from(
    [0.0, 0.05, 0.15, 0.3, 1.25, 2.5, 3.75, 15.0, 1e-7, 0.1 + 0.2]
)
_tokens = st.integers(min_value=-10, max_value=10**9)


@given(
    _prices,
    _prices,
    st.none() | _prices,
    st.none() | _prices,
    _tokens,
    _tokens,
    _tokens,
    _tokens,
)
def test_cost_ticks_is_the_exact_decimal_cost_rounded_half_up(
    input_price: float,
    output_price: float,
    read_price: float | None,
    write_price: float | None,
    input_tokens: int,
    output_tokens: int,
    read_tokens: int,
    write_tokens: int,
) -> None:
    # The prices are taken as the decimals they print as; each count is clamped at zero.
    prices = ModelPrices(input_price, output_price, read_price, write_price)
    catalog = ModelCatalog(
        {"m": ModelInfo("m", "openai", ApiBackend.CHAT_COMPLETIONS, 1, 1, prices)}
    )
    usage = Usage(input_tokens, output_tokens, read_tokens, write_tokens)
    read, write = max(read_tokens, 0), max(write_tokens, 0)
    terms = [
        (max(input_tokens - read - write, 0), input_price),
        (read, input_price if read_price is None else read_price),
        (write, input_price if write_price is None else write_price),
        (max(output_tokens, 0), output_price),
    ]
    exact = sum(
        (n * Fraction(str(price)) * Fraction(TICKS_PER_USD, 10**6) for n, price in terms),
        Fraction(0),
    )
    assert catalog.cost_ticks("m", usage) == math.floor(exact + Fraction(1, 2))
