"""The asyncio lock stores the asyncio contract suite (tests/test_lock_contract_async.py)
runs against.

Each one stands on a sync store of tests/lock_stores.py: the same servers, namespace
and fencing sequence. So the sync lock of a name is the same lock as the asyncio
one (the cross-driver rules), and the sync store's probe (is a writer queued?) sees
the asyncio locks' waiters too. The servers live as long as the sync store; the
asyncio clients and engines belong to one test's event loop and are closed at its
end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import redis
import redis.asyncio
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from cacheguard.aio import AsyncNotifier, AsyncRedisRWLock, AsyncRedlockRWLock, async_notifier_for
from cacheguard.locks.postgres.async_rwlock import AsyncPostgresRWLock, close_idle_async_connections
from cacheguard.locks.redlock.async_rwlock import default_async_redlock_watchdog
from cacheguard.redis.keys import ResourceKeys
from tests.helpers import subscribers
from tests.lock_stores import (
    REDIS_LEASE,
    REDLOCK_LEASE,
    Store,
    postgres_lock,
    redis_lock,
    redlock_lock,
)

T = TypeVar("T")


class AsyncLock(Protocol):
    """What every asyncio store's lock offers (``AsyncRedisRWLock``'s shape)."""

    name: str

    async def acquire_read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Any: ...

    async def acquire_write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Any: ...

    async def try_acquire_read(self, *, owner: str | None = None) -> Any: ...
    async def try_acquire_write(self, *, owner: str | None = None) -> Any: ...

    def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AbstractAsyncContextManager[Any]: ...

    def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AbstractAsyncContextManager[Any]: ...


class SyncLock(Protocol):
    """The sync twin, with explicit owners: its calls run on executor threads, which
    are reused, so a thread's default owner could re-enter another call's hold."""

    def acquire_write(self, timeout: float | None = None, *, owner: str | None = None) -> Any: ...
    def try_acquire_read(self, *, owner: str | None = None) -> Any: ...
    def try_acquire_write(self, *, owner: str | None = None) -> Any: ...

    def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AbstractContextManager[Any]: ...


@dataclass
class AsyncStore:
    """One asyncio store under the contract, on the servers of ``sync``."""

    name: str
    sync: Store
    # A lock named ``name`` on this test's event loop (each call may return a new
    # object for the same lock).
    build: Callable[[str], AsyncLock]
    # (module-level function, args): ``maker(*args, name)`` builds the same asyncio lock
    # in a child process, outside any loop (its clients bind to the child's loop).
    maker: tuple[Callable[..., AsyncLock], tuple[Any, ...]]
    # Test-side probe for the Redis stores: is a waiter of ``name`` subscribed to its
    # release channel (past its subscription: parked until a release or its timer)?
    # None: a queued waiter waits in the server (PostgreSQL).
    listening: Callable[[str], bool] | None = None
    # What the test took and started, for tidy() to end if the test failed midway.
    held: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def recovers_within(self) -> float:
        return self.sync.recovers_within

    def make(self, name: str) -> AsyncLock:
        """The lock ``name`` on this test's loop."""
        return _Tracked(self.build(name), self.held)

    def in_task(self, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Run ``work`` as another owner: a task of its own (every asyncio store's
        default owner is the current task)."""

        async def run() -> T:
            return await work()

        task = asyncio.ensure_future(run())
        self.tasks.append(task)
        return task

    def sync_lock(self, name: str) -> SyncLock:
        """The sync lock of the same name: the same lock for the store's server."""
        return cast(SyncLock, self.sync.make(name))

    async def writer_waiting(self, name: str) -> bool:
        """Is a writer queued on ``name`` (the sync probe, off the loop)?"""
        probe = self.sync.writer_waiting
        assert probe is not None, f"{self.sync.name} has no probe for a waiting writer"
        return await asyncio.to_thread(probe, name)

    async def writer_parked(self, name: str) -> bool:
        """Is a writer queued on ``name`` and in its wait, not in a round trip?"""
        if not await self.writer_waiting(name):
            return False
        return self.listening is None or await asyncio.to_thread(self.listening, name)

    async def tidy(self) -> None:
        """End what a failed test left behind, before its clients close: other owners'
        tasks (cancelled: their ``async with`` blocks release) and holds taken with
        ``acquire_*``. A watchdog task still renewing a hold when the loop closes
        can miss its cancellation in a redis-py round trip and keep the loop from
        closing."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            done, _ = await asyncio.wait(self.tasks, timeout=30)
            for task in done:
                if not task.cancelled():
                    task.exception()  # seen: no "exception was never retrieved"
        for handle in self.held:
            if not (handle.released or handle.lost):
                with contextlib.suppress(Exception):  # a lost hold: nothing left to free
                    await handle.release()


class _Tracked:
    """A lock whose ``acquire_*`` handles are noted for :meth:`AsyncStore.tidy`
    (``read()`` / ``write()`` release by themselves)."""

    def __init__(self, lock: AsyncLock, held: list[Any]) -> None:
        self.lock = lock
        self.name = lock.name
        self._held = held

    def _noted(self, handle: Any) -> Any:
        if handle is not None:
            self._held.append(handle)
        return handle

    async def acquire_read(self, timeout: float | None = None, *, owner: str | None = None) -> Any:
        return self._noted(await self.lock.acquire_read(timeout, owner=owner))

    async def acquire_write(self, timeout: float | None = None, *, owner: str | None = None) -> Any:
        return self._noted(await self.lock.acquire_write(timeout, owner=owner))

    async def try_acquire_read(self, *, owner: str | None = None) -> Any:
        return self._noted(await self.lock.try_acquire_read(owner=owner))

    async def try_acquire_write(self, *, owner: str | None = None) -> Any:
        return self._noted(await self.lock.try_acquire_write(owner=owner))

    def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AbstractAsyncContextManager[Any]:
        return self.lock.read(timeout, owner=owner)

    def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AbstractAsyncContextManager[Any]:
        return self.lock.write(timeout, owner=owner)


def _args(store: Store, sync_maker: Callable[..., Any]) -> tuple[Any, ...]:
    """The arguments of ``store``'s child maker, which must be ``sync_maker``: the
    asyncio maker of the same store takes the same ones."""
    maker, args = store.maker
    assert maker is sync_maker, f"{store.name}: expected {sync_maker.__name__}, got {maker}"
    return args


def _channel(namespace: str, name: str) -> str:
    """The release channel of the lock ``name`` (one layout for both Redis stores)."""
    return ResourceKeys(namespace, name).released_channel


# -- Redis (one server) ---------------------------------------------------------------------------


def redis_async_lock(url: str, namespace: str, name: str) -> AsyncRedisRWLock:
    return AsyncRedisRWLock(
        redis.asyncio.Redis.from_url(url), name, namespace=namespace, lease=REDIS_LEASE
    )


@contextlib.asynccontextmanager
async def redis_async_store(sync: Store) -> AsyncIterator[AsyncStore]:
    url, namespace = _args(sync, redis_lock)
    # One client for the test, as in a process: every task is its own owner on it.
    client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
    probe = redis.Redis.from_url(url, socket_timeout=10)

    def build(name: str) -> AsyncRedisRWLock:
        return AsyncRedisRWLock(client, name, namespace=namespace, lease=REDIS_LEASE)

    store = AsyncStore(
        name="redis-async",
        sync=sync,
        build=build,
        maker=(redis_async_lock, (url, namespace)),
        listening=lambda name: subscribers(probe, _channel(namespace, name)) > 0,
    )
    try:
        yield store
    finally:
        await store.tidy()
        notifier = async_notifier_for(client)
        assert isinstance(notifier, AsyncNotifier)  # one plain server: never a cluster's
        await notifier.aclose()  # its listener task must not outlive the loop
        await client.aclose()
        probe.close()


# -- Redlock (the sync store's five masters) ------------------------------------------------------


def redlock_async_lock(urls: tuple[str, ...], namespace: str, name: str) -> AsyncRedlockRWLock:
    clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    return AsyncRedlockRWLock(clients, name, namespace=namespace, lease=REDLOCK_LEASE)


@contextlib.asynccontextmanager
async def redlock_async_store(sync: Store) -> AsyncIterator[AsyncStore]:
    urls, namespace = _args(sync, redlock_lock)
    clients = [redis.asyncio.Redis.from_url(url, socket_timeout=2) for url in urls]
    made: list[AsyncRedlockRWLock] = []

    def make(name: str) -> AsyncRedlockRWLock:
        made.append(AsyncRedlockRWLock(clients, name, namespace=namespace, lease=REDLOCK_LEASE))
        return made[-1]

    probes = [redis.Redis.from_url(url, socket_timeout=2) for url in urls]

    def listening(name: str) -> bool:
        """Subscribed on a majority of the masters (the waiter listens to all)?"""
        channel = _channel(namespace, name)
        return sum(subscribers(probe, channel) > 0 for probe in probes) > len(probes) // 2

    store = AsyncStore(
        name="redlock-async",
        sync=sync,
        build=make,
        maker=(redlock_async_lock, (urls, namespace)),
        listening=listening,
    )
    try:
        yield store
    finally:
        await store.tidy()
        # The loop's Redlock watchdog task and the per-master subscriber tasks must
        # not outlive the loop.
        default_async_redlock_watchdog().close()
        for lock in made:
            await lock.aclose()
        for client in clients:
            await client.aclose()
        for probe in probes:
            probe.close()


# -- PostgreSQL (the sync store's database, namespace and fencing sequence) -----------------------


def postgres_async_lock(url: str, namespace: str, fence: str, name: str) -> AsyncPostgresRWLock:
    engine = create_async_engine(url, poolclass=sqlalchemy.NullPool)
    return AsyncPostgresRWLock(engine, name, namespace=namespace, fence_sequence=fence)


@contextlib.asynccontextmanager
async def postgres_async_store(sync: Store) -> AsyncIterator[AsyncStore]:
    url, namespace, fence = _args(sync, postgres_lock)
    engine = create_async_engine(url, connect_args={"connect_timeout": 5})
    store = AsyncStore(
        name="postgres-async",
        sync=sync,
        build=lambda name: AsyncPostgresRWLock(
            engine, name, namespace=namespace, fence_sequence=fence
        ),
        maker=(postgres_async_lock, (url, namespace, fence)),
    )
    try:
        yield store
    finally:
        await store.tidy()
        await close_idle_async_connections(engine)
        await engine.dispose()


# sync store name (tests/lock_stores.py) -> its asyncio store on the same servers. kazoo is
# sync: ZooKeeper has no asyncio lock (docs/locks.md, "asyncio" under ZooKeeper).
ASYNC_STORES: dict[str, Callable[[Store], AbstractAsyncContextManager[AsyncStore]]] = {
    "redis": redis_async_store,
    "redlock": redlock_async_store,
    "postgres": postgres_async_store,
}


# -- a child process holding an asyncio lock ------------------------------------------------------


def hold_in_child(
    maker: Callable[..., AsyncLock], args: tuple[Any, ...], name: str, mode: str, ready: Any
) -> None:
    """Child: on an event loop of its own, take ``mode`` on the asyncio lock, say so,
    and hold it (its watchdog renewing) until killed."""
    asyncio.run(_hold(maker(*args, name), mode, ready))


async def _hold(lock: AsyncLock, mode: str, ready: Any) -> None:
    await (lock.acquire_write(10) if mode == "write" else lock.acquire_read(10))
    ready.set()
    await asyncio.Event().wait()  # held until the parent kills or stops us


# -- another owner's outcome ----------------------------------------------------------------------


async def outcome(task: asyncio.Task[Any], timeout: float) -> Any:
    """What ``task`` ended with: its result, or the exception it raised."""
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        raise AssertionError(f"the other owner did not finish within {timeout} s")
    return task.exception() or task.result()


async def held_briefly(context: AbstractAsyncContextManager[Any]) -> str:
    async with context:
        return "held"


async def token_of(context: AbstractAsyncContextManager[Any]) -> int:
    async with context as handle:
        return int(handle.token)
