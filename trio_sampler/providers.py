"""Provider profiles: where a provider lives, how it authenticates, and its wire quirks.

Pure data. :meth:`trio_sampler.config.SamplerConfig.for_provider` starts from a profile;
request builders and stream transforms look quirks up with :func:`get_profile` (by the
``provider`` name carried in :class:`~trio_sampler.wire._request.BuildOptions`).
"""

from __future__ import annotations

import enum

import attrs

from .types import ApiBackend

__all__ = [
    "PROFILES",
    "AuthScheme",
    "ProviderProfile",
    "get_profile",
]


class AuthScheme(enum.Enum):
    """How the API key is sent."""

    #: ``Authorization: Bearer <key>`` (OpenAI and every OpenAI-compatible server).
    BEARER = "bearer"
    #: ``x-api-key: <key>`` (Anthropic).
    X_API_KEY = "x_api_key"
    #: No credential header at all (local servers).
    NONE = "none"


@attrs.frozen
class ProviderProfile:
    """One provider: endpoint, auth and the quirks the wire layer needs.

    ``base_url`` is ``None`` for profiles whose address only the user knows
    (``openai_compatible``, ``emulator``): a ``base_url`` must then be given.
    """

    name: str
    base_url: str | None
    backend: ApiBackend
    auth_scheme: AuthScheme = AuthScheme.BEARER
    #: Environment variable holding the key; ``None`` when the provider has no standard one.
    api_key_env: str | None = None
    #: A request without a key is certain to fail with 401: refuse to build the config.
    requires_api_key: bool = True
    #: Model used when neither the config nor the request names one.
    default_model: str | None = None
    #: Chat Completions field for the output-token cap (``max_tokens`` is the older name,
    #: which OpenAI's reasoning models reject; most compatible servers only know it).
    max_tokens_field: str = "max_tokens"
    #: Assistant turns must carry their ``reasoning_content`` back (DeepSeek thinking mode
    #: with tool calls).
    reasoning_content_replay: bool = False
    #: Chat usage reports reasoning tokens outside ``completion_tokens`` (xAI): add them back.
    reasoning_tokens_outside_completion: bool = False
    #: The server understands ``stream_options: {"include_usage": true}``. Strict servers
    #: reject unknown fields, so the generic profile leaves it off.
    supports_stream_usage: bool = True
    #: Field that carries reasoning text in Chat deltas (``reasoning_content`` or ``reasoning``).
    reasoning_field: str = "reasoning_content"


PROFILES: dict[str, ProviderProfile] = {
    p.name: p
    for p in (
        ProviderProfile(
            name="openai",
            base_url="https://api.openai.com/v1",
            # Responses: the only OpenAI protocol that round-trips reasoning items.
            backend=ApiBackend.RESPONSES,
            api_key_env="OPENAI_API_KEY",
            default_model="gpt-5-mini",
            max_tokens_field="max_completion_tokens",
        ),
        ProviderProfile(
            name="anthropic",
            base_url="https://api.anthropic.com/v1",
            backend=ApiBackend.MESSAGES,
            auth_scheme=AuthScheme.X_API_KEY,
            api_key_env="ANTHROPIC_API_KEY",
            default_model="claude-sonnet-4-5",
        ),
        ProviderProfile(
            name="xai",
            base_url="https://api.x.ai/v1",
            # Responses carries encrypted reasoning and the doom-loop check signal.
            backend=ApiBackend.RESPONSES,
            api_key_env="XAI_API_KEY",
            default_model="grok-4",
            max_tokens_field="max_completion_tokens",
            reasoning_tokens_outside_completion=True,
        ),
        ProviderProfile(
            name="openrouter",
            base_url="https://openrouter.ai/api/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="OPENROUTER_API_KEY",
            reasoning_field="reasoning",
        ),
        ProviderProfile(
            name="deepseek",
            base_url="https://api.deepseek.com/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="DEEPSEEK_API_KEY",
            default_model="deepseek-chat",
            reasoning_content_replay=True,
        ),
        ProviderProfile(
            name="groq",
            base_url="https://api.groq.com/openai/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="GROQ_API_KEY",
            max_tokens_field="max_completion_tokens",
            reasoning_field="reasoning",
        ),
        ProviderProfile(
            name="ollama",
            base_url="http://localhost:11434/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            reasoning_field="reasoning",
        ),
        ProviderProfile(
            name="vllm",
            base_url="http://localhost:8000/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
        ),
        ProviderProfile(
            name="openai_compatible",
            base_url=None,
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            supports_stream_usage=False,
        ),
        ProviderProfile(
            name="emulator",
            base_url=None,
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            default_model="emulator-1",
            max_tokens_field="max_completion_tokens",
        ),
    )
}


def get_profile(name: str) -> ProviderProfile:
    """The profile called ``name`` (case-insensitive; ``-`` and ``_`` are the same).

    Raises :class:`ValueError` listing the known names when there is none.
    """
    key = name.strip().lower().replace("-", "_")
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(
            f"unknown provider {name!r}; known providers: {known} "
            "(use 'openai_compatible' with a base_url for any other OpenAI-style server)"
        ) from None
