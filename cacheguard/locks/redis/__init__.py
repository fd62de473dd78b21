"""The read-write lock on one Redis hash.

* ``lua``            -- the acquire / release / renew / withdraw scripts and their contracts
* ``wire``           -- every script call (KEYS, ARGV) and reply parser, sans I/O
* ``lease``          -- the lease book: which holds are renewed when, and what replies mean
* ``rwlock``         -- :class:`RedisRWLock` and :class:`LockHandle`, the sync driver
* ``async_rwlock``   -- their asyncio twins
* ``watchdog`` / ``async_watchdog`` -- one renewal thread per process / task per loop
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.locks.redis.async_rwlock import AsyncLockHandle, AsyncRedisRWLock
    from cacheguard.locks.redis.rwlock import LockHandle, RedisRWLock

__all__ = [
    "AsyncLockHandle",
    "AsyncRedisRWLock",
    "LockHandle",
    "RedisRWLock",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "LockHandle": "cacheguard.locks.redis.rwlock",
        "RedisRWLock": "cacheguard.locks.redis.rwlock",
        "AsyncLockHandle": "cacheguard.locks.redis.async_rwlock",
        "AsyncRedisRWLock": "cacheguard.locks.redis.async_rwlock",
    },
)
