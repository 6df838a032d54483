"""Serving the emulator over loopback HTTP with Hypercorn's Trio worker."""

from __future__ import annotations

import functools
from typing import Any, cast

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from ._app import EmulatorApp

__all__ = ["BACKEND_PATHS", "EmulatorServer", "serve"]

#: The path of each backend's endpoint under ``base_url``.
BACKEND_PATHS = {
    "chat_completions": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
}


@attrs.frozen
class EmulatorServer:
    """A running emulator: where it listens, and its app (for recorded requests)."""

    host: str
    port: int
    app: EmulatorApp = attrs.field(repr=False)

    @property
    def origin(self) -> str:
        """``http://HOST:PORT`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The base URL every SDK takes: ``http://HOST:PORT/v1``."""
        return self.origin + "/v1"

    def url_for(self, backend: str) -> str:
        """The full endpoint URL for ``backend`` (``chat_completions``, ``responses``,
        ``messages``)."""
        try:
            return self.base_url + BACKEND_PATHS[backend]
        except KeyError:
            raise ValueError(
                f"unknown backend {backend!r}; expected one of {', '.join(BACKEND_PATHS)}"
            ) from None


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[EmulatorServer] = trio.TASK_STATUS_IGNORED,
    bench: bool = False,
    require_key: str | None = None,
    app: EmulatorApp | None = None,
    backlog: int = 1024,
) -> None:
    """Serve the emulator until cancelled.

    Use it with ``server = await nursery.start(serve)``: the value is an
    :class:`EmulatorServer` whose ``port`` is the bound port (``port=0`` picks a free one),
    and the server is accepting connections by the time ``start`` returns.

    Args:
        host: the address to bind; loopback by default.
        port: the port; 0 for any free port.
        bench: pre-rendered bodies for benchmarks (see :class:`EmulatorApp`).
        require_key: reject requests without this API key (401).
        app: serve this app instead of a new one.
        backlog: the listen queue; thousands of clients connecting at once need a long
            one (Hypercorn's default of 100 drops connections at 10,000).
    """
    if app is None:
        app = EmulatorApp(bench=bench, require_key=require_key)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    config.graceful_timeout = 0.5
    config.backlog = backlog
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            functools.partial(hypercorn_serve, cast(Any, app), config)
        )
        bound_port = int(binds[0].rsplit(":", 1)[1])
        task_status.started(EmulatorServer(host, bound_port, app))
