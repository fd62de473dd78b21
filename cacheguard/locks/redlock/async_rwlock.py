"""Redlock on asyncio: :class:`AsyncRedlockRWLock`, on ``redis.asyncio`` clients.

::

    masters = [redis.asyncio.Redis(host=h) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")]
    lock = AsyncRedlockRWLock(masters, "menu:7", lease=30.0)
    async with lock.write(timeout=5) as handle:
        await write_to_db(fencing_token=handle.token)

The sync :class:`~cacheguard.locks.redlock.rwlock.RedlockRWLock`'s lock, natively on
asyncio: the same rounds (a round's calls go to every master at once with
``asyncio.gather``, each bounded by ``instance_timeout``), the same decisions
(:mod:`cacheguard.locks.redlock.quorum`: the round flow, renewal and release verdicts,
tidy-ups), the same keys, scripts and release channels: sync and asyncio holders
of one name on the same masters exclude each other and wake each other.

Owners are tasks (:func:`~cacheguard.locks.redis.async_rwlock.task_owner`), as for
``AsyncRedisRWLock``. Cancellation: a task cancelled while it waits withdraws its
writer's marks; one cancelled during a round lets the round finish and gives
back what it got (grants released, marks withdrawn) before the cancellation goes
on; a cancelled release finishes in the background. Renewals, finished releases
and tidy-ups run in one task per event loop (:class:`AsyncRedlockWatchdog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cacheguard._identity import on_fork_in_child
from cacheguard._loop import LoopBinding, LoopTask
from cacheguard.backoff import Backoff
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import LockUpgradeError
from cacheguard.locks.async_shape import AsyncRWLockShape, LoopHandle
from cacheguard.locks.protocol import Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.async_rwlock import task_owner
from cacheguard.locks.redis.lease import LeaseEntry
from cacheguard.locks.redlock import quorum
from cacheguard.locks.redlock.holdings import process_holdings
from cacheguard.locks.redlock.quorum import (
    FanOut,
    Grant,
    RedlockBook,
    RedlockCommon,
    RedlockHandleState,
    RoundResult,
    Tidy,
)
from cacheguard.redis.async_notifier import AsyncNotifier, AsyncSubscription, async_notifier_for
from cacheguard.redis.async_scripts import arun_pipelined
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import LuaScript, ScriptCall
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "AsyncRedlockHandle",
    "AsyncRedlockRWLock",
    "AsyncRedlockWatchdog",
    "default_async_redlock_watchdog",
]

log = logging.getLogger("cacheguard.redlock")

T = TypeVar("T")
AsyncRedlockLostCallback = Callable[["AsyncRedlockHandle"], object]


# -- the masters -----------------------------------------------------------------------------------

_derived: weakref.WeakKeyDictionary[Any, dict[float, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary()
)


def _master_client(client: object, instance_timeout: float) -> tuple[redis.asyncio.Redis, str]:
    """The asyncio twin of the sync lock's per-master client: the caller's connection
    settings, socket timeouts capped at ``instance_timeout``, no retries."""
    if not isinstance(client, redis.asyncio.Redis):
        raise TypeError(
            "AsyncRedlockRWLock takes redis.asyncio.Redis clients of independent masters, "
            f"not {type(client).__module__}.{type(client).__name__}"
        )
    pool = client.connection_pool
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        raise TypeError("AsyncRedlockRWLock takes clients of plain masters, not Sentinel's")
    settings = dict(pool.connection_kwargs)
    per_timeout = _derived.setdefault(pool, {})
    derived = per_timeout.get(instance_timeout)
    if derived is None:
        kwargs = quorum.master_connection_kwargs(settings, instance_timeout, Retry(NoBackoff(), 0))
        derived_pool = redis.asyncio.ConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
        derived = per_timeout[instance_timeout] = redis.asyncio.Redis(connection_pool=derived_pool)
    return derived, quorum.master_address(settings)


class _Master:
    __slots__ = ("address", "client", "index")

    def __init__(self, index: int, client: redis.asyncio.Redis, address: str) -> None:
        self.index = index
        self.client = client
        self.address = address

    async def call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        return await script.acall(self.client, keys, args)

    async def pipelined(self, calls: list[ScriptCall]) -> list[Any]:
        return await arun_pipelined(self.client, calls)

    def notifier(self) -> AsyncNotifier:
        notifier = async_notifier_for(self.client)
        assert isinstance(notifier, AsyncNotifier)  # a plain master: never a cluster's
        return notifier

    def __repr__(self) -> str:
        return f"master {self.index} ({self.address})"


async def _caught(call: Callable[[], Awaitable[T]]) -> T | BaseException:
    # The coroutine is made here, so a gather cancelled before it starts leaves none
    # un-awaited behind.
    try:
        return await call()
    except (redis.RedisError, OSError) as exc:  # one master's trouble, not the caller's
        return exc


class _Masters:
    def __init__(self, masters: tuple[_Master, ...]) -> None:
        self.masters = masters
        self.quorum = quorum.majority(len(masters))

    def __len__(self) -> int:
        return len(self.masters)

    async def fan_out(
        self, work: Callable[[_Master], Awaitable[T]], indexes: Sequence[int] | None = None
    ) -> dict[int, T | BaseException]:
        """``work(master)`` on the chosen masters (all by default) at once."""
        chosen = list(self.masters) if indexes is None else [self.masters[i] for i in indexes]
        results = await asyncio.gather(*(_caught(functools.partial(work, m)) for m in chosen))
        return {m.index: result for m, result in zip(chosen, results, strict=True)}

    async def run(self, step: FanOut) -> dict[int, Any]:
        """One script call per master, as ``step`` names them."""
        return await self.fan_out(lambda m: m.call(*step.calls[m.index]), list(step.calls))

    async def drive(self, flow: Generator[FanOut, dict[int, Any], T]) -> T:
        """Answer ``flow``'s fan-outs until it returns."""
        try:
            step = next(flow)
            while True:
                step = flow.send(await self.run(step))
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            flow.close()


def _masters_for(clients: Sequence[object], instance_timeout: float) -> _Masters:
    quorum.check_master_list(clients, "AsyncRedlockRWLock", "redis.asyncio.Redis")
    made = [_master_client(client, instance_timeout) for client in clients]
    quorum.check_independent([address for _, address in made])
    return _Masters(tuple(_Master(i, c, a) for i, (c, a) in enumerate(made)))


# -- handles ---------------------------------------------------------------------------------------


class AsyncRedlockHandle(LoopHandle, RedlockHandleState):
    """One acquisition of an :class:`AsyncRedlockRWLock` (the fields of the sync
    ``RedlockHandle``: ``token``, ``epochs``, ``valid_until``, ``lost`` ...)."""

    __slots__ = ()

    lock: AsyncRedlockRWLock

    async def renew(self) -> bool:
        return await self.lock.renew(self)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- waking up -------------------------------------------------------------------------------------


class _FanIn(AsyncSubscription):
    __slots__ = ("_index", "_waiter")

    def __init__(self, notifier: AsyncNotifier, channel: str, index: int, waiter: _Waiter) -> None:
        super().__init__(notifier, channel)
        self._index = index
        self._waiter = waiter

    def _deliver(self, payload: bytes | None) -> None:
        super()._deliver(payload)
        self._waiter.note(self._index)


class _Waiter:
    """The sync lock's waiter on asyncio: any master's announcement wakes it."""

    def __init__(self, masters: _Masters, channel: str) -> None:
        self._masters = masters
        self._channel = channel
        self._woken_by: set[int] = set()
        self._wakeup: asyncio.Future[None] | None = None
        self._subscriptions: list[_FanIn] = []
        self.deaf_once = False

    def note(self, index: int) -> None:
        self._woken_by.add(index)
        if self._wakeup is not None:
            _resolve(self._wakeup)

    async def open(self, timeout: float) -> bool:
        """Subscribe on every master; wait up to ``timeout`` until a majority confirmed."""
        self._subscriptions = [
            _FanIn(m.notifier(), self._channel, m.index, self) for m in self._masters.masters
        ]
        opening = {asyncio.ensure_future(s.open(timeout)) for s in self._subscriptions}
        confirmed = 0
        try:
            while opening and confirmed < self._masters.quorum:
                done, opening = await asyncio.wait(opening, return_when=asyncio.FIRST_COMPLETED)
                confirmed += sum(
                    1 for d in done if not d.cancelled() and d.exception() is None and d.result()
                )
        finally:
            for pending in opening:
                pending.cancel()
        return confirmed >= self._masters.quorum

    def after_round(self, result: RoundResult) -> None:
        self._woken_by.difference_update(result.undone)
        self.deaf_once = result.split

    def clear(self) -> None:
        self._woken_by.clear()

    async def wait(self, seconds: float) -> list[bytes]:
        if self.deaf_once:
            self.deaf_once = False
            await asyncio.sleep(seconds)  # Redlock's random pause after a split vote
            return []
        if self._woken_by or seconds <= 0:
            return []
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup = loop.create_future()
        timer = loop.call_later(seconds, _resolve, wakeup)
        try:
            await wakeup
        finally:
            timer.cancel()
            self._wakeup = None
        return []

    def close(self) -> None:
        for subscription in self._subscriptions:
            subscription.close()


# -- the lock --------------------------------------------------------------------------------------


class AsyncRedlockRWLock(RedlockCommon, AsyncRWLockShape[AsyncRedlockHandle]):
    """:class:`~cacheguard.locks.redlock.rwlock.RedlockRWLock` on ``redis.asyncio`` clients
    (the same arguments; ``watchdog`` takes an :class:`AsyncRedlockWatchdog`;
    ``on_lost`` is called on the loop, a coroutine function run as a task)."""

    _masters: _Masters

    def __init__(
        self,
        clients: Sequence[redis.asyncio.Redis],
        name: str,
        *,
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        namespace: str = "cg",
        instance_timeout: Seconds | None = None,
        clock_drift: float = 0.01,
        watchdog: AsyncRedlockWatchdog | bool = True,
        on_lost: AsyncRedlockLostCallback | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = quorum.redlock_settings(
            name, lease, timeout, namespace, instance_timeout, clock_drift, backoff
        )
        masters = _masters_for(clients, settings.instance_timeout)
        self._configure(settings, masters, on_lost=on_lost, backoff=backoff, timer=timer)
        self._watchdog_choice = watchdog
        self._watchdog: AsyncRedlockWatchdog | None = None
        self._binding = LoopBinding(f"the lock {settings.name!r}")
        self._background: set[asyncio.Future[Any]] = set()

    # -- acquiring ---------------------------------------------------------------------

    async def _acquire(
        self, mode: Mode, timeout: Seconds | None, owner: str | None
    ) -> AsyncRedlockHandle:
        self._binding.check()
        owner = owner or task_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        first = await self._round(mode, owner, queued=True)
        if first.grant is not None:
            return self._granted(mode, owner, first.grant)
        flow = acquire_flow(
            first.attempt,
            name=self.name,
            mode=mode,
            owner=owner,
            start=start,
            timeout=limit,
            timer=self._timer,
            backoff=self._backoff,
        )
        return self._granted(mode, owner, await self._drive(flow, mode, owner))

    async def _drive(self, flow: Generator[Step, Any, int], mode: Mode, owner: str) -> Grant:
        waiter = _Waiter(self._masters, self.keys.released_channel)
        grant: Grant | None = None
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        waiter.clear()
                        result = await self._round(mode, owner, queued=True)
                        grant, reply = result.grant, result.attempt
                        waiter.after_round(result)
                    elif isinstance(step, Subscribe):
                        reply = await waiter.open(step.timeout)
                    elif isinstance(step, Wait):
                        reply = await waiter.wait(step.seconds)
                    else:
                        await self._shielded(self._masters.run(self._withdraw_step(owner)))
                except BaseException as exc:  # the flow decides; a cancel withdraws marks
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration:
            assert grant is not None
            return grant
        finally:
            flow.close()
            waiter.close()

    async def _try_once(self, mode: Mode, owner: str | None) -> AsyncRedlockHandle | None:
        self._binding.check()
        owner = owner or task_owner()
        result = await self._round(mode, owner, queued=False)
        if result.attempt.upgrade:
            raise LockUpgradeError(name=self.name, owner=owner)
        return self._granted(mode, owner, result.grant) if result.grant is not None else None

    async def _round(self, mode: Mode, owner: str, *, queued: bool) -> RoundResult:
        """One round, run to its end even if the caller is cancelled meanwhile; what
        it got is then given back before the cancellation goes on."""
        running = self._spawn(self._round_to_end(mode, owner, queued=queued))
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            undo = self._spawn(self._give_back(running, mode, owner, queued=queued))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(undo)
            raise
        if result.error is not None:
            raise result.error
        return result

    async def _give_back(
        self, running: asyncio.Future[RoundResult], mode: Mode, owner: str, *, queued: bool
    ) -> None:
        try:
            result = await running
        except Exception:
            return
        calls = quorum.abandoned_round_calls(
            result, self.keys, owner, mode, masters=len(self._masters), queued=queued
        )
        if calls:
            await self._masters.run(FanOut(calls))

    async def _round_to_end(self, mode: Mode, owner: str, *, queued: bool) -> RoundResult:
        unanswered: list[int] = []
        try:
            with process_holdings().round(self.keys.lock, owner):
                flow = self._round_flow(mode, owner, queued=queued, unanswered=unanswered)
                return await self._masters.drive(flow)
        finally:
            self._tidy_later(unanswered, owner, mode)

    def _granted(self, mode: Mode, owner: str, grant: Grant) -> AsyncRedlockHandle:
        handle = AsyncRedlockHandle(self, mode, owner, grant, self._on_lost, self.masters)
        process_holdings().add(handle)
        watchdog = self._watchdog_or_default()
        if watchdog is not None:
            watchdog.watch(handle, weak=True)  # a handle its task dropped is given back
        return handle

    # -- releasing and renewing --------------------------------------------------------

    async def release(self, handle: AsyncRedlockHandle) -> None:
        """Release one hold on every master holding it (see the sync lock); a release
        whose caller is cancelled meanwhile still finishes, in the background."""
        if handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        if handle.released:
            return
        self._binding.check()
        watchdog = self._watchdog_or_default()
        last_renewed = watchdog.unwatch(handle) if watchdog is not None else None
        handle.released = True
        process_holdings().remove(handle)
        released, pending = await self._shielded(_release_on(self._masters, handle))
        if pending:
            self._tidier().retry_release(handle, last_renewed)
        failure = quorum.release_failure(handle, released, pending)
        if failure is not None:
            raise failure

    async def renew(self, handle: AsyncRedlockHandle) -> bool:
        """Extend the lease on every master holding ``handle`` now (see the sync lock)."""
        if handle.released or handle.lost:
            return False
        self._binding.check()
        lost = quorum.renewal_outcome(handle, (await _renew_on(self._masters, [handle]))[0])
        if lost is None:
            return True
        if self._watchdog is not None:
            self._watchdog.unwatch(handle)
        handle._mark_lost(lost)
        return False

    async def aclose(self) -> None:
        """Stop the subscriber tasks of this lock's masters on this loop and close
        their connections (shared by every lock on the same clients; all of it starts
        again on next use), and the Redlock watchdog's task if it has nothing left to
        do. Call it before the event loop closes."""
        for master in self._masters.masters:
            await master.notifier().aclose()
            await master.client.aclose()
        watchdog = self._watchdog
        if watchdog is None:
            watchdog = _watchdogs.get(asyncio.get_running_loop())
        if watchdog is not None and not len(watchdog) and not watchdog.pending_tidies():
            await watchdog.aclose()

    # -- plumbing --------------------------------------------------------------------

    def _watchdog_or_default(self) -> AsyncRedlockWatchdog | None:
        """The watchdog renewing this lock's handles (None with ``watchdog=False``)."""
        if self._watchdog is None and self._watchdog_choice is not False:
            choice = self._watchdog_choice
            self._watchdog = default_async_redlock_watchdog() if choice is True else choice
        return self._watchdog

    def _tidier(self) -> AsyncRedlockWatchdog:
        """Who finishes releases and tidies masters: the lock's watchdog, else the loop's."""
        watchdog = self._watchdog_or_default()
        return watchdog if watchdog is not None else default_async_redlock_watchdog()

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.shield(self._spawn(coro))


# -- renewal and release on the masters ------------------------------------------------------------


async def _renew_on(
    masters: _Masters, handles: Sequence[AsyncRedlockHandle]
) -> list[wire.Renewal | str]:
    """The sync ``_renew_on`` with awaits (the verdicts are ``quorum.settle_renewals``')."""
    starts, calls = quorum.renewal_calls(handles)
    replies = await masters.fan_out(
        lambda m: m.pipelined([c for _, c in calls[m.index]]), list(calls)
    )
    return quorum.settle_renewals(handles, starts, calls, replies)


async def _release_on(masters: _Masters, handle: AsyncRedlockHandle) -> tuple[int, list[int]]:
    replies = await masters.run(FanOut(quorum.release_calls(handle)))
    return quorum.settle_release(handle, replies)


# -- the watchdog ----------------------------------------------------------------------------------


_RedlockWork = tuple[list[Tidy], list[LeaseEntry[AsyncRedlockHandle]]]


class AsyncRedlockWatchdog(RedlockBook[AsyncRedlockHandle], LoopTask[_RedlockWork]):
    """The sync ``RedlockWatchdog`` as one task per event loop: renewals on a
    majority, unfinished releases, tidy-ups of masters that did not answer."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._guard = contextlib.nullcontext()
        self._tidies = {}
        self._init_loop_task("this AsyncRedlockWatchdog")

    def tidy(
        self, master: _Master, keys: ResourceKeys, owner: str, mode: Mode, lease: float
    ) -> None:
        self._add_tidy(master, keys, owner, mode, lease)
        self._poke(self._timer())

    def _add(self, entry: LeaseEntry[AsyncRedlockHandle]) -> None:
        self._entries[entry.key] = entry
        self._poke(entry.due)

    def unwatch(self, handle: AsyncRedlockHandle) -> float | None:
        last_renewed = super().unwatch(handle)
        if not self._entries and self._wake is not None:
            self._wake.set()  # nothing left to renew: the task may end now
        return last_renewed

    def _task_name(self) -> str:
        return "cacheguard-redlock-watchdog"

    def _due_work(self, now: float) -> tuple[_RedlockWork | None, float]:
        due, soonest = self._due(now)
        tidies = self._due_tidies(now)
        if due or tidies:
            return (tidies, due), now
        return None, min(soonest, self._next_tidy())

    async def _do(self, work: _RedlockWork) -> None:
        tidies, due = work
        if tidies:
            await self._tidy_now(tidies)
        if due:
            await self._work(due)

    def _failed(self, work: _RedlockWork) -> None:
        log.exception("unexpected error while renewing Redlock leases")
        self._after_error(work[1])

    async def _work(self, due: list[LeaseEntry[AsyncRedlockHandle]]) -> None:
        now = self._timer()
        for entries in self._batches(due):
            masters = entries[0].handle.client
            renewing = [e for e in entries if not e.releasing]
            if renewing:
                verdicts = await _renew_on(masters, [e.handle for e in renewing])
                self._settle_renewals(renewing, verdicts, now)
            for entry in (e for e in entries if e.releasing):
                self._settle_release(entry, (await _release_on(masters, entry.handle))[1])

    async def _tidy_now(self, tidies: list[Tidy]) -> None:
        groups = quorum.group_by_master(tidies)
        results = await asyncio.gather(
            *(_caught(functools.partial(_tidy_on, g[0].master, g)) for g in groups)
        )
        self._tidies_done(tidies, [t for r in results if isinstance(r, list) for t in r])


async def _tidy_on(master: _Master, tidies: list[Tidy]) -> list[Tidy]:
    """The sync ``_tidy_on`` with awaits."""
    pipe = master.client.pipeline(transaction=False)
    for t in tidies:
        pipe.hget(t.keys.lock, f"g:{t.owner}")
    epochs = await pipe.execute(raise_on_error=False)
    done, releases = quorum.tidy_plan(tidies, epochs, master.address, process_holdings())
    if releases:
        answers = await master.pipelined([call for _, call in releases])
        done += quorum.tidies_released(releases, answers)
    return done


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRedlockWatchdog] = (
    weakref.WeakKeyDictionary()
)


def default_async_redlock_watchdog() -> AsyncRedlockWatchdog:
    """The running event loop's Redlock watchdog, created on first use."""
    loop = asyncio.get_running_loop()
    dog = _watchdogs.get(loop)
    if dog is None:
        dog = _watchdogs[loop] = AsyncRedlockWatchdog()
        dog._binding.check()
    return dog


def _reset_after_fork() -> None:
    _watchdogs.clear()


on_fork_in_child(_reset_after_fork)
