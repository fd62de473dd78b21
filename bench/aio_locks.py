"""asyncio lock benchmark: 300 waiters on one held lock, tasks and threads side by side.

    python bench/aio_locks.py [--url redis://...] [--waiters 300] [--rounds 3]

Without ``--url`` it starts its own throwaway ``redis-server`` (or falls back like
the tests do). Per round, a writer holds the lock while ``--waiters`` readers wait
for it (asyncio tasks on one loop with :class:`AsyncRedisRWLock`, then threads with
:class:`RedisRWLock`); the writer releases; every reader gets in at once. Printed:

* waiter lag: from the release to each reader holding the lock (median, p99, max, ms);
* max gap: the largest interval between two ticks of a 1 ms ticker running beside
  the waiters (a task on the same loop, or a thread), over the whole round, ms: how
  long the waiters kept everything else on the loop (or the GIL) from running.

Both clients use a blocking pool of 64 connections (redis-py's default pools hold
100 and refuse the 101st call in flight at once).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import percentile, run_line, run_report
from cacheguard import RedisRWLock
from cacheguard.aio import AsyncRedisRWLock, async_notifier_for
from cacheguard.redis.notifier import notifier_for
from cacheguard.testing import RedisEndpoint

MARK = "bench/aio_locks.py"
POOL_SIZE = 64
SETTLE = 0.5  # s for the waiters to reach their wait before the release


def _subscribed(admin: redis.Redis, channel: str) -> bool:
    return int(admin.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1]) >= 1


async def _tasks_round(url: str, name: str, waiters: int) -> tuple[list[float], float]:
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE)
    client = redis.asyncio.Redis(connection_pool=pool)
    admin = redis.Redis.from_url(url)
    lock = AsyncRedisRWLock(client, name, namespace="bench")
    holder = await lock.acquire_write(owner="holder")
    got: list[float] = []
    stop = asyncio.Event()
    max_gap = 0.0

    async def ticker() -> None:
        nonlocal max_gap
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            max_gap = max(max_gap, now - last)
            last = now

    async def reader() -> None:
        handle = await lock.acquire_read(timeout=60)
        got.append(time.perf_counter())
        await handle.release()

    tick = asyncio.ensure_future(ticker())
    tasks = [asyncio.ensure_future(reader()) for _ in range(waiters)]
    while not _subscribed(admin, lock.keys.released_channel):
        await asyncio.sleep(0.01)
    await asyncio.sleep(SETTLE)
    released = time.perf_counter()
    await holder.release()
    await asyncio.gather(*tasks)
    stop.set()
    await tick
    await async_notifier_for(client).aclose()
    await client.aclose()
    await pool.aclose()
    admin.close()
    return [(t - released) * 1000 for t in got], max_gap * 1000


def _threads_round(url: str, name: str, waiters: int) -> tuple[list[float], float]:
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE)
    client = redis.Redis(connection_pool=pool)
    lock = RedisRWLock(client, name, namespace="bench")
    holder = lock.acquire_write(owner="holder")
    got: list[float] = []
    mutex = threading.Lock()
    stop = threading.Event()
    max_gap = 0.0

    def ticker() -> None:
        nonlocal max_gap
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            max_gap = max(max_gap, now - last)
            last = now

    def reader() -> None:
        handle = lock.acquire_read(timeout=60)
        with mutex:
            got.append(time.perf_counter())
        handle.release()

    tick = threading.Thread(target=ticker)
    tick.start()
    threads = [threading.Thread(target=reader) for _ in range(waiters)]
    for t in threads:
        t.start()
    while not _subscribed(client, lock.keys.released_channel):
        time.sleep(0.01)
    time.sleep(SETTLE)
    released = time.perf_counter()
    holder.release()
    for t in threads:
        t.join()
    stop.set()
    tick.join()
    notifier_for(client).close()
    client.close()
    return [(t - released) * 1000 for t in got], max_gap * 1000


def _row(label: str, lags: list[float], gap: float) -> str:
    return (
        f"| {label} | {statistics.median(lags):.1f} | {percentile(lags, 0.99):.1f} | "
        f"{max(lags):.1f} | {gap:.1f} |"
    )


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    admin = redis.Redis.from_url(endpoint.url)
    server = admin.info("server") if endpoint.real else {"redis_version": "fakeredis"}
    admin.close()
    lines = [
        run_line(str(server.get("redis_version")), endpoint.kind),
        "",
        f"{args.waiters} readers wait on a held write lock; the holder releases "
        f"(lag and gaps in ms; pool of {POOL_SIZE} connections).",
        "",
        "| round | lag median | lag p99 | lag max | max gap beside the waiters |",
        "|---|---|---|---|---|",
    ]
    for n in range(1, args.rounds + 1):
        lags, gap = asyncio.run(_tasks_round(endpoint.url, f"aio{n}", args.waiters))
        lines.append(_row(f"{n}: asyncio tasks, one loop", lags, gap))
        lags, gap = _threads_round(endpoint.url, f"threads{n}", args.waiters)
        lines.append(_row(f"{n}: threads", lags, gap))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--waiters", type=int, default=300, help="waiting readers per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument("--write", type=Path, help="also write the table into this Markdown file")
    args = parser.parse_args(argv)
    return run_report(args.url, args.write, MARK, lambda endpoint: report(endpoint, args))


if __name__ == "__main__":
    sys.exit(main())
