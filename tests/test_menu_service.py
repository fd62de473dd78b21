"""The menu-service example: its demo (a real, short run), its HTTP API, its usage errors."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from menu_service import cli  # noqa: E402
from menu_service.infra import make_engine, seed  # noqa: E402


def _row(output: str, mode: str) -> dict[str, float]:
    match = re.search(rf"^\| {mode}\s*\|(.*)\|$", output, re.M)
    assert match, f"no table row for {mode} in:\n{output}"
    cells = [c.strip() for c in match[1].split("|")]
    names = ["requests", "queries", "writes", "per_write", "stale", "p50", "p99"]
    return {n: float(c) for n, c in zip(names, cells, strict=True)}


@pytest.mark.slow
def test_demo_runs_both_modes_and_protects_the_database(redis_url: str, tmp_path: Path) -> None:
    chart = tmp_path / "demo.png"
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("DATABASE_URL", None)  # the embedded SQLite default
    command = [sys.executable, str(EXAMPLES / "menu_service"), "demo", "--processes", "2"]
    command += ["--threads", "4", "--seconds", "2", "--write-every", "0.4", "--chart", str(chart)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "[unprotected] done" in out
    assert "[ cacheguard] done" in out
    plain, guarded = _row(out, "unprotected"), _row(out, "cacheguard")
    assert guarded["writes"] >= 2
    assert guarded["stale"] == 0
    # One load when cold, then one per invalidation.
    assert guarded["queries"] == guarded["writes"] + 1
    assert plain["queries"] > guarded["queries"]
    assert "error in" not in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "chart skipped" in out


def _tables_and_rows(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table: conn.execute(sa.text(f'SELECT count(*) FROM "{table}"')).scalar_one()
                for table in sa.inspect(conn).get_table_names()
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", [["demo", "--no-chart"], ["serve", "--port", "0"]])
def test_a_database_of_yours_that_holds_tables_is_refused_without_reset(
    command: list[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'yours.sqlite3'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
        conn.execute(sa.text("INSERT INTO customers VALUES (1, 'kept')"))
    engine.dispose()
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("REDIS_URL", redis_url)

    def went_on(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("it went on past the check")

    monkeypatch.setattr(cli, "seed", went_on)  # serve
    monkeypatch.setattr(cli.demo, "run_mode", went_on)
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert "already holds tables (customers)" in err
    assert "--reset" in err
    assert _tables_and_rows(url) == {"customers": 1}  # untouched, nothing created


def test_a_database_holding_only_the_demos_own_table_is_used_without_reset(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table an earlier run left is the demo's own: no --reset needed."""
    url = f"sqlite:///{tmp_path / 'yours.sqlite3'}"
    engine = make_engine(url)
    seed(engine, 3)  # what an earlier run leaves
    engine.dispose()
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    ran: list[str] = []

    def run_mode(mode: str, *args: Any, **kwargs: Any) -> Any:
        ran.append(mode)
        return cli.demo.RunResult(mode)

    monkeypatch.setattr(cli.demo, "run_mode", run_mode)
    assert cli.main(["demo", "--no-chart", "--only", "cacheguard"]) == 0
    assert ran == ["cacheguard"]  # it went on


@pytest.mark.slow
def test_with_reset_the_demo_fills_only_its_own_table(redis_url: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'yours.sqlite3'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE menu (id INTEGER PRIMARY KEY, name TEXT)"))
        conn.execute(sa.text("INSERT INTO menu VALUES (1, 'a table of yours named menu')"))
    engine.dispose()
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": url}
    command = [sys.executable, str(EXAMPLES / "menu_service"), "demo", "--reset", "--no-chart"]
    command += ["--processes", "1", "--threads", "2", "--seconds", "0.5", "--only", "cacheguard"]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert _tables_and_rows(url) == {"menu": 1, "cacheguard_demo_menu": 40}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runner", "cwd"),
    [
        # The README's form, from anywhere: the folder is run as a script.
        ([str(EXAMPLES / "menu_service")], None),
        # As a module of the repository root (examples/ is a namespace package).
        (["-m", "examples.menu_service"], ROOT),
    ],
    ids=["folder", "module"],
)
def test_the_demo_runs_as_a_folder_and_as_a_module(
    runner: list[str], cwd: Path | None, redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("DATABASE_URL", None)
    command = [sys.executable, *runner, "demo", "--no-chart", "--only", "cacheguard"]
    command += ["--processes", "1", "--threads", "2", "--seconds", "0.5"]
    done = subprocess.run(
        command,
        env=env,
        cwd=cwd or tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[ cacheguard] done" in done.stdout
    assert _row(done.stdout, "cacheguard")["stale"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--processes", "0"], "must be > 0"),
        (["demo", "--seconds", "soon"], "is not a number"),
        (["demo", "--only", "both"], "invalid choice"),
        (["serve", "--port", "70000"], "must be >= 0 and <= 65535"),
        ([], "required"),
    ],
)
def test_bad_options_get_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert message in err


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_help_documents_every_option_with_its_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        command
    ]
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help"
        if action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in out, action.option_strings
    if command == "serve":
        assert "(default: 127.0.0.1)" in out
        assert "(default: 8000)" in out


def test_the_table_lines_up_and_defines_a_stale_read() -> None:
    from menu_service.demo import STALE_READ, RunResult, format_table

    runs = [
        RunResult("unprotected", 42609, 313, 5877, 9, [1.18, 9.93]),
        RunResult("cacheguard", 62679, 10, 0, 9, [1.52, 3.98]),
    ]
    table, _, definition = format_table(runs).partition("\n\n")
    lines = table.splitlines()
    assert len(lines) == 4
    assert len({len(line) for line in lines}) == 1  # every row as wide as the heading
    for line in lines:  # and every column boundary in the same place
        assert [i for i, c in enumerate(line) if c == "|"] == [
            i for i, c in enumerate(lines[0]) if c == "|"
        ]
    assert "| unprotected |    42609 |" in lines[2]
    assert definition == STALE_READ
    assert "before the read began" in STALE_READ


@pytest.mark.parametrize(
    ("cacheguard_p50", "explained"), [(1.52, True), (1.18, False), (0.9, False)]
)
def test_a_higher_median_with_cacheguard_is_explained(
    cacheguard_p50: float, explained: bool
) -> None:
    """The table says why cacheguard's median read is the slower one, and only when it is."""
    from menu_service.demo import SHARED_GET, STALE_READ, RunResult, format_table

    runs = [  # one latency each: it is the median
        RunResult("unprotected", 42609, 313, 5877, 9, [1.18]),
        RunResult("cacheguard", 62679, 10, 0, 9, [cacheguard_p50]),
    ]
    notes = format_table(runs).split("\n\n")[1:]
    assert notes == ([STALE_READ, SHARED_GET] if explained else [STALE_READ])
    assert SHARED_GET.startswith("p50 is higher with cacheguard because")
    # One run alone has nothing to compare with.
    assert format_table(runs[1:]).split("\n\n")[1:] == [STALE_READ]
