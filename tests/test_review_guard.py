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

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
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
            assert wait_until(lambda: "k" in guard._flights._flights, 10)
            assert guard.get_or_load("k", lambda: "mine", ttl=60) == "mine"
        reader.join(30)
        assert got["reader"] == "committed"  # loaded after the write: not the writer's
        assert guard.peek("k") == "committed"
    finally:
        guard.close()
        guard.client.close()


async def test_an_async_writer_reads_its_own_view_while_another_task_leads_the_key(
    aguard: AsyncCacheGuard,
) -> None:
    async with aguard.write("k"):
        reader = asyncio.ensure_future(aguard.get_or_load("k", lambda: "committed", ttl=60))
        for _ in range(100):
            if "k" in aguard._flights._flights:
                break
            await asyncio.sleep(0)
        assert "k" in aguard._flights._flights
        mine = await in_this_task(aguard.get_or_load("k", lambda: "mine", ttl=60), 10)
        assert mine == "mine"
    assert await asyncio.wait_for(reader, 10) == "committed"
    assert await aguard.peek("k") == "committed"
