"""Local tools for the agent loop: :class:`ToolRegistry` (any Python callable as a tool,
with failures turned into error results the model can act on) and :func:`builtin_tools`:
``read_file`` and ``list_directory`` confined to a root directory, and ``calculate``
(arithmetic through :mod:`ast`, no ``eval``). There is deliberately no shell tool.
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs
import orjson
import trio

from ._tool_signature import Signature, signature_of
from .types import (
    ToolCall,
    ToolResult,
    ToolSpec,
    TrioSamplerError,
)
from .types._schema import schema_errors

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_MAX_RESULT_CHARS",
    "CalculationError",
    "ToolError",
    "ToolRegistry",
    "builtin_tools",
    "calculate",
    "tool",
]

#: A tool's result is cut to this many characters (the model's context is finite).
DEFAULT_MAX_RESULT_CHARS = 100_000

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolError(TrioSamplerError):
    """Raise from a tool to report a failure to the model with exactly this message."""


# ---------------------------------------------------------------------------
# The tool registry
# ---------------------------------------------------------------------------


@attrs.frozen
class _Tool:
    spec: ToolSpec
    function: Callable[..., Any]
    signature: inspect.Signature | None
    run_in_thread: bool
    #: The schema derived from the function (``None``: a schema given by hand).
    derived: Signature | None = None


@attrs.frozen
class _ToolOptions:
    name: str | None
    description: str | None
    parameters: Mapping[str, Any] | None
    run_in_thread: bool
    strict: bool | None


_OPTIONS = "__trio_sampler_tool__"


def _merged(given: _ToolOptions, marked: _ToolOptions | None, thread_unset: bool) -> _ToolOptions:
    """The options of ``register`` with those of ``@tool`` as defaults."""
    if marked is None:
        return given
    return _ToolOptions(
        name=given.name or marked.name,
        description=given.description if given.description is not None else marked.description,
        parameters=given.parameters if given.parameters is not None else marked.parameters,
        run_in_thread=marked.run_in_thread if thread_unset else given.run_in_thread,
        strict=given.strict if given.strict is not None else marked.strict,
    )


_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def tool(
    function: _F,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    run_in_thread: bool = False,
    strict: bool | None = None,
) -> _F: ...


@overload
def tool(
    function: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    run_in_thread: bool = False,
    strict: bool | None = None,
) -> Callable[[_F], _F]: ...


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    run_in_thread: bool = False,
    strict: bool | None = None,
) -> Any:
    """Mark a function as a tool (``@tool`` or ``@tool(name=..., ...)``), its schema
    derived from its signature now, so a function the schema cannot be derived from fails
    where it is defined. :meth:`ToolRegistry.register` takes the options given here; the
    function itself is returned unchanged."""

    def mark(target: Callable[..., Any]) -> Callable[..., Any]:
        if parameters is None:
            signature_of(target, name)  # fails here, saying what to write
        options = _ToolOptions(name, description, parameters, run_in_thread, strict)
        setattr(target, _OPTIONS, options)
        return target

    return mark if function is None else mark(function)


class ToolRegistry:
    """Named local tools the model may call, and the one place they are run.

    Register plain functions or ``async def`` functions; :meth:`specs` gives the
    :class:`ToolSpec` list for the request and :meth:`execute` runs a :class:`ToolCall`.
    The call's JSON arguments are passed as keyword arguments. Synchronous tools run in
    the loop's task unless registered with ``run_in_thread=True`` (use that for anything
    that blocks; the thread is abandoned, not killed, if the loop is cancelled).
    """

    def __init__(self, *, max_result_chars: int = DEFAULT_MAX_RESULT_CHARS) -> None:
        if max_result_chars < 1:
            raise ValueError("max_result_chars must be at least 1")
        self.max_result_chars = max_result_chars
        self._tools: dict[str, _Tool] = {}

    def register(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        run_in_thread: bool | None = None,
        strict: bool | None = None,
    ) -> ToolSpec:
        """Add a tool. ``name`` defaults to the function's name, ``description`` to its
        docstring's first paragraph, ``parameters`` (a JSON Schema object) to the schema
        derived from the signature (see :func:`tool`; options given there are defaults here).

        Raises ``ValueError`` for a name the providers reject (``[A-Za-z0-9_-]{1,64}``) or
        one already registered, ``TypeError`` for a function with parameters and no schema
        to derive (a parameter without annotation, ``**kwargs``): pass ``parameters=``.
        """
        given = _ToolOptions(name, description, parameters, bool(run_in_thread), strict)
        options = _merged(given, getattr(function, _OPTIONS, None), run_in_thread is None)
        name, description, parameters = options.name, options.description, options.parameters
        tool_name: str = name or str(getattr(function, "__name__", ""))
        if not _TOOL_NAME.match(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} is not accepted by the providers: use 1 to 64 "
                "letters, digits, '_' or '-'"
            )
        if tool_name in self._tools:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        if description is None:
            doc = inspect.getdoc(function) or ""
            description = doc.split("\n\n", 1)[0].strip() or None
        derived = signature_of(function, tool_name) if parameters is None else None
        schema = dict(derived.schema) if derived is not None else dict(parameters or {})
        try:
            signature: inspect.Signature | None = inspect.signature(function)
        except (TypeError, ValueError):  # some builtins have none: skip the binding check
            signature = None
        spec = ToolSpec(
            name=tool_name, description=description, parameters=schema, strict=options.strict
        )
        self._tools[tool_name] = _Tool(spec, function, signature, options.run_in_thread, derived)
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        """The registered tools as request specs, in registration order."""
        return tuple(tool.spec for tool in self._tools.values())

    async def execute(self, call: ToolCall) -> ToolResult:
        """Run one tool call. Never raises for a tool's own failure (only ``trio.Cancelled``
        and other ``BaseException`` propagate): every problem becomes an error result."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return self._error(call, f"unknown tool {call.name!r}; available tools: {known}")
        if not call.arguments_complete:
            return self._error(
                call,
                f"the arguments of {call.name!r} are not valid JSON: they were cut off before "
                "they were complete (the stream ended early); the tool was not run, send the "
                "call again",
            )
        try:
            arguments = orjson.loads(call.arguments or "{}")
        except orjson.JSONDecodeError as exc:
            return self._error(
                call,
                f"the arguments of {call.name!r} are not valid JSON ({exc}); send a JSON object",
            )
        if not isinstance(arguments, dict):
            return self._error(
                call, f"the arguments of {call.name!r} must be a JSON object, not {arguments!r:.80}"
            )
        problem = _check_arguments(tool, arguments)
        if problem is None and tool.derived is not None:
            try:
                arguments = tool.derived.arguments(arguments)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            return self._error(call, f"bad arguments for {call.name!r}: {problem}")
        try:
            value = await self._invoke(tool, arguments)
        except ToolError as exc:
            return self._error(call, f"{call.name} failed: {exc}")
        except Exception as exc:
            # A tool's bug must not end the conversation: the model sees what happened.
            return self._error(call, f"{call.name} raised {type(exc).__name__}: {exc}")
        return ToolResult(call_id=call.id, content=self._render(value))

    async def _invoke(self, tool: _Tool, arguments: dict[str, Any]) -> Any:
        function = tool.function
        if tool.run_in_thread:
            return await trio.to_thread.run_sync(lambda: function(**arguments))
        value = function(**arguments)
        if inspect.isawaitable(value):
            value = await value
        return value

    def _render(self, value: Any) -> str:
        if isinstance(value, str):
            text = value
        else:
            try:
                text = orjson.dumps(value, default=str).decode()
            except TypeError:
                text = repr(value)
        if len(text) > self.max_result_chars:
            cut = len(text) - self.max_result_chars
            text = f"{text[: self.max_result_chars]}\n[truncated: {cut} more characters]"
        return text

    def _error(self, call: ToolCall, message: str) -> ToolResult:
        return ToolResult(call_id=call.id, content=message[: self.max_result_chars], is_error=True)


def _check_arguments(tool: _Tool, arguments: dict[str, Any]) -> str | None:
    """A message if the arguments cannot be passed (missing required, unexpected names)."""
    if tool.derived is not None:
        return None  # validated by the model the schema was derived from
    required = tool.spec.parameters.get("required", ())
    missing = [key for key in required if key not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(map(str, missing))}"
    errors = schema_errors(arguments, tool.spec.parameters)
    if errors:
        return "; ".join(errors[:5])
    if tool.signature is not None:
        try:
            tool.signature.bind(**arguments)
        except TypeError as exc:
            return str(exc)
    return None


# ---------------------------------------------------------------------------
# Built-in tools
# ---------------------------------------------------------------------------


class CalculationError(TrioSamplerError, ValueError):
    """The expression is not plain arithmetic, or its result would be too large."""


#: |exponent| allowed in ``**``; with the bit cap below it keeps every step cheap.
MAX_EXPONENT = 10_000
#: Integers (intermediate ones too) may not exceed this many bits (~3000 digits).
MAX_INT_BITS = 10_000
MAX_EXPRESSION_CHARS = 1_000
#: Operators may nest this deep (keeps the evaluator far from the recursion limit).
MAX_NESTING = 100

_BINARY: Mapping[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: Mapping[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise CalculationError("the result is a complex number, which is not supported")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculationError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("the result is not a finite number")
    assert isinstance(value, int | float)
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculationError(f"exponent {exponent} is too large (the limit is {MAX_EXPONENT})")
    # Refuse before computing: an int power's size is about bits(base) * exponent.
    # (The estimate may undershoot by 2x; _checked catches the rest, still cheaply.)
    both_int = isinstance(base, int) and isinstance(exponent, int)
    if both_int and exponent > 0 and max(int(base).bit_length() - 1, 0) * exponent > MAX_INT_BITS:
        raise CalculationError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    return _checked(operator.pow(base, exponent))


def _evaluate(node: ast.AST, depth: int = 0) -> int | float:
    if depth > MAX_NESTING:
        raise CalculationError(f"the expression is nested more than {MAX_NESTING} levels deep")
    depth += 1
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, depth)
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):  # not bool, complex, str, bytes or None
            return _checked(node.value)
        raise CalculationError(f"only numbers are allowed, not {node.value!r}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand, depth)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, depth), _evaluate(node.right, depth)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Name):
        raise CalculationError(f"names are not allowed ({node.id!r}): use numbers only")
    raise CalculationError(
        f"{type(node).__name__} is not allowed: use numbers, + - * / // % **, and parentheses"
    )


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses).

    The expression is parsed with :mod:`ast` and walked node by node; nothing is ever
    passed to ``eval``, and names, calls, attributes and subscripts are refused. Exponents
    and integer sizes are bounded so that no input can take noticeable time or memory.
    Raises :class:`CalculationError` with a message the model can act on.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculationError(f"not a valid arithmetic expression: {exc}") from None
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except (OverflowError, RecursionError) as exc:
        raise CalculationError(f"the calculation overflowed: {exc}") from None
    return repr(value) if isinstance(value, float) else str(value)


#: Files larger than this are returned truncated by ``read_file``.
DEFAULT_MAX_FILE_BYTES = 256 * 1024
#: ``list_directory`` shows at most this many entries.
MAX_DIRECTORY_ENTRIES = 1_000


def _read_capped(path: str, limit: int) -> tuple[bytes, int]:
    # O_NOFOLLOW: a symlink swapped in after the confinement check is refused here.
    # O_NONBLOCK: opening a FIFO must not hang; it is then rejected as not a regular file.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit), info.st_size
    finally:
        os.close(fd)


class _Confined:
    """Resolves tool paths inside ``root``; anything resolving outside is refused."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    async def resolve(self, path: str) -> trio.Path:
        if "\0" in path:
            raise ToolError("the path contains a NUL character")
        # resolve() follows every symlink, so a link pointing out of root is caught too.
        candidate = await (trio.Path(self.root) / path).resolve()
        if not Path(candidate).is_relative_to(self.root):
            raise ToolError(f"{path!r} is outside the allowed directory; use a relative path")
        return candidate

    def display(self, path: trio.Path) -> str:
        relative = Path(path).relative_to(self.root).as_posix()
        return relative or "."


def builtin_tools(
    root: Path | str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> ToolRegistry:
    """A registry with ``read_file``, ``list_directory`` and ``calculate``.

    File tools see only ``root`` and what is under it: paths are resolved (symlinks
    included) and refused when they land outside. ``read_file`` returns at most
    ``max_file_bytes`` bytes of a regular UTF-8 text file (binary files are refused).
    """
    confined = _Confined(Path(root))
    registry = ToolRegistry()

    async def read_file(path: str) -> str:
        """Read a text file under the working directory."""
        target = await confined.resolve(path)
        if await target.is_dir():
            raise ToolError(f"{path!r} is a directory; use list_directory")
        try:
            data, size = await trio.to_thread.run_sync(
                _read_capped, os.fspath(target), max_file_bytes
            )
        except FileNotFoundError:
            raise ToolError(f"no such file: {path!r}") from None
        except PermissionError:
            raise ToolError(f"permission denied: {path!r}") from None
        if b"\0" in data:
            raise ToolError(f"{path!r} looks like a binary file; only text files can be read")
        text = data.decode("utf-8", errors="replace")
        if size > len(data):
            text += f"\n[truncated: showing the first {len(data)} of {size} bytes]"
        return text

    async def list_directory(path: str = ".") -> str:
        """List the entries of a directory under the working directory."""
        target = await confined.resolve(path)
        if not await target.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        names = sorted(os.fspath(p.name) for p in await target.iterdir())
        lines = []
        for name in names[:MAX_DIRECTORY_ENTRIES]:
            entry = target / name
            suffix = "@" if await entry.is_symlink() else "/" if await entry.is_dir() else ""
            lines.append(name + suffix)
        if len(names) > MAX_DIRECTORY_ENTRIES:
            lines.append(f"[{len(names) - MAX_DIRECTORY_ENTRIES} more entries not shown]")
        header = f"{confined.display(target)}: {len(names)} entries"
        return "\n".join([header, *lines])

    def calculator(expression: str) -> str:
        try:
            return calculate(expression)
        except CalculationError as exc:
            raise ToolError(str(exc)) from None

    path_schema = {"type": "string", "description": "A path relative to the working directory."}
    registry.register(
        read_file,
        parameters={"type": "object", "properties": {"path": path_schema}, "required": ["path"]},
    )
    registry.register(
        list_directory,
        parameters={"type": "object", "properties": {"path": path_schema}, "required": []},
    )
    registry.register(
        calculator,
        name="calculate",
        description=(
            "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."
        ),
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (2 + 3) * 4"}},
            "required": ["expression"],
        },
    )
    return registry
