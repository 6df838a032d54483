"""Rate-limit headers of every common spelling, parsed into one ``RateLimitSnapshot``."""

from __future__ import annotations

import math

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_sampler._redact import Redactor
from trio_sampler.emulator import EmulatorApp, PromptCache, RateLimits
from trio_sampler.testing import EmulatorTransport
from trio_sampler.types import RateLimitBudget, RateLimitSnapshot, StreamStarted
from trio_sampler.wire import new_transform, parse_duration, parse_rate_limits
from trio_sampler.wire.errors import classify_http_error

DATE = "Sun, 05 Apr 2026 14:28:50 GMT"  # 1775399330


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("4ms", 0.004),
        ("0s", 0.0),
        ("1h2m3.5s", 3723.5),
        ("1.5s", 1.5),
        ("250us", 0.00025),
        ("7", 7.0),
        ("0.25", 0.25),
        (" 2S ", 2.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "1x", "s", "-1", "-1s", "1m-2s", "1s2", "inf", "nan"])
def test_bad_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


def test_openai_headers() -> None:
    snapshot = parse_rate_limits(
        {
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-reset-requests": "6ms",
            "x-ratelimit-limit-tokens": "30000000",
            "x-ratelimit-remaining-tokens": "29999990",
            "x-ratelimit-reset-tokens": "0s",
        }
    )
    assert snapshot == RateLimitSnapshot(
        requests=RateLimitBudget(10000, 9999, 0.006),
        tokens=RateLimitBudget(30_000_000, 29_999_990, 0.0),
    )


def test_anthropic_headers_reset_relative_to_the_date_header() -> None:
    snapshot = parse_rate_limits(
        {
            "Date": DATE,
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2026-04-05T14:28:55Z",
            "anthropic-ratelimit-input-tokens-limit": "50000",
            "anthropic-ratelimit-input-tokens-remaining": "48000",
            "anthropic-ratelimit-input-tokens-reset": "2026-04-05T14:28:53+00:00",
            "anthropic-ratelimit-output-tokens-limit": "10000",
            "anthropic-ratelimit-output-tokens-remaining": "10000",
            "anthropic-ratelimit-output-tokens-reset": "2026-04-05T14:28:50Z",
            "anthropic-ratelimit-tokens-limit": "60000",
            "anthropic-ratelimit-tokens-remaining": "58000",
            "anthropic-ratelimit-tokens-reset": "2026-04-05T14:28:53Z",
        }
    )
    assert snapshot is not None
    assert snapshot.requests == RateLimitBudget(50, 49, 5.0)
    assert snapshot.input_tokens == RateLimitBudget(50000, 48000, 3.0)
    assert snapshot.output_tokens == RateLimitBudget(10000, 10000, 0.0)
    assert snapshot.tokens == RateLimitBudget(60000, 58000, 3.0)


def test_absolute_times_without_a_date_header_use_now() -> None:
    snapshot = parse_rate_limits(
        {"anthropic-ratelimit-requests-reset": "2026-04-05T14:28:55Z"}, now=1775399330.0 - 10
    )
    assert snapshot is not None and snapshot.requests == RateLimitBudget(None, None, 15.0)


def test_ietf_fields() -> None:
    structured = parse_rate_limits(
        {
            "RateLimit": '"default";r=50;t=30',
            "RateLimit-Policy": '"burst";q=10;w=1, "default";q=100;w=60',
        }
    )
    assert structured == RateLimitSnapshot(requests=RateLimitBudget(100, 50, 30.0))
    listed = parse_rate_limits({"RateLimit": "limit=100, remaining=50, reset=30"})
    assert listed == RateLimitSnapshot(requests=RateLimitBudget(100, 50, 30.0))
    separate = parse_rate_limits(
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "12"}
    )
    assert separate == RateLimitSnapshot(requests=RateLimitBudget(100, 0, 12.0))


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [("30", 30.0), ("1775399340", 10.0), ("1775399345000", 15.0), ("1m", 60.0)],
)
def test_gateway_headers_with_durations_or_unix_times(reset: str, seconds: float) -> None:
    snapshot = parse_rate_limits(
        {
            "date": DATE,
            "X-RateLimit-Limit": "20",
            "X-RateLimit-Remaining": "3",
            "X-RateLimit-Reset": reset,
        }
    )
    assert snapshot == RateLimitSnapshot(requests=RateLimitBudget(20, 3, seconds))


def test_retry_after_in_its_three_forms() -> None:
    assert parse_rate_limits({"retry-after": "2"}) == RateLimitSnapshot(retry_after=2.0)
    assert parse_rate_limits({"retry-after-ms": "1500", "retry-after": "9"}) == RateLimitSnapshot(
        retry_after=1.5
    )
    dated = parse_rate_limits({"date": DATE, "retry-after": "Sun, 05 Apr 2026 14:29:20 GMT"})
    assert dated == RateLimitSnapshot(retry_after=30.0)


def test_unparseable_values_are_dropped_and_the_rest_kept() -> None:
    snapshot = parse_rate_limits(
        {
            "x-ratelimit-limit-requests": "lots",
            "x-ratelimit-remaining-requests": "5",
            "x-ratelimit-reset-requests": "soon",
            "x-ratelimit-limit-tokens": "-3",
            "x-ratelimit-remaining-tokens": "1e400",
            "anthropic-ratelimit-tokens-reset": "tomorrow",
            "retry-after": "later",
        }
    )
    assert snapshot == RateLimitSnapshot(requests=RateLimitBudget(None, 5, None))


def test_no_rate_limit_headers_is_none() -> None:
    assert parse_rate_limits({"content-type": "text/event-stream", "date": DATE}) is None
    assert parse_rate_limits([]) is None


def test_snapshot_helpers() -> None:
    snapshot = RateLimitSnapshot(
        requests=RateLimitBudget(60, 0, 4.0), tokens=RateLimitBudget(1000, 900, 6.0)
    )
    assert [name for name, _ in snapshot.budgets()] == ["requests", "tokens"]
    assert snapshot.exhausted() == ("requests", 4.0)
    assert snapshot.exhausted(reserve=0.2) == ("requests", 4.0)
    assert snapshot.tokens is not None and snapshot.tokens.used_fraction == pytest.approx(0.1)
    assert RateLimitSnapshot().empty and not snapshot.empty


_NAMES = st.sampled_from(
    [
        f"{prefix}-{part}-{dim}"
        for prefix in ("x-ratelimit",)
        for part in ("limit", "remaining", "reset")
        for dim in ("requests", "tokens")
    ]
    + [
        f"anthropic-ratelimit-{dim}-{part}"
        for dim in ("requests", "tokens", "input-tokens", "output-tokens")
        for part in ("limit", "remaining", "reset")
    ]
    + [
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
        "retry-after-ms",
        "date",
    ]
)
_NUMBERS = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)
_VALUES = st.one_of(
    st.text(max_size=40),
    _NUMBERS,
    st.tuples(_NUMBERS, st.sampled_from(["h", "m", "s", "ms", "us", "x"])).map("".join),
    st.tuples(st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)).map(
        lambda p: f"{p[0]:04d}-{p[1]:02d}-{p[2]:02d}T{p[3]:02d}:00:00Z"
    ),
    st.tuples(st.sampled_from(["r", "q", "t", "w", "limit"]), _NUMBERS).map(
        lambda p: f'"default";{p[0]}={p[1]}'
    ),
)


@given(st.dictionaries(_NAMES, _VALUES, max_size=12))
def test_any_header_values_parse_without_raising(headers: dict[str, str]) -> None:
    snapshot = parse_rate_limits(headers)
    if snapshot is None:
        return
    if snapshot.retry_after is not None:
        assert math.isfinite(snapshot.retry_after) and snapshot.retry_after >= 0
    for _, budget in snapshot.budgets():
        for count in (budget.limit, budget.remaining):
            assert count is None or count >= 0
        if budget.reset_after is not None:
            assert math.isfinite(budget.reset_after) and budget.reset_after >= 0


def test_http_errors_carry_the_snapshot_beside_the_raw_headers() -> None:
    info = classify_http_error(
        429,
        {
            "retry-after": "3",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-reset-requests": "3s",
            "RateLimit-Policy": '"d";q=60;w=60',
        },
        b'{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}',
    )
    assert info.rate_limit["x-ratelimit-remaining-requests"] == "0"
    assert info.rate_limit["ratelimit-policy"] == '"d";q=60;w=60'
    assert info.rate_limit_snapshot == RateLimitSnapshot(
        requests=RateLimitBudget(60, 0, 3.0), retry_after=3.0
    )


def test_redaction_scrubs_the_raw_values_and_keeps_the_numbers() -> None:
    secret = "sk-proj-" + "A" * 40
    info = classify_http_error(
        429, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-note": secret}, b""
    )
    scrubbed = Redactor().error(info)
    assert secret not in repr(scrubbed)
    assert scrubbed.rate_limit_snapshot == RateLimitSnapshot(
        requests=RateLimitBudget(None, 0, None)
    )


def test_stream_started_carries_the_snapshot() -> None:
    transform = new_transform("chat_completions", "r1")
    started = transform.start({"x-ratelimit-remaining-requests": "7"}, attempt=2)[0]
    assert isinstance(started, StreamStarted) and started.attempt == 2
    assert started.rate_limit == RateLimitSnapshot(requests=RateLimitBudget(None, 7, None))
    bare = new_transform("messages", "r2").start({"content-type": "text/event-stream"})[0]
    assert isinstance(bare, StreamStarted) and bare.rate_limit is None


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/responses", {"model": "m", "input": "hi"}),
        (
            "/messages",
            {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
async def test_the_emulators_limits_read_back(path: str, body: dict[str, object]) -> None:
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=10_000, refund_unused=False)
    app = EmulatorApp(cache=PromptCache(), rate_limits=limits)
    async with httpx2.AsyncClient(transport=EmulatorTransport(app)) as client:
        response = await client.post("http://emulator.test/v1" + path, json=body)
    snapshot = parse_rate_limits(response.headers)
    assert snapshot is not None and snapshot.requests is not None
    assert snapshot.requests.limit == 60 and snapshot.requests.remaining == 59
    assert snapshot.requests.reset_after is not None and snapshot.requests.reset_after <= 1.0
    assert snapshot.tokens is not None and snapshot.tokens.limit == 10_000
    assert snapshot.tokens.remaining is not None and snapshot.tokens.remaining < 10_000


def test_families_together_read_as_each_alone() -> None:
    # Only the families with a header present are looked up: together, each still reads
    # what it reads alone (and the first family's dimension wins, as it did).
    openai = {"x-ratelimit-limit-requests": "100", "x-ratelimit-reset-requests": "1s"}
    anthropic = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-tokens-remaining": "7",
        "anthropic-ratelimit-tokens-reset": "2026-04-05T14:29:00Z",
    }
    ietf = {"ratelimit": "limit=10, remaining=3, reset=4"}
    retry = {"retry-after": "Sun, 05 Apr 2026 14:29:20 GMT"}
    alone = [parse_rate_limits({"date": DATE, **h}) for h in (openai, anthropic, ietf, retry)]
    together = parse_rate_limits({"date": DATE, **openai, **anthropic, **ietf, **retry})
    assert together == RateLimitSnapshot(
        requests=alone[0].requests if alone[0] else None,
        tokens=alone[1].tokens if alone[1] else None,
        retry_after=alone[3].retry_after if alone[3] else None,
    )
    assert together is not None and together.tokens == RateLimitBudget(None, 7, 10.0)
    assert parse_rate_limits({"date": DATE, **ietf}) == RateLimitSnapshot(
        requests=RateLimitBudget(10, 3, 4.0)
    )


def test_an_absolute_reset_is_read_against_now_or_date_and_never_a_clock() -> None:
    # The wire layer reads no clock: an absolute time becomes a wait only against the
    # ``now`` the caller gives or the response's own Date header.
    headers = {"anthropic-ratelimit-requests-limit": "50"}
    headers["anthropic-ratelimit-requests-reset"] = "2026-04-05T14:29:00Z"
    alone = parse_rate_limits(headers)
    assert alone is not None and alone.requests is not None
    assert alone.requests.limit == 50 and alone.requests.reset_after is None
    dated = parse_rate_limits({**headers, "date": "Sun, 05 Apr 2026 14:28:30 GMT"})
    assert dated is not None and dated.requests is not None
    assert dated.requests.reset_after == 30.0
    given = parse_rate_limits(headers, now=dated_now())
    assert given is not None and given.requests is not None
    assert given.requests.reset_after == 10.0
    assert parse_rate_limits({"retry-after": "Sun, 05 Apr 2026 14:29:20 GMT"}) is None


def dated_now() -> float:
    """2026-04-05T14:28:50Z as a Unix time."""
    return 1775399330.0
