"""The asyncio face of cacheguard, on a ``redis.asyncio.Redis`` client.

Every name here is the asyncio twin of a sync one and lives beside it: the guard
and loaders in :mod:`cacheguard.cache` (``async_guard``, ``async_loader``), the
locks in :mod:`cacheguard.locks` (``async_local``, ``async_two_tier``, and each
store's ``async_rwlock``), the notifier in :mod:`cacheguard.redis`. The
algorithms are the sync side's (sans-I/O flows), so sync and asyncio processes
share entries, locks, fills and announcements. Everything here belongs to one
event loop: use one client (and its guards and locks) per loop.

Names are imported on first use, so ``import cacheguard`` never loads asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.cache.async_guard import AsyncCacheGuard
    from cacheguard.cache.async_loader import AsyncCachedFunction, AsyncCacheLoader
    from cacheguard.locks.async_local import AsyncLocalRWLock
    from cacheguard.locks.async_two_tier import AsyncLockFactory, AsyncTwoTierRWLock
    from cacheguard.locks.redis.async_rwlock import AsyncLockHandle, AsyncRedisRWLock
    from cacheguard.locks.redis.async_watchdog import AsyncWatchdog, default_async_watchdog
    from cacheguard.locks.redlock.async_rwlock import AsyncRedlockHandle, AsyncRedlockRWLock
    from cacheguard.redis.async_notifier import AsyncNotifier, AsyncSubscription, async_notifier_for

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

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "AsyncCacheGuard": "cacheguard.cache.async_guard",
        "AsyncCacheLoader": "cacheguard.cache.async_loader",
        "AsyncCachedFunction": "cacheguard.cache.async_loader",
        "AsyncLocalRWLock": "cacheguard.locks.async_local",
        "AsyncNotifier": "cacheguard.redis.async_notifier",
        "AsyncSubscription": "cacheguard.redis.async_notifier",
        "async_notifier_for": "cacheguard.redis.async_notifier",
        "AsyncRedlockHandle": "cacheguard.locks.redlock.async_rwlock",
        "AsyncRedlockRWLock": "cacheguard.locks.redlock.async_rwlock",
        "AsyncLockHandle": "cacheguard.locks.redis.async_rwlock",
        "AsyncRedisRWLock": "cacheguard.locks.redis.async_rwlock",
        "AsyncLockFactory": "cacheguard.locks.async_two_tier",
        "AsyncTwoTierRWLock": "cacheguard.locks.async_two_tier",
        "AsyncWatchdog": "cacheguard.locks.redis.async_watchdog",
        "default_async_watchdog": "cacheguard.locks.redis.async_watchdog",
    },
)
