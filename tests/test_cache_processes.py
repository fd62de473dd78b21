"""The cache across real processes: stampedes, no stale sets, frozen fillers."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cacheguard import MISSING
from tests import cache_workers
from tests.helpers import make_guard, start_gated_fill
from tests.procs import CTX, result_within, run_processes, start_process_reporting


@pytest.mark.slow
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


@pytest.mark.slow
def test_waiter_in_another_process_is_woken_by_the_fills_announcement(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """A process waits for another one's fill with its retry timer, the filler's lease
    and its own wait_timeout all a minute long; the test waits 20 s for its answer
    once the fill ends: only the fill's announcement can deliver it that soon."""
    filler = make_guard(client, namespace, lease=60)
    release, fill = start_gated_fill(filler, "k", "filled", hold=60)
    in_wait = CTX.Event()
    child, results = start_process_reporting(
        cache_workers.wait_for_announced_fill, redis_url, namespace, "k", in_wait
    )
    try:
        assert in_wait.wait(60), "the waiting process never started waiting"
        assert filler.peek("k") is MISSING  # it waits for the fill still under way
        release.set()
        fill.join(10)
        got = result_within(results, 20, "the waiter was not woken by the announcement")
        assert got == {"value": "filled", "loads": 0}
    finally:
        release.set()
        child.join(5)
        if child.is_alive():
            child.kill()


@pytest.mark.slow
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


@pytest.mark.slow
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
