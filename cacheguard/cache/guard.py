"""CacheGuard: the read-through cache, its write path, and the sync driver of the fill flow.

Read path (``get_or_load``): L1 (optional, in process) -> L2 (Redis: a hit is one
GET and takes no lock) -> on a miss, one thread per process per key goes on
(single flight) and runs :func:`cacheguard.cache.flow.fill_flow` under the key's
local read lock; the others wait for its result.

Write path (``write``): the keys' write locks in one global order, then bump
their versions and delete them, run the body, delete again, release.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Final, Literal, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from cacheguard._identity import on_fork_in_child
from cacheguard.backoff import Backoff
from cacheguard.cache.breaker import CircuitBreaker
from cacheguard.cache.codec import Codec, MsgpackCodec, check_codec
from cacheguard.cache.entry import Entry, pack_entry, unpack_entry
from cacheguard.cache.flow import (
    Begin,
    BeginFill,
    EndFill,
    Load,
    LoadUnlocked,
    Lookup,
    Message,
    Outcome,
    Subscribe,
    TimeoutPolicy,
    Wait,
    fill_flow,
)
from cacheguard.cache.l1 import ABSENT, LocalTier
from cacheguard.cache.scripts import FILL_BEGIN, FILL_END, INVALIDATE, RAISE_WATERMARK
from cacheguard.cache.singleflight import VALID_FOR_ALL, Flight, SingleFlight
from cacheguard.cache.stats import Stats, StatsRecorder
from cacheguard.cache.watermark import collecting
from cacheguard.exceptions import (
    REDIS_DOWN,
    BackendUnavailable,
    LockTimeout,
    RecursiveLoadError,
    SerializationError,
)
from cacheguard.keys import (
    ResourceKeys,
    check_namespace,
    hash_tag,
    invalidation_channel,
    name_from_tag,
    prefix_stamp_key,
    watermark_key,
)
from cacheguard.locks.notifier import Subscription, notifier_for
from cacheguard.locks.redis_rwlock import MAX_SECONDS, LockHandle, check_positive
from cacheguard.locks.scripts import ScriptCall, run_pipelined
from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock

__all__ = ["MISSING", "BackendPolicy", "CacheGuard"]

log = logging.getLogger("cacheguard")

T = TypeVar("T")
BackendPolicy = Literal["bypass", "raise"]

_NUMBERS = (int, float)  # exact classes: bool is refused by check_positive
# XFetch refreshes with probability exp(-time_left / (beta * load_duration)).
_XFETCH_HORIZON = 40.0

# The safety-net timer of a waiting fill. The filler's announcement wakes waiters;
# a dead filler is retried when its lease ends (the begin script says when). The
# timer only covers a lost announcement, so it need not fire during a normal load.
_WAIT_BACKOFF = functools.partial(Backoff, initial=0.5, cap=1.0)


class _Missing:
    """The sentinel ``peek`` returns when nothing is cached."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()


def _check_ratio(what: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{what} must be a number in [0, 1), got {value!r}")
    return float(value)


def _check_non_negative(what: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    if math.isinf(value) or value > MAX_SECONDS:
        raise ValueError(f"{what} must be at most {MAX_SECONDS:.0f} (ten years), got {value!r}")
    return float(value)


class CacheGuard:
    """A read-through cache on Redis that loads each missing key once, everywhere.

    See ``docs/guide.md`` for every setting; the defaults suit most services.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str = "cg",
        lease: float = 30.0,
        wait_timeout: float = 10.0,
        on_timeout: TimeoutPolicy = "load",
        on_backend_error: BackendPolicy = "bypass",
        codec: Codec | None = None,
        ttl_jitter: float = 0.1,
        none_ttl: float | None = 30.0,
        stale_ttl: float = 0.0,
        early_refresh_beta: float = 1.0,
        l1_maxsize: int = 0,
        l1_ttl: float = 5.0,
        max_value_bytes: int = 8 * 1024 * 1024,
        announce_value_bytes: int = 64 * 1024,
        version_ttl: float = 7 * 24 * 3600.0,
        max_key_length: int = 200,
        max_fill_retries: int = 3,
        max_load_time: float = 60.0,
        breaker_failures: int = 3,
        breaker_cooldown: float = 2.0,
        on_event: Callable[[Any], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError(
                "CacheGuard needs a client with decode_responses=False (it stores bytes)"
            )
        self.client = client
        self.namespace = check_namespace(namespace)
        self.lease = check_positive("lease", lease)
        self.wait_timeout = check_positive("wait_timeout", wait_timeout)
        if on_timeout not in ("load", "raise", "stale"):
            raise ValueError(f"on_timeout must be 'load', 'raise' or 'stale', not {on_timeout!r}")
        if on_backend_error not in ("bypass", "raise"):
            raise ValueError(
                f"on_backend_error must be 'bypass' or 'raise', not {on_backend_error!r}"
            )
        self.on_timeout: TimeoutPolicy = on_timeout
        self.on_backend_error: BackendPolicy = on_backend_error
        self.codec: Codec = check_codec(codec) if codec is not None else MsgpackCodec()
        self.ttl_jitter = _check_ratio("ttl_jitter", ttl_jitter)
        self.none_ttl = None if none_ttl is None else check_positive("none_ttl", none_ttl)
        self.stale_ttl = _check_non_negative("stale_ttl", stale_ttl)
        self.early_refresh_beta = _check_non_negative("early_refresh_beta", early_refresh_beta)
        if not isinstance(l1_maxsize, int) or l1_maxsize < 0:
            raise ValueError("l1_maxsize must be an int >= 0 (0 turns L1 off)")
        self.l1_ttl = check_positive("l1_ttl", l1_ttl)
        for what, number in (
            ("max_value_bytes", max_value_bytes),
            ("announce_value_bytes", announce_value_bytes),
        ):
            if not isinstance(number, int) or number < 1:
                raise ValueError(f"{what} must be an int >= 1")
        if not isinstance(max_key_length, int) or max_key_length < 80:
            raise ValueError("max_key_length must be an int >= 80")
        if not isinstance(max_fill_retries, int) or max_fill_retries < 0:
            raise ValueError("max_fill_retries must be an int >= 0")
        self.max_value_bytes = max_value_bytes
        self.announce_value_bytes = announce_value_bytes
        self.version_ttl_ms = int(check_positive("version_ttl", version_ttl) * 1000)
        self.max_key_length = max_key_length
        self.max_fill_retries = max_fill_retries
        self.max_load_time = check_positive("max_load_time", max_load_time)
        self._timer = timer
        self._clock = clock
        self._rng = rng
        self._lease_ms = max(1, int(self.lease * 1000))
        self._locks = LockFactory(
            client,
            namespace=self.namespace,
            lease=self.lease,
            timeout=self.wait_timeout,
            timer=timer,
        )
        self._flights = SingleFlight()
        self._refreshes = SingleFlight()
        self._stats = StatsRecorder(on_event)
        self._breaker = CircuitBreaker(
            failures=breaker_failures, cooldown=breaker_cooldown, timer=timer
        )
        self._executor: ThreadPoolExecutor | None = None
        self._executor_mutex = threading.Lock()
        self._closed = False
        self._l1: LocalTier | None = None
        self._l1_mutex = threading.Lock()
        self._l1_listener: Subscription | None = None
        self._loading = threading.local()  # names this thread is loading (recursion)
        self._channel_l1 = invalidation_channel(self.namespace)
        self._watermark_key = watermark_key(self.namespace)
        self._watched_prefixes: tuple[str, ...] = ()
        self._prefix_mutex = threading.Lock()
        if l1_maxsize:
            self._l1 = LocalTier(maxsize=l1_maxsize, ttl=self.l1_ttl, timer=timer)
            self._l1_listener = self._listen_l1(timeout=5.0)
        _guards.add(self)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 1.0,
        socket_timeout: float = 2.0,
        **settings: Any,
    ) -> CacheGuard:
        """A guard on a new client for ``url`` (``redis://``, ``rediss://``, ``unix://``).

        The client fails fast when Redis is down (connect and socket timeouts, no
        retries of its own: a retried script could run twice), which the circuit
        breaker and ``on_backend_error`` then handle.
        """
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            # No retries: a script whose reply was lost may have run, and running it
            # again is not safe (a second hold, a false "lock lost"). Connections
            # broken while idle are replaced when taken from the pool.
            retry=Retry(NoBackoff(), 0),
        )
        return cls(client, **settings)

    # -- public API -----------------------------------------------------------------

    def rwlock(self, name: str) -> TwoTierRWLock:
        """The two-tier read-write lock of resource ``name`` (shared in this process)."""
        return self._locks.rwlock(name)

    def stats(self) -> Stats:
        return self._stats.snapshot()

    def keys(self, name: str) -> ResourceKeys:
        return ResourceKeys(self.namespace, name)

    def _value_key(self, name: str) -> str:
        # The hit path's only key: built once per name (bounded LRU), not per call.
        return _value_key(self.namespace, name)

    def get_or_load(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: float,
        none_ttl: float | _Missing | None = MISSING,
    ) -> T:
        """The cached value of ``name``, loaded by ``load()`` once if missing."""
        if not (ttl.__class__ in _NUMBERS and 0 < ttl <= MAX_SECONDS):  # the hit path: cheap
            ttl = check_positive("ttl", ttl)
        return self._get(name, load, ttl, none_ttl)

    def _get(
        self, name: str, load: Callable[[], T], ttl: float, none_ttl: float | _Missing | None
    ) -> T:
        """``get_or_load`` with ``ttl`` already validated (loaders validate it once)."""
        l1 = self._l1
        if l1 is not None:
            kept = l1.get(name)
            if kept is not ABSENT:
                self._stats.count("l1_hits", name)
                return kept  # type: ignore[no-any-return]
        start = self._timer()
        while True:  # bounded: every pass waits on a leader that was already running
            flight, leader, joined = self._flights.join(name)
            if leader:
                break
            self._refuse_recursion(name)  # the leader may be this very thread's loader
            if not flight.wait(self.wait_timeout - (self._timer() - start)):
                return self._timed_out(name, load, start)  # type: ignore[no-any-return]
            if flight.serves(joined):
                if flight.error is not None:
                    raise flight.error
                return flight.result  # type: ignore[no-any-return]
            # We joined after the leader's read was sent: it may predate a write that
            # ended before we started. Read again (with the others who joined late).
        try:
            value, valid_below = self._lead(name, flight, load, ttl, none_ttl, start)
            if flight.has_followers_from(valid_below):
                value, valid_below = self._reread_for_late_followers(
                    name, flight, value, valid_below
                )
        except BaseException as exc:
            self._flights.finish(name, flight, error=exc)
            raise
        self._flights.finish(name, flight, value, valid_below=valid_below)
        return value

    def peek(self, name: str) -> Any:
        """The cached value of ``name`` or :data:`MISSING`; never loads, never locks."""
        if self._l1 is not None:
            value = self._l1.get(name)
            if value is not ABSENT:
                return value
        if not self._breaker.allow():
            if self.on_backend_error == "raise":
                raise BackendUnavailable(f"Redis unavailable reading {name!r} (circuit open)")
            return MISSING
        try:
            entry = self._fetch(name)
        except REDIS_DOWN as exc:
            self._backend_failed(name, exc)
            if self.on_backend_error == "raise":
                raise BackendUnavailable(f"Redis unreachable reading {name!r}: {exc}") from exc
            return MISSING
        self._breaker.success()
        if entry is None or self._clock() >= entry.expires_at:
            return MISSING
        return entry.value

    def refresh(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: float,
        none_ttl: float | _Missing | None = MISSING,
    ) -> T:
        """Load ``name`` now (under its locks, once across processes) and store it.

        With Redis unreachable (or the circuit open) ``on_backend_error`` applies as
        for reads: ``bypass`` returns a fresh load without storing it, ``raise``
        raises :class:`BackendUnavailable`."""
        ttl = check_positive("ttl", ttl)
        self._refuse_recursion(name)
        if not self._breaker.allow():
            return self._bypass(name, load, None)
        try:
            outcome, _ = self._fill(name, load, ttl, none_ttl, refresh=True, stale=None)
        except BackendUnavailable as exc:  # raised before any load ran (see _fill)
            return self._bypass(name, load, exc)
        return outcome.value  # type: ignore[no-any-return]

    def watermark(self) -> int:
        """The namespace's invalidation sequence now: read it *before* a database
        snapshot is taken and a fill from that snapshot cannot store a value that
        a later invalidation replaced (see ``cache/watermark.py``). Raises
        :class:`BackendUnavailable` when Redis is unreachable."""
        if not self._breaker.allow():
            raise BackendUnavailable("Redis unavailable reading the watermark (circuit open)")
        try:
            raw = self.client.get(self._watermark_key)
        except REDIS_DOWN as exc:
            self._backend_failed(self._watermark_key, exc)
            raise BackendUnavailable(f"Redis unreachable reading the watermark: {exc}") from exc
        self._breaker.success()
        return int(raw or 0)

    def invalidate(self, *names: str) -> None:
        """Stamp ``names`` with the next invalidation number and delete them,
        without taking locks.

        Every fill in flight for them fails its store, and so does every later
        fill whose database snapshot is older than this call (when the loader's
        snapshot watermark is known); L1 copies everywhere are dropped (here at
        once, in other processes through pub/sub).
        """
        if not names:
            return
        self._drop_l1(names)
        if not self._breaker.allow():
            raise BackendUnavailable(
                f"Redis unavailable invalidating {', '.join(map(repr, names))} (circuit open)"
            )
        try:
            # One number for the whole call, taken first: the keys' scripts then run
            # in their own slots (cluster-safe), and a version never goes down.
            stamp = int(self.client.incr(self._watermark_key))
            calls: list[ScriptCall] = []
            for name in names:
                keys = self.keys(name)
                calls.append(
                    (
                        INVALIDATE,
                        [keys.value, keys.version],
                        [self.version_ttl_ms, self._channel_l1, name, stamp],
                    )
                )
            results = run_pipelined(self.client, calls)
            highest = max((r for r in results if isinstance(r, int)), default=stamp)
            if highest > stamp:  # a version ran ahead of the sequence: lift the sequence
                RAISE_WATERMARK(self.client, [self._watermark_key], [highest])
            self._breaker.success()
        except REDIS_DOWN as exc:
            self._backend_failed(names[0], exc)
            raise BackendUnavailable(
                f"Redis unreachable invalidating {', '.join(map(repr, names))}: {exc}"
            ) from exc
        for result in results:
            if isinstance(result, Exception):
                raise result

    def invalidate_prefix(self, prefix: str) -> int:
        """Invalidate every key whose name starts with ``prefix``: values and fills
        in flight. Walks the keyspace with SCAN (cost grows with the whole keyspace),
        so it is the fallback for changes whose keys cannot be listed; the number of
        keys invalidated is returned."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self.watch_prefix(prefix)
        head = f"{self.namespace}:{{"
        pattern = _glob_escape(head + hash_tag(prefix)) + "*"
        names: set[str] = set()
        try:
            # Stamped first: a fill of a key the SCAN cannot see (no value, no fill
            # yet) from a snapshot older than this stamp will not store.
            stamp = int(self.client.incr(self._watermark_key))
            self.client.set(self._prefix_stamp_key(prefix), stamp, px=self.version_ttl_ms)
            for raw in self.client.scan_iter(match=pattern, count=1000):
                key = raw.decode("utf-8", "surrogateescape")
                for suffix in ("}:v", "}:rw"):  # a value, or a lock hash (a fill under way)
                    if key.endswith(suffix):
                        names.add(name_from_tag(key[len(head) : -len(suffix)]))
        except REDIS_DOWN as exc:
            self._backend_failed(prefix, exc)
            raise BackendUnavailable(f"Redis unreachable scanning {prefix!r}*: {exc}") from exc
        ordered = sorted(names)
        for start in range(0, len(ordered), 500):
            self.invalidate(*ordered[start : start + 500])
        return len(ordered)

    def watch_prefix(self, prefix: str) -> None:
        """Make fills of keys under ``prefix`` honour its prefix invalidations (see
        :meth:`invalidate_prefix`) in this process. The SQLAlchemy hooks watch
        their templates' prefixes; ``invalidate_prefix`` watches its own."""
        with self._prefix_mutex:
            if prefix not in self._watched_prefixes:
                self._watched_prefixes = (*self._watched_prefixes, prefix)

    def _prefix_stamp_key(self, prefix: str) -> str:
        return prefix_stamp_key(self.namespace, prefix)

    def _oldest_allowed(self, name: str, snapshot: int | None) -> int | None:
        """``snapshot``, or -1 (refuse the store) when a prefix invalidation covering
        ``name`` is newer than the snapshot."""
        if snapshot is None or snapshot < 0:
            return snapshot
        prefixes = [p for p in self._watched_prefixes if name.startswith(p)]
        if not prefixes:
            return snapshot
        pipe = self.client.pipeline(transaction=False)
        for prefix in prefixes:
            pipe.get(self._prefix_stamp_key(prefix))
        try:
            stamps = [int(raw) for raw in pipe.execute() if raw is not None]
        except (*REDIS_DOWN, redis.ResponseError, ValueError) as exc:
            log.info("prefix stamps of %r unreadable, its fill will not store: %s", name, exc)
            return -1  # the load is done and its value is returned; just do not store it
        return -1 if stamps and max(stamps) > snapshot else snapshot

    @contextmanager
    def write(self, *names: str, timeout: float | None = None) -> Iterator[None]:
        """The write path around a database update and commit.

        Takes the write locks of all ``names`` in one global order (two writers on
        overlapping keys cannot deadlock), invalidates them, runs the body,
        invalidates again (also if the body raised) and releases.
        """
        ordered = sorted(set(names))
        if not ordered:
            raise ValueError("write() needs at least one key name")
        if not self._breaker.allow():
            raise BackendUnavailable(
                f"Redis unavailable writing {', '.join(map(repr, ordered))} (circuit open)"
            )
        # The holds belong to the entering thread; the exit may run in another one
        # (ASGI servers run a sync dependency's enter and exit in two worker threads).
        holder = threading.get_ident()
        held: list[TwoTierRWLock] = []
        try:
            for name in ordered:
                lock = self.rwlock(name)
                lock.acquire_write(timeout)
                held.append(lock)
            self.invalidate(*ordered)
            try:
                yield
            except BaseException as body_error:
                # The body's error is what the caller must see; a failing closing
                # invalidation is attached to it, not raised in its place.
                try:
                    self.invalidate(*ordered)
                except Exception as closing_error:
                    _add_note(
                        body_error,
                        f"cacheguard: the closing invalidation of {ordered!r} also failed: "
                        f"{type(closing_error).__name__}: {closing_error}",
                    )
                raise
            self.invalidate(*ordered)
        finally:
            for lock in reversed(held):
                try:
                    lock.release_write(holder=holder)
                except Exception:
                    log.exception("releasing the write lock of %r failed", lock.name)

    def close(self) -> None:
        """Stop background work (L1 listener, refresh threads); the client stays open.

        The guard still serves reads afterwards, without background refreshes or L1
        invalidation broadcasts."""
        self._closed = True
        with self._l1_mutex:
            if self._l1_listener is not None:
                self._l1_listener.close()
                self._l1_listener = None
        if self._l1 is not None:
            self._l1.clear()  # no invalidations reach it any more
        with self._executor_mutex:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    # -- the read path -----------------------------------------------------------------

    def _reread_for_late_followers(
        self, name: str, flight: Flight, value: Any, valid_below: int
    ) -> tuple[Any, int]:
        """Some followers joined after our read was sent; one more shared GET serves
        them all (instead of each re-reading). Bounded; stragglers read themselves."""
        for _ in range(2):
            sealed = self._flights.seal(flight)
            try:
                entry = self._fetch(name)
            except REDIS_DOWN:
                break
            if entry is None or self._clock() >= entry.expires_at:
                break  # invalidated again: late followers must load it themselves
            value, valid_below = entry.value, sealed
            if not flight.has_followers_from(sealed):
                break
        return value, valid_below

    def _timed_out(self, name: str, load: Callable[[], Any], start: float) -> Any:
        """A wait in this process (for its leader of ``name``, or for a writer of it)
        took too long: apply the ``on_timeout`` policy."""
        self._stats.count("wait_timeouts", name, self._timer() - start)
        if self.on_timeout == "raise":
            raise LockTimeout(name=name, mode="read", waited=self._timer() - start)
        if self.on_timeout == "stale":
            stale = self.peek_entry(name)
            if stale is not None:
                self._stats.count("stale_served", name)
                return stale.value
        return self._load_counted(name, load)[0]

    def peek_entry(self, name: str) -> Entry | None:
        """The stored entry of ``name`` even past its logical expiry, or None."""
        try:
            return self._fetch(name)
        except REDIS_DOWN:
            return None

    def _fetch(self, name: str) -> Entry | None:
        """GET and decode the entry of ``name``; corrupt or foreign data is a miss.
        A lost connection raises (callers apply their own policy)."""
        try:
            raw = self.client.get(self._value_key(name))
        except NoPermissionError:
            raise  # an ACL that does not cover the namespace: the caller's policy applies
        except redis.ResponseError as exc:  # e.g. WRONGTYPE: someone else's key
            self._stats.count("corrupt_entries", name, error=exc)
            log.warning("cache key of %r is not ours, treated as a miss: %s", name, exc)
            return None
        return self._decode(name, raw) if raw is not None else None

    def _fetch_fresh(self, name: str) -> Entry | None:
        """The entry of ``name`` if it is there and not past its expiry."""
        entry = self._fetch(name)
        return entry if entry is not None and self._clock() < entry.expires_at else None

    def _lead(
        self,
        name: str,
        flight: Flight,
        load: Callable[[], T],
        ttl: float,
        none_ttl: float | _Missing | None,
        start: float,
    ) -> tuple[T, int]:
        """Get ``name`` for the flight (the call began at ``start``); returns the value
        and the generation below which followers may take it (see
        :mod:`cacheguard.cache.singleflight`)."""
        if not self._breaker.allow():
            return self._bypass(name, load, None), self._flights.seal(flight)
        l1_guard = self._l1_guard() if self._l1 is not None else None  # before the GET
        sealed = flight.generation  # flights are born sealed for this first GET
        try:
            entry = self._fetch(name)
        except REDIS_DOWN as exc:
            return self._bypass(name, load, exc), self._flights.seal(flight)
        self._breaker.success()
        if entry is not None:
            now = self._clock()
            left = entry.created + entry.ttl - now
            if left > 0:  # the hit path: keep it short
                self._stats.count("l2_hits", name)
                if self._should_refresh_early(entry, now):
                    self._refresh_in_background(name, load, ttl, none_ttl)
                if l1_guard is not None:
                    self._keep_l1(name, entry.value, left, l1_guard)
                return entry.value, sealed
            if self.stale_ttl > 0:  # inside the stale window: serve, reload in background
                self._stats.count("stale_served", name)
                self._refresh_in_background(name, load, ttl, none_ttl)
                return entry.value, sealed
        self._stats.count("misses", name)
        try:
            outcome, valid_below = self._fill(
                name,
                load,
                ttl,
                none_ttl,
                refresh=False,
                stale=entry,
                seal=lambda: self._flights.seal(flight),
                budget=self.wait_timeout - (self._timer() - start),
            )
        except BackendUnavailable as exc:  # raised before any load ran (see _fill)
            return self._bypass(name, load, exc), self._flights.seal(flight)
        if l1_guard is not None and outcome.source in ("l2", "loaded", "peer"):
            if outcome.entry is not None:
                lifetime = outcome.entry.expires_at - self._clock()
            else:  # our own store: its TTL was jittered, never above this floor
                lifetime = ttl * (1 - self.ttl_jitter)
            self._keep_l1(name, outcome.value, lifetime, l1_guard)
        return outcome.value, valid_below

    def _bypass(self, name: str, load: Callable[[], T], exc: BaseException | None) -> T:
        """Redis is down (or the breaker is open): load directly, or raise."""
        if exc is not None:
            self._backend_failed(name, exc)
        if self.on_backend_error == "raise":
            raise BackendUnavailable(
                f"Redis unavailable for {name!r}"
                + (f": {exc}" if exc is not None else " (circuit open)")
            ) from exc
        return self._load_counted(name, load)[0]

    def _backend_failed(self, name: str, exc: BaseException) -> None:
        self._breaker.failure()
        self._stats.count("backend_errors", name, error=exc)
        log.warning("Redis unavailable for %r (%s: %s)", name, type(exc).__name__, exc)

    def _loading_here(self) -> set[str]:
        """The names this thread is loading right now (innermost last)."""
        names: set[str] | None = getattr(self._loading, "names", None)
        if names is None:
            names = self._loading.names = set()
        return names

    def _refuse_recursion(self, name: str) -> None:
        """A loader asking for its own key would wait for itself: fail at once."""
        if name in self._loading_here():
            self._stats.count("load_errors", name, error=RecursiveLoadError(key=name))
            raise RecursiveLoadError(key=name)

    def _load_counted(self, name: str, load: Callable[[], T]) -> tuple[T, float]:
        loading = self._loading_here()
        outermost = name not in loading
        loading.add(name)
        start = self._timer()
        try:
            value = load()
        except BaseException as exc:
            self._stats.count("load_errors", name, self._timer() - start, error=exc)
            raise
        finally:
            if outermost:
                loading.discard(name)
        seconds = self._timer() - start
        self._stats.count("loads", name, seconds)
        return value, seconds

    def _should_refresh_early(self, entry: Entry, now: float) -> bool:
        """XFetch: refresh with a probability that rises as expiry nears."""
        scale = self.early_refresh_beta * entry.load_duration
        if scale <= 0:
            return False
        if entry.expires_at - now > _XFETCH_HORIZON * scale:
            return False  # chance below e**-40: not worth a random draw on every hit
        draw = self._rng()
        if draw <= 0:
            return False
        gap = -entry.load_duration * self.early_refresh_beta * math.log(draw)
        return now + gap >= entry.expires_at

    def _refresh_in_background(
        self, name: str, load: Callable[[], Any], ttl: float, none_ttl: float | _Missing | None
    ) -> None:
        if self._closed:
            return
        flight, leader, _ = self._refreshes.join(name)
        if not leader:
            return  # this process already refreshes it

        def run() -> None:
            try:
                outcome, _ = self._fill(
                    name, load, ttl, none_ttl, refresh=True, stale=None, background=True
                )
                if outcome.source == "loaded":
                    self._stats.count("early_refreshes", name)
            except Exception:
                log.exception("background refresh of %r failed", name)
            finally:
                self._refreshes.finish(name, flight)

        try:
            self._background().submit(run)
        except RuntimeError:  # executor shut down (close() or interpreter exit)
            self._refreshes.finish(name, flight)

    def _background(self) -> ThreadPoolExecutor:
        with self._executor_mutex:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="cacheguard-refresh"
                )
            return self._executor

    # -- the fill flow driver --------------------------------------------------------------

    def _fill(
        self,
        name: str,
        load: Callable[[], Any],
        ttl: float,
        none_ttl: float | _Missing | None,
        *,
        refresh: bool,
        stale: Entry | None,
        background: bool = False,
        seal: Callable[[], int] | None = None,
        budget: float | None = None,
    ) -> tuple[Outcome, int]:
        """Run the fill flow for ``name`` under its local read lock.

        Returns the outcome and the flight generation below which followers may
        share it: ``seal`` is called before every step whose answer may be shared
        (begin, end of our own fill, an unlocked load), and the last seal bounds it.
        """
        self._refuse_recursion(name)
        lock = self.rwlock(name)
        keys = self.keys(name)
        owner = lock.owner
        start = self._timer()
        limit = max(self.wait_timeout if budget is None else budget, 1e-3)
        seal_now = seal if seal is not None else (lambda: VALID_FOR_ALL)
        if lock.local.is_write_held_by_me():
            # This thread is writing the key (guard.write or a tracked transaction):
            # what it loads may be uncommitted. Serve it to this caller only (valid
            # below generation 0: followers read again) and store nothing.
            return Outcome(self._load_counted(name, load)[0], "unlocked"), 0
        try:
            lock.local.acquire_read(limit)  # local writers and fills exclude
        except LockTimeout:  # a writer of this process holds the key: same policy
            if background:
                raise
            sealed = seal_now()
            return Outcome(self._timed_out(name, load, start), "unlocked"), sealed
        flow = fill_flow(
            name=name,
            refresh=refresh,
            background=background,
            wait_timeout=max(limit - (self._timer() - start), 1e-3),
            on_timeout=self.on_timeout,
            stale=stale,
            max_aborts=self.max_fill_retries,
            timer=self._timer,
            backoff=_WAIT_BACKOFF,
        )
        subscription: Subscription | None = None
        fill_handle = None
        waited_from: float | None = None
        sealed = VALID_FOR_ALL
        snapshot: int | None = None  # watermark of the oldest snapshot our load read
        try:
            step: Any = next(flow)
            while True:
                reply: Any = None
                try:
                    if isinstance(step, BeginFill):
                        sealed = seal_now()
                        if subscription is not None:
                            subscription.drain()  # announcements before this begin are moot
                        reply = self._begin(name, keys, owner, step.refresh)
                        if reply.kind == "fill":
                            # Renewed while the loader runs, up to max_load_time: a hung
                            # loader must not keep writers of the key out for ever.
                            fill_handle = lock.remote.adopt(
                                "read", owner, int(reply.epoch), renew_for=self.max_load_time
                            )
                    elif isinstance(step, Load):
                        with collecting() as snapshots:
                            reply = self._load_counted(name, load)
                        snapshot = self._oldest_allowed(name, min(snapshots, default=None))
                    elif isinstance(step, EndFill):
                        # Our load serves followers that joined before our hold ends.
                        sealed = seal_now()
                        reply = self._end_fill(
                            name, keys, lock, fill_handle, step, ttl, none_ttl, snapshot
                        )
                    elif isinstance(step, Subscribe):
                        waited_from = self._timer()
                        subscription = notifier_for(self.client).subscription(keys.released_channel)
                        reply = subscription.open(min(self.wait_timeout, 1.0))
                    elif isinstance(step, Lookup):
                        reply = self._redis(name, self._fetch_fresh, name)
                    elif isinstance(step, Wait):
                        assert subscription is not None
                        reply = [self._message(name, m) for m in subscription.wait(step.seconds)]
                    elif isinstance(step, LoadUnlocked):
                        self._stats.count("wait_timeouts", name, self._timer() - start)
                        sealed = seal_now()  # serves only followers that joined before
                        reply = self._load_counted(name, load)[0]
                except BaseException as exc:  # hand the failure to the flow
                    step = flow.throw(exc)
                    continue
                step = flow.send(reply)
        except StopIteration as done:
            outcome: Outcome = done.value
            if outcome.source == "stale":
                self._stats.count("stale_served", name)
            return outcome, sealed
        finally:
            if subscription is not None:
                subscription.close()
            if waited_from is not None:
                self._stats.count("lock_waits", name, self._timer() - waited_from)
            lock.local.release_read()

    def _end_fill(
        self,
        name: str,
        keys: ResourceKeys,
        lock: TwoTierRWLock,
        fill_handle: LockHandle | None,
        step: EndFill,
        ttl: float,
        none_ttl: float | _Missing | None,
        snapshot: int | None,
    ) -> bool:
        """End our fill (store or not); the end script releases its read hold, or,
        if that script fails, the watchdog releases it in the background."""
        last_renewed = lock.remote.disown(fill_handle) if fill_handle is not None else None
        try:
            return self._end(name, keys, lock.owner, step, ttl, none_ttl, snapshot)
        except BaseException as exc:
            if fill_handle is not None:
                lock.remote.release_in_background(fill_handle, last_renewed)
            if not isinstance(exc, BackendUnavailable):
                raise
            # The load is done: keep its value (or its error); never load again.
            self._backend_failed(name, exc)
            return False

    def _redis(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except REDIS_DOWN as exc:
            raise BackendUnavailable(f"Redis unreachable for {name!r}: {exc}") from exc

    def _begin(self, name: str, keys: ResourceKeys, owner: str, refresh: bool) -> Begin:
        reply = self._redis(
            name,
            FILL_BEGIN,
            self.client,
            [keys.value, keys.lock, keys.version],
            [owner, self._lease_ms, "1" if refresh else "0", self.version_ttl_ms],
        )
        status = int(reply[0])
        if status == 0:
            # Not counted: the GET just before this begin counted the same bytes.
            entry = self._decode(name, reply[1], count=False)
            if entry is None:
                return Begin("corrupt")
            if self._clock() >= entry.expires_at:  # kept only for stale serving
                return Begin("expired")
            return Begin("hit", entry=entry)
        if status == 1:
            return Begin(
                "fill",
                version=_text(reply[1]),
                epoch=_text(reply[2]),
                begun_ms=int(reply[3]),
                since_us=int(reply[4]),
            )
        return Begin(
            "busy",
            wait=max(int(reply[1]), 0) / 1000.0,
            since_us=int(reply[3]),
            version=_text(reply[4]),
        )

    def _end(
        self,
        name: str,
        keys: ResourceKeys,
        owner: str,
        step: EndFill,
        ttl: float,
        none_ttl: float | _Missing | None,
        snapshot: int | None,
    ) -> bool:
        data = b""
        error: BaseException | None = None
        seconds = 0.0
        try:
            if not step.failed:
                data, seconds = self._encode(name, step, ttl, none_ttl)
        except BaseException as exc:  # the fill still ends (no store) before it raises
            error, data = exc, b""
        px = max(1, int((seconds + self.stale_ttl + self._kept_for_timeouts(seconds)) * 1000))
        stored = self._redis(
            name,
            FILL_END,
            self.client,
            [keys.value, keys.lock, keys.version],
            [
                owner,
                step.begin.epoch,
                step.begin.version,
                step.begin.begun_ms,
                self.version_ttl_ms,
                data,
                px,
                keys.released_channel,
                self.announce_value_bytes,
                "1" if step.failed or error is not None else "0",
                "" if snapshot is None else snapshot,
                step.begin.since_us,
            ],
        )
        if error is not None:
            raise error
        if data and stored != 1:
            self._stats.count("stores_rejected", name)
            log.info(
                "store of %r rejected: invalidated while loading, loaded from a snapshot "
                "older than the last invalidation, or lease lost",
                name,
            )
        return bool(stored == 1)

    def _encode(
        self, name: str, step: EndFill, ttl: float, none_ttl: float | _Missing | None
    ) -> tuple[bytes, float]:
        """The entry to store for a successful load (b"" for none) and its TTL."""
        effective_none_ttl = self.none_ttl if none_ttl is MISSING else none_ttl
        if step.value is None and effective_none_ttl is None:
            return b"", 0.0  # negative caching off: return None, store nothing
        lifetime = ttl if step.value is not None else float(effective_none_ttl)  # type: ignore[arg-type]
        lifetime = self._jittered(lifetime)
        try:
            data = pack_entry(
                self.codec,
                step.value,
                created=self._clock(),
                ttl=lifetime,
                version=int(step.begin.version),
                load_duration=step.load_seconds,
            )
        except SerializationError as exc:
            raise SerializationError(f"cannot cache {name!r}: {exc}", key=name) from exc
        if len(data) > self.max_value_bytes:
            self._stats.count("values_too_large", name)
            log.warning(
                "value of %r is %d bytes, over max_value_bytes=%d: returned, not cached",
                name,
                len(data),
                self.max_value_bytes,
            )
            return b"", 0.0
        return data, lifetime

    def _kept_for_timeouts(self, lifetime: float) -> float:
        """How long an entry stays in Redis past its expiry (and stale window) for
        ``on_timeout="stale"``: one more lifetime, served only to readers whose wait
        for a fresh value timed out."""
        return lifetime if self.on_timeout == "stale" else 0.0

    def _jittered(self, ttl: float) -> float:
        if self.ttl_jitter <= 0:
            return ttl
        return ttl * (1 + self.ttl_jitter * (2 * self._rng() - 1))

    def _message(self, name: str, payload: bytes) -> Message:
        kind = payload[:1]
        if kind == b"V":
            began, _, data = payload[1:].partition(b":")
            entry = self._decode(name, data) if began.isdigit() else None
            if entry is None:
                return Message("stored")  # read it from the key instead
            return Message("value", entry, int(began))
        if kind == b"S":
            return Message("stored")
        if kind == b"A":
            return Message("aborted")
        if kind == b"N":
            return Message("not_stored")
        return Message("released")

    def _decode(self, name: str, raw: Any, *, count: bool = True) -> Entry | None:
        try:
            if not isinstance(raw, bytes):
                raise ValueError(f"expected bytes from Redis, got {type(raw).__name__}")
            return unpack_entry(self.codec, raw)
        except ValueError as exc:
            if count:
                self._stats.count("corrupt_entries", name, error=exc)
                log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
            return None

    # -- L1 ------------------------------------------------------------------------------

    def _listen_l1(self, timeout: float) -> Subscription:
        return notifier_for(self.client).listen(
            self._channel_l1, self._on_l1_message, timeout=timeout, on_gap=self._on_l1_gap
        )

    def _l1_guard(self) -> tuple[int, object] | None:
        """What must not change between reading a value and keeping it in L1: the
        L1 epoch (no drop meanwhile) and the listener's live token (no gap in the
        invalidation feed). None: L1 is off, or its feed is not live right now."""
        l1 = self._l1
        if l1 is None:
            return None
        listener = self._l1_listener
        if listener is None:
            listener = self._resume_l1_listener()
            if listener is None:
                return None
        token = listener.live_token()
        return None if token is None else (l1.epoch, token)

    def _resume_l1_listener(self) -> Subscription | None:
        """Subscribe again where a fork left the guard without its listener; L1
        takes copies again once Redis confirms it."""
        with self._l1_mutex:
            if self._l1_listener is None and not self._closed:
                self._l1_listener = self._listen_l1(timeout=0.0)
            return self._l1_listener

    def _keep_l1(self, name: str, value: Any, lifetime: float, guard: tuple[int, object]) -> None:
        l1, listener = self._l1, self._l1_listener
        if l1 is None or listener is None or listener.live_token() is not guard[1]:
            return
        l1.put(name, value, lifetime, guard[0])

    def _drop_l1(self, names: tuple[str, ...] | list[str]) -> None:
        if self._l1 is not None:
            self._l1.drop(names)

    def _on_l1_message(self, payload: bytes) -> None:
        self._drop_l1([payload.decode("utf-8", "surrogateescape")])

    def _on_l1_gap(self) -> None:
        if self._l1 is not None:
            self._l1.clear()  # invalidations may have been missed


@functools.lru_cache(maxsize=4096)
def _value_key(namespace: str, name: str) -> str:
    return ResourceKeys(namespace, name).value


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11+); logged on older versions."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(note)
    else:
        log.error("%s (while handling %r)", note, error)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_guards: weakref.WeakSet[CacheGuard] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for guard in list(_guards):
        guard._executor = None  # the parent's worker threads do not exist here
        guard._executor_mutex = threading.Lock()
        guard._l1_mutex = threading.Lock()
        guard._prefix_mutex = threading.Lock()
        if guard._l1 is not None:
            # The parent's subscription is gone with its notifier: drop what the
            # parent kept and subscribe again on first use (not here: no threads
            # are started inside a fork hook).
            guard._l1.reset_after_fork()
            guard._l1_listener = None
        guard._flights = SingleFlight()
        guard._refreshes = SingleFlight()


on_fork_in_child(_reset_after_fork)
