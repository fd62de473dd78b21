"""The two-tier lock: a local read-write lock in front of the distributed one.

Threads of one process first meet at the :class:`LocalRWLock`, so at most one of
them talks to Redis for a given lock at a time:

* readers: the first local reader takes one distributed read hold for the
  whole process, later readers share it, the last one out releases it;
* writers: a writer takes the local write lock (which waits for local readers
  to leave), then the distributed write lock.

A shared read hold is not joined once it is lost, or once a renewal reported
a writer of another process waiting: new local readers then wait for the
current ones to leave and take a fresh hold (behind that writer), so a busy
process cannot starve remote writers.

Lock cohorting: a writer releasing while other local writers wait hands the
local write lock straight to the oldest of them and keeps the distributed write
hold for it (no round trip), at most ``cohort_limit`` times in a row; then the
hold goes back to the store and the next local writer queues there behind the
other processes. A hold is handed over only while the store's handle says it is
sure to last (not lost, more than a third of its lease left): a holder whose lease
may have run out releases in the store, which tells it (``LockLostError``). The
next holder gets the same handle, and so the same fencing token: one distributed
holding, held by this process throughout, its holders following each other under
the local lock.

All distributed holds of one :class:`TwoTierRWLock` use one owner id per
process, so a write holder taking the read lock (a downgrade) re-enters its own
distributed holding. Holds belong to holders, not threads (``cacheguard/_identity.py``):
a nested acquisition in the same context re-enters, any thread may release a hold
given its ``holder=``, and a holder collected while holding (a thread that ended
holding) has its holds ended, local and distributed, so waiters go on.
Get instances from :class:`LockFactory` so every thread of a process shares the
one instance per name; the factory keeps a lock alive while anyone holds it.
After ``fork()`` a child starts with every two-tier lock free.

The distributed tier is a :class:`RedisRWLock` by default; ``LockFactory(store=...)``
puts another store's lock there (Redlock, PostgreSQL, ZooKeeper: any lock of
that shape, made by ``store(name)``), with the same local tier in front.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from cacheguard._identity import (
    Holder,
    ambient_holder,
    enter_holder,
    leave_holder,
    on_fork_in_child,
    process_id,
)
from cacheguard.checks import Seconds, check_int
from cacheguard.exceptions import LockNotHeldError, LockTimeout
from cacheguard.locks.local import LocalRWLock
from cacheguard.locks.redis.rwlock import (
    LockHandle,
    LostCallback,
    RedisRWLock,
    check_positive,
    release_on_exit,
)
from cacheguard.locks.redis.watchdog import Watchdog
from cacheguard.locks.registry import WeakRegistry
from cacheguard.redis.clients import SyncClient

__all__ = ["DEFAULT_COHORT_LIMIT", "LockFactory", "TwoTierRWLock", "check_cohort_limit"]

log = logging.getLogger("cacheguard.lock")

_instance_ids = itertools.count(1)
_all_locks: weakref.WeakSet[TwoTierRWLock] = weakref.WeakSet()

PinCallback = Callable[["TwoTierRWLock", bool], None]

#: Hand-overs of one distributed write hold between local writers before it goes
#: back to the store: other processes wait at most this many local holds longer
#: (``GuardSettings.cohort_limit`` has the same default).
DEFAULT_COHORT_LIMIT: Final = 16


def check_cohort_limit(value: object) -> int:
    """``cohort_limit``: a whole number >= 0 (0: every release goes to the store)."""
    return check_int("cohort_limit (0 turns hand-overs off)", value, minimum=0)


def may_hand_over(handle: Any) -> bool:
    """Whether a distributed write hold may pass to the next local holder without
    asking the store: not lost nor released, and sure to last more than a third of
    its lease (the watchdog renews every third: less means renewals fail). A store
    whose handles do not say how long they are sure to last (no ``validity``:
    PostgreSQL, ZooKeeper) is always asked."""
    validity = getattr(handle, "validity", None)
    return (
        validity is not None
        and not handle.lost
        and not handle.released
        and validity > handle.lease / 3
    )


class TwoTierRWLock:
    """One process's view of a distributed read-write lock, local lock first.

    ``cohort_limit``: hand-overs of a write hold between local writers before it
    goes back to the store (see the module docstring)."""

    def __init__(
        self,
        remote: Any,
        *,
        timer: Callable[[], float] = time.monotonic,
        on_pin: PinCallback | None = None,
        cohort_limit: int = DEFAULT_COHORT_LIMIT,
    ) -> None:
        self.remote = remote
        self.name = remote.name
        self.cohort_limit = check_cohort_limit(cohort_limit)
        self._timer = timer
        self._on_pin = on_pin
        self._instance = next(_instance_ids)
        self._reset()
        _all_locks.add(self)

    def _reset(self) -> None:
        self._local = LocalRWLock(
            self.remote.name,
            timer=self._timer,
            on_abandoned=self._abandoned,
            on_dropped=self._drop_unclaimed,
        )
        # Serialises the first-reader-in / last-reader-out transitions.
        self._gate = threading.Condition(threading.Lock())
        self._readers = 0
        self._read_handle: LockHandle | None = None
        # Touched by the holder of the local write lock; the handle also, under
        # _write_mutex, by whoever finds it kept for a hand-over nobody took.
        self._write_depth = 0
        self._write_handle: LockHandle | None = None
        self._handovers = 0  # of the distributed write hold, since it was taken
        self._write_mutex = threading.Lock()
        self._holds = 0  # all holds of this process, for pinning
        self._holds_mutex = threading.Lock()

    def _count_hold(self, delta: int) -> None:
        if self._on_pin is None:
            return
        with self._holds_mutex:
            self._holds += delta
            if (delta > 0 and self._holds == delta) or (delta < 0 and self._holds == 0):
                self._on_pin(self, self._holds > 0)

    @property
    def local(self) -> LocalRWLock:
        """The in-process tier (cache fills take its read side around their own script)."""
        return self._local

    @property
    def owner(self) -> str:
        """The distributed owner id this process uses for this lock."""
        return f"{process_id()}:tt{self._instance}"

    # -- reading -----------------------------------------------------------------------

    def acquire_read(
        self, timeout: Seconds | None = None, *, holder: Holder | None = None
    ) -> LockHandle:
        """Take the read lock for ``holder`` (default: the context's; see
        :meth:`LocalRWLock.acquire_read`)."""
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        me = self._local.acquire_read(limit, holder=holder)
        # A holder already inside (a reader, or the writer downgrading) re-enters:
        # waiting for the shared hold's readers to leave would wait for itself.
        reentry = self._local.read_depth(me) > 1 or self._local.holds_write(me)
        try:
            remaining = limit - (self._timer() - start)
            if remaining <= 0 or not self._gate.acquire(timeout=remaining):
                raise LockTimeout(name=self.name, mode="read", waited=self._timer() - start)
            try:
                # Do not join a shared hold that is lost, or that a remote writer
                # waits behind: wait for its readers to leave, then take a fresh one.
                joinable = reentry or self._gate.wait_for(
                    lambda: self._readers == 0 or self._shared_hold_is_joinable(),
                    max(limit - (self._timer() - start), 0.0),
                )
                if not joinable:
                    raise LockTimeout(name=self.name, mode="read", waited=self._timer() - start)
                if self._readers == 0:
                    self._read_handle = self.remote.acquire_read(
                        max(limit - (self._timer() - start), 1e-3), owner=self.owner
                    )
                self._readers += 1
                assert self._read_handle is not None
                handle = self._read_handle
            finally:
                self._gate.release()
        except BaseException:
            self._local.release_read(holder=me)
            raise
        self._count_hold(+1)
        return handle

    def _shared_hold_is_joinable(self) -> bool:
        handle = self._read_handle
        # writer_waiting: what a Redis renewal reports; other stores' handles lack it.
        return (
            handle is not None and not handle.lost and not getattr(handle, "writer_waiting", False)
        )

    def release_read(self, *, holder: Holder | None = None) -> None:
        """Release one read hold of ``holder`` (default: the context's), from any thread."""
        me = holder if holder is not None else ambient_holder()
        if not self._local.read_depth(me):
            raise LockNotHeldError(
                f"this holder does not hold the read lock {self.name!r}",
                name=self.name,
                mode="read",
            )
        try:
            with self._gate:
                self._drop_readers(1)
        finally:
            # Local last: a local writer must not get in while our distributed
            # read hold (same owner) still exists, or it would be an upgrade.
            self._local.release_read(holder=me)
            self._count_hold(-1)

    def _drop_readers(self, count: int) -> None:
        """``count`` local read holds ended (caller holds the gate)."""
        self._readers -= count
        if self._readers == 0:
            handle, self._read_handle = self._read_handle, None
            self._gate.notify_all()  # readers waiting for a fresh hold
            if handle is not None:
                handle.release()

    # -- writing -----------------------------------------------------------------------

    def acquire_write(
        self, timeout: Seconds | None = None, *, holder: Holder | None = None
    ) -> LockHandle:
        """Take the write lock for ``holder`` (default: the context's, re-entering its
        own hold; see :meth:`LocalRWLock.acquire_write`). Any thread may release it
        with ``release_write(holder=...)``."""
        limit = self.remote.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        me = self._local.acquire_write(limit, holder=holder, successor=True)
        if self._write_depth == 0:
            try:
                self._write_handle = self._distributed_write(
                    lambda: self.remote.acquire_write(
                        max(limit - (self._timer() - start), 1e-3), owner=self.owner
                    )
                )
            except BaseException:
                self._local.release_write(holder=me)
                raise
        self._write_depth += 1
        assert self._write_handle is not None
        self._count_hold(+1)
        return self._write_handle

    def try_acquire_write(self, *, holder: Holder | None = None) -> LockHandle | None:
        """:meth:`acquire_write` without waiting, here or in Redis (where a busy lock
        is left no waiting writer's mark): the handle, or None if the lock is busy."""
        me = self._local.try_acquire_write(holder=holder)
        if me is None:
            return None
        if self._write_depth == 0:
            try:
                handle = self._distributed_write(
                    lambda: self.remote.try_acquire_write(owner=self.owner)
                )
            except BaseException:
                self._local.release_write(holder=me)
                raise
            if handle is None:
                self._local.release_write(holder=me)
                return None
            self._write_handle = handle
        self._write_depth += 1
        assert self._write_handle is not None
        self._count_hold(+1)
        return self._write_handle

    def _distributed_write(self, take: Callable[[], Any]) -> Any:
        """The distributed write hold for a new local writer (the caller holds the
        local write lock): the one a hand-over kept for it, else ``take()``'s."""
        with self._write_mutex:
            kept = self._write_handle
            if kept is not None and not kept.lost:
                return kept  # handed over: no round trip
            # None, or lost since it was handed over (the loss was announced, and a
            # lost holding has nothing left to give back): take a fresh one.
            self._write_handle = None
            self._handovers = 0
        return take()

    def release_write(self, *, holder: Holder | None = None) -> None:
        """Release one write hold of ``holder`` (default: the context's), from any thread.

        The last one hands the lock to the oldest local writer waiting, keeping the
        distributed hold for it, while the cohort is under ``cohort_limit`` and the
        hold is sure to last; else the hold is released in the store, which raises
        :class:`LockLostError` if it was gone."""
        me = holder if holder is not None else ambient_holder()
        if not self._local.holds_write(me):
            raise LockNotHeldError(
                f"this holder does not hold the write lock {self.name!r}",
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
                    self._handovers += 1
                    handed = self._local.hand_over_write(holder=me)
                    if handed:
                        return
                    self._handovers -= 1  # nobody waiting after all
                self._write_handle = None
                self._handovers = 0
                if handle is not None:
                    handle.release()
        finally:
            if not handed:
                self._local.release_write(holder=me)
            self._count_hold(-1)

    def _drop_unclaimed(self) -> None:
        """A hand-over found nobody to take it (its successor was interrupted before
        it took the lock, and none waited behind): give back the distributed hold
        kept for it, unless a new two-tier writer took the local lock meanwhile (it
        claims the hold; a plain local writer, such as a session's outbox hold, never
        does)."""
        with self._write_mutex:
            kept = self._write_handle
            if kept is None or self._local.writer_claims_hand_overs:
                return
            self._write_handle = None
            self._handovers = 0
            try:
                kept.release()
            except Exception as exc:  # lost, or Redis away: its lease ends it
                log.warning("giving back an unclaimed write hold of %r failed: %s", self.name, exc)

    # -- holds whose holder is gone -------------------------------------------------------

    def _abandoned(self, number: int) -> None:
        """A holder was collected while holding here (its thread ended holding, say):
        end the distributed holds only it kept, then its local holds, then wake the
        waiters (on a thread of its own, see :meth:`LocalRWLock._collected`).

        Local last, as in the releases: while its local holds stand no local writer
        gets in, so none can find the distributed write hold about to go, nor ask
        Redis for a write while this process's shared read hold is still there; the
        gate keeps new local readers from taking a fresh read hold meanwhile."""
        with self._gate:
            depth, reads = self._local.abandoned_holds(number)
            released: list[LockHandle] = []
            if depth:
                self._write_depth = 0
                with self._write_mutex:
                    if self._write_handle is not None:
                        released.append(self._write_handle)
                    self._write_handle = None
                    self._handovers = 0
            if reads:
                self._readers -= reads
                if self._readers == 0 and self._read_handle is not None:
                    released.append(self._read_handle)
                    self._read_handle = None
            for handle in released:
                try:
                    handle.release()
                except Exception as exc:  # lost already, or Redis away: its lease ends it
                    log.warning("releasing an abandoned hold of %r failed: %s", self.name, exc)
            self._local.take_abandoned(number)
            if reads:
                self._gate.notify_all()
        self._local.wake()
        if depth or reads:
            log.warning(
                "a holder of lock %r was gone while holding it (%d write, %d read holds ended)",
                self.name,
                depth,
                reads,
            )
            self._count_hold(-(depth + reads))

    # -- context managers -----------------------------------------------------------------

    @contextmanager
    def read(self, timeout: Seconds | None = None) -> Iterator[LockHandle]:
        holder = enter_holder()
        try:
            handle = self.acquire_read(timeout, holder=holder)
            with release_on_exit(lambda: self.release_read(holder=holder)):
                yield handle
        finally:
            leave_holder(holder)

    @contextmanager
    def write(self, timeout: Seconds | None = None) -> Iterator[LockHandle]:
        holder = enter_holder()
        try:
            handle = self.acquire_write(timeout, holder=holder)
            with release_on_exit(lambda: self.release_write(holder=holder)):
                yield handle
        finally:
            leave_holder(holder)

    def __repr__(self) -> str:
        return f"<TwoTierRWLock {self.name!r} readers={self._readers} writer={self._write_depth}>"


class LockFactory:
    """Hands out one shared :class:`TwoTierRWLock` per name for a process.

    Its distributed tier is a :class:`RedisRWLock` on ``client``, or the lock
    ``store(name)`` makes (``store=functools.partial(RedlockRWLock, masters)``,
    ``PostgresRWLock``, ``ZooKeeperRWLock``: the store's own settings apply, and
    ``namespace``, ``lease``, ``watchdog`` and ``on_lost`` here are for Redis only).

    ``cohort_limit``: how many times in a row a lock's write hold goes from one
    local writer straight to the next without a round trip (lock cohorting, see the
    module docstring); 0: every release goes to the store.

    Instances are kept in a weak registry: a lock lives while someone uses it,
    so touching a million names leaves no million locks behind.
    """

    def __init__(
        self,
        client: SyncClient | None = None,
        *,
        namespace: str = "cg",
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        watchdog: Watchdog | bool = True,
        on_lost: LostCallback | None = None,
        store: Callable[[str], Any] | None = None,
        timer: Callable[[], float] = time.monotonic,
        cohort_limit: int = DEFAULT_COHORT_LIMIT,
    ) -> None:
        if (client is None) == (store is None):
            raise TypeError(
                "LockFactory needs a Redis client, or a store that makes the distributed "
                "locks (e.g. functools.partial(PostgresRWLock, engine)), not both"
            )
        if store is not None and not callable(store):
            raise TypeError(f"store must make a lock for a name, not {type(store).__name__}")
        self.client = client
        self._store = store
        self.namespace = namespace
        self.lease = check_positive("lease", lease)
        self.timeout = check_positive("timeout", timeout)
        self._watchdog = watchdog
        self._on_lost = on_lost
        self._timer = timer
        self.cohort_limit = check_cohort_limit(cohort_limit)
        self._registry: WeakRegistry[TwoTierRWLock] = WeakRegistry(self._create)
        # Locks someone holds stay referenced here, so the weak registry cannot
        # drop one while held (a handle references only the distributed part).
        self._pinned: dict[str, TwoTierRWLock] = {}
        self._pinned_mutex = threading.Lock()

    def rwlock(self, name: str) -> TwoTierRWLock:
        return self._registry.get(name)

    def __len__(self) -> int:
        return len(self._registry)

    def _create(self, name: str) -> TwoTierRWLock:
        if self._store is not None:
            # The store's own settings (lease, namespace, timeout) are the store's.
            return TwoTierRWLock(
                self._store(name),
                timer=self._timer,
                on_pin=self._pin,
                cohort_limit=self.cohort_limit,
            )
        assert self.client is not None
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
        return TwoTierRWLock(
            remote, timer=self._timer, on_pin=self._pin, cohort_limit=self.cohort_limit
        )

    def _pin(self, lock: TwoTierRWLock, held: bool) -> None:
        with self._pinned_mutex:
            if held:
                self._pinned[lock.name] = lock
            elif self._pinned.get(lock.name) is lock:
                del self._pinned[lock.name]


def _reset_after_fork() -> None:
    # The parent's threads, and so their local holds, do not exist in the child.
    for lock in list(_all_locks):
        lock._reset()


on_fork_in_child(_reset_after_fork)
