"""The one state the flows run over: a guard's parts and the small decisions on them.

:class:`~cacheguard.CacheGuard` (sync) and :class:`~cacheguard.aio.AsyncCacheGuard`
each hold a :class:`GuardState` and add only the I/O: they run the flows
(:mod:`cacheguard.cache.flows`) over it, read, call scripts and wait, so a decision
is written once for both.
"""

from __future__ import annotations

import functools
import logging
import random
import sys
import time
import weakref
from collections.abc import Callable, Generator, Iterable
from typing import Any, Final, Protocol

from cacheguard.backoff import Backoff
from cacheguard.cache.entry import Entry, unpack_entry
from cacheguard.cache.flows.fill import (
    WAIT_BACKOFF,
)
from cacheguard.cache.invalidation import Invalidation
from cacheguard.cache.l1 import L1Feed
from cacheguard.cache.loading import Loads
from cacheguard.cache.outage.breaker import Breakers, CircuitBreaker
from cacheguard.cache.outage.fallback import LastSeen
from cacheguard.cache.outage.recovery import Recovery
from cacheguard.cache.outage.shared_loads import SharedLoads
from cacheguard.cache.server_clock import ServerClock
from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.singleflight import SingleFlight
from cacheguard.cache.stats import EventHook, Stats, StatsRecorder
from cacheguard.cache.tracing import CallTracer
from cacheguard.checks import MAX_SECONDS, Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, GuardClosed
from cacheguard.redis.keys import ResourceKeys, check_name
from cacheguard.redis.scripts import Confirm

__all__ = ["GuardState", "Lock", "add_note", "value_key", "weakly"]

log = logging.getLogger("cacheguard")

_NUMBERS: Final = (int, float)  # exact classes: bool is refused by check_positive


class Lock(Protocol):
    """What a fill needs of a two-tier lock, sync or asyncio."""

    @property
    def owner(self) -> str: ...

    @property
    def remote(self) -> Any: ...

    @property
    def local(self) -> Any: ...


class GuardState:
    """The state the flows run over, one per guard: its settings and every part a
    decision reads or updates (counters, breakers, single flights, loader
    bookkeeping, the invalidation layout, L1, the fallback memory, the outbox
    recovery), the lock factory and the driver's ``run_in_background``. Its
    methods are the small decisions every flow shares; none does I/O."""

    def __init__(
        self,
        settings: GuardSettings,
        *,
        on_event: Callable[[Any], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        flight_event: Callable[[], Any],
        front: str = "guard",
        run_in_background: Callable[[Generator[Any, Any, None], str], bool],
        locks: Any,
        store_write_lock: Callable[[str], Any] | None = None,
        node_of: Callable[[str], str] | None = None,
        replicas: Callable[[], int] = lambda: 0,
    ) -> None:
        self.settings = settings
        self.front = front  # the guard's class name, for its errors
        # The two-tier locks (a LockFactory, or its asyncio twin) and, with
        # write_locks=, the store's write lock of a name (cache/write_locks.py).
        self.locks = locks
        self.store_write_lock = store_write_lock
        # Runs a background refresh apart from the caller (a thread, a task): the
        # driver's; False when it cannot (the guard closing).
        self.run_in_background = run_in_background
        self.namespace = settings.namespace
        self.timer = timer
        self.clock = clock
        self.server_clock = ServerClock(timer, clock)  # entries' ages are judged by it
        self.rng = rng
        self.flights = SingleFlight(flight_event)
        self.refreshes = SingleFlight(flight_event)
        # The unlocked loads of callers whose waits timed out, shared per key.
        self.shared_loads = SharedLoads(flight_event, timer, settings.max_load_time)
        self.recorder = StatsRecorder(on_event)
        # Outbox replays before serving after an outage: pending again whenever a
        # circuit closes (its node is back: rows for it may wait in the outbox).
        self.recovery = Recovery(timer=timer)
        self.breakers = Breakers(
            failures=settings.breaker_failures,
            cooldown=settings.breaker_cooldown,
            timer=timer,
            node_of=node_of,
            on_close=self.recovery.mark,
        )
        self.replicas = replicas  # how many the deployment has, for confirm_replicas=None
        self.loads = Loads(self.recorder, timer)
        # Told when calls begin and end (cache/tracing.py); None: not traced, and
        # each call pays one attribute check for it.
        self.tracer: CallTracer | None = None
        self.invalidation = Invalidation(settings.namespace, settings.version_ttl_ms, timer=timer)
        self.l1: L1Feed | None = None
        # What this process saw last, for outage_ttl and stale_if_error (docs/outage.md)
        self.last_seen: LastSeen | None = None
        if settings.outage_ttl or settings.stale_if_error:
            self.last_seen = LastSeen(maxsize=settings.fallback_maxsize, timer=timer)
        self.gutter: Any = None  # the guard on the gutter Redis, if one is given
        self.checks_snapshots = True  # False in a gutter's guard (cache/outage/gutter.py)
        self.closed = False
        self.owns_client = False  # from_url made the client: close() closes it
        # from_url's client and a GET on its connections for the hit path (see
        # clients.direct_get); used while that client is the guard's client.
        self.direct_get: tuple[object, Callable[[str], Any]] | None = None
        self.max_key_length = settings.max_key_length
        self.wait_backoff: Callable[[], Backoff] = WAIT_BACKOFF  # tests lengthen it

    # -- public, no I/O ---------------------------------------------------------------

    def stats(self) -> Stats:
        return self.recorder.snapshot()

    def add_event_hook(self, hook: EventHook) -> None:
        """Call ``hook(event)`` with every :class:`~cacheguard.CacheEvent` from now on,
        besides ``on_event`` (thread-safe; adding a hook twice adds it once). Hooks
        run in the calling thread (or on the loop) and must be quick; one that raises
        is logged and never fails the cache call."""
        self.recorder.add_hook(hook)

    def remove_event_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; :class:`ValueError` if it is not a hook of this guard."""
        self.recorder.remove_hook(hook)

    def set_tracer(self, tracer: CallTracer | None) -> None:
        """Trace this guard's calls and loads with ``tracer`` from now on (None: stop);
        see :mod:`cacheguard.cache.tracing`."""
        self.tracer = tracer
        self.loads.tracer = tracer

    def waited_for_leader(self, name: str, since: float) -> None:
        """A follower's wait for the leader of ``name`` (begun at ``since``, by
        :attr:`timer`) ended: the tracer's to know; no counter counts it."""
        if self.tracer is not None:
            self.tracer.waited(name, self.timer() - since)

    def keys(self, name: str) -> ResourceKeys:
        return ResourceKeys(self.namespace, name)

    def rwlock(self, name: str) -> Any:
        """The two-tier read-write lock of resource ``name`` (one per name in this
        process, or in this event loop for the asyncio guard)."""
        return self.locks.rwlock(self.key_name(name))

    def write_lock(self, name: str) -> Any:
        """The lock ``write`` and the SQLAlchemy hooks take for ``name``: the two-tier
        lock, or the ``write_locks`` store's (see :mod:`cacheguard.cache.write_locks`)."""
        name = self.key_name(name)
        if self.store_write_lock is None:
            return self.locks.rwlock(name)
        return self.store_write_lock(name)

    def watch_prefix(self, prefix: str) -> None:
        """Make fills of keys under ``prefix`` honour its prefix invalidations (see
        ``invalidate_prefix``) in this process, for good. The SQLAlchemy hooks watch
        their templates' prefixes; ``invalidate_prefix`` makes its process honour its
        own stamp for as long as the stamp lives (``version_ttl``)."""
        self.invalidation.watch(prefix)

    # -- what every call checks first, before Redis is touched -------------------------------

    def check_open(self) -> None:
        """Refuse a call on a closed guard (:class:`GuardClosed`)."""
        if self.closed:
            raise GuardClosed(
                f"this {self.front} is closed: make a new one "
                "(a client the guard made was closed with it)"
            )

    def checked_name(self, name: object) -> str:
        """A key name as the guard uses it: a non-empty str encodable as UTF-8
        (``TypeError``/``ValueError`` otherwise), shortened past ``max_key_length``
        as a template's names are (see :func:`~cacheguard.redis.keys.check_name`)."""
        if type(name) is str and name and len(name) <= self.max_key_length and name.isascii():
            return name  # the hit path: nothing to check further
        return check_name(name, self.max_key_length)

    def key_name(self, name: object) -> str:
        """The name of a call that talks to Redis: the guard open, the name checked."""
        if self.closed:
            self.check_open()
        return self.checked_name(name)

    def key_names(self, names: Iterable[object]) -> tuple[str, ...]:
        """:meth:`key_name` for every name of a call."""
        self.check_open()
        return tuple(self.checked_name(name) for name in names)

    def key_prefix(self, prefix: object) -> str:
        """An ``invalidate_prefix`` prefix: a str encodable as UTF-8 (empty: every key
        of the namespace), never shortened."""
        self.check_open()
        if prefix == "":
            return ""
        return check_name(prefix, sys.maxsize, "a prefix")

    # -- decisions the drivers ask for --------------------------------------------------------

    @staticmethod
    def checked_ttl(ttl: Seconds) -> float:
        """``ttl`` in seconds: a number as it is, a timedelta converted (checks.py)."""
        if ttl.__class__ in _NUMBERS and 0 < ttl <= MAX_SECONDS:  # the hit path: cheap
            return ttl
        return check_positive("ttl", ttl)

    def l1_seen(self) -> tuple[int, object] | None:
        """Taken before a GET whose value L1 may keep (see :meth:`L1Feed.guard`)."""
        return self.l1.guard() if self.l1 is not None else None

    def decode(
        self,
        name: str,
        raw: Any,
        *,
        count: bool = True,
        template: str | None = None,
        fits: Callable[[Any], bool] | None = None,
    ) -> Entry | None:
        """An entry from what a GET or a script returned; what is not one of ours
        (corrupt bytes, another type of key, a value that does not ``fits`` the type
        a typed read asks for) is a miss, counted unless ``count`` is false (the same
        bytes were counted when first read)."""
        try:
            if raw.__class__ is bytes:
                entry = unpack_entry(self.settings.codec, raw)
                if fits is not None and not fits(entry.value):
                    raise ValueError(
                        "its value does not fit the type read (stored before it changed?)"
                    )
                return entry
            if raw is None:
                return None
            if isinstance(raw, Exception):
                raise ValueError(f"the key is not ours: {raw}")
            raise ValueError(f"expected bytes from Redis, got {type(raw).__name__}")
        except ValueError as exc:
            if count:
                self.recorder.count("corrupt_entries", name, 0.0, exc, template)
                log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
            return None

    def breaker(self, name: str) -> CircuitBreaker:
        """The circuit breaker of the node serving resource ``name`` (see Breakers)."""
        breakers = self.breakers
        return breakers.shared if breakers.single else breakers.of(value_key(self.namespace, name))

    def confirm(self) -> Confirm | None:
        """What a write-path invalidation waits for: (replicas, seconds), or None."""
        wanted = self.settings.confirm_replicas
        if wanted is None:
            wanted = self.replicas()
        return (wanted, self.settings.confirm_timeout) if wanted else None

    def backend_failed(
        self,
        name: str,
        exc: BaseException,
        *,
        key: str | None = None,
        template: str | None = None,
    ) -> None:
        """Redis failed ``name``'s call (or the call on Redis key ``key``)."""
        (self.breakers.of(key) if key is not None else self.breaker(name)).failure()
        self.recovery.mark()  # writes may have gone to an outbox meanwhile
        self.recorder.count("backend_errors", name, 0.0, exc, template)
        log.warning("Redis unavailable for %r (%s: %s)", name, type(exc).__name__, exc)

    def seen_ticket(self, name: str) -> int:
        """Taken before a read of ``name`` whose value the fallback memory may keep: a
        write of ``name`` here meanwhile voids the note (see
        :mod:`cacheguard.cache.outage.fallback`)."""
        return self.last_seen.ticket(name) if self.last_seen is not None else 0

    def replay_pending(self) -> bool:
        return self.recovery.pending

    def forget_here(self, names: Iterable[str]) -> None:
        """Drop what this process keeps of ``names`` (L1, the last values seen): they
        are being written or invalidated."""
        if self.l1 is not None:
            self.l1.drop(names)
        if self.last_seen is not None:
            self.last_seen.drop(names)

    def written(self, names: Iterable[str]) -> None:
        """``names`` were just written without the write path's locks (an invalidation,
        an entry write): a call from now on neither waits for nor shares a load of
        them already under way here, which may have read the data before the write
        (see :meth:`SingleFlight.written`)."""
        for name in names:
            self.flights.written(name)

    def written_under(self, prefix: str) -> None:
        """:meth:`written` for every name that starts with ``prefix``."""
        self.flights.written_under(prefix)

    def note_written(self, names: Iterable[object], prefix: object = None) -> None:
        """The guards' ``note_written``: ``names`` (and every name under ``prefix``)
        were written in Redis by other means than the guard's own calls. Checked as
        the calls check them, but on a closed guard too (nothing of it is open)."""
        checked = [self.checked_name(name) for name in names]
        self.forget_here(checked)
        self.written(checked)
        if prefix is not None:
            under = "" if prefix == "" else check_name(prefix, sys.maxsize, "a prefix")
            if self.last_seen is not None:
                self.last_seen.drop_prefix(under)
            if self.l1 is not None:
                self.l1.tier.clear()  # no prefix index: all of it (a rare call)
            self.written_under(under)

    def refuse_bypass(
        self,
        name: str,
        exc: BaseException | None,
        template: str | None = None,
        *,
        failure_counted: bool = False,
    ) -> None:
        """Redis is down (``exc``) or the circuit is open (None): raise under
        ``on_backend_error="raise"``, else count the bypass and return (the caller
        loads directly). ``failure_counted``: ``exc`` was counted already."""
        if exc is not None and not failure_counted:
            self.backend_failed(name, exc, template=template)
        if self.settings.on_backend_error == "raise":
            raise BackendUnavailable(
                f"Redis unavailable for {name!r}"
                + (f": {exc}" if exc is not None else " (circuit open)")
            ) from exc
        self.recorder.count("bypasses", name, 0.0, None, template)

    def circuit_open(
        self, what: str, names: Iterable[str] = (), key: str | None = None
    ) -> BackendUnavailable | None:
        """The error for ``what`` when the circuit of a node it needs (serving one of
        ``names``, or Redis key ``key``) is open, else None."""
        needed = [self.breaker(name) for name in names]
        if key is not None:
            needed.append(self.breakers.of(key))
        # Each breaker once: keys on one node share it, and in its half-open state a
        # second ask would be refused while the first holds the probe.
        breakers = {id(breaker): breaker for breaker in needed}.values()
        if all(breaker.allow() for breaker in breakers):
            return None
        return BackendUnavailable(f"Redis unavailable {what} (circuit open)")


def weakly(method: Callable[..., bool]) -> Callable[..., bool]:
    """``method`` (a guard's bound method that its state keeps) called through a weak
    reference, so the state does not keep its guard alive: a dropped guard is freed
    at once, not at the next garbage collection. False once the guard is gone."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> bool:
        bound = ref()
        return False if bound is None else bound(*args)

    return call


@functools.lru_cache(maxsize=4096)
def value_key(namespace: str, name: str) -> str:
    """The hit path's only key: built once per name (bounded LRU), not per call."""
    return ResourceKeys(namespace, name).value


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11+); logged on older versions."""
    add = getattr(error, "add_note", None)
    if add is not None:
        add(note)
    else:
        log.error("%s (while handling %r)", note, error)


def closing_failed_note(names: list[str], error: BaseException) -> str:
    return (
        f"cacheguard: the closing invalidation of {names!r} also failed: "
        f"{type(error).__name__}: {error}"
    )
