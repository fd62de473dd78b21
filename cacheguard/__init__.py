"""cacheguard: read-through caching on Redis that does not stampede the database.

Use :class:`CacheGuard` with :class:`CacheLoader` or :func:`cached_with_lock`
(their asyncio twins are in :mod:`cacheguard.aio`); :func:`use` installs the guard
that functions decorated without one read through. The foundation is a
read-write lock shared by every thread of every process: :class:`LocalRWLock`
(threads), :class:`RedisRWLock` (processes, with leases, a watchdog, fencing
tokens and pub/sub wake-ups) and :class:`TwoTierRWLock` (the local lock in front
of the distributed one); more lock stores are in :mod:`cacheguard.locks`.

The names below are imported on first use: ``import cacheguard`` alone loads the
exceptions and nothing of Redis, asyncio or the lock stores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports
from cacheguard.exceptions import (
    BackendUnavailable,
    CacheGuardError,
    FillFailed,
    GuardClosed,
    IncompleteLoad,
    KeyTemplateError,
    LockError,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
    NoDefaultGuard,
    RecursiveLoadError,
    SerializationError,
    WriteNotConfirmed,
    WrongEventLoop,
)

if TYPE_CHECKING:
    from cacheguard.backoff import Backoff as Backoff
    from cacheguard.cache.codec import Codec, JsonCodec, MsgpackCodec, PickleCodec
    from cacheguard.cache.decorator import cached_with_lock
    from cacheguard.cache.default import use
    from cacheguard.cache.guard import MISSING, CacheGuard
    from cacheguard.cache.loader import CachedFunction, CacheLoader
    from cacheguard.cache.many import cached_many_with_lock
    from cacheguard.cache.stats import CacheEvent, Stats
    from cacheguard.checks import Seconds
    from cacheguard.locks.local import LocalRWLock
    from cacheguard.locks.redis.rwlock import LockHandle, RedisRWLock
    from cacheguard.locks.redis.watchdog import Watchdog as Watchdog
    from cacheguard.locks.registry import WeakRegistry as WeakRegistry
    from cacheguard.locks.two_tier import LockFactory as LockFactory
    from cacheguard.locks.two_tier import TwoTierRWLock
    from cacheguard.redis.notifier import Notifier as Notifier

__all__ = [
    "MISSING",
    "BackendUnavailable",
    "CacheEvent",
    "CacheGuard",
    "CacheGuardError",
    "CacheLoader",
    "CachedFunction",
    "Codec",
    "FillFailed",
    "GuardClosed",
    "IncompleteLoad",
    "JsonCodec",
    "KeyTemplateError",
    "LocalRWLock",
    "LockError",
    "LockHandle",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeout",
    "LockUpgradeError",
    "MsgpackCodec",
    "NoDefaultGuard",
    "PickleCodec",
    "RecursiveLoadError",
    "RedisRWLock",
    "Seconds",
    "SerializationError",
    "Stats",
    "TwoTierRWLock",
    "WriteNotConfirmed",
    "WrongEventLoop",
    "__version__",
    "cached_many_with_lock",
    "cached_with_lock",
    "use",
]

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "CacheGuard": "cacheguard.cache.guard",
        "MISSING": "cacheguard.cache.guard",
        "CacheLoader": "cacheguard.cache.loader",
        "CachedFunction": "cacheguard.cache.loader",
        "cached_with_lock": "cacheguard.cache.decorator",
        "cached_many_with_lock": "cacheguard.cache.many",
        "use": "cacheguard.cache.default",
        "Codec": "cacheguard.cache.codec",
        "JsonCodec": "cacheguard.cache.codec",
        "MsgpackCodec": "cacheguard.cache.codec",
        "PickleCodec": "cacheguard.cache.codec",
        "CacheEvent": "cacheguard.cache.stats",
        "Stats": "cacheguard.cache.stats",
        "Seconds": "cacheguard.checks",
        "LocalRWLock": "cacheguard.locks.local",
        "LockHandle": "cacheguard.locks.redis.rwlock",
        "RedisRWLock": "cacheguard.locks.redis.rwlock",
        "LockFactory": "cacheguard.locks.two_tier",
        "TwoTierRWLock": "cacheguard.locks.two_tier",
        "Backoff": "cacheguard.backoff",
        "Notifier": "cacheguard.redis.notifier",
        "Watchdog": "cacheguard.locks.redis.watchdog",
        "WeakRegistry": "cacheguard.locks.registry",
    },
)
