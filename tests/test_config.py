"""SamplerConfig, Timeouts, RetryPolicy, Secret and provider profiles."""

from __future__ import annotations

import pickle
from typing import Any

import attrs
import pytest

from trio_sampler.config import (
    AuthScheme,
    RetryPolicy,
    SamplerConfig,
    Secret,
    Timeouts,
)
from trio_sampler.providers import PROFILES, get_profile
from trio_sampler.types import ApiBackend
from trio_sampler.wire._request import BuildOptions

KEY = "sk-test-0123456789abcdef"


def test_secret_never_shows_itself() -> None:
    secret = Secret(KEY)
    for text in (repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>40}"):
        assert KEY not in text
    assert secret.reveal() == KEY
    assert secret == Secret(KEY)
    assert secret != Secret("other")
    assert bool(Secret("")) is False
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(secret)


def test_config_repr_hides_key_and_sensitive_headers() -> None:
    cfg = SamplerConfig(
        base_url="https://api.openai.com/v1",
        api_key=KEY,
        extra_headers={"X-Proxy-Token": "tok-secret-1", "X-Title": "demo"},
        query_params={"api-key": "qk-secret-2", "api-version": "2024-10-21"},
    )
    for text in (repr(cfg), str(cfg)):
        assert KEY not in text
        assert "tok-secret-1" not in text
        assert "qk-secret-2" not in text
        assert "demo" in text
        assert "2024-10-21" in text
    assert isinstance(cfg.api_key, Secret)


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("https://api.openai.com/v1/", "https://api.openai.com/v1"),
        ("https://api.openai.com/v1///", "https://api.openai.com/v1"),
        ("http://localhost:11434/v1", "http://localhost:11434/v1"),
        ("  https://api.x.ai/v1  ", "https://api.x.ai/v1"),
    ],
)
def test_base_url_normalized(url: str, normalized: str) -> None:
    assert SamplerConfig(base_url=url).base_url == normalized


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("api.openai.com/v1", "absolute http:// or https://"),
        ("ftp://example.com", "scheme 'ftp'"),
        ("", "base_url is required"),
        ("https://user:pw@example.com/v1", "must not contain credentials"),
        ("https://example.com/v1?key=1", "query_params"),
        ("https:///v1", "absolute"),
    ],
)
def test_bad_base_url(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplerConfig(base_url=url)


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"X-Evil": "a\r\nInjected: 1"}, "CR, LF or NUL"),
        ({"X-Evil": "a\nb"}, "CR, LF or NUL"),
        ({"X-Evil": "a\0b"}, "CR, LF or NUL"),
        ({"Bad Name": "x"}, "not a valid HTTP token"),
        ({"X-Colon:": "x"}, "not a valid HTTP token"),
        ({"": "x"}, "not a valid HTTP token"),
        ({"Content-Length": "3"}, "managed by the HTTP client"),
        ({"Host": "evil"}, "managed by the HTTP client"),
    ],
)
def test_bad_extra_headers(headers: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplerConfig(base_url="https://x.test", extra_headers=headers)


def test_extra_headers_values_never_in_error() -> None:
    with pytest.raises(ValueError) as info:
        SamplerConfig(base_url="https://x.test", extra_headers={"X-Key": "sekrit\r\n"})
    assert "sekrit" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"connect": -1}, "Timeouts.connect must be a positive"),
        ({"idle": 0}, "Timeouts.idle must be a positive"),
        ({"first_token": float("inf")}, "finite"),
        ({"total": -5}, "or None for no limit"),
        ({"response_headers": None}, "not None"),
    ],
)
def test_bad_timeouts(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Timeouts(**kwargs)


def test_timeouts_defaults_and_read_backstop() -> None:
    t = Timeouts()
    assert (t.connect, t.response_headers, t.first_token, t.idle, t.total) == (
        10.0,
        60.0,
        300.0,
        120.0,
        None,
    )
    assert t.read == 300.0
    assert Timeouts(first_token=10, idle=50, response_headers=5).read == 50
    # The backstop never cuts the wait for the response head short.
    assert Timeouts(response_headers=2, first_token=0.5, idle=0.5).read == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_retries": -1}, "max_retries must be an int >= 0"),
        ({"jitter": 1.5}, "jitter is a fraction"),
        ({"base_delay": 5, "max_delay": 1}, "must be >= base_delay"),
        ({"retry_budget_ratio": 0}, "retry_budget_ratio"),
        ({"max_retry_after": -1}, "max_retry_after must be a positive"),
    ],
)
def test_bad_retry_policy(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)


def test_retry_policy_defaults() -> None:
    p = RetryPolicy()
    assert (p.max_retries, p.base_delay, p.max_delay, p.jitter) == (4, 0.5, 30.0, 0.25)
    assert (p.max_retry_after, p.max_consecutive_rate_limits) == (60.0, 3)
    assert p.retry_budget_ratio is None and p.retry_mid_stream


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_response_bytes": 0}, "max_response_bytes must be a positive int"),
        ({"max_sse_event_bytes": -1}, "max_sse_event_bytes"),
        ({"model": "  "}, "model must be a non-empty"),
        ({"provider": "nope"}, "unknown provider 'nope'; known providers: anthropic"),
        ({"api_key": "sk-abc\n"}, "api_key ends with whitespace"),
        ({"anthropic_version": ""}, "anthropic_version"),
    ],
)
def test_bad_config_fields(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplerConfig(base_url="https://x.test", **kwargs)


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        (AuthScheme.BEARER, [("authorization", f"Bearer {KEY}")]),
        (AuthScheme.X_API_KEY, [("x-api-key", KEY)]),
        (AuthScheme.NONE, []),
    ],
)
def test_auth_headers(scheme: AuthScheme, expected: list[tuple[str, str]]) -> None:
    cfg = SamplerConfig(base_url="https://x.test", api_key=KEY, auth_scheme=scheme)
    assert cfg.auth_headers() == expected


def test_no_key_no_auth_header() -> None:
    assert SamplerConfig(base_url="https://x.test").auth_headers() == []


def test_request_headers_anthropic_version_and_override() -> None:
    cfg = SamplerConfig(
        base_url="https://api.anthropic.com/v1",
        backend=ApiBackend.MESSAGES,
        api_key=KEY,
        auth_scheme=AuthScheme.X_API_KEY,
        extra_headers=[("anthropic-beta", "x")],
    )
    assert cfg.request_headers() == [
        ("x-api-key", KEY),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "x"),
    ]
    chat = SamplerConfig(base_url="https://x.test", api_key=KEY)
    assert [n for n, _ in chat.request_headers()] == ["authorization"]
    gateway = chat.evolve(extra_headers={"Authorization": "Bearer gateway"})
    assert gateway.request_headers() == [("Authorization", "Bearer gateway")]


def test_for_provider_reads_env() -> None:
    cfg = SamplerConfig.for_provider("anthropic", env={"ANTHROPIC_API_KEY": KEY})
    assert cfg.backend is ApiBackend.MESSAGES
    assert cfg.auth_scheme is AuthScheme.X_API_KEY
    assert cfg.base_url == "https://api.anthropic.com/v1"
    assert cfg.api_key == Secret(KEY)
    assert cfg.provider == "anthropic"
    assert cfg.model == "claude-sonnet-5-5"


def test_for_provider_missing_key_names_env_var() -> None:
    with pytest.raises(ValueError, match="set the environment variable XAI_API_KEY"):
        SamplerConfig.for_provider("xai", env={})
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        SamplerConfig.for_provider("openai", env={"OPENAI_API_KEY": "  "})


def test_for_provider_explicit_key_and_overrides() -> None:
    cfg = SamplerConfig.for_provider(
        "deepseek",
        api_key=KEY,
        model="deepseek-v4-pro",
        env={},
        http2=True,
        timeouts=Timeouts(idle=30),
    )
    assert cfg.model == "deepseek-v4-pro"
    assert cfg.http2 and cfg.timeouts.idle == 30
    assert cfg.profile is not None and cfg.profile.reasoning_content_replay


def test_for_provider_local_servers_need_no_key() -> None:
    cfg = SamplerConfig.for_provider("ollama", env={}, model="llama3.2")
    assert cfg.api_key is None and cfg.auth_scheme is AuthScheme.NONE
    assert cfg.auth_headers() == []
    with pytest.raises(ValueError, match="pass base_url"):
        SamplerConfig.for_provider("openai_compatible", env={})
    generic = SamplerConfig.for_provider(
        "openai-compatible", base_url="https://llm.internal/v1/", api_key=KEY, env={}
    )
    assert generic.base_url == "https://llm.internal/v1"
    assert generic.auth_scheme is AuthScheme.BEARER


def test_get_profile_unknown_lists_names() -> None:
    with pytest.raises(ValueError) as info:
        get_profile("gemini")
    for name in PROFILES:
        assert name in str(info.value)


def test_profiles_table() -> None:
    expected = {
        "openai",
        "anthropic",
        "xai",
        "openrouter",
        "deepseek",
        "groq",
        "ollama",
        "vllm",
        "llamacpp",
        "azure",
        "bedrock",
        "bedrock_sigv4",
        "bedrock_messages",
        "bedrock_messages_sigv4",
        "vertex",
        "openai_compatible",
        "emulator",
    }
    assert set(PROFILES) == expected
    assert get_profile("xai").reasoning_tokens_outside_completion
    assert get_profile("ollama").api_key_env is None
    assert get_profile("vllm").api_key_env is None
    for profile in PROFILES.values():
        if profile.requires_api_key:
            assert profile.api_key_env
        if profile.base_url is not None:
            SamplerConfig(base_url=profile.base_url)  # every shipped URL validates


def test_build_options() -> None:
    cfg = SamplerConfig(
        base_url="https://x.test",
        model="m",
        provider="groq",
        default_max_output_tokens=1000,
        cache_breakpoints=False,
        strict_conversion=True,
    )
    assert cfg.build_options() == BuildOptions(
        model="m",
        provider="groq",
        stream=True,
        default_max_output_tokens=1000,
        cache_breakpoints=False,
        strict=True,
    )
    assert cfg.build_options(stream=False).stream is False


def test_config_is_frozen() -> None:
    cfg = SamplerConfig(base_url="https://x.test")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.model = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="absolute"):
        cfg.evolve(base_url="nope")


BAD_KEYS = [
    (f" {KEY}", "starts with whitespace"),
    (f"{KEY} ", "ends with whitespace"),
    (f"{KEY}\t", "ends with whitespace"),
    (f"{KEY}\x0b", "ends with whitespace"),
    (f"{KEY}\x0c", "ends with whitespace"),
    (f"{KEY}\u00a0", "ends with whitespace"),
    (f"{KEY}\r\n", "ends with whitespace"),
    (f"{KEY[:8]}\x01{KEY[8:]}", r"control character \(U\+0001\) at position 8"),
    (f"{KEY[:8]}\x7f{KEY[8:]}", r"control character \(U\+007F\)"),
    (f"{KEY[:8]}\n{KEY[8:]}", r"control character \(U\+000A\)"),
    (f"{KEY[:8]}\x00{KEY[8:]}", r"control character \(U\+0000\)"),
    (f"\u201c{KEY}\u201d", r"non-ASCII character U\+201C at position 0"),
    (f"{KEY[:4]}\u2013{KEY[4:]}", r"non-ASCII character U\+2013"),
]


@pytest.mark.parametrize(("key", "match"), BAD_KEYS)
def test_api_key_with_whitespace_or_control_characters_is_refused(key: str, match: str) -> None:
    # The commonest copy/paste slip (a trailing space) used to be accepted; the HTTP layer
    # then refused the header with a message quoting the whole key.
    for value in (key, Secret(key)):
        with pytest.raises(ValueError, match=match) as info:
            SamplerConfig(base_url="https://x.test", api_key=value)
        assert "api_key" in str(info.value)
        assert KEY not in str(info.value) and KEY[8:] not in str(info.value)


@pytest.mark.parametrize(("key", "match"), BAD_KEYS)
def test_credential_headers_and_query_values_follow_the_key_rule(key: str, match: str) -> None:
    # CR, LF and NUL in any header are refused first, as header injection.
    injection = any(c in key for c in "\r\n\0")
    header_match = "CR, LF or NUL" if injection else match
    for name in ("X-Goog-Api-Key", "Authorization"):
        with pytest.raises(ValueError, match=header_match) as info:
            SamplerConfig(base_url="https://x.test", extra_headers={name: key})
        assert f"{name!r}" in str(info.value) and KEY[8:] not in str(info.value)
    with pytest.raises(ValueError, match="CR/LF/NUL" if injection else match) as info:
        SamplerConfig(base_url="https://x.test", query_params={"key": key})
    assert "query parameter 'key'" in str(info.value) and KEY[8:] not in str(info.value)


def test_per_request_credential_header_follows_the_key_rule() -> None:
    from trio_sampler.types import ConversationRequest, User
    from trio_sampler.wire import build_request

    request = ConversationRequest(items=[User("hi")], extra_headers={"x-api-key": KEY + " "})
    with pytest.raises(ValueError, match="request header 'x-api-key' ends with whitespace"):
        build_request(ApiBackend.CHAT_COMPLETIONS, request, BuildOptions(model="m"))


def test_ordinary_header_values_and_inner_spaces_are_untouched() -> None:
    cfg = SamplerConfig(
        base_url="https://x.test",
        api_key=KEY,
        extra_headers={"Authorization": f"Bearer {KEY}", "X-Title": " my app "},
    )
    assert ("X-Title", " my app ") in cfg.extra_headers
    assert SamplerConfig(base_url="https://x.test", api_key="").auth_headers() == []


def test_for_provider_strips_the_environment_value_but_checks_the_rest() -> None:
    cfg = SamplerConfig.for_provider("openai", env={"OPENAI_API_KEY": f"  {KEY}\n"})
    assert cfg.api_key == Secret(KEY)
    with pytest.raises(ValueError, match="OPENAI_API_KEY contains a control character"):
        SamplerConfig.for_provider("openai", env={"OPENAI_API_KEY": f"{KEY[:5]}\x1b{KEY[5:]}"})
