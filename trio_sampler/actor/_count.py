"""``SamplerHandle.count_tokens``: a request's input tokens, counted by the provider
where it has an endpoint for it, else estimated (and said to be)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs
import orjson

from ..client import SamplingClient, SamplingClientError
from ..config import SamplerConfig
from ..tokens import TokenCount, TokenCountSource, estimate_input_tokens
from ..types import ApiBackend, ConversationRequest, SamplingError, SamplingErrorInfo
from ..types import SamplingErrorKind as Kind
from ..wire import WireRequest, build_request

__all__ = ["count_tokens"]

#: Per backend: the counting endpoint (after the request's own path), the body fields it
#: takes, and what it is called.
_ENDPOINTS: Final[Mapping[ApiBackend, tuple[str, frozenset[str], TokenCountSource]]] = {
    ApiBackend.MESSAGES: (
        "/count_tokens",
        frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"}),
        TokenCountSource.MESSAGES_COUNT_TOKENS,
    ),
    ApiBackend.RESPONSES: (
        "/input_tokens",
        frozenset(
            {
                "model",
                "input",
                "instructions",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "reasoning",
                "text",
                "previous_response_id",
                "conversation",
                "truncation",
            }
        ),
        TokenCountSource.RESPONSES_INPUT_TOKENS,
    ),
}
#: A server without the endpoint (a compatible server, a cloud profile): estimate.
_NO_ENDPOINT: Final = frozenset({404, 405})


async def count_tokens(
    client: SamplingClient, request: ConversationRequest, config: SamplerConfig
) -> TokenCount:
    """``request``'s input tokens on ``config``'s endpoint (see :mod:`trio_sampler.tokens`).

    Raises ``ValueError`` for a request the backend cannot carry and
    :class:`~trio_sampler.types.SamplingError` when the counting endpoint fails (other
    than by not being there)."""
    wire = build_request(config.backend, request, config.build_options())
    backend = config.backend
    endpoint = _ENDPOINTS.get(backend) if isinstance(backend, ApiBackend) else None
    if endpoint is None:
        name = backend.value if isinstance(backend, ApiBackend) else backend
        return _estimate(wire, f"{name} has no counting endpoint")
    suffix, fields, source = endpoint
    data = {key: value for key, value in wire.data.items() if key in fields}
    counting = attrs.evolve(
        wire, path=wire.path + suffix, body=orjson.dumps(data), data=data, query=()
    )
    try:
        _status, _headers, body = await client.post_json(counting, config=config)
    except SamplingClientError as exc:
        if exc.info.status_code in _NO_ENDPOINT:
            return _estimate(wire, f"{counting.path} answered {exc.info.status_code}")
        raise SamplingError(exc.info) from None
    return TokenCount(_tokens(body, counting.path), True, source)


def _estimate(wire: WireRequest, why: str) -> TokenCount:
    return TokenCount(estimate_input_tokens(wire), False, TokenCountSource.BODY_ESTIMATE, why)


def _tokens(body: bytes, path: str) -> int:
    """``input_tokens`` of a counting answer, or a typed error naming what came."""
    try:
        answer: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    tokens = answer.get("input_tokens") if isinstance(answer, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
        return tokens
    info = SamplingErrorInfo(
        kind=Kind.SERIALIZATION,
        message=f"{path} answered without a count (no input_tokens in {body[:200]!r})",
    )
    raise SamplingError(info)
