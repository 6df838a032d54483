"""Structured output and tool arguments as they stream, through a sampler and the emulator:
``OutputDelta`` / ``ToolArgumentsDelta`` after their sources, the partial values readable
at any time, the answer read into ``output_parsed`` (or a typed ``output_error``), and
``output=`` accepting a JSON Schema or a Python type, strict rules checked at once.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Literal

import attrs
import httpx2
import openai
import pydantic
import pytest
from test_partial_json import _consistent, _split, apply_changes
from typing_extensions import TypedDict  # pydantic reads typing's only from 3.12

from trio_sampler import ApiBackend, SamplerConfig, open_sampler
from trio_sampler.agent import AgentStop, process_conversation_turn
from trio_sampler.testing import EmulatorFixture
from trio_sampler.tools import ToolRegistry
from trio_sampler.types import (
    Assistant,
    Cancelled,
    ChannelToken,
    Completed,
    ConversationRequest,
    ConversationResponse,
    Failed,
    FirstToken,
    JSONChange,
    JSONChangeKind,
    OutputDelta,
    OutputErrorKind,
    ResponseSchema,
    SamplingChannel,
    SamplingError,
    SamplingErrorInfo,
    SamplingErrorKind,
    SamplingEvent,
    StopReason,
    ToolArgumentsDelta,
    ToolCallDelta,
    ToolResult,
    ToolSpec,
    User,
    structured_output,
)
from trio_sampler.wire import (
    BuildOptions,
    ConversionAction,
    PartialOutputs,
    build_request,
    collect,
    read_output,
)

BACKENDS = [pytest.param(b, id=b.value) for b in ApiBackend]


class City(pydantic.BaseModel):
    name: str
    population: int
    districts: list[str]
    kind: Literal["capital", "town"]


PARIS = City(name="Paris", population=2102650, districts=["Louvre", "Bourse"], kind="capital")


def config(emulator: EmulatorFixture, backend: ApiBackend) -> SamplerConfig:
    return SamplerConfig(
        base_url=emulator.base_url, backend=backend, model="emulator-1", api_key="sk-struct-1"
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_answer_streams_as_changes_and_ends_validated(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    text = json.dumps(PARIS.model_dump())
    headers = emulator.script(text=text)
    request = ConversationRequest([User("a city")], output=City, extra_headers=headers)
    seen: list[Any] = []
    deltas: list[OutputDelta] = []
    async with open_sampler(config(emulator, backend)) as sampler:
        stream = await sampler.submit(request)
        async for event in stream:
            if isinstance(event, OutputDelta):
                deltas.append(event)
                seen.append(copy.deepcopy(stream.partial_output()))
            if isinstance(event, Completed):
                response = event.response
    assert response.output_parsed == PARIS and response.output_error is None
    assert deltas and seen[-1] == json.loads(text)
    # The changes alone rebuild the answer (how many runs the reads made varies).
    assert apply_changes([c for d in deltas for c in d.changes]) == json.loads(text)
    for partial in seen:  # a view that never contradicts the answer
        assert partial.get("name", "") in ("", *(PARIS.name[:n] for n in range(1, 6)))
        assert set(partial) <= set(json.loads(text))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_tool_arguments_stream_as_changes_beside_the_raw_fragments(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    arguments = {"path": "notes.md", "content": 'line one\nline two "quoted"\n' * 20}
    headers = emulator.script(tool_calls=[{"name": "write_file", "arguments": arguments}])
    request = ConversationRequest(
        [User("write it")], tools=[ToolSpec("write_file")], extra_headers=headers
    )
    raw: list[str] = []
    changes: list[JSONChange] = []
    async with open_sampler(config(emulator, backend)) as sampler:
        stream = await sampler.submit(request)
        async for event in stream:
            if isinstance(event, ToolCallDelta):
                raw.append(event.arguments_delta)  # the raw text still streams as before
            elif isinstance(event, ToolArgumentsDelta):
                assert event.tool_index == 0
                changes += event.changes
        assert stream.partial_arguments(0) == arguments
    assert json.loads("".join(raw)) == arguments
    assert changes[-1].kind is JSONChangeKind.CLOSE and changes[-1].path == ()


def test_not_json_invalid_and_refused_answers_are_typed_with_the_text_kept() -> None:
    output = structured_output(City)
    assert output is not None
    not_json = read_output(output, ConversationResponse(items=[], stop_reason=None))
    assert not_json.output_error is not None
    assert not_json.output_error.kind is OutputErrorKind.NOT_JSON

    invalid = read_output(output, ConversationResponse(items=[Assistant('{"name": 1}')]))
    assert invalid.output_error is not None
    assert invalid.output_error.kind is OutputErrorKind.INVALID
    assert invalid.output_error.text == '{"name": 1}'

    refused = read_output(output, ConversationResponse(items=[Assistant(refusal="I can't")]))
    assert refused.output_error is not None
    assert refused.output_error.kind is OutputErrorKind.REFUSED
    assert refused.output_error.refusal == "I can't"
    anthropic = read_output(
        output,
        ConversationResponse(items=[Assistant("I won't help")], raw_stop_reason="refusal"),
    )
    assert anthropic.output_error is not None
    assert anthropic.output_error.kind is OutputErrorKind.REFUSED


_TRACK = {
    "type": "object",
    "properties": {
        "points": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "closed": {"type": "boolean"},
        "name": {"type": "string"},
    },
    "required": ["points", "closed", "name"],
    "additionalProperties": False,
}
_TRACK_TEXT = '{"points": [[1, 25], [-3.5, 1e3, 120]], "closed": true, "name": "loop"}'


@pytest.mark.parametrize("cut", range(len(_TRACK_TEXT)))
def test_an_answer_cut_anywhere_is_not_json_on_every_terminal_with_a_consistent_partial(
    cut: int,
) -> None:
    """A stream cut at any character of its answer (numbers nested in arrays included):
    the partial answer never contradicts the whole one, and the response of whatever
    terminal ends it (a ``Completed`` cut by the length limit, the ``partial`` of a
    ``Failed`` or a ``Cancelled``) says NOT_JSON, the text kept."""
    request = ConversationRequest([User("x")], output=_TRACK)
    partials = PartialOutputs.for_request("r", request)
    assert partials is not None
    head = _TRACK_TEXT[:cut]
    for piece in _split(head, [cut // 3, cut // 2, cut - 1]):
        partials.batch([ChannelToken("r", SamplingChannel.TEXT, piece, 1)])
    view = partials.output()
    if view is not None:
        assert _consistent(view, json.loads(_TRACK_TEXT), open_=True), (head, view)
    response = ConversationResponse(
        items=[Assistant(head)], stop_reason=StopReason.LENGTH, raw_stop_reason="length"
    )
    error = SamplingErrorInfo(kind=SamplingErrorKind.TRANSPORT, message="reset", retryable=False)
    for terminal in (
        Completed("r", response),
        Failed("r", error, response),
        Cancelled("r", "cancelled by the caller", response),
    ):
        ended = partials.finish(terminal)
        answer = ended.response if isinstance(ended, Completed) else ended.partial
        assert answer is not None and answer.output_parsed is None
        assert answer.output_error is not None, type(terminal).__name__
        assert answer.output_error.kind is OutputErrorKind.NOT_JSON
        assert answer.output_error.text == head
        assert answer.output_error.message == (
            f"the text ends before its JSON does (cut at character {len(head)})"
        )


@dataclasses.dataclass
class Point:
    x: int
    y: int


@attrs.define
class Box:
    label: str
    size: float = 1.0


class Movie(TypedDict):
    title: str
    year: int


@pytest.mark.parametrize(
    ("target", "answer", "expected"),
    [
        (Point, {"x": 1, "y": 2}, Point(1, 2)),
        (Box, {"label": "a", "size": 2.5}, Box("a", 2.5)),
        (Movie, {"title": "M", "year": 1931}, {"title": "M", "year": 1931}),
        (City, PARIS.model_dump(), PARIS),
    ],
)
def test_output_accepts_python_types_lowered_to_the_strict_subset(
    target: Any, answer: Any, expected: Any
) -> None:
    request = ConversationRequest([User("x")], output=target)
    assert request.output is not None and request.response_schema is not None
    schema = request.response_schema.schema
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(schema["properties"])
    assert request.output.parse(json.dumps(answer)) == expected


def test_a_json_schema_output_is_checked_against_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    output = structured_output(schema)
    assert output is not None
    assert output.parse('{"tags": ["a"]}') == {"tags": ["a"]}
    with pytest.raises(ValueError, match=r"\$\.tags\[1\]: expected string, got integer"):
        output.parse('{"tags": ["a", 2]}')


def test_a_strict_schema_a_strict_mode_would_reject_fails_at_construction() -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    with pytest.raises(ValueError, match=r"additionalProperties.*add \['a'\] to 'required'"):
        ConversationRequest([User("x")], output=loose)
    # Not strict: sent as it is.
    request = ConversationRequest([User("x")], output=ResponseSchema("loose", loose, strict=False))
    assert request.response_schema is not None and not request.response_schema.strict


def test_a_text_channel_without_output_gets_no_output_events() -> None:
    request = ConversationRequest([User("x")])
    assert PartialOutputs.for_request("r", request) is None
    partials = PartialOutputs.for_request("r", ConversationRequest([User("x")], output=Point))
    assert partials is not None
    token = ChannelToken("r", SamplingChannel.TEXT, '{"x": 1', 1)
    batch = partials.batch([token])
    assert batch[0] is token and isinstance(batch[1], OutputDelta)
    assert partials.output() == {}  # 1 may go on


# -- the emulator's structured answers ---------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_pydantic_model_round_trips_on_every_backend(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    """Nothing scripted: the emulator answers with JSON matching the schema it was sent."""
    request = ConversationRequest([User("a city")], output=City)
    async with open_sampler(config(emulator, backend)) as sampler:
        stream = await sampler.submit(request)
        deltas = [e async for e in stream if isinstance(e, OutputDelta)]
        response = (await stream.result()).unwrap()
    assert isinstance(response.output_parsed, City), response.output_error
    assert response.output_parsed.kind == "capital"  # the first of the Literal's values
    assert deltas
    assert City.model_validate(stream.partial_output()) == response.output_parsed


@pytest.mark.parametrize("backend", BACKENDS)
async def test_scripted_malformed_output_is_a_typed_error_with_the_text_kept(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    headers = emulator.script(text='{"name": "Paris", "population": "many"')
    request = ConversationRequest([User("a city")], output=City, extra_headers=headers)
    async with open_sampler(config(emulator, backend)) as sampler:
        response = (await (await sampler.submit(request)).result()).unwrap()
    assert response.output_parsed is None and response.output_error is not None
    assert response.output_error.kind is OutputErrorKind.NOT_JSON
    assert response.output_error.text == '{"name": "Paris", "population": "many"'


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_emulator_rejects_a_schema_strict_mode_rejects(
    emulator: EmulatorFixture, backend: ApiBackend
) -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    strict = backend is ApiBackend.MESSAGES  # Anthropic's structured output is always strict
    schema = ResponseSchema("loose", loose, strict=False)
    # Sent as strict (bypassing the request's own check) to see the server's answer.
    request = attrs.evolve(
        ConversationRequest([User("x")], output=schema),
        response_schema=attrs.evolve(schema, strict=True),
    )
    async with open_sampler(config(emulator, backend)) as sampler:
        outcome = await (await sampler.submit(request)).result()
        relaxed = await (
            await sampler.submit(ConversationRequest([User("x")], output=schema))
        ).result()
    with pytest.raises(SamplingError) as caught:
        outcome.unwrap()
    assert caught.value.kind is SamplingErrorKind.INVALID_REQUEST
    assert "additionalProperties" in str(caught.value)
    if strict:
        with pytest.raises(SamplingError):
            relaxed.unwrap()
    else:
        assert relaxed.unwrap().output_parsed == {}


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_the_openai_sdk_parse_and_output_parsed_agree(emulator: EmulatorFixture) -> None:
    """The official SDK's ``.parse()`` (its own strict schema, its own parser) and ours,
    on the emulator's answers: each valid unscripted, and equal on the same text."""
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=emulator.base_url, api_key="sk-struct-1", http_client=http, max_retries=0
        )
        messages: Any = [{"role": "user", "content": "a city"}]
        chat = await client.chat.completions.parse(
            model="emulator-1", messages=messages, response_format=City
        )
        responses = await client.responses.parse(
            model="emulator-1", input="a city", text_format=City
        )
        text = chat.choices[0].message.content or ""
        headers = emulator.script(text=text)
        scripted = await client.chat.completions.parse(
            model="emulator-1", messages=messages, response_format=City, extra_headers=headers
        )
    assert isinstance(chat.choices[0].message.parsed, City)
    assert isinstance(responses.output_parsed, City)
    for backend in (ApiBackend.CHAT_COMPLETIONS, ApiBackend.RESPONSES):
        request = ConversationRequest([User("a city")], output=City, extra_headers=headers)
        async with open_sampler(config(emulator, backend)) as sampler:
            ours = (await (await sampler.submit(request)).result()).unwrap()
        assert ours.output_parsed == scripted.choices[0].message.parsed
        assert ours.text == text


# -- the tool-forcing strategy -----------------------------------------------------------


def test_a_provider_without_native_structured_output_gets_a_forced_tool_reported() -> None:
    request = ConversationRequest([User("a city")], output=City)
    native = build_request("responses", request, BuildOptions(model="m", provider="openai"))
    assert "text" in json.loads(native.body) and not native.report.notes
    options = BuildOptions(model="m", provider="deepseek")
    forced = build_request("chat_completions", request, options)
    body = json.loads(forced.body)
    assert "response_format" not in body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "City"}}
    (tool_body,) = body["tools"]
    assert tool_body["function"]["parameters"] == request.response_schema.schema  # type: ignore[union-attr]
    (note,) = forced.report.notes
    assert note.what == "response_schema" and note.action is ConversionAction.ADJUSTED
    assert "forced with tool_choice" in note.detail


async def test_the_forced_tool_call_is_read_as_the_answer(emulator: EmulatorFixture) -> None:
    config_ = SamplerConfig(
        base_url=emulator.base_url, provider="deepseek", model="emulator-1", api_key="sk-ds-1"
    )
    request = ConversationRequest([User("a city")], output=City)
    async with open_sampler(config_) as sampler:
        stream = await sampler.submit(request)
        events = [e async for e in stream]
        response = (await stream.result()).unwrap()
    assert isinstance(response.output_parsed, City), response.output_error
    # The forced call is the answer, not a call to run: it reads as a native answer does.
    assert response.tool_calls == () and response.stop_reason is StopReason.STOP
    assert City.model_validate_json(response.text) == response.output_parsed
    assert collect(events) == response
    assert any(isinstance(e, OutputDelta) for e in events)
    assert not any(isinstance(e, ToolArgumentsDelta) for e in events)
    assert City.model_validate(stream.partial_output()) == response.output_parsed


async def test_the_agent_loop_ends_on_the_forced_answer_without_running_it(
    emulator: EmulatorFixture,
) -> None:
    """A turn with local tools and ``output=`` on a provider without native structured
    output: the answer's synthetic tool is never dispatched (the registry does not know
    it); the turn ends on it, ``output_parsed`` set, the conversation resubmittable."""
    config_ = SamplerConfig(
        base_url=emulator.base_url, provider="deepseek", model="emulator-1", api_key="sk-ds-1"
    )
    registry = ToolRegistry()

    def population(city: str) -> int:
        """The population of a city."""
        raise AssertionError("the answer was forced: no tool runs")

    registry.register(population)
    request = ConversationRequest([User("a city")], output=City)
    async with open_sampler(config_) as sampler:
        result = await process_conversation_turn(sampler, request, tools=registry)
    assert result.stop is AgentStop.FINAL_ANSWER and result.steps == 1, result.message
    assert result.response is not None
    assert isinstance(result.response.output_parsed, City), result.response.output_error
    assert not any(isinstance(item, ToolResult) for item in result.items)
    assert all(not item.tool_calls for item in result.items if isinstance(item, Assistant))


def test_a_run_of_fragments_is_read_once_and_its_changes_follow_it() -> None:
    """Within a batch (one network read), consecutive fragments of one document are one
    run: pushed one by one, read once at the run's end, the changes placed after it."""
    tools = ConversationRequest([User("x")], output=Point, tools=[ToolSpec("a"), ToolSpec("b")])
    partials = PartialOutputs.for_request("r", tools)
    assert partials is not None

    def text(piece: str) -> ChannelToken:
        return ChannelToken("r", SamplingChannel.TEXT, piece, 1)

    def call(index: int, piece: str) -> ToolCallDelta:
        return ToolCallDelta("r", index, None, None, piece)

    first = FirstToken("r")
    batch: list[SamplingEvent] = [
        text('{"x": '),
        text("1, "),
        first,
        call(0, '{"q": "a'),
        call(1, "[tr"),
        call(1, "ue]"),
    ]
    out = partials.batch(batch)
    kinds = [type(e).__name__ for e in out]
    assert kinds == [
        "ChannelToken",
        "ChannelToken",
        "OutputDelta",
        "FirstToken",
        "ToolCallDelta",
        "ToolArgumentsDelta",
        "ToolCallDelta",
        "ToolCallDelta",
        "ToolArgumentsDelta",
    ]
    assert [e.tool_index for e in out if isinstance(e, ToolArgumentsDelta)] == [0, 1]
    assert partials.output() == {"x": 1}
    assert partials.arguments(0) == {"q": "a"} and partials.arguments(1) == [True]
    # A batch with nothing to read is handed back as it is.
    quiet: list[SamplingEvent] = [first]
    assert partials.batch(quiet) is quiet


def test_a_batch_of_one_calls_fragments_reads_as_the_general_path_does() -> None:
    """A read holding nothing but one tool call's fragments (a burst's usual batch) is
    read at once; its changes are those the event-by-event path finds."""
    request = ConversationRequest([User("x")], tools=[ToolSpec("a"), ToolSpec("b")])
    text = '{"path": "a.py", "content": "x = [1, 2]\\n", "mode": 420}'
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    one = PartialOutputs.for_request("r", request)
    general = PartialOutputs.for_request("r", request)
    assert one is not None and general is not None
    calls: list[SamplingEvent] = [ToolCallDelta("r", 1, None, None, p) for p in pieces]
    fast = one.batch(calls[:7]) + one.batch(calls[7:])
    # The same fragments with an event between them: read by the general path.
    first = FirstToken("r")
    slow = general.batch([first, *calls[:7]]) + general.batch([*calls[7:], first])
    deltas = [e for e in fast if isinstance(e, ToolArgumentsDelta)]
    assert [type(e) for e in fast] == (
        [ToolCallDelta] * 7
        + [ToolArgumentsDelta]
        + [ToolCallDelta] * (len(calls) - 7)
        + [ToolArgumentsDelta]
    )
    expected = [e for e in slow if isinstance(e, ToolArgumentsDelta)]
    assert [d.changes for d in deltas] == [d.changes for d in expected]
    assert one.arguments(1) == general.arguments(1) == json.loads(text)
    # Two calls in one batch: the general path, each call's run after it.
    two = PartialOutputs.for_request("r", request)
    assert two is not None
    mixed = two.batch([ToolCallDelta("r", 0, None, None, "[1]"), calls[0]])
    assert [type(e).__name__ for e in mixed] == [
        "ToolCallDelta",
        "ToolArgumentsDelta",
        "ToolCallDelta",
        "ToolArgumentsDelta",
    ]


def test_a_closed_subtree_that_breaks_the_schema_is_reported_as_it_closes() -> None:
    schema = structured_output(City)
    assert schema is not None  # the schema alone, as a JSON Schema dict is checked
    request = ConversationRequest([User("x")], output=dict(schema.schema.schema))
    partials = PartialOutputs.for_request("r", request)
    assert partials is not None

    def text(piece: str) -> ChannelToken:
        return ChannelToken("r", SamplingChannel.TEXT, piece, 1)

    good = partials.batch([text('{"name": "Paris", "population": 2102650, ')])
    bad = partials.batch([text('"districts": ["Louvre", 2], "kind"')])
    deltas = [e for e in good + bad if isinstance(e, OutputDelta)]
    assert deltas[0].problems == ()
    # Reported when the array closes, long before the answer ends (and only once).
    assert deltas[1].problems == ("$.districts[1]: expected string, got integer",)
    end = partials.batch([text(': "capital"}')])
    assert [e.problems for e in end if isinstance(e, OutputDelta)] == [()]


class Stop(pydantic.BaseModel):
    city: str
    nights: int = pydantic.Field(gt=0)

    @pydantic.field_validator("city")
    @classmethod
    def _known(cls, city: str) -> str:
        if city not in {"Paris", "Lyon"}:
            raise ValueError(f"no hotel in {city}")
        return city


class Trip(pydantic.BaseModel):
    traveller: str
    stops: list[Stop]


def test_a_pydantic_model_validates_each_closed_subtree_as_it_closes() -> None:
    """With a pydantic model as ``output``, a closed subtree is validated by the model's
    own type for it (constraints, validators), reported on the event, the stream read on."""
    partials = PartialOutputs.for_request("r", ConversationRequest([User("x")], output=Trip))
    assert partials is not None
    pieces = [
        '{"traveller": "Ada", "stops": [{"city": "Paris", "nights": 2}, ',
        '{"city": "Oslo", "nights": 0}',
        ', {"city": "Lyon", "nights": 1}]}',
    ]
    problems = []
    for piece in pieces:
        batch = partials.batch([ChannelToken("r", SamplingChannel.TEXT, piece, 1)])
        problems.append([p for e in batch if isinstance(e, OutputDelta) for p in e.problems])
    assert problems[0] == []
    # The second stop, as it closes: the model's validator and its Field constraint.
    assert problems[1] == [
        "$.stops[1].city: Value error, no hotel in Oslo",
        "$.stops[1].nights: Input should be greater than 0",
    ]
    assert problems[2] == []  # read on; the problems above are not repeated
    assert partials.output()["stops"][2] == {"city": "Lyon", "nights": 1}
    text = "".join(pieces)
    ended = partials.finish(Completed("r", ConversationResponse(items=[Assistant(text)])))
    assert isinstance(ended, Completed) and ended.response.output_error is not None
    assert ended.response.output_error.kind is OutputErrorKind.INVALID
