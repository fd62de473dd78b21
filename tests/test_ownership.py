"""Holds follow the hold, not the thread (cacheguard/_identity.py).

Thread pools hand a ``with`` block's enter and exit to different worker threads
(ASGI servers run a sync dependency that way), reuse their threads for the next
request, and CPython reuses the ident of a thread that ended. None of that may
share or inherit a hold.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
import redis

from cacheguard import LockFactory, LockTimeout, RedisRWLock
from cacheguard.aio import AsyncLockFactory, AsyncRedisRWLock
from tests.helpers import make_guard, wait_until

T = TypeVar("T")


def in_pool(pool: ThreadPoolExecutor, call: Callable[..., T], *args: Any) -> T:
    """Run ``call`` on a worker as AnyIO and ``asyncio.to_thread`` do: in a copy of
    the caller's context."""
    return pool.submit(contextvars.copy_context().run, call, *args).result(timeout=30)


def _requests_through_a_pool(enter_exit: Callable[[], Any], requests: int = 8) -> dict[str, int]:
    """``requests`` read-modify-write requests, each entering its write block on a
    worker of a thread pool and leaving it on whichever is free then (as FastAPI
    runs a sync ``yield`` dependency), interleaved on an event loop: what they saw
    inside. The pool reuses an idle worker before it starts another, so requests
    enter on threads where earlier ones entered (enough workers that the waiting
    enters cannot starve the exits)."""
    seen = {"balance": 0, "inside": 0, "most_inside": 0}
    pool = ThreadPoolExecutor(max_workers=requests + 2)

    async def request(started: asyncio.Event) -> None:
        block = enter_exit()
        await asyncio.get_running_loop().run_in_executor(
            pool, contextvars.copy_context().run, block.__enter__
        )
        seen["inside"] += 1
        seen["most_inside"] = max(seen["most_inside"], seen["inside"])
        balance = seen["balance"]
        started.set()
        await asyncio.sleep(0.02)  # the body awaits: other requests run meanwhile
        seen["balance"] = balance + 1
        seen["inside"] -= 1
        await asyncio.get_running_loop().run_in_executor(
            pool, contextvars.copy_context().run, block.__exit__, None, None, None
        )

    async def main() -> None:
        tasks = []
        for _ in range(requests):
            started = asyncio.Event()
            tasks.append(asyncio.create_task(request(started)))
            await asyncio.sleep(0.005)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    return seen


def test_guard_write_excludes_requests_sharing_pool_threads(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace)
    seen = _requests_through_a_pool(lambda: guard.write("account:1", timeout=30))
    assert seen["most_inside"] == 1
    assert seen["balance"] == 8


def test_two_tier_write_excludes_requests_sharing_pool_threads(
    client: redis.Redis, namespace: str
) -> None:
    factory = LockFactory(client, namespace=namespace)
    seen = _requests_through_a_pool(lambda: factory.rwlock("account:1").write(timeout=30))
    assert seen["most_inside"] == 1
    assert seen["balance"] == 8


def test_nested_blocks_in_one_context_reenter_and_copies_carry_it(
    client: redis.Redis, namespace: str
) -> None:
    """Re-entry is by context: the block's own nested calls, and calls run in a copy
    of its context (to_thread), re-enter; a fresh thread does not."""
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with lock.write(timeout=5) as outer:
            assert lock.acquire_write(timeout=1) is outer  # nested: re-entry
            lock.release_write()
            inner = in_pool(pool, lambda: lock.acquire_write(timeout=1))
            assert inner is outer  # a copy of this context re-enters too
            in_pool(pool, lock.release_write)
            outsider = pool.submit(lock.try_acquire_write)  # a bare worker: no context
            assert outsider.result(timeout=10) is None
    finally:
        pool.shutdown()


def _end_thread_holding(take: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``take`` in a thread that ends without releasing; (its result, its ident)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(take()))
    thread.start()
    thread.join()
    assert thread.ident is not None
    return out[0], thread.ident


def test_ended_thread_neither_lends_its_hold_nor_keeps_it(
    client: redis.Redis, namespace: str
) -> None:
    """A thread that ended holding a two-tier write lock: its hold ends (local and in
    Redis), and a new thread, whatever its ident, gets a fresh hold of its own."""
    lock = LockFactory(client, namespace=namespace, lease=30).rwlock("k")
    first, _ident = _end_thread_holding(lambda: lock.acquire_write(timeout=5))
    gc.collect()
    got: list[Any] = []

    def later() -> None:
        got.append((threading.get_ident(), lock.acquire_write(timeout=10)))
        lock.release_write()

    thread = threading.Thread(target=later)
    thread.start()
    thread.join()
    _, second = got[0]
    assert second is not first
    assert second.token > first.token
    assert first.released  # the abandoned hold was given back in Redis
    assert lock.local.is_free()
    assert not client.exists(lock.remote.keys.lock)


def test_ident_reuse_does_not_inherit_a_store_hold(client: redis.Redis, namespace: str) -> None:
    """A store's lock taken without owner= by a thread that ended: a later thread
    (CPython hands out the dead thread's ident again) is another owner."""
    lock = RedisRWLock(client, "k", namespace=namespace, lease=30)
    held, ident = _end_thread_holding(lambda: lock.acquire_write(timeout=5))
    results: list[Any] = []
    for _ in range(20):  # until a thread gets the same ident (usually the first)
        thread = threading.Thread(
            target=lambda: results.append((threading.get_ident(), lock.try_acquire_write()))
        )
        thread.start()
        thread.join()
        if results[-1][0] == ident:
            break
    assert all(handle is None for _, handle in results)
    held.release()


@pytest.mark.slow
def test_a_dropped_store_hold_is_given_back_not_renewed(
    client: redis.Redis, namespace: str
) -> None:
    """A thread that ended holding a RedisRWLock it never released (nothing references
    the handle any more): the watchdog gives the hold back at its next renewal."""
    # A lease a loaded machine still renews in time (renewed every second): with
    # renewals late by a lease, the hold would lapse unreleased and prove nothing.
    lock = RedisRWLock(client, "k", namespace=namespace, lease=3.0)
    dropped: list[Any] = []
    held: list[int] = []

    def take_and_drop() -> None:
        handle = lock.acquire_write(timeout=5)
        held.append(client.exists(lock.keys.lock))  # taken (seen before it is dropped)
        dropped.append(weakref.ref(handle))

    thread = threading.Thread(target=take_and_drop)
    thread.start()
    thread.join()
    gc.collect()
    assert dropped[0]() is None
    assert held == [1]
    # Without the release it would be renewed for ever (lease 3 s, renewed every 1 s).
    assert wait_until(lambda: not client.exists(lock.keys.lock), timeout=10)
    with lock.write(timeout=5) as again:  # a fresh hold, another owner
        assert again.token > 0


@pytest.mark.slow
def test_a_kept_handle_stays_held_whatever_thread_took_it(
    client: redis.Redis, namespace: str
) -> None:
    """The hand-off the other way: a handle taken in a thread that ended, but still
    referenced, stays held (renewed) until released."""
    # A lease long enough that a loaded machine (the mutation check beside the suite)
    # still renews in time; unrenewed, the hold would be gone within 2 s.
    lock = RedisRWLock(client, "k", namespace=namespace, lease=2.0)
    held, _ = _end_thread_holding(lambda: lock.acquire_write(timeout=5))
    gc.collect()
    # One and a half leases long, the holding stays (observed in Redis, not slept on).
    deadline = time.monotonic() + 1.5 * 2.0
    while time.monotonic() < deadline:
        assert client.exists(lock.keys.lock)
        time.sleep(0.02)
    assert not held.lost
    assert lock.try_acquire_write() is None
    held.release()
    assert not client.exists(lock.keys.lock)


def _queue_a_writer(lock: Any) -> tuple[threading.Thread, threading.Event]:
    """Another process's writer, queued on ``lock`` from a thread: (thread, wrote)."""
    wrote = threading.Event()

    def writer() -> None:
        with lock.write(timeout=20):
            wrote.set()

    thread = threading.Thread(target=writer)
    thread.start()
    return thread, wrote


def test_reentered_read_does_not_wait_behind_a_queued_remote_writer(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    ours = LockFactory(client, namespace=namespace, lease=0.6).rwlock("k")
    theirs = LockFactory(other_client, namespace=namespace, lease=30).rwlock("k")
    handle = ours.acquire_read(timeout=5)
    thread, wrote = _queue_a_writer(theirs)
    assert wait_until(lambda: handle.writer_waiting, timeout=10)  # a renewal saw it
    assert ours.acquire_read(timeout=2) is handle  # re-entry, not a wait
    ours.release_read()
    assert not wrote.is_set()
    ours.release_read()
    assert wrote.wait(10)
    thread.join()


async def test_async_reentered_read_does_not_wait_behind_a_queued_remote_writer(
    aclient: Any, other_client: redis.Redis, namespace: str
) -> None:
    ours = AsyncLockFactory(aclient, namespace=namespace, lease=0.6).rwlock("k")
    theirs = LockFactory(other_client, namespace=namespace, lease=30).rwlock("k")
    handle = await ours.acquire_read(timeout=5)
    thread, wrote = _queue_a_writer(theirs)
    for _ in range(500):
        if handle.writer_waiting:
            break
        await asyncio.sleep(0.02)
    assert handle.writer_waiting
    assert await ours.acquire_read(timeout=2) is handle
    await ours.release_read()
    assert not wrote.is_set()
    await ours.release_read()
    assert await asyncio.to_thread(wrote.wait, 10)
    thread.join()


def test_release_from_another_thread_needs_the_holder(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        holder = None

        def take() -> None:
            nonlocal holder
            lock.acquire_write(timeout=5)
            holder = lock.local.writer

        take()
        from cacheguard.exceptions import LockNotHeldError

        with pytest.raises(LockNotHeldError):
            pool.submit(lock.release_write).result(timeout=10)
        with pytest.raises(LockTimeout):
            pool.submit(lock.acquire_write, 0.2).result(timeout=10)
        lock.release_write()
        assert holder is not None
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_an_abandoned_read_hold_is_given_back_before_local_writers_go_on(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader thread ended holding: its process's shared read hold in Redis is given
    back before its local hold ends, so a local writer waits for that (it would
    otherwise ask Redis for a write while its own process still held the read, and
    get LockUpgradeError)."""
    lock = LockFactory(client, namespace=namespace, lease=30).rwlock("k")
    releasing, proceed = threading.Event(), threading.Event()
    original = RedisRWLock.release

    def slow_release(self: RedisRWLock, handle: Any) -> None:
        if handle.mode == "read":
            releasing.set()
            proceed.wait(10)
        original(self, handle)

    monkeypatch.setattr(RedisRWLock, "release", slow_release)
    _end_thread_holding(lambda: lock.acquire_read(timeout=5))
    gc.collect()
    assert releasing.wait(10)  # the abandonment is giving the shared hold back
    outcome: list[Any] = []

    def write() -> None:
        try:
            outcome.append(lock.acquire_write(timeout=10))
            lock.release_write()
        except Exception as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.3)  # (a bounded look: it must still be waiting, not refused)
    assert not outcome
    proceed.set()
    writer.join(10)
    assert len(outcome) == 1
    assert not isinstance(outcome[0], Exception)


def test_a_holder_must_be_a_holder(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    with pytest.raises(TypeError, match="Holder"):
        lock.acquire_write(timeout=1, holder=-1)  # type: ignore[arg-type]
    assert lock.local.is_free()


@pytest.mark.slow
async def test_async_a_dropped_store_hold_is_given_back_not_renewed(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    """A task that ended holding an AsyncRedisRWLock it never released: the asyncio
    watchdog gives the hold back at its next renewal instead of renewing it."""
    lock = AsyncRedisRWLock(aclient, "k", namespace=namespace, lease=3.0)  # as above
    dropped: list[Any] = []

    async def take_and_drop() -> None:
        handle = await lock.acquire_write(timeout=5)
        dropped.append(weakref.ref(handle))

    await asyncio.create_task(take_and_drop())
    gc.collect()
    assert dropped[0]() is None
    assert client.exists(lock.keys.lock)
    for _ in range(500):  # renewed every 1 s: given back at the first of them
        if not client.exists(lock.keys.lock):
            break
        await asyncio.sleep(0.02)
    assert not client.exists(lock.keys.lock)
