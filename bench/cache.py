"""Cache benchmark: the cold-key stampede and the hit path, side by side in one run.

    python bench/cache.py [--url redis://...] [--processes 4] [--threads 25] [--tasks 50]
                          [--load-ms 50] [--rounds 3] [--hit-rounds 100] [--hit-only]
                          [--write docs/benchmarks.md]

Without ``--url`` it starts its own throwaway ``redis-server`` (so command counts
are not mixed with other traffic), or falls back like the tests do.

Stampede: P processes x T threads ask for one cold key at once; the loader
sleeps ``--load-ms`` then returns. Measured per round (median of rounds shown):
loader calls; waiter lag (from the moment the loader returned to the moment each
other caller got the value); caller latency; and the Redis commands the whole
stampede cost (``total_commands_processed``, which counts the calls made inside
Lua too). Connections and scripts are warmed up first, as in a running service;
the channel's UNSUBSCRIBE (10 s after the last waiter) falls outside the window.
The same stampede through naive cache-aside (GET, load, SET) runs beside it.
Then on asyncio: P processes x ``--tasks`` tasks of an AsyncCacheGuard, with a
1 ms ticker task in each loop recording its longest gap (a blocked loop shows),
and sync and asyncio processes side by side on one key (one load expected).
With ``--cluster`` (the default when ``redis-server`` is installed) the sync and
asyncio stampedes run again on a throwaway Redis Cluster (3 masters, 3 replicas),
beside the single-server figures; commands are summed over the masters.

Hit path (``--hit-only``: this alone): one warm key, one thread, default settings,
over a real connection. A default redis-py client's GET + decode of the same
payload (the codec call the guard makes: what a user pays without cacheguard),
the GET + decode of the client ``CacheGuard.from_url`` makes, and a hit through
``get_or_load``, ``CacheLoader.get`` and ``@cached_with_lock``; then the asyncio
twins on one event loop (a default ``redis.asyncio`` client against
``AsyncCacheGuard.from_url``). Batches of 300 calls, every row's once per round in
a rotating order, ``--hit-rounds`` rounds: µs per call is the median batch, and
the cost over the default client is the median of the rounds' paired differences
(the machine's speed drifts by more than the differences measured; a round's
batches drift alike). Each row's CPU time (this thread's: the wait for Redis
excluded) beside it. Then the same rows with GET answered from memory (the
Python cost alone), and an L1 hit. In both, a ``get_or_load`` hit with metrics on
(:mod:`cacheguard.integrations.prometheus`) and with tracing on
(:mod:`cacheguard.integrations.opentelemetry`: an SDK ``TracerProvider`` whose batch
processor hands the spans to an exporter that drops them). Then a batch: 20 warm
keys through ``get_or_load_many`` (one pipeline) against 20 single ``get_or_load``
hits and against a default client's one MGET of 20 raw keys with their decodes.
Last, compression: a hit of a 200-row menu list stored as encoded, zlib- and
zstd-compressed (zstd when zstandard is installed), each against the uncompressed
one, over the wire and from memory; and typed values: the 20 rows read as
dataclasses, pydantic models and msgspec Structs, each against the plain rows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cacheguard_testing.deployments import OwnedRedisCluster

from bench._common import (
    Paired,
    command_calls,
    paired_batches,
    percentile,
    run_line,
    run_report,
    total_commands,
    wake_floor,
)
from cacheguard import CacheGuard, CacheLoader, cached_with_lock
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader, async_notifier_for
from cacheguard.cache.codec import MsgpackCodec
from cacheguard.cache.scripts import TIMED_GET
from cacheguard.redis.clients import parse_url, sync_client_from_url
from cacheguard.redis.notifier import notifier_for
from cacheguard.testing import RedisEndpoint

CTX = mp.get_context("spawn")
MARK = "bench/cache.py"
HIT_MARK = "bench/cache.py --hit-only"


def _worker(
    url: str, kind: str, name: str, threads: int, load_s: float, ready: Any, go: Any, out: Any
) -> None:
    if kind == "cacheguard-async":
        asyncio.run(_async_worker(url, name, threads, load_s, ready, go, out))
        return
    client = sync_client_from_url(url, {})
    guard = CacheGuard(client, namespace="bench", ttl_jitter=0, early_refresh_beta=0)
    # Warm up as a running service would be: pool connection, scripts, subscriber.
    guard.get_or_load(f"warm-{os.getpid()}", lambda: 1, ttl=60)
    with notifier_for(client).subscription("bench:warm") as sub:
        sub.open(5)
    client.ping()
    results: list[tuple[float, bool]] = []
    mutex = threading.Lock()

    def load() -> str:
        time.sleep(load_s)
        client_side_end = time.time()
        with mutex:
            results.append((client_side_end, True))
        return "value"

    def naive() -> str:
        raw = client.get(f"bench:naive:{name}")
        if raw is not None:
            return str(msgpack.unpackb(raw))
        value = load()
        client.set(f"bench:naive:{name}", msgpack.packb(value), ex=60)
        return value

    def call() -> None:
        go.wait()
        started = time.time()
        if kind == "cacheguard":
            guard.get_or_load(name, load, ttl=60)
        else:
            naive()
        ended = time.time()
        with mutex:
            results.append((ended, False))
            results.append((ended - started, None))  # type: ignore[arg-type]

    pool = [threading.Thread(target=call) for _ in range(threads)]
    for t in pool:
        t.start()
    ready.put(True)
    for t in pool:
        t.join()
    out.put(results)


async def _async_worker(
    url: str, name: str, tasks: int, load_s: float, ready: Any, go: Any, out: Any
) -> None:
    """``tasks`` asyncio tasks of one process ask for the key at once; a ticker task
    beside them records the longest gap between its ticks (a blocked loop shows)."""
    guard = AsyncCacheGuard.from_url(url, namespace="bench", ttl_jitter=0, early_refresh_beta=0)
    await guard.get_or_load(f"warm-{os.getpid()}", lambda: 1, ttl=60)
    warm = async_notifier_for(guard.client).subscription("bench:warm")
    await warm.open(5)
    warm.close()
    results: list[tuple[float, Any]] = []

    async def load() -> str:
        await asyncio.sleep(load_s)
        results.append((time.time(), True))
        return "value"

    async def call() -> None:
        started = time.time()
        await guard.get_or_load(name, load, ttl=60)
        ended = time.time()
        results.append((ended, False))
        results.append((ended - started, None))

    ready.put(True)
    await asyncio.to_thread(go.wait)
    stop = asyncio.Event()
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    await asyncio.gather(*(call() for _ in range(tasks)))
    stop.set()
    await ticking
    results.append((max(gaps, default=0.0) * 1000, "gap"))
    await guard.aclose()
    await guard.client.aclose()
    out.put(results)


def stampede(
    url: str, kind: str, processes: int, threads: int, load_s: float, rnd: int
) -> dict[str, float]:
    """One cold key asked by ``processes`` x ``threads`` callers; ``kind`` "mixed"
    alternates sync (threads) and asyncio (tasks) processes."""
    name = f"stampede-{kind}-{rnd}-{time.time_ns()}"
    ready, out, go = CTX.Queue(), CTX.Queue(), CTX.Event()
    kinds = [
        ("cacheguard" if i % 2 else "cacheguard-async") if kind == "mixed" else kind
        for i in range(processes)
    ]
    procs = [
        CTX.Process(target=_worker, args=(url, k, name, threads, load_s, ready, go, out))
        for k in kinds
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    time.sleep(0.2)  # every thread is parked on the go signal
    admins = _admins(url)
    calls_before = _summed(command_calls(a) for a in admins)
    before = sum(total_commands(a) for a in admins)
    go.set()
    rows: list[tuple[float, Any]] = []
    for _ in procs:
        rows.extend(out.get(timeout=120))
    after = sum(total_commands(a) for a in admins)
    calls_after = _summed(command_calls(a) for a in admins)
    for admin in admins:
        admin.close()
    breakdown = {
        k: calls_after.get(k, 0) - calls_before.get(k, 0)
        for k in calls_after
        if calls_after.get(k, 0) - calls_before.get(k, 0) and k != "info"
    }
    for p in procs:
        p.join(10)
    gaps = [t for t, is_load in rows if is_load == "gap"]
    fill_ends = [t for t, is_load in rows if is_load is True]
    returns = [t for t, is_load in rows if is_load is False]
    latencies = [t * 1000 for t, is_load in rows if is_load is None]
    loads = len(fill_ends)
    # Waiter lag: each caller that did not load, from the (first) load's end.
    first_end = min(fill_ends)
    lags = sorted((r - first_end) * 1000 for r in returns)[loads:]
    return {
        "loads": loads,
        # minus the first INFO of each server, counted by the second; -1: no INFO (fakeredis)
        "commands": after - before - len(admins) if before >= 0 else -1,
        "lag_p50": statistics.median(lags) if lags else 0.0,
        "lag_max": max(lags) if lags else 0.0,
        "lat_p50": statistics.median(latencies),
        "lat_p99": percentile(latencies, 0.99),
        "gap_max": max(gaps, default=float("nan")),  # the loop's longest stall (asyncio)
        "breakdown": breakdown,  # type: ignore[dict-item]
    }


def _admins(url: str) -> list[redis.Redis]:
    """A client of each server whose commands a stampede is counted on: the one
    server, or every master of a cluster (replicas only replay what masters did)."""
    if parse_url(url).kind != "cluster":
        return [redis.Redis.from_url(url)]
    cluster = sync_client_from_url(url, {})
    try:
        return [redis.Redis(host=n.host, port=n.port) for n in cluster.get_primaries()]
    finally:
        cluster.close()


def _summed(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for name, calls in count.items():
            total[name] = total.get(name, 0) + calls
    return total


def cluster_stampedes(args: argparse.Namespace, load_s: float) -> dict[str, list[dict[str, Any]]]:
    """The sync and asyncio stampedes on a throwaway cluster (3 masters, 3 replicas)."""
    runs: dict[str, list[dict[str, Any]]] = {
        "cacheguard, cluster": [],
        "cacheguard (asyncio), cluster": [],
    }
    with OwnedRedisCluster() as cluster:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
        for rnd in range(args.rounds):
            runs["cacheguard, cluster"].append(
                stampede(url, "cacheguard", args.processes, args.threads, load_s, rnd)
            )
            runs["cacheguard (asyncio), cluster"].append(
                stampede(url, "cacheguard-async", args.processes, args.tasks, load_s, rnd)
            )
    return runs


class _InMemory:
    """A stand-in client whose GET returns stored bytes without I/O: what is left of a
    hit is its Python cost, measured without the network's noise."""

    def __init__(self, client: redis.Redis, keys: list[str]) -> None:
        self._data = {key: client.get(key) for key in keys}

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def evalsha(self, sha: str, numkeys: int, key: str, *args: Any) -> list[Any]:
        """TIMED_GET, the only script a hit sends (once a minute: it samples the
        server's clock, see cacheguard/cache/server_clock.py), with this host's clock."""
        assert sha == TIMED_GET.sha, "only TIMED_GET is answered from memory"
        seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
        return [self._data.get(key), seconds, micros]


def _menu_rows() -> list[dict[str, Any]]:
    return [
        {"id": i, "name": f"menu {i}", "parent_id": i // 10, "sort": i, "url": f"/m/{i}"}
        for i in range(20)
    ]


# What a user does without cacheguard: GET the key and decode it with the same
# codec call the guard makes (msgpack with the guard's extension types).
_CODEC = MsgpackCodec()
RAW_KEY = "bench-hit:raw"
HIT_NAMESPACE = "bench-hit"


def _batched(body: Callable[[], Any]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            body()

    return run


def _guard_bodies(guard: CacheGuard) -> dict[str, Callable[[int], None]]:
    """A hit through each way in, on ``guard`` (key template rendering included)."""
    value = _menu_rows()

    def load_menu(menu_id: int) -> list[dict[str, Any]]:
        return value

    menu = CacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=3600)

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=3600)
    def cached_menu(menu_id: int) -> list[dict[str, Any]]:
        return value

    return {
        "get_or_load": _batched(lambda: guard.get_or_load("menu:7", lambda: value, ttl=3600)),
        "CacheLoader.get": _batched(lambda: menu.get(7)),
        "@cached_with_lock": _batched(lambda: cached_menu(7)),
    }


class _Observers:
    """What the observed rows hit through: guards with metrics on (a ``CacheMetrics`` on
    a registry of its own) and with tracing on (an SDK ``TracerProvider`` whose batch
    processor hands the spans to an exporter that drops them: the SDK's whole cost
    but the network's)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from prometheus_client import CollectorRegistry

        from cacheguard.integrations.prometheus import CacheMetrics

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        self.metrics = CacheMetrics(CollectorRegistry())
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(Dropped()))

    def metered(self, guard: Any) -> Any:
        return self.metrics.instrument(guard)

    def traced(self, guard: Any) -> Any:
        from cacheguard.integrations.opentelemetry import instrument

        instrument(guard, tracer_provider=self.provider)
        return guard

    def close(self) -> None:
        self.metrics.close()
        self.provider.shutdown()


def _observed_bodies(metered: CacheGuard, traced: CacheGuard) -> dict[str, Callable[[int], None]]:
    value = _menu_rows()
    return {
        "get_or_load, metrics on": _batched(
            lambda: metered.get_or_load("menu:7", lambda: value, ttl=3600)
        ),
        "get_or_load, tracing on": _batched(
            lambda: traced.get_or_load("menu:7", lambda: value, ttl=3600)
        ),
    }


def _decoded(client: Any) -> Callable[[int], None]:
    decode, get = _CODEC.decode, client.get
    return _batched(lambda: decode(get(RAW_KEY)))


# The batch rows: 20 warm keys read at once, against 20 single hits and one raw MGET.
BATCH_NAMES = [f"menu:{i}" for i in range(100, 120)]
RAW_BATCH_KEYS = [f"{RAW_KEY}:{i}" for i in range(20)]
BATCH_SECTION = f"batch of {len(BATCH_NAMES)} hits (µs per batch)"
BATCH_CALLS = 50  # calls per timed batch: each reads 20 keys


def _batch_bodies(guard: CacheGuard, default: redis.Redis) -> dict[str, Callable[[int], None]]:
    value = _menu_rows()
    decode = _CODEC.decode
    default.mset(dict.fromkeys(RAW_BATCH_KEYS, _CODEC.encode(value)))

    def load_many(names: list[str]) -> dict[str, Any]:
        return dict.fromkeys(names, value)

    def singles() -> None:
        for name in BATCH_NAMES:
            guard.get_or_load(name, lambda: value, ttl=3600)

    guard.get_or_load_many(BATCH_NAMES, load_many, ttl=3600)  # warm
    return {
        "20 x get_or_load": _batched(singles),
        "default client: one MGET + 20 decodes": _batched(
            lambda: [decode(raw) for raw in default.mget(RAW_BATCH_KEYS)]
        ),
        "get_or_load_many (20 keys)": _batched(
            lambda: guard.get_or_load_many(BATCH_NAMES, load_many, ttl=3600)
        ),
    }


def hit_path(url: str, rounds: int) -> dict[str, dict[str, Paired]]:
    """µs per hit over the wire, beside a default redis-py client's GET + decode of
    the same payload, and with GET answered from memory (the Python cost alone)."""
    default = redis.Redis.from_url(url)
    default.set(RAW_KEY, _CODEC.encode(_menu_rows()))
    guard = CacheGuard.from_url(url, namespace=HIT_NAMESPACE)  # what from_url gives
    guard.invalidate("menu:7")
    guard.get_or_load("menu:7", _menu_rows, ttl=3600)
    memory = CacheGuard(default, namespace=HIT_NAMESPACE)
    memory.client = _InMemory(default, [guard.keys("menu:7").value])  # type: ignore[assignment]
    observers = _Observers()
    wired = [CacheGuard.from_url(url, namespace=HIT_NAMESPACE) for _ in range(2)]
    in_memory = [CacheGuard(default, namespace=HIT_NAMESPACE) for _ in range(2)]
    for observed in in_memory:
        observed.client = memory.client
    sections = {
        "over the wire": {
            "default client: GET + decode": _decoded(default),
            "guard's client: GET + decode": _decoded(guard.client),
            **_guard_bodies(guard),
            **_observed_bodies(observers.metered(wired[0]), observers.traced(wired[1])),
        },
        "no I/O (GET from memory)": {
            "GET + decode": _decoded(_InMemory(default, [RAW_KEY])),
            **_guard_bodies(memory),
            **_observed_bodies(observers.metered(in_memory[0]), observers.traced(in_memory[1])),
        },
    }
    results: dict[str, dict[str, Paired]] = {}
    try:
        for where, bodies in sections.items():
            for run in bodies.values():
                run(300)  # connections, scripts, key names: warm, as in a service
            results[where] = paired_batches(bodies, rounds)
        results["over the wire"]["L1 hit (get_or_load)"] = _l1_hit(url)
        batch_bodies = _batch_bodies(guard, default)
        for run in batch_bodies.values():
            run(BATCH_CALLS)
        results[BATCH_SECTION] = paired_batches(batch_bodies, rounds, BATCH_CALLS)
    finally:
        observers.close()
        for observed in wired:
            observed.close()
        guard.close()
        default.close()
    return results


def _l1_hit(url: str) -> Paired:
    client = redis.Redis.from_url(url)
    l1_guard = CacheGuard(client, namespace=HIT_NAMESPACE, l1_maxsize=1000, l1_ttl=3600)
    value = _menu_rows()
    try:
        deadline = time.monotonic() + 5
        while "menu:7" not in l1_guard._state.l1 and time.monotonic() < deadline:  # type: ignore[operator]
            l1_guard.get_or_load("menu:7", lambda: value, ttl=3600)  # L1 keeps once subscribed
            time.sleep(0.01)
        n = 50000
        cpu_start, start = time.thread_time(), time.perf_counter()
        for _ in range(n):
            l1_guard.get_or_load("menu:7", lambda: value, ttl=3600)
        wall = (time.perf_counter() - start) / n * 1e6
        cpu = (time.thread_time() - cpu_start) / n * 1e6
    finally:
        l1_guard.close()
        client.close()
    return Paired(wall, cpu, math.nan, math.nan)


def _big_menu_rows() -> list[dict[str, Any]]:
    return [
        {"id": i, "name": f"menu {i}", "parent_id": i // 10, "sort": i, "url": f"/m/{i}"}
        for i in range(200)
    ]


def _compressions() -> dict[str, str | None]:
    """The ``compress`` settings measured: zstd only where zstandard is installed."""
    kinds: dict[str, str | None] = {"stored as encoded": None, "zlib": "zlib"}
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return kinds
    kinds["zstd"] = "zstd"
    return kinds


def compressed_hits(url: str, rounds: int) -> dict[str, dict[str, Paired]]:
    """µs per hit of a 200-row menu list stored each way (each key filled by a guard
    of that ``compress`` setting, all read by one default guard, as any guard reads
    any entry), against the hit of the uncompressed one."""
    default = redis.Redis.from_url(url)
    rows = _big_menu_rows()
    names = {label: f"menu:big:{label.split()[-1]}" for label in _compressions()}
    sizes: dict[str, int] = {}
    for label, compress in _compressions().items():
        with CacheGuard(default, namespace=HIT_NAMESPACE, compress=compress) as writer:
            writer.invalidate(names[label])
            writer.get_or_load(names[label], lambda: rows, ttl=3600)
            sizes[label] = len(default.get(writer.keys(names[label]).value) or b"")
    default.close()

    def hits(reader: CacheGuard) -> dict[str, Callable[[int], None]]:
        return {
            f"get_or_load, {label} ({sizes[label]:,} B)": _batched(
                lambda name=name: reader.get_or_load(name, lambda: rows, ttl=3600)
            )
            for label, name in names.items()
        }

    return _over_the_wire_and_in_memory(url, list(names.values()), hits, rounds)


def _over_the_wire_and_in_memory(
    url: str,
    names: list[str],
    hits: Callable[[CacheGuard], dict[str, Callable[[int], None]]],
    rounds: int,
) -> dict[str, dict[str, Paired]]:
    """``hits`` (the rows of one comparison, each a batch of hits of ``names``) on a
    guard from ``from_url`` and on one whose GETs are answered from memory, paired."""
    default = redis.Redis.from_url(url)
    guard = CacheGuard.from_url(url, namespace=HIT_NAMESPACE)
    memory = CacheGuard(default, namespace=HIT_NAMESPACE)
    memory.client = _InMemory(default, [guard.keys(n).value for n in names])  # type: ignore[assignment]
    results: dict[str, dict[str, Paired]] = {}
    try:
        for where, bodies in {
            "over the wire": hits(guard),
            "no I/O (GET from memory)": hits(memory),
        }.items():
            for run in bodies.values():
                run(300)
            results[where] = paired_batches(bodies, rounds)
    finally:
        guard.close()
        memory.close()
        default.close()
    return results


def against_the_first_row(blocks: dict[str, dict[str, Paired]], first: str) -> list[str]:
    """A comparison's rows, each against its block's first row (named ``first``)."""
    lines = [
        f"| GET | operation | µs / call | µs over {first} | vs {first} "
        f"| client CPU µs / call | CPU µs over {first} |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for where, block in blocks.items():
        base = next(iter(block.values()))
        for label, p in block.items():
            lines.append(
                f"| {where} | {label} | {p.wall:.1f} | {p.wall_over:+.1f} "
                f"| {p.wall / base.wall:.2f}x | {p.cpu:.1f} | {p.cpu_over:+.1f} |"
            )
    return lines


@dataclasses.dataclass
class MenuRow:
    """A menu row as a dataclass: what a typed value's hit decodes to."""

    id: int
    name: str
    parent_id: int
    sort: int
    url: str


def _typed_rows() -> dict[str, tuple[Any, Any]]:
    """The same 20 rows as each family's values, with the type they are read as."""
    import msgspec
    import pydantic

    class MenuModel(pydantic.BaseModel):
        id: int
        name: str
        parent_id: int
        sort: int
        url: str

    class MenuStruct(msgspec.Struct):
        id: int
        name: str
        parent_id: int
        sort: int
        url: str

    rows = _menu_rows()
    return {
        "plain dicts (no type)": (rows, None),
        "dataclasses, type=list[MenuRow]": ([MenuRow(**r) for r in rows], list[MenuRow]),
        "pydantic, type=list[MenuModel]": ([MenuModel(**r) for r in rows], list[MenuModel]),
        "msgspec, type=list[MenuStruct]": ([MenuStruct(**r) for r in rows], list[MenuStruct]),
    }


def typed_hits(url: str, rounds: int) -> dict[str, dict[str, Paired]]:
    """µs per hit of the 20-row menu list read as each family's values
    (``get_or_load(..., type=...)``), against the hit of the plain rows."""
    families = _typed_rows()
    names = {label: f"menu:typed:{i}" for i, label in enumerate(families)}
    with CacheGuard.from_url(url, namespace=HIT_NAMESPACE) as writer:
        for label, (value, kind) in families.items():
            writer.invalidate(names[label])
            writer.get_or_load(names[label], lambda value=value: value, ttl=3600, type=kind)

    def hits(reader: CacheGuard) -> dict[str, Callable[[int], None]]:
        return {
            f"get_or_load, {label}": _batched(
                lambda name=names[label], value=value, kind=kind: reader.get_or_load(
                    name, lambda: value, ttl=3600, type=kind
                )
            )
            for label, (value, kind) in families.items()
        }

    return _over_the_wire_and_in_memory(url, list(names.values()), hits, rounds)


class _AsyncInMemory:
    """:class:`_InMemory` for the asyncio guard."""

    def __init__(self, client: redis.Redis, keys: list[str]) -> None:
        self._data = {key: client.get(key) for key in keys}

    async def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def evalsha(self, sha: str, numkeys: int, key: str, *args: Any) -> list[Any]:
        return _InMemory.evalsha(self, sha, numkeys, key, *args)  # type: ignore[arg-type]


def _async_guard_bodies(guard: AsyncCacheGuard) -> dict[str, Any]:
    """The asyncio guard's hits, each a coroutine function of one call."""
    value = _menu_rows()

    async def load_menu(menu_id: int) -> list[dict[str, Any]]:
        return value

    menu = AsyncCacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=3600)

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=3600)
    async def cached_menu(menu_id: int) -> list[dict[str, Any]]:
        return value

    async def get_or_load() -> None:
        await guard.get_or_load("menu:7", lambda: value, ttl=3600)

    async def loader_get() -> None:
        await menu.get(7)

    async def decorated() -> None:
        await cached_menu(7)

    return {
        "get_or_load (asyncio)": get_or_load,
        "AsyncCacheLoader.get": loader_get,
        "@cached_with_lock (async def)": decorated,
    }


def _async_observed_bodies(metered: AsyncCacheGuard, traced: AsyncCacheGuard) -> dict[str, Any]:
    value = _menu_rows()

    async def with_metrics() -> None:
        await metered.get_or_load("menu:7", lambda: value, ttl=3600)

    async def with_tracing() -> None:
        await traced.get_or_load("menu:7", lambda: value, ttl=3600)

    return {
        "get_or_load (asyncio), metrics on": with_metrics,
        "get_or_load (asyncio), tracing on": with_tracing,
    }


def _async_batch_bodies(guard: AsyncCacheGuard, default: Any) -> dict[str, Any]:
    """:func:`_batch_bodies` on asyncio (the raw keys are set by the sync rows)."""
    value = _menu_rows()
    decode = _CODEC.decode

    def load_many(names: list[str]) -> dict[str, Any]:
        return dict.fromkeys(names, value)

    async def singles() -> None:
        for name in BATCH_NAMES:
            await guard.get_or_load(name, lambda: value, ttl=3600)

    async def mget() -> None:
        [decode(raw) for raw in await default.mget(RAW_BATCH_KEYS)]

    async def many() -> None:
        await guard.get_or_load_many(BATCH_NAMES, load_many, ttl=3600)

    return {
        "20 x await get_or_load": singles,
        "default client: one await MGET + 20 decodes": mget,
        "await get_or_load_many (20 keys)": many,
    }


def _async_decoded(client: Any) -> Any:
    decode, get = _CODEC.decode, client.get

    async def raw() -> None:
        decode(await get(RAW_KEY))

    return raw


def async_hit_path(url: str, rounds: int) -> dict[str, dict[str, Paired]]:
    """:func:`hit_path` on asyncio: a default ``redis.asyncio`` client's GET + decode
    beside the asyncio guard's hits; every batch runs on one event loop (a guard
    belongs to one)."""
    loop = asyncio.new_event_loop()
    sync_client = redis.Redis.from_url(url)
    sync_client.set(RAW_KEY, _CODEC.encode(_menu_rows()))
    default = redis.asyncio.Redis.from_url(url)
    guard = AsyncCacheGuard.from_url(url, namespace=HIT_NAMESPACE)  # what from_url gives
    loop.run_until_complete(guard.get_or_load("menu:7", _menu_rows, ttl=3600))
    memory = AsyncCacheGuard(default, namespace=HIT_NAMESPACE)
    memory.client = _AsyncInMemory(sync_client, [guard.keys("menu:7").value])  # type: ignore[assignment]
    observers = _Observers()
    wired = [AsyncCacheGuard.from_url(url, namespace=HIT_NAMESPACE) for _ in range(2)]
    in_memory = [AsyncCacheGuard(default, namespace=HIT_NAMESPACE) for _ in range(2)]
    for observed in in_memory:
        observed.client = memory.client
    sections = {
        "over the wire": {
            "default client: await GET + decode": _async_decoded(default),
            "guard's client: await GET + decode": _async_decoded(guard.client),
            **_async_guard_bodies(guard),
            **_async_observed_bodies(observers.metered(wired[0]), observers.traced(wired[1])),
        },
        "no I/O (GET from memory)": {
            "await GET + decode": _async_decoded(_AsyncInMemory(sync_client, [RAW_KEY])),
            **_async_guard_bodies(memory),
            **_async_observed_bodies(
                observers.metered(in_memory[0]), observers.traced(in_memory[1])
            ),
        },
    }

    def batch(body: Any) -> Callable[[int], None]:
        async def calls(n: int) -> None:
            for _ in range(n):
                await body()

        return lambda n: loop.run_until_complete(calls(n))

    results: dict[str, dict[str, Paired]] = {}
    try:
        for where, bodies in sections.items():
            batches = {name: batch(body) for name, body in bodies.items()}
            for run in batches.values():
                run(300)
            results[where] = paired_batches(batches, rounds)
        batches = {name: batch(body) for name, body in _async_batch_bodies(guard, default).items()}
        for run in batches.values():
            run(BATCH_CALLS)
        results[BATCH_SECTION] = paired_batches(batches, rounds, BATCH_CALLS)
    finally:
        observers.close()
        for observed in wired:
            loop.run_until_complete(observed.aclose())
        loop.run_until_complete(guard.aclose())
        loop.run_until_complete(default.aclose())
        loop.close()
        sync_client.close()
    return results


def hit_table(sync: dict[str, dict[str, Paired]], aio: dict[str, dict[str, Paired]]) -> list[str]:
    """The hit path's rows: each against the first row of its block (the default
    client's GET + decode, or the same GET answered from memory)."""
    lines = [
        "| GET | operation | µs / call | µs over the first row | vs first row "
        "| client CPU µs / call | CPU µs over the first row |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for where, sync_block in sync.items():
        for block in (sync_block, aio[where]):
            base = next(iter(block.values()))
            for label, p in block.items():
                if math.isnan(p.wall_over):  # no paired base (the L1 hit)
                    lines.append(f"| {where} | {label} | {p.wall:.1f} | | | {p.cpu:.1f} | |")
                    continue
                lines.append(
                    f"| {where} | {label} | {p.wall:.1f} | {p.wall_over:+.1f} "
                    f"| {p.wall / base.wall:.2f}x | {p.cpu:.1f} | {p.cpu_over:+.1f} |"
                )
    return lines


def _hit_report(endpoint: RedisEndpoint, args: argparse.Namespace) -> list[str]:
    rounds = args.hit_rounds
    sync, aio = hit_path(endpoint.url, rounds), async_hit_path(endpoint.url, rounds)
    compressed = compressed_hits(endpoint.url, rounds)
    typed = typed_hits(endpoint.url, rounds)
    return [
        f"Hit path over the wire, one warm key (a 20-row menu list), one thread, default "
        f"settings, guards made by `from_url`; {rounds} rounds of 300-call batches, every "
        "row's batch once per round in a rotating order. µs / call: the median batch; "
        "over the first row: the median of each round's difference from that round's "
        "batch of the first row of its block (a default redis-py client, `redis.Redis."
        "from_url(url)` or `redis.asyncio.Redis.from_url(url)`, GET + the codec's decode "
        "of the same payload); client CPU: this thread's CPU time, the wait for Redis "
        "excluded. Metrics on: the guard instrumented by a `CacheMetrics`; tracing on: by "
        "`cacheguard.integrations.opentelemetry.instrument`, with an SDK `TracerProvider` "
        "whose batch processor hands the spans to an exporter that drops them. Then the same "
        "with GET answered from memory (the Python cost alone); "
        f"then {len(BATCH_NAMES)} warm keys read at once ({BATCH_CALLS}-call batches): "
        "`get_or_load_many` (one pipeline) against 20 single hits and against one MGET "
        "of 20 raw keys + their decodes, per batch of 20 keys:",
        "",
        *hit_table(sync, aio),
        "",
        "Compression: a hit of a 200-row menu list (`get_or_load`, one default guard "
        "reading every entry), its entry stored as encoded (msgpack), and compressed by "
        'a guard with `compress="zlib"` and `compress="zstd"` (stored bytes beside '
        "each); over the uncompressed hit: the median of each round's paired difference. "
        "An uncompressed entry's hit is the one above, with a larger value.",
        "",
        *against_the_first_row(compressed, "the uncompressed hit"),
        "",
        "Typed values: a hit of the same 20-row menu list read as plain dicts, and as "
        "dataclasses, pydantic models and msgspec Structs (`get_or_load(..., type=...)`, "
        "each stored by its family: see cacheguard.codecs); over plain dicts: the median "
        "of each round's paired difference.",
        "",
        *against_the_first_row(typed, "plain dicts"),
    ]


def _server_line(endpoint: RedisEndpoint) -> str:
    try:
        server = redis.Redis.from_url(endpoint.url).info("server")
    except redis.ResponseError:  # fakeredis has no INFO
        server = {"redis_version": "fakeredis"}
    return run_line(str(server.get("redis_version")), endpoint.kind)


def hit_report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    """``--hit-only``: the hit path's table alone."""
    return "\n".join(
        [
            _server_line(endpoint),
            "",
            f"Command: `python bench/cache.py --hit-only --hit-rounds {args.hit_rounds}`",
            "",
            *_hit_report(endpoint, args),
        ]
    )


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    load_s = args.load_ms / 1000
    runs: dict[str, list[dict[str, Any]]] = {"cacheguard": [], "naive cache-aside": []}
    async_runs: dict[str, list[dict[str, Any]]] = {
        "cacheguard (asyncio)": [],
        "sync + asyncio processes": [],
    }
    for rnd in range(args.rounds):
        runs["cacheguard"].append(
            stampede(endpoint.url, "cacheguard", args.processes, args.threads, load_s, rnd)
        )
        runs["naive cache-aside"].append(
            stampede(endpoint.url, "naive", args.processes, args.threads, load_s, rnd)
        )
        async_runs["cacheguard (asyncio)"].append(
            stampede(endpoint.url, "cacheguard-async", args.processes, args.tasks, load_s, rnd)
        )
        async_runs["sync + asyncio processes"].append(
            stampede(endpoint.url, "mixed", args.processes, args.tasks, load_s, rnd)
        )
    cluster_runs = (
        cluster_stampedes(args, load_s) if args.cluster and shutil.which("redis-server") else {}
    )
    floors = [wake_floor(args.processes, args.threads) for _ in range(args.rounds)]
    task_floors = [wake_floor(args.processes, args.tasks, tasks=True) for _ in range(args.rounds)]

    def med(kind: str, field: str) -> float:
        return statistics.median(r[field] for r in {**runs, **async_runs, **cluster_runs}[kind])

    lines = [
        _server_line(endpoint),
        "",
        f"Command: `python bench/cache.py --processes {args.processes} --threads {args.threads} "
        f"--tasks {args.tasks} --load-ms {args.load_ms} --rounds {args.rounds} "
        f"--hit-rounds {args.hit_rounds}`",
        "",
        f"Cold-key stampede, {args.processes} processes x {args.threads} threads, "
        f"{args.load_ms} ms loader, median of {args.rounds} rounds (every round's figures "
        "in the last column):",
        "",
        "| system | loads | waiter lag p50 ms | waiter lag max ms | latency p50 ms "
        "| latency p99 ms | Redis commands | rounds (loads / lag max / commands) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for kind, rounds in runs.items():
        per_round = "; ".join(
            f"{int(r['loads'])} / {r['lag_max']:.1f} / {_count(r['commands'])}" for r in rounds
        )
        lines.append(
            f"| {kind} | {med(kind, 'loads'):.0f} | {med(kind, 'lag_p50'):.2f} "
            f"| {med(kind, 'lag_max'):.2f} | {med(kind, 'lat_p50'):.1f} "
            f"| {med(kind, 'lat_p99'):.1f} | {_count(med(kind, 'commands'))} | {per_round} |"
        )
    floor_p50 = statistics.median(f["lag_p50"] for f in floors)
    floor_max = statistics.median(f["lag_max"] for f in floors)
    lines.append(
        f"| floor: the same threads woken by an Event, no Redis | | {floor_p50:.2f} "
        f"| {floor_max:.2f} | | | | "
        + "; ".join(f"- / {f['lag_max']:.1f} / -" for f in floors)
        + " |"
    )
    lines += [
        "",
        f"The same stampede on asyncio: {args.processes} processes x {args.tasks} tasks "
        "(one event loop each); then sync and asyncio processes side by side on the key "
        f"(every other process a thread pool of {args.tasks}). Loop gap: the longest pause "
        "between the ticks of a 1 ms ticker task beside the callers.",
        "",
        "| system | loads | waiter lag p50 ms | waiter lag max ms | latency p50 ms "
        "| latency p99 ms | Redis commands | loop gap max ms "
        "| rounds (loads / lag max / commands) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for kind, rounds in async_runs.items():
        per_round = "; ".join(
            f"{int(r['loads'])} / {r['lag_max']:.1f} / {_count(r['commands'])}" for r in rounds
        )
        lines.append(
            f"| {kind} | {med(kind, 'loads'):.0f} | {med(kind, 'lag_p50'):.2f} "
            f"| {med(kind, 'lag_max'):.2f} | {med(kind, 'lat_p50'):.1f} "
            f"| {med(kind, 'lat_p99'):.1f} | {_count(med(kind, 'commands'))} "
            f"| {max(r['gap_max'] for r in rounds):.1f} | {per_round} |"
        )
    lines.append(
        "| floor: the same tasks woken by an asyncio.Event, no Redis | "
        f"| {statistics.median(f['lag_p50'] for f in task_floors):.2f} "
        f"| {statistics.median(f['lag_max'] for f in task_floors):.2f} | | | | | "
        + "; ".join(f"- / {f['lag_max']:.1f} / -" for f in task_floors)
        + " |"
    )
    if cluster_runs:
        lines += [
            "",
            "The same stampedes on a Redis Cluster of 3 masters and 3 replicas (throwaway, "
            "loopback), beside the single server's: commands summed over the masters, the "
            "calls inside Lua included. Every write-path invalidation there waits for a "
            "replica (WAIT); a fill does not.",
            "",
            "| system | loads | waiter lag p50 ms | waiter lag max ms | latency p50 ms "
            "| latency p99 ms | Redis commands | rounds (loads / lag max / commands) |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for kind in ("cacheguard", "cacheguard, cluster", "cacheguard (asyncio)",
                     "cacheguard (asyncio), cluster"):  # fmt: skip
            rounds = {**runs, **async_runs, **cluster_runs}[kind]
            per_round = "; ".join(
                f"{int(r['loads'])} / {r['lag_max']:.1f} / {_count(r['commands'])}" for r in rounds
            )
            lines.append(
                f"| {kind} | {med(kind, 'loads'):.0f} | {med(kind, 'lag_p50'):.2f} "
                f"| {med(kind, 'lag_max'):.2f} | {med(kind, 'lat_p50'):.1f} "
                f"| {med(kind, 'lat_p99'):.1f} | {_count(med(kind, 'commands'))} | {per_round} |"
            )
        first = cluster_runs["cacheguard, cluster"][0]["breakdown"]
        lines += [
            "",
            "Where the cluster's commands went (first round, sync): "
            + ", ".join(
                f"{k.upper()} {v}" for k, v in sorted(first.items(), key=lambda kv: -kv[1])
            ),
        ]
    lines += ["", *_hit_report(endpoint, args)]
    return "\n".join(lines)


def _count(commands: float) -> str:
    return "n/a (no INFO)" if commands < 0 else f"{commands:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=25)
    parser.add_argument("--tasks", type=int, default=50, help="asyncio callers per process")
    parser.add_argument("--load-ms", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hit-rounds", type=int, default=100, help="hit path: rounds of 300-call batches"
    )
    parser.add_argument("--hit-only", action="store_true", help="measure the hit path alone")
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    parser.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the stampedes on a throwaway Redis Cluster (needs redis-server)",
    )
    args = parser.parse_args(argv)
    if (
        min(args.processes, args.threads, args.tasks, args.rounds) < 1
        or args.load_ms < 0
        or args.hit_rounds < 1
    ):
        parser.error("processes, threads, tasks, rounds and hit-rounds must be >= 1, load-ms >= 0")
    if args.hit_only:
        return run_report(
            args.url, args.write, HIT_MARK, lambda endpoint: hit_report(endpoint, args)
        )
    return run_report(args.url, args.write, MARK, lambda endpoint: report(endpoint, args))


if __name__ == "__main__":
    raise SystemExit(main())
