"""Tools from code: the JSON Schema derived from a function's signature, annotations and
docstring; registration failing, saying what to write, when none can be derived; and the
arguments validated (and converted) before the function runs, a bad call answered with an
error result the model can act on."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

import attrs
import pydantic
import pytest
from typing_extensions import TypedDict

from trio_sampler.tools import ToolRegistry, tool
from trio_sampler.types import ToolCall


class Address(pydantic.BaseModel):
    street: str
    city: str


@dataclasses.dataclass
class Window:
    start: int
    end: int


@attrs.define
class Box:
    label: str
    weight: float = 1.0


class Filters(TypedDict):
    tag: str


def test_the_schema_comes_from_the_signature_annotations_and_docstring() -> None:
    def add(a: int, b: int = 2) -> int:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    spec = ToolRegistry().register(add)
    assert spec.description == "Add two numbers."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "integer", "default": 2, "description": "the second number"},
        },
        "required": ["a"],
        "additionalProperties": False,
    }


def test_sphinx_style_parameter_docs_and_the_common_annotations() -> None:
    def search(
        query: str,
        mode: Literal["fast", "deep"] = "fast",
        limit: int | None = None,
        tags: list[str] | None = None,
        weights: dict[str, float] | None = None,
    ) -> str:
        """Search the index.

        :param query: what to look for
        :param mode: how hard to look
        """
        return query

    properties = ToolRegistry().register(search).parameters["properties"]
    assert properties["query"] == {"type": "string", "description": "what to look for"}
    assert properties["mode"]["enum"] == ["fast", "deep"]
    assert properties["mode"]["description"] == "how hard to look"
    assert {"type": "null"} in properties["limit"]["anyOf"]
    assert {"items": {"type": "string"}, "type": "array"} in properties["tags"]["anyOf"]
    assert {"additionalProperties": {"type": "number"}, "type": "object"} in properties["weights"][
        "anyOf"
    ]


@pytest.mark.parametrize(
    ("function", "what"),
    [
        (lambda a, b: a + b, "no annotation on parameter 'a'"),
        (lambda **options: options, "it takes *args / **kwargs"),
    ],
)
def test_a_function_with_no_derivable_schema_fails_at_registration(
    function: Any, what: str
) -> None:
    with pytest.raises(TypeError, match=f"tool 'calc': {re.escape(what)}.*pass parameters="):
        ToolRegistry().register(function, name="calc")
    with pytest.raises(TypeError, match="annotate every parameter"):
        tool(function, name="calc")
    # With a schema written by hand it registers.
    ToolRegistry().register(function, name="calc", parameters={"type": "object"})


def test_a_function_without_parameters_needs_no_annotation() -> None:
    spec = ToolRegistry().register(lambda: "now", name="clock")
    assert spec.parameters == {"type": "object", "properties": {}}


async def test_structured_parameters_arrive_as_instances() -> None:
    received: dict[str, Any] = {}

    @tool(name="ship", description="Ship a box.")
    def ship(box: Box, to: Address, window: Window, filters: Filters) -> str:
        received.update(box=box, to=to, window=window, filters=filters)
        return "shipped"

    registry = ToolRegistry()
    spec = registry.register(ship)
    assert spec.name == "ship" and spec.description == "Ship a box."
    arguments = (
        '{"box": {"label": "books", "weight": 2.5}, "to": {"street": "1 Rue", "city": "Paris"},'
        ' "window": {"start": 9, "end": 17}, "filters": {"tag": "fragile"}}'
    )
    result = await registry.execute(ToolCall("1", "ship", arguments))
    assert result.content == "shipped" and not result.is_error
    assert received == {
        "box": Box("books", 2.5),
        "to": Address(street="1 Rue", city="Paris"),
        "window": Window(9, 17),
        "filters": {"tag": "fragile"},
    }


async def test_arguments_that_do_not_validate_never_reach_the_function() -> None:
    ran: list[object] = []

    @tool
    def schedule(day: Literal["mon", "tue"], hours: int) -> str:
        ran.append((day, hours))
        return "ok"

    registry = ToolRegistry()
    registry.register(schedule)
    result = await registry.execute(ToolCall("1", "schedule", '{"day": "sun", "hours": "x"}'))
    assert result.is_error and not ran
    assert "bad arguments for 'schedule'" in result.content
    assert "day: 'sun' is not one of ['mon', 'tue']" in result.content
    assert "hours: expected integer, got string" in result.content


async def test_with_a_pydantic_parameter_pydantic_validates_the_arguments() -> None:
    ran: list[object] = []

    @tool
    def deliver(to: Address, day: Literal["mon", "tue"]) -> str:
        ran.append((to, day))
        return "ok"

    registry = ToolRegistry()
    registry.register(deliver)
    result = await registry.execute(ToolCall("1", "deliver", '{"to": {"city": 1}, "day": "sun"}'))
    assert result.is_error and not ran
    assert "to.street: Field required" in result.content
    assert "day: Input should be 'mon' or 'tue'" in result.content


async def test_a_hand_written_schema_is_checked_before_the_call() -> None:
    ran: list[object] = []

    def tag(names: Any) -> str:
        ran.append(names)
        return "ok"

    schema = {
        "type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        "required": ["names"],
    }
    registry = ToolRegistry()
    registry.register(tag, parameters=schema)
    result = await registry.execute(ToolCall("1", "tag", '{"names": ["a", 2]}'))
    assert result.is_error and not ran
    assert "$.names[1]: expected string, got integer" in result.content
    assert not (await registry.execute(ToolCall("2", "tag", '{"names": ["a"]}'))).is_error
