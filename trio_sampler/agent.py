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
4. stop with a clear :class:`AgentResult` on the final answer, the step limit, a spent
   :class:`TurnBudget` (time, tokens, dollars, steps), a fatal error or a cancel.

An :class:`AgentTurn` is the turn as a unit: ``await turn.run()`` runs it, ``turn.cancel()``
(from any task) ends it with its partial answer and usage, and ``turn.result`` holds the
result even when a cancel scope around ``run()`` took the call away.

Tools never crash the loop: an unknown tool, arguments that are not a JSON object, a
missing or unexpected argument and any exception a tool raises all become a
``ToolResult(is_error=True)`` the model can read and react to.

:func:`builtin_tools` gives three safe local tools: ``read_file`` and ``list_directory``
confined to a root directory, and ``calculate`` (arithmetic through :mod:`ast`, no
``eval``). There is deliberately no shell tool.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import trio

from .bridge import (
    EventCallback,
    SamplerTurnOutcome,
    TurnCancelled,
    TurnCompactAndResubmit,
    TurnFatal,
    TurnRefreshAuthAndResubmit,
    TurnResponse,
    follow_turn,
    submit_turn,
)
from .models import TICKS_PER_USD
from .types import (
    Cancelled,
    ConversationItem,
    ConversationRequest,
    ConversationResponse,
    SamplingErrorInfo,
    SamplingErrorKind,
    ToolCall,
    ToolResult,
    Usage,
)

if TYPE_CHECKING:
    from .actor import RequestStream, SamplerHandle
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
    "AgentTurn",
    "CalculationError",
    "ToolError",
    "ToolRegistry",
    "TurnBudget",
    "builtin_tools",
    "calculate",
    "process_conversation_turn",
]

Compactor: TypeAlias = Callable[
    [tuple[ConversationItem, ...]], Awaitable[Sequence[ConversationItem]]
]


# ---------------------------------------------------------------------------
# What ends a turn
# ---------------------------------------------------------------------------


class AgentStop(enum.Enum):
    """Why a turn ended (:attr:`AgentResult.stop`)."""

    #: The model answered without asking for tools.
    FINAL_ANSWER = "final_answer"
    #: ``max_steps`` (or the budget's ``steps``) responses were sampled and the model still
    #: wanted tools.
    STEP_LIMIT = "step_limit"
    #: The budget's ``seconds`` ran out (the request in flight was cut; its partial kept).
    TIME_BUDGET = "time_budget"
    #: The budget's ``tokens`` (input + output, over every step) were spent.
    TOKEN_BUDGET = "token_budget"
    #: The budget's ``cost_usd`` was spent.
    COST_BUDGET = "cost_budget"
    #: The context overflowed and no compaction was possible (none given, or the limit).
    CONTEXT_OVERFLOW = "context_overflow"
    #: Authentication failed and could not be refreshed (no refresher, or the limit).
    AUTH_FAILED = "auth_failed"
    #: Any other failure.
    FAILED = "failed"
    #: :meth:`AgentTurn.cancel`, a cancel scope around :meth:`AgentTurn.run`, or the
    #: request cancelled from elsewhere (e.g. sampler shutdown); :attr:`AgentResult.reason`
    #: says which.
    CANCELLED = "cancelled"


def _optional_positive(kind: type | tuple[type, ...], example: str) -> Callable[..., None]:
    def check(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:  # type: ignore[operator]
            raise (TypeError if not isinstance(value, int | float) else ValueError)(
                f"TurnBudget.{attribute.name} must be a number above 0 (or None for no "
                f"limit), e.g. TurnBudget({attribute.name}={example}); got {value!r}"
            )

    return check


@attrs.frozen
class TurnBudget:
    """What one turn may spend; the first limit reached ends it with its :class:`AgentStop`.

    * ``seconds``: wall time of the whole turn, every request and tool included (the
      request in flight is cut at the deadline and its partial kept): ``TIME_BUDGET``;
    * ``tokens``: input + output tokens over every step: ``TOKEN_BUDGET``;
    * ``cost_usd``: dollars over every step (the server's cost, or the model catalog's
      prices): ``COST_BUDGET``;
    * ``steps``: responses sampled (as ``max_steps``; the smaller wins): ``STEP_LIMIT``.

    Tokens and dollars are counted when a response ends, so the step that crosses the limit
    finishes (with its tool calls run, so the conversation stays valid to resubmit).
    """

    seconds: float | None = attrs.field(
        default=None, validator=_optional_positive((int, float), "30.0")
    )
    tokens: int | None = attrs.field(default=None, validator=_optional_positive(int, "50_000"))
    cost_usd: float | None = attrs.field(
        default=None, validator=_optional_positive((int, float), "0.50")
    )
    steps: int | None = attrs.field(default=None, validator=_optional_positive(int, "8"))


@attrs.frozen
class AgentResult:
    """The end of a turn: why it stopped, the whole conversation, and what it cost."""

    stop: AgentStop
    #: The full conversation: the request's items (compacted, if that happened) followed
    #: by every response item and tool result of this turn. Resubmittable as it is (a
    #: tool call a cancel left without a result gets an error result saying so).
    items: tuple[ConversationItem, ...]
    #: The last response (or partial output) received, if any.
    response: ConversationResponse | None = None
    error: SamplingErrorInfo | None = None
    #: Responses sampled (each one a step; a step cut by a cancel does not count).
    steps: int = 0
    #: Usage summed over every request of the turn (partial outputs included).
    usage: Usage = attrs.field(factory=Usage)
    compactions: int = 0
    auth_refreshes: int = 0
    #: The config in use at the end (the last refreshed one), to keep using it.
    config: SamplerConfig | None = None
    #: The route that answered each step, in order (empty without routing).
    routes: tuple[str, ...] = ()
    #: Cost over every request of the turn, in ticks (1 USD = 10**10 ticks).
    cost_usd_ticks: int = 0
    #: Why it was cancelled, or which budget limit was reached.
    reason: str | None = None

    @property
    def final_text(self) -> str:
        """The model's last text (the answer, on ``FINAL_ANSWER``; the partial on a cut)."""
        return self.response.text if self.response is not None else ""

    @property
    def cost_usd(self) -> float:
        """:attr:`cost_usd_ticks` in dollars."""
        return self.cost_usd_ticks / TICKS_PER_USD

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
        if self.reason is not None:
            return f"{self.stop.value}: {self.reason}"
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


# ---------------------------------------------------------------------------
# The turn
# ---------------------------------------------------------------------------


class AgentTurn:
    """One user turn of the agent loop, as a unit that can be run, cancelled and bounded.

    ::

        turn = AgentTurn(sampler, request, tools=tools, budget=TurnBudget(seconds=60))
        nursery.start_soon(watch_for_escape, turn.cancel)
        result = await turn.run()

    The arguments are :func:`process_conversation_turn`'s, plus ``budget`` and
    ``parallel_tools`` (1: tool calls of one step run one after another, in the model's
    order; more: up to that many at once in a nursery, results still in the model's order).

    Ending a turn early keeps what it produced: :meth:`cancel` (from any task) and a spent
    ``budget.seconds`` cut the request in flight and return its partial answer and the
    turn's usage so far; a cancel scope around :meth:`run` (``trio.move_on_after``) takes
    the call away, as it does for any Trio call, but :attr:`result` still holds the same
    partial :class:`AgentResult` afterwards (``stop=CANCELLED``).
    """

    def __init__(
        self,
        handle: SamplerHandle,
        request: ConversationRequest,
        *,
        tools: ToolRegistry,
        budget: TurnBudget | None = None,
        parallel_tools: int = 1,
        compact: Compactor | None = None,
        refresh_credentials: Callable[[], Awaitable[SamplerConfig]] | None = None,
        max_steps: int = 8,
        max_auth_refreshes: int = 2,
        max_compactions: int = 2,
        on_event: EventCallback | None = None,
        config: SamplerConfig | None = None,
        telemetry: GenAITelemetry | None = None,
    ) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if budget is not None and not isinstance(budget, TurnBudget):
            raise TypeError(f"budget must be a TurnBudget(...), not a {type(budget).__name__}")
        if isinstance(parallel_tools, bool) or not isinstance(parallel_tools, int):
            raise TypeError(f"parallel_tools must be an int, e.g. 4; got {parallel_tools!r}")
        if parallel_tools < 1:
            raise ValueError(
                f"parallel_tools must be at least 1 (1: one at a time); got {parallel_tools}"
            )
        self._handle = handle
        self._request = _with_tools(request, tools)
        self._tools = tools
        self._budget = budget or TurnBudget()
        self._parallel_tools = parallel_tools
        self._compact = compact
        self._refresh = refresh_credentials
        self._max_steps = min(max_steps, self._budget.steps or max_steps)
        self._max_auth_refreshes = max_auth_refreshes
        self._max_compactions = max_compactions
        self._on_event = on_event
        self._telemetry = telemetry
        #: The result, once the turn has ended (however it ended).
        self.result: AgentResult | None = None
        # The turn so far (what a cut result is built from).
        self._config = config
        self._items: tuple[ConversationItem, ...] = self._request.items
        self._usage = Usage()
        self._cost_ticks = 0
        self._steps = self._compactions = self._auth_refreshes = 0
        self._routes: list[str] = []
        self._last: ConversationResponse | None = None
        self._stream: RequestStream | None = None
        self._unanswered: tuple[ToolCall, ...] = ()
        self._answered: dict[int, ToolResult] = {}
        self._scope: trio.CancelScope | None = None
        self._cancel_reason: str | None = None
        self._started = False

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """End the turn now, keeping its partial answer and usage (``stop=CANCELLED``).
        Synchronous, from any task of the run; a no-op once the turn has ended."""
        if self.result is not None or self._cancel_reason is not None:
            return
        self._cancel_reason = reason
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> AgentResult:
        """Run the turn to its end and return its :class:`AgentResult` (also kept in
        :attr:`result`). A turn runs once."""
        if self._started:
            raise RuntimeError("an AgentTurn runs once; make a new one for the next turn")
        self._started = True
        seconds = self._budget.seconds
        deadline = trio.current_time() + seconds if seconds is not None else math.inf
        with trio.CancelScope(deadline=deadline) as scope:
            self._scope = scope
            if self._cancel_reason is not None:
                scope.cancel()
            try:
                self.result = await self._loop()
            except trio.Cancelled:
                # Kept for the caller of an enclosing scope; replaced below when the
                # cancel was our own (cancel() or the time budget).
                self.result = self._cut(AgentStop.CANCELLED, "cancelled by a cancel scope")
                raise
        assert self.result is not None
        if scope.cancelled_caught:  # our own cancel: say which
            if self._cancel_reason is not None:
                stop, reason = AgentStop.CANCELLED, self._cancel_reason
            else:
                stop, reason = (
                    AgentStop.TIME_BUDGET,
                    f"the turn's time budget of {seconds:g} s ran out",
                )
            self.result = attrs.evolve(self.result, stop=stop, reason=reason)
        return self.result

    # -- the loop ------------------------------------------------------------------------

    async def _loop(self) -> AgentResult:
        compactions_in_row = refreshes_in_row = 0
        while True:
            outcome = await self._sample()
            self._count(outcome)
            if isinstance(outcome, TurnResponse):
                compactions_in_row = refreshes_in_row = 0
                done = await self._step(outcome)
                if done is not None:
                    return done
            elif isinstance(outcome, TurnCompactAndResubmit):
                if self._compact is None or compactions_in_row >= self._max_compactions:
                    return self._end(AgentStop.CONTEXT_OVERFLOW, outcome.partial, outcome.error)
                self._items = tuple(await self._compact(self._items))
                self._compactions += 1
                compactions_in_row += 1
            elif isinstance(outcome, TurnRefreshAuthAndResubmit):
                if self._refresh is None or refreshes_in_row >= self._max_auth_refreshes:
                    return self._end(AgentStop.AUTH_FAILED, None, outcome.error)
                self._config = await self._refresh()
                self._auth_refreshes += 1
                refreshes_in_row += 1
            elif isinstance(outcome, TurnFatal):
                auth = outcome.error.kind is SamplingErrorKind.AUTH
                stop = AgentStop.AUTH_FAILED if auth else AgentStop.FAILED
                return self._end(stop, outcome.partial, outcome.error)
            else:
                assert isinstance(outcome, TurnCancelled)
                return self._end(AgentStop.CANCELLED, outcome.partial, reason=outcome.reason)

    async def _sample(self) -> SamplerTurnOutcome:
        request = attrs.evolve(self._request, items=self._items)
        self._stream = stream = await submit_turn(self._handle, request, config=self._config)
        outcome = await follow_turn(
            self._handle,
            stream,
            request,
            config=self._config,
            on_event=self._on_event,
            telemetry=self._telemetry,
            can_refresh_auth=self._refresh is not None,
        )
        self._stream = None
        return outcome

    def _count(self, outcome: SamplerTurnOutcome) -> None:
        """Add what ``outcome`` cost to the turn's usage and cost."""
        partial = outcome.response if isinstance(outcome, TurnResponse) else None
        if isinstance(outcome, TurnCompactAndResubmit | TurnFatal | TurnCancelled):
            partial = outcome.partial
        self._usage = _add_usage(self._usage, partial)
        metrics = outcome.metrics
        ticks = metrics.total_cost_usd_ticks if metrics is not None else None
        if ticks is None and partial is not None:
            ticks = partial.cost_usd_ticks
        self._cost_ticks += ticks or 0

    async def _step(self, outcome: TurnResponse) -> AgentResult | None:
        """One answered step: its items, its tools, and whether the turn ends here."""
        response = outcome.response
        self._steps += 1
        self._last = response
        if outcome.metrics is not None and outcome.metrics.route is not None:
            self._routes.append(outcome.metrics.route)
        self._items = self._items + response.items
        if not response.tool_calls:
            return self._end(AgentStop.FINAL_ANSWER, response)
        self._items = self._items + tuple(await self._run_tools(response.tool_calls))
        spent = self._spent()
        if spent is not None:
            return self._end(spent[0], response, reason=spent[1])
        if self._steps >= self._max_steps:
            return self._end(AgentStop.STEP_LIMIT, response)
        return None

    def _spent(self) -> tuple[AgentStop, str] | None:
        """The budget limit reached, if any, with a sentence saying so."""
        budget = self._budget
        tokens = self._usage.input_tokens + self._usage.output_tokens
        if budget.tokens is not None and tokens >= budget.tokens:
            return AgentStop.TOKEN_BUDGET, f"{tokens} tokens spent, the budget is {budget.tokens}"
        if budget.cost_usd is not None and self._cost_ticks >= budget.cost_usd * TICKS_PER_USD:
            spent = self._cost_ticks / TICKS_PER_USD
            return AgentStop.COST_BUDGET, f"${spent:g} spent, the budget is ${budget.cost_usd:g}"
        return None

    async def _run_tools(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The results of ``calls``, in their order; at most ``parallel_tools`` at once."""
        self._unanswered, self._answered = tuple(calls), {}
        if self._parallel_tools == 1:
            for index, call in enumerate(calls):
                self._answered[index] = await self._tools.execute(call)
        else:
            # Started in the model's order: a slot is taken before each call starts.
            slots = trio.Semaphore(self._parallel_tools)

            async def run_one(index: int, call: ToolCall) -> None:
                try:
                    self._answered[index] = await self._tools.execute(call)
                finally:
                    slots.release()

            async with trio.open_nursery() as nursery:
                for index, call in enumerate(calls):
                    await slots.acquire()
                    nursery.start_soon(run_one, index, call)
        results = [self._answered[index] for index in range(len(calls))]
        self._unanswered = ()
        return results

    # -- the end -------------------------------------------------------------------------

    def _end(
        self,
        stop: AgentStop,
        response: ConversationResponse | None = None,
        error: SamplingErrorInfo | None = None,
        *,
        reason: str | None = None,
    ) -> AgentResult:
        return AgentResult(
            stop,
            self._items,
            response,
            error,
            self._steps,
            self._usage,
            self._compactions,
            self._auth_refreshes,
            self._config,
            tuple(self._routes),
            self._cost_ticks,
            reason,
        )

    def _cut(self, stop: AgentStop, reason: str) -> AgentResult:
        """The turn as it stands when cancelled: the request in flight ends with its
        ``Cancelled`` (its partial and usage counted), and a tool call left without a
        result gets an error result, so the conversation stays valid to resubmit."""
        partial = self._last
        stream, self._stream = self._stream, None
        if stream is not None:
            if stream.terminal is None:
                stream.cancel(reason)
            terminal = stream.terminal
            if isinstance(terminal, Cancelled):
                self._count(TurnCancelled(terminal.reason, terminal.partial, terminal.metrics))
                partial = terminal.partial or partial
        if self._unanswered:
            cut = "the turn ended before this tool call finished; it may have run in part"
            self._items = self._items + tuple(
                self._answered.get(index) or ToolResult(call_id=call.id, content=cut, is_error=True)
                for index, call in enumerate(self._unanswered)
            )
            self._unanswered = ()
        return self._end(stop, partial, reason=reason)


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
    budget: TurnBudget | None = None,
    parallel_tools: int = 1,
) -> AgentResult:
    """Run the agent loop for one turn of ``request`` until a final answer or a limit.

    ``AgentTurn(handle, request, ...).run()`` in one call; make the :class:`AgentTurn`
    yourself to cancel the turn from another task or to read its result after a cancel
    scope around it.

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
        config: the config for the first submit (else the sampler's; on a routed sampler
            it stands in for the routes at its endpoint).
        telemetry: forwarded to the bridge (GenAI spans and metrics).
        budget: what the turn may spend (:class:`TurnBudget`: seconds, tokens, dollars,
            steps); the first limit reached ends it with its :class:`AgentStop`.
        parallel_tools: tool calls of one step run at once, at most (1: one after another,
            in the order the model gave them, since tools may have side effects the next
            call depends on).

    Exceptions from ``compact`` or ``refresh_credentials`` propagate: they are the caller's
    code. Cancelling the calling task cancels the request in flight.
    """
    turn = AgentTurn(
        handle,
        request,
        tools=tools,
        budget=budget,
        parallel_tools=parallel_tools,
        compact=compact,
        refresh_credentials=refresh_credentials,
        max_steps=max_steps,
        max_auth_refreshes=max_auth_refreshes,
        max_compactions=max_compactions,
        on_event=on_event,
        config=config,
        telemetry=telemetry,
    )
    return await turn.run()
