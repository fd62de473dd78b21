"""Lock stores side by side: uncontended cost, round trips, cross-process hand-off.

    python bench/locks.py [--cycles 2000] [--count-cycles 200] [--handoffs 40]
                          [--masters 5] [--stores redis,redlock,postgres,zookeeper]
                          [--url redis://...] [--postgres-url postgresql+psycopg://...]
                          [--write docs/benchmarks.md]

The four read-write locks of one contract, measured in one run:

* ``RedisRWLock`` on one Redis (a throwaway ``redis-server``, or ``--url``);
* ``RedlockRWLock`` on ``--masters`` throwaway ``redis-server`` masters;
* ``PostgresRWLock`` on PostgreSQL (``--postgres-url``; default ``DATABASE_URL``
  when it names PostgreSQL, else ``postgres@127.0.0.1:5432/test``);
* ``ZooKeeperRWLock`` through kazoo on a throwaway standalone ZooKeeper.

For each store: uncontended read and write acquire+release (median µs per cycle
over batches of 100, the batches of every row interleaved, who goes first
rotating), next to two bare round trips to the same server; round trips and
requests per cycle, counted as the report says under its table; and the hand-off:
this process releases the write lock while a waiter in another (spawned) process
is blocked on it, and the delay until that waiter holds it (median, p99), the
stores' rounds interleaved. A store that cannot be set up (its server missing,
its module not importable) or that fails during the run is reported as such in
its rows; the others are measured all the same.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import command_calls, interleaved_us, percentile, run_line, write_section
from cacheguard import RedisRWLock
from cacheguard.locks import RedlockRWLock
from cacheguard.testing import OwnedRedisServer, redis_server

CTX = mp.get_context("spawn")
MARK = "bench/locks.py"
STORES = ("redis", "redlock", "postgres", "zookeeper")
WARMUP_CYCLES = 100  # per body: scripts loaded, connections and sessions open
WARMUP_ROUNDS = 3  # first hand-offs open connections and subscriptions: not counted
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The client sends only these to a Redis master on a lock's path; every other command
# in INFO commandstats was called by a script (or is the bench's own INFO).
SCRIPT_CALLS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")

FLOOR = "two bare round trips, no lock"

Body = Callable[[], None]


@dataclass(frozen=True)
class Count:
    """What one cycle sent, on average."""

    round_trips: float  # requests the client waited for one after the other
    requests: str  # what was sent (and run server-side), per cycle


@dataclass
class Rig:
    """One store, set up: how to make its lock here and in a child, and how to count."""

    key: str
    label: str
    server: str  # what it ran on, for the report's header
    wakes: str  # how a blocked waiter learns of the release
    make: Callable[[str], Any]  # lock name -> a lock in this process
    # (module-level function, args): ``maker(*args, name)`` makes the same lock in a
    # spawned child, which connects on its own.
    maker: tuple[Callable[..., Any], tuple[Any, ...]]
    count: Callable[[Body, int], Count]  # run body n times, count what it sent
    queued: Callable[[Any], bool]  # is a writer (the child) queued on this lock?
    floor: tuple[str, Body] | None = None  # two bare round trips to the same server
    extra: dict[str, Callable[[str], Body]] = field(default_factory=dict)
    redis: tuple[str, str] | None = None  # (version, endpoint kind) for the run line
    failure: str = ""


def per_cycle(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def breakdown(counts: dict[str, float]) -> str:
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} {per_cycle(n)}" for name, n in ordered if n > 0)


def wait_until(condition: Callable[[], bool], deadline: float, what: str) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting: {what}")
        time.sleep(0.002)


# -- Redis and Redlock: INFO commandstats per master ----------------------------------------------


@contextlib.contextmanager
def socket_writes() -> Iterator[Counter[str]]:
    """Count redis-py's socket writes (a command, or a whole pipeline) meanwhile."""
    writes: Counter[str] = Counter()
    cls = redis.connection.AbstractConnection
    original = cls.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        writes["sent"] += 1
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    cls.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield writes
    finally:
        cls.send_packed_command = original  # type: ignore[method-assign]


def redis_counter(admins: list[redis.Redis]) -> Callable[[Body, int], Count]:
    """Round trips: script calls per master, from INFO commandstats diffed around the
    cycles (checked against redis-py's socket writes); requests: every command per
    master, those run inside the scripts included."""

    def count(body: Body, cycles: int) -> Count:
        before = [command_calls(admin) for admin in admins]
        with socket_writes() as writes:
            for _ in range(cycles):
                body()
        after = [command_calls(admin) for admin in admins]
        totals: Counter[str] = Counter()
        for old, new in zip(before, after, strict=True):
            for name, calls in new.items():
                if name != "info" and calls > old.get(name, 0):  # (INFO: the bench's own)
                    totals[name] += calls - old.get(name, 0)
        masters = len(admins)
        per_master = {name: n / cycles / masters for name, n in totals.items()}
        sent = {name: n for name, n in per_master.items() if name in SCRIPT_CALLS}
        inside = {name: n for name, n in per_master.items() if name not in SCRIPT_CALLS}
        round_trips = sum(sent.values())
        client_side = writes["sent"] / cycles / masters
        if not sent:  # a body of plain commands (the floor): each one a round trip
            round_trips, sent, inside = client_side, per_master, {}
        text = breakdown(sent).upper()
        if inside:
            text += f" (inside the scripts: {breakdown(inside).upper()})"
        if masters > 1:
            text += f", on each of {masters} masters"
        if abs(client_side - round_trips) > 0.01:
            text += f"; redis-py wrote {per_cycle(client_side)} per master"
        return Count(round_trips, text)

    return count


def redis_queued(admins: list[redis.Redis]) -> Callable[[Any], bool]:
    """A writer's waiting mark (``q:<owner>``) in the lock hash, on a majority."""

    def queued(lock: Any) -> bool:
        marked = 0
        for admin in admins:
            fields: list[Any] = admin.hkeys(lock.keys.lock)
            marked += any(f.startswith(b"q:") for f in fields)
        return marked > len(admins) // 2

    return queued


def redis_lock(url: str, namespace: str, name: str) -> RedisRWLock:
    return RedisRWLock(redis.Redis.from_url(url), name, namespace=namespace)


def redlock_lock(urls: tuple[str, ...], namespace: str, name: str) -> RedlockRWLock:
    return RedlockRWLock([redis.Redis.from_url(url) for url in urls], name, namespace=namespace)


def redis_version(client: redis.Redis) -> str:
    return str(client.info("server").get("redis_version"))


@contextlib.contextmanager
def redis_rig(args: argparse.Namespace) -> Iterator[Rig]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        if args.url:
            url = stack.enter_context(redis_server(args.url)).url
            kind = "url"
        else:
            url = stack.enter_context(contextlib.closing(OwnedRedisServer())).url
            kind = "redis-server"
        client = redis.Redis.from_url(url)
        stack.callback(client.close)
        if args.url:  # a shared server: take away what we left, never flush

            def tidy() -> None:
                for key in client.scan_iter(match=f"{namespace}:*", count=1000):
                    client.delete(key)

            stack.callback(tidy)
        raw = f"{namespace}:raw"
        client.set(raw, b"x" * 64)

        def two_gets() -> None:
            client.get(raw)
            client.get(raw)

        version = redis_version(client)
        yield Rig(
            key="redis",
            label="Redis (1 server)",
            server=f"one Redis {version} ({'--url' if args.url else 'throwaway'}, loopback)",
            wakes="pub/sub: the release script publishes, the waiter's listener wakes it",
            make=lambda name: RedisRWLock(client, name, namespace=namespace),
            maker=(redis_lock, (url, namespace)),
            count=redis_counter([client]),
            queued=redis_queued([client]),
            floor=(FLOOR, two_gets),
            redis=(version, kind),
        )


@contextlib.contextmanager
def redlock_rig(args: argparse.Namespace) -> Iterator[Rig]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(contextlib.closing(OwnedRedisServer())) for _ in range(args.masters)
        ]
        urls = tuple(server.url for server in servers)
        clients = [redis.Redis.from_url(url) for url in urls]
        for client in clients:
            stack.callback(client.close)
        # The floor goes to every master at once as the lock does: the calling thread
        # takes the first master, a pool thread each of the others.
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(args.masters))
        raw = f"{namespace}:raw"
        for client in clients:
            client.set(raw, b"x" * 64)

        def get_everywhere() -> None:
            futures = [pool.submit(client.get, raw) for client in clients[1:]]
            clients[0].get(raw)
            for future in futures:
                future.result()

        def two_rounds() -> None:
            get_everywhere()
            get_everywhere()

        yield Rig(
            key="redlock",
            label=f"Redlock ({args.masters} masters)",
            server=(
                f"Redlock on {args.masters} x Redis {redis_version(clients[0])} (throwaway "
                "masters, one host, loopback)"
            ),
            wakes="pub/sub from any master, then a new round on every master",
            make=lambda name: RedlockRWLock(clients, name, namespace=namespace),
            maker=(redlock_lock, (urls, namespace)),
            count=redis_counter(clients),
            queued=redis_queued(clients),
            floor=(FLOOR, two_rounds),
        )


# -- PostgreSQL: statements counted at psycopg ----------------------------------------------------


def postgres_url(given: str | None) -> str:
    if given:
        return given
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgresql"):
        return POSTGRES_URL
    return "postgresql+psycopg" + url[url.index("://") :]


def statement_kind(query: object) -> str:
    text = " ".join(str(query).split())
    for marker, kind in (
        ("pg_advisory_lock_shared(", "lock_shared"),
        ("pg_advisory_lock(", "lock"),
        ("pg_advisory_unlock_shared(", "unlock_shared"),
        ("pg_advisory_unlock(", "unlock"),
    ):
        if marker in text:
            return kind + (" + nextval" if "nextval(" in text and kind == "lock" else "")
    return text[:40]


def postgres_counter() -> Callable[[Body, int], Count]:
    """Statements sent on every psycopg connection of this process (the lock's
    sessions are connections of its own, outside the engine's pool, where a
    SQLAlchemy ``before_cursor_execute`` listener sees nothing); in autocommit
    each is one round trip."""
    import psycopg

    def count(body: Body, cycles: int) -> Count:
        seen: Counter[str] = Counter()
        original = psycopg.Cursor.execute

        def counted(self: Any, query: Any, *rest: Any, **kwargs: Any) -> Any:
            seen[statement_kind(query)] += 1
            return original(self, query, *rest, **kwargs)

        psycopg.Cursor.execute = counted  # type: ignore[method-assign]
        try:
            for _ in range(cycles):
                body()
        finally:
            psycopg.Cursor.execute = original  # type: ignore[method-assign]
        per = {kind: n / cycles for kind, n in seen.items()}
        return Count(sum(per.values()), "statements: " + breakdown(per))

    return count


def postgres_lock(url: str, namespace: str, fence: str, name: str) -> Any:
    import sqlalchemy

    from cacheguard.locks.postgres.rwlock import PostgresRWLock

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool)
    return PostgresRWLock(engine, name, namespace=namespace, fence_sequence=fence)


@contextlib.contextmanager
def postgres_rig(args: argparse.Namespace) -> Iterator[Rig]:
    import psycopg
    import sqlalchemy

    # The module another engineer may still be finishing: its failure to import
    # is reported in the rows, like an unreachable server.
    from cacheguard.locks.postgres.rwlock import PostgresRWLock, close_idle_connections, key_parts

    url = postgres_url(args.postgres_url)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    fence = f"cg_bench_fence_{uuid.uuid4().hex[:8]}"  # dropped afterwards
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
    raw: psycopg.Connection[Any] | None = None
    try:
        with engine.connect() as conn:
            version = conn.execute(sqlalchemy.text("SHOW server_version")).scalar_one()
            version = str(version).split()[0]
        # A bare session like the lock's (autocommit) for the floor.
        raw = psycopg.connect(engine.url.set(drivername="postgresql").render_as_string(False))
        raw.autocommit = True
        bare = raw

        def two_selects() -> None:
            bare.execute("SELECT 1")
            bare.execute("SELECT 1")

        def queued(lock: Any) -> bool:
            classid, objid = key_parts(lock.key)
            query = sqlalchemy.text(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                " AND NOT granted AND mode = 'ExclusiveLock'"
                " AND classid = CAST(:classid AS oid) AND objid = CAST(:objid AS oid)"
                " AND objsubid = 1)"
            )
            with engine.connect() as conn:
                found = conn.execute(query, {"classid": classid, "objid": objid})
                return bool(found.scalar_one())

        def make(name: str) -> PostgresRWLock:
            return PostgresRWLock(engine, name, namespace=namespace, fence_sequence=fence)

        def unfenced_write(name: str) -> Body:
            lock = PostgresRWLock(engine, name, namespace=namespace, fencing=False)
            return lambda: lock.acquire_write().release()

        yield Rig(
            key="postgres",
            label="PostgreSQL",
            server=(
                f"PostgreSQL {version} ({engine.url.host}:{engine.url.port}, psycopg "
                f"{psycopg.__version__}, SQLAlchemy {sqlalchemy.__version__})"
            ),
            wakes="the server's lock queue: the waiter's pg_advisory_lock call returns",
            make=make,
            maker=(postgres_lock, (url, namespace, fence)),
            count=postgres_counter(),
            queued=queued,
            floor=(FLOOR, two_selects),
            extra={"write acquire+release, fencing=False": unfenced_write},
        )
    finally:
        if raw is not None:
            raw.close()
        with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError), engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SEQUENCE IF EXISTS {fence}"))
        close_idle_connections(engine)
        engine.dispose()


# -- ZooKeeper: kazoo requests counted at the client ----------------------------------------------


def zookeeper_counter(client: Any) -> Callable[[Body, int], Count]:
    """Every request the kazoo client queues (pings aside), by type. A round trip is a
    request queued while no other is queued or awaiting its answer; the others ride
    along with one in flight (pipelined)."""

    def count(body: Body, cycles: int) -> Count:
        seen: Counter[str] = Counter()
        trips = 0
        original = client._call

        def counted(request: Any, async_object: Any) -> Any:
            nonlocal trips
            if not client._queue and not client._pending:
                trips += 1
            seen[type(request).__name__] += 1
            return original(request, async_object)

        client._call = counted
        try:
            for _ in range(cycles):
                body()
        finally:
            del client._call  # the class's method again
        per = {kind: n / cycles for kind, n in seen.items()}
        return Count(trips / cycles, "requests: " + breakdown(per))

    return count


def zookeeper_lock(hosts: str, namespace: str, name: str) -> Any:
    from kazoo.client import KazooClient

    from cacheguard.locks.zookeeper.rwlock import ZooKeeperRWLock

    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    return ZooKeeperRWLock(client, name, namespace=namespace)


@contextlib.contextmanager
def zookeeper_rig(args: argparse.Namespace) -> Iterator[Rig]:
    from cacheguard_testing.zookeeper import zookeeper_server
    from kazoo.client import KazooClient

    from cacheguard.locks.zookeeper.rwlock import ZooKeeperRWLock

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    with zookeeper_server() as server:
        version = server.four_letter("srvr").splitlines()[0].split(":", 1)[-1].split("-")[0]
        client = KazooClient(hosts=server.hosts)
        client.start(timeout=15)
        try:
            client.ensure_path("/bench")

            def two_exists() -> None:
                client.exists("/bench")
                client.exists("/bench")

            def queued(lock: Any) -> bool:
                return len(client.get_children(lock.path)) >= 2  # ours and the waiter's

            yield Rig(
                key="zookeeper",
                label="ZooKeeper",
                server=(
                    f"ZooKeeper {version.strip()} (throwaway standalone, loopback, kazoo "
                    f"{importlib.metadata.version('kazoo')})"
                ),
                wakes="a watch on the node ahead fires on its deletion, then get_children",
                make=lambda name: ZooKeeperRWLock(client, name, namespace=namespace),
                maker=(zookeeper_lock, (server.hosts, namespace)),
                count=zookeeper_counter(client),
                queued=queued,
                floor=(FLOOR, two_exists),
            )
        finally:
            client.stop()
            client.close()


RIGS: dict[str, Callable[[argparse.Namespace], contextlib.AbstractContextManager[Rig]]] = {
    "redis": redis_rig,
    "redlock": redlock_rig,
    "postgres": postgres_rig,
    "zookeeper": zookeeper_rig,
}
LABELS = {
    "redis": "Redis (1 server)",
    "redlock": "Redlock",
    "postgres": "PostgreSQL",
    "zookeeper": "ZooKeeper",
}


def why(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


# -- uncontended ----------------------------------------------------------------------------------


@dataclass
class Row:
    rig: Rig
    operation: str
    body: Body
    us: float = 0.0
    count: Count | None = None


def rows_of(rig: Rig) -> list[Row]:
    lock = rig.make("uncontended")
    rows = []
    if rig.floor:
        rows.append(Row(rig, rig.floor[0], rig.floor[1]))
    rows.append(Row(rig, "read acquire+release", lambda: lock.acquire_read().release()))
    rows.append(Row(rig, "write acquire+release", lambda: lock.acquire_write().release()))
    for operation, body_for in rig.extra.items():
        rows.append(Row(rig, operation, body_for("uncontended")))
    return rows


def guarded(rig: Rig, body: Body) -> Body:
    """The body, or nothing once its store failed (the failure goes in its rows)."""

    def run() -> None:
        if rig.failure:
            return
        try:
            body()
        except Exception as exc:
            rig.failure = f"failed during the run: {why(exc)}"

    return run


def uncontended(rigs: list[Rig], cycles: int, count_cycles: int) -> list[Row]:
    rows: list[Row] = []
    for rig in rigs:
        try:
            mine = rows_of(rig)
            for row in mine:
                for _ in range(WARMUP_CYCLES):
                    row.body()
        except Exception as exc:
            rig.failure = f"failed in the warm-up: {why(exc)}"
            continue
        rows += mine
    bodies = {f"{row.rig.key}: {row.operation}": guarded(row.rig, row.body) for row in rows}
    micros = interleaved_us(bodies, cycles) if bodies else {}
    for row in rows:
        row.us = micros[f"{row.rig.key}: {row.operation}"]
        if not row.rig.failure:
            try:
                row.count = row.rig.count(row.body, count_cycles)
            except Exception as exc:
                row.rig.failure = f"failed while counting: {why(exc)}"
    return rows


# -- hand-off between processes -------------------------------------------------------------------


def _waiter(
    maker: tuple[Callable[..., Any], tuple[Any, ...]], name: str, go: Any, done: Any
) -> None:
    """In the child: on each go, block on the write lock; report when it was ours."""
    try:
        make, args = maker
        lock = make(*args, name)
        while go.get():
            held = lock.acquire_write(timeout=30)
            # time.monotonic is CLOCK_MONOTONIC on Linux: one clock for all processes.
            acquired_at = time.monotonic()
            held.release()
            done.put(acquired_at)
    except Exception as exc:
        done.put(why(exc))


@dataclass
class Handoff:
    rig: Rig
    lock: Any = None
    child: Any = None
    go: Any = None
    done: Any = None
    delays: list[float] = field(default_factory=list)

    def start(self) -> None:
        name = f"handoff-{uuid.uuid4().hex[:6]}"
        self.lock = self.rig.make(name)
        self.go, self.done = CTX.Queue(), CTX.Queue()
        self.child = CTX.Process(
            target=_waiter, args=(self.rig.maker, name, self.go, self.done), daemon=True
        )
        self.child.start()

    def round(self, rng: random.Random) -> None:
        held = self.lock.acquire_write(timeout=30)
        self.go.put(True)
        # The waiter is blocked once the store shows it queued (a child's first round
        # includes its start-up); a little more and it is parked in its wait, at a
        # moment that varies, so no phase of the store's machinery is favoured.
        try:
            wait_until(
                # (a child that died has put its error in ``done``)
                lambda: self.rig.queued(self.lock) or not self.child.is_alive(),
                time.monotonic() + 60,
                f"the {self.rig.label} waiter to queue",
            )
        except Exception:
            held.release()
            raise
        time.sleep(rng.uniform(0.01, 0.04))
        released_at = time.monotonic()
        held.release()
        got = self.done.get(timeout=60)
        if isinstance(got, str):
            raise RuntimeError(f"the waiter failed: {got}")
        self.delays.append((got - released_at) * 1000)

    def stop(self) -> None:
        if self.child is None:
            return
        with contextlib.suppress(Exception):
            self.go.put(False)
        self.child.join(15)
        if self.child.is_alive():
            self.child.kill()
            self.child.join(5)


def handoffs(rigs: list[Rig], rounds: int) -> dict[str, list[float]]:
    runs = [Handoff(rig) for rig in rigs if not rig.failure]
    rng = random.Random(7)
    try:
        for run in runs:
            try:
                run.start()
            except Exception as exc:
                run.rig.failure = f"hand-off set-up failed: {why(exc)}"
        for round_no in range(rounds + WARMUP_ROUNDS):
            live = [run for run in runs if not run.rig.failure]
            rotation = round_no % max(len(live), 1)
            for run in live[rotation:] + live[:rotation]:
                try:
                    run.round(rng)
                except Exception as exc:
                    run.rig.failure = f"hand-off failed: {why(exc)}"
    finally:
        for run in runs:
            run.stop()
    return {run.rig.key: run.delays[WARMUP_ROUNDS:] for run in runs if not run.rig.failure}


# -- report ---------------------------------------------------------------------------------------


def report(args: argparse.Namespace, rigs: list[Rig], missing: dict[str, str], command: str) -> str:
    rows = uncontended(rigs, args.cycles, args.count_cycles)
    delays = handoffs(rigs, args.handoffs)
    baseline = {
        row.operation: row.us for row in rows if row.rig.key == "redis" and not row.rig.failure
    }
    version, kind = next((rig.redis for rig in rigs if rig.redis), ("-", "none"))
    lines = [
        run_line(version, kind),
        "",
        "Stores: " + "; ".join(rig.server for rig in rigs) + ".",
        "",
        f"Command: `{command}`",
        "",
        "Uncontended cost (one thread; median µs of batches of 100 cycles, the batches of "
        f"all rows interleaved; requests counted over {args.count_cycles} more cycles each, "
        "per cycle; vs Redis: the same operation on one Redis):",
        "",
        "| store | operation | µs / cycle | vs Redis | round trips / cycle | sent per cycle |",
        "|---|---|---:|---:|---:|---|",
    ]
    for key in args.stores:
        rig = next((r for r in rigs if r.key == key), None)
        if rig is None or rig.failure:
            reason = missing.get(key) or (rig.failure if rig else "not set up")
            label = rig.label if rig else LABELS[key]
            lines.append(f"| {label} | not measured | | | | {reason} |")
            continue
        for row in (r for r in rows if r.rig is rig):
            assert row.count is not None
            base = baseline.get(row.operation)
            ratio = f"{row.us / base:.2f}x" if base else ""
            trips = per_cycle(row.count.round_trips)
            if key == "redlock":
                trips += " per master"
            lines.append(
                f"| {rig.label} | {row.operation} | {row.us:.1f} | {ratio} | {trips} "
                f"| {row.count.requests} |"
            )
    lines += [
        "",
        "How requests were counted:",
        "",
        "- Redis, Redlock: `INFO commandstats` of each master, read before and after the "
        "cycles. Round trips: the script calls (EVALSHA), the only commands the client "
        "sends on this path (checked against redis-py's socket writes; a mismatch would "
        "be noted in the row); the other commands ran inside the scripts. Redlock sends "
        "each call to every master at once (one thread each): a cycle waits for that "
        "many rounds, each as slow as the slowest master it waits for."
        + (" With --url, other clients of that server are counted too." if args.url else ""),
        "- PostgreSQL: statements sent, counted by wrapping psycopg's `Cursor.execute` in "
        "this process (the lock's sessions are psycopg connections of its own, outside the "
        "engine's pool, so a SQLAlchemy `before_cursor_execute` listener sees none; "
        "`pg_stat_statements` would count every session of the server, other clients' "
        "included). In autocommit each statement is one round trip.",
        "- ZooKeeper: every request the kazoo client queues (its pings aside), by type, "
        "counted by wrapping the client's `_call`. A round trip is a request queued while "
        "no other was queued or awaiting its answer; the others were pipelined behind one.",
        "",
        f"Hand-off between processes ({args.handoffs} rounds per store after "
        f"{WARMUP_ROUNDS} warm-up rounds, the stores' rounds interleaved): this process "
        "holds the write lock, a waiter in another process blocks on it (seen queued in "
        "the store, then 10-40 ms more), this process releases; milliseconds from the "
        "release call to the waiter holding the lock.",
        "",
        "| store | the waiter is woken by | median ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|",
    ]
    for key in args.stores:
        rig = next((r for r in rigs if r.key == key), None)
        if rig is None or rig.failure or key not in delays:
            reason = missing.get(key) or (rig.failure if rig else "not set up")
            label = rig.label if rig else LABELS[key]
            lines.append(f"| {label} | not measured: {reason} | | | |")
            continue
        ms = delays[key]
        lines.append(
            f"| {rig.label} | {rig.wakes} | {statistics.median(ms):.2f} "
            f"| {percentile(ms, 0.99):.2f} | {max(ms):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000, help="timed cycles per row")
    parser.add_argument(
        "--count-cycles", type=int, default=200, help="cycles per row whose requests are counted"
    )
    parser.add_argument("--handoffs", type=int, default=40, help="hand-off rounds per store")
    parser.add_argument("--masters", type=int, default=5, help="Redlock masters")
    parser.add_argument(
        "--stores",
        default=",".join(STORES),
        help=f"comma-separated, of {', '.join(STORES)} (default: all)",
    )
    parser.add_argument("--url", help="Redis URL for the one-server store (default: throwaway)")
    parser.add_argument("--postgres-url", help="SQLAlchemy URL, postgresql+psycopg://...")
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    args = parser.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(args.stores) - set(STORES)
    if unknown or not args.stores:
        parser.error(f"--stores takes some of {', '.join(STORES)}")
    if args.cycles < 100 or args.count_cycles < 1 or args.handoffs < 1 or args.masters < 1:
        parser.error("--cycles must be >= 100, --count-cycles, --handoffs, --masters >= 1")

    command = "python bench/locks.py " + " ".join(
        [f"--cycles {args.cycles}", f"--count-cycles {args.count_cycles}"]
        + [f"--handoffs {args.handoffs}", f"--masters {args.masters}"]
        + ([f"--stores {','.join(args.stores)}"] if args.stores != list(STORES) else [])
    )
    rigs: list[Rig] = []
    missing: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for key in args.stores:
            try:
                rigs.append(stack.enter_context(RIGS[key](args)))
            except Exception as exc:  # reported in its rows; the others still run
                missing[key] = f"set-up failed: {why(exc)}"
        text = report(args, rigs, missing, command)
    print(text)
    if args.write:
        write_section(args.write, text, MARK)
        print(f"\nwritten to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
