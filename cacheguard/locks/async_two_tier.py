"""The two-tier lock on asyncio: a task-level read-write lock in front of the
distributed one.

The twin of :class:`cacheguard.locks.two_tier.TwoTierRWLock`: tasks of one event
loop first meet at the :class:`AsyncLocalRWLock`, so at most one of them talks to
Redis for a given lock at a time. The first local reader takes one distributed
read hold for the whole loop, later readers share it, the last one out releases
it; a shared hold that is lost, or that a remote writer waits behind, is not
joined (new readers wait for a fresh one). A writer takes the local write lock,
then the distributed write lock. One owner id per lock instance, so a write
holder taking the read lock re-enters its own distributed holding.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from cacheguard._identity import process_id
from cacheguard.checks import check_positive
from cacheguard.exceptions import LockNotHeldError, LockTimeout
from cacheguard.locks.async_local import AsyncLocalRWLock, current_task
from cacheguard.locks.redis.async_rwlock import AsyncLockHandle, AsyncRedisRWLock
from cacheguard.locks.registry import WeakRegistry
from cacheguard.redis.clients import AsyncClient

__all__ = ["AsyncLockFactory", "AsyncTwoTierRWLock"]

_instance_ids = itertools.count(1)


class AsyncTwoTierRWLock:
    """One event loop's view of a distributed read-write lock, local lock first."""

    def __init__(
        self,
        remote: AsyncRedisRWLock,
        *,
        timer: Callable[[], float] = time.monotonic,
        on_pin: Callable[[AsyncTwoTierRWLock, bool], None] | None = None,
    ) -> None:
        self.remote = remote
        self.name = remote.name
        self._timer = timer
        self._on_pin = on_pin
        self._instance = next(_instance_ids)
        self._local = AsyncLocalRWLock(remote.name, timer=timer)
        self._gate = asyncio.Lock()  # first-reader-in: one distributed read at a time
        self._readers = 0
        self._read_handle: AsyncLockHandle | None = None
        self._readers_gone: asyncio.Future[None] | None = None  # set when readers hit 0
        self._write_depth = 0
        self._write_handle: AsyncLockHandle | None = None
        self._holds = 0

    def _count_hold(self, delta: int) -> None:
        self._holds += delta
        if self._on_pin is not None and self._holds == (1 if delta > 0 else 0):
            self._on_pin(self, self._holds == 1)

    @property
    def local(self) -> AsyncLocalRWLock:
        """The in-loop tier (cache fills take its read side around their own script)."""
        return self._local

    @property
    def owner(self) -> str:
        return f"{process_id()}:att{self._instance}"

    # -- reading -----------------------------------------------------------------------

    async def acquire_read(self, timeout: float | None = None) -> AsyncLockHandle:
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        await self._local.acquire_read(limit)
        # A task already inside (a reader, or the writer downgrading) re-enters:
        # waiting for the shared hold's readers to leave would wait for itself.
        reentry = self._local.read_depth_of_me() > 1 or self._local.is_write_held_by_me()
        try:
            handle = await asyncio.wait_for(
                self._join_read(start + limit, reentry), max(limit - (self._timer() - start), 0.0)
            )
        except asyncio.TimeoutError:
            self._local.release_read()
            raise LockTimeout(name=self.name, mode="read", waited=self._timer() - start) from None
        except BaseException:
            self._local.release_read()
            raise
        self._count_hold(+1)
        return handle

    async def _join_read(self, deadline: float, reentry: bool) -> AsyncLockHandle:
        async with self._gate:
            handle = self._read_handle
            stale = handle is not None and (handle.lost or handle.writer_waiting)
            if self._readers and stale and not reentry:
                # Do not join a shared hold that is lost, or that a remote writer
                # waits behind: wait for its readers to leave, then take a fresh one.
                while self._readers:
                    self._readers_gone = asyncio.get_running_loop().create_future()
                    await self._readers_gone
            if self._readers == 0:
                self._read_handle = await self.remote.acquire_read(
                    max(deadline - self._timer(), 1e-3), owner=self.owner
                )
            self._readers += 1
            assert self._read_handle is not None
            return self._read_handle

    async def release_read(self) -> None:
        if not self._local.read_depth_of_me():
            raise LockNotHeldError(
                f"this task does not hold the read lock {self.name!r}", name=self.name, mode="read"
            )
        try:
            self._readers -= 1
            if self._readers == 0:
                handle, self._read_handle = self._read_handle, None
                gone = self._readers_gone
                if gone is not None and not gone.done():
                    gone.set_result(None)  # a reader waits for a fresh hold
                if handle is not None:
                    await handle.release()
        finally:
            # Local last: a local writer must not get in while our distributed
            # read hold (same owner) still exists, or it would be an upgrade.
            self._local.release_read()
            self._count_hold(-1)

    # -- writing -----------------------------------------------------------------------

    async def acquire_write(self, timeout: float | None = None) -> AsyncLockHandle:
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        await self._local.acquire_write(limit)
        if self._write_depth == 0:
            try:
                self._write_handle = await self.remote.acquire_write(
                    max(limit - (self._timer() - start), 1e-3), owner=self.owner
                )
            except BaseException:
                self._local.release_write()
                raise
        self._write_depth += 1
        assert self._write_handle is not None
        self._count_hold(+1)
        return self._write_handle

    async def release_write(self, *, holder: asyncio.Task[Any] | None = None) -> None:
        """Release one write hold of this task, or of task ``holder``."""
        if self._local.writer is None or self._local.writer is not (holder or current_task()):
            raise LockNotHeldError(
                f"this task does not hold the write lock {self.name!r}",
                name=self.name,
                mode="write",
            )
        try:
            self._write_depth -= 1
            if self._write_depth == 0:
                handle, self._write_handle = self._write_handle, None
                if handle is not None:
                    await handle.release()
        finally:
            self._local.release_write(holder=holder)
            self._count_hold(-1)

    # -- context managers -----------------------------------------------------------------

    @asynccontextmanager
    async def read(self, timeout: float | None = None) -> AsyncIterator[AsyncLockHandle]:
        handle = await self.acquire_read(timeout)
        try:
            yield handle
        finally:
            await self.release_read()

    @asynccontextmanager
    async def write(self, timeout: float | None = None) -> AsyncIterator[AsyncLockHandle]:
        handle = await self.acquire_write(timeout)
        try:
            yield handle
        finally:
            await self.release_write()

    def __repr__(self) -> str:
        return (
            f"<AsyncTwoTierRWLock {self.name!r} readers={self._readers} writer={self._write_depth}>"
        )


class AsyncLockFactory:
    """One shared :class:`AsyncTwoTierRWLock` per name, held weakly (a lock lives
    while someone uses it; a held lock is pinned)."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str = "cg",
        lease: float = 30.0,
        timeout: float = 30.0,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.lease = check_positive("lease", lease)
        self.timeout = check_positive("timeout", timeout)
        self._timer = timer
        self._registry: WeakRegistry[AsyncTwoTierRWLock] = WeakRegistry(self._create)
        self._pinned: dict[str, AsyncTwoTierRWLock] = {}

    def rwlock(self, name: str) -> AsyncTwoTierRWLock:
        return self._registry.get(name)

    def __len__(self) -> int:
        return len(self._registry)

    def _create(self, name: str) -> AsyncTwoTierRWLock:
        remote = AsyncRedisRWLock(
            self.client,
            name,
            lease=self.lease,
            timeout=self.timeout,
            namespace=self.namespace,
            timer=self._timer,
        )
        return AsyncTwoTierRWLock(remote, timer=self._timer, on_pin=self._pin)

    def _pin(self, lock: AsyncTwoTierRWLock, held: bool) -> None:
        if held:
            self._pinned[lock.name] = lock
        elif self._pinned.get(lock.name) is lock:
            del self._pinned[lock.name]
