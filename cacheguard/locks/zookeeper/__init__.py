"""The read-write lock on ZooKeeper, through kazoo (the ``zookeeper`` extra).

* ``rwlock`` -- :class:`ZooKeeperRWLock`: ephemeral sequential znodes (sync only)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.locks.zookeeper.rwlock import ZooKeeperLockHandle, ZooKeeperRWLock

__all__ = [
    "ZooKeeperLockHandle",
    "ZooKeeperRWLock",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "ZooKeeperLockHandle": "cacheguard.locks.zookeeper.rwlock",
        "ZooKeeperRWLock": "cacheguard.locks.zookeeper.rwlock",
    },
)
