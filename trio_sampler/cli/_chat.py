"""``trio-sampler chat [PROMPT]``: talk to any endpoint, streaming live.

One-shot with a prompt; interactive (one turn per line of input, the conversation kept)
without one. The key comes from the provider's environment variable.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlsplit

import orjson
import trio

from ..actor import SamplerHandle, open_sampler
from ..config import SamplerConfig
from ..providers import get_profile
from ..types import (
    ApiBackend,
    ChannelToken,
    Completed,
    ConversationItem,
    ConversationRequest,
    Failed,
    Retrying,
    SamplingChannel,
    SamplingErrorKind,
    System,
    User,
    to_jsonable,
)
from ..wire._request import validate_headers
from ._console import Console
from ._errors import UsageError, api_key_or_fail, backend_choice, run_interruptibly, url

__all__ = ["add_endpoint_arguments", "add_parser", "config_from_args", "headers_from_args"]

#: How long the check that a refused connection is really refused may take.
_PROBE_S = 2.0


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
    add_endpoint_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    parser.set_defaults(run=run)


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say where to send a chat and how (``chat`` and ``record``)."""
    parser.add_argument("--provider", help="a provider profile (default: openai_compatible)")
    parser.add_argument("--base-url", type=url, help="the endpoint (e.g. http://127.0.0.1:8080/v1)")
    parser.add_argument("--backend", type=backend_choice, choices=[b.value for b in ApiBackend])
    parser.add_argument("--model", help="the model")
    parser.add_argument("--system", help="system instructions")
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra request header (repeatable), e.g. for a gateway or the emulator's script",
    )


def headers_from_args(args: argparse.Namespace) -> dict[str, str]:
    """``--header 'Name: value'`` options as a dict, checked like every extra header."""
    headers: dict[str, str] = {}
    for text in args.header:
        name, colon, value = text.partition(":")
        if not colon or not name.strip():
            raise UsageError(f"--header {text!r}: write it as 'Name: value'")
        headers[name.strip()] = value.strip()
    try:
        validate_headers(headers.items(), what="--header")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return headers


def config_from_args(args: argparse.Namespace) -> SamplerConfig:
    """A config from ``--provider``/``--base-url``/``--backend``/``--model``.

    Raises :class:`UsageError` naming the flag or environment variable to fix.
    """
    provider = args.provider or "openai_compatible"
    try:
        profile = get_profile(provider)
    except ValueError as exc:
        raise UsageError(f"--provider: {exc}") from None
    if args.base_url is None and profile.base_url is None:
        raise UsageError(f"--base-url is required: provider {profile.name!r} has no standard one")
    api_key_or_fail(profile.api_key_env, needed=profile.requires_api_key)
    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["backend"] = ApiBackend(args.backend)
    try:
        config = SamplerConfig.for_provider(
            provider, model=args.model, base_url=args.base_url, **overrides
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if config.model is None:
        raise UsageError(f"provider {profile.name!r} has no default model: pass --model")
    return config


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    headers = headers_from_args(args)
    answer = _Answer()
    return run_interruptibly(_chat, config, args, headers, answer, on_interrupt=answer.interrupt)


class _Answer:
    """The answer being streamed in an interactive chat, which Ctrl-C ends.

    A Ctrl-C while an answer streams cancels it and the chat goes back to its prompt; a
    Ctrl-C at the prompt (the second one, say) quits, as everywhere else.
    """

    def __init__(self) -> None:
        self.scope: trio.CancelScope | None = None

    def interrupt(self) -> bool:
        """Whether this Ctrl-C was taken (an answer was streaming: it is cancelled)."""
        scope = self.scope
        if scope is None or scope.cancel_called:
            return False
        scope.cancel()
        return True


def _address(base_url: str) -> str:
    """``host:port`` of ``base_url``, for a connect failure's message."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


async def _connection_refused(base_url: str) -> bool:
    """Whether nothing listens at ``base_url``'s address (the connection is refused): a
    stopped server or a wrong port, which waiting will not fix."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with trio.fail_after(_PROBE_S):
            stream = await trio.open_tcp_stream(parts.hostname or "", port)
    except OSError as exc:
        return _is_refused(exc)
    except trio.TooSlowError:
        return False
    await stream.aclose()
    return False


def _is_refused(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionRefusedError):
        return True
    causes = [exc.__cause__, exc.__context__, *getattr(exc, "exceptions", ())]
    return any(c is not None and _is_refused(c) for c in causes)


def _failure_hint(config: SamplerConfig, terminal: Failed) -> str:
    """What to try, for a failure whose usual cause is the base URL."""
    if terminal.error.status_code == 404:
        path = urlsplit(config.base_url).path.rstrip("/")
        if not path.endswith("/v1"):
            fixed = config.base_url.rstrip("/") + "/v1"
            return (
                f"; the base URL has no /v1, under which most servers serve the API: "
                f"try --base-url {fixed}"
            )
    return ""


class _Transcript:
    """The streamed text of a turn on stdout, reasoning kept apart from the answer.

    On a terminal reasoning is dim; piped (or with ``NO_COLOR``) every reasoning line starts
    with ``thinking: ``. Either way a blank line separates the reasoning from the answer.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.channel: SamplingChannel | None = None
        self.at_line_start = True

    def write(self, channel: SamplingChannel, text: str) -> None:
        out = self.console.out
        thinking = channel is SamplingChannel.REASONING
        if channel is not self.channel:
            if self.channel is not None:
                out.write("\n\n" if not self.at_line_start else "\n")
                self.at_line_start = True
            self.channel = channel
        if thinking and not self.console.color:
            lines = text.split("\n")
            pieces = []
            for index, line in enumerate(lines):
                if index:
                    pieces.append("\n")
                    self.at_line_start = True
                if line and self.at_line_start:
                    pieces.append("thinking: ")
                if line:
                    self.at_line_start = False
                pieces.append(line)
            out.write("".join(pieces))
        else:
            out.write(self.console.style(text, "dim") if thinking else text)
            if text:
                self.at_line_start = text.endswith("\n")
        out.flush()

    def end(self) -> None:
        if self.channel is not None and not self.at_line_start:
            self.console.out.write("\n")
            self.console.out.flush()


async def _turn(
    handle: SamplerHandle,
    items: list[ConversationItem],
    console: Console,
    as_json: bool,
    headers: dict[str, str],
) -> Completed | Failed | None:
    config = handle.config
    stream = await handle.submit(ConversationRequest(items=items, extra_headers=headers))
    terminal: Completed | Failed | None = None
    transcript = _Transcript(console)
    async with stream:
        async for event in stream:
            if isinstance(event, Retrying) and await _refused(event, config):
                return None  # leaving the stream cancels the request
            if as_json:
                sys.stdout.buffer.write(orjson.dumps(to_jsonable(event)) + b"\n")
                sys.stdout.flush()
            elif isinstance(event, ChannelToken):
                transcript.write(event.channel, event.text)
            elif isinstance(event, Retrying):
                transcript.end()
                print(
                    f"trio-sampler chat: retrying in {event.delay:.1f} s: {event.reason}",
                    file=sys.stderr,
                    flush=True,
                )
            if isinstance(event, Completed | Failed):
                terminal = event
    if not as_json:
        transcript.end()
    if isinstance(terminal, Failed):
        hint = _failure_hint(config, terminal)
        print(f"trio-sampler chat: {terminal.error}{hint}", file=sys.stderr)
    return terminal


async def _refused(retrying: Retrying, config: SamplerConfig) -> bool:
    """Whether the first attempt could not connect because nothing listens there (then
    said on stderr): retrying a stopped server or a wrong port only makes the user wait."""
    could_not_connect = retrying.kind is SamplingErrorKind.TRANSPORT and (
        retrying.reason.startswith("could not connect")
    )
    if retrying.attempt != 1 or not could_not_connect:
        return False
    if not await _connection_refused(config.base_url):
        return False
    print(
        f"trio-sampler chat: nothing listens at {_address(config.base_url)} (connection "
        f"refused): is the server running, and is --base-url {config.base_url} right?",
        file=sys.stderr,
    )
    return True


async def _chat(
    config: SamplerConfig, args: argparse.Namespace, headers: dict[str, str], answer: _Answer
) -> int:
    console = Console()
    items: list[ConversationItem] = [System(args.system)] if args.system else []
    async with open_sampler(config) as handle:
        if args.prompt is not None:
            items.append(User(args.prompt))
            terminal = await _turn(handle, items, console, args.json, headers)
            return 0 if isinstance(terminal, Completed) else 1
        interactive = sys.stdin.isatty()
        status = 0
        while True:
            if interactive:
                console.out.write(console.style("you> ", "bold"))
                console.out.flush()
            # Abandoned on cancel (Ctrl-C): a blocked read must not hold the command open.
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                return status
            if not line.strip():
                continue
            items.append(User(line.rstrip("\n")))
            terminal = None
            # At a terminal, Ctrl-C while the answer streams ends only the answer.
            with trio.CancelScope() as scope:
                answer.scope = scope if interactive else None
                terminal = await _turn(handle, items, console, args.json, headers)
            answer.scope = None
            if scope.cancelled_caught:
                console.out.write("\n")
                console.out.flush()
                print(
                    "trio-sampler chat: answer interrupted (Ctrl-C again quits)",
                    file=sys.stderr,
                    flush=True,
                )
            if isinstance(terminal, Completed):
                items.extend(terminal.response.items)
            else:
                items.pop()  # keep the conversation valid to resubmit
                status = 1
