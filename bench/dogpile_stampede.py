"""A stampede on a dogpile.cache region: the ``cacheguard`` backend side by side with
dogpile's own ``dogpile.cache.redis`` (``distributed_lock=True``).

    python bench/dogpile_stampede.py [--url redis://...] [--processes 4] [--threads 25]
                                     [--rounds 5] [--load-ms 50] [--write docs/benchmarks.md]

P processes x T threads call ``region.get_or_create`` on one cold key at once; the
creator sleeps ``--load-ms``, counts itself in Redis and returns the moment it
finished inside the value. Reported per backend (median of the rounds, rounds of
the two backends interleaved, who goes first alternating): creator calls, and for
every other caller the lag from the creator's return to its own (p50, p95, max),
next to the machine's floor (P x T threads woken by an Event, no Redis).

Both regions are configured as their users would: the same expiration, the
default (pickle) serializer, the same lock lease (``lease`` / ``lock_timeout``),
``thread_local_lock=False`` on dogpile's backend as its docs advise with a
distributed lock. Without ``--url`` a throwaway ``redis-server`` is started.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import percentile, run_line, run_report, wake_floor
from cacheguard.testing import RedisEndpoint

CTX = mp.get_context("spawn")
MARK = "bench/dogpile_stampede.py"
BACKENDS = ("cacheguard", "dogpile.cache.redis")


def region_for(backend: str, url: str, prefix: str, lease: float) -> Any:
    from dogpile.cache import make_region

    if backend == "cacheguard":
        return make_region().configure(
            "cacheguard",
            expiration_time=60,
            arguments={"url": url, "namespace": prefix, "lease": lease},
        )
    return make_region(key_mangler=lambda key: f"{prefix}:{key}").configure(
        "dogpile.cache.redis",
        expiration_time=60,
        arguments={
            "url": url,
            "distributed_lock": True,
            "thread_local_lock": False,
            "lock_timeout": int(lease),
        },
    )


def worker(
    backend: str,
    url: str,
    prefix: str,
    threads: int,
    load_s: float,
    ready: Any,
    go: Any,
    out: Any,
    finish: Any,
) -> None:
    region = region_for(backend, url, prefix, 2.0)
    counter = redis.Redis.from_url(url)
    region.get_or_create(f"warm-{os.getpid()}", lambda: "warm")  # connections, scripts
    if backend == "cacheguard":
        # The process's pub/sub connection, open in a service after its first wait.
        from cacheguard.redis.notifier import notifier_for

        with notifier_for(region.backend.guard.client).subscription(f"{prefix}:warm") as sub:
            sub.open(5)
    created = threading.local()
    records: list[tuple[float, float, bool]] = []  # (returned at, loaded at, created here)
    mutex = threading.Lock()

    def create() -> dict[str, Any]:
        time.sleep(load_s)
        counter.incr(f"{prefix}:creations")
        created.here = True
        return {"loaded_at": time.time()}

    def call() -> None:
        created.here = False
        go.wait()
        value = region.get_or_create("hot", create)
        returned = time.time()
        with mutex:
            records.append((returned, value["loaded_at"], created.here))

    pool = [threading.Thread(target=call, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    ready.put(os.getpid())
    for thread in pool:
        thread.join(120)
    out.put(records)
    # Stay up until every process has reported, as a service would: an exiting
    # interpreter's teardown would take CPU from the processes still serving.
    finish.wait(180)


def one_round(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    prefix = f"dgb-{uuid.uuid4().hex[:8]}"
    ready, out, go, finish = CTX.Queue(), CTX.Queue(), CTX.Event(), CTX.Event()
    job = (backend, args.url, prefix, args.threads, args.load_ms / 1000)
    procs = [
        CTX.Process(target=worker, args=(*job, ready, go, out, finish), daemon=True)
        for _ in range(args.processes)
    ]
    admin = redis.Redis.from_url(args.url)
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=120)
        time.sleep(0.3)  # every caller parked on the go signal
        go.set()
        records = [record for _ in procs for record in out.get(timeout=180)]
        creations = int(admin.get(f"{prefix}:creations") or 0)
    finally:
        finish.set()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        keys = list(admin.scan_iter(match=f"{prefix}:*", count=1000))
        keys += list(admin.scan_iter(match=f"_lock{prefix}:*", count=1000))
        if keys:
            admin.delete(*keys)
        admin.close()
    lags = [(returned - loaded) * 1000 for returned, loaded, here in records if not here]
    return {
        "creations": creations,
        "answered": len(records),
        "p50": statistics.median(lags),
        "p95": percentile(lags, 0.95),
        "max": max(lags),
    }


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    args.url = endpoint.url
    rounds: dict[str, list[dict[str, Any]]] = {backend: [] for backend in BACKENDS}
    for rnd in range(args.rounds):
        order = BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]
        for backend in order:
            print(f"round {rnd + 1}: {backend}", file=sys.stderr)
            rounds[backend].append(one_round(args, backend))
    floors = [wake_floor(args.processes, args.threads) for _ in range(args.rounds)]
    version = redis.Redis.from_url(endpoint.url).info("server").get("redis_version", "?")
    callers = args.processes * args.threads
    lines = [
        run_line(str(version), endpoint.kind),
        "",
        f"Command: `python bench/dogpile_stampede.py {' '.join(args.argv)}`",
        "",
        f"{args.processes} processes x {args.threads} threads ({callers} callers) call "
        f"`region.get_or_create` on one cold key at once; the creator takes {args.load_ms} ms. "
        f"Waiter lag: from the creator's return to each other caller's. Median of "
        f"{args.rounds} rounds; lock lease 2 s on both.",
        "",
        "| backend | creator calls | callers answered | waiter lag p50 ms | p95 ms | max ms "
        "| max ms, worst round |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, runs in rounds.items():
        calls = ", ".join(str(run["creations"]) for run in runs)
        lines.append(
            f"| `{backend}` | {calls} | {min(run['answered'] for run in runs)} of {callers} "
            f"| {_median(runs, 'p50'):,.1f} | {_median(runs, 'p95'):,.1f} "
            f"| {_median(runs, 'max'):,.1f} | {max(run['max'] for run in runs):,.1f} |"
        )
    lines.append(
        f"| floor: {callers} threads woken by an Event, no Redis | | "
        f"| {statistics.median(f['lag_p50'] for f in floors):,.1f} | "
        f"| {statistics.median(f['lag_max'] for f in floors):,.1f} "
        f"| {max(f['lag_max'] for f in floors):,.1f} |"
    )
    return "\n".join(lines)


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(run[field] for run in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=25, help="callers per process")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load-ms", type=int, default=50)
    parser.add_argument("--write", type=Path, help="also write the table into this Markdown file")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return run_report(args.url, args.write, MARK, lambda endpoint: report(endpoint, args))


if __name__ == "__main__":
    sys.exit(main())
