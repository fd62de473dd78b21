"""cacheguard: read-through caching on Redis that does not stampede the database.

The foundation is a read-write lock shared by every thread of every process:
:class:`LocalRWLock` (threads), :class:`RedisRWLock` (processes, with leases, a
watchdog, fencing tokens and pub/sub wake-ups) and :class:`TwoTierRWLock` (the
local lock in front of the distributed one).
"""

from cacheguard.backoff import Backoff
from cacheguard.exceptions import (
    BackendUnavailable,
    CacheGuardError,
    LockError,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
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
    "BackendUnavailable",
    "Backoff",
    "CacheGuardError",
    "LocalRWLock",
    "LockError",
    "LockFactory",
    "LockHandle",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeout",
    "LockUpgradeError",
    "Notifier",
    "RedisRWLock",
    "TwoTierRWLock",
    "Watchdog",
    "WeakRegistry",
    "__version__",
]
