"""The read-write lock contract for the asyncio stores, written once and run against
each of them: ``AsyncRedisRWLock``, ``AsyncRedlockRWLock`` and ``AsyncPostgresRWLock``.

The rules of tests/test_lock_contract.py, on asyncio: readers share, a writer
excludes and waits for the readers, ``LockTimeout`` at the deadline, reentrancy and
downgrade for one owner, upgrade refused with ``LockUpgradeError``, a holder that
dies frees the lock by itself; writer preference, fencing tokens, a frozen holder.
And two that only the asyncio side has: a writer task cancelled while it waits
leaves nothing behind, and the sync and asyncio locks of one name are one lock.
Stores: tests/async_lock_stores.py (on the servers of tests/lock_stores.py).
ZooKeeper has no asyncio lock (kazoo is sync), so it is not here.

Owners are tasks (every asyncio store's default owner is the current task), so
"another owner" is another task here, or another process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from cacheguard.exceptions import LockTimeout, LockUpgradeError
from tests.async_lock_stores import (
    ASYNC_STORES,
    AsyncStore,
    held_briefly,
    hold_in_child,
    outcome,
    token_of,
)
from tests.lock_stores import STORES, Store
from tests.procs import CTX, start_process


@pytest.fixture(scope="module", params=sorted(ASYNC_STORES), ids=lambda name: f"{name}-async")
def servers(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The sync store whose servers (and namespace) the asyncio store uses."""
    with STORES[request.param]() as built:
        yield built


@pytest.fixture
async def store(servers: Store) -> AsyncIterator[AsyncStore]:
    async with ASYNC_STORES[servers.name](servers) as built:
        yield built


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"contract-{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"


# -- sharing and excluding ----------------------------------------------------------


async def test_readers_share(store: AsyncStore, name: str) -> None:
    async with store.make(name).read(timeout=5):
        other = store.in_task(lambda: held_briefly(store.make(name).read(timeout=5)))
        assert await outcome(other, 10) == "held"


@pytest.mark.slow
async def test_a_writer_excludes_readers_and_writers(store: AsyncStore, name: str) -> None:
    async with store.make(name).write(timeout=5):
        reader = store.in_task(lambda: held_briefly(store.make(name).read(timeout=0.5)))
        assert isinstance(await outcome(reader, 30), LockTimeout)
        writer = store.in_task(lambda: held_briefly(store.make(name).write(timeout=0.5)))
        assert isinstance(await outcome(writer, 30), LockTimeout)


async def test_a_writer_waits_for_the_readers_then_gets_in(store: AsyncStore, name: str) -> None:
    reader = await store.make(name).acquire_read(timeout=5)
    entered = asyncio.Event()

    async def write() -> str:
        async with store.make(name).write(timeout=30):
            entered.set()
        return "wrote"

    writer = store.in_task(write)
    await _until_a_writer_waits(store, name)  # queued in the store, not merely not run yet
    assert not entered.is_set()
    await reader.release()
    assert await outcome(writer, 30) == "wrote"


@pytest.mark.slow
async def test_timeout_raises_lock_timeout_naming_the_lock(store: AsyncStore, name: str) -> None:
    async with store.make(name).write(timeout=5):
        attempt = store.in_task(lambda: held_briefly(store.make(name).write(timeout=0.3)))
        error = await outcome(attempt, 30)
    assert isinstance(error, LockTimeout)
    assert name in str(error)


@pytest.mark.slow
async def test_a_timedelta_timeout_is_its_seconds(store: AsyncStore, name: str) -> None:
    """Durations are seconds or a timedelta (issue #26): a wait given a timedelta
    ends at its deadline, and a bad one is refused as its number is."""
    async with store.make(name).write(timeout=timedelta(seconds=5)):
        attempt = store.in_task(
            lambda: held_briefly(store.make(name).write(timeout=timedelta(milliseconds=300)))
        )
        assert isinstance(await outcome(attempt, 30), LockTimeout)
        for bad in (timedelta(0), timedelta(seconds=-1), timedelta(days=3651)):
            with pytest.raises(ValueError, match=r"^timeout must be"):
                await store.make(name).acquire_read(timeout=bad)
    async with store.make(name).read(timeout=timedelta(seconds=5)):
        pass


# -- one owner's holds ----------------------------------------------------------------


@pytest.mark.slow
async def test_reentrant_and_downgrade(store: AsyncStore, name: str) -> None:
    lock = store.make(name)
    async with lock.write(timeout=5), lock.write(timeout=5):
        pass  # a write hold nests
    outer = await lock.acquire_write(timeout=5)
    inner = await lock.acquire_read(timeout=5)  # downgrade: read while writing
    await outer.release()
    # Still a reader: another reader may join, a writer may not.
    joined = store.in_task(lambda: held_briefly(store.make(name).read(timeout=5)))
    assert await outcome(joined, 10) == "held"
    blocked = store.in_task(lambda: held_briefly(store.make(name).write(timeout=0.3)))
    assert isinstance(await outcome(blocked, 30), LockTimeout)
    await inner.release()
    writer = store.in_task(lambda: held_briefly(store.make(name).write(timeout=5)))
    assert await outcome(writer, 10) == "held"


async def test_upgrade_is_refused(store: AsyncStore, name: str) -> None:
    lock = store.make(name)
    async with lock.read(timeout=5):
        with pytest.raises(LockUpgradeError):
            await lock.acquire_write(timeout=5)
    # The refusal left nothing behind: a writer gets in.
    writer = store.in_task(lambda: held_briefly(store.make(name).write(timeout=5)))
    assert await outcome(writer, 10) == "held"


# -- the store's own offers -------------------------------------------------------------


@pytest.mark.slow
async def test_writer_preference(store: AsyncStore, name: str) -> None:
    reader = await store.make(name).acquire_read(timeout=5)
    writer_in = asyncio.Event()

    async def write() -> None:
        async with store.make(name).write(timeout=30):
            writer_in.set()

    writer = store.in_task(write)
    await _until_a_writer_waits(store, name)
    late = store.in_task(lambda: held_briefly(store.make(name).read(timeout=0.5)))
    assert isinstance(await outcome(late, 30), LockTimeout)
    await reader.release()
    assert await outcome(writer, 30) is None
    assert writer_in.is_set()


async def test_fencing_tokens_increase(store: AsyncStore, name: str) -> None:
    lock = store.make(name)
    tokens = []
    for _ in range(3):
        async with lock.write(timeout=5) as handle:
            tokens.append(handle.token)
    other = store.in_task(lambda: token_of(store.make(name).write(timeout=5)))
    tokens.append(await outcome(other, 10))
    assert tokens == sorted(set(tokens)), tokens


# -- cancellation ------------------------------------------------------------------------------


async def test_a_writer_cancelled_while_waiting_leaves_nothing_behind(
    store: AsyncStore, name: str
) -> None:
    reader = await store.make(name).acquire_read(timeout=5)
    writer = store.in_task(lambda: store.make(name).acquire_write(timeout=30))
    await _until_a_writer_waits(store, name, parked=True)  # cancelled in its wait
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    # No waiting writer is left to hold new readers off: one gets in at once.
    assert not await store.writer_waiting(name)
    late = await outcome(store.in_task(lambda: store.make(name).try_acquire_read()), 10)
    assert late is not None
    assert not isinstance(late, BaseException), late
    await late.release()
    await reader.release()
    # Nor a hold: a writer gets in at once.
    free = await outcome(store.in_task(lambda: store.make(name).try_acquire_write()), 10)
    assert free is not None
    assert not isinstance(free, BaseException), free
    await free.release()


# -- one lock for both drivers -----------------------------------------------------------------


async def test_a_sync_holder_excludes_an_async_acquirer_and_its_release_lets_it_in(
    store: AsyncStore, name: str
) -> None:
    sync_lock = store.sync_lock(name)
    held = await asyncio.to_thread(sync_lock.acquire_write, 5, owner="sync-holder")
    try:
        lock = store.make(name)
        assert await lock.try_acquire_read() is None
        assert await lock.try_acquire_write() is None
        waiter = store.in_task(lambda: token_of(store.make(name).write(timeout=30)))
        await _until_a_writer_waits(store, name)
    finally:
        await asyncio.to_thread(held.release)
    assert await outcome(waiter, 30) > held.token  # one fencing counter for both drivers


async def test_an_async_holder_excludes_a_sync_acquirer_and_its_release_lets_it_in(
    store: AsyncStore, name: str
) -> None:
    held = await store.make(name).acquire_write(timeout=5)
    sync_lock = store.sync_lock(name)
    assert await asyncio.to_thread(sync_lock.try_acquire_read, owner="sync-reader") is None
    assert await asyncio.to_thread(sync_lock.try_acquire_write, owner="sync-writer") is None

    def sync_write() -> int:
        with sync_lock.write(timeout=30, owner="sync-waiter") as handle:
            return int(handle.token)

    waiter = asyncio.ensure_future(asyncio.to_thread(sync_write))
    await _until_a_writer_waits(store, name)
    await held.release()
    assert await outcome(waiter, 30) > held.token


# -- dead and frozen holders ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_killed_holder_frees_the_lock(store: AsyncStore, name: str, mode: str) -> None:
    child, pid = await _holding_child(store, name, mode)
    os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(child.join, 10)
    async with store.make(name).write(timeout=store.recovers_within + 10):
        pass


@pytest.mark.slow
async def test_a_frozen_holder(store: AsyncStore, name: str) -> None:
    child, pid = await _holding_child(store, name, "write")
    os.kill(pid, signal.SIGSTOP)
    try:
        if store.sync.frozen_holder == "taken over":
            async with store.make(name).write(timeout=store.recovers_within + 10):
                pass
        else:
            with pytest.raises(LockTimeout):
                await store.make(name).acquire_write(timeout=store.recovers_within + 1)
    finally:
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(child.join, 10)


# -- helpers ------------------------------------------------------------------------------------


async def _until_a_writer_waits(store: AsyncStore, name: str, *, parked: bool = False) -> None:
    """Until a writer is queued on ``name`` (``parked``: and waiting, past its round trips)."""
    probe = store.writer_parked if parked else store.writer_waiting
    deadline = time.monotonic() + 10
    while not await probe(name):  # a condition polled with a deadline
        assert time.monotonic() < deadline, "the writer never queued"
        await asyncio.sleep(0.01)


async def _holding_child(store: AsyncStore, name: str, mode: str) -> tuple[BaseProcess, int]:
    """A child process holding the asyncio lock ``name`` in ``mode``, and its pid."""
    maker, args = store.maker
    ready = CTX.Event()
    child = start_process(hold_in_child, maker, args, name, mode, ready)
    if not await asyncio.to_thread(_ready_or_dead, child, ready, 30):
        child.kill()
        raise AssertionError(f"the child never took the lock (exit code {child.exitcode})")
    assert child.pid is not None  # started
    return child, child.pid


def _ready_or_dead(child: BaseProcess, ready: Any, within: float) -> bool:
    """Did the child say it holds the lock within ``within`` s? A child that died
    (its traceback is on stderr) ends the wait at once."""
    deadline = time.monotonic() + within
    while not ready.wait(0.1):  # the event or the child's death, polled with a deadline
        if not child.is_alive() or time.monotonic() > deadline:
            return False
    return True
