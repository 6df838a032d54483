"""Provider profiles: where a provider lives, how it authenticates, and its wire quirks.

Pure data, and the only home of provider quirks: no other module compares a provider's
name. :meth:`trio_sampler.config.SamplerConfig.for_provider` starts from a profile; the
request builders read the profile of :attr:`~trio_sampler.wire.BuildOptions.profile`, the
stream transforms the one they are constructed with, the actor and telemetry the config's.
Without a provider, :data:`NO_PROVIDER` gives the behaviour: the field defaults below.
"""

from __future__ import annotations

import enum

import attrs

from .types import ApiBackend
from .types._conversation import coerce_enum
from .types._credential_names import redact_url

__all__ = [
    "COST_IN_TICKS",
    "COST_IN_USD",
    "NO_PROVIDER",
    "PROFILES",
    "AuthScheme",
    "CostField",
    "ProviderProfile",
    "get_profile",
    "profile_for",
]


class AuthScheme(enum.Enum):
    """How the API key is sent."""

    #: ``Authorization: Bearer <key>`` (OpenAI and every OpenAI-compatible server).
    BEARER = "bearer"
    #: ``x-api-key: <key>`` (Anthropic).
    X_API_KEY = "x_api_key"
    #: No credential header at all (local servers).
    NONE = "none"
    #: AWS Signature Version 4 on every request (Amazon Bedrock; the ``bedrock`` extra):
    #: credentials from the AWS environment, no API key.
    AWS_SIGV4 = "aws_sigv4"


@attrs.frozen
class CostField:
    """A ``usage`` field in which a server reports what the request cost, and its unit."""

    #: The field's name in the wire ``usage`` object (on every backend).
    name: str
    #: USD ticks (10⁻¹⁰ USD) per unit of the field: 1 for a count of ticks.
    ticks_per_unit: int


#: xAI's exact cost, an integer count of USD ticks.
COST_IN_TICKS = CostField("cost_in_usd_ticks", 1)
#: OpenRouter's cost, in USD.
COST_IN_USD = CostField("cost", 10**10)


def _profile_backend(value: ApiBackend | str) -> ApiBackend:
    return coerce_enum(ApiBackend, value, "ProviderProfile.backend")


def _profile_auth(value: AuthScheme | str) -> AuthScheme:
    return coerce_enum(AuthScheme, value, "ProviderProfile.auth_scheme")


@attrs.frozen
class ProviderProfile:
    """One provider: endpoint, auth and the quirks the wire layer needs.

    ``base_url`` is ``None`` for profiles whose address only the user knows
    (``openai_compatible``, ``emulator``): a ``base_url`` must then be given.
    """

    name: str
    base_url: str | None = attrs.field(repr=redact_url)
    backend: ApiBackend = attrs.field(converter=_profile_backend)
    auth_scheme: AuthScheme = attrs.field(default=AuthScheme.BEARER, converter=_profile_auth)
    #: Environment variable holding the key; ``None`` when the provider has no standard one.
    api_key_env: str | None = None
    #: A request without a key is certain to fail with 401: refuse to build the config.
    requires_api_key: bool = True
    #: Model used when neither the config nor the request names one.
    default_model: str | None = None
    #: Chat Completions field for the output-token cap: ``max_completion_tokens`` (OpenAI's
    #: name; its reasoning models reject the older one) or ``max_tokens`` (the older name,
    #: which most compatible servers and DeepSeek only know).
    max_tokens_field: str = "max_completion_tokens"
    #: Chat Completions: the server understands the ``developer`` role (else ``system``).
    developer_role: bool = True
    #: Assistant turns must carry their reasoning back in Chat Completions (DeepSeek
    #: thinking mode with tool calls), in the field :attr:`reasoning_field`.
    reasoning_content_replay: bool = False
    #: Chat usage reports reasoning tokens outside ``completion_tokens`` (xAI): add them back
    #: (when ``total_tokens`` does not settle it).
    reasoning_tokens_outside_completion: bool = False
    #: The server understands ``stream_options: {"include_usage": true}``. Strict servers
    #: reject unknown fields, so the generic profile leaves it off.
    supports_stream_usage: bool = True
    #: Field that carries reasoning text in Chat messages sent back (``reasoning_content`` or
    #: ``reasoning``). Streams are read from either field, whatever the provider.
    reasoning_field: str = "reasoning_content"
    #: Response headers with the model's context window and output cap (xAI).
    context_window_header: str | None = None
    max_output_tokens_header: str | None = None
    #: Request header that opts into the server-side doom-loop check on Responses (xAI).
    doom_loop_header: str | None = None
    #: ``usage`` fields that report the cost, in order; the first positive one wins. By
    #: default both known ones are read: a gateway in front of any provider may send either.
    cost_fields: tuple[CostField, ...] = (COST_IN_TICKS, COST_IN_USD)
    #: The OpenTelemetry GenAI ``gen_ai.provider.name`` (``None``: the profile's name).
    otel_name: str | None = None
    #: The server takes a JSON Schema for the answer (``response_format`` / ``text.format``
    #: / ``output_config``). Without it a request's ``output=`` is sent as a forced tool
    #: (``trio_sampler.wire`` reports the conversion).
    native_structured_output: bool = True
    #: Messages served under the model's own path (Vertex AI): the path, with ``{model}``
    #: and ``{method}`` (``streamRawPredict`` when streaming, else ``rawPredict``); the
    #: model then goes in the path, not the body. ``None``: ``/messages``.
    messages_path: str | None = None
    #: The ``{method}`` of :attr:`messages_path`: (streaming, not streaming).
    messages_methods: tuple[str, str] = ("streamRawPredict", "rawPredict")
    #: Messages served by a cloud (Vertex AI, Bedrock): the body's ``anthropic_version``.
    anthropic_version_body: str | None = None
    #: The body says ``"stream": true`` when streaming (Bedrock's path says it instead).
    stream_in_body: bool = True
    #: Messages beta features go in the body (``anthropic_beta: [...]``, Bedrock) rather
    #: than the ``anthropic-beta`` header.
    beta_in_body: bool = False
    #: The media type of a streamed answer: ``text/event-stream`` (SSE), or
    #: ``application/vnd.amazon.eventstream`` (Bedrock's ``InvokeModelWithResponseStream``,
    #: read by :class:`~trio_sampler.wire.EventStreamDecoder`).
    stream_media_type: str = "text/event-stream"
    #: The server takes OpenAI's explicit prompt-cache breakpoints
    #: (``prompt_cache_breakpoint`` on content parts, ``prompt_cache_options``) for the
    #: models that cache explicitly (GPT-5.6 and later).
    prompt_cache_breakpoints: bool = False

    @property
    def telemetry_name(self) -> str:
        return self.otel_name or self.name


#: The behaviour without a provider profile: every quirk at its default.
NO_PROVIDER = ProviderProfile(name="", base_url=None, backend=ApiBackend.CHAT_COMPLETIONS)

_XAI_CONTEXT_HEADER = "x-grok-context-window"
_XAI_MAX_OUTPUT_HEADER = "x-grok-max-completion-tokens"

#: Amazon Bedrock's OpenAI-compatible endpoint, per region:
#: https://bedrock-runtime.<region>.amazonaws.com/openai/v1 (a Bedrock API key).
_BEDROCK = ProviderProfile(
    name="bedrock",
    base_url=None,
    backend=ApiBackend.CHAT_COMPLETIONS,
    api_key_env="AWS_BEARER_TOKEN_BEDROCK",
    max_tokens_field="max_tokens",
    developer_role=False,
    otel_name="aws.bedrock",
)

#: Anthropic models on Amazon Bedrock, in their own Messages format
#: (https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html):
#: https://bedrock-runtime.<region>.amazonaws.com, a Bedrock API key; the model (a model
#: id or an inference profile) goes in the path, the stream comes in AWS event-stream
#: framing.
_BEDROCK_MESSAGES = ProviderProfile(
    name="bedrock_messages",
    base_url=None,
    backend=ApiBackend.MESSAGES,
    api_key_env="AWS_BEARER_TOKEN_BEDROCK",
    developer_role=False,
    messages_path="/model/{model}/{method}",
    messages_methods=("invoke-with-response-stream", "invoke"),
    anthropic_version_body="bedrock-2023-05-31",
    stream_in_body=False,
    beta_in_body=True,
    stream_media_type="application/vnd.amazon.eventstream",
    otel_name="aws.bedrock",
)


def _sigv4(profile: ProviderProfile) -> ProviderProfile:
    """``profile``'s endpoint with each request signed with AWS credentials (SigV4)
    instead of a Bedrock API key: ``<name>_sigv4``."""
    return attrs.evolve(
        profile,
        name=f"{profile.name}_sigv4",
        auth_scheme=AuthScheme.AWS_SIGV4,
        requires_api_key=False,
        api_key_env=None,
    )


PROFILES: dict[str, ProviderProfile] = {
    p.name: p
    for p in (
        ProviderProfile(
            name="openai",
            base_url="https://api.openai.com/v1",
            # Responses: the only OpenAI protocol that round-trips reasoning items.
            backend=ApiBackend.RESPONSES,
            api_key_env="OPENAI_API_KEY",
            default_model="gpt-6-luna",
            prompt_cache_breakpoints=True,
        ),
        ProviderProfile(
            name="anthropic",
            base_url="https://api.anthropic.com/v1",
            backend=ApiBackend.MESSAGES,
            auth_scheme=AuthScheme.X_API_KEY,
            api_key_env="ANTHROPIC_API_KEY",
            default_model="claude-sonnet-5-5",
            developer_role=False,
        ),
        ProviderProfile(
            name="xai",
            base_url="https://api.x.ai/v1",
            # Responses carries encrypted reasoning and the doom-loop check signal.
            backend=ApiBackend.RESPONSES,
            api_key_env="XAI_API_KEY",
            default_model="grok-4.7",
            developer_role=False,
            reasoning_tokens_outside_completion=True,
            context_window_header=_XAI_CONTEXT_HEADER,
            max_output_tokens_header=_XAI_MAX_OUTPUT_HEADER,
            doom_loop_header="x-grok-doom-loop-check",
            cost_fields=(COST_IN_TICKS,),
            otel_name="x_ai",
        ),
        ProviderProfile(
            name="openrouter",
            base_url="https://openrouter.ai/api/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="OPENROUTER_API_KEY",
            max_tokens_field="max_tokens",
            developer_role=False,
            reasoning_field="reasoning",
            cost_fields=(COST_IN_USD,),
        ),
        ProviderProfile(
            name="deepseek",
            base_url="https://api.deepseek.com/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="DEEPSEEK_API_KEY",
            default_model="deepseek-flash",
            max_tokens_field="max_tokens",
            developer_role=False,
            reasoning_content_replay=True,
            # JSON mode (json_object) only: no schema for the answer.
            native_structured_output=False,
        ),
        ProviderProfile(
            name="groq",
            base_url="https://api.groq.com/openai/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="GROQ_API_KEY",
            developer_role=False,
            reasoning_field="reasoning",
        ),
        ProviderProfile(
            name="ollama",
            base_url="http://localhost:11434/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            max_tokens_field="max_tokens",
            developer_role=False,
            reasoning_field="reasoning",
        ),
        ProviderProfile(
            name="llamacpp",
            base_url="http://localhost:8080/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            max_tokens_field="max_tokens",
            developer_role=False,
        ),
        ProviderProfile(
            name="vllm",
            base_url="http://localhost:8000/v1",
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            max_tokens_field="max_tokens",
            developer_role=False,
        ),
        ProviderProfile(
            name="azure",
            # The resource's own endpoint: https://<resource>.openai.azure.com/openai/v1
            base_url=None,
            backend=ApiBackend.CHAT_COMPLETIONS,
            api_key_env="AZURE_OPENAI_API_KEY",
            otel_name="azure.ai.openai",
        ),
        _BEDROCK,
        _sigv4(_BEDROCK),
        _BEDROCK_MESSAGES,
        _sigv4(_BEDROCK_MESSAGES),
        ProviderProfile(
            name="vertex",
            # Anthropic models on Vertex AI: https://<region>-aiplatform.googleapis.com/v1/
            # projects/<project>/locations/<region>; the key is an OAuth access token
            # (``gcloud auth print-access-token``), read from VERTEX_ACCESS_TOKEN.
            base_url=None,
            backend=ApiBackend.MESSAGES,
            api_key_env="VERTEX_ACCESS_TOKEN",
            developer_role=False,
            messages_path="/publishers/anthropic/models/{model}:{method}",
            anthropic_version_body="vertex-2023-10-16",
            otel_name="gcp.vertex_ai",
        ),
        ProviderProfile(
            name="openai_compatible",
            base_url=None,
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            max_tokens_field="max_tokens",
            developer_role=False,
            supports_stream_usage=False,
        ),
        ProviderProfile(
            name="emulator",
            base_url=None,
            backend=ApiBackend.CHAT_COMPLETIONS,
            requires_api_key=False,
            default_model="emulator-1",
            developer_role=False,
        ),
    )
}


def get_profile(name: str) -> ProviderProfile:
    """The profile called ``name`` (case-insensitive; ``-`` and ``_`` are the same).

    Raises :class:`ValueError` listing the known names when there is none.
    """
    key = name.strip().lower().replace("-", "_").replace(".", "")
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(
            f"unknown provider {name!r}; known providers: {known} "
            "(use 'openai_compatible' with a base_url for any other OpenAI-style server)"
        ) from None


def profile_for(name: str | None) -> ProviderProfile:
    """The profile called ``name``, or :data:`NO_PROVIDER` for ``None``."""
    return NO_PROVIDER if name is None else get_profile(name)
