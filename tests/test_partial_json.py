"""The incremental JSON reader: any split of the text gives the value ``json.loads`` gives,
every partial value on the way is consistent with the final one, errors name the
character where the text stops being JSON, and every tool call of the real-stream corpora
reads back as ``json.loads`` reads its arguments.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import corpus
from trio_sampler.types import ApiBackend, ToolCall, ToolCallCompleted, ToolCallDelta
from trio_sampler.wire import JSONChange, JSONChangeKind, PartialJSON, PartialJSONError, replay

# -- values and splits ---------------------------------------------------------------

_text = st.text(
    st.characters(codec="utf-16", exclude_categories=["Cs"]) | st.sampled_from('"\\\n\t/'),
    max_size=12,
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_text, inner, max_size=5),
    max_leaves=20,
)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def _consistent(partial: Any, final: Any, *, open_: bool) -> bool:
    """Whether ``partial`` is a view of ``final`` in progress: equal where complete, a
    prefix where open (the last member of each container may be open)."""
    if isinstance(final, dict):
        if not isinstance(partial, dict) or list(partial) != list(final)[: len(partial)]:
            return False
        keys = list(partial)
        return all(_consistent(partial[k], final[k], open_=open_ and k == keys[-1]) for k in keys)
    if isinstance(final, list):
        if not isinstance(partial, list) or len(partial) > len(final):
            return False
        last = len(partial) - 1
        return all(
            _consistent(p, f, open_=open_ and n == last)
            for n, (p, f) in enumerate(zip(partial, final, strict=False))
        )
    if isinstance(final, str) and open_:
        return isinstance(partial, str) and final.startswith(partial)
    return type(partial) is type(final) and partial == final


@given(_values, st.lists(st.integers(0, 10**6), max_size=40), st.booleans())
@settings(max_examples=300)
def test_any_split_reads_the_same_value_through_consistent_partials(
    value: Any, cuts: list[int], indent: bool
) -> None:
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=False)
    final = json.loads(text)
    reader = PartialJSON()
    for fragment in _split(text, cuts):
        reader.feed(fragment)
        assert reader.error is None
        partial = copy.deepcopy(reader.value)
        if partial is not None or reader.complete:
            assert _consistent(partial, final, open_=True), (partial, final)
    assert reader.finish() == final
    assert reader.error is None and reader.complete


@given(_values, st.lists(st.integers(0, 10**6), max_size=40))
@settings(max_examples=100)
def test_bytes_cut_inside_characters_read_the_same(value: Any, cuts: list[int]) -> None:
    data = json.dumps(value, ensure_ascii=False).encode()
    reader = PartialJSON()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        reader.push_bytes(data[a:b])
    assert reader.finish() == json.loads(data)


@given(_values, st.lists(st.integers(0, 10**6), max_size=40))
@settings(max_examples=100)
def test_changes_replayed_build_the_value(value: Any, cuts: list[int]) -> None:
    """The changes alone are enough to rebuild the document (a consumer's own copy)."""
    text = json.dumps(value)
    reader = PartialJSON()
    changes: list[JSONChange] = []
    for fragment in _split(text, cuts):
        changes += reader.feed(fragment)
    reader.finish()
    changes += reader.changes()
    assert apply_changes(changes) == json.loads(text)


def apply_changes(changes: list[JSONChange]) -> Any:
    """The document the changes build (as a consumer keeping its own copy would)."""
    root: list[Any] = [None]

    for kind, path, value in changes:
        *above, key = (0, *path)
        holder: Any = root
        for step in above:
            holder = holder[step]
        if kind is JSONChangeKind.SET:
            fresh = copy.deepcopy(value)
            if isinstance(holder, list) and key == len(holder):
                holder.append(fresh)
            else:
                holder[key] = fresh
        elif kind is JSONChangeKind.APPEND:
            holder[key] += value
    return root[0]


def test_partial_strings_grow_and_numbers_wait_for_their_end() -> None:
    reader = PartialJSON()
    assert [c.kind for c in reader.feed('{"a": "hel')] == [
        JSONChangeKind.SET,
        JSONChangeKind.SET,
        JSONChangeKind.APPEND,
    ]
    assert reader.value == {"a": "hel"}
    reader.feed('lo", "n": 12')
    assert reader.value == {"a": "hello"}  # 12 may go on: 123
    assert reader.feed("3") == []
    reader.feed(', "t": tr')
    assert reader.value == {"a": "hello", "n": 123}
    assert reader.feed("ue}")[-1] == JSONChange(
        JSONChangeKind.CLOSE, (), {"a": "hello", "n": 123, "t": True}
    )
    assert reader.complete


def test_a_string_cut_inside_an_escape_or_a_surrogate_pair() -> None:
    reader = PartialJSON()
    for fragment in ['["a\\', "n\\u00", "e9\\ud83d", "\\ude00", '"]']:
        reader.feed(fragment)
    assert reader.finish() == ["a\né\U0001f600"]


@pytest.mark.parametrize(
    ("fragments", "position", "message"),
    [
        (['{"a": 1,', "}"], 8, "expected a key"),
        (['{"a": tr', "ux}"], 6, "expected 'true', found 'trux'"),
        (["[1, 2", "]x"], 6, "expected nothing after the document"),
        (['{"a" 1}'], 5, "expected ':' after the key"),
        (['["ab\x01"]'], 4, "invalid control character"),
        (['["\\x"]'], 2, "invalid \\escape"),
        (["[01]"], 1, "'01' is not a JSON number"),
        (["[NaN]"], 1, "expected a value or ']', found 'N'"),
        (['{"a": [1}'], 8, "expected ',' or the end of the container"),
    ],
)
def test_an_error_names_where_the_text_stops_being_json(
    fragments: list[str], position: int, message: str
) -> None:
    reader = PartialJSON()
    for fragment in fragments:
        reader.feed(fragment)
    assert isinstance(reader.error, PartialJSONError)
    assert reader.error.position == position, reader.error
    assert message in str(reader.error)
    # The reader stops reading; the stream goes on (more text is taken and ignored).
    kept = copy.deepcopy(reader.value)
    assert reader.feed('"more", 1]}') == []
    assert reader.value == kept
    assert reader.finish() == kept and reader.error.position == position


def test_the_text_ending_early_is_an_error_with_the_partial_value_kept() -> None:
    reader = PartialJSON()
    reader.feed('{"path": "a.py", "content": "def f')
    assert reader.finish() == {"path": "a.py", "content": "def f"}
    assert reader.error is not None and "ended inside a string" in str(reader.error)
    assert not reader.complete


_documents = st.lists(_values, max_size=5) | st.dictionaries(_text, _values, max_size=5)


@given(_documents, st.integers(0, 10**6), st.lists(st.integers(0, 10**6), max_size=20))
@settings(max_examples=300)
def test_a_cut_anywhere_ends_in_an_error_and_a_value_that_never_contradicts(
    value: Any, cut: int, cuts: list[int]
) -> None:
    """A document (an object or an array, as an answer or tool arguments are) cut at any
    character, nested numbers and literals in arrays and objects included, read in any
    split: ``finish()`` says the text ended early and keeps a view of the final value
    (a number the cut may have shortened is never shown)."""
    text = json.dumps(value, ensure_ascii=False)
    final = json.loads(text)
    head = text[: cut % len(text)]
    reader = PartialJSON()
    for fragment in _split(head, cuts):
        reader.feed(fragment)
    partial = reader.finish()
    assert isinstance(reader.error, PartialJSONError) and not reader.complete
    assert "the text ended inside" in reader.error.message
    assert reader.error.position == len(head)
    if partial is not None:
        assert _consistent(partial, final, open_=True), (head, partial, final)


def test_pushed_fragments_are_read_when_asked_for() -> None:
    reader = PartialJSON()
    for fragment in ['{"xs": [1, ', '2, 3], "s": "ab', 'c"}']:
        reader.push(fragment)
    assert reader.value == {"xs": [1, 2, 3], "s": "abc"}
    kinds = [c.kind for c in reader.changes()]
    assert kinds.count(JSONChangeKind.CLOSE) == 3  # the list, the string, the object
    assert reader.changes() == []


# -- every tool call of the real-stream corpora ----------------------------------------


def _corpus_roots() -> list[Path]:
    """The corpus and its sibling captures (``<corpus>-2``, ``<corpus>-3``, ...)."""
    root = corpus.root()
    siblings = sorted(root.parent.glob(root.name + "-*"))
    return [r for r in [root, *siblings] if (r / "manifest.json").is_file()]


def _tool_captures() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for root in _corpus_roots():
        for entry in json.loads((root / "manifest.json").read_text()):
            if "tool_calls" in entry.get("features", ()):
                found.append((root, entry))
    return found


CAPTURES = _tool_captures()


@pytest.mark.real_streams
@pytest.mark.parametrize(
    "capture", CAPTURES, ids=[f"{root.name}/{entry['file']}" for root, entry in CAPTURES]
)
def test_every_corpus_tool_call_reads_as_json_loads_reads_it(
    capture: tuple[Path, dict[str, Any]],
) -> None:
    root, entry = capture
    events = replay(ApiBackend(entry["backend"]), (root / entry["file"]).read_bytes())
    readers: dict[int, PartialJSON] = {}
    streamed: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ToolCallDelta) and event.arguments_delta:
            readers.setdefault(event.tool_index, PartialJSON()).feed(event.arguments_delta)
            streamed.setdefault(event.tool_index, []).append(event.arguments_delta)
    for event in events:
        # A call whose arguments came whole (no fragments): read in 3-character pieces.
        if isinstance(event, ToolCallCompleted) and event.tool_index not in readers:
            text = event.call.arguments
            streamed[event.tool_index] = [text[n : n + 3] for n in range(0, len(text), 3)]
            readers[event.tool_index] = reader = PartialJSON()
            for piece in streamed[event.tool_index]:
                reader.feed(piece)
    assert readers, "a capture with tool calls has arguments"
    for index, reader in readers.items():
        text = "".join(streamed[index])
        value = reader.finish()
        try:
            expected = json.loads(text)
        except ValueError:  # arguments cut short (max_tokens): the reader says so too
            assert reader.error is not None
            continue
        assert reader.error is None, reader.error
        assert value == expected


def test_a_tool_call_cut_short_shows_what_arrived_and_no_cut_number() -> None:
    cut = ToolCall("1", "write", '{"path": "a.py", "size": 12', arguments_complete=False)
    assert cut.partial_arguments == {"path": "a.py"}  # 12 may have been 120
    text = ToolCall("2", "write", '{"path": "a.py", "content": "def f', arguments_complete=False)
    assert text.partial_arguments == {"path": "a.py", "content": "def f"}
    assert ToolCall("3", "noop", "").partial_arguments is None
    assert ToolCall("4", "add", '{"a": 1, "b": 2}').partial_arguments == {"a": 1, "b": 2}


def test_the_stdlib_scanners_the_reader_calls_behave_as_it_expects() -> None:
    """The reader calls ``json``'s C scanners directly (``scanstring``, the decoder's
    ``scan_once``), which are outside ``json``'s documented API: a Python upgrade that
    changes them fails here, by name."""
    from trio_sampler.types import _partial_json as reader

    assert reader._scanstring('ab\\n"c', 0) == ("ab\n", 5)
    assert reader._scan_once('x [1, {"a": 2}] y', 2) == ([1, {"a": 2}], 15)
    # Text that is not (yet) a whole value raises one of the two the reader catches.
    for text in ("x ", "[1, ", '{"a": tr', "[NaN]", "[1,]"):
        with pytest.raises((StopIteration, ValueError)):
            reader._scan_once(text, 2 if text == "x " else 0)
