"""Stacks and child-process bodies for the outbox tests (tests/test_outbox.py).

A test gets its own menu table and outbox table; children rebuild both from their
names, so they need no state from the parent.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.integrations.sqlalchemy import (
    AsyncOutboxReplayer,
    ModelTracker,
    OutboxReplayer,
    outbox_table,
    sqlite_async_engine,
    track_models,
)
from tests import sa_support
from tests.sa_support import MENU_KEYS

# Fail fast: an outage costs half a second per call, not the client's default 2 s.
FAST = {"socket_timeout": 0.5, "connect_timeout": 0.5}


@functools.cache
def outbox_for(name: str) -> sa.Table:
    """The outbox table ``name`` (one Table object per process and name)."""
    return outbox_table(sa.MetaData(), name)


def create_outbox(db_url: str, name: str) -> None:
    engine = sa_support.engine_for(db_url)
    outbox_for(name).create(engine)
    engine.dispose()


def drop_outbox(db_url: str, name: str) -> None:
    engine = sa_support.engine_for(db_url)
    outbox_for(name).drop(engine, checkfirst=True)
    engine.dispose()


def async_engine(db_url: str) -> AsyncEngine:
    if db_url.startswith("sqlite"):
        return sqlite_async_engine(db_url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    return create_async_engine(db_url.replace("+psycopg://", "+psycopg_async://", 1))


class OutboxStack:
    """A guard (its own client, made from the URL) + engine + sessions tracked with
    the outbox: what one process of an application has."""

    def __init__(
        self,
        redis_url: str,
        namespace: str,
        db_url: str,
        table: str,
        outbox: str,
        *,
        poll: float = 1.0,
        **settings: Any,
    ) -> None:
        self.menu = sa_support.menu_model(table)
        self.outbox = outbox_for(outbox)
        settings.setdefault("ttl_jitter", 0)
        settings.setdefault("wait_timeout", 5)
        self.guard = CacheGuard.from_url(redis_url, namespace=namespace, **FAST, **settings)
        self.engine = sa_support.engine_for(db_url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.tracker: ModelTracker = track_models(
            self.guard, self.sessions, {self.menu: MENU_KEYS}, outbox=self.outbox, outbox_poll=poll
        )

    def name_of(self, menu_id: int) -> str | None:
        def load() -> str | None:
            with self.sessions() as session:
                row = session.get(self.menu, menu_id)
                return None if row is None else row.name

        return self.guard.get_or_load(f"menu:{menu_id}", load, ttl=60)

    def rename(self, menu_id: int, name: str) -> None:
        with self.sessions.begin() as session:
            session.get(self.menu, menu_id).name = name

    def depth(self) -> int:
        """The rows of this guard's namespace in the outbox."""
        query = sa.select(sa.func.count()).where(self.outbox.c.namespace == self.guard.namespace)
        with self.engine.connect() as connection:
            return int(connection.execute(query).scalar_one())

    def close(self) -> None:
        self.tracker.remove()
        self.guard.close()
        self.engine.dispose()


class AsyncOutboxStack:
    """:class:`OutboxStack` with an AsyncCacheGuard and an async_sessionmaker."""

    def __init__(
        self,
        redis_url: str,
        namespace: str,
        db_url: str,
        table: str,
        outbox: str,
        *,
        poll: float = 1.0,
        **settings: Any,
    ) -> None:
        self.menu = sa_support.menu_model(table)
        self.outbox = outbox_for(outbox)
        settings.setdefault("ttl_jitter", 0)
        settings.setdefault("wait_timeout", 5)
        self.guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace, **FAST, **settings)
        self.engine = async_engine(db_url)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self.tracker: ModelTracker = track_models(
            self.guard, self.sessions, {self.menu: MENU_KEYS}, outbox=self.outbox, outbox_poll=poll
        )

    async def name_of(self, menu_id: int) -> str | None:
        async def load() -> str | None:
            async with self.sessions() as session:
                row = await session.get(self.menu, menu_id)
                return None if row is None else row.name

        return await self.guard.get_or_load(f"menu:{menu_id}", load, ttl=60)  # type: ignore[no-any-return]

    async def rename(self, menu_id: int, name: str) -> None:
        async with self.sessions.begin() as session:
            (await session.get(self.menu, menu_id)).name = name

    async def depth(self) -> int:
        query = sa.select(sa.func.count()).where(self.outbox.c.namespace == self.guard.namespace)
        async with self.engine.connect() as connection:
            return int((await connection.execute(query)).scalar_one())

    async def close(self) -> None:
        self.tracker.remove()
        await self.guard.aclose()
        await self.engine.dispose()


# -- child-process bodies ---------------------------------------------------------------------


def serve_until_new(
    redis_url: str,
    namespace: str,
    db_url: str,
    table: str,
    outbox: str,
    warmed: Any,
    new: str,
    deadline: float,
) -> tuple[float | None, int]:
    """A process that reaches Redis and never sees it fail: cache menu 2, say so on
    ``warmed``, then read it until it reads ``new`` (or ``deadline`` s pass). Returns
    the wall-clock time it first read ``new`` (None: never) and how many reads
    came before."""
    stack = OutboxStack(redis_url, namespace, db_url, table, outbox, poll=1.0)
    try:
        old = stack.name_of(2)
        assert old != new, old
        warmed.set()
        reads = 0
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if stack.name_of(2) == new:
                return time.time(), reads
            reads += 1
            time.sleep(0.01)
        return None, reads
    finally:
        stack.close()


def serve_until_new_async(
    redis_url: str,
    namespace: str,
    db_url: str,
    table: str,
    outbox: str,
    warmed: Any,
    new: str,
    deadline: float,
) -> tuple[float | None, int]:
    """:func:`serve_until_new` with an AsyncCacheGuard on asyncio (its poller is a
    task on the guard's loop)."""

    async def run() -> tuple[float | None, int]:
        stack = AsyncOutboxStack(redis_url, namespace, db_url, table, outbox, poll=1.0)
        try:
            old = await stack.name_of(2)
            assert old != new, old
            warmed.set()
            reads = 0
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                if await stack.name_of(2) == new:
                    return time.time(), reads
                reads += 1
                await asyncio.sleep(0.01)
            return None, reads
        finally:
            await stack.close()

    return asyncio.run(run())


def replay_when_told(
    redis_url: str, namespace: str, db_url: str, outbox: str, go: Any, batch: int
) -> int:
    """A process that only replays (no tracker): how many rows it replayed."""
    guard = CacheGuard.from_url(redis_url, namespace=namespace, **FAST)
    engine = sa_support.engine_for(db_url)
    try:
        replayer = OutboxReplayer(guard, engine, outbox_for(outbox), batch=batch)
        assert go.wait(30), "never told to go"
        return replayer.replay()
    finally:
        guard.close()
        engine.dispose()


def replay_when_told_async(
    redis_url: str, namespace: str, db_url: str, outbox: str, go: Any, batch: int
) -> int:
    async def run() -> int:
        guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace, **FAST)
        engine = async_engine(db_url)
        try:
            replayer = AsyncOutboxReplayer(guard, engine, outbox_for(outbox), batch=batch)
            assert await asyncio.to_thread(go.wait, 30), "never told to go"
            return await replayer.replay()
        finally:
            await guard.aclose()
            await engine.dispose()

    return asyncio.run(run())


def read_versions(
    redis_url: str,
    namespace: str,
    db_url: str,
    table: str,
    outbox: str,
    ids: list[int],
    started: Any,
    stop: Any,
) -> list[tuple[float, int, int]]:
    """A reader of the churn test: reads the menus ``ids`` round and round until
    ``stop``; each read as (monotonic start, id, version read)."""
    stack = OutboxStack(redis_url, namespace, db_url, table, outbox, poll=1.0)
    reads: list[tuple[float, int, int]] = []
    try:
        for menu_id in ids:  # cached before the outage
            stack.name_of(menu_id)
        started.set()
        turn = 0
        while not stop.is_set():
            menu_id = ids[turn % len(ids)]
            turn += 1
            begun = time.monotonic()
            name = stack.name_of(menu_id)
            assert name is not None
            assert name.startswith("v"), name
            reads.append((begun, menu_id, int(name[1:])))
        return reads
    finally:
        stack.close()
