"""The stampede demo: the same load on plain cache-aside and on cacheguard.

``processes`` x ``threads`` readers ask for the menu list as fast as they can
while a writer renames menu 1 every ``write_every`` seconds (its name carries a
revision, ``Menu 1 #17``). Each write ends with the cache entry invalidated, so
every write starts a stampede on a cold ``menu:list``:

* unprotected: cache-aside as services commonly write it. Readers GET, on a
  miss query the database and SET; the writer DELs the entry, then updates and
  commits. Every reader that misses queries the database, and one that queried
  between the DEL and the COMMIT puts the old list back: stale until the next
  write;
* cacheguard: ``MenuRepository`` (read-through with locks, writes through
  tracked sessions): one query per invalidation, no stale read.

A read is stale when it returns a revision older than one whose write had
fully finished (commit and invalidation) before the read began.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgpack
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from cacheguard import CacheGuard
from cacheguard.integrations.sqlalchemy import track_models

from .infra import (
    Backends,
    QueryLog,
    backends,
    check_database,
    make_engine,
    seed,
)
from .models import Menu
from .repository import MenuRepository

MODES = ("unprotected", "cacheguard")
CTX = mp.get_context("spawn")

# Per process, in shared memory: requests, DB queries, stale reads, ready flag.
_SLOTS = 4


@dataclass(frozen=True)
class Settings:
    processes: int = 4
    threads: int = 8
    seconds: float = 5.0
    write_every: float = 0.5
    build_ms: float = 30.0
    menus: int = 40
    ttl: float = 300.0
    chart: Path | None = Path("menu_demo.png")
    modes: Sequence[str] = MODES
    reset: bool = False  # may use a DATABASE_URL database that holds tables (check_database)


@dataclass
class RunResult:
    mode: str
    requests: int = 0
    db_queries: int = 0
    stale_reads: int = 0
    writes: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    query_times: list[float] = field(default_factory=list)  # seconds since the start
    write_times: list[float] = field(default_factory=list)  # each write's commit, done
    write_starts: list[float] = field(default_factory=list)  # ... and its first invalidation
    errors: list[str] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def revision_of(menus: list[dict[str, Any]]) -> int:
    """The revision in menu 1's name (``Menu 1 #17`` -> 17)."""
    for menu in menus:
        if menu["id"] == 1:
            return int(str(menu["name"]).rsplit("#", 1)[1])
    raise ValueError("menu 1 is missing from the list")


# -- readers (child processes) --------------------------------------------------------------------


def reader_process(
    mode: str,
    index: int,
    backends_: Backends,
    namespace: str,
    settings: Settings,
    counters: Any,
    floor: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    engine = make_engine(backends_.database_url)
    queries = QueryLog(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    client = redis.Redis.from_url(backends_.redis_url)
    build = settings.build_ms / 1000.0
    if mode == "cacheguard":
        guard = CacheGuard(client, namespace=namespace, wait_timeout=30.0)
        track_models(guard, sessions, [Menu])
        get_list = MenuRepository(guard, sessions, ttl=settings.ttl, build_seconds=build).get_list
    else:
        get_list = _cache_aside(client, f"{namespace}:menu:list", sessions, settings.ttl, build)
    base = index * _SLOTS
    latencies: list[list[float]] = [[] for _ in range(settings.threads)]
    errors: list[str] = []
    counters[base + 3] = 1  # ready
    go.wait()
    start = time.monotonic()

    def read(thread: int) -> None:
        mine = latencies[thread]
        while not stop.is_set():
            must_see = floor.value
            began = time.perf_counter()
            try:
                menus = get_list()
            except Exception as exc:  # counted and shown, never silent
                errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.01)
                continue
            mine.append((time.perf_counter() - began) * 1000.0)
            with counters.get_lock():
                counters[base] += 1
                counters[base + 1] = queries.count
                if revision_of(menus) < must_see:
                    counters[base + 2] += 1

    pool = [threading.Thread(target=read, args=(t,)) for t in range(settings.threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    with counters.get_lock():
        counters[base + 1] = queries.count
    results.put(
        (
            index,
            [x for xs in latencies for x in xs],
            [t - start for t in queries.times],
            errors[:5],
        )
    )
    engine.dispose()


def _cache_aside(
    client: redis.Redis, key: str, sessions: sessionmaker[Session], ttl: float, build: float
) -> Any:
    """Plain cache-aside, as services write it: GET, else query, build and SET."""

    def get_list() -> list[dict[str, Any]]:
        raw = client.get(key)
        if raw is not None:
            return msgpack.unpackb(raw)  # type: ignore[no-any-return]
        with sessions() as session:
            rows = session.scalars(sa.select(Menu).order_by(Menu.sort, Menu.id)).all()
            menus = [row.to_dict() for row in rows]
        if build:
            time.sleep(build)
        client.set(key, msgpack.packb(menus), ex=int(ttl))
        return menus

    return get_list


# -- one run --------------------------------------------------------------------------------------


def run_mode(mode: str, backends_: Backends, settings: Settings, out: TextIO) -> RunResult:
    engine = make_engine(backends_.database_url)
    seed(engine, settings.menus)
    namespace = f"demo-{uuid.uuid4().hex[:8]}-{mode}"
    client = redis.Redis.from_url(backends_.redis_url)
    counters = CTX.Array("q", settings.processes * _SLOTS)
    floor = CTX.Value("q", 0)
    go, stop = CTX.Event(), CTX.Event()
    results = CTX.Queue()
    procs = [
        CTX.Process(
            target=reader_process,
            args=(mode, i, backends_, namespace, settings, counters, floor, go, stop, results),
            daemon=True,
        )
        for i in range(settings.processes)
    ]
    for p in procs:
        p.start()
    result = RunResult(mode)
    try:
        deadline = time.monotonic() + 60
        while any(counters[i * _SLOTS + 3] == 0 for i in range(settings.processes)):
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                raise RuntimeError(f"{mode}: reader processes did not start")
            time.sleep(0.05)
        writer = _Writer(mode, engine, client, namespace, settings, floor)
        start = time.monotonic()
        go.set()
        writer.start()
        next_report = start + 1.0
        while (now := time.monotonic()) < start + settings.seconds:
            if now >= next_report:
                _progress(out, mode, now - start, counters, settings, writer.count)
                next_report += 1.0
            time.sleep(0.05)
        stop.set()
        writer.stop()
        for _ in procs:
            _, latencies, query_times, errors = results.get(timeout=60)
            result.latencies_ms.extend(latencies)
            result.query_times.extend(query_times)
            result.errors.extend(errors)
        for p in procs:
            p.join(10)
        result.writes = writer.count
        result.write_times = [t - start for t in writer.times]
        result.write_starts = [t - start for t in writer.starts]
        result.requests = sum(counters[i * _SLOTS] for i in range(settings.processes))
        result.db_queries = sum(counters[i * _SLOTS + 1] for i in range(settings.processes))
        result.stale_reads = sum(counters[i * _SLOTS + 2] for i in range(settings.processes))
        if writer.error:
            result.errors.append(writer.error)
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.delete(key)
        client.close()
        engine.dispose()
    _progress(out, mode, settings.seconds, counters, settings, result.writes, final=True)
    return result


class _Writer:
    """Renames menu 1 every ``write_every`` seconds, then raises the floor."""

    def __init__(
        self,
        mode: str,
        engine: sa.Engine,
        client: redis.Redis,
        namespace: str,
        settings: Settings,
        floor: Any,
    ) -> None:
        self.count = 0
        self.times: list[float] = []
        self.starts: list[float] = []
        self.error = ""
        self._stop = threading.Event()
        sessions = sessionmaker(engine, expire_on_commit=False)
        if mode == "cacheguard":
            guard = CacheGuard(client, namespace=namespace, wait_timeout=30.0)
            track_models(guard, sessions, [Menu])
            update = MenuRepository(guard, sessions).update_menu_by_id
        else:

            def update(menu: dict[str, Any]) -> dict[str, Any]:
                # Cache-aside's usual write path: delete the entry, then update the row.
                client.delete(f"{namespace}:menu:list")
                with sessions.begin() as session:
                    row = session.get(Menu, menu["id"])
                    assert row is not None
                    row.name = menu["name"]
                return menu

        self._update = update
        self._every = settings.write_every
        self._floor = floor
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        revision = 0
        while not self._stop.wait(self._every):
            revision += 1
            # Both write paths invalidate first (cacheguard once it holds the write lock):
            # the span from here to the commit is when readers can miss.
            began = time.monotonic()
            try:
                self._update({"id": 1, "name": f"Menu 1 #{revision}"})
            except Exception as exc:
                self.error = f"writer: {type(exc).__name__}: {exc}"
                return
            self.starts.append(began)
            self.times.append(time.monotonic())
            self.count = revision
            self._floor.value = revision  # reads that start now must see it


def _progress(
    out: TextIO,
    mode: str,
    elapsed: float,
    counters: Any,
    settings: Settings,
    writes: int,
    *,
    final: bool = False,
) -> None:
    n = settings.processes
    requests = sum(counters[i * _SLOTS] for i in range(n))
    queries = sum(counters[i * _SLOTS + 1] for i in range(n))
    stale = sum(counters[i * _SLOTS + 2] for i in range(n))
    mark = "done" if final else "    "
    print(
        f"  [{mode:>11}] {mark} {elapsed:4.1f}s  requests {requests:>7}  "
        f"DB queries {queries:>5}  writes {writes:>3}  stale reads {stale:>5}",
        file=out,
        flush=True,
    )


# -- the whole demo --------------------------------------------------------------------------------


def run(settings: Settings, out: TextIO = sys.stdout) -> dict[str, RunResult]:
    with backends() as found:
        check_database(found, reset=settings.reset)
        db = found.database_url.split("://", 1)[0]
        print(
            f"menu-service demo: {settings.processes} processes x {settings.threads} threads "
            f"read menu:list for {settings.seconds:g}s per run; menu 1 renamed every "
            f"{settings.write_every:g}s; building the list takes {settings.build_ms:g} ms\n"
            f"Redis: {found.redis_kind} ({found.redis_url}); database: {db}",
            file=out,
            flush=True,
        )
        runs = {mode: run_mode(mode, found, settings, out) for mode in settings.modes}
    print(file=out)
    print(format_table(list(runs.values())), file=out)
    for r in runs.values():
        for error in r.errors:
            print(f"  error in {r.mode}: {error}", file=out)
    if settings.chart is not None:
        print(write_chart(list(runs.values()), settings), file=out)
    return runs


STALE_READ = (
    "stale read: a read that returned menu 1 older than a write which had fully "
    "finished (committed and invalidated) before the read began"
)
# Measured, not assumed (examples/menu_service/README.md, "Why the median read can be
# slower"): a cacheguard read lasted about three GETs, an unprotected read one; with one
# reader thread per process (nothing to share) the medians were alike.
SHARED_GET = (
    "p50 is higher with cacheguard because the reader threads of a process share one GET: a "
    "read that arrives while another thread's GET is in flight waits for its reply and "
    "then for one more GET, sent for all the reads that arrived meanwhile (so that none "
    "is answered by a GET sent before it began), where an unprotected read waits for "
    "its own GET only"
)
_COLUMNS = (  # heading, width, cell format
    ("run", 11, "<11"),
    ("requests", 8, ">8"),
    ("DB queries", 10, ">10"),
    ("writes", 6, ">6"),
    ("queries per write", 17, ">17.1f"),
    ("stale reads", 11, ">11"),
    ("p50 ms", 6, ">6.2f"),
    ("p99 ms", 6, ">6.2f"),
)


def format_table(results: list[RunResult]) -> str:
    """A Markdown table that also lines up in a terminal, what a stale read is and,
    when cacheguard's median read is the slower one, why."""
    lines = [
        "| " + " | ".join(f"{h:<{w}}" for h, w, _ in _COLUMNS) + " |",
        "|" + "|".join("-" * (w + 2) for _, w, _ in _COLUMNS) + "|",
    ]
    for r in results:
        cells = (
            r.mode,
            r.requests,
            r.db_queries,
            r.writes,
            r.db_queries / max(r.writes, 1),
            r.stale_reads,
            r.percentile(0.5),
            r.percentile(0.99),
        )
        lines.append(
            "| "
            + " | ".join(f"{c:{f}}" for c, (_, _, f) in zip(cells, _COLUMNS, strict=True))
            + " |"
        )
    notes = [STALE_READ]
    p50 = {r.mode: r.percentile(0.5) for r in results}
    if p50.get("cacheguard", 0.0) > p50.get("unprotected", math.inf):
        notes.append(SHARED_GET)
    return "\n\n".join(["\n".join(lines), *notes])


def write_chart(results: list[RunResult], settings: Settings) -> str:
    """A PNG of DB queries per 100 ms for each run, each write drawn as a span from its
    first invalidation to its commit; needs matplotlib."""
    assert settings.chart is not None
    try:
        import matplotlib  # noqa: PLC0415  (optional: the plot extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install -e '.[plot]')"
    bucket = 0.1
    figure, axes = plt.subplots(len(results), 1, figsize=(9, 2.6 * len(results)), sharex=True)
    axes = axes if len(results) > 1 else [axes]
    series = [_per_bucket(r.query_times, settings.seconds, bucket) for r in results]
    top = max(1, *(max(counts) for counts in series))
    for ax, r, counts in zip(axes, results, series, strict=True):
        ax.bar(
            [i * bucket for i in range(len(counts))],
            counts,
            width=bucket,
            align="edge",
            label="DB queries per 100 ms",
        )
        for n, (began, done) in enumerate(zip(r.write_starts, r.write_times, strict=True)):
            # At least 20 ms wide, so that a fast write stays visible.
            ax.axvspan(
                began,
                max(done, began + 0.02),
                color="tab:red",
                alpha=0.35,
                label="write: first invalidation to commit" if n == 0 else None,
            )
        ax.set_ylim(0, top * 1.1)
        ax.set_ylabel("DB queries / 100 ms")
        ax.set_title(
            f"{r.mode}: {r.db_queries} queries for {r.writes} writes, {r.stale_reads} stale reads",
            fontsize=10,
        )

    axes[-1].set_xlabel("seconds")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(settings.chart, dpi=100)
    plt.close(figure)
    return f"chart written to {settings.chart}"


def _per_bucket(times: list[float], seconds: float, bucket: float) -> list[int]:
    counts = [0] * (int(seconds / bucket) + 2)
    for t in times:
        if 0 <= t < len(counts) * bucket:
            counts[int(t / bucket)] += 1
    return counts
