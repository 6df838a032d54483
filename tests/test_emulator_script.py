"""Script parsing, the per-scenario fault schedule, schema-driven arguments, the CLI."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from trio_sampler.emulator import ScriptError, parse_script
from trio_sampler.emulator._faults import FaultBook
from trio_sampler.emulator._reply import chunk_text, minimal_value
from trio_sampler.emulator._script import DropFault, PingsFault, StallFault, StatusFault


def test_full_script_parses() -> None:
    script = parse_script(
        '{"text":"t","reasoning":"r","tool_calls":[{"name":"f","arguments":{"a":1}}],'
        '"hosted_tool":{"name":"web_search","query":"q"},"chunk_chars":3,"delay_ms":5,'
        '"stop":"length","usage":{"output_tokens":9},"scenario":"s",'
        '"faults":[{"type":"status","status":503,"retry_after":1,"times":2},'
        '{"type":"pings","count":2,"interval_ms":10}]}'
    )
    assert script.text == "t" and script.chunk_chars == 3 and script.stop == "length"
    assert script.faults == (StatusFault(503, 1.0, None, 2), PingsFault(2, 10, None))
    assert parse_script(None) == parse_script("") == parse_script("  ")


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '{"tool_calls":[{"name":""}]}',
        '{"usage":{"tokens":1}}',
        '{"hosted_tool":{"name":"code"}}',
        '{"faults":[{"type":"status","status":200}]}',
        '{"faults":[{"type":"stall","after_events":1,"seconds":-1}]}',
        '{"faults":[{"type":"slow_first_token"}]}',
        '{"faults":[{"type":"status","status":503,"from_s":5,"until_s":5}]}',
        '{"faults":[{"type":"status","status":503,"until_s":20,"period_s":10}]}',
        '{"accepts_prefill":"no"}',
        '{"context_window":0}',
        '{"faults":[{"type":"drop","after_events":1,"extra":1}]}',
        '{"delay_ms":-1}',
        '{"chunk_chars":0}',
    ],
)
def test_bad_scripts_are_rejected(raw: str) -> None:
    with pytest.raises(ScriptError, match="x-emulator-script"):
        parse_script(raw)


def test_fault_schedule_applies_in_order_per_scenario() -> None:
    book = FaultBook()
    faults = (StatusFault(503, times=2), DropFault(1, times=1), StallFault(0, 1.0, times=1))
    plans = [book.plan("s", faults) for _ in range(4)]
    assert [p.outcome for p in plans] == [faults[0], faults[0], faults[1], None]
    assert [len(p.stalls) for p in plans] == [1, 0, 0, 0]
    assert [p.attempt for p in plans] == [1, 2, 3, 4]
    assert book.plan("other", faults).outcome == faults[0]  # counted per scenario
    assert (
        book.plan("forever", (StatusFault(500),)).outcome
        == book.plan("forever", (StatusFault(500),)).outcome
    )


def test_minimal_value_follows_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 12},
            "count": {"type": "integer", "minimum": 3},
            "mode": {"enum": ["fast", "slow"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "nested": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            },
            "optional": {"type": "string"},
            "maybe": {"type": ["null", "number"]},
        },
        "required": ["name", "count", "mode", "tags", "nested", "maybe"],
    }
    value = minimal_value(schema, random.Random(0))
    assert set(value) == {"name", "count", "mode", "tags", "nested", "maybe"}
    assert len(value["name"]) >= 12 and value["count"] == 3 and value["mode"] == "fast"
    assert len(value["tags"]) == 1 and value["nested"] == {"ok": True}
    assert isinstance(value["maybe"], float)


def test_chunk_text() -> None:
    assert chunk_text("ab cd  ef", None) == ["ab", " cd", "  ef"]
    assert chunk_text("abcdefg", 3) == ["abc", "def", "g"]
    assert chunk_text("", 3) == []


def test_cli_prints_listening_line_first() -> None:
    code = (
        "from trio_sampler.emulator import run_serve; raise SystemExit(run_serve('127.0.0.1', 0))"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:") and int(line.rsplit(":", 1)[1]) > 0
    finally:
        process.terminate()
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


def test_after_tool_result_is_parsed_and_checked() -> None:
    from trio_sampler.emulator import ScriptError, parse_script

    script = parse_script('{"after_tool_result": {"text": "done", "reasoning": "ok"}}')
    assert script.after_tool_result is not None
    assert script.after_tool_result.text == "done"
    with pytest.raises(ScriptError, match="after_tool_result: unknown key"):
        parse_script('{"after_tool_result": {"txt": "x"}}')
    with pytest.raises(ScriptError, match="after_tool_result must be an object"):
        parse_script('{"after_tool_result": "x"}')


def test_fault_book_is_bounded_and_forgets() -> None:
    from trio_sampler.emulator._faults import MAX_SCENARIOS, FaultBook
    from trio_sampler.emulator._script import StatusFault

    book = FaultBook()
    faults = (StatusFault(503, times=1),)
    assert book.plan("a", faults).outcome is not None
    assert book.plan("a", faults).outcome is None  # used up
    book.forget("a")
    assert book.plan("a", faults).outcome is not None  # afresh
    for i in range(MAX_SCENARIOS + 10):
        book.plan(f"s{i}", faults)
    assert book.attempts("s0") == 0  # the oldest were forgotten
    assert book.attempts(f"s{MAX_SCENARIOS + 9}") == 1
