"""``trio-sampler demo``: three protocols, one vocabulary, live, in about a minute.

With no arguments it starts the embedded emulator and runs, concurrently and in ONE
sampler actor, an agent conversation on each backend:

* Chat Completions: thinks, calls the calculator, meets a scripted 429 (the ``Retrying``
  is shown), and answers.
* Responses: searches the web (a hosted tool), reads a file with a local tool, answers.
* Messages: thinks, lists a directory, then starts a long answer that is cancelled
  mid-stream: its partial output is shown.

It ends with a table per backend and exits 0 when everything behaved as expected. With
``--provider`` / ``--base-url`` / ``--model`` it runs one conversation against a real
endpoint instead.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

from ..actor import SamplerHandle, open_sampler
from ..agent import AgentResult, AgentStop, builtin_tools, process_conversation_turn
from ..config import RetryPolicy, SamplerConfig, Timeouts
from ..types import (
    ApiBackend,
    BackendToolCallCompleted,
    BackendToolCallStarted,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    Failed,
    ReasoningEffort,
    Retrying,
    SamplingChannel,
    SamplingEvent,
    System,
    ToolCallDelta,
    User,
)
from ..wire import backend_name
from ._console import Console
from ._errors import run_interruptibly

__all__ = ["add_parser"]

# A long system prompt, so the second step of each conversation is served partly from
# the emulator's prompt cache (caching starts at 1,024 tokens).
SYSTEM = (
    "You are a careful assistant running inside the trio_sampler demo. "
    + "Answer briefly, use the tools you are given, and say what you did. " * 80
)

CANCEL_AFTER_TOKENS = 12


@attrs.define
class Scene:
    label: str
    backend: ApiBackend | str
    model: str
    prompt: str
    script: dict[str, Any]
    expected: AgentStop
    expect_retry: bool = False
    cancel_after_tokens: int | None = None
    # Filled while running:
    answer_tokens: int = 0
    retries: int = 0
    attempts: int = 0
    ttft_ms: float | None = None
    cost_ticks: int = 0
    result: AgentResult | None = None
    tool_names: dict[int, str] = attrs.field(factory=dict)


def scenes() -> list[Scene]:
    return [
        Scene(
            label="chat_completions",
            backend=ApiBackend.CHAT_COMPLETIONS,
            model="gpt-4o-mini",
            prompt="What is 17 × 23 + 4?",
            script={
                "reasoning": "The user wants arithmetic. I will use the calculator tool.",
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "17 * 23 + 4"}}],
                "after_tool_result": {
                    "reasoning": "The calculator says 395.",
                    "text": "17 × 23 + 4 = 395 (checked with the calculator).",
                },
                "chunk_chars": 6,
                "delay_ms": 40,
                "scenario": "demo-chat",
                "faults": [{"type": "status", "status": 429, "retry_after": 0.8, "times": 1}],
            },
            expected=AgentStop.FINAL_ANSWER,
            expect_retry=True,
        ),
        Scene(
            label="responses",
            backend=ApiBackend.RESPONSES,
            model="gpt-5-mini",
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
                    "text": "notes.txt says: every request ends with exactly one terminal event.",
                },
                "chunk_chars": 7,
                "delay_ms": 45,
                "scenario": "demo-responses",
            },
            expected=AgentStop.FINAL_ANSWER,
        ),
        Scene(
            label="messages",
            backend=ApiBackend.MESSAGES,
            model="claude-sonnet-4-5",
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
            expected=AgentStop.CANCELLED,
            cancel_after_tokens=CANCEL_AFTER_TOKENS,
        ),
    ]


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="see the library work: three protocols, tools, a retry and a cancel (no keys)",
        description=(
            "Start the embedded emulator and run, concurrently in one sampler, an agent "
            "conversation on each backend: live tokens (thinking apart from the answer), "
            "tool calls assembled and executed, a scripted 429 and its retry, a cancel with "
            "its partial output, and a table of the numbers. With --provider/--base-url/"
            "--model, run one conversation against a real endpoint instead."
        ),
    )
    parser.add_argument("--provider", help="a provider profile (openai, anthropic, xai, ...)")
    parser.add_argument("--base-url", help="an endpoint speaking one of the three protocols")
    parser.add_argument("--model", help="the model to use against a real endpoint")
    parser.add_argument(
        "--backend", choices=[b.value for b in ApiBackend], help="protocol of --base-url"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.provider or args.base_url:
        from ._chat import config_from_args

        try:
            config = config_from_args(args)
        except ValueError as exc:
            console.line("", f"trio-sampler demo: {exc}", "red")
            return 2
        return run_interruptibly(_real_endpoint, config, console)
    return run_interruptibly(_emulated, console)


# -- event rendering ------------------------------------------------------------------


async def _show(
    scene: Scene, console: Console, handle: SamplerHandle, event: SamplingEvent
) -> None:
    label = scene.label
    if isinstance(event, ChannelToken):
        if event.channel is SamplingChannel.REASONING:
            console.stream(label, "thinking", event.text, "dim")
        else:
            console.stream(label, "answer", event.text, "cyan")
            scene.answer_tokens += 1
            if (
                scene.cancel_after_tokens is not None
                and scene.answer_tokens == scene.cancel_after_tokens
            ):
                console.flush_label(label)
                console.line(label, "✂ cancelling this request mid-stream", "yellow")
                await handle.cancel(event.request_id, "cancelled by the demo")
    elif isinstance(event, ToolCallDelta):
        if event.name:
            scene.tool_names[event.tool_index] = event.name
            console.flush_label(label)
            console.line(label, f"tool call #{event.tool_index}: {event.name}(", "magenta")
        if event.arguments_delta:
            console.stream(label, "  args", event.arguments_delta, "magenta")
    elif isinstance(event, BackendToolCallStarted):
        console.flush_label(label)
        console.line(label, f"server tool {event.name} started", "blue")
    elif isinstance(event, BackendToolCallCompleted):
        console.line(label, f"server tool {event.name} completed", "blue")
    elif isinstance(event, Retrying):
        scene.retries += 1
        console.flush_label(label)
        console.line(
            label,
            f"↻ retrying (attempt {event.attempt}/{event.max_retries}) in {event.delay:.1f} s: "
            f"{event.kind.value}: {event.reason}",
            "yellow",
        )
    elif isinstance(event, Completed | Failed | Cancelled):
        console.flush_label(label)
        metrics = event.metrics
        if metrics is not None:
            scene.attempts += len(metrics.attempts)
            if scene.ttft_ms is None:
                scene.ttft_ms = metrics.time_to_first_token_ms
        if isinstance(event, Completed):
            scene.cost_ticks += event.response.cost_usd_ticks or 0
            for call in event.response.tool_calls:
                console.line(label, f"→ run {call.name}({call.arguments})", "magenta")
        elif isinstance(event, Failed):
            console.line(label, f"✗ failed: {event.error}", "red")


# -- the emulated demo ----------------------------------------------------------------


async def _run_scene(
    scene: Scene, handle: SamplerHandle, base: SamplerConfig, root: Path, console: Console
) -> None:
    from ..emulator import script_headers

    config = attrs.evolve(base, backend=scene.backend, model=scene.model)
    request = ConversationRequest(
        items=[System(SYSTEM), User(scene.prompt)],
        reasoning_effort=ReasoningEffort.LOW,
        extra_headers=script_headers(**scene.script),
    )
    console.line(scene.label, f"user: {scene.prompt}", "bold")
    scene.result = await process_conversation_turn(
        handle,
        request,
        tools=builtin_tools(root),
        config=config,
        on_event=functools.partial(_show, scene, console, handle),
        max_steps=4,
    )
    result = scene.result
    if result.stop is AgentStop.CANCELLED:
        partial = result.final_text
        console.line(
            scene.label,
            f"cancelled; partial output kept ({len(partial)} chars): {partial[:70]!r}…",
            "yellow",
        )
    else:
        console.line(scene.label, f"done: {result.message}", "green")


async def _emulated(console: Console) -> int:
    from ..emulator import serve

    with tempfile.TemporaryDirectory(prefix="trio-sampler-demo-") as tmp:
        root = Path(tmp)
        (root / "notes.txt").write_text(
            "trio_sampler: every request ends with exactly one terminal event.\n"
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve)
            console.line(
                "", f"embedded emulator at {server.base_url} (no network, no keys)", "bold"
            )
            base = SamplerConfig(
                base_url=server.base_url,
                backend=ApiBackend.CHAT_COMPLETIONS,
                model="emulator-1",
                api_key="sk-demo-not-a-real-key",
                retry=RetryPolicy(max_retries=3, base_delay=0.2),
                timeouts=Timeouts(first_token=30, idle=10),
            )
            all_scenes = scenes()
            async with open_sampler(base) as handle, trio.open_nursery() as runs:
                for scene in all_scenes:
                    runs.start_soon(_run_scene, scene, handle, base, root, console)
            nursery.cancel_scope.cancel()
    return _summary(all_scenes, console)


def _summary(all_scenes: list[Scene], console: Console) -> int:
    console.line("", "")
    header = (
        f"{'backend':<17} {'ttft ms':>8} {'in':>6} {'out':>5} {'cached':>6} "
        f"{'cost $':>9} {'attempts':>8}  outcome"
    )
    console.line("", header, "bold")
    ok = True
    for scene in all_scenes:
        result = scene.result
        assert result is not None
        usage = result.usage
        ttft = f"{scene.ttft_ms:.0f}" if scene.ttft_ms is not None else "-"
        behaved = result.stop is scene.expected and (scene.retries > 0) == scene.expect_retry
        if scene.cancel_after_tokens is not None:
            behaved = behaved and bool(result.final_text)
        ok = ok and behaved
        outcome = result.stop.value + ("" if behaved else "  (UNEXPECTED)")
        console.line(
            "",
            f"{scene.label:<17} {ttft:>8} {usage.input_tokens:>6} {usage.output_tokens:>5} "
            f"{usage.cache_read_tokens:>6} {scene.cost_ticks / 1e10:>9.6f} "
            f"{scene.attempts:>8}  {outcome}",
            "green" if behaved else "red",
        )
    console.line(
        "",
        "everything behaved as expected" if ok else "something misbehaved",
        "green" if ok else "red",
    )
    return 0 if ok else 1


# -- a real endpoint --------------------------------------------------------------------


async def _real_endpoint(config: SamplerConfig, console: Console) -> int:
    scene = Scene(
        label=backend_name(config.backend),
        backend=config.backend,
        model=config.model or "",
        prompt="Use the calculator to compute 17 * 23 + 4, then answer in one sentence.",
        script={},
        expected=AgentStop.FINAL_ANSWER,
    )
    console.line("", f"endpoint {config.base_url} ({backend_name(config.backend)}, {config.model})")
    with tempfile.TemporaryDirectory() as tmp:
        async with open_sampler(config) as handle:
            request = ConversationRequest(items=[User(scene.prompt)])
            console.line(scene.label, f"user: {scene.prompt}", "bold")
            scene.result = await process_conversation_turn(
                handle,
                request,
                tools=builtin_tools(Path(tmp)),
                on_event=functools.partial(_show, scene, console, handle),
                max_steps=4,
            )
    console.line(scene.label, scene.result.message)
    return _summary([scene], console)
