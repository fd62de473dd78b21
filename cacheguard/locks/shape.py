"""The outside of every sync lock store, written once.

Every store (:class:`~cacheguard.locks.redis.rwlock.RedisRWLock`, Redlock,
PostgreSQL, ZooKeeper) offers the same methods::

    handle = lock.acquire_write(timeout=5)        # or acquire_read
    handle = lock.try_acquire_read()              # one attempt: a handle or None
    with lock.write(timeout=5) as handle: ...     # released on exit

A ``timeout`` (like every lease and timeout a lock takes) is seconds or a
``timedelta``; None is the lock's own.

:class:`RWLockShape` builds them from two hooks a store writes, ``_acquire`` (block
until granted or :class:`~cacheguard.exceptions.LockTimeout`) and ``_try_once``
(one attempt). :class:`HandleState` is what every handle knows of its holding,
sync or asyncio; :class:`ThreadedHandle` runs a sync handle's ``on_lost`` callback
on a thread of its own. The asyncio counterparts are in :mod:`cacheguard.locks.async_shape`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, TypeVar

from cacheguard._identity import Holder, enter_holder, leave_holder
from cacheguard.checks import Seconds
from cacheguard.exceptions import LockLostError
from cacheguard.locks.protocol import Mode

__all__ = ["HandleState", "RWLockShape", "ThreadedHandle", "release_on_exit"]

log = logging.getLogger("cacheguard.lock")


class HandleState:
    """What a handle knows of its holding, and how it learns that it lost it (shared
    by every store's handle, sync and asyncio); ``lock`` is the lock it came from."""

    __slots__ = (
        "__weakref__",
        "_on_lost",
        "confirmed_at",
        "holder",
        "lock",
        "lost",
        "lost_reason",
        "mode",
        "owner",
        "released",
        "token",
        "writer_waiting",
    )

    #: Why a release found the holding gone, when nothing said so before.
    gone_at_release: ClassVar[str] = "the holding was gone at release"
    #: What a release that found the holding gone did (and did not do) about it.
    after_loss: ClassVar[str] = (
        "the lock now in Redis, if any, belongs to someone else and was left alone"
    )

    lock: Any  # set by each store's handle

    def __init__(self, mode: Mode, owner: str, token: int, on_lost: Any) -> None:
        self.mode: Mode = mode
        self.owner = owner
        self.token = token
        self.lost = False
        self.lost_reason = ""
        self.released = False
        self.writer_waiting = False  # set by renewals: another owner's writer is queued
        # time.monotonic() when the call that last confirmed the holding (its grant, a
        # renewal) was sent: a leased holding lasts at least a lease from then. None:
        # not known (a store without leases, a holding another script granted).
        self.confirmed_at: float | None = None
        self._on_lost = on_lost
        # The holder whose owner id this hold took (acquired without owner=): its use
        # ends with the release, wherever that happens.
        self.holder: Holder | None = None

    def _leave_holder(self) -> None:
        holder, self.holder = self.holder, None
        if holder is not None:
            leave_holder(holder)

    def remains(self) -> Any:
        """A copy to release the holding with once this handle is collected unreleased
        (a watchdog watches handles weakly): it tells nobody of a loss, since nobody
        holds the handle any more."""
        cls = type(self)
        twin = cls.__new__(cls)
        for name in _slot_names(cls):
            if hasattr(self, name):
                setattr(twin, name, getattr(self, name))
        twin._on_lost = None
        twin.holder = None
        return twin

    def _dropped(self) -> None:
        """Called on :meth:`remains` when the handle was found collected unreleased,
        before its release: a store forgets what it kept for the live handle."""

    @property
    def lock_name(self) -> str:
        name: str = self.lock.name
        return name

    def _mark_lost(self, why: str) -> None:
        if self.lost or self.released:
            return
        self.lost = True
        self.lost_reason = why
        self._announce_lost()

    def _announce_lost(self) -> None:
        """Log the loss (``lost`` and ``lost_reason`` are set) and start ``on_lost``."""
        log.warning(
            "lost the %s lock %r (owner %s, token %d): %s",
            self.mode,
            self.lock_name,
            self.owner,
            self.token,
            self.lost_reason,
        )
        if self._on_lost is not None:
            self._start_on_lost()

    def _start_on_lost(self) -> None:
        raise NotImplementedError

    def _lost_at_release(self) -> LockLostError:
        """Mark the handle lost (its release found the holding gone); the error to raise."""
        self.lost = True
        self.lost_reason = self.lost_reason or self.gone_at_release
        name = self.lock_name
        return LockLostError(
            f"the {self.mode} lock {name!r} (token {self.token}) was lost "
            f"before release: {self.lost_reason}; {self.after_loss}",
            name=name,
            owner=self.owner,
            mode=self.mode,
        )

    def _where(self) -> str:
        """More to show in the repr (where the holding is), with a trailing space."""
        return ""

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<{type(self).__name__} {self.mode} {self.lock_name!r} token={self.token} "
            f"owner={self.owner} {self._where()}{state}>"
        )


class ThreadedHandle(HandleState):
    """A sync store's handle: ``release()`` through its lock, and ``on_lost`` run on
    a thread of its own (a slow callback must not stall renewals or the thread that
    noticed the loss)."""

    __slots__ = ()

    def release(self) -> None:
        try:
            self.lock.release(self)
        finally:
            self._leave_holder()

    def _start_on_lost(self) -> None:
        threading.Thread(target=self._run_on_lost, name="cacheguard-on-lost", daemon=True).start()

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            self._on_lost(self)
        except Exception:
            log.exception("on_lost callback of lock %r failed", self.lock_name)


H = TypeVar("H", bound=ThreadedHandle)


class RWLockShape(Generic[H]):
    """The public methods of a sync lock store, from its ``_acquire`` and ``_try_once``."""

    def acquire_read(self, timeout: Seconds | None = None, *, owner: str | None = None) -> H:
        """Block until the read lock is ours (or :class:`LockTimeout`)."""
        return self._held("read", timeout, owner, wait=True)  # type: ignore[return-value]

    def acquire_write(self, timeout: Seconds | None = None, *, owner: str | None = None) -> H:
        """Block until the write lock is ours; a read holder gets :class:`LockUpgradeError`."""
        return self._held("write", timeout, owner, wait=True)  # type: ignore[return-value]

    def try_acquire_read(self, *, owner: str | None = None) -> H | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return self._held("read", None, owner, wait=False)

    def try_acquire_write(self, *, owner: str | None = None) -> H | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return self._held("write", None, owner, wait=False)

    @contextmanager
    def read(self, timeout: Seconds | None = None, *, owner: str | None = None) -> Iterator[H]:
        """Hold the read lock for the ``with`` block."""
        handle = self.acquire_read(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    @contextmanager
    def write(self, timeout: Seconds | None = None, *, owner: str | None = None) -> Iterator[H]:
        """Hold the write lock for the ``with`` block."""
        handle = self.acquire_write(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    def _held(
        self, mode: Mode, timeout: Seconds | None, owner: str | None, *, wait: bool
    ) -> H | None:
        """Acquire for ``owner``, or without one for the context's holder (a nested
        acquisition re-enters; see ``cacheguard/_identity.py``)."""
        if owner is not None:
            return self._acquire(mode, timeout, owner) if wait else self._try_once(mode, owner)
        holder = enter_holder()
        try:
            if wait:
                handle: H | None = self._acquire(mode, timeout, holder.owner)
            else:
                handle = self._try_once(mode, holder.owner)
        except BaseException:
            leave_holder(holder)
            raise
        if handle is None:
            leave_holder(holder)
        else:
            handle.holder = holder
        return handle

    def _acquire(self, mode: Mode, timeout: Seconds | None, owner: str | None) -> H:
        raise NotImplementedError

    def _try_once(self, mode: Mode, owner: str | None) -> H | None:
        raise NotImplementedError


_slots_by_class: dict[type, tuple[str, ...]] = {}


def _slot_names(cls: type) -> tuple[str, ...]:
    """Every slot of ``cls`` and its bases that holds data (for :meth:`remains`)."""
    names = _slots_by_class.get(cls)
    if names is None:
        found: list[str] = []
        for klass in cls.__mro__:
            for name in getattr(klass, "__slots__", ()):
                if name not in ("__weakref__", "__dict__") and name not in found:
                    found.append(name)
        names = _slots_by_class[cls] = tuple(found)
    return names


@contextmanager
def release_on_exit(release: Callable[[], None]) -> Iterator[None]:
    """Call ``release`` on exit; a lost lock raises unless the body already raised."""
    try:
        yield
    except BaseException:
        try:
            release()
        except LockLostError as lost:
            log.warning("%s (while the body raised)", lost)
        raise
    release()
