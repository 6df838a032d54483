"""The pytest plugin: an ``emulator`` fixture (pytest-trio) on a real loopback port.

Enable it in your ``conftest.py``; nothing is loaded into pytest runs that do not ask::

    pytest_plugins = ["trio_sampler.testing"]

``emulator`` is a fresh emulator (its own app and prompt cache) on a free loopback port for
the duration of the test: an :class:`EmulatorFixture` (``base_url``, ``url_for(backend)``,
``script(**kwargs)`` headers, ``requests(scenario)``).

``cassette_server`` serves recorded exchanges (:mod:`trio_sampler.recording`, ``trio-sampler
record``) on a free loopback port: ``server = await cassette_server("run.cassette")`` (its
``base_url`` as the emulator's), with their original timing or ``timing="fast"``.

The helpers that need no pytest live in :mod:`trio_sampler.emulator`:
:func:`~trio_sampler.emulator.script_headers` and the in-process
:class:`~trio_sampler.emulator.EmulatorTransport` (re-exported here).

Importing :class:`EmulatorFixture` from here for a type hint works in any test module, even
before pytest loads the plugin: the module holds no ``assert`` for pytest to rewrite, and says
so to pytest with the marker PYTEST_DONT_REWRITE (without it, pytest warns that it cannot
rewrite a module already imported, a collection error under ``-W error``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import attrs
import pytest
import trio

from .emulator import (
    EmulatorApp,
    EmulatorServer,
    EmulatorTransport,
    PromptCache,
    script_headers,
    serve,
)
from .recording import Cassette, CassetteApp, Timing
from .types import ApiBackend

__all__ = [
    "CassetteServer",
    "EmulatorFixture",
    "EmulatorTransport",
    "cassette_server",
    "emulator",
    "script_headers",
]

#: ``await cassette_server(cassette, timing=...)``: a cassette (or its path) served on a free
#: loopback port until the test ends.
CassetteServer = Callable[..., Awaitable[EmulatorServer]]


@attrs.frozen
class EmulatorFixture:
    """What the ``emulator`` fixture gives a test."""

    server: EmulatorServer

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: pass it as an SDK's ``base_url``."""
        return self.server.base_url

    @property
    def app(self) -> EmulatorApp:
        """The running app (fault counters, recorded requests)."""
        return self.server.app

    def url_for(self, backend: ApiBackend | str) -> str:
        """The endpoint URL for ``backend``: an :class:`ApiBackend` or its name
        (``chat_completions``, ``responses``, ``messages``)."""
        return self.server.url_for(backend)

    def script(self, **script: Any) -> dict[str, str]:
        """Headers carrying ``script`` (see :func:`script_headers`)."""
        return script_headers(**script)

    def requests(self, scenario: str | None = None) -> list[dict[str, Any]]:
        """Requests received for ``scenario`` (auth headers redacted)."""
        return self.server.app.requests(scenario)


@pytest.fixture
async def emulator() -> AsyncIterator[EmulatorFixture]:
    """A fresh emulator (own app, own prompt cache) on a free loopback port."""
    async with trio.open_nursery() as nursery:
        app = EmulatorApp(cache=PromptCache())
        server: EmulatorServer = await nursery.start(_serve_app, app)
        yield EmulatorFixture(server)
        nursery.cancel_scope.cancel()


async def _serve_app(
    app: EmulatorApp, *, task_status: trio.TaskStatus[EmulatorServer] = trio.TASK_STATUS_IGNORED
) -> None:
    await serve(app=app, task_status=task_status)


@pytest.fixture
async def cassette_server() -> AsyncIterator[CassetteServer]:
    """Serves cassettes on free loopback ports until the test ends:
    ``server = await cassette_server("run.cassette", timing="fast")``."""
    async with trio.open_nursery() as nursery:

        async def start(
            cassette: Cassette | str | os.PathLike[str], *, timing: Timing | str = Timing.ORIGINAL
        ) -> EmulatorServer:
            app = CassetteApp(cassette, timing=timing)
            server: EmulatorServer = await nursery.start(
                functools.partial(serve, app=cast(Any, app))
            )
            return server

        yield start
        nursery.cancel_scope.cancel()
