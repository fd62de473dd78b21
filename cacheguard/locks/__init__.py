"""Locks: one read-write lock contract on several stores, and the two-tier lock.

* ``local`` / ``async_local``            -- the holders of one process (threads, tasks)
* ``two_tier`` / ``async_two_tier``      -- the local lock in front of a distributed one
  (:class:`TwoTierRWLock`, :class:`LockFactory`)
* ``shape`` / ``async_shape``            -- what every store's lock offers, written once
* ``protocol``                           -- the acquire algorithm, sans I/O
* ``registry``                           -- per-name objects held weakly
* ``redis/``     -- the lock on one Redis hash: Lua, wire, lease book, watchdogs, drivers
* ``redlock/``   -- the same lock on a majority of N independent Redis masters
* ``postgres/``  -- on PostgreSQL advisory locks (the ``postgres`` extra)
* ``zookeeper/`` -- on ZooKeeper's ephemeral sequential znodes (the ``zookeeper`` extra)

In each store's folder ``rwlock.py`` is the sync driver and ``async_rwlock.py`` its
asyncio twin. Names are imported on first use. Every lease and timeout a lock
takes is seconds or a ``datetime.timedelta``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard._identity import Holder
    from cacheguard.locks.local import LocalRWLock
    from cacheguard.locks.redis.rwlock import LockHandle, RedisRWLock
    from cacheguard.locks.redis.watchdog import Watchdog as Watchdog
    from cacheguard.locks.redlock.rwlock import RedlockHandle, RedlockRWLock
    from cacheguard.locks.registry import WeakRegistry as WeakRegistry
    from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock
    from cacheguard.redis.notifier import Notifier as Notifier

__all__ = [
    "Holder",
    "LocalRWLock",
    "LockFactory",
    "LockHandle",
    "RedisRWLock",
    "RedlockHandle",
    "RedlockRWLock",
    "TwoTierRWLock",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "Holder": "cacheguard._identity",
        "LocalRWLock": "cacheguard.locks.local",
        "LockHandle": "cacheguard.locks.redis.rwlock",
        "RedisRWLock": "cacheguard.locks.redis.rwlock",
        "RedlockHandle": "cacheguard.locks.redlock.rwlock",
        "RedlockRWLock": "cacheguard.locks.redlock.rwlock",
        "LockFactory": "cacheguard.locks.two_tier",
        "TwoTierRWLock": "cacheguard.locks.two_tier",
        "WeakRegistry": "cacheguard.locks.registry",
        "Notifier": "cacheguard.redis.notifier",
        "Watchdog": "cacheguard.locks.redis.watchdog",
    },
)
