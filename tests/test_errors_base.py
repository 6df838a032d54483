"""Every exception the library raises on purpose derives from ``TrioSamplerError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import trio_sampler
from trio_sampler import RequestCancelledError, SamplingError, TrioSamplerError
from trio_sampler.types import SamplingErrorInfo, SamplingErrorKind


def _modules() -> list[str]:
    names = ["trio_sampler"]
    for info in pkgutil.walk_packages(trio_sampler.__path__, "trio_sampler."):
        if info.name.endswith(("__main__", "testing")):
            continue  # __main__ runs the CLI on import; testing needs pytest's plugin hooks
        names.append(info.name)
    return names


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, BaseException)
                and value.__module__.startswith("trio_sampler")
                and not value.__name__.startswith("_")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_exception_of_ours_has_the_one_base() -> None:
    classes = _exception_classes()
    assert len(classes) >= 20  # the walk found the library's exceptions
    orphans = [c.__qualname__ for c in classes if not issubclass(c, TrioSamplerError)]
    assert orphans == []


def test_the_builtin_bases_are_kept() -> None:
    from trio_sampler.actor import DuplicateRequestError, SamplerClosedError
    from trio_sampler.wire import ConversionError

    assert issubclass(ConversionError, ValueError)
    assert issubclass(DuplicateRequestError, ValueError)
    assert issubclass(SamplerClosedError, RuntimeError)


def test_one_except_clause_catches_a_failed_and_a_cancelled_request() -> None:
    info = SamplingErrorInfo(kind=SamplingErrorKind.API, message="boom")
    for error in (SamplingError(info), RequestCancelledError("r1", "stop", None)):
        with pytest.raises(TrioSamplerError):
            raise error
