"""asyncio twins of cacheguard's building blocks, on a ``redis.asyncio.Redis`` client.

* ``rwlock``   -- :class:`AsyncRedisRWLock` and :class:`AsyncLockHandle`
* ``notifier`` -- one pub/sub listener task per (event loop, connection pool)
* ``watchdog`` -- one lease-renewal task per event loop

Everything here belongs to one event loop: use one client (and its locks) per loop.
"""

from cacheguard.aio.notifier import AsyncNotifier, AsyncSubscription, async_notifier_for
from cacheguard.aio.rwlock import AsyncLockHandle, AsyncRedisRWLock
from cacheguard.aio.watchdog import AsyncWatchdog, default_async_watchdog

__all__ = [
    "AsyncLockHandle",
    "AsyncNotifier",
    "AsyncRedisRWLock",
    "AsyncSubscription",
    "AsyncWatchdog",
    "async_notifier_for",
    "default_async_watchdog",
]
