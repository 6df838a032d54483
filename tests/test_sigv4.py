"""SigV4 signing for Amazon Bedrock (the ``bedrock`` extra): the signature a request
carries is checked by an independent implementation of the AWS algorithm below."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

import httpx2
import orjson
import pytest
from log_capture import capture_root_logs

from trio_sampler import _sigv4
from trio_sampler.actor import open_sampler
from trio_sampler.client import SamplingClient, SamplingClientError
from trio_sampler.config import AuthScheme, SamplerConfig
from trio_sampler.types import (
    ConversationRequest,
    Failed,
    SamplingErrorKind,
    SamplingEvent,
    User,
)
from trio_sampler.wire._request import WireRequest

ACCESS_KEY = "AKIDEXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "session-token-example"
BASE = "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1"
WIRE = WireRequest(
    path="/chat/completions",
    body=b'{"model":"openai.gpt-oss-120b-1:0","stream":true}',
    data={},
)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Credentials in the environment only (no files, no instance metadata)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": TOKEN,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
        "AWS_CONFIG_FILE": "/nonexistent/config",
    }.items():
        monkeypatch.setenv(name, value)
    _sigv4._session.cache_clear()
    yield
    _sigv4._session.cache_clear()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def expected_authorization(
    method: str, url: str, headers: Mapping[str, str], body: bytes, region: str
) -> str:
    """AWS SigV4 written from its specification, for the headers the request signs."""
    signed = headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    stamp = headers["x-amz-date"]
    parts = urlsplit(url)
    canonical_headers = "".join(f"{name}:{headers[name].strip()}\n" for name in signed)
    canonical = "\n".join(
        [
            method,
            parts.path,
            parts.query,
            canonical_headers,
            ";".join(signed),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{stamp[:8]}/{region}/bedrock/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{SECRET_KEY}".encode(), stamp[:8])
    for part in (region, "bedrock", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
        f"SignedHeaders={';'.join(signed)}, Signature={signature}"
    )


def test_sign_returns_the_headers_aws_checks(aws_env: None) -> None:
    url = f"{BASE}/chat/completions"
    headers = [("content-type", "application/json"), ("accept", "text/event-stream")]
    added = dict(_sigv4.sign("POST", url, headers, WIRE.body))
    assert set(added) == {"Authorization", "X-Amz-Date", "X-Amz-Security-Token"}
    assert added["X-Amz-Security-Token"] == TOKEN
    seen = {k.lower(): v for k, v in [*headers, *added.items()]}
    seen["host"] = "bedrock-runtime.us-west-2.amazonaws.com"
    assert added["Authorization"] == expected_authorization(
        "POST", url, seen, WIRE.body, "us-west-2"
    )


async def test_the_client_signs_each_request_where_its_headers_are_final(aws_env: None) -> None:
    seen: list[httpx2.Request] = []

    async def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=b"")

    config = SamplerConfig.for_provider("bedrock_sigv4", base_url=BASE, env={})
    assert config.auth_scheme is AuthScheme.AWS_SIGV4 and config.api_key is None
    transport = httpx2.MockTransport(handler)
    async with SamplingClient(config, transport=transport) as client, client.open_stream(WIRE) as s:
        assert s.status == 200
    (request,) = seen
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["authorization"] == expected_authorization(
        "POST", str(request.url), headers, request.content, "us-west-2"
    )
    assert "content-type" in headers["authorization"]  # our headers are signed too


async def test_missing_credentials_are_an_auth_error_naming_what_to_set(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    config = SamplerConfig.for_provider("bedrock_sigv4", base_url=BASE, env={})
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200))
    async with SamplingClient(config, transport=transport) as client:
        with pytest.raises(SamplingClientError) as caught:
            async with client.open_stream(WIRE):
                pass
    assert caught.value.info.kind is SamplingErrorKind.AUTH
    assert "AWS_ACCESS_KEY_ID" in caught.value.info.message


async def test_the_session_token_and_the_signature_never_leave_the_library(
    aws_env: None,
) -> None:
    """A server that echoes the signed headers back: neither the session token nor the
    signature shows in the events, the error, the reprs or any log record."""
    seen: dict[str, str] = {}

    async def handler(request: httpx2.Request) -> httpx2.Response:
        seen.update({k.lower(): v for k, v in request.headers.items()})
        echo = (
            f"The security token included in the request is invalid: "
            f"{request.headers['x-amz-security-token']} "
            f"(Authorization: {request.headers['authorization']})"
        )
        logging.getLogger("httpx2").debug("request headers %r", list(request.headers.items()))
        return httpx2.Response(
            403,
            headers={"content-type": "application/json", "x-echo": TOKEN},
            content=orjson.dumps({"message": echo}),
        )

    config = SamplerConfig.for_provider("bedrock_sigv4", base_url=BASE, env={})
    events: list[SamplingEvent] = []
    with capture_root_logs() as logs:
        async with open_sampler(config, transport=httpx2.MockTransport(handler)) as sampler:
            stream = await sampler.submit(
                ConversationRequest([User("hi")], model="openai.gpt-oss-120b-1:0")
            )
            async with stream:
                events.extend([event async for event in stream])
    signature = seen["authorization"].split("Signature=")[1]
    assert seen["x-amz-security-token"] == TOKEN  # it was sent...
    failed = events[-1]
    assert isinstance(failed, Failed) and failed.error.kind is SamplingErrorKind.AUTH
    texts = [
        *(repr(event) for event in events),
        str(failed.error.message),
        repr(config),
        *logs.texts,
    ]
    for text in texts:  # ...and nowhere else
        assert TOKEN not in text
        assert signature not in text
    assert any("[REDACTED x-amz-security-token" in text for text in texts)


def test_the_session_token_is_among_the_configs_credentials(aws_env: None) -> None:
    config = SamplerConfig.for_provider("bedrock_sigv4", base_url=BASE, env={})
    assert ("x-amz-security-token", TOKEN) in config.credentials()
    assert ("aws_secret_access_key", SECRET_KEY) in config.credentials()
    assert config.credentials_change
