"""The public surface: ``__all__`` lists exactly what the package re-exports."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "trio_sampler",
    "trio_sampler.types",
    "trio_sampler.wire",
    "trio_sampler.actor",
    "trio_sampler.fleet",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    # Sorted the way ruff's RUF022 sorts: CONSTANTS, then Classes, then functions.
    key = sorted(exported, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    assert exported == key, f"{name}.__all__ is not sorted"
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, type(importlib))  # submodules are not re-exports
        and attr not in {"annotations", "PackageNotFoundError", "version"}
    }
    assert set(exported) == public


def test_backend_values_are_stable() -> None:
    from trio_sampler import ApiBackend

    assert [b.value for b in ApiBackend] == ["chat_completions", "responses", "messages"]


def test_version_is_set() -> None:
    import trio_sampler

    assert trio_sampler.__version__ != "0+unknown"


def test_the_top_level_is_what_an_application_needs() -> None:
    import trio_sampler

    assert len(trio_sampler.__all__) <= 40


def test_a_moved_name_says_where_it_is_imported_from() -> None:
    import trio_sampler

    with pytest.raises(AttributeError, match=r"import it from trio_sampler\.routing"):
        getattr(trio_sampler, "HedgePolicy")  # noqa: B009 - a name mypy rightly rejects
    for name, module in trio_sampler._MOVED.items():
        assert hasattr(importlib.import_module(module), name), (name, module)
        assert name not in trio_sampler.__all__
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        getattr(trio_sampler, "NoSuchName")  # noqa: B009 - as above
