"""``write_locks=``: the write path's locks from another lock store.

For every store of tests/lock_stores.py: ``guard.write`` and tracked sessions take
the store's write lock (a holder of it in another thread makes them wait), the
write path still invalidates before and after, and fills keep working beside it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from cacheguard import (
    MISSING,
    CacheGuard,
    LockFactory,
    LockLostError,
    LockTimeout,
    RedisRWLock,
)
from cacheguard.aio import AsyncCacheGuard, AsyncRedisRWLock
from cacheguard.integrations.sqlalchemy import sqlite_engine, track_models
from tests.lock_stores import STORES, Store, held_briefly, in_thread


@pytest.fixture(scope="module", params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as built:
        yield built


@pytest.fixture
def guard(store: Store, client: redis.Redis, namespace: str) -> Iterator[CacheGuard]:
    g = CacheGuard(client, namespace=namespace, write_locks=store.make, wait_timeout=5)
    yield g
    g.close()


class _Held:
    """The store's write lock of ``name`` held by another thread until ``free()``."""

    def __init__(self, store: Store, name: str) -> None:
        self._taken, self._free = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(store, name), daemon=True)
        self._thread.start()
        assert self._taken.wait(30), "the store's lock was not taken"

    def _hold(self, store: Store, name: str) -> None:
        with store.make(name).write(timeout=10):
            self._taken.set()
            self._free.wait(60)

    def free(self) -> None:
        self._free.set()
        self._thread.join(30)


@pytest.mark.slow
def test_guard_write_takes_the_stores_lock(guard: CacheGuard, store: Store) -> None:
    held = _Held(store, "menu:7")
    try:
        with pytest.raises(LockTimeout), guard.write("menu:7", timeout=0.3):
            pass
    finally:
        held.free()
    with guard.write("menu:7", timeout=5):
        # Held through the store now: another owner cannot take it.
        other = _other_owner_tries(store, "menu:7")
        assert isinstance(other, LockTimeout), other
    assert _other_owner_tries(store, "menu:7") == "held"  # released on exit


def test_the_write_path_still_invalidates_before_and_after(guard: CacheGuard) -> None:
    guard.get_or_load("menu:7", lambda: "old", ttl=60)
    with guard.write("menu:7"):
        assert guard.peek("menu:7") is guard_missing()
        # A fill during the write does not wait for it (the lock is in another store)...
        assert guard.get_or_load("menu:7", lambda: "during", ttl=60) == "during"
    # ... and the write's second invalidation removes what it stored.
    assert guard.peek("menu:7") is guard_missing()
    assert guard.get_or_load("menu:7", lambda: "new", ttl=60) == "new"


class _Base(DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = "write_locks_row"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(20))


@pytest.mark.slow
def test_tracked_sessions_take_the_stores_lock(
    guard: CacheGuard, store: Store, tmp_path: Any
) -> None:
    engine = sqlite_engine(f"sqlite:///{tmp_path / 'rows.sqlite3'}")
    _Base.metadata.create_all(engine)
    sessions = sessionmaker(engine)
    with sessions.begin() as session:
        session.add(_Row(id=1, name="a"))
    tracker = track_models(guard, sessions, {_Row: ("row:{id}",)})
    try:
        guard.get_or_load("row:1", lambda: "a", ttl=60)
        with sessions.begin() as session:
            session.get(_Row, 1).name = "b"  # type: ignore[union-attr]
            session.flush()  # the hooks lock row:1 (in the store) and invalidate it
            assert isinstance(_other_owner_tries(store, "row:1"), LockTimeout)
            assert guard.peek("row:1") is guard_missing()
        assert _other_owner_tries(store, "row:1") == "held"  # released with the transaction
    finally:
        tracker.remove()
        engine.dispose()


@pytest.mark.slow
def test_a_lock_factory_puts_the_stores_lock_behind_its_local_tier(store: Store) -> None:
    """``LockFactory(store=...)``: the two-tier lock with the store's lock as its
    distributed tier: another owner of the store's lock holds it off, and its own
    threads meet at the local tier first."""
    factory = LockFactory(store=store.make)
    lock = factory.rwlock("menu:9")
    held = _Held(store, "menu:9")
    try:
        with pytest.raises(LockTimeout):
            lock.acquire_write(timeout=0.3)
    finally:
        held.free()
    with lock.write(timeout=5):
        assert isinstance(_other_owner_tries(store, "menu:9"), LockTimeout)  # the store
        local = in_thread(lambda: lock.acquire_read(timeout=0.3)).result(30)  # the local tier
        assert isinstance(local, LockTimeout), local
    with lock.read(timeout=5):  # threads of the process share one distributed read hold
        other = in_thread(lambda: _read_and_release(lock)).result(30)
        assert other == "read", other
    assert _other_owner_tries(store, "menu:9") == "held"


def test_a_lock_factory_needs_a_client_or_a_store(client: redis.Redis) -> None:
    with pytest.raises(TypeError, match="a Redis client, or a store"):
        LockFactory()
    with pytest.raises(TypeError, match="not both"):
        LockFactory(client, store=lambda name: None)


def _read_and_release(lock: Any) -> str:
    with lock.read(timeout=5):
        return "read"


def test_a_stores_lock_lost_during_a_write_fails_the_write(
    store: Store, client: redis.Redis, namespace: str
) -> None:
    handles: list[Any] = []

    def recording(name: str) -> Any:  # the store's lock, its write handles noted
        lock = store.make(name)
        acquire = lock.acquire_write

        def acquire_write(timeout: float | None = None, **kwargs: Any) -> Any:
            handles.append(acquire(timeout, **kwargs))
            return handles[-1]

        lock.acquire_write = acquire_write
        return lock

    guard = CacheGuard(client, namespace=namespace, write_locks=recording, wait_timeout=5)
    try:

        def body() -> None:
            # What the store's renewal does when it finds the holding gone.
            handles[-1]._mark_lost("the test took it away")
            guard.get_or_load("menu:7", lambda: "during", ttl=60)

        with pytest.raises(LockLostError) as lost, guard.write("menu:7"):
            body()
        assert lost.value.name == "menu:7"
        assert "the test took it away" in str(lost.value)
        assert guard.peek("menu:7") is guard_missing()  # invalidated again first
        # (The holding itself was never taken away here, so what a store's release
        # does with it is the store's business: tests/test_lost_write_locks.py loses
        # a Redis lock for real and checks that nothing stays held.)
    finally:
        guard.close()


def test_write_locks_must_make_locks(client: redis.Redis, namespace: str) -> None:
    with pytest.raises(TypeError, match="write_locks must make a lock"):
        CacheGuard(client, namespace=namespace, write_locks="postgres")  # type: ignore[arg-type]


async def test_an_asyncio_guard_takes_an_asyncio_stores_lock(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    aclient = redis.asyncio.Redis.from_url(redis_url)
    locks = f"{namespace}-store"
    guard = AsyncCacheGuard(
        aclient,
        namespace=namespace,
        write_locks=functools.partial(AsyncRedisRWLock, aclient, namespace=locks),
    )
    try:
        sync_lock = RedisRWLock(client, "menu:7", namespace=locks)
        handle = sync_lock.acquire_write(5, owner="another process")
        try:
            with pytest.raises(LockTimeout):
                async with guard.write("menu:7", timeout=0.3):
                    pass
        finally:
            handle.release()
        async with guard.write("menu:7", timeout=5):
            assert sync_lock.try_acquire_write(owner="another process") is None
        again = sync_lock.try_acquire_write(owner="another process")
        assert again is not None
        again.release()
    finally:
        await guard.aclose()
        await aclient.aclose()


async def test_an_asyncio_guard_refuses_a_sync_store(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    aclient = redis.asyncio.Redis.from_url(redis_url)
    guard = AsyncCacheGuard(
        aclient,
        namespace=namespace,
        write_locks=functools.partial(RedisRWLock, client, namespace=f"{namespace}-store"),
    )
    try:
        with pytest.raises(TypeError, match="asyncio store"):
            async with guard.write("menu:7", timeout=1):
                pass
        # The sync hold it took was given back.
        lock = RedisRWLock(client, "menu:7", namespace=f"{namespace}-store")
        handle = lock.try_acquire_write(owner="someone")
        assert handle is not None
        handle.release()
    finally:
        await guard.aclose()
        await aclient.aclose()


def _other_owner_tries(store: Store, name: str) -> Any:
    """Another thread's short try at the store's write lock: "held", or its exception."""
    return in_thread(lambda: held_briefly(store.make(name).write(timeout=0.3))).result(30)


def guard_missing() -> Any:
    return MISSING
