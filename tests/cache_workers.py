"""Child-process bodies for the cache tests (module level, so spawn can import them)."""

from __future__ import annotations

import functools
import os
import random
import sqlite3
import threading
import time
from typing import Any

from cacheguard import CacheGuard, CacheLoader
from cacheguard.backoff import Backoff
from tests.helpers import client_for, run_threads

# Keeps the highest version whose write block has exited (writers may finish out of order).
_SET_MAX = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


def stampede_worker(
    url: str, namespace: str, threads: int, names: list[str], load_seconds: float, start_at: float
) -> list[Any]:
    """Threads ask for ``names`` (shuffled) at once; every load counts itself in Redis."""
    client = client_for(url)
    guard = CacheGuard(client, namespace=namespace, lease=10, wait_timeout=30)

    def load(name: str) -> dict[str, Any]:
        client.incr(f"{namespace}:loads:{name}")
        time.sleep(load_seconds)
        return {"name": name, "pid": os.getpid()}

    results: list[Any] = []
    mutex = threading.Lock()

    def run(_: int) -> None:
        order = list(names)
        random.shuffle(order)
        time.sleep(max(start_at - time.time(), 0))
        got = [guard.get_or_load(n, lambda n=n: load(n), ttl=60) for n in order]
        with mutex:
            results.extend(got)

    run_threads(threads, run)
    return results


def timed_out_stampede_worker(
    url: str,
    namespace: str,
    threads: int,
    load_seconds: float,
    wait_timeout: float,
    barrier: Any,
) -> dict[str, Any]:
    """``threads`` threads read one cold key together (past ``barrier``, shared by
    every thread of every process) with a loader slower than ``wait_timeout``; each
    loader run counts itself in Redis (``<namespace>:loads``)."""
    client = client_for(url)
    guard = CacheGuard(client, namespace=namespace, lease=30, wait_timeout=wait_timeout)

    def load() -> int:
        client.incr(f"{namespace}:loads")
        time.sleep(load_seconds)  # the subject: a database slower than wait_timeout
        return os.getpid()

    values: list[int] = []
    mutex = threading.Lock()

    def run(_: int) -> None:
        barrier.wait(60)
        value = guard.get_or_load("hot", load, ttl=60)
        with mutex:
            values.append(value)

    run_threads(threads, run)
    return {"values": values, "stats": guard.stats().as_dict()}


def _connect_db(database: str) -> Any:
    if database.startswith("postgresql"):
        import psycopg

        return psycopg.connect(
            database.replace("postgresql+psycopg", "postgresql"), autocommit=True
        )
    conn = sqlite3.connect(database, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def mixed_worker(
    url: str, namespace: str, database: str, table: str, operations: int, seed: int
) -> dict[str, int]:
    """Reads through the cache and ~10% writes through guard.write; count stale reads.

    A read is stale if it returns a version older than one whose write block had
    already exited before the read started.
    """
    client = client_for(url)
    set_max = client.register_script(_SET_MAX)
    guard = CacheGuard(client, namespace=namespace, lease=10, wait_timeout=30, ttl_jitter=0)
    rng = random.Random(seed)
    local = threading.local()

    def db() -> Any:
        if not hasattr(local, "conn"):
            local.conn = _connect_db(database)
        return local.conn

    def load_row(row_id: int) -> int:
        # fetchall finishes the statement: an unfinished SQLite statement would keep
        # its read snapshot open (the snapshot-age race the SQLAlchemy hooks close).
        rows = db().execute(f"SELECT version FROM {table} WHERE id = {int(row_id)}").fetchall()
        return int(rows[0][0])

    rows = CacheLoader(guard, key="row:{row_id}", load=load_row, ttl=60)
    counts = {"reads": 0, "writes": 0, "stale": 0}
    mutex = threading.Lock()

    def run(thread_seed: int) -> None:
        trng = random.Random(thread_seed)
        for _ in range(operations // 2):
            row_id = trng.randrange(3)
            floor_key = f"{namespace}:exited:{row_id}"
            if trng.random() < 0.1:
                with guard.write(f"row:{row_id}"):
                    conn = db()
                    if database.startswith("postgresql"):
                        with conn.transaction():
                            cur = conn.execute(
                                f"UPDATE {table} SET version = version + 1 WHERE id = %s "
                                "RETURNING version",
                                (row_id,),
                            )
                            new_version = int(cur.fetchone()[0])
                    else:
                        conn.execute("BEGIN IMMEDIATE")
                        conn.execute(
                            f"UPDATE {table} SET version = version + 1 WHERE id = ?", (row_id,)
                        )
                        new_version = int(
                            conn.execute(
                                f"SELECT version FROM {table} WHERE id = ?", (row_id,)
                            ).fetchall()[0][0]
                        )
                        conn.execute("COMMIT")
                set_max(keys=[floor_key], args=[new_version])  # the block has exited
                with mutex:
                    counts["writes"] += 1
            else:
                floor = int(client.get(floor_key) or 0)
                seen = rows.get(row_id=row_id)
                with mutex:
                    counts["reads"] += 1
                    if seen < floor:
                        counts["stale"] += 1

    pool = [threading.Thread(target=run, args=(seed * 100 + t,)) for t in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    _ = rng
    return counts


def paused_filler(url: str, namespace: str, loading: Any, lease: float) -> dict[str, Any]:
    """Fill a key with a loader the test freezes (SIGSTOP) past the lease."""
    client = client_for(url)
    guard = CacheGuard(client, namespace=namespace, lease=lease, wait_timeout=30, ttl_jitter=0)

    def load() -> str:
        loading.set()
        time.sleep(0.5)  # the test stops us in here
        return "old"

    value = guard.get_or_load("k", load, ttl=60)
    return {"value": value, "rejected": guard.stats().stores_rejected}


def wait_for_announced_fill(url: str, namespace: str, name: str, in_wait: Any) -> dict[str, Any]:
    """Ask for ``name`` while another process fills it, with every timer that could
    wake this waiter a minute long: the fill-wait backoff here, the filler's lease
    (the parent's guard) and ``wait_timeout``. Sets ``in_wait`` as the waiter starts
    waiting on the key's channel (after its subscription and its second look)."""
    from cacheguard.redis.notifier import Subscription

    real_wait = Subscription.wait

    def wait(self: Subscription, seconds: float) -> list[bytes]:
        in_wait.set()  # a message that arrives from here on is kept for this wait
        return real_wait(self, seconds)

    Subscription.wait = wait  # type: ignore[method-assign]
    guard = CacheGuard(
        client_for(url), namespace=namespace, wait_timeout=120, on_timeout="raise", lease=60
    )
    guard._state.wait_backoff = functools.partial(Backoff, initial=60.0, cap=60.0)
    loads: list[int] = []

    def load() -> str:
        loads.append(1)
        return "loaded by the waiter"

    value = guard.get_or_load(name, load, ttl=60)
    return {"value": value, "loads": len(loads)}


def batch_worker(
    url: str, namespace: str, kind: str, callers: int, names: list[str], start_at: float
) -> list[dict[str, Any]]:
    """``callers`` threads (``kind="sync"``) or tasks (``"async"``) each read a shuffled,
    overlapping half of ``names`` or more with ``get_or_load_many``; every load of a
    name counts itself in Redis."""
    rng = random.Random(os.getpid())
    orders = []
    for _ in range(callers):
        order = rng.sample(names, k=rng.randint(len(names) // 2, len(names)))
        orders.append(order)

    def loaded(client: Any, keys: list[str]) -> dict[str, Any]:
        for key in keys:
            client.incr(f"{namespace}:loads:{key}")
        return {key: {"name": key} for key in keys}

    if kind == "sync":
        client = client_for(url)
        guard = CacheGuard(client, namespace=namespace, lease=10, wait_timeout=30)
        results: list[dict[str, Any]] = []
        mutex = threading.Lock()

        def run(index: int) -> None:
            time.sleep(max(start_at - time.time(), 0))

            def load_many(keys: list[str]) -> dict[str, Any]:
                time.sleep(0.05)  # long enough for the others to find the keys busy
                return loaded(client, keys)

            got = guard.get_or_load_many(orders[index], load_many, ttl=60)
            with mutex:
                results.append(got)

        run_threads(callers, run)
        guard.close()
        return results

    import asyncio

    from cacheguard.aio import AsyncCacheGuard

    counter = client_for(url)

    async def main() -> list[dict[str, Any]]:
        # from_url: any deployment's URL (a cluster's too); closed with the guard
        guard = AsyncCacheGuard.from_url(url, namespace=namespace, lease=10, wait_timeout=30)

        async def load_many(keys: list[str]) -> dict[str, Any]:
            await asyncio.sleep(0.05)
            return loaded(counter, keys)

        async def run(order: list[str]) -> dict[str, Any]:
            await asyncio.sleep(max(start_at - time.time(), 0))
            return await guard.get_or_load_many(order, load_many, ttl=60)

        try:
            return list(await asyncio.gather(*(run(order) for order in orders)))
        finally:
            await guard.aclose()

    return asyncio.run(main())
