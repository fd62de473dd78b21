"""Guarantees pinned on their mechanism rather than on timing.

Each test here fails when the guarantee it names is removed (tools/mutants.py
removes them one by one): a waiter that can only be woken by the announcement,
a value that only the closing invalidation can remove, an announcement that only
the fill-start check can refuse.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import MISSING, CacheGuard, LockHandle, LockLostError, RedisRWLock
from cacheguard.aio import AsyncCacheGuard
from cacheguard.backoff import Backoff
from cacheguard.cache.codec import MsgpackCodec
from cacheguard.cache.entry import pack_entry
from cacheguard.cache.scripts import FILL_BEGIN
from cacheguard.redis.notifier import Subscription
from tests.helpers import make_guard, start_gated_fill, subscribers, wait_until, waiting_in

# A retry timer of a minute: within a test's deadline only an announcement wakes.
_NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)


def test_lock_waiter_is_woken_by_the_release_announcement(
    client: redis.Redis, namespace: str
) -> None:
    """The holder's lease and the waiter's retry timer both run for a minute, longer
    than the test waits for the waiter: only the release's PUBLISH can wake it. The
    release comes once the waiter waits (after its try that follows subscribing: a
    release before that try would let the try succeed without any message)."""

    def lock() -> RedisRWLock:
        return RedisRWLock(
            client, "res", namespace=namespace, lease=60.0, backoff=_NO_TIMER_WAKE_UP
        )

    held = lock().acquire_write(owner="holder")
    got: list[LockHandle] = []
    waiter = threading.Thread(
        target=lambda: got.append(lock().acquire_write(timeout=60, owner="waiter")),
        daemon=True,  # under a broken wake-up it would outlive the test
    )
    keys = lock().keys
    with waiting_in(waiter) as in_wait:  # a message from then on is kept for its wait
        waiter.start()
        assert wait_until(lambda: client.hexists(keys.lock, "q:waiter"))
        assert wait_until(lambda: subscribers(client, keys.released_channel) >= 1)
        assert in_wait.wait(10), "the waiter never started waiting"
    held.release()
    waiter.join(20)
    assert len(got) == 1
    assert got[0].token > held.token
    got[0].release()


@pytest.mark.parametrize("body_raises", [False, True], ids=["body returns", "body raises"])
def test_a_value_filled_while_the_writer_lost_its_lock_is_dropped_at_the_end(
    client: redis.Redis, namespace: str, body_raises: bool
) -> None:
    """A writer paused past its lease loses its lock mid-body; a reader then fills
    the key from the database as it was before the commit. The invalidation that
    closes the write path (also when the body raised) drops that value; then the
    loss is raised (LockLostError), unless the body's own error is."""
    writer = make_guard(client, namespace)
    reader = make_guard(client, namespace)  # another owner of the same keys

    class BodyFailed(Exception):
        pass

    def body() -> None:
        client.delete(writer.keys("k").lock)  # the lease ran out
        assert reader.get_or_load("k", lambda: "before the commit", ttl=60) == ("before the commit")
        assert reader.peek("k") == "before the commit"
        if body_raises:
            raise BodyFailed

    with pytest.raises(BodyFailed if body_raises else LockLostError), writer.write("k"):
        body()
    assert reader.peek("k") is MISSING
    assert reader.get_or_load("k", lambda: "after the commit", ttl=60) == "after the commit"


def test_an_older_fills_announcement_is_refused_even_at_the_same_version(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key has never been invalidated (or its version key expired), so an entry
    announced by a fill of long ago carries the very version the waiter saw: only
    the check on the fill's start time refuses it. The fill under way ends only once
    the waiter has judged that announcement (it waits again, or it took it): ended
    sooner, a slow waiter's next try would find the new value and never judge it."""
    old = pack_entry(MsgpackCodec(), "old", created=time.time(), ttl=60, version=0,
                     load_duration=0.0)  # fmt: skip
    announcement = b"V1:" + old  # began at µs 1: long before the fill under way
    waits_after_it = threading.Event()
    delivered = threading.Event()
    real_wait = Subscription.wait

    def wait(self: Subscription, seconds: float) -> list[bytes]:
        if delivered.is_set():
            waits_after_it.set()  # the announcement was judged, and refused
        messages = real_wait(self, seconds)
        if announcement in messages:
            delivered.set()
        return messages

    monkeypatch.setattr(Subscription, "wait", wait)
    filler = make_guard(client, namespace)
    waiter = make_guard(client, namespace)  # another owner: waits for the filler
    release, fill = start_gated_fill(filler, "k", "new")
    got: list[Any] = []
    reader = threading.Thread(
        target=lambda: got.append(waiter.get_or_load("k", lambda: "unlocked", ttl=60))
    )
    reader.start()
    channel = waiter.keys("k").released_channel
    assert wait_until(lambda: subscribers(client, channel) >= 1)
    client.spublish(channel, announcement)
    assert wait_until(lambda: waits_after_it.is_set() or not reader.is_alive(), 10)
    release.set()
    fill.join(5)
    reader.join(5)
    assert got == ["new"]


def test_a_dead_fillers_fill_ends_with_its_lease_while_others_keep_the_lock_alive(
    client: redis.Redis, namespace: str
) -> None:
    """A filler that died leaves its fill in the key's lock hash; a reader holding the
    same lock keeps the hash (and its TTL) alive. The dead filler's fill must end with
    its own lease, so that the next caller fills the key."""
    guard = make_guard(client, namespace, wait_timeout=10.0)
    keys = guard.keys("k")
    begun = FILL_BEGIN(client, [keys.value, keys.lock, keys.version], ["dead", 200, "0", 60_000])
    assert int(begun[0]) == 1  # "dead" holds the fill for 200 ms and never ends it
    reader = RedisRWLock(client, "k", namespace=namespace, lease=60.0, watchdog=False)
    held = reader.acquire_read(owner="long reader")
    try:
        assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        assert guard.peek("k") == "loaded"
    finally:
        held.release()


# -- the hit path's flight seal, and how long a fill's version stays provable ------------


def _joined_as_follower(guard: Any, name: str) -> bool:
    """Has a caller joined ``name``'s flight after its leader's GET was sent?"""
    flight = guard._state.flights._flights.get(name)
    return flight is not None and flight.newest_follower >= 1


def test_a_read_that_starts_after_a_write_never_shares_a_get_sent_before_it(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader's GET has been answered by Redis (the old value) but the reply is
    held up; meanwhile a write runs and returns in another process (here another
    guard: a write of this guard closes the flight, see
    tests/test_guard_both_drivers.py). A read that starts now joins the leader's
    flight, yet must not take that reply: the flight was sealed for the GET, so the
    late follower reads again and loads the new value."""
    _no_answer_from_before_the_write(make_guard(client, namespace), client, monkeypatch)


def test_a_read_through_the_flow_that_starts_after_a_write_never_shares_a_get_sent_before_it(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when the leader's GET is the read flow's (a guard that remembers the
    values it saw for outages reads through the flow, not the hit path)."""
    guard = make_guard(client, namespace, outage_ttl=60)
    _no_answer_from_before_the_write(guard, client, monkeypatch)


def _no_answer_from_before_the_write(
    guard: CacheGuard, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = {"k": "old"}
    assert guard.get_or_load("k", lambda: db["k"], ttl=60) == "old"
    got_reply, deliver = threading.Event(), threading.Event()
    real_get = client.get

    def held_get(key: Any) -> Any:
        reply = real_get(key)
        if threading.current_thread().name == "early reader":
            got_reply.set()
            assert deliver.wait(10)
        return reply

    monkeypatch.setattr(client, "get", held_get)
    got: dict[str, Any] = {}

    def read(who: str) -> None:
        got[who] = guard.get_or_load("k", lambda: db["k"], ttl=60)

    early = threading.Thread(target=read, args=("early reader",), name="early reader")
    early.start()
    assert got_reply.wait(5), "the early reader's GET was never answered"
    with make_guard(client, guard.namespace).write("k"):  # another process's write
        db["k"] = "new"
    late = threading.Thread(target=read, args=("late reader",), name="late reader")
    late.start()
    assert wait_until(lambda: _joined_as_follower(guard, "k"))
    deliver.set()
    early.join(10)
    late.join(10)
    assert got == {"early reader": "old", "late reader": "new"}


async def test_an_async_read_that_starts_after_a_write_never_shares_a_get_sent_before_it(
    aclient: redis.asyncio.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio guard's twin of the test above: the leader's GET reply is held
    until a task that started after another process's ``write`` returned has joined
    its flight."""
    guard = AsyncCacheGuard(aclient, namespace=namespace, ttl_jitter=0)
    db = {"k": "old"}
    assert await guard.get_or_load("k", lambda: db["k"], ttl=60) == "old"
    got_reply, deliver = asyncio.Event(), asyncio.Event()
    real_get = aclient.get

    async def held_get(key: Any) -> Any:
        reply = await real_get(key)
        task = asyncio.current_task()
        if task is not None and task.get_name() == "early reader":
            got_reply.set()
            await asyncio.wait_for(deliver.wait(), 10)
        return reply

    monkeypatch.setattr(aclient, "get", held_get)

    async def read() -> Any:
        return await guard.get_or_load("k", lambda: db["k"], ttl=60)

    early = asyncio.create_task(read(), name="early reader")
    await asyncio.wait_for(got_reply.wait(), 5)
    elsewhere = AsyncCacheGuard(aclient, namespace=namespace, ttl_jitter=0)
    async with elsewhere.write("k"):  # another process's write
        db["k"] = "new"
    await elsewhere.aclose()
    late = asyncio.create_task(read(), name="late reader")
    deadline = asyncio.get_running_loop().time() + 5
    while not _joined_as_follower(guard, "k"):
        assert asyncio.get_running_loop().time() < deadline, "the late reader never joined"
        await asyncio.sleep(0)  # let the late task run up to its wait
    deliver.set()
    assert await asyncio.wait_for(early, 10) == "old"
    assert await asyncio.wait_for(late, 10) == "new"
    await guard.aclose()


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.slow
def test_a_fill_older_than_version_ttl_does_not_store(client: redis.Redis, namespace: str) -> None:
    """An invalidation during a fill moves the key's version; that record lives for
    ``version_ttl``. A fill still loading once it is gone would find no version, the
    very "none" it began with, and store what it loaded before the invalidation:
    a fill older than ``version_ttl`` cannot prove its version, so it stores nothing.
    (Today's invalidations also take the fill's mark; the invalidation here is one
    by a process of an older cacheguard, during a rolling upgrade, which moves only
    the version: the age check is what refuses the store.)"""
    guard = make_guard(client, namespace, version_ttl=1.0)
    release, fill = start_gated_fill(guard, "k", "before the invalidation")
    version_key = guard.keys("k").version
    client.set(version_key, "999999", px=1000)  # the older process's invalidation
    client.delete(guard.keys("k").value)
    assert client.exists(version_key)
    assert wait_until(lambda: not client.exists(version_key), timeout=10)  # forgotten
    release.set()
    fill.join(10)
    assert guard.peek("k") is MISSING
    assert guard.get_or_load("k", lambda: "after", ttl=60) == "after"


def test_a_fill_keeps_its_keys_version_alive_until_it_stores(
    client: redis.Redis, namespace: str
) -> None:
    """The key's version was about to expire when a fill began. fill_begin renews
    it for ``version_ttl``, so the store at the fill's end still finds the version
    it began with (without the renewal it would be gone, and the store refused)."""
    guard = make_guard(client, namespace, version_ttl=60.0)
    guard.invalidate("k")
    version_key = guard.keys("k").version
    assert client.pexpire(version_key, 300)
    ends = int(client.execute_command("PEXPIRETIME", version_key))
    release, fill = start_gated_fill(guard, "k", "loaded")
    # Past the moment the version would have expired, by the server's clock.
    assert wait_until(lambda: _server_ms(client) > ends + 50, timeout=10)
    release.set()
    fill.join(10)
    assert guard.peek("k") == "loaded"
