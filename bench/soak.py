"""Soak: a randomized mixed load with holder kills and Redis restarts.

    python bench/soak.py                 # 2 minutes, 4 processes x 4 threads
    python bench/soak.py --seconds 600 --processes 6

Worker processes read rows of a SQLite table (WAL) through a ``CacheGuard``,
write them through ``guard.write`` (about 10 % of operations) and invalidate
some (about 5 %). Meanwhile the soak SIGKILLs a random worker every
``--kill-every`` seconds (it is restarted) and SIGKILLs and restarts its own
``redis-server`` every ``--restart-every`` seconds. It reports operations,
errors by kind, stale reads (a read that returns a row version older than one
whose write had finished before the read began: must be 0), the longest
operation, and the keys left behind without a TTL (must be 0 apart from the
documented never-expiring counters: fencing counters and the invalidation
sequence).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from cacheguard import CacheGuard
from cacheguard.testing import OwnedRedisServer

CTX = mp.get_context("spawn")
NAMESPACE = "soak"
NEVER_EXPIRING = (":fence", f"{NAMESPACE}:wm")  # documented counters


def _db(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def worker(
    url: str,
    db_path: str,
    rows: int,
    threads: int,
    lease: float,
    slot: int,
    processes: int,
    floors: Any,
    stats: Any,
) -> None:
    """Mixed operations until killed. Counters and floors live in shared memory without
    cross-process locks (a process killed holding one would stall the others): each
    process writes only its own slot, under a lock of its own that dies with it."""
    guard = CacheGuard.from_url(url, namespace=NAMESPACE, lease=lease, wait_timeout=5.0)
    local = threading.local()
    mine = threading.Lock()
    width = len(_KINDS) + 1

    def count(kind: str, seconds: float = 0.0) -> None:
        index = _KINDS.index(kind) if kind in _KINDS else _KINDS.index("error other")
        with mine:
            stats[slot * width + index] += 1
            top = slot * width + len(_KINDS)
            stats[top] = max(stats[top], seconds)

    def floor_of(row: int) -> int:
        return max(floors[p * rows + row] for p in range(processes))

    def db() -> sqlite3.Connection:
        if not hasattr(local, "conn"):
            local.conn = _db(db_path)
        return local.conn  # type: ignore[no-any-return]

    def version(row: int) -> int:
        return int(db().execute("SELECT version FROM rows WHERE id = ?", (row,)).fetchone()[0])

    def run() -> None:
        rng = random.Random()
        while True:
            row = rng.randrange(rows)
            name = f"row:{row}"
            roll = rng.random()
            began = time.monotonic()
            try:
                if roll < 0.10:
                    with guard.write(name):
                        db().execute("UPDATE rows SET version = version + 1 WHERE id = ?", (row,))
                        new = version(row)
                    with mine:  # the write has exited: reads must see it
                        floors[slot * rows + row] = max(floors[slot * rows + row], new)
                    kind = "writes"
                elif roll < 0.15:
                    guard.invalidate(name)
                    kind = "invalidations"
                else:
                    must_see = floor_of(row)
                    seen = guard.get_or_load(name, lambda row=row: version(row), ttl=2.0)
                    if seen < must_see:
                        count("stale_reads")
                    kind = "reads"
            except Exception as exc:
                kind = f"error {type(exc).__name__}"
            count(kind, time.monotonic() - began)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


_KINDS = [
    "reads",
    "writes",
    "invalidations",
    "stale_reads",
    "error BackendUnavailable",
    "error LockTimeout",
    "error LockLostError",
    "error other",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--kill-every", type=float, default=10.0)
    parser.add_argument("--restart-every", type=float, default=30.0)
    args = parser.parse_args(argv)
    for what in ("seconds", "processes", "threads", "rows", "lease", "kill_every"):
        if getattr(args, what) <= 0:
            parser.error(f"--{what.replace('_', '-')} must be > 0")

    workdir = tempfile.mkdtemp(prefix="cacheguard-soak-")
    db_path = str(Path(workdir) / "rows.sqlite3")
    conn = _db(db_path)
    conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)")
    conn.executemany("INSERT INTO rows VALUES (?, 0)", [(i,) for i in range(args.rows)])
    if shutil.which("redis-server") is None:
        sys.exit("soak: needs redis-server on the PATH (it kills and restarts its own)")
    server = OwnedRedisServer()
    width = len(_KINDS) + 1
    floors = CTX.Array("q", args.processes * args.rows, lock=False)
    stats = CTX.Array("d", args.processes * width, lock=False)

    def spawn(slot: int) -> Any:
        p = CTX.Process(
            target=worker,
            args=(server.url, db_path, args.rows, args.threads, args.lease, slot,
                  args.processes, floors, stats),
            daemon=True,
        )  # fmt: skip
        p.start()
        return p

    procs = [spawn(slot) for slot in range(args.processes)]
    kills = restarts = 0
    start = time.monotonic()
    next_kill, next_restart = start + args.kill_every, start + args.restart_every
    print(f"soak: {args.processes} processes x {args.threads} threads for {args.seconds:g}s")
    try:
        while (now := time.monotonic()) < start + args.seconds:
            if now >= next_kill:
                victim = random.randrange(len(procs))
                procs[victim].kill()
                procs[victim].join()
                procs[victim] = spawn(victim)
                kills += 1
                next_kill += args.kill_every
            if args.restart_every > 0 and now >= next_restart:
                server.kill()
                time.sleep(0.5)
                server.start()
                restarts += 1
                next_restart += args.restart_every
            time.sleep(0.1)
    finally:
        for p in procs:
            p.kill()
            p.join()
    counts = Counter(
        {
            kind: int(sum(stats[p * width + i] for p in range(args.processes)))
            for i, kind in enumerate(_KINDS)
        }
    )
    longest = max(stats[p * width + len(_KINDS)] for p in range(args.processes))
    client = redis.Redis(port=server.port)
    time.sleep(args.lease + 0.5)  # let the killed workers' leases run out
    left = [
        key.decode()
        for key in client.scan_iter(match=f"{NAMESPACE}:*", count=1000)
        if client.pttl(key) == -1 and not key.decode().endswith(NEVER_EXPIRING)
    ]
    print(f"worker kills {kills}, Redis restarts {restarts}")
    for kind in _KINDS:
        print(f"  {kind:<26} {counts.get(kind, 0):>9}")
    print(f"  {'longest operation (s)':<26} {longest:>9.3f}")
    print(f"  {'keys left without a TTL':<26} {len(left):>9}  {left[:5]}")
    server.close()
    shutil.rmtree(workdir, ignore_errors=True)
    failed = counts.get("stale_reads", 0) > 0 or bool(left)
    print("FAILED" if failed else "OK: no stale read, nothing left behind")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
