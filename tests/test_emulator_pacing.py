"""Token pacing (first_token_ms, token_interval_ms) and ignore_eos in the emulator script."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import MutableMapping
from typing import Any

import httpx2
import orjson
import pytest
import trio
import trio.testing

from trio_sampler._receive_time import kernel_timestamps_available
from trio_sampler.emulator import EmulatorApp, PromptCache, ScriptError, parse_script, serve
from trio_sampler.emulator._arrival import ArrivalStream
from trio_sampler.emulator._punctuality import Punctuality
from trio_sampler.emulator._sse import is_token_frame
from trio_sampler.emulator._timer import DeadlineTimer
from trio_sampler.testing import EmulatorTransport, script_headers

BASE = "http://emulator.test/v1"
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {
    "/chat/completions": {"model": "m", "stream": True, "messages": MESSAGES, "max_tokens": 16},
    "/responses": {"model": "m", "stream": True, "input": "hi", "max_output_tokens": 16},
    "/messages": {"model": "c", "stream": True, "messages": MESSAGES, "max_tokens": 16},
}


def _token_frames(body: bytes) -> list[bytes]:
    return [frame for frame in body.split(b"\n\n") if frame and is_token_frame(frame + b"\n\n")]


@pytest.mark.parametrize("path", list(BODIES))
async def test_tokens_arrive_on_the_programmed_schedule(
    autojump_clock: trio.abc.Clock, path: str
) -> None:
    headers = script_headers(
        ignore_eos=True, chunk_chars=4, first_token_ms=250, token_interval_ms=40
    )
    arrivals: list[float] = []
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        start = trio.current_time()
        async with client.stream("POST", BASE + path, json=BODIES[path], headers=headers) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_raw():
                arrivals.extend(trio.current_time() - start for _ in _token_frames(chunk))
    # ignore_eos with 4-character deltas: exactly max_tokens deltas, the first at 250 ms,
    # then one every 40 ms.
    assert arrivals == pytest.approx([0.25 + 0.04 * k for k in range(16)])


async def test_ignore_eos_fills_max_tokens_and_stops_on_length() -> None:
    headers = script_headers(ignore_eos=True)
    body = {**BODIES["/chat/completions"], "stream": False, "max_tokens": 37}
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        response = await client.post(BASE + "/chat/completions", json=body, headers=headers)
    data = response.json()
    assert data["usage"]["completion_tokens"] == 37
    assert data["choices"][0]["finish_reason"] == "length"


async def test_without_ignore_eos_the_reply_keeps_its_own_length() -> None:
    body = {**BODIES["/chat/completions"], "stream": False, "max_tokens": 4000}
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        response = await client.post(BASE + "/chat/completions", json=body)
    data = response.json()
    assert data["usage"]["completion_tokens"] < 4000
    assert data["choices"][0]["finish_reason"] == "stop"


def test_pacing_and_delay_ms_do_not_combine() -> None:
    with pytest.raises(ScriptError, match="delay_ms"):
        parse_script(orjson.dumps({"delay_ms": 5, "first_token_ms": 10}))


@pytest.mark.parametrize(
    ("key", "value"),
    [("first_token_ms", "soon"), ("token_interval_ms", -1), ("ignore_eos", "yes")],
)
def test_pacing_keys_are_validated(key: str, value: Any) -> None:
    with pytest.raises(ScriptError, match=key):
        parse_script(orjson.dumps({key: value}))


def _chat(delta: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"delta": delta}]}) + b"\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    kind: str = payload["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (_chat({"content": "hi"}), True),
        (_chat({"role": "assistant", "content": ""}), False),
        (_chat({"reasoning_content": "so"}), True),
        (_chat({"tool_calls": [{"function": {"arguments": "{"}}]}), True),
        (_chat({"tool_calls": [{"function": {"name": "f", "arguments": ""}}]}), False),
        (b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n', False),
        (b"data: [DONE]\n\n", False),
        (_event({"type": "response.output_text.delta", "delta": "a"}), True),
        (_event({"type": "response.created"}), False),
        (
            _event({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}}),
            True,
        ),
        (_event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}), False),
        (b": keep-alive\n\n", False),
    ],
)
def test_is_token_frame(frame: bytes, expected: bool) -> None:
    assert is_token_frame(frame) is expected


# -- the paced stream on the wire: what is sent, and when -----------------------------------


async def _call(
    script: dict[str, Any], path: str, *, body_after: float = 0.0
) -> list[tuple[float, bytes]]:
    """Serve one request straight through the ASGI app; each body message sent, with the
    time (from the request's arrival) it was sent at. The body arrives ``body_after``
    seconds after the request head."""
    app = EmulatorApp(cache=PromptCache())
    body = orjson.dumps(BODIES[path])
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1" + path,
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"x-emulator-script", orjson.dumps(script)),
        ],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            await trio.sleep(body_after)
            return messages.pop()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    sent: list[tuple[float, bytes]] = []
    start = trio.current_time()

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        elif message["body"]:
            sent.append((trio.current_time() - start, message["body"]))

    await app({"type": "http", **scope}, receive, send)
    return sent


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_paced_stream_is_the_unpaced_stream_one_delta_per_message(
    autojump_clock: trio.abc.Clock, path: str
) -> None:
    script: dict[str, Any] = {"ignore_eos": True, "chunk_chars": 4}
    unpaced = await _call(script, path)
    paced = await _call({**script, "first_token_ms": 250, "token_interval_ms": 40}, path)
    # The same bytes (the reply depends on the request, not on its pacing) ...
    assert b"".join(body for _, body in paced) == b"".join(body for _, body in unpaced)
    # ... with each content delta in a body message of its own, sent when it is due.
    deltas = [(at, body) for at, body in paced if _token_frames(body)]
    assert [len(_token_frames(body)) for _, body in deltas] == [1] * 16
    assert [at for at, _ in deltas] == pytest.approx([0.25 + 0.04 * k for k in range(16)])


async def test_pacing_counts_from_the_end_of_the_requests_body(
    autojump_clock: trio.abc.Clock,
) -> None:
    # In memory there is no connection to say when the bytes came: the request arrived
    # when the app had read its body, 0.1 s after the head.
    script = {"ignore_eos": True, "chunk_chars": 4, "first_token_ms": 250, "token_interval_ms": 40}
    sent = await _call(script, "/chat/completions", body_after=0.1)
    deltas = [at for at, body in sent if _token_frames(body)]
    assert deltas[0] == pytest.approx(0.35)
    assert deltas[1:] == pytest.approx([0.35 + 0.04 * k for k in range(1, 16)])


# -- over a real connection: the clock starts at the read of the request's last bytes -----


def _raw_request(script: dict[str, Any]) -> bytes:
    body = orjson.dumps(BODIES["/chat/completions"])
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\nx-emulator-script: "
        + orjson.dumps(script)
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


async def _first_token_after_last_byte(
    stream: trio.SocketStream, request: bytes, cut: int, gap: float
) -> float:
    """Send ``request`` in two writes, ``gap`` seconds apart, the first ``cut`` bytes
    long; read its response to the end; how long after the last byte the first content
    delta came."""
    await stream.send_all(request[:cut])
    await trio.sleep(gap)
    await stream.send_all(request[cut:])
    written = trio.current_time()
    received = b""
    first: float | None = None
    while not received.endswith(b"0\r\n\r\n"):
        chunk = await stream.receive_some(65536)
        assert chunk, "the emulator closed the connection"
        received += chunk
        if first is None and b'"content":"' in chunk and b'"content":""' not in chunk:
            first = trio.current_time()
    assert first is not None
    return first - written


@pytest.mark.parametrize("in_the_head", [True, False], ids=["head-cut", "body-late"])
async def test_over_a_connection_pacing_counts_from_the_last_bytes_read(
    in_the_head: bool,
) -> None:
    # The real network (not timing precision, which the benchmark measures): the request
    # comes in two writes 0.3 s apart, cut in its head or between head and body. The first
    # token is due 0.3 s after the second write; counted from the first bytes it would
    # come right after that write. The second request on the same connection gets its
    # own arrival.
    script = {"ignore_eos": True, "chunk_chars": 4, "first_token_ms": 300, "token_interval_ms": 1}
    request = _raw_request(script)
    cut = 20 if in_the_head else request.index(b"\r\n\r\n") + 4
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            for _ in range(2):
                after = await _first_token_after_last_byte(stream, request, cut, 0.3)
                # The server may read the last bytes just before ``written`` is taken
                # (``send_all`` ends in a schedule point): a few ms of slack below.
                assert 0.29 <= after < 0.5
                await trio.sleep(0.3)  # idle: the next request's clock is its own
        nursery.cancel_scope.cancel()


async def test_a_requests_bytes_are_timed_by_their_arrival_not_by_the_read() -> None:
    # Bytes that waited in the socket while the server was busy arrived when they came
    # (the kernel's receive timestamp, where Linux gives one), not when they were read.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        async with client, ArrivalStream(await listeners[0].accept()) as server:
            await client.send_all(b"POST / HTTP/1.1\r\n")
            await trio.sleep(0.1)
            await client.send_all(b"\r\n")
            written = trio.current_time()
            await trio.sleep(0.3)  # the server is busy elsewhere
            received = b""
            while len(received) < 18:
                received += await server.receive_some()
            read = trio.current_time()
            arrived = server.arrived()
            assert arrived is not None
            if not kernel_timestamps_available():  # no kernel timestamps here: the read's own time
                assert written + 0.3 <= arrived <= read
            else:
                assert written - 0.05 <= arrived <= written + 0.05
            # Once the app has taken the arrival, later bytes are not the request's.
            await client.send_all(b"more")
            assert await server.receive_some() == b"more"
            assert server.arrived() == arrived


# -- the deadline timer ----------------------------------------------------------------------


async def test_the_deadline_timer_follows_the_mock_clock(autojump_clock: trio.abc.Clock) -> None:
    with DeadlineTimer() as timer:
        start = trio.current_time()
        for k in range(1, 4):
            await timer.sleep_until(start + 0.1 * k)
            assert trio.current_time() == pytest.approx(start + 0.1 * k)


async def test_the_deadline_timer_never_wakes_before_its_deadline() -> None:
    # The real clock (a timerfd on Linux): each wake-up is at or after its deadline, and
    # a deadline already past is a checkpoint, not a wait. How late is for the benchmark.
    with DeadlineTimer() as timer:
        start = trio.current_time()
        for k in range(1, 6):
            deadline = start + 0.003 * k
            await timer.sleep_until(deadline)
            assert trio.current_time() >= deadline
        with trio.testing.assert_checkpoints():
            await timer.sleep_until(start)


async def test_the_deadline_timer_is_cancellable_and_closes_its_descriptor() -> None:
    with DeadlineTimer() as timer:
        with trio.move_on_after(0.01) as scope:
            await timer.sleep_until(trio.current_time() + 60)
        assert scope.cancelled_caught
        fd = timer._fd
    assert timer._fd is None
    if fd is not None:  # Linux: the timerfd is gone
        with pytest.raises(OSError):
            os.fstat(fd)


# -- punctuality: what the paced writes did, against their schedule -------------------------


async def test_the_emulator_reports_its_paced_writes_against_their_schedule(
    autojump_clock: trio.abc.Clock,
) -> None:
    script = script_headers(
        ignore_eos=True, chunk_chars=4, first_token_ms=250, token_interval_ms=40
    )
    body = BODIES["/chat/completions"]
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        for _ in range(3):
            async with client.stream(
                "POST", BASE + "/chat/completions", json=body, headers=script
            ) as r:
                await r.aread()
        report = (await client.get(BASE + "/emulator/pacing")).json()
        # Each stream: its first delta (TTFT 250 ms), then 15 more 40 ms apart; under the
        # mock clock every write is on time.
        assert report["first_token_late"]["count"] == 3
        assert report["token_late"]["count"] == 45
        assert report["ttft"]["p50"] == report["ttft"]["max"] == pytest.approx(250)
        assert report["itl"]["p99"] == pytest.approx(40)
        assert report["first_token_late"]["max"] == report["token_late"]["max"] == 0
        assert report["pid"] == os.getpid()
        # With ?values=1, the values themselves (ms), for merging several processes'.
        full = (await client.get(BASE + "/emulator/pacing", params={"values": "1"})).json()
        assert full["ttft"]["values"] == pytest.approx([250] * 3)
        assert full["itl"]["values"] == pytest.approx([40] * 45)
        assert "values" not in report["ttft"]
        # DELETE clears it (and answers with the emptied report).
        cleared = (await client.delete(BASE + "/emulator/pacing")).json()
        assert cleared["ttft"] == {"count": 0, **dict.fromkeys(["p50", "p90", "p95", "p99", "max"])}
        assert (await client.get(BASE + "/emulator/pacing")).json() == cleared


async def test_unpaced_streams_leave_no_punctuality_values() -> None:
    async with httpx2.AsyncClient(transport=EmulatorTransport()) as client:
        async with client.stream(
            "POST", BASE + "/chat/completions", json=BODIES["/chat/completions"]
        ) as r:
            await r.aread()
        report = (await client.get(BASE + "/emulator/pacing")).json()
    assert all(
        report[kind]["count"] == 0 for kind in ("first_token_late", "token_late", "ttft", "itl")
    )


async def test_over_a_connection_a_paced_write_is_timed_when_the_kernel_took_it() -> None:
    # A late write counts as late: the server's loop is held up (a blocking call in
    # another task) just as a delta falls due, so its write goes out late and says so.
    script = {"ignore_eos": True, "chunk_chars": 4, "first_token_ms": 100, "token_interval_ms": 50}
    app = EmulatorApp()

    async def block_at(delay: float, seconds: float) -> None:
        await trio.sleep(delay)
        time.sleep(seconds)  # noqa: ASYNC251 (deliberate: the whole process stalls)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, app=app))
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            nursery.start_soon(block_at, 0.12, 0.1)  # across the second delta (due at 0.15)
            await _first_token_after_last_byte(stream, _raw_request(script), 20, 0.0)
        nursery.cancel_scope.cancel()
    report = app.punctuality.report()
    assert report["first_token_late"]["count"] == 1
    assert report["token_late"]["count"] == 15
    assert report["ttft"]["max"] >= 100
    # The second delta was due at 150 ms and written after the stall ended at 220 ms.
    assert report["token_late"]["max"] >= 60
    assert report["itl"]["max"] >= 110


def test_punctuality_percentiles_are_nearest_rank_over_the_most_recent_values() -> None:
    record = Punctuality(max_samples=100)
    for k in range(300):  # only the last 100 (200 ... 299 ms late) are kept
        record.delta_written(1, due=0.0, written=k / 1000, arrived=0.0, previous=0.0)
    late = record.report()["token_late"]
    assert late["count"] == 100
    assert late["p50"] == pytest.approx(249)
    assert late["p99"] == pytest.approx(298)
    assert late["max"] == pytest.approx(299)
    with pytest.raises(ValueError, match="max_samples must be a positive int"):
        Punctuality(max_samples=0)
