"""The read-write lock on PostgreSQL advisory locks (the ``postgres`` extra).

* ``core``         -- the store's decisions and statement flows, sans waiting
* ``rwlock``       -- :class:`PostgresRWLock`, the sync driver (psycopg 3 through SQLAlchemy)
* ``async_rwlock`` -- :class:`AsyncPostgresRWLock`, the asyncio driver
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.locks.postgres.async_rwlock import (
        AsyncPostgresLockHandle,
        AsyncPostgresRWLock,
        close_idle_async_connections,
    )
    from cacheguard.locks.postgres.rwlock import (
        DEFAULT_FENCE_SEQUENCE,
        KEEPALIVE_WITHIN,
        MAX_IDLE,
        LockSettings,
        PostgresLockHandle,
        PostgresRWLock,
        SessionWatch,
        TransactionLock,
        advisory_key,
        close_idle_connections,
        key_parts,
        lock_settings,
        lock_timeout_ms,
    )

__all__ = [
    "DEFAULT_FENCE_SEQUENCE",
    "KEEPALIVE_WITHIN",
    "MAX_IDLE",
    "AsyncPostgresLockHandle",
    "AsyncPostgresRWLock",
    "LockSettings",
    "PostgresLockHandle",
    "PostgresRWLock",
    "SessionWatch",
    "TransactionLock",
    "advisory_key",
    "close_idle_async_connections",
    "close_idle_connections",
    "key_parts",
    "lock_settings",
    "lock_timeout_ms",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "DEFAULT_FENCE_SEQUENCE": "cacheguard.locks.postgres.rwlock",
        "KEEPALIVE_WITHIN": "cacheguard.locks.postgres.rwlock",
        "LockSettings": "cacheguard.locks.postgres.rwlock",
        "MAX_IDLE": "cacheguard.locks.postgres.rwlock",
        "PostgresLockHandle": "cacheguard.locks.postgres.rwlock",
        "PostgresRWLock": "cacheguard.locks.postgres.rwlock",
        "SessionWatch": "cacheguard.locks.postgres.rwlock",
        "TransactionLock": "cacheguard.locks.postgres.rwlock",
        "advisory_key": "cacheguard.locks.postgres.rwlock",
        "close_idle_connections": "cacheguard.locks.postgres.rwlock",
        "key_parts": "cacheguard.locks.postgres.rwlock",
        "lock_settings": "cacheguard.locks.postgres.rwlock",
        "lock_timeout_ms": "cacheguard.locks.postgres.rwlock",
        "AsyncPostgresLockHandle": "cacheguard.locks.postgres.async_rwlock",
        "AsyncPostgresRWLock": "cacheguard.locks.postgres.async_rwlock",
        "close_idle_async_connections": "cacheguard.locks.postgres.async_rwlock",
    },
)
