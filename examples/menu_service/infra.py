"""Where the service's Redis and database come from, and how queries are counted.

``REDIS_URL`` / ``DATABASE_URL`` point at real servers. Without them the service
runs on a bare machine: a throwaway ``redis-server`` on a free port if the
binary is installed, else fakeredis's TCP server, and a SQLite file.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from cacheguard.integrations.sqlalchemy import sqlite_async_engine, sqlite_engine
from cacheguard.testing import redis_server

from .models import Menu


@dataclass(frozen=True)
class Backends:
    redis_url: str
    redis_kind: str  # "url", "redis-server" or "fakeredis"
    database_url: str
    database_is_ours: bool  # the throwaway SQLite file, not a DATABASE_URL


class DatabaseNotEmpty(Exception):
    """A database given by DATABASE_URL already holds tables, and --reset was not given."""


@contextmanager
def backends(database_url: str | None = None) -> Iterator[Backends]:
    """Redis and a database for the service (embedded ones unless configured)."""
    url = database_url or os.environ.get("DATABASE_URL")
    with redis_server() as endpoint, tempfile.TemporaryDirectory(prefix="menu-service-") as tmp:
        yield Backends(
            redis_url=endpoint.url,
            redis_kind=endpoint.kind,
            database_url=url or f"sqlite:///{Path(tmp) / 'menu.sqlite3'}",
            database_is_ours=not url,
        )


def check_database(found: Backends, *, reset: bool) -> None:
    """Refuse a database of the user's that holds any table but the demo's own
    (``cacheguard_demo_menu``, left by an earlier run), unless ``reset``: the demo
    then drops and fills only its own table."""
    if found.database_is_ours or reset:
        return
    engine = sa.create_engine(found.database_url)
    try:
        tables = sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    tables = [t for t in tables if t != Menu.__tablename__]  # its own, from an earlier run
    if tables:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise DatabaseNotEmpty(
            f"DATABASE_URL points at a database that already holds tables ({listed}). "
            f"The demo (re)creates and fills only its own table, {Menu.__tablename__}, "
            "and never touches the others; run again with --reset to let it do so here."
        )


def make_engine(database_url: str) -> sa.Engine:
    if database_url.startswith("sqlite"):
        return sqlite_engine(database_url, pool_size=20, max_overflow=20)
    return sa.create_engine(database_url, pool_size=20, max_overflow=20)


def async_database_url(database_url: str) -> str:
    """The asyncio driver's URL for the same database: SQLite through aiosqlite,
    PostgreSQL through psycopg 3 (which has both APIs)."""
    scheme, sep, rest = database_url.partition("://")
    drivers = {
        "sqlite": "sqlite+aiosqlite",
        "sqlite+aiosqlite": "sqlite+aiosqlite",
        "postgresql": "postgresql+psycopg",
        "postgresql+psycopg": "postgresql+psycopg",
    }
    if not sep or scheme not in drivers:
        raise ValueError(
            f"the service needs a database it can reach both ways (sync and asyncio), "
            f"not {scheme or database_url!r}: use sqlite:///... or postgresql+psycopg://..."
        )
    return f"{drivers[scheme]}://{rest}"


def make_async_engine(database_url: str) -> AsyncEngine:
    url = async_database_url(database_url)
    if url.startswith("sqlite"):
        return sqlite_async_engine(url, pool_size=20, max_overflow=20)
    return create_async_engine(url, pool_size=20, max_overflow=20)


def seed(engine: sa.Engine, menus: int) -> None:
    """(Re)create the demo's own table (only it: see check_database): ``menus`` rows,
    a few top-level, the rest below them."""
    table = Menu.__table__
    assert isinstance(table, sa.Table)
    table.drop(engine, checkfirst=True)
    table.create(engine)
    with Session(engine) as session, session.begin():
        for i in range(1, menus + 1):
            parent = None if i <= 4 else 1 + (i % 4)
            session.add(Menu(id=i, name=f"Menu {i} #0", parent_id=parent, sort=i, url=f"/menu/{i}"))


class QueryLog:
    """Counts the SELECTs engines send to the menu table, with their times."""

    def __init__(self, engine: sa.Engine, *, timer: Any = time.monotonic) -> None:
        self.times: list[float] = []
        self._timer = timer
        self._mutex = threading.Lock()
        self.watch(engine)

    def watch(self, engine: sa.Engine) -> None:
        """Count this engine's queries too (an ``AsyncEngine``'s ``sync_engine``)."""
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = statement.lstrip().upper()
        if text.startswith("SELECT") and "MENU" in text:
            with self._mutex:
                self.times.append(self._timer())

    @property
    def count(self) -> int:
        return len(self.times)
