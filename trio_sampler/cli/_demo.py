"""``trio-sampler demo``: three protocols, one vocabulary, live, in a few seconds.

With no arguments it starts the embedded emulator and runs, concurrently and in ONE
sampler, an agent conversation on each protocol, each in its own lane:

* Chat Completions: meets a scripted HTTP 429 (its ``Retrying`` is shown), thinks, calls
  the calculator, and answers.
* Responses: thinks, searches the web (a tool the server runs), reads a file with a local
  tool, and answers.
* Messages: thinks, lists a directory, then starts a long answer that the demo cancels
  mid-stream: the partial answer the library keeps is shown.

It ends with a table of the numbers, every column explained, and exits 0 when everything
behaved as expected. With ``--provider`` / ``--base-url`` / ``--model`` it runs one
conversation against a real endpoint instead.

The demo is written against the public API (``open_sampler``, ``process_conversation_turn``,
the events) and doubles as an example of it. This module holds what happens (the scenes,
the runs, the command); ``_demo_lanes`` what each conversation has shown so far, updated
from its events; ``_demo_view`` draws it, live on a terminal with ``rich`` or as plain
lines.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from ..actor import SamplerHandle, open_sampler
from ..agent import AgentStop, ToolRegistry, builtin_tools, process_conversation_turn
from ..config import RetryPolicy, SamplerConfig, Timeouts
from ..types import (
    ApiBackend,
    ChannelToken,
    ConversationItem,
    ConversationRequest,
    ReasoningEffort,
    SamplingChannel,
    SamplingEvent,
    System,
    ToolCall,
    ToolResult,
    ToolSpec,
    User,
)
from ..wire import build_request
from ._demo_lanes import Lane, Scene, View
from ._errors import backend_choice, run_interruptibly, url

__all__ = [
    "add_parser",
    "emulator_config",
    "lanes_for",
    "run_scenes",
    "scenes",
    "write_workspace",
]

# A long system prompt, so the second step of each conversation is served partly from
# the emulator's prompt cache (caching starts at 1,024 tokens).
SYSTEM = (
    "You are a careful assistant running inside the trio_sampler demo. "
    + "Answer briefly, use the tools you are given, and say what you did. " * 80
)

#: The Messages conversation is cancelled after this many answer chunks.
CANCEL_AFTER_CHUNKS = 12


def scenes() -> list[Scene]:
    """The three conversations of the emulated demo, one per protocol."""
    return [
        Scene(
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="deepseek-flash",
            prompt="What is 17 × 23 + 4?",
            script={
                "reasoning": "The user wants arithmetic. I will use the calculator tool.",
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "17 * 23 + 4"}}],
                "after_tool_result": {
                    "reasoning": "The calculator says 395.",
                    "text": "17 × 23 + 4 = 395, checked with the calculator.",
                },
                "chunk_chars": 6,
                "delay_ms": 40,
                "scenario": "demo-chat",
                "faults": [{"type": "status", "status": 429, "retry_after": 0.8, "times": 1}],
            },
            scripted="HTTP 429 once, Retry-After 0.8 s",
            expect_retry=True,
        ),
        Scene(
            backend=ApiBackend.RESPONSES,
            model="gpt-6-luna",
            prompt="Search the web for trio, then summarize notes.txt.",
            script={
                "reasoning": "First a web search, then I read the notes file.",
                "hosted_tool": {
                    "name": "web_search",
                    "query": "python trio structured concurrency",
                },
                "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
                "after_tool_result": {
                    "reasoning": "The file is short; I can summarize it.",
                    "text": "notes.txt says that every request ends with exactly one terminal "
                    "event, whatever happens.",
                },
                "chunk_chars": 7,
                "delay_ms": 45,
                "scenario": "demo-responses",
            },
            scripted="a web search run by the server",
            expect_retry=False,
        ),
        Scene(
            backend=ApiBackend.MESSAGES,
            model="claude-sonnet-5-5",
            prompt="List the files here, then write a long essay about them.",
            script={
                "reasoning": "I should look at the directory before writing.",
                "tool_calls": [{"name": "list_directory", "arguments": {"path": "."}}],
                "after_tool_result": {
                    "reasoning": "One file. Time to write.",
                    "text": "The directory holds notes.txt. "
                    + "An essay on structured concurrency follows, at great length. " * 20,
                },
                "chunk_chars": 8,
                "delay_ms": 50,
                "scenario": "demo-messages",
            },
            scripted=f"a long answer, cancelled after {CANCEL_AFTER_CHUNKS} chunks",
            expected=AgentStop.CANCELLED,
            expect_retry=False,
            cancel_after_chunks=CANCEL_AFTER_CHUNKS,
        ),
    ]


class _ShownTools(ToolRegistry):
    """The registry the agent loop runs tools through, showing each call and its result."""

    def __init__(self, tools: ToolRegistry, lane: Lane) -> None:
        super().__init__(max_result_chars=tools.max_result_chars)
        self._inner = tools
        self._lane = lane

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._inner.specs()

    async def execute(self, call: ToolCall) -> ToolResult:
        self._lane.tool_running(call)
        result = await self._inner.execute(call)
        self._lane.tool_ran(call, result)
        return result


# -- running the conversations ----------------------------------------------------------


def endpoint(config: SamplerConfig) -> str:
    """``POST /v1/messages``: where ``config``'s requests go."""
    wire = build_request(
        config.backend, ConversationRequest(items=[User("?")]), config.build_options()
    )
    base = urlsplit(config.base_url).path.rstrip("/")
    return f"{wire.method} {base}{wire.path}"


async def _show(lane: Lane, handle: SamplerHandle, event: SamplingEvent) -> None:
    lane.on_event(event)
    limit = lane.scene.cancel_after_chunks
    if (
        isinstance(event, ChannelToken)
        and event.channel is SamplingChannel.TEXT
        and limit is not None
        and lane.answer_chunks == limit
    ):
        await handle.cancel(event.request_id, "cancelled by the demo")


async def _converse(
    lane: Lane, handle: SamplerHandle, config: SamplerConfig, tools: ToolRegistry, system: str
) -> None:
    from ..emulator import script_headers

    scene = lane.scene
    items: list[ConversationItem] = [System(system)] if system else []
    items.append(User(scene.prompt))
    request = ConversationRequest(
        items=items,
        reasoning_effort=ReasoningEffort.LOW,
        extra_headers=script_headers(**scene.script) if scene.script else {},
    )
    lane.start()
    result = await process_conversation_turn(
        handle,
        request,
        tools=_ShownTools(tools, lane),
        config=config,
        on_event=functools.partial(_show, lane, handle),
        max_steps=4,
    )
    lane.finish(result)


async def run_scenes(
    lanes: list[Lane], config: SamplerConfig, root: Path, *, system: str = SYSTEM
) -> None:
    """Run every lane's conversation concurrently in one sampler (``config``'s defaults;
    each scene picks its protocol and model), with the local tools confined to ``root``."""
    tools = builtin_tools(root)
    async with open_sampler(config) as handle, trio.open_nursery() as nursery:
        for lane in lanes:
            lane_config = scene_config(config, lane.scene)
            lane.endpoint = endpoint(lane_config)
            nursery.start_soon(_converse, lane, handle, lane_config, tools, system)


def scene_config(config: SamplerConfig, scene: Scene) -> SamplerConfig:
    """``config`` with the scene's protocol and model."""
    return attrs.evolve(config, backend=scene.backend, model=scene.model)


def lanes_for(scenes: list[Scene], config: SamplerConfig) -> list[Lane]:
    """A lane for each scene, knowing where its requests go."""
    return [Lane(scene, endpoint=endpoint(scene_config(config, scene))) for scene in scenes]


def emulator_config(base_url: str) -> SamplerConfig:
    """The sampler's defaults for the emulated demo (a fast retry policy)."""
    return SamplerConfig(
        base_url=base_url,
        backend=ApiBackend.CHAT_COMPLETIONS,
        model="emulator-1",
        api_key="sk-demo-not-a-real-key",
        retry=RetryPolicy(max_retries=3, base_delay=0.2),
        timeouts=Timeouts(first_token=30, idle=10),
    )


def write_workspace(root: Path) -> None:
    """The files the demo's local tools see."""
    (root / "notes.txt").write_text(
        "trio_sampler: every request ends with exactly one terminal event.\n", encoding="utf-8"
    )


async def _emulated(view: View) -> int:
    from ..emulator import serve

    with tempfile.TemporaryDirectory(prefix="trio-sampler-demo-") as tmp:
        root = Path(tmp)
        write_workspace(root)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve)
            config = emulator_config(server.base_url)
            lanes = lanes_for(scenes(), config)
            header = (
                f"trio_sampler demo: three conversations at once in one sampler, one per "
                f"protocol, on the embedded emulator at {server.base_url} (no network, no keys)"
            )
            await view.run(
                lanes,
                functools.partial(run_scenes, lanes, config, root),
                header,
            )
            nursery.cancel_scope.cancel()
    return 0 if all(lane.behaved for lane in lanes) else 1


async def _real_endpoint(config: SamplerConfig, view: View) -> int:
    scene = Scene(
        backend=config.backend,
        model=config.model or "",
        prompt="Use the calculator to compute 17 * 23 + 4, then answer in one sentence.",
    )
    lanes = lanes_for([scene], config)
    header = f"trio_sampler demo: one conversation with {config.base_url} ({config.model})"
    with tempfile.TemporaryDirectory(prefix="trio-sampler-demo-") as tmp:
        work = functools.partial(run_scenes, lanes, config, Path(tmp), system="")
        await view.run(lanes, work, header)
    return 0 if lanes[0].behaved else 1


# -- the command ------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="see the library work: three protocols, tools, a retry and a cancel (no keys)",
        description=(
            "Start the embedded emulator and run, concurrently in one sampler, an agent "
            "conversation on each protocol, each in its own lane: live tokens (thinking "
            "apart from the answer), tool calls with their results, a scripted 429 and its "
            "retry, a cancel with its kept partial answer, and a table of the numbers, every "
            "column explained. On a terminal the lanes are drawn live (side by side when it "
            "is wide enough); otherwise, or with --plain, each line is printed once, whole, "
            "prefixed with its lane. With --provider/--base-url/--model, run one "
            "conversation against a real endpoint instead."
        ),
    )
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.add_argument("--provider", help="a provider profile (openai, anthropic, xai, ...)")
    parser.add_argument(
        "--base-url", type=url, help="an endpoint speaking one of the three protocols"
    )
    parser.add_argument("--model", help="the model to use against a real endpoint")
    parser.add_argument(
        "--backend",
        type=backend_choice,
        choices=[b.value for b in ApiBackend],
        help="protocol of --base-url",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ._demo_view import choose_view

    view = choose_view(plain=args.plain)
    if args.provider or args.base_url:
        from ._chat import config_from_args

        config = config_from_args(args)  # a UsageError is one line, exit status 2
        return run_interruptibly(_real_endpoint, config, view)
    return run_interruptibly(_emulated, view)
