"""Outage: what a Redis outage does to the database, the readers and the writers.

    python -m bench.outage                                # today's behaviour, 4 x 25, 10 s outage
    python -m bench.outage --all --write docs/benchmarks.md
    python -m bench.outage --scenario gutter --scenario outbox --outage stop
    python -m bench.outage --quick --scenario today       # a few seconds (the smoke test)

Per scenario (a named set of settings, see ``SCENARIOS``), all in one run: a
throwaway primary ``redis-server`` the bench owns (and, for the gutter, a second
one), a table of ``--keys`` rows ``(id, version)`` in PostgreSQL (``DATABASE_URL``,
in a schema of the run's own), ``--processes`` reader processes of ``--threads``
threads each calling ``get_or_load("item:{id}")`` on random keys (the loader selects
the row's version, then sleeps ``--load-ms``), and one writer process that every
``--write-every-ms`` adds one to a row's version through a session tracked by
``track_models``. The timeline: ``--warmup`` seconds with Redis up, then the
outage (``--outage kill``: SIGKILL, the server restarted empty on the same port,
connections refused meanwhile; ``--outage stop``: SIGSTOP then SIGCONT, a partition
whose server keeps its data and whose replies never come), then ``--recovery``
seconds with Redis back.

Measured per phase (a call belongs to the phase it began in): database loads,
reads served, read errors by class, stale reads, read latency, write attempts and
successes. A read is stale when its version is older than one whose commit had
returned before the read began (the writer publishes each committed version and
its commit time in shared memory; ``time.monotonic`` is system-wide on Linux); its
staleness is the time from the first newer commit to the read's start. Beside the
totals: the most loads of one key by one process within any 1 s of the outage,
the most loads of one key by all processes within any ``gutter_ttl`` (5 s), stale
reads after recovery beyond the scenario's staleness bound, and the outbox rows
left when the run ends.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import multiprocessing as mp
import os
import queue
import random
import shlex
import shutil
import signal
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cacheguard.integrations.sqlalchemy as cg_sqlalchemy
from bench._common import percentile, run_line, write_section
from cacheguard import CacheGuard
from cacheguard.testing import OwnedRedisServer, free_port

CTX = mp.get_context("spawn")
MARK = "bench/outage.py"
NAMESPACE = "outage"
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PHASES = ("before", "during", "after")
BEFORE, DURING, AFTER, STOP = 0, 1, 2, 3
MAX_VERSIONS = 100_000  # commit times kept per key (a write every 100 ms: hours of run)
CACHE_TTL = 60.0  # longer than a run: entries leave Redis by invalidation or a restart
GUTTER_TTL = 5.0


@dataclass(frozen=True)
class Scenario:
    """A named set of settings: the guard's (``gutter`` adds a second server's URL),
    ``outbox`` for ``track_models``; ``bound``: the staleness (seconds) they allow."""

    name: str
    label: str
    settings: tuple[tuple[str, Any], ...] = ()
    gutter: bool = False
    outbox: bool = False
    bound: float = 0.0

    def guard_settings(self, gutter_url: str | None) -> dict[str, Any]:
        settings: dict[str, Any] = {"gutter": gutter_url} if self.gutter else {}
        settings.update(self.settings)
        return settings


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("today", "today (defaults)"),
        Scenario("outage_ttl", "outage_ttl=1", (("outage_ttl", 1.0),), bound=1.0),
        Scenario(
            "stale_if_error",
            "stale_if_error=30, raise",
            (("stale_if_error", 30.0), ("on_backend_error", "raise")),
            bound=30.0,
        ),
        Scenario(
            "gutter", "gutter, gutter_ttl=5", (("gutter_ttl", GUTTER_TTL),), gutter=True,
            bound=GUTTER_TTL,
        ),
        # A write the writer's process still sends to the outbox while the readers
        # reach Redis again is replayed within outbox_poll (1 s): docs/outage.md.
        Scenario("outbox", "outbox=True", outbox=True, bound=1.0),
        Scenario(
            "all",
            "all: outage_ttl=1, stale_if_error=30, gutter, outbox",
            (("outage_ttl", 1.0), ("stale_if_error", 30.0), ("gutter_ttl", GUTTER_TTL)),
            gutter=True,
            outbox=True,
            bound=30.0,
        ),
    )
}  # fmt: skip


def missing_feature(scenario: Scenario) -> str | None:
    """Why the installed cacheguard cannot run ``scenario`` (a setting it lacks), or None.
    The settings are tried on a guard for an address nothing listens on (a client
    connects on first use, and none is made here): together, then one by one to
    name the lacking ones."""
    where = Path(inspect.getfile(CacheGuard)).parents[1]
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    settings = scenario.guard_settings(nowhere)
    if _rejected(nowhere, settings):
        lacking = [s for s, value in settings.items() if _rejected(nowhere, {s: value})]
        lacking = lacking or list(settings)
        return (
            f"scenario {scenario.name} needs the {', '.join(lacking)} "
            f"setting{'s' if len(lacking) > 1 else ''}, which the installed cacheguard "
            f"({where}) lacks"
        )
    if scenario.outbox and (
        "outbox" not in inspect.signature(cg_sqlalchemy.track_models).parameters
        or not hasattr(cg_sqlalchemy, "outbox_table")
    ):
        return (
            f"scenario {scenario.name} needs track_models(..., outbox=True) and "
            f"cacheguard.integrations.sqlalchemy.outbox_table, which the installed cacheguard "
            f"({where}) lacks"
        )
    return None


def _rejected(url: str, settings: dict[str, Any]) -> bool:
    """Does ``CacheGuard`` refuse these settings as unknown (a TypeError)? Any other
    error is left to the run itself, against live servers."""
    try:
        CacheGuard.from_url(url, namespace=NAMESPACE, **settings).close()
    except TypeError:
        return True
    except Exception:
        return False
    return False


# -- the database -------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(default=0)


ITEM_KEYS = ("item:{id}",)


def engine_for(db_url: str, schema: str, pool_size: int) -> sa.Engine:
    """An engine whose connections see the run's own schema first (its tables, and an
    outbox table of the default name, collide with nobody's)."""
    return sa.create_engine(
        db_url,
        pool_size=pool_size,
        max_overflow=0,
        connect_args={"options": f"-c search_path={schema}"},
    )


def outbox_metadata() -> tuple[sa.MetaData, sa.Table]:
    metadata = sa.MetaData()
    return metadata, cg_sqlalchemy.outbox_table(metadata)  # type: ignore[attr-defined]


def tracker_for(guard: CacheGuard, sessions: Any, outbox: bool) -> Any:
    options = {"outbox": True} if outbox else {}
    return cg_sqlalchemy.track_models(guard, sessions, {Item: ITEM_KEYS}, **options)


# -- what the child processes share and report ------------------------------------------


@dataclass(frozen=True)
class Config:
    """Everything a child needs (plain data; the shared memory travels beside it)."""

    scenario: Scenario
    redis_url: str
    gutter_url: str | None
    db_url: str
    schema: str
    keys: int
    threads: int
    load_s: float
    write_every_s: float


@dataclass
class Shared:
    """Shared memory, written without cross-process locks: ``phase`` by the parent,
    ``floors`` (each key's newest version whose commit returned) and ``commit_times``
    (when the commit of version v of key k returned, at ``k * MAX_VERSIONS + v``) by
    the writer, which stores a version's time before publishing the version."""

    phase: Any
    floors: Any
    commit_times: Any
    go: Any
    ready: Any
    out: Any


@dataclass
class PhaseTally:
    reads: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    stale_max: float = 0.0
    beyond_bound: int = 0  # stale reads older than the scenario's bound allows
    latencies: list[float] = field(default_factory=list)  # seconds, of reads (writes: writer's)
    writes: int = 0
    writes_ok: int = 0

    def add(self, other: PhaseTally) -> None:
        self.reads += other.reads
        self.errors.update(other.errors)
        self.stale += other.stale
        self.stale_max = max(self.stale_max, other.stale_max)
        self.beyond_bound += other.beyond_bound
        self.latencies.extend(other.latencies)
        self.writes += other.writes
        self.writes_ok += other.writes_ok


@dataclass
class Report:
    """One process's findings: tallies per phase, its loads ``(key, start, phase)``,
    the warnings cacheguard logged."""

    slot: int
    phases: list[PhaseTally]
    loads: list[tuple[int, float, int]] = field(default_factory=list)
    logged: Counter[str] = field(default_factory=Counter)


class _CountingHandler(logging.Handler):
    """Counts cacheguard's warnings instead of printing one per failed call."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[f"{record.name} {record.levelname}"] += 1


def _count_logs() -> _CountingHandler:
    handler = _CountingHandler()
    logger = logging.getLogger("cacheguard")
    logger.addHandler(handler)
    logger.propagate = False
    return handler


def _child(body: Callable[[], Report], shared: Shared, slot: int) -> None:
    """Run a child's body, reporting a failure to set up (or to run) to the parent."""
    try:
        shared.out.put(body())
    except BaseException:
        shared.ready.put((slot, traceback.format_exc()))
        raise


def stale_check(
    shared: Shared, key: int, seen: int, floor: int, began: float, bound: float, tally: PhaseTally
) -> None:
    """Count ``seen`` as stale when older than ``floor`` (the newest version committed
    before the read began), for as long as the first newer commit it missed."""
    if seen >= floor:
        return
    times = [
        shared.commit_times[key * MAX_VERSIONS + v]
        for v in range(seen + 1, min(floor, MAX_VERSIONS - 1) + 1)
    ]
    known = [t for t in times if t > 0]  # a write whose outcome was unknown has none
    age = began - min(known) if known else 0.0
    tally.stale += 1
    tally.stale_max = max(tally.stale_max, age)
    if age > bound:
        tally.beyond_bound += 1


def reader(config: Config, shared: Shared, slot: int) -> None:
    _child(lambda: _read(config, shared, slot), shared, slot)


def _read(config: Config, shared: Shared, slot: int) -> Report:
    logs = _count_logs()
    scenario = config.scenario
    # A bounded setting's staleness runs from when a load began: the setting plus one load.
    allowed = scenario.bound + config.load_s if scenario.bound > 0 else 0.0
    guard = CacheGuard.from_url(
        config.redis_url, namespace=NAMESPACE, **scenario.guard_settings(config.gutter_url)
    )
    engine = engine_for(config.db_url, config.schema, config.threads)
    # Every process tracks the model, as a service would: with the outbox, a guard that
    # sees Redis again replays it (the loader itself reads through a plain connection).
    tracker = tracker_for(guard, sessionmaker(engine), scenario.outbox)
    loads: list[tuple[int, float, int]] = []
    query = sa.select(Item.version).where(Item.id == sa.bindparam("id"))

    def load(key: int) -> int:
        loads.append((key, time.monotonic(), shared.phase.value))
        with engine.connect() as conn:
            version = int(conn.execute(query, {"id": key}).scalar_one())
        time.sleep(config.load_s)  # the value ages while it loads, as a real one would
        return version

    with engine.connect() as conn:  # fail here, before the run, on a bad database
        conn.execute(query, {"id": 0}).scalar_one()
    tallies: list[list[PhaseTally]] = []

    def run() -> None:
        mine = [PhaseTally() for _ in PHASES]
        tallies.append(mine)
        rng = random.Random()
        shared.go.wait()
        while (phase := shared.phase.value) != STOP:
            key = rng.randrange(config.keys)
            began = time.monotonic()
            floor = shared.floors[key]
            tally = mine[phase]
            try:
                seen = guard.get_or_load(f"item:{key}", functools.partial(load, key), ttl=CACHE_TTL)
            except Exception as exc:
                tally.errors[type(exc).__name__] += 1
                continue
            tally.latencies.append(time.monotonic() - began)
            tally.reads += 1
            stale_check(shared, key, seen, floor, began, allowed, tally)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(config.threads)]
    for t in pool:
        t.start()
    shared.ready.put((slot, None))
    for t in pool:
        t.join()
    tracker.remove()
    guard.close()
    engine.dispose()
    phases = [PhaseTally() for _ in PHASES]
    for mine in tallies:
        for total, part in zip(phases, mine, strict=True):
            total.add(part)
    return Report(slot, phases, loads, logs.seen)


def writer(config: Config, shared: Shared, slot: int) -> None:
    _child(lambda: _write(config, shared, slot), shared, slot)


def _write(config: Config, shared: Shared, slot: int) -> Report:
    logs = _count_logs()
    scenario = config.scenario
    guard = CacheGuard.from_url(
        config.redis_url, namespace=NAMESPACE, **scenario.guard_settings(config.gutter_url)
    )
    engine = engine_for(config.db_url, config.schema, 2)
    sessions = sessionmaker(engine, expire_on_commit=False)
    tracker = tracker_for(guard, sessions, scenario.outbox)
    with engine.connect() as conn:
        conn.execute(sa.select(Item.version).limit(1)).all()
    phases = [PhaseTally() for _ in PHASES]
    shared.ready.put((slot, None))
    shared.go.wait()
    turn = 0
    next_at = time.monotonic()
    while (phase := shared.phase.value) != STOP:
        key = turn % config.keys
        turn += 1
        tally = phases[phase]
        tally.writes += 1
        began = time.monotonic()
        try:
            with sessions() as session, session.begin():
                item = session.get(Item, key)
                assert item is not None
                item.version += 1
                version = item.version
        except Exception as exc:
            tally.errors[type(exc).__name__] += 1
        else:
            if version < MAX_VERSIONS:
                shared.commit_times[key * MAX_VERSIONS + version] = time.monotonic()
            shared.floors[key] = version  # after its time: a reader finds both
            tally.writes_ok += 1
        tally.latencies.append(time.monotonic() - began)  # failed or not
        next_at = max(next_at + config.write_every_s, time.monotonic())
        time.sleep(max(0.0, next_at - time.monotonic()))
    tracker.remove()
    guard.close()
    engine.dispose()
    return Report(slot, phases, [], logs.seen)


# -- one scenario -------------------------------------------------------------------------


@dataclass
class Outcome:
    scenario: Scenario
    seconds: list[float]  # each phase's length
    phases: list[PhaseTally]
    writer: list[PhaseTally]
    loads: list[list[tuple[int, float, int]]]  # per reader process
    logged: Counter[str]
    outbox_left: int | None
    redis_version: str


def max_in_window(times: Sequence[float], width: float) -> int:
    """The most of ``times`` within any half-open window ``width`` seconds long."""
    ordered = sorted(times)
    best, first = 0, 0
    for last, t in enumerate(ordered):
        while t - ordered[first] >= width:
            first += 1
        best = max(best, last - first + 1)
    return best


def per_key_window(loads: list[tuple[int, float, int]], width: float) -> int:
    by_key: dict[int, list[float]] = {}
    for key, t, phase in loads:
        if phase == DURING:
            by_key.setdefault(key, []).append(t)
    return max((max_in_window(times, width) for times in by_key.values()), default=0)


@dataclass
class Servers:
    primary: OwnedRedisServer
    gutter: OwnedRedisServer | None

    def close(self) -> None:
        if self.primary.proc is not None:
            os.kill(self.primary.proc.pid, signal.SIGCONT)  # a stopped one, if it was
        self.primary.close()
        if self.gutter is not None:
            self.gutter.close()


def _setup_database(db_url: str, schema: str, scenario: Scenario, keys: int) -> sa.Table | None:
    engine = engine_for(db_url, schema, 1)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
        outbox = None
        if scenario.outbox:
            metadata, outbox = outbox_metadata()
            metadata.drop_all(engine)
            metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add_all(Item(id=i, version=0) for i in range(keys))
        return outbox
    finally:
        engine.dispose()


def _rows_left(db_url: str, schema: str, table: sa.Table) -> int:
    engine = engine_for(db_url, schema, 1)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())
    finally:
        engine.dispose()


def run_scenario(scenario: Scenario, args: argparse.Namespace, schema: str) -> Outcome:
    outbox = _setup_database(args.database_url, schema, scenario, args.keys)
    servers = Servers(OwnedRedisServer(), OwnedRedisServer() if scenario.gutter else None)
    shared = Shared(
        phase=CTX.Value("i", BEFORE, lock=False),
        floors=CTX.Array("q", args.keys, lock=False),
        commit_times=CTX.Array("d", args.keys * MAX_VERSIONS, lock=False),
        go=CTX.Event(),
        ready=CTX.Queue(),
        out=CTX.Queue(),
    )
    config = Config(
        scenario=scenario,
        redis_url=servers.primary.url,
        gutter_url=servers.gutter.url if servers.gutter else None,
        db_url=args.database_url,
        schema=schema,
        keys=args.keys,
        threads=args.threads,
        load_s=args.load_ms / 1000,
        write_every_s=args.write_every_ms / 1000,
    )
    children = [
        CTX.Process(target=reader, args=(config, shared, slot), daemon=True)
        for slot in range(args.processes)
    ]
    children.append(CTX.Process(target=writer, args=(config, shared, args.processes), daemon=True))
    try:
        redis_version = str(redis.Redis(port=servers.primary.port).info("server")["redis_version"])
        for child in children:
            child.start()
        for _ in children:
            slot, failure = shared.ready.get(timeout=120)
            if failure is not None:
                raise RuntimeError(f"scenario {scenario.name}: child {slot} failed:\n{failure}")
        seconds = _timeline(args, servers, shared)
        reports: list[Report] = []
        for _ in children:
            reports.append(_collect(shared, scenario))
        for child in children:
            child.join(30)
        outbox_left = _rows_left(args.database_url, schema, outbox) if outbox is not None else None
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(5)
        servers.close()
    readers = [r for r in reports if r.slot < args.processes]
    phases = [PhaseTally() for _ in PHASES]
    for report in readers:
        for total, part in zip(phases, report.phases, strict=True):
            total.add(part)
    logged: Counter[str] = Counter()
    for report in reports:
        logged.update(report.logged)
    return Outcome(
        scenario=scenario,
        seconds=seconds,
        phases=phases,
        writer=next(r.phases for r in reports if r.slot == args.processes),
        loads=[r.loads for r in sorted(readers, key=lambda r: r.slot)],
        logged=logged,
        outbox_left=outbox_left,
        redis_version=redis_version,
    )


def _collect(shared: Shared, scenario: Scenario) -> Report:
    deadline = time.monotonic() + 120  # callers in a long wait finish it first
    while time.monotonic() < deadline:
        try:
            report: Report = shared.out.get(timeout=1)
            return report
        except queue.Empty:
            if not shared.ready.empty():
                slot, failure = shared.ready.get()
                raise RuntimeError(
                    f"scenario {scenario.name}: child {slot} failed:\n{failure}"
                ) from None
    raise RuntimeError(f"scenario {scenario.name}: a child did not report within 120 s")


def _timeline(args: argparse.Namespace, servers: Servers, shared: Shared) -> list[float]:
    """Warm-up, outage, recovery; each phase's length in seconds."""
    primary = servers.primary
    shared.go.set()
    began = time.monotonic()
    time.sleep(args.warmup)
    shared.phase.value = DURING
    down = time.monotonic()
    assert primary.proc is not None
    if args.outage == "kill":
        primary.kill()
    else:
        os.kill(primary.proc.pid, signal.SIGSTOP)
    time.sleep(args.outage_seconds)
    if args.outage == "kill":
        primary.start()  # same port, empty: it was started without persistence
    else:
        os.kill(primary.proc.pid, signal.SIGCONT)
    shared.phase.value = AFTER
    up = time.monotonic()
    time.sleep(args.recovery)
    shared.phase.value = STOP
    ended = time.monotonic()
    return [down - began, up - down, ended - up]


# -- the report -----------------------------------------------------------------------------

TABLE_HEADER = (
    "| scenario | DB loads in outage | max loads / key / process in any 1 s "
    f"| max loads / key, all processes, in any {GUTTER_TTL:g} s | reads served in outage "
    "| read errors in outage | stale reads in outage (max s) "
    "| stale reads after recovery (beyond bound) | writes ok / attempted in outage "
    "| outbox rows left |"
)
PHASE_HEADER = (
    "| scenario | phase | seconds | DB loads | reads served | read errors "
    "| stale reads (max s) | read latency p50 / p99 / max ms | writes ok / attempted "
    "| write time max ms |"
)


def _stale(tally: PhaseTally) -> str:
    return f"{tally.stale:,} ({tally.stale_max:.2f})"


def table(outcomes: list[Outcome]) -> list[str]:
    lines = [TABLE_HEADER, "|---|" + "---:|" * 9]
    for o in outcomes:
        during, after, wrote = o.phases[DURING], o.phases[AFTER], o.writer[DURING]
        all_loads = [load for process in o.loads for load in process]
        loaded = sum(1 for _, _, phase in all_loads if phase == DURING)
        per_process = max((per_key_window(process, 1.0) for process in o.loads), default=0)
        lines.append(
            f"| {o.scenario.label} | {loaded:,} | {per_process} "
            f"| {per_key_window(all_loads, GUTTER_TTL)} | {during.reads:,} "
            f"| {sum(during.errors.values()):,} | {_stale(during)} "
            f"| {after.stale:,} ({after.beyond_bound:,}) | {wrote.writes_ok} / {wrote.writes} "
            f"| {'-' if o.outbox_left is None else o.outbox_left} |"
        )
    return lines


def phase_table(outcomes: list[Outcome]) -> list[str]:
    lines = [PHASE_HEADER, "|---|---|" + "---:|" * 8]
    for o in outcomes:
        for phase, name in enumerate(PHASES):
            tally, wrote = o.phases[phase], o.writer[phase]
            loaded = sum(1 for process in o.loads for _, _, p in process if p == phase)
            ms = sorted(t * 1000 for t in tally.latencies)
            latency = (
                f"{statistics.median(ms):.1f} / {percentile(ms, 0.99):.1f} / {ms[-1]:.1f}"
                if ms
                else "-"
            )
            lines.append(
                f"| {o.scenario.label} | {name} | {o.seconds[phase]:.1f} | {loaded:,} "
                f"| {tally.reads:,} | {sum(tally.errors.values()):,} | {_stale(tally)} "
                f"| {latency} | {wrote.writes_ok} / {wrote.writes} "
                f"| {max(wrote.latencies, default=0.0) * 1000:.1f} |"
            )
    return lines


def notes(outcomes: list[Outcome]) -> list[str]:
    lines = []
    for o in outcomes:
        errors = Counter[str]()
        for phase, name in enumerate(PHASES):
            errors.update({f"reads {name}: {k}": n for k, n in o.phases[phase].errors.items()})
            errors.update({f"writes {name}: {k}": n for k, n in o.writer[phase].errors.items()})
        described = ", ".join(f"{k} {n:,}" for k, n in sorted(errors.items())) or "none"
        logged = ", ".join(f"{k} {n:,}" for k, n in sorted(o.logged.items())) or "none"
        lines.append(
            f"- {o.scenario.label}: errors by class: {described}; cacheguard logged: {logged}"
        )
    return lines


OUTAGES = {
    "kill": "SIGKILL of the primary (connections refused), restarted empty on the same "
    "port after the outage (it runs without persistence: the cache is cold again)",
    "stop": "SIGSTOP of the primary (a partition: connections hang, replies never come; "
    "requests sent meanwhile run when SIGCONT resumes it), its data kept",
}


def report(args: argparse.Namespace, outcomes: list[Outcome]) -> str:
    command = shlex.join(["python", "-m", "bench.outage", *args.argv])
    bounds = ", ".join(f"{o.scenario.label} {o.scenario.bound:g} s" for o in outcomes)
    lines = [
        run_line(outcomes[0].redis_version, "redis-server") if outcomes else "",
        "",
        f"Command: `{command}`",
        "",
        f"Settings: {args.processes} reader processes x {args.threads} threads on "
        f"{args.keys} hot keys (random), {args.load_ms} ms loader (a PostgreSQL SELECT of "
        f"the row's version, then the sleep), cache TTL {CACHE_TTL:g} s; one writer process "
        f"adding one to a row's version every {args.write_every_ms} ms through a tracked "
        f"session; {args.warmup:g} s with Redis up, a {args.outage_seconds:g} s outage, "
        f"{args.recovery:g} s of recovery. Outage: {OUTAGES[args.outage]}. Every scenario "
        "gets fresh servers and a fresh table.",
        "",
        "A stale read returned a version older than one whose commit had returned before "
        "the read began; its age is the time since that newer commit. Beyond bound: stale "
        f"reads older than the scenario's settings allow ({bounds}), plus one load's "
        f"{args.load_ms} ms where a setting allows staleness (a value is remembered when "
        "its load ends; its data is from when the load began).",
        "",
        *table(outcomes),
        "",
        "Per phase (a call counts in the phase it began in):",
        "",
        *phase_table(outcomes),
        "",
        *notes(outcomes),
    ]
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------

FULL = {"processes": 4, "threads": 25, "warmup": 2.0, "outage_seconds": 10.0, "recovery": 5.0}
QUICK = {"processes": 2, "threads": 4, "warmup": 1.0, "outage_seconds": 2.0, "recovery": 2.0}


@dataclass
class _Schema:
    db_url: str
    name: str = field(default_factory=lambda: f"bench_outage_{uuid.uuid4().hex[:10]}")

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc: object) -> None:
        engine = sa.create_engine(self.db_url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE'))
        finally:
            engine.dispose()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS), help="repeatable; default today"
    )
    chosen.add_argument("--all", action="store_true", help="every scenario, in one run")
    parser.add_argument("--outage", choices=list(OUTAGES), default="kill")
    parser.add_argument(
        "--quick", action="store_true", help="2 x 4 threads, 1 s + 2 s outage + 2 s (smoke)"
    )
    parser.add_argument("--processes", type=int, help=f"readers (default {FULL['processes']})")
    parser.add_argument("--threads", type=int, help=f"per reader (default {FULL['threads']})")
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--load-ms", type=int, default=50)
    parser.add_argument("--write-every-ms", type=int, default=100)
    parser.add_argument("--warmup", type=float, help="seconds before the outage (default 2)")
    parser.add_argument("--outage-seconds", type=float, help="default 10")
    parser.add_argument("--recovery", type=float, help="seconds after it (default 5)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL,
        help="PostgreSQL (default: $DATABASE_URL, else the tests' local one)",
    )
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.processes, args.threads, args.keys, args.write_every_ms) < 1 or args.load_ms < 0:
        parser.error("processes, threads, keys and write-every-ms must be >= 1, load-ms >= 0")
    if min(args.warmup, args.outage_seconds, args.recovery) <= 0:
        parser.error("warmup, outage-seconds and recovery must be > 0")
    if not args.database_url.startswith("postgresql"):
        parser.error("the bench's database is PostgreSQL (--database-url or DATABASE_URL)")
    names = list(SCENARIOS) if args.all else (args.scenario or ["today"])
    args.scenarios = [SCENARIOS[name] for name in dict.fromkeys(names)]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    missing = [m for s in args.scenarios if (m := missing_feature(s)) is not None]
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 2
    if shutil.which("redis-server") is None:
        print("bench.outage needs redis-server on the PATH (it kills its own)", file=sys.stderr)
        return 2
    outcomes = []
    with _Schema(args.database_url) as schema:
        for scenario in args.scenarios:
            print(f"scenario {scenario.name} ...", file=sys.stderr, flush=True)
            outcomes.append(run_scenario(scenario, args, schema))
    text = report(args, outcomes)
    print(text)
    if args.write:
        write_section(args.write, text, MARK)
        print(f"\nwritten to {args.write}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Run the module imported by its name, so what the children pickle back (reports)
    # names bench.outage, which both sides import alike.
    from bench.outage import main as run_main

    sys.exit(run_main())
