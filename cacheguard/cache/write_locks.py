"""The write path's locks from another lock store (``write_locks=`` of the guards).

By default ``guard.write`` and the SQLAlchemy hooks take the write side of the
key's two-tier lock in Redis, the same lock fills take in read mode. A guard made
with ``write_locks=`` takes the write locks from another store instead: any
callable that makes a read-write lock for a name, such as
``functools.partial(PostgresRWLock, engine)``, ``functools.partial(RedlockRWLock,
masters)`` or ``functools.partial(ZooKeeperRWLock, client)`` (an asyncio guard:
a store whose ``acquire_write`` is awaited, such as ``AsyncRedlockRWLock``).

Writes then exclude each other through that store. Fills keep their checks in
Redis, which stays the cache: a fill that began before a write's first
invalidation fails its store (the version check), one whose database snapshot
predates it fails too when its session is tracked (the watermark check), and the
write's second invalidation, after the commit, removes anything else filled from
the old rows. What fills no longer do is wait for a write in progress: they load
from the database as it is (see docs/design.md, "Write locks from another store").

The adapters give a store's lock the two calls the write path makes
(``acquire_write(timeout, holder=)`` in the entering thread or task, returning the
store's handle, whose ``lost`` the write path checks; ``release_write(holder=)``
possibly from another one), keeping the store's handles per holder.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from cacheguard._identity import ambient_holder
from cacheguard.checks import Seconds

__all__ = [
    "AsyncStoreWriteLock",
    "StoreWriteLock",
    "WriteLockStore",
    "async_store_write_locks",
    "checked_store",
    "store_write_locks",
]

WriteLockStore = Callable[[str], Any]
"""Makes the lock of a name: ``store(name)`` has ``acquire_write(timeout)`` returning a
handle with ``release()`` (awaitable both, for an asyncio guard)."""


class StoreWriteLock:
    """A store's lock of one name, driven by the sync write path."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.name: str = lock.name
        self._handles: dict[Any, list[Any]] = {}
        self._mutex = threading.Lock()

    def acquire_write(self, timeout: Seconds | None = None, *, holder: Any = None) -> Any:
        handle = self.lock.acquire_write(timeout)
        with self._mutex:
            self._handles.setdefault(_holder(holder), []).append(handle)
        return handle

    def release_write(self, *, holder: Any = None) -> None:
        with self._mutex:
            held = self._handles.get(_holder(holder))
            if not held:
                raise RuntimeError(f"{self.name!r}: this holder has no write hold to release")
            handle = held.pop()
            if not held:
                del self._handles[_holder(holder)]
        handle.release()


class AsyncStoreWriteLock:
    """A store's lock of one name, driven by the asyncio write path (holder: a task)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.name: str = lock.name
        self._handles: dict[Any, list[Any]] = {}

    async def acquire_write(self, timeout: Seconds | None = None, *, holder: Any = None) -> Any:
        pending = self.lock.acquire_write(timeout)
        if not inspect.isawaitable(pending):
            pending.release()  # a sync store's hold (it blocked the loop once): give it back
            raise TypeError(
                f"an AsyncCacheGuard's write_locks must be an asyncio store (its acquire_write "
                f"awaited), not {type(self.lock).__name__}"
            )
        handle = await pending
        self._handles.setdefault(holder or asyncio.current_task(), []).append(handle)
        return handle

    async def release_write(self, *, holder: Any = None) -> None:
        key = holder or asyncio.current_task()
        held = self._handles.get(key)
        if not held:
            raise RuntimeError(f"{self.name!r}: this task has no write hold to release")
        handle = held.pop()
        if not held:
            del self._handles[key]
        await handle.release()


def checked_store(store: WriteLockStore | None) -> WriteLockStore | None:
    """``store`` if it can make locks (a callable), else :class:`TypeError` at once."""
    if store is not None and not callable(store):
        raise TypeError(
            "write_locks must make a lock for a name (e.g. functools.partial(PostgresRWLock, "
            f"engine)), not {type(store).__name__}"
        )
    return store


def _holder(holder: Any) -> Any:
    return ambient_holder() if holder is None else holder


def store_write_locks(store: WriteLockStore | None) -> Callable[[str], StoreWriteLock] | None:
    """The write lock of a name from ``store``, for the sync guard; None without one."""
    checked = checked_store(store)
    return None if checked is None else lambda name: StoreWriteLock(checked(name))


def async_store_write_locks(
    store: WriteLockStore | None,
) -> Callable[[str], AsyncStoreWriteLock] | None:
    """The write lock of a name from ``store``, for the asyncio guard; None without one."""
    checked = checked_store(store)
    return None if checked is None else lambda name: AsyncStoreWriteLock(checked(name))
