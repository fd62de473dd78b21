"""The two-tier lock: a local read-write lock in front of the distributed one.

Threads of one process first meet at the :class:`LocalRWLock`, so at most one of
them talks to Redis for a given lock at a time:

* readers: the first local reader takes one distributed read hold for the
  whole process, later readers share it, the last one out releases it;
* writers: a writer takes the local write lock (which waits for local readers
  to leave), then the distributed write lock.

All distributed holds of one :class:`TwoTierRWLock` use one owner id per
process, so a write holder taking the read lock (a downgrade) re-enters its own
distributed holding. Holds are per thread: release from the acquiring thread.
Get instances from :class:`LockFactory` so every thread of a process shares the
one instance per name.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from cacheguard._identity import process_id
from cacheguard.exceptions import LockNotHeldError, LockTimeout
from cacheguard.locks.local import LocalRWLock
from cacheguard.locks.redis_rwlock import (
    LockHandle,
    LostCallback,
    RedisRWLock,
    check_positive,
    release_on_exit,
)
from cacheguard.locks.registry import WeakRegistry
from cacheguard.locks.watchdog import Watchdog

__all__ = ["LockFactory", "TwoTierRWLock"]

_instance_ids = itertools.count(1)


class TwoTierRWLock:
    """One process's view of a distributed read-write lock, local lock first."""

    def __init__(
        self,
        remote: RedisRWLock,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.remote = remote
        self.name = remote.name
        self._timer = timer
        self._local = LocalRWLock(remote.name, timer=timer)
        self._instance = next(_instance_ids)
        # Serialises the first-reader-in / last-reader-out transitions.
        self._gate = threading.Lock()
        self._readers = 0
        self._read_handle: LockHandle | None = None
        # Touched only by the thread holding the local write lock.
        self._write_depth = 0
        self._write_handle: LockHandle | None = None

    @property
    def owner(self) -> str:
        """The distributed owner id this process uses for this lock."""
        return f"{process_id()}:tt{self._instance}"

    # -- reading -----------------------------------------------------------------------

    def acquire_read(self, timeout: float | None = None) -> LockHandle:
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        self._local.acquire_read(limit)
        try:
            remaining = limit - (self._timer() - start)
            if remaining <= 0 or not self._gate.acquire(timeout=remaining):
                raise LockTimeout(name=self.name, mode="read", waited=self._timer() - start)
            try:
                if self._readers == 0:
                    self._read_handle = self.remote.acquire_read(
                        max(limit - (self._timer() - start), 1e-3), owner=self.owner
                    )
                self._readers += 1
                assert self._read_handle is not None
                return self._read_handle
            finally:
                self._gate.release()
        except BaseException:
            self._local.release_read()
            raise

    def release_read(self) -> None:
        if not self._local.read_depth_of_me():
            raise LockNotHeldError(
                f"this thread does not hold the read lock {self.name!r}",
                name=self.name,
                mode="read",
            )
        try:
            with self._gate:
                self._readers -= 1
                if self._readers == 0:
                    handle, self._read_handle = self._read_handle, None
                    if handle is not None:
                        handle.release()
        finally:
            # Local last: a local writer must not get in while our distributed
            # read hold (same owner) still exists, or it would be an upgrade.
            self._local.release_read()

    # -- writing -----------------------------------------------------------------------

    def acquire_write(self, timeout: float | None = None) -> LockHandle:
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        self._local.acquire_write(limit)
        if self._write_depth == 0:
            try:
                self._write_handle = self.remote.acquire_write(
                    max(limit - (self._timer() - start), 1e-3), owner=self.owner
                )
            except BaseException:
                self._local.release_write()
                raise
        self._write_depth += 1
        assert self._write_handle is not None
        return self._write_handle

    def release_write(self) -> None:
        if not self._local.is_write_held_by_me():
            raise LockNotHeldError(
                f"this thread does not hold the write lock {self.name!r}",
                name=self.name,
                mode="write",
            )
        try:
            self._write_depth -= 1
            if self._write_depth == 0:
                handle, self._write_handle = self._write_handle, None
                if handle is not None:
                    handle.release()
        finally:
            self._local.release_write()

    # -- context managers -----------------------------------------------------------------

    @contextmanager
    def read(self, timeout: float | None = None) -> Iterator[LockHandle]:
        handle = self.acquire_read(timeout)
        with release_on_exit(self.release_read):
            yield handle

    @contextmanager
    def write(self, timeout: float | None = None) -> Iterator[LockHandle]:
        handle = self.acquire_write(timeout)
        with release_on_exit(self.release_write):
            yield handle

    def __repr__(self) -> str:
        return f"<TwoTierRWLock {self.name!r} readers={self._readers} writer={self._write_depth}>"


class LockFactory:
    """Hands out one shared :class:`TwoTierRWLock` per name for a process.

    Instances are kept in a weak registry: a lock lives while someone uses it,
    so touching a million names leaves no million locks behind.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str = "cg",
        lease: float = 30.0,
        timeout: float = 30.0,
        watchdog: Watchdog | bool = True,
        on_lost: LostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.lease = check_positive("lease", lease)
        self.timeout = check_positive("timeout", timeout)
        self._watchdog = watchdog
        self._on_lost = on_lost
        self._timer = timer
        self._registry: WeakRegistry[TwoTierRWLock] = WeakRegistry(self._create)

    def rwlock(self, name: str) -> TwoTierRWLock:
        return self._registry.get(name)

    def __len__(self) -> int:
        return len(self._registry)

    def _create(self, name: str) -> TwoTierRWLock:
        remote = RedisRWLock(
            self.client,
            name,
            lease=self.lease,
            timeout=self.timeout,
            namespace=self.namespace,
            watchdog=self._watchdog,
            on_lost=self._on_lost,
            timer=self._timer,
        )
        return TwoTierRWLock(remote, timer=self._timer)
