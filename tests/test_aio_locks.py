"""The asyncio lock on its own: interop with the sync lock, cancellation, many
waiting tasks, one event loop per object, the notifier's reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import CacheGuardError, RedisRWLock, WrongEventLoop
from cacheguard.aio import (
    AsyncLockHandle,
    AsyncNotifier,
    AsyncRedisRWLock,
    AsyncWatchdog,
    async_notifier_for,
)
from cacheguard.testing import RedisEndpoint
from tests.helpers import subscribers, waiting_in
from tests.lock_drivers import NO_TIMER_WAKE_UP, Driver, eventually, fields


def alock(aclient: redis.asyncio.Redis, namespace: str, **kw: Any) -> AsyncRedisRWLock:
    kw.setdefault("backoff", NO_TIMER_WAKE_UP)
    return AsyncRedisRWLock(aclient, "res", namespace=namespace, **kw)


def slock(client: redis.Redis, namespace: str, **kw: Any) -> RedisRWLock:
    kw.setdefault("backoff", NO_TIMER_WAKE_UP)
    return RedisRWLock(client, "res", namespace=namespace, **kw)


def queued_writers(client: redis.Redis, key: str) -> list[str]:
    return [k for k in fields(client, key) if k.startswith("q:")]


# -- interop: one lock, two drivers ---------------------------------------------------------


async def test_a_sync_holder_blocks_an_async_acquirer_and_its_release_wakes_it(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    holder = slock(client, namespace, lease=60).acquire_write(owner="sync-holder")
    lock = alock(aclient, namespace, lease=60)
    assert await lock.try_acquire_read(owner="async-reader") is None
    with waiting_in() as waits:
        waiter = asyncio.ensure_future(lock.acquire_write(timeout=60))
        try:
            assert await eventually(lambda: queued_writers(client, lock.keys.lock))
            assert await eventually(waits.is_set)
            holder.release()  # only its announcement can wake the waiter within 20 s
            handle = await asyncio.wait_for(waiter, 20)
        finally:
            waiter.cancel()
    assert handle.token > holder.token
    await handle.release()
    assert not client.exists(lock.keys.lock)


async def test_an_async_holder_blocks_a_sync_acquirer_and_its_release_wakes_it(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    holder = await alock(aclient, namespace, lease=60).acquire_write(owner="async-holder")
    lock = slock(client, namespace, lease=60)
    assert lock.try_acquire_read(owner="sync-reader") is None
    driver = Driver("sync", client, aclient, namespace)
    with waiting_in() as waits:
        waiter = driver.in_background(lambda: lock.acquire_write(timeout=60, owner="sync-waiter"))
        assert await eventually(lambda: client.hexists(lock.keys.lock, "q:sync-waiter"))
        assert await eventually(waits.is_set)
    await holder.release()
    handle = await asyncio.wait_for(waiter, 20)
    assert handle.token > holder.token
    handle.release()
    assert not client.exists(lock.keys.lock)


# -- cancellation -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_task_cancelled_while_waiting_leaves_nothing_behind(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str, mode: str
) -> None:
    lock = alock(aclient, namespace)
    holder = await lock.acquire_write(owner="holder")
    acquire = lock.acquire_read if mode == "read" else lock.acquire_write
    waiter = asyncio.ensure_future(acquire(timeout=60, owner="waiter"))
    channel = lock.keys.released_channel
    assert await eventually(lambda: subscribers(client, channel) >= 1)  # it waits
    if mode == "write":
        assert client.hexists(lock.keys.lock, "q:waiter")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # Read at once: the mark is withdrawn before the cancellation reaches the caller.
    f = fields(client, lock.keys.lock)
    assert "q:waiter" not in f
    assert "n:waiter" not in f
    assert "r:waiter" not in f
    await holder.release()
    assert not client.exists(lock.keys.lock)


@pytest.mark.parametrize("busy", [False, True], ids=["granted", "queued"])
async def test_a_task_cancelled_during_the_acquire_round_trip_leaks_nothing(
    client: redis.Redis,
    aclient: redis.asyncio.Redis,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    busy: bool,
) -> None:
    """The acquire script has run in Redis (granted, or queued a waiting writer) but
    its reply has not reached the task when the task is cancelled."""
    lock = alock(aclient, namespace)
    holder = await lock.acquire_write(owner="holder") if busy else None
    script_ran, reply_held = asyncio.Event(), asyncio.Event()
    real_call = lock._call

    async def reply_in_flight(script: Any, keys: list[str], args: list[Any]) -> Any:
        reply = await real_call(script, keys, args)
        if args[0] == "waiter":
            script_ran.set()
            await reply_held.wait()  # the reply is still on its way
        return reply

    monkeypatch.setattr(lock, "_call", reply_in_flight)
    waiter = asyncio.ensure_future(lock.acquire_write(timeout=60, owner="waiter"))
    await asyncio.wait_for(script_ran.wait(), 10)
    assert client.hexists(lock.keys.lock, "q:waiter" if busy else "w:waiter")
    waiter.cancel()
    reply_held.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    f = fields(client, lock.keys.lock)
    assert not [k for k in f if k.endswith(":waiter")], f
    if holder is not None:
        await holder.release()
    assert not client.exists(lock.keys.lock)


async def test_a_cancelled_body_releases(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    lock = alock(aclient, namespace)
    entered = asyncio.Event()

    async def body() -> None:
        async with lock.write(timeout=5):
            entered.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), 10)
    assert client.exists(lock.keys.lock)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not client.exists(lock.keys.lock)


async def test_a_cancelled_release_still_releases(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    lock = alock(aclient, namespace)
    handle = await lock.acquire_write()
    releasing = asyncio.ensure_future(handle.release())
    await asyncio.sleep(0)  # the release's call is under way
    releasing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await releasing
    assert await eventually(lambda: not client.exists(lock.keys.lock))


# -- many tasks on one loop -------------------------------------------------------------------


@pytest.mark.slow
async def test_300_waiting_tasks_all_get_the_lock_and_leave_it_free(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """300 readers wait on a writer while a ticker task runs on the same loop; the
    ticker's largest gap is measured by bench/aio_locks.py, not asserted here.

    Every call in flight holds a pool connection: redis-py's default asyncio pool
    refuses a 101st at once ("Too many connections"), a blocking pool queues it."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=32, timeout=30)
    aclient = redis.asyncio.Redis(connection_pool=pool)
    try:
        await _300_waiters(client, aclient, namespace)
    finally:
        await async_notifier_for(aclient).aclose()
        await aclient.aclose()
        await pool.aclose()


async def _300_waiters(client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str) -> None:
    lock = alock(aclient, namespace, lease=60)
    holder = await lock.acquire_write(owner="holder")
    got: list[str] = []
    stop = asyncio.Event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def reader() -> None:
        async with lock.read(timeout=60) as handle:
            got.append(handle.owner)

    tick = asyncio.ensure_future(ticker())
    readers = [asyncio.ensure_future(reader()) for _ in range(300)]
    assert await eventually(lambda: subscribers(client, lock.keys.released_channel) >= 1)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*readers), 60)
    stop.set()
    await tick
    assert len(got) == len(set(got)) == 300  # 300 tasks, 300 owners
    assert ticks > 0
    assert not client.exists(lock.keys.lock)


# -- one event loop per object --------------------------------------------------------------


def test_a_second_event_loop_is_refused(redis_url: str, namespace: str) -> None:
    aclient = redis.asyncio.Redis.from_url(redis_url)
    lock = AsyncRedisRWLock(aclient, "res", namespace=namespace)
    dog = AsyncWatchdog()
    notifier = AsyncNotifier(aclient.connection_pool.make_connection)

    async def first() -> None:
        async with lock.write(timeout=5) as handle:
            dog.watch(handle)
            dog.unwatch(handle)
        with notifier.subscription(f"{namespace}:ch") as sub:
            assert await sub.open(5)
        await notifier.aclose()
        await async_notifier_for(aclient).aclose()
        await aclient.aclose()

    asyncio.run(first())

    async def again(use: Any) -> None:
        await use()

    uses = {
        "lock": lambda: lock.acquire_write(timeout=5),
        "watchdog": lambda: _watch(dog, lock),
        "notifier": lambda: notifier.subscription(f"{namespace}:ch").open(5),
    }
    for what, use in uses.items():
        with pytest.raises(WrongEventLoop, match="one Redis client") as info:
            asyncio.run(again(use))
        assert isinstance(info.value, RuntimeError), what
        assert isinstance(info.value, CacheGuardError), what


async def _watch(dog: AsyncWatchdog, lock: AsyncRedisRWLock) -> None:
    dog.watch(AsyncLockHandle(lock, "read", "o", 1, None))


# -- closing a watchdog whose round trip swallows the cancellation ----------------------------


def _swallowing_round_trip(in_flight: asyncio.Event) -> Any:
    """A renewal round trip that returns normally when cancelled, as redis-py's
    pipeline does now and then."""

    async def round_trip(*args: Any) -> Any:
        in_flight.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return [1] * len(args[-1])  # (pretends every renewal went through)
        raise AssertionError("unreachable")

    return round_trip


async def test_a_closed_watchdog_stops_even_if_its_round_trip_swallows_the_cancel(
    aclient: redis.asyncio.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cacheguard.locks.redis.async_watchdog as aio_watchdog

    in_flight = asyncio.Event()
    monkeypatch.setattr(aio_watchdog, "_run_batch", _swallowing_round_trip(in_flight))
    dog = AsyncWatchdog()
    lock = alock(aclient, namespace, lease=0.3, watchdog=dog)
    handle = await lock.acquire_write(timeout=5)
    await asyncio.wait_for(in_flight.wait(), 5)  # a renewal is under way
    task = dog._task
    assert task is not None
    dog.close()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done, "the closed watchdog's task kept renewing"
    monkeypatch.undo()
    await handle.release()


async def test_a_closed_redlock_watchdog_stops_even_if_its_round_trip_swallows_the_cancel(
    aclient: redis.asyncio.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cacheguard.locks.redlock.async_rwlock as aio_redlock
    from cacheguard.locks.redis.wire import Renewal
    from cacheguard.locks.redlock.async_rwlock import AsyncRedlockRWLock, AsyncRedlockWatchdog

    in_flight = asyncio.Event()
    swallowing = _swallowing_round_trip(in_flight)

    async def renew_on(masters: Any, handles: Any) -> list[Renewal]:
        await swallowing(handles)
        return [Renewal.RENEWED] * len(handles)

    dog = AsyncRedlockWatchdog()
    lock = AsyncRedlockRWLock([aclient], "res", namespace=namespace, lease=0.3, watchdog=dog)
    handle = await lock.acquire_write(timeout=5)
    monkeypatch.setattr(aio_redlock, "_renew_on", renew_on)
    await asyncio.wait_for(in_flight.wait(), 5)  # a renewal is under way
    task = dog._task
    assert task is not None
    await asyncio.wait_for(dog.aclose(), 5)  # waited for ever before
    assert task.done()
    monkeypatch.undo()
    await handle.release()
    await lock.aclose()


# -- the notifier ---------------------------------------------------------------------------


async def test_the_notifier_reconnects_and_waiters_are_still_woken(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str, redis_endpoint: RedisEndpoint
) -> None:
    """Kill the pub/sub connection while tasks wait: after the reconnect their channel
    is subscribed again, and the release's announcement (the only thing that can wake
    them within the test: minute-long timers and lease) still gets them the lock."""
    if not redis_endpoint.real:  # CI requires a real Redis, so this never skips there
        pytest.skip("fakeredis has no CLIENT KILL")
    notifier = AsyncNotifier(aclient.connection_pool.make_connection)
    try:
        lock = alock(aclient, namespace, lease=60, notifier=notifier)
        holder = await lock.acquire_write(owner="holder")
        readers = [
            asyncio.ensure_future(lock.acquire_read(timeout=60, owner=f"r{i}")) for i in range(3)
        ]
        channel = lock.keys.released_channel
        assert await eventually(lambda: subscribers(client, channel) >= 1)
        assert notifier.reconnects == 1
        assert client.client_kill_filter(_type="pubsub", addr=_address(notifier)) == 1
        # The listener reconnects and subscribes the channel again.
        assert await eventually(lambda: notifier.reconnects >= 2, timeout=10)
        assert await eventually(lambda: subscribers(client, channel) >= 1, timeout=10)
        await holder.release()
        handles = await asyncio.wait_for(asyncio.gather(*readers), 20)
        assert {h.owner for h in handles} == {"r0", "r1", "r2"}
        for handle in handles:
            await handle.release()
        assert not client.exists(lock.keys.lock)
    finally:
        await notifier.aclose()


def _address(notifier: AsyncNotifier) -> str:
    conn = notifier._conn
    assert conn is not None
    host, port = conn._writer.get_extra_info("sockname")[:2]  # type: ignore[attr-defined]
    return f"{host}:{port}"


async def test_listen_calls_back_and_reports_a_gap(
    client: redis.Redis, aclient: redis.asyncio.Redis, namespace: str, redis_endpoint: RedisEndpoint
) -> None:
    if not redis_endpoint.real:
        pytest.skip("fakeredis has no CLIENT KILL")
    notifier = AsyncNotifier(aclient.connection_pool.make_connection)
    got: list[bytes] = []
    gaps: list[float] = []
    try:
        listener = await notifier.listen(
            f"{namespace}:feed", got.append, on_gap=lambda: gaps.append(time.monotonic())
        )
        first = listener.live_token()
        assert first is not None
        await aclient.publish(f"{namespace}:feed", b"one")
        assert await eventually(lambda: got == [b"one"])
        client.client_kill_filter(_type="pubsub", addr=_address(notifier))
        assert await eventually(lambda: len(gaps) == 1)
        # Confirmed again after the reconnect, under a new token.
        assert await eventually(lambda: listener.live_token() not in (None, first), timeout=10)
        await aclient.publish(f"{namespace}:feed", b"two")
        assert await eventually(lambda: got == [b"one", b"two"])
        listener.close()
    finally:
        await notifier.aclose()


@pytest.mark.slow
async def test_idle_channels_are_unsubscribed_and_the_task_ends(
    aclient: redis.asyncio.Redis, namespace: str
) -> None:
    notifier = AsyncNotifier(aclient.connection_pool.make_connection, linger=0.1)
    with notifier.subscription(f"{namespace}:idle") as sub:
        assert await sub.open(5)
        assert notifier._task is not None
    assert await eventually(lambda: notifier.subscribed_channels() == [])
    assert await eventually(lambda: notifier._task is None)
    with notifier.subscription(f"{namespace}:idle") as again:  # and it starts again
        assert await again.open(5)
    await notifier.aclose()
    assert notifier._task is None
