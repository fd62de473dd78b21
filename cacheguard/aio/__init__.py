"""The asyncio twin of cacheguard, on a ``redis.asyncio.Redis`` client.

* ``guard``    -- :class:`AsyncCacheGuard`: the read path and the write path
* ``loader``   -- :class:`AsyncCacheLoader` (``cached_with_lock`` takes an ``async def``)
* ``driver``   -- the fill flow's asyncio driver
* ``two_tier`` -- :class:`AsyncTwoTierRWLock`: a task-level lock in front of Redis's
* ``local``    -- :class:`AsyncLocalRWLock`: the tasks of one loop
* ``rwlock``   -- :class:`AsyncRedisRWLock` and :class:`AsyncLockHandle`
* ``redlock``  -- :class:`AsyncRedlockRWLock`: the lock on a majority of N masters
* ``postgres`` -- ``AsyncPostgresRWLock``: advisory locks on PostgreSQL
* ``shape``    -- the methods and handle state every asyncio store shares
* ``notifier`` -- one pub/sub listener task per (event loop, connection pool)
* ``watchdog`` -- one lease-renewal task per event loop

The algorithms are the sync side's (sans-I/O flows), so sync and asyncio
processes share entries, locks, fills and announcements. Everything here
belongs to one event loop: use one client (and its guards and locks) per loop.
"""

from cacheguard.aio.guard import AsyncCacheGuard
from cacheguard.aio.loader import AsyncCachedFunction, AsyncCacheLoader
from cacheguard.aio.local import AsyncLocalRWLock
from cacheguard.aio.notifier import AsyncNotifier, AsyncSubscription, async_notifier_for
from cacheguard.aio.redlock import AsyncRedlockHandle, AsyncRedlockRWLock
from cacheguard.aio.rwlock import AsyncLockHandle, AsyncRedisRWLock
from cacheguard.aio.two_tier import AsyncLockFactory, AsyncTwoTierRWLock
from cacheguard.aio.watchdog import AsyncWatchdog, default_async_watchdog

__all__ = [
    "AsyncCacheGuard",
    "AsyncCacheLoader",
    "AsyncCachedFunction",
    "AsyncLocalRWLock",
    "AsyncLockFactory",
    "AsyncLockHandle",
    "AsyncNotifier",
    "AsyncRedisRWLock",
    "AsyncRedlockHandle",
    "AsyncRedlockRWLock",
    "AsyncSubscription",
    "AsyncTwoTierRWLock",
    "AsyncWatchdog",
    "async_notifier_for",
    "default_async_watchdog",
]
