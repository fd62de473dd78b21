"""Release notifications: confirmation, wake-ups, reconnects, idle unsubscribes."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from cacheguard import LockHandle, RedisRWLock
from cacheguard.redis.notifier import Notifier, notifier_for
from cacheguard.testing import RedisEndpoint


def test_subscription_is_confirmed_and_woken(client: redis.Redis, namespace: str) -> None:
    notifier = Notifier(client.connection_pool.make_connection)
    try:
        with notifier.subscription(f"{namespace}:ch") as sub:
            assert sub.open(5)
            client.spublish(f"{namespace}:ch", "free")  # a lock's channel is sharded
            assert sub.wait(5)
            assert not sub.wait(0.05)  # the wake-up was consumed
    finally:
        notifier.close()


def test_one_notifier_per_pool(client: redis.Redis) -> None:
    assert notifier_for(client) is notifier_for(client)
    other = redis.Redis(connection_pool=redis.ConnectionPool.from_url("redis://127.0.0.1:1"))
    assert notifier_for(other) is not notifier_for(client)


def test_waiters_survive_a_killed_subscriber_connection(
    client: redis.Redis, namespace: str, redis_endpoint: RedisEndpoint
) -> None:
    """Kill the pub/sub connection mid-wait: waiters still get the lock."""
    if not redis_endpoint.real:  # CI requires a real Redis, so this never skips there
        pytest.skip("fakeredis has no CLIENT KILL")
    notifier = Notifier(client.connection_pool.make_connection)
    try:
        lock = RedisRWLock(client, "k", namespace=namespace, notifier=notifier, lease=5)
        holder = lock.acquire_write(owner="holder")
        got: list[LockHandle] = []
        waiters = [
            threading.Thread(target=lambda i=i: got.append(lock.acquire_write(10, owner=f"w{i}")))
            for i in range(3)
        ]
        for t in waiters:
            t.start()
        deadline = time.monotonic() + 5
        channel = lock.keys.released_channel
        while time.monotonic() < deadline and not (
            notifier._conn is not None
            and channel in notifier._channels
            and notifier._channels[channel].confirmed.is_set()
        ):
            time.sleep(0.01)
        assert notifier._conn is not None
        host, port = notifier._conn._sock.getsockname()[:2]  # type: ignore[attr-defined]
        assert client.client_kill_filter(addr=f"{host}:{port}") == 1
        time.sleep(0.1)
        holder.release()
        for h in _drain(got, 3, waiters, lock):
            assert h.token > holder.token
        deadline = time.monotonic() + 5
        while notifier.reconnects < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert notifier.reconnects >= 2  # first connect + reconnect after the kill
    finally:
        notifier.close()


def _drain(got: list[LockHandle], n: int, threads: list[threading.Thread], lock: RedisRWLock):  # type: ignore[no-untyped-def]
    """Release each handle as it arrives so the next waiter can get in."""
    seen = 0
    deadline = time.monotonic() + 30
    while seen < n and time.monotonic() < deadline:
        if len(got) > seen:
            got[seen].release()
            yield got[seen]
            seen += 1
        else:
            time.sleep(0.005)
    for t in threads:
        t.join(5)
    assert seen == n


@pytest.mark.slow
def test_idle_channels_are_unsubscribed(client: redis.Redis, namespace: str) -> None:
    notifier = Notifier(client.connection_pool.make_connection, linger=0.1)
    try:
        sub = notifier.subscription(f"{namespace}:idle")
        assert sub.open(5)
        sub.close()
        deadline = time.monotonic() + 5
        while notifier.subscribed_channels() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notifier.subscribed_channels() == []
        # And it can be subscribed again afterwards.
        with notifier.subscription(f"{namespace}:idle") as again:
            assert again.open(5)
    finally:
        notifier.close()
