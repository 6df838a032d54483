"""The emulator process's garbage collection by heap growth (``trio-sampler serve``)."""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
import weakref

import pytest
import trio

from trio_sampler.emulator._cli import serve_and_report
from trio_sampler.emulator._gc import CHECK_INTERVAL, DEFAULT_GROWTH, collect_by_growth


class _Node:
    """A container object kept alive only by a cycle through itself."""

    def __init__(self) -> None:
        self.me = self


def _cycles(count: int) -> weakref.ref[_Node]:
    """``count`` unreachable cycles; a weak reference to the last."""
    node = _Node()
    for _ in range(count - 1):
        _Node()
    return weakref.ref(node)


async def test_the_collector_is_off_while_it_runs_and_as_it_was_after(
    autojump_clock: trio.abc.Clock,
) -> None:
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect_by_growth, 10_000)
        await trio.sleep(0.1)
        assert not gc.isenabled()
        # What was alive when it started is out of the collector's view.
        assert gc.get_freeze_count() > frozen_before
        nursery.cancel_scope.cancel()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen_before


async def test_cyclic_garbage_waits_for_the_growth_then_is_collected(
    autojump_clock: trio.abc.Clock,
) -> None:
    growth = 50_000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect_by_growth, growth)
        await trio.sleep(0.1)
        few = _cycles(1_000)  # far below the growth: left for later
        await trio.sleep(CHECK_INTERVAL * 3)
        assert few() is not None
        many = _cycles(growth)  # now the heap grew by more than ``growth``
        await trio.sleep(CHECK_INTERVAL * 1.5)
        assert few() is None and many() is None
        nursery.cancel_scope.cancel()


async def test_a_growth_that_is_not_a_positive_int_is_refused() -> None:
    for growth in (0, -5, 1.5):
        with pytest.raises(ValueError, match="growth must be a positive int"):
            await collect_by_growth(growth)  # type: ignore[arg-type]
    assert gc.isenabled()


async def test_the_serving_process_collects_by_growth_only_when_asked() -> None:
    for growth, enabled_while_serving in ((DEFAULT_GROWTH, False), (None, True)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(serve_and_report, "127.0.0.1", 0, gc_growth=growth)
            )
            await trio.sleep(0.5)
            assert gc.isenabled() is enabled_while_serving
            nursery.cancel_scope.cancel()
        assert gc.isenabled()


def test_the_serve_command_offers_both_policies_and_says_the_threshold() -> None:
    command = [sys.executable, "-m", "trio_sampler.cli", "serve"]
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True)
    assert f"{DEFAULT_GROWTH:,}" in " ".join(shown.stdout.split())
    wrong = subprocess.run([*command, "--gc", "never"], capture_output=True, text=True)
    assert wrong.returncode == 2
    assert "invalid choice: 'never'" in wrong.stderr and "'growth', 'python'" in wrong.stderr
