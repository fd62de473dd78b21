"""The ``cacheguard`` backend for dogpile.cache (extra ``dogpile``).

The package registers it under dogpile.cache's entry point, so a region finds
it by name, without importing cacheguard::

    from dogpile.cache import make_region

    region = make_region().configure(
        "cacheguard",  # was "dogpile.cache.redis"
        expiration_time=300,
        arguments={"url": "redis://127.0.0.1:6379/0", "namespace": "menu"},
    )

What it brings over ``dogpile.cache.redis``: the dogpile lock of a key is the
write side of cacheguard's two-tier read-write lock on that key
(:class:`~cacheguard.locks.TwoTierRWLock`). Threads of one process meet at a local
gate first, so one thread per process talks to Redis; waiters in other processes
are woken by the release message on the key's pub/sub channel instead of
polling; the lease is renewed by the watchdog while the holder lives and ends by
itself when it dies.

A process that holds a key's lock while some of its own threads wait for it
passes the distributed hold from one to the next without a Redis round trip,
at most as many times as threads were waiting when it first passed it on (and
only while the hold is sure to last); the threads that come later queue in Redis
behind the other processes. So a stampede costs a round trip per process rather
than per thread, and no process keeps a key from the others for longer than one
round of its waiting threads.

dogpile makes every waiter take the mutex in turn and read the value under it,
to see whether another thread created it while it waited. That read, the first
call on the key a thread makes after a blocking ``acquire()``, is answered from
what this process last read or wrote there, without a round trip, when it did so
after the thread began to wait and while holding the key's lock in Redis ever
since: the value as it was at a moment within the caller's wait, which no other
creator can have changed since. So the waiters of a process pass the lock on at
the pace of thread switches, not of round trips. Any other read goes to Redis.

Serialization is dogpile's: this is a :class:`~dogpile.cache.api.BytesBackend`,
so the region's serializer (pickle unless the region names another) writes
dogpile's own ``metadata|payload`` bytes, which dogpile needs for its expiration
decisions, and the backend stores them as they are under the guard's key layout
(``<namespace>:{<key>}:v``, the lock in ``<namespace>:{<key>}:rw``: one hash slot
per key on a cluster). A guard's codec and entry envelope would only wrap bytes
that are already encoded, and would limit values to what the codec carries.

Every write hold draws a fencing token from the key's counter
(``<namespace>:{<key>}:fence``), which the lock layer keeps for a day after its
last token (and starts again from the server clock, so a lock's tokens still only
grow). The dogpile mutex shows no token, so the backend lets the counters of its
keys go sooner: each release of a key's hold in Redis gives the counter
``max(lease, redis_expiration_time)`` seconds more, in the release's own round
trip, and ``delete`` / ``delete_multi`` do the same (for a counter a holder
that died left behind). So keys that are no longer used leave nothing in Redis,
as with dogpile.cache.redis. At least a lease: a release the watchdog still
retries in the background (up to a lease after the hold's last renewal) never
meets a counter that started over. ``guard.write`` on a key shows no token
either; only a handle of ``guard.rwlock(key)`` does, and its tokens may start
over once the counter of a key also cached through this backend expired.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Final, NamedTuple

import redis
from dogpile.cache.api import (
    NO_VALUE,
    BytesBackend,
    CacheMutex,
    KeyType,
    SerializedReturnType,
)
from dogpile.cache.exception import ValidationError

from cacheguard._identity import Holder, on_fork_in_child
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.settings import client_options
from cacheguard.checks import MAX_SECONDS, check_positive
from cacheguard.exceptions import (
    BackendUnavailable,
    CacheGuardError,
    LockNotHeldError,
    LockTimeout,
)
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.lua import RELEASE
from cacheguard.locks.redis.rwlock import LockHandle
from cacheguard.locks.registry import WeakRegistry
from cacheguard.locks.two_tier import TwoTierRWLock, may_hand_over
from cacheguard.redis.clients import SyncClient, is_cluster, sync_client_from_url
from cacheguard.redis.errors import REDIS_DOWN, classify
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import LuaScript

__all__ = ["BackendArgumentError", "CacheGuardBackend", "CacheGuardMutex"]

log = logging.getLogger("cacheguard.dogpile")

# dogpile.cache.redis's connection arguments, understood the same way here.
_CONNECTION: Final = frozenset(
    {
        "url",
        "host",
        "port",
        "db",
        "username",
        "password",
        "ssl",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "connection_kwargs",
        "connection_pool",
    }
)
_OWN: Final = frozenset(
    {
        "guard",
        "client",
        "namespace",
        "lease",
        "lock_timeout",
        "redis_expiration_time",
        "wait_timeout",
        "lock_blocking_timeout",
        "distributed_lock",
    }
)
# dogpile.cache.redis's lock tuning, which has no meaning here: accepted so that its
# arguments carry over unchanged, and ignored.
_MEANINGLESS: Final = frozenset(
    {
        "thread_local_lock",  # any thread may release this mutex
        "lock_sleep",  # waiters are woken by the release message, not a poll
        "lock_prefix",  # the lock lives in the key's own hash slot
        "lock_blocking",  # dogpile says whether to wait on every acquire
    }
)
# Arguments of dogpile's Sentinel and Cluster backends: say where they went.
_ELSEWHERE: Final = {
    "sentinels": "url='redis+sentinel://host:26379[,host:port...]/service[/db]'",
    "service_name": "url='redis+sentinel://host:26379[,host:port...]/service[/db]'",
    "sentinel_kwargs": "url='redis+sentinel://...', or a client= of your own",
    "startup_nodes": "url='redis+cluster://host:port[,host:port...]'",
}


# The lock's own release script, then a lifetime for the key's fencing counter, in
# one round trip. The release script's source runs unchanged as the body of a Lua
# function: what it reads of KEYS and ARGV stays where it was.
_RELEASE_EXPIRING_FENCE: Final = LuaScript(
    "-- dogpile release: the lock's release (contract below), then PEXPIRE of the\n"
    "-- key's fencing counter. KEYS: the release's, then the counter\n"
    "-- <ns>:{<name>}:fence (same slot); ARGV: the release's, then its lifetime in ms.\n"
    "-- Returns the release's reply.\n"
    "local function release()\n"
    f"{RELEASE.source}\n"
    "end\n"
    "local released = release()\n"
    "redis.call('PEXPIRE', KEYS[#KEYS], ARGV[#ARGV])\n"
    "return released\n"
)


class BackendArgumentError(CacheGuardError, ValidationError, ValueError):
    """An argument of the ``cacheguard`` dogpile backend (in ``configure``'s
    ``arguments``, or a key given to it) cannot be used. Also a dogpile.cache
    ``ValidationError`` and a ``ValueError``."""


class CacheGuardBackend(BytesBackend):
    """A dogpile.cache backend on cacheguard: values under a guard's key layout, and
    :meth:`get_mutex` on the key's two-tier lock.

    ``arguments`` (all optional; ``docs/guide.md`` lists them with their defaults):

    - where: ``url`` (every form of :meth:`CacheGuard.from_url <cacheguard.CacheGuard.from_url>`:
      one server, ``redis+cluster://``, ``redis+sentinel://``), or
      dogpile.cache.redis's ``host``/``port``/``db``/``username``/``password``/``ssl``,
      ``socket_timeout``, ``socket_connect_timeout``, ``socket_keepalive``,
      ``socket_keepalive_options``, ``connection_kwargs``, ``connection_pool``; or a
      ready ``client`` (``redis.Redis``/``RedisCluster``, bytes replies); or a ready
      ``guard`` (a :class:`~cacheguard.CacheGuard`: its client, namespace and lease);
    - ``namespace`` (default ``"cg"``), ``lease`` (alias ``lock_timeout``, default
      30 s): the lock's lease, renewed while its holder lives;
    - ``redis_expiration_time``: how long Redis keeps a value (default, or 0: no expiry);
    - ``wait_timeout`` (alias ``lock_blocking_timeout``): the longest a blocking
      ``acquire`` waits before :class:`~cacheguard.LockTimeout` (default: no limit);
    - ``distributed_lock`` (default True): False leaves locking to dogpile's
      in-process ``threading.Lock``.

    Each duration (these and the socket timeouts) is seconds or a ``timedelta``.

    dogpile.cache.redis's ``thread_local_lock``, ``lock_sleep``, ``lock_prefix`` and
    ``lock_blocking`` are accepted and ignored; other unknown names are ignored with
    a warning (dogpile's contract: a backend takes any arguments dict).
    """

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        given = dict(arguments)  # dogpile's contract: the caller's dict stays untouched
        _refuse_other_backends(given)
        unknown = set(given) - _CONNECTION - _OWN - _MEANINGLESS
        if unknown:
            warnings.warn(
                f"the cacheguard dogpile backend ignores unknown arguments {sorted(unknown)}",
                stacklevel=3,
            )
        # An expiration of 0 is dogpile.cache.redis's default for "none"; a wait_timeout
        # of 0 is refused (the caller means acquire(False)).
        self.redis_expiration_time = _optional_seconds(given, "redis_expiration_time", zero=True)
        self.wait_timeout = _optional_seconds(given, "wait_timeout", "lock_blocking_timeout")
        self.distributed_lock = _flag(given, "distributed_lock", default=True)
        self.guard, self._owned = _guard_from(given)
        self.namespace = self.guard.namespace
        self._client: SyncClient = self.guard.client
        self._px = (
            None
            if self.redis_expiration_time is None
            else max(1, round(self.redis_expiration_time * 1000))
        )
        # How long a key's fencing counter outlives its last release (module docstring).
        fence_seconds = max(self.guard.settings.lease, self.redis_expiration_time or 0.0)
        self._fence_ms = max(1, round(fence_seconds * 1000))
        self._gates: WeakRegistry[_KeyGate] = WeakRegistry(self._new_gate)

    # -- values ----------------------------------------------------------------------------

    def get_serialized(self, key: KeyType) -> SerializedReturnType:
        name = _key_name(key)
        gate = self._gates.peek(name)
        if gate is not None:
            known = gate.first_read()  # takes this thread's ticket, if any
            if known is not None:  # a waiter's read, answered from its wait
                return NO_VALUE if known.value is None else known.value
        seen = self._seeing([name], [gate])
        try:
            with _unavailable(f"reading {key!r}"):
                value: Any = self._client.get(self.guard.keys(name).value)  # bytes
        except redis.ResponseError as exc:
            if str(exc).startswith("WRONGTYPE"):  # another type of key at our name: a miss
                return NO_VALUE
            raise
        seen.done([value])
        return NO_VALUE if value is None else value

    def get_serialized_multi(self, keys: Iterable[KeyType]) -> Sequence[SerializedReturnType]:
        seen = self._seeing([_key_name(key) for key in keys])
        if not seen.names:
            return []
        names = [self.guard.keys(name).value for name in seen.names]
        with _unavailable(f"reading {len(names)} keys"):
            if is_cluster(self._client):  # the keys live on several nodes
                values = self._client.mget_nonatomic(names)  # type: ignore[union-attr]
            else:
                values = self._client.mget(names)
        seen.done(values)
        return [NO_VALUE if value is None else value for value in values]

    def set_serialized(self, key: KeyType, value: bytes) -> None:
        name = _key_name(key)
        seen = self._seeing([name])
        with _unavailable(f"writing {key!r}"):
            self._client.set(self.guard.keys(name).value, _bytes(key, value), px=self._px)
        seen.done([value])

    def set_serialized_multi(self, mapping: Mapping[KeyType, bytes]) -> None:
        if not mapping:
            return
        items = [(_key_name(key), _bytes(key, value)) for key, value in mapping.items()]
        seen = self._seeing([name for name, _ in items])
        with _unavailable(f"writing {len(items)} keys"):
            # One round trip on a server; on a cluster one per node.
            pipe = self._client.pipeline(transaction=False)
            for name, value in items:
                pipe.set(self.guard.keys(name).value, value, px=self._px)
            pipe.execute()
        seen.done([value for _, value in items])

    def delete(self, key: KeyType) -> None:
        self._delete_names([_key_name(key)], f"deleting {key!r}")

    def delete_multi(self, keys: Iterable[KeyType]) -> None:
        names = [_key_name(key) for key in keys]
        if names:
            self._delete_names(names, f"deleting {len(names)} keys")

    def _delete_names(self, names: list[str], what: str) -> None:
        seen = self._seeing(names)
        with _unavailable(what):
            self._delete([self.guard.keys(name) for name in names])
        seen.done([None] * len(names))

    def _seeing(self, names: list[str], gates: list[_KeyGate | None] | None = None) -> _Seeing:
        """About to read or write ``names``: what that call will have seen, for the
        keys whose mutex is in use here (see :meth:`_KeyGate.first_read`). This is
        the calling thread's call on each of them, so no later read of theirs is
        its first (``gates``: looked up already, and so told)."""
        if gates is None:
            gates = [self._gates.peek(name) for name in names]
            for gate in gates:
                if gate is not None:
                    gate.no_first_read()
        holds = [None if gate is None else gate.hold for gate in gates]
        return _Seeing(names, gates, time.monotonic(), holds)

    def _delete(self, resources: Sequence[ResourceKeys]) -> None:
        """Delete the values, and give the keys' fencing counters their lifetime: a
        holder that died before its release left its counter without one. The lock
        hash needs nothing: it always expires with its last lease. One round trip
        (on a cluster, one per node)."""
        pipe = self._client.pipeline(transaction=False)
        for resource in resources:
            pipe.delete(resource.value)
            pipe.pexpire(resource.fence, self._fence_ms)
        pipe.execute()

    # -- the dogpile lock ------------------------------------------------------------------

    def get_mutex(self, key: KeyType) -> CacheGuardMutex | None:
        """The dogpile lock of ``key``: the write side of the key's two-tier lock
        (None with ``distributed_lock=False``: dogpile then uses a threading lock)."""
        if not self.distributed_lock:
            return None
        return CacheGuardMutex(self._gates.get(_key_name(key)), self.wait_timeout)

    def has_lock_timeout(self) -> bool:
        # A live holder's lease is renewed, so its lock never times out under it.
        return False

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the guard and client this backend made (a ``guard`` or ``client``
        passed in is left to its owner)."""
        if self._owned:
            self.guard.close()
            self._client.close()

    def _value_key(self, key: object) -> str:
        return self.guard.keys(_key_name(key)).value

    def _new_gate(self, name: str) -> _KeyGate:
        return _KeyGate(self.guard.rwlock(name), self._client, self._fence_ms)


class CacheGuardMutex(CacheMutex):
    """dogpile's lock for one key: a mutex on the write side of its two-tier lock.

    Not reentrant, as dogpile expects: while the key is held in this process, an
    ``acquire(False)`` through any mutex of that key returns False, from the holding
    thread too, and ``acquire()`` waits. The holder may release from another
    thread (dogpile's ``async_creation_runner`` does). Every mutex of a key in one
    process shares that key's gate; processes exclude each other in Redis.
    """

    __slots__ = ("_gate", "_wait_timeout")

    def __init__(self, gate: _KeyGate, wait_timeout: float | None) -> None:
        self._gate = gate
        self._wait_timeout = wait_timeout

    def acquire(self, wait: bool = True) -> bool:
        """Take the lock: ``wait=False`` answers at once; ``wait=True`` waits (for
        ever, or ``wait_timeout`` s and then raises :class:`~cacheguard.LockTimeout`)."""
        return self._gate.acquire(self, wait, self._wait_timeout if wait else None)

    def release(self) -> None:
        """Release the lock this mutex holds, from any thread
        (:class:`~cacheguard.LockNotHeldError` if it holds none)."""
        self._gate.release(self)

    def locked(self) -> bool:
        """Whether the key's lock is held now: in this process, or (asking Redis) by
        any process."""
        return self._gate.locked()

    def __repr__(self) -> str:
        return f"<CacheGuardMutex {self._gate.lock.name!r}>"


class _Seen(NamedTuple):
    """What this process last saw of a key's value in Redis (``None``: none there):
    read or written by a call sent at ``sent`` (``time.monotonic()``), under the
    distributed hold ``hold``. So the value was this at some moment after ``sent``."""

    value: bytes | None
    sent: float
    hold: LockHandle


class _Seeing:
    """A read or write of some keys under way: told to their gates once it is done."""

    __slots__ = ("gates", "holds", "names", "sent")

    def __init__(
        self,
        names: list[str],
        gates: list[_KeyGate | None],
        sent: float,
        holds: list[LockHandle | None],
    ) -> None:
        self.names, self.gates, self.sent, self.holds = names, gates, sent, holds

    def done(self, values: Sequence[bytes | None]) -> None:
        for gate, hold, value in zip(self.gates, self.holds, values, strict=True):
            if gate is not None and hold is not None:
                gate.saw(value, self.sent, hold)


_gates: weakref.WeakSet[_KeyGate] = weakref.WeakSet()


class _KeyGate:
    """One key's dogpile lock in this process, shared by every mutex of the key.

    ``holder`` is the mutex holding it (None: free here). The distributed hold,
    ``hold``, is the two-tier lock's write side taken for ``holder_id``, a holder
    id of this gate rather than of a thread: whichever thread releases, the hold
    is the same, and no thread re-enters it by accident (through ``guard.write``
    on the same key, say). Between two local holders it may stay taken (see the
    module docstring): ``passes`` counts the hand-overs it has left. Releasing it
    in Redis gives the key's fencing counter ``fence_ms`` more to live.

    ``seen`` is the key's value as this process last read or wrote it under
    ``hold``; ``entries`` counts acquisitions, and a thread that took the mutex
    after waiting keeps a ticket (its entry and when it began to wait) for its
    first call on the key: :meth:`first_read`.
    """

    __slots__ = (
        "__weakref__",
        "_cond",
        "_entries",
        "_passes",
        "_tickets",
        "client",
        "fence_ms",
        "hold",
        "holder",
        "holder_id",
        "lock",
        "seen",
        "waiting",
    )

    def __init__(self, lock: TwoTierRWLock, client: SyncClient, fence_ms: int) -> None:
        self.lock = lock
        self.client = client
        self.fence_ms = fence_ms
        self.holder_id = Holder()  # the gate's, never a thread's or a context's
        self._reset()
        _gates.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.holder: CacheGuardMutex | None = None
        self.waiting = 0
        self.hold: LockHandle | None = None
        self._passes: int | None = None  # set when the hold is first passed on
        self.seen: _Seen | None = None
        self._entries = 0
        self._tickets = threading.local()  # .first_read: (entry, began) or None

    def acquire(self, mutex: CacheGuardMutex, wait: bool, timeout: float | None) -> bool:
        start = time.monotonic()
        with self._cond:
            if self.holder is not None:
                if not wait:
                    self._tickets.first_read = None
                    return False
                self._wait_turn(timeout, start)
            self.holder = mutex
            self._entries += 1
            # Only a caller that waited reads first what it waited for (dogpile's
            # "did someone create it meanwhile?"); acquire(False) makes no ticket.
            self._tickets.first_read = (self._entries, start) if wait else None
            kept = self.hold
        if kept is not None and not kept.lost:
            return True  # passed on by the previous holder here: already ours in Redis
        try:
            if kept is not None:  # lost while passed on: let it go, take a fresh one
                self.hold = None
                self._let_go(kept)
            if wait:
                left = MAX_SECONDS if timeout is None else timeout - (time.monotonic() - start)
                if left <= 0:
                    raise LockTimeout(
                        name=self.lock.name, mode="write", waited=time.monotonic() - start
                    )
                hold: LockHandle | None = self.lock.acquire_write(left, holder=self.holder_id)
            else:
                hold = self.lock.try_acquire_write(holder=self.holder_id)
        except BaseException:
            self._leave()
            raise
        if hold is None:
            self._leave()
            return False
        self.hold, self._passes = hold, None
        return True

    def _wait_turn(self, timeout: float | None, start: float) -> None:
        """Wait until no mutex holds the gate (the caller holds ``_cond``)."""
        self.waiting += 1
        try:
            free = self._cond.wait_for(lambda: self.holder is None, timeout)
        except BaseException:  # interrupted: the wake-up we may have taken goes on
            self.waiting -= 1
            if self.holder is None:
                if self.waiting:
                    self._cond.notify()
                elif self.hold is not None:  # passed on to waiters that are all gone
                    hold, self.hold = self.hold, None
                    self._let_go(hold)
            raise
        self.waiting -= 1
        if not free:
            raise LockTimeout(name=self.lock.name, mode="write", waited=time.monotonic() - start)

    def release(self, mutex: CacheGuardMutex) -> None:
        with self._cond:
            if self.holder is not mutex:
                raise LockNotHeldError(
                    f"this mutex does not hold the dogpile lock {self.lock.name!r}",
                    name=self.lock.name,
                    mode="write",
                )
            hold = self.hold
            if self._passes is None:
                # Only the threads waiting now may share this hold; later ones queue in
                # Redis behind the other processes.
                self._passes = self.waiting
            # Passed on only while sure to last: a holder whose lease may have run out
            # lets go in Redis, which says so (the warning below).
            if hold is not None and may_hand_over(hold) and self.waiting and self._passes > 0:
                self._passes -= 1
                self.holder = None
                self._cond.notify()
                return
            self.hold = None
        try:
            if hold is not None:
                self._let_go(hold)
        finally:
            self._leave()

    # -- what a waiter's first read may be answered with -----------------------------------

    def first_read(self) -> _Seen | None:
        """For the calling thread's first call on the key since it waited for the
        mutex and took it: what this process last saw of the value, if it saw it
        after the thread began to wait and has held the key's lock in Redis ever
        since (so no creator elsewhere changed it meanwhile). None: read Redis. The
        ticket is used up either way."""
        ticket = getattr(self._tickets, "first_read", None)
        if ticket is None:
            return None
        self._tickets.first_read = None
        entry, began = ticket
        with self._cond:
            seen, hold = self.seen, self.hold
            if (
                self.holder is None
                or self._entries != entry  # its hold of the mutex ended meanwhile
                or seen is None
                or hold is None
                or hold.lost
                or seen.hold is not hold  # seen under an earlier hold, since let go
                or seen.sent < began  # seen before it began to wait
            ):
                return None
            return seen

    def no_first_read(self) -> None:
        """The calling thread makes a call on the key: any later read is not its first."""
        self._tickets.first_read = None

    def saw(self, value: bytes | None, sent: float, hold: LockHandle) -> None:
        """A call sent at ``sent``, while ``hold`` was this process's, found or left
        ``value`` in Redis; kept while that hold lasts, the latest sent first."""
        with self._cond:
            if self.hold is not hold:
                return  # let go meanwhile: it says nothing about the hold there is now
            if self.seen is None or self.seen.hold is not hold or self.seen.sent <= sent:
                self.seen = _Seen(value, sent, hold)

    def locked(self) -> bool:
        with self._cond:
            if self.holder is not None:
                return True
        with _unavailable(f"reading the lock of {self.lock.name!r}"):
            mode = self.client.hget(self.lock.remote.keys.lock, "mode")
        return mode == b"write"

    def _let_go(self, hold: LockHandle) -> None:
        """Release the distributed hold and give the key's fencing counter its
        lifetime, in one round trip (the caller holds the gate)."""
        remote = hold.lock
        # The release goes through our own script: stop the renewals first, so none
        # lands after it, as the lock's own release does.
        last_renewed = remote.disown(hold)
        try:
            _, keys, args = wire.release_call(remote.keys, hold.owner, "write", hold.token)
            try:
                reply = _RELEASE_EXPIRING_FENCE(
                    self.client, [*keys, remote.keys.fence], [*args, self.fence_ms]
                )
            finally:
                # This process's side of the lock (the handle counts as released now).
                self.lock.release_write(holder=self.holder_id)
        except REDIS_DOWN as exc:
            # Still held in Redis: the watchdog retries the release in the background
            # until it goes through or the lease ends, so the hold never leaks.
            remote.release_in_background(hold, last_renewed)
            log.warning("releasing the dogpile lock of %r failed: %s", self.lock.name, exc)
            return
        if not wire.parse_release(reply):
            # Its lease ended while held: someone else may have created the value too.
            log.warning("dogpile lock lost before its release: %s", hold._lost_at_release())

    def _leave(self) -> None:
        with self._cond:
            self.holder = None
            self._cond.notify()


def _reset_gates_after_fork() -> None:
    # The parent's threads, and so its holders, do not exist in the child.
    for gate in list(_gates):
        gate._reset()


on_fork_in_child(_reset_gates_after_fork)


# -- arguments ---------------------------------------------------------------------------------


def _key_name(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise BackendArgumentError(
            f"the cacheguard dogpile backend needs non-empty str keys, got {key!r} "
            "(give the region a key_mangler that makes them)"
        )
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError as exc:
            raise BackendArgumentError(
                f"the cacheguard dogpile backend cannot store the key {key!r}: it has no "
                f"UTF-8 form ({exc.reason} at position {exc.start}); give the region a "
                "key_mangler that makes valid text"
            ) from None
    return key


def _bytes(key: object, value: object) -> bytes:
    if not isinstance(value, bytes):
        raise BackendArgumentError(
            f"the cacheguard dogpile backend stores serialized values (bytes), got "
            f"{type(value).__name__} for {key!r}: let the region serialize them"
        )
    return value


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """Redis down (unreachable, or refusing for now) -> :class:`BackendUnavailable`."""
    try:
        yield
    except REDIS_DOWN as exc:
        raise BackendUnavailable(f"Redis unavailable {what}: {exc}") from exc
    except redis.ResponseError as exc:
        refusal = classify(exc)
        if isinstance(refusal, REDIS_DOWN):
            raise BackendUnavailable(f"Redis unavailable {what}: {exc}") from exc
        raise


def _refuse_other_backends(given: Mapping[str, Any]) -> None:
    for name, instead in _ELSEWHERE.items():
        if name in given:
            raise BackendArgumentError(
                f"{name!r} is an argument of dogpile's own Sentinel or Cluster backend; "
                f"the cacheguard backend takes {instead}"
            )


_NO_TIME: Final = timedelta(0)


def _optional_seconds(
    given: Mapping[str, Any], name: str, alias: str | None = None, *, zero: bool = False
) -> float | None:
    """A duration in seconds (given as a number or a timedelta), or None for none
    (also 0 when ``zero``); ``alias`` is dogpile.cache.redis's name for it."""
    if alias is not None and alias in given:
        if name in given and not _agree(name, given[name], given[alias]):
            raise BackendArgumentError(f"{name!r} and its alias {alias!r} disagree")
        value = given[alias]
    else:
        value = given.get(name)
    if value is None or (zero and not isinstance(value, bool) and value in (0, _NO_TIME)):
        return None
    return _seconds(name, value)


def _seconds(name: str, value: object) -> float:
    try:
        return check_positive(name, value)
    except (TypeError, ValueError) as exc:
        raise BackendArgumentError(f"cacheguard dogpile backend: {exc}") from exc


def _agree(name: str, one: object, other: object) -> bool:
    """Two spellings of one duration say the same: both unset, or the same seconds
    (``5`` and ``timedelta(seconds=5)`` agree)."""
    if one is None or other is None:
        return one is other
    return _seconds(name, one) == _seconds(name, other)


def _flag(given: Mapping[str, Any], name: str, *, default: bool) -> bool:
    value = given.get(name, default)
    if not isinstance(value, bool):
        raise BackendArgumentError(f"{name!r} must be True or False, not {value!r}")
    return value


def _guard_from(given: Mapping[str, Any]) -> tuple[CacheGuard, bool]:
    """The guard to work through, and whether the backend made it (and its client)."""
    guard = given.get("guard")
    client = given.get("client")
    connection = sorted(set(given) & _CONNECTION)
    lease: object = given.get("lease")
    if "lock_timeout" in given:
        if lease is not None and not _agree("lease", lease, given["lock_timeout"]):
            raise BackendArgumentError("'lease' and its alias 'lock_timeout' disagree")
        lease = given["lock_timeout"]
    if guard is not None:
        if not isinstance(guard, CacheGuard):
            raise BackendArgumentError(
                f"'guard' must be a cacheguard.CacheGuard, not {type(guard).__name__} "
                "(an AsyncCacheGuard cannot serve dogpile's blocking calls)"
            )
        clashing = [*connection, *(["client"] if client is not None else [])]
        if given.get("namespace", guard.namespace) != guard.namespace:
            clashing.append("namespace")
        if lease is not None and _seconds("lease", lease) != guard.settings.lease:
            clashing.append("lease")
        if clashing:
            raise BackendArgumentError(
                f"with 'guard' given, {clashing} would contradict it: the guard brings "
                "its client, namespace and lease"
            )
        return guard, False
    settings: dict[str, Any] = {"namespace": given.get("namespace", "cg")}
    if lease is not None:
        settings["lease"] = _seconds("lease", lease)
    owned = client is None
    if client is None:
        client = _client_from(given)
    elif connection:
        raise BackendArgumentError(
            f"with 'client' given, {connection} would contradict it: pass one or the other"
        )
    try:
        return CacheGuard(client, **settings), owned
    except (TypeError, ValueError) as exc:
        raise BackendArgumentError(f"cacheguard dogpile backend: {exc}") from exc


def _client_from(given: Mapping[str, Any]) -> SyncClient:
    """A client the way dogpile.cache.redis makes one, failing fast like
    :meth:`CacheGuard.from_url <cacheguard.CacheGuard.from_url>` (connect 1 s,
    socket 2 s, no retries of its own) unless told otherwise. Every argument is
    checked here, so a bad one fails ``configure`` rather than the first call."""
    pool = given.get("connection_pool")
    if pool is not None:  # dogpile's contract: the pool supersedes every other argument
        if not isinstance(pool, redis.ConnectionPool):
            raise BackendArgumentError(
                f"'connection_pool' must be a redis.ConnectionPool, not {type(pool).__name__}"
            )
        return _check_database(_connectable(redis.Redis(connection_pool=pool)))
    options = client_options(
        _seconds("socket_connect_timeout", given.get("socket_connect_timeout", 1.0)),
        _seconds("socket_timeout", given.get("socket_timeout", 2.0)),
    )
    if given.get("socket_keepalive") is not None and _flag(
        given, "socket_keepalive", default=False
    ):
        options["socket_keepalive"] = True
        keepalive_options = given.get("socket_keepalive_options")
        if keepalive_options is not None:
            if not isinstance(keepalive_options, Mapping):
                raise BackendArgumentError(
                    "'socket_keepalive_options' must be a dict of socket options, "
                    f"not {type(keepalive_options).__name__}"
                )
            options["socket_keepalive_options"] = keepalive_options
    options.update(_connection_kwargs(given))
    url = given.get("url")
    if url is not None:  # dogpile's contract: the URL overrides host, port and db
        if not isinstance(url, str):
            raise BackendArgumentError(f"'url' must be a str, not {type(url).__name__}")
        if given.get("ssl"):
            raise BackendArgumentError("with 'url', ask for TLS with a rediss:// URL")
    elif given.get("ssl") is not None:
        options["ssl"] = _flag(given, "ssl", default=False)
    where: dict[str, Any] = {
        "host": _text(given, "host", "localhost", empty=False),
        "port": _whole(given, "port", 6379, low=1, high=65535),
        "db": _whole(given, "db", 0, low=0),
        "username": _text(given, "username"),
        "password": _text(given, "password"),
    }
    try:
        client = (
            redis.Redis(**where, **options) if url is None else sync_client_from_url(url, options)
        )
    except (TypeError, ValueError) as exc:
        raise BackendArgumentError(f"cacheguard dogpile backend: {exc}") from exc
    return _check_database(_connectable(client))


def _text(
    given: Mapping[str, Any], name: str, default: str | None = None, *, empty: bool = True
) -> str | None:
    """A str argument (None: ``default``)."""
    value = given.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or not (value or empty):
        kind = "a str" if empty else "a non-empty str"
        raise BackendArgumentError(f"{name!r} must be {kind}, not {value!r}")
    return value


def _whole(
    given: Mapping[str, Any], name: str, default: int, *, low: int, high: int | None = None
) -> int:
    """A whole-number argument in ``low..high`` (None: ``default``); a str of digits
    is read as redis-py would read it."""
    value = given.get(name)
    if value is None:
        return default
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BackendArgumentError(f"{name!r} must be a whole number, not {value!r}")
    if number < low or (high is not None and number > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise BackendArgumentError(f"{name!r} must be {bounds}, not {number}")
    return number


def _connection_kwargs(given: Mapping[str, Any]) -> Mapping[str, Any]:
    """``connection_kwargs``, its names checked against what redis-py's clients and
    connections take."""
    extra = given.get("connection_kwargs")
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise BackendArgumentError(
            f"'connection_kwargs' must be a dict, not {type(extra).__name__}"
        )
    known = _redis_connection_names()
    unknown = sorted(repr(name) for name in extra if name not in known)
    if unknown:
        raise BackendArgumentError(
            f"'connection_kwargs' has names redis-py does not take: {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(known))}"
        )
    return extra


@functools.cache
def _redis_connection_names() -> frozenset[str]:
    """The keyword arguments of ``redis.Redis`` and of its connection classes."""
    names: set[str] = set()
    for made in (
        redis.Redis,
        redis.Connection,
        redis.SSLConnection,
        redis.UnixDomainSocketConnection,
    ):
        for cls in made.__mro__:
            init = cls.__dict__.get("__init__")
            if init is None or cls is object:
                continue
            names.update(
                parameter.name
                for parameter in inspect.signature(init).parameters.values()
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                and parameter.name != "self"
            )
    return frozenset(names)


def _check_database(client: SyncClient) -> SyncClient:
    """``client``, once the server was seen to have the database it selects: redis-py
    sends SELECT only when it first connects, so ``db=99`` on a server with 16
    databases would pass ``configure`` and fail every call. Database 0 always
    exists; another is checked by connecting now. Redis down: left to the calls,
    which report it (the circuit breaker's business, not an argument's)."""
    pool = getattr(client, "connection_pool", None)
    db = pool.connection_kwargs.get("db", 0) if pool is not None else 0
    if not db:
        return client
    try:
        client.ping()
    except redis.ResponseError as exc:  # ERR DB index is out of range
        client.close()
        raise BackendArgumentError(
            f"cacheguard dogpile backend: the Redis server refuses database {db}: {exc}"
        ) from exc
    except redis.RedisError as exc:
        log.info("dogpile backend: database %s not checked (Redis unavailable: %s)", db, exc)
    return client


def _connectable(client: SyncClient) -> SyncClient:
    """``client``, once one connection was made the way its pool will make them (not
    connected): redis-py checks a connection's arguments only then, at the first call
    otherwise. A cluster client made its nodes' clients already."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        try:
            pool.connection_class(**pool.connection_kwargs)
        except (TypeError, ValueError, redis.RedisError) as exc:
            raise BackendArgumentError(
                f"cacheguard dogpile backend: redis-py refuses the connection arguments: {exc}"
            ) from exc
    return client
