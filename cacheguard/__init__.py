"""cacheguard: read-through caching on Redis that does not stampede the database.

Use :class:`CacheGuard` with :class:`CacheLoader` or :func:`cached_with_lock`.
The foundation is a read-write lock shared by every thread of every process:
:class:`LocalRWLock` (threads), :class:`RedisRWLock` (processes, with leases, a
watchdog, fencing tokens and pub/sub wake-ups) and :class:`TwoTierRWLock` (the
local lock in front of the distributed one).
"""

from cacheguard.backoff import Backoff
from cacheguard.cache import (
    MISSING,
    CachedFunction,
    CacheEvent,
    CacheGuard,
    CacheLoader,
    Codec,
    JsonCodec,
    MsgpackCodec,
    PickleCodec,
    Stats,
)
from cacheguard.decorator import cached_with_lock
from cacheguard.exceptions import (
    BackendUnavailable,
    CacheGuardError,
    FillFailed,
    GuardClosed,
    KeyTemplateError,
    LockError,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
    RecursiveLoadError,
    SerializationError,
    WriteNotConfirmed,
    WrongEventLoop,
)
from cacheguard.locks import (
    LocalRWLock,
    LockFactory,
    LockHandle,
    Notifier,
    RedisRWLock,
    TwoTierRWLock,
    Watchdog,
    WeakRegistry,
)

__version__ = "0.1.0"

__all__ = [
    "MISSING",
    "BackendUnavailable",
    "Backoff",
    "CacheEvent",
    "CacheGuard",
    "CacheGuardError",
    "CacheLoader",
    "CachedFunction",
    "Codec",
    "FillFailed",
    "GuardClosed",
    "JsonCodec",
    "KeyTemplateError",
    "LocalRWLock",
    "LockError",
    "LockFactory",
    "LockHandle",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeout",
    "LockUpgradeError",
    "MsgpackCodec",
    "Notifier",
    "PickleCodec",
    "RecursiveLoadError",
    "RedisRWLock",
    "SerializationError",
    "Stats",
    "TwoTierRWLock",
    "Watchdog",
    "WeakRegistry",
    "WriteNotConfirmed",
    "WrongEventLoop",
    "__version__",
    "cached_with_lock",
]
