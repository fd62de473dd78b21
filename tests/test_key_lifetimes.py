"""Every key cacheguard writes expires, but one per namespace: the invalidation
sequence ``<ns>:wm`` (docs/design.md, "Keys").

A workload through each guard (fills, writes, invalidations by name and by prefix,
read and write locks), through tracked sessions, and through the Redis lock itself,
then a SCAN of the namespace: every key but the sequence has a TTL.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from cacheguard import RedisRWLock
from cacheguard.locks.redis.lua import FENCE_TTL_MS
from cacheguard.redis.keys import watermark_key
from tests import sa_support
from tests.guard_drivers import KINDS, guards_on
from tests.sa_support import Stack

WRITES = 200


def lifetimes(client: redis.Redis, namespace: str) -> dict[str, int]:
    """Every key of ``namespace`` and its PTTL (-1: it never expires)."""
    return {
        key.decode(): int(client.pttl(key))
        for key in client.scan_iter(match=f"{namespace}:*", count=1000)
    }


def assert_only_the_sequence_persists(client: redis.Redis, namespace: str) -> dict[str, int]:
    left = lifetimes(client, namespace)
    forever = sorted(key for key, ttl in left.items() if ttl <= 0)
    assert forever == [watermark_key(namespace)], forever
    return left


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a_guards_workload_leaves_only_the_sequence_without_a_ttl(
    kind: str, redis_url: str, namespace: str, client: redis.Redis
) -> None:
    async with guards_on(kind, redis_url, namespace=namespace, ttl_jitter=0) as make:
        guard = make()
        for i in range(WRITES):
            name = f"menu:{i}"
            assert await guard.get_or_load(name, lambda i=i: i, ttl=60) == i
            async with guard.write(name):
                pass
        await guard.refresh("menu:0", lambda: "again", ttl=60)
        await guard.invalidate("menu:1", "menu:2")
        assert await guard.invalidate_prefix("menu:") > 0
        if kind == "sync":  # the key's two-tier lock, both sides
            lock = guard.guard.rwlock("lock:only")
            with lock.read():
                pass
            with lock.write():
                pass
    left = assert_only_the_sequence_persists(client, namespace)
    # The fencing counters of the write locks are among what expires.
    fences = [ttl for key, ttl in left.items() if key.endswith(":fence")]
    assert len(fences) >= WRITES
    assert all(0 < ttl <= FENCE_TTL_MS for ttl in fences)


def test_tracked_sessions_leave_only_the_sequence_without_a_ttl(
    redis_url: str, namespace: str, db_url: str, client: redis.Redis
) -> None:
    table = f"menu_{uuid.uuid4().hex[:10]}"
    sa_support.create_table(db_url, table)
    stack = Stack(redis_url, namespace, db_url, table, wait_timeout=5)
    try:
        for round_ in range(3):
            assert stack.names()
            with stack.sessions() as session:
                for menu_id in (1, 2, 3):
                    session.get(stack.menu, menu_id).name = f"round {round_}"
                session.add(stack.menu(name=f"new {round_}"))
                session.commit()
        assert stack.name_of(2) == "round 2"
        assert_only_the_sequence_persists(client, namespace)
    finally:
        stack.close()
        sa_support.drop_table(db_url, table)


def test_the_lock_alone_leaves_nothing_without_a_ttl(client: redis.Redis, namespace: str) -> None:
    for i in range(20):
        lock = RedisRWLock(client, f"res:{i}", namespace=namespace)
        with lock.write():
            pass
        with lock.read():
            pass
    left = lifetimes(client, namespace)
    assert left, "the fencing counters are there, expiring"
    assert all(ttl > 0 for ttl in left.values()), left
