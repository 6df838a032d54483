"""Every real capture gives the same response through every path, per capture.

The paths: ``collect(replay(...))``; the actor, with the capture served over loopback
HTTP; the bridge over the same server; and the fold of the stream's deltas alone (no
terminal), which must rebuild the terminal's items exactly: one fold, so the response of
a stream and the fold of its events cannot disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
from loopback import read_request, serve

from benchmarks import corpus
from trio_sampler import (
    ApiBackend,
    Assistant,
    Cancelled,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    SamplerConfig,
    User,
    open_sampler,
)
from trio_sampler.bridge import TurnCancelled, run_turn_via_sampler
from trio_sampler.config import RetryPolicy, Timeouts
from trio_sampler.doom_loop import DoomLoopPolicy
from trio_sampler.models import ModelCatalog
from trio_sampler.wire import collect, replay

pytestmark = pytest.mark.real_streams


def _content(response: ConversationResponse) -> tuple[Any, ...]:
    """The items without the per-turn metadata (model, message id, Responses ``phase``,
    Chat Completions audio id) only a terminal has."""
    return tuple(
        attrs.evolve(item, model=None, id=None, phase=None, audio_id=None)
        if isinstance(item, Assistant)
        else item
        for item in response.items
    )


def _terminal_response(events: list[Any]) -> ConversationResponse | None:
    end = events[-1]
    if isinstance(end, Completed):
        return end.response
    assert isinstance(end, Failed | Cancelled)
    return end.partial


def _replaying(body: bytes, content_type: str) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A connection handler that answers the request with the capture's bytes, in reads
    of a few KiB, then closes the connection."""

    async def handler(stream: trio.SocketStream) -> None:
        if await read_request(stream) is None:
            return
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: "
            + content_type.encode()
            + b"\r\nconnection: close\r\n\r\n"
        )
        for start in range(0, len(body), 4096):
            await stream.send_all(body[start : start + 4096])

    return handler


@pytest.mark.parametrize("capture", corpus.params())
async def test_every_path_gives_the_same_response(capture: dict[str, Any]) -> None:
    backend = ApiBackend(capture["backend"])
    body = capture["path"].read_bytes()

    # 1. The wire layer alone.
    events = replay(backend, body)
    by_replay = collect(events)
    own = _terminal_response(events)
    # A failure before any output carries no partial: collect folds the (no) deltas.
    assert by_replay == (own if own is not None else ConversationResponse(items=[Assistant()]))

    # 2. One fold: the deltas alone rebuild the terminal's items (and chunk count).
    deltas = collect(e for e in events if not isinstance(e, Completed | Failed | Cancelled))
    assert _content(deltas) == _content(by_replay)
    assert deltas.chunk_count == by_replay.chunk_count

    # 3. The actor and 4. the bridge, over loopback HTTP.
    async with serve(_replaying(body, capture["content_type"] or "text/event-stream")) as port:
        config = SamplerConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            backend=backend,
            model=capture.get("model") or "model",
            api_key="sk-corpus-test-0123456789",
            retry=RetryPolicy(max_retries=0),
            timeouts=Timeouts(first_token=30.0, idle=30.0, response_headers=30.0),
        )
        request = ConversationRequest(items=[User("replay")])
        with trio.fail_after(60):
            async with open_sampler(
                config, doom_loop=DoomLoopPolicy(enabled=False), models=ModelCatalog()
            ) as sampler:
                stream = await sampler.submit(request)
                actor_events = [event async for event in stream]
                outcome = await run_turn_via_sampler(sampler, request)

    by_actor = collect(actor_events)
    assert by_actor == by_replay
    assert not isinstance(outcome, TurnCancelled)
    by_bridge = getattr(outcome, "response", None) or getattr(outcome, "partial", None)
    assert by_bridge == by_replay
