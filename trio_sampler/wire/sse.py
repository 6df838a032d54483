"""An incremental, bytes-level Server-Sent Events decoder (WHATWG rules). Pure.

Bytes go in, :class:`ServerSentEvent` values come out; no I/O, no clock. The decoder
splits on bytes and decodes UTF-8 only per complete line, so

* a multi-byte character split across network reads survives, and
* U+2028 / U+2029 inside a JSON string are just characters, never line ends
  (``str.splitlines`` — what ``aiter_lines`` uses — would split there and corrupt JSON).

Line ends are ``\\n``, ``\\r`` and ``\\r\\n``, including a ``\\r\\n`` split across two
chunks. A UTF-8 BOM at the very start is dropped. Lines starting with ``:`` are comments.
``data`` lines are joined with ``\\n``; ``event``, ``id`` and ``retry`` are kept; other
fields are ignored. A blank line dispatches an event; an event with no ``data`` field is
not dispatched (WHATWG).

Cost is linear in the bytes received, however large one event or line is and however the
bytes are split: each byte is scanned a fixed number of times, by the read it came in
(a few passes in C: the search for a run of plain frames, then the line split). An
unfinished line is carried in a ``bytearray`` that only ever holds bytes already known to
contain no line end, so a read extends it without rescanning or copying what came before
(the scan offset of h11's receive buffer). One 16 MiB event in 16 KiB reads, or one long
line trickled in 64-byte reads, costs the same per byte as ordinary traffic
(``benchmarks/bench_wire.py``).

Memory is bounded: one event (its lines so far plus the line still arriving) may not
exceed ``max_event_bytes``. Past it, :meth:`SSEDecoder.feed` raises
:class:`SSEEventTooLarge` at the read that crosses the bound and the decoder stays failed;
callers turn that into a typed ``Failed`` (see :func:`trio_sampler.wire.replay`).
Comment lines are skipped as they arrive and never buffered, so they are not bounded.

At end of body, :meth:`SSEDecoder.close` dispatches an event whose lines were all
complete but that lacked the final blank line (some servers omit it), and discards an
unterminated last line: a body cut mid-line is a truncated stream, not an event.

Per event, the cost that matters is what a stream of small events pays: lines stay
``bytes`` until their event is dispatched, and :meth:`SSEDecoder.feed_payloads` hands a
data-only event over as its raw bytes (no ``str``, no event object), which
:meth:`StreamTransform.feed_payloads <trio_sampler.wire.StreamTransform.feed_payloads>`
parses as they are.
"""

from __future__ import annotations

from typing import TypeAlias

import attrs

from ..types import TrioSamplerError

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEventTooLarge",
    "SSEPayload",
    "ServerSentEvent",
    "payload_event",
]

#: Default bound on one event's size: generous for huge tool arguments, still bounded.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"


@attrs.define
class ServerSentEvent:
    """One dispatched event. ``event`` is ``"message"`` when the server sent no ``event:``."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


#: One decoded event as :meth:`SSEDecoder.feed_payloads` gives it: the raw data of an
#: unnamed event with one ``data`` line, ``(name, raw data)`` of a named one, or the whole
#: event.
SSEPayload: TypeAlias = "bytes | tuple[str, bytes] | ServerSentEvent"


def payload_event(item: SSEPayload) -> ServerSentEvent:
    """The :class:`ServerSentEvent` an :data:`SSEPayload` stands for."""
    if type(item) is bytes:
        return ServerSentEvent(item.decode("utf-8", "replace"))
    if type(item) is tuple:
        name, raw = item
        return ServerSentEvent(raw.decode("utf-8", "replace"), name)
    return item  # type: ignore[return-value]


class SSEDecodeError(TrioSamplerError, ValueError):
    """The byte stream cannot be decoded as SSE within the configured bounds."""


class SSEEventTooLarge(SSEDecodeError):
    """One event exceeded ``max_event_bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"a server-sent event exceeded the {limit}-byte limit; the stream was stopped "
            "(raise max_sse_event_bytes in the config if the server legitimately sends "
            "events this large)"
        )
        self.limit = limit


class SSEDecoder:
    """Incremental SSE decoder: ``feed(chunk) -> events`` and ``close() -> events``.

    Feeding a body whole, byte by byte or split anywhere yields the same events.
    """

    __slots__ = (
        "_at_start",
        "_data",
        "_event",
        "_event_bytes",
        "_failed",
        "_in_comment",
        "_last_id",
        "_max",
        "_partial",
        "_retry",
        "_skip_lf",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes <= 0:
            raise ValueError("max_event_bytes must be a positive number of bytes")
        self._max = max_event_bytes
        # The incomplete last line, carried to the next chunk; it never holds a line end.
        self._partial = bytearray()
        self._at_start = True  # BOM detection still pending
        self._skip_lf = False  # last chunk ended in \r: a leading \n belongs to it
        self._in_comment = False  # inside a comment line split across chunks
        self._failed = False
        # The event's data lines, undecoded (decoded when it is dispatched).
        self._data: list[bytes] = []
        self._event: str | None = None
        self._last_id: str | None = None  # persists across events (WHATWG)
        self._retry: int | None = None
        self._event_bytes = 0

    @property
    def buffered_bytes(self) -> int:
        """The bytes it holds for the event in progress: its data lines and the carried
        partial line, as allocated (a growing ``bytearray`` keeps an eighth again in
        reserve); what a memory account counts."""
        return self._event_bytes + self._partial.__sizeof__()

    @property
    def last_event_id(self) -> str | None:
        """The last ``id`` field seen (WHATWG: it persists across events)."""
        return self._last_id

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode ``chunk`` and return the events it completed.

        Raises :class:`SSEEventTooLarge` when an event grows past the bound (and on every
        call after that).
        """
        return [payload_event(item) for item in self.feed_payloads(chunk)]

    def feed_payloads(self, chunk: bytes) -> list[SSEPayload]:
        """:meth:`feed`, in the form that costs least per event: an event with one
        ``data`` line, no ``retry`` and no ``id`` (nor any ``id`` before it: what the
        three protocols send) is its data's raw UTF-8 ``bytes``, undecoded, when it has
        no ``event`` name (a Chat Completions stream), or ``(name, raw data)`` when it
        has one; any other event is a :class:`ServerSentEvent`. Decoding the raw data
        with ``"replace"`` gives the data :meth:`feed` would give; an unnamed event is
        ``"message"``.
        """
        if self._failed:
            raise SSEEventTooLarge(self._max)
        if not chunk:
            return []
        if self._at_start:
            # Hold back until we can tell whether the body starts with a BOM.
            data = bytes(self._partial) + chunk
            if len(data) < 3 and _BOM.startswith(data):
                self._partial[:] = data
                return []
            self._at_start = False
            self._partial.clear()
            chunk = data[3:] if data.startswith(_BOM) else data
            if not chunk:
                return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        # ``find``, not ``in``: ``bytes.__contains__`` tries its operand as an integer
        # first, and a ``bytes`` one raises (and clears) a formatted ``TypeError`` every
        # time: about 2,000 machine instructions a test, two a read here (callgrind).
        if chunk.find(b"\r") >= 0:
            if chunk.endswith(b"\r"):
                self._skip_lf = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        # From here on the only line end is \n.
        out: list[SSEPayload] = []
        if self._partial or self._in_comment or self._data or self._event_bytes:
            # An event in progress: it ends at the first blank line, the general way.
            end = chunk.find(b"\n\n")
            if end < 0:
                self._feed_lines(chunk, out)
                return out
            self._feed_lines(chunk[: end + 2], out)
            chunk = chunk[end + 2 :]
        if self._last_id is None and self._retry is None and self._event is None:
            chunk = self._plain_frames(chunk, out)
        if chunk:
            self._feed_lines(chunk, out)
        return out

    def _plain_frames(self, chunk: bytes, out: list[SSEPayload]) -> bytes:
        """The run of plain data frames (``data: X`` then a blank line, ``X`` one line)
        that ``chunk`` starts with, from a decoder with no event in progress, into
        ``out`` in one split; returns the rest of ``chunk``. What a Chat Completions read
        holds: its frames cost no Python per frame (the line loop runs about 70 bytecode
        instructions a frame, 14,000 of the 81,000 of a 200-delta request before this:
        ``benchmarks/calls_per_request.py --bytecode``). The events are those of the loop:
        every line end in the run is a frame's blank line, every frame starts with
        ``data: ``, and the run is shorter than one event's bound."""
        end = chunk.rfind(b"\n\n")
        if end < 6 or end >= self._max or not chunk.startswith(b"data: "):
            return chunk
        frames = chunk[6:end].split(b"\n\ndata: ")
        # A line end left in a frame is a line that is not a plain frame's: the line loop
        # takes it all. The frames, joined, are searched by ``memchr``: the split and the
        # search of a 200-delta request's 36 kB take 21 µs where counting the line ends
        # and the boundaries first (``bytes.count`` of one byte is a plain loop) took 45,
        # and 0.32 M fewer of its 5.96 M instructions (``instructions_per_request.py``).
        if b"".join(frames).find(b"\n") >= 0:  # ``find``: see the ``\r`` test above
            return chunk
        out += frames
        return chunk[end + 2 :]

    def _feed_lines(self, chunk: bytes, out: list[SSEPayload]) -> None:
        """Decode ``chunk`` (no ``\r`` in it) line by line into ``out``. Every byte of
        ``chunk`` is scanned once: the carried partial line is known to hold no line
        end, so it is never scanned again, only extended (its end is the scan offset, as
        in h11's receive buffer)."""
        lines = chunk.split(b"\n")
        if len(lines) == 1:  # no line end: the partial line grows (or a comment goes on)
            if not self._in_comment:
                self._extend(chunk)
            return
        if self._in_comment:
            # The rest of a comment line that began in an earlier chunk: drop it unseen.
            self._in_comment = False
            del lines[0]
        elif self._partial:
            partial = self._partial
            partial += lines[0]
            lines[0] = bytes(partial)
            partial.clear()
        tail = lines.pop()
        if lines:
            self._lines(lines, out)
        if tail:  # the start of a new line (the carried partial is empty again here)
            if tail[0] == 0x3A:  # b":": an unfinished comment, see _extend
                self._in_comment = True
            else:
                self._partial += tail
                if self._event_bytes + len(tail) > self._max:
                    self._fail()

    def close(self) -> list[ServerSentEvent]:
        """Signal end of body; returns a final event that lacked its blank line, if any."""
        return [payload_event(item) for item in self.close_payloads()]

    def close_payloads(self) -> list[SSEPayload]:
        """:meth:`close`, in the form of :meth:`feed_payloads`."""
        if self._failed:
            return []
        out: list[SSEPayload] = []
        # An unterminated last line is a truncated line: discard it (see module doc).
        self._partial.clear()
        self._in_comment = False
        data = self._data
        if data:
            if len(data) == 1 and self._retry is None and self._last_id is None:
                event = self._event
                out.append((event, data[0]) if event else data[0])
            else:
                self._dispatch(data, self._event, out)
        self._reset_event()
        return out

    # -- internals -----------------------------------------------------------------

    def _extend(self, piece: bytes) -> None:
        """Carry ``piece`` (no line end in it) as the start or next part of a line."""
        partial = self._partial
        if not partial and piece[:1] == b":":
            # An unfinished comment: its bytes are never needed, so none are kept. This
            # keeps comments free of the size bound however they are split.
            self._in_comment = True
            return
        partial += piece
        # The line will count towards its event when it ends: fail as soon as it cannot fit.
        if self._event_bytes + len(partial) > self._max:
            self._fail()

    def _fail(self) -> None:
        self._failed = True
        self._partial = bytearray()
        self._data = []
        raise SSEEventTooLarge(self._max)

    def _lines(self, lines: list[bytes], out: list[SSEPayload]) -> None:
        # The hot loop: one iteration per line, without a method call per line.
        # ``data: `` and ``event: `` (with the usual single space) are handled inline, with
        # the event's state in locals; anything else (comments, ``id``, ``retry``, odd
        # spacing, unknown fields) goes through ``_line`` with the state written back
        # first. Both paths implement the same rules. ``plain``: no ``retry`` in this
        # event and no ``id`` ever, so a lone data line is dispatched as its bytes.
        # ``first``: the event's data line while it is its only one, kept out of ``data``
        # (the usual event is one line: no list is made or grown for it).
        data = self._data
        first: bytes | None = None
        event = self._event
        size = self._event_bytes
        limit = self._max
        plain = self._retry is None and self._last_id is None
        for line in lines:
            if line[:6] == b"data: ":
                size += len(line) + 1
                if size > limit:
                    self._fail()
                if first is None and not data:
                    first = line[6:]
                else:
                    if first is not None:
                        data.append(first)
                        first = None
                    data.append(line[6:])
            elif not line:  # a blank line dispatches the event (if it has data)
                if first is not None:
                    if plain:
                        out.append((event, first) if event else first)
                    else:
                        self._dispatch([first], event, out)
                    first = None
                elif data:
                    if plain and len(data) == 1:
                        out.append((event, data[0]) if event else data[0])
                    else:
                        self._dispatch(data, event, out)
                    data = []
                event = None
                if not plain:
                    self._retry = None
                    plain = self._last_id is None
                size = 0
            elif line[:7] == b"event: ":
                size += len(line) + 1
                if size > limit:
                    self._fail()
                event = line[7:].decode("utf-8", "replace")
            else:
                if first is not None:
                    data.append(first)
                    first = None
                self._data = data
                self._event = event
                self._event_bytes = size
                self._line(line)
                data = self._data
                event = self._event
                size = self._event_bytes
                plain = self._retry is None and self._last_id is None
        if first is not None:
            data.append(first)
        self._data = data
        self._event = event
        self._event_bytes = size

    def _line(self, raw: bytes) -> None:
        """Any non-blank line the fast path in :meth:`_lines` does not take."""
        if raw[0] == 0x3A:  # b":" comment (keep-alives such as ": OPENROUTER PROCESSING")
            return
        self._event_bytes += len(raw) + 1
        if self._event_bytes > self._max:
            self._fail()
        name, sep, value = raw.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\x00" not in value:  # WHATWG: ids containing NUL are ignored
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)
        # Any other field name is ignored (WHATWG).

    def _dispatch(self, data: list[bytes], event: str | None, out: list[SSEPayload]) -> None:
        if len(data) == 1:
            text = data[0].decode("utf-8", "replace")
        else:
            text = "\n".join([line.decode("utf-8", "replace") for line in data])
        out.append(ServerSentEvent(text, event or "message", self._last_id, self._retry))

    def _reset_event(self) -> None:
        self._data = []
        self._event = None
        self._retry = None
        self._event_bytes = 0
