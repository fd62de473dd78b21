"""A transaction whose keys went to the outbox holds no write lock in Redis; its
writes are uncommitted all the same. Its own reads of those keys must stay its own:
not stored, not remembered for outage reuse, not shared with other callers.

Redis is unreachable (a port nothing listens on), so every flush goes to the outbox.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.integrations.sqlalchemy import outbox_table, sqlite_engine, track_models
from cacheguard.integrations.sqlalchemy.guards import guard_io
from cacheguard.locks.async_local import AsyncLocalRWLock
from cacheguard.testing import free_port
from tests.faults.proxy import TcpProxy


class Base(DeclarativeBase):
    pass


class Menu(Base):
    __tablename__ = "menu"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(50))


@pytest.fixture
def setup(tmp_path: Path, namespace: str) -> Iterator[tuple[CacheGuard, sessionmaker[Session]]]:
    engine = sqlite_engine(f"sqlite:///{tmp_path / 'menu.sqlite3'}")
    metadata = sa.MetaData()
    outbox = outbox_table(metadata)
    Base.metadata.create_all(engine)
    metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(Menu(id=1, name="menu 1"))
    guard = CacheGuard.from_url(
        f"redis://127.0.0.1:{free_port()}/0",
        namespace=namespace,
        outage_ttl=60.0,  # a value loaded would be reused: the dirty one must not be
        breaker_failures=1,
        breaker_cooldown=60.0,
    )
    factory = sessionmaker(engine)
    tracker = track_models(guard, factory, {Menu: ("menu:{id}",)}, outbox=outbox, outbox_poll=60)
    try:
        yield guard, factory
    finally:
        tracker.remove()
        guard.close()
        engine.dispose()


def committed_name(factory: sessionmaker[Session]) -> str:
    with factory() as session:
        return session.get(Menu, 1).name  # type: ignore[union-attr]


def test_a_transaction_s_reads_of_its_outboxed_keys_are_its_own(
    setup: tuple[CacheGuard, sessionmaker[Session]],
) -> None:
    guard, factory = setup
    with factory() as session:
        session.begin()
        session.get(Menu, 1).name = "DIRTY"  # type: ignore[union-attr]
        session.flush()  # Redis is down: the invalidation goes to the outbox
        assert guard.stats().outbox_writes == 1

        def own_view() -> str:
            return session.get(Menu, 1).name  # type: ignore[union-attr]

        # The transaction sees its own write...
        assert guard.get_or_load("menu:1", own_view, ttl=60) == "DIRTY"
        # ...another thread of this process gets the committed row, not that view
        # (neither shared with it nor reused from what the transaction loaded).
        seen: list[str] = []
        other = threading.Thread(
            target=lambda: seen.append(
                guard.get_or_load("menu:1", lambda: committed_name(factory), ttl=60)
            )
        )
        other.start()
        other.join(10)
        assert seen == ["menu 1"]
        session.rollback()
    # Nothing remembered the uncommitted value for outage reuse.
    assert guard.get_or_load("menu:1", lambda: committed_name(factory), ttl=60) == "menu 1"


def test_a_fill_in_such_a_transaction_after_redis_returns_stores_nothing(
    tmp_path: Path, namespace: str, redis_url: str
) -> None:
    """Redis comes back while the transaction is open: its read misses and fills, and
    the fill (its own, uncommitted view) is not stored for everyone."""
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    proxy = TcpProxy(port)
    engine = sqlite_engine(f"sqlite:///{tmp_path / 'menu.sqlite3'}")
    metadata = sa.MetaData()
    outbox = outbox_table(metadata)
    Base.metadata.create_all(engine)
    metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(Menu(id=1, name="menu 1"))
    guard = CacheGuard.from_url(
        proxy.url, namespace=namespace, socket_timeout=0.3, breaker_failures=1,
        breaker_cooldown=0.2,
    )  # fmt: skip
    factory = sessionmaker(engine)
    tracker = track_models(guard, factory, {Menu: ("menu:{id}",)}, outbox=outbox, outbox_poll=60)
    direct = redis.Redis.from_url(redis_url)
    try:
        with factory() as session:
            session.begin()
            menu = session.get(Menu, 1)  # begun with Redis up: a snapshot watermark
            proxy.set_mode("blackhole")
            menu.name = "DIRTY"  # type: ignore[union-attr]
            session.flush()  # Redis unreachable: to the outbox
            assert guard.stats().outbox_writes == 1
            proxy.set_mode("pass")
            proxy.drop_all()

            def own_view() -> str:
                return session.get(Menu, 1).name  # type: ignore[union-attr]

            deadline = time.monotonic() + 10
            while guard._state.breaker("menu:1").state == "open":  # a condition with a deadline
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert guard.get_or_load("menu:1", own_view, ttl=60) == "DIRTY"
            assert guard.stats().l2_hits == 0  # it reached Redis (a miss) and filled
            assert not direct.exists(guard.keys("menu:1").value)  # nothing stored
            session.rollback()
    finally:
        tracker.remove()
        guard.close()
        direct.close()
        proxy.close()
        engine.dispose()


async def test_a_local_hold_released_from_another_thread_wakes_the_loop_s_waiters(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped session's holds are released by a background thread; an asyncio
    guard's local lock belongs to its loop: the release is handed to the loop, so a
    task waiting there gets the lock at once, not at its timeout."""
    guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace)
    io = guard_io(guard)
    try:
        await guard.get_or_load("k", lambda: 1, ttl=60)  # binds the guard to this loop
        lock = guard.rwlock("k")
        holder = asyncio.current_task()
        await lock.local.acquire_write(5)
        waiter = asyncio.ensure_future(lock.local.acquire_write(5))
        await asyncio.sleep(0)  # it waits for the hold
        assert not waiter.done()
        released_in: list[threading.Thread] = []
        release = AsyncLocalRWLock.release_write

        def recorded(self: AsyncLocalRWLock, **kwargs: Any) -> None:  # where it changes
            released_in.append(threading.current_thread())
            release(self, **kwargs)

        monkeypatch.setattr(AsyncLocalRWLock, "release_write", recorded)
        threading.Thread(target=io.release_local, args=(lock, holder)).start()
        await asyncio.wait_for(waiter, 2)  # woken by the release, long before 5 s
        assert released_in == [threading.current_thread()]  # on the loop's thread
        monkeypatch.undo()
        lock.local.release_write(holder=waiter)  # held by the waiter's task now
    finally:
        await guard.aclose()
