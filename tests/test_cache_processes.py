"""The cache across real processes: stampedes, no stale sets, frozen fillers."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cacheguard import CacheGuard
from tests import cache_workers
from tests.procs import CTX, run_processes, start_process


def test_cold_key_stampede_loads_once(client: redis.Redis, redis_url: str, namespace: str) -> None:
    """4 processes x 25 threads ask for one cold key whose loader takes 100 ms."""
    start_at = time.time() + 2.0  # all threads start together, after the spawns
    results = run_processes(
        cache_workers.stampede_worker,
        [(redis_url, namespace, 25, ["menu:list"], 0.1, start_at)] * 4,
    )
    values = [v for per_process in results for v in per_process]
    assert len(values) == 100
    assert int(client.get(f"{namespace}:loads:menu:list")) == 1
    assert len({(v["name"], v["pid"]) for v in values}) == 1  # everyone got the one load


def test_many_cold_keys_each_load_once(client: redis.Redis, redis_url: str, namespace: str) -> None:
    names = [f"item:{i}" for i in range(1000)]
    start_at = time.time() + 2.0
    results = run_processes(
        cache_workers.stampede_worker, [(redis_url, namespace, 4, names, 0.0, start_at)] * 4
    )
    assert sum(len(r) for r in results) == 4 * 4 * 1000
    loads = Counter()
    for name in names:
        loads[int(client.get(f"{namespace}:loads:{name}") or 0)] += 1
    assert loads == Counter({1: 1000})


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A table ``(id, version)`` with 3 rows: PostgreSQL if DATABASE_URL is set, else SQLite."""
    table = f"rows_{uuid.uuid4().hex[:10]}"
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgresql"):
        import psycopg

        dsn = url.replace("postgresql+psycopg", "postgresql")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, version int NOT NULL)")
            conn.execute(f"INSERT INTO {table} VALUES (0, 0), (1, 0), (2, 0)")
        try:
            yield url, table
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
    else:
        path = str(tmp_path / "rows.sqlite3")
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, version int NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (0, 0), (1, 0), (2, 0)")
        conn.commit()
        conn.close()
        yield path, table


def test_no_read_after_a_write_returns_an_older_version(
    client: redis.Redis, redis_url: str, namespace: str, database: tuple[str, str]
) -> None:
    """>= 10,000 operations in 4 processes, ~10 % writes through guard.write (L1 off)."""
    url, table = database
    results = run_processes(
        cache_workers.mixed_worker,
        [(redis_url, namespace, url, table, 2500, seed) for seed in range(4)],
        timeout=300,
    )
    reads = sum(r["reads"] for r in results)
    writes = sum(r["writes"] for r in results)
    assert reads + writes >= 10_000
    assert writes >= 500  # ~10 % of the operations really wrote
    assert sum(r["stale"] for r in results) == 0


def test_frozen_fill_past_its_lease_is_rejected(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    lease = 1.0
    loading = CTX.Event()
    result: list[dict[str, object]] = []
    child_done = threading.Event()

    def run_child() -> None:
        result.extend(
            run_processes(cache_workers.paused_filler, [(redis_url, namespace, loading, lease)])
        )
        child_done.set()

    runner = threading.Thread(target=run_child)
    runner.start()
    assert loading.wait(30), "the child never started loading"
    child_pid = _child_pid_loading()
    os.kill(child_pid, signal.SIGSTOP)
    try:
        time.sleep(lease + 0.5)  # its lease runs out while frozen
        guard = CacheGuard(client, namespace=namespace, lease=5, wait_timeout=10, ttl_jitter=0)
        with guard.write("k"):
            pass  # a writer invalidates meanwhile
        assert guard.get_or_load("k", lambda: "new", ttl=60) == "new"
    finally:
        os.kill(child_pid, signal.SIGCONT)
    runner.join(60)
    assert child_done.is_set()
    assert result[0] == {"value": "old", "rejected": 1}  # its caller got its load ...
    assert guard.peek("k") == "new"  # ... but the cache kept the newer value


def _child_pid_loading() -> int:
    children = [p for p in CTX.active_children()]
    assert len(children) == 1
    pid = children[0].pid
    assert pid is not None
    return pid


def test_sigkilled_filler_is_taken_over(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    lease = 1.0
    loading = CTX.Event()
    child = start_process(cache_workers.paused_filler, redis_url, namespace, loading, lease)
    try:
        assert loading.wait(30)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)
        guard = CacheGuard(client, namespace=namespace, lease=5, wait_timeout=lease + 1.0)
        start = time.monotonic()
        value = guard.get_or_load("k", lambda: "taken over", ttl=60)
        took = time.monotonic() - start
        print(f"\nSIGKILLed filler (lease {lease:g} s) taken over after {took:.3f} s")
        assert value == "taken over"
        assert took <= lease + 1.0
        assert guard.stats().wait_timeouts == 0  # not the timeout policy: a real takeover
    finally:
        if child.is_alive():
            child.kill()
