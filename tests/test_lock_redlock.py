"""Redlock's own guarantees, on five real ``redis-server`` masters per test.

The common read-write lock rules run in tests/test_lock_contract.py (the
"redlock" store); here are the faults a quorum is for and the rules it adds:
masters killed (two of five: still a lock; three: a refusal within the deadline,
never a false grant), a master frozen by SIGSTOP (an acquire is not held up, and
the master is tidied once it wakes), a killed holder process, a round that falls
short giving back what it got, a grant that came too late, renewal and release on
every master, and fencing tokens across different majorities.

Another holder on some masters only is played by a ``RedisRWLock`` on each of
those masters: the same hash, the same scripts, so the Redlock sees a holder there.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import RedisRWLock
from cacheguard.aio import AsyncRedlockRWLock
from cacheguard.exceptions import (
    BackendUnavailable,
    LockLostError,
    LockTimeout,
    LockUpgradeError,
)
from cacheguard.locks import RedlockRWLock
from cacheguard.locks.redis.lua import FENCE_TTL_MS
from cacheguard.locks.redlock.async_rwlock import default_async_redlock_watchdog
from cacheguard.locks.redlock.holdings import process_holdings
from cacheguard.testing import OwnedRedisServer
from tests.lock_stores import REDLOCK_LEASE, redlock_lock, redlock_masters, redlock_writer_waiting
from tests.procs import CTX, run_processes, start_process


@pytest.fixture
def masters() -> Iterator[list[OwnedRedisServer]]:
    """Five fresh masters for this test (it may kill or freeze some)."""
    with redlock_masters() as servers:
        yield servers


@pytest.fixture
def namespace() -> str:
    return f"rl{uuid.uuid4().hex[:10]}"


@pytest.fixture
def probes(masters: list[OwnedRedisServer]) -> Iterator[list[redis.Redis]]:
    """Test-side clients, one per master, to look at what each master holds."""
    clients = [redis.Redis.from_url(m.url, socket_timeout=2) for m in masters]
    yield clients
    for client in clients:
        client.close()


def make_lock(masters: list[OwnedRedisServer], namespace: str, **kwargs: Any) -> RedlockRWLock:
    # The clients keep redis-py's own timeouts (5 s): the lock must cap them itself.
    clients = [redis.Redis.from_url(m.url) for m in masters]
    kwargs.setdefault("lease", REDLOCK_LEASE)
    return RedlockRWLock(clients, "menu:7", namespace=namespace, **kwargs)


def held_on(probes: list[redis.Redis], key: str) -> list[int]:
    """The masters (indexes) whose lock hash exists; a dead master counts as empty."""
    found = []
    for index, probe in enumerate(probes):
        try:
            if probe.exists(key):
                found.append(index)
        except redis.RedisError:
            pass
    return found


def wait_until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():  # a condition polled with a deadline
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        time.sleep(0.02)


class Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None

    def result(self, within: float) -> Any:
        assert self.done.wait(within), f"no result within {within} s"
        return self.value


def in_thread(work: Callable[[], Any]) -> Outcome:
    """Run ``work`` as another owner (a thread): its result or the exception it raised."""
    outcome = Outcome()

    def run() -> None:
        try:
            outcome.value = work()
        except Exception as exc:
            outcome.value = exc
        outcome.done.set()

    threading.Thread(target=run, daemon=True).start()
    return outcome


def hold_on(
    masters: list[OwnedRedisServer], indexes: list[int], namespace: str, mode: str = "write"
) -> list[Any]:
    """Another owner's holds on these masters only (a holder as each of those masters
    sees it; read holds keep writers out without moving the fencing counters)."""
    handles = []
    for i in indexes:
        client = redis.Redis.from_url(masters[i].url, socket_timeout=2)
        lock = RedisRWLock(client, "menu:7", namespace=namespace, lease=30.0, watchdog=False)
        take = lock.acquire_write if mode == "write" else lock.acquire_read
        handles.append(take(timeout=5, owner="someone-else"))
    return handles


def redlock_holdings() -> Any:
    """This process's record of Redlock rounds in flight and live holdings."""
    return process_holdings()


def freeze(server: OwnedRedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def thaw(server: OwnedRedisServer) -> None:
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)


# -- masters killed ------------------------------------------------------------------------------


def test_two_of_five_masters_down_still_a_lock(
    masters: list[OwnedRedisServer], namespace: str
) -> None:
    masters[0].kill()
    masters[1].kill()
    lock = make_lock(masters, namespace)
    with lock.write(timeout=5) as handle:
        assert handle.masters_held == 3
        # Another owner is kept out, readers and writers alike.
        assert in_thread(lock.try_acquire_write).result(10) is None
        assert in_thread(lock.try_acquire_read).result(10) is None
    with lock.read(timeout=5):
        other = in_thread(lambda: lock.acquire_read(timeout=5).release())
        assert other.result(10) is None  # readers still share


@pytest.mark.parametrize("mode", ["read", "write"])
def test_three_of_five_masters_down_refuses_and_leaves_nothing(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str, mode: str
) -> None:
    for server in masters[:3]:
        server.kill()
    lock = make_lock(masters, namespace)
    acquire = lock.acquire_write if mode == "write" else lock.acquire_read
    outcome = in_thread(lambda: acquire(timeout=1.0))
    error = outcome.result(10)  # the call returns: a refusal, within its deadline
    assert isinstance(error, (LockTimeout, BackendUnavailable)), error
    with pytest.raises(BackendUnavailable):
        lock.try_acquire_write()  # one round: no majority answers, no grant
    # The two masters that answered were given back what they granted.
    assert held_on(probes, lock.keys.lock) == []


# -- a frozen master -----------------------------------------------------------------------------


def test_a_frozen_master_does_not_stall_an_acquire(
    masters: list[OwnedRedisServer], namespace: str
) -> None:
    lock = make_lock(masters, namespace)
    lock.acquire_write(timeout=5).release()  # connections open: the next call reaches it
    freeze(masters[0])
    try:
        # Its clients would wait 5 s on it (and retry); the lock's own cap is 0.1 s.
        # (Owners by name: a finished thread's ident, hence its owner, may be reused.)
        outcome = in_thread(lambda: lock.acquire_write(timeout=2.0, owner="holder"))
        handle = outcome.result(10)
        assert not isinstance(handle, Exception), handle
        assert handle.masters_held == 4
        assert lock.try_acquire_read(owner="another") is None
        handle.release()
    finally:
        thaw(masters[0])


def test_a_master_that_did_not_answer_is_tidied_once_it_wakes(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    # A lease far longer than the wait below: the leftover must be released, not expire.
    lock = make_lock(masters, namespace, lease=60.0)
    # With the connection open, the frozen master gets the next acquire call in its
    # socket buffer (its reply never comes in time) and runs it once it wakes.
    lock.acquire_write(timeout=5).release()
    freeze(masters[0])
    try:
        handle = lock.acquire_write(timeout=5)
        assert handle.epochs[0] is None  # no answer from the frozen master
        handle.release()
        assert held_on(probes[1:], lock.keys.lock) == []
    finally:
        thaw(masters[0])
    # The frozen master ran the acquire once it woke; the watchdog releases it there.
    wait_until(lambda: held_on(probes, lock.keys.lock) == [], 10, "the woken master was tidied")


def test_three_frozen_masters_refuse_within_the_deadline(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    lock = make_lock(masters, namespace)
    for server in masters[:3]:
        freeze(server)
    try:
        error = in_thread(lambda: lock.acquire_write(timeout=1.0)).result(15)
        assert isinstance(error, (LockTimeout, BackendUnavailable)), error
        assert held_on(probes[3:], lock.keys.lock) == []
    finally:
        for server in masters[:3]:
            thaw(server)


# -- a killed holder -----------------------------------------------------------------------------


def _hold_in_child(urls: tuple[str, ...], namespace: str, ready: Any) -> None:
    lock = redlock_lock(urls, namespace, "menu:7")
    lock.acquire_write(10)
    ready.set()
    threading.Event().wait()  # held until killed


@pytest.mark.slow
def test_a_killed_holder_is_recovered_after_its_lease_with_a_master_down(
    masters: list[OwnedRedisServer], namespace: str
) -> None:
    ready = CTX.Event()
    child = start_process(_hold_in_child, tuple(m.url for m in masters), namespace, ready)
    try:
        assert ready.wait(30), "the child never took the lock"
        masters[4].kill()  # the next holder's majority must do without it
        lock = make_lock(masters, namespace)
        assert lock.try_acquire_write() is None
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        with lock.write(timeout=REDLOCK_LEASE + 10) as handle:
            # A majority of the five without the dead one (usually all four alive; a
            # loaded machine may let one grant miss the round's deadline).
            assert 3 <= handle.masters_held <= 4
    finally:
        child.kill()
        child.join(10)


# -- what a round gives back ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_round_without_a_majority_gives_back_its_grants(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    others = hold_on(masters, [0, 1, 2], namespace)
    lock = make_lock(masters, namespace)
    assert lock.try_acquire_write() is None  # granted by masters 3 and 4 only
    assert lock.try_acquire_read() is None
    assert held_on(probes, lock.keys.lock) == [0, 1, 2]  # 3 and 4: given back
    with pytest.raises(LockTimeout):
        lock.acquire_write(timeout=0.5)
    assert held_on(probes, lock.keys.lock) == [0, 1, 2]
    for i in (0, 1, 2):  # no waiting mark of ours left behind either
        assert not [f for f in probes[i].hkeys(lock.keys.lock) if f.startswith(b"q:")]
    for other in others:
        other.release()
    with lock.write(timeout=5) as handle:
        assert handle.masters_held == 5


def test_a_grant_that_came_too_late_is_refused(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    # On this clock every round takes longer than the lease: no validity is left.
    late = make_lock(masters, namespace, timer=lambda: time.monotonic() * 1e6)
    assert late.try_acquire_write() is None
    assert late.try_acquire_read() is None
    assert held_on(probes, late.keys.lock) == []  # every master granted, every one gave back
    on_time = make_lock(masters, namespace)
    with on_time.write(timeout=5) as handle:
        assert handle.validity > 0


def test_upgrade_refused_by_a_majority(masters: list[OwnedRedisServer], namespace: str) -> None:
    masters[0].kill()
    lock = make_lock(masters, namespace)
    with lock.read(timeout=5), pytest.raises(LockUpgradeError):
        lock.acquire_write(timeout=5)
    with lock.write(timeout=5):
        pass  # the refusal left nothing behind


# -- renewal and release ---------------------------------------------------------------------------


def test_release_frees_every_master(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    lock = make_lock(masters, namespace)
    for take in (lock.write, lock.read):
        with take(timeout=5) as handle:
            assert held_on(probes, lock.keys.lock) == [0, 1, 2, 3, 4]
        assert handle.released
        assert held_on(probes, lock.keys.lock) == []


def test_renewal_needs_a_majority(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    lock = make_lock(masters, namespace, watchdog=False)
    handle = lock.acquire_write(timeout=5)
    key = lock.keys.lock
    for i in (0, 1):  # two masters lose the holding: a majority still has it
        probes[i].delete(key)
    assert handle.renew() is True
    assert handle.masters_held == 3
    probes[2].delete(key)  # now only two of five
    assert handle.renew() is False
    assert handle.lost
    with pytest.raises(LockLostError):
        handle.release()
    assert held_on(probes, key) == []  # the minority it still had was released too


@pytest.mark.slow
def test_the_watchdog_marks_a_handle_lost_when_its_majority_is_gone(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    lost = threading.Event()
    lock = make_lock(masters, namespace, on_lost=lambda handle: lost.set())
    handle = lock.acquire_write(timeout=5)
    for i in (0, 1, 2):
        probes[i].delete(lock.keys.lock)
    assert lost.wait(REDLOCK_LEASE + 5), "the watchdog never noticed"
    assert handle.lost
    with pytest.raises(LockLostError):
        handle.release()


@pytest.mark.slow
def test_the_watchdog_keeps_a_live_holder(masters: list[OwnedRedisServer], namespace: str) -> None:
    lock = make_lock(masters, namespace, lease=1.0)
    with lock.write(timeout=5) as handle:
        first = handle.valid_until
        wait_until(lambda: handle.valid_until > first, 5, "a renewal")
        masters[0].kill()  # renewals go on with four
        renewed = handle.valid_until
        wait_until(lambda: handle.valid_until > renewed, 5, "a renewal with a master down")
        assert not handle.lost
        assert lock.try_acquire_write(owner="another") is None


# -- fencing -----------------------------------------------------------------------------------


def test_fencing_tokens_increase_across_different_majorities(
    masters: list[OwnedRedisServer], namespace: str
) -> None:
    lock = make_lock(masters, namespace)
    # Rounds that masters 0 and 4 granted and the others refused move only their
    # counters on: the masters' counters drift apart, as they do in real life.
    others = hold_on(masters, [1, 2, 3], namespace, "read")
    for _ in range(3):
        assert lock.try_acquire_write() is None
    for other in others:
        other.release()
    tokens = []
    for majority in ([0, 1, 2], [2, 3, 4], [1, 3, 4], [0, 1, 2]):
        others = hold_on(masters, [i for i in range(5) if i not in majority], namespace, "read")
        with lock.write(timeout=5) as handle:
            assert [i for i, e in enumerate(handle.epochs) if e is not None] == majority
            tokens.append(handle.token)
        for other in others:
            other.release()
    assert tokens == sorted(set(tokens)), tokens


def test_fencing_counters_expire_and_tokens_still_increase(
    masters: list[OwnedRedisServer], namespace: str, probes: list[redis.Redis]
) -> None:
    lock = make_lock(masters, namespace)
    with lock.write(timeout=5) as first:
        pass
    # Every master's counter (raised to the token where it was lower) has a lifetime.
    lifetimes = [probe.pttl(lock.keys.fence) for probe in probes]
    assert all(0 < ttl <= FENCE_TTL_MS for ttl in lifetimes), lifetimes
    assert {int(probe.get(lock.keys.fence) or 0) for probe in probes} == {first.token}
    for probe in probes:
        probe.delete(lock.keys.fence)  # a day without writes: every counter expired
    with lock.write(timeout=5) as second:
        pass
    assert second.token > first.token


# -- many owners at once ---------------------------------------------------------------------------


def _count_under_the_lock(urls: tuple[str, ...], namespace: str, rounds: int) -> int:
    """Child: two threads, each adding 1 to a counter ``rounds`` times by a read,
    then a write, under the write lock (lost updates if two ever overlap)."""
    lock = redlock_lock(urls, namespace, "menu:7")
    counter = redis.Redis.from_url(urls[0], socket_timeout=5)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(rounds):
                with lock.write(timeout=60):
                    value = int(counter.get(f"{namespace}:count") or 0)
                    counter.set(f"{namespace}:count", value + 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return rounds * 2


@pytest.mark.slow
def test_writers_in_several_processes_exclude_each_other(
    masters: list[OwnedRedisServer], probes: list[redis.Redis], namespace: str
) -> None:
    urls = tuple(m.url for m in masters)
    done = run_processes(_count_under_the_lock, [(urls, namespace, 8)] * 3, timeout=120)
    assert int(probes[0].get(f"{namespace}:count") or 0) == sum(done) == 48


# -- bad input -------------------------------------------------------------------------------------


def test_bad_masters_are_refused(masters: list[OwnedRedisServer]) -> None:
    client = redis.Redis.from_url(masters[0].url)
    with pytest.raises(ValueError, match="independent"):
        RedlockRWLock([client, redis.Redis.from_url(masters[0].url)], "x")
    with pytest.raises(ValueError, match="at least one"):
        RedlockRWLock([], "x")
    with pytest.raises(TypeError):
        RedlockRWLock(client, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RedlockRWLock(["redis://127.0.0.1"], "x")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="instance_timeout"):
        RedlockRWLock([client], "x", lease=1.0, instance_timeout=0.5)
    with pytest.raises(ValueError, match="clock_drift"):
        RedlockRWLock([client], "x", clock_drift=1.5)
    lock = RedlockRWLock([client], "x")
    assert lock.quorum == 1
    assert lock.instance_timeout == pytest.approx(0.1)


# -- asyncio: AsyncRedlockRWLock ---------------------------------------------------------------


@pytest.fixture
async def make_alock(
    masters: list[OwnedRedisServer], namespace: str
) -> AsyncIterator[Callable[..., AsyncRedlockRWLock]]:
    """Async locks on the masters (owners are tasks); their background tasks and
    connections are closed afterwards, on the test's loop."""
    made: list[AsyncRedlockRWLock] = []

    def make(**kwargs: Any) -> AsyncRedlockRWLock:
        clients = [redis.asyncio.Redis.from_url(m.url) for m in masters]
        kwargs.setdefault("lease", REDLOCK_LEASE)
        made.append(AsyncRedlockRWLock(clients, "menu:7", namespace=namespace, **kwargs))
        return made[-1]

    yield make
    default_async_redlock_watchdog().close()
    for lock in made:
        await lock.aclose()


async def test_async_lock_excludes_and_wakes_the_sync_lock(
    masters: list[OwnedRedisServer], namespace: str, make_alock: Callable[..., AsyncRedlockRWLock]
) -> None:
    alock = make_alock()
    sync_lock = make_lock(masters, namespace)
    async with alock.write(timeout=5) as handle:
        assert handle.masters_held == 5
        assert await asyncio.to_thread(sync_lock.try_acquire_read) is None
    held = await asyncio.to_thread(sync_lock.acquire_write, 5)
    waiter = asyncio.create_task(alock.acquire_write(timeout=10))
    await asyncio.sleep(0.2)  # (a bounded look: it must still be waiting)
    assert not waiter.done()
    await asyncio.to_thread(held.release)
    handle = await asyncio.wait_for(waiter, 15)  # woken by the release (or its timer)
    assert handle.token > held.token  # one counter for both drivers
    await handle.release()


async def test_async_minority_down_still_a_lock_majority_down_refuses(
    masters: list[OwnedRedisServer],
    probes: list[redis.Redis],
    make_alock: Callable[..., AsyncRedlockRWLock],
) -> None:
    alock = make_alock()
    masters[0].kill()
    masters[1].kill()
    async with alock.read(timeout=5) as handle:
        assert handle.masters_held == 3
        assert await alock.try_acquire_write(owner="another") is None
    masters[2].kill()
    with pytest.raises((LockTimeout, BackendUnavailable)):
        await asyncio.wait_for(alock.acquire_write(timeout=1.0), 10)
    assert held_on(probes, alock.keys.lock) == []


async def test_async_frozen_master_does_not_stall_an_acquire(
    masters: list[OwnedRedisServer], make_alock: Callable[..., AsyncRedlockRWLock]
) -> None:
    alock = make_alock()
    await (await alock.acquire_write(timeout=5)).release()  # connections open
    freeze(masters[0])
    acquiring = asyncio.create_task(alock.acquire_write(timeout=2.0))
    try:
        done, _ = await asyncio.wait({acquiring}, timeout=10)
    finally:
        thaw(masters[0])  # (a stalled acquire then ends: the test fails fast)
    assert acquiring in done, "the acquire was stalled by the frozen master"
    handle = acquiring.result()
    assert handle.masters_held == 4
    await handle.release()


async def test_async_task_cancelled_during_a_round_gives_back_what_it_got(
    masters: list[OwnedRedisServer],
    probes: list[redis.Redis],
    make_alock: Callable[..., AsyncRedlockRWLock],
) -> None:
    alock = make_alock()
    await (await alock.acquire_write(timeout=5)).release()
    freeze(masters[0])  # each round now waits on it: time to cancel in the middle
    try:
        task = asyncio.create_task(alock.acquire_write(timeout=5, owner="cancelled"))
        deadline = time.monotonic() + 5
        while not redlock_holdings().acquiring(alock.keys.lock, "cancelled"):
            assert time.monotonic() < deadline, "the round never started"
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Masters 1-4 granted meanwhile; all of it was given back.
        assert held_on(probes[1:], alock.keys.lock) == []
    finally:
        thaw(masters[0])


async def test_async_cancelled_waiting_writer_withdraws_its_marks(
    probes: list[redis.Redis],
    make_alock: Callable[..., AsyncRedlockRWLock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cacheguard.locks.redlock.async_rwlock as aio_redlock

    waiting = asyncio.Event()
    original_wait = aio_redlock._Waiter.wait

    async def wait(self: Any, seconds: float) -> list[bytes]:
        waiting.set()  # the writer sleeps between rounds: where a cancel must withdraw
        return await original_wait(self, seconds)

    monkeypatch.setattr(aio_redlock._Waiter, "wait", wait)
    alock = make_alock()
    reader = await alock.acquire_read(timeout=5, owner="reader")
    writer = asyncio.create_task(alock.acquire_write(timeout=10, owner="writer"))
    key = alock.keys.lock
    await asyncio.wait_for(waiting.wait(), 10)
    assert redlock_writer_waiting(probes, key)  # queued on a majority
    assert await alock.try_acquire_read(owner="late reader") is None  # writer preference
    waiting.clear()
    await asyncio.wait_for(waiting.wait(), 10)  # back in its wait after our try woke it
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert not redlock_writer_waiting(probes, key)
    assert not [i for i, p in enumerate(probes) if any(f.startswith(b"q:") for f in p.hkeys(key))]
    late = await alock.try_acquire_read(owner="late reader")
    assert late is not None
    await late.release()
    await reader.release()


async def test_async_rules_renewal_and_release(
    probes: list[redis.Redis], make_alock: Callable[..., AsyncRedlockRWLock]
) -> None:
    alock = make_alock(watchdog=False)
    async with alock.write(timeout=5), alock.write(timeout=5):
        pass  # reentrant
    async with alock.read(timeout=5):
        with pytest.raises(LockUpgradeError):
            await alock.acquire_write(timeout=5)
    handle = await alock.acquire_write(timeout=5)
    downgraded = await alock.acquire_read(timeout=5)  # read while writing
    await handle.release()
    assert await alock.try_acquire_write(owner="another") is None
    await downgraded.release()
    assert held_on(probes, alock.keys.lock) == []  # released on every master
    handle = await alock.acquire_write(timeout=5)
    probes[0].delete(alock.keys.lock)
    assert await handle.renew() is True
    probes[1].delete(alock.keys.lock)
    probes[2].delete(alock.keys.lock)
    assert await handle.renew() is False
    assert handle.lost
    with pytest.raises(LockLostError):
        await handle.release()
    assert held_on(probes, alock.keys.lock) == []


async def test_async_watchdog_renews_on_a_majority(
    masters: list[OwnedRedisServer], make_alock: Callable[..., AsyncRedlockRWLock]
) -> None:
    alock = make_alock(lease=1.0)
    async with alock.write(timeout=5) as handle:
        first = handle.valid_until
        masters[0].kill()
        deadline = time.monotonic() + 5
        while handle.valid_until == first:
            assert time.monotonic() < deadline, "no renewal"
            await asyncio.sleep(0.02)
        assert not handle.lost


@pytest.mark.slow
def test_a_handle_dropped_unreleased_is_given_back_on_every_master(
    masters: list[OwnedRedisServer], namespace: str, probes: list[redis.Redis]
) -> None:
    """A thread that ended holding a Redlock write it never released (nothing
    references the handle): the watchdog releases it on every master at its next
    renewal instead of renewing it for the life of the process."""
    # Renewed every lease/3 s; without the give-back the watchdog would renew it for
    # ever, so the wait below would time out.
    lock = make_lock(masters, namespace, lease=3.0)
    key = lock.keys.lock
    dropped: list[Any] = []

    def take_and_drop() -> None:
        handle = lock.acquire_write(timeout=5)
        # Seen while the handle is referenced: the watchdog may give it back at any
        # renewal once the thread has ended (on a loaded machine, before a look after).
        held_on = sum(bool(p.exists(key)) for p in probes)
        dropped.extend([weakref.ref(handle), handle.owner, list(handle._granted), held_on])

    thread = threading.Thread(target=take_and_drop)
    thread.start()
    thread.join()
    gc.collect()
    gone, owner, granted, held_on = dropped
    assert gone() is None
    assert held_on >= 3
    wait_until(lambda: not any(p.exists(key) for p in probes), 10, "the dropped hold given back")
    # Its epochs no longer keep tidy-ups off its masters.
    assert not any(process_holdings().counts_on(key, owner, a, e) for a, e in granted)
    again = make_lock(masters, namespace).try_acquire_write()
    assert again is not None
    again.release()


async def test_async_a_handle_dropped_unreleased_is_given_back_on_every_master(
    namespace: str, probes: list[redis.Redis], make_alock: Callable[..., AsyncRedlockRWLock]
) -> None:
    alock = make_alock(lease=0.9)
    dropped: list[Any] = []

    async def take_and_drop() -> None:
        handle = await alock.acquire_write(timeout=5)
        dropped.append(weakref.ref(handle))

    await asyncio.create_task(take_and_drop())
    gc.collect()
    assert dropped[0]() is None
    key = alock.keys.lock
    for _ in range(500):  # renewed every 0.3 s: given back at the first of them
        if not any(p.exists(key) for p in probes):
            break
        await asyncio.sleep(0.02)
    assert not any(p.exists(key) for p in probes)
