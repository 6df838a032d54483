"""``trio-sampler chat [PROMPT]``: talk to any endpoint, streaming live.

One-shot with a prompt; interactive (one turn per line of input, the conversation kept)
without one. The key comes from the provider's environment variable.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import orjson
import trio

from ..actor import SamplerHandle, open_sampler
from ..config import SamplerConfig
from ..types import (
    ApiBackend,
    ChannelToken,
    Completed,
    ConversationItem,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingChannel,
    System,
    User,
    to_jsonable,
)
from ._console import Console

__all__ = ["add_parser", "config_from_args"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "chat",
        help="chat with a model (one-shot with a prompt, interactive without)",
        description=(
            "Stream a conversation with any provider profile or base URL. The API key is read "
            "from the provider's environment variable (e.g. OPENAI_API_KEY)."
        ),
    )
    parser.add_argument("prompt", nargs="?", help="the prompt (omit for an interactive chat)")
    parser.add_argument("--provider", help="a provider profile (default: openai_compatible)")
    parser.add_argument("--base-url", help="the endpoint (e.g. http://127.0.0.1:8080/v1)")
    parser.add_argument("--backend", choices=[b.value for b in ApiBackend])
    parser.add_argument("--model", help="the model")
    parser.add_argument("--system", help="system instructions")
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    parser.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> SamplerConfig:
    """A config from ``--provider``/``--base-url``/``--backend``/``--model``."""
    provider = args.provider or "openai_compatible"
    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["backend"] = ApiBackend(args.backend)
    config = SamplerConfig.for_provider(
        provider, model=args.model, base_url=args.base_url, **overrides
    )
    if config.model is None:
        raise ValueError(f"provider {provider!r} has no default model: pass --model")
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"trio-sampler chat: {exc}", file=sys.stderr)
        return 2
    return trio.run(functools.partial(_chat, config, args))


async def _turn(
    handle: SamplerHandle, items: list[ConversationItem], console: Console, as_json: bool
) -> Completed | Failed | None:
    stream = await handle.submit(ConversationRequest(items=items))
    terminal: Completed | Failed | None = None
    async with stream:
        async for event in stream:
            if as_json:
                sys.stdout.buffer.write(orjson.dumps(to_jsonable(event)) + b"\n")
                sys.stdout.flush()
            elif isinstance(event, ChannelToken):
                thinking = event.channel is SamplingChannel.REASONING
                console.out.write(console.style(event.text, "dim") if thinking else event.text)
                console.out.flush()
            elif isinstance(event, Retrying):
                console.line("", f"\n[retrying in {event.delay:.1f} s: {event.reason}]", "yellow")
            if isinstance(event, Completed | Failed):
                terminal = event
    if not as_json:
        console.out.write("\n")
        console.out.flush()
    if isinstance(terminal, Failed):
        print(f"trio-sampler chat: {terminal.error}", file=sys.stderr)
    return terminal


async def _chat(config: SamplerConfig, args: argparse.Namespace) -> int:
    console = Console()
    items: list[ConversationItem] = [System(args.system)] if args.system else []
    async with open_sampler(config) as handle:
        if args.prompt is not None:
            items.append(User(args.prompt))
            terminal = await _turn(handle, items, console, args.json)
            return 0 if isinstance(terminal, Completed) else 1
        interactive = sys.stdin.isatty()
        status = 0
        while True:
            if interactive:
                console.out.write(console.style("you> ", "bold"))
                console.out.flush()
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return status
            if not line.strip():
                continue
            items.append(User(line.rstrip("\n")))
            terminal = await _turn(handle, items, console, args.json)
            if isinstance(terminal, Completed):
                items.extend(terminal.response.items)
            else:
                items.pop()  # keep the conversation valid to resubmit
                status = 1
