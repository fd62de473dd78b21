"""CacheGuard: the read-through cache and its write path, on a sync Redis client.

Read path (``get_or_load``): L1 (optional, in process) -> L2 (Redis: a hit is one
GET and takes no lock) -> on a miss, one thread per process per key goes on
(single flight) and fills the key, once across processes; the others wait for
its result. Write path (``write``): the keys' write locks in one global order,
invalidate, the body, invalidate again, release.

Every decision is in the flows (:mod:`~cacheguard.cache.flows.read`,
:mod:`~cacheguard.cache.flows.write`, :mod:`~cacheguard.cache.flows.fill`) and in
:class:`~cacheguard.cache.flows.state.GuardState`; this guard is their blocking driver:
each public method runs one flow, and ``_answer`` carries out its steps.
:class:`cacheguard.aio.AsyncCacheGuard` is its asyncio twin.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import redis

from cacheguard._identity import enter_holder, leave_holder, on_fork_in_child
from cacheguard.cache import typed
from cacheguard.cache.batch_driver import Batch, BatchDriver, value_of
from cacheguard.cache.driver import backend_down, drive_fill, is_loader, lookup_failed
from cacheguard.cache.entry import MISSING, Entry, Missing
from cacheguard.cache.flows.batch import batch_read, refresh_many
from cacheguard.cache.flows.fill import Call, Lookup
from cacheguard.cache.flows.read import (
    Gutter,
    LoadNow,
    Read,
    Replay,
    RunFill,
    WaitFlight,
    hit,
    hit_lead,
    peek_entry_flow,
    peek_flow,
    read,
    read_call,
    refresh_flow,
)
from cacheguard.cache.flows.state import GuardState, value_key, weakly
from cacheguard.cache.flows.write import (
    BODY,
    AcquireWrite,
    Command,
    Pipelined,
    ReleaseWrites,
    Scan,
    invalidate_flow,
    invalidate_prefix_flow,
    watermark_flow,
    write_flow,
)
from cacheguard.cache.l1 import L1Feed, Listener, LocalTier
from cacheguard.cache.outage.gutter import gutter_guard_made, gutter_settings
from cacheguard.cache.outage.shared_loads import SharedLoads
from cacheguard.cache.settings import BackendPolicy, GuardSettings, client_options
from cacheguard.cache.singleflight import SingleFlight
from cacheguard.cache.stats import EventHook, Stats
from cacheguard.cache.write_locks import (
    StoreWriteLock,
    WriteLockStore,
    store_write_locks,
)
from cacheguard.checks import Seconds
from cacheguard.codecs import ValueType, value_type
from cacheguard.locks.two_tier import LockFactory, TwoTierRWLock
from cacheguard.redis.clients import (
    SyncClient,
    check_sync_client,
    close_sync_client,
    direct_get,
    node_namer,
    replicas_expected,
    sync_client_from_url,
)
from cacheguard.redis.errors import REDIS_DOWN, classify
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.notifier import close_notifier_of, notifier_for
from cacheguard.redis.scripts import run_pipelined

__all__ = ["MISSING", "BackendPolicy", "CacheGuard"]


T = TypeVar("T")


class CacheGuard:
    """A read-through cache on Redis that loads each missing key once, everywhere.

    Every keyword but the last six is a setting of :class:`GuardSettings` (see
    ``docs/guide.md``); ``on_event`` receives every counted event; ``write_locks``
    makes the write path's locks in another lock store (a callable: name -> lock,
    see :mod:`cacheguard.cache.write_locks`); ``gutter`` is a second Redis (a client
    or a URL) that fills go through while this one is unreachable (entries kept
    ``gutter_ttl`` s, see ``docs/outage.md``); ``timer``, ``clock`` and ``rng`` are
    injectable for tests.

    Every duration, here and in the methods (``ttl``, ``none_ttl``, ``lease``,
    ``wait_timeout``, ``timeout`` ...), is seconds (int or float) or a
    ``datetime.timedelta``. The guard is a context manager: ``with
    CacheGuard.from_url(url) as guard:`` closes it on exit (:meth:`close`: what
    the guard made, never a client passed in).
    """

    def __init__(
        self,
        client: SyncClient,
        *,
        on_event: Callable[[Any], None] | None = None,
        write_locks: WriteLockStore | None = None,
        gutter: SyncClient | str | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        **settings: Any,
    ) -> None:
        check_sync_client(client, "CacheGuard")
        config = GuardSettings(**settings)
        if gutter is not None and not isinstance(gutter, str):
            check_sync_client(gutter, "CacheGuard's gutter")
        self._state = GuardState(
            config,
            on_event=on_event,
            timer=timer,
            clock=clock,
            rng=rng,
            flight_event=threading.Event,
            front="CacheGuard",
            run_in_background=weakly(self._start_background),
            locks=LockFactory(
                client,
                namespace=config.namespace,
                lease=config.lease,
                timeout=config.wait_timeout,
                timer=timer,
                cohort_limit=config.cohort_limit,
            ),
            store_write_lock=store_write_locks(write_locks),
            node_of=node_namer(client),
            replicas=replicas_expected(client),
        )
        self.client = client
        self._executor: ThreadPoolExecutor | None = None
        self._executor_mutex = threading.Lock()
        if gutter is not None:
            self._state.gutter = self._gutter_guard(gutter, config, timer, clock, rng)
        if config.l1_maxsize:
            self._state.l1 = L1Feed(
                LocalTier(maxsize=config.l1_maxsize, ttl=config.l1_ttl, timer=timer),
                self._listen_l1,
            )
            try:
                self._state.l1.start(timeout=5.0)
            except BaseException:
                if self._state.gutter is not None:
                    self._state.gutter.close()
                raise
        _guards.add(self)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: Seconds = 1.0,
        socket_timeout: Seconds = 2.0,
        **settings: Any,
    ) -> CacheGuard:
        """A guard on a new client for ``url``: one server (``redis://``, ``rediss://``,
        ``unix://``), a cluster (``redis+cluster://host:port,...``) or a Sentinel
        master (``redis+sentinel://host:port,.../service``; see ``cacheguard/redis/clients.py``).

        The client fails fast when Redis is down (``connect_timeout`` and
        ``socket_timeout``, seconds or a ``timedelta``; no retries of its own: a
        retried script could run twice), which the circuit breaker and
        ``on_backend_error`` then handle. The guard owns it: :meth:`close` (or
        leaving a ``with`` block) closes it, with every connection, pool and
        sentinel client it made.
        """
        client = sync_client_from_url(url, client_options(connect_timeout, socket_timeout))
        try:
            guard = cls(client, **settings)
        except BaseException:
            close_sync_client(client)  # a bad setting leaves no connection behind
            raise
        guard._state.owns_client = True
        get = direct_get(client)
        if get is not None:
            guard._state.direct_get = (client, get)
        return guard

    # -- public API -----------------------------------------------------------------

    # -- the state's public face -----------------------------------------------------------

    @property
    def settings(self) -> GuardSettings:
        """This guard's settings: one frozen record (see :class:`GuardSettings`)."""
        return self._state.settings

    @property
    def namespace(self) -> str:
        """The prefix of every key this guard writes."""
        return self._state.namespace

    def stats(self) -> Stats:
        """What the guard did so far: a snapshot of its counters."""
        return self._state.stats()

    def add_event_hook(self, hook: EventHook) -> None:
        """Call ``hook(event)`` with every :class:`~cacheguard.CacheEvent` from now on,
        besides ``on_event`` (thread-safe; adding a hook twice adds it once). Hooks
        run in the calling thread (or on the loop) and must be quick; one that raises
        is logged and never fails the cache call."""
        self._state.add_event_hook(hook)

    def remove_event_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; :class:`ValueError` if it is not a hook of this guard."""
        self._state.remove_event_hook(hook)

    def keys(self, name: str) -> ResourceKeys:
        """The Redis keys of resource ``name`` (its value, lock, fence ...)."""
        return self._state.keys(name)

    def watch_prefix(self, prefix: str) -> None:
        """Make fills of keys under ``prefix`` honour its prefix invalidations (see
        ``invalidate_prefix``) in this process, for good. The SQLAlchemy hooks watch
        their templates' prefixes; ``invalidate_prefix`` makes its process honour its
        own stamp for as long as the stamp lives (``version_ttl``)."""
        self._state.watch_prefix(prefix)

    def rwlock(self, name: str) -> TwoTierRWLock:
        """The two-tier read-write lock of resource ``name`` (shared in this process)."""
        return self._state.rwlock(name)  # type: ignore[no-any-return]

    def write_lock(self, name: str) -> TwoTierRWLock | StoreWriteLock:
        """The lock ``write`` and the SQLAlchemy hooks take for ``name``: the two-tier
        lock, or the ``write_locks`` store's lock (see :mod:`cacheguard.cache.write_locks`)."""
        return self._state.write_lock(name)  # type: ignore[no-any-return]

    def get_or_load(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> T:
        """The cached value of ``name``, loaded by ``load()`` once if missing.

        ``ttl`` (and ``none_ttl``, a cached None's lifetime; MISSING: the setting's,
        None: never cached): seconds or a ``timedelta``. ``template`` names the
        family of keys ``name`` belongs to (``"menu:{id}"``) in this call's events,
        for metrics labels; loaders pass their own. Without it the events carry
        None (see :mod:`cacheguard.cache.stats`). ``type``: the value's type, a
        dataclass, a pydantic model, a msgspec Struct or a container of them (see
        :mod:`cacheguard.codecs`): the value is stored as plain data and read back
        as that type."""
        if type is not None:
            return typed.get_or_load(  # type: ignore[no-any-return]
                self, value_type(type), name, load, ttl=ttl, none_ttl=none_ttl, template=template
            )
        return self._get_or_load(name, load, ttl, none_ttl, template, None)  # type: ignore[no-any-return]

    def _get_or_load(
        self,
        name: str,
        load: Callable[[], Any],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        template: str | None,
        fits: Callable[[Any], bool] | None,
    ) -> Any:
        """:meth:`get_or_load`; ``fits``: a typed read's check of stored values
        (cache/typed.py: one that does not fit is a miss, filled once)."""
        name = self._state.key_name(name)
        state = self._state  # a local: the hit path reads it often
        # Checked before the hit path leads the key's flight: a refusal leaves none open.
        call = read_call(state, name, load, ttl, none_ttl, template, fits)
        # Traced (cache/tracing.py) around the whole call; untraced, two None checks.
        tracer = state.tracer
        trace = None if tracer is None else tracer.begin("get_or_load", template)
        try:
            lead = hit_lead(state, call)
            if lead is None:
                return self._run(read(state, call), name)
            # The hit path (see cache/flows/read.py): the leader's GET without the flow,
            # which goes on from its answer unless that is a value to serve at once.
            direct, client = state.direct_get, self.client
            get = direct[1] if direct is not None and direct[0] is client else client.get
            try:
                raw, error = get(value_key(state.namespace, name)), None
            except BaseException as exc:
                raw, error = lookup_failed(name, exc)
            value, rest = hit(state, call, lead, raw, error)
            if rest is None:
                return value
            return self._run(rest, name)
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            raise
        finally:
            if trace is not None:
                trace.end()

    def get_or_load_many(
        self,
        names: Iterable[str],
        load_many: Callable[[list[str]], Mapping[str, T]],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> dict[str, T]:
        """The cached values of ``names`` (a dict in their order, duplicates once),
        those missing loaded by one ``load_many(missing_names)`` call returning a
        mapping name -> value. ``type``: the values' type, as for :meth:`get_or_load`.

        Each name gets what :meth:`get_or_load` gives it (one load across
        processes, version-checked stores, write locks respected); the hits come
        in one round trip (one per node on a cluster; a node down bypasses its own
        names only). Names another caller is filling are waited for once our own
        fills ended; where a single read would load one of them, ``load_many`` is
        called for it alone. A name
        ``load_many`` leaves out raises :class:`~cacheguard.IncompleteLoad` (nothing
        cached for it; the names it returned are). See ``docs/batch.md``."""
        values = None if type is None else value_type(type)
        return self._get_or_load_many(names, load_many, ttl, none_ttl, template, values)

    def _get_or_load_many(
        self,
        names: Iterable[str],
        load_many: Callable[[list[str]], Any],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        template: str | None,
        values: ValueType | None,
    ) -> dict[str, Any]:
        """:meth:`get_or_load_many` with ``values`` (the values' type made, or None)."""
        state = self._state

        def loaded_alone(name: str) -> Callable[[], Any]:
            return lambda: value_of(load_many([name]), name)

        def load_one(name: str) -> Callable[[], Any]:
            load = loaded_alone(name)
            return load if values is None else typed.dumping(values, load)

        batch = Batch(state, names, load_many, load_one, ttl, none_ttl, template, values)
        if not batch.calls:
            return {}
        # Traced as get_or_load is: one span for the batch, its outcome the furthest any
        # name went (cache/tracing.py); untraced, two None checks.
        tracer = state.tracer
        trace = None if tracer is None else tracer.begin("get_or_load_many", template)
        try:
            return self._read_many(batch, ttl, none_ttl, template, values, loaded_alone)
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            raise
        finally:
            if trace is not None:
                trace.end()

    def _read_many(
        self,
        batch: Batch,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        template: str | None,
        values: ValueType | None,
        loaded_alone: Callable[[str], Callable[[], Any]],
    ) -> dict[str, Any]:
        """The batch's reads, then its refreshes and its typed reloads."""
        state = self._state
        driver = BatchDriver(state, self.client, batch, self._run, self._answer)
        due: list[Read] = []  # served, due for a refresh: refreshed together
        result, unfit = batch.result(driver.drive(batch_read(state, batch.calls, due)))
        if due:
            self._refresh_many(batch, due)
        if values is not None:  # names shared by an untyped read here: loaded again
            for name in unfit:
                result[name] = typed.refresh(
                    self,
                    values,
                    name,
                    loaded_alone(name),
                    ttl=ttl,
                    none_ttl=none_ttl,
                    template=template,
                )
        return result

    def peek(
        self,
        name: str,
        *,
        template: str | None = None,
        type: Any = None,
    ) -> Any:
        """The cached value of ``name`` or :data:`MISSING`; never loads, never locks.
        With ``type``, as that type (:data:`MISSING` if the data does not fit it)."""
        if type is not None:
            return typed.peek(self, value_type(type), name, template=template)
        name = self._state.key_name(name)
        return self._traced("peek", template, peek_flow(self._state, name, template), name)

    def peek_entry(self, name: str) -> Entry | None:
        """The stored entry of ``name`` even past its logical expiry, or None."""
        name = self._state.key_name(name)
        return self._run(peek_entry_flow(self._state, name), name)  # type: ignore[no-any-return]

    def refresh(
        self,
        name: str,
        load: Callable[[], T],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> T:
        """Load ``name`` now (under its locks, once across processes) and store it.

        With Redis unreachable (or the circuit open) ``on_backend_error`` applies as
        for reads: ``bypass`` returns a fresh load without storing it, ``raise``
        raises :class:`BackendUnavailable`. ``template`` and ``type``: as for
        :meth:`get_or_load`."""
        if type is not None:
            return typed.refresh(  # type: ignore[no-any-return]
                self, value_type(type), name, load, ttl=ttl, none_ttl=none_ttl, template=template
            )
        name = self._state.key_name(name)
        flow = refresh_flow(
            self._state, read_call(self._state, name, load, ttl, none_ttl, template)
        )
        return self._traced("refresh", template, flow, name)  # type: ignore[no-any-return]

    def watermark(self) -> int:
        """The namespace's invalidation sequence now: read it *before* a database
        snapshot is taken and a fill from that snapshot cannot store a value that
        a later invalidation replaced (see ``cache/watermark.py``). Raises
        :class:`BackendUnavailable` when Redis is unreachable."""
        self._state.check_open()
        return self._run(watermark_flow(self._state), "the watermark")  # type: ignore[no-any-return]

    def invalidate(self, *names: str, template: str | None = None) -> None:
        """Stamp ``names`` with the next invalidation number and delete them,
        without taking locks.

        Every fill in flight for them fails its store, and so does every later
        fill whose database snapshot is older than this call (when the loader's
        snapshot watermark is known); L1 copies everywhere are dropped (here at
        once, in other processes through pub/sub). A read that starts in this
        process after the call returned never waits for, nor gets, a load of
        them begun before it (see :meth:`note_written`). ``template``: the names'
        key template, for the events' labels (as for :meth:`get_or_load`).
        """
        names = self._state.key_names(names)
        flow = invalidate_flow(self._state, names, template=template)
        self._traced("invalidate", template, flow, ", ".join(names))

    def invalidate_prefix(self, prefix: str) -> int:
        """Invalidate every key whose name starts with ``prefix``: values and fills
        in flight. Walks the keyspace with SCAN (cost grows with the whole keyspace),
        so it is the fallback for changes whose keys cannot be listed; the number of
        keys invalidated is returned."""
        prefix = self._state.key_prefix(prefix)
        flow = invalidate_prefix_flow(self._state, prefix)
        return self._traced("invalidate_prefix", None, flow, f"{prefix}*")  # type: ignore[no-any-return]

    def note_written(self, *names: str, prefix: str | None = None) -> None:
        """Tell the guard that ``names`` (and, with ``prefix``, every name starting
        with it: ``""`` for all) were just written in Redis by other means than its
        own calls, without its locks (e.g. the Django backend's ``set`` and
        ``delete``, :mod:`cacheguard.cache.entry_writes`). A call from now on in this
        process then neither waits for nor shares a load of them already under way
        (it may have read the data before the write): it reads Redis itself. What
        the process keeps of them (L1, the values seen) is dropped. No I/O, and no
        error on a closed guard; ``invalidate`` and ``invalidate_prefix`` do this
        themselves."""
        self._state.note_written(names, prefix)

    @contextmanager
    def write(self, *names: str, timeout: Seconds | None = None) -> Iterator[None]:
        """The write path around a database update and commit.

        Takes the write locks of all ``names`` in one global order (two writers on
        overlapping keys cannot deadlock; each waited for up to ``timeout``, seconds
        or a ``timedelta``, default ``wait_timeout``), invalidates them, runs the body,
        invalidates again (also if the body raised) and releases. A lock lost
        meanwhile (another writer may have run with the body) then raises
        :class:`LockLostError`; if the body raised, its error wins, with the loss
        as a note.
        """
        names = self._state.key_names(names)
        # The holds are this block's holder's (the context's, so nested calls in the
        # body re-enter), not the thread's: the exit may run in another thread.
        holder = enter_holder()
        try:
            flow = write_flow(self._state, names, timeout, holder)
            self._run(flow, "the write")  # up to the body; raising, it holds nothing
            try:
                yield
            except BaseException as body_error:
                self._run(flow, "the write", error=body_error)  # re-raises it
                raise
            self._run(flow, "the write")
        finally:
            leave_holder(holder)

    def close(self) -> None:
        """Stop background work (L1 listener, refresh threads) and close what the
        guard made: the client ``from_url`` made, with its connections, pools and
        release-notification listener. A client passed in is left open (it is
        yours). Closing again does nothing.

        Afterwards every call that would talk to Redis raises :class:`GuardClosed`.
        With a client of its own the guard first waits for the background
        refreshes already running (queued ones are dropped). Calls under way in
        other threads are not waited for: one may still use the client (and open a
        connection) as it ends, so close after your own calls have returned."""
        if self._state.closed:
            return
        self._state.closed = True
        if self._state.l1 is not None:
            self._state.l1.close()
        with self._executor_mutex:
            executor, self._executor = self._executor, None
        if executor is not None:
            owned = self._state.owns_client
            executor.shutdown(wait=owned, cancel_futures=owned)
        if self._state.gutter is not None:
            self._state.gutter.close()
        if self._state.owns_client:
            close_notifier_of(self.client)
            close_sync_client(self.client)

    def __enter__(self) -> CacheGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the driver: every step of the flows, carried out with blocking calls --------------

    def _traced(
        self, operation: str, template: str | None, flow: Generator[Any, Any, Any], name: str
    ) -> Any:
        """:meth:`_run` of a public call's ``flow``, traced as ``operation`` when the
        guard has a tracer (see :mod:`cacheguard.cache.tracing`)."""
        tracer = self._state.tracer
        if tracer is None:
            return self._run(flow, name)
        trace = tracer.begin(operation, template)
        try:
            return self._run(flow, name)
        except BaseException as exc:
            trace.failed(exc)
            raise
        finally:
            trace.end()

    def _run(
        self,
        flow: Generator[Any, Any, Any],
        name: str,
        *,
        error: BaseException | None = None,
    ) -> Any:
        """Resume ``flow`` (with ``error`` thrown in, if given) and carry out its steps
        until it returns (its value) or asks for the caller's ``with`` block; closed
        unless suspended there."""
        step: Any = None
        try:
            step = flow.send(None) if error is None else flow.throw(error)
            while step is not BODY:
                try:
                    if step.__class__ is Lookup:  # the hit path's one step, inline
                        reply = self.client.get(value_key(self._state.namespace, name))
                    else:
                        reply = self._answer(step, name)
                except REDIS_DOWN as exc:
                    step = flow.throw(exc if is_loader(step) else backend_down(name, exc))
                except redis.ResponseError as exc:  # a GET of someone else's key: not ours
                    if not is_loader(step) and isinstance(refusal := classify(exc), REDIS_DOWN):
                        step = flow.throw(backend_down(name, refusal))
                    else:
                        step = flow.send(exc) if step.__class__ is Lookup else flow.throw(exc)
                except BaseException as exc:
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration as done:
            return done.value
        finally:
            if step is not BODY:
                flow.close()
        return None

    def _answer(self, step: Any, name: str) -> Any:
        client = self.client
        if isinstance(step, RunFill):
            return drive_fill(
                step.flow,
                client=client,
                lock=step.lock,
                loads=self._state.loads,
                name=step.call.name,
                load=step.call.load,
                seal=step.seal,
                template=step.call.template,
            )
        if isinstance(step, WaitFlight):
            return step.flight.wait(step.timeout)
        if isinstance(step, LoadNow):
            call = step.call
            return self._state.loads.run(call.name, call.load, call.template)[0]
        if isinstance(step, Gutter):
            call = step.call
            return self._state.gutter.get_or_load(
                call.name, call.load, ttl=step.ttl, none_ttl=step.none_ttl, template=call.template
            )
        if isinstance(step, Replay):
            return self._state.recovery.run()
        if isinstance(step, Command):
            return client.execute_command(*step.args)  # type: ignore[no-untyped-call]
        if isinstance(step, Pipelined):
            return run_pipelined(client, list(step.calls), step.confirm)
        if isinstance(step, Call):
            script, keys, args = step.call
            return script(client, keys, args)
        if isinstance(step, Scan):
            return list(client.scan_iter(match=step.pattern, count=1000))
        if isinstance(step, AcquireWrite):
            return step.lock.acquire_write(step.timeout, holder=step.holder)
        if isinstance(step, ReleaseWrites):
            errors: list[Exception | None] = []
            for lock in reversed(step.locks):
                try:
                    lock.release_write(holder=step.holder)
                except Exception as exc:  # the flow tells a lost lock from a failure
                    errors.append(exc)
                else:
                    errors.append(None)
            return errors[::-1]
        raise TypeError(f"not a guard step: {step!r}")

    def _gutter_guard(
        self,
        gutter: SyncClient | str,
        config: GuardSettings,
        timer: Callable[[], float],
        clock: Callable[[], float],
        rng: Callable[[], float],
    ) -> CacheGuard:
        """The guard on the gutter Redis (see :mod:`cacheguard.cache.outage.gutter`); closed
        with this one (with its client too when made from a URL)."""
        settings = gutter_settings(config)
        if isinstance(gutter, str):
            inner = CacheGuard.from_url(gutter, timer=timer, clock=clock, rng=rng, **settings)
        else:
            inner = CacheGuard(gutter, timer=timer, clock=clock, rng=rng, **settings)
        return gutter_guard_made(inner, self._state.recorder)

    def _start_background(self, flow: Generator[Any, Any, None], name: str) -> bool:
        try:
            self._background().submit(self._run, flow, name)
        except RuntimeError:  # executor shut down (close() or interpreter exit)
            return False
        return True

    def _refresh_many(self, batch: Batch, due: list[Read]) -> None:
        """Refresh a batch's ``due`` entries in a worker thread, with one ``load_many``."""
        driver = BatchDriver(self._state, self.client, batch, self._run, self._answer)
        flow = refresh_many(self._state, due)
        try:
            self._background().submit(driver.drive, flow)
        except RuntimeError:  # executor shut down (close() or interpreter exit)
            flow.close()

    def _background(self) -> ThreadPoolExecutor:
        with self._executor_mutex:
            if self._state.closed:
                # A call that began before close() and ends now must not start a
                # pool that close() would never shut down (its threads would leak).
                raise RuntimeError("the guard is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="cacheguard-refresh"
                )
            return self._executor

    def _listen_l1(self, timeout: float) -> Listener:
        assert self._state.l1 is not None
        return notifier_for(self.client).listen(
            self._state.invalidation.l1_channel,
            self._state.l1.on_message,
            timeout=timeout,
            on_gap=self._state.l1.on_gap,
        )


_guards: weakref.WeakSet[CacheGuard] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for guard in list(_guards):
        guard._executor = None  # the parent's worker threads do not exist here
        guard._executor_mutex = threading.Lock()
        guard._state.invalidation.reset_after_fork()
        if guard._state.l1 is not None:
            guard._state.l1.reset_after_fork()
        guard._state.flights = SingleFlight()
        guard._state.refreshes = SingleFlight()
        guard._state.recovery.reset_after_fork()
        if guard._state.last_seen is not None:
            guard._state.last_seen.reset_after_fork()
        guard._state.shared_loads = SharedLoads(
            threading.Event, guard._state.timer, guard.settings.max_load_time
        )


on_fork_in_child(_reset_after_fork)
