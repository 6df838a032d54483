"""The emulator's ASGI application: routing, auth redaction, recording, faults, streaming."""

from __future__ import annotations

import contextvars
import hashlib
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any
from urllib.parse import parse_qs

import attrs
import orjson
import trio

from .._receive_time import LAST_SENT
from ..wire import get_backend
from ._arrival import request_answered, request_arrived
from ._background import BackgroundStore
from ._bedrock import BEDROCK_PATH, EventStreamSend, messages_body
from ._billing import (
    DEFAULT_MAX_BILLED,
    BillingBook,
    BillingEntry,
    BillingOutcome,
    StreamProgress,
    settle_body,
    settle_stream,
)
from ._budget import DEFAULT_MAX_REPLY_BYTES, Frames, ReplyBudget, stream_deltas
from ._cache import SHARED_CACHE, PromptCache
from ._faults import AttemptPlan, FaultBook, OutcomeFault
from ._log import (
    DEFAULT_MAX_RECORDED_BODY_BYTES,
    DEFAULT_MAX_RECORDED_BYTES,
    REDACTED,
    RequestLog,
    redact_headers,
)
from ._punctuality import Punctuality
from ._ratelimit import RateLimitBook, RateLimits, Verdict
from ._render_chat import ChatRenderer
from ._render_messages import MessagesRenderer
from ._render_responses import ResponsesRenderer, response_id
from ._reply import Reply, RequestView, empty_reply, plan_reply
from ._script import (
    ContentFilterFault,
    ContextLengthFault,
    DropFault,
    EmptyFault,
    MalformedFault,
    NoTerminatorFault,
    Script,
    ScriptError,
    StatusFault,
    StreamErrorFault,
    TokenPacing,
    merge_scripts,
    parse_script,
)
from ._sse import Renderer, dumps, is_token_frame, retry_after_headers
from ._timer import DeadlineTimer
from ._validate import ApiError, view_chat, view_messages, view_responses

__all__ = ["EMULATOR_MODELS", "REDACTED", "EmulatorApp", "redact_headers"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Models listed by ``GET /v1/models`` (any model name is accepted and echoed).
EMULATOR_MODELS = ("emulator-1", "gpt-4o-mini", "gpt-5-mini", "claude-haiku-4-5")
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Seconds a request body may take to arrive in full (slow-body clients hold a
#: connection, and a file descriptor, for at most this long).
DEFAULT_BODY_TIMEOUT = 30.0
#: Frames sent together are sent in body messages of about this size: a long reply to a
#: client that does not read is then held once (its frames), not copied whole into one
#: message as well.
_COALESCE_BYTES = 64 * 1024
#: Pre-rendered bench bodies kept (the cache is cleared when full).
MAX_BENCH_BODIES = 1024

_ROUTES: dict[str, tuple[Renderer, Callable[[Mapping[str, Any], PromptCache], RequestView]]] = {
    "/v1/chat/completions": (ChatRenderer(), view_chat),
    "/v1/responses": (ResponsesRenderer(), view_responses),
    "/v1/messages": (MessagesRenderer(), view_messages),
}
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_JSON = (b"content-type", b"application/json")


@attrs.frozen
class StreamControl:
    """What the server under the app can do with a request's stream beyond ASGI, given
    the ``send`` it handed the app (:func:`~trio_sampler.emulator.serve` provides it per
    connection; elsewhere there is none)."""

    #: Reset the stream (HTTP/2: RST_STREAM) once what was sent so far has gone out.
    reset: Callable[[Send], Awaitable[None]]
    #: Whether the client has already closed or reset the stream: a request reset as
    #: soon as it was sent (an HTTP/2 rapid-reset flood) is then not answered at all.
    closed: Callable[[Send], bool]


#: The current connection's :class:`StreamControl` (``None``: a response left mid-body is
#: the server's to end, and an HTTP/1.1 server closes the connection).
STREAM_CONTROL: contextvars.ContextVar[StreamControl | None] = contextvars.ContextVar(
    "trio_sampler_emulator_stream_control", default=None
)
_SERVER_SEND: contextvars.ContextVar[Send | None] = contextvars.ContextVar(
    "trio_sampler_emulator_server_send", default=None
)
#: What newer Anthropic models answer (400) to a request ending with an assistant message;
#: gateways that proxy them to OpenAI-compatible clients pass the same text on.
PREFILL_REJECTED = (
    "This model does not support assistant message prefill. "
    "The conversation must end with a user message."
)


def _peer_check(backend: str, data: Mapping[str, Any]) -> None:
    """Run the wire layer's ``parse_request`` for the backend, when it exists.

    It raises ``ValueError`` on shapes the client library could not have produced or read;
    the emulator answers those with a 400 like the real API would.
    """
    try:
        found = get_backend(backend)
    except ValueError:
        return
    try:
        found.parse_request(data)
    except ValueError as exc:
        raise ApiError(str(exc)) from None


class EmulatorApp:
    """The emulator as an ASGI 3 application (HTTP and lifespan scopes).

    Args:
        bench: serve pre-rendered bodies cached per (backend, script, model, stream), so a
            request costs one dictionary lookup (also per request: ``x-emulator-bench: 1``).
        require_key: when set, requests must carry this key (``Authorization: Bearer`` or
            ``x-api-key``) or get a 401; when ``None`` any key (or none) is accepted.
        cache: the prompt-cache store; the process-wide one by default.
        rate_limits: server-side limits per API key (requests and tokens per window), with
            the providers' rate-limit headers on every answer and 429s past them; see
            :class:`RateLimits`. Bench shortcuts are off while limits are set.
        models: a default script per model name (each a script object of the
            ``x-emulator-script`` schema), so one server plays several models that behave
            and fail independently: a request for a listed model runs that model's script,
            with the keys of its own header (if any) on top, and its fault counters are
            kept apart from every other model's. Checked here: a bad script raises
            :class:`ScriptError` naming the model.
        body_timeout: seconds a request body may take to arrive in full; a slower one
            gets a 408 and its connection is closed (a slow-body client cannot hold a
            connection longer). The request head is bounded by the server's
            ``keep_alive_timeout`` (see :func:`~trio_sampler.emulator.serve`).
        max_recorded_bytes: the request log's bound in bytes (oldest dropped first).
        max_recorded_body_bytes: of each recorded body, at most this many bytes are kept.
        max_reply_bytes: the bytes of replies held at once, over every connection (a
            reply is held from its rendering until its last byte is handed to the
            connection; a client that never reads holds it until it goes away). Past it,
            new requests get 503 (Anthropic: 529, overloaded).
        max_billed: the billing record's bound in entries (oldest dropped first); see
            :attr:`billing`.
    """

    def __init__(
        self,
        *,
        bench: bool = False,
        require_key: str | None = None,
        cache: PromptCache | None = None,
        rate_limits: RateLimits | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        max_recorded_bytes: int = DEFAULT_MAX_RECORDED_BYTES,
        max_recorded_body_bytes: int = DEFAULT_MAX_RECORDED_BODY_BYTES,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        max_billed: int = DEFAULT_MAX_BILLED,
    ) -> None:
        if not (isinstance(body_timeout, int | float) and 0 < body_timeout < math.inf):
            raise ValueError(
                f"body_timeout must be a positive number of seconds; got {body_timeout!r}"
            )
        self.bench = bench
        self.rate_limits = None if rate_limits is None else RateLimitBook(rate_limits)
        self._require_key = require_key
        self.cache = SHARED_CACHE if cache is None else cache
        self.faults = FaultBook()
        self.body_timeout = float(body_timeout)
        self.replies = ReplyBudget(max_reply_bytes)
        self.log = RequestLog(max_bytes=max_recorded_bytes, max_body_bytes=max_recorded_body_bytes)
        #: When this process's paced deltas were written, against their schedule.
        self.punctuality = Punctuality()
        self._bench_bodies: dict[tuple[Any, ...], tuple[int, list[tuple[bytes, bytes]], bytes]] = {}
        self.models = _checked_models(models)
        self._epoch: float | None = None
        #: Responses background mode: the responses kept for retrieval and their record.
        self.background = BackgroundStore(budget=self.replies)
        #: What every sampling request was billed, by the request id sent back (see
        #: :meth:`billed`).
        self.billing = BillingBook(max_billed)

    def clock(self) -> float:
        """The emulator's clock: seconds since its first request (or since
        :meth:`start_clock`), on trio's clock. Faults with a time window read it."""
        now = trio.current_time()
        if self._epoch is None:
            self._epoch = now
        return now - self._epoch

    def start_clock(self) -> None:
        """Start the emulator's clock now (it otherwise starts at the first request)."""
        self._epoch = trio.current_time()

    def __repr__(self) -> str:
        # Never show the key, even in a repr.
        return (
            f"EmulatorApp(bench={self.bench}, require_key={'set' if self._require_key else None})"
        )

    def forget(self, scenario: str) -> None:
        """Drop what the app keeps for ``scenario``: its fault counters and recorded requests.

        Long-running servers keep at most ``MAX_SCENARIOS`` of each anyway (least recently
        used dropped first); tests that reuse a scenario name call this to start afresh.
        """
        self.faults.forget(scenario)
        for model in self.models:
            self.faults.forget(_model_key(model, scenario))
        self.log.forget(scenario)

    def requests(self, scenario: str | None = None) -> list[dict[str, Any]]:
        """Requests received for ``scenario`` (all scenarios when ``None``), oldest first,
        credential headers redacted: ``path``, ``headers``, ``body`` (the parsed JSON, or
        ``None`` when it was longer than ``max_recorded_body_bytes``; then ``body_head``
        holds its start), ``body_bytes`` and ``body_truncated``. The log is bounded (see
        :class:`~trio_sampler.emulator.RequestLog`): old entries are dropped.

        Requests without a scenario are recorded under ``""``.
        """
        return self.log.entries(scenario)

    def billed(self, scenario: str | None = None) -> list[BillingEntry]:
        """What the emulator billed for each sampling request of ``scenario`` (every
        request when ``None``; ``""``: those without one), oldest first: one
        :class:`~trio_sampler.emulator.BillingEntry` per request, keyed by the request id
        it sent back (``x-request-id`` / ``request-id``), with what was billed and what
        the client could read of it (``docs/emulator.md``, "Billing"). Bounded
        (``max_billed``): old entries are dropped."""
        return self.billing.entries(scenario)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            _SERVER_SEND.set(send)
            await self._http(scope, *_tracking_the_exchange(scope, receive, send))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"].rstrip("/")
        method: str = scope["method"]
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        route = _ROUTES.get(path)
        bedrock = BEDROCK_PATH.match(path)
        anthropic = "anthropic-version" in headers or path == "/v1/messages" or bool(bedrock)
        renderer: Renderer = _ROUTES["/v1/messages" if anthropic else "/v1/chat/completions"][0]
        request_id = "req_" + uuid.uuid4().hex
        try:
            if not self._authorized(headers):
                raise ApiError("", status=401)
            if path == "/v1/models" and method == "GET":
                await _respond(send, 200, self._models(anthropic), [])
                return
            if path == "/v1/emulator/requests" and method == "GET":
                query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
                scenario = query["scenario"][0] if "scenario" in query else None
                await _respond(send, 200, self.requests(scenario), [])
                return
            if path == "/v1/emulator/pacing" and method in ("GET", "DELETE"):
                if method == "DELETE":
                    self.punctuality.reset()
                query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
                values = query.get("values", ["0"])[0] not in ("", "0", "false")
                await _respond(send, 200, self.punctuality.report(values=values), [])
                return
            if path == "/v1/emulator/billing" and method in ("GET", "DELETE"):
                if method == "DELETE":
                    self.billing.clear()
                query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
                scenario = query["scenario"][0] if "scenario" in query else None
                await _respond(send, 200, [e.as_json() for e in self.billed(scenario)], [])
                return
            if path in _COUNTERS and method == "POST":
                await self._count_tokens(path, await self._read_body(receive), send, request_id)
                return
            if path.startswith(_RESPONSE_PREFIX):
                await self._background_call(scope, method, path, send, request_id)
                return
            if bedrock is not None and method == "POST":
                await self._bedrock(bedrock, headers, receive, send, request_id)
                return
            if route is None:
                raise ApiError(f"Unknown request URL: {method} {path}.", status=404)
            if method != "POST":
                raise ApiError(f"Method {method} not allowed for {path}.", status=405)
            renderer, view_of = route
            body = await self._read_body(receive)
            if _stream_closed():
                return  # reset by the client: nobody to answer
            # When the request arrived (the read of its last bytes, where the server
            # says): paced streams count from here.
            arrived = request_arrived()
            with self.billing.serving(request_id, renderer.backend) as entry:
                await self._sample(
                    renderer,
                    view_of,
                    path,
                    headers,
                    body,
                    receive,
                    send,
                    request_id,
                    arrived,
                    entry,
                )
        except _ClientGone:
            return
        except ApiError as error:
            extra = [(renderer.request_id_header(), request_id.encode())]
            extra += retry_after_headers(error.retry_after)
            await _respond(send, error.status, renderer.error_body(error, request_id), extra)

    async def _bedrock(
        self,
        route: re.Match[str],
        headers: Mapping[str, str],
        receive: Receive,
        send: Send,
        request_id: str,
    ) -> None:
        """Bedrock's Messages endpoints (``emulator/_bedrock.py``): the body checked and
        turned into the Messages body it stands for, sampled as ``/v1/messages``; a
        stream re-framed as an AWS event stream."""
        streaming = route["method"] == "invoke-with-response-stream"
        body = messages_body(await self._read_body(receive), route["model"], streaming)
        if _stream_closed():
            return
        arrived = request_arrived()
        renderer, view_of = _ROUTES["/v1/messages"]
        out = EventStreamSend(send) if streaming else send
        # Recorded under its own path, with the Messages body it stands for.
        with self.billing.serving(request_id, renderer.backend) as entry:
            await self._sample(
                renderer, view_of, route[0], headers, body, receive, out, request_id, arrived, entry
            )

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        return self._require_key is None or _api_key(headers) == self._require_key

    def _models(self, anthropic: bool) -> dict[str, Any]:
        names = list(dict.fromkeys([*EMULATOR_MODELS, *self.models]))
        if anthropic:
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in names
            ]
            return {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"],
                "last_id": data[-1]["id"],
            }
        models = [
            {"id": m, "object": "model", "created": 1735689600, "owned_by": "trio-sampler-emulator"}
            for m in names
        ]
        return {"object": "list", "data": models}

    async def _read_body(self, receive: Receive) -> bytes:
        body: bytes | None = None
        with trio.move_on_after(self.body_timeout):
            body = await _read_body(receive)
        if body is None:
            # Answered, then the connection is closed (the body never ended).
            raise ApiError(
                f"The request body did not arrive within {self.body_timeout:g} seconds.",
                status=408,
            )
        return body

    async def _sample(
        self,
        renderer: Renderer,
        view_of: Callable[[Mapping[str, Any], PromptCache], RequestView],
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        receive: Receive,
        send: Send,
        request_id: str,
        arrived: float,
        entry: BillingEntry,
    ) -> None:
        now = self.clock()
        model = _model_of(body) if self.models else None
        model_script = None if model is None else self.models.get(model)
        try:
            if model_script is None:
                script = parse_script(headers.get("x-emulator-script"))
            else:
                script = merge_scripts(model_script, headers.get("x-emulator-script"))
        except ScriptError as exc:
            raise ApiError(str(exc)) from None
        entry.scenario = script.scenario or ""
        pacing = TokenPacing.of(script, arrived)
        bench = (self.bench or headers.get("x-emulator-bench") == "1") and not (
            script.faults or script.delay_ms or pacing or self.rate_limits or model_script
        )
        if bench and await self._bench_hit(renderer, script, body, send):
            self.billing.discard(entry.request_id)  # bench answers are not recorded
            return
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError(
                "We could not parse the JSON body of your request. The API expects a JSON "
                "payload, but what was sent was not valid JSON."
            ) from None
        if not isinstance(data, dict):
            raise ApiError("The request body must be a JSON object.")
        if not bench:
            self.log.add(script.scenario or "", path, headers, body)
        view = view_of(data, self.cache)
        entry.model = view.model
        _peer_check(renderer.backend, data)
        if view.prefill and not script.accepts_prefill:
            raise ApiError(PREFILL_REJECTED)
        if script.context_window is not None and view.prompt.total > script.context_window:
            raise _context_error(renderer.backend, view.prompt.total, script.context_window)
        key = script.scenario or ("script:" + hashlib.sha256(script.source.encode()).hexdigest())
        if model_script is not None and model is not None:
            key = _model_key(model, key)
        verdict: Verdict | None = None
        if self.rate_limits is not None:
            verdict = self.rate_limits.admit(
                _api_key(headers),
                view.prompt.total,
                view.max_tokens or 0,
                anthropic=renderer.backend == "messages",
            )
            if not verdict.admitted:
                entry.status, entry.outcome = 429, BillingOutcome.REFUSED
                await _respond(
                    send,
                    429,
                    renderer.error_body(
                        _rate_limit_error(verdict, anthropic=renderer.backend == "messages"),
                        request_id,
                    ),
                    [
                        (renderer.request_id_header(), request_id.encode()),
                        *verdict.headers,
                        *retry_after_headers(math.ceil(verdict.retry_after * 1000) / 1000),
                    ],
                )
                return
        plan = self.faults.plan(key, script.faults, now)
        for silence in plan.silences:
            await _hold(receive, silence.seconds)
        base = [
            (renderer.request_id_header(), request_id.encode()),
            (b"x-emulator-attempt", str(plan.attempt).encode()),
            (b"x-emulator-prompt-cache", view.prompt.header().encode()),
            *(verdict.headers if verdict is not None else ()),
        ]
        charge = verdict.charge if verdict is not None else None
        outcome = plan.outcome
        if isinstance(outcome, StatusFault | ContextLengthFault):
            entry.outcome = BillingOutcome.REFUSED
            entry.status = outcome.status if isinstance(outcome, StatusFault) else 400
            if charge is not None and self.rate_limits is not None:
                self.rate_limits.settle(charge, 0)
            if isinstance(outcome, ContextLengthFault):
                total = view.prompt.total
                window = script.context_window
                error = _context_error(
                    renderer.backend, total, window if window and window < total else total - 1
                )
                await _respond(send, 400, renderer.error_body(error, request_id), base)
                return
            error_body = outcome.body or renderer.error_body(
                ApiError("", status=outcome.status), request_id
            )
            await _respond(
                send, outcome.status, error_body, base + retry_after_headers(outcome.retry_after)
            )
            return
        # Refused before its reply is planned when the replies held fill the budget, and
        # before it is rendered when it would not fit.
        anthropic = renderer.backend == "messages"
        self.replies.check(anthropic=anthropic)
        if isinstance(outcome, ContentFilterFault):
            script = attrs.evolve(script, stop="content_filter")
        if isinstance(outcome, EmptyFault):
            reply = empty_reply(view, body)
        else:
            reply = plan_reply(view, script, body)
        deltas = stream_deltas(reply) if view.stream else 0
        self.replies.check(anthropic=anthropic, api=renderer.backend, deltas=deltas)
        if charge is not None and self.rate_limits is not None:
            # The emulator knows the reply's length up front: the output charge is corrected
            # now rather than when the body ends (the provider's bucket is never tighter).
            self.rate_limits.settle(charge, reply.usage.output_tokens)
        background = _background_of(renderer, data)
        if background:
            # A kept response's id is its own (ids are otherwise a function of the body).
            unique = hashlib.sha256((reply.id_seed + request_id).encode()).hexdigest()
            reply = attrs.evolve(reply, id_seed=unique)
            self.background.keep(  # refused (overloaded) past the reply budget
                response_id(reply),
                renderer.stream(reply, view),
                renderer.body(reply, view),
                trio.current_time(),
                script.delay_ms / 1000,
                anthropic=anthropic,
            )
            self.billing.kept(entry, response_id(reply), reply.usage)
        if view.stream:
            frames = Frames(renderer.stream(reply, view))
            if bench:
                self._bench_store(renderer, script, data, 200, base + _SSE_HEADERS, frames.data)
            progress = StreamProgress()
            held = self.replies.holding(
                frames.nbytes, anthropic=anthropic, api=renderer.backend, deltas=deltas
            )
            try:
                with held:
                    await _send_start(send, 200, base + _SSE_HEADERS)
                    entry.status = 200
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                        await _emit(
                            send,
                            renderer,
                            reply,
                            view,
                            frames,
                            plan,
                            script.delay_ms / 1000,
                            pacing,
                            arrived,
                            self.punctuality,
                            progress,
                        )
                        nursery.cancel_scope.cancel()
            finally:
                if entry.status == 200:
                    settle_stream(entry, frames, progress, reply.usage, view.include_usage)
            return
        if plan.first_token_after is not None:
            await _hold(receive, arrived + plan.first_token_after - trio.current_time())
        for stall in plan.stalls:
            await _hold(receive, stall.seconds)
        payload = dumps(renderer.body(reply, view))
        if isinstance(outcome, StreamErrorFault):
            error = ApiError("", status=529 if renderer.backend == "messages" else 500)
            error.error_type = outcome.error_type
            await _respond(send, error.status, renderer.error_body(error, request_id), base)
            return
        if bench:
            self._bench_store(renderer, script, data, 200, [*base, _JSON], payload)
        with self.replies.holding(len(payload), anthropic=anthropic):
            entry.status = 200
            await _send_payload(send, base, payload, outcome)
        settle_body(entry, reply.usage, cut=isinstance(outcome, DropFault | MalformedFault))

    async def _count_tokens(self, path: str, body: bytes, send: Send, request_id: str) -> None:
        """``POST /v1/messages/count_tokens`` and ``POST /v1/responses/input_tokens``: the
        prompt's size as a request of that body is billed (``input_tokens``), counted on
        a scratch cache (counting caches nothing)."""
        backend, view_of = _COUNTERS[path]
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError("We could not parse the JSON body of your request.") from None
        if not isinstance(data, dict):
            raise ApiError("The request body must be a JSON object.")
        if backend == "messages":  # counting takes no output cap; the view wants one
            data = {"max_tokens": 1, **data}
        tokens = view_of(data, PromptCache(max_entries=1)).prompt.total
        payload: dict[str, Any] = {"input_tokens": tokens}
        if backend == "responses":
            payload = {"object": "response.input_tokens", **payload}
        await _respond(send, 200, payload, [(b"x-request-id", request_id.encode())])

    async def _background_call(
        self, scope: Scope, method: str, path: str, send: Send, request_id: str
    ) -> None:
        """``GET /v1/responses/{id}`` (streamed from ``starting_after`` with
        ``stream=true``) and ``POST /v1/responses/{id}/cancel``: see ``_background``."""
        response_id, _, action = path[len(_RESPONSE_PREFIX) :].partition("/")
        if (method, action) not in (("GET", ""), ("POST", "cancel")):
            raise ApiError(f"Unknown request URL: {method} {path}.", status=404)
        now = trio.current_time()
        stored = self.background.find(response_id, now)
        if stored is None:
            raise ApiError(f"Response with id '{response_id}' not found.", status=404)
        base = [(b"x-request-id", request_id.encode())]
        if action == "cancel":
            self.background.cancel(stored, now)
            if stored.cancelled_at is not None:
                generated = stored.cut(None)
                self.billing.background_cancelled(
                    response_id,
                    sum(is_token_frame(stored.frames[n]) for n in generated),
                    sum(map(is_token_frame, stored.frames)),
                )
            await _respond(send, 200, stored.response(now), base)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if query.get("stream", ["false"])[0] != "true":
            await _respond(send, 200, stored.response(now), base)
            return
        after = query.get("starting_after", [None])[0]
        try:
            starting_after = None if after is None else int(after)
        except ValueError:
            raise ApiError(
                f"Invalid 'starting_after': {after!r}; expected a sequence number."
            ) from None
        self.background.retrieved(response_id)
        await _send_start(send, 200, base + _SSE_HEADERS)
        pending = bytearray()
        for sequence in stored.cut(starting_after):
            if stored.due(sequence) > trio.current_time():  # not generated yet: wait for it
                await send(
                    {"type": "http.response.body", "body": bytes(pending), "more_body": True}
                )
                pending.clear()
                await trio.sleep_until(stored.due(sequence))
            pending += stored.frames[sequence]
        await send({"type": "http.response.body", "body": bytes(pending), "more_body": False})

    def _bench_key(
        self, renderer: Renderer, script: Script, data: Mapping[str, Any]
    ) -> tuple[Any, ...]:
        options = data.get("stream_options")
        usage = isinstance(options, Mapping) and options.get("include_usage") is True
        return (renderer.backend, script.source, data.get("model"), data.get("stream"), usage)

    def _bench_store(
        self,
        renderer: Renderer,
        script: Script,
        data: Mapping[str, Any],
        status: int,
        headers: list[tuple[bytes, bytes]],
        payload: bytes,
    ) -> None:
        headers = [h for h in headers if h[0] != b"x-emulator-attempt"]
        if len(self._bench_bodies) >= MAX_BENCH_BODIES:
            self._bench_bodies.clear()  # bounded: bench runs reuse a handful of scripts
        self._bench_bodies[self._bench_key(renderer, script, data)] = (status, headers, payload)

    async def _bench_hit(self, renderer: Renderer, script: Script, body: bytes, send: Send) -> bool:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(data, dict):
            return False
        hit = self._bench_bodies.get(self._bench_key(renderer, script, data))
        if hit is None:
            return False
        status, headers, payload = hit
        await _send_start(send, status, headers)
        await send({"type": "http.response.body", "body": payload, "more_body": False})
        return True


_RESPONSE_PREFIX = "/v1/responses/"
#: The token-counting endpoints: path → (backend, the view that bills the prompt).
_COUNTERS: dict[str, tuple[str, Callable[[Mapping[str, Any], PromptCache], RequestView]]] = {
    "/v1/messages/count_tokens": ("messages", view_messages),
    "/v1/responses/input_tokens": ("responses", view_responses),
}


def _background_of(renderer: Renderer, data: Mapping[str, Any]) -> bool:
    """Whether a request asks for Responses background mode (which needs ``store``)."""
    if renderer.backend != "responses" or data.get("background") is not True:
        return False
    if data.get("store") is False:
        raise ApiError("Background mode requires store=true.", param="background")
    return True


def _checked_models(models: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The per-model script table, each script checked now (a typo fails at construction)."""
    if models is None:
        return {}
    if not isinstance(models, Mapping):
        raise TypeError(
            "models must map model names to script objects, e.g. "
            '{"primary": {"faults": [{"type": "status", "status": 503}]}}'
        )
    table: dict[str, dict[str, Any]] = {}
    for name, script in models.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"models: model names must be non-empty strings; got {name!r}")
        if not isinstance(script, Mapping):
            raise ScriptError(
                f"models[{name!r}] must be a script object (the x-emulator-script schema)"
            )
        try:
            merge_scripts(script, None)
        except ScriptError as exc:
            raise ScriptError(f"models[{name!r}]: {exc}") from None
        table[name] = dict(script)
    return table


def _model_of(body: bytes) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def _model_key(model: str, key: str) -> str:
    """The fault-counter key of ``key`` on a model of the table (kept apart per model)."""
    return f"model:{model}\0{key}"


def _context_error(backend: str, total: int, window: int) -> ApiError:
    """Each backend's real "context length exceeded" 400."""
    if backend == "messages":
        # Anthropic gives no machine code; clients match the message's prefix.
        return ApiError(f"prompt is too long: {total} tokens > {window} maximum")
    if backend == "responses":
        return ApiError(
            "Your input exceeds the context window of this model. "
            "Please adjust your input and try again.",
            param="input",
            code="context_length_exceeded",
        )
    return ApiError(
        f"This model's maximum context length is {window} tokens. However, your messages "
        f"resulted in {total} tokens. Please reduce the length of the messages.",
        param="messages",
        code="context_length_exceeded",
    )


def _api_key(headers: Mapping[str, str]) -> str | None:
    bearer = headers.get("authorization", "")
    return bearer[7:] if bearer.lower().startswith("bearer ") else headers.get("x-api-key")


def _rate_limit_error(verdict: Verdict, *, anthropic: bool) -> ApiError:
    dim = (verdict.exhausted or "requests").replace("_", " ")
    error = ApiError(
        f"Rate limit reached for {dim} per minute (emulated). "
        f"Please try again in {verdict.retry_after:.3f}s.",
        status=429,
        code="rate_limit_exceeded",
    )
    if not anthropic and verdict.exhausted != "requests":
        error.error_type = "tokens"  # OpenAI's type for a token limit
    return error


def _tracking_the_exchange(scope: Scope, receive: Receive, send: Send) -> tuple[Receive, Send]:
    """``receive`` and ``send`` noting whether the request body was read in full, and
    telling the connection when the response's last body message goes out (so that the
    next request's arrival is the next read; see ``_arrival``)."""
    announced = any(name in _BODY_HEADERS for name, _ in scope["headers"])
    body_read = not announced

    async def tracked_receive() -> Message:
        nonlocal body_read
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body_read = True
        return message

    async def tracked_send(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            request_answered(body_read)
        await send(message)

    return tracked_receive, tracked_send


_BODY_HEADERS = frozenset((b"content-length", b"transfer-encoding"))


class _ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError("Request body too large.", status=413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel the stream when the client goes away (``send`` alone never notices)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _hold(receive: Receive, seconds: float | None) -> None:
    """Send nothing for ``seconds`` (``None``: until the client goes away).

    Raises:
        _ClientGone: the client disconnected meanwhile (nothing more is sent).
    """
    if seconds is not None and seconds <= 0:
        return
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await trio.sleep(math.inf if seconds is None else seconds)
        nursery.cancel_scope.cancel()
    if gone:
        raise _ClientGone


async def _send_payload(
    send: Send,
    base: list[tuple[bytes, bytes]],
    payload: bytes,
    outcome: OutcomeFault | None,
) -> None:
    await _send_start(send, 200, [*base, _JSON, (b"content-length", str(len(payload)).encode())])
    if isinstance(outcome, DropFault):
        await send(
            {
                "type": "http.response.body",
                "body": payload[: len(payload) // 2],
                "more_body": True,
            }
        )
        await _drop_stream()
        return
    if isinstance(outcome, MalformedFault):
        payload = payload[: len(payload) // 2].ljust(len(payload))
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _drop_stream() -> None:
    """End the current response mid-body, as a dropped connection does: the server
    resets an HTTP/2 stream at once (the client sees the error rather than waiting out
    its idle timeout); otherwise the app's returning mid-body closes the connection."""
    control = STREAM_CONTROL.get()
    send = _SERVER_SEND.get()
    if control is not None and send is not None:
        await control.reset(send)


def _stream_closed() -> bool:
    """Whether the client has already closed the current request's stream (known only
    under :func:`~trio_sampler.emulator.serve`)."""
    control = STREAM_CONTROL.get()
    send = _SERVER_SEND.get()
    return control is not None and send is not None and control.closed(send)


async def _send_start(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _respond(
    send: Send, status: int, payload: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    body = dumps(payload)
    await _send_start(send, status, [*headers, _JSON, (b"content-length", str(len(body)).encode())])
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _emit(
    send: Send,
    renderer: Renderer,
    reply: Reply,
    view: RequestView,
    frames: Sequence[bytes],
    plan: AttemptPlan,
    delay: float,
    pacing: TokenPacing | None,
    arrived: float,
    punctuality: Punctuality,
    progress: StreamProgress,
) -> None:
    """Send ``frames`` with the attempt's pacing and outcome faults applied.

    Events are counted over ``frames`` (keep-alives excluded). Without a delay, consecutive
    frames are coalesced into one body message. With token ``pacing``, the k-th content
    delta (k from 0) is sent, in a body message of its own, at ``arrived + first_token +
    k * interval`` on an absolute schedule (so a late wake-up does not push every later
    token back), woken by a :class:`DeadlineTimer`; other events go out right after the
    one before them. Each paced delta's write is noted in ``punctuality``, and how far the
    stream got in ``progress`` (what it is billed).
    """
    with DeadlineTimer() as timer:
        await _emit_frames(
            send,
            renderer,
            reply,
            view,
            frames,
            plan,
            delay,
            pacing,
            arrived,
            timer,
            punctuality,
            progress,
        )


async def _emit_frames(
    send: Send,
    renderer: Renderer,
    reply: Reply,
    view: RequestView,
    frames: Sequence[bytes],
    plan: AttemptPlan,
    delay: float,
    pacing: TokenPacing | None,
    arrived: float,
    timer: DeadlineTimer,
    punctuality: Punctuality,
    progress: StreamProgress,
) -> None:
    token_number = 0
    previous = arrived  # when the paced delta before the next one was written
    pending = bytearray()
    appended = 0  # frames in ``pending`` or sent before it

    async def flush() -> None:
        if pending:
            await send({"type": "http.response.body", "body": bytes(pending), "more_body": True})
            pending.clear()
            progress.sent = appended

    for pings in plan.pings:
        for number in range(pings.count):
            pending += renderer.keepalive()
            await flush()
            if pings.interval_ms and number < pings.count - 1:
                await trio.sleep(pings.interval_ms / 1000)
    outcome = plan.outcome
    cut = math.inf
    if isinstance(outcome, StreamErrorFault | DropFault | MalformedFault):
        # Never past the terminator: a fault always interrupts a real stream.
        after = len(frames) // 2 if outcome.after_events is None else outcome.after_events
        cut = min(after, len(frames) - 1)
    if isinstance(outcome, NoTerminatorFault):
        frames = frames[:-1]
        progress.faulted = True
    middle = len(frames) // 2
    first_token_due = None if plan.first_token_after is None else arrived + plan.first_token_after
    for index, frame in enumerate(frames):
        if index == cut:
            progress.faulted = True
            if isinstance(outcome, StreamErrorFault):
                pending += b"".join(renderer.stream_error(reply, view, outcome.error_type, index))
                break
            if isinstance(outcome, DropFault):
                await flush()
                await _drop_stream()
                return
            pending += renderer.malformed()
            progress.readable = index
        for stall in plan.stalls:
            if (middle if stall.after_events is None else stall.after_events) == index:
                await flush()
                await trio.sleep(math.inf if stall.seconds is None else stall.seconds)
        if delay and index:
            await flush()
            await trio.sleep(delay)
        if (pacing is not None or first_token_due is not None) and is_token_frame(frame):
            await flush()
            due = -math.inf
            if pacing is not None:
                due = pacing.deadline(token_number)
                await timer.sleep_until(due)
            if first_token_due is not None and token_number == 0:
                due = max(due, first_token_due)
                await timer.sleep_until(first_token_due)
            token_number += 1
            if pacing is not None:
                # Out at once, on its own: the delta is due now, whatever follows it.
                pending += frame
                appended = index + 1
                LAST_SENT.set(None)
                await flush()
                # When the connection handed it to the kernel (else: now).
                written = LAST_SENT.get()
                if written is None:
                    written = trio.current_time()
                punctuality.delta_written(token_number - 1, due, written, arrived, previous)
                previous = written
                continue
        pending += frame
        appended = index + 1
        if len(pending) >= _COALESCE_BYTES:
            await flush()
    await flush()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    progress.sent = appended
    progress.done = True
