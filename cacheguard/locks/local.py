"""An in-process read-write lock for threads.

Rules, chosen so the lock can sit in front of the distributed one:

* writer-preferring: once a writer waits, new readers queue behind it, so a
  stream of readers cannot starve writers;
* reentrant: the write holder may take the write or read lock again, a reader
  may take the read lock again (even while a writer waits: refusing would
  deadlock the reader against a writer that waits for it);
* downgrade allowed: write -> read -> release write leaves a read hold;
* upgrade refused: a reader asking for the write lock gets
  :class:`LockUpgradeError` at once instead of deadlocking itself;
* every acquisition can time out (:class:`LockTimeout`).

Holds belong to threads, so a thread releases what it acquired; a write hold
may instead belong to an explicit ``holder`` id, for work handed between threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cacheguard.exceptions import LockNotHeldError, LockTimeout, LockUpgradeError

__all__ = ["LocalRWLock"]


class LocalRWLock:
    """Writer-preferring, reentrant read-write lock for the threads of one process."""

    __slots__ = (
        "__weakref__",
        "_cond",
        "_readers",
        "_timer",
        "_waiting_writers",
        "_write_depth",
        "_writer",
        "name",
    )

    def __init__(self, name: str = "", *, timer: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._timer = timer
        self._cond = threading.Condition(threading.Lock())
        self._writer: int | None = None
        self._write_depth = 0
        self._readers: dict[int, int] = {}
        self._waiting_writers = 0

    # -- reading ---------------------------------------------------------------

    def acquire_read(self, timeout: float | None = None) -> None:
        """Take the read lock; ``timeout=None`` waits without a deadline."""
        me = threading.get_ident()
        with self._cond:
            if self._writer == me or me in self._readers:
                self._readers[me] = self._readers.get(me, 0) + 1
                return
            self._wait_for(
                lambda: self._writer is None and self._waiting_writers == 0,
                timeout,
                "read",
            )
            self._readers[me] = 1

    def release_read(self) -> None:
        me = threading.get_ident()
        with self._cond:
            count = self._readers.get(me)
            if not count:
                raise LockNotHeldError(
                    f"this thread does not hold the read lock {self.name!r}",
                    name=self.name,
                    mode="read",
                )
            if count == 1:
                del self._readers[me]
                if not self._readers:
                    self._cond.notify_all()
            else:
                self._readers[me] = count - 1

    # -- writing ---------------------------------------------------------------

    def acquire_write(self, timeout: float | None = None, *, holder: int | None = None) -> None:
        """Take the write lock; a read holder gets :class:`LockUpgradeError`.

        ``holder`` (a negative int, so no thread ident can equal it) takes the lock
        for work that is not a thread's, such as a hold handed from thread to
        thread: it re-enters only its own hold, never the calling thread's, and is
        released with ``release_write(holder=...)``. A calling thread that holds
        the read lock is refused either way (it would wait for itself)."""
        me = threading.get_ident() if holder is None else holder
        with self._cond:
            if self._writer == me:
                self._write_depth += 1
                return
            if me in self._readers or threading.get_ident() in self._readers:
                raise LockUpgradeError(name=self.name)
            self._waiting_writers += 1
            try:
                self._wait_for(
                    lambda: self._writer is None and not self._readers,
                    timeout,
                    "write",
                )
            finally:
                self._waiting_writers -= 1
                if self._writer is None and self._waiting_writers == 0:
                    # We gave up: readers held off for our sake may go now.
                    self._cond.notify_all()
            self._writer = me
            self._write_depth = 1

    def release_write(self, *, holder: int | None = None) -> None:
        """Release one write hold of this thread, or of thread ``holder`` (a thread
        ident): for work that ends elsewhere, e.g. a database session committed
        from another thread than the one that flushed it."""
        with self._cond:
            if self._writer != (threading.get_ident() if holder is None else holder):
                raise LockNotHeldError(
                    f"this thread does not hold the write lock {self.name!r}",
                    name=self.name,
                    mode="write",
                )
            self._write_depth -= 1
            if self._write_depth == 0:
                self._writer = None
                self._cond.notify_all()

    # -- introspection -----------------------------------------------------------

    @property
    def writer(self) -> int | None:
        """The ident of the thread holding the write lock, if any."""
        return self._writer

    def is_write_held_by_me(self) -> bool:
        return self._writer == threading.get_ident()

    def read_depth_of_me(self) -> int:
        return self._readers.get(threading.get_ident(), 0)

    def is_free(self) -> bool:
        """No holder and no waiting writer (used by registries and tests)."""
        with self._cond:
            return self._writer is None and not self._readers and not self._waiting_writers

    # -- context managers --------------------------------------------------------

    @contextmanager
    def read(self, timeout: float | None = None) -> Iterator[None]:
        self.acquire_read(timeout)
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self, timeout: float | None = None) -> Iterator[None]:
        self.acquire_write(timeout)
        try:
            yield
        finally:
            self.release_write()

    # -- internals -------------------------------------------------------------------

    def _wait_for(self, ready: Callable[[], bool], timeout: float | None, mode: str) -> None:
        """Wait on the condition until ``ready()``; caller holds ``self._cond``."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0")
        if ready():
            return
        start = self._timer()
        deadline = None if timeout is None else start + timeout
        while not ready():
            if deadline is None:
                self._cond.wait()
                continue
            remaining = deadline - self._timer()
            if remaining <= 0:
                raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start)
            self._cond.wait(remaining)
