"""``ConversationRequest.background``: sent as Responses ``background: true``, dropped
(and reported) where the backend has no background mode."""

from __future__ import annotations

import pytest

from trio_sampler.types import ApiBackend, ConversationRequest, User
from trio_sampler.wire import BuildOptions, build_request
from trio_sampler.wire.responses import parse_request


def test_responses_sends_background() -> None:
    request = ConversationRequest([User("hi")], model="m", background=True)
    wire = build_request(ApiBackend.RESPONSES, request, BuildOptions())
    assert wire.data["background"] is True
    assert parse_request(wire.body).background is True


def test_foreground_sends_no_field() -> None:
    wire = build_request(
        ApiBackend.RESPONSES, ConversationRequest([User("hi")], model="m"), BuildOptions()
    )
    assert "background" not in wire.data


@pytest.mark.parametrize("backend", [ApiBackend.CHAT_COMPLETIONS, ApiBackend.MESSAGES])
def test_other_backends_report_the_drop(backend: ApiBackend) -> None:
    request = ConversationRequest([User("hi")], model="m", background=True)
    wire = build_request(backend, request, BuildOptions())
    assert "background" not in wire.data
    assert [note.what for note in wire.report.notes] == ["background"]


def test_background_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="background must be True, False"):
        ConversationRequest([User("hi")], background=1)  # type: ignore[arg-type]
