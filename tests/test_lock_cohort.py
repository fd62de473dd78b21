"""Lock cohorting: a two-tier write hold handed between the writers of one process.

A writer releasing while other local writers wait passes the local write lock
straight to the oldest of them and keeps the process's distributed hold for it:
no round trip, the same handle and fencing token. At most ``cohort_limit`` times in
a row, and only while the hold is sure to last; then it goes back to Redis, where
other processes' writers queued meanwhile come first. Sync threads and asyncio
tasks alike, against the real Redis; "another process" is a second factory (its
own owner id) on a client of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import LockFactory, LockLostError, TwoTierRWLock
from cacheguard._identity import Holder
from cacheguard.aio import (
    AsyncCacheGuard,
    AsyncLockFactory,
    AsyncRedisRWLock,
    async_notifier_for,
)
from cacheguard.cache.settings import GuardSettings
from cacheguard.locks.async_two_tier import AsyncTwoTierRWLock
from cacheguard.locks.local import LocalRWLock
from cacheguard.locks.two_tier import DEFAULT_COHORT_LIMIT
from tests.helpers import make_guard, wait_until


def lock_hash(client: redis.Redis, lock: Any) -> dict[str, str]:
    raw = client.hgetall(lock.remote.keys.lock)
    return {k.decode(): v.decode() for k, v in raw.items()}


def count_calls(lock: Any) -> list[str]:
    """Every script call the lock's distributed tier sends from now on (by name)."""
    calls: list[str] = []
    original = lock.remote._call

    def counting(script: Any, keys: Any, args: Any) -> Any:
        calls.append(script.source.split("\n", 1)[0])
        return original(script, keys, args)

    lock.remote._call = counting
    return calls


def queue_writers(
    lock: TwoTierRWLock, count: int, inside: Callable[[int, Any], None]
) -> list[threading.Thread]:
    """``count`` threads that each wait for the write lock, run ``inside(i, handle)``
    holding it, and release; returned once all of them wait as successors."""
    queued = lock.local.waiting_successors

    def writer(i: int) -> None:
        with lock.write(timeout=30) as handle:
            inside(i, handle)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(count)]
    for n, t in enumerate(threads, start=queued + 1):
        t.start()
        # One at a time, so they queue in this order.
        assert wait_until(lambda n=n: lock.local.waiting_successors == n, 10)
    return threads


def another_writer(
    other: TwoTierRWLock, log: list[str], client: redis.Redis, mine: TwoTierRWLock
) -> threading.Thread:
    """A writer of "another process", queued in Redis (its waiting mark is there) when
    this returns."""

    def write() -> None:
        with other.write(timeout=30):
            log.append("other")

    thread = threading.Thread(target=write)
    thread.start()
    mark = f"q:{other.owner}"
    assert wait_until(lambda: mark in lock_hash(client, mine), 10)
    return thread


# -- sync --------------------------------------------------------------------------------------


def test_a_handed_over_write_hold_does_not_touch_redis(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    first = lock.acquire_write(timeout=5)
    during_first = lock_hash(client, lock)
    seen: list[tuple[Any, dict[str, str]]] = []
    threads = queue_writers(lock, 4, lambda i, h: seen.append((h, lock_hash(client, lock))))
    calls = count_calls(lock)
    lock.release_write()
    for t in threads:
        t.join(30)
    assert len(seen) == 4
    # Each writer got the first one's holding: the same handle and token, and the hash
    # exactly as it was (a new acquire would have moved the lease end e:<owner>).
    assert all(handle is first for handle, _ in seen)
    assert all(state == during_first for _, state in seen)
    assert during_first[f"w:{lock.owner}"] == "1"
    # Five holders, one round trip: the last one's release.
    assert len(calls) == 1
    assert "release" in calls[0]
    assert first.released
    assert not client.exists(lock.remote.keys.lock)
    assert lock.local.is_free()


def test_the_cohort_limit_lets_another_process_in_after_that_many_hand_overs(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    limit = 2
    mine = LockFactory(client, namespace=namespace, lease=60, cohort_limit=limit).rwlock("k")
    other = LockFactory(other_client, namespace=namespace, lease=60).rwlock("k")
    log: list[str] = []
    tokens: list[int] = []
    first = mine.acquire_write(timeout=5)

    def inside(i: int, handle: Any) -> None:
        log.append("mine")
        tokens.append(handle.token)

    threads = queue_writers(mine, 5, inside)
    theirs = another_writer(other, log, client, mine)
    mine.release_write()
    for t in [*threads, theirs]:
        t.join(30)
    # The first holder handed over `limit` times, then the other process's writer,
    # queued in Redis meanwhile, came before the rest of this process's writers.
    assert log == ["mine"] * limit + ["other"] + ["mine"] * (5 - limit)
    assert tokens[:limit] == [first.token] * limit
    assert first.token < tokens[limit]  # a fresh holding: a new, higher token
    assert len(set(tokens[limit:])) == 1  # which the next cohort shares
    assert not client.exists(mine.remote.keys.lock)


def test_a_busy_process_does_not_starve_another(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    """Four threads here write without pause; a writer of another process still gets
    in, after at most what is left of the cohort under way when it queued."""
    limit = 3
    mine = LockFactory(client, namespace=namespace, lease=60, cohort_limit=limit).rwlock("k")
    other = LockFactory(other_client, namespace=namespace, lease=60).rwlock("k")
    stop = threading.Event()
    entries: list[tuple[float, int]] = []
    queued: list[float] = []
    attempt = other.remote._attempt

    def first_attempt(*args: Any, **kwargs: Any) -> Any:
        answer = attempt(*args, **kwargs)
        queued.append(time.monotonic())  # its waiting mark (and ticket) is in Redis
        return answer

    other.remote._attempt = first_attempt  # type: ignore[method-assign]

    def busy() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            with mine.write(timeout=30) as handle:
                entries.append((time.monotonic(), handle.token))

    threads = [threading.Thread(target=busy) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: len(entries) > 50, 30)
        with other.write(timeout=30):
            got_in = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    overtaking = [token for at, token in entries if queued[0] < at < got_in]
    # Only the cohort under way when it queued went on: one holding, at most its
    # first hold and `limit` hand-overs.
    assert len(set(overtaking)) <= 1, overtaking
    assert len(overtaking) <= limit + 1, overtaking


def test_a_lost_hold_is_not_handed_over_and_its_loss_is_raised_to_the_holder(
    client: redis.Redis, namespace: str
) -> None:
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    first = lock.acquire_write(timeout=5)
    tokens: list[int] = []
    threads = queue_writers(lock, 1, lambda i, h: tokens.append(h.token))
    client.delete(lock.remote.keys.lock)  # the holding is gone (a failover, a DEL)
    assert not first.renew()  # and a renewal has found out
    assert first.lost
    with pytest.raises(LockLostError):
        lock.release_write()
    threads[0].join(30)
    assert tokens
    assert tokens[0] > first.token  # the next writer took a fresh holding


def test_a_loss_found_at_the_end_of_a_cohort_is_raised_to_the_holder_then(
    client: redis.Redis, namespace: str
) -> None:
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    first = lock.acquire_write(timeout=5)
    errors: list[BaseException] = []
    handed = threading.Event()
    inside = threading.Event()

    def successor() -> None:
        handle = lock.acquire_write(timeout=30)
        assert handle is first  # handed over
        inside.set()
        assert handed.wait(30)
        try:
            lock.release_write()  # nobody waits behind it: the release goes to Redis
        except LockLostError as exc:
            errors.append(exc)

    thread = threading.Thread(target=successor)
    thread.start()
    assert wait_until(lambda: lock.local.waiting_successors == 1, 10)
    lock.release_write()
    assert inside.wait(30)
    client.delete(lock.remote.keys.lock)  # lost while the successor holds it
    handed.set()
    thread.join(30)
    assert len(errors) == 1
    assert first.lost


def test_a_holder_whose_lease_may_have_run_out_releases_in_redis(
    client: redis.Redis, namespace: str
) -> None:
    """No watchdog renews this lock, so its lease runs out under the holder (a process
    frozen past its lease looks the same): its release must not hand the hold over as
    if nothing happened, but ask Redis, which says it was lost."""
    lock = LockFactory(client, namespace=namespace, lease=0.5, watchdog=False).rwlock("k")
    first = lock.acquire_write(timeout=5)
    tokens: list[int] = []
    threads = queue_writers(lock, 1, lambda i, h: tokens.append(h.token))
    assert wait_until(lambda: not client.exists(lock.remote.keys.lock), 10)  # expired
    assert not first.lost  # and nothing in this process has noticed
    with pytest.raises(LockLostError):
        lock.release_write()
    threads[0].join(30)
    assert tokens
    assert tokens[0] > first.token


@pytest.mark.slow
def test_a_hold_the_watchdog_renews_is_still_handed_over_past_its_first_lease(
    client: redis.Redis, namespace: str
) -> None:
    """Each renewal confirms the hold for a lease from when it was sent: held longer
    than its lease, it is still sure to last, and handed over."""
    lock = LockFactory(client, namespace=namespace, lease=0.6).rwlock("k")
    first = lock.acquire_write(timeout=5)
    granted = first.confirmed_at
    assert granted is not None
    assert wait_until(lambda: first.confirmed_at > granted + 0.6, 10)  # renewed since
    tokens: list[int] = []
    threads = queue_writers(lock, 1, lambda i, h: tokens.append(h.token))
    calls = count_calls(lock)
    lock.release_write()
    threads[0].join(30)
    assert tokens == [first.token]
    assert len(calls) == 1  # the successor's release


def test_a_downgraded_holder_does_not_hand_over(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    first = lock.acquire_write(timeout=5)
    entered: list[int] = []
    threads = queue_writers(lock, 1, lambda i, h: entered.append(h.token))
    lock.acquire_read(timeout=5)  # downgrade: read, then let the write go
    lock.release_write()
    assert lock_hash(client, lock).get(f"w:{lock.owner}") is None
    assert lock_hash(client, lock)[f"r:{lock.owner}"] == "1"
    assert not entered  # the successor waits for the read hold
    lock.release_read()
    threads[0].join(30)
    assert entered
    assert entered[0] > first.token


def test_an_interrupted_successor_passes_the_hold_on_or_gives_it_back(
    client: redis.Redis, namespace: str
) -> None:
    """A successor interrupted (here: an exception out of its wait) after it was handed
    the lock passes it to the next successor, or, with none, gives the distributed
    hold back instead of keeping it for nobody."""
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")

    class Interrupted(BaseException):
        pass

    local = lock.local
    interrupt = threading.Event()
    cond = local._cond

    class InterruptingCondition(type(cond)):
        def wait(self, timeout: float | None = None) -> bool:
            woke = super().wait(timeout)
            if interrupt.is_set() and threading.current_thread().name.startswith("victim"):
                raise Interrupted
            return woke

    local._cond = InterruptingCondition(threading.Lock())
    first = lock.acquire_write(timeout=5)
    raised: list[BaseException] = []
    tokens: list[int] = []

    def victim() -> None:
        try:
            lock.acquire_write(timeout=30)
        except Interrupted as exc:
            raised.append(exc)

    def after(i: int, handle: Any) -> None:
        tokens.append(handle.token)

    victims = [threading.Thread(target=victim, name="victim-0")]
    victims[0].start()
    assert wait_until(lambda: local.waiting_successors == 1, 10)
    others = queue_writers(lock, 1, after)
    interrupt.set()
    lock.release_write()
    victims[0].join(30)
    others[0].join(30)
    assert len(raised) == 1
    assert tokens == [first.token]  # passed on to the next successor, still held
    assert not client.exists(lock.remote.keys.lock)

    # Alone: the hold is given back.
    interrupt.clear()
    second = lock.acquire_write(timeout=5)
    victims = [threading.Thread(target=victim, name="victim-1")]
    victims[0].start()
    assert wait_until(lambda: local.waiting_successors == 1, 10)
    interrupt.set()
    lock.release_write()
    victims[0].join(30)
    assert len(raised) == 2
    assert wait_until(lambda: not client.exists(lock.remote.keys.lock), 10)
    assert second.released
    assert local.is_free()
    with lock.write(timeout=5) as third:
        assert third.token > second.token


def test_a_hold_nobody_claims_is_given_back_when_a_plain_local_writer_came_first(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A successor interrupted after the hand-over frees the local lock; a plain local
    writer (a session's outbox hold: the local tier alone) that takes it before the
    give-back runs claims nothing, so the distributed hold kept for the successor is
    given back, not kept and renewed for nobody."""
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    successor, local_only = Holder(), Holder()
    wait_for = LocalRWLock._wait_for

    def interrupted_once_handed_the_lock(self: Any, ready: Any, timeout: Any, mode: str) -> None:
        wait_for(self, ready, timeout, mode)
        if self._writer == successor.number:
            raise KeyboardInterrupt  # e.g. a signal handler raising in that thread

    drop = TwoTierRWLock._drop_unclaimed

    def a_plain_local_writer_comes_first(self: TwoTierRWLock) -> None:
        took: list[Any] = []

        def take() -> None:
            try:
                took.append(lock.local.acquire_write(5, holder=local_only))
            except BaseException as exc:
                took.append(exc)

        taker = threading.Thread(target=take)
        taker.start()
        taker.join(10)
        assert took == [local_only]
        drop(self)

    monkeypatch.setattr(LocalRWLock, "_wait_for", interrupted_once_handed_the_lock)
    monkeypatch.setattr(TwoTierRWLock, "_drop_unclaimed", a_plain_local_writer_comes_first)
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")  # binds the hooks
    first = lock.acquire_write(timeout=5)
    interrupted: list[BaseException] = []

    def wait_as_successor() -> None:
        try:
            lock.acquire_write(timeout=30, holder=successor)
        except KeyboardInterrupt as exc:
            interrupted.append(exc)

    waiting = threading.Thread(target=wait_as_successor)
    waiting.start()
    assert wait_until(lambda: lock.local.waiting_successors == 1, 10)
    lock.release_write()  # handed over: the distributed hold is kept for the successor
    waiting.join(30)
    assert len(interrupted) == 1
    assert lock.local.writer == local_only.number
    assert first.released  # given back at once
    assert not client.exists(lock.remote.keys.lock)
    lock.local.release_write(holder=local_only)
    with lock.write(timeout=5) as again:
        assert again.token > first.token


def test_a_successor_that_ends_holding_gives_the_hold_back(
    client: redis.Redis, namespace: str
) -> None:
    lock = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    lock.acquire_write(timeout=5)
    took: list[Any] = []
    ends = threading.Thread(target=lambda: took.append(lock.acquire_write(timeout=30)))
    ends.start()
    assert wait_until(lambda: lock.local.waiting_successors == 1, 10)
    lock.release_write()
    ends.join(30)  # it took the handed-over hold and ended without releasing it
    assert took
    held = took.pop()
    del held
    assert wait_until(lambda: not client.exists(lock.remote.keys.lock), 10)
    with lock.write(timeout=5):
        pass


def test_cohort_limit_is_checked(client: redis.Redis, namespace: str) -> None:
    assert LockFactory(client).cohort_limit == DEFAULT_COHORT_LIMIT == 16
    for bad in (-1, 1.5, "4", True, None):
        with pytest.raises(ValueError, match="cohort_limit"):
            LockFactory(client, cohort_limit=bad)  # type: ignore[arg-type]
    off = LockFactory(client, namespace=namespace, cohort_limit=0).rwlock("k")
    first = off.acquire_write(timeout=5)
    tokens: list[int] = []
    threads = queue_writers(off, 1, lambda i, h: tokens.append(h.token))
    off.release_write()
    threads[0].join(30)
    assert tokens[0] > first.token  # 0: every release goes to Redis


def test_a_guards_cohort_limit_is_its_locks(client: redis.Redis, namespace: str) -> None:
    assert GuardSettings().cohort_limit == DEFAULT_COHORT_LIMIT
    guard = make_guard(client, namespace, cohort_limit=3)
    try:
        assert guard.rwlock("k").cohort_limit == 3
    finally:
        guard.close()
    with pytest.raises(ValueError, match="cohort_limit"):
        make_guard(client, namespace, cohort_limit=-1)


# -- asyncio -----------------------------------------------------------------------------------


async def queue_tasks(
    lock: AsyncTwoTierRWLock, count: int, inside: Callable[[int, Any], None]
) -> list[asyncio.Task[None]]:
    async def writer(i: int) -> None:
        async with lock.write(timeout=30) as handle:
            inside(i, handle)

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(writer(i)))
        await asyncio.sleep(0)  # each waits before the next one starts: queued in order
    assert lock.local.waiting_successors == count
    return tasks


async def test_async_a_handed_over_write_hold_does_not_touch_redis(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncLockFactory(aclient, namespace=namespace, lease=60).rwlock("k")
    first = await lock.acquire_write(timeout=5)
    during_first = lock_hash(client, lock)
    seen: list[tuple[Any, dict[str, str]]] = []
    tasks = await queue_tasks(lock, 4, lambda i, h: seen.append((h, lock_hash(client, lock))))
    calls = count_calls(lock)
    await lock.release_write()
    await asyncio.gather(*tasks)
    assert len(seen) == 4
    assert all(handle is first for handle, _ in seen)
    assert all(state == during_first for _, state in seen)
    assert len(calls) == 1
    assert "release" in calls[0]
    assert not client.exists(lock.remote.keys.lock)


async def test_async_the_cohort_limit_lets_another_process_in(
    aclient: Any, redis_url: str, client: redis.Redis, namespace: str
) -> None:
    limit = 2
    mine = AsyncLockFactory(aclient, namespace=namespace, lease=60, cohort_limit=limit).rwlock("k")
    theirs_client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10)
    try:
        other = AsyncLockFactory(theirs_client, namespace=namespace, lease=60).rwlock("k")
        log: list[str] = []
        tokens: list[int] = []
        first = await mine.acquire_write(timeout=5)

        def inside(i: int, handle: Any) -> None:
            log.append("mine")
            tokens.append(handle.token)

        tasks = await queue_tasks(mine, 5, inside)

        async def write() -> None:
            async with other.write(timeout=30):
                log.append("other")

        theirs = asyncio.create_task(write())
        for _ in range(500):
            if f"q:{other.owner}" in lock_hash(client, mine):
                break
            await asyncio.sleep(0.01)
        assert f"q:{other.owner}" in lock_hash(client, mine)
        await mine.release_write()
        await asyncio.wait_for(asyncio.gather(*tasks, theirs), 30)
        assert log == ["mine"] * limit + ["other"] + ["mine"] * (5 - limit)
        assert tokens[:limit] == [first.token] * limit
        assert first.token < tokens[limit]
    finally:
        await async_notifier_for(theirs_client).aclose()
        await theirs_client.aclose()


async def test_async_a_lost_hold_is_not_handed_over_and_its_loss_is_raised(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncLockFactory(aclient, namespace=namespace, lease=60).rwlock("k")
    first = await lock.acquire_write(timeout=5)
    tokens: list[int] = []
    tasks = await queue_tasks(lock, 1, lambda i, h: tokens.append(h.token))
    client.delete(lock.remote.keys.lock)
    assert not await first.renew()
    with pytest.raises(LockLostError):
        await lock.release_write()
    await asyncio.wait_for(tasks[0], 30)
    assert tokens[0] > first.token


async def test_async_a_holder_whose_lease_may_have_run_out_releases_in_redis(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncTwoTierRWLock(  # no watchdog renews it: its lease runs out
        AsyncRedisRWLock(aclient, "k", namespace=namespace, lease=0.5, watchdog=False)
    )
    first = await lock.acquire_write(timeout=5)
    tokens: list[int] = []
    tasks = await queue_tasks(lock, 1, lambda i, h: tokens.append(h.token))
    for _ in range(500):
        if not client.exists(lock.remote.keys.lock):
            break
        await asyncio.sleep(0.02)
    assert not client.exists(lock.remote.keys.lock)
    assert not first.lost
    with pytest.raises(LockLostError):
        await lock.release_write()
    await asyncio.wait_for(tasks[0], 30)
    assert tokens[0] > first.token


@pytest.mark.slow
async def test_async_a_hold_the_watchdog_renews_is_still_handed_over(
    aclient: Any, namespace: str
) -> None:
    lock = AsyncLockFactory(aclient, namespace=namespace, lease=0.6).rwlock("k")
    first = await lock.acquire_write(timeout=5)
    granted = first.confirmed_at
    assert granted is not None
    for _ in range(500):
        if first.confirmed_at > granted + 0.6:
            break
        await asyncio.sleep(0.02)
    assert first.confirmed_at > granted + 0.6
    tokens: list[int] = []
    tasks = await queue_tasks(lock, 1, lambda i, h: tokens.append(h.token))
    await lock.release_write()
    await asyncio.wait_for(tasks[0], 30)
    assert tokens == [first.token]


async def test_async_a_downgraded_holder_does_not_hand_over(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncLockFactory(aclient, namespace=namespace, lease=60).rwlock("k")
    first = await lock.acquire_write(timeout=5)
    entered: list[int] = []
    tasks = await queue_tasks(lock, 1, lambda i, h: entered.append(h.token))
    await lock.acquire_read(timeout=5)  # downgrade: read, then let the write go
    await lock.release_write()
    for _ in range(20):  # turns of the loop: a successor handed the lock would run
        await asyncio.sleep(0)
    assert lock_hash(client, lock).get(f"w:{lock.owner}") is None
    assert lock_hash(client, lock)[f"r:{lock.owner}"] == "1"
    assert not entered
    await lock.release_read()
    await asyncio.wait_for(tasks[0], 30)
    assert entered[0] > first.token


async def test_async_a_cancelled_successor_passes_the_hold_on_or_gives_it_back(
    aclient: Any, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncLockFactory(aclient, namespace=namespace, lease=60).rwlock("k")
    first = await lock.acquire_write(timeout=5)
    tokens: list[int] = []
    victim, after = await queue_tasks(lock, 2, lambda i, h: tokens.append(h.token))
    await lock.release_write()  # handed to the victim, which has not run yet
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim
    await asyncio.wait_for(after, 30)
    assert tokens == [first.token]  # passed on, still held

    second = await lock.acquire_write(timeout=5)
    (victim,) = await queue_tasks(lock, 1, lambda i, h: tokens.append(h.token))
    await lock.release_write()
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim
    for _ in range(500):  # given back in the background
        if second.released and not client.exists(lock.remote.keys.lock):
            break
        await asyncio.sleep(0.01)
    assert second.released
    assert not client.exists(lock.remote.keys.lock)
    assert lock.local.is_free()
    async with lock.write(timeout=5) as third:
        assert third.token > second.token


async def test_async_a_guards_cohort_limit_is_its_locks(aclient: Any, namespace: str) -> None:
    guard = AsyncCacheGuard(aclient, namespace=namespace, cohort_limit=3)
    try:
        assert guard.rwlock("k").cohort_limit == 3
    finally:
        await guard.aclose()


async def test_async_cohort_limit_is_checked(aclient: Any, namespace: str) -> None:
    assert AsyncLockFactory(aclient).cohort_limit == DEFAULT_COHORT_LIMIT
    with pytest.raises(ValueError, match="cohort_limit"):
        AsyncLockFactory(aclient, cohort_limit=-1)
    off = AsyncLockFactory(aclient, namespace=namespace, cohort_limit=0).rwlock("k")
    first = await off.acquire_write(timeout=5)
    tokens: list[int] = []
    tasks = await queue_tasks(off, 1, lambda i, h: tokens.append(h.token))
    await off.release_write()
    await asyncio.wait_for(tasks[0], 30)
    assert tokens[0] > first.token
