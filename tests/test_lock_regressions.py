"""Regressions found in review: fork safety, shared-hold joining, pinning, retries."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import redis

from cacheguard import BackendUnavailable, LockFactory, RedisRWLock, Watchdog
from cacheguard.locks.redis import watchdog as watchdog_module
from cacheguard.redis.notifier import notifier_for
from cacheguard.testing import RedisEndpoint
from tests.helpers import wait_until


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_renews_its_own_leases(client: redis.Redis, namespace: str) -> None:
    lock = RedisRWLock(client, "k", namespace=namespace, lease=0.6)
    with lock.write():  # the parent's watchdog thread and notifier now exist
        pass
    pid = os.fork()
    if pid == 0:  # the child: its watchdog must renew, its holds are its own
        code = 1
        try:
            # The parent's lock object, with the watchdog it was built with.
            handle = lock.acquire_write(timeout=5)
            time.sleep(2.0)  # > 3 leases
            intruder = lock.try_acquire_write(owner="intruder")
            code = 0 if (not handle.lost and intruder is None) else 2
            handle.release()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.slow
def test_lost_shared_read_hold_is_not_joined(client: redis.Redis, namespace: str) -> None:
    lock = LockFactory(client, namespace=namespace, lease=0.9).rwlock("k")
    first = lock.acquire_read()
    client.delete(first.keys.lock)  # the shared holding vanishes
    assert wait_until(lambda: first.lost, timeout=3)
    writer = RedisRWLock(client, "k", namespace=namespace, watchdog=False).acquire_write(
        owner="remote-writer", timeout=2
    )
    errors: list[BaseException] = []

    def new_reader() -> None:
        try:
            lock.acquire_read(timeout=0.5)
            lock.release_read()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=new_reader)
    t.start()
    t.join(5)
    assert [type(e).__name__ for e in errors] == ["LockTimeout"]  # not admitted
    writer.release()
    with pytest.raises(Exception, match="lost"):
        lock.release_read()  # the last old reader learns of the loss


def test_remote_writer_gets_past_overlapping_local_readers(
    client: redis.Redis, namespace: str
) -> None:
    readers = LockFactory(client, namespace=namespace, lease=0.6).rwlock("k")
    stop = threading.Event()

    def overlapping_reader() -> None:
        while not stop.is_set():
            with readers.read(timeout=10):
                time.sleep(0.05)

    threads = [threading.Thread(target=overlapping_reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: client.hexists(readers.remote.keys.lock, "mode"))
        other_process = LockFactory(client, namespace=namespace, lease=0.6).rwlock("k")
        with other_process.write(timeout=5):  # LockTimeout here means starvation
            pass
    finally:
        stop.set()
        for t in threads:
            t.join(10)


@pytest.mark.slow
def test_held_two_tier_lock_is_not_garbage_collected(client: redis.Redis, namespace: str) -> None:
    factory = LockFactory(client, namespace=namespace)
    factory.rwlock("k").acquire_write()  # the caller keeps no reference to the lock
    gc.collect()
    lock = factory.rwlock("k")
    assert not lock._local.is_free()  # the same, still held instance
    lock.release_write()
    assert not client.exists(lock.remote.keys.lock)
    del lock
    gc.collect()
    assert len(factory) == 0


def test_failed_release_is_retried_in_the_background(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = RedisRWLock(client, "k", namespace=namespace, lease=5, watchdog=Watchdog())
    handle = lock.acquire_write()
    real_call = lock._call
    failed = []

    def fail_release_once(script, keys, args):  # type: ignore[no-untyped-def]
        if not failed:
            failed.append(True)
            raise BackendUnavailable("injected: Redis unreachable")
        return real_call(script, keys, args)

    monkeypatch.setattr(lock, "_call", fail_release_once)
    with pytest.raises(BackendUnavailable):
        handle.release()
    assert client.exists(lock.keys.lock)  # still held in Redis ...
    assert wait_until(lambda: not client.exists(lock.keys.lock), timeout=3)  # ... not for long


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_error_reply_at_renewal_is_not_a_loss(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_batch = watchdog_module._run_batch
    calls = []

    def busy_once(c, entries):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            return [redis.ResponseError("BUSY Redis is busy running a script.") for _ in entries]
        return real_batch(c, entries)

    monkeypatch.setattr(watchdog_module, "_run_batch", busy_once)
    lock = RedisRWLock(client, "k", namespace=namespace, lease=0.6, watchdog=Watchdog())
    handle = lock.acquire_write()
    time.sleep(1.2)  # two leases: only kept by renewals after the BUSY one
    assert len(calls) >= 2
    assert not handle.lost
    assert client.hexists(lock.keys.lock, f"w:{handle.owner}")
    handle.release()


def test_subscriber_reconnects_do_not_use_up_the_pool(
    redis_url: str, namespace: str, redis_endpoint: RedisEndpoint
) -> None:
    if not redis_endpoint.real:  # CI requires a real Redis, so this never skips there
        pytest.skip("fakeredis has no CLIENT KILL")
    pool = redis.ConnectionPool.from_url(redis_url, max_connections=2)
    client = redis.Redis(connection_pool=pool)
    notifier = notifier_for(client)
    with notifier.subscription(f"{namespace}:ch") as sub:
        assert sub.open(5)
        for kills in range(1, 4):
            conn = notifier._conn
            assert conn is not None
            host, port = conn._sock.getsockname()[:2]  # type: ignore[attr-defined]
            client.client_kill_filter(addr=f"{host}:{port}")
            # Reconnecting must not need a pool slot (the pool has only two).
            assert wait_until(
                lambda k=kills: notifier.reconnects >= k + 1 and notifier._conn is not None
            )
    client.close()
