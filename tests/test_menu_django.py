"""The Django menu example (examples/menu_django): its demo, run for real on SQLite and
on PostgreSQL (``DATABASE_URL``), its JSON views, and its database settings."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from menu_django.database import database_from_url  # noqa: E402

RUN_TIMEOUT = 240  # seconds; the short demo of the test takes about 15 here
SLOW_BUILD = 2.0  # the stale scene's slow reader waits this long at most for the commit


def _launch(args: list[str], redis_url: str, database_url: str) -> subprocess.CompletedProcess[str]:
    """``python -m examples.menu_django ARGS`` from the repository root, on the test Redis
    and the given database, with a key prefix of its own (deleted at its end)."""
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url}
    env.pop("MENU_DJANGO_NAMESPACE", None)
    return subprocess.run(
        [sys.executable, "-m", "examples.menu_django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


@pytest.fixture
def database_url(db_url: str) -> str:
    """SQLite in a temporary file, and PostgreSQL when ``DATABASE_URL`` names one (in
    the SQLAlchemy form, as CI sets it: the example reads it as it is): a database of
    the example's tests' own beside it, made on first use (``<name>_menu_django``:
    copies of the suite run beside each other on databases of their own)."""
    if db_url.startswith("sqlite"):
        return db_url
    import psycopg

    parts = urlsplit(db_url)
    name = f"{parts.path.lstrip('/') or 'postgres'}_menu_django"
    plain = urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
    with psycopg.connect(plain, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if found.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # a race: made
                connection.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


class TableOfYours:
    """A table named as Django would name the example's (``menus_menu``), holding a
    row: the demo must leave it as it is."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        if database_url.startswith("sqlite"):
            import sqlite3

            self.path = database_url.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(self.path)) as connection, connection:
                connection.execute("CREATE TABLE menus_menu (id INTEGER, note TEXT)")
                connection.execute("INSERT INTO menus_menu VALUES (1, 'yours')")
        else:
            with self._postgres() as connection:
                connection.execute("DROP TABLE IF EXISTS menus_menu")
                connection.execute("CREATE TABLE menus_menu (id INTEGER, note TEXT)")
                connection.execute("INSERT INTO menus_menu VALUES (1, 'yours')")

    def _postgres(self) -> Any:
        import psycopg

        parts = urlsplit(self.url)
        plain = urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
        return psycopg.connect(plain, autocommit=True)

    def rows(self) -> list[tuple[Any, ...]]:
        if self.url.startswith("sqlite"):
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.path)) as connection:
                return list(connection.execute("SELECT id, note FROM menus_menu"))
        with self._postgres() as connection:
            return list(connection.execute("SELECT id, note FROM menus_menu"))

    def drop(self) -> None:
        if not self.url.startswith("sqlite"):
            with self._postgres() as connection:
                connection.execute("DROP TABLE IF EXISTS menus_menu")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_demo_one_query_per_stampede_and_no_stale_read(redis_url: str, database_url: str) -> None:
    yours = TableOfYours(database_url)
    command = ["demo", "--processes", "2", "--threads", "4", "--menus", "8"]
    command += ["--reads-after", "5", "--slow-build", str(SLOW_BUILD), "--json"]
    try:
        done = _launch(command, redis_url, database_url)
        assert done.returncode == 0, done.stderr[-3000:]
        assert yours.rows() == [(1, "yours")]  # the demo touched only its own table
    finally:
        yours.drop()
    summary = json.loads(done.stdout)
    assert summary["database"] == ("sqlite" if database_url.startswith("sqlite") else "postgresql")

    guarded, plain = summary["stampede"]["cacheguard"], summary["stampede"]["django"]
    for run in (guarded, plain):
        assert run["callers"] == 8
        assert run["served"] == 8, run["errors"]
        assert run["errors"] == []
    assert guarded["db_queries"] == 1  # one load across the 2 processes x 4 threads
    assert plain["db_queries"] >= 1

    guarded, plain = summary["stale"]["cacheguard"], summary["stale"]["django"]
    for run in (guarded, plain):
        assert run["errors"] == []
        assert run["reader_got"] == 0  # the slow reader queried before the write
        assert run["reads_after"] == 5
    # cacheguard: no read after the commit sees the old list; the first one loads it anew.
    assert guarded["stale_reads"] == 0
    assert guarded["cached_after"] == 1
    assert guarded["db_queries_after"] == 1
    # Django's backend: the slow reader stored the old list after the commit (when the
    # write committed well within the reader's build, which it does unless the machine
    # stalled for seconds), and every read after it is stale.
    if plain["writer_waited_ms"] < SLOW_BUILD * 1000 / 2:
        assert plain["stale_reads"] == 5
        assert plain["db_queries_after"] == 0


_VIEWS_SCRIPT = textwrap.dedent(
    """
    import json
    from django.test import Client
    from menu_django.menus.demo import prepare_table

    prepare_table(6)  # owners: menu i belongs to owner-(i % 3)
    client = Client()
    seen = {}

    def get(path):
        response = client.get(path)
        return response.status_code, response.json()

    seen["list"] = get("/menus/")
    seen["detail"] = get("/menus/4/")
    seen["owner1_before"] = get("/menus/?owner=owner-1")
    seen["owner2_before"] = get("/menus/?owner=owner-2")
    answer = client.post("/menus/4/", json.dumps({"owner": "owner-2", "price": 990}),
                         content_type="application/json")
    seen["update"] = (answer.status_code, answer.json())
    seen["detail_after"] = get("/menus/4/")
    seen["owner1_after"] = get("/menus/?owner=owner-1")
    seen["owner2_after"] = get("/menus/?owner=owner-2")
    seen["list_after"] = get("/menus/")
    seen["missing"] = get("/menus/99/")
    bad = client.post("/menus/4/", "{\\"price\\": -1}", content_type="application/json")
    seen["bad"] = (bad.status_code, bad.json())
    unknown = client.post("/menus/4/", "{\\"colour\\": 1}", content_type="application/json")
    seen["unknown"] = (unknown.status_code, unknown.json())
    seen["delete"] = (client.delete("/menus/4/").status_code, None)
    print("VIEWS " + json.dumps(seen))
    """
)


def _ids(answer: Any) -> list[int]:
    return [menu["id"] for menu in answer[1]["menus"]]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_views_read_through_the_cache_and_writes_refresh_every_key(
    redis_url: str, database_url: str
) -> None:
    done = _launch(["shell", "-c", _VIEWS_SCRIPT], redis_url, database_url)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("VIEWS "))
    seen = json.loads(line.removeprefix("VIEWS "))
    assert seen["list"][0] == 200
    assert _ids(seen["list"]) == [1, 2, 3, 4, 5, 6]
    assert seen["detail"] == [200, {"id": 4, "name": "Menu 4 #0", "price": 600, "owner": "owner-1"}]
    assert _ids(seen["owner1_before"]) == [1, 4]
    assert _ids(seen["owner2_before"]) == [2, 5]
    changed = {"id": 4, "name": "Menu 4 #0", "price": 990, "owner": "owner-2"}
    assert seen["update"] == [200, changed]
    # Each of the row's keys was read (cached) before the write and is fresh after it:
    # the menu, the list, and both owners' lists (the old owner's and the new one's).
    assert seen["detail_after"] == [200, changed]
    assert _ids(seen["owner1_after"]) == [1]
    assert _ids(seen["owner2_after"]) == [2, 4, 5]
    assert seen["list_after"][1]["menus"][3] == changed
    assert seen["missing"][0] == 404
    assert seen["bad"][0] == 400
    assert "price" in seen["bad"][1]["detail"]
    assert seen["unknown"] == [400, {"detail": "unknown field(s): colour"}]
    assert seen["delete"][0] == 405


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql+psycopg://postgres@127.0.0.1:5432/test",
            {"NAME": "test", "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"},
        ),
        (
            "postgres://u%40x:p%2Fw@db.example:6543/menus?sslmode=require",
            {"NAME": "menus", "USER": "u@x", "PASSWORD": "p/w", "PORT": "6543"},
        ),
        ("postgresql://localhost/menus", {"NAME": "menus", "HOST": "localhost", "PORT": ""}),
    ],
)
def test_postgresql_urls_in_either_form(url: str, expected: dict[str, str]) -> None:
    database = database_from_url(url)
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert {k: database[k] for k in expected} == expected
    if "sslmode" in url:
        assert database["OPTIONS"] == {"sslmode": "require"}


def test_sqlite_urls_name_a_file_and_other_schemes_are_refused() -> None:
    assert database_from_url("sqlite:////tmp/x/menu.sqlite3")["NAME"] == "/tmp/x/menu.sqlite3"
    assert database_from_url("sqlite:///menu.sqlite3")["NAME"] == "menu.sqlite3"
    for url in ("sqlite://", "sqlite:///:memory:"):
        with pytest.raises(ImproperlyConfigured, match="file, not memory"):
            database_from_url(url)
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        database_from_url("mysql://root@localhost/test")
