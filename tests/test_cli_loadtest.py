"""``trio-sampler loadtest`` as a user runs it: a real emulator on loopback, subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import trio

from trio_sampler.cli import _loadtest, main
from trio_sampler.testing import EmulatorFixture

PACED = orjson.dumps(
    {"ignore_eos": True, "chunk_chars": 4, "first_token_ms": 30, "token_interval_ms": 5}
).decode()


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "LOADTEST_KEY": "sk-test-key", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "trio_sampler.cli", "loadtest", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
        env=env,
        text=True,
    )


def _target(emulator: EmulatorFixture) -> list[str]:
    return [
        "--base-url", emulator.base_url, "--model", "gpt-4o-mini",
        "--api-key-env", "LOADTEST_KEY", "--header", f"x-emulator-script:{PACED}",
    ]  # fmt: skip


async def test_sweep_with_two_workers_writes_json_csv_and_html(
    emulator: EmulatorFixture, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = [
        *_target(emulator),
        "--concurrency", "1,4", "--requests", "12", "--output-tokens", "6",
        "--workers", "2", "--slo-ttft", "5000", "--no-progress",
        "--json", f"{out}.json", "--csv", f"{out}.csv", "--html", f"{out}.html",
    ]  # fmt: skip
    result = await trio.to_thread.run_sync(lambda: run(*args))
    assert result.returncode == 0, result.stderr
    assert "C=1" in result.stdout and "C=4" in result.stdout
    _check_outputs(out)
    second = tmp_path / "second.json"
    await trio.to_thread.run_sync(lambda: second.write_bytes(Path(f"{out}.json").read_bytes()))
    # compare and report read it back.
    compared = await trio.to_thread.run_sync(
        lambda: run("compare", f"{out}.json", str(second), "--html", str(tmp_path / "c.html"))
    )
    assert compared.returncode == 0, compared.stderr
    assert "TTFT p99" in compared.stdout and "+0.0%" in compared.stdout
    report = await trio.to_thread.run_sync(
        lambda: run("report", f"{out}.json", "--html", str(tmp_path / "r.html"))
    )
    assert report.returncode == 0
    _check_reports(tmp_path)


def _check_outputs(out: Path) -> None:
    data = orjson.loads(Path(f"{out}.json").read_bytes())
    assert data["schema"] == "trio-sampler.loadtest/2"
    assert data["workers"] == 2
    for stage in data["stages"]:
        # Both workers' requests, merged: 12 measured, each generating 6 tokens.
        assert stage["requests"]["completed"] == 12
        assert stage["tokens"]["output"] == 72
        assert len(stage["client"]["workers"]) == (1 if stage["load"]["streams"] == 1 else 2)
        assert stage["latency_ms"]["ttft"]["count"] == 12
        assert stage["latency_ms"]["ttft"]["p50"] >= 30
    assert Path(f"{out}.csv").read_text().count("\n") == 3
    html = Path(f"{out}.html").read_text()
    assert html.count("<svg") == 3 and "<script" not in html
    assert "sk-test-key" not in Path(f"{out}.json").read_text() + html


def _check_reports(folder: Path) -> None:
    assert (folder / "c.html").read_text().count("<svg") == 3
    assert (folder / "r.html").read_text().count("<svg") == 3


async def test_open_loop_from_the_command_line(emulator: EmulatorFixture, tmp_path: Path) -> None:
    path = tmp_path / "rate.json"
    args = [
        *_target(emulator), "--rate", "20", "--arrivals", "constant", "--duration", "1",
        "--output-tokens", "4", "--no-progress", "--json", str(path),
    ]  # fmt: skip
    result = await trio.to_thread.run_sync(lambda: run(*args))
    assert result.returncode == 0, result.stderr
    [stage] = orjson.loads(await trio.Path(path).read_bytes())["stages"]
    assert stage["load"] == {
        "kind": "rate", "per_second": 20.0, "arrivals": "constant", "max_in_flight": None
    }  # fmt: skip
    assert 18 <= stage["requests"]["started"] <= 21


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "every value must be positive"),
        (["--concurrency", "a,b"], "comma-separated list"),
        (["--rate", "1", "--concurrency", "2"], "not allowed with argument"),
        (["--header", "nocolon"], "write NAME:VALUE"),
        (["--rate", "1", "--ramp", "2"], "drop --ramp"),
        (["--ramp", "-1"], "ramp_s must be a finite number of seconds"),
        (["--extra-body", "[1]"], "JSON object"),
        (["--input-tokens", "lots"], "uniform:LOW:HIGH"),
        (["--api-key-env", "LOADTEST_UNSET_VARIABLE"], "empty or unset"),
        (["--dataset", "missing.jsonl"], "missing.jsonl"),
        (["--fail-if", "ttft.p99"], "write METRIC>VALUE, e.g. ttft.p99>500ms"),
        (["--memory-cap", "lots"], "write a size such as 1GiB, 512MiB or 65536"),
        (["--memory-cap", "0"], "at least one byte"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["loadtest", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *args]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = int(exc.code or 0)
    assert status == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("text", "size"), [("1GiB", 1 << 30), ("512MiB", 512 << 20), ("65536", 65536), ("none", None)]
)
def test_memory_cap_sizes(text: str, size: int | None) -> None:
    assert _loadtest._size(text) == size


def test_bad_results_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"schema": "something/1"}')
    result = run("compare", str(path), str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "trio-sampler loadtest: not a trio-sampler loadtest result (no 'schema' key)"
    )


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "hdrh" else real(name, *a)
    )
    assert _loadtest._missing_extra() == (
        "needs the loadtest extra: pip install 'trio-sampler[loadtest]' (hdrh is not installed)"
    )


def test_against_a_dead_server_it_exits_1_listing_the_error_kinds(tmp_path: Path) -> None:
    # Port 9 (discard) has no listener on loopback: every connection is refused.
    path = tmp_path / "dead.json"
    result = run(
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "2",
        "--requests", "6", "--no-progress", "--json", str(path),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "trio-sampler loadtest: failed: C=2: every request failed (transport 6)" in result.stderr
    # The table lists the error kinds with an example message.
    assert "transport" in result.stdout and "6" in result.stdout
    stage = orjson.loads(path.read_bytes())["stages"][0]
    assert stage["requests"]["errors"] == {"transport": 6}
    assert stage["requests"]["error_examples"]["transport"]


async def test_fail_if_exits_1_with_a_one_line_reason(emulator: EmulatorFixture) -> None:
    args = [
        *_target(emulator), "--concurrency", "1", "--requests", "2", "--output-tokens", "3",
        "--no-progress", "--fail-if", "ttft.p50>1ms", "--fail-if", "error_rate>1%",
    ]  # fmt: skip
    result = await trio.to_thread.run_sync(lambda: run(*args))
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "fail" in line]
    assert line.startswith("trio-sampler loadtest: failed: C=1: ttft.p50 ")
    assert line.endswith(" ms (ttft.p50>1ms)")


@pytest.mark.parametrize(
    ("given", "installed", "transport"),
    [
        ([], True, "httptools"),
        ([], False, "direct"),
        (["--http-transport", "direct"], True, "direct"),
        (["--http-transport", "httpx"], True, "httpx"),
    ],
)
def test_the_samplers_run_on_httptools_where_installed_unless_told(
    given: list[str], installed: bool, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from trio_sampler.cli import build_parser

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: real(name, *a) if installed or name != "httptools" else None,
    )
    argv = ["loadtest", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *given]
    test = _loadtest._build(build_parser().parse_args(argv))
    assert test.config.http_transport == transport
