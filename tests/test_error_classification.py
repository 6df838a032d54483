"""classify_http_error / classify_transport_error: one table per provider's documented errors."""

from __future__ import annotations

import socket
import ssl

import httpx2
import orjson
import pytest
import trio

from trio_sampler._http import classify_transport_error
from trio_sampler.types import SamplingErrorKind as K
from trio_sampler.wire.errors import (
    classify_http_error,
    classify_stream_error,
    scrub_secrets,
)


def openai_body(
    message: str, type_: str | None, code: str | None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def anthropic_body(type_: str, message: str) -> bytes:
    return orjson.dumps(
        {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011CA"}
    )


CLOUDFLARE_413 = (
    b"<html><head><title>413 Request Entity Too Large</title></head><body>cf</body></html>"
)

# (status, body, kind, retryable, error_type, error_code)
TABLE: list[tuple[int, bytes, K, bool, str | None, str | None]] = [
    # --- OpenAI ---
    (
        400,
        openai_body(
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 8227 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        ),
        K.CONTEXT_LENGTH_EXCEEDED,
        False,
        "invalid_request_error",
        "context_length_exceeded",
    ),
    (
        400,
        openai_body(
            "Your input exceeds the context window of this model.",
            "invalid_request_error",
            "context_length_exceeded",
            "input",
        ),
        K.CONTEXT_LENGTH_EXCEEDED,
        False,
        "invalid_request_error",
        "context_length_exceeded",
    ),
    (
        400,
        openai_body(
            "Unsupported parameter: 'max_tokens'", "invalid_request_error", "unsupported_parameter"
        ),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        "unsupported_parameter",
    ),
    (
        400,
        openai_body("Invalid image.", "invalid_request_error", "invalid_image"),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        "invalid_image",
    ),
    (
        401,
        openai_body("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
        K.AUTH,
        False,
        "invalid_request_error",
        "invalid_api_key",
    ),
    (
        403,
        openai_body("Country, region, or territory not supported", "request_forbidden", None),
        K.AUTH,
        False,
        "request_forbidden",
        None,
    ),
    (
        404,
        openai_body("The model `gpt-9` does not exist", "invalid_request_error", "model_not_found"),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        "model_not_found",
    ),
    (409, openai_body("conflict", None, None), K.HTTP, True, None, None),
    (422, openai_body("unprocessable", None, None), K.INVALID_REQUEST, False, None, None),
    (
        429,
        openai_body("Rate limit reached for gpt-4o", "requests", "rate_limit_exceeded"),
        K.RATE_LIMITED,
        True,
        "requests",
        "rate_limit_exceeded",
    ),
    (
        429,
        openai_body(
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        K.RATE_LIMITED,
        False,
        "insufficient_quota",
        "insufficient_quota",
    ),
    (
        429,
        openai_body("The engine is currently overloaded, please try again later", None, None),
        K.RATE_LIMITED,
        True,
        None,
        None,
    ),
    (
        500,
        openai_body("The server had an error while processing your request", "server_error", None),
        K.API,
        True,
        "server_error",
        None,
    ),
    # OpenRouter: integer codes, and its own overflow message
    (
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "This endpoint's maximum context length is 4096 tokens",
                    "code": 400,
                }
            }
        ),
        K.CONTEXT_LENGTH_EXCEEDED,
        False,
        None,
        "400",
    ),
    # xAI
    (
        400,
        orjson.dumps(
            {
                "code": "Client specified an invalid argument",
                "error": "This model's maximum prompt length is 131072 but the request contains "
                "140000 tokens.",
            }
        ),
        K.CONTEXT_LENGTH_EXCEEDED,
        False,
        None,
        "Client specified an invalid argument",
    ),
    # --- Anthropic ---
    (
        400,
        anthropic_body(
            "invalid_request_error", "prompt is too long: 207791 tokens > 200000 maximum"
        ),
        K.CONTEXT_LENGTH_EXCEEDED,
        False,
        "invalid_request_error",
        None,
    ),
    (
        400,
        anthropic_body(
            "invalid_request_error",
            "This model does not support effort level 'xhigh'. "
            "Supported levels: high, low, max, medium.",
        ),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        None,
    ),
    (
        400,
        anthropic_body(
            "invalid_request_error",
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        None,
    ),
    (
        400,
        anthropic_body("invalid_request_error", "Could not process image"),
        K.INVALID_REQUEST,
        False,
        "invalid_request_error",
        "invalid_image",
    ),
    (
        401,
        anthropic_body("authentication_error", "invalid x-api-key"),
        K.AUTH,
        False,
        "authentication_error",
        None,
    ),
    (
        402,
        anthropic_body("billing_error", "Your credit balance is too low"),
        K.INVALID_REQUEST,
        False,
        "billing_error",
        None,
    ),
    (
        403,
        anthropic_body("permission_error", "Your API key does not have permission"),
        K.AUTH,
        False,
        "permission_error",
        None,
    ),
    (
        404,
        anthropic_body("not_found_error", "model: claude-9"),
        K.INVALID_REQUEST,
        False,
        "not_found_error",
        None,
    ),
    (
        413,
        anthropic_body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        K.PAYLOAD_TOO_LARGE,
        False,
        "request_too_large",
        None,
    ),
    (413, CLOUDFLARE_413, K.PAYLOAD_TOO_LARGE, False, None, None),
    (
        429,
        anthropic_body(
            "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
        ),
        K.RATE_LIMITED,
        True,
        "rate_limit_error",
        None,
    ),
    (500, anthropic_body("api_error", "Internal server error"), K.API, True, "api_error", None),
    (504, anthropic_body("timeout_error", "Request timed out"), K.API, True, "timeout_error", None),
    (
        529,
        anthropic_body("overloaded_error", "Overloaded"),
        K.OVERLOADED,
        True,
        "overloaded_error",
        None,
    ),
    # --- status only (gateways, CDNs, empty bodies) ---
    (408, b"", K.HTTP, True, None, None),
    (502, b"<html><body>Bad Gateway</body></html>", K.HTTP, True, None, None),
    (
        503,
        b"upstream connect error or disconnect/reset before headers",
        K.OVERLOADED,
        True,
        None,
        None,
    ),
    (520, b"", K.HTTP, True, None, None),
    (525, b"", K.HTTP, False, None, None),
    (526, b"", K.HTTP, False, None, None),
    (529, b"", K.OVERLOADED, True, None, None),
    (301, b"", K.HTTP, False, None, None),
    (418, b"I'm a teapot", K.INVALID_REQUEST, False, None, None),
]


@pytest.mark.parametrize(("status", "body", "kind", "retryable", "etype", "code"), TABLE)
def test_status_table(
    status: int, body: bytes, kind: K, retryable: bool, etype: str | None, code: str | None
) -> None:
    info = classify_http_error(status, {}, body)
    assert (info.kind, info.retryable, info.error_type, info.error_code) == (
        kind,
        retryable,
        etype,
        code,
    )
    assert info.status_code == status
    assert info.message
    assert "<" not in info.message  # never an HTML page
    assert len(info.message) <= 281


def test_anthropic_message_and_request_id_from_body() -> None:
    info = classify_http_error(529, [], anthropic_body("overloaded_error", "Overloaded"))
    assert info.message == "Overloaded"
    assert info.provider_request_id == "req_011CA"


def test_html_page_gives_status_copy() -> None:
    info = classify_http_error(502, {}, b"<!DOCTYPE html><html>nginx</html>")
    assert info.message == "the service is temporarily unavailable"
    assert str(info) == "http (HTTP 502): the service is temporarily unavailable"


def test_redirect_message_points_at_base_url() -> None:
    info = classify_http_error(307, {"location": "https://evil.example/?key=sk-abc"}, b"")
    assert "base_url" in info.message
    assert "evil" not in info.message


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "retry-after": "30"}, 1.5),
        ({"retry-after-ms": "nope", "retry-after": "30"}, 30.0),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": ""}, None),
        ({}, None),
        # HTTP date, relative to the `now` argument
        ({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0),
    ],
)
def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    info = classify_http_error(429, headers, b"", now=now)
    assert info.retry_after == expected


def test_retry_after_date_relative_to_date_header() -> None:
    headers = [
        ("Date", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("Retry-After", "Wed, 21 Oct 2015 07:28:45 GMT"),
    ]
    assert classify_http_error(503, headers, b"").retry_after == 45.0


@pytest.mark.parametrize(
    ("status", "value", "retryable", "should_retry"),
    [
        (500, "false", False, False),
        (400, "true", True, True),
        (429, "FALSE", False, False),
        (500, "maybe", True, None),
        # a context overflow is never retried, whatever the header says
        (400, "true", False, True),
    ],
)
def test_x_should_retry(
    status: int, value: str, retryable: bool, should_retry: bool | None
) -> None:
    body = b""
    if retryable is False and should_retry is True:
        body = anthropic_body("invalid_request_error", "prompt is too long: 3 tokens > 2 maximum")
    info = classify_http_error(status, {"x-should-retry": value}, body)
    assert (info.retryable, info.should_retry) == (retryable, should_retry)


def test_rate_limit_headers_and_request_id() -> None:
    headers = [
        ("x-request-id", "req_abc"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-tokens", "6m0s"),
        ("anthropic-ratelimit-tokens-reset", "2026-04-05T14:28:55Z"),
        ("retry-after", "7"),
        ("content-type", "application/json"),
    ]
    info = classify_http_error(429, headers, b"")
    assert info.provider_request_id == "req_abc"
    assert info.rate_limit == {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-tokens": "6m0s",
        "anthropic-ratelimit-tokens-reset": "2026-04-05T14:28:55Z",
        "retry-after": "7",
    }
    assert (
        classify_http_error(500, {"request-id": "req_011C"}, b"").provider_request_id == "req_011C"
    )


@pytest.mark.parametrize(
    "secret",
    [
        "sk-proj-abcdefghijklmnop1234",
        "sk-ant-api03-abcdefghijklmnop",
        "xai-ABCDEFGHIJKLMNOPQRSTUV",
        "gsk_abcdefghijklmnopqrst",
        "Bearer abc.def.ghi",
    ],
)
def test_secrets_scrubbed_from_messages(secret: str) -> None:
    body = openai_body(f"Incorrect API key provided: {secret}. Find yours at ...", None, None)
    info = classify_http_error(401, {}, body)
    assert secret not in info.message
    assert secret.split()[-1] not in str(info)
    assert "[REDACTED]" in info.message
    stream = classify_stream_error({"error": {"message": f"bad key {secret}"}})
    assert secret.split()[-1] not in stream.message


def test_scrub_query_keys_but_not_prose() -> None:
    assert (
        scrub_secrets("see https://x.test/v1?key=abc123&x=1")
        == "see https://x.test/v1?key=[REDACTED]&x=1"
    )
    assert scrub_secrets("the task-runner asked a risky question") == (
        "the task-runner asked a risky question"
    )


def test_long_message_trimmed() -> None:
    info = classify_http_error(400, {}, openai_body("x " * 1000, None, None))
    assert len(info.message) <= 281
    assert info.message.endswith("…")


def test_garbage_bodies_do_not_raise() -> None:
    for body in (b"{", b"[]", b"[1]", b"null", b'{"error": 5}', b"\xff\xfe", b'"text"'):
        info = classify_http_error(500, {}, body)
        assert info.retryable


# --- transport ------------------------------------------------------------------------

_REQ = httpx2.Request("POST", "https://api.example.test/v1/chat?api-key=sk-secretsecret123")


@pytest.mark.parametrize(
    ("exc", "kind", "retryable"),
    [
        (httpx2.ConnectError("[Errno 111] Connection refused", request=_REQ), K.TRANSPORT, True),
        (httpx2.ConnectTimeout("timed out", request=_REQ), K.TRANSPORT, True),
        (httpx2.ReadTimeout("timed out", request=_REQ), K.IDLE_TIMEOUT, True),
        (httpx2.WriteTimeout("timed out", request=_REQ), K.TRANSPORT, True),
        (httpx2.PoolTimeout("timed out", request=_REQ), K.TRANSPORT, True),
        (httpx2.ReadError("connection reset", request=_REQ), K.TRANSPORT, True),
        (httpx2.RemoteProtocolError("peer closed connection", request=_REQ), K.TRANSPORT, True),
        (httpx2.LocalProtocolError("bad header", request=_REQ), K.TRANSPORT, False),
        (
            httpx2.UnsupportedProtocol(
                "Request URL has an unsupported protocol 'ftp://'.", request=_REQ
            ),
            K.TRANSPORT,
            False,
        ),
        (trio.TooSlowError(), K.IDLE_TIMEOUT, True),
        (ConnectionResetError(104, "Connection reset by peer"), K.TRANSPORT, True),
        (ssl.SSLError("handshake failure"), K.TRANSPORT, True),
    ],
)
def test_transport_table(exc: BaseException, kind: K, retryable: bool) -> None:
    info = classify_transport_error(exc)
    assert (info.kind, info.retryable, info.status_code) == (kind, retryable, None)
    assert info.message


def test_tls_certificate_failure_is_not_retryable() -> None:
    exc = httpx2.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    info = classify_transport_error(exc)
    assert info.kind is K.TRANSPORT
    assert not info.retryable
    assert "certificate" in info.message


def test_tls_handshake_failure_via_cause() -> None:
    try:
        try:
            raise ssl.SSLError("[SSL: WRONG_VERSION_NUMBER] wrong version number")
        except ssl.SSLError as cause:
            raise httpx2.ConnectError("connect failed") from cause
    except httpx2.ConnectError as exc:
        info = classify_transport_error(exc)
    assert info.retryable
    assert "TLS" in info.message


@pytest.mark.parametrize(
    ("errno", "retryable"),
    [(socket.EAI_NONAME, False), (socket.EAI_AGAIN, True)],
    ids=["name-does-not-exist", "resolver-temporarily-failing"],
)
def test_dns_failure_retried_only_when_temporary(errno: int, retryable: bool) -> None:
    try:
        try:
            raise socket.gaierror(errno, "Name or service not known")
        except socket.gaierror as cause:
            raise httpx2.ConnectError("[Errno -2] Name or service not known") from cause
    except httpx2.ConnectError as exc:
        info = classify_transport_error(exc)
    assert info.kind is K.TRANSPORT
    assert info.retryable is retryable
    if not retryable:
        assert "does not resolve" in info.message


def test_transport_message_drops_url_query_and_path() -> None:
    exc = httpx2.ConnectError(
        "failed to connect to https://api.example.test/v1/chat?api-key=sk-secretsecret123 "
        "(Bearer tok123456)"
    )
    info = classify_transport_error(exc)
    assert "sk-secret" not in info.message
    assert "api-key" not in info.message
    assert "tok123456" not in info.message
    assert "api.example.test" in info.message
