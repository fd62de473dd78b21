"""The two-tier lock: local lock first, one distributed hold per process."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import redis

from cacheguard import LockFactory, LockTimeout, LockUpgradeError, TwoTierRWLock
from tests.helpers import subscribers, wait_until


def holds(client: redis.Redis, lock: TwoTierRWLock) -> dict[str, str]:
    raw = client.hgetall(lock.remote.keys.lock)
    return {k.decode(): v.decode() for k, v in raw.items() if k[:2] in (b"r:", b"w:")}


def test_local_readers_share_one_distributed_hold(client: redis.Redis, namespace: str) -> None:
    factory = LockFactory(client, namespace=namespace)
    lock = factory.rwlock("menu:list")
    attempts = 0
    original = lock.remote._attempt

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        return original(*args, **kwargs)

    lock.remote._attempt = counting  # type: ignore[method-assign]
    inside = threading.Barrier(9, timeout=10)
    leave = threading.Event()
    handles = []

    def reader() -> None:
        with factory.rwlock("menu:list").read(timeout=5) as h:
            handles.append(h)
            inside.wait()
            leave.wait(10)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    inside.wait()
    assert holds(client, lock) == {f"r:{lock.owner}": "1"}  # one hold for 8 readers
    assert attempts == 1  # one thread talked to Redis
    assert len({id(h) for h in handles}) == 1
    leave.set()
    for t in threads:
        t.join()
    assert not client.exists(lock.remote.keys.lock)  # last reader out released it


def test_writers_exclude_each_other_and_readers(client: redis.Redis, namespace: str) -> None:
    factory = LockFactory(client, namespace=namespace)
    state = {"value": 0, "writer_inside": False, "violations": 0}

    def writer() -> None:
        for _ in range(20):
            with factory.rwlock("k").write(timeout=10):
                state["writer_inside"] = True
                v = state["value"]
                time.sleep(0.0005)
                state["value"] = v + 1
                state["writer_inside"] = False

    def reader() -> None:
        for _ in range(20):
            with factory.rwlock("k").read(timeout=10):
                if state["writer_inside"]:
                    state["violations"] += 1

    threads = [threading.Thread(target=f) for f in (writer, writer, writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["value"] == 60
    assert state["violations"] == 0


def test_reentrancy_and_downgrade(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    with lock.write() as outer:
        with lock.write() as inner:
            assert inner is outer  # one distributed hold for the nested writes
        read = lock.acquire_read()  # downgrade: the writer may read
    assert holds(client, lock) == {f"r:{lock.owner}": "1"}
    assert read.mode == "read"
    with pytest.raises(LockUpgradeError):
        lock.acquire_write(timeout=1)
    lock.release_read()
    assert not client.exists(lock.remote.keys.lock)


def test_two_processes_worth_of_instances_exclude(client: redis.Redis, namespace: str) -> None:
    """Two factories stand in for two processes: distinct owners, real exclusion."""
    a = LockFactory(client, namespace=namespace).rwlock("k")
    b = LockFactory(client, namespace=namespace).rwlock("k")
    assert a.owner != b.owner
    with a.read():
        with b.read():  # readers of two processes overlap
            assert len(holds(client, a)) == 2
        with pytest.raises(LockTimeout):
            b.acquire_write(timeout=0.2)
    with b.write(timeout=5):
        pass


def _two_processes(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> tuple[TwoTierRWLock, TwoTierRWLock]:
    """One lock seen from two processes: two factories (two owners), two clients (two
    pools, two pub/sub connections). They share nothing but Redis."""
    a = LockFactory(client, namespace=namespace, lease=60).rwlock("k")
    b = LockFactory(other_client, namespace=namespace, lease=60).rwlock("k")
    assert a.owner != b.owner
    return a, b


@pytest.mark.parametrize(
    ("first", "second"),
    [("write", "read"), ("read", "write"), ("write", "write")],
    ids=["writer blocks reader", "reader blocks writer", "writer blocks writer"],
)
def test_other_processes_are_excluded_through_redis_until_release(
    client: redis.Redis, other_client: redis.Redis, namespace: str, first: str, second: str
) -> None:
    a, b = _two_processes(client, other_client, namespace)
    getattr(a, f"acquire_{first}")()
    seen_inside: list[dict[str, str]] = []

    def enter() -> None:
        with getattr(b, second)(timeout=30):
            seen_inside.append(holds(client, a))

    t = threading.Thread(target=enter)
    t.start()
    # b waits in Redis: subscribed to the lock's channel on its own connection (a,
    # the holder, subscribes to nothing).
    assert wait_until(lambda: subscribers(client, a.remote.keys.released_channel) >= 1)
    assert seen_inside == []
    assert t.is_alive()
    assert holds(client, a) == {f"{first[0]}:{a.owner}": "1"}
    getattr(a, f"release_{first}")()
    t.join(10)
    assert seen_inside == [{f"{second[0]}:{b.owner}": "1"}]  # in once a had left
    assert not client.exists(a.remote.keys.lock)


def test_readers_of_two_processes_share_the_lock_through_redis(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    a, b = _two_processes(client, other_client, namespace)
    with a.read(timeout=5), b.read(timeout=5):
        assert holds(client, a) == {f"r:{a.owner}": "1", f"r:{b.owner}": "1"}
        # Both processes' read holds keep a third one's writer out.
        third = LockFactory(client, namespace=namespace).rwlock("k")
        with pytest.raises(LockTimeout):
            third.acquire_write(timeout=0.2)
    assert not client.exists(a.remote.keys.lock)


def test_timeout_includes_local_wait(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    lock.acquire_write()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            lock.acquire_read(timeout=0.2)
        except LockTimeout as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    lock.release_write()
    assert len(errors) == 1
    assert errors[0].mode == "read"


def test_failed_remote_acquire_leaves_nothing_held(client: redis.Redis, namespace: str) -> None:
    factory = LockFactory(client, namespace=namespace)
    blocker = LockFactory(client, namespace=namespace).rwlock("k")  # "another process"
    blocker.acquire_write()
    lock = factory.rwlock("k")
    with pytest.raises(LockTimeout):
        lock.acquire_read(timeout=0.2)
    with pytest.raises(LockTimeout):
        lock.acquire_write(timeout=0.2)
    blocker.release_write()
    # Local state was rolled back: both modes work at once afterwards.
    with lock.read(timeout=2):
        pass
    with lock.write(timeout=2):
        pass


@pytest.mark.slow
def test_factory_registry_is_weak(client: redis.Redis, namespace: str) -> None:
    factory = LockFactory(client, namespace=namespace)
    lock = factory.rwlock("a")
    assert factory.rwlock("a") is lock
    for i in range(1000):
        with factory.rwlock(f"n{i}").read():
            pass
    gc.collect()
    assert len(factory) == 1  # only the one still referenced


def test_bad_arguments(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="lease"):
        LockFactory(client, lease=0)
    with pytest.raises(ValueError, match="timeout"):
        LockFactory(client, timeout=-5)
    with pytest.raises(ValueError, match="empty"):
        LockFactory(client).rwlock("")
