"""The per-object cache the sampler keeps what one config (or chain) alone decides in."""

from __future__ import annotations

from trio_sampler import SamplerConfig
from trio_sampler._by_identity import ByIdentity


def _config() -> SamplerConfig:
    return SamplerConfig(base_url="http://127.0.0.1:1/v1", model="m", api_key="k")


def test_a_value_is_found_for_the_same_object_and_detail_only() -> None:
    cache: ByIdentity[str] = ByIdentity()
    config, equal = _config(), _config()
    assert config == equal and config is not equal
    assert cache.put(config, "streaming", True) == "streaming"
    assert cache.get(config, True) == "streaming"
    assert cache.get(config, False) is None  # another detail
    assert cache.get(equal, True) is None  # an equal config is another one


def test_an_entry_keeps_its_object_so_its_id_is_not_reused() -> None:
    cache: ByIdentity[int] = ByIdentity()
    cache.put(_config(), 1)  # the only reference is the cache's
    assert all(cache.get(_config()) is None for _ in range(100))


def test_a_full_cache_starts_over() -> None:
    cache: ByIdentity[int] = ByIdentity(limit=2)
    first, second, third = _config(), _config(), _config()
    cache.put(first, 1)
    cache.put(second, 2)
    cache.put(third, 3)
    assert (cache.get(first), cache.get(second), cache.get(third)) == (None, None, 3)
