"""Regressions found by the adversarial review of the sans-I/O restructure: the
writer's own reads, cancellation at every await of the asyncio fill and write
path."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio

import cacheguard.cache.async_guard
from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache.scripts import FILL_BEGIN, NEXT_STAMP
from cacheguard.locks.async_two_tier import AsyncTwoTierRWLock
from cacheguard.redis.scripts import LuaScript
from tests.helpers import wait_until

T = TypeVar("T")


async def in_this_task(call: Awaitable[T], seconds: float) -> T:
    """``await call`` in the calling task (locks belong to tasks: ``asyncio.wait_for``
    would run it in another one before Python 3.12), failing after ``seconds``."""
    task = asyncio.current_task()
    assert task is not None
    fired: list[bool] = []

    def stop() -> None:
        fired.append(True)
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, stop)
    try:
        return await call
    except asyncio.CancelledError:
        if fired:
            raise AssertionError(f"still waiting after {seconds} s") from None
        raise
    finally:
        timer.cancel()


@pytest.fixture
async def aguard(redis_url: str, namespace: str) -> AsyncIterator[AsyncCacheGuard]:
    # A lease and a wait of minutes: only a deadline of the test's own can end a stall.
    made = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url, socket_timeout=10),
        namespace=namespace,
        ttl_jitter=0,
        lease=120,
        wait_timeout=120,
    )
    yield made
    await made.aclose()
    await made.client.aclose()


# -- a writer reading its own key -------------------------------------------------------------


def test_a_sync_writer_reads_its_own_view_while_another_thread_leads_the_key(
    redis_url: str, namespace: str
) -> None:
    # Another thread of the process leads the key's single flight; it waits for the
    # writer's local write lock. The writer reading the key must not wait for that
    # flight (it would wait until wait_timeout, then take the other thread's value,
    # loaded while the write was under way): it loads its own view, privately.
    guard = CacheGuard(
        redis.Redis.from_url(redis_url, socket_timeout=10),
        namespace=namespace,
        ttl_jitter=0,
        wait_timeout=5,
        on_timeout="raise",
    )
    got: dict[str, Any] = {}

    def other_thread() -> None:
        try:
            got["reader"] = guard.get_or_load("k", lambda: "committed", ttl=60)
        except BaseException as exc:
            got["reader"] = exc

    try:
        with guard.write("k"):
            reader = threading.Thread(target=other_thread)
            reader.start()
            assert wait_until(lambda: "k" in guard._state.flights._flights, 10)
            assert guard.get_or_load("k", lambda: "mine", ttl=60) == "mine"
        reader.join(30)
        assert got["reader"] == "committed"  # loaded after the write: not the writer's
        assert guard.peek("k") == "committed"
    finally:
        guard.close()
        guard.client.close()


def test_followers_of_an_interrupted_sync_leader_carry_on(redis_url: str, namespace: str) -> None:
    # A KeyboardInterrupt (or SystemExit) in the leader's loader is the leader's own:
    # a follower must not have it raised in its thread; it reads (and loads) itself.
    guard = CacheGuard(
        redis.Redis.from_url(redis_url, socket_timeout=10), namespace=namespace, wait_timeout=30
    )
    go = threading.Event()
    got: dict[str, Any] = {}

    def interrupted() -> str:
        go.wait(30)
        raise KeyboardInterrupt

    def run(role: str, load: Any) -> None:
        try:
            got[role] = guard.get_or_load("k", load, ttl=60)
        except BaseException as exc:
            got[role] = exc

    leader = threading.Thread(target=run, args=("leader", interrupted))
    leader.start()
    try:
        assert wait_until(lambda: "k" in guard._state.flights._flights, 10)
        follower = threading.Thread(target=run, args=("follower", lambda: "loaded again"))
        follower.start()
        assert wait_until(lambda: guard._state.flights._flights["k"].event is not None, 10)
        go.set()
        leader.join(30)
        follower.join(30)
        assert isinstance(got["leader"], KeyboardInterrupt)
        assert got["follower"] == "loaded again"
    finally:
        go.set()
        guard.close()
        guard.client.close()


async def test_an_async_writer_reads_its_own_view_while_another_task_leads_the_key(
    aguard: AsyncCacheGuard,
) -> None:
    async with aguard.write("k"):
        reader = asyncio.ensure_future(aguard.get_or_load("k", lambda: "committed", ttl=60))
        for _ in range(100):
            if "k" in aguard._state.flights._flights:
                break
            await asyncio.sleep(0)
        assert "k" in aguard._state.flights._flights
        mine = await in_this_task(aguard.get_or_load("k", lambda: "mine", ttl=60), 10)
        assert mine == "mine"
    assert await asyncio.wait_for(reader, 10) == "committed"
    assert await aguard.peek("k") == "committed"


# -- cancellation at each await of the asyncio fill and write path ------------------------------


def lock_free(client: redis.Redis, guard: AsyncCacheGuard, name: str) -> bool:
    return wait_until(lambda: not client.exists(guard.keys(name).lock), 10)


async def test_a_filler_cancelled_twice_during_fill_begin_still_ends_its_fill(
    aguard: AsyncCacheGuard, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fill_begin ran in Redis (we are the key's filler) and its reply is slow; the
    # task is cancelled, then cancelled again (a timeout and a task group, say). The
    # call must still be seen through and the fill ended, not left for its lease.
    ran, reply = asyncio.Event(), asyncio.Event()
    original = LuaScript.acall

    async def slow_reply(self: LuaScript, aclient: Any, keys: list[str], args: list[Any]) -> Any:
        result = await original(self, aclient, keys, args)
        if self is FILL_BEGIN and not ran.is_set():
            ran.set()
            await reply.wait()
        return result

    monkeypatch.setattr(LuaScript, "acall", slow_reply)
    calls: list[str] = []

    def load() -> str:
        calls.append("cancelled filler")
        return "never stored"

    filler = asyncio.ensure_future(aguard.get_or_load("k", load, ttl=60))
    await asyncio.wait_for(ran.wait(), 10)
    assert client.hgetall(aguard.keys("k").lock)  # the begin made it the filler
    filler.cancel()
    await asyncio.sleep(0)  # the driver catches the first cancellation
    filler.cancel()
    await asyncio.sleep(0)
    reply.set()
    with pytest.raises(asyncio.CancelledError):
        await filler
    assert calls == []  # a cancelled task does not go on to load
    assert await asyncio.to_thread(lock_free, client, aguard, "k")  # lease: 120 s
    assert len(aguard._state.flights) == 0
    assert aguard.rwlock("k").local.is_free()
    assert await in_this_task(aguard.get_or_load("k", lambda: "next", ttl=60), 10) == "next"


async def test_a_writer_cancelled_during_its_closing_invalidation_still_invalidates(
    aguard: AsyncCacheGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The body returned (the transaction committed); the closing invalidation is on
    # its way when the task is cancelled. It must still run to its end.
    closing, go_on = asyncio.Event(), asyncio.Event()
    stamps: list[int] = []
    send = cacheguard.cache.async_guard.arun_pipelined

    async def slow_closing(client: Any, calls: list[Any], *args: Any) -> Any:
        stamp = calls[0][0] is NEXT_STAMP
        if stamp and stamps:  # the second stamp: the closing invalidation
            closing.set()
            await go_on.wait()
        replies = await send(client, calls, *args)
        if stamp:
            stamps.extend(replies)
        return replies

    monkeypatch.setattr(cacheguard.cache.async_guard, "arun_pipelined", slow_closing)

    async def write() -> None:
        async with aguard.write("k"):
            pass

    writer = asyncio.ensure_future(write())
    await asyncio.wait_for(closing.wait(), 10)
    writer.cancel()
    await asyncio.sleep(0)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await writer
    monkeypatch.undo()
    assert stamps == [1, 2]
    # The closing invalidation ran to its end: the key carries its stamp.
    assert int(await aguard.client.get(aguard.keys("k").version)) == 2
    assert await aguard.watermark() == 2
    assert aguard.rwlock("k").local.is_free()


async def test_a_writer_cancelled_again_while_releasing_releases_every_lock(
    aguard: AsyncCacheGuard, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside, never = asyncio.Event(), asyncio.Event()
    releasing, go_on = asyncio.Event(), asyncio.Event()
    original = AsyncTwoTierRWLock.release_write

    async def slow_release(self: AsyncTwoTierRWLock, *, holder: Any = None) -> None:
        if self.name == "b":  # released first (reverse order)
            releasing.set()
            await go_on.wait()
        await original(self, holder=holder)

    monkeypatch.setattr(AsyncTwoTierRWLock, "release_write", slow_release)

    async def write() -> None:
        async with aguard.write("a", "b"):
            inside.set()
            await never.wait()

    writer = asyncio.ensure_future(write())
    await asyncio.wait_for(inside.wait(), 10)
    writer.cancel()
    await asyncio.wait_for(releasing.wait(), 10)
    writer.cancel()  # cancelled again while the first release is under way
    await asyncio.sleep(0)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await writer
    for name in ("a", "b"):
        assert await asyncio.to_thread(lock_free, client, aguard, name), name
    # Free in this loop too, at once for another task (lease and wait: 120 s).
    await in_this_task(_write_once(aguard, "a", "b"), 10)
    assert aguard.rwlock("a").local.is_free()


async def test_a_writer_cancelled_while_acquiring_and_again_while_releasing_frees_its_locks(
    aguard: AsyncCacheGuard, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer holds "a" and waits for "b" (another task writes it) when it is
    # cancelled; cancelled again while releasing "a", it must still release it.
    b_held, b_done = asyncio.Event(), asyncio.Event()
    releasing, go_on = asyncio.Event(), asyncio.Event()
    original = AsyncTwoTierRWLock.release_write

    async def slow_release(self: AsyncTwoTierRWLock, *, holder: Any = None) -> None:
        if self.name == "a":
            releasing.set()
            await go_on.wait()
        await original(self, holder=holder)

    async def hold_b() -> None:
        async with aguard.write("b"):
            b_held.set()
            await b_done.wait()

    other = asyncio.ensure_future(hold_b())
    await asyncio.wait_for(b_held.wait(), 10)
    monkeypatch.setattr(AsyncTwoTierRWLock, "release_write", slow_release)
    writer = asyncio.ensure_future(_write_once(aguard, "a", "b"))
    held_a = lambda: bool(client.exists(aguard.keys("a").lock))  # noqa: E731
    assert await asyncio.to_thread(wait_until, held_a, 10)
    writer.cancel()
    await asyncio.wait_for(releasing.wait(), 10)
    writer.cancel()  # cancelled again while the release of "a" is under way
    await asyncio.sleep(0)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await asyncio.to_thread(lock_free, client, aguard, "a")
    b_done.set()
    await asyncio.wait_for(other, 10)
    await in_this_task(_write_once(aguard, "a", "b"), 10)


async def _write_once(guard: AsyncCacheGuard, *names: str) -> None:
    async with guard.write(*names, timeout=5):
        pass
