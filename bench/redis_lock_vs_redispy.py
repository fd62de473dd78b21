"""cacheguard's Redis lock against redis-py's Lock: uncontended cost, cross-process hand-off.

    python bench/redis_lock_vs_redispy.py [--url redis://...] [--cycles 3000] [--handoffs 60]
                                          [--write docs/benchmarks.md]

Without ``--url`` it starts its own throwaway ``redis-server`` (so command
counts are not mixed with other traffic), or falls back like the tests do.
Every figure of one run is measured on the same server, one after the other:

* uncontended read / write acquire+release: median microseconds per cycle, and
  Redis commands per cycle from ``INFO commandstats`` (round trips the client
  sent, and the total including the calls made inside Lua), next to two raw GETs;
* hand-off: a process releases, a waiter in another process acquires; the delay
  between the two (median, p99), for cacheguard and for redis-py's ``Lock``
  (which sleeps 0.1 s between polls by default).

The other lock stores (Redlock, PostgreSQL, ZooKeeper) are compared with this one
by ``bench/locks.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import interleaved_us, percentile, run_line, run_report
from cacheguard import RedisRWLock
from cacheguard.testing import RedisEndpoint

CTX = mp.get_context("spawn")
MARK = "bench/redis_lock_vs_redispy.py"


def command_counts(client: redis.Redis) -> tuple[int, int]:
    """(calls of EVALSHA/GET sent by clients, all commands incl. those inside Lua)."""
    stats = client.info("commandstats")
    sent = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_get"))
    total = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_config", "cmdstat_info"))
    return sent, total


def commands_per_cycle(
    client: redis.Redis, body: Callable[[], None], cycles: int
) -> tuple[float, float]:
    client.config_resetstat()
    for _ in range(cycles):
        body()
    sent, total = command_counts(client)
    return sent / cycles, total / cycles


def uncontended(url: str, cycles: int) -> dict[str, dict[str, float]]:
    client = redis.Redis.from_url(url)
    client.set("bench:raw", b"x" * 64)
    lock = RedisRWLock(client, "bench:uncontended", namespace="bench")

    def two_gets() -> None:
        client.get("bench:raw")
        client.get("bench:raw")

    def read_cycle() -> None:
        lock.acquire_read().release()

    def write_cycle() -> None:
        lock.acquire_write().release()

    bodies = {
        "two raw GETs": two_gets,
        "read acquire+release": read_cycle,
        "write acquire+release": write_cycle,
    }
    for body in bodies.values():  # warm up: scripts loaded, connections open
        for _ in range(200):
            body()
    micros = interleaved_us(bodies, cycles)
    out = {}
    for label, body in bodies.items():
        sent, total = commands_per_cycle(client, body, 500)
        out[label] = {"us": micros[label], "sent": sent, "total": total}
    return out


# -- hand-off between processes ---------------------------------------------------------


def _make_lock(kind: str, client: redis.Redis, name: str) -> Any:
    if kind == "cacheguard":
        return RedisRWLock(client, name, namespace="bench", lease=10, timeout=10)
    return client.lock(f"bench:{name}", timeout=10, sleep=0.1, blocking_timeout=10)


def _acquire(kind: str, lock: Any) -> Any:
    if kind == "cacheguard":
        return lock.acquire_write()
    assert lock.acquire()
    return lock


def _release(kind: str, held: Any) -> None:
    held.release()


def _waiter(url: str, kind: str, name: str, rounds: int, go: Any, done: Any) -> None:
    client = redis.Redis.from_url(url)
    lock = _make_lock(kind, client, name)
    for _ in range(rounds):
        go.get()
        held = _acquire(kind, lock)
        acquired_at = time.time()
        _release(kind, held)
        done.put(acquired_at)


WARMUP_ROUNDS = 3  # first hand-offs open connections and subscriptions: not counted


def handoff(url: str, kind: str, rounds: int) -> list[float]:
    name = f"handoff-{kind}"
    client = redis.Redis.from_url(url)
    lock = _make_lock(kind, client, name)
    go, done = CTX.Queue(), CTX.Queue()
    total = rounds + WARMUP_ROUNDS
    child = CTX.Process(target=_waiter, args=(url, kind, name, total, go, done), daemon=True)
    child.start()
    delays = []
    rng = random.Random(7)
    try:
        for _ in range(total):
            held = _acquire(kind, lock)
            go.put(True)
            # Let the waiter block (and subscribe); a random moment, so a polling
            # waiter's phase is not locked to our release.
            time.sleep(rng.uniform(0.03, 0.13))
            released_at = time.time()
            _release(kind, held)
            delays.append((done.get(timeout=30) - released_at) * 1000)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return delays[WARMUP_ROUNDS:]


# -- report ---------------------------------------------------------------------------------


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    client = redis.Redis.from_url(endpoint.url)
    server = client.info("server")
    costs = uncontended(endpoint.url, args.cycles)
    ours = handoff(endpoint.url, "cacheguard", args.handoffs)
    theirs = handoff(endpoint.url, "redis-py", args.handoffs)
    base = costs["two raw GETs"]["us"]

    lines = [
        run_line(str(server.get("redis_version")), endpoint.kind),
        "",
        f"Command: `python {MARK} --cycles {args.cycles} --handoffs {args.handoffs}`",
        "",
        "Uncontended cost (one thread; median of batches of 100 cycles, the three rows' "
        "batches interleaved; commands counted over 500 more cycles each):",
        "",
        "| operation | µs / cycle | vs two raw GETs | commands sent / cycle "
        "| commands incl. inside Lua / cycle |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, c in costs.items():
        lines.append(
            f"| {label} | {c['us']:.1f} | {c['us'] / base:.2f}x | {c['sent']:.2f} "
            f"| {c['total']:.2f} |"
        )
    lines += [
        "",
        f"Hand-off between processes ({args.handoffs} rounds after {WARMUP_ROUNDS} warm-up "
        "rounds): a process releases the write "
        "lock, a waiter in another process acquires it; milliseconds from release to "
        "acquire.",
        "",
        "| lock | median ms | p99 ms | max ms |",
        "|---|---:|---:|---:|",
        f"| cacheguard RedisRWLock (pub/sub wake-up) | {statistics.median(ours):.2f} "
        f"| {percentile(ours, 0.99):.2f} | {max(ours):.2f} |",
        f"| redis-py Lock (sleep=0.1 poll) | {statistics.median(theirs):.2f} "
        f"| {percentile(theirs, 0.99):.2f} | {max(theirs):.2f} |",
        "",
        f"Hand-off ratio (redis-py median / cacheguard median): "
        f"{statistics.median(theirs) / max(statistics.median(ours), 1e-9):.0f}x.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--cycles", type=int, default=3000, help="uncontended cycles per row")
    parser.add_argument("--handoffs", type=int, default=60, help="hand-off rounds per lock")
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    args = parser.parse_args(argv)
    if args.cycles < 100 or args.handoffs < 1:
        parser.error("--cycles must be >= 100 and --handoffs >= 1")

    return run_report(args.url, args.write, MARK, lambda endpoint: report(endpoint, args))


if __name__ == "__main__":
    raise SystemExit(main())
