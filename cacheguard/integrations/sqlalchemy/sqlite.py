"""SQLite engines whose transactions really are transactions.

Python's ``sqlite3`` module (before 3.12's ``autocommit=False``) sends no
``BEGIN`` before a SELECT, so each read sees the newest data and a transaction
has no snapshot until its first write. A snapshot watermark recorded when the
session's transaction begins then describes nothing. This engine sends
``BEGIN`` when SQLAlchemy begins a transaction and uses WAL, so readers keep a
consistent snapshot while one writer commits, as on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["sqlite_async_engine", "sqlite_engine"]


def sqlite_engine(url: str, **engine_options: Any) -> sa.Engine:
    """An engine for a ``sqlite:///path`` URL with real transactions and WAL."""
    if not url.startswith("sqlite"):
        raise ValueError(f"sqlite_engine needs a sqlite:// URL, got {url!r}")
    engine_options.setdefault("connect_args", {}).setdefault("timeout", 30)
    engine = sa.create_engine(url, **engine_options)
    _real_transactions(engine)
    return engine


def sqlite_async_engine(url: str, **engine_options: Any) -> AsyncEngine:
    """The same for ``sqlite+aiosqlite:///path`` (an ``AsyncEngine``)."""
    if not url.startswith("sqlite+aiosqlite"):
        raise ValueError(f"sqlite_async_engine needs a sqlite+aiosqlite:// URL, got {url!r}")
    engine_options.setdefault("connect_args", {}).setdefault("timeout", 30)
    engine = create_async_engine(url, **engine_options)
    _real_transactions(engine.sync_engine)
    return engine


def _real_transactions(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # we send BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        connection.exec_driver_sql("BEGIN")
