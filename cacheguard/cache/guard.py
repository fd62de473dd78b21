"""CacheGuard: the read-through cache and its write path, on a sync Redis client.

Read path (``get_or_load``): L1 (optional, in process) -> L2 (Redis: a hit is one
GET and takes no lock; :func:`~cacheguard.cache.flow.judge` decides what a
value read is good for) -> on a miss, one thread per process per key goes on
(single flight) and runs :func:`~cacheguard.cache.flow.fill_flow` through the
sync driver (:mod:`cacheguard.cache.driver`); the others wait for its result.

Write path (``write``): the keys' write locks in one global order, then bump
their versions and delete them, run the body, delete again, release.

The guard is a front on :class:`~cacheguard.cache.core.GuardCore` (settings, L1,
invalidation, loader bookkeeping, and every decision that is not I/O); it adds
the blocking I/O. :class:`cacheguard.aio.AsyncCacheGuard` is its asyncio twin.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import redis

from cacheguard._identity import on_fork_in_child
from cacheguard.cache.core import GuardCore, add_note, closing_failed_note, value_key
from cacheguard.cache.driver import drive_fill, get_raw
from cacheguard.cache.entry import MISSING, Entry, Missing
from cacheguard.cache.flow import Outcome, Step, timed_out_flow
from cacheguard.cache.invalidation import SCAN_BATCH
from cacheguard.cache.l1 import ABSENT, L1Feed, Listener, LocalTier
from cacheguard.cache.settings import BackendPolicy, GuardSettings, client_options
from cacheguard.cache.singleflight import VALID_FOR_ALL, Flight, SingleFlight
from cacheguard.exceptions import REDIS_DOWN, BackendUnavailable
from cacheguard.locks.notifier import notifier_for
from cacheguard.locks.scripts import run_pipelined
from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock

__all__ = ["MISSING", "BackendPolicy", "CacheGuard"]

log = logging.getLogger("cacheguard")

T = TypeVar("T")


class CacheGuard(GuardCore):
    """A read-through cache on Redis that loads each missing key once, everywhere.

    Every keyword but the last four is a setting of :class:`GuardSettings` (see
    ``docs/guide.md``); ``on_event`` receives every counted event; ``timer``,
    ``clock`` and ``rng`` are injectable for tests.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        on_event: Callable[[Any], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        **settings: Any,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError(
                "CacheGuard needs a client with decode_responses=False (it stores bytes)"
            )
        config = GuardSettings(**settings)
        super().__init__(
            config,
            on_event=on_event,
            timer=timer,
            clock=clock,
            rng=rng,
            flight_event=threading.Event,
        )
        self.client = client
        self._locks = LockFactory(
            client,
            namespace=config.namespace,
            lease=config.lease,
            timeout=config.wait_timeout,
            timer=timer,
        )
        self._executor: ThreadPoolExecutor | None = None
        self._executor_mutex = threading.Lock()
        if config.l1_maxsize:
            self._l1 = L1Feed(
                LocalTier(maxsize=config.l1_maxsize, ttl=config.l1_ttl, timer=timer),
                self._listen_l1,
            )
            self._l1.start(timeout=5.0)
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
        client = redis.Redis.from_url(url, **client_options(connect_timeout, socket_timeout))
        return cls(client, **settings)

    # -- public API -----------------------------------------------------------------

    def rwlock(self, name: str) -> TwoTierRWLock:
        """The two-tier read-write lock of resource ``name`` (shared in this process)."""
        return self._locks.rwlock(name)

    def get_or_load(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> T:
        """The cached value of ``name``, loaded by ``load()`` once if missing."""
        ttl = self._ttl(ttl)
        l1 = self._l1
        if l1 is not None:
            kept = l1.tier.get(name)
            if kept is not ABSENT:
                self._stats.count("l1_hits", name)
                return kept  # type: ignore[no-any-return]
        start = self._timer()
        while True:  # bounded: every pass waits on a leader that was already running
            flight, leader, joined = self._flights.join(name)
            if leader:
                break
            self._loads.refuse_recursion(name)  # the leader may be this very thread's loader
            lock = self.rwlock(name)
            if lock.local.is_write_held_by_me():
                # Our own write: the leader waits for us, and what it loads is not our
                # view. Load privately (see fill_flow's writing_here), storing nothing.
                mine, _ = self._fill(name, load, ttl, none_ttl, refresh=False, stale=None)
                return mine.value  # type: ignore[no-any-return]
            if not flight.wait(self.settings.wait_timeout - (self._timer() - start)):
                waited = self._timer() - start
                flow = timed_out_flow(self._job(name, lock, ttl, none_ttl), None, waited)
                return self._drive(name, lock, load, flow)[0].value  # type: ignore[no-any-return]
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
            value = self._l1.tier.get(name)
            if value is not ABSENT:
                return value
        raising = self.settings.on_backend_error == "raise"
        closed = self._circuit_open(f"reading {name!r}")
        if closed is not None:
            if raising:
                raise closed
            return MISSING
        try:
            entry = self._fetch(name)
        except REDIS_DOWN as exc:
            self._backend_failed(name, exc)
            if raising:
                raise BackendUnavailable(f"Redis unreachable reading {name!r}: {exc}") from exc
            return MISSING
        self._breaker.success()
        return self._peeked(entry)

    def refresh(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> T:
        """Load ``name`` now (under its locks, once across processes) and store it.

        With Redis unreachable (or the circuit open) ``on_backend_error`` applies as
        for reads: ``bypass`` returns a fresh load without storing it, ``raise``
        raises :class:`BackendUnavailable`."""
        ttl = self._ttl(ttl)
        self._loads.refuse_recursion(name)
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
        key = self._invalidation.watermark_key
        closed = self._circuit_open("reading the watermark")
        if closed is not None:
            raise closed
        try:
            raw = self.client.get(key)
        except REDIS_DOWN as exc:
            self._backend_failed(key, exc)
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
        if self._l1 is not None:
            self._l1.drop(names)
        listed = ", ".join(map(repr, names))
        closed = self._circuit_open(f"invalidating {listed}")
        if closed is not None:
            raise closed
        invalidation = self._invalidation
        try:
            # One number for the whole call, taken first: the keys' scripts then run
            # in their own slots (cluster-safe), and a version never goes down.
            stamp = int(self.client.incr(invalidation.watermark_key))
            results = run_pipelined(self.client, invalidation.calls(names, stamp))
            lift = invalidation.lift(results, stamp)
            if lift is not None:  # a version ran ahead of the sequence: lift the sequence
                script, keys, args = lift
                script(self.client, keys, args)
            self._breaker.success()
        except REDIS_DOWN as exc:
            self._backend_failed(names[0], exc)
            raise BackendUnavailable(f"Redis unreachable invalidating {listed}: {exc}") from exc
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
        invalidation = self._invalidation
        invalidation.watch(prefix)
        names: set[str] = set()
        try:
            # Stamped first: a fill of a key the SCAN cannot see (no value, no fill
            # yet) from a snapshot older than this stamp will not store.
            stamp = int(self.client.incr(invalidation.watermark_key))
            self.client.set(invalidation.stamp_key(prefix), stamp, px=self.settings.version_ttl_ms)
            for raw in self.client.scan_iter(match=invalidation.scan_pattern(prefix), count=1000):
                name = invalidation.name_of(raw.decode("utf-8", "surrogateescape"))
                if name is not None:
                    names.add(name)
        except REDIS_DOWN as exc:
            self._backend_failed(prefix, exc)
            raise BackendUnavailable(f"Redis unreachable scanning {prefix!r}*: {exc}") from exc
        ordered = sorted(names)
        for start in range(0, len(ordered), SCAN_BATCH):
            self.invalidate(*ordered[start : start + SCAN_BATCH])
        return len(ordered)

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
        closed = self._circuit_open(f"writing {', '.join(map(repr, ordered))}")
        if closed is not None:
            raise closed
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
                    add_note(body_error, closing_failed_note(ordered, closing_error))
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
        if self._l1 is not None:
            self._l1.close()
        with self._executor_mutex:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    def peek_entry(self, name: str) -> Entry | None:
        """The stored entry of ``name`` even past its logical expiry, or None."""
        try:
            return self._fetch(name)
        except REDIS_DOWN:
            return None

    # -- the read path -----------------------------------------------------------------

    def _lead(
        self,
        name: str,
        flight: Flight,
        load: Callable[[], T],
        ttl: float,
        none_ttl: float | Missing | None,
        start: float,
    ) -> tuple[T, int]:
        """Get ``name`` for the flight (the call began at ``start``); returns the value
        and the generation below which followers may take it (see
        :mod:`cacheguard.cache.singleflight`)."""
        if not self._breaker.allow():
            return self._bypass(name, load, None), self._flights.seal(flight)
        l1_seen = self._l1_seen() if self._l1 is not None else None  # before the GET
        sealed = flight.generation  # flights are born sealed for this first GET
        raw: Any
        try:
            raw = self.client.get(value_key(self.namespace, name))
        except REDIS_DOWN as exc:
            return self._bypass(name, load, exc), self._flights.seal(flight)
        except redis.ResponseError as exc:  # e.g. WRONGTYPE: someone else's key
            raw = exc
        self._breaker.success()
        served, entry = self._served(name, raw, l1_seen, load, ttl, none_ttl)
        if served:
            return entry.value, sealed  # type: ignore[union-attr]
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
                budget=self.settings.wait_timeout - (self._timer() - start),
            )
        except BackendUnavailable as exc:  # raised before any load ran (see _fill)
            return self._bypass(name, load, exc), self._flights.seal(flight)
        self._keep_filled(name, outcome, l1_seen, ttl)
        return outcome.value, valid_below

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

    def _fetch(self, name: str) -> Entry | None:
        """GET and decode the entry of ``name``; corrupt or foreign data is a miss.
        A lost connection raises (callers apply their own policy)."""
        return self._decode(name, get_raw(self.client, value_key(self.namespace, name)))

    def _bypass(self, name: str, load: Callable[[], T], exc: BaseException | None) -> T:
        """Redis is down (or the breaker is open): load directly, or raise."""
        self._refuse_bypass(name, exc)
        return self._loads.run(name, load)[0]  # type: ignore[no-any-return]

    def _refresh_in_background(
        self, name: str, load: Callable[[], Any], ttl: float, none_ttl: float | Missing | None
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

    # -- the fill ----------------------------------------------------------------------------

    def _fill(
        self,
        name: str,
        load: Callable[[], Any],
        ttl: float,
        none_ttl: float | Missing | None,
        *,
        refresh: bool,
        stale: Entry | None,
        background: bool = False,
        seal: Callable[[], int] | None = None,
        budget: float | None = None,
    ) -> tuple[Outcome, int]:
        """Run the fill flow for ``name``: its outcome and the flight generation
        below which followers may share it."""
        lock = self.rwlock(name)  # one instance for the job and the driver: one owner
        flow = self._fill_flow(
            name,
            lock,
            ttl,
            none_ttl,
            refresh=refresh,
            stale=stale,
            background=background,
            budget=budget,
        )
        return self._drive(name, lock, load, flow, seal)

    def _drive(
        self,
        name: str,
        lock: TwoTierRWLock,
        load: Callable[[], Any],
        flow: Generator[Step, Any, Outcome],
        seal: Callable[[], int] | None = None,
    ) -> tuple[Outcome, int]:
        return drive_fill(
            flow,
            client=self.client,
            lock=lock,
            loads=self._loads,
            name=name,
            load=load,
            seal=seal if seal is not None else _valid_for_all,
        )

    def _listen_l1(self, timeout: float) -> Listener:
        assert self._l1 is not None
        return notifier_for(self.client).listen(
            self._invalidation.l1_channel,
            self._l1.on_message,
            timeout=timeout,
            on_gap=self._l1.on_gap,
        )


def _valid_for_all() -> int:
    return VALID_FOR_ALL


_guards: weakref.WeakSet[CacheGuard] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for guard in list(_guards):
        guard._executor = None  # the parent's worker threads do not exist here
        guard._executor_mutex = threading.Lock()
        guard._invalidation.reset_after_fork()
        if guard._l1 is not None:
            guard._l1.reset_after_fork()
        guard._flights = SingleFlight()
        guard._refreshes = SingleFlight()


on_fork_in_child(_reset_after_fork)
