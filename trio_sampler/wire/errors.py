"""Error classification: provider error payloads → :class:`SamplingErrorInfo`. Pure.

This module holds the shared vocabulary (provider error types and codes, the known
context-overflow messages) used for errors inside a 200 stream
(:func:`classify_stream_error`) and HTTP error responses (:func:`classify_http_error`).
Failures of the connection itself are the HTTP transports' to classify
(``trio_sampler._http``): the wire layer knows nothing of any HTTP library.

Sans-I/O like the rest of ``wire``: no clock (an HTTP date is read against the ``now``
the caller gives, else the response's ``Date`` header), and no HTTP library.

``retryable`` means *the same request, sent again unchanged, may succeed* (the status
table in ``docs/retry-policy.md``). The actor's ``classify`` makes the final decision: 413
and ``invalid_image`` are ``retryable=False`` here because only a *changed* request
(images stripped) can succeed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson

from .._redact import scrub_secrets
from ..types import SamplingErrorInfo, SamplingErrorKind
from ._headers import Headers, normalize_headers, parse_retry_after
from ._ratelimit import parse_lowered_rate_limits

__all__ = [
    "MAX_USER_MESSAGE_CHARS",
    "RETRYABLE",
    "classify_http_error",
    "classify_stream_error",
    "error_fields",
    "error_info",
    "internal_error",
    "is_context_length_message",
    "provider_request_id",
    "scrub_secrets",
    "user_message",
]

#: User-facing messages are cut to this many characters (plus an ellipsis).
MAX_USER_MESSAGE_CHARS = 280

_CONTEXT_PATTERNS = re.compile(
    r"too long for this model|prompt is too long|maximum prompt length|"
    r"maximum context length|context[_ ]length[_ ]exceeded|context window|"
    r"exceeds the context|input is too long|too many tokens|"
    r"(?:current message.*exceeds budget)",
    re.IGNORECASE | re.DOTALL,
)

# Provider error type or code → kind. Lower-cased keys.
_KIND_BY_TYPE: dict[str, SamplingErrorKind] = {
    "overloaded_error": SamplingErrorKind.OVERLOADED,
    "service_unavailable_error": SamplingErrorKind.OVERLOADED,
    "server_is_overloaded": SamplingErrorKind.OVERLOADED,
    "overloaded": SamplingErrorKind.OVERLOADED,
    "rate_limit_error": SamplingErrorKind.RATE_LIMITED,
    "rate_limit_exceeded": SamplingErrorKind.RATE_LIMITED,
    "tokens": SamplingErrorKind.RATE_LIMITED,
    "requests": SamplingErrorKind.RATE_LIMITED,
    "authentication_error": SamplingErrorKind.AUTH,
    "invalid_api_key": SamplingErrorKind.AUTH,
    "permission_error": SamplingErrorKind.AUTH,
    "context_length_exceeded": SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
    "string_above_max_length": SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED,
    "request_too_large": SamplingErrorKind.PAYLOAD_TOO_LARGE,
    "content_filter": SamplingErrorKind.CONTENT_FILTER,
    "content_policy_violation": SamplingErrorKind.CONTENT_FILTER,
    "invalid_prompt": SamplingErrorKind.CONTENT_FILTER,
    "invalid_request_error": SamplingErrorKind.INVALID_REQUEST,
    "invalid_image": SamplingErrorKind.INVALID_REQUEST,
    "not_found_error": SamplingErrorKind.INVALID_REQUEST,
    "insufficient_quota": SamplingErrorKind.RATE_LIMITED,
    # Amazon Bedrock's exceptions (in an event stream's exception messages and in the
    # x-amzn-errortype of an error response), per the InvokeModelWithResponseStream
    # reference: a throttle waits, a server or stream fault is tried again, a bad
    # request or a refused access is not.
    "throttlingexception": SamplingErrorKind.RATE_LIMITED,
    "servicequotaexceededexception": SamplingErrorKind.RATE_LIMITED,
    "modelstreamerrorexception": SamplingErrorKind.API,
    "internalserverexception": SamplingErrorKind.API,
    "modeltimeoutexception": SamplingErrorKind.API,
    "modelerrorexception": SamplingErrorKind.API,
    "serviceunavailableexception": SamplingErrorKind.OVERLOADED,
    "modelnotreadyexception": SamplingErrorKind.OVERLOADED,
    "validationexception": SamplingErrorKind.INVALID_REQUEST,
    "resourcenotfoundexception": SamplingErrorKind.INVALID_REQUEST,
    "accessdeniedexception": SamplingErrorKind.AUTH,
}

# Codes that override the type: the model (not the request) produced something bad.
_SAMPLING_FAILURE_CODES = frozenset({"tool_use_failed", "json_validate_failed"})

#: The one kind → retryable table: may the same request, sent again unchanged, succeed?
#: Every classifier (HTTP statuses, in-stream errors, transport failures, the actor's own
#: timeouts) takes ``retryable`` from here; :func:`_status_kind` narrows it for a few
#: statuses of a retryable kind (a quota 429, 525/526, redirects) and never widens it.
RETRYABLE: Final[Mapping[SamplingErrorKind, bool]] = MappingProxyType(
    {
        SamplingErrorKind.AUTH: False,
        SamplingErrorKind.HTTP: True,
        SamplingErrorKind.API: True,
        SamplingErrorKind.SERIALIZATION: True,
        SamplingErrorKind.IDLE_TIMEOUT: True,
        SamplingErrorKind.RATE_LIMITED: True,
        SamplingErrorKind.EMPTY_RESPONSE: True,
        SamplingErrorKind.MAX_TOKENS_TRUNCATION: False,
        SamplingErrorKind.DOOM_LOOP_DETECTED: True,
        SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED: False,
        SamplingErrorKind.OVERLOADED: True,
        SamplingErrorKind.INVALID_REQUEST: False,
        SamplingErrorKind.PAYLOAD_TOO_LARGE: False,
        SamplingErrorKind.CONTENT_FILTER: False,
        SamplingErrorKind.TRANSPORT: True,
        # Nothing was sent, and Redis does not come back within a backoff.
        SamplingErrorKind.FLEET_UNAVAILABLE: False,
        SamplingErrorKind.INTERNAL: False,
    }
)


def error_info(
    kind: SamplingErrorKind, message: str, *, code: str | None = None
) -> SamplingErrorInfo:
    """A :class:`SamplingErrorInfo` whose ``retryable`` comes from :data:`RETRYABLE`."""
    return SamplingErrorInfo(kind=kind, message=message, retryable=RETRYABLE[kind], error_code=code)


_log = logging.getLogger("trio_sampler")


def internal_error(exc: BaseException, while_doing: str) -> SamplingErrorInfo:
    """Our own bug (``AttributeError``, ``TypeError``, ``AssertionError``, ...) as data.

    Logged here, once, with its traceback (logger ``trio_sampler``); the error is kind
    ``INTERNAL``, code ``internal_error``, never retried (a server fault it is not). The
    message names the exception type only: its text may quote provider data.
    """
    _log.error("internal error in trio_sampler while %s", while_doing, exc_info=exc)
    return error_info(
        SamplingErrorKind.INTERNAL,
        f"internal error in trio_sampler while {while_doing} ({type(exc).__name__}); "
        "this is a bug in the library, not a server fault: please report it",
        code="internal_error",
    )


def user_message(text: str | None, *, fallback: str) -> str:
    """Trim ``text`` into a one-paragraph user-facing message.

    HTML error pages (from proxies and CDNs) are never echoed: ``fallback`` is used instead.
    Anything shaped like a credential is replaced by ``[REDACTED]`` (``scrub_secrets``).
    """
    if not text:
        return fallback
    stripped = scrub_secrets(text).strip()
    if not stripped:
        return fallback
    lowered = stripped[:200].lower()
    if lowered.startswith(("<!doctype", "<html", "<?xml", "<head", "<body")) or "<html" in lowered:
        return fallback
    stripped = " ".join(stripped.split())
    if len(stripped) > MAX_USER_MESSAGE_CHARS:
        stripped = stripped[:MAX_USER_MESSAGE_CHARS].rstrip() + "…"
    return stripped


def is_context_length_message(message: str | None) -> bool:
    """True when ``message`` is one of the known context-window overflow messages."""
    return bool(message) and _CONTEXT_PATTERNS.search(message or "") is not None


def _as_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        # OpenRouter sends integer codes (the HTTP status of the upstream failure).
        return str(value)
    return None


def error_fields(payload: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """Extract ``(type, code, message)`` from any of the error envelopes providers use.

    Accepts the nested form ``{"error": {"type", "code", "message"}}`` (OpenAI, Anthropic,
    Responses as really sent), the flat form ``{"type": "error", "code", "message"}``
    (Responses as documented), ``{"error": "text", "code": ...}`` and a Responses
    ``response.failed`` object (``{"response": {"error": {...}}}``).
    """
    body: Any = payload
    response = payload.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("error"), Mapping):
        body = response["error"]
    elif isinstance(payload.get("error"), Mapping):
        body = payload["error"]
    elif isinstance(payload.get("error"), str):
        return (_as_str(payload.get("type")), _as_str(payload.get("code")), payload["error"])
    if not isinstance(body, Mapping):
        return (None, None, None)
    error_type = _as_str(body.get("type"))
    if error_type == "error" and body is payload:
        error_type = None
    code = _as_str(body.get("code"))
    message = body.get("message")
    if not isinstance(message, str):
        message = None
    return (error_type, code, message)


def _code_kind(
    error_type: str | None, code: str | None, message: str | None
) -> SamplingErrorKind | None:
    """The kind a provider error type / code (or a known overflow message) names, if any."""
    lowered = (code or "").lower()
    if lowered in _SAMPLING_FAILURE_CODES:
        return SamplingErrorKind.API
    if lowered == "context_length_exceeded" or is_context_length_message(message):
        return SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED
    for key in (code, error_type):
        if key:
            kind = _KIND_BY_TYPE.get(key.lower())
            if kind is not None:
                return kind
    return None


def _stream_kind(
    error_type: str | None, code: str | None, message: str | None
) -> tuple[SamplingErrorKind, bool]:
    """An in-stream error: its named code, else a numeric code read as an HTTP status
    (OpenRouter sends the upstream status), else a provider fault (``API``)."""
    kind = _code_kind(error_type, code, message)
    if kind is None and code and code.isdigit():
        return _status_kind(int(code), error_type, code, message)
    if kind is None:
        kind = SamplingErrorKind.API
    return kind, RETRYABLE[kind] and not _is_quota(error_type, code, message)


def _is_quota(error_type: str | None, code: str | None, message: str | None) -> bool:
    """A spent quota: a 429-family error that waiting does not fix."""
    if "insufficient_quota" in ((code or "").lower(), (error_type or "").lower()):
        return True
    return _QUOTA_MESSAGES.search(message or "") is not None


def classify_stream_error(payload: Mapping[str, Any]) -> SamplingErrorInfo:
    """Classify an error that arrived inside a 200 stream.

    Transient provider failures (overloaded, server errors, a model that produced a bad
    tool call) are retryable; auth, invalid-request, context-overflow and content-filter
    errors are not. ``insufficient_quota`` is a 429-family code but not transient.
    """
    error_type, code, message = error_fields(payload)
    kind, retryable = _stream_kind(error_type, code, message)
    label = error_type or code or "error"
    text = user_message(message, fallback=f"the server reported an error in the stream ({label})")
    return SamplingErrorInfo(
        kind=kind,
        message=text,
        status_code=None,
        retryable=retryable,
        error_type=error_type,
        error_code=code,
    )


# ---------------------------------------------------------------------------------------
# HTTP error responses
# ---------------------------------------------------------------------------------------

_RATE_LIMIT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit-")
_RATE_LIMIT_NAMES = frozenset({"retry-after", "retry-after-ms", "ratelimit"})
_MAX_HEADER_VALUE_CHARS = 200
_IMAGE_MESSAGES = re.compile(
    r"could not process image|invalid image|image.*(?:invalid|unsupported)", re.I
)
_QUOTA_MESSAGES = re.compile(r"exceeded your current quota|insufficient[_ ]quota", re.I)

# Status-based copy for when the body carries no usable message.
_STATUS_COPY: dict[int, str] = {
    401: "authentication failed: check the API key",
    403: "permission denied: the API key is not allowed to use this model or resource",
    404: "not found: check base_url and the model name",
    408: "the server timed out waiting for the request",
    409: "the request conflicted with another request",
    413: "the request is too large",
    429: "rate limited by the server",
    529: "the service is temporarily overloaded",
}


def _status_copy(status: int) -> str:
    if status in _STATUS_COPY:
        return _STATUS_COPY[status]
    if 300 <= status < 400:
        return (
            f"the server answered with a redirect (HTTP {status}); redirects are not followed "
            "so credentials never go to another host: check base_url"
        )
    if status in (502, 503, 504):
        return "the service is temporarily unavailable"
    if status in (520, 521, 522, 523, 524, 530):
        return "the request timed out or was interrupted between the CDN and the server"
    if status in (525, 526):
        return "the secure connection between the CDN and the server failed"
    if status >= 500:
        return "something went wrong on the server"
    return f"request failed (HTTP {status})"


def _parse_should_retry(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def _clean_header_value(value: str | None) -> str | None:
    if not value:
        return None
    value = scrub_secrets(value.strip())[:_MAX_HEADER_VALUE_CHARS]
    return value if value.isprintable() else None


def provider_request_id(lowered: Mapping[str, str]) -> str | None:
    """The provider's request id in response headers (names lower-cased):
    ``x-request-id`` (OpenAI) or ``request-id`` (Anthropic), cleaned as every header value
    that leaves the library is (secrets scrubbed, bounded, printable); ``None``: none."""
    return _clean_header_value(lowered.get("x-request-id") or lowered.get("request-id"))


def _parse_body(body: bytes) -> tuple[str | None, str | None, str | None, str | None]:
    """``(type, code, message, request_id)`` from a JSON error body, or the body as text."""
    text = body.strip()
    if not text:
        return (None, None, None, None)
    if text[:1] in (b"{", b"["):
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            payload = None
        if isinstance(payload, list) and payload and isinstance(payload[0], Mapping):
            payload = payload[0]  # some gateways wrap the error in a one-element list
        if isinstance(payload, Mapping):
            error_type, code, message = error_fields(payload)
            request_id = payload.get("request_id")
            return (
                error_type,
                code,
                message,
                request_id if isinstance(request_id, str) else None,
            )
    # Plain text (a gateway's "upstream connect error", say). user_message() drops HTML.
    return (None, None, text[:4096].decode("utf-8", "replace"), None)


def _status_kind(
    status: int, error_type: str | None, code: str | None, message: str | None
) -> tuple[SamplingErrorKind, bool]:
    """The status table (``docs/retry-policy.md``): ``(kind, retryable)``, for HTTP statuses
    and for in-stream error codes that are statuses alike. ``retryable`` is
    :data:`RETRYABLE` of the kind, narrowed for a spent quota, 525/526 and redirects."""
    if status == 401 or status == 403:
        # 403 keeps its status_code: the bridge refreshes credentials on 401 only, because
        # a refreshed key does not fix a permission/region problem.
        return (SamplingErrorKind.AUTH, False)
    if status == 429:
        return (SamplingErrorKind.RATE_LIMITED, not _is_quota(error_type, code, message))
    if status == 413:
        # Often Cloudflare's page, not the provider's JSON: decide on the status alone.
        return (SamplingErrorKind.PAYLOAD_TOO_LARGE, False)
    if status in (408, 409):
        return (SamplingErrorKind.HTTP, True)
    if 400 <= status < 500:
        if (code or "").lower() == "context_length_exceeded" or is_context_length_message(message):
            return (SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED, False)
        if _code_kind(None, code, None) is SamplingErrorKind.CONTENT_FILTER:
            # OpenAI and Azure send the filter's verdict as a 400 whose code names it (its
            # type is the generic invalid_request_error): a verdict, not a malformed request.
            return (SamplingErrorKind.CONTENT_FILTER, False)
        return (SamplingErrorKind.INVALID_REQUEST, False)
    if status >= 500:
        if status in (525, 526):
            return (SamplingErrorKind.HTTP, False)  # TLS between the CDN and the origin
        overloaded = (error_type or "").lower() in ("overloaded_error", "service_unavailable_error")
        overloaded = overloaded or "overloaded" in (message or "").lower()
        if status in (503, 529) or overloaded:
            return (SamplingErrorKind.OVERLOADED, True)
        has_provider_error = error_type is not None or code is not None
        kind = SamplingErrorKind.API if has_provider_error else SamplingErrorKind.HTTP
        return (kind, RETRYABLE[kind])
    # 1xx/3xx (redirects are never followed) and anything unexpected.
    return (SamplingErrorKind.HTTP, False)


def classify_http_error(
    status: int,
    headers: Headers,
    body: bytes,
    *,
    now: float | None = None,
) -> SamplingErrorInfo:
    """Classify a non-2xx HTTP response. Pure (given ``now``).

    * ``kind`` and ``retryable`` follow the status table (``docs/retry-policy.md``):
      401/403 → AUTH; 429 → RATE_LIMITED (``insufficient_quota`` is not retryable);
      413 → PAYLOAD_TOO_LARGE; a 4xx with ``code: context_length_exceeded`` or a known
      overflow message → CONTEXT_LENGTH_EXCEEDED; an ``invalid_image`` error → INVALID_REQUEST with
      ``error_code="invalid_image"``; 408/409 → HTTP retryable; 503/529 or an overloaded
      error → OVERLOADED retryable; other 5xx → API (provider JSON) or HTTP, retryable,
      except 525/526 (TLS between CDN and origin); redirects and other 4xx → not retryable.
    * ``x-should-retry`` overrides ``retryable`` both ways, except that a context overflow
      is never retryable (resending the same prompt cannot fit).
    * ``retry_after`` comes from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP
      date relative to ``now``, else the ``Date`` header; with neither, a date is
      dropped); it is not
      capped here (the retry policy caps it).
    * ``message`` is the provider's message, trimmed, secrets scrubbed, never an HTML page;
      else a status-based sentence.
    """
    # Imported here: the parser reads this module's header helpers.

    lowered = normalize_headers(headers)
    error_type, code, message, body_request_id = _parse_body(body)
    if code is None and _IMAGE_MESSAGES.search(message or "") and 400 <= status < 600:
        code = "invalid_image"
    kind, retryable = _status_kind(status, error_type, code, message)
    if (code or "").lower() == "invalid_image" and status not in (401, 403, 429):
        kind, retryable = SamplingErrorKind.INVALID_REQUEST, False
    should_retry = _parse_should_retry(lowered.get("x-should-retry"))
    if should_retry is not None and kind is not SamplingErrorKind.CONTEXT_LENGTH_EXCEEDED:
        retryable = should_retry
    rate_limit = {
        name: value
        for name, value in lowered.items()
        if name.startswith(_RATE_LIMIT_PREFIXES) or name in _RATE_LIMIT_NAMES
    }
    request_id = provider_request_id(lowered) or _clean_header_value(body_request_id)
    return SamplingErrorInfo(
        kind=kind,
        message=user_message(message, fallback=_status_copy(status)),
        status_code=status,
        retryable=retryable,
        retry_after=parse_retry_after(lowered, now),
        should_retry=should_retry,
        error_type=_clean_header_value(error_type),
        error_code=_clean_header_value(code),
        provider_request_id=request_id,
        rate_limit=rate_limit,
        rate_limit_snapshot=parse_lowered_rate_limits(lowered, now=now),
    )
