"""Configuration: :class:`SamplerConfig`, :class:`Timeouts`, :class:`RetryPolicy`, :class:`Secret`.

Every value is an attrs frozen class validated at construction: a bad value fails where it
is written, with a message that says what to fix, not deep inside a request. Plain data,
no I/O (``for_provider`` reads a mapping you pass, ``os.environ`` by default).

The API key lives in a :class:`Secret`, whose ``repr``/``str`` never show it: a config can
be logged, printed or put in an exception safely.
"""

from __future__ import annotations

import hmac
import math
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._redact import check_credential, is_credential_name
from .models import ModelCatalog
from .providers import AuthScheme, ProviderProfile, get_profile
from .ratelimit import RateLimitPacing
from .types import ApiBackend
from .types._conversation import coerce_enum
from .wire import get_backend
from .wire._request import BuildOptions, validate_headers
from .wire.messages import ANTHROPIC_VERSION

__all__ = [
    "DEFAULT_ANTHROPIC_VERSION",
    "AuthScheme",
    "RetryPolicy",
    "SamplerConfig",
    "Secret",
    "Timeouts",
]

DEFAULT_ANTHROPIC_VERSION = ANTHROPIC_VERSION
_MIB = 1024 * 1024


class Secret:
    """A string that never shows itself: ``repr``/``str``/``format`` give ``Secret('***')``.

    Call :meth:`reveal` at the one place the value is needed (building the auth header).
    Equality compares in constant time.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret holds a str, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """The secret itself. Never log the result."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> Any:
        # Pickling would write the key in clear to wherever the pickle goes.
        raise TypeError("Secret cannot be pickled")


def _to_secret(value: str | Secret | None) -> Secret | None:
    if value is None or isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise TypeError(f"api_key must be a str or Secret, not {type(value).__name__}")
    return Secret(value)


def _positive(name: str, value: float | None, *, optional: bool = False) -> None:
    if value is None:
        if optional:
            return
        raise ValueError(f"{name} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        hint = " or None for no limit" if optional else ""
        raise ValueError(f"{name} must be a positive, finite number of seconds{hint}; got {value}")


@attrs.frozen
class Timeouts:
    """The separate timeouts of one request, in seconds (``docs/configuration.md``).

    * ``connect`` (10 s): TCP + TLS; longer means the host is unreachable.
    * ``write`` (60 s): sending the body (large image payloads on slow uplinks).
    * ``response_headers`` (60 s): from sending to the status line. Servers answer with
      headers before generating (Grok Build's sampler, ``xai-org/grok-build``, has no such
      limit and hangs).
    * ``first_token`` (300 s): headers to first content. Long, because reasoning models
      think for minutes before they speak.
    * ``idle`` (120 s): between content events. Pings and SSE comments do not reset it.
    * ``total`` (None): a deadline for the whole request, off by default because agent
      turns legitimately run long.

    The five are independent: none caps another, and each failure says which fired and
    after how long. The socket read timeout is only a backstop for a dead connection,
    ``max(response_headers, first_token, idle)`` (:attr:`read`), so it never fires before
    the wait it backs: the client bounds the wait for the response head by
    ``response_headers`` and the actor the first-token and idle waits by theirs.
    """

    connect: float = 10.0
    write: float = 60.0
    response_headers: float = 60.0
    first_token: float = 300.0
    idle: float = 120.0
    total: float | None = None

    def __attrs_post_init__(self) -> None:
        for field in ("connect", "write", "response_headers", "first_token", "idle"):
            _positive(f"Timeouts.{field}", getattr(self, field))
        _positive("Timeouts.total", self.total, optional=True)

    @property
    def read(self) -> float:
        """The socket read timeout given to the HTTP library: a backstop no shorter than
        any wait it could cut short (the response head, the first token, idleness)."""
        return max(self.response_headers, self.first_token, self.idle)


@attrs.frozen
class RetryPolicy:
    """How the actor retries (``docs/retry-policy.md``). Backoff before retry ``n`` (0-based) is
    ``min(base_delay * 2**n, max_delay) * (1 - jitter * U)``, ``U`` uniform in [0, 1).

    * ``max_retries`` (4): retries after the first attempt (5 attempts in all); the SDKs
      use 2, which gives up during a short provider blip.
    * ``max_retry_after`` (60 s): a server-requested wait is honoured up to this; longer
      ones fail fast rather than block a request for minutes.
    * ``max_consecutive_rate_limits`` (3): a separate, small cap on back-to-back 429s.
    * ``retry_budget_ratio`` (None = off): retries may be at most this share of the
      actor's requests within ``retry_budget_window_s``, so an outage does not multiply load.
    * ``retry_mid_stream`` (True): retry after output started, with ``discard_partial``.
    """

    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.25
    max_retry_after: float = 60.0
    max_consecutive_rate_limits: int = 3
    retry_budget_ratio: float | None = None
    retry_budget_window_s: float = 10.0
    retry_mid_stream: bool = True

    def __attrs_post_init__(self) -> None:
        for name in ("max_retries", "max_consecutive_rate_limits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be an int >= 0; got {value!r}")
        for name in ("base_delay", "max_delay", "max_retry_after", "retry_budget_window_s"):
            _positive(f"RetryPolicy.{name}", getattr(self, name))
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"RetryPolicy.max_delay ({self.max_delay}) must be >= base_delay "
                f"({self.base_delay})"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter is a fraction in [0, 1]; got {self.jitter}")
        if self.retry_budget_ratio is not None:
            check_retry_budget(self.retry_budget_ratio, self.retry_budget_window_s)


def check_retry_budget(ratio: float, window: float) -> None:
    """The one rule for a retry budget: a ratio in (0, 1], a positive window in seconds."""
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 < ratio <= 1.0:
        raise ValueError(
            f"RetryPolicy.retry_budget_ratio is a fraction in (0, 1] or None; got {ratio!r} "
            "(e.g. 0.2 allows retries up to 20 % of recent requests)"
        )
    _positive("RetryPolicy.retry_budget_window_s", window)


def _to_backend(value: ApiBackend | str) -> ApiBackend | str:
    """An :class:`ApiBackend`, or its name (``"chat_completions"``, ``"responses"``,
    ``"messages"``, any case), or the name of a backend added with
    :func:`trio_sampler.wire.register_backend` (checked after construction)."""
    if isinstance(value, str) and not isinstance(value, ApiBackend):
        try:
            return coerce_enum(ApiBackend, value, "backend")
        except ValueError:
            return value
    return value


def _to_auth_scheme(value: AuthScheme | str) -> AuthScheme:
    """An :class:`AuthScheme`, or its name (``"bearer"``, ``"x_api_key"``, ``"none"``,
    ``"aws_sigv4"``, which needs the ``bedrock`` extra)."""
    scheme = coerce_enum(AuthScheme, value, "auth_scheme")
    if scheme is AuthScheme.AWS_SIGV4:
        from ._sigv4 import require_botocore

        require_botocore()
    return scheme


def _validate_base_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ValueError("base_url is required, e.g. 'https://api.openai.com/v1'")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "base_url must be an absolute http:// or https:// URL such as "
            f"'https://api.openai.com/v1'; got a URL with scheme {parts.scheme or 'none'!r}"
        )
    if parts.username or parts.password:
        raise ValueError("base_url must not contain credentials; pass the key as api_key")
    if parts.query or parts.fragment:
        raise ValueError(
            "base_url must not contain a query or fragment; pass query parameters "
            "as query_params={...}"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _pairs(
    value: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


def _redacted_pairs(pairs: tuple[tuple[str, str], ...]) -> str:
    shown = [(k, "***" if is_credential_name(k) else v) for k, v in pairs]
    return repr(tuple(shown))


#: The values of ``SamplerConfig.http_transport``.
HTTP_TRANSPORTS = ("direct", "httptools", "httpx")

#: SamplerConfig's fields of an object type: (name, type, what to write). ``None`` is
#: allowed where the field's default is ``None``.
_FIELD_KINDS: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("model", str, 'a model name such as "gpt-5-mini", or None'),
    ("provider", str, 'a provider profile name such as "openai", or None'),
    ("anthropic_version", str, "a date string such as '2023-06-01'"),
    ("timeouts", Timeouts, "a Timeouts(...) (e.g. Timeouts(first_token=60))"),
    ("retry", RetryPolicy, "a RetryPolicy(...) (e.g. RetryPolicy(max_retries=2))"),
)


@attrs.frozen
class SamplerConfig:
    """Everything needed to talk to one endpoint. Validated at construction.

    ``api_key`` is stored as a :class:`Secret` (a plain ``str`` is wrapped); ``repr`` never
    shows it, nor the values of extra headers or query parameters whose names look like
    credentials.
    """

    base_url: str = attrs.field(converter=_validate_base_url)
    #: An :class:`ApiBackend`, or the name of a backend added with
    #: :func:`trio_sampler.wire.register_backend`.
    backend: ApiBackend | str = attrs.field(
        default=ApiBackend.CHAT_COMPLETIONS, converter=_to_backend
    )
    model: str | None = None
    api_key: Secret | None = attrs.field(default=None, converter=_to_secret)
    #: An :class:`AuthScheme`, or its name (``"bearer"``, ``"x_api_key"``, ``"none"``).
    auth_scheme: AuthScheme = attrs.field(default=AuthScheme.BEARER, converter=_to_auth_scheme)
    #: Sent as ``anthropic-version`` by backends that send one (Messages).
    anthropic_version: str = DEFAULT_ANTHROPIC_VERSION
    extra_headers: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_pairs, repr=_redacted_pairs
    )
    query_params: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_pairs, repr=_redacted_pairs
    )
    timeouts: Timeouts = attrs.field(factory=Timeouts)
    #: One SSE event may not exceed this (a hostile server cannot exhaust memory).
    max_sse_event_bytes: int = 16 * _MIB
    #: A whole response body may not exceed this.
    max_response_bytes: int = 256 * _MIB
    #: Try HTTP/2 (only if the ``h2`` package is installed; off by default, see docs).
    http2: bool = False
    #: Idle connections kept for reuse. Live streams are not limited by the pool.
    max_keepalive_connections: int = 64
    #: Connection pools the client spreads streams over (each stream goes to the least
    #: busy). Measured: one pool under thousands of concurrent streams spends its time in
    #: bookkeeping; see docs/benchmarks-actor.md.
    connection_pools: int = 16
    #: Time each network read by when its bytes reached the socket (the kernel's receive
    #: timestamp; Linux, HTTP/1.1 over TCP) rather than when the read returned: the
    #: metrics' headers, first token, token gaps and last byte then leave out how late the
    #: client got to its reads. About a microsecond per read; the load generator turns it
    #: on. Read when the sampler starts, like ``connection_pools``.
    receive_timestamps: bool = False
    #: What carries the bytes when no ``transport`` is given to the sampler:
    #: ``"direct"`` (httpcore2's pools; HTTP/2 when asked), ``"httptools"`` (HTTP/1.1 over
    #: trio sockets parsed by llhttp, the least CPU per token; needs the ``fast`` extra)
    #: or ``"httpx"`` (``httpx2.AsyncClient``'s public API). See docs/configuration.md.
    http_transport: str = "direct"
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    #: Provider profile name: selects wire quirks (see :mod:`trio_sampler.providers`).
    provider: str | None = None
    #: ``max_tokens`` sent when the request sets none (Messages requires one).
    default_max_output_tokens: int = 8192
    #: Place Anthropic ``cache_control`` breakpoints.
    cache_breakpoints: bool = True
    #: Fail instead of converting what a backend cannot carry.
    strict_conversion: bool = False
    #: Extra top-level JSON fields merged into every request body last, for server knobs
    #: the request model does not name (vLLM's ``ignore_eos``, ``min_tokens``, ...).
    extra_body: Mapping[str, Any] = attrs.field(factory=dict, converter=dict, hash=False)
    #: Hold attempts back while the provider's rate-limit headers say its budget has no
    #: room for them (see :mod:`trio_sampler.ratelimit`); ``None`` turns pacing off.
    #: Without rate-limit headers from the server it never holds anything.
    rate_limit_pacing: RateLimitPacing | None = attrs.field(factory=RateLimitPacing)

    def _check_kinds(self) -> None:
        """Each field of an object type holds that type (a dict for a policy object, a
        number for a name: the field named, and what to write)."""
        for name, kind, example in _FIELD_KINDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{name} must be {example}, not a {type(value).__name__}")
        for name in ("model", "provider", "anthropic_version"):
            value = getattr(self, name)
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"{name} holds a lone surrogate; write valid text") from None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.backend, ApiBackend | str):
            raise TypeError(
                'backend must be an ApiBackend or its name ("chat_completions", "responses", '
                f'"messages", or a registered backend\'s), not a {type(self.backend).__name__}'
            )
        get_backend(self.backend)  # a name nobody registered fails with the known ones
        if self.rate_limit_pacing is not None and not isinstance(
            self.rate_limit_pacing, RateLimitPacing
        ):
            raise TypeError(
                "rate_limit_pacing must be a trio_sampler.ratelimit.RateLimitPacing(...) or "
                f"None (no pacing), not a {type(self.rate_limit_pacing).__name__}"
            )
        self._check_kinds()
        if self.model is not None and not self.model.strip():
            raise ValueError("model must be a non-empty name or None")
        if self.api_key is not None:
            check_credential(self.api_key.reveal(), "api_key")
        if any(c in self.anthropic_version for c in "\r\n\0") or not self.anthropic_version:
            raise ValueError("anthropic_version must be a date string such as '2023-06-01'")
        validate_headers(self.extra_headers, what="extra header")
        for key, value in self.query_params:
            if not key or any(c in key + value for c in "\r\n\0"):
                raise ValueError(f"query parameter {key!r} is empty or contains CR/LF/NUL")
            if is_credential_name(key):
                check_credential(value, f"query parameter {key!r}")
        for name in ("max_sse_event_bytes", "max_response_bytes", "default_max_output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if self.max_keepalive_connections < 0:
            raise ValueError("max_keepalive_connections must be >= 0")
        if not isinstance(self.receive_timestamps, bool):
            raise ValueError(
                f"receive_timestamps must be True or False; got {self.receive_timestamps!r}"
            )
        if self.http_transport not in HTTP_TRANSPORTS:
            raise ValueError(
                f"http_transport must be one of {', '.join(map(repr, HTTP_TRANSPORTS))}; "
                f"got {self.http_transport!r}"
            )
        if not 1 <= self.connection_pools <= 1024:
            raise ValueError("connection_pools must be between 1 and 1024 (16 is the default)")
        if self.provider is not None:
            get_profile(self.provider)  # raises with the list of known names

    @property
    def profile(self) -> ProviderProfile | None:
        """The provider profile named by ``provider``, if any."""
        return get_profile(self.provider) if self.provider is not None else None

    @property
    def stream_media_type(self) -> str:
        """What a streamed answer comes as: ``text/event-stream`` (SSE), or the profile's
        own (Bedrock's ``application/vnd.amazon.eventstream``)."""
        profile = self.profile
        return "text/event-stream" if profile is None else profile.stream_media_type

    @classmethod
    def for_provider(
        cls,
        name: str,
        *,
        model: str | None = None,
        api_key: str | Secret | None = None,
        base_url: str | None = None,
        env: Mapping[str, str] = os.environ,
        **overrides: Any,
    ) -> SamplerConfig:
        """A config from the profile ``name``: its base URL, backend and auth scheme.

        A ``model`` the shipped catalog (``default_models.json``) lists for this provider
        picks its backend, base URL and output limit from there; ``base_url`` and
        ``overrides`` (``backend=...``, ``default_max_output_tokens=...``) still win.

        The key comes from ``api_key``, else the profile's environment variable in ``env``.
        A provider that needs a key and has none raises :class:`ValueError` naming the
        variable to set. ``overrides`` are any other :class:`SamplerConfig` fields.
        """
        profile = get_profile(name)
        url = base_url or profile.base_url
        if url is None:
            raise ValueError(f"provider {profile.name!r} has no standard address: pass base_url=")
        key = _to_secret(api_key)
        if key is None and profile.api_key_env is not None:
            # Surrounding whitespace in a variable (a trailing newline from a file) is
            # unambiguous and dropped; anything else wrong is named with the variable.
            from_env = env.get(profile.api_key_env, "").strip()
            check_credential(from_env, f"the environment variable {profile.api_key_env}")
            key = Secret(from_env) if from_env else None
        if key is None and profile.requires_api_key:
            raise ValueError(
                f"provider {profile.name!r} needs an API key: set the environment variable "
                f"{profile.api_key_env} or pass api_key="
            )
        signed = profile.auth_scheme is AuthScheme.AWS_SIGV4
        scheme = profile.auth_scheme if key is not None or signed else AuthScheme.NONE
        chosen = model or profile.default_model
        fields: dict[str, Any] = {
            "base_url": url,
            "backend": profile.backend,
            "model": chosen,
            "api_key": key,
            "auth_scheme": scheme,
            "provider": profile.name,
        }
        # A model of the shipped catalog served by this provider brings its protocol, its
        # address and its output limit (each still overridable).
        info = ModelCatalog.shipped().get(chosen) if chosen else None
        if info is not None and info.provider == profile.name:
            fields["backend"] = info.backend
            if base_url is None and info.base_url is not None:
                fields["base_url"] = info.base_url
            fields["default_max_output_tokens"] = min(8192, info.max_output_tokens)
        fields.update(overrides)
        return cls(**fields)

    def auth_headers(self) -> list[tuple[str, str]]:
        """The credential header for ``auth_scheme`` (empty without a key or for NONE)."""
        if not self.api_key or self.auth_scheme in (AuthScheme.NONE, AuthScheme.AWS_SIGV4):
            return []  # no key, or every request is signed (SigV4, in the client)
        if self.auth_scheme is AuthScheme.X_API_KEY:
            return [("x-api-key", self.api_key.reveal())]
        return [("authorization", f"Bearer {self.api_key.reveal()}")]

    def credentials(
        self, extra_headers: Iterable[tuple[str, str]] = ()
    ) -> tuple[tuple[str, str], ...]:
        """``(label, value)`` for every credential a request with this config carries:
        the API key (label ``api_key``), then the values of credential-named headers (the
        config's, then ``extra_headers``, such as a request's own) and query parameters,
        labelled by name; with SigV4, the AWS session token and secret key of the
        credentials it signs with. These exact values are what redaction scrubs from every string
        that leaves the library (``docs/contract.md`` §7). Never log the result.
        """
        found: list[tuple[str, str]] = []
        if self.api_key:
            found.append(("api_key", self.api_key.reveal()))
        for name, value in (*self.extra_headers, *extra_headers):
            if is_credential_name(name):
                found.append((name.lower(), value))
        found += [(name, value) for name, value in self.query_params if is_credential_name(name)]
        if self.auth_scheme is AuthScheme.AWS_SIGV4:
            from ._sigv4 import secrets

            found += secrets()
        return tuple(found)

    @property
    def credentials_change(self) -> bool:
        """Whether :meth:`credentials` may give other values later: with SigV4, the
        temporary credentials botocore refreshes (a new session token). Whoever caches
        a redactor per config asks again each time for such a config."""
        return self.auth_scheme is AuthScheme.AWS_SIGV4

    def request_headers(self) -> list[tuple[str, str]]:
        """Headers on every request: auth, the backend's default headers (Messages:
        ``anthropic-version``, from :attr:`anthropic_version`), extra headers.

        Extra headers come last and replace a same-named header before them, so a gateway
        can take over ``authorization`` deliberately.
        """
        headers = self.auth_headers()
        for name, value in get_backend(self.backend).default_headers:
            headers.append((name, self.anthropic_version if name == "anthropic-version" else value))
        overridden = {name.lower() for name, _ in self.extra_headers}
        headers = [(k, v) for k, v in headers if k.lower() not in overridden]
        headers.extend(self.extra_headers)
        return headers

    def build_options(self, *, stream: bool = True) -> BuildOptions:
        """The options the request builders take, from this config."""
        return BuildOptions(
            model=self.model,
            provider=self.provider,
            stream=stream,
            default_max_output_tokens=self.default_max_output_tokens,
            cache_breakpoints=self.cache_breakpoints,
            strict=self.strict_conversion,
            extra_body=self.extra_body,
        )

    def evolve(self, **changes: Any) -> SamplerConfig:
        """A copy with ``changes`` applied (and validated)."""
        return attrs.evolve(self, **changes)
