"""An in-process read-write lock for the tasks of one event loop.

The asyncio twin of :class:`cacheguard.locks.local.LocalRWLock`, with the same
rules: writer-preferring, reentrant (per task), downgrade allowed, upgrade
refused with :class:`LockUpgradeError`, every acquisition bounded by a timeout
(:class:`LockTimeout`), and the hand-over (:meth:`AsyncLocalRWLock.hand_over_write`:
the write lock passed straight to the oldest waiting successor). Holds belong to
tasks. Releasing never awaits, so it is safe in ``finally`` blocks and from a task
being cancelled; a waiter that is cancelled leaves nothing behind (one handed the
lock passes it on).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cacheguard.checks import Seconds, check_non_negative
from cacheguard.exceptions import LockNotHeldError, LockTimeout, LockUpgradeError

__all__ = ["AsyncLocalRWLock", "current_task"]


def current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cacheguard's asyncio locks must be used from inside a task")
    return task


class AsyncLocalRWLock:
    """Writer-preferring, reentrant read-write lock for the tasks of one loop."""

    __slots__ = (
        "__weakref__",
        "_on_dropped",
        "_readers",
        "_successors",
        "_timer",
        "_waiters",
        "_waiting_writers",
        "_write_depth",
        "_writer",
        "name",
    )

    def __init__(
        self,
        name: str = "",
        *,
        timer: Callable[[], float] = time.monotonic,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._timer = timer
        self._writer: asyncio.Task[Any] | None = None
        self._write_depth = 0
        self._readers: dict[asyncio.Task[Any], int] = {}
        self._waiting_writers = 0
        self._waiters: set[asyncio.Future[None]] = set()
        # Waiting writers that take a handed-over write lock, oldest first.
        self._successors: deque[asyncio.Task[Any]] = deque()
        # Called when a hand-over found nobody to take it after all.
        self._on_dropped = on_dropped

    # -- reading ---------------------------------------------------------------

    async def acquire_read(self, timeout: Seconds | None = None) -> None:
        me = current_task()
        if self._writer is me or me in self._readers:
            self._readers[me] = self._readers.get(me, 0) + 1
            return
        await self._wait_for(
            lambda: self._writer is None and self._waiting_writers == 0, timeout, "read"
        )
        self._readers[me] = 1

    def release_read(self, *, holder: asyncio.Task[Any] | None = None) -> None:
        me = holder or current_task()
        count = self._readers.get(me)
        if not count:
            raise LockNotHeldError(
                f"this task does not hold the read lock {self.name!r}", name=self.name, mode="read"
            )
        if count == 1:
            del self._readers[me]
            if not self._readers:
                self._wake()
        else:
            self._readers[me] = count - 1

    # -- writing ---------------------------------------------------------------

    async def acquire_write(
        self, timeout: Seconds | None = None, *, successor: bool = False
    ) -> None:
        """Take the write lock; ``successor``: while it waits, a writer releasing with
        :meth:`hand_over_write` may pass the lock straight to it (oldest first)."""
        me = current_task()
        if self._writer is me:
            self._write_depth += 1
            return
        if me in self._readers:
            raise LockUpgradeError(name=self.name)
        self._waiting_writers += 1
        if successor:
            self._successors.append(me)
        try:
            await self._wait_for(
                lambda: self._writer is me or (self._writer is None and not self._readers),
                timeout,
                "write",
            )
        except BaseException:
            # Cancelled after a writer handed us the lock: pass it on.
            if self._writer is me and self._pass_on_handover() and self._on_dropped is not None:
                self._on_dropped()
            raise
        finally:
            self._waiting_writers -= 1
            if successor and me in self._successors:
                self._successors.remove(me)
            if self._writer is None and self._waiting_writers == 0:
                self._wake()  # we gave up: readers held off for our sake may go now
        if self._writer is not me:  # free, not handed over (which set the depth)
            self._writer = me
            self._write_depth = 1

    def hand_over_write(self, *, holder: asyncio.Task[Any] | None = None) -> bool:
        """End this task's (or ``holder``'s) write hold by passing the write lock
        straight to the oldest waiting successor: True if handed over. False, and
        nothing changed, unless this is its last write hold, it holds no read lock
        (a downgrade) and a successor waits."""
        me = holder or current_task()
        if self._writer is None or self._writer is not me:
            raise LockNotHeldError(
                f"this task does not hold the write lock {self.name!r}",
                name=self.name,
                mode="write",
            )
        if self._write_depth != 1 or me in self._readers or not self._successors:
            return False
        self._writer = self._successors.popleft()  # its depth: the 1 left here
        self._wake()
        return True

    def _pass_on_handover(self) -> bool:
        """A successor handed the write lock was cancelled before it took it: pass it
        to the next successor, else free it. True if freed: what the hand-over kept
        has no taker now."""
        if self._successors:
            self._writer = self._successors.popleft()
            self._wake()
            return False
        self._writer = None
        self._write_depth = 0
        self._wake()
        return True

    def release_write(self, *, holder: asyncio.Task[Any] | None = None) -> None:
        """Release one write hold of this task, or of task ``holder``."""
        if self._writer is None or self._writer is not (holder or current_task()):
            raise LockNotHeldError(
                f"this task does not hold the write lock {self.name!r}",
                name=self.name,
                mode="write",
            )
        self._write_depth -= 1
        if self._write_depth == 0:
            self._writer = None
            self._wake()

    # -- introspection -----------------------------------------------------------

    @property
    def writer(self) -> asyncio.Task[Any] | None:
        return self._writer

    def is_write_held_by_me(self) -> bool:
        return self._writer is not None and self._writer is asyncio.current_task()

    def read_depth_of_me(self) -> int:
        task = asyncio.current_task()
        return self._readers.get(task, 0) if task is not None else 0

    def is_free(self) -> bool:
        return self._writer is None and not self._readers and not self._waiting_writers

    @property
    def waiting_successors(self) -> int:
        """Writers waiting that would take a handed-over write lock."""
        return len(self._successors)

    # -- internals -------------------------------------------------------------------

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_for(
        self, ready: Callable[[], bool], timeout: Seconds | None, mode: str
    ) -> None:
        limit = None if timeout is None else check_non_negative("timeout", timeout)
        if ready():
            return
        start = self._timer()
        loop = asyncio.get_running_loop()
        while not ready():
            remaining = None if limit is None else start + limit - self._timer()
            if remaining is not None and remaining <= 0:
                raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start)
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait((waiter,), timeout=remaining)  # re-checked either way
            finally:
                self._waiters.discard(waiter)
