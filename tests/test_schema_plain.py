"""JSON Schemas derived from the standard library's types without pydantic: the same
shapes pydantic gives (titles aside), decoded JSON validated and turned into instances,
and pydantic asked for only when a pydantic model is given."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import sys
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NotRequired, Optional, Union

import attrs
import pydantic
import pytest
from typing_extensions import TypedDict

from trio_sampler.tools import ToolRegistry, tool
from trio_sampler.types import ToolCall
from trio_sampler.types._schema import schema_for, to_python


class Colour(enum.Enum):
    """A paint colour."""

    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


@dataclasses.dataclass
class Point:
    """A point on the plane."""

    x: float
    y: float = 0.0


@dataclasses.dataclass
class Shape:
    name: str
    points: list[Point]
    colour: Colour = Colour.RED
    size: Optional[Size] = None  # noqa: UP045 - the spelling is what is tested
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Tree:
    value: int
    children: list[Tree] = dataclasses.field(default_factory=list)


class Order(TypedDict):
    """An order."""

    item: str
    quantity: int
    note: NotRequired[str]
    shape: NotRequired[Shape]


@attrs.define
class Parcel:
    weight: float
    colour: Colour = Colour.BLUE
    dimensions: tuple[int, int, int] = (1, 1, 1)


@dataclasses.dataclass
class ParcelAsDataclass:  # what pydantic would say of Parcel, if it read attrs classes
    weight: float
    colour: Colour = Colour.BLUE
    dimensions: tuple[int, int, int] = (1, 1, 1)


class Signup(pydantic.BaseModel):
    name: str


PLAIN_TYPES: list[Any] = [
    str,
    int,
    float,
    bool,
    None,
    type(None),
    Any,
    Literal["a"],
    Literal["a", "b"],
    Literal[1, "a"],
    Literal[True],
    Optional[int],  # noqa: UP045
    int | None,
    Union[int, str],  # noqa: UP007
    list,
    list[int],
    list[Any],
    Sequence[str],
    tuple[int, ...],
    tuple[int, str],
    set[str],
    frozenset[int],
    dict,
    dict[str, int],
    dict[str, Any],
    Mapping[str, list[float]],
    Colour,
    Size,
    list[Colour],
    Point,
    Shape,
    Tree,
    Order,
    dict[str, Tree] | None,
    Annotated[int, pydantic.Field(description="how many")],
]


def _untitled(node: Any) -> Any:
    if isinstance(node, list):
        return [_untitled(n) for n in node]
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
    return node


def _without_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic", None)  # `import pydantic` now fails
    with pytest.raises(ImportError):
        import pydantic  # noqa: F401


@pytest.mark.parametrize("target", PLAIN_TYPES, ids=repr)
def test_the_plain_derivation_gives_pydantics_schema_without_pydantic(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = pydantic.TypeAdapter(target).json_schema()
    if sys.modules.get("pydantic") is not None and _has_pydantic_metadata(target):
        # pydantic's own metadata needs pydantic; the plain spelling of the same is a string.
        target = Annotated[int, "how many"]
    _without_pydantic(monkeypatch)
    assert _untitled(schema_for(target)) == _untitled(expected)


def _has_pydantic_metadata(target: Any) -> bool:
    metadata = getattr(target, "__metadata__", ())
    return any(isinstance(m, pydantic.fields.FieldInfo) for m in metadata)


def test_an_attrs_class_gives_the_schema_of_the_same_dataclass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = pydantic.TypeAdapter(ParcelAsDataclass).json_schema()
    _without_pydantic(monkeypatch)
    assert _untitled(schema_for(Parcel)) == _untitled(expected)


def test_annotated_text_and_class_docstrings_are_descriptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_pydantic(monkeypatch)
    assert schema_for(Annotated[int, "how many"]) == {"type": "integer", "description": "how many"}
    assert schema_for(Point)["description"] == "A point on the plane."
    assert "description" not in schema_for(Tree)  # a dataclass's generated docstring is not one


def test_decoded_json_becomes_instances_without_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_pydantic(monkeypatch)
    shape = {"name": "tri", "points": [{"x": 1, "y": 2.5}, {"x": 0}], "size": 2, "colour": "blue"}
    assert to_python(Shape, shape) == Shape(
        "tri", [Point(1.0, 2.5), Point(0.0)], Colour.BLUE, Size.LARGE
    )
    assert to_python(Parcel, {"weight": 2, "dimensions": [1, 2, 3]}) == Parcel(
        2.0, Colour.BLUE, (1, 2, 3)
    )
    order = {"item": "pen", "quantity": 3, "shape": {"name": "s", "points": []}}
    assert to_python(Order, order) == {"item": "pen", "quantity": 3, "shape": Shape("s", [])}
    tree = to_python(Tree, {"value": 1, "children": [{"value": 2}]})
    assert tree == Tree(1, [Tree(2)])
    assert to_python(dict[str, Colour] | None, {"a": "red"}) == {"a": Colour.RED}
    assert to_python(int | str, "x") == "x"
    assert to_python(set[int], [1, 2, 2]) == {1, 2}


def test_json_that_does_not_validate_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_pydantic(monkeypatch)
    with pytest.raises(ValueError, match=r"\$.points\[0\]: missing required property 'x'"):
        to_python(Shape, {"name": "tri", "points": [{"y": 1}]})
    with pytest.raises(ValueError, match=r"\$.colour: 'green' is not one of \['red', 'blue'\]"):
        to_python(Shape, {"name": "tri", "points": [], "colour": "green"})
    with pytest.raises(ValueError, match=r"\$.quantity: expected integer, got string"):
        to_python(Order, {"item": "pen", "quantity": "3"})


def test_a_pydantic_model_without_pydantic_says_which_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_pydantic(monkeypatch)
    extra = r"pip install 'trio-sampler\[structured\]'"
    with pytest.raises(TypeError, match=f"pydantic model.*{extra}"):
        schema_for(Signup)
    with pytest.raises(TypeError, match=r"pip install 'trio-sampler\[structured\]'"):
        to_python(list[Signup], [])


def test_a_type_the_plain_derivation_cannot_read_says_what_to_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_pydantic(monkeypatch)
    with pytest.raises(TypeError, match=r"datetime.*use str.*or pip install") as caught:
        schema_for(list[datetime.datetime])
    assert "dataclass" in str(caught.value)
    with pytest.raises(TypeError, match=r"dict\[int, str\].*keys"):
        schema_for(dict[int, str])
    # With pydantic, the type pydantic reads is derived by it.
    monkeypatch.undo()
    assert schema_for(datetime.datetime) == {"type": "string", "format": "date-time"}


async def test_tools_from_plain_signatures_need_no_pydantic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_pydantic(monkeypatch)
    received: list[Any] = []

    @tool
    def place(
        shape: Shape,
        parcel: Parcel,
        order: Order,
        count: Annotated[int, "how many copies"] = 1,
        mode: Literal["fast", "slow"] = "fast",
    ) -> str:
        """Place a shape.

        Args:
            shape: what to place
        """
        received.append((shape, parcel, order, count, mode))
        return "placed"

    registry = ToolRegistry()
    spec = registry.register(place)
    properties = spec.parameters["properties"]
    assert spec.parameters["required"] == ["shape", "parcel", "order"]
    assert spec.parameters["additionalProperties"] is False
    assert properties["shape"] == {"$ref": "#/$defs/Shape", "description": "what to place"}
    count = {"type": "integer", "default": 1, "description": "how many copies"}
    assert properties["count"] == count
    assert set(spec.parameters["$defs"]) == {"Shape", "Point", "Colour", "Size", "Parcel", "Order"}
    arguments = (
        '{"shape": {"name": "s", "points": [{"x": 1}]}, "parcel": {"weight": 1},'
        ' "order": {"item": "pen", "quantity": 1}, "mode": "slow"}'
    )
    result = await registry.execute(ToolCall("1", "place", arguments))
    assert result.content == "placed" and not result.is_error
    assert received == [
        (Shape("s", [Point(1.0)]), Parcel(1.0), {"item": "pen", "quantity": 1}, 1, "slow")
    ]
    bad = await registry.execute(ToolCall("2", "place", '{"shape": {}, "mode": "slow", "x": 1}'))
    assert bad.is_error and len(received) == 1
    assert "shape: missing required property 'name'" in bad.content
    assert "arguments: missing required property 'parcel'" in bad.content
    assert "arguments: unexpected property 'x'" in bad.content


def test_a_tool_taking_a_pydantic_model_without_pydantic_says_which_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_pydantic(monkeypatch)

    def sign(who: Signup) -> str:
        return who.name

    with pytest.raises(TypeError, match=r"tool 'sign'.*pydantic model.*trio-sampler\[structured\]"):
        ToolRegistry().register(sign)


def test_a_typing_typeddict_which_pydantic_refuses_before_3_12_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Line(typing.TypedDict):
        text: str
        number: typing.NotRequired[int]

    _without_pydantic(monkeypatch)
    assert schema_for(Line) == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "number": {"type": "integer"}},
        "required": ["text"],
        "title": "Line",
    }
    assert to_python(Line, {"text": "a", "number": 1}) == {"text": "a", "number": 1}


def test_a_pydantic_model_inside_a_dataclass_is_derived_by_pydantic() -> None:
    @dataclasses.dataclass
    class Team:
        lead: Signup
        size: int

    assert schema_for(Team) == pydantic.TypeAdapter(Team).json_schema()
    team = to_python(Team, {"lead": {"name": "Ada"}, "size": 2})
    assert team == Team(Signup(name="Ada"), 2)


def test_a_plain_output_type_streams_its_partials_without_pydantic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A closed subtree of a plain type is checked against its JSON Schema alone: asking
    # whether a pydantic check applies must not import pydantic.
    from trio_sampler.types._schema import subtree_check

    monkeypatch.setitem(sys.modules, "pydantic", None)

    @dataclasses.dataclass
    class Stop:
        city: str
        nights: int

    assert subtree_check(Stop, ("nights",)) is None
