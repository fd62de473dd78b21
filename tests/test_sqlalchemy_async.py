"""The session hooks with AsyncSession and an AsyncCacheGuard, on real PostgreSQL
(psycopg's asyncio driver, DATABASE_URL, set in CI) and SQLite (aiosqlite): the
same write path and the same watermark guarantee as the sync hooks."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from cacheguard import MISSING, CacheGuard, LockLostError
from cacheguard.aio import AsyncCacheGuard
from cacheguard.integrations.sqlalchemy import sqlite_async_engine, track_models
from tests import sa_support
from tests.helpers import subscribers, wait_until
from tests.sa_support import MENU_KEYS


def async_engine(db_url: str) -> AsyncEngine:
    if db_url.startswith("sqlite"):
        return sqlite_async_engine(db_url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    return create_async_engine(db_url.replace("+psycopg://", "+psycopg_async://", 1))


class AsyncStack:
    def __init__(self, redis_url: str, namespace: str, db_url: str, table: str) -> None:
        self.menu = sa_support.menu_model(table)
        self.guard = AsyncCacheGuard(
            redis.asyncio.Redis.from_url(redis_url), namespace=namespace, ttl_jitter=0,
            wait_timeout=5,
        )  # fmt: skip
        self.engine = async_engine(db_url)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self.tracker = track_models(self.guard, self.sessions, {self.menu: MENU_KEYS})

    async def name_of(self, menu_id: int) -> str | None:
        async def load() -> str | None:
            async with self.sessions() as session:
                row = await session.get(self.menu, menu_id)
                return None if row is None else row.name

        return await self.guard.get_or_load(f"menu:{menu_id}", load, ttl=60)  # type: ignore[no-any-return]

    async def close(self) -> None:
        self.tracker.remove()
        await self.guard.aclose()
        await self.engine.dispose()
        await self.guard.client.aclose()


@pytest.fixture
async def stack(redis_url: str, namespace: str, db_url: str) -> AsyncIterator[AsyncStack]:
    table = f"menu_{uuid.uuid4().hex[:10]}"
    sa_support.create_table(db_url, table)
    made = AsyncStack(redis_url, namespace, db_url, table)
    yield made
    await made.close()
    sa_support.drop_table(db_url, table)


async def test_a_commit_invalidates_what_readers_see(stack: AsyncStack) -> None:
    assert await stack.name_of(2) == "menu 2"
    async with stack.sessions() as session, session.begin():
        row = await session.get(stack.menu, 2)
        row.name = "Soups"
        await session.flush()
        # Locked and invalidated from the flush on, until the commit.
        assert await stack.guard.peek("menu:2") is MISSING
    assert await stack.name_of(2) == "Soups"
    assert stack.tracker.held_keys(session.sync_session) == frozenset()


async def test_a_write_lock_lost_before_the_commit_fails_it(
    stack: AsyncStack, client: redis.Redis, redis_url: str
) -> None:
    # Another process's guard: its own client and owner.
    other = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=stack.guard.namespace, wait_timeout=10
    )
    try:
        async with stack.sessions() as session:
            (await session.get(stack.menu, 2)).name = "written after the loss"
            await session.flush()
            handle = session.sync_session.info[stack.tracker._info_key].locks["menu:2"][1]
            # The lock's hash vanishes, another writer gets in and a reader stores a value.
            assert client.delete(stack.guard.keys("menu:2").lock) == 1
            async with other.write("menu:2", timeout=5):
                pass
            assert await other.get_or_load("menu:2", lambda: "stale", ttl=60) == "stale"
            assert not await handle.renew()  # what the watchdog's next renewal finds
            with pytest.raises(LockLostError) as lost:
                await session.commit()
            assert (lost.value.name, lost.value.mode) == ("menu:2", "write")
            with pytest.raises(LockLostError):
                await session.commit()  # nothing commits until the transaction is rolled back
            await session.rollback()
            assert stack.tracker.held_keys(session.sync_session) == frozenset()
        assert await other.peek("menu:2") is MISSING  # invalidated again at the rollback
        for name in ("menu:list", "menu:2", "menu:children:1"):
            assert not client.exists(stack.guard.keys(name).lock)
        assert await stack.name_of(2) == "menu 2"  # the change was not committed
    finally:
        await other.aclose()
        await other.client.aclose()


async def test_a_reader_waits_for_the_transaction_and_sees_the_commit(
    stack: AsyncStack, client: redis.Redis, redis_url: str
) -> None:
    assert await stack.name_of(2) == "menu 2"
    # Another process's guard: its own client, pool and pub/sub connection.
    other = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=stack.guard.namespace, wait_timeout=10
    )

    async def load() -> str:
        async with stack.sessions() as session:
            return (await session.get(stack.menu, 2)).name  # type: ignore[no-any-return]

    try:
        async with stack.sessions() as session, session.begin():
            (await session.get(stack.menu, 2)).name = "Salads"
            await session.flush()
            read = asyncio.ensure_future(other.get_or_load("menu:2", load, ttl=60))
            channel = other.keys("menu:2").released_channel
            assert await asyncio.to_thread(
                wait_until, lambda: subscribers(client, channel) >= 1, 10
            )
            assert not read.done()
        assert await read == "Salads"
    finally:
        await other.aclose()
        await other.client.aclose()


async def test_a_rollback_releases_and_caches_nothing_uncommitted(stack: AsyncStack) -> None:
    async with stack.sessions() as session, session.begin():
        (await session.get(stack.menu, 2)).name = "never"
        await session.flush()
        await session.rollback()
    assert stack.tracker.held_keys(session.sync_session) == frozenset()
    assert await stack.name_of(2) == "menu 2"


async def test_a_reader_with_an_old_snapshot_cannot_fill_a_stale_row(
    stack: AsyncStack, db_url: str
) -> None:
    reader = stack.sessions()
    try:
        if not db_url.startswith("sqlite"):
            await reader.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        assert (await reader.get(stack.menu, 2)).name == "menu 2"  # the snapshot is taken here
        async with stack.sessions() as writer:
            (await writer.get(stack.menu, 2)).name = "fresh"
            await writer.commit()

        async def load_in_reader() -> str:
            query = sa.select(stack.menu.name).where(stack.menu.id == 2)
            return (await reader.scalars(query)).one()

        # The reader sees its snapshot (that is its business) but must not cache it.
        assert await stack.guard.get_or_load("menu:2", load_in_reader, ttl=60) == "menu 2"
        assert stack.guard.stats().stores_rejected == 1
        assert await stack.guard.peek("menu:2") is MISSING
    finally:
        await reader.close()
    assert await stack.name_of(2) == "fresh"


async def test_sync_and_async_trackers_share_the_locks(
    stack: AsyncStack, redis_url: str, db_url: str, client: redis.Redis
) -> None:
    """A sync service's transaction holds the keys an asyncio service reads."""
    sync_guard = CacheGuard(client, namespace=stack.guard.namespace, wait_timeout=5)
    engine = sa_support.engine_for(db_url)
    sync_sessions = sessionmaker(engine, expire_on_commit=False)
    tracker = track_models(sync_guard, sync_sessions, {stack.menu: MENU_KEYS})
    try:
        assert await stack.name_of(3) == "menu 3"

        def sync_write(entered: Any, leave: Any) -> None:
            with sync_sessions() as session, session.begin():
                session.get(stack.menu, 3).name = "from sync"
                session.flush()
                entered.set()
                assert leave.wait(10)

        entered, leave = threading.Event(), threading.Event()
        writing = asyncio.ensure_future(asyncio.to_thread(sync_write, entered, leave))
        assert await asyncio.to_thread(entered.wait, 10)
        read = asyncio.ensure_future(stack.name_of(3))
        channel = stack.guard.keys("menu:3").released_channel
        assert await asyncio.to_thread(wait_until, lambda: subscribers(client, channel) >= 1, 10)
        assert not read.done()
        leave.set()
        await writing
        assert await read == "from sync"
    finally:
        tracker.remove()
        sync_guard.close()
        engine.dispose()


def test_mismatched_guards_and_factories_are_refused(redis_url: str, namespace: str) -> None:
    menu = sa_support.menu_model("menu_mismatch")
    sync_guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace)
    async_guard = AsyncCacheGuard(redis.asyncio.Redis.from_url(redis_url), namespace=namespace)
    with pytest.raises(TypeError, match="AsyncCacheGuard"):
        track_models(sync_guard, async_sessionmaker(), {menu: MENU_KEYS})
    with pytest.raises(TypeError, match="AsyncSession"):
        track_models(async_guard, sessionmaker(), {menu: MENU_KEYS})

    class Plain(AsyncSession):
        pass

    with pytest.raises(TypeError, match="sync_session_class"):
        track_models(async_guard, Plain, {menu: MENU_KEYS})
    # An async_sessionmaker without a sync class of its own gets one: Session stays untracked.
    factory = async_sessionmaker()
    tracker = track_models(async_guard, factory, {menu: MENU_KEYS})
    assert factory.kw["sync_session_class"] is not Session
    assert issubclass(factory.kw["sync_session_class"], Session)
    tracker.remove()
