"""Counting a request's input tokens: before it is sent, and as the rate limiters see it.

Two ways to know a prompt's size, one vocabulary:

* :meth:`SamplerHandle.count_tokens <trio_sampler.SamplerHandle.count_tokens>` asks the
  provider where it has a counting endpoint (Messages ``POST /v1/messages/count_tokens``,
  Responses ``POST /v1/responses/input_tokens``): the count is *exact*, the number the
  request would be billed as input. Elsewhere (Chat Completions, or an endpoint that is not
  there: 404) it is a local *estimate*, and the :class:`TokenCount` says so.
* The pacer (:class:`~trio_sampler.ratelimit.RateLimitPacing`) and the fleet
  (:class:`~trio_sampler.fleet.LimiterSpec`) reserve each attempt's prompt before it is
  sent, by an :data:`InputTokenEstimator`: by default the body's length over
  ``chars_per_token`` (:func:`estimate_input_tokens`); give them your own (a local
  tokenizer's count, say) to reserve what the provider will count.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import TypeAlias

import attrs

from .wire import WireRequest

__all__ = ["InputTokenEstimator", "TokenCount", "TokenCountSource", "estimate_input_tokens"]

#: An attempt's prompt size in tokens, from its rendered request (``None``: no opinion,
#: the default estimate is used). Called once per attempt, before it is sent: keep it
#: fast and free of I/O.
InputTokenEstimator: TypeAlias = Callable[[WireRequest], "int | None"]


class TokenCountSource(enum.Enum):
    """Where a :class:`TokenCount` comes from."""

    #: Anthropic Messages ``POST /v1/messages/count_tokens``.
    MESSAGES_COUNT_TOKENS = "messages/count_tokens"
    #: OpenAI Responses ``POST /v1/responses/input_tokens``.
    RESPONSES_INPUT_TOKENS = "responses/input_tokens"
    #: The request body's length over ``chars_per_token`` (no counting endpoint).
    BODY_ESTIMATE = "body_estimate"


@attrs.frozen
class TokenCount:
    """A request's input tokens: ``exact`` when the provider counted them, else an
    estimate; ``source`` says which, and ``detail`` why an estimate was used."""

    tokens: int
    exact: bool
    source: TokenCountSource
    detail: str = ""


def estimate_input_tokens(wire: WireRequest, chars_per_token: float = 4.0) -> int:
    """The default estimate: the rendered body's length over ``chars_per_token``."""
    return math.ceil(len(wire.body) / chars_per_token)
