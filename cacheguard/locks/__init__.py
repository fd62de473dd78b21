"""Locks: the local RW lock, the distributed RW lock on Redis and on the other
stores (Redlock, PostgreSQL, ZooKeeper), and the two-tier lock.

Layout (each module small, each with one job; the asyncio twins are in
:mod:`cacheguard.aio`):

* ``shape``       -- the methods and handle state every store shares (acquire, try,
  ``read()``/``write()``, on_lost); a store writes only ``_acquire`` and ``_try_once``
* ``local``       -- :class:`LocalRWLock`, the holders of one process (``Holder``:
  ``cacheguard/_identity.py``)
* ``registry``    -- :class:`WeakRegistry`, per-name objects held weakly
* ``protocol``    -- the acquire algorithm, sans I/O (shared by sync and async drivers)
* ``scripts``     -- the Lua scripts and their KEYS/ARGV contracts
* ``wire``        -- every lock script call (KEYS, ARGV) and reply parser, sync and asyncio
* ``redis_rwlock``-- :class:`RedisRWLock` and :class:`LockHandle`, the sync driver
* ``notifier``    -- one pub/sub listener per process for release wake-ups
* ``watchdog``    -- one renewal thread per process for leases (decisions in ``LeaseBook``)
* ``two_tier``    -- :class:`TwoTierRWLock` and :class:`LockFactory`
* ``quorum``      -- Redlock's decisions, sans I/O (rounds, renewals, releases, tidy-ups)
* ``redlock``     -- :class:`RedlockRWLock`: the same lock on a majority of N independent
  masters, the sync driver of ``quorum``
* ``postgres_core``-- the PostgreSQL store's decisions and statement flows, sans waiting
* ``postgres``    -- ``PostgresRWLock``: advisory locks on PostgreSQL, the sync driver of
  ``postgres_core`` (the ``postgres`` extra)
* ``zookeeper``   -- ``ZooKeeperRWLock``: the same lock on ZooKeeper's ephemeral sequential
  znodes (import it from there: it needs the ``zookeeper`` extra, kazoo)
"""

from cacheguard._identity import Holder
from cacheguard.locks.local import LocalRWLock
from cacheguard.locks.notifier import Notifier
from cacheguard.locks.redis_rwlock import LockHandle, RedisRWLock
from cacheguard.locks.redlock import RedlockHandle, RedlockRWLock
from cacheguard.locks.registry import WeakRegistry
from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock
from cacheguard.locks.watchdog import Watchdog

__all__ = [
    "Holder",
    "LocalRWLock",
    "LockFactory",
    "LockHandle",
    "Notifier",
    "RedisRWLock",
    "RedlockHandle",
    "RedlockRWLock",
    "TwoTierRWLock",
    "Watchdog",
    "WeakRegistry",
]
