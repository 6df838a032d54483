"""An incremental JSON reader for text that is JSON by contract. Pure.

Public as :class:`trio_sampler.wire.PartialJSON`; it lives with the types so that
:attr:`~trio_sampler.types.ToolCall.partial_arguments` can read with it.

Structured output and tool-call arguments arrive as fragments of one JSON document.
:class:`PartialJSON` reads each fragment once, where it stops, and keeps the document
read so far as a live Python value::

    reader = PartialJSON()
    for delta in deltas:
        for change in reader.feed(delta):   # what this delta changed, and only that
            ...
        reader.value                         # the document so far, never re-parsed
    reader.finish()                          # the whole value (or ``reader.error``)

What the partial value shows, and when:

==================  ==========================================================
JSON                in ``value``
==================  ==========================================================
object, array       as soon as it opens, filled member by member
string              as soon as it opens, growing with each fragment
number              once complete (a delimiter follows, or :meth:`finish`)
``true`` ...        once complete
object key          once its closing quote arrived (with the value it opens)
==================  ==========================================================

So a partial value never contradicts the final one: every member but the open one is
final, and the open one is a prefix of its final text (a string) or a partial value of
the same kind (a container).

Work per fragment is proportional to the fragment, whatever the document's size: the
scanner starts where the previous fragment stopped (a number or escape cut in two is
the only text it sees twice), the containers are the ones of the final value, filled in
place, and the open string keeps its pieces until it is read. A value whole in the text
read is decoded by one C call, and in an array the whole items that follow it are read in
the same loop, one C call and one match each (no step of the scanner): 64 KiB of records
read 1 KiB at a time went from 6.0 to 3.8 ms of CPU with it (load average 8 on 2 cores,
``benchmarks/bench_partial_json.py``, "ours, every 1 KiB"). The tokenizer is our own,
built on :mod:`re` (C-speed searches over the fragment): the C push parsers (yajl, as in
ijson) report a string only once it is complete and give no position for an error;
``docs/structured-output.md`` has the measurement behind the choice.

The text is strict JSON, as :func:`json.loads` reads it minus ``NaN`` and ``Infinity``.
Text that is not JSON sets :attr:`PartialJSON.error` (a :class:`PartialJSONError` naming
the character where it went wrong) and the reader stops reading: the value stays as it
was, and later fragments are counted but ignored, so the stream carrying them goes on.

:attr:`PartialJSON.held_bytes` estimates the memory the value read so far takes (and the
open string's pieces), for a caller that bounds what a stream may make it hold (a
sampler's memory account): a text of ``[{},{},...]`` holds 24 bytes per byte read, as
dictionaries. It is kept as the value grows, by a constant where a value is placed (the
``sys.getsizeof`` of an empty one and its slot in the container, :data:`HELD_COST`), and
for a value decoded whole by the C decoder, from its text: its length (4 bytes a
character if the text is not ASCII) and, counted in C with ``str.count``, its openers,
quotes (a member's cost with its key's) and commas, each at the cost of what it makes
(a string decoded whole, from its length). So it costs no step per byte. Against
``tracemalloc`` it is within 0.5x to 2.5x for the shapes of
``tests/test_partial_json_memory.py`` (arrays of empty objects, of empty arrays, of
numbers, of records, a long string, a wide object): over for small integers, which
CPython shares, and for a string of braces or commas, counted as the values they would
open.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from ._errors import TrioSamplerError
from ._partial import JSONChange, JSONChangeKind, JSONPath

__all__ = ["JSONChange", "JSONChangeKind", "JSONPath", "PartialJSON", "PartialJSONError"]


class PartialJSONError(TrioSamplerError, ValueError):
    """The text stopped being JSON at character ``position`` (counted from 0 over the
    whole document); ``message`` says what was expected there."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at character {position}")
        self.message = message
        self.position = position


# ``_new(JSONChange, (kind, path, value))`` makes a change without the NamedTuple's
# Python ``__new__`` (one frame less per change, where many are made).
_new = tuple.__new__
_SET = JSONChangeKind.SET
_APPEND = JSONChangeKind.APPEND
_CLOSE = JSONChangeKind.CLOSE

# The C string decoder behind ``json.loads`` (public in the module, not in its ``__all__``).
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
# The end of a string's text that cannot be decoded yet: a high surrogate escape, then an
# escape cut short (either may be absent).
_CUT = re.compile(r"(?:\\u[dD][89abAB][0-9a-fA-F]{2})?(?:\\(?:u[0-9a-fA-F]{0,3})?)?\Z")
# Where a string's plain run ends: its closing quote, an escape, or a control character
# (not allowed raw in JSON).
_STRING_STOP = re.compile(r'["\\\x00-\x1f]')
_SPACE = re.compile(r"[ \t\n\r]*")
_SPACES = " \t\n\r"
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?\Z")
_OPENERS = '"{['
# A value starting this far (or more) from the end of the text is first tried whole.
_WHOLE_MIN = 32


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_WHOLE = json.JSONDecoder(parse_constant=_no_constant)
# Its C scanner, called directly: ``raw_decode`` is a Python frame around it. It raises
# ``StopIteration`` where no value starts and ``ValueError`` on text that is not JSON.
_scan_once: Callable[[str, int], tuple[Any, int]] = _WHOLE.scan_once  # type: ignore[attr-defined]
# After an array's item: the comma, and the next item if it opens a string or container.
_NEXT_ITEM = re.compile(r'[ \t\n\r]*,[ \t\n\r]*(?=["{\[])')
_LITERALS = {"t": ("true", True), "f": ("false", False), "n": ("null", None)}

# What the values take, as CPython 3.11 to 3.13 on 64 bits holds them (``tracemalloc``):
_DICT = sys.getsizeof({})  # an empty object (64)
_LIST = sys.getsizeof([])  # an empty array (56)
_STR = sys.getsizeof("")  # a string's own object, before its characters (49)
_NUMBER_SIZE = sys.getsizeof(1 << 40)  # an integer CPython does not share, or a float (32)
_DICT_MEMBER = 24  # an object's member: its entry and index, with the table's spare room
_LIST_MEMBER = 9  # an array's item: its slot, with the list's spare room
_PIECE = _STR + 8  # a piece of the open string, kept in a list until it is joined
# A value decoded whole, from its text: per comma (an item's slot and, for a number, its
# object: 16 is between a shared small integer's 9 and a large one's 37), and per quote
# half a string and half a member (a key's two quotes make its string and its member; a
# string value's are over by a member's 24 bytes, beside its own 49 and its characters).
_COMMA = 16
_QUOTE = (_STR + _DICT_MEMBER) // 2
#: The costs :attr:`PartialJSON.held_bytes` adds up, by what a value makes.
HELD_COST = {
    "object": _DICT,
    "array": _LIST,
    "string": _STR,
    "number": _NUMBER_SIZE,
    "object member": _DICT_MEMBER,
    "array item": _LIST_MEMBER,
    "string piece": _PIECE,
    "comma in a whole value": _COMMA,
    "quote in a whole value": _QUOTE,
}


def _text_cost(text: str, start: int, end: int) -> int:
    """The memory the value(s) decoded whole from ``text[start:end]`` take, estimated from
    the text: four C passes over it, no step per byte. (A colon is not counted: a member's
    cost rides on its key's quotes, which saves a fifth pass, a sixth of the parse of a
    read of records.)"""
    count = text.count
    return (
        (end - start) * (1 if text.isascii() else 4)
        + count("{", start, end) * _DICT
        + count("[", start, end) * _LIST
        + count('"', start, end) * _QUOTE
        + count(",", start, end) * _COMMA
    )


def _chars(piece: str) -> int:
    """The bytes of ``piece``'s characters (4 a character unless it is ASCII: an O(1)
    check in CPython, where the string's kind is known)."""
    return len(piece) if piece.isascii() else 4 * len(piece)


# What the scanner expects next.
_VALUE = 0  # a value (after ``:``, ``,`` in an array, or at the start)
_FIRST_VALUE = 1  # a value or ``]`` (just after ``[``)
_KEY = 2  # a key (after ``,`` in an object)
_FIRST_KEY = 3  # a key or ``}`` (just after ``{``)
_COLON = 4
_AFTER = 5  # ``,`` or the container's end, after a member
_STRING = 6  # inside a string value
_KEY_STRING = 7  # inside a key
_END = 8  # the document is complete: only white space may follow
_STOPPED = 9  # an error was found

_EXPECTED = {
    _VALUE: "a value",
    _FIRST_VALUE: "a value or ']'",
    _KEY: "a key (a string in double quotes)",
    _FIRST_KEY: "a key (a string in double quotes) or '}'",
    _COLON: "':' after the key",
    _END: "nothing after the document",
}


class _Frame:
    """An open object or array: the container, its path, and the key being read."""

    __slots__ = ("container", "is_object", "key", "path")

    def __init__(self, container: dict[str, Any] | list[Any], path: JSONPath) -> None:
        self.container = container
        self.is_object = type(container) is dict
        self.path = path
        self.key: str = ""


def _safe_cut(text: str, i: int) -> int:
    """Where the string text ``text[i:]`` can be cut and decoded: before an escape cut at
    its end, and before a high surrogate escape there (it may pair with the next one)."""
    at = max(i, len(text) - 12)
    while True:
        match = _CUT.search(text, at)
        assert match is not None  # the pattern matches the empty end
        q = match.start()
        run = q
        while run > i and text[run - 1] == "\\":
            run -= 1
        if (q - run) % 2 == 0:  # text[q] starts an escape (or the empty end)
            return q
        at = q + 1  # text[q] is an escaped backslash's second half


class PartialJSON:
    """Reads one JSON document fragment by fragment (see the module's documentation).

    Fragments are ``str`` or ``bytes`` (UTF-8, a character may be cut between two
    fragments); do not mix the two in one document.
    """

    def __init__(self) -> None:
        self._root: Any = None
        self._stack: list[_Frame] = []
        self._state = _VALUE
        self._carry = ""  # text seen but not yet read (a cut number, literal or escape)
        self._offset = 0  # the position of the next fragment's first character
        self._parts: list[str] = []  # the open string's (or key's) pieces
        self._string_path: JSONPath = ()
        self._dirty = False  # the open string has pieces ``value`` does not show yet
        self._decoder: codecs.IncrementalDecoder | None = None
        self._pending: list[str] = []  # fragments received, not yet read
        #: Take the next fragment (``str``), to be read when the value or the changes
        #: are asked for (:attr:`value`, :meth:`changes`): the cheapest way to follow a
        #: stream whose partial value is looked at less often than fragments arrive.
        #: (It is the pending list's own ``append``: one C call per fragment.)
        self.push: Callable[[str], None] = self._pending.append
        self._out: list[JSONChange] = []  # changes not yet taken by ``changes()``
        #: An estimate of the bytes the value read so far takes, with the open string's
        #: pieces (the module's documentation says how it is kept, and how close it is).
        self.held_bytes = 0
        #: Why the text is not JSON (``None`` while it is).
        self.error: PartialJSONError | None = None

    # -- reading -------------------------------------------------------------------

    @property
    def value(self) -> Any:
        """The document read so far (``None`` before its first value).

        It is the live value: the reader keeps filling it. Copy it to keep a snapshot.
        """
        if self._pending:
            self._read_pending()
        if self._dirty:
            self._show_open_string()
        return self._root

    @property
    def complete(self) -> bool:
        """Whether the document is whole (its top-level value closed) and error-free."""
        if self._pending:
            self._read_pending()
        return self._state == _END

    def push_bytes(self, data: bytes, *, final: bool = False) -> None:
        """:attr:`push` for UTF-8 bytes (a character may be cut between two pieces;
        ``final`` says the text ends here, as :meth:`finish` does)."""
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            self._pending.append(self._decoder.decode(data, final=final))
        except UnicodeDecodeError as exc:
            self._read_pending()
            self._fail(f"invalid UTF-8 ({exc.reason})", self._offset)

    def feed(self, fragment: str | bytes) -> list[JSONChange]:
        """Read the next fragment now; returns what it changed, in order (after the
        changes of fragments pushed before it, not yet taken)."""
        if not isinstance(fragment, str) or self._pending or self._out:
            if isinstance(fragment, str):
                self._pending.append(fragment)
            else:
                self.push_bytes(bytes(fragment))
            return self.changes()
        if not fragment:
            return []
        if self._carry or self._state != _STRING or _STRING_STOP.search(fragment):
            # Read here rather than through ``changes()``: one call less per fragment.
            if self._state != _STOPPED:
                start = self._offset - len(self._carry)
                text = self._carry + fragment if self._carry else fragment
                self._carry = ""
                self._offset += len(fragment)
                self._scan(text, start)
            out = self._out
            self._out = []
            return out
        # The usual fragment of a long string: its text, appended.
        self._parts.append(fragment)
        self.held_bytes += _chars(fragment) + _PIECE
        self._dirty = True
        self._offset += len(fragment)
        return [JSONChange(_APPEND, self._string_path, fragment)]

    def changes(self) -> list[JSONChange]:
        """What the fragments received changed since the last call, in order."""
        if self._pending:
            self._read_pending()
        out = self._out
        self._out = []
        return out

    def finish(self) -> Any:
        """End of the text: complete a top-level number and return the whole value.

        When the text is not one whole JSON document, :attr:`error` says why (and the
        partial value is returned). The changes it makes are left for :meth:`changes`.
        """
        if self._decoder is not None:
            self.push_bytes(b"", final=True)
        if self._pending:
            self._read_pending()
        # A number (or literal) at the end is whole only if it is the whole document: in
        # an open container the text was cut, and the number with it, perhaps.
        if self._carry and not self._stack and self._state not in (_STOPPED, _STRING):
            carry, self._carry = self._carry, ""
            self._token(carry, self._offset - len(carry))
        if self._state not in (_END, _STOPPED):
            where = "a string" if self._in_string() else "a value"
            self._fail(f"the text ended inside {where}", self._offset)
        return self.value

    def _read_pending(self) -> None:
        pending = self._pending
        fragment = pending[0] if len(pending) == 1 else "".join(pending)
        pending.clear()
        if self._state == _STOPPED:
            return
        text = self._carry + fragment if self._carry else fragment
        start = self._offset - len(self._carry)
        self._carry = ""
        self._offset += len(fragment)
        self._scan(text, start)

    # -- the scanner ---------------------------------------------------------------

    def _in_string(self) -> bool:
        return self._state in (_STRING, _KEY_STRING)

    def _scan(self, text: str, start: int) -> None:
        """Read ``text`` (which begins at document position ``start``) to its end."""
        i = 0
        end = len(text)
        while i < end:
            state = self._state
            if state in (_STRING, _KEY_STRING):
                i = self._string(text, i, start)
                continue
            if state == _STOPPED:
                return
            char = text[i]
            if char in _SPACES:
                i = _SPACE.match(text, i).end()  # type: ignore[union-attr]  # matches ""
                if i == end:
                    return
                char = text[i]
            if state <= _FIRST_VALUE:
                if state == _FIRST_VALUE and char == "]":
                    i = self._close(i + 1)
                else:
                    i = self._value(text, i, start)
            elif state == _AFTER:
                i = self._after(char, i, start)
            elif state <= _FIRST_KEY:
                i = self._key(char, i, start)
            elif state == _COLON and char == ":":
                self._state = _VALUE
                i += 1
            else:
                i = self._unexpected(char, start + i)

    def _unexpected(self, char: str, position: int) -> int:
        expected = _EXPECTED.get(self._state, "',' or the end of the container")
        self._fail(f"expected {expected}, found {char!r}", position)
        return position

    def _value(self, text: str, i: int, start: int) -> int:
        char = text[i]
        if char in _OPENERS and len(text) - i >= _WHOLE_MIN:
            end = self._whole(text, i)
            if end:
                return end
        if char == '"':
            self._parts = []
            self.held_bytes += _STR
            self._string_path = self._place("")
            self._out.append(JSONChange(_SET, self._string_path, ""))
            self._state = _STRING
            return i + 1
        if char == "{" or char == "[":
            container: dict[str, Any] | list[Any] = {} if char == "{" else []
            self.held_bytes += _DICT if char == "{" else _LIST
            path = self._place(container)
            self._out.append(JSONChange(_SET, path, {} if char == "{" else []))
            self._stack.append(_Frame(container, path))
            self._state = _FIRST_KEY if char == "{" else _FIRST_VALUE
            return i + 1
        if char in "-0123456789" or char in _LITERALS:
            return self._scalar(text, i, start)
        return self._unexpected(char, start + i)

    def _whole(self, text: str, i: int) -> int:
        """Read a string, object or array that is whole in ``text`` with the C decoder
        (one call instead of one step per token); 0 when it is not whole (or not JSON:
        the scanner then finds where). In an array, the whole items that follow are read
        here too, without a step of the scanner each: an array of records (a read of
        1 KiB holds a dozen) costs one C call and one match per record."""
        try:
            value, end = _scan_once(text, i)
        except (StopIteration, ValueError):
            return 0
        out = self._out
        path = self._place(value)
        out.append(_new(JSONChange, (_SET, path, value)))
        out.append(_new(JSONChange, (_CLOSE, path, value)))
        self._value_done()
        if self._state != _AFTER or self._stack[-1].is_object:
            if type(value) is str:  # its size is known: no pass over its text
                self.held_bytes += _STR + _chars(value)
            else:
                self.held_bytes += _text_cost(text, i, end)
            return end
        frame = self._stack[-1]
        items = frame.container
        limit = len(text) - _WHOLE_MIN
        match = _NEXT_ITEM.match(text, end)
        while match is not None and match.end() <= limit:
            try:
                value, end = _scan_once(text, match.end())
            except (StopIteration, ValueError):
                self._state = _VALUE  # after the comma: the scanner reads the item
                self.held_bytes += _text_cost(text, i, match.end())
                return match.end()
            items.append(value)  # type: ignore[union-attr]  # an array's
            path = (*frame.path, len(items) - 1)
            out.append(_new(JSONChange, (_SET, path, value)))
            out.append(_new(JSONChange, (_CLOSE, path, value)))
            match = _NEXT_ITEM.match(text, end)
        # What was read whole, counted from its text in one go (the items' commas too).
        self.held_bytes += _text_cost(text, i, end)
        return end

    def _scalar(self, text: str, i: int, start: int) -> int:
        """A number or literal at ``text[i]``: read if complete, else kept for later."""
        literal = _LITERALS.get(text[i])
        if literal is None:
            end = _NUMBER_CHARS.match(text, i).end()  # type: ignore[union-attr]  # matches ""
        elif text.startswith(literal[0], i):
            end = i + len(literal[0])
        else:
            end = min(len(text), i + len(literal[0]))
            if end == len(text) and not literal[0].startswith(text[i:]):
                end = i + 1  # not a prefix of the literal: wrong now, not later
        if end == len(text):
            self._carry = text[i:]  # it may go on in the next fragment
            return end
        self._token(text[i:end], start + i)
        return end

    def _token(self, token: str, position: int) -> None:
        """Store a whole number or literal ``token`` (or fail on it)."""
        value: Any
        literal = _LITERALS.get(token[0])
        if literal is not None:
            if token != literal[0]:
                self._fail(f"expected {literal[0]!r}, found {token!r}", position)
                return
            value = literal[1]
        else:
            match = _NUMBER.match(token)
            if match is None:
                self._fail(f"{token!r} is not a JSON number", position)
                return
            value = float(token) if match.group(1) or match.group(2) else int(token)
            if type(value) is float or not -5 <= value <= 256:  # CPython shares the rest
                self.held_bytes += _NUMBER_SIZE
        self._out.append(JSONChange(_SET, self._place(value), value))
        self._value_done()

    def _string(self, text: str, i: int, start: int) -> int:
        """Inside a string: read it to its end, or to the end of ``text`` (an escape cut
        there waits for the next fragment). The C string scanner of :mod:`json` decodes."""
        try:
            piece, end = _scanstring(text, i)
        except json.JSONDecodeError:
            pass  # not closed in ``text`` (or not JSON: decoding what is there says)
        else:
            if end > i + 1:
                self._piece(piece)
            self._close_string()
            return int(end)
        cut = _safe_cut(text, i)
        if cut > i:
            try:
                piece = _scanstring(text[i:cut] + '"', 0)[0]
            except json.JSONDecodeError as exc:
                self._fail(exc.msg.lower(), start + i + exc.pos)
                return len(text)
            self._piece(piece)
        self._carry = text[cut:]
        return len(text)

    def _piece(self, piece: str) -> None:
        self._parts.append(piece)
        self.held_bytes += _chars(piece) + _PIECE
        if self._state == _STRING:
            self._dirty = True
            self._out.append(JSONChange(_APPEND, self._string_path, piece))

    def _close_string(self) -> None:
        text = "".join(self._parts)
        # The pieces are freed; their characters stay, in the string (or key) they made.
        self.held_bytes -= len(self._parts) * _PIECE
        self._parts = []
        if self._state == _KEY_STRING:
            self.held_bytes += _STR
            self._stack[-1].key = text
            self._state = _COLON
            return
        self._dirty = False
        self._replace_open(text)
        self._out.append(JSONChange(_CLOSE, self._string_path, text))
        self._value_done()

    def _show_open_string(self) -> None:
        text = "".join(self._parts)
        self.held_bytes -= (len(self._parts) - 1) * _PIECE
        self._parts = [text]
        self._replace_open(text)
        self._dirty = False

    # -- containers ----------------------------------------------------------------

    def _place(self, value: Any) -> JSONPath:
        """Put a new ``value`` where the scanner is; returns its path."""
        if not self._stack:
            self._root = value
            return ()
        frame = self._stack[-1]
        container = frame.container
        if frame.is_object:
            container[frame.key] = value  # type: ignore[call-overload]
            self.held_bytes += _DICT_MEMBER
            return (*frame.path, frame.key)
        container.append(value)  # type: ignore[union-attr]
        self.held_bytes += _LIST_MEMBER
        return (*frame.path, len(container) - 1)

    def _replace_open(self, text: str) -> None:
        """Show ``text`` as the open string's value (placed when the string opened)."""
        if not self._stack:
            self._root = text
            return
        frame = self._stack[-1]
        if frame.is_object:
            frame.container[frame.key] = text  # type: ignore[call-overload]
        else:
            frame.container[-1] = text  # type: ignore[index]

    def _value_done(self) -> None:
        self._state = _AFTER if self._stack else _END

    def _after(self, char: str, i: int, start: int) -> int:
        if char == ",":
            self._state = _KEY if self._stack[-1].is_object else _VALUE
            return i + 1
        if (char == "}") is self._stack[-1].is_object and char in "}]":
            return self._close(i + 1)
        return self._unexpected(char, start + i)

    def _key(self, char: str, i: int, start: int) -> int:
        if char == '"':
            self._parts = []
            self._state = _KEY_STRING
            return i + 1
        if char == "}" and self._state == _FIRST_KEY:
            return self._close(i + 1)
        return self._unexpected(char, start + i)

    def _close(self, i: int) -> int:
        frame = self._stack.pop()
        self._out.append(JSONChange(_CLOSE, frame.path, frame.container))
        self._value_done()
        return i

    def _fail(self, message: str, position: int) -> None:
        self.error = PartialJSONError(message, position)
        self._state = _STOPPED
