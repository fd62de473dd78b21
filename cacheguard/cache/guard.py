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

import cachetools
import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from cacheguard._identity import on_fork_in_child
from cacheguard.backoff import Backoff
from cacheguard.cache.breaker import CircuitBreaker
from cacheguard.cache.codec import Codec, MsgpackCodec
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
from cacheguard.cache.scripts import FILL_BEGIN, FILL_END, INVALIDATE, RAISE_WATERMARK
from cacheguard.cache.singleflight import VALID_FOR_ALL, Flight, SingleFlight
from cacheguard.cache.stats import Stats, StatsRecorder
from cacheguard.cache.watermark import collecting
from cacheguard.exceptions import BackendUnavailable, LockTimeout, SerializationError
from cacheguard.keys import (
    ResourceKeys,
    check_namespace,
    hash_tag,
    invalidation_channel,
    name_from_tag,
    watermark_key,
)
from cacheguard.locks.notifier import Subscription, notifier_for
from cacheguard.locks.redis_rwlock import LockHandle, check_positive
from cacheguard.locks.scripts import ScriptCall, run_pipelined
from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock

__all__ = ["MISSING", "BackendPolicy", "CacheGuard"]

log = logging.getLogger("cacheguard")

T = TypeVar("T")
BackendPolicy = Literal["bypass", "raise"]

# Redis unusable for us: unreachable, or refusing our keys (an ACL without them).
_REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError, NoPermissionError)

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
    if math.isinf(value):
        raise ValueError(f"{what} must be finite")
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
        self.codec: Codec = codec if codec is not None else MsgpackCodec()
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
        self._l1: cachetools.TTLCache[str, Entry] | None = None
        self._l1_mutex = threading.Lock()
        self._l1_listener: Subscription | None = None
        self._channel_l1 = invalidation_channel(self.namespace)
        self._watermark_key = watermark_key(self.namespace)
        self._watched_prefixes: tuple[str, ...] = ()
        self._prefix_mutex = threading.Lock()
        if l1_maxsize:
            self._l1 = cachetools.TTLCache(maxsize=l1_maxsize, ttl=self.l1_ttl, timer=timer)
            self._l1_listener = notifier_for(client).listen(self._channel_l1, self._on_l1_message)
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
        return self._get(name, load, check_positive("ttl", ttl), none_ttl)

    def _get(
        self, name: str, load: Callable[[], T], ttl: float, none_ttl: float | _Missing | None
    ) -> T:
        """``get_or_load`` with ``ttl`` already validated (loaders validate it once)."""
        l1 = self._l1
        if l1 is not None:
            entry = l1.get(name)
            if entry is not None:
                self._stats.count("l1_hits", name)
                return entry.value  # type: ignore[no-any-return]
        start = self._timer()
        while True:  # bounded: every pass waits on a leader that was already running
            flight, leader, joined = self._flights.join(name)
            if leader:
                break
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
            entry = self._l1.get(name)
            if entry is not None:
                return entry.value
        try:
            entry = self._fetch(name)
        except _REDIS_DOWN as exc:
            self._backend_failed(name, exc)
            if self.on_backend_error == "raise":
                raise BackendUnavailable(f"Redis unreachable reading {name!r}: {exc}") from exc
            return MISSING
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
        """Load ``name`` now (under its locks, once across processes) and store it."""
        ttl = check_positive("ttl", ttl)
        outcome, _ = self._fill(name, load, ttl, none_ttl, refresh=True, stale=None)
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
        except _REDIS_DOWN as exc:
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
        except _REDIS_DOWN as exc:
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
        except _REDIS_DOWN as exc:
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
        return f"{self.namespace}:ps:{hash_tag(prefix)}"

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
        except (*_REDIS_DOWN, redis.ResponseError, ValueError) as exc:
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
        held: list[TwoTierRWLock] = []
        try:
            for name in ordered:
                lock = self.rwlock(name)
                lock.acquire_write(timeout)
                held.append(lock)
            self.invalidate(*ordered)
            try:
                yield
            finally:
                self.invalidate(*ordered)
        finally:
            for lock in reversed(held):
                try:
                    lock.release_write()
                except Exception:
                    log.exception("releasing the write lock of %r failed", lock.name)

    def close(self) -> None:
        """Stop background work (L1 listener, refresh threads); the client stays open.

        The guard still serves reads afterwards, without background refreshes or L1
        invalidation broadcasts."""
        self._closed = True
        if self._l1_listener is not None:
            self._l1_listener.close()
            self._l1_listener = None
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
            except _REDIS_DOWN:
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
        except _REDIS_DOWN:
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
        sealed = flight.generation  # flights are born sealed for this first GET
        try:
            entry = self._fetch(name)
        except _REDIS_DOWN as exc:
            return self._bypass(name, load, exc), self._flights.seal(flight)
        self._breaker.success()
        if entry is not None:
            now = self._clock()
            if now < entry.expires_at:
                self._stats.count("l2_hits", name)
                if self._should_refresh_early(entry, now):
                    self._refresh_in_background(name, load, ttl, none_ttl)
                self._keep_l1(name, entry)
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
        if self._l1 is not None and outcome.source in ("l2", "loaded", "peer"):
            self._keep_l1(name, Entry(outcome.value, self._clock(), ttl, 0, 0.0))
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

    def _load_counted(self, name: str, load: Callable[[], T]) -> tuple[T, float]:
        start = self._timer()
        try:
            value = load()
        except BaseException as exc:
            self._stats.count("load_errors", name, self._timer() - start, error=exc)
            raise
        seconds = self._timer() - start
        self._stats.count("loads", name, seconds)
        return value, seconds

    def _should_refresh_early(self, entry: Entry, now: float) -> bool:
        """XFetch: refresh with a probability that rises as expiry nears."""
        if self.early_refresh_beta <= 0 or entry.load_duration <= 0:
            return False
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
                            fill_handle = lock.remote.adopt("read", owner, int(reply.epoch))
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
                        reply = self._redis(name, self._fetch, name)
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
        except _REDIS_DOWN as exc:
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
            entry = self._decode(name, reply[1])
            return Begin("hit", entry=entry) if entry is not None else Begin("corrupt")
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
        px = max(1, int((seconds + self.stale_ttl) * 1000))
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

    def _decode(self, name: str, raw: Any) -> Entry | None:
        try:
            if not isinstance(raw, bytes):
                raise ValueError(f"expected bytes from Redis, got {type(raw).__name__}")
            return unpack_entry(self.codec, raw)
        except ValueError as exc:
            self._stats.count("corrupt_entries", name, error=exc)
            log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
            return None

    # -- L1 ------------------------------------------------------------------------------

    def _keep_l1(self, name: str, entry: Entry) -> None:
        if self._l1 is not None:
            with self._l1_mutex:
                self._l1[name] = entry

    def _drop_l1(self, names: tuple[str, ...] | list[str]) -> None:
        if self._l1 is not None:
            with self._l1_mutex:
                for name in names:
                    self._l1.pop(name, None)

    def _on_l1_message(self, payload: bytes) -> None:
        self._drop_l1([payload.decode("utf-8", "surrogateescape")])


@functools.lru_cache(maxsize=4096)
def _value_key(namespace: str, name: str) -> str:
    return ResourceKeys(namespace, name).value


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_guards: weakref.WeakSet[CacheGuard] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for guard in list(_guards):
        guard._executor = None  # the parent's worker threads do not exist here
        guard._executor_mutex = threading.Lock()
        guard._l1_mutex = threading.Lock()
        guard._prefix_mutex = threading.Lock()
        guard._flights = SingleFlight()
        guard._refreshes = SingleFlight()


on_fork_in_child(_reset_after_fork)
