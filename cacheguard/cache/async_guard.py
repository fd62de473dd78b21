"""AsyncCacheGuard: the read-through cache and its write path on asyncio.

The twin of :class:`cacheguard.CacheGuard`, on the same
:class:`~cacheguard.cache.flows.state.GuardState` and the same fill flow, with awaits:

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
import inspect
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import redis
import redis.asyncio

from cacheguard._loop import LoopBinding
from cacheguard.cache import typed
from cacheguard.cache.async_batch_driver import AsyncBatchDriver
from cacheguard.cache.async_driver import Deferral, arun_load, drive_fill_async
from cacheguard.cache.batch_driver import Batch, value_of
from cacheguard.cache.driver import backend_down, is_loader, lookup_failed
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
from cacheguard.cache.settings import GuardSettings, client_options
from cacheguard.cache.stats import EventHook, Stats
from cacheguard.cache.write_locks import (
    AsyncStoreWriteLock,
    WriteLockStore,
    async_store_write_locks,
)
from cacheguard.checks import Seconds, check_int
from cacheguard.codecs import ValueType, value_type
from cacheguard.locks.async_local import current_task
from cacheguard.locks.async_two_tier import AsyncLockFactory, AsyncTwoTierRWLock
from cacheguard.redis.async_notifier import aclose_notifiers_of, async_notifier_for
from cacheguard.redis.async_scripts import aclose_node_clients, arun_pipelined
from cacheguard.redis.clients import (
    AsyncClient,
    aclose_async_client,
    async_client_from_url,
    check_async_client,
    direct_aget,
    node_namer,
    replicas_expected,
)
from cacheguard.redis.errors import REDIS_DOWN, classify
from cacheguard.redis.keys import ResourceKeys

__all__ = ["AsyncCacheGuard"]

log = logging.getLogger("cacheguard")

T = TypeVar("T")


class AsyncCacheGuard:
    """A read-through cache on Redis for asyncio: each missing key loaded once,
    by one task of one process, while every other caller awaits its value.

    The settings are :class:`~cacheguard.cache.settings.GuardSettings`' (those of
    :class:`~cacheguard.CacheGuard`, as are ``on_event``, ``write_locks`` and
    ``gutter``: here an asyncio client or a URL); ``load`` functions may be
    ``async def`` or plain functions (a plain one runs on the loop: keep it quick).

    Every duration is seconds or a ``datetime.timedelta``, as for
    :class:`~cacheguard.CacheGuard`. The guard is an async context manager:
    ``async with AsyncCacheGuard.from_url(url) as guard:`` closes it on exit
    (:meth:`aclose`: what the guard made, never a client passed in).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        on_event: Callable[[Any], None] | None = None,
        write_locks: WriteLockStore | None = None,
        gutter: AsyncClient | str | None = None,
        timer: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        **settings: Any,
    ) -> None:
        check_async_client(client, "AsyncCacheGuard")
        config = GuardSettings(**settings)
        if gutter is not None and not isinstance(gutter, str):
            check_async_client(gutter, "AsyncCacheGuard's gutter")
        self._state = GuardState(
            config,
            on_event=on_event,
            timer=timer,
            clock=clock,
            rng=rng,
            flight_event=asyncio.Event,
            front="AsyncCacheGuard",
            run_in_background=weakly(self._start_background),
            locks=AsyncLockFactory(
                client,
                namespace=config.namespace,
                lease=config.lease,
                timeout=config.wait_timeout,
                timer=timer,
                cohort_limit=config.cohort_limit,
            ),
            store_write_lock=async_store_write_locks(write_locks),
            node_of=node_namer(client),
            replicas=replicas_expected(client),
        )
        self.client = client
        self._binding = LoopBinding("this AsyncCacheGuard")
        self._tasks: set[asyncio.Task[Any]] = set()  # background refreshes, L1 subscribing
        if config.l1_maxsize:
            # Subscribed on first use, from inside the loop.
            self._state.l1 = L1Feed(
                LocalTier(maxsize=config.l1_maxsize, ttl=config.l1_ttl, timer=timer),
                self._listen_l1,
            )
        if gutter is not None:
            settings = gutter_settings(config)
            self._state.gutter = (
                AsyncCacheGuard.from_url(gutter, timer=timer, clock=clock, rng=rng, **settings)
                if isinstance(gutter, str)
                else AsyncCacheGuard(gutter, timer=timer, clock=clock, rng=rng, **settings)
            )  # see cacheguard/cache/outage/gutter.py; closed with this guard
            gutter_guard_made(self._state.gutter, self._state.recorder)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: Seconds = 1.0,
        socket_timeout: Seconds = 2.0,
        max_connections: int | None = None,
        **settings: Any,
    ) -> AsyncCacheGuard:
        """A guard on a new ``redis.asyncio`` client for ``url``; the client options
        are :meth:`CacheGuard.from_url`'s (fail fast, no client retries).

        The pool of one server (or Sentinel master) holds at most ``max_connections``
        (default 64) and makes a task wait for a free one (up to ``socket_timeout``)
        rather than fail: hundreds of tasks may call at once, and a refused
        connection would count as Redis being down. redis-py's cluster client does
        not queue tasks: there the limit is per node and defaults to 1,024.

        The guard owns the client: :meth:`aclose` (or leaving an ``async with``
        block) closes it, with every connection, pool and sentinel client it made."""
        if max_connections is not None:
            check_int("max_connections", max_connections, minimum=1)
        client = async_client_from_url(
            url, client_options(connect_timeout, socket_timeout), max_connections
        )
        guard = cls(client, **settings)  # (refused: the client never connected, holds nothing)
        guard._state.owns_client = True
        get = direct_aget(client)
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

    def rwlock(self, name: str) -> AsyncTwoTierRWLock:
        """The two-tier read-write lock of resource ``name`` (shared in this loop)."""
        return self._state.rwlock(name)  # type: ignore[no-any-return]

    def write_lock(self, name: str) -> AsyncTwoTierRWLock | AsyncStoreWriteLock:
        """The lock ``write`` and the SQLAlchemy hooks take for ``name``: the two-tier
        lock, or the ``write_locks`` store's (an asyncio store: its calls are awaited)."""
        return self._state.write_lock(name)  # type: ignore[no-any-return]

    async def get_or_load(
        self,
        name: str,
        load: Callable[[], Any],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> Any:
        """The cached value of ``name``, loaded by ``load()`` once if missing
        (``ttl``, ``none_ttl``: seconds or a ``timedelta``; ``type``: see
        :meth:`CacheGuard.get_or_load`)."""
        if type is not None:
            return await typed.aget_or_load(
                self, value_type(type), name, load, ttl=ttl, none_ttl=none_ttl, template=template
            )
        return await self._get_or_load(name, load, ttl, none_ttl, template, None)

    async def _get_or_load(
        self,
        name: str,
        load: Callable[[], Any],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        template: str | None,
        fits: Callable[[Any], bool] | None,
    ) -> Any:
        """:meth:`get_or_load`; ``fits`` as for :meth:`CacheGuard._get_or_load`."""
        self._binding.check()
        # template: labels the call's events (see CacheGuard.get_or_load)
        name = self._state.key_name(name)
        state = self._state  # a local: the hit path reads it often
        # Checked before the hit path leads the key's flight: a refusal leaves none open.
        call = read_call(state, name, load, ttl, none_ttl, template, fits)
        # Traced as CacheGuard.get_or_load is: in this task's context, so spans the
        # caller has current are the call's parents.
        tracer = state.tracer
        trace = None if tracer is None else tracer.begin("get_or_load", template)
        try:
            lead = hit_lead(state, call)
            if lead is None:
                return await self._run(read(state, call), name)
            # The hit path, as CacheGuard.get_or_load's (see cache/flows/read.py).
            direct, client = state.direct_get, self.client
            get = direct[1] if direct is not None and direct[0] is client else client.get
            try:
                raw, error = await get(value_key(state.namespace, name)), None
            except BaseException as exc:
                raw, error = lookup_failed(name, exc)
            value, rest = hit(state, call, lead, raw, error)
            if rest is None:
                return value
            return await self._run(rest, name)
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            raise
        finally:
            if trace is not None:
                trace.end()

    async def get_or_load_many(
        self,
        names: Iterable[str],
        load_many: Callable[[list[str]], Any],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> dict[str, Any]:
        """:meth:`CacheGuard.get_or_load_many <cacheguard.CacheGuard.get_or_load_many>`,
        awaited: ``load_many`` may be an ``async def`` (awaited) or a plain function."""
        self._binding.check()
        values = None if type is None else value_type(type)
        return await self._get_or_load_many(names, load_many, ttl, none_ttl, template, values)

    async def _get_or_load_many(
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
            async def load() -> Any:
                answer = load_many([name])
                if inspect.isawaitable(answer):
                    answer = await answer
                return value_of(answer, name)

            return load

        def load_one(name: str) -> Callable[[], Any]:
            load = loaded_alone(name)
            return load if values is None else typed.adumping(values, load)

        batch = Batch(state, names, load_many, load_one, ttl, none_ttl, template, values)
        if not batch.calls:
            return {}
        # Traced as get_or_load is: one span for the batch, its outcome the furthest any
        # name went (cache/tracing.py); untraced, two None checks.
        tracer = state.tracer
        trace = None if tracer is None else tracer.begin("get_or_load_many", template)
        try:
            return await self._read_many(batch, ttl, none_ttl, template, values, loaded_alone)
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            raise
        finally:
            if trace is not None:
                trace.end()

    async def _read_many(
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
        driver = AsyncBatchDriver(state, self.client, batch, self._run, self._answer)
        due: list[Read] = []  # served, due for a refresh: refreshed together
        result, unfit = batch.result(await driver.drive(batch_read(state, batch.calls, due)))
        if due:
            self._refresh_many(batch, due)
        if values is not None:  # names shared by an untyped read here: loaded again
            for name in unfit:
                result[name] = await typed.arefresh(
                    self,
                    values,
                    name,
                    loaded_alone(name),
                    ttl=ttl,
                    none_ttl=none_ttl,
                    template=template,
                )
        return result

    async def peek(
        self,
        name: str,
        *,
        template: str | None = None,
        type: Any = None,
    ) -> Any:
        """The cached value of ``name`` or :data:`MISSING`; never loads, never locks.
        With ``type``, as that type (:data:`MISSING` if the data does not fit it)."""
        if type is not None:
            return await typed.apeek(self, value_type(type), name, template=template)
        self._binding.check()
        name = self._state.key_name(name)
        return await self._traced("peek", template, peek_flow(self._state, name, template), name)

    async def peek_entry(self, name: str) -> Entry | None:
        """The stored entry of ``name`` even past its logical expiry, or None."""
        self._binding.check()
        name = self._state.key_name(name)
        return await self._run(peek_entry_flow(self._state, name), name)  # type: ignore[no-any-return]

    async def refresh(
        self,
        name: str,
        load: Callable[[], Any],
        *,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        template: str | None = None,
        type: Any = None,
    ) -> Any:
        """Load ``name`` now (under its locks, once across processes) and store it;
        ``on_backend_error`` applies as for reads; ``type`` as for :meth:`get_or_load`."""
        if type is not None:
            return await typed.arefresh(
                self, value_type(type), name, load, ttl=ttl, none_ttl=none_ttl, template=template
            )
        self._binding.check()
        name = self._state.key_name(name)
        flow = refresh_flow(
            self._state, read_call(self._state, name, load, ttl, none_ttl, template)
        )
        return await self._traced("refresh", template, flow, name)

    async def watermark(self) -> int:
        """The namespace's invalidation sequence now (see :meth:`CacheGuard.watermark`)."""
        self._binding.check()
        self._state.check_open()
        return await self._run(watermark_flow(self._state), "the watermark")  # type: ignore[no-any-return]

    async def invalidate(self, *names: str, template: str | None = None) -> None:
        """Stamp ``names`` with the next invalidation number and delete them, without
        taking locks (see :meth:`CacheGuard.invalidate`)."""
        self._binding.check()
        names = self._state.key_names(names)
        flow = invalidate_flow(self._state, names, template=template)
        await self._traced("invalidate", template, flow, ", ".join(names))

    async def invalidate_prefix(self, prefix: str) -> int:
        """Invalidate every key whose name starts with ``prefix`` (a SCAN; see
        :meth:`CacheGuard.invalidate_prefix`); returns how many."""
        self._binding.check()
        prefix = self._state.key_prefix(prefix)
        flow = invalidate_prefix_flow(self._state, prefix)
        return await self._traced("invalidate_prefix", None, flow, f"{prefix}*")  # type: ignore[no-any-return]

    def note_written(self, *names: str, prefix: str | None = None) -> None:
        """Tell the guard that ``names`` (and every name under ``prefix``) were just
        written in Redis by other means than its own calls: later calls neither
        wait for nor share a load of them under way (see
        :meth:`CacheGuard.note_written`). Not awaited: no I/O; callable from any
        thread (the Django backend's sync writes tell every loop's guard)."""
        self._state.note_written(names, prefix)

    @asynccontextmanager
    async def write(self, *names: str, timeout: Seconds | None = None) -> AsyncIterator[None]:
        """The write path around a database update and commit: write locks in one
        global order, invalidate, the body, invalidate again (also if the body
        raised or was cancelled), release; then :class:`LockLostError` if a lock
        was lost meanwhile (see :meth:`CacheGuard.write`)."""
        self._binding.check()
        names = self._state.key_names(names)
        flow = write_flow(self._state, names, timeout, current_task())  # the exit may run elsewhere
        await self._run(flow, "the write")  # up to the body; raising, it holds nothing
        try:
            yield
        except BaseException as body_error:
            await self._run(flow, "the write", error=body_error, to_the_end=True)
            raise
        # The body is done (committed): a cancellation now must not skip the rest.
        await self._run(flow, "the write", to_the_end=True)

    async def aclose(self) -> None:
        """Stop background work (L1 listener, refresh tasks: cancelled and awaited)
        and close what the guard made: the client ``from_url`` made, with its
        connections, pools and release-notification listener. A client passed in is
        left open (it is yours). Closing again does nothing.

        Afterwards every call that would talk to Redis raises :class:`GuardClosed`."""
        if self._state.closed:
            return
        self._state.closed = True
        if self._state.l1 is not None:
            self._state.l1.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._state.gutter is not None:
            await self._state.gutter.aclose()
        if self._state.owns_client:
            await aclose_notifiers_of(self.client)
            await aclose_node_clients(self.client)  # a cluster's per-node pipelines
            await aclose_async_client(self.client)

    async def __aenter__(self) -> AsyncCacheGuard:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the driver: every step of the flows, carried out with awaits -----------------------

    async def _traced(
        self, operation: str, template: str | None, flow: Generator[Any, Any, Any], name: str
    ) -> Any:
        """:meth:`_run` of a public call's ``flow``, traced as ``operation`` when the
        guard has a tracer (see :mod:`cacheguard.cache.tracing`)."""
        tracer = self._state.tracer
        if tracer is None:
            return await self._run(flow, name)
        trace = tracer.begin(operation, template)
        try:
            return await self._run(flow, name)
        except BaseException as exc:
            trace.failed(exc)
            raise
        finally:
            trace.end()

    async def _run(
        self,
        flow: Generator[Any, Any, Any],
        name: str,
        *,
        error: BaseException | None = None,
        to_the_end: bool = False,
    ) -> Any:
        """Resume ``flow`` (with ``error`` thrown in, if given) and carry out its steps
        until it returns (its value) or asks for the caller's ``with`` block; closed
        unless suspended there. With ``to_the_end``, and for releases, a cancellation
        waits for the flow's end."""
        deferral: Deferral | None = None  # made on the first step that must run through
        step: Any = None
        try:
            step = flow.send(None) if error is None else flow.throw(error)
            while step is not BODY:
                try:
                    if step.__class__ is Lookup:  # the hit path's one step, inline
                        reply = await self.client.get(value_key(self._state.namespace, name))
                    elif to_the_end or isinstance(step, ReleaseWrites):
                        deferral = deferral or Deferral()
                        reply = await deferral.through(self._answer(step, name))
                    else:
                        reply = await self._answer(step, name)
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
            if deferral is not None and deferral.cancelled:
                raise asyncio.CancelledError from None
            return done.value
        finally:
            if step is not BODY:
                flow.close()
        if deferral is not None and deferral.cancelled:
            raise asyncio.CancelledError
        return None

    async def _answer(self, step: Any, name: str) -> Any:
        client = self.client
        if isinstance(step, RunFill):
            return await drive_fill_async(
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
            return await step.flight.wait_async(step.timeout)
        if isinstance(step, LoadNow):
            call = step.call
            return (await arun_load(self._state.loads, call.name, call.load, call.template))[0]
        if isinstance(step, Gutter):
            call = step.call
            return await self._state.gutter.get_or_load(
                call.name, call.load, ttl=step.ttl, none_ttl=step.none_ttl, template=call.template
            )
        if isinstance(step, Replay):
            return await self._state.recovery.arun()
        if isinstance(step, Command):
            return await client.execute_command(*step.args)
        if isinstance(step, Pipelined):
            return await arun_pipelined(client, list(step.calls), step.confirm)
        if isinstance(step, Call):
            script, keys, args = step.call
            return await script.acall(client, keys, args)
        if isinstance(step, Scan):
            return [key async for key in client.scan_iter(match=step.pattern, count=1000)]
        if isinstance(step, AcquireWrite):
            return await step.lock.acquire_write(step.timeout)
        if isinstance(step, ReleaseWrites):
            errors: list[Exception | None] = []
            for lock in reversed(step.locks):
                try:
                    await lock.release_write(holder=step.holder)
                except Exception as exc:  # the flow tells a lost lock from a failure
                    errors.append(exc)
                else:
                    errors.append(None)
            return errors[::-1]
        raise TypeError(f"not a guard step: {step!r}")

    def _start_background(self, flow: Generator[Any, Any, None], name: str) -> bool:
        self._spawn(self._run(flow, name), "cacheguard-refresh")
        return True

    def _refresh_many(self, batch: Batch, due: list[Read]) -> None:
        """Refresh a batch's ``due`` entries in a task, with one ``load_many``."""
        driver = AsyncBatchDriver(self._state, self.client, batch, self._run, self._answer)
        self._spawn(driver.drive(refresh_many(self._state, due)), "cacheguard-refresh")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        # In a context of its own: a background refresh is nobody's nested load, and
        # the caller's open database snapshots are not its snapshots. aclose()
        # cancels it (the SQLAlchemy outbox's poller is one too).
        loop = asyncio.get_running_loop()
        task = contextvars.Context().run(loop.create_task, coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        l1 = self._state.l1
        assert l1 is not None
        try:
            listener = await async_notifier_for(self.client).listen(
                self._state.invalidation.l1_channel,
                l1.on_message,
                timeout=max(timeout, 5.0),
                on_gap=l1.on_gap,
            )
        except Exception as exc:  # L1 keeps nothing until a later use subscribes
            log.warning("L1 invalidation feed not subscribed: %s", exc)
            return
        l1.attach(listener)
