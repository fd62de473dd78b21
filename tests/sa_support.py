"""Models, engines and child-process bodies for the SQLAlchemy hook tests.

A test gets its own table (``menu_<random>``); children build the same model
from the table name, so they need no state from the parent.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from cacheguard import CacheGuard
from cacheguard.integrations.sqlalchemy import ModelTracker, sqlite_engine, track_models
from tests.helpers import client_for, make_guard

MENU_KEYS = ("menu:list", "menu:{id}", "menu:children:{parent_id}")


@functools.cache
def menu_model(table: str) -> type[Any]:
    """The ``menu`` model of the documents, on table ``table``."""

    class Base(DeclarativeBase):
        pass

    class Menu(Base):
        __tablename__ = table
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(100))
        parent_id: Mapped[int | None] = mapped_column(default=None)
        sort: Mapped[int] = mapped_column(default=0)
        url: Mapped[str] = mapped_column(sa.String(200), default="")

    return Menu


def engine_for(db_url: str) -> sa.Engine:
    if db_url.startswith("sqlite"):
        return sqlite_engine(db_url)
    return sa.create_engine(db_url, pool_size=10, max_overflow=10)


def create_table(db_url: str, table: str, rows: int = 3) -> None:
    menu = menu_model(table)
    engine = engine_for(db_url)
    menu.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        for i in range(1, 1 + rows):  # ids from the database, 1, 2, 3...: sequences stay right
            session.add(menu(name=f"menu {i}", parent_id=None if i == 1 else 1))
            session.flush()
    engine.dispose()


def drop_table(db_url: str, table: str) -> None:
    engine = engine_for(db_url)
    menu_model(table).metadata.drop_all(engine)
    engine.dispose()


class Stack:
    """Guard + engine + tracked session factory for one test or child."""

    def __init__(self, redis_url: str, namespace: str, db_url: str, table: str, **settings: Any):
        self.menu = menu_model(table)
        self.client = client_for(redis_url)
        self.guard: CacheGuard = make_guard(self.client, namespace, **settings)
        self.engine = engine_for(db_url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.tracker: ModelTracker = track_models(self.guard, self.sessions, {self.menu: MENU_KEYS})

    def names(self) -> list[str]:
        """The menu names, read through the cache under ``menu:list``."""

        def load() -> list[str]:
            with self.sessions() as session:
                return list(session.scalars(sa.select(self.menu.name).order_by(self.menu.id)))

        return self.guard.get_or_load("menu:list", load, ttl=60)

    def name_of(self, menu_id: int) -> str | None:
        def load() -> str | None:
            with self.sessions() as session:
                row = session.get(self.menu, menu_id)
                return None if row is None else row.name

        return self.guard.get_or_load(f"menu:{menu_id}", load, ttl=60)

    def close(self) -> None:
        self.tracker.remove()
        self.guard.close()
        self.engine.dispose()
        self.client.close()


# -- child-process bodies ---------------------------------------------------------------------


def read_names(redis_url: str, namespace: str, db_url: str, table: str) -> list[str]:
    stack = Stack(redis_url, namespace, db_url, table)
    try:
        return stack.names()
    finally:
        stack.close()


def die_holding_write_locks(
    redis_url: str, namespace: str, db_url: str, table: str, lease: float
) -> None:
    """Flush a change (taking the write locks), say so in Redis, then hang until killed."""
    stack = Stack(redis_url, namespace, db_url, table, lease=lease)
    session = stack.sessions()
    session.get(stack.menu, 2).name = "never committed"
    session.flush()
    stack.client.set(f"{namespace}:test:flushed", "1")
    time.sleep(600)
