"""What the three builders share about hosted tools: the passthrough, the parse rule and
the order of the ``tools`` list.

A builder renders each :data:`~trio_sampler.types.HostedTool` its backend supports and
reports the others as dropped. A parser turns each non-function tool it reads into the
modeled class only when rendering that class gives the same JSON back (nulls aside);
anything else becomes a :class:`~trio_sampler.types.ProviderTool` holding the raw object,
so no tool is ever lost on ``parse_request`` → ``build_request``. Where function and
hosted tools interleave on the wire, the parser records the order
(:attr:`~trio_sampler.types.ConversationRequest.tool_order`) and :func:`in_order` gives
the builders the tools back in it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..types._conversation import (
    ApiBackend,
    ConversationRequest,
    HostedTool,
    ProviderTool,
    ToolSpec,
)
from ._render import JsonObject, ReportCollector
from ._request import ConversionAction

__all__ = ["drop", "in_order", "keep_or_passthrough", "order_record", "passthrough"]


def order_record(kinds: Sequence[str]) -> tuple[str, ...]:
    """The ``tool_order`` a parser keeps for the wire order ``kinds`` ("function" /
    "hosted", one per tool): empty when it is the default (function tools first)."""
    default = sorted(kinds, key=lambda kind: kind != "function")  # a stable sort
    return () if list(kinds) == default else tuple(kinds)


def in_order(request: ConversationRequest) -> list[ToolSpec | HostedTool]:
    """The request's function and hosted tools in the order its ``tool_order`` records."""
    sources: dict[str, Iterator[ToolSpec | HostedTool]] = {
        "function": iter(request.tools),
        "hosted": iter(request.hosted_tools),
    }
    tools: list[ToolSpec | HostedTool] = []
    for kind in request.tool_order:
        tool = next(sources[kind], None)
        if tool is not None:
            tools.append(tool)
    tools.extend(sources["function"])
    tools.extend(sources["hosted"])
    return tools


def drop(report: ReportCollector, tool: HostedTool, detail: str) -> None:
    """Report ``tool`` as not sent: this backend cannot run it."""
    report.note(None, f"hosted tool {type(tool).__name__}", ConversionAction.DROPPED, detail)


def passthrough(
    tool: ProviderTool, backend: ApiBackend, report: ReportCollector
) -> JsonObject | None:
    """The raw object of a :class:`ProviderTool` meant for ``backend``, else a report note."""
    if tool.backend is backend:
        return copy.deepcopy(dict(tool.tool))
    kind = tool.tool.get("type", tool.tool.get("name", "?"))
    report.note(
        None,
        f"provider tool {kind!r}",
        ConversionAction.DROPPED,
        f"it is a {tool.backend.value} tool; {backend.value} cannot run it",
    )
    return None


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def keep_or_passthrough(
    backend: ApiBackend,
    raw: Mapping[str, Any],
    model: Callable[[], HostedTool | None],
    render: Callable[[HostedTool, ReportCollector], JsonObject | None],
) -> HostedTool:
    """``model()`` when it renders back to ``raw``; otherwise ``raw`` kept verbatim.

    ``model`` may return ``None`` or raise ``ValueError`` / ``TypeError`` (a field of a
    shape the class does not take): the tool is then kept as a :class:`ProviderTool`.
    """
    try:
        tool = model()
    except (ValueError, TypeError):
        tool = None
    if tool is not None:
        report = ReportCollector(strict=False)
        rendered = render(tool, report)
        if not report.report() and rendered == _without_nulls(raw):
            return tool
    return ProviderTool(backend, dict(raw))
