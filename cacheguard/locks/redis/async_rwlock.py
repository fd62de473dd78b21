"""The distributed read-write lock on asyncio.

::

    lock = AsyncRedisRWLock(client, "menu:list", lease=10.0)  # a redis.asyncio.Redis
    async with lock.write(timeout=5) as handle:
        await write_to_db(fencing_token=handle.token)

The same lock as :class:`~cacheguard.locks.redis.rwlock.RedisRWLock`: the same
scripts, keys and release channel, driven by the same sans-I/O
:func:`~cacheguard.locks.protocol.acquire_flow`, so sync and asyncio holders of
one name exclude each other and wake each other.

Owners
    Holds belong to an *owner* string, by default the calling asyncio **task**
    (``<process id>:task<n>``, ``n`` stable for the task's life). The same task may
    take the lock again (counts nest); pass ``owner=`` to share a holding.

Cancellation
    A task cancelled while it waits leaves nothing behind: a waiting writer
    withdraws its mark (as at its deadline). A task cancelled during an acquire
    script's round trip lets the call finish, and takes back what it did (releases
    a granted hold, withdraws a mark) before the cancellation goes on. A cancelled
    body inside ``async with lock.write()`` releases; a cancelled release finishes
    in the background.

One event loop
    A lock, like its client, belongs to the loop it is first used on; used from
    another it raises :class:`~cacheguard.exceptions.WrongEventLoop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from cacheguard._identity import process_id, thread_owner
from cacheguard._loop import LoopBinding
from cacheguard.backoff import Backoff
from cacheguard.checks import Seconds
from cacheguard.exceptions import BackendUnavailable, LockUpgradeError
from cacheguard.locks.async_shape import AsyncRWLockShape, LoopHandle
from cacheguard.locks.protocol import Attempt, Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.async_watchdog import AsyncWatchdog, default_async_watchdog
from cacheguard.locks.redis.rwlock import check_positive, lease_left, lock_settings, unavailable
from cacheguard.redis.async_notifier import (
    AsyncClusterNotifier,
    AsyncNotifier,
    AsyncSubscription,
    async_notifier_for,
)
from cacheguard.redis.clients import AsyncClient
from cacheguard.redis.errors import REDIS_DOWN
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import LuaScript
from cacheguard.steps import Subscribe, Wait

__all__ = ["AsyncLockHandle", "AsyncRedisRWLock", "task_owner"]

log = logging.getLogger("cacheguard.lock")

T = TypeVar("T")
AsyncLostCallback = Callable[["AsyncLockHandle"], object]

_task_numbers: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_next_task_number = itertools.count(1)


def task_owner() -> str:
    """The default lock owner on asyncio: this process and the current task.

    A number per task (never reused in this process, unlike ``id()``), so a task
    that ended holding a lock cannot be mistaken for a later one. Outside a task
    (a plain callback), the calling thread's owner."""
    task = asyncio.current_task()
    if task is None:
        return thread_owner()
    number = _task_numbers.get(task)
    if number is None:
        number = _task_numbers[task] = next(_next_task_number)
    return f"{process_id()}:task{number}"


class AsyncLockHandle(LoopHandle):
    """One acquisition of an :class:`AsyncRedisRWLock` (see the sync ``LockHandle``:
    ``token``, ``lost``, ``lost_reason``, ``released``, ``writer_waiting``)."""

    __slots__ = ()

    lock: AsyncRedisRWLock

    def __init__(
        self,
        lock: AsyncRedisRWLock,
        mode: Mode,
        owner: str,
        token: int,
        on_lost: AsyncLostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock

    # Used by the watchdog.
    @property
    def client(self) -> AsyncClient:
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
        """Seconds the holding is sure to last even if no renewal succeeds from now
        (see the sync ``LockHandle.validity``)."""
        return lease_left(self)

    async def renew(self) -> bool:
        """Extend the lease now; ``False`` (and marked lost) if the holding is gone."""
        return await self.lock.renew(self)


class AsyncRedisRWLock(AsyncRWLockShape[AsyncLockHandle]):
    """A read-write lock shared by every task, thread and process using one Redis.

    ``client`` is a ``redis.asyncio.Redis``. ``watchdog``: ``True`` for the event
    loop's watchdog task, ``False`` to renew by hand (``await handle.renew()``), or
    an :class:`AsyncWatchdog` of your own. ``on_lost`` is called on the loop with a
    handle whose holding vanished (a coroutine function is run as a task). The
    other arguments are :class:`~cacheguard.locks.redis.rwlock.RedisRWLock`'s.
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        namespace: str = "cg",
        watchdog: AsyncWatchdog | bool = True,
        notifier: AsyncNotifier | AsyncClusterNotifier | None = None,
        on_lost: AsyncLostCallback | None = None,
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
        self._mark_ms = settings.mark_ms
        self._watchdog_choice = watchdog
        self._watchdog: AsyncWatchdog | None = None
        self._notifier = notifier
        self._on_lost = on_lost
        self._backoff = backoff
        self._timer = timer
        self._binding = LoopBinding(f"the lock {settings.name!r}")
        self._background: set[asyncio.Future[Any]] = set()

    # -- acquiring ---------------------------------------------------------------------

    async def _acquire(
        self, mode: Mode, timeout: Seconds | None, owner: str | None
    ) -> AsyncLockHandle:
        self._binding.check()
        owner = owner or task_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        sent = time.monotonic()
        first = await self._attempt(mode, owner, queue=True)
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
        epoch, sent = await self._drive(flow, mode, owner)
        return self._granted(mode, owner, epoch, confirmed_at=sent)

    async def _drive(
        self, flow: Generator[Step, Any, int], mode: Mode, owner: str
    ) -> tuple[int, float]:
        """Answer the flow's steps with awaits; I/O errors and cancellation are thrown in.
        Returns the epoch granted and when the granting attempt was sent."""
        subscription: AsyncSubscription | None = None
        sent = 0.0
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        sent = time.monotonic()
                        reply = await self._attempt(mode, owner, queue=True)
                    elif isinstance(step, Subscribe):
                        channel = self.keys.released_channel
                        subscription = self._notifier_or_default().subscription(channel)
                        reply = await subscription.open(step.timeout)
                    elif isinstance(step, Wait):
                        assert subscription is not None
                        reply = await subscription.wait(step.seconds)
                    else:
                        await self._shielded(self._call(*wire.withdraw_call(self.keys, owner)))
                except BaseException as exc:  # the flow decides; a cancel withdraws a mark
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

    async def _try_once(self, mode: Mode, owner: str | None) -> AsyncLockHandle | None:
        self._binding.check()
        owner = owner or task_owner()
        sent = time.monotonic()
        attempt = await self._attempt(mode, owner, queue=False)
        if attempt.upgrade:
            raise LockUpgradeError(name=self.name, owner=owner)
        if not attempt.granted:
            return None
        return self._granted(mode, owner, attempt.epoch, confirmed_at=sent)

    async def _attempt(self, mode: Mode, owner: str, *, queue: bool) -> Attempt:
        """One acquire script call; ``queue`` leaves a waiting writer's mark if busy.

        The call runs to its end even if the caller is cancelled meanwhile; what it
        did is then taken back before the cancellation goes on."""
        mark_ms = self._mark_ms if queue else 0
        call = wire.acquire_call(self.keys, owner, mode, lease_ms=self.lease_ms, mark_ms=mark_ms)
        running = self._spawn(self._call(*call))
        try:
            reply = await asyncio.shield(running)
        except asyncio.CancelledError:
            undo = self._spawn(self._undo_attempt(running, mode, owner, queued=queue))
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: undo goes on
                await asyncio.shield(undo)
            raise
        return wire.parse_attempt(reply)

    async def _undo_attempt(
        self, running: asyncio.Future[Any], mode: Mode, owner: str, *, queued: bool
    ) -> None:
        try:
            attempt = wire.parse_attempt(await running)
        except Exception:
            return  # the call failed: it granted nothing we could know of
        call = wire.undo_attempt_call(self.keys, owner, mode, attempt, queued=queued)
        if call is None:
            return
        try:
            await self._call(*call)
        except BackendUnavailable as exc:
            log.warning("could not take back the %s attempt on %r: %s", mode, self.name, exc)
            if attempt.granted:  # retried in the background like any failed release
                handle = AsyncLockHandle(self, mode, owner, attempt.epoch, None)
                self.release_in_background(handle, None)

    def _granted(
        self,
        mode: Mode,
        owner: str,
        token: int,
        renew_for: float | None = None,
        *,
        confirmed_at: float | None = None,
    ) -> AsyncLockHandle:
        handle = AsyncLockHandle(self, mode, owner, token, self._on_lost)
        handle.confirmed_at = confirmed_at
        watchdog = self._watchdog_or_default()
        if watchdog is not None:
            # Weakly: a handle dropped unreleased (its task ended holding it) is
            # given back at its next renewal, not renewed for the life of the loop.
            watchdog.watch(handle, renew_for=renew_for, weak=True)
        return handle

    def adopt(
        self, mode: Mode, owner: str, token: int, *, renew_for: float | None = None
    ) -> AsyncLockHandle:
        """A handle for a holding that another script granted (a cache fill's read
        hold); it is renewed by the watchdog like any other, for at most
        ``renew_for`` seconds when given."""
        self._binding.check()
        return self._granted(mode, owner, token, renew_for)

    def disown(self, handle: AsyncLockHandle) -> float | None:
        """Another script is about to release the holding: stop renewing the handle.
        Returns when it was last renewed (for :meth:`release_in_background`)."""
        watchdog = self._watchdog_or_default()
        last_renewed = watchdog.unwatch(handle) if watchdog is not None else None
        handle.released = True
        return last_renewed

    def release_in_background(self, handle: AsyncLockHandle, last_renewed: float | None) -> None:
        """A release failed (Redis unreachable): let the watchdog retry it until it
        goes through or the lease would have ended anyway."""
        watchdog = self._watchdog_or_default()
        if watchdog is not None:
            watchdog.retry_release(handle, last_renewed)

    # -- releasing and renewing --------------------------------------------------------

    async def release(self, handle: AsyncLockHandle) -> None:
        """Release one hold; :class:`LockLostError` if it was no longer ours. A release
        whose caller is cancelled meanwhile still finishes, in the background."""
        if handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        if handle.released:
            return
        self._binding.check()
        # Stop renewing first, so no renewal can land after the release.
        watchdog = self._watchdog_or_default()
        last_renewed = watchdog.unwatch(handle) if watchdog is not None else None
        handle.released = True
        released = await self._shielded(self._release_call(handle, last_renewed))
        if not wire.parse_release(released):
            raise handle._lost_at_release()

    async def _release_call(self, handle: AsyncLockHandle, last_renewed: float | None) -> Any:
        try:
            return await self._call(
                *wire.release_call(self.keys, handle.owner, handle.mode, handle.token)
            )
        except BackendUnavailable:
            # The hold is still in Redis: keep trying in the background until it
            # goes through or its lease would have ended anyway, so it never leaks.
            self.release_in_background(handle, last_renewed)
            raise

    async def renew(self, handle: AsyncLockHandle) -> bool:
        """Extend the lease of ``handle`` now (useful with ``watchdog=False``)."""
        if handle.released or handle.lost:
            return False
        self._binding.check()
        call = wire.renew_call(self.keys, handle.owner, handle.token, self.lease_ms)
        sent = time.monotonic()
        renewed = wire.parse_renewal(await self._call(*call))
        handle.writer_waiting = renewed is wire.Renewal.RENEWED_WRITER_WAITS
        if renewed is wire.Renewal.GONE:
            watchdog = self._watchdog_or_default()
            if watchdog is not None:
                watchdog.unwatch(handle)
            handle._mark_lost("its holding was gone at renewal")
            return False
        handle.confirmed_at = sent
        return True

    # -- plumbing --------------------------------------------------------------------

    def _watchdog_or_default(self) -> AsyncWatchdog | None:
        if self._watchdog is None and self._watchdog_choice is not False:
            choice = self._watchdog_choice
            self._watchdog = default_async_watchdog() if choice is True else choice
        return self._watchdog

    def _notifier_or_default(self) -> AsyncNotifier | AsyncClusterNotifier:
        if self._notifier is None:
            self._notifier = async_notifier_for(self.client)
        return self._notifier

    async def _call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script.acall(self.client, keys, args)
        except REDIS_DOWN as exc:
            raise unavailable(self.name, exc) from exc

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task of its own, kept referenced until it ends."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Seen here, so an error nobody awaited (its caller was cancelled) is
            # logged once instead of asyncio's "exception was never retrieved".
            log.debug("background lock call on %r failed: %r", self.name, task.exception())

    async def _shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro``, which runs to its end even if the caller is cancelled."""
        return await asyncio.shield(self._spawn(coro))

    def __repr__(self) -> str:
        return f"<AsyncRedisRWLock {self.name!r} key={self.keys.lock!r} lease={self.lease}s>"
