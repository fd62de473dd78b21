"""``cacheguard.aio.postgres``, kept so that code written for it keeps working:
the asyncio PostgreSQL lock now lives in :mod:`cacheguard.locks.postgres.async_rwlock`."""

from __future__ import annotations

from cacheguard.locks.postgres.async_rwlock import (
    AsyncPostgresLockHandle,
    AsyncPostgresRWLock,
    close_idle_async_connections,
)

__all__ = [
    "AsyncPostgresLockHandle",
    "AsyncPostgresRWLock",
    "close_idle_async_connections",
]
