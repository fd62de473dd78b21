"""What only the asyncio guard has: cancellation, event loops, async loaders, and
a loop that never blocks while many tasks wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import MISSING, WrongEventLoop, cached_with_lock
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader
from tests.helpers import subscribers, wait_until


@pytest.fixture
async def guard(redis_url: str, namespace: str) -> AsyncIterator[AsyncCacheGuard]:
    made = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=namespace, ttl_jitter=0, lease=5
    )
    yield made
    await made.aclose()
    await made.client.aclose()


@pytest.fixture
async def other(redis_url: str, namespace: str) -> AsyncIterator[AsyncCacheGuard]:
    """Another process's worth: its own client, pool and pub/sub connection."""
    made = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=namespace, ttl_jitter=0, lease=5
    )
    yield made
    await made.aclose()
    await made.client.aclose()


def lock_free(client: redis.Redis, guard: AsyncCacheGuard, name: str) -> bool:
    return wait_until(lambda: not client.exists(guard.keys(name).lock), 10)


async def test_async_and_sync_loaders(guard: AsyncCacheGuard) -> None:
    async def load_async() -> str:
        await asyncio.sleep(0)
        return "from a coroutine"

    assert await guard.get_or_load("a", load_async, ttl=60) == "from a coroutine"
    assert await guard.get_or_load("b", lambda: "from a function", ttl=60) == "from a function"
    loader = AsyncCacheLoader(guard, key="menu:{menu_id}", load=lambda menu_id: menu_id, ttl=60)
    assert await loader.get(3) == 3

    @cached_with_lock(guard, key="double:{n}", ttl=60)
    async def double(n: int) -> int:
        return 2 * n

    assert await double(4) == 8
    assert await double.peek(4) == 8
    await double.invalidate(4)
    assert await double.peek(4) is MISSING


async def test_a_filler_cancelled_mid_load_ends_its_fill_and_followers_carry_on(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    # A lease and a deadline of minutes: a stranded fill would hold the follower past
    # the test's own 10 s deadline, so only the cancelled filler's end lets it go on.
    guard = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=namespace, lease=120, wait_timeout=120
    )
    started, never = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def hangs() -> str:
        calls.append("hangs")
        started.set()
        await never.wait()
        return "never"

    async def quick() -> str:
        calls.append("quick")
        return "from a follower"

    filler = asyncio.ensure_future(guard.get_or_load("k", hangs, ttl=60))
    await asyncio.wait_for(started.wait(), 10)
    follower = asyncio.ensure_future(guard.get_or_load("k", quick, ttl=60))
    await asyncio.sleep(0)  # one turn of the loop: the follower runs up to its wait
    assert guard._state.flights._flights["k"].event is not None  # it joined the filler's flight
    filler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await filler
    try:
        # The fill ended (no hold left for its lease), and the follower loaded itself.
        assert await asyncio.wait_for(follower, 10) == "from a follower"
        assert calls == ["hangs", "quick"]
        assert await asyncio.to_thread(lock_free, client, guard, "k")
    finally:
        await guard.aclose()
        await guard.client.aclose()


async def test_a_waiter_cancelled_leaves_nothing_behind(
    guard: AsyncCacheGuard, other: AsyncCacheGuard, client: redis.Redis
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "filled"

    filling = asyncio.ensure_future(guard.get_or_load("k", slow, ttl=60))
    await asyncio.wait_for(started.wait(), 10)
    # A wait that outlasts any slow machine: the waiter is still waiting when cancelled.
    patient = AsyncCacheGuard(
        other.client, namespace=guard._state.namespace, ttl_jitter=0, wait_timeout=600
    )
    waiter = asyncio.ensure_future(patient.get_or_load("k", lambda: "waiter", ttl=60))
    channel = patient.keys("k").released_channel
    assert await asyncio.to_thread(wait_until, lambda: subscribers(client, channel) >= 1, 60)
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    assert await filling == "filled"
    assert await other.get_or_load("k", lambda: "waiter", ttl=60) == "filled"
    assert await asyncio.to_thread(lock_free, client, guard, "k")
    assert len(patient._state.flights) == 0
    await patient.aclose()


async def test_a_cancelled_writer_releases_its_locks(
    guard: AsyncCacheGuard, other: AsyncCacheGuard, client: redis.Redis
) -> None:
    inside, never = asyncio.Event(), asyncio.Event()

    async def write() -> None:
        async with guard.write("a", "b"):
            inside.set()
            await never.wait()

    writer = asyncio.ensure_future(write())
    await asyncio.wait_for(inside.wait(), 10)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await asyncio.to_thread(lock_free, client, guard, "a")
    assert await asyncio.to_thread(lock_free, client, guard, "b")
    async with other.write("a", "b", timeout=5):  # free for another owner at once
        pass


async def test_a_guard_used_from_a_second_event_loop_fails_clearly(
    guard: AsyncCacheGuard,
) -> None:
    assert await guard.get_or_load("k", lambda: "v", ttl=60) == "v"
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            asyncio.run(guard.get_or_load("k", lambda: "v", ttl=60))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert len(errors) == 1
    assert isinstance(errors[0], WrongEventLoop)
    assert "event loop" in str(errors[0])


async def test_hundreds_of_waiting_tasks_get_one_load(
    guard: AsyncCacheGuard, other: AsyncCacheGuard
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def load() -> dict[str, Any]:
        calls.append(1)
        started.set()
        await release.wait()
        return {"menu": "list"}

    first = asyncio.ensure_future(guard.get_or_load("menu:list", load, ttl=60))
    await asyncio.wait_for(started.wait(), 10)
    tasks = [
        asyncio.ensure_future(g.get_or_load("menu:list", load, ttl=60))
        for g in (guard, other)
        for _ in range(150)
    ]
    await asyncio.sleep(0)
    release.set()
    assert await first == {"menu": "list"}
    assert await asyncio.wait_for(asyncio.gather(*tasks), 30) == [{"menu": "list"}] * 300
    assert calls == [1]


async def test_l1_keeps_copies_and_drops_them_on_invalidation(
    redis_url: str, namespace: str, other: AsyncCacheGuard
) -> None:
    guard = AsyncCacheGuard(
        redis.asyncio.Redis.from_url(redis_url), namespace=namespace, l1_maxsize=100, l1_ttl=60
    )
    try:
        assert await guard.get_or_load("k", lambda: "v1", ttl=60) == "v1"
        l1 = guard._state.l1
        assert l1 is not None
        # The feed subscribes in a task of the loop; a copy is kept once it is live.
        for _ in range(500):
            await guard.get_or_load("k", lambda: "v1", ttl=60)
            if "k" in l1:
                break
            await asyncio.sleep(0.01)
        assert "k" in l1
        before = guard.stats().l1_hits
        assert await guard.get_or_load("k", lambda: "other", ttl=60) == "v1"
        assert guard.stats().l1_hits == before + 1
        await other.invalidate("k")  # another process: reaches L1 through pub/sub
        for _ in range(500):
            if "k" not in l1:
                break
            await asyncio.sleep(0.01)
        assert "k" not in l1
        assert await guard.get_or_load("k", lambda: "v2", ttl=60) == "v2"
    finally:
        await guard.aclose()
        await guard.client.aclose()


async def test_background_work_starts_in_a_context_of_its_own(guard: AsyncCacheGuard) -> None:
    """A background refresh started from inside a load is nobody's nested load: it must
    not see the caller's keys under load (a spurious RecursiveLoadError) or its open
    database snapshots."""
    from cacheguard.cache.loading import _LOADING

    seen: list[frozenset[tuple[int, str]]] = []

    async def look() -> None:
        seen.append(_LOADING.get())

    with guard._state.loads.loading("outer"):
        assert _LOADING.get()  # the caller is loading "outer"
        guard._spawn(look(), "probe")
    await asyncio.gather(*guard._tasks)
    assert seen == [frozenset()]
