"""The redactor: every form of a held credential, credential shapes, events, log records."""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse

import pytest

from trio_sampler._redact import (
    LOGGER_NAMES,
    MAX_IDENTIFIER_CHARS,
    RedactingFilter,
    Redactor,
    redactor_for,
    scrub_secrets,
)
from trio_sampler.client import SamplingClient
from trio_sampler.config import SamplerConfig
from trio_sampler.types import (
    Assistant,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationResponse,
    Failed,
    ImagesStripped,
    ModelMetadata,
    RequestMetrics,
    Retrying,
    SamplingChannel,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StreamStarted,
    StripReason,
    ToolCallDelta,
)

STRIP = StripReason.PAYLOAD_HEURISTIC

KEY = "Kp2xLm9QrT4vWz7YbN3cF6hJ8aD1eG5s"  # 32 characters, no known provider shape
MASK = "[REDACTED api_key …eG5s]"
R = Redactor([("api_key", KEY)])


def _b64_core(key: str, offset: int) -> str:
    raw = key.encode()
    encoded = base64.b64encode(b"\0" * offset + raw).decode()
    return encoded[4 if offset else 0 : 4 * ((offset + len(raw)) // 3)]


@pytest.mark.parametrize(
    "form",
    [
        KEY,
        KEY.upper(),
        KEY.lower(),
        urllib.parse.quote(KEY + "/+=", safe=""),
        base64.b64encode(KEY.encode()).decode(),
        base64.urlsafe_b64encode(KEY.encode()).decode(),
        base64.b64encode(f"user:{KEY}".encode()).decode(),  # a Basic credential
        base64.b64encode(f"ab{KEY}cd".encode()).decode(),
        base64.urlsafe_b64encode(f'{{"k":"{KEY}"}}'.encode()).decode().rstrip("="),  # a JWT part
        KEY[:14],  # a truncated echo
        KEY[9:25],
    ],
)
def test_every_form_of_a_held_key_is_scrubbed(form: str) -> None:
    text = f"the server said: {form} (end)"
    scrubbed = R.text(text)
    assert scrubbed.startswith("the server said: [REDACTED api_key")
    assert scrubbed.endswith(" (end)")
    for core in (KEY, *(_b64_core(KEY, o) for o in range(3))):
        for piece in (core[i : i + 12] for i in range(len(core) - 11)):
            assert piece.lower() not in scrubbed.lower()


def test_escaped_forms_of_a_key_with_punctuation() -> None:
    key = "pw\"with\\slash/and'quote"
    redactor = Redactor([("password", key)])
    for form in (json.dumps(key)[1:-1], json.dumps(key)[1:-1].replace("/", "\\/"), repr(key)):
        assert redactor.text(f"<{form}>") in (
            "<[REDACTED password …uote]>",
            "<'[REDACTED password …uote]'>",
        )


def test_what_a_scrubbed_value_looks_like() -> None:
    assert R.text(f"key {KEY}.") == f"key {MASK}."
    # Short values get no tail: four characters of eight would be half the key.
    assert Redactor([("x-token", "abcd1234")]).text("t=abcd1234") == "t=[REDACTED x-token]"
    # A key we were never told about, shaped like one.
    assert R.text("also sk-proj-abcdefghijklmnop") == "also [REDACTED]"


def test_fragments_and_short_values_are_left() -> None:
    # Under 12 characters of a longer key, and values under 8 characters, are not secrets
    # worth mangling ordinary text for.
    assert R.text(f"x {KEY[:11]} y") == f"x {KEY[:11]} y"
    assert Redactor([("api_key", "local")]).text("localhost") == "localhost"


def test_scrubbing_is_idempotent_and_returns_the_same_object_when_clean() -> None:
    text = f"a {KEY} b Bearer {KEY} c ?key={KEY}&x=1"
    once = R.text(text)
    assert R.text(once) == once
    clean = "nothing to see"
    assert R.text(clean) is clean


def test_text_outside_ascii_keeps_its_offsets() -> None:
    # "İ".lower() is two code points; folding case must not shift what is cut.
    text = f"İİİ {KEY} İ"
    assert R.text(text) == f"İİİ {MASK} İ"


def test_authorization_values_are_split_into_their_secret_parts() -> None:
    basic = base64.b64encode(b"svc-user:pa55word-xyz").decode()
    redactor = Redactor([("authorization", f"Basic {basic}")])
    assert "pa55word-xyz" not in redactor.text("login with pa55word-xyz failed")
    bearer = Redactor([("authorization", f"Bearer {KEY}")])
    assert bearer.text(f"token {KEY}") == "token [REDACTED authorization …eG5s]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("AIzaSyD3x7Kq9LmPz2Vb8Nc4Wr6Ty1Ue5Io0Pa", "[REDACTED]"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc_DEF-123", "[REDACTED]"),
        (
            "u?x-goog-api-key=abc&auth=def&code=ghi&sig=j",
            "u?x-goog-api-key=[REDACTED]&auth=[REDACTED]&code=[REDACTED]&sig=[REDACTED]",
        ),
        ("x-api-key: 9f86d081884c7d659a2feaa0c55ad015", "x-api-key: [REDACTED]"),
        ('{"api_key": "abcdefghijklmnop"}', '{"api_key": "[REDACTED]"}'),
        ("authorization: Bearer abc.def", "authorization: Bearer [REDACTED]"),
        ("xai-abcdefgh12345678 and gsk_abcdefgh12345678", "[REDACTED] and [REDACTED]"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[REDACTED]"),
        # Prose stays readable.
        ("invalid token: expired", "invalid token: expired"),
        ("send a Bearer token", "send a Bearer token"),
        ("the task-runner asked a risky question", "the task-runner asked a risky question"),
        ("max_tokens: 4096", "max_tokens: 4096"),
    ],
)
def test_credential_shapes(text: str, expected: str) -> None:
    assert scrub_secrets(text) == expected


def test_error_info_every_field() -> None:
    info = SamplingErrorInfo(
        kind=SamplingErrorKind.AUTH,
        message=f"bad key {KEY}",
        status_code=401,
        error_type=KEY,
        error_code=KEY,
        provider_request_id=KEY,
        rate_limit={"x-ratelimit-limit-requests": KEY, f"x-ratelimit-{KEY}": "1"},
    )
    scrubbed = R.error(info)
    assert KEY not in repr(scrubbed)
    assert scrubbed.message == f"bad key {MASK}"
    assert scrubbed.error_code == MASK and scrubbed.provider_request_id == MASK
    assert scrubbed.rate_limit["x-ratelimit-limit-requests"] == MASK
    assert scrubbed.kind is SamplingErrorKind.AUTH and scrubbed.status_code == 401
    clean = SamplingErrorInfo(kind=SamplingErrorKind.API, message="fine")
    assert R.error(clean) is clean


def test_identifiers_are_cut() -> None:
    long = "m" * 10_000
    assert R.identifier(long) == "m" * MAX_IDENTIFIER_CHARS + "…"


def test_events_scrubbed_and_content_untouched() -> None:
    response = ConversationResponse(
        items=[Assistant(f"the model said {KEY}", model=KEY, id=KEY)],
        model=KEY,
        response_id=KEY,
    )
    error = SamplingErrorInfo(kind=SamplingErrorKind.API, message=KEY)
    metrics = RequestMetrics()
    events: list[SamplingEvent] = [
        StreamStarted("r"),
        ModelMetadata("r", model=KEY, response_id=KEY),
        ChannelToken("r", SamplingChannel.TEXT, KEY, 1),
        ToolCallDelta("r", 0, None, None, KEY),
        Retrying("r", 1, 2, SamplingErrorKind.API, KEY, 0.1, True, ()),
        ImagesStripped(
            "r", (f"https://img.test/a.png?sig={KEY}", "data:image/png;base64,AAAA"), STRIP
        ),
        Completed("r", response, metrics),
        Failed("r", error, response, metrics),
        Cancelled("r", KEY, response, metrics),
    ]
    out = R.events(events)
    started, metadata, token, delta, retrying, stripped, completed, failed, cancelled = out
    assert started is events[0] and token is events[2] and delta is events[3]
    assert KEY not in repr([metadata, retrying, stripped])
    assert isinstance(stripped, ImagesStripped)
    assert stripped.stripped_urls[1] == "data:image/png;base64,AAAA"
    for terminal in (completed, failed, cancelled):
        assert isinstance(terminal, Completed | Failed | Cancelled)
        text = repr(terminal)
        # Generated content is the payload and passes; every identifier is scrubbed.
        assert text.count(KEY) == 1 and f"the model said {KEY}" in text
    clean: list[SamplingEvent] = [
        StreamStarted("r"),
        ChannelToken("r", SamplingChannel.TEXT, "hi", 1),
    ]
    assert R.events(clean) is clean
    # A batch of one event (one token per read; a retry's notice alone), and of tokens.
    tokens: list[SamplingEvent] = [ChannelToken("r", SamplingChannel.TEXT, KEY, 1)] * 3
    one = tokens[:1]
    assert R.events(tokens) is tokens and R.events(one) is one
    (alone,) = R.events([events[4]])
    assert isinstance(alone, Retrying) and KEY not in repr(alone)


def test_each_response_model_is_scrubbed_whatever_came_before() -> None:
    # The redactor remembers the last model name it scrubbed: the same name again, a
    # clean one after it and the first one back are each what scrubbing them gives.
    redactor = Redactor([("api_key", KEY)])
    leaked, clean = f"ft:{KEY}", "gpt-4o-mini-2024-07-18"
    for model in (leaked, leaked, clean, leaked, clean):
        response = redactor.response(ConversationResponse(items=[Assistant("hi")], model=model))
        assert response is not None
        assert response.model == R.identifier(model)
        assert (KEY in repr(response)) is False
    assert R.identifier(clean) == clean


def test_config_credentials_and_cached_redactor() -> None:
    config = SamplerConfig(
        base_url="https://x.test",
        api_key=KEY,
        extra_headers={"X-Goog-Api-Key": "g" * 20, "X-Title": "app"},
        query_params={"key": "q" * 20, "api-version": "2024"},
    )
    assert config.credentials([("x-auth-token", "t" * 20), ("accept", "x")]) == (
        ("api_key", KEY),
        ("x-goog-api-key", "g" * 20),
        ("x-auth-token", "t" * 20),
        ("key", "q" * 20),
    )
    assert redactor_for(config.credentials()) is redactor_for(config.credentials())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _filters(name: str) -> list[logging.Filter]:
    return [f for f in logging.getLogger(name).filters if isinstance(f, RedactingFilter)]


async def test_log_filter_lives_as_long_as_the_client() -> None:
    config = SamplerConfig(base_url="https://x.test", api_key=KEY)
    names = [*LOGGER_NAMES, "httpcore2.http11", "httpcore2.connection", "trio_sampler.emulator"]
    logging.getLogger("trio_sampler.emulator")  # a child that exists before the client
    before = {name: len(_filters(name)) for name in names}
    handler = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        async with SamplingClient(config):
            assert {name: len(_filters(name)) for name in names} == {
                name: count + 1 for name, count in before.items()
            }
            logging.getLogger("httpcore2.http11").debug("headers %r", [(b"x-echo", KEY.encode())])
            logging.getLogger("httpx2").info("%s %d %s", f"url?key={KEY}", 401, KEY)
            try:
                raise RuntimeError(f"boom {KEY}")
            except RuntimeError:
                logging.getLogger("trio_sampler.emulator").exception("failed with %s", KEY)
        assert {name: len(_filters(name)) for name in names} == before
        # Once the client is closed its filter is gone: nothing global is left behind.
        logging.getLogger("httpx2").info("after %s", KEY)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    formatter = logging.Formatter("%(message)s")
    texts = [formatter.format(r) for r in handler.records]
    assert texts[0] == "headers [(b'x-echo', b'" + MASK + "')]"
    # (Another client's filter, if one is open, may have hidden the query value first.)
    assert texts[1] in (f"url?key={MASK} 401 {MASK}", f"url?key=[REDACTED] 401 {MASK}")
    assert texts[2].startswith(f"failed with {MASK}\nTraceback") and KEY not in texts[2]
    assert texts[3] == f"after {KEY}"


def test_a_client_never_closed_takes_its_filter_with_it() -> None:
    import gc

    before = len(_filters("httpx2"))
    client = SamplingClient(SamplerConfig(base_url="https://x.test", api_key=KEY))
    assert len(_filters("httpx2")) == before + 1
    del client
    gc.collect()
    assert len(_filters("httpx2")) == before


def test_a_shape_split_between_format_and_argument_is_scrubbed_whole() -> None:
    """botocore's SigV4 signer logs ``"Signature:\\n%s"``: neither half is a credential
    alone, the formatted line is."""
    signature = "12f24214d02a9c1e7b3a4f6e8d9c0b1a2f3e4d5c6b7a89012f3e4d5c6b7a8901"
    record = logging.LogRecord(
        "botocore.auth", logging.DEBUG, "", 0, "Signature:\n%s", (signature,), None
    )
    log_filter = RedactingFilter()
    assert log_filter.filter(record)
    assert record.getMessage() == "Signature:\n[REDACTED]"
    plain = logging.LogRecord("x", logging.DEBUG, "", 0, "%d tokens of %s", (3, "text"), None)
    assert log_filter.filter(plain) and plain.args == (3, "text")
