"""One lock suite, run against the sync driver and the asyncio driver alike.

The bodies are written once as ``async def``; ``tests/lock_drivers.py`` awaits the
asyncio lock and calls the sync one. Waits that must be ended by a release are
given a retry timer of a minute (and holders a lease of a minute), so that only
the release announcement can end them within the test's own deadline.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

from cacheguard import LockLostError, LockTimeout, LockUpgradeError
from tests.helpers import waiting_in
from tests.lock_drivers import (
    NO_TIMER_WAKE_UP,
    Driver,
    eventually,
    fields,
    maybe_await,
    release,
)


@pytest.fixture(params=["sync", "async"])
def driver(
    request: pytest.FixtureRequest,
    client: redis.Redis,
    aclient: redis.asyncio.Redis,
    namespace: str,
) -> Driver:
    return Driver(request.param, client, aclient, namespace)


async def test_readers_share(driver: Driver) -> None:
    lock = driver.lock()
    a = await lock.acquire_read(owner="a")
    b = await lock.acquire_read(owner="b")
    f = fields(driver.client, lock.keys.lock)
    assert f["mode"] == "read"
    assert (f["r:a"], f["r:b"]) == ("1", "1")
    await release(a)
    await release(b)
    assert not driver.client.exists(lock.keys.lock)


async def test_a_writer_excludes_readers_and_writers(driver: Driver) -> None:
    lock = driver.lock()
    writer = await lock.acquire_write(owner="w")
    assert await lock.try_acquire_read(owner="r") is None
    assert await lock.try_acquire_write(owner="w2") is None
    await release(writer)
    reader = await lock.acquire_read(owner="r")
    assert await lock.try_acquire_write(owner="w2") is None  # readers exclude writers
    await release(reader)
    assert not driver.client.exists(lock.keys.lock)


async def test_one_owner_reenters(driver: Driver) -> None:
    lock = driver.lock()
    outer = await lock.acquire_write()  # the default owner: this thread, or this task
    inner = await lock.acquire_write()
    assert inner.owner == outer.owner
    assert inner.token == outer.token
    assert fields(driver.client, lock.keys.lock)[f"w:{outer.owner}"] == "2"
    read = await lock.acquire_read()  # a writer may read: the first step of a downgrade
    await release(inner)
    await release(outer)
    f = fields(driver.client, lock.keys.lock)
    assert f["mode"] == "read"
    assert f[f"r:{outer.owner}"] == "1"
    await release(read)
    assert not driver.client.exists(lock.keys.lock)


async def test_upgrade_is_refused(driver: Driver) -> None:
    lock = driver.lock()
    read = await lock.acquire_read()
    with pytest.raises(LockUpgradeError):
        await lock.acquire_write(timeout=5)
    with pytest.raises(LockUpgradeError):
        await lock.try_acquire_write()
    await release(read)
    assert not driver.client.exists(lock.keys.lock)


async def test_fencing_tokens_strictly_increase(driver: Driver) -> None:
    lock = driver.lock()
    tokens = []
    for _ in range(5):
        async with lock.write(timeout=5) as handle:
            tokens.append(handle.token)
    assert tokens == sorted(set(tokens))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_timeout_raises_lock_timeout_at_its_deadline(driver: Driver, mode: str) -> None:
    """The waiter's retry timer is a minute and the holder's lease too: only the
    deadline can end the wait within the bound checked here."""
    holder = await driver.lock(lease=60).acquire_write(owner="holder")
    lock = driver.lock(backoff=NO_TIMER_WAKE_UP)
    acquire = lock.acquire_read if mode == "read" else lock.acquire_write
    start = time.monotonic()
    with pytest.raises(LockTimeout) as info:
        await acquire(timeout=0.5, owner="waiter")
    assert info.value.waited >= 0.5
    assert info.value.mode == mode
    assert time.monotonic() - start < 0.5 + 10  # not the minute of the retry timer
    # A writer that timed out withdrew its waiting mark.
    assert not any(k.startswith("q:") for k in fields(driver.client, lock.keys.lock))
    await release(holder)


async def test_a_release_wakes_a_waiter_through_pubsub(driver: Driver) -> None:
    holder = await driver.lock(lease=60).acquire_write(owner="holder")
    lock = driver.lock(lease=60, backoff=NO_TIMER_WAKE_UP)
    with waiting_in() as waits:
        waiter = driver.in_background(lambda: lock.lock.acquire_write(timeout=60, owner="waiter"))
        try:
            assert await eventually(lambda: driver.client.hexists(lock.keys.lock, "q:waiter"))
            assert await eventually(waits.is_set)  # subscribed, tried again, and waits
            await release(holder)
            handle = await asyncio.wait_for(waiter, 20)
        finally:
            waiter.cancel()  # an asyncio waiter left by a failure must not outlive the test
    assert handle.token > holder.token
    await release(handle)
    assert not driver.client.exists(lock.keys.lock)


@pytest.mark.slow
async def test_the_watchdog_renews_past_the_lease(driver: Driver) -> None:
    dog = driver.watchdog()
    lock = driver.lock(lease=0.5, watchdog=dog)
    handle = await lock.acquire_write()
    # Four renewals, lease / 3 apart: more than a whole lease after the acquisition.
    assert await eventually(lambda: dog.renewals >= 4, timeout=10)
    assert not handle.lost
    assert driver.client.hexists(lock.keys.lock, f"w:{handle.owner}")
    assert await lock.try_acquire_write(owner="rival") is None
    await release(handle)
    assert not dog.watching(handle)
    assert not driver.client.exists(lock.keys.lock)


@pytest.mark.slow
async def test_a_dead_holder_is_taken_over_after_its_lease(driver: Driver) -> None:
    """The dead holder never renews; the waiter's retry timer is a minute, so only
    the lease's end (which the busy reply reports) can let it in in time."""
    await driver.lock(lease=0.5, watchdog=False).acquire_write(owner="dead")
    lock = driver.lock(backoff=NO_TIMER_WAKE_UP)
    async with lock.write(timeout=10) as handle:
        assert handle.owner != "dead"
    assert not driver.client.exists(lock.keys.lock)


async def test_releasing_a_lost_handle_raises_and_spares_the_new_holder(driver: Driver) -> None:
    lost = []
    lock = driver.lock(lease=30, watchdog=driver.watchdog(), on_lost=lost.append)
    handle = await lock.acquire_write()
    driver.client.delete(lock.keys.lock)  # behind the holder's back
    newcomer = await lock.acquire_write(owner="newcomer", timeout=5)
    # A renewal finds the holding gone (asked for now, not in 10 s) and marks it lost.
    renewed = await maybe_await(handle.renew())
    assert renewed is False
    assert handle.lost
    assert await eventually(lambda: lost == [handle])
    with pytest.raises(LockLostError) as info:
        await release(handle)
    assert info.value.name == "res"
    f = fields(driver.client, lock.keys.lock)
    assert f["w:newcomer"] == "1"
    assert f["token"] == str(newcomer.token)
    await release(newcomer)
