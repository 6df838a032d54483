"""Credentials: which names carry one, what a valid one looks like, and redaction.

Plain functions over strings and our plain-data types, no I/O, so every layer can use
them: the config and the request builders check credential values with
:func:`check_credential`; reprs and logged URLs hide the values of names
:func:`is_credential_name` accepts; a :class:`Redactor` scrubs every string that leaves
the library of the credentials a config holds.

What a scrubbed value looks like (``docs/contract.md`` §7):

* a credential the config holds becomes ``[REDACTED api_key …9c2e]``: which credential
  (``api_key``, or the header or query parameter's name) and, for a value of 16 characters
  or more, its last four characters, so a 401 still tells you *which* key was refused;
* anything that merely looks like a credential (a key of some other provider, a bearer
  token, ``?key=...``) becomes ``[REDACTED]``.

A :class:`Redactor` recognises a credential it holds in every form a server or a library
is likely to echo it in: raw, in any letter case, URL-encoded, base64 (standard and
URL-safe alphabets, at any alignment inside a longer base64 string, so a ``Basic`` header
or a JWT that embeds it is caught), JSON- and repr-escaped, and any run of 12 or more of
its consecutive characters (a truncated echo). Values shorter than 8 characters are not
scrubbed: a string that short is no secret, and scrubbing it would mangle ordinary words.

Where it is applied (the choke points):

* every event a request's stream hands to its consumer (``RequestState.emit`` and
  ``finish`` in the actor): errors, ``Retrying`` reasons, header- and server-derived
  fields (``ModelMetadata``, a response's model and ids). Generated content (text,
  reasoning, tool arguments) is the payload and passes untouched;
* every :class:`~trio_sampler.client.SamplingClientError` the client raises;
* every record of the ``trio_sampler``, ``httpx2`` and ``httpcore2`` loggers, through a
  :class:`RedactingFilter` the client installs for its lifetime.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import operator
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar, cast, final

import attrs

from .types import (
    Assistant,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationResponse,
    Failed,
    ImagesStripped,
    LedgerEntry,
    ModelMetadata,
    RequestMetrics,
    Retrying,
    SamplingErrorInfo,
    SamplingEvent,
)
from .types._credential_names import is_credential_name, redact_url

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "Redactor",
    "check_credential",
    "install_log_filter",
    "is_credential_name",
    "redact_url",
    "redactor_for",
    "scrub_secrets",
]

_Event = TypeVar("_Event", bound=SamplingEvent)
_T = TypeVar("_T")

#: What a value that only looks like a credential becomes.
REDACTED: Final = "[REDACTED]"


def check_credential(value: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` when ``value`` cannot be a credential.

    Refused: leading or trailing whitespace (the commonest copy/paste slip: the server
    would reject the key, or the HTTP layer the header with a message quoting it), control
    characters anywhere (C0, DEL, C1), and characters outside ASCII (a typographic quote or
    dash picked up from a document). The message says where the problem is, never what
    the value is.
    """
    stripped = value.strip()
    if stripped != value:
        end = "starts" if value[:1].isspace() else "ends"
        raise ValueError(
            f"{what} {end} with whitespace (a space, tab or line break copied with it?); remove it"
        )
    for position, char in enumerate(value):
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0:
            raise ValueError(
                f"{what} contains a control character (U+{code:04X}) at position "
                f"{position}; copy the key again"
            )
        if code > 0x7F:
            raise ValueError(
                f"{what} contains the non-ASCII character U+{code:04X} at position "
                f"{position}; credentials are ASCII (a typographic quote or dash copied "
                "from a document?): copy the key again"
            )


# ---------------------------------------------------------------------------------------
# Shapes: credentials we were never told about
# ---------------------------------------------------------------------------------------

# A value that is already a redaction marker is left alone (scrubbing is idempotent).
_NOT_MARKED = r"(?!\[REDACTED)"
_NAME_WORD = r"(?:auth|key|token|secret|cookie|signature|password|passwd|credential)"
# Each alternative keeps its named prefix (so the text still says *what* was hidden) and
# replaces what follows. Matches start at a literal (a prefix, a name word), never at a
# free-running character class, so a long text costs linear time.
_SHAPES = re.compile(
    # Provider key prefixes: OpenAI/DeepSeek/OpenRouter ``sk-`` (``sk-proj-``, ``sk-ant-``,
    # ``sk-or-``), xAI ``xai-``, Groq ``gsk_``, Google ``AIza``, GitHub ``gh?_``, AWS
    # access key ids, Slack tokens; JSON Web Tokens (header.payload.signature).
    r"\b(?:sk|xai|gsk)[-_][A-Za-z0-9_\-./+=]{7,}[A-Za-z0-9_\-=]"
    r"|\bAIza[0-9A-Za-z_\-]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"
    # HTTP authorization schemes ("a Bearer token" in prose stays).
    rf"|(?P<scheme>\b(?:bearer|basic)\s+){_NOT_MARKED}(?!tokens?\b)[^\s\"',;\[]+"
    # ``name=value`` in a query or form string (``?key=...``, ``&x-goog-api-key=...``).
    rf"|(?P<param>{_NAME_WORD}[A-Za-z0-9_.\-]{{0,40}}=|(?<=[?&;])(?:sig|code)=)"
    rf"{_NOT_MARKED}[^&\s\"'#]+"
    # ``name: value`` and ``"name": "value"`` in a header or JSON dump, for values shaped
    # like a key (12+ key characters): prose such as "invalid token: expired" stays.
    rf"|(?P<field>{_NAME_WORD}[A-Za-z0-9_.\-]{{0,40}}[\"']?\s{{0,3}}:\s{{0,3}}[\"']?)"
    rf"{_NOT_MARKED}[A-Za-z0-9_\-./+=~]{{12,}}",
    re.IGNORECASE,
)


#: A literal every match of ``_SHAPES`` contains, lower-cased: each alternative starts
#: with one (``sk-``/``sk_``, ``xai-``/``xai_``, ``gsk-``/``gsk_`` through ``sk``; the
#: ``gh?_`` prefixes; the name words, of which ``signature`` holds ``sig`` and
#: ``password``/``passwd`` hold ``passw``). An ASCII text holding none cannot match, so
#: it is not run through the pattern: a plain identifier costs a few substring tests
#: instead of the pattern tried at every position. (Outside ASCII, case-insensitive
#: matching has folds ``str.lower`` does not mirror, such as the Kelvin sign for ``k``:
#: such text always takes the pattern.)
_SHAPE_ANCHORS: Final = (
    "sk-",
    "sk_",
    "xai-",
    "xai_",
    "aiza",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "akia",
    "asia",
    "xox",
    "eyj",
    "bearer",
    "basic",
    "auth",
    "key",
    "token",
    "secret",
    "cookie",
    "sig",
    "passw",
    "credential",
    "code",
)


def _shape(match: re.Match[str]) -> str:
    return (match.group("scheme") or match.group("param") or match.group("field") or "") + REDACTED


def _first_letter_tree(literals: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching any of ``literals``, as one alternative per first character
    (``s(?:k-|k_|ig|ecret)|x(?:ai-|...)``): at a position the engine tries the ten
    first characters, not the 25 literals. What it buys: a search of a 38-character
    server id took 0.77 µs as the flat alternation, 0.50 µs as this (timeit, best of 5)."""
    rests: dict[str, list[str]] = {}
    for literal in literals:
        rests.setdefault(literal[0], []).append(literal[1:])
    return re.compile(
        "|".join(
            re.escape(first) + "(?:" + "|".join(map(re.escape, rest)) + ")"
            for first, rest in rests.items()
        )
    )


_ANCHORS = _first_letter_tree(_SHAPE_ANCHORS)
#: The shortest text ``_SHAPES`` can match (``key=x``; a test checks it against the
#: pattern's own minimum width).
_SHAPE_MIN_CHARS: Final = 5


def could_hold_shape(text: str) -> bool:
    """False only when ``text`` cannot contain a credential shape (see
    :func:`scrub_secrets`): it is shorter than any shape, or ASCII without any of the
    literals every shape starts with."""
    if len(text) < _SHAPE_MIN_CHARS:
        return False
    if not text.isascii():
        return True
    return _ANCHORS.search(text.lower()) is not None


def scrub_secrets(text: str) -> str:
    """Replace anything in ``text`` shaped like a credential by :data:`REDACTED`
    (keeping the name before it: ``?key=[REDACTED]``, ``x-api-key: [REDACTED]``)."""
    if not could_hold_shape(text):
        return text
    return _SHAPES.sub(_shape, text)


# ---------------------------------------------------------------------------------------
# Exact values: the credentials a config holds
# ---------------------------------------------------------------------------------------

_MIN_SECRET = 8
_WINDOW = 12
#: The window scan probes every ``_STRIDE``-th position for a ``_PROBE``-character piece
#: of a window (``Redactor._scrub_windows``).
_STRIDE = 4
_PROBE = _WINDOW - _STRIDE + 1
_TAIL_MIN = 16
#: Server-supplied identifiers (model names, ids, error codes) are cut to this before
#: scrubbing: none is legitimately longer, and a hostile one must not cost seconds.
MAX_IDENTIFIER_CHARS: Final = 256
_URLSAFE = str.maketrans("+/", "-_")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9_\-]*)\s+(\S+)$")


def _values(value: str) -> list[str]:
    """The secret parts of one credential: the value, the token after an auth scheme
    (``Bearer X``), and the decoded ``user:password`` and password of ``Basic X``."""
    out = [value]
    scheme = _SCHEME.match(value)
    if scheme is not None:
        out.append(scheme.group(2))
        if scheme.group(1).lower() == "basic":
            try:
                decoded = base64.b64decode(scheme.group(2), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            if decoded:
                out += [decoded, decoded.partition(":")[2]]
    return [v for v in out if len(v) >= _MIN_SECRET]


def _forms(value: str) -> tuple[set[str], set[str]]:
    """Every encoding of ``value`` a server or a library is likely to echo: the textual
    ones (raw, URL-encoded, escaped), and the base64 ones."""
    raw = value.encode()
    textual = {
        value,
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value, safe="/"),
        urllib.parse.quote_plus(value),
        json.dumps(value)[1:-1],
        json.dumps(value)[1:-1].replace("/", "\\/"),
        repr(value)[1:-1],
    }
    encoded_forms = {base64.b64encode(raw).decode()}
    # Inside a longer base64 string the value's bytes start at offset 0, 1 or 2 of a
    # 3-byte group. For each alignment, the characters that encode only the value's bytes
    # are the same whatever surrounds it.
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        core = encoded[4 if offset else 0 : 4 * ((offset + len(raw)) // 3)]
        encoded_forms |= {core, core.translate(_URLSAFE)}
    return (
        {form for form in textual if len(form) >= _MIN_SECRET},
        {form for form in encoded_forms - textual if len(form) >= _MIN_SECRET},
    )


def _same_without_case(form: str, text: str) -> bool:
    return re.fullmatch(re.escape(form), text, re.IGNORECASE) is not None


def _lower_ascii(text: str) -> str:
    # ``str.lower`` can change a string's length outside ASCII ("İ" becomes two code
    # points), which would shift every offset; credentials are ASCII, so only ASCII letters
    # need folding.
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_TOKEN_HEAD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_TOKEN_CHARS = _TOKEN_HEAD_CHARS | {"="}


def _echo(
    text: str, lowered: str, windows: Mapping[str, object], position: int, done: int, widen: bool
) -> tuple[int, int]:
    """Where the echo whose first held window starts at ``position`` begins and ends."""
    size = len(text)
    # A run of overlapping windows is one echo of (part of) a credential.
    end = position + _WINDOW
    while end < size and lowered[end - _WINDOW + 1 : end + 1] in windows:
        end += 1
    while text[position].isspace():  # the space of "Bearer <key>" stays
        position += 1
    while text[end - 1].isspace():
        end -= 1
    if widen:
        # The edges of a base64 form also encode what surrounds the credential:
        # the whole base64 token goes (not over "=", which pads only at the end).
        while position > done and text[position - 1] in _TOKEN_HEAD_CHARS:
            position -= 1
        while end < size and text[end] in _TOKEN_CHARS:
            end += 1
    return position, end


@final
class Redactor:
    """Scrubs strings of a fixed set of credentials, then of credential shapes.

    ``credentials`` are ``(label, value)`` pairs; the label names the credential in the
    replacement (``api_key``, a header or query parameter name). Build one with
    :func:`redactor_for`, which caches it. A redactor with no credentials still scrubs
    shapes. Methods return their argument itself when nothing changed.
    """

    __slots__ = (
        "_clean",
        "_last_model",
        "_masks",
        "_probes",
        "_short",
        "_short_forms",
        "_windows",
    )

    def __init__(self, credentials: Iterable[tuple[str, str]] = ()) -> None:
        # 12-character window (case-folded) → (mask, widen to the enclosing base64 token).
        self._windows: dict[str, tuple[str, bool]] = {}
        self._masks: dict[str, str] = {}
        short: dict[str, str] = {}
        for label, value in credentials:
            for secret in _values(value):
                tail = f" …{secret[-4:]}" if len(secret) >= _TAIL_MIN else ""
                mask = f"[REDACTED {label}{tail}]"
                textual, encoded = _forms(secret)
                # Textual forms first: where a window is in both, it is not widened.
                for form, widen in (*((f, False) for f in textual), *((f, True) for f in encoded)):
                    lowered = _lower_ascii(form)
                    if len(form) < _WINDOW:
                        short.setdefault(lowered, mask)
                        continue
                    for start in range(len(lowered) - _WINDOW + 1):
                        self._windows.setdefault(lowered[start : start + _WINDOW], (mask, widen))
        self._masks = short
        # Every ``_PROBE``-character piece of a window, for ``_scrub_windows``.
        self._probes = frozenset(
            window[start : start + _PROBE] for window in self._windows for start in range(_STRIDE)
        )
        self._short = (
            re.compile(
                "|".join(re.escape(s) for s in sorted(short, key=len, reverse=True)),
                re.IGNORECASE,
            )
            if short
            else None
        )
        # ASCII forms (credentials are ASCII) can only match ASCII text as its lower-case
        # copy holding them: that test stands in for the pattern on such text.
        self._short_forms = tuple(short) if all(form.isascii() for form in short) else None
        # Any short form or shape anchor (with the short forms ASCII), for the lower-case
        # copy of an ASCII text: one search says such a text holds neither (what a
        # server's id, a model name, a stop reason hold), where the two tests below took
        # one each. What it buys: a 14-character id's scrub took 17,500 instructions,
        # now 13,500 (callgrind).
        forms = self._short_forms
        self._clean = (
            None
            if forms is None
            else (_first_letter_tree((*_SHAPE_ANCHORS, *forms)) if forms else _ANCHORS)
        )
        #: The last model name :meth:`response` scrubbed, and what it became.
        self._last_model: tuple[str, str | None] = ("", "")

    def __repr__(self) -> str:
        return f"<Redactor of {len(self._windows)} windows, {len(self._masks)} short values>"

    # -- text ------------------------------------------------------------------------

    def text(self, text: str) -> str:
        """``text`` without the credentials (any form) and without credential shapes."""
        if len(text) < _SHAPE_MIN_CHARS:  # shorter than every shape and every form
            return text
        # The ASCII lower-case copy every cheap test below reads (``None`` outside ASCII,
        # where each pattern runs).
        lowered = text.lower() if text.isascii() else None
        if self._windows and len(text) >= _WINDOW:
            scrubbed = self._scrub_windows(text, lowered)
            if scrubbed is not text:
                text = scrubbed
                lowered = text.lower() if text.isascii() else None
        clean = self._clean
        if lowered is not None and clean is not None and clean.search(lowered) is None:
            return text  # neither a short form nor a shape can match
        if self._short is not None and self._could_hold_short(text, lowered):
            scrubbed = self._short.sub(self._short_mask, text)
            if scrubbed != text:
                text = scrubbed
                lowered = text.lower() if text.isascii() else None
        if lowered is not None and _ANCHORS.search(lowered) is None:
            return text  # no shape can match (see ``could_hold_shape``)
        return _SHAPES.sub(_shape, text)

    def _could_hold_short(self, text: str, lowered: str | None) -> bool:
        forms = self._short_forms
        if len(text) < _MIN_SECRET:
            return False
        if forms is None or lowered is None:
            return True
        return any(map(lowered.__contains__, forms))

    def _short_mask(self, match: re.Match[str]) -> str:
        found = match.group(0)
        mask = self._masks.get(_lower_ascii(found))
        if mask is None:
            # Matched through a case fold outside ASCII (the Kelvin sign for "k", say):
            # the form it stands for, found the way the pattern found it.
            folded = (m for form, m in self._masks.items() if _same_without_case(form, found))
            mask = next(folded, REDACTED)
        return mask

    def _scrub_windows(self, text: str, lowered: str | None = None) -> str:
        """``text`` with every run of held windows replaced by its mask.

        A held window (``_WINDOW`` characters) starting at ``q`` holds the
        ``_PROBE``-character piece (a probe) starting at the first multiple of
        ``_STRIDE`` from ``q`` on. So only every ``_STRIDE``-th position is looked up,
        for a probe; where one is found, the windows that can hold it (starting up to
        ``_STRIDE - 1`` before it) are looked up in order, as a scan of every position
        would: every position skipped is one such a scan would have passed over, and the
        result is the same (``tests/test_redaction_windows.py``). What it buys, for a
        38-character server id and a 42-character key (timeit, best of 7): 27 window
        lookups took 3.1 µs, its 8 probes take 0.9 µs."""
        if lowered is None:
            lowered = _lower_ascii(text)
        windows, probes = self._windows, self._probes
        size = len(text)
        pieces: list[str] = []
        done = position = 0
        for probe in range(0, size - _PROBE + 1, _STRIDE):
            if lowered[probe : probe + _PROBE] not in probes:
                continue
            position = max(position, probe - _STRIDE + 1)
            while position <= probe and position + _WINDOW <= size:
                hit = windows.get(lowered[position : position + _WINDOW])
                if hit is None:
                    position += 1
                    continue
                position, end = _echo(text, lowered, windows, position, done, hit[1])
                pieces += [text[done:position], hit[0]]
                done = position = end
        if not pieces:
            return text
        pieces.append(text[done:])
        return "".join(pieces)

    def optional(self, text: str | None) -> str | None:
        return None if text is None else self.text(text)

    def identifier(self, text: str | None) -> str | None:
        """A server-supplied identifier (model, id, code): cut, then scrubbed."""
        if text is None:
            return None
        if len(text) > MAX_IDENTIFIER_CHARS:
            text = text[:MAX_IDENTIFIER_CHARS] + "…"
        return self.text(text)

    # -- values ----------------------------------------------------------------------

    def error(self, info: SamplingErrorInfo) -> SamplingErrorInfo:
        """``info`` with every string field scrubbed (rate-limit names and values too)."""
        rate_limit = {
            self.identifier(name) or "": self.identifier(value) or ""
            for name, value in info.rate_limit.items()
        }
        changes = _changed(
            info,
            message=self.text(info.message),
            error_type=self.identifier(info.error_type),
            error_code=self.identifier(info.error_code),
            provider_request_id=self.identifier(info.provider_request_id),
        )
        if rate_limit != dict(info.rate_limit):
            changes["rate_limit"] = rate_limit
        return attrs.evolve(info, **changes) if changes else info

    def response(self, response: ConversationResponse | None) -> ConversationResponse | None:
        """``response`` with its server-supplied identifiers scrubbed (model, ids, stop
        reason; the same on its assistant items), not its content."""
        if response is None:
            return None
        identifier = self.identifier
        model = response.model
        scrubbed_model = None if model is None else self._model(model)
        items = response.items
        new_items = self._assistant_items(items, model, scrubbed_model)
        response_id = response.response_id
        if response_id is not None:
            response_id = identifier(response_id)
        raw_stop_reason = response.raw_stop_reason
        if raw_stop_reason is not None:
            raw_stop_reason = identifier(raw_stop_reason)
        stop_sequence = response.stop_sequence
        if stop_sequence is not None:
            stop_sequence = identifier(stop_sequence)
        # Doom-loop trigger labels are the server's too (``response.doom_loop_check``).
        signals = response.doom_loop_signals
        if signals:
            scrubbed = tuple(identifier(signal) or "" for signal in signals)
            signals = signals if scrubbed == signals else scrubbed
        if (
            new_items is None
            and _same(scrubbed_model, model)
            and _same(response_id, response.response_id)
            and _same(raw_stop_reason, response.raw_stop_reason)
            and _same(stop_sequence, response.stop_sequence)
            and signals is response.doom_loop_signals
        ):
            return response
        return attrs.evolve(
            response,
            items=items if new_items is None else tuple(new_items),
            model=scrubbed_model,
            response_id=response_id,
            raw_stop_reason=raw_stop_reason,
            stop_sequence=stop_sequence,
            doom_loop_signals=signals,
        )

    def _assistant_items(
        self, items: tuple[Any, ...], model: str | None, scrubbed_model: str | None
    ) -> list[Any] | None:
        """``items`` with each assistant item's model and id scrubbed (``None``: none
        changed); ``scrubbed_model`` is the response's ``model``, already scrubbed."""
        identifier = self.identifier
        new_items: list[Any] | None = None
        for index, item in enumerate(items):
            if type(item) is not Assistant or (item.model is None and item.id is None):
                continue
            # An assistant item names the response's model (the same string): scrubbed once.
            item_model = scrubbed_model if item.model is model else identifier(item.model)
            item_id = None if item.id is None else identifier(item.id)
            if _same(item_model, item.model) and _same(item_id, item.id):
                continue
            if new_items is None:
                new_items = list(items)
            new_items[index] = attrs.evolve(item, model=item_model, id=item_id)
        return new_items

    def _model(self, model: str) -> str | None:
        """A response's model name, scrubbed as an identifier. A sampler's responses
        name the same model again and again: the last name is remembered with what it
        became (scrubbing one again ran 87 bytecode instructions for an 11-character
        name, 399 for a 22-character one)."""
        last, scrubbed = self._last_model
        if model != last:
            scrubbed = self.identifier(model)
            self._last_model = (model, scrubbed)
        return scrubbed

    def metrics(self, metrics: RequestMetrics | None) -> RequestMetrics | None:
        """``metrics`` with the reasons its routes were passed over scrubbed (a reason
        may quote an admission's error) and the provider's request ids in its ledger (a
        server may echo anything in a header); everything else in it is numbers, or
        names the caller gave (routes, models)."""
        if metrics is None:
            return None
        changes: dict[str, Any] = {}
        if metrics.skipped_routes:
            skipped = tuple((route, self.text(r)) for route, r in metrics.skipped_routes)
            if skipped != metrics.skipped_routes:
                changes["skipped_routes"] = skipped
        ledger = tuple(map(self._ledger_entry, metrics.ledger))
        if any(map(operator.is_not, ledger, metrics.ledger)):
            changes["ledger"] = ledger
        return attrs.evolve(metrics, **changes) if changes else metrics

    def _ledger_entry(self, entry: LedgerEntry) -> LedgerEntry:
        """``entry`` with its provider's request id scrubbed (itself when that changed
        nothing: what every request's terminal has, so no other object is made)."""
        request_id = entry.provider_request_id
        if request_id is None:
            return entry
        scrubbed = self.identifier(request_id)
        if _same(scrubbed, request_id):
            return entry
        return attrs.evolve(entry, provider_request_id=scrubbed)

    def event(self, event: _Event) -> _Event:
        """``event`` with every string that did not come from the model scrubbed."""
        scrub = _EVENT_SCRUBBERS.get(type(event))
        return event if scrub is None else cast(_Event, scrub(self, event))

    def events(self, batch: list[SamplingEvent]) -> list[SamplingEvent]:
        """:meth:`event` over a batch (content events pass at the cost of a lookup)."""
        if len(batch) > 1:
            # The usual batch is text tokens alone: counted among the batch's types, in
            # C, before the types are looked up. What it buys: a batch of 200 tokens
            # took 62,100 instructions, now 37,500 (callgrind).
            kinds = list(map(type, batch))
            tokens = kinds.count(ChannelToken)
            plain = tokens == len(kinds) or _EVENT_SCRUBBERS.keys().isdisjoint(kinds)
        else:  # one token per read: one lookup
            plain = not batch or type(batch[0]) not in _EVENT_SCRUBBERS
        return batch if plain else [self.event(event) for event in batch]


def _changed(instance: Any, **candidates: Any) -> dict[str, Any]:
    return {
        name: value
        for name, value in candidates.items()
        if value is not getattr(instance, name) and value != getattr(instance, name)
    }


def _evolve(event: _T, **candidates: Any) -> _T:
    changes = _changed(event, **candidates)
    return cast(_T, attrs.evolve(cast(Any, event), **changes)) if changes else event


def _metadata(r: Redactor, e: ModelMetadata) -> ModelMetadata:
    return _evolve(e, model=r.identifier(e.model), response_id=r.identifier(e.response_id))


def _retrying(r: Redactor, e: Retrying) -> Retrying:
    return _evolve(e, reason=r.text(e.reason))


def _images_stripped(r: Redactor, e: ImagesStripped) -> ImagesStripped:
    # A data: URI is the image itself (megabytes); a URL may carry a signed query.
    urls = tuple(u if u.startswith("data:") else r.text(u) for u in e.stripped_urls)
    return _evolve(e, stripped_urls=urls)


def _same(new: object, old: object) -> bool:
    return new is old or new == old


def _completed(r: Redactor, e: Completed) -> Completed:
    response = r.response(e.response)
    assert response is not None
    # ``model`` is the server's name for the model when it gave one (a response header),
    # usually the response's own model string: scrubbed once.
    model = e.model
    if model is not None:
        model = response.model if model is e.response.model else r.identifier(model)
    metrics = r.metrics(e.metrics)
    if response is e.response and _same(model, e.model) and metrics is e.metrics:
        return e
    return attrs.evolve(e, response=response, model=model, metrics=metrics)


def _failed(r: Redactor, e: Failed) -> Failed:
    error, partial = r.error(e.error), r.response(e.partial)
    metrics = r.metrics(e.metrics)
    if error is e.error and partial is e.partial and metrics is e.metrics:
        return e
    return attrs.evolve(e, error=error, partial=partial, metrics=metrics)


def _cancelled(r: Redactor, e: Cancelled) -> Cancelled:
    reason, partial = r.text(e.reason), r.response(e.partial)
    metrics = r.metrics(e.metrics)
    if _same(reason, e.reason) and partial is e.partial and metrics is e.metrics:
        return e
    return attrs.evolve(e, reason=reason, partial=partial, metrics=metrics)


# The events that carry strings not generated by the model; every other event passes.
_EVENT_SCRUBBERS: dict[type, Callable[[Redactor, Any], Any]] = {
    ModelMetadata: _metadata,
    Retrying: _retrying,
    ImagesStripped: _images_stripped,
    Completed: _completed,
    Failed: _failed,
    Cancelled: _cancelled,
}


@functools.lru_cache(maxsize=256)
def redactor_for(credentials: tuple[tuple[str, str], ...]) -> Redactor:
    """The (cached) :class:`Redactor` of ``credentials`` (``(label, value)`` pairs)."""
    return Redactor(credentials)


# ---------------------------------------------------------------------------------------
# Logs
# ---------------------------------------------------------------------------------------

#: The loggers whose records may carry request data: ours and the HTTP stack's
#: (``hpack``, under HTTP/2, logs each header it encodes at DEBUG, with its value unless
#: the header is marked sensitive, which ``x-api-key`` is not), and ``botocore``'s (its
#: SigV4 signer logs the canonical request, ``x-amz-security-token`` included, at DEBUG).
LOGGER_NAMES: Final = ("trio_sampler", "httpx2", "httpcore2", "hpack", "botocore")
# The HTTP stack logs on these children (a filter on a logger does not see its children's
# records, so each gets the filter itself); listed because they may not exist yet when
# a client is built (hpack is imported with the first HTTP/2 connection).
_KNOWN_CHILDREN = (
    "httpcore2.connection",
    "httpcore2.http11",
    "httpcore2.http2",
    "httpcore2.proxy",
    "httpcore2.socks",
    "hpack.hpack",
    "hpack.table",
    "botocore.auth",
)
_MAX_REDACTORS = 64


class _Scrubbed:
    """A log argument whose ``str`` or ``repr`` held a credential, with both scrubbed
    (so ``%s`` and ``%r`` still format as the caller meant)."""

    __slots__ = ("_repr", "_str")

    def __init__(self, as_str: str, as_repr: str) -> None:
        self._str = as_str
        self._repr = as_repr

    def __str__(self) -> str:
        return self._str

    def __repr__(self) -> str:
        return self._repr


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs records with every redactor it was given.

    It rewrites the message, each argument (keeping numbers as they are, so ``%d`` still
    formats), the formatted message when a credential shows only once formatted, the
    formatted traceback (``exc_info`` becomes ``exc_text``) and the stack
    text; it never drops a record. It holds the last 64 distinct redactors added.
    """

    def __init__(self) -> None:
        super().__init__()
        self._redactors: dict[Redactor, None] = {}

    def add(self, redactor: Redactor) -> None:
        """Scrub with ``redactor`` too (the most recent 64 are kept)."""
        redactors = self._redactors
        if redactor in redactors:
            return
        redactors[redactor] = None
        if len(redactors) > _MAX_REDACTORS:
            del redactors[next(iter(redactors))]

    def _text(self, text: str) -> str:
        for redactor in tuple(self._redactors) or (_SHAPES_ONLY,):
            text = redactor.text(text)
        return text

    def _arg(self, value: object) -> object:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, bytes | bytearray):
            text = bytes(value).decode("latin-1")
            scrubbed = self._text(text)
            return value if scrubbed == text else scrubbed.encode("latin-1", "replace")
        as_str, as_repr = str(value), repr(value)
        scrubbed_str, scrubbed_repr = self._text(as_str), self._text(as_repr)
        if scrubbed_str == as_str and scrubbed_repr == as_repr:
            return value
        return _Scrubbed(scrubbed_str, scrubbed_repr)

    def _whole(self, record: logging.LogRecord) -> None:
        """Scrub the formatted message as a whole when a shape spans the format and an
        argument (``"Signature:\n%s"``, ``"key=%s"``): each alone shows nothing."""
        try:
            whole = record.getMessage()
        except (TypeError, ValueError, KeyError):
            return  # a record that does not format: logging reports it as it is
        scrubbed = self._text(whole)
        if scrubbed != whole:
            record.msg, record.args = scrubbed, None

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._arg(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(self._arg(a) for a in args)
        elif isinstance(args, Mapping):
            record.args = {k: self._arg(v) for k, v in args.items()}
        if args:
            self._whole(record)
        if record.exc_info and record.exc_info[1] is not None:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_text = self._text(text)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = self._text(record.exc_text)
        if record.stack_info:
            record.stack_info = self._text(record.stack_info)
        return True


_SHAPES_ONLY = Redactor()


def install_log_filter(log_filter: logging.Filter) -> Callable[[], None]:
    """Add ``log_filter`` to the loggers of :data:`LOGGER_NAMES` and their children;
    return the function that removes it again from exactly those loggers."""
    prefixes = tuple(f"{name}." for name in LOGGER_NAMES)
    existing = [name for name in list(logging.root.manager.loggerDict) if name.startswith(prefixes)]
    names = sorted({*LOGGER_NAMES, *_KNOWN_CHILDREN, *existing})
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addFilter(log_filter)

    def remove() -> None:
        for logger in loggers:
            logger.removeFilter(log_filter)

    return remove
