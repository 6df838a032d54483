"""Structured output where a provider has none natively: the tool-forcing strategy. Pure.

A provider whose profile says it has no native structured output
(:attr:`~trio_sampler.providers.ProviderProfile.native_structured_output` false) gets the
request's schema as a synthetic tool, named after the schema, and a ``tool_choice`` that
forces it: the model's answer is then that call's arguments.
:class:`~trio_sampler.wire.PartialOutputs` reads a call of that name as the answer, as it
streams and at the end (``output_parsed``), where the response is rewritten as a native
answer reads (the call's arguments its text, the call gone): the agent loop ends on it and
never runs it. The conversion report says it was done.
"""

from __future__ import annotations

import attrs

from ..types import ConversationRequest, NamedToolChoice, ToolSpec
from ._render import ReportCollector
from ._request import BuildOptions, ConversionAction

__all__ = ["lower_structured_output"]


def lower_structured_output(
    request: ConversationRequest, options: BuildOptions, report: ReportCollector
) -> ConversationRequest:
    """``request`` as the provider can take it: unchanged, or with its response schema
    turned into a forced tool (reported)."""
    schema = request.response_schema
    profile = options.profile
    if schema is None or profile.native_structured_output:
        return request
    report.note(
        None,
        "response_schema",
        ConversionAction.ADJUSTED,
        f"{profile.name or 'the provider'} has no native structured output: the schema is "
        f"sent as the tool {schema.name!r}, forced with tool_choice (the answer is its call)",
    )
    answer = ToolSpec(
        name=schema.name,
        description=schema.description or "Give the answer in this shape.",
        parameters=schema.schema,
        strict=schema.strict,
    )
    return attrs.evolve(
        request,
        tools=(*request.tools, answer),
        tool_choice=NamedToolChoice(schema.name),
        response_schema=None,
        output=None,  # else the request sets response_schema from it again
    )
