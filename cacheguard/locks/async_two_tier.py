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

Lock cohorting, as in the sync lock: a writer releasing while other tasks wait to
write hands them the local write lock with the distributed hold kept (no round
trip), at most ``cohort_limit`` times in a row and only while the hold is sure to
last; then it goes back to Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from cacheguard._identity import process_id
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import LockNotHeldError, LockTimeout
from cacheguard.locks.async_local import AsyncLocalRWLock, current_task
from cacheguard.locks.redis.async_rwlock import AsyncLockHandle, AsyncRedisRWLock
from cacheguard.locks.registry import WeakRegistry
from cacheguard.locks.two_tier import DEFAULT_COHORT_LIMIT, check_cohort_limit, may_hand_over
from cacheguard.redis.clients import AsyncClient

__all__ = ["AsyncLockFactory", "AsyncTwoTierRWLock"]

log = logging.getLogger("cacheguard.lock")

_instance_ids = itertools.count(1)


class AsyncTwoTierRWLock:
    """One event loop's view of a distributed read-write lock, local lock first;
    ``cohort_limit`` as for :class:`~cacheguard.locks.TwoTierRWLock`."""

    def __init__(
        self,
        remote: AsyncRedisRWLock,
        *,
        timer: Callable[[], float] = time.monotonic,
        on_pin: Callable[[AsyncTwoTierRWLock, bool], None] | None = None,
        cohort_limit: int = DEFAULT_COHORT_LIMIT,
    ) -> None:
        self.remote = remote
        self.name = remote.name
        self.cohort_limit = check_cohort_limit(cohort_limit)
        self._timer = timer
        self._on_pin = on_pin
        self._instance = next(_instance_ids)
        self._local = AsyncLocalRWLock(remote.name, timer=timer, on_dropped=self._drop_unclaimed)
        self._gate = asyncio.Lock()  # first-reader-in: one distributed read at a time
        self._readers = 0
        self._read_handle: AsyncLockHandle | None = None
        self._readers_gone: asyncio.Future[None] | None = None  # set when readers hit 0
        self._write_depth = 0
        self._write_handle: AsyncLockHandle | None = None
        self._handovers = 0  # of the distributed write hold, since it was taken
        self._giving_back: set[asyncio.Task[None]] = set()
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

    async def acquire_read(self, timeout: Seconds | None = None) -> AsyncLockHandle:
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

    async def acquire_write(self, timeout: Seconds | None = None) -> AsyncLockHandle:
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        await self._local.acquire_write(limit, successor=True)
        if self._write_depth == 0:
            kept = self._write_handle
            if kept is None or kept.lost:
                # None, or lost since it was handed over (the loss was announced, and
                # a lost holding has nothing to give back): take a fresh one.
                self._write_handle = None
                self._handovers = 0
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
        """Release one write hold of this task, or of task ``holder``. The last one
        hands the lock to the oldest task waiting to write, keeping the distributed
        hold, while the cohort is under ``cohort_limit`` and the hold is sure to last;
        else the hold is released in Redis (:class:`LockLostError` if it was gone)."""
        if self._local.writer is None or self._local.writer is not (holder or current_task()):
            raise LockNotHeldError(
                f"this task does not hold the write lock {self.name!r}",
                name=self.name,
                mode="write",
            )
        handed = False
        try:
            self._write_depth -= 1
            if self._write_depth == 0:
                handle = self._write_handle
                if (
                    handle is not None
                    and self._handovers < self.cohort_limit
                    and may_hand_over(handle)
                ):
                    handed = self._local.hand_over_write(holder=holder)
                    if handed:
                        self._handovers += 1
                        return
                self._write_handle = None
                self._handovers = 0
                if handle is not None:
                    await handle.release()
        finally:
            if not handed:
                self._local.release_write(holder=holder)
            self._count_hold(-1)

    def _drop_unclaimed(self) -> None:
        """A hand-over found nobody to take it (its successor was cancelled before it
        took the lock, and none waited behind): give back the distributed hold kept
        for it, in the background (this runs in the cancelled task's unwinding)."""
        kept = self._write_handle
        if kept is None or self._local.writer is not None:
            return
        self._write_handle = None
        self._handovers = 0
        task = asyncio.get_running_loop().create_task(self._give_back(kept))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _give_back(self, handle: AsyncLockHandle) -> None:
        try:
            await handle.release()
        except Exception as exc:  # lost, or Redis away: its lease ends it
            log.warning("giving back an unclaimed write hold of %r failed: %s", self.name, exc)

    # -- context managers -----------------------------------------------------------------

    @asynccontextmanager
    async def read(self, timeout: Seconds | None = None) -> AsyncIterator[AsyncLockHandle]:
        handle = await self.acquire_read(timeout)
        try:
            yield handle
        finally:
            await self.release_read()

    @asynccontextmanager
    async def write(self, timeout: Seconds | None = None) -> AsyncIterator[AsyncLockHandle]:
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
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        timer: Callable[[], float] = time.monotonic,
        cohort_limit: int = DEFAULT_COHORT_LIMIT,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.lease = check_positive("lease", lease)
        self.timeout = check_positive("timeout", timeout)
        self.cohort_limit = check_cohort_limit(cohort_limit)
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
        return AsyncTwoTierRWLock(
            remote, timer=self._timer, on_pin=self._pin, cohort_limit=self.cohort_limit
        )

    def _pin(self, lock: AsyncTwoTierRWLock, held: bool) -> None:
        if held:
            self._pinned[lock.name] = lock
        elif self._pinned.get(lock.name) is lock:
            del self._pinned[lock.name]
