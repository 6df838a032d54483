"""``WireRequest.with_headers``: the request with headers after its own, every other
field passed on (it builds the request field by field, so a new field must be added
there: the list below says so)."""

from __future__ import annotations

import attrs

from trio_sampler.types import ConversationRequest, User
from trio_sampler.wire import BuildOptions, build_request
from trio_sampler.wire._request import (
    ConversionAction,
    ConversionNote,
    ConversionReport,
    WireRequest,
)


def test_with_headers_appends_the_headers_and_keeps_every_other_field() -> None:
    note = ConversionNote(0, "an image", next(iter(ConversionAction)), "not carried")
    wire = WireRequest(
        path="responses/resp_1",
        body=b'{"a":1}',
        data={"a": 1},
        headers=(("x-own", "1"),),
        report=ConversionReport((note,)),
        method="GET",
        query=(("stream", "true"),),
    )
    extra = (("x-trace", "t"), ("x-other", "o"))
    assert wire.with_headers(extra) == attrs.evolve(wire, headers=(*wire.headers, *extra))
    assert wire.with_headers(extra).headers == (("x-own", "1"), ("x-trace", "t"), ("x-other", "o"))


def test_with_headers_passes_on_each_field_of_a_wire_request() -> None:
    # A field added to WireRequest must be passed on by ``with_headers`` too.
    assert [field.name for field in attrs.fields(WireRequest)] == [
        "path",
        "body",
        "data",
        "headers",
        "report",
        "method",
        "query",
    ]


def test_a_requests_own_headers_follow_the_rendered_ones() -> None:
    request = ConversationRequest(items=[User("hi")], extra_headers={"X-Trace": "t1"})
    wire = build_request("chat_completions", request, BuildOptions(model="m"))
    assert wire.headers[-1] == ("X-Trace", "t1")
