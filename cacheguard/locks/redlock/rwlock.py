"""Redlock: the read-write lock on a quorum of N independent Redis masters.

::

    masters = [redis.Redis(host=h) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")]
    lock = RedlockRWLock(masters, "menu:7", lease=30.0)
    with lock.write(timeout=5) as handle:
        write_to_db(fencing_token=handle.token)

The lock state on each master is :class:`~cacheguard.locks.redis.rwlock.RedisRWLock`'s
hash, changed by the same scripts (:mod:`cacheguard.locks.redis.lua`); this module
runs them on every master and counts.

One attempt (a *round*)
    The acquire script goes to every master at once (one thread each, from a
    shared pool), each call bounded by the per-master ``instance_timeout``. The
    lock is granted when a majority (``N // 2 + 1``) granted it and the round,
    the time it took counted from before the first call went out, still leaves
    a *validity*: ``lease - elapsed - drift``, where ``drift = lease *
    clock_drift + 2 ms`` allows for clocks that run at slightly different rates.
    A round that falls short releases what it was granted, on every master that
    granted it; a master that did not answer may still have run the call, so it
    is tidied in the background (its holding, if one appeared, is released).

Writers, marks and split votes
    A refused writer leaves its waiting mark on each master that refused it, as
    on one Redis, so a writer queued on a majority holds new readers off.
    When writers split the masters between them (each was granted some, none a
    majority), each releases its grants, withdraws its marks and sleeps a
    jittered backoff deaf to wake-ups, as Redlock prescribes: marks kept through
    a split would order the writers differently on each master and could keep
    them splitting for ever.

Fencing tokens
    A write handle's token is the largest fencing counter (``INCR`` of the
    per-master ``fence`` key) among the granting masters, and before the grant
    counts, that token is written back to every granting master's counter
    (raised, never lowered), on a majority at least. A later write holding's
    majority shares a master with that one, whose counter then already passed
    the token: tokens strictly increase across write holdings while the
    masters' clocks keep the drift allowance and agree with each other to within
    the time since the last token (a master's ``fence`` key expires a day after
    its last use, and a master that finds it gone, expired or lost, starts it
    again from its own clock in microseconds; see :mod:`cacheguard.locks.redis.lua`).

Renewal and release
    The Redlock watchdog (:class:`RedlockWatchdog`, one thread per process, the
    decisions of :class:`~cacheguard.locks.redis.watchdog.LeaseBook`) renews every
    ``lease / 3`` on every master that holds the handle; the validity restarts
    only when a majority renewed in time. A handle that keeps fewer than a
    majority, or gets no majority renewal before its validity ends, is marked
    lost. Release goes to every master holding the handle.

Every master's client is the caller's ``redis.Redis`` with its socket and connect
timeouts capped at ``instance_timeout`` and no retries (a client of the same
connection settings, shared per process), so a frozen or unreachable master
costs one ``instance_timeout`` per round, never a stalled acquire.

The decisions (rounds, renewals, releases, tidy-ups) are in
:mod:`cacheguard.locks.redlock.quorum`, shared with the asyncio lock; this module sends
the calls to the masters (from a thread pool) and waits for wake-ups.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Final, TypeVar

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheguard._identity import on_fork_in_child, thread_owner
from cacheguard.backoff import Backoff
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, LockUpgradeError
from cacheguard.locks.protocol import Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.lease import LeaseEntry
from cacheguard.locks.redlock import quorum
from cacheguard.locks.redlock.holdings import process_holdings, reset_holdings_after_fork
from cacheguard.locks.redlock.lua import RAISE_FENCE
from cacheguard.locks.redlock.quorum import (
    RETRY,
    FanOut,
    Grant,
    RedlockBook,
    RedlockCommon,
    RedlockHandleState,
    Round,
    RoundResult,
    RoundVerdict,
    Tidy,
    no_majority_message,
    release_error,
    renewal_verdict,
    settle_round,
    tally_round,
)
from cacheguard.locks.shape import RWLockShape, ThreadedHandle
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.notifier import Notifier, Subscription, notifier_for
from cacheguard.redis.scripts import LuaScript, ScriptCall, run_pipelined
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "RAISE_FENCE",
    "RETRY",
    "RedlockHandle",
    "RedlockRWLock",
    "RedlockWatchdog",
    "Round",
    "RoundVerdict",
    "default_redlock_watchdog",
    "no_majority_message",
    "release_error",
    "renewal_verdict",
    "settle_round",
    "tally_round",
]

log = logging.getLogger("cacheguard.redlock")

T = TypeVar("T")
RedlockLostCallback = Callable[["RedlockHandle"], None]

_CONFIRM_SLICE: Final = 0.01  # s spent on one master's subscription confirmation at a time


# -- the masters -----------------------------------------------------------------------------------

_derived: weakref.WeakKeyDictionary[Any, dict[float, redis.Redis]] = weakref.WeakKeyDictionary()
_derived_mutex = threading.Lock()


def _master_client(client: object, instance_timeout: float) -> tuple[redis.Redis, str]:
    """The client Redlock uses for ``client``'s master: the same connection settings,
    socket timeouts capped at ``instance_timeout``, no retries (one per pool and
    timeout, per process); and the master's address."""
    if not isinstance(client, redis.Redis):
        raise TypeError(
            "RedlockRWLock takes redis.Redis clients of independent masters, not "
            f"{type(client).__module__}.{type(client).__name__}"
        )
    pool = client.connection_pool
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        raise TypeError("RedlockRWLock takes clients of plain masters, not Sentinel-managed ones")
    settings = dict(pool.connection_kwargs)
    with _derived_mutex:
        per_timeout = _derived.setdefault(pool, {})
        derived = per_timeout.get(instance_timeout)
        if derived is None:
            kwargs = quorum.master_connection_kwargs(
                settings, instance_timeout, Retry(NoBackoff(), 0)
            )
            derived_pool = redis.ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **kwargs,
            )
            derived = per_timeout[instance_timeout] = redis.Redis(connection_pool=derived_pool)
    return derived, quorum.master_address(settings)


class _Master:
    """One master of a Redlock set."""

    __slots__ = ("address", "client", "index")

    def __init__(self, index: int, client: redis.Redis, address: str) -> None:
        self.index = index
        self.client = client
        self.address = address

    def call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        return script(self.client, keys, args)

    def pipelined(self, calls: list[ScriptCall]) -> list[Any]:
        return run_pipelined(self.client, calls)

    def notifier(self) -> Notifier:
        notifier = notifier_for(self.client)
        assert isinstance(notifier, Notifier)  # a plain master: never a cluster's
        return notifier

    def __repr__(self) -> str:
        return f"master {self.index} ({self.address})"


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_mutex = threading.Lock()
_POOL_THREADS: Final = 32


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_mutex:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=_POOL_THREADS, thread_name_prefix="cacheguard-redlock"
            )
        return _pool


def _caught(work: Callable[[], T]) -> T | BaseException:
    try:
        return work()
    except (redis.RedisError, OSError) as exc:  # one master's trouble, not the caller's
        return exc


def _at_once(works: Sequence[Callable[[], T]]) -> list[T | BaseException]:
    """Run ``works`` at once (the calling thread takes the first itself: one thread
    hand-off fewer); each result, or the Redis error it raised. Bounded by the
    masters' socket timeouts. Never called from a pool thread (no nesting)."""
    if not works:
        return []
    pool = _executor()
    futures = [pool.submit(_caught, work) for work in works[1:]]
    return [_caught(works[0]), *(future.result() for future in futures)]


class _Masters:
    """The masters of a Redlock set, and calls on several of them at once."""

    def __init__(self, masters: tuple[_Master, ...]) -> None:
        self.masters = masters
        self.quorum = quorum.majority(len(masters))

    def __len__(self) -> int:
        return len(self.masters)

    def fan_out(
        self, work: Callable[[_Master], T], indexes: Iterable[int] | None = None
    ) -> dict[int, T | BaseException]:
        """``work(master)`` on the chosen masters (all by default) at once; each
        master's result, or the Redis error it raised."""
        chosen = list(self.masters) if indexes is None else [self.masters[i] for i in indexes]
        results = _at_once([functools.partial(work, m) for m in chosen])
        return {m.index: result for m, result in zip(chosen, results, strict=True)}

    def run(self, step: FanOut) -> dict[int, Any]:
        """One script call per master, as ``step`` names them."""
        return self.fan_out(lambda m: m.call(*step.calls[m.index]), step.calls)

    def drive(self, flow: Generator[FanOut, dict[int, Any], T]) -> T:
        """Answer ``flow``'s fan-outs until it returns."""
        try:
            step = next(flow)
            while True:
                step = flow.send(self.run(step))
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            flow.close()


_master_sets: weakref.WeakValueDictionary[tuple[int, ...], _Masters] = weakref.WeakValueDictionary()


def _masters_for(clients: Sequence[object], instance_timeout: float) -> _Masters:
    """The shared master set of these clients (one per process), so the watchdog
    renews the handles of every lock on them together."""
    quorum.check_master_list(clients, "RedlockRWLock", "redis.Redis")
    made = [_master_client(client, instance_timeout) for client in clients]
    quorum.check_independent([address for _, address in made])
    key = tuple(id(client) for client, _ in made)
    with _derived_mutex:
        masters = _master_sets.get(key)
        if masters is None:
            masters = _Masters(
                tuple(_Master(i, client, address) for i, (client, address) in enumerate(made))
            )
            _master_sets[key] = masters
        return masters


# -- handles ---------------------------------------------------------------------------------------


class RedlockHandle(ThreadedHandle, RedlockHandleState):
    """One acquisition of a :class:`RedlockRWLock` (the fields of ``LockHandle``).

    ``token``: for write holds, the fencing token (see the module docstring for when
    it increases). ``epochs``: per master, the epoch of the holding there, or
    ``None`` where it is not held. ``valid_until``: the moment (on the lock's
    timer) until which a majority is known to hold it; renewals move it on.
    """

    __slots__ = ()

    lock: RedlockRWLock

    def renew(self) -> bool:
        """Renew on every master now; ``False`` (and marked lost) if the majority is gone."""
        return self.lock.renew(self)


# -- waking up: any master's announcement ---------------------------------------------------------


class _FanIn(Subscription):
    """One master's subscription of a waiter that listens on every master."""

    __slots__ = ("_index", "_waiter")

    def __init__(self, notifier: Notifier, channel: str, index: int, waiter: _Waiter) -> None:
        super().__init__(notifier, channel)
        self._index = index
        self._waiter = waiter

    def _deliver(self, payload: bytes | None) -> None:
        super()._deliver(payload)
        self._waiter.note(self._index)


class _Waiter:
    """A blocked acquisition's wake-ups: the lock's release channel on every master
    (each master's notifier, shared by the process); any master's announcement (or
    a dropped subscriber connection) wakes it."""

    def __init__(self, masters: _Masters, channel: str) -> None:
        self._masters = masters
        self._channel = channel
        self._cond = threading.Condition(threading.Lock())
        self._woken_by: set[int] = set()
        self._subscriptions: list[_FanIn] = []
        self.deaf_once = False  # the next wait ignores wake-ups (after a split vote)

    def note(self, index: int) -> None:
        with self._cond:
            self._woken_by.add(index)
            self._cond.notify_all()

    def open(self, timeout: float) -> bool:
        """Subscribe on every master; wait up to ``timeout`` until a majority confirmed.
        A release changes a majority of masters, and two majorities share one: a
        release after this point wakes us."""
        self._subscriptions = [
            _FanIn(m.notifier(), self._channel, m.index, self) for m in self._masters.masters
        ]
        deadline = time.monotonic() + timeout
        pending = list(self._subscriptions)
        confirmed = 0
        while True:
            waiting = []
            for subscription in pending:
                if subscription.open(0.0):
                    confirmed += 1
                else:
                    waiting.append(subscription)
            pending = waiting
            remaining = deadline - time.monotonic()
            if confirmed >= self._masters.quorum or not pending or remaining <= 0:
                return confirmed >= self._masters.quorum
            # Wait on one master at a time, briefly: a frozen one must not hold us.
            pending.append(pending.pop(0))
            pending[-1].open(min(_CONFIRM_SLICE, remaining))

    def after_round(self, result: RoundResult) -> None:
        """Drop wake-ups from masters that announced our own undoing; after a split
        vote, the next wait ignores wake-ups."""
        with self._cond:
            self._woken_by.difference_update(result.undone)
        self.deaf_once = result.split

    def clear(self) -> None:
        with self._cond:
            self._woken_by.clear()

    def wait(self, seconds: float) -> list[bytes]:
        if self.deaf_once:
            self.deaf_once = False
            time.sleep(seconds)  # Redlock's random pause after a split vote
            return []
        with self._cond:
            self._cond.wait_for(lambda: bool(self._woken_by), seconds)
        return []

    def close(self) -> None:
        for subscription in self._subscriptions:
            subscription.close()


# -- the lock --------------------------------------------------------------------------------------


class RedlockRWLock(RedlockCommon, RWLockShape[RedlockHandle]):
    """A read-write lock held on a majority of N independent Redis masters.

    ``clients``: one ``redis.Redis`` per master (independent servers, no replication
    between them; an odd number, 3 or 5, is usual). ``instance_timeout`` (s): the
    cap on every master's socket and connect timeouts (default ``min(0.1, lease /
    10)``, at most ``lease / 10``). ``clock_drift``: the share of the lease set aside
    for clocks running at different rates (plus 2 ms). ``watchdog``: ``True`` for
    the process's Redlock watchdog, ``False`` to renew by hand, or a
    :class:`RedlockWatchdog`. The other arguments are ``RedisRWLock``'s.
    """

    _masters: _Masters

    def __init__(
        self,
        clients: Sequence[redis.Redis],
        name: str,
        *,
        lease: Seconds = 30.0,
        timeout: Seconds = 30.0,
        namespace: str = "cg",
        instance_timeout: Seconds | None = None,
        clock_drift: float = 0.01,
        watchdog: RedlockWatchdog | bool = True,
        on_lost: RedlockLostCallback | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = quorum.redlock_settings(
            name, lease, timeout, namespace, instance_timeout, clock_drift, backoff
        )
        masters = _masters_for(clients, settings.instance_timeout)
        self._configure(settings, masters, on_lost=on_lost, backoff=backoff, timer=timer)
        self._watchdog: RedlockWatchdog | None
        if watchdog is True:
            self._watchdog = default_redlock_watchdog()
        elif watchdog is False:
            self._watchdog = None
        else:
            self._watchdog = watchdog

    # -- acquiring ---------------------------------------------------------------------

    def _acquire(self, mode: Mode, timeout: Seconds | None, owner: str | None) -> RedlockHandle:
        owner = owner or thread_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        first = self._round(mode, owner, queued=True)
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
        return self._granted(mode, owner, self._drive(flow, mode, owner))

    def _drive(self, flow: Generator[Step, Any, int], mode: Mode, owner: str) -> Grant:
        """Answer the acquire flow's steps: a try is one round on every master, the
        wake-ups come from any master."""
        waiter = _Waiter(self._masters, self.keys.released_channel)
        grant: Grant | None = None
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        waiter.clear()  # this round reads the state those wake-ups announced
                        result = self._round(mode, owner, queued=True)
                        grant, reply = result.grant, result.attempt
                        waiter.after_round(result)
                    elif isinstance(step, Subscribe):
                        reply = waiter.open(step.timeout)
                    elif isinstance(step, Wait):
                        reply = waiter.wait(step.seconds)
                    else:
                        self._masters.run(self._withdraw_step(owner))
                except BackendUnavailable as exc:
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration:
            assert grant is not None
            return grant
        finally:
            flow.close()
            waiter.close()

    def _try_once(self, mode: Mode, owner: str | None) -> RedlockHandle | None:
        owner = owner or thread_owner()
        result = self._round(mode, owner, queued=False)
        if result.attempt.upgrade:
            raise LockUpgradeError(name=self.name, owner=owner)
        return self._granted(mode, owner, result.grant) if result.grant is not None else None

    def _round(self, mode: Mode, owner: str, *, queued: bool) -> RoundResult:
        """One attempt on every master (:func:`~cacheguard.locks.redlock.quorum.round_flow`)."""
        unanswered: list[int] = []
        try:
            with process_holdings().round(self.keys.lock, owner):
                flow = self._round_flow(mode, owner, queued=queued, unanswered=unanswered)
                result = self._masters.drive(flow)
        finally:
            self._tidy_later(unanswered, owner, mode)
        if result.error is not None:
            raise result.error
        return result

    def _tidier(self) -> RedlockWatchdog:
        """Who finishes releases and tidies masters: the lock's watchdog, else the process's."""
        return self._watchdog if self._watchdog is not None else default_redlock_watchdog()

    def _granted(self, mode: Mode, owner: str, grant: Grant) -> RedlockHandle:
        handle = RedlockHandle(self, mode, owner, grant, self._on_lost, self.masters)
        process_holdings().add(handle)
        if self._watchdog is not None:
            # Weakly: a handle dropped unreleased (its thread ended holding it) is
            # given back at its next renewal, not renewed for the life of the process.
            self._watchdog.watch(handle, weak=True)
        return handle

    # -- releasing and renewing --------------------------------------------------------

    def release(self, handle: RedlockHandle) -> None:
        """Release one hold on every master that holds it.

        :class:`LockLostError` if fewer than a majority still held it (someone else
        may have entered); :class:`BackendUnavailable` if too few masters answered to
        tell (the others are retried in the background, as are unreached masters
        after a successful release).
        """
        if handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        if handle.released:
            return
        # Stop renewing first, so no renewal can land after the release.
        last_renewed = self._watchdog.unwatch(handle) if self._watchdog is not None else None
        handle.released = True
        process_holdings().remove(handle)
        released, pending = _release_on(self._masters, handle)
        if pending:
            self._tidier().retry_release(handle, last_renewed)
        failure = quorum.release_failure(handle, released, pending)
        if failure is not None:
            raise failure

    def renew(self, handle: RedlockHandle) -> bool:
        """Extend the lease on every master holding ``handle`` now (useful with
        ``watchdog=False``). ``False`` (and ``handle.lost``) when it no longer holds a
        majority; :class:`BackendUnavailable` when too few masters answered to tell."""
        if handle.released or handle.lost:
            return False
        lost = quorum.renewal_outcome(handle, _renew_on(self._masters, [handle])[0])
        if lost is None:
            return True
        if self._watchdog is not None:
            self._watchdog.unwatch(handle)
        handle._mark_lost(lost)
        return False


# -- renewal and release on the masters (shared by the lock and the watchdog) ---------------------


def _renew_on(masters: _Masters, handles: Sequence[RedlockHandle]) -> list[wire.Renewal | str]:
    """Renew ``handles`` on every master holding them, one pipelined round trip per
    master, all masters at once (verdicts:
    :func:`~cacheguard.locks.redlock.quorum.settle_renewals`)."""
    starts, calls = quorum.renewal_calls(handles)
    replies = masters.fan_out(lambda m: m.pipelined([c for _, c in calls[m.index]]), calls)
    return quorum.settle_renewals(handles, starts, calls, replies)


def _release_on(masters: _Masters, handle: RedlockHandle) -> tuple[int, list[int]]:
    """Release ``handle`` on every master still holding it (see ``settle_release``)."""
    return quorum.settle_release(handle, masters.run(FanOut(quorum.release_calls(handle))))


# -- the watchdog ----------------------------------------------------------------------------------

_all_watchdogs: weakref.WeakSet[RedlockWatchdog] = weakref.WeakSet()


class RedlockWatchdog(RedlockBook[RedlockHandle]):
    """Renews Redlock handles on their masters from one daemon thread (every
    ``lease / 3``; a majority must renew within the validity), finishes releases
    that failed on some masters, and tidies masters that did not answer an acquire
    call: if the owner's holding appeared there and no live handle of this process
    counts on it, it is released. Retries every 0.5 s, for at most one lease."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._reset()
        _all_watchdogs.add(self)

    def _reset(self) -> None:
        self._cond = self._guard = threading.Condition(threading.Lock())
        self._entries = {}
        self._tidies = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def tidy(
        self, master: _Master, keys: ResourceKeys, owner: str, mode: Mode, lease: float
    ) -> None:
        """Tidy ``master`` after an acquire call of ``owner`` went unanswered."""
        with self._cond:
            self._add_tidy(master, keys, owner, mode, lease)
            self._start_locked()
            self._cond.notify()

    def _add(self, entry: LeaseEntry[RedlockHandle]) -> None:
        with self._cond:
            self._entries[entry.key] = entry
            self._start_locked()
            if entry.due < self._wake_at:
                self._cond.notify()

    def _start_locked(self) -> None:
        if self._thread is None:  # the loop never exits; a fork resets this object
            self._thread = threading.Thread(
                target=self._run, name="cacheguard-redlock-watchdog", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = self._timer()
                    due, soonest = self._due(now)
                    tidies = self._due_tidies(now)
                    if due or tidies:
                        self._wake_at = now
                        break
                    self._wake_at = soonest = min(soonest, self._next_tidy())
                    self._cond.wait(None if soonest == float("inf") else soonest - now)
            try:
                if tidies:
                    self._tidy_now(tidies)
                if due:
                    self._work(due)
            except Exception:  # keep renewing the others whatever one batch did
                log.exception("unexpected error while renewing Redlock leases")
                self._after_error(due)

    def _work(self, due: list[LeaseEntry[RedlockHandle]]) -> None:
        now = self._timer()
        for entries in self._batches(due):
            masters = entries[0].handle.client
            renewing = [e for e in entries if not e.releasing]
            if renewing:
                self._settle_renewals(
                    renewing, _renew_on(masters, [e.handle for e in renewing]), now
                )
            for entry in (e for e in entries if e.releasing):
                self._settle_release(entry, _release_on(masters, entry.handle)[1])

    def _tidy_now(self, tidies: list[Tidy]) -> None:
        groups = quorum.group_by_master(tidies)
        results = _at_once([functools.partial(_tidy_on, g[0].master, g) for g in groups])
        self._tidies_done(tidies, [t for r in results if isinstance(r, list) for t in r])


def _tidy_on(master: _Master, tidies: list[Tidy]) -> list[Tidy]:
    """Look up the owners' epochs on ``master`` and release each holding that no live
    handle of this process counts on (:func:`~cacheguard.locks.redlock.quorum.tidy_plan`).
    Returns the tidy-ups that are done."""
    pipe = master.client.pipeline(transaction=False)
    for t in tidies:
        pipe.hget(t.keys.lock, f"g:{t.owner}")
    done, releases = quorum.tidy_plan(
        tidies, pipe.execute(raise_on_error=False), master.address, process_holdings()
    )
    if releases:
        answers = master.pipelined([call for _, call in releases])
        done += quorum.tidies_released(releases, answers)
    return done


_default: RedlockWatchdog | None = None
_default_mutex = threading.Lock()


def default_redlock_watchdog() -> RedlockWatchdog:
    """The process-wide Redlock watchdog, created on first use."""
    global _default
    with _default_mutex:
        if _default is None:
            _default = RedlockWatchdog()
        return _default


def _reset_after_fork() -> None:
    global _default_mutex, _pool, _pool_mutex, _derived_mutex
    # Parent threads do not exist in the child; their locks may be held for ever.
    _default_mutex = threading.Lock()
    _pool_mutex = threading.Lock()
    _derived_mutex = threading.Lock()
    _pool = None
    reset_holdings_after_fork()
    for dog in list(_all_watchdogs):
        dog._reset()


on_fork_in_child(_reset_after_fork)
