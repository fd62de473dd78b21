"""The distributed read-write lock on one Redis hash.

::

    lock = RedisRWLock(client, "menu:list", lease=10.0)
    with lock.write(timeout=5) as handle:
        write_to_db(fencing_token=handle.token)

Owners and reentrancy
    Holds belong to an *owner* string, by default the owner of the context's
    holder (``cacheguard/_identity.py``): nested acquisitions in one context
    re-enter, other threads and a pool's next call are other owners. The same
    owner may take the lock again (counts nest); pass ``owner=`` to share a
    holding between threads or tasks.

Handles
    Each acquisition returns a :class:`LockHandle`. Release goes through the
    handle, so any thread may release it. Releasing a handle whose lock was lost
    raises :class:`LockLostError` and changes nothing in Redis: the lock there, if
    any, is someone else's.

Leases
    Holds expire ``lease`` seconds after the last renewal. With the watchdog on
    (the default), the process's watchdog thread renews every ``lease / 3`` while
    the handle is held, and marks the handle ``lost`` if the holding vanished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from cacheguard._identity import thread_owner
from cacheguard.backoff import Backoff
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, LockUpgradeError
from cacheguard.locks.protocol import Attempt, Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.watchdog import Watchdog, default_watchdog
from cacheguard.locks.shape import HandleState, RWLockShape, ThreadedHandle, release_on_exit
from cacheguard.redis.clients import SyncClient
from cacheguard.redis.errors import REDIS_DOWN
from cacheguard.redis.keys import ResourceKeys, check_namespace
from cacheguard.redis.notifier import ClusterNotifier, Notifier, Subscription, notifier_for
from cacheguard.redis.scripts import LuaScript
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "HandleState",
    "LockHandle",
    "LockSettings",
    "RedisRWLock",
    "check_positive",
    "lease_left",
    "lock_settings",
    "release_on_exit",
    "unavailable",
]

log = logging.getLogger("cacheguard.lock")

LostCallback = Callable[["LockHandle"], None]


class LockSettings(NamedTuple):
    """A lock's checked settings (shared by the sync and the asyncio lock)."""

    name: str
    keys: ResourceKeys
    lease: float
    lease_ms: int
    timeout: float
    mark_ms: int  # how long a waiting writer's mark lasts


def lock_settings(
    name: object, *, lease: object, timeout: object, namespace: str, backoff: Callable[[], Backoff]
) -> LockSettings:
    """Check a lock's constructor arguments (ValueError / TypeError)."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    checked_lease = check_positive("lease", lease)
    checked_timeout = check_positive("timeout", timeout)
    return LockSettings(
        name=name,
        keys=ResourceKeys(check_namespace(namespace), name),
        lease=checked_lease,
        lease_ms=max(1, int(checked_lease * 1000)),
        timeout=checked_timeout,
        # A waiting writer's mark outlives the longest sleep between its retries.
        mark_ms=max(3000, int(3 * backoff().cap * 1000)),
    )


class LockHandle(ThreadedHandle):
    """One acquisition of a :class:`RedisRWLock`.

    ``token`` is the fencing token: for write holds it is strictly greater than
    the token of every earlier write hold of this lock, so a storage system can
    refuse writes carrying an older token. ``lost`` turns true when the watchdog
    finds that the holding vanished; ``lost_reason`` says why.
    """

    __slots__ = ()

    lock: RedisRWLock

    def __init__(
        self,
        lock: RedisRWLock,
        mode: Mode,
        owner: str,
        token: int,
        on_lost: LostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock

    # Used by the watchdog.
    @property
    def client(self) -> SyncClient:
        return self.lock.client

    @property
    def keys(self) -> ResourceKeys:
        return self.lock.keys

    @property
    def lease(self) -> float:
        return self.lock.lease

    @property
    def lease_ms(self) -> int:
        return self.lock.lease_ms

    @property
    def validity(self) -> float:
        """Seconds the holding is sure to last even if no renewal succeeds from now:
        a lease from when its grant or last renewal was sent (0 once that passed, or
        if not known)."""
        return lease_left(self)

    def renew(self) -> bool:
        """Extend the lease now; ``False`` (and marked lost) if the holding is gone."""
        return self.lock.renew(self)


class RedisRWLock(RWLockShape[LockHandle]):
    """A read-write lock shared by every thread of every process using one Redis.

    ``lease`` (s): how long a hold outlives its last renewal. ``timeout`` (s): the
    default deadline of blocking acquisitions (both, and an acquisition's
    ``timeout``, are seconds or a ``timedelta``). ``watchdog``: ``True`` for the
    process-wide watchdog, ``False`` to renew by hand (``handle.renew()``), or a
    :class:`Watchdog` of your own. ``on_lost`` is called (from the watchdog
    thread) with a handle whose holding vanished.
    """

    def __init__(
        self,
        client: SyncClient,
        name: str,
        *,
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        namespace: str = "cg",
        watchdog: Watchdog | bool = True,
        notifier: Notifier | ClusterNotifier | None = None,
        on_lost: LostCallback | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = lock_settings(
            name, lease=lease, timeout=timeout, namespace=namespace, backoff=backoff
        )
        self.client = client
        self.name = settings.name
        self.lease = settings.lease
        self.lease_ms = settings.lease_ms
        self.timeout = settings.timeout
        self.keys = settings.keys
        self._watchdog: Watchdog | None
        if watchdog is True:
            self._watchdog = default_watchdog()
        elif watchdog is False:
            self._watchdog = None
        else:
            self._watchdog = watchdog
        self._notifier = notifier
        self._on_lost = on_lost
        self._backoff = backoff
        self._timer = timer
        self._mark_ms = settings.mark_ms

    # -- acquiring ---------------------------------------------------------------------

    def _acquire(self, mode: Mode, timeout: Seconds | None, owner: str | None) -> LockHandle:
        owner = owner or thread_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        sent = time.monotonic()
        first = self._attempt(mode, owner, queue=True)
        if first.granted:  # the uncontended path: one round trip, no generator
            return self._granted(mode, owner, first.epoch, confirmed_at=sent)
        flow = acquire_flow(
            first,
            name=self.name,
            mode=mode,
            owner=owner,
            start=start,
            timeout=limit,
            timer=self._timer,
            backoff=self._backoff,
        )
        epoch, sent = self._drive(flow, mode, owner)
        return self._granted(mode, owner, epoch, confirmed_at=sent)

    def _drive(self, flow: Generator[Step, Any, int], mode: Mode, owner: str) -> tuple[int, float]:
        """Answer the flow's steps with blocking I/O; I/O errors are thrown into it.
        Returns the epoch granted and when the granting attempt was sent."""
        subscription: Subscription | None = None
        sent = 0.0
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        sent = time.monotonic()
                        reply = self._attempt(mode, owner, queue=True)
                    elif isinstance(step, Subscribe):
                        channel = self.keys.released_channel
                        subscription = self._notifier_or_default().subscription(channel)
                        reply = subscription.open(step.timeout)
                    elif isinstance(step, Wait):
                        assert subscription is not None
                        reply = subscription.wait(step.seconds)
                    else:
                        self._call(*wire.withdraw_call(self.keys, owner))
                except BackendUnavailable as exc:
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration as done:
            epoch: int = done.value
            return epoch, sent
        finally:
            flow.close()
            if subscription is not None:
                subscription.close()

    def _try_once(self, mode: Mode, owner: str | None) -> LockHandle | None:
        owner = owner or thread_owner()
        sent = time.monotonic()
        attempt = self._attempt(mode, owner, queue=False)
        if attempt.upgrade:
            raise LockUpgradeError(name=self.name, owner=owner)
        if not attempt.granted:
            return None
        return self._granted(mode, owner, attempt.epoch, confirmed_at=sent)

    def _attempt(self, mode: Mode, owner: str, *, queue: bool) -> Attempt:
        """One acquire script call; ``queue`` leaves a waiting writer's mark if busy."""
        mark_ms = self._mark_ms if queue else 0
        call = wire.acquire_call(self.keys, owner, mode, lease_ms=self.lease_ms, mark_ms=mark_ms)
        return wire.parse_attempt(self._call(*call))

    def _granted(
        self,
        mode: Mode,
        owner: str,
        token: int,
        renew_for: float | None = None,
        *,
        confirmed_at: float | None = None,
    ) -> LockHandle:
        handle = LockHandle(self, mode, owner, token, self._on_lost)
        handle.confirmed_at = confirmed_at
        if self._watchdog is not None:
            # Weakly: a handle dropped unreleased (its thread ended holding it) is
            # given back at its next renewal, not renewed for the life of the process.
            self._watchdog.watch(handle, renew_for=renew_for, weak=True)
        return handle

    def adopt(
        self, mode: Mode, owner: str, token: int, *, renew_for: float | None = None
    ) -> LockHandle:
        """A handle for a holding that another script granted (a cache fill's read
        hold); it is renewed by the watchdog like any other, for at most
        ``renew_for`` seconds when given."""
        return self._granted(mode, owner, token, renew_for)

    def disown(self, handle: LockHandle) -> float | None:
        """Another script is about to release the holding: stop renewing the handle.
        Returns when it was last renewed (for :meth:`release_in_background`)."""
        last_renewed = self._watchdog.unwatch(handle) if self._watchdog is not None else None
        handle.released = True
        return last_renewed

    def release_in_background(self, handle: LockHandle, last_renewed: float | None) -> None:
        """A release failed (Redis unreachable): let the watchdog retry it until it
        goes through or the lease would have ended anyway."""
        if self._watchdog is not None:
            self._watchdog.retry_release(handle, last_renewed)

    # -- releasing and renewing --------------------------------------------------------

    def release(self, handle: LockHandle) -> None:
        """Release one hold; :class:`LockLostError` if it was no longer ours."""
        if handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        if handle.released:
            return
        # Stop renewing first, so no renewal can land after the release.
        last_renewed = self._watchdog.unwatch(handle) if self._watchdog is not None else None
        handle.released = True
        try:
            released = self._call(
                *wire.release_call(self.keys, handle.owner, handle.mode, handle.token)
            )
        except BackendUnavailable:
            # The hold is still in Redis: keep trying in the background until it
            # goes through or its lease would have ended anyway, so it never leaks.
            if self._watchdog is not None:
                self._watchdog.retry_release(handle, last_renewed)
            raise
        if not wire.parse_release(released):
            raise handle._lost_at_release()

    def renew(self, handle: LockHandle) -> bool:
        """Extend the lease of ``handle`` now (useful with ``watchdog=False``)."""
        if handle.released or handle.lost:
            return False
        call = wire.renew_call(self.keys, handle.owner, handle.token, self.lease_ms)
        sent = time.monotonic()
        renewed = wire.parse_renewal(self._call(*call))
        handle.writer_waiting = renewed is wire.Renewal.RENEWED_WRITER_WAITS
        if renewed is wire.Renewal.GONE:
            if self._watchdog is not None:
                self._watchdog.unwatch(handle)
            handle._mark_lost("its holding was gone at renewal")
            return False
        handle.confirmed_at = sent
        return True

    # -- plumbing --------------------------------------------------------------------

    def _notifier_or_default(self) -> Notifier | ClusterNotifier:
        if self._notifier is None:
            self._notifier = notifier_for(self.client)
        return self._notifier

    def _call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(self.client, keys, args)
        except REDIS_DOWN as exc:
            raise unavailable(self.name, exc) from exc

    def __repr__(self) -> str:
        return f"<RedisRWLock {self.name!r} key={self.keys.lock!r} lease={self.lease}s>"


def lease_left(handle: HandleState) -> float:
    """Seconds a Redis holding is sure to last from now without another renewal:
    its lease from ``confirmed_at`` (the server set its end after that call was
    sent); 0 once passed or if not known."""
    if handle.confirmed_at is None:
        return 0.0
    lease: float = handle.lock.lease
    return max(0.0, handle.confirmed_at + lease - time.monotonic())


def unavailable(name: str, exc: Exception) -> BackendUnavailable:
    """The error for a lock call that found Redis down (``exc`` chained by the caller)."""
    return BackendUnavailable(
        f"Redis unreachable or refusing while working on lock {name!r}: {exc}"
    )
