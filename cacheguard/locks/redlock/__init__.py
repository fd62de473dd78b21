"""Redlock: the read-write lock on a majority of N independent Redis masters.

* ``quorum``       -- its decisions, sans I/O: rounds, renewals, releases, tidy-ups
* ``rwlock``       -- :class:`RedlockRWLock`, the sync driver
* ``async_rwlock`` -- :class:`AsyncRedlockRWLock`, the asyncio driver
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.locks.redlock.async_rwlock import (
        AsyncRedlockHandle,
        AsyncRedlockRWLock,
        AsyncRedlockWatchdog,
        default_async_redlock_watchdog,
    )
    from cacheguard.locks.redlock.rwlock import (
        RAISE_FENCE,
        RETRY,
        RedlockHandle,
        RedlockRWLock,
        RedlockWatchdog,
        Round,
        RoundVerdict,
        default_redlock_watchdog,
        no_majority_message,
        release_error,
        renewal_verdict,
        settle_round,
        tally_round,
    )

__all__ = [
    "RAISE_FENCE",
    "RETRY",
    "AsyncRedlockHandle",
    "AsyncRedlockRWLock",
    "AsyncRedlockWatchdog",
    "RedlockHandle",
    "RedlockRWLock",
    "RedlockWatchdog",
    "Round",
    "RoundVerdict",
    "default_async_redlock_watchdog",
    "default_redlock_watchdog",
    "no_majority_message",
    "release_error",
    "renewal_verdict",
    "settle_round",
    "tally_round",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "RAISE_FENCE": "cacheguard.locks.redlock.rwlock",
        "RETRY": "cacheguard.locks.redlock.rwlock",
        "RedlockHandle": "cacheguard.locks.redlock.rwlock",
        "RedlockRWLock": "cacheguard.locks.redlock.rwlock",
        "RedlockWatchdog": "cacheguard.locks.redlock.rwlock",
        "Round": "cacheguard.locks.redlock.rwlock",
        "RoundVerdict": "cacheguard.locks.redlock.rwlock",
        "default_redlock_watchdog": "cacheguard.locks.redlock.rwlock",
        "no_majority_message": "cacheguard.locks.redlock.rwlock",
        "release_error": "cacheguard.locks.redlock.rwlock",
        "renewal_verdict": "cacheguard.locks.redlock.rwlock",
        "settle_round": "cacheguard.locks.redlock.rwlock",
        "tally_round": "cacheguard.locks.redlock.rwlock",
        "AsyncRedlockHandle": "cacheguard.locks.redlock.async_rwlock",
        "AsyncRedlockRWLock": "cacheguard.locks.redlock.async_rwlock",
        "AsyncRedlockWatchdog": "cacheguard.locks.redlock.async_rwlock",
        "default_async_redlock_watchdog": "cacheguard.locks.redlock.async_rwlock",
    },
)
