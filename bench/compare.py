"""Side-by-side comparison: cacheguard against the caches users would pick instead.

    python bench/compare.py [--url redis://...] [--processes 4] [--threads 25]
                            [--rounds 3] [--write docs/benchmarks.md] [--charts docs/img]

Systems (bench/systems.py, one adapter each): cacheguard, naive cache-aside,
redis-py ``Lock`` (double-checked), python-redis-lock, dogpile.cache
(``distributed_lock=True``, ``lock_timeout`` = the lease), cashews (``lock=True``,
asyncio tasks instead of threads). Each run uses its own key prefix and cold keys.

Workloads, P processes x T callers, medians of the rounds:

- stampede: one cold key, all callers at once; the loader sleeps ``--load-ms``
  then counts itself in Redis. Loads, caller latency, waiter lag (how long after
  the first load ended each other caller returned), and the Redis commands the
  stampede cost (``total_commands_processed``, calls inside Lua included, the
  loaders' own counting excluded);
- many: ``--keys`` cold keys, every caller asks for each in its own shuffled order:
  loads (ideal = keys), wall time, commands per key;
- hit: one warm key, one thread: µs per get next to a raw GET + msgpack decode of
  the same payload (sync or asyncio, as the system is), cacheguard also with L1;
- churn: every caller reads one key for ``--churn-seconds`` while a writer process
  commits a new version (a counter in Redis standing in for the database) every
  ``--write-every-ms`` through the system's write path: loads per write (ideal 1),
  stale reads (a version older than one committed before the read began), p99;
- crash: one process starts the load and is SIGKILLed mid-load; the other callers
  are already waiting: time from the kill until they get a value (bounded by
  ``--crash-wait``). dogpile.cache also runs with its default (no lock_timeout).

Without ``--url`` a throwaway ``redis-server`` is started so the command counts are
not mixed with other traffic. Every wait is bounded; a run that does not finish
in time is reported as such, not hung on.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    command_calls,
    interleaved_batches_us,
    percentile,
    run_line,
    run_report,
    total_commands,
    wake_floor,
)
from bench.compare_report import (
    charts_for,
    churn_table,
    crash_table,
    hit_table,
    many_table,
    stampede_table,
)
from bench.systems import CRASH_EXTRA, SYSTEMS, Settings, fresh_prefix, versions
from cacheguard.testing import RedisEndpoint

CTX = mp.get_context("spawn")
MARK = "bench/compare.py"
WORKLOADS = ("stampede", "many", "hit", "churn", "crash")
# Sent once per new connection: a pool growing to the stampede's concurrency pays
# them once, a running service has paid them already. Listed, not counted.
HANDSHAKES = ("hello", "client|setinfo", "client|setname")
PAYLOAD = [
    {"id": i, "name": f"menu {i}", "parent_id": i // 10, "sort": i, "url": f"/m/{i}"}
    for i in range(20)
]

# A caller is a generator: it yields the key it wants, receives the value, and
# returns its records. One algorithm per workload serves thread and asyncio
# drivers alike.
Caller = Generator[str, Any, list[Any]]


@dataclass
class Job:
    """What one worker process does; picklable for the spawn context."""

    system: str
    settings: Settings
    role: str  # "callers" | "victim" | "writer"
    workload: str
    callers: int
    load_s: float
    key: str = ""
    keys: list[str] = field(default_factory=list)
    seed: int = 0
    duration: float = 0.0  # seconds a timed workload runs after the go signal
    write_every: float = 0.2
    give_up: float = 0.0  # seconds after the go signal a waiting caller stops waiting


def _counter(settings: Settings) -> str:
    return f"{settings.prefix}:bench:loads"


def _db(settings: Settings) -> str:
    return f"{settings.prefix}:bench:db"


# -- callers --------------------------------------------------------------------


def _one_call(key: str) -> Caller:
    started = time.time()
    yield key
    ended = time.time()
    return [(ended, ended - started)]


def _walk(keys: list[str], seed: int) -> Caller:
    order = list(keys)
    random.Random(seed).shuffle(order)
    started = time.time()
    for key in order:  # noqa: UP028 (values are sent back in; a list iterator takes no send)
        yield key
    return [(started, time.time(), len(order))]


def _read_until(key: str, until: float) -> Caller:
    records = []
    while True:
        started = time.time()
        if started >= until:
            return records
        value = yield key
        records.append((started, int(value["v"]), time.time() - started))


def _caller(job: Job, index: int) -> Caller:
    if job.workload == "many":
        return _walk(job.keys, job.seed * 1000 + index)
    if job.workload == "churn":
        return _read_until(job.key, time.time() + job.duration)
    return _one_call(job.key)


def _drive(caller: Caller, get: Callable[[str], Any]) -> list[Any]:
    try:
        key = next(caller)
        while True:
            key = caller.send(get(key))
    except StopIteration as done:
        return list(done.value)


async def _adrive(caller: Caller, get: Callable[[str], Any]) -> list[Any]:
    try:
        key = next(caller)
        while True:
            key = caller.send(await get(key))
    except StopIteration as done:
        return list(done.value)


# -- worker processes ------------------------------------------------------------


def _worker(job: Job, ready: Any, go: Any, out: Any) -> None:
    system = SYSTEMS.get(job.system) or CRASH_EXTRA[job.system]
    adapter = system(job.settings)
    if adapter.is_async:
        asyncio.run(_async_worker(job, adapter, ready, go, out))
    else:
        _sync_worker(job, adapter, ready, go, out)


def _sync_worker(job: Job, adapter: Any, ready: Any, go: Any, out: Any) -> None:
    client = redis.Redis.from_url(job.settings.url)
    load_ends: list[float] = []
    db, counter = _db(job.settings), _counter(job.settings)

    armed = threading.Event()  # the victim dies in its first load after the warm-up

    def load() -> dict[str, Any]:
        version = int(client.get(db) or 0) if job.workload == "churn" else 0
        if armed.is_set():
            ready.put("loading")
            time.sleep(3600)  # SIGKILLed here
        time.sleep(job.load_s)
        client.incr(counter)
        load_ends.append(time.time())
        return {"v": version, "rows": PAYLOAD}

    adapter.get(f"warm-{os.getpid()}", load)  # connections, scripts
    adapter.warm()  # what else a running service has open already
    if job.workload == "churn":
        adapter.get(job.key, load)  # churn measures invalidations, not the cold start
    load_ends.clear()
    if job.role == "victim":
        armed.set()
        adapter.get(job.key, load)
    if job.role == "writer":
        ready.put("ready")
        go.wait()
        out.put(_write_loop(job, lambda update: adapter.write(job.key, update), client))
        return
    results: list[Any] = []
    mutex = threading.Lock()

    def run(index: int) -> None:
        go.wait()
        records = _drive(_caller(job, index), lambda key: adapter.get(key, load))
        with mutex:
            results.extend(records)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(job.callers)]
    for thread in threads:
        thread.start()
    ready.put("ready")
    go.wait()
    give_up = time.time() + job.give_up if job.give_up else None
    for thread in threads:
        thread.join(max(give_up - time.time(), 0) if give_up else None)
    with mutex:
        out.put({"records": list(results), "load_ends": list(load_ends)})
    _exit_now(out)


def _exit_now(out: Any) -> None:
    """Leave at once: callers still blocked in a lock (a system that never recovers)
    must not hold the process. The queue's feeder thread is flushed first."""
    out.close()
    out.join_thread()
    os._exit(0)


def _write_loop(job: Job, write: Callable[[Callable[[], None]], None], client: Any) -> Any:
    commits: list[tuple[float, int]] = []

    def update() -> None:
        version = int(client.incr(_db(job.settings)))
        commits.append((time.time(), version))

    until = time.time() + job.duration
    while time.time() < until:
        started = time.time()
        write(update)
        time.sleep(max(job.write_every - (time.time() - started), 0))
    return {"commits": commits}


async def _async_worker(job: Job, adapter: Any, ready: Any, go: Any, out: Any) -> None:
    client = redis.asyncio.Redis.from_url(job.settings.url)
    load_ends: list[float] = []
    db, counter = _db(job.settings), _counter(job.settings)
    loop = asyncio.get_running_loop()

    armed = False  # the victim dies in its first load after the warm-up

    async def load() -> dict[str, Any]:
        version = int(await client.get(db) or 0) if job.workload == "churn" else 0
        if armed:
            ready.put("loading")
            await asyncio.sleep(3600)  # SIGKILLed here
        await asyncio.sleep(job.load_s)
        await client.incr(counter)
        load_ends.append(time.time())
        return {"v": version, "rows": PAYLOAD}

    await adapter.get(f"warm-{os.getpid()}", load)
    await adapter.warm()
    if job.workload == "churn":
        await adapter.get(job.key, load)
    load_ends.clear()
    if job.role == "victim":
        armed = True
        await adapter.get(job.key, load)
    ready.put("ready")
    await loop.run_in_executor(None, go.wait)
    if job.role == "writer":
        commits: list[tuple[float, int]] = []

        async def update() -> None:
            version = int(await client.incr(db))
            commits.append((time.time(), version))

        until = time.time() + job.duration
        while time.time() < until:
            started = time.time()
            await adapter.write(job.key, update)
            await asyncio.sleep(max(job.write_every - (time.time() - started), 0))
        out.put({"commits": commits})
        return
    tasks = [
        asyncio.create_task(_adrive(_caller(job, i), lambda key: adapter.get(key, load)))
        for i in range(job.callers)
    ]
    done, _pending = await asyncio.wait(tasks, timeout=job.give_up or None)
    records = [r for task in done if task.exception() is None for r in task.result()]
    out.put({"records": records, "load_ends": list(load_ends)})
    _exit_now(out)


# -- one round of a workload -------------------------------------------------------


class Round:
    """Spawns a round's workers, starts them together, collects their results; on
    close, stops what is left and drops the round's keys."""

    def __init__(self, deadline: float, settings: Settings) -> None:
        self.deadline, self.settings = deadline, settings
        self.ready, self.out, self.go = CTX.Queue(), CTX.Queue(), CTX.Event()
        self.procs: list[Any] = []

    def spawn(self, job: Job) -> Any:
        proc = CTX.Process(target=_worker, args=(job, self.ready, self.go, self.out), daemon=True)
        proc.start()
        self.procs.append(proc)
        return proc

    def wait_ready(self, count: int) -> None:
        for _ in range(count):
            self.ready.get(timeout=max(self.deadline - time.time(), 1))

    def collect(self, count: int) -> list[Any]:
        results = []
        for _ in range(count):
            results.append(self.out.get(timeout=max(self.deadline - time.time(), 1)))
        return results

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        _forget(redis.Redis.from_url(self.settings.url), self.settings)

    def __enter__(self) -> Round:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Window:
    """What the workers of a round reported and what their run cost Redis."""

    results: list[Any]
    wall_s: float
    loads: int
    commands: int  # calls inside Lua included; -1 without INFO (fakeredis)
    by_command: dict[str, int]


def _measure(admin: redis.Redis, settings: Settings, runner: Round, workers: int) -> Window:
    """Start the round's spawned workers together, wait for their results, and
    count the loads and Redis commands in between."""
    runner.wait_ready(workers)
    time.sleep(0.3)  # every caller is parked on the go signal
    loads_before = _loads(admin, settings)
    calls_before = command_calls(admin)
    before = total_commands(admin)
    started = time.time()
    runner.go.set()
    results = runner.collect(workers)
    wall = time.time() - started
    after = total_commands(admin)
    spent = _spent(calls_before, command_calls(admin))
    loads = _loads(admin, settings) - loads_before
    handshakes = sum(n for name, n in spent.items() if name in HANDSHAKES)
    # minus the first INFO (counted by the second), the loaders' INCRs and the
    # handshakes of connections opened meanwhile
    commands = after - before - 1 - loads - handshakes if before >= 0 else -1
    return Window(results, wall, loads, commands, spent)


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per command between two INFO commandstats readings (INFO itself left out)."""
    return {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if calls > before.get(name, 0) and name != "info"
    }


def _loads(admin: redis.Redis, settings: Settings) -> int:
    return int(admin.get(_counter(settings)) or 0)


def _forget(admin: redis.Redis, settings: Settings) -> None:
    """Drop the round's keys once its processes are gone: a ``--url`` server keeps
    nothing of the run (cacheguard's fence and watermark counters never expire)."""
    keys = list(admin.scan_iter(match=f"{settings.prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        admin.delete(*keys[start : start + 500])


def _settings(args: argparse.Namespace, system: str) -> Settings:
    return Settings(url=args.url, prefix=fresh_prefix(system), ttl=args.ttl, lease=args.lease)


def _job(args: argparse.Namespace, system: str, settings: Settings, **kw: Any) -> Job:
    base: dict[str, Any] = {
        "system": system,
        "settings": settings,
        "role": "callers",
        "callers": args.threads,
        "load_s": args.load_ms / 1000,
    }
    base.update(kw)
    return Job(**base)


def run_stampede(args: argparse.Namespace, system: str, rnd: int) -> dict[str, Any]:
    settings = _settings(args, system)
    admin = redis.Redis.from_url(args.url)
    with Round(time.time() + args.deadline, settings) as runner:
        for p in range(args.processes):
            job = _job(args, system, settings, workload="stampede", key=f"stampede-{rnd}", seed=p)
            runner.spawn(job)
        window = _measure(admin, settings, runner, args.processes)
    loads = window.loads
    load_ends = sorted(t for r in window.results for t in r["load_ends"])
    records = [rec for r in window.results for rec in r["records"]]
    latencies = [lat * 1000 for _, lat in records]
    lags = sorted((ended - load_ends[0]) * 1000 for ended, _ in records)[loads:]
    return {
        "loads": loads,
        "commands": window.commands,
        "lag_p50": statistics.median(lags) if lags else 0.0,
        "lag_max": max(lags) if lags else 0.0,
        "lat_p50": statistics.median(latencies),
        "lat_p99": percentile(latencies, 0.99),
        "lat_max": max(latencies),
        "answered": len(records),
        "by_command": window.by_command,
    }


def run_many(args: argparse.Namespace, system: str, rnd: int) -> dict[str, Any]:
    settings = _settings(args, system)
    admin = redis.Redis.from_url(args.url)
    keys = [f"many-{rnd}-{i}" for i in range(args.keys)]
    with Round(time.time() + args.deadline, settings) as runner:
        for p in range(args.processes):
            runner.spawn(_job(args, system, settings, workload="many", keys=keys, seed=p))
        window = _measure(admin, settings, runner, args.processes)
    calls = sum(n for r in window.results for _, _, n in r["records"])
    return {
        "loads": window.loads,
        "wall_s": window.wall_s,
        "commands_per_key": window.commands / args.keys if window.commands >= 0 else -1,
        "complete": calls == args.keys * args.processes * args.threads,
        "by_command": window.by_command,
    }


def run_churn(args: argparse.Namespace, system: str, rnd: int) -> dict[str, Any]:
    settings = _settings(args, system)
    admin = redis.Redis.from_url(args.url)
    common = {"workload": "churn", "key": f"churn-{rnd}", "duration": args.churn_seconds}
    with Round(time.time() + args.deadline + args.churn_seconds, settings) as runner:
        for p in range(args.processes):
            runner.spawn(_job(args, system, settings, seed=p, **common))
        writer = _job(
            args, system, settings, role="writer", write_every=args.write_every_ms / 1000, **common
        )
        runner.spawn(writer)
        window = _measure(admin, settings, runner, args.processes + 1)
    commits = sorted(c for r in window.results for c in r.get("commits", []))
    reads = [rec for r in window.results for rec in r.get("records", [])]
    commit_times = [t for t, _ in commits]
    stale = 0
    for started, version, _ in reads:
        # the newest version committed before this read began
        committed = bisect.bisect_right(commit_times, started)
        if committed and version < commits[committed - 1][1]:
            stale += 1
    latencies = [lat * 1000 for _, _, lat in reads]
    return {
        "writes": len(commits),
        "loads": window.loads,
        "loads_per_write": window.loads / max(len(commits), 1),
        "reads": len(reads),
        "stale": stale,
        "lat_p50": statistics.median(latencies) if latencies else 0.0,
        "lat_p99": percentile(latencies, 0.99) if latencies else 0.0,
    }


def run_crash(args: argparse.Namespace, system: str, rnd: int) -> dict[str, Any]:
    settings = _settings(args, system)
    key = f"crash-{rnd}"
    with Round(time.time() + args.deadline, settings) as runner:
        victim = runner.spawn(
            _job(args, system, settings, role="victim", workload="crash", key=key, callers=1)
        )
        if runner.ready.get(timeout=args.deadline) != "loading":
            raise RuntimeError(f"{system}: the victim did not start loading")
        waiters = max(args.processes - 1, 1)
        settle = 0.5  # every waiter is inside the library's wait before the kill
        for p in range(waiters):
            runner.spawn(
                _job(
                    args,
                    system,
                    settings,
                    workload="crash",
                    key=key,
                    seed=p + 1,
                    give_up=settle + args.crash_wait,
                )
            )
        runner.wait_ready(waiters)
        runner.go.set()
        time.sleep(settle)
        killed = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        results = _collect_until(runner, waiters, killed + args.crash_wait + 10)
    answered = sorted(ended - killed for r in results for ended, _ in r["records"])
    answered = [a for a in answered if a <= args.crash_wait]
    return {
        "callers": waiters * args.threads,
        "answered": len(answered),
        "first_s": answered[0] if answered else None,
        "median_s": statistics.median(answered) if answered else None,
        "last_s": answered[-1] if answered else None,
    }


def _collect_until(runner: Round, count: int, until: float) -> list[Any]:
    results = []
    for _ in range(count):
        try:
            results.append(runner.out.get(timeout=max(until - time.time(), 0.1)))
        except Exception:  # queue.Empty: a worker still blocked past its give-up
            break
    return results


# -- hit path (one thread, in this process) ---------------------------------------


def run_hit(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """µs per warm get of every system, batches interleaved with the raw baselines."""
    loop = asyncio.new_event_loop()
    client = redis.Redis.from_url(args.url)
    aclient = redis.asyncio.Redis.from_url(args.url)
    raw_key = fresh_prefix("raw")
    client.set(raw_key, msgpack.packb({"v": 0, "rows": PAYLOAD}), ex=3600)
    value = {"v": 0, "rows": PAYLOAD}

    def load() -> dict[str, Any]:
        return value

    async def aload() -> dict[str, Any]:
        return value

    async def make(system: type[Any], settings: Settings) -> Any:
        return system(settings)

    adapters: list[tuple[str, Any]] = []
    for name in args.systems:
        adapters.append((name, loop.run_until_complete(make(SYSTEMS[name], _settings(args, name)))))
    if "cacheguard" in args.systems:
        l1 = Settings(url=args.url, prefix=fresh_prefix("cacheguard"), ttl=3600, l1=True)
        adapters.append(("cacheguard, L1 on", SYSTEMS["cacheguard"](l1)))

    def sync_batch(adapter: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                adapter.get("hot", load)

        return run

    def async_batch(adapter: Any) -> Callable[[int], None]:
        async def many(n: int) -> None:
            for _ in range(n):
                await adapter.get("hot", aload)

        return lambda n: loop.run_until_complete(many(n))

    def raw(n: int) -> None:
        for _ in range(n):
            msgpack.unpackb(client.get(raw_key))

    async def araw_many(n: int) -> None:
        for _ in range(n):
            msgpack.unpackb(await aclient.get(raw_key))

    batches: dict[str, Callable[[int], None]] = {
        "raw GET + unpackb": raw,
        "raw GET + unpackb (asyncio)": lambda n: loop.run_until_complete(araw_many(n)),
    }
    kinds = {"raw GET + unpackb": "sync", "raw GET + unpackb (asyncio)": "async"}
    for name, adapter in adapters:
        label = adapter.label if name != "cacheguard, L1 on" else name
        batches[label] = async_batch(adapter) if adapter.is_async else sync_batch(adapter)
        kinds[label] = "async" if adapter.is_async else "sync"
    for run in batches.values():
        run(200)  # warm: connections, scripts, the entry itself
    micros = interleaved_batches_us(batches, args.cycles)
    for _name, adapter in adapters:
        closing = adapter.close()
        if asyncio.iscoroutine(closing):
            loop.run_until_complete(closing)
    loop.run_until_complete(aclient.aclose())
    loop.close()
    return {label: {"us": us, "async": kinds[label] == "async"} for label, us in micros.items()}


# -- the report --------------------------------------------------------------------


def _bounded(rounds: list[dict[str, Any]], name: str, run: Callable[[], dict[str, Any]]) -> None:
    """Run one round; a round that breaks its time bound is recorded as such."""
    try:
        rounds.append(run())
    except Exception as exc:  # a library that hangs or fails must not stop the others
        print(f"  {name}: round failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        rounds.append({"failed": f"{type(exc).__name__}"})


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    args.url = endpoint.url
    try:
        server = redis.Redis.from_url(endpoint.url).info("server")
    except redis.ResponseError:  # fakeredis has no INFO
        server = {"redis_version": "fakeredis"}
    found = versions()
    lines = [
        run_line(str(server.get("redis_version")), endpoint.kind),
        "Libraries: " + ", ".join(f"{dist} {ver}" for dist, ver in found.items()) + ".",
        "",
        f"Command: `python bench/compare.py {' '.join(args.argv)}`",
        "",
        f"Settings: {args.processes} processes x {args.threads} callers (threads; asyncio tasks "
        f"for cashews), {args.load_ms} ms loader, lock lease {args.lease:g} s where the library "
        f"has one, cache TTL {args.ttl:g} s, median of {args.rounds} rounds.",
    ]
    charts: dict[str, Any] = {}
    runners: dict[str, Callable[[argparse.Namespace, str, int], dict[str, Any]]] = {
        "stampede": run_stampede,
        "many": run_many,
        "churn": run_churn,
        "crash": run_crash,
    }
    for workload in args.workloads:
        print(f"{workload} ...", file=sys.stderr)
        if workload == "hit":
            hits = run_hit(args)
            lines += hit_table(hits)
            charts["hit"] = hits
            continue
        names = list(args.systems) + (
            [n for n in CRASH_EXTRA if "dogpile" in args.systems] if workload == "crash" else []
        )
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for rnd in range(args.rounds):
            # systems interleaved round by round, who goes first rotating: noise and
            # whatever the previous run left behind hit all alike
            shift = rnd % len(names)
            for name in names[shift:] + names[:shift]:
                print(f"  {workload} round {rnd + 1}: {name}", file=sys.stderr)
                _bounded(
                    results[name],
                    name,
                    lambda run=runners[workload], n=name, r=rnd: run(args, n, r),
                )
        if workload == "stampede":
            floors = [wake_floor(args.processes, args.threads) for _ in range(args.rounds)]
            lines += stampede_table(results, floors, args)
        elif workload == "many":
            lines += many_table(results, args)
        elif workload == "churn":
            lines += churn_table(results, args)
        else:
            lines += crash_table(results, args)
        charts[workload] = results
    if args.charts:
        lines += charts_for(charts, args)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=25, help="callers per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-ms", type=int, default=50)
    parser.add_argument("--keys", type=int, default=1000, help="keys of the many-keys workload")
    parser.add_argument("--churn-seconds", type=float, default=10.0)
    parser.add_argument("--write-every-ms", type=int, default=200)
    parser.add_argument("--lease", type=float, default=2.0, help="lock lease / timeout, s")
    parser.add_argument("--ttl", type=float, default=60.0, help="cache TTL, s")
    parser.add_argument("--crash-wait", type=float, default=10.0)
    parser.add_argument("--cycles", type=int, default=3000, help="hit-path cycles per system")
    parser.add_argument("--deadline", type=float, default=120.0, help="bound on one round, s")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    parser.add_argument("--charts", type=Path, help="write one PNG per workload into this folder")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = [s for s in args.systems if s not in SYSTEMS] + [
        w for w in args.workloads if w not in WORKLOADS
    ]
    if unknown:
        parser.error(
            f"unknown {', '.join(unknown)}; systems: {', '.join(SYSTEMS)}; "
            f"workloads: {', '.join(WORKLOADS)}"
        )
    if min(args.processes, args.threads, args.rounds, args.keys) < 1 or args.load_ms < 0:
        parser.error("processes, threads, rounds and keys must be >= 1, load-ms >= 0")
    if min(args.churn_seconds, args.lease, args.ttl, args.crash_wait, args.deadline) <= 0:
        parser.error("churn-seconds, lease, ttl, crash-wait and deadline must be > 0")
    if args.cycles < 100 or args.write_every_ms < 1:
        parser.error("cycles must be >= 100 and write-every-ms >= 1")
    return run_report(args.url, args.write, MARK, lambda endpoint: report(endpoint, args))


if __name__ == "__main__":
    raise SystemExit(main())
