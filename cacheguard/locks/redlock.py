"""Redlock: the read-write lock on a quorum of N independent Redis masters.

::

    masters = [redis.Redis(host=h) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")]
    lock = RedlockRWLock(masters, "menu:7", lease=30.0)
    with lock.write(timeout=5) as handle:
        write_to_db(fencing_token=handle.token)

The lock state on each master is :class:`~cacheguard.locks.redis_rwlock.RedisRWLock`'s
hash, changed by the same scripts (:mod:`cacheguard.locks.scripts`); this module
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
    the token: tokens strictly increase across write holdings while no master
    loses its ``fence`` key (a restart without persistence, FLUSHALL,
    eviction) and the masters' clocks keep the drift allowance.

Renewal and release
    The Redlock watchdog (:class:`RedlockWatchdog`, one thread per process, the
    decisions of :class:`~cacheguard.locks.watchdog.LeaseBook`) renews every
    ``lease / 3`` on every master that holds the handle; the validity restarts
    only when a majority renewed in time. A handle that keeps fewer than a
    majority, or gets no majority renewal before its validity ends, is marked
    lost. Release goes to every master holding the handle.

Every master's client is the caller's ``redis.Redis`` with its socket and connect
timeouts capped at ``instance_timeout`` and no retries (a client of the same
connection settings, shared per process), so a frozen or unreachable master
costs one ``instance_timeout`` per round, never a stalled acquire.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheguard._identity import on_fork_in_child, thread_owner
from cacheguard.backoff import Backoff
from cacheguard.checks import check_positive, check_ratio
from cacheguard.exceptions import REDIS_UNREACHABLE, BackendUnavailable, LockUpgradeError
from cacheguard.keys import ResourceKeys
from cacheguard.locks import wire
from cacheguard.locks.notifier import Notifier, Subscription, notifier_for
from cacheguard.locks.protocol import Attempt, Mode, Step, TryAcquire, acquire_flow
from cacheguard.locks.redis_rwlock import HandleState, lock_settings, release_on_exit
from cacheguard.locks.scripts import LuaScript, ScriptCall, run_pipelined
from cacheguard.locks.watchdog import LeaseBook, _Entry
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

DEFAULT_INSTANCE_TIMEOUT: Final = 0.1  # s; capped at lease / 10
DRIFT_FLOOR: Final = 0.002  # s added to lease * clock_drift (Redlock's 2 ms)
_CONFIRM_SLICE: Final = 0.01  # s spent on one master's subscription confirmation at a time
_RETRY_AFTER_ERROR: Final = 0.5  # s before a failed renewal, release or tidy-up is retried

RAISE_FENCE_CONTRACT = """\
-- raise_fence: lift a lock's fencing counter to at least a token; never lowers it.
-- (Redlock: a write holding's token is written back to the masters that granted it,
-- so a later writer's INCR on any of them passes it.)
-- KEYS[1]  fencing counter   <ns>:{<name>}:fence (never expires)
-- ARGV[1]  the token (a decimal integer)
-- Returns the counter afterwards.
"""

_RAISE_FENCE_BODY = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return tostring(current)
"""

RAISE_FENCE = LuaScript(RAISE_FENCE_CONTRACT + _RAISE_FENCE_BODY)


# -- one round, sans I/O: what the masters answered and what it means ------------------------------


@dataclass
class Round:
    """What one acquire round came to, from every master's answer (see :func:`tally_round`)."""

    granted: dict[int, int] = field(default_factory=dict)  # master -> epoch
    refused: dict[int, float] = field(default_factory=dict)  # master -> s until it may grant
    marked: list[int] = field(default_factory=list)  # masters where a writer's mark was left
    upgrades: int = 0  # masters refusing because the owner holds the read lock there
    unanswered: list[int] = field(default_factory=list)  # no reply: the call may have run
    failed: int = 0  # masters that did not grant for an error (unanswered ones included)
    errors: list[str] = field(default_factory=list)

    @property
    def token(self) -> int:
        return max(self.granted.values(), default=0)

    def retry_in(self, quorum: int) -> float:
        """Seconds until enough refusing masters may grant (their soonest blocking
        leases end); 0 when unknown."""
        needed = quorum - len(self.granted)
        waits = sorted(self.refused.values())
        if needed <= 0 or needed > len(waits):
            return 0.0
        return waits[needed - 1]

    def has_majority(self, quorum: int) -> bool:
        return len(self.granted) >= quorum


@dataclass(frozen=True)
class RoundVerdict:
    """What a driver does after a round (see :func:`settle_round`)."""

    granted: bool
    split: bool = False  # granted by some masters, not a majority in time
    upgrade: bool = False  # LockUpgradeError
    unreachable: bool = False  # BackendUnavailable: too few masters answered
    withdraw: tuple[int, ...] = ()  # masters where the writer withdraws its mark
    retry_in: float = 0.0


def settle_round(
    outcome: Round, *, masters: int, quorum: int, fenced: bool, now: float, valid_until: float
) -> RoundVerdict:
    """A round is a grant when a majority granted it, a write's token was written
    back (``fenced``) and time is left (``now < valid_until``). Otherwise its grants
    are given back; a writer that was granted anything (a split vote, or a majority
    too late), refused as an upgrade or short of masters also withdraws its marks."""
    if outcome.has_majority(quorum) and fenced and now < valid_until:
        return RoundVerdict(granted=True)
    split = bool(outcome.granted)
    upgrade = outcome.upgrades > masters - quorum
    unreachable = outcome.failed > masters - quorum
    return RoundVerdict(
        granted=False,
        split=split,
        upgrade=upgrade,
        unreachable=unreachable,
        withdraw=tuple(outcome.marked) if (split or upgrade or unreachable) else (),
        retry_in=outcome.retry_in(quorum),
    )


RETRY: Final = "retry"


def renewal_verdict(
    *, renewed: int, held: int, writer_waits: bool, quorum: int, masters: int, in_time: bool
) -> wire.Renewal | str:
    """A renewal round's meaning for one handle: renewed (a majority renewed it in
    time), :data:`RETRY` (too few answered; lost once its validity ends), or why it
    is lost (fewer than a majority still hold it)."""
    if renewed >= quorum and in_time:
        return wire.Renewal.RENEWED_WRITER_WAITS if writer_waits else wire.Renewal.RENEWED
    if held < quorum:
        return f"held on {held} of {masters} masters at renewal, fewer than a majority ({quorum})"
    return RETRY


def release_error(*, released: int, pending: int, quorum: int, lost: bool) -> str | None:
    """After a release on every master: ``"lost"`` (fewer than a majority still
    held it, or it was lost before), ``"unavailable"`` (too few answered to tell),
    or None."""
    if lost or released + pending < quorum:
        return "lost"
    if released < quorum:
        return "unavailable"
    return None


def no_majority_message(name: str, quorum: int, outcome: Round) -> str:
    return (
        f"no majority of the masters of lock {name!r} could be reached ({quorum} needed): "
        f"{'; '.join(outcome.errors)}"
    )


def tally_round(
    replies: Mapping[int, Any], *, mode: Mode, queued: bool, describe: Callable[[int], str]
) -> Round:
    """Sort each master's reply to the acquire script: a granted epoch, a refusal,
    an upgrade refused, an error reply (the script did not run) or no reply (it
    may have run: the master is tidied later)."""
    outcome = Round()
    for index, reply in sorted(replies.items()):
        if isinstance(reply, BaseException):
            outcome.failed += 1
            outcome.errors.append(f"{describe(index)}: {reply}")
            if isinstance(reply, REDIS_UNREACHABLE):
                outcome.unanswered.append(index)
            continue
        attempt = wire.parse_attempt(reply)
        if attempt.granted:
            outcome.granted[index] = attempt.epoch
        elif attempt.upgrade:
            outcome.upgrades += 1
        else:
            outcome.refused[index] = attempt.retry_in
            if mode == "write" and queued:
                outcome.marked.append(index)
    return outcome


# -- the masters -----------------------------------------------------------------------------------

# Connection settings a pool adds by itself (maintenance notifications): not copied.
_POOL_MADE: Final = frozenset(
    {
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    }
)


def _capped(value: Any, cap: float) -> float:
    return cap if value is None else min(float(value), cap)


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
    address = settings.get("path") or f"{settings.get('host')}:{settings.get('port')}"
    with _derived_mutex:
        per_timeout = _derived.setdefault(pool, {})
        derived = per_timeout.get(instance_timeout)
        if derived is None:
            kwargs = {k: v for k, v in settings.items() if k not in _POOL_MADE}
            kwargs["socket_timeout"] = _capped(kwargs.get("socket_timeout"), instance_timeout)
            kwargs["socket_connect_timeout"] = _capped(
                kwargs.get("socket_connect_timeout"), instance_timeout
            )
            # One answer or none within the timeout: Redlock retries whole rounds itself.
            kwargs["retry"] = Retry(NoBackoff(), 0)
            derived_pool = redis.ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **kwargs,
            )
            derived = per_timeout[instance_timeout] = redis.Redis(connection_pool=derived_pool)
    return derived, str(address)


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
    """The masters of a Redlock set, and one call on several of them at once."""

    def __init__(self, masters: tuple[_Master, ...]) -> None:
        self.masters = masters
        self.quorum = len(masters) // 2 + 1

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


_master_sets: weakref.WeakValueDictionary[tuple[int, ...], _Masters] = weakref.WeakValueDictionary()


def _masters_for(clients: Sequence[object], instance_timeout: float) -> _Masters:
    """The shared master set of these clients (one per process), so the watchdog
    renews the handles of every lock on them together."""
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        raise TypeError("RedlockRWLock takes a sequence of redis.Redis clients")
    if not clients:
        raise ValueError("RedlockRWLock needs at least one master")
    made = [_master_client(client, instance_timeout) for client in clients]
    addresses = [address for _, address in made]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(
            f"the masters of a Redlock must be independent servers; given more than once: "
            f"{', '.join(repeated)}"
        )
    key = tuple(id(client) for client, _ in made)
    with _derived_mutex:
        masters = _master_sets.get(key)
        if masters is None:
            masters = _Masters(
                tuple(_Master(i, client, address) for i, (client, address) in enumerate(made))
            )
            _master_sets[key] = masters
        return masters


# -- this process's live holdings, for tidying after lost replies ----------------------------------


class _Holdings:
    """Per (lock key, owner): the rounds in flight and the per-master epochs of live
    handles in this process. A tidy-up must not release a holding that one of them
    counts on (an owner's holds on one master share its epoch)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._rounds: Counter[tuple[str, str]] = Counter()
        self._epochs: Counter[tuple[str, str, str, int]] = Counter()

    @contextmanager
    def round(self, lock_key: str, owner: str) -> Iterator[None]:
        with self._mutex:
            self._rounds[lock_key, owner] += 1
        try:
            yield
        finally:
            with self._mutex:
                self._rounds[lock_key, owner] -= 1
                if not self._rounds[lock_key, owner]:
                    del self._rounds[lock_key, owner]

    def add(self, lock_key: str, owner: str, epochs: Iterable[tuple[str, int]]) -> None:
        with self._mutex:
            for address, epoch in epochs:
                self._epochs[lock_key, owner, address, epoch] += 1

    def remove(self, lock_key: str, owner: str, epochs: Iterable[tuple[str, int]]) -> None:
        with self._mutex:
            for address, epoch in epochs:
                entry = (lock_key, owner, address, epoch)
                self._epochs[entry] -= 1
                if self._epochs[entry] <= 0:
                    del self._epochs[entry]

    def acquiring(self, lock_key: str, owner: str) -> bool:
        """Is an acquisition round of ``owner`` on this lock under way?"""
        with self._mutex:
            return (lock_key, owner) in self._rounds

    def counts_on(self, lock_key: str, owner: str, address: str, epoch: int) -> bool:
        """Does a live handle of ``owner`` hold this lock on that master with ``epoch``?"""
        with self._mutex:
            return (lock_key, owner, address, epoch) in self._epochs


_holdings = _Holdings()


# -- handles ---------------------------------------------------------------------------------------


class RedlockHandle(HandleState):
    """One acquisition of a :class:`RedlockRWLock` (the fields of ``LockHandle``).

    ``token``: for write holds, the fencing token (see the module docstring for when
    it increases). ``epochs``: per master, the epoch of the holding there, or
    ``None`` where it is not held. ``valid_until``: the moment (on the lock's
    timer) until which a majority is known to hold it; renewals move it on.
    """

    __slots__ = ("_granted", "epochs", "lock", "valid_until")

    def __init__(
        self,
        lock: RedlockRWLock,
        mode: Mode,
        owner: str,
        token: int,
        epochs: list[int | None],
        valid_until: float,
        on_lost: RedlockLostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock
        self.epochs = epochs
        self.valid_until = valid_until
        # (master address, epoch) as granted: this process's record of the holding.
        self._granted = [
            (lock._masters.masters[i].address, e) for i, e in enumerate(epochs) if e is not None
        ]

    # Used by the watchdog.
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
        """Seconds left until ``valid_until`` (0 once it passed)."""
        return max(0.0, self.valid_until - self.lock._timer())

    @property
    def masters_held(self) -> int:
        return sum(e is not None for e in self.epochs)

    def release(self) -> None:
        self.lock.release(self)

    def renew(self) -> bool:
        """Renew on every master now; ``False`` (and marked lost) if the majority is gone."""
        return self.lock.renew(self)

    def _start_on_lost(self) -> None:
        # On a thread of its own: a slow callback must not stall lease renewals.
        threading.Thread(target=self._run_on_lost, name="cacheguard-on-lost", daemon=True).start()

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            self._on_lost(self)
        except Exception:
            log.exception("on_lost callback of lock %r failed", self.lock.name)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<RedlockHandle {self.mode} {self.lock.name!r} token={self.token} "
            f"owner={self.owner} on {self.masters_held}/{len(self.epochs)} masters {state}>"
        )


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

    def clear(self) -> None:
        with self._cond:
            self._woken_by.clear()

    def forget(self, indexes: Iterable[int]) -> None:
        """Drop wake-ups from these masters (announcements of our own undoing)."""
        with self._cond:
            self._woken_by.difference_update(indexes)

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


@dataclass
class _Grant:
    epochs: list[int | None]
    token: int
    valid_until: float


class RedlockRWLock:
    """A read-write lock held on a majority of N independent Redis masters.

    ``clients``: one ``redis.Redis`` per master (independent servers, no replication
    between them; an odd number, 3 or 5, is usual). ``instance_timeout`` (s): the
    cap on every master's socket and connect timeouts (default ``min(0.1, lease /
    10)``, at most ``lease / 10``). ``clock_drift``: the share of the lease set aside
    for clocks running at different rates (plus 2 ms). ``watchdog``: ``True`` for
    the process's Redlock watchdog, ``False`` to renew by hand, or a
    :class:`RedlockWatchdog`. The other arguments are ``RedisRWLock``'s.
    """

    def __init__(
        self,
        clients: Sequence[redis.Redis],
        name: str,
        *,
        lease: float = 30.0,
        timeout: float = 30.0,
        namespace: str = "cg",
        instance_timeout: float | None = None,
        clock_drift: float = 0.01,
        watchdog: RedlockWatchdog | bool = True,
        on_lost: RedlockLostCallback | None = None,
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
        self._watchdog: RedlockWatchdog | None
        if watchdog is True:
            self._watchdog = default_redlock_watchdog()
        elif watchdog is False:
            self._watchdog = None
        else:
            self._watchdog = watchdog
        self._on_lost = on_lost
        self._backoff = backoff
        self._timer = timer

    @property
    def masters(self) -> list[str]:
        """The masters' addresses, in the order given."""
        return [m.address for m in self._masters.masters]

    # -- acquiring ---------------------------------------------------------------------

    def acquire_read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> RedlockHandle:
        """Block until a majority granted the read lock (or :class:`LockTimeout`)."""
        return self._acquire("read", timeout, owner)

    def acquire_write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> RedlockHandle:
        """Block until a majority granted the write lock; a read holder gets
        :class:`LockUpgradeError`."""
        return self._acquire("write", timeout, owner)

    def try_acquire_read(self, *, owner: str | None = None) -> RedlockHandle | None:
        """One round, no waiting: the handle, or ``None`` if no majority granted it."""
        return self._try_once("read", owner)

    def try_acquire_write(self, *, owner: str | None = None) -> RedlockHandle | None:
        return self._try_once("write", owner)

    @contextmanager
    def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Iterator[RedlockHandle]:
        handle = self.acquire_read(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    @contextmanager
    def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Iterator[RedlockHandle]:
        handle = self.acquire_write(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    def _acquire(self, mode: Mode, timeout: float | None, owner: str | None) -> RedlockHandle:
        owner = owner or thread_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        first, grant, _, _ = self._round(mode, owner, queued=True)
        if grant is not None:
            return self._granted(mode, owner, grant)
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
        return self._granted(mode, owner, self._drive(flow, mode, owner))

    def _drive(self, flow: Generator[Step, Any, int], mode: Mode, owner: str) -> _Grant:
        """Answer the acquire flow's steps: a try is one round on every master, the
        wake-ups come from any master."""
        waiter = _Waiter(self._masters, self.keys.released_channel)
        grant: _Grant | None = None
        try:
            step = next(flow)
            while True:
                try:
                    reply: Any = None
                    if isinstance(step, TryAcquire):
                        waiter.clear()  # this round reads the state those wake-ups announced
                        reply, grant, undone, split = self._round(mode, owner, queued=True)
                        waiter.forget(undone)
                        waiter.deaf_once = split
                    elif isinstance(step, Subscribe):
                        reply = waiter.open(step.timeout)
                    elif isinstance(step, Wait):
                        reply = waiter.wait(step.seconds)
                    else:
                        self._withdraw(owner)
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
        attempt, grant, _, _ = self._round(mode, owner, queued=False)
        if attempt.upgrade:
            raise LockUpgradeError(name=self.name, owner=owner)
        return self._granted(mode, owner, grant) if grant is not None else None

    def _round(
        self, mode: Mode, owner: str, *, queued: bool
    ) -> tuple[Attempt, _Grant | None, set[int], bool]:
        """One attempt on every master: (the attempt for the flow, the grant if a
        majority granted in time, the masters whose state this round changed back,
        whether it was a split vote)."""
        unanswered: list[int] = []
        try:
            with _holdings.round(self.keys.lock, owner):
                return self._round_in_flight(mode, owner, queued=queued, unanswered=unanswered)
        finally:
            # Masters that may have run a call whose reply we never got: tidied
            # once this round no longer counts on them.
            if unanswered:
                tidier = self._watchdog or default_redlock_watchdog()
                for i in sorted(set(unanswered)):
                    tidier.tidy(self._masters.masters[i], self.keys, owner, mode, self.lease)

    def _round_in_flight(
        self, mode: Mode, owner: str, *, queued: bool, unanswered: list[int]
    ) -> tuple[Attempt, _Grant | None, set[int], bool]:
        masters = self._masters
        mark_ms = self._mark_ms if queued else 0
        call = wire.acquire_call(self.keys, owner, mode, lease_ms=self.lease_ms, mark_ms=mark_ms)
        start = self._timer()
        replies = masters.fan_out(lambda m: m.call(*call))
        outcome = tally_round(replies, mode=mode, queued=queued, describe=self._describe)
        unanswered += outcome.unanswered
        fenced = True
        if outcome.has_majority(masters.quorum) and mode == "write":
            fenced = self._fence(outcome, owner)
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
            attempt = Attempt(granted=True, epoch=outcome.token)
            return attempt, _Grant(epochs, outcome.token, valid_until), set(), False
        undone = self._undo(outcome.granted, verdict.withdraw, owner, mode, unanswered)
        if verdict.upgrade:
            return Attempt(granted=False, upgrade=True), None, undone, verdict.split
        if verdict.unreachable:
            raise BackendUnavailable(no_majority_message(self.name, masters.quorum, outcome))
        return Attempt(granted=False, retry_in=verdict.retry_in), None, undone, verdict.split

    def _fence(self, outcome: Round, owner: str) -> bool:
        """A writer granted by a majority: write its token back to every granting
        master's counter (a majority must confirm); withdraw its marks elsewhere."""
        raise_call: ScriptCall = (RAISE_FENCE, [self.keys.fence], [outcome.token])
        calls = {i: raise_call for i in outcome.granted}
        calls.update({i: wire.withdraw_call(self.keys, owner) for i in outcome.marked})
        replies = self._masters.fan_out(lambda m: m.call(*calls[m.index]), calls)
        raised = sum(not isinstance(replies[i], BaseException) for i in outcome.granted)
        return raised >= self._masters.quorum

    def _undo(
        self,
        granted: Mapping[int, int],
        marked: Sequence[int],
        owner: str,
        mode: Mode,
        unanswered: list[int],
    ) -> set[int]:
        """Release the grants and withdraw the marks of a round that failed; the
        masters changed. A master that cannot be reached is tidied later."""
        calls: dict[int, ScriptCall] = {
            i: wire.release_call(self.keys, owner, mode, epoch) for i, epoch in granted.items()
        }
        for i in marked:
            calls[i] = wire.withdraw_call(self.keys, owner)
        replies = self._masters.fan_out(lambda m: m.call(*calls[m.index]), calls)
        unanswered += [i for i in granted if isinstance(replies[i], REDIS_UNREACHABLE)]
        return set(calls)

    def _withdraw(self, owner: str) -> None:
        """A writer gives up: remove its mark on every master (best effort: marks expire)."""
        call = wire.withdraw_call(self.keys, owner)
        self._masters.fan_out(lambda m: m.call(*call))

    def _granted(self, mode: Mode, owner: str, grant: _Grant) -> RedlockHandle:
        handle = RedlockHandle(
            self, mode, owner, grant.token, grant.epochs, grant.valid_until, self._on_lost
        )
        _holdings.add(self.keys.lock, owner, handle._granted)
        if self._watchdog is not None:
            self._watchdog.watch(handle)
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
        _holdings.remove(self.keys.lock, handle.owner, handle._granted)
        released, pending = _release_on(self._masters, handle)
        if pending:
            (self._watchdog or default_redlock_watchdog()).retry_release(handle, last_renewed)
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

    def renew(self, handle: RedlockHandle) -> bool:
        """Extend the lease on every master holding ``handle`` now (useful with
        ``watchdog=False``). ``False`` (and ``handle.lost``) when it no longer holds a
        majority; :class:`BackendUnavailable` when too few masters answered to tell."""
        if handle.released or handle.lost:
            return False
        verdict = _renew_on(self._masters, [handle])[0]
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

    def _describe(self, index: int) -> str:
        return repr(self._masters.masters[index])

    def __repr__(self) -> str:
        return (
            f"<RedlockRWLock {self.name!r} key={self.keys.lock!r} lease={self.lease}s "
            f"on {len(self._masters)} masters, quorum {self.quorum}>"
        )


# -- renewal and release on the masters (shared by the lock and the watchdog) ---------------------


def _renew_on(masters: _Masters, handles: Sequence[RedlockHandle]) -> list[wire.Renewal | str]:
    """Renew ``handles`` on every master holding them, one pipelined round trip per
    master, all masters at once. Per handle: the renewal (a majority renewed within
    its validity; ``valid_until`` moved on), :data:`RETRY` (too few answered), or
    why the handle is lost (too few masters still hold it). Masters answering that
    the holding is gone are dropped from the handle."""
    starts = [h.lock._timer() for h in handles]
    calls: dict[int, list[tuple[int, ScriptCall]]] = {}
    for n, h in enumerate(handles):
        for i, epoch in enumerate(h.epochs):
            if epoch is not None:
                calls.setdefault(i, []).append(
                    (n, wire.renew_call(h.keys, h.owner, epoch, h.lease_ms))
                )
    replies = masters.fan_out(lambda m: m.pipelined([c for _, c in calls[m.index]]), calls)
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


def _release_on(masters: _Masters, handle: RedlockHandle) -> tuple[int, list[int]]:
    """Release ``handle`` on every master still holding it: (how many released it,
    the masters that did not answer: they keep their epoch in ``handle.epochs``).
    A master answering that the holding was gone counts for neither."""
    held = {i: e for i, e in enumerate(handle.epochs) if e is not None}
    replies = masters.fan_out(
        lambda m: m.call(*wire.release_call(handle.keys, handle.owner, handle.mode, held[m.index])),
        held,
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
    """A master that did not answer an acquire call, which may have run there."""

    master: _Master
    keys: ResourceKeys
    owner: str
    mode: Mode
    due: float
    give_up_at: float


_all_watchdogs: weakref.WeakSet[RedlockWatchdog] = weakref.WeakSet()


class RedlockWatchdog(LeaseBook[RedlockHandle]):
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
        self._tidies: dict[tuple[str, str, str, str], _Tidy] = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def tidy(
        self, master: _Master, keys: ResourceKeys, owner: str, mode: Mode, lease: float
    ) -> None:
        """Tidy ``master`` after an acquire call of ``owner`` went unanswered."""
        now = self._timer()
        key = (master.address, keys.lock, owner, mode)
        with self._cond:
            if key not in self._tidies:
                self._tidies[key] = _Tidy(master, keys, owner, mode, now, now + lease)
            self._start_locked()
            self._cond.notify()

    def pending_tidies(self) -> int:
        with self._cond:
            return len(self._tidies)

    def _add(self, entry: _Entry[RedlockHandle]) -> None:
        with self._cond:
            self._entries[id(entry.handle)] = entry
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
                    tidies = [t for t in self._tidies.values() if t.due <= now]
                    if due or tidies:
                        self._wake_at = now
                        break
                    soonest = min([soonest, *(t.due for t in self._tidies.values())])
                    self._wake_at = soonest
                    self._cond.wait(None if soonest == float("inf") else soonest - now)
            try:
                if tidies:
                    self._tidy_now(tidies)
                if due:
                    self._work(due)
            except Exception:  # keep renewing the others whatever one batch did
                log.exception("unexpected error while renewing Redlock leases")
                self._after_error(due)

    def _work(self, due: list[_Entry[RedlockHandle]]) -> None:
        now = self._timer()
        for entries in self._batches(due):
            masters = entries[0].handle.client
            renewing = [e for e in entries if not e.releasing]
            releasing = [e for e in entries if e.releasing]
            if renewing:
                verdicts = _renew_on(masters, [e.handle for e in renewing])
                for entry, verdict in zip(renewing, verdicts, strict=True):
                    if isinstance(verdict, wire.Renewal):
                        self._settle(entry, int(verdict), now)
                    elif verdict == RETRY:
                        self._after_error([entry])
                    else:
                        self._lose(entry, verdict)
            for entry in releasing:
                _, pending = _release_on(masters, entry.handle)
                if pending:
                    self._after_error([entry])
                else:
                    self._forget(entry)

    def _after_error(self, entries: list[_Entry[RedlockHandle]]) -> None:
        now = self._timer()
        for entry in entries:
            handle = entry.handle
            if entry.releasing:
                if now - entry.last_renewed >= handle.lease:
                    self._forget(entry)  # expired by now anyway: nothing left to release
                    continue
            elif handle.validity <= 0:
                self._lose(entry, "no majority renewed it within its validity")
                continue
            entry.due = now + min(_RETRY_AFTER_ERROR, handle.lease / 3)

    def _tidy_now(self, tidies: list[_Tidy]) -> None:
        by_master: dict[str, list[_Tidy]] = {}
        for t in tidies:
            by_master.setdefault(t.master.address, []).append(t)
        groups = list(by_master.values())
        results = _at_once([functools.partial(_tidy_on, g[0].master, g) for g in groups])
        done = {id(t) for result in results if isinstance(result, list) for t in result}
        now = self._timer()
        with self._cond:
            for t in tidies:
                if id(t) in done or now >= t.give_up_at:
                    self._tidies.pop((t.master.address, t.keys.lock, t.owner, t.mode), None)
                else:
                    t.due = now + _RETRY_AFTER_ERROR


def _tidy_on(master: _Master, tidies: list[_Tidy]) -> list[_Tidy]:
    """Look up the owners' epochs on ``master`` and release each holding that no live
    handle of this process counts on. Returns the tidy-ups that are done."""
    pipe = master.client.pipeline(transaction=False)
    for t in tidies:
        pipe.hget(t.keys.lock, f"g:{t.owner}")
    epochs = pipe.execute(raise_on_error=False)
    done: list[_Tidy] = []
    releases: list[tuple[_Tidy, ScriptCall]] = []
    for t, raw in zip(tidies, epochs, strict=True):
        if isinstance(raw, BaseException):
            continue
        if raw is None:
            done.append(t)  # nothing of this owner's there
        elif _holdings.acquiring(t.keys.lock, t.owner):
            continue  # its round may be counting on that holding: look again later
        elif _holdings.counts_on(t.keys.lock, t.owner, master.address, int(raw)):
            # A live handle holds that epoch there: an extra hold, if one landed,
            # cannot be told apart; it ends with the owner's lease on that master.
            done.append(t)
        else:
            releases.append((t, wire.release_call(t.keys, t.owner, t.mode, int(raw))))
    if releases:
        answers = master.pipelined([call for _, call in releases])
        done += [
            t
            for (t, _), a in zip(releases, answers, strict=True)
            if not isinstance(a, BaseException)
        ]
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
    global _default_mutex, _pool, _pool_mutex, _derived_mutex, _holdings
    # Parent threads do not exist in the child; their locks may be held for ever.
    _default_mutex = threading.Lock()
    _pool_mutex = threading.Lock()
    _derived_mutex = threading.Lock()
    _pool = None
    _holdings = _Holdings()  # the child holds nothing
    for dog in list(_all_watchdogs):
        dog._reset()


on_fork_in_child(_reset_after_fork)
