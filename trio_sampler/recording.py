"""Record live exchanges to a cassette and serve them back, with their timing.

A **cassette** is a JSON Lines file: a first line naming the format, then one line per
exchange (request, status, headers, the raw body as it arrived, in the reads it arrived in,
each with its arrival time)::

    {"format": "trio-sampler.cassette/1"}
    {"request": {...}, "response": {"status": 200, "headers": [...], "headers_at": 0.031,
     "chunks": [[0.044, "ZGF0YTog..."], ...], "end_at": 0.92}}

Times are seconds from the moment the request was handed to the transport, on Trio's clock.
Bodies are base64 (the bytes exactly as received, compressed or not). Credentials never
reach the file: every header and query parameter whose name is a credential's
(``authorization``, ``x-api-key``, ``*token*``, ``cookie``, ... see
:func:`trio_sampler._redact.is_credential_name`) keeps its name and loses its value.

* :class:`RecordingTransport` wraps the transport a sampler talks through and appends each
  exchange to the cassette as its body ends: ``open_sampler(config,
  transport=RecordingTransport("run.cassette"))`` (``trio-sampler record`` does this).
* :class:`ReplayTransport` serves a cassette's exchanges back, in order, with their original
  timing (``timing="original"``, each read at its recorded offset from the request) or as
  fast as possible (``timing="fast"``): ``open_sampler(config,
  transport=ReplayTransport("run.cassette"))``. Under Trio's mock clock the original timing
  costs no wall time.

Both are ``httpx2`` transports, the same kind ``open_sampler(transport=...)`` takes.
"""

from __future__ import annotations

import base64
import enum
import os
import zlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import attrs
import httpx2
import orjson
import trio

from ._redact import is_credential_name, redact_url
from .types import ApiBackend, TrioSamplerError

__all__ = [
    "CASSETTE_FORMAT",
    "Cassette",
    "CassetteApp",
    "CassetteError",
    "Exchange",
    "RecordingTransport",
    "ReplayTransport",
    "Timing",
]

#: The first line's ``format``; a change that breaks readers bumps the number.
CASSETTE_FORMAT = "trio-sampler.cassette/1"

#: What a credential's value becomes in a cassette.
REMOVED = "<removed>"

#: The protocol of an exchange by the end of its URL's path.
_PATHS = (
    ("/chat/completions", ApiBackend.CHAT_COMPLETIONS),
    ("/responses", ApiBackend.RESPONSES),
    ("/messages", ApiBackend.MESSAGES),
)


class CassetteError(TrioSamplerError, ValueError):
    """A cassette file that cannot be read (missing, not a cassette, a malformed line)."""


class Timing(enum.Enum):
    """How :class:`ReplayTransport` paces a recorded body."""

    #: Each read at its recorded offset from the request (headers too).
    ORIGINAL = "original"
    #: Every read at once.
    FAST = "fast"


def _headers(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Header pairs with the values of credential names removed."""
    return tuple((name, REMOVED if is_credential_name(name) else value) for name, value in pairs)


@attrs.frozen
class Exchange:
    """One request and the response it got, as it arrived."""

    method: str
    #: The URL, credential query parameters' values removed.
    url: str = attrs.field(converter=redact_url)
    #: The request's headers, the values of credential names removed.
    request_headers: tuple[tuple[str, str], ...] = attrs.field(converter=_headers)
    request_body: bytes
    status: int
    response_headers: tuple[tuple[str, str], ...]
    #: When the response's headers arrived (seconds from the request).
    headers_at: float
    #: The body, one entry per read: (seconds from the request, bytes).
    chunks: tuple[tuple[float, bytes], ...]
    #: When the body ended (seconds from the request).
    end_at: float

    @property
    def body(self) -> bytes:
        """The whole response body, as it came off the wire."""
        return b"".join(data for _, data in self.chunks)

    def header(self, name: str) -> str | None:
        """The response header ``name`` (any case), if it was sent."""
        wanted = name.lower()
        return next((v for n, v in self.response_headers if n.lower() == wanted), None)

    def decoded_chunks(self) -> list[tuple[float, bytes]]:
        """:attr:`chunks` with a ``gzip`` or ``deflate`` content encoding undone, read by
        read (a client's view of the body). Raises :class:`CassetteError` for another
        encoding: serve it with :class:`ReplayTransport`, whose client decodes it."""
        encoding = (self.header("content-encoding") or "identity").strip().lower()
        if encoding == "identity":
            return list(self.chunks)
        if encoding not in ("gzip", "deflate"):
            raise CassetteError(
                f"the body is {encoding}-encoded; serve it through ReplayTransport, whose "
                "HTTP client decodes it"
            )
        inflate = zlib.decompressobj(wbits=47)  # gzip or zlib, by the header
        return [(at, inflate.decompress(data)) for at, data in self.chunks]

    @property
    def backend(self) -> ApiBackend | None:
        """The protocol of the exchange, from its URL's path (``None`` if unknown)."""
        path = httpx2.URL(self.url).path.rstrip("/")
        return next((b for suffix, b in _PATHS if path.endswith(suffix)), None)

    def to_json(self) -> dict[str, Any]:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")

        return {
            "request": {
                "method": self.method,
                "url": self.url,
                "headers": [list(pair) for pair in self.request_headers],
                "body": b64(self.request_body),
            },
            "response": {
                "status": self.status,
                "headers": [list(pair) for pair in self.response_headers],
                "headers_at": self.headers_at,
                "chunks": [[at, b64(data)] for at, data in self.chunks],
                "end_at": self.end_at,
            },
        }

    @classmethod
    def from_json(cls, value: Any) -> Exchange:
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed value."""
        request, response = value["request"], value["response"]

        def pairs(items: Any) -> tuple[tuple[str, str], ...]:
            return tuple((str(name), str(text)) for name, text in items)

        return cls(
            method=str(request["method"]),
            url=str(request["url"]),
            request_headers=pairs(request["headers"]),
            request_body=base64.b64decode(request["body"], validate=True),
            status=int(response["status"]),
            response_headers=pairs(response["headers"]),
            headers_at=float(response["headers_at"]),
            chunks=tuple(
                (float(at), base64.b64decode(data, validate=True))
                for at, data in response["chunks"]
            ),
            end_at=float(response["end_at"]),
        )


@attrs.frozen
class Cassette:
    """The exchanges of a cassette file, in the order they were recorded."""

    exchanges: tuple[Exchange, ...] = ()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cassette:
        """Read a cassette; raises :class:`CassetteError` naming the file and the line."""
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            where = os.fspath(path)
            raise CassetteError(f"cannot read the cassette {where}: {exc.strerror}") from None
        return cls.parse(text, os.fspath(path))

    @classmethod
    def parse(cls, text: bytes, name: str = "the cassette") -> Cassette:
        """A cassette from the text of its file (``name`` for the errors)."""
        lines = text.splitlines()
        if not lines or not is_cassette_line(lines[0]):
            raise CassetteError(
                f"{name} is not a cassette (its first line is not "
                f'{{"format": "{CASSETTE_FORMAT}"}}); record one with trio-sampler record'
            )
        exchanges = []
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                exchanges.append(Exchange.from_json(orjson.loads(line)))
            except (KeyError, TypeError, ValueError) as exc:
                raise CassetteError(
                    f"{name}, line {number}: not an exchange ({type(exc).__name__}: {exc})"
                ) from None
        return cls(tuple(exchanges))


def is_cassette_line(line: bytes) -> bool:
    """Whether ``line`` is a cassette's first line."""
    try:
        head = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(head, dict) and head.get("format") == CASSETTE_FORMAT


# ---------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------


class RecordingTransport(httpx2.AsyncBaseTransport):
    """Passes every request to ``inner`` and appends each exchange to the cassette at
    ``path`` as its body ends (a body cut short is recorded as far as it was read).

    Args:
        path: the cassette file; created with its first line if missing, appended to
            otherwise.
        inner: the transport to record (default: ``httpx2``'s own network transport).
    """

    def __init__(
        self, path: str | os.PathLike[str], inner: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        self.path = Path(path)
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()
        #: The exchanges recorded by this transport, in the order they ended.
        self.recorded: list[Exchange] = []
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.write_bytes(orjson.dumps({"format": CASSETTE_FORMAT}) + b"\n")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        started = trio.current_time()
        body = await request.aread()
        response = await self._inner.handle_async_request(request)
        recorder = _RecordedBody(self, request, body, response, started)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=recorder,
            request=request,
            extensions=response.extensions,
        )

    def _write(self, exchange: Exchange) -> None:
        self.recorded.append(exchange)
        with self.path.open("ab") as file:
            file.write(orjson.dumps(exchange.to_json()) + b"\n")

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RecordedBody(httpx2.AsyncByteStream):
    """The response body, passed through read by read, with each read's arrival time."""

    def __init__(
        self,
        transport: RecordingTransport,
        request: httpx2.Request,
        request_body: bytes,
        response: httpx2.Response,
        started: float,
    ) -> None:
        self._transport = transport
        self._request = request
        self._request_body = request_body
        self._response = response
        self._started = started
        self._headers_at = trio.current_time() - started
        self._chunks: list[tuple[float, bytes]] = []
        self._written = False
        self._source: AsyncIterator[bytes] | None = None

    # An iterator, not an async generator: one abandoned mid-body (a cancel) has nothing
    # left to finalize.
    def __aiter__(self) -> _RecordedBody:
        stream = self._response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        self._source = stream.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._source is not None, "iterate with async for"
        try:
            chunk = await self._source.__anext__()
        except StopAsyncIteration:
            self._finish()
            raise
        self._chunks.append((trio.current_time() - self._started, bytes(chunk)))
        return chunk

    def _finish(self) -> None:
        if self._written:
            return
        self._written = True
        request, response = self._request, self._response
        self._transport._write(
            Exchange(
                method=request.method,
                url=redact_url(str(request.url)),
                request_headers=_headers(request.headers.items()),
                request_body=self._request_body,
                status=response.status_code,
                response_headers=_headers(response.headers.items()),
                headers_at=self._headers_at,
                chunks=tuple(self._chunks),
                end_at=trio.current_time() - self._started,
            )
        )

    async def aclose(self) -> None:
        self._finish()
        await self._response.aclose()


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------


class _Deck:
    """A cassette's exchanges, each served once: the next one recorded for a method and a
    path (so requests to several endpoints interleave as they did)."""

    def __init__(self, cassette: Cassette) -> None:
        self.cassette = cassette
        self._served = [False] * len(cassette.exchanges)

    def next(self, method: str, path: str) -> Exchange | None:
        for index, exchange in enumerate(self.cassette.exchanges):
            if self._served[index] or exchange.method != method:
                continue
            if httpx2.URL(exchange.url).path == path:
                self._served[index] = True
                return exchange
        return None

    def missing(self, method: str, path: str) -> bytes:
        """The JSON error body of a request the cassette has nothing left for."""
        message = (
            f"the cassette has no exchange left for {method} {path} "
            f"({sum(self._served)} of {len(self._served)} served)"
        )
        return orjson.dumps({"error": {"type": "cassette_exhausted", "message": message}})


def _load(cassette: Cassette | str | os.PathLike[str]) -> Cassette:
    return cassette if isinstance(cassette, Cassette) else Cassette.load(cassette)


def _timing(timing: Timing | str) -> Timing:
    try:
        return Timing(timing)
    except ValueError:
        raise ValueError(
            f"timing must be 'original' or 'fast' (a Timing), not {timing!r}"
        ) from None


class ReplayTransport(httpx2.AsyncBaseTransport):
    """Serves a cassette's exchanges back, one per request, in the order recorded.

    Each request gets the next exchange recorded for the same method and URL path (so
    requests to several endpoints interleave as they did). A request the cassette has no
    exchange left for is answered ``404`` with an error body naming it (not retried, and
    the ``Failed`` says what was missing).

    Args:
        cassette: a :class:`Cassette` or the path of a cassette file.
        timing: :attr:`Timing.ORIGINAL` (default) paces the headers and every read at
            their recorded offsets from the request; :attr:`Timing.FAST` serves at once.
    """

    def __init__(
        self, cassette: Cassette | str | os.PathLike[str], *, timing: Timing | str = Timing.ORIGINAL
    ) -> None:
        self.cassette = _load(cassette)
        self.timing = _timing(timing)
        self._deck = _Deck(self.cassette)
        #: The requests served, in order.
        self.requests: list[httpx2.Request] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        started = trio.current_time()
        self.requests.append(request)
        method, path = request.method, request.url.path
        exchange = self._deck.next(method, path)
        if exchange is None:
            await trio.lowlevel.checkpoint()
            return httpx2.Response(
                404,
                headers={"content-type": "application/json"},
                content=self._deck.missing(method, path),
                request=request,
            )
        if self.timing is Timing.ORIGINAL:
            await trio.sleep_until(started + exchange.headers_at)
        else:
            await trio.lowlevel.checkpoint()
        # The headers and body as they came off the wire (still compressed, if they were):
        # the client decodes them as it did the first time.
        return httpx2.Response(
            exchange.status,
            headers=list(exchange.response_headers),
            stream=_ReplayedBody(exchange, started, self.timing),
            request=request,
        )


class _ReplayedBody(httpx2.AsyncByteStream):
    def __init__(self, exchange: Exchange, started: float, timing: Timing) -> None:
        self._exchange = exchange
        self._started = started
        self._original = timing is Timing.ORIGINAL
        self._next = 0

    def __aiter__(self) -> _ReplayedBody:
        return self

    async def __anext__(self) -> bytes:
        chunks = self._exchange.chunks
        index = self._next
        if index >= len(chunks):
            if self._original:  # the body ends when it ended
                await trio.sleep_until(self._started + self._exchange.end_at)
            raise StopAsyncIteration
        self._next += 1
        at, data = chunks[index]
        if self._original:
            await trio.sleep_until(self._started + at)
        else:
            await trio.lowlevel.checkpoint()
        return data

    async def aclose(self) -> None:
        pass


# ---------------------------------------------------------------------------------------
# Serving over HTTP
# ---------------------------------------------------------------------------------------

#: Recorded headers the serving HTTP server writes itself (framing, connection, date).
_SERVER_OWNED = frozenset(
    {"transfer-encoding", "connection", "keep-alive", "date", "server", "alt-svc"}
)


class CassetteApp:
    """An ASGI app answering each request with the cassette's next exchange for its method
    and path, paced as :class:`ReplayTransport` paces it: serve it on a real port with
    :func:`trio_sampler.emulator.serve` (``trio-sampler serve --cassette FILE``, the pytest
    plugin's ``cassette_server`` fixture) to test a client that is not this library's."""

    def __init__(
        self, cassette: Cassette | str | os.PathLike[str], *, timing: Timing | str = Timing.ORIGINAL
    ) -> None:
        self.cassette = _load(cassette)
        self.timing = _timing(timing)
        self._deck = _Deck(self.cassette)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        started = trio.current_time()
        while (await receive()).get("more_body", False):
            pass  # the request body is not compared: the cassette's order decides
        method, path = scope["method"], scope["path"]
        exchange = self._deck.next(method, path)
        if exchange is None:
            body = self._deck.missing(method, path)
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._answer(exchange, started, send)

    async def _answer(self, exchange: Exchange, started: float, send: Any) -> None:
        original = self.timing is Timing.ORIGINAL
        if original:
            await trio.sleep_until(started + exchange.headers_at)
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in exchange.response_headers
            if name.lower() not in _SERVER_OWNED
        ]
        await send({"type": "http.response.start", "status": exchange.status, "headers": headers})
        for at, data in exchange.chunks:
            if original:
                await trio.sleep_until(started + at)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        if original:
            await trio.sleep_until(started + exchange.end_at)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
