"""The menu-service example: its demo (a real, short run), its HTTP API, its usage errors."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from cacheguard.sqlalchemy import track_models
from tests.helpers import client_for, make_guard

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from menu_service import cli  # noqa: E402
from menu_service.infra import QueryLog, make_engine, seed  # noqa: E402
from menu_service.models import Menu  # noqa: E402
from menu_service.repository import MenuRepository  # noqa: E402
from menu_service.server import make_server  # noqa: E402


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


@pytest.mark.parametrize("command", [["demo", "--no-chart"], ["serve", "--port", "8000"]])
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--processes", "0"], "must be > 0"),
        (["demo", "--seconds", "soon"], "is not a number"),
        (["demo", "--only", "both"], "invalid choice"),
        (["serve", "--port", "70000"], "must be > 0 and <= 65535"),
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


@pytest.fixture
def api(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[str]:
    engine = make_engine(f"sqlite:///{tmp_path / 'menu.sqlite3'}")
    seed(engine, 5)
    queries = QueryLog(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    guard = make_guard(client_for(redis_url), namespace)
    tracker = track_models(guard, sessions, [Menu])
    server = make_server(MenuRepository(guard, sessions), queries, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    tracker.remove()
    engine.dispose()


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_api_reads_through_the_cache_and_writes_through_the_hooks(api: str) -> None:
    status, menus = _call(f"{api}/menus")
    assert status == 200
    assert [m["id"] for m in menus] == [1, 2, 3, 4, 5]
    for _ in range(3):
        _call(f"{api}/menus")
    assert _call(f"{api}/stats")[1]["db_queries"] == 1  # one load, then hits
    status, updated = _call(f"{api}/menus/2", "PUT", {"name": "Soups", "sort": 9})
    assert status == 200
    assert updated["name"] == "Soups"
    assert _call(f"{api}/menus/2") == (200, {**updated})
    menus = _call(f"{api}/menus")[1]
    assert [m["name"] for m in menus if m["id"] == 2] == ["Soups"]
    assert menus[-1]["id"] == 2  # sorted by the new sort value
    stats = _call(f"{api}/stats")[1]
    assert stats["loads"] >= 3


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("GET", "/menus/999", None, 404, "no menu 999"),
        ("GET", "/nowhere", None, 404, "no route"),
        ("PUT", "/menus/999", {"name": "x"}, 404, "no menu 999"),
        ("PUT", "/menus/1", b"{not json", 400, "not JSON"),
        ("PUT", "/menus/1", {"colour": "red"}, 400, "unknown fields"),
        ("PUT", "/menus/1", {"sort": "high"}, 400, "sort must be int"),
        ("PUT", "/menus/1", {"name": " "}, 400, "must not be empty"),
        ("PUT", "/menus/1", [], 400, "JSON object"),
    ],
)
def test_http_api_errors_are_json(
    api: str, method: str, path: str, body: Any, status: int, message: str
) -> None:
    got, reply = _call(f"{api}{path}", method, body)
    assert got == status
    assert message in reply["error"]
    assert _call(f"{api}/menus/1")[1]["name"] == "Menu 1 #0"  # nothing changed


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
