"""AsyncCacheGuard: the read-through cache and its write path on asyncio.

The twin of :class:`cacheguard.CacheGuard`, on the same
:class:`~cacheguard.cache.core.GuardCore` and the same fill flow, with awaits:

::

    guard = AsyncCacheGuard.from_url(url, namespace="menu", lease=30.0)
    menu = await guard.get_or_load("menu:7", load_menu, ttl=300)
    async with guard.write("menu:list", "menu:7"):
        await update_menu_and_commit()

Native asyncio end to end: a ``redis.asyncio`` client, the loop's notifier and
watchdog tasks, a task-level lock in front of the distributed one, a single
flight of asyncio events. Entries, locks, fills, versions and announcements are
the sync guard's: sync and asyncio processes on one namespace share them.

Cancellation: a task cancelled while it waits leaves nothing held; a cancelled
filler still ends its fill (storing nothing) and releases its hold; followers of
a cancelled leader carry on without it; a cancelled writer releases its locks.
A guard belongs to the event loop it is first used on (:class:`WrongEventLoop`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import redis
import redis.asyncio

from cacheguard.aio._loop import LoopBinding
from cacheguard.aio.driver import aget_raw, arun_load, drive_fill_async
from cacheguard.aio.local import current_task
from cacheguard.aio.notifier import async_notifier_for
from cacheguard.aio.two_tier import AsyncLockFactory, AsyncTwoTierRWLock
from cacheguard.cache.core import GuardCore, add_note, closing_failed_note, value_key
from cacheguard.cache.entry import MISSING, Entry, Missing
from cacheguard.cache.flow import Outcome, Step, timed_out_flow
from cacheguard.cache.invalidation import SCAN_BATCH
from cacheguard.cache.l1 import ABSENT, L1Feed, Listener, LocalTier
from cacheguard.cache.settings import GuardSettings, client_options
from cacheguard.cache.singleflight import VALID_FOR_ALL, Flight
from cacheguard.checks import check_int
from cacheguard.exceptions import REDIS_DOWN, BackendUnavailable
from cacheguard.locks.scripts import arun_pipelined

__all__ = ["AsyncCacheGuard"]

log = logging.getLogger("cacheguard")

T = TypeVar("T")


class AsyncCacheGuard(GuardCore):
    """A read-through cache on Redis for asyncio: each missing key loaded once,
    by one task of one process, while every other caller awaits its value.

    The settings are :class:`~cacheguard.cache.settings.GuardSettings`' (those of
    :class:`~cacheguard.CacheGuard`); ``load`` functions may be ``async def`` or
    plain functions (a plain one runs on the loop: keep it quick).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        on_event: Callable[[Any], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        **settings: Any,
    ) -> None:
        if not isinstance(client, redis.asyncio.Redis):
            raise TypeError(
                f"AsyncCacheGuard needs a redis.asyncio.Redis client, not {type(client).__name__}"
                " (use CacheGuard for a sync client)"
            )
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError(
                "AsyncCacheGuard needs a client with decode_responses=False (it stores bytes)"
            )
        config = GuardSettings(**settings)
        super().__init__(
            config, on_event=on_event, timer=timer, clock=clock, rng=rng, flight_event=asyncio.Event
        )
        self.client = client
        self._binding = LoopBinding("this AsyncCacheGuard")
        self._locks = AsyncLockFactory(
            client,
            namespace=config.namespace,
            lease=config.lease,
            timeout=config.wait_timeout,
            timer=timer,
        )
        self._tasks: set[asyncio.Task[Any]] = set()  # background refreshes, L1 subscribing
        if config.l1_maxsize:
            # Subscribed on first use, from inside the loop.
            self._l1 = L1Feed(
                LocalTier(maxsize=config.l1_maxsize, ttl=config.l1_ttl, timer=timer),
                self._listen_l1,
            )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 1.0,
        socket_timeout: float = 2.0,
        max_connections: int = 64,
        **settings: Any,
    ) -> AsyncCacheGuard:
        """A guard on a new ``redis.asyncio`` client for ``url``; the client options
        are :meth:`CacheGuard.from_url`'s (fail fast, no client retries).

        The pool holds at most ``max_connections`` and makes a task wait for a free
        one (up to ``socket_timeout``) rather than fail: hundreds of tasks may call
        at once, and a refused connection would count as Redis being down."""
        options = client_options(connect_timeout, socket_timeout)
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=check_int("max_connections", max_connections, minimum=1),
            timeout=options["socket_timeout"],
            **options,
        )
        return cls(redis.asyncio.Redis(connection_pool=pool), **settings)

    # -- public API -----------------------------------------------------------------

    def rwlock(self, name: str) -> AsyncTwoTierRWLock:
        """The two-tier read-write lock of resource ``name`` (shared in this loop)."""
        return self._locks.rwlock(name)

    async def get_or_load(
        self,
        name: str,
        load: Callable[[], Any],
        *,
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> Any:
        """The cached value of ``name``, loaded by ``load()`` once if missing."""
        self._binding.check()
        ttl = self._ttl(ttl)
        l1 = self._l1
        if l1 is not None:
            kept = l1.tier.get(name)
            if kept is not ABSENT:
                self._stats.count("l1_hits", name)
                return kept
        start = self._timer()
        while True:  # bounded: every pass waits on a leader that was already running
            flight, leader, joined = self._flights.join(name)
            if leader:
                break
            self._loads.refuse_recursion(name)  # the leader may be this task's loader
            lock = self.rwlock(name)
            if lock.local.is_write_held_by_me():
                # Our own write: the leader waits for us, and what it loads is not our
                # view. Load privately (see fill_flow's writing_here), storing nothing.
                mine, _ = await self._fill(name, load, ttl, none_ttl, refresh=False, stale=None)
                return mine.value
            if not await flight.wait_async(self.settings.wait_timeout - (self._timer() - start)):
                waited = self._timer() - start
                flow = timed_out_flow(self._job(name, lock, ttl, none_ttl), None, waited)
                return (await self._drive(name, lock, load, flow))[0].value
            if flight.serves(joined):
                if flight.error is not None:
                    raise flight.error
                return flight.result
            # Joined after the leader's read was sent, or the leader was cancelled:
            # read again (with the others who joined late).
        try:
            value, valid_below = await self._lead(name, flight, load, ttl, none_ttl, start)
            if flight.has_followers_from(valid_below):
                value, valid_below = await self._reread_for_late_followers(
                    name, flight, value, valid_below
                )
        except asyncio.CancelledError:
            self._flights.finish(name, flight, valid_below=0)  # followers go on without us
            raise
        except BaseException as exc:
            self._flights.finish(name, flight, error=exc)
            raise
        self._flights.finish(name, flight, value, valid_below=valid_below)
        return value

    async def peek(self, name: str) -> Any:
        """The cached value of ``name`` or :data:`MISSING`; never loads, never locks."""
        self._binding.check()
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
            entry = await self._fetch(name)
        except REDIS_DOWN as exc:
            self._backend_failed(name, exc)
            if raising:
                raise BackendUnavailable(f"Redis unreachable reading {name!r}: {exc}") from exc
            return MISSING
        self._breaker.success()
        return self._peeked(entry)

    async def peek_entry(self, name: str) -> Entry | None:
        """The stored entry of ``name`` even past its logical expiry, or None."""
        self._binding.check()
        try:
            return await self._fetch(name)
        except REDIS_DOWN:
            return None

    async def refresh(
        self,
        name: str,
        load: Callable[[], Any],
        *,
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> Any:
        """Load ``name`` now (under its locks, once across processes) and store it;
        ``on_backend_error`` applies as for reads."""
        self._binding.check()
        ttl = self._ttl(ttl)
        self._loads.refuse_recursion(name)
        if not self._breaker.allow():
            return await self._bypass(name, load, None)
        try:
            outcome, _ = await self._fill(name, load, ttl, none_ttl, refresh=True, stale=None)
        except BackendUnavailable as exc:  # raised before any load ran
            return await self._bypass(name, load, exc)
        return outcome.value

    async def watermark(self) -> int:
        """The namespace's invalidation sequence now (see :meth:`CacheGuard.watermark`)."""
        self._binding.check()
        key = self._invalidation.watermark_key
        closed = self._circuit_open("reading the watermark")
        if closed is not None:
            raise closed
        try:
            raw = await self.client.get(key)
        except REDIS_DOWN as exc:
            self._backend_failed(key, exc)
            raise BackendUnavailable(f"Redis unreachable reading the watermark: {exc}") from exc
        self._breaker.success()
        return int(raw or 0)

    async def invalidate(self, *names: str) -> None:
        """Stamp ``names`` with the next invalidation number and delete them, without
        taking locks (see :meth:`CacheGuard.invalidate`)."""
        self._binding.check()
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
            stamp = int(await self.client.incr(invalidation.watermark_key))
            results = await arun_pipelined(self.client, invalidation.calls(names, stamp))
            lift = invalidation.lift(results, stamp)
            if lift is not None:  # a version ran ahead of the sequence: lift the sequence
                script, keys, args = lift
                await script.acall(self.client, keys, args)
            self._breaker.success()
        except REDIS_DOWN as exc:
            self._backend_failed(names[0], exc)
            raise BackendUnavailable(f"Redis unreachable invalidating {listed}: {exc}") from exc
        for result in results:
            if isinstance(result, Exception):
                raise result

    async def invalidate_prefix(self, prefix: str) -> int:
        """Invalidate every key whose name starts with ``prefix`` (a SCAN; see
        :meth:`CacheGuard.invalidate_prefix`); returns how many."""
        self._binding.check()
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        invalidation = self._invalidation
        invalidation.watch(prefix)
        names: set[str] = set()
        try:
            stamp = int(await self.client.incr(invalidation.watermark_key))
            await self.client.set(
                invalidation.stamp_key(prefix), stamp, px=self.settings.version_ttl_ms
            )
            pattern = invalidation.scan_pattern(prefix)
            async for raw in self.client.scan_iter(match=pattern, count=1000):
                name = invalidation.name_of(raw.decode("utf-8", "surrogateescape"))
                if name is not None:
                    names.add(name)
        except REDIS_DOWN as exc:
            self._backend_failed(prefix, exc)
            raise BackendUnavailable(f"Redis unreachable scanning {prefix!r}*: {exc}") from exc
        ordered = sorted(names)
        for start in range(0, len(ordered), SCAN_BATCH):
            await self.invalidate(*ordered[start : start + SCAN_BATCH])
        return len(ordered)

    @asynccontextmanager
    async def write(self, *names: str, timeout: float | None = None) -> AsyncIterator[None]:
        """The write path around a database update and commit: write locks in one
        global order, invalidate, the body, invalidate again (also if the body
        raised or was cancelled), release."""
        self._binding.check()
        ordered = sorted(set(names))
        if not ordered:
            raise ValueError("write() needs at least one key name")
        closed = self._circuit_open(f"writing {', '.join(map(repr, ordered))}")
        if closed is not None:
            raise closed
        holder = current_task()  # the exit may run in another task
        held: list[AsyncTwoTierRWLock] = []
        try:
            for name in ordered:
                lock = self.rwlock(name)
                await lock.acquire_write(timeout)
                held.append(lock)
            await self.invalidate(*ordered)
            try:
                yield
            except BaseException as body_error:
                try:
                    await _shielded(self.invalidate(*ordered))
                except Exception as closing_error:
                    add_note(body_error, closing_failed_note(ordered, closing_error))
                raise
            # The body is done (committed): a cancellation now must not skip this.
            await _shielded(self.invalidate(*ordered))
        finally:
            if held:  # all of them, in one task: cancelled again, it still goes on
                await _shielded(_release_writes(held, holder))

    async def aclose(self) -> None:
        """Stop background work (L1 listener, refresh tasks); the client stays open."""
        self._closed = True
        if self._l1 is not None:
            self._l1.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the read path -----------------------------------------------------------------

    async def _lead(
        self,
        name: str,
        flight: Flight,
        load: Callable[[], Any],
        ttl: float,
        none_ttl: float | Missing | None,
        start: float,
    ) -> tuple[Any, int]:
        if not self._breaker.allow():
            return await self._bypass(name, load, None), self._flights.seal(flight)
        l1_seen = self._l1_seen() if self._l1 is not None else None  # before the GET
        sealed = flight.generation  # flights are born sealed for this first GET
        raw: Any
        try:
            raw = await self.client.get(value_key(self.namespace, name))
        except REDIS_DOWN as exc:
            return await self._bypass(name, load, exc), self._flights.seal(flight)
        except redis.ResponseError as exc:  # e.g. WRONGTYPE: someone else's key
            raw = exc
        self._breaker.success()
        served, entry = self._served(name, raw, l1_seen, load, ttl, none_ttl)
        if served:
            return entry.value, sealed  # type: ignore[union-attr]
        self._stats.count("misses", name)
        try:
            outcome, valid_below = await self._fill(
                name,
                load,
                ttl,
                none_ttl,
                refresh=False,
                stale=entry,
                seal=lambda: self._flights.seal(flight),
                budget=self.settings.wait_timeout - (self._timer() - start),
            )
        except BackendUnavailable as exc:  # raised before any load ran
            return await self._bypass(name, load, exc), self._flights.seal(flight)
        self._keep_filled(name, outcome, l1_seen, ttl)
        return outcome.value, valid_below

    async def _reread_for_late_followers(
        self, name: str, flight: Flight, value: Any, valid_below: int
    ) -> tuple[Any, int]:
        for _ in range(2):
            sealed = self._flights.seal(flight)
            try:
                entry = await self._fetch(name)
            except REDIS_DOWN:
                break
            if entry is None or self._clock() >= entry.expires_at:
                break  # invalidated again: late followers must load it themselves
            value, valid_below = entry.value, sealed
            if not flight.has_followers_from(sealed):
                break
        return value, valid_below

    async def _fetch(self, name: str) -> Entry | None:
        return self._decode(name, await aget_raw(self.client, value_key(self.namespace, name)))

    async def _bypass(self, name: str, load: Callable[[], Any], exc: BaseException | None) -> Any:
        self._refuse_bypass(name, exc)
        return (await arun_load(self._loads, name, load))[0]

    def _refresh_in_background(
        self, name: str, load: Callable[[], Any], ttl: float, none_ttl: float | Missing | None
    ) -> None:
        if self._closed:
            return
        flight, leader, _ = self._refreshes.join(name)
        if not leader:
            return  # this loop already refreshes it

        async def run() -> None:
            try:
                outcome, _ = await self._fill(
                    name, load, ttl, none_ttl, refresh=True, stale=None, background=True
                )
                if outcome.source == "loaded":
                    self._stats.count("early_refreshes", name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background refresh of %r failed", name)
            finally:
                self._refreshes.finish(name, flight)

        self._spawn(run(), "cacheguard-refresh")

    def _spawn(self, coro: Any, name: str) -> None:
        # In a context of its own: a background refresh is nobody's nested load, and
        # the caller's open database snapshots are not its snapshots.
        loop = asyncio.get_running_loop()
        task = contextvars.Context().run(loop.create_task, coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the fill ----------------------------------------------------------------------------

    async def _fill(
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
        return await self._drive(name, lock, load, flow, seal)

    async def _drive(
        self,
        name: str,
        lock: AsyncTwoTierRWLock,
        load: Callable[[], Any],
        flow: Generator[Step, Any, Outcome],
        seal: Callable[[], int] | None = None,
    ) -> tuple[Outcome, int]:
        return await drive_fill_async(
            flow,
            client=self.client,
            lock=lock,
            loads=self._loads,
            name=name,
            load=load,
            seal=seal if seal is not None else _valid_for_all,
        )

    # -- L1 ------------------------------------------------------------------------------

    def _listen_l1(self, timeout: float) -> Listener | None:
        """Subscribe in a task of the running loop (none yet: on first use)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        if not any(t.get_name() == "cacheguard-l1" for t in self._tasks):
            self._spawn(self._subscribe_l1(timeout), "cacheguard-l1")
        return None

    async def _subscribe_l1(self, timeout: float) -> None:
        l1 = self._l1
        assert l1 is not None
        try:
            listener = await async_notifier_for(self.client).listen(
                self._invalidation.l1_channel,
                l1.on_message,
                timeout=max(timeout, 5.0),
                on_gap=l1.on_gap,
            )
        except Exception as exc:  # L1 keeps nothing until a later use subscribes
            log.warning("L1 invalidation feed not subscribed: %s", exc)
            return
        l1.attach(listener)


def _valid_for_all() -> int:
    return VALID_FOR_ALL


async def _release_writes(held: list[AsyncTwoTierRWLock], holder: asyncio.Task[Any]) -> None:
    for lock in reversed(held):
        try:
            await lock.release_write(holder=holder)
        except Exception:
            log.exception("releasing the write lock of %r failed", lock.name)


async def _shielded(call: Any) -> Any:
    """Run ``call`` to its end even if the caller is cancelled meanwhile (a closing
    invalidation, a release); the cancellation goes on once it is done."""
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait((task,))
        if not task.cancelled() and task.exception() is not None:
            log.warning("while cancelled: %s", task.exception())
        raise
