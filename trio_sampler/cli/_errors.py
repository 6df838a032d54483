"""What the commands share about bad input: the usage error and argument types."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import trio

from ..types import TrioSamplerError

__all__ = [
    "UsageError",
    "api_key_or_fail",
    "backend_choice",
    "port",
    "positive_int",
    "run_interruptibly",
    "url",
]


class UsageError(TrioSamplerError):
    """A problem with what the user asked for: printed as one line, exit status 2.

    The message names flags and environment variables, never Python parameters.
    """


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0 to 65535)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def url(text: str) -> str:
    """An argparse type: an absolute ``http://`` or ``https://`` URL with a host."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"not an http:// or https:// URL: {text!r} (e.g. http://127.0.0.1:8080/v1)"
        )
    return text


def api_key_or_fail(env_var: str | None, *, needed: bool) -> None:
    """Fail with the variable to set when a provider needs a key and none is in the environment."""
    if needed and env_var and not os.environ.get(env_var):
        raise UsageError(f"no API key: set the environment variable {env_var}")


def run_interruptibly(
    async_fn: Callable[..., Awaitable[int]],
    *args: Any,
    on_interrupt: Callable[[], bool] | None = None,
) -> int:
    """``trio.run(async_fn, *args)`` where Ctrl-C cancels everything, then raises
    ``KeyboardInterrupt`` from here (the command line turns it into one line and 130).

    ``on_interrupt`` is asked first at each Ctrl-C: when it returns ``True`` it has dealt
    with it (``chat`` ends the answer being streamed and goes back to its prompt).

    While it runs, SIGINT goes to a signal receiver instead of raising ``KeyboardInterrupt``
    inside whichever task happens to be running: a library task could swallow it (Hypercorn
    treats it as a graceful shutdown and returns), and the command would carry on.
    """
    interrupted = False

    async def main() -> int:
        nonlocal interrupted
        status = 0
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def body() -> None:
                    nonlocal status
                    status = await async_fn(*args)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(body)
                async for _ in signals:
                    if on_interrupt is not None and on_interrupt():
                        continue
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    break
        return status

    status = trio.run(main)
    if interrupted:
        raise KeyboardInterrupt
    return status


def backend_choice(value: str) -> str:
    """A ``--backend`` value in any case, ``-`` or ``_``: ``Responses`` and
    ``chat-completions`` are ``responses`` and ``chat_completions`` (argparse then checks
    it against the choices and lists them when it is none of them)."""
    return value.strip().lower().replace("-", "_")
