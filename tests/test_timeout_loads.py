"""Timeouts do not stampede: under ``on_timeout="load"``, the callers of a process
whose waits for a key timed out share one unlocked load of it at a time (see
``cacheguard/cache/outage/shared_loads.py``), on the real Redis, with real threads,
tasks and processes. The waits are made to time out by a writer holding the key
(a fill cannot begin) or by a loader slower than ``wait_timeout``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from cacheguard import CacheGuard, RecursiveLoadError
from cacheguard.aio import AsyncCacheGuard
from tests import cache_workers
from tests.guard_drivers import KINDS, Guard, guards_on
from tests.helpers import run_threads, wait_until
from tests.procs import CTX, run_processes
from tests.test_review_guard import in_this_task

Make = Callable[..., Guard]


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    # Every call of the sync guard is a thread of the loop's executor: enough for all at once.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))
    async with guards_on(request.param, redis_url, namespace=namespace, ttl_jitter=0) as build:
        yield build


class Interrupted(BaseException):
    """Not an Exception, as KeyboardInterrupt (which would also stop the test's loop)."""


class Counted:
    """A loader that returns its call's number (1, 2, ...). The calls numbered in
    ``held`` hold until the test opens them (blocking in a worker thread, awaiting
    on the loop); those in ``fails`` then raise their error instead."""

    def __init__(self, *held: int, fails: dict[int, BaseException] | None = None) -> None:
        self.gates = {number: threading.Event() for number in held}
        self.running = {number: threading.Event() for number in held}
        self.fails = fails or {}
        self.calls = 0
        self.tasks: list[asyncio.Task[Any] | None] = []  # the task of each call
        self._mutex = threading.Lock()

    def open(self, *numbers: int) -> None:
        """Let the held calls ``numbers`` (all, without any) return."""
        for number in numbers or self.gates:
            self.gates[number].set()

    def __call__(self) -> Any:
        with self._mutex:
            self.calls += 1
            number = self.calls
        try:
            self.tasks.append(asyncio.current_task())
        except RuntimeError:  # a worker thread of the sync guard
            self.tasks.append(None)
            if number in self.gates:
                self.running[number].set()
                assert self.gates[number].wait(30), "the test never let the load return"
            return self._outcome(number)
        if number not in self.gates:
            return self._outcome(number)
        self.running[number].set()
        return self._held(number)

    async def _held(self, number: int) -> Any:
        opened = await asyncio.to_thread(self.gates[number].wait, 30)
        assert opened, "the test never let the load return"
        return self._outcome(number)

    def _outcome(self, number: int) -> Any:
        if number in self.fails:
            raise self.fails[number]
        return number


def members(guard: Guard) -> int:
    """How many callers take the outcome of the key's running shared load."""
    wave = guard.guard._state.shared_loads._loading.get("k")
    return 0 if wave is None else wave.members


async def eventually(predicate: Callable[[], object], what: str) -> None:
    assert await asyncio.to_thread(wait_until, predicate, 10), what


class Calls:
    """Calls of ``guard.get_or_load("k", load)`` (threads of the sync guard, tasks of
    the asyncio one); on leaving, whatever happened, the loads are let return and
    every call is waited for, so no call outlives its test."""

    def __init__(self, guard: Guard, load: Counted) -> None:
        self.guard, self.load = guard, load
        self.made: list[asyncio.Future[Any]] = []

    def ask(self, count: int) -> list[asyncio.Future[Any]]:
        """``count`` calls at once."""
        calls = [
            asyncio.ensure_future(self.guard.get_or_load("k", self.load, ttl=60))
            for _ in range(count)
        ]
        self.made += calls
        return calls

    async def __aenter__(self) -> Calls:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.load.open()
        await asyncio.wait_for(asyncio.gather(*self.made, return_exceptions=True), 30)


# -- sharing, and what a caller may share ------------------------------------------------------


@pytest.mark.slow
async def test_timed_out_callers_share_one_load_and_later_ones_the_next(make: Make) -> None:
    writer, reader = make(), make(wait_timeout=0.3)
    load = Counted(1)
    # No fill can begin while the writer holds the key: every reader's wait times out.
    async with Calls(reader, load) as calls, writer.write("k"):
        early = calls.ask(6)
        await eventually(load.running[1].is_set, "no shared load began")
        # These calls begin after the running load began: a write may have committed
        # between, so its value is not theirs. They gather behind it.
        late = calls.ask(6)
        await eventually(lambda: reader.stats().wait_timeouts == 12, "the waits did not end")
        assert load.calls == 1  # one load in flight for all twelve
        load.open(1)
        early_values = await asyncio.gather(*early)
        late_values = await asyncio.gather(*late)
    assert late_values == [2] * 6  # one new load for all of them, never the older one
    # Callers whose call began before the first load began share it; a thread or task
    # that a busy machine started late gathers with the late ones (then the second).
    assert set(early_values) <= {1, 2}
    assert 1 in early_values
    assert load.calls == 2
    stats = reader.stats()
    assert (stats.loads, stats.shared_timeout_loads) == (2, 10)
    assert len(reader.guard._state.shared_loads) == 0


@pytest.mark.slow
async def test_a_loaders_error_is_shared_with_the_callers_of_its_load(make: Make) -> None:
    writer, reader = make(), make(wait_timeout=0.3)
    load = Counted(1, fails={1: ZeroDivisionError("database down")})
    async with Calls(reader, load) as calls, writer.write("k"):
        callers = calls.ask(5)
        await eventually(lambda: reader.stats().wait_timeouts == 5, "the waits did not end")
        load.open(1)
        results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(result, ZeroDivisionError) for result in results), results
    assert load.calls == 1  # a failing database is not asked again by each caller
    assert reader.stats().shared_timeout_loads == 4
    assert len(reader.guard._state.shared_loads) == 0


@pytest.mark.slow
async def test_the_callers_of_an_interrupted_load_go_on_without_it(make: Make) -> None:
    """The runner of the shared load is interrupted (its task cancelled, or its
    thread's loader raising a BaseException): none of its callers inherits that,
    none hangs, and one load serves them all."""
    writer, reader = make(), make(wait_timeout=0.3)
    load = Counted(1, 2, fails={1: Interrupted()})
    async with Calls(reader, load) as calls, writer.write("k"):
        callers = calls.ask(5)
        await eventually(lambda: reader.stats().wait_timeouts == 5, "the waits did not end")
        assert members(reader) == 5
        runner = load.tasks[0]
        if runner is not None:
            runner.cancel()
        else:
            load.open(1)  # the held load raises Interrupted in its thread
        await eventually(load.running[2].is_set, "nobody loaded in the runner's place")
        await eventually(lambda: members(reader) == 4, "its callers did not go on")
        load.open(2)
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), 20)
    stopped = (asyncio.CancelledError, Interrupted)
    assert sum(isinstance(result, stopped) for result in results) == 1, results
    assert sorted(r for r in results if not isinstance(r, BaseException)) == [2] * 4
    assert load.calls == 2
    assert len(reader.guard._state.shared_loads) == 0


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
async def test_loaders_reading_each_others_keys_do_not_wait_forever(make: Make) -> None:
    """Loader a reads key b and loader b reads key a, both called at once while the
    keys' fills are held off: each caller's shared load would wait for the other's.
    A load running max_load_time is presumed hung, so both calls end (with the
    cycle's own error: a loader would read the key it is loading) instead of hanging."""
    writer, reader = make(), make(wait_timeout=0.2, max_load_time=1.0)
    inside = {"a": threading.Event(), "b": threading.Event()}
    guard = reader.guard

    def loader(mine: str, other: str) -> Callable[[], Any]:
        if isinstance(guard, CacheGuard):

            def load() -> Any:
                inside[mine].set()
                assert inside[other].wait(10)
                return guard.get_or_load(other, loader(other, mine), ttl=60)

            return load

        async def aload() -> Any:
            inside[mine].set()
            assert await asyncio.to_thread(inside[other].wait, 10)
            return await guard.get_or_load(other, loader(other, mine), ttl=60)

        return aload

    async with writer.write("a", "b"):
        calls = [
            asyncio.ensure_future(reader.get_or_load(key, loader(key, other), ttl=60))
            for key, other in ("ab", "ba")
        ]
        _, waiting = await asyncio.wait(calls, timeout=20)
        if waiting:  # they wait for each other: end the loads they wait for, so the test ends
            shared = guard._state.shared_loads
            for key, wave in list(shared._loading.items()):
                shared.finish(key, wave, interrupted=True)
        results = await asyncio.gather(*calls, return_exceptions=True)
    assert not waiting, "the calls waited for each other's loads for good"
    assert [type(result) for result in results] == [RecursiveLoadError] * 2, results
    assert len(guard._state.shared_loads) == 0


# -- a writer's own load is never shared ---------------------------------------------------------


def sync_guard(redis_url: str, namespace: str) -> CacheGuard:
    return CacheGuard(
        redis.Redis.from_url(redis_url, socket_timeout=10),
        namespace=namespace,
        ttl_jitter=0,
        wait_timeout=0.3,
    )


def async_guard(redis_url: str, namespace: str) -> AsyncCacheGuard:
    return AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url, socket_timeout=10),
        namespace=namespace,
        ttl_jitter=0,
        wait_timeout=0.3,
    )


def test_a_sync_writers_read_during_a_shared_load_is_its_own(
    redis_url: str, namespace: str
) -> None:
    """Readers of the writer's own process time out on its write lock and share a
    load (held here). The writer reading the key meanwhile loads its own view at
    once: it neither waits behind their load nor takes its value."""
    guard = sync_guard(redis_url, namespace)
    shared = Counted(1)
    got: dict[str, Any] = {}
    in_write, writer_read = threading.Event(), threading.Event()

    def writer() -> None:
        with guard.write("k"):
            in_write.set()
            assert shared.running[1].wait(10), "the readers' shared load never began"
            got["writer"] = guard.get_or_load("k", lambda: "uncommitted", ttl=60)
            writer_read.set()

    def reader(index: int) -> None:
        got[index] = guard.get_or_load("k", shared, ttl=60)

    holding = threading.Thread(target=writer)
    readers = threading.Thread(target=run_threads, args=(3, reader))
    try:
        holding.start()
        assert in_write.wait(10)
        readers.start()
        assert writer_read.wait(10), "the writer's read waited for the readers' load"
        assert got["writer"] == "uncommitted"
        assert wait_until(lambda: guard.stats().wait_timeouts == 3, 10)
        shared.open()
        readers.join(10)
        assert [got[i] for i in range(3)] == [1, 1, 1]  # theirs, not the writer's view
        assert shared.calls == 1
    finally:
        shared.open()
        holding.join(10)
        readers.join(10)
        guard.close()
        guard.client.close()


def test_readers_never_take_a_sync_writers_private_load(redis_url: str, namespace: str) -> None:
    """The writer's own load (held here) runs while readers of its process time out:
    they share a load of their own, without waiting for the writer's."""
    guard = sync_guard(redis_url, namespace)
    private = Counted(1)
    got: dict[str, Any] = {}

    def writer() -> None:
        with guard.write("k"):
            got["writer"] = guard.get_or_load("k", private, ttl=60)

    def reader(index: int) -> None:
        got[index] = guard.get_or_load("k", lambda: "committed", ttl=60)

    holding = threading.Thread(target=writer)
    readers = threading.Thread(target=run_threads, args=(3, reader))
    try:
        holding.start()
        assert private.running[1].wait(10), "the writer's load never began"
        readers.start()
        readers.join(10)
        assert not readers.is_alive(), "the readers waited for the writer's private load"
        assert [got[i] for i in range(3)] == ["committed"] * 3
        private.open()
        holding.join(10)
        assert got["writer"] == 1
    finally:
        private.open()
        holding.join(10)
        readers.join(10)
        guard.close()
        guard.client.close()


async def test_an_async_writers_read_during_a_shared_load_is_its_own(
    redis_url: str, namespace: str
) -> None:
    guard = async_guard(redis_url, namespace)
    shared = Counted(1)
    readers: list[asyncio.Future[Any]] = []
    try:
        async with guard.write("k"):
            readers += [
                asyncio.ensure_future(guard.get_or_load("k", shared, ttl=60)) for _ in range(3)
            ]
            await eventually(shared.running[1].is_set, "the readers' shared load never began")
            mine = guard.get_or_load("k", lambda: "uncommitted", ttl=60)
            assert await in_this_task(mine, 10) == "uncommitted"
            await eventually(lambda: guard.stats().wait_timeouts == 3, "the waits did not end")
            shared.open()
            assert await asyncio.gather(*readers) == [1, 1, 1]
        assert shared.calls == 1
    finally:
        shared.open()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await guard.aclose()
        await guard.client.aclose()


async def test_readers_never_take_an_async_writers_private_load(
    redis_url: str, namespace: str
) -> None:
    guard = async_guard(redis_url, namespace)
    private = Counted(1)

    async def writer() -> Any:
        async with guard.write("k"):
            return await guard.get_or_load("k", private, ttl=60)

    holding = asyncio.ensure_future(writer())
    readers: list[asyncio.Future[Any]] = []
    try:
        await eventually(private.running[1].is_set, "the writer's load never began")
        readers += [
            asyncio.ensure_future(guard.get_or_load("k", lambda: "committed", ttl=60))
            for _ in range(3)
        ]
        _, pending = await asyncio.wait(readers, timeout=10)
        assert not pending, "the readers waited for the writer's private load"
        assert [reader.result() for reader in readers] == ["committed"] * 3
        private.open()
        assert await holding == 1
    finally:
        private.open()
        for task in [holding, *readers]:
            task.cancel()
        await asyncio.gather(holding, *readers, return_exceptions=True)
        await guard.aclose()
        await guard.client.aclose()


# -- processes -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_slow_database_sees_a_few_loads_not_one_per_caller(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """4 processes x 8 threads read one cold key with a loader (1.5 s) far slower than
    wait_timeout (0.3 s): every caller but the filler times out. Before sharing,
    each loaded without the lock: 32 loads for 32 callers.

    The bound: the one locked fill across processes (the begin script grants one),
    plus per process one unlocked load shared by every caller whose call began before
    it began, plus at most one more shared by the callers whose calls began after it
    (a thread the machine started late; they gather into one next load). A third
    would need a call to begin a whole load after the barrier.
    """
    processes, threads = 4, 8
    barrier = CTX.Barrier(processes * threads)
    results = run_processes(
        cache_workers.timed_out_stampede_worker,
        [(redis_url, namespace, threads, 1.5, 0.3, barrier)] * processes,
    )
    loads = int(client.get(f"{namespace}:loads") or 0)
    print(f"\n{processes} x {threads} callers, 1.5 s loader, wait_timeout 0.3 s: {loads} loads")
    assert sum(len(r["values"]) for r in results) == processes * threads
    assert loads <= 1 + 2 * processes
    # Most callers timed out and took a load another caller ran for them.
    counted = {kind: sum(r["stats"][kind] for r in results) for kind in results[0]["stats"]}
    assert counted["wait_timeouts"] >= processes * threads // 2
    assert counted["shared_timeout_loads"] >= processes * threads // 2
