"""Redlock on asyncio: :class:`AsyncRedlockRWLock`, on ``redis.asyncio`` clients.

::

    masters = [redis.asyncio.Redis(host=h) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")]
    lock = AsyncRedlockRWLock(masters, "menu:7", lease=30.0)
    async with lock.write(timeout=5) as handle:
        await write_to_db(fencing_token=handle.token)

The sync :class:`~cacheguard.locks.redlock.RedlockRWLock`'s lock, natively on
asyncio: the same rounds (a round's calls go to every master at once with
``asyncio.gather``, each bounded by ``instance_timeout``), the same decisions
(:func:`~cacheguard.locks.redlock.settle_round`,
:func:`~cacheguard.locks.redlock.renewal_verdict`), the same keys, scripts and
release channels: sync and asyncio holders of one name on the same masters
exclude each other and wake each other.

Owners are tasks (:func:`~cacheguard.aio.rwlock.task_owner`), as for
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
import inspect
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cacheguard._identity import on_fork_in_child
from cacheguard.aio._loop import LoopBinding
from cacheguard.aio.notifier import AsyncNotifier, AsyncSubscription, async_notifier_for
from cacheguard.aio.rwlock import release_on_exit, task_owner
from cacheguard.backoff import Backoff
from cacheguard.checks import check_positive, check_ratio
from cacheguard.exceptions import REDIS_UNREACHABLE, BackendUnavailable, LockUpgradeError
from cacheguard.keys import ResourceKeys
from cacheguard.locks import redlock as sync_redlock
from cacheguard.locks import wire
from cacheguard.locks.protocol import Attempt, Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis_rwlock import HandleState, lock_settings
from cacheguard.locks.redlock import (
    _POOL_MADE,
    _RETRY_AFTER_ERROR,
    DEFAULT_INSTANCE_TIMEOUT,
    DRIFT_FLOOR,
    RAISE_FENCE,
    RETRY,
    Round,
    no_majority_message,
    release_error,
    renewal_verdict,
    settle_round,
    tally_round,
)
from cacheguard.locks.scripts import LuaScript, ScriptCall, arun_pipelined
from cacheguard.locks.watchdog import LeaseBook, _Entry
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
    address = settings.get("path") or f"{settings.get('host')}:{settings.get('port')}"
    per_timeout = _derived.setdefault(pool, {})
    derived = per_timeout.get(instance_timeout)
    if derived is None:
        kwargs = {k: v for k, v in settings.items() if k not in _POOL_MADE}
        for setting in ("socket_timeout", "socket_connect_timeout"):
            value = kwargs.get(setting)
            kwargs[setting] = instance_timeout if value is None else min(value, instance_timeout)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        derived_pool = redis.asyncio.ConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
        derived = per_timeout[instance_timeout] = redis.asyncio.Redis(connection_pool=derived_pool)
    return derived, str(address)


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
        self.quorum = len(masters) // 2 + 1

    def __len__(self) -> int:
        return len(self.masters)

    async def fan_out(
        self, work: Callable[[_Master], Awaitable[T]], indexes: Sequence[int] | None = None
    ) -> dict[int, T | BaseException]:
        """``work(master)`` on the chosen masters (all by default) at once."""
        chosen = list(self.masters) if indexes is None else [self.masters[i] for i in indexes]
        results = await asyncio.gather(*(_caught(functools.partial(work, m)) for m in chosen))
        return {m.index: result for m, result in zip(chosen, results, strict=True)}


def _masters_for(clients: Sequence[object], instance_timeout: float) -> _Masters:
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        raise TypeError("AsyncRedlockRWLock takes a sequence of redis.asyncio.Redis clients")
    if not clients:
        raise ValueError("AsyncRedlockRWLock needs at least one master")
    made = [_master_client(client, instance_timeout) for client in clients]
    addresses = [address for _, address in made]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(
            f"the masters of a Redlock must be independent servers; given more than once: "
            f"{', '.join(repeated)}"
        )
    return _Masters(tuple(_Master(i, c, a) for i, (c, a) in enumerate(made)))


# -- handles ---------------------------------------------------------------------------------------


class AsyncRedlockHandle(HandleState):
    """One acquisition of an :class:`AsyncRedlockRWLock` (the fields of the sync
    ``RedlockHandle``: ``token``, ``epochs``, ``valid_until``, ``lost`` ...)."""

    __slots__ = ("_granted", "epochs", "lock", "valid_until")

    def __init__(
        self,
        lock: AsyncRedlockRWLock,
        mode: Mode,
        owner: str,
        token: int,
        epochs: list[int | None],
        valid_until: float,
        on_lost: AsyncRedlockLostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock
        self.epochs = epochs
        self.valid_until = valid_until
        self._granted = [
            (lock._masters.masters[i].address, e) for i, e in enumerate(epochs) if e is not None
        ]

    @property
    def client(self) -> _Masters:
        return self.lock._masters

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
    def lock_name(self) -> str:
        return self.lock.name

    @property
    def validity(self) -> float:
        return max(0.0, self.valid_until - self.lock._timer())

    @property
    def masters_held(self) -> int:
        return sum(e is not None for e in self.epochs)

    async def release(self) -> None:
        await self.lock.release(self)

    async def renew(self) -> bool:
        return await self.lock.renew(self)

    def _start_on_lost(self) -> None:
        asyncio.get_running_loop().call_soon(self._run_on_lost)

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            result = self._on_lost(self)
            if inspect.isawaitable(result):
                self.lock._spawn(_awaited(result))
        except Exception:
            log.exception("on_lost callback of lock %r failed", self.lock.name)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<AsyncRedlockHandle {self.mode} {self.lock.name!r} token={self.token} "
            f"owner={self.owner} on {self.masters_held}/{len(self.epochs)} masters {state}>"
        )


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


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

    def clear(self) -> None:
        self._woken_by.clear()

    def forget(self, indexes: set[int]) -> None:
        self._woken_by.difference_update(indexes)

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


@dataclass
class _Grant:
    epochs: list[int | None]
    token: int
    valid_until: float


@dataclass
class _RoundResult:
    attempt: Attempt
    grant: _Grant | None
    undone: set[int]
    split: bool
    error: BackendUnavailable | None = None


class AsyncRedlockRWLock:
    """:class:`~cacheguard.locks.redlock.RedlockRWLock` on ``redis.asyncio`` clients
    (the same arguments; ``watchdog`` takes an :class:`AsyncRedlockWatchdog`;
    ``on_lost`` is called on the loop, a coroutine function run as a task)."""

    def __init__(
        self,
        clients: Sequence[redis.asyncio.Redis],
        name: str,
        *,
        lease: float = 30.0,
        timeout: float = 30.0,
        namespace: str = "cg",
        instance_timeout: float | None = None,
        clock_drift: float = 0.01,
        watchdog: AsyncRedlockWatchdog | bool = True,
        on_lost: AsyncRedlockLostCallback | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = lock_settings(
            name, lease=lease, timeout=timeout, namespace=namespace, backoff=backoff
        )
        self.name = settings.name
        self.lease = settings.lease
        self.lease_ms = settings.lease_ms
        self.timeout = settings.timeout
        self.keys = settings.keys
        self._mark_ms = settings.mark_ms
        if instance_timeout is None:
            self.instance_timeout = min(DEFAULT_INSTANCE_TIMEOUT, self.lease / 10)
        else:
            self.instance_timeout = check_positive("instance_timeout", instance_timeout)
            if self.instance_timeout > self.lease / 10:
                raise ValueError(
                    f"instance_timeout must be at most lease / 10 ({self.lease / 10:g} s), "
                    f"got {instance_timeout!r}: a slow master would eat the lock's validity"
                )
        self.clock_drift = check_ratio("clock_drift", clock_drift)
        self.drift = self.lease * self.clock_drift + DRIFT_FLOOR
        self._masters = _masters_for(clients, self.instance_timeout)
        self.quorum = self._masters.quorum
        self._watchdog_choice = watchdog
        self._watchdog: AsyncRedlockWatchdog | None = None
        self._on_lost = on_lost
        self._backoff = backoff
        self._timer = timer
        self._binding = LoopBinding(f"the lock {settings.name!r}")
        self._background: set[asyncio.Future[Any]] = set()

    @property
    def masters(self) -> list[str]:
        return [m.address for m in self._masters.masters]

    # -- acquiring ---------------------------------------------------------------------

    async def acquire_read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncRedlockHandle:
        return await self._acquire("read", timeout, owner)

    async def acquire_write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncRedlockHandle:
        return await self._acquire("write", timeout, owner)

    async def try_acquire_read(self, *, owner: str | None = None) -> AsyncRedlockHandle | None:
        return await self._try_once("read", owner)

    async def try_acquire_write(self, *, owner: str | None = None) -> AsyncRedlockHandle | None:
        return await self._try_once("write", owner)

    @contextlib.asynccontextmanager
    async def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncIterator[AsyncRedlockHandle]:
        handle = await self.acquire_read(timeout, owner=owner)
        async with release_on_exit(handle.release):
            yield handle

    @contextlib.asynccontextmanager
    async def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncIterator[AsyncRedlockHandle]:
        handle = await self.acquire_write(timeout, owner=owner)
        async with release_on_exit(handle.release):
            yield handle

    async def _acquire(
        self, mode: Mode, timeout: float | None, owner: str | None
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

    async def _drive(self, flow: Generator[Step, Any, int], mode: Mode, owner: str) -> _Grant:
        waiter = _Waiter(self._masters, self.keys.released_channel)
        grant: _Grant | None = None
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        waiter.clear()
                        result = await self._round(mode, owner, queued=True)
                        grant, reply = result.grant, result.attempt
                        waiter.forget(result.undone)
                        waiter.deaf_once = result.split
                    elif isinstance(step, Subscribe):
                        reply = await waiter.open(step.timeout)
                    elif isinstance(step, Wait):
                        reply = await waiter.wait(step.seconds)
                    else:
                        await self._shielded(self._withdraw(owner))
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

    async def _round(self, mode: Mode, owner: str, *, queued: bool) -> _RoundResult:
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
        self, running: asyncio.Future[_RoundResult], mode: Mode, owner: str, *, queued: bool
    ) -> None:
        try:
            result = await running
        except Exception:
            return
        grant = result.grant
        if grant is not None:
            granted = {i: e for i, e in enumerate(grant.epochs) if e is not None}
            marked = list(range(len(self._masters))) if mode == "write" and queued else []
            await self._undo(granted, marked, owner, mode, [])
        elif mode == "write" and queued:
            await self._withdraw(owner)

    async def _round_to_end(self, mode: Mode, owner: str, *, queued: bool) -> _RoundResult:
        unanswered: list[int] = []
        try:
            with sync_redlock._holdings.round(self.keys.lock, owner):
                return await self._round_in_flight(mode, owner, queued, unanswered)
        finally:
            if unanswered:
                tidier = self._tidier()
                for i in sorted(set(unanswered)):
                    tidier.tidy(self._masters.masters[i], self.keys, owner, mode, self.lease)

    async def _round_in_flight(
        self, mode: Mode, owner: str, queued: bool, unanswered: list[int]
    ) -> _RoundResult:
        masters = self._masters
        mark_ms = self._mark_ms if queued else 0
        call = wire.acquire_call(self.keys, owner, mode, lease_ms=self.lease_ms, mark_ms=mark_ms)
        start = self._timer()
        replies = await masters.fan_out(lambda m: m.call(*call))
        outcome = tally_round(replies, mode=mode, queued=queued, describe=self._describe)
        unanswered += outcome.unanswered
        fenced = True
        if outcome.has_majority(masters.quorum) and mode == "write":
            fenced = await self._fence(outcome, owner)
        valid_until = start + self.lease - self.drift
        verdict = settle_round(
            outcome,
            masters=len(masters),
            quorum=masters.quorum,
            fenced=fenced,
            now=self._timer(),
            valid_until=valid_until,
        )
        if verdict.granted:
            epochs: list[int | None] = [outcome.granted.get(i) for i in range(len(masters))]
            grant = _Grant(epochs, outcome.token, valid_until)
            return _RoundResult(Attempt(granted=True, epoch=outcome.token), grant, set(), False)
        undone = await self._undo(outcome.granted, verdict.withdraw, owner, mode, unanswered)
        if verdict.upgrade:
            return _RoundResult(Attempt(granted=False, upgrade=True), None, undone, verdict.split)
        attempt = Attempt(granted=False, retry_in=verdict.retry_in)
        result = _RoundResult(attempt, None, undone, verdict.split)
        if verdict.unreachable:
            result.error = BackendUnavailable(
                no_majority_message(self.name, masters.quorum, outcome)
            )
        return result

    async def _fence(self, outcome: Round, owner: str) -> bool:
        raise_call: ScriptCall = (RAISE_FENCE, [self.keys.fence], [outcome.token])
        calls = {i: raise_call for i in outcome.granted}
        calls.update({i: wire.withdraw_call(self.keys, owner) for i in outcome.marked})
        replies = await self._masters.fan_out(lambda m: m.call(*calls[m.index]), list(calls))
        raised = sum(not isinstance(replies[i], BaseException) for i in outcome.granted)
        return raised >= self._masters.quorum

    async def _undo(
        self,
        granted: dict[int, int],
        marked: Sequence[int],
        owner: str,
        mode: Mode,
        unanswered: list[int],
    ) -> set[int]:
        calls: dict[int, ScriptCall] = {
            i: wire.release_call(self.keys, owner, mode, epoch) for i, epoch in granted.items()
        }
        for i in marked:
            calls.setdefault(i, wire.withdraw_call(self.keys, owner))
        replies = await self._masters.fan_out(lambda m: m.call(*calls[m.index]), list(calls))
        unanswered += [i for i in granted if isinstance(replies[i], REDIS_UNREACHABLE)]
        return set(calls)

    async def _withdraw(self, owner: str) -> None:
        call = wire.withdraw_call(self.keys, owner)
        await self._masters.fan_out(lambda m: m.call(*call))

    def _granted(self, mode: Mode, owner: str, grant: _Grant) -> AsyncRedlockHandle:
        handle = AsyncRedlockHandle(
            self, mode, owner, grant.token, grant.epochs, grant.valid_until, self._on_lost
        )
        sync_redlock._holdings.add(self.keys.lock, owner, handle._granted)
        watchdog = self._watchdog_or_default()
        if watchdog is not None:
            watchdog.watch(handle)
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
        sync_redlock._holdings.remove(self.keys.lock, handle.owner, handle._granted)
        released, pending = await self._shielded(_release_on(self._masters, handle))
        if pending:
            self._tidier().retry_release(handle, last_renewed)
        error = release_error(
            released=released, pending=len(pending), quorum=self.quorum, lost=handle.lost
        )
        if error == "lost":
            raise handle._lost_at_release()
        if error == "unavailable":
            raise BackendUnavailable(
                f"released lock {self.name!r} on {released} of {len(self._masters)} masters; "
                f"{len(pending)} did not answer and are retried in the background"
            )

    async def renew(self, handle: AsyncRedlockHandle) -> bool:
        """Extend the lease on every master holding ``handle`` now (see the sync lock)."""
        if handle.released or handle.lost:
            return False
        self._binding.check()
        verdict = (await _renew_on(self._masters, [handle]))[0]
        if isinstance(verdict, wire.Renewal):
            return True
        if verdict == RETRY and handle.validity > 0:
            raise BackendUnavailable(
                f"no majority of the masters of lock {self.name!r} answered the renewal"
            )
        if self._watchdog is not None:
            self._watchdog.unwatch(handle)
        handle._mark_lost(
            "no majority renewal within its validity" if verdict == RETRY else verdict
        )
        return False

    async def aclose(self) -> None:
        """Stop the subscriber tasks of this lock's masters on this loop and close
        their connections (shared by every lock on the same clients; all of it starts
        again on next use), and the Redlock watchdog's task if it has nothing left to
        do. Call it before the event loop closes."""
        for master in self._masters.masters:
            await master.notifier().aclose()
            await master.client.aclose()
        watchdog = self._watchdog or _watchdogs.get(asyncio.get_running_loop())
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
        return self._watchdog_or_default() or default_async_redlock_watchdog()

    def _describe(self, index: int) -> str:
        return repr(self._masters.masters[index])

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.shield(self._spawn(coro))

    def __repr__(self) -> str:
        return (
            f"<AsyncRedlockRWLock {self.name!r} key={self.keys.lock!r} lease={self.lease}s "
            f"on {len(self._masters)} masters, quorum {self.quorum}>"
        )


# -- renewal and release on the masters ------------------------------------------------------------


async def _renew_on(
    masters: _Masters, handles: Sequence[AsyncRedlockHandle]
) -> list[wire.Renewal | str]:
    """The sync ``_renew_on`` with awaits (the decisions are ``renewal_verdict``'s)."""
    starts = [h.lock._timer() for h in handles]
    calls: dict[int, list[tuple[int, ScriptCall]]] = {}
    for n, h in enumerate(handles):
        for i, epoch in enumerate(h.epochs):
            if epoch is not None:
                calls.setdefault(i, []).append(
                    (n, wire.renew_call(h.keys, h.owner, epoch, h.lease_ms))
                )
    replies = await masters.fan_out(
        lambda m: m.pipelined([c for _, c in calls[m.index]]), list(calls)
    )
    renewed = [0] * len(handles)
    writer_waits = [False] * len(handles)
    for i, batch in calls.items():
        answers = replies[i]
        if isinstance(answers, BaseException):
            continue
        for (n, _), answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                continue
            renewal = wire.parse_renewal(answer)
            if renewal is wire.Renewal.GONE:
                handles[n].epochs[i] = None
            else:
                renewed[n] += 1
                writer_waits[n] |= renewal is wire.Renewal.RENEWED_WRITER_WAITS
    verdicts: list[wire.Renewal | str] = []
    for n, h in enumerate(handles):
        valid_until = starts[n] + h.lease - h.lock.drift
        verdict = renewal_verdict(
            renewed=renewed[n],
            held=h.masters_held,
            writer_waits=writer_waits[n],
            quorum=masters.quorum,
            masters=len(masters),
            in_time=h.lock._timer() < valid_until,
        )
        if isinstance(verdict, wire.Renewal):
            h.valid_until = valid_until
        verdicts.append(verdict)
    return verdicts


async def _release_on(masters: _Masters, handle: AsyncRedlockHandle) -> tuple[int, list[int]]:
    held = {i: e for i, e in enumerate(handle.epochs) if e is not None}
    replies = await masters.fan_out(
        lambda m: m.call(*wire.release_call(handle.keys, handle.owner, handle.mode, held[m.index])),
        list(held),
    )
    released = 0
    pending = []
    for i, reply in replies.items():
        if isinstance(reply, BaseException):
            pending.append(i)
            continue
        handle.epochs[i] = None
        released += wire.parse_release(reply)
    return released, pending


# -- the watchdog ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Tidy:
    master: _Master
    keys: ResourceKeys
    owner: str
    mode: Mode
    due: float
    give_up_at: float


class AsyncRedlockWatchdog(LeaseBook[AsyncRedlockHandle]):
    """The sync ``RedlockWatchdog`` as one task per event loop: renewals on a
    majority, unfinished releases, tidy-ups of masters that did not answer."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._guard = contextlib.nullcontext()
        self._binding = LoopBinding("this AsyncRedlockWatchdog")
        self._tidies: dict[tuple[str, str, str, str], _Tidy] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._wake_at = float("inf")

    def tidy(
        self, master: _Master, keys: ResourceKeys, owner: str, mode: Mode, lease: float
    ) -> None:
        now = self._timer()
        key = (master.address, keys.lock, owner, mode)
        self._tidies.setdefault(key, _Tidy(master, keys, owner, mode, now, now + lease))
        self._poke(now)

    def pending_tidies(self) -> int:
        return len(self._tidies)

    def _add(self, entry: _Entry[AsyncRedlockHandle]) -> None:
        self._entries[id(entry.handle)] = entry
        self._poke(entry.due)

    def _poke(self, due: float) -> None:
        loop = self._binding.check()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="cacheguard-redlock-watchdog")
        elif due < self._wake_at and self._wake is not None:
            self._wake.set()

    def unwatch(self, handle: AsyncRedlockHandle) -> float | None:
        last_renewed = super().unwatch(handle)
        if not self._entries and self._wake is not None:
            self._wake.set()  # nothing left to renew: the task may end now
        return last_renewed

    def close(self) -> None:
        """Stop the task (what is watched stays; the next watch or tidy-up restarts it)."""
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the task has ended."""
        task = self._task
        self.close()
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        try:
            while True:
                now = self._timer()
                due, soonest = self._due(now)
                tidies = [t for t in self._tidies.values() if t.due <= now]
                if not due and not tidies:
                    soonest = min([soonest, *(t.due for t in self._tidies.values())])
                    if soonest == float("inf"):
                        return  # nothing to do: the next watch or tidy starts a new task
                    self._wake_at = soonest
                    wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(wake.wait(), soonest - now)
                    continue
                self._wake_at = now
                try:
                    if tidies:
                        await self._tidy_now(tidies)
                    if due:
                        await self._work(due)
                except Exception:
                    log.exception("unexpected error while renewing Redlock leases")
                    self._after_error(due)
        finally:
            if self._task is asyncio.current_task():
                self._task = None
                self._wake_at = float("inf")

    async def _work(self, due: list[_Entry[AsyncRedlockHandle]]) -> None:
        now = self._timer()
        for entries in self._batches(due):
            masters = entries[0].handle.client
            renewing = [e for e in entries if not e.releasing]
            if renewing:
                verdicts = await _renew_on(masters, [e.handle for e in renewing])
                for entry, verdict in zip(renewing, verdicts, strict=True):
                    if isinstance(verdict, wire.Renewal):
                        self._settle(entry, int(verdict), now)
                    elif verdict == RETRY:
                        self._after_error([entry])
                    else:
                        self._lose(entry, verdict)
            for entry in (e for e in entries if e.releasing):
                _, pending = await _release_on(masters, entry.handle)
                if pending:
                    self._after_error([entry])
                else:
                    self._forget(entry)

    def _after_error(self, entries: list[_Entry[AsyncRedlockHandle]]) -> None:
        now = self._timer()
        for entry in entries:
            handle = entry.handle
            if entry.releasing:
                if now - entry.last_renewed >= handle.lease:
                    self._forget(entry)
                    continue
            elif handle.validity <= 0:
                self._lose(entry, "no majority renewed it within its validity")
                continue
            entry.due = now + min(_RETRY_AFTER_ERROR, handle.lease / 3)

    async def _tidy_now(self, tidies: list[_Tidy]) -> None:
        by_master: dict[str, list[_Tidy]] = {}
        for t in tidies:
            by_master.setdefault(t.master.address, []).append(t)
        results = await asyncio.gather(
            *(
                _caught(functools.partial(_tidy_on, group[0].master, group))
                for group in by_master.values()
            )
        )
        done = {id(t) for result in results if isinstance(result, list) for t in result}
        now = self._timer()
        for t in tidies:
            if id(t) in done or now >= t.give_up_at:
                self._tidies.pop((t.master.address, t.keys.lock, t.owner, t.mode), None)
            else:
                t.due = now + _RETRY_AFTER_ERROR


async def _tidy_on(master: _Master, tidies: list[_Tidy]) -> list[_Tidy]:
    """The sync ``_tidy_on`` with awaits."""
    holdings = sync_redlock._holdings
    pipe = master.client.pipeline(transaction=False)
    for t in tidies:
        pipe.hget(t.keys.lock, f"g:{t.owner}")
    epochs = await pipe.execute(raise_on_error=False)
    done: list[_Tidy] = []
    releases: list[tuple[_Tidy, ScriptCall]] = []
    for t, raw in zip(tidies, epochs, strict=True):
        if isinstance(raw, BaseException):
            continue
        if raw is None:
            done.append(t)
        elif holdings.acquiring(t.keys.lock, t.owner):
            continue
        elif holdings.counts_on(t.keys.lock, t.owner, master.address, int(raw)):
            done.append(t)
        else:
            releases.append((t, wire.release_call(t.keys, t.owner, t.mode, int(raw))))
    if releases:
        answers = await master.pipelined([call for _, call in releases])
        done += [
            t
            for (t, _), a in zip(releases, answers, strict=True)
            if not isinstance(a, BaseException)
        ]
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
