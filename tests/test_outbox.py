"""The outbox (``track_models(..., outbox=True)``): tracked writes go on while Redis
is unreachable, their invalidations are not lost.

Real outages on a throwaway ``redis-server``: killed (connection refused),
SIGSTOPped (a partition: data kept, no replies) and black-holed by a TCP proxy;
SQLite and (DATABASE_URL) PostgreSQL; sync and asyncio guards; several processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from cacheguard_testing.deployments import OwnedRedisCluster
from sqlalchemy.orm import Session, sessionmaker

from cacheguard import MISSING, BackendUnavailable, CacheGuard
from cacheguard.cache.outage.recovery import RETRY_DELAY
from cacheguard.integrations.sqlalchemy import (
    AsyncOutboxReplayer,
    OutboxReplayer,
    async_outbox_depth,
    outbox_depth,
    outbox_table,
    track_models,
)
from cacheguard.integrations.sqlalchemy import outbox as outbox_module
from cacheguard.redis.keys import ResourceKeys
from cacheguard.testing import OwnedRedisServer, free_port
from tests import outbox_support, sa_support
from tests.faults.proxy import TcpProxy
from tests.helpers import wait_until
from tests.lock_stores import postgres_engine, postgres_url
from tests.outbox_support import FAST, AsyncOutboxStack, OutboxStack, outbox_for
from tests.procs import CTX, result_within, start_process_reporting
from tests.sa_support import MENU_KEYS

pytest_plugins = ["tests.deployment_fixtures"]

MENU_2_KEYS = {("key", "menu:list"), ("key", "menu:2"), ("key", "menu:children:1")}


@pytest.fixture
def server() -> Iterator[OwnedRedisServer]:
    """A redis-server of the test's own, to kill, stop and black-hole."""
    owned = OwnedRedisServer()
    yield owned
    if owned.proc is not None:
        os.kill(owned.proc.pid, signal.SIGCONT)  # a stopped one ends too
    owned.close()


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    name = f"menu_{uuid.uuid4().hex[:10]}"
    sa_support.create_table(db_url, name)
    yield name
    sa_support.drop_table(db_url, name)


@pytest.fixture
def outbox(db_url: str) -> Iterator[str]:
    name = f"cg_outbox_{uuid.uuid4().hex[:10]}"
    outbox_support.create_outbox(db_url, name)
    yield name
    outbox_support.drop_outbox(db_url, name)


@contextmanager
def stopped(server: OwnedRedisServer) -> Iterator[None]:
    """Redis SIGSTOPped: connections stay open, nothing is answered, data is kept."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def rows_of(connection: Any, outbox: sa.Table, namespace: str) -> set[tuple[str, str]]:
    query = sa.select(outbox.c.kind, outbox.c.name).where(outbox.c.namespace == namespace)
    return {(kind, name) for kind, name in connection.execute(query)}


# -- rows in the writer's transaction -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["killed", "blackholed"])
def test_a_tracked_write_commits_with_its_invalidations_in_the_same_transaction(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str, outage: str
) -> None:
    proxy = TcpProxy(server.port)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stack = OutboxStack(proxy.url, namespace, db_url, table, outbox, poll=3600)
    try:
        assert stack.name_of(2) == "menu 2"
        if outage == "killed":
            server.kill()
        else:
            proxy.set_mode("blackhole")

        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "soups"
            session.flush()  # no BackendUnavailable: the keys went to the outbox
            assert rows_of(session, stack.outbox, namespace) == MENU_2_KEYS
            with stack.engine.connect() as other:  # not committed: nobody else sees them
                assert rows_of(other, stack.outbox, namespace) == set()
            session.commit()
        assert stack.depth() == 3  # Redis is still unreachable: kept for a replay
        assert stack.guard.stats().outbox_writes == 3
        with stack.engine.connect() as other:
            assert rows_of(other, stack.outbox, namespace) == MENU_2_KEYS
            assert other.execute(sa.select(stack.menu.name).where(stack.menu.id == 2)).scalar() == (
                "soups"
            )

        with stack.sessions() as session:  # rolled back: its rows go with its writes
            session.get(stack.menu, 3).name = "never"
            session.flush()
            assert ("key", "menu:3") in rows_of(session, stack.outbox, namespace)
            session.rollback()
        assert stack.depth() == 3

        if outage == "killed":
            server.start()  # empty: nothing old left to serve, still replayed
        else:
            proxy.set_mode("pass")
        # A read that reaches Redis again replays first (the circuit may be open a while).
        assert wait_until(lambda: stack.name_of(2) == "soups" and stack.depth() == 0, 15)
        assert stack.guard.stats().outbox_replays == 3
    finally:
        stack.close()
        proxy.close()


def test_without_the_outbox_the_flush_still_fails_before_its_sql(
    server: OwnedRedisServer, db_url: str, table: str
) -> None:
    guard = CacheGuard.from_url(server.url, namespace=f"t{uuid.uuid4().hex[:12]}", **FAST)
    engine = sa_support.engine_for(db_url)
    sessions = sessionmaker(engine)
    menu = sa_support.menu_model(table)
    tracker = track_models(guard, sessions, {menu: MENU_KEYS})
    server.kill()
    try:
        with sessions() as session:
            session.get(menu, 2).name = "not written"
            with pytest.raises(BackendUnavailable):
                session.flush()
    finally:
        tracker.remove()
        guard.close()
        engine.dispose()


def test_a_rolled_back_savepoint_takes_its_rows_and_the_rest_commit(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stack = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600)
    try:
        server.kill()
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "kept"
            session.flush()
            savepoint = session.begin_nested()
            session.get(stack.menu, 3).name = "dropped"
            session.flush()  # menu:list and menu:children:1 are in the outbox already
            assert ("key", "menu:3") in rows_of(session, stack.outbox, namespace)
            savepoint.rollback()
            assert rows_of(session, stack.outbox, namespace) == MENU_2_KEYS
            state = session.info[stack.tracker._info_key]
            assert {n for rows in state.outboxed.values() for n in rows} == MENU_2_KEYS
            session.commit()
        assert stack.depth() == 3
    finally:
        stack.close()


@pytest.mark.slow
def test_the_closing_step_deletes_the_rows_once_redis_is_back(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    proxy = TcpProxy(server.port)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    # The circuit never opens: the closing invalidation goes to Redis.
    stack = OutboxStack(proxy.url, namespace, db_url, table, outbox, poll=3600, breaker_failures=99)
    try:
        assert stack.name_of(2) == "menu 2"
        with stack.sessions() as session:
            proxy.set_mode("blackhole")
            session.get(stack.menu, 2).name = "soups"
            session.flush()
            assert rows_of(session, stack.outbox, namespace) == MENU_2_KEYS
            proxy.set_mode("pass")
            session.commit()  # its closing invalidation goes through: its rows go
        assert stack.depth() == 0
        assert stack.guard.stats().outbox_replays == 0  # no replay was needed
        assert stack.guard.peek("menu:2") is MISSING
        assert stack.name_of(2) == "soups"
    finally:
        stack.close()
        proxy.close()


@pytest.mark.slow
async def test_an_asyncio_sessions_closing_step_deletes_its_rows_once_redis_is_back(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    proxy = TcpProxy(server.port)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stack = AsyncOutboxStack(
        proxy.url, namespace, db_url, table, outbox, poll=3600, breaker_failures=99
    )
    try:
        assert await stack.name_of(2) == "menu 2"
        async with stack.sessions() as session:
            proxy.set_mode("blackhole")
            (await session.get(stack.menu, 2)).name = "soups"
            await session.flush()
            assert await session.run_sync(rows_of, stack.outbox, namespace) == MENU_2_KEYS
            proxy.set_mode("pass")
            await session.commit()  # the delete runs in the session's greenlet
        assert await stack.depth() == 0
        assert stack.guard.stats().outbox_writes == 3
        assert stack.guard.stats().outbox_replays == 0
        assert await stack.name_of(2) == "soups"
    finally:
        await stack.close()
        proxy.close()


def test_guard_write_outside_a_tracked_session_still_raises(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    stack = OutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox)
    try:
        server.kill()
        with pytest.raises(BackendUnavailable), stack.guard.write("menu:2"):
            pytest.fail("the body must not run")  # no transaction to put a row in
    finally:
        stack.close()


# -- replay before serving -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_guard_that_saw_the_outage_replays_before_serving_from_redis(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    # Pollers off (an hour): only the replay before serving can drop the old value.
    reader = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600)
    # The writer's first failure opens its circuit for long: it sends nothing more,
    # so no command of its waits in the stopped server's buffers to run at SIGCONT.
    writer = OutboxStack(
        server.url, namespace, db_url, table, outbox, poll=3600,
        breaker_failures=1, breaker_cooldown=600,
    )  # fmt: skip
    try:
        assert reader.name_of(2) == "menu 2"  # cached in Redis
        with stopped(server):
            assert reader.name_of(2) == "menu 2"  # read from the database: it saw Redis fail
            writer.rename(2, "soups")
            assert writer.depth() == 3
        # Redis answers again, with the old value: the first read replays, then reads.
        assert reader.name_of(2) == "soups"
        assert reader.depth() == 0
        assert reader.guard.stats().outbox_replays == 3
    finally:
        writer.close()
        reader.close()


@pytest.mark.slow
async def test_an_asyncio_guard_replays_before_serving_from_redis(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    reader = AsyncOutboxStack(server.url, namespace, db_url, table, outbox, poll=3600)
    writer = AsyncOutboxStack(
        server.url, namespace, db_url, table, outbox, poll=3600,
        breaker_failures=1, breaker_cooldown=600,
    )  # fmt: skip
    try:
        assert await reader.name_of(2) == "menu 2"
        with stopped(server):
            assert await reader.name_of(2) == "menu 2"
            await writer.rename(2, "soups")
            assert await writer.depth() == 3
            assert writer.guard.stats().outbox_writes == 3
        assert await reader.name_of(2) == "soups"
        assert await reader.depth() == 0
        assert reader.guard.stats().outbox_replays == 3
        assert await async_outbox_depth(reader.engine, reader.outbox) == 0
    finally:
        await writer.close()
        await reader.close()


def test_a_guard_replays_at_start_up(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    """A process that starts after an outage has not seen it: it replays first too."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    old = CacheGuard.from_url(server.url, namespace=namespace)
    assert old.get_or_load("menu:2", lambda: "menu 2", ttl=60) == "menu 2"
    old.close()
    engine = sa_support.engine_for(db_url)
    menu = sa_support.menu_model(table)
    with engine.begin() as connection:  # as a writer that could not reach Redis left it
        connection.execute(sa.update(menu).where(menu.id == 2).values(name="soups"))
        connection.execute(
            sa.insert(outbox_for(outbox)), [{"namespace": namespace, "kind": k, "name": n}
                                            for k, n in MENU_2_KEYS]
        )  # fmt: skip
    engine.dispose()
    stack = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600)
    try:
        assert stack.guard._state.recovery.pending
        assert stack.name_of(2) == "soups"
        assert stack.depth() == 0
    finally:
        stack.close()


def test_readers_of_a_guard_whose_replay_cannot_reach_the_database_share_one_attempt(
    server: OwnedRedisServer,
) -> None:
    """The database is unreachable (nothing listens on its port), Redis is up and the
    guard pending: the readers do not each attempt the replay (one at a time, a
    connect timeout each): one attempt, its failure for all, the next after
    RETRY_DELAY. Nothing is served from Redis meanwhile."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    names = [f"menu:{i}" for i in range(8)]
    warm = CacheGuard.from_url(server.url, namespace=namespace)
    for name in names:
        warm.get_or_load(name, lambda: "cached", ttl=60)
    warm.close()
    engine = sa.create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test")
    attempts: list[int] = []
    sa.event.listen(engine, "do_connect", lambda *args: attempts.append(1))
    guard = CacheGuard.from_url(server.url, namespace=namespace, **FAST)
    offset = [0.0]
    guard._state.recovery._timer = lambda: time.monotonic() + offset[0]  # the retry delay's clock
    tracker = track_models(
        guard,
        sessionmaker(engine),
        {sa_support.menu_model("menu_unreachable"): MENU_KEYS},
        outbox=outbox_for("cg_outbox_unreachable"),
        outbox_poll=3600,
    )
    try:
        results: dict[str, object] = {}
        readers = [
            threading.Thread(
                target=lambda name=name: results.update(
                    {name: guard.get_or_load(name, lambda: "loaded", ttl=60)}
                )
            )
            for name in names
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
        assert results == {name: "loaded" for name in names}  # none served from Redis
        assert guard.stats().replay_failures == len(names)
        assert len(attempts) == 1  # one attempt, not one per reader
        assert guard.get_or_load("menu:0", lambda: "loaded", ttl=60) == "loaded"
        assert len(attempts) == 1  # within the retry delay: not tried again
        offset[0] += RETRY_DELAY
        assert guard.get_or_load("menu:0", lambda: "loaded", ttl=60) == "loaded"
        assert len(attempts) == 2
    finally:
        tracker.remove()
        guard.close()
        engine.dispose()


# SQLite's write lock is the whole database's: PostgreSQL has none to wait for.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_sqlite_transaction_reading_through_a_pending_guard_does_not_wait_for_itself(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    """On SQLite the transaction holds the database's write lock: the replay its read
    runs does not wait for it (until the busy timeout) to delete the replayed rows;
    they stay, invalidated, for a later replay."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stack = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600)
    try:
        assert stack.name_of(1) == "menu 1"
        assert stack.name_of(3) == "menu 3"
        with stack.engine.begin() as connection:  # an earlier write's row
            connection.execute(sa.insert(stack.outbox), [
                {"namespace": namespace, "kind": "key", "name": "menu:3"}
            ])  # fmt: skip
        stack.guard._state.recovery.mark()  # this guard saw Redis fail
        before = stack.guard.stats()
        with stack.sessions.begin() as session:
            session.get(stack.menu, 2).name = "soups"
            session.flush()  # the write lock is this transaction's now
            assert stack.name_of(1) == "menu 1"
        after = stack.guard.stats()
        assert after.replay_failures == before.replay_failures  # replayed, not failed
        assert after.l2_hits == before.l2_hits + 1  # and served from Redis
        assert stack.guard.peek("menu:3") is MISSING  # invalidated
        assert stack.depth() == 1  # the row stays: a later replay deletes it
        assert OutboxReplayer(stack.guard, stack.engine, stack.outbox).replay() == 1
        assert stack.depth() == 0
    finally:
        stack.close()


@pytest.fixture
def postgres_reachable() -> Iterator[None]:
    """PostgreSQL answers (a failure under CACHEGUARD_REQUIRE_REDIS, else a skip)."""
    with postgres_engine():
        yield


# Row locks are PostgreSQL's: this test runs there only (SQLite has none to wait for).
@pytest.mark.parametrize("db_url", [pytest.param(postgres_url(), id="postgresql")], indirect=True)
def test_a_replay_waits_for_the_rows_another_replayer_holds(
    postgres_reachable: None, server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    """PostgreSQL: a replay skips the rows another replayer has locked, then waits for
    them: if that replayer fails (a process cut off from Redis), they are replayed
    here before anything is served, never skipped."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    # The replay waits at most wait_timeout: longer than the test holds the rows.
    stack = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600, wait_timeout=60)
    other = stack.engine.connect()  # another process's replayer, mid-invalidation
    try:
        assert stack.name_of(2) == "menu 2"  # cached; the start-up replay ran
        with stack.engine.begin() as connection:  # a write that went to the outbox
            connection.execute(sa.update(stack.menu).where(stack.menu.id == 2).values(name="soups"))
            rows = [{"namespace": namespace, "kind": k, "name": n} for k, n in MENU_2_KEYS]
            connection.execute(sa.insert(stack.outbox), rows)
        locking = other.begin()
        held = other.execute(
            sa.select(stack.outbox.c.id).where(stack.outbox.c.namespace == namespace)
            .with_for_update()
        ).all()  # fmt: skip
        assert len(held) == 3
        stack.guard._state.recovery.mark()  # this guard saw Redis fail
        read: list[str | None] = []
        reader = threading.Thread(target=lambda: read.append(stack.name_of(2)))
        reader.start()
        waiting = sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE :outbox"
        )

        def replay_waits() -> bool:  # a transaction per look: PostgreSQL caches the view in one
            with stack.engine.connect() as probe:
                return bool(probe.execute(waiting, {"outbox": f"%{outbox}%"}).scalar_one())

        assert wait_until(replay_waits, 10), "the replay did not wait for the held rows"
        assert read == []  # nothing served while they are held
        locking.rollback()  # that replayer failed: its rows are this one's now
        reader.join(10)
        assert read == ["soups"]
        assert stack.depth() == 0
    finally:
        other.close()  # (rolls back: the tables can be dropped)
        stack.close()


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
@pytest.mark.parametrize("db_url", [pytest.param(postgres_url(), id="postgresql")], indirect=True)
def test_a_replay_waits_for_held_rows_at_most_wait_timeout(
    postgres_reachable: None, server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    """Another replayer holds the rows and does not let go (a frozen process): the
    read does not wait for it past wait_timeout; it is not served from Redis."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stack = OutboxStack(server.url, namespace, db_url, table, outbox, poll=3600, wait_timeout=0.5)
    other = stack.engine.connect()
    try:
        assert stack.name_of(2) == "menu 2"
        with stack.engine.begin() as connection:
            connection.execute(sa.update(stack.menu).where(stack.menu.id == 2).values(name="soups"))
            rows = [{"namespace": namespace, "kind": k, "name": n} for k, n in MENU_2_KEYS]
            connection.execute(sa.insert(stack.outbox), rows)
        locking = other.begin()
        other.execute(
            sa.select(stack.outbox.c.id).where(stack.outbox.c.namespace == namespace)
            .with_for_update()
        ).all()  # fmt: skip
        stack.guard._state.recovery.mark()
        read: list[str | None] = []
        reader = threading.Thread(target=lambda: read.append(stack.name_of(2)), daemon=True)
        reader.start()
        reader.join(20)  # (a deadline for a broken bound, not a speed test)
        assert not reader.is_alive(), "the read waited for the held rows past wait_timeout"
        assert read == ["soups"]  # loaded: the cached "menu 2" is not served
        assert stack.guard.stats().replay_failures == 1
        assert stack.depth() == 3
        locking.rollback()  # that replayer is gone: the next replay (after the delay) takes them
        assert wait_until(lambda: stack.name_of(2) == "soups" and stack.depth() == 0, 10)
        assert stack.guard.stats().outbox_replays == 3
    finally:
        other.close()
        stack.close()


# -- a cluster with a shard down ------------------------------------------------------------------


@pytest.mark.slow
def test_a_dead_shards_rows_wait_while_the_other_shards_keys_are_served_from_redis(
    redis_server_binary: str, db_url: str, outbox: str
) -> None:
    """A cluster master is paused (SIGSTOP: its data is kept) and a tracked write of a
    key it serves goes to the outbox: the replay invalidates the other shards' keys
    and leaves that shard's rows waiting (its keys' reads bypass Redis), so the
    other shards' keys are still served from Redis. Once the shard answers again,
    its rows are replayed: the value it kept is not served."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    table = f"menu_{uuid.uuid4().hex[:10]}"
    sa_support.create_table(db_url, table, rows=30)
    cluster = OwnedRedisCluster(masters=3, replicas_per_master=0)
    stack: OutboxStack | None = None
    paused: int | None = None
    try:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
        stack = OutboxStack(
            url, namespace, db_url, table, outbox, poll=3600,
            breaker_failures=1, breaker_cooldown=1,
        )  # fmt: skip

        def port_of(name: str) -> int:
            return cluster.master_for_key(ResourceKeys(namespace, name).value).port

        sequence = cluster.master_for_key(f"{namespace}:wm").port
        doomed = next(i for i in range(2, 31) if port_of(f"menu:{i}") != sequence)
        down = port_of(f"menu:{doomed}")
        written = {f"menu:{doomed}", "menu:list", "menu:children:1"}
        waits = {("key", name) for name in written if port_of(name) == down}
        healthy = [i for i in range(2, 31) if port_of(f"menu:{i}") != down][:8]
        for menu_id in [doomed, *healthy]:
            assert stack.name_of(menu_id) == f"menu {menu_id}"  # cached
        pid = next(node.pid for node in cluster.nodes if node.port == down)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        paused = pid
        assert stack.name_of(doomed) == f"menu {doomed}"  # its circuit opens: loaded
        stack.rename(doomed, "soups")
        assert stack.depth() >= len(waits)
        before = stack.guard.stats()
        for _ in range(3):
            for menu_id in healthy:
                assert stack.name_of(menu_id) == f"menu {menu_id}"
        after = stack.guard.stats()
        assert after.replay_failures == before.replay_failures
        assert after.l2_hits - before.l2_hits == 3 * len(healthy)  # served from Redis
        with stack.engine.connect() as connection:
            assert rows_of(connection, stack.outbox, namespace) == waits  # the others replayed

        os.kill(pid, signal.SIGCONT)
        paused = None
        with redis.Redis(port=down) as direct:  # the shard kept the old value
            assert direct.exists(ResourceKeys(namespace, f"menu:{doomed}").value) == 1
        # (A guard replays before it serves once the circuit closes; here the
        # replay is called directly, as the poller would.)
        replayer = OutboxReplayer(stack.guard, stack.engine, stack.outbox)
        assert wait_until(lambda: replayer.replay() >= 0 and stack.depth() == 0, 30)
        assert stack.name_of(doomed) == "soups"
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        if stack is not None:
            stack.close()
        cluster.close()
        sa_support.drop_table(db_url, table)


# -- a partial partition: the timer ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["sync", "asyncio"])
def test_a_process_that_never_saw_the_outage_stops_serving_the_old_value_within_the_poll(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str, reader: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    proxy = TcpProxy(server.port)
    writer = OutboxStack(
        proxy.url, namespace, db_url, table, outbox, poll=3600,
        breaker_failures=1, breaker_cooldown=600,
    )  # fmt: skip
    warmed = CTX.Event()
    body = (
        outbox_support.serve_until_new if reader == "sync" else outbox_support.serve_until_new_async
    )
    deadline = 30.0
    child, results = start_process_reporting(
        body, server.url, namespace, db_url, table, outbox, warmed, "soups", deadline
    )
    try:
        assert warmed.wait(30), "the reader did not start"
        time.sleep(random.random())  # the commit lands anywhere in the reader's poll period
        proxy.set_mode("blackhole")  # only the writer's path to Redis is cut
        writer.rename(2, "soups")
        committed = time.time()
        assert writer.depth() == 3
        seen_at, _reads = result_within(results, deadline + 30, "the reader")
        assert seen_at is not None, f"the reader served the old value for {deadline} s"
        lag = seen_at - committed
        print(f"\n{reader} reader stopped serving the old value {lag:.2f} s after the commit")
        assert lag < 1.0 + 15.0  # outbox_poll + one replay, with a generous margin
        assert wait_until(lambda: writer.depth() == 0, 10)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
        writer.close()
        proxy.close()


# -- several replayers -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_replayers_in_several_processes_replay_every_row_once_removed(
    server: OwnedRedisServer, db_url: str, outbox: str, driver: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    guard = CacheGuard.from_url(server.url, namespace=namespace)
    keys = [f"menu:{i}" for i in range(300)]
    under_prefix = [f"menu:children:{i}" for i in range(20)]
    for name in keys + under_prefix:
        guard.get_or_load(name, lambda: "old", ttl=600)
    rows = [{"namespace": namespace, "kind": "key", "name": name} for name in keys]
    rows.append({"namespace": namespace, "kind": "prefix", "name": "menu:children:"})
    rows.append({"namespace": "another", "kind": "key", "name": "menu:1"})  # not ours
    engine = sa_support.engine_for(db_url)
    table = outbox_for(outbox)
    with engine.begin() as connection:
        connection.execute(sa.insert(table), rows)
    go = CTX.Event()
    replay = outbox_support.replay_when_told
    body = replay if driver == "sync" else outbox_support.replay_when_told_async
    args = (server.url, namespace, db_url, outbox, go, 25)
    procs = [start_process_reporting(body, *args) for _ in range(4)]
    try:
        go.set()
        counts = [result_within(results, 90, "a replayer") for _, results in procs]
        print(f"\nrows replayed by each process: {counts}")
        if engine.dialect.name == "postgresql":
            assert sum(counts) == len(keys) + 1  # SKIP LOCKED: each row claimed once
        else:
            assert sum(counts) >= len(keys) + 1  # replayed twice at worst: harmless
        assert outbox_depth(engine, table, namespace=namespace) == 0
        assert outbox_depth(engine, table) == 1  # the other namespace's row stays
        assert all(guard.peek(name) is MISSING for name in keys + under_prefix)
    finally:
        for proc, _ in procs:
            proc.join(10)
        guard.close()
        engine.dispose()


# -- churn: no invalidation lost -----------------------------------------------------------


@pytest.mark.slow
def test_writes_during_an_outage_lose_no_invalidation(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    ids = [1, 2, 3]
    engine = sa_support.engine_for(db_url)
    menu = sa_support.menu_model(table)
    with engine.begin() as connection:
        connection.execute(sa.update(menu).values(name="v0"))
    writer = OutboxStack(
        server.url, namespace, db_url, table, outbox, poll=3600,
        breaker_failures=1, breaker_cooldown=600,
    )  # fmt: skip
    started = [CTX.Event() for _ in range(3)]
    stop = CTX.Event()
    readers = [
        start_process_reporting(
            outbox_support.read_versions,
            server.url,
            namespace,
            db_url,
            table,
            outbox,
            ids,
            ready,
            stop,
        )
        for ready in started
    ]
    committed: list[tuple[float, int, int]] = []  # (monotonic end of commit, id, version)
    try:
        assert all(ready.wait(60) for ready in started), "a reader did not start"
        time.sleep(0.5)  # readers serve cached values for a while
        version = 0
        with stopped(server):
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                version += 1
                menu_id = ids[version % len(ids)]
                writer.rename(menu_id, f"v{version}")
                committed.append((time.monotonic(), menu_id, version))
            assert writer.depth() > 0
        assert wait_until(lambda: writer.depth() == 0, 20), "the outbox was not replayed"
        replayed = time.monotonic()
        time.sleep(1.5)  # readers go on after the replay
        stop.set()
        reads = [read for _, results in readers for read in result_within(results, 60, "a reader")]
    finally:
        stop.set()
        for proc, _ in readers:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        writer.close()
        engine.dispose()
    latest = {menu_id: max(v for _, i, v in committed if i == menu_id) for menu_id in ids}
    after = [(begun, i, v) for begun, i, v in reads if begun > replayed]
    stale = [(i, v, latest[i]) for _, i, v in after if v < latest[i]]
    print(
        f"\n{len(committed)} writes during the outage ({version} versions), {len(reads)} reads, "
        f"{len(after)} after the replay, {len(stale)} stale"
    )
    assert len(committed) >= 3
    assert len(after) >= 30
    assert stale == []


# -- the poller, the hook, configuration ----------------------------------------------------------


@pytest.mark.slow
def test_an_empty_outbox_costs_one_indexed_query_per_poll(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    stack = OutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox, poll=0.05)
    statements: list[str] = []
    lock = threading.Lock()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        with lock:
            statements.append(" ".join(statement.split()))

    sa.event.listen(stack.engine, "before_cursor_execute", record)
    try:
        assert wait_until(lambda: len(statements) >= 5, 10)
    finally:
        sa.event.remove(stack.engine, "before_cursor_execute", record)
        stack.close()
    with lock:  # (sqlite_engine sends BEGIN itself, for its snapshots: a local no-op)
        seen = [s for s in statements if s != "BEGIN"]
    assert all(s.startswith(f"SELECT {outbox}.id FROM {outbox} WHERE") for s in seen), seen
    assert all("LIMIT" in s and "FOR UPDATE" not in s for s in seen), seen


def test_remove_and_close_stop_the_poller_and_unregister_the_replay(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    stack = OutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox, poll=0.05)
    poller = stack.tracker._outbox._poller  # type: ignore[union-attr]
    assert poller._thread is not None
    assert poller._thread.is_alive()
    assert len(stack.guard._state.recovery.hooks) == 1
    stack.tracker.remove()
    assert not poller._thread.is_alive()
    assert stack.guard._state.recovery.hooks == ()
    stack.guard.close()
    stack.engine.dispose()

    other = OutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox, poll=0.05)
    thread = other.tracker._outbox._poller._thread  # type: ignore[union-attr]
    try:
        other.guard.close()
        assert wait_until(lambda: not thread.is_alive(), 5)
    finally:
        other.close()


def test_the_asyncio_poller_starts_on_the_loop_and_aclose_cancels_it(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    # Made outside any event loop (at import time, say): no task yet.
    stack = AsyncOutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox)
    poller = stack.tracker._outbox._poller  # type: ignore[union-attr]
    assert poller._task is None

    async def use() -> None:
        assert await stack.name_of(2) == "menu 2"  # the start-up replay starts it
        task = poller._task
        assert task is not None
        assert not task.done()
        await stack.guard.aclose()
        assert task.done()
        await stack.close()

    asyncio.run(use())


def test_the_asyncio_poller_starts_only_on_the_loop_the_guard_is_bound_to(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    stack = AsyncOutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox)
    tracked = stack.tracker._outbox
    assert tracked is not None
    poller = tracked._poller
    assert isinstance(poller, outbox_module._TaskPoller)

    async def elsewhere() -> None:  # a loop the guard is never used on
        tracked.touch()
        assert poller._task is None

    asyncio.run(elsewhere())

    async def use() -> None:
        tracked.touch()
        assert poller._task is None  # not bound yet: the loop may not be the guard's
        assert await stack.name_of(2) == "menu 2"  # bound now; the replay starts it
        assert poller._task is not None
        assert not poller._task.done()
        await stack.close()

    asyncio.run(use())


def _forked_child_polls(queue: Any, stack: OutboxStack) -> None:
    stack.engine.dispose(close=False)  # the parent's connections stay the parent's
    names = [t.name for t in threading.enumerate()]
    pending = stack.guard._state.recovery.pending
    stack.name_of(2)  # the first read replays, which starts the child's poller
    thread = stack.tracker._outbox._poller._thread  # type: ignore[union-attr]
    queue.put((names, pending, thread is not None and thread.is_alive()))


def test_a_forked_child_starts_its_own_poller(
    server: OwnedRedisServer, db_url: str, table: str, outbox: str
) -> None:
    stack = OutboxStack(server.url, f"t{uuid.uuid4().hex[:12]}", db_url, table, outbox, poll=0.05)
    fork = mp.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_forked_child_polls, args=(queue, stack))
    try:
        child.start()
        names, pending, polling = queue.get(timeout=30)
        assert "cacheguard-outbox" not in names  # the parent's thread is not the child's
        assert pending
        assert polling
    finally:
        child.join(10)
        stack.close()


def test_bad_outbox_configurations_are_refused(db_url: str, table: str) -> None:
    guard = CacheGuard.from_url("redis://127.0.0.1:1/0", namespace="t-config")
    engine = sa_support.engine_for(db_url)
    menu = sa_support.menu_model(table)
    models = {menu: MENU_KEYS}
    try:

        class Unbound(Session):
            pass

        with pytest.raises(ValueError, match="outbox_bind"):
            track_models(guard, Unbound, models, outbox=True)
        with pytest.raises(TypeError, match="Engine"):
            track_models(guard, sessionmaker(engine), models, outbox=True, outbox_bind="db")
        with pytest.raises(ValueError, match="outbox_poll"):
            track_models(guard, sessionmaker(engine), models, outbox=True, outbox_poll=0)
        odd = sa.Table("odd", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
        with pytest.raises(ValueError, match="outbox_table"):
            track_models(guard, sessionmaker(engine), models, outbox=odd)
        with pytest.raises(TypeError, match="AsyncCacheGuard"):
            AsyncOutboxReplayer(guard, engine)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Engine"):
            OutboxReplayer(guard, "db")  # type: ignore[arg-type]
        assert guard._state.recovery.hooks == ()  # nothing half-installed
    finally:
        guard.close()
        engine.dispose()


def test_the_table_has_its_index_on_both_databases(db_url: str) -> None:
    name = f"cg_outbox_{uuid.uuid4().hex[:10]}"
    table = outbox_table(sa.MetaData(), name)
    engine = sa_support.engine_for(db_url)
    try:
        table.create(engine)
        indexes = sa.inspect(engine).get_indexes(name)
        assert [(i["name"], i["column_names"]) for i in indexes] == [
            (f"{name}_namespace_id", ["namespace", "id"])
        ]
        with engine.begin() as connection:
            connection.execute(sa.insert(table), [{"namespace": "n", "kind": "key", "name": "a"}])
            row = connection.execute(sa.select(table)).one()
            assert row.id >= 1
            assert row.created_at is not None
            strange = [{"namespace": "n", "kind": "other", "name": "a"}]
            with pytest.raises(sa.exc.IntegrityError), connection.begin_nested():
                connection.execute(sa.insert(table), strange)  # kinds are checked
        assert outbox_depth(engine, table, namespace="n") == 1
    finally:
        table.drop(engine, checkfirst=True)
        engine.dispose()
