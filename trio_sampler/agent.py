"""A reference agent loop on top of the bridge: sample, run tools, resubmit, until done.

:func:`process_conversation_turn` runs one user turn to its end:

1. submit the conversation through :func:`~trio_sampler.bridge.run_turn_via_sampler`;
2. on a response, append its items (reasoning, hosted-tool calls and the assistant item,
   in order), run each requested tool call through a :class:`ToolRegistry`, append the
   :class:`~trio_sampler.types.ToolResult` items and resubmit; a response without tool
   calls is the final answer;
3. on a context overflow, shrink the conversation with the caller's ``compact`` and
   resubmit; on an auth failure, get a fresh config from ``refresh_credentials`` and
   resubmit; both are bounded;
4. stop with a clear :class:`AgentResult` on the final answer, the step limit, a fatal
   error or a cancel.

Tools never crash the loop: an unknown tool, arguments that are not a JSON object, a
missing or unexpected argument and any exception a tool raises all become a
``ToolResult(is_error=True)`` the model can read and react to.

:func:`builtin_tools` gives three safe local tools: ``read_file`` and ``list_directory``
confined to a root directory, and ``calculate`` (arithmetic through :mod:`ast`, no
``eval``). There is deliberately no shell tool.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import attrs

from .bridge import (
    EventCallback,
    TurnCancelled,
    TurnCompactAndResubmit,
    TurnFatal,
    TurnRefreshAuthAndResubmit,
    TurnResponse,
    run_turn_via_sampler,
)
from .types import (
    ConversationItem,
    ConversationRequest,
    ConversationResponse,
    SamplingErrorInfo,
    SamplingErrorKind,
    Usage,
)

if TYPE_CHECKING:
    from .actor import SamplerHandle
    from .config import SamplerConfig
    from .telemetry import GenAITelemetry

from .tools import CalculationError as CalculationError
from .tools import ToolError as ToolError
from .tools import ToolRegistry as ToolRegistry
from .tools import builtin_tools as builtin_tools
from .tools import calculate as calculate

__all__ = [
    "AgentResult",
    "AgentStop",
    "CalculationError",
    "ToolError",
    "ToolRegistry",
    "builtin_tools",
    "calculate",
    "process_conversation_turn",
]

Compactor: TypeAlias = Callable[
    [tuple[ConversationItem, ...]], Awaitable[Sequence[ConversationItem]]
]


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------


class AgentStop(enum.Enum):
    """Why :func:`process_conversation_turn` returned."""

    #: The model answered without asking for tools.
    FINAL_ANSWER = "final_answer"
    #: ``max_steps`` responses were sampled and the model still wanted tools.
    STEP_LIMIT = "step_limit"
    #: The context overflowed and no compaction was possible (none given, or the limit).
    CONTEXT_OVERFLOW = "context_overflow"
    #: Authentication failed and could not be refreshed (no refresher, or the limit).
    AUTH_FAILED = "auth_failed"
    #: Any other failure.
    FAILED = "failed"
    #: The request was cancelled from elsewhere (e.g. sampler shutdown).
    CANCELLED = "cancelled"


@attrs.frozen
class AgentResult:
    """The end of a turn: why it stopped, the whole conversation, and what it cost."""

    stop: AgentStop
    #: The full conversation: the request's items (compacted, if that happened) followed
    #: by every response item and tool result of this turn. Resubmittable as it is.
    items: tuple[ConversationItem, ...]
    #: The last response (or partial output) received, if any.
    response: ConversationResponse | None = None
    error: SamplingErrorInfo | None = None
    #: Responses sampled (each one a step).
    steps: int = 0
    #: Usage summed over every request of the turn (partial outputs included).
    usage: Usage = attrs.field(factory=Usage)
    compactions: int = 0
    auth_refreshes: int = 0
    #: The config in use at the end (the last refreshed one), to keep using it.
    config: SamplerConfig | None = None

    @property
    def final_text(self) -> str:
        """The model's last text (the answer, on ``FINAL_ANSWER``)."""
        return self.response.text if self.response is not None else ""

    @property
    def message(self) -> str:
        """One sentence for a log or a user: why the turn ended."""
        if self.stop is AgentStop.FINAL_ANSWER:
            return f"answered after {self.steps} step(s)"
        if self.stop is AgentStop.STEP_LIMIT:
            return (
                f"stopped at the step limit ({self.steps} steps) while the model still "
                "asked for tools; raise max_steps or continue the conversation"
            )
        detail = f": {self.error}" if self.error is not None else ""
        return f"{self.stop.value}{detail}"


def _add_usage(total: Usage, response: ConversationResponse | None) -> Usage:
    if response is None or response.usage is None:
        return total
    u = response.usage
    return Usage(
        input_tokens=total.input_tokens + u.input_tokens,
        output_tokens=total.output_tokens + u.output_tokens,
        cache_read_tokens=total.cache_read_tokens + u.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + u.cache_write_tokens,
        reasoning_tokens=total.reasoning_tokens + u.reasoning_tokens,
    )


def _with_tools(request: ConversationRequest, tools: ToolRegistry) -> ConversationRequest:
    # Tools already on the request stay (and win on a name clash): the caller said so.
    present = {spec.name for spec in request.tools}
    extra = tuple(spec for spec in tools.specs() if spec.name not in present)
    return attrs.evolve(request, tools=request.tools + extra) if extra else request


async def process_conversation_turn(
    handle: SamplerHandle,
    request: ConversationRequest,
    *,
    tools: ToolRegistry,
    compact: Compactor | None = None,
    refresh_credentials: Callable[[], Awaitable[SamplerConfig]] | None = None,
    max_steps: int = 8,
    max_auth_refreshes: int = 2,
    max_compactions: int = 2,
    on_event: EventCallback | None = None,
    config: SamplerConfig | None = None,
    telemetry: GenAITelemetry | None = None,
) -> AgentResult:
    """Run the agent loop for one turn of ``request`` until a final answer or a limit.

    Args:
        handle: the running sampler.
        request: the conversation so far; the registry's tools are added to its ``tools``.
        tools: the local tools the model may call.
        compact: ``async compact(items) -> items`` shrinks the conversation when the
            context overflows; without it an overflow ends the turn (``CONTEXT_OVERFLOW``).
        refresh_credentials: ``async refresh() -> SamplerConfig`` gives a config with fresh
            credentials, used for every later submit; without it an auth failure ends the
            turn (``AUTH_FAILED``).
        max_steps: responses to sample at most. When the last allowed response still asks
            for tools, they are run and their results appended (so the conversation stays
            valid to resubmit), then the turn stops with ``STEP_LIMIT``.
        max_auth_refreshes: refreshes in a row (reset by a successful response).
        max_compactions: compactions in a row (reset by a successful response).
        on_event: forwarded to the bridge: every event of every request, in order.
        config: the config for the first submit (else the sampler's).
        telemetry: forwarded to the bridge (GenAI spans and metrics).

    Tool calls of one response run one after another, in the order the model gave them
    (tools may have side effects the next call depends on). Exceptions from ``compact`` or
    ``refresh_credentials`` propagate: they are the caller's code. Cancelling the calling
    task cancels the request in flight.
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    request = _with_tools(request, tools)
    items: tuple[ConversationItem, ...] = request.items
    usage = Usage()
    steps = compactions = auth_refreshes = 0
    compactions_in_row = refreshes_in_row = 0

    def result(
        stop: AgentStop,
        response: ConversationResponse | None = None,
        error: SamplingErrorInfo | None = None,
    ) -> AgentResult:
        return AgentResult(
            stop, items, response, error, steps, usage, compactions, auth_refreshes, config
        )

    while True:
        outcome = await run_turn_via_sampler(
            handle,
            attrs.evolve(request, items=items),
            on_event=on_event,
            refresh_credentials=refresh_credentials,
            config=config,
            telemetry=telemetry,
        )
        if isinstance(outcome, TurnResponse):
            response = outcome.response
            steps += 1
            compactions_in_row = refreshes_in_row = 0
            usage = _add_usage(usage, response)
            items = items + response.items
            if not response.tool_calls:
                return result(AgentStop.FINAL_ANSWER, response)
            results = [await tools.execute(call) for call in response.tool_calls]
            items = items + tuple(results)
            if steps >= max_steps:
                return result(AgentStop.STEP_LIMIT, response)
        elif isinstance(outcome, TurnCompactAndResubmit):
            usage = _add_usage(usage, outcome.partial)
            if compact is None or compactions_in_row >= max_compactions:
                return result(AgentStop.CONTEXT_OVERFLOW, outcome.partial, outcome.error)
            items = tuple(await compact(items))
            compactions += 1
            compactions_in_row += 1
        elif isinstance(outcome, TurnRefreshAuthAndResubmit):
            if refresh_credentials is None or refreshes_in_row >= max_auth_refreshes:
                return result(AgentStop.AUTH_FAILED, None, outcome.error)
            config = await refresh_credentials()
            auth_refreshes += 1
            refreshes_in_row += 1
        elif isinstance(outcome, TurnFatal):
            usage = _add_usage(usage, outcome.partial)
            auth = outcome.error.kind is SamplingErrorKind.AUTH
            stop = AgentStop.AUTH_FAILED if auth else AgentStop.FAILED
            return result(stop, outcome.partial, outcome.error)
        else:
            assert isinstance(outcome, TurnCancelled)
            usage = _add_usage(usage, outcome.partial)
            return result(AgentStop.CANCELLED, outcome.partial)
