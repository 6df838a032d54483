"""``trio-sampler record PROMPT --out FILE``: one live exchange, written to a cassette.

The request goes out as ``chat`` sends it (same options); the answer streams to stdout, and
the exchange (request, status, headers without credentials, the raw body read by read with
its arrival times) is appended to the cassette, which ``replay``, ``serve --cassette``,
:class:`~trio_sampler.recording.ReplayTransport` and the pytest fixture serve back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import trio

from ..actor import open_sampler
from ..config import SamplerConfig
from ..recording import RecordingTransport
from ..types import ChannelToken, Completed, ConversationRequest, Failed, SamplingChannel, User
from ._chat import add_endpoint_arguments, config_from_args, headers_from_args
from ._errors import UsageError, run_interruptibly

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "record",
        help="send one prompt and record the exchange to a cassette",
        description=(
            "Send PROMPT as `chat` does and append the exchange to the cassette --out (created "
            "if missing): the request, the status, the headers with credentials removed, and "
            "the raw body with each read's arrival time. `replay`, `serve --cassette` and "
            "trio_sampler.recording.ReplayTransport serve it back."
        ),
    )
    parser.add_argument("prompt", help="the prompt")
    parser.add_argument("--out", "-o", required=True, help="the cassette file to append to")
    add_endpoint_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    headers = headers_from_args(args)
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise UsageError(f"--out {args.out}: not a file in an existing directory")
    return run_interruptibly(_record, config, args, headers, out)


async def _record(
    config: SamplerConfig, args: argparse.Namespace, headers: dict[str, str], out: Path
) -> int:
    transport = RecordingTransport(out)
    items = [User(args.prompt)]
    request = ConversationRequest(items=items, extra_headers=headers)
    terminal: Completed | Failed | None = None
    async with open_sampler(config, transport=transport) as sampler:
        stream = await sampler.submit(request)
        async with stream:
            async for event in stream:
                if isinstance(event, ChannelToken) and event.channel is SamplingChannel.TEXT:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Completed | Failed):
                    terminal = event
    await trio.lowlevel.checkpoint()
    sys.stdout.write("\n")
    count = len(transport.recorded)
    print(f"trio-sampler record: {count} exchange(s) recorded to {out}", file=sys.stderr)
    if isinstance(terminal, Failed):
        print(f"trio-sampler record: {terminal.error}", file=sys.stderr)
        return 1
    return 0 if isinstance(terminal, Completed) else 1
