"""An in-process read-write lock for the threads (and contexts) of one process.

Rules, chosen so the lock can sit in front of the distributed one:

* writer-preferring: once a writer waits, new readers queue behind it, so a
  stream of readers cannot starve writers;
* reentrant: the write holder may take the write or read lock again, a reader
  may take the read lock again (even while a writer waits: refusing would
  deadlock the reader against a writer that waits for it);
* downgrade allowed: write -> read -> release write leaves a read hold;
* upgrade refused: a reader asking for the write lock gets
  :class:`LockUpgradeError` at once instead of deadlocking itself;
* every acquisition can time out (:class:`LockTimeout`); a ``timeout`` is seconds
  or a ``timedelta``, 0 a single try, None no deadline;
* a hand-over: :meth:`LocalRWLock.hand_over_write` passes the write lock straight
  to the oldest writer waiting as a *successor* (the two-tier lock's writers, which
  then keep the process's distributed write hold: lock cohorting), with no moment
  in between where the lock is free.

Holds belong to :class:`~cacheguard._identity.Holder` objects, not threads (see
``cacheguard/_identity.py``): an acquisition without ``holder=`` is the context's
ambient holder's (so nested calls re-enter) or a new holder's; it returns the
holder, and any thread may release with ``holder=`` it. A holder that is
garbage-collected while it holds (its thread ended, nothing else referenced it)
has abandoned its holds: they end, and waiters go on.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cacheguard._identity import Holder, ambient_holder, enter_holder, leave_holder
from cacheguard.checks import Seconds, check_non_negative
from cacheguard.exceptions import LockNotHeldError, LockTimeout, LockUpgradeError

__all__ = ["LocalRWLock"]

AbandonHook = Callable[[int], None]
DroppedHook = Callable[[], None]


class LocalRWLock:
    """Writer-preferring, reentrant read-write lock for the holders of one process."""

    __slots__ = (
        "__weakref__",
        "_cond",
        "_holders",
        "_on_abandoned",
        "_on_dropped",
        "_readers",
        "_successors",
        "_timer",
        "_waiting_writers",
        "_write_depth",
        "_writer",
        "_writer_succeeds",
        "name",
    )

    def __init__(
        self,
        name: str = "",
        *,
        timer: Callable[[], float] = time.monotonic,
        on_abandoned: AbandonHook | None = None,
        on_dropped: DroppedHook | None = None,
    ) -> None:
        self.name = name
        self._timer = timer
        self._cond = threading.Condition(threading.Lock())
        self._writer: int | None = None  # holder numbers, never the holders themselves
        # The writer took the lock as a successor (a two-tier writer, which claims a
        # distributed hold a hand-over kept); a plain local writer never does.
        self._writer_succeeds = False
        self._write_depth = 0
        self._readers: dict[int, int] = {}
        self._waiting_writers = 0
        # Waiting writers that take a handed-over write lock, oldest first.
        self._successors: deque[int] = deque()
        # Called (outside the lock) when a hand-over found nobody to take it after all.
        self._on_dropped = on_dropped
        # Holders with a hold here, weakly: a collected one abandoned its holds.
        self._holders: dict[int, weakref.ref[Holder]] = {}
        self._on_abandoned = on_abandoned

    # -- reading ---------------------------------------------------------------

    def acquire_read(
        self, timeout: Seconds | None = None, *, holder: Holder | None = None
    ) -> Holder:
        """Take the read lock; ``timeout=None`` waits without a deadline. Returns
        the holder the hold belongs to."""
        me = enter_holder(holder)
        try:
            with self._cond:
                n = me.number
                if self._writer == n or n in self._readers:
                    self._readers[n] = self._readers.get(n, 0) + 1
                    return me
                self._wait_for(
                    lambda: self._writer is None and self._waiting_writers == 0,
                    timeout,
                    "read",
                )
                self._readers[n] = 1
                self._track(me)
                return me
        except BaseException:
            leave_holder(me)
            raise

    def release_read(self, *, holder: Holder | None = None) -> None:
        """Release one read hold of ``holder`` (default: the context's)."""
        me = holder if holder is not None else ambient_holder()
        with self._cond:
            count = self._readers.get(me.number) if me is not None else None
            if not count or me is None:
                raise LockNotHeldError(
                    f"this holder does not hold the read lock {self.name!r}",
                    name=self.name,
                    mode="read",
                )
            if count == 1:
                del self._readers[me.number]
                if self._writer != me.number:
                    self._untrack(me.number)
                if not self._readers:
                    self._cond.notify_all()
            else:
                self._readers[me.number] = count - 1
        leave_holder(me)

    # -- writing ---------------------------------------------------------------

    def acquire_write(
        self,
        timeout: Seconds | None = None,
        *,
        holder: Holder | None = None,
        successor: bool = False,
    ) -> Holder:
        """Take the write lock; a read holder gets :class:`LockUpgradeError`.

        Returns the holder the hold belongs to: ``holder`` if given (a hold handed
        between threads, released with ``release_write(holder=...)``), else the
        context's ambient holder (re-entry) or a new one. ``successor``: while it
        waits, a writer releasing with :meth:`hand_over_write` may pass the lock
        straight to it (oldest successor first)."""
        me = enter_holder(holder)
        dropped = False
        try:
            with self._cond:
                n = me.number
                if self._writer == n:
                    self._write_depth += 1
                    return me
                ambient = ambient_holder()
                if n in self._readers or (ambient is not None and ambient.number in self._readers):
                    # It would wait for a read hold of its own context.
                    raise LockUpgradeError(name=self.name)
                self._waiting_writers += 1
                if successor:
                    self._successors.append(n)
                try:
                    self._wait_for(
                        lambda: self._writer == n or (self._writer is None and not self._readers),
                        timeout,
                        "write",
                    )
                except BaseException:
                    # Interrupted after a writer handed us the lock: pass it on.
                    dropped = self._writer == n and self._pass_on_handover()
                    raise
                finally:
                    self._waiting_writers -= 1
                    if successor and n in self._successors:
                        self._successors.remove(n)
                    if self._writer is None and self._waiting_writers == 0:
                        # We gave up: readers held off for our sake may go now.
                        self._cond.notify_all()
                if self._writer != n:  # free, not handed over (which set the depth)
                    self._writer = n
                    self._write_depth = 1
                    self._writer_succeeds = successor
                self._track(me)
                return me
        except BaseException:
            leave_holder(me)
            if dropped and self._on_dropped is not None:
                self._on_dropped()
            raise

    def try_acquire_write(self, *, holder: Holder | None = None) -> Holder | None:
        """:meth:`acquire_write` without waiting: the holder, or None if busy."""
        try:
            return self.acquire_write(0.0, holder=holder)
        except LockTimeout:
            return None

    def release_write(self, *, holder: Holder | None = None) -> None:
        """Release one write hold of ``holder`` (default: the context's), from any
        thread: e.g. a database session committed from another thread than the one
        that flushed it."""
        me = holder if holder is not None else ambient_holder()
        with self._cond:
            if me is None or self._writer != me.number:
                raise LockNotHeldError(
                    f"this holder does not hold the write lock {self.name!r}",
                    name=self.name,
                    mode="write",
                )
            self._write_depth -= 1
            if self._write_depth == 0:
                self._writer = None
                if me.number not in self._readers:
                    self._untrack(me.number)
                self._cond.notify_all()
        leave_holder(me)

    def hand_over_write(self, *, holder: Holder | None = None) -> bool:
        """End the write hold of ``holder`` (default: the context's) by passing the
        write lock straight to the oldest waiting successor (see
        :meth:`acquire_write`): True if it was handed over. False, and nothing
        changed, unless this is the holder's last write hold, it holds no read lock
        (a downgrade: its read hold must stay alone) and a successor waits."""
        me = holder if holder is not None else ambient_holder()
        with self._cond:
            if me is None or self._writer != me.number:
                raise LockNotHeldError(
                    f"this holder does not hold the write lock {self.name!r}",
                    name=self.name,
                    mode="write",
                )
            if self._write_depth != 1 or me.number in self._readers or not self._successors:
                return False
            self._writer = self._successors.popleft()  # its depth: the 1 left here
            self._writer_succeeds = True
            self._untrack(me.number)
            self._cond.notify_all()
        leave_holder(me)
        return True

    def _pass_on_handover(self) -> bool:
        """A successor that was handed the write lock gave up before taking it (the
        caller holds the lock): pass it to the next successor, else free it. True if
        it was freed: what the hand-over kept for it has no taker now."""
        if self._successors:
            self._writer = self._successors.popleft()
            self._writer_succeeds = True
            self._cond.notify_all()
            return False
        self._writer = None
        self._write_depth = 0
        self._cond.notify_all()
        return True

    # -- introspection -----------------------------------------------------------

    @property
    def writer(self) -> int | None:
        """The number of the holder holding the write lock, if any."""
        return self._writer

    @property
    def writer_claims_hand_overs(self) -> bool:
        """Does the write lock's holder (if any) claim what a hand-over kept for it?
        Only a writer that took it as a successor (:meth:`acquire_write`) does."""
        return self._writer is not None and self._writer_succeeds

    @property
    def write_depth(self) -> int:
        return self._write_depth

    def holds_write(self, holder: Holder | None) -> bool:
        return holder is not None and self._writer == holder.number

    def read_depth(self, holder: Holder | None) -> int:
        return 0 if holder is None else self._readers.get(holder.number, 0)

    def is_write_held_by_me(self) -> bool:
        """The context's ambient holder holds the write lock."""
        return self.holds_write(ambient_holder())

    def read_depth_of_me(self) -> int:
        return self.read_depth(ambient_holder())

    def is_free(self) -> bool:
        """No holder and no waiting writer (used by registries and tests)."""
        with self._cond:
            return self._writer is None and not self._readers and not self._waiting_writers

    @property
    def waiting_successors(self) -> int:
        """Writers waiting that would take a handed-over write lock."""
        return len(self._successors)

    # -- abandoned holds -----------------------------------------------------------

    def _track(self, holder: Holder) -> None:
        n = holder.number
        if n not in self._holders:
            self._holders[n] = weakref.ref(holder, lambda _ref: self._collected(n))

    def _untrack(self, number: int) -> None:
        self._holders.pop(number, None)

    def _collected(self, number: int) -> None:
        # A weakref callback runs wherever the collection happened, maybe inside
        # this lock's own critical section: end the holds from a thread of its own.
        hook = self._on_abandoned or self.abandon
        threading.Thread(
            target=hook, args=(number,), name="cacheguard-abandoned", daemon=True
        ).start()

    def abandoned_holds(self, number: int) -> tuple[int, int]:
        """The (write depth, read count) of the collected holder ``number``, left in
        place: its holds keep others out until :meth:`take_abandoned` ends them."""
        with self._cond:
            depth = self._write_depth if self._writer == number else 0
            return depth, self._readers.get(number, 0)

    def take_abandoned(self, number: int) -> tuple[int, int]:
        """End every hold of the (collected) holder ``number`` without waking anyone;
        returns its (write depth, read count). The caller then calls :meth:`wake`."""
        with self._cond:
            self._holders.pop(number, None)
            depth = 0
            if self._writer == number:
                depth, self._writer, self._write_depth = self._write_depth, None, 0
            return depth, self._readers.pop(number, 0)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def abandon(self, number: int) -> None:
        """End the holds of a holder that was collected while holding, wake waiters."""
        self.take_abandoned(number)
        self.wake()

    # -- context managers --------------------------------------------------------

    @contextmanager
    def read(self, timeout: Seconds | None = None) -> Iterator[Holder]:
        holder = self.acquire_read(timeout)
        try:
            yield holder
        finally:
            self.release_read(holder=holder)

    @contextmanager
    def write(self, timeout: Seconds | None = None) -> Iterator[Holder]:
        holder = self.acquire_write(timeout)
        try:
            yield holder
        finally:
            self.release_write(holder=holder)

    # -- internals -------------------------------------------------------------------

    def _wait_for(self, ready: Callable[[], bool], timeout: Seconds | None, mode: str) -> None:
        """Wait on the condition until ``ready()``; caller holds ``self._cond``."""
        limit = None if timeout is None else check_non_negative("timeout", timeout)
        if ready():
            return
        start = self._timer()
        deadline = None if limit is None else start + limit
        while not ready():
            if deadline is None:
                self._cond.wait()
                continue
            remaining = deadline - self._timer()
            if remaining <= 0:
                raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start)
            self._cond.wait(remaining)
