"""PostgresRWLock's own faults and features, on the real PostgreSQL (the common rules
are in tests/test_lock_contract.py): a session terminated by the server, a SIGKILLed
holder process, key derivation, the transaction-scoped locks, failed acquisitions,
deadlocks, fork, connections per owner."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cacheguard.exceptions import (
    BackendUnavailable,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
)
from cacheguard.locks.postgres import rwlock as postgres
from cacheguard.locks.postgres.async_rwlock import AsyncPostgresRWLock, close_idle_async_connections
from cacheguard.locks.postgres.rwlock import (
    PostgresLockHandle,
    PostgresRWLock,
    advisory_key,
    key_parts,
)
from cacheguard.testing import free_port
from tests.lock_stores import (
    postgres_engine,
    postgres_lock,
    postgres_url,
    postgres_writer_waiting,
)
from tests.procs import CTX, run_processes, start_process

# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[sqlalchemy.Engine]:
    with postgres_engine() as built:
        yield built


@pytest.fixture(scope="module")
def fence(engine: sqlalchemy.Engine) -> Iterator[str]:
    """A fencing sequence of this module's own (made on first use, dropped afterwards)."""
    name = f"cg_test_fence_{uuid.uuid4().hex[:8]}"
    yield name
    _drop(engine, f"DROP SEQUENCE IF EXISTS {name}")


@pytest.fixture
def make(engine: sqlalchemy.Engine, fence: str) -> Callable[..., PostgresRWLock]:
    """``make(name, **options)``: a lock in a namespace no other test uses."""
    namespace = f"t{uuid.uuid4().hex[:12]}"

    def build(name: str, **options: Any) -> PostgresRWLock:
        options.setdefault("fence_sequence", fence)
        return PostgresRWLock(engine, name, namespace=namespace, **options)

    return build


def _drop(engine: sqlalchemy.Engine, statement: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(statement))


def _in_thread(work: Callable[[], Any]) -> Callable[[float], Any]:
    """Run ``work`` as another owner; returns ``result(timeout)``: its value or exception."""
    done = threading.Event()
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(work())
        except Exception as exc:
            box.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()

    def result(timeout: float) -> Any:
        assert done.wait(timeout), f"the other owner did not finish within {timeout} s"
        return box[0]

    return result


def _held(context: Any) -> str:
    with context:
        return "held"


def _try_write(lock: PostgresRWLock) -> bool:
    """From another owner: could it take the write lock right now?"""

    def attempt() -> bool:
        handle = lock.try_acquire_write()
        if handle is None:
            return False
        handle.release()
        return True

    result: bool = _in_thread(attempt)(10)
    return result


def _holder_pids(engine: sqlalchemy.Engine, key: int) -> set[int]:
    classid, objid = key_parts(key)
    query = text(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = CAST(:c AS oid) AND objid = CAST(:o AS oid) AND objsubid = 1"
    )
    with engine.connect() as conn:
        return {row[0] for row in conn.execute(query, {"c": classid, "o": objid})}


def _wait_until_a_writer_waits(engine: sqlalchemy.Engine, key: int) -> None:
    deadline = time.monotonic() + 10
    while not postgres_writer_waiting(engine, key):  # a condition polled with a deadline
        assert time.monotonic() < deadline, "the writer never queued"
        time.sleep(0.01)


def _terminate(engine: sqlalchemy.Engine, pid: int) -> None:
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()


# -- keys -------------------------------------------------------------------------------------


def test_keys_are_pinned() -> None:
    # Processes of different versions must agree on keys, or their locks never meet:
    # the derivation may not change.
    assert advisory_key("cg", "menu:7") == 2041270108117288875
    assert advisory_key("ab", "c") == 4151143824720978099


def test_distinct_names_get_distinct_keys() -> None:
    names = [f"menu:{i}" for i in range(20_000)] + ["", "é", "\udcff", "menu:7 "]
    keys = {advisory_key("cg", name) for name in names}
    assert len(keys) == len(names)
    # The namespace counts, and the boundary between namespace and name does too.
    assert advisory_key("cg", "menu:7") != advisory_key("cg2", "menu:7")
    assert advisory_key("ab", "c") != advisory_key("a", "bc")
    assert all(-(2**63) <= key < 2**63 for key in keys)


def _keys_of(names: list[str]) -> list[int]:
    return [advisory_key("cg", name) for name in names]


@pytest.mark.slow
def test_the_same_name_gets_the_same_key_in_another_process() -> None:
    names = ["menu:7", "menu:list", "ü:{x}"]
    [theirs] = run_processes(_keys_of, [[names]])
    assert theirs == _keys_of(names)


def test_key_parts_name_the_lock_as_pg_locks_shows_it(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    lock = make("menu:7")
    negative = next(make(f"n{i}") for i in range(64) if make(f"n{i}").key < 0)
    for each in (lock, negative):
        with each.write(timeout=5):
            assert len(_holder_pids(engine, each.key)) == 1
        assert not _holder_pids(engine, each.key)


# -- sessions ---------------------------------------------------------------------------------


def test_an_owner_holds_all_its_locks_on_one_connection(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    locks = [make(f"menu:{i}") for i in range(3)]
    handles = [lock.acquire_write(timeout=5) for lock in locks]
    pids = set().union(*(_holder_pids(engine, lock.key) for lock in locks))
    other = _in_thread(lambda: _holder_pids_while_holding(engine, make("menu:other")))(10)
    for handle in handles:
        handle.release()
    assert len(pids) == 1
    assert other
    assert not other & pids


def _holder_pids_while_holding(engine: sqlalchemy.Engine, lock: PostgresRWLock) -> set[int]:
    with lock.write(timeout=5):
        return _holder_pids(engine, lock.key)


def test_a_terminated_session_frees_the_lock_and_its_handles_report_it(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    lost = threading.Event()
    lock = make("menu:7", on_lost=lambda handle: lost.set())
    outer = lock.acquire_write(timeout=5)
    inner = lock.acquire_write(timeout=5)
    [pid] = _holder_pids(engine, lock.key)
    _terminate(engine, pid)
    # The watch notices without a query of ours, before anyone releases.
    assert lost.wait(5), "the terminated session's handle was never marked lost"
    assert outer.lost
    assert inner.lost
    # PostgreSQL freed the lock with the session: another owner gets it.
    newcomer = make("menu:7").acquire_write  # (another thread below: another owner)
    holder: list[PostgresLockHandle] = []
    taken = threading.Event()
    let_go = threading.Event()

    def hold() -> None:
        holder.append(newcomer(timeout=5))
        taken.set()
        let_go.wait(30)
        holder[0].release()

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(10)
    for handle in (inner, outer):
        with pytest.raises(LockLostError, match="menu:7"):
            handle.release()
    # The old handles' releases left the new holder alone.
    assert not _try_write(make("menu:7"))
    let_go.set()
    # And the owner whose session ended simply starts a new one.
    with lock.write(timeout=10) as again:
        assert not again.lost


def test_release_reports_a_lost_session_even_unwatched(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres.SessionWatch, "add", lambda self, session: None)
    lock = make("menu:7")
    handle = lock.acquire_write(timeout=5)
    [pid] = _holder_pids(engine, lock.key)
    _terminate(engine, pid)
    assert _in_thread(lambda: _held(make("menu:7").write(timeout=10)))(20) == "held"
    assert not handle.lost  # nobody looked yet
    with pytest.raises(LockLostError):
        handle.release()


def test_a_reentry_on_an_ended_session_starts_afresh(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres.SessionWatch, "add", lambda self, session: None)
    lock = make("menu:7")
    first = lock.acquire_write(timeout=5)
    [pid] = _holder_pids(engine, lock.key)
    _terminate(engine, pid)
    _in_thread(lambda: _held(make("menu:7").write(timeout=10)))(20)  # the session is gone
    # A reentry would be counted locally; the dead session is noticed instead.
    second = lock.acquire_write(timeout=5)
    assert first.lost
    assert not second.lost
    assert not _try_write(make("menu:7"))  # really held at the server
    second.release()
    with pytest.raises(LockLostError):
        first.release()


def test_a_lock_session_is_never_ended_by_server_timeouts_and_probes_its_client(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    # Engines (or roles) may set timeouts that would end a session holding a lock.
    strict = sqlalchemy.create_engine(
        engine.url, connect_args={"options": "-c statement_timeout=100 -c idle_session_timeout=100"}
    )
    try:
        lock = PostgresRWLock(strict, "menu:7", namespace=make("x").namespace)
        with lock.write(timeout=5) as handle, handle.session.use:  # (the watch keeps off)
            conn = handle.session.conn
            assert conn is not None
            settings = dict(conn.execute("SELECT name, setting FROM pg_settings").fetchall())
        assert settings["statement_timeout"] == "0"
        assert settings["idle_session_timeout"] == "0"
        # A vanished client (host down, network cut) is found by TCP keepalives.
        probes = [int(settings[f"tcp_keepalives_{part}"]) for part in ("idle", "interval", "count")]
        assert all(probes)
        assert probes[0] + probes[1] * probes[2] <= postgres.KEEPALIVE_WITHIN
    finally:
        postgres.close_idle_connections(strict)
        strict.dispose()


def _hold_until_killed(url: str, namespace: str, fence: str, name: str, ready: Any) -> None:
    postgres_lock(url, namespace, fence, name).acquire_write(10)
    ready.set()
    threading.Event().wait()


@pytest.mark.slow
def test_a_sigkilled_holder_hands_the_lock_to_a_waiting_process(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock], fence: str
) -> None:
    lock = make("menu:7")
    ready = CTX.Event()
    child = start_process(
        _hold_until_killed, postgres_url(), lock.namespace, fence, "menu:7", ready
    )
    try:
        assert ready.wait(30), "the child never took the lock"
        waiting = _in_thread(lambda: _held(make("menu:7").write(timeout=30)))
        _wait_until_a_writer_waits(engine, lock.key)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        assert waiting(40) == "held"
    finally:
        child.kill()
        child.join(10)


@pytest.mark.slow
def test_a_wait_ends_at_its_deadline(make: Callable[..., PostgresRWLock]) -> None:
    with make("menu:7").write(timeout=5):
        for take in ("read", "write"):
            waited = _in_thread(
                lambda take=take: _held(getattr(make("menu:7"), take)(timeout=0.3))
            )(5)
            assert isinstance(waited, LockTimeout), take
            assert isinstance(waited.__cause__, psycopg.errors.LockNotAvailable)


def test_a_failed_acquire_leaves_no_hold_behind(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    # A "sequence" that is a table: nextval fails *after* the lock was granted, and a
    # session lock outlives its statement's error unless it is undone.
    table = f"cg_not_a_sequence_{uuid.uuid4().hex[:8]}"
    _drop(engine, f"CREATE TABLE {table} (x int)")
    try:
        lock = make("menu:7", fence_sequence=table)
        with pytest.raises(BackendUnavailable, match="menu:7"):
            lock.acquire_write(timeout=5)
        assert not _holder_pids(engine, lock.key)  # (nor a parked connection holding it)
        assert _try_write(make("menu:7"))
        with lock.read(timeout=5):  # the owner's session is still good
            pass
    finally:
        _drop(engine, f"DROP TABLE {table}")


def test_a_missing_fence_sequence_is_made_on_first_use(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    sequence = f"cg_new_fence_{uuid.uuid4().hex[:8]}"
    try:
        lock = make("menu:7", fence_sequence=sequence)
        tokens = []
        for _ in range(2):
            with lock.write(timeout=5) as handle:
                tokens.append(handle.token)
        with engine.begin() as conn:
            tokens.append(lock.write_in(conn).token)
        assert tokens == [1, 2, 3]
        _drop(engine, f"DROP SEQUENCE {sequence}")
        with engine.begin() as conn:  # the transaction-scoped path makes it too
            assert lock.write_in(conn).token == 1
    finally:
        _drop(engine, f"DROP SEQUENCE IF EXISTS {sequence}")


def _interrupting_create_sequence(
    monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException], *, asynchronous: bool
) -> None:
    """Make the next CREATE SEQUENCE raise ``interrupt`` (the lock is granted by then)."""
    kind = psycopg.AsyncConnection if asynchronous else psycopg.Connection
    original = kind.execute

    def creating(query: Any) -> bool:
        return "CREATE SEQUENCE" in (query if isinstance(query, str) else repr(query))

    if asynchronous:

        async def aexecute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if creating(query):
                raise interrupt()
            return await original(self, query, *args, **kwargs)

        monkeypatch.setattr(kind, "execute", aexecute)
    else:

        def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if creating(query):
                raise interrupt()
            return original(self, query, *args, **kwargs)

        monkeypatch.setattr(kind, "execute", execute)


def test_an_interrupt_while_making_the_fence_sequence_leaves_no_lock_behind(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock], monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = f"cg_new_fence_{uuid.uuid4().hex[:8]}"
    lock = make("menu:7", fence_sequence=sequence)
    _interrupting_create_sequence(monkeypatch, KeyboardInterrupt, asynchronous=False)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire_write(timeout=5, owner="interrupted")
    monkeypatch.undo()
    assert _holder_pids(engine, lock.key) == set()  # granted, then let go again
    with make("menu:7", fencing=False).write(timeout=5, owner="next"):
        pass


async def test_a_cancel_while_making_the_fence_sequence_leaves_no_lock_behind(
    engine: sqlalchemy.Engine,
    amake: Callable[..., AsyncPostgresRWLock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sequence = f"cg_new_fence_{uuid.uuid4().hex[:8]}"
    lock = amake("menu:7", fence_sequence=sequence)
    _interrupting_create_sequence(monkeypatch, asyncio.CancelledError, asynchronous=True)
    with pytest.raises(asyncio.CancelledError):
        await lock.acquire_write(timeout=5, owner="cancelled")
    monkeypatch.undo()
    assert _holder_pids(engine, lock.key) == set()


def test_without_fencing_tokens_are_zero(make: Callable[..., PostgresRWLock]) -> None:
    lock = make("menu:7", fencing=False)
    with lock.write(timeout=5) as handle:
        assert handle.token == 0


@pytest.mark.slow
def test_a_deadlock_between_owners_ends_in_lock_timeout_for_one(
    make: Callable[..., PostgresRWLock],
) -> None:
    first_held, second_held = threading.Event(), threading.Event()

    def cross(mine: str, theirs: str, held: threading.Event, other: threading.Event) -> str:
        with make(mine).write(timeout=5):
            held.set()
            assert other.wait(10)
            with make(theirs).write(timeout=20):
                return "both"

    one = _in_thread(lambda: cross("a", "b", first_held, second_held))
    two = _in_thread(lambda: cross("b", "a", second_held, first_held))
    outcomes = [one(40), two(40)]
    # The server breaks the cycle (deadlock_timeout): one gives up, the other gets in.
    assert "both" in outcomes
    [error] = [outcome for outcome in outcomes if outcome != "both"]
    assert isinstance(error, LockTimeout)
    assert isinstance(error.__cause__, psycopg.errors.DeadlockDetected)


def test_an_unreachable_server_raises_backend_unavailable() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    dead = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 2})
    lock = PostgresRWLock(dead, "menu:7")
    with pytest.raises(BackendUnavailable, match="menu:7"):
        lock.acquire_write(timeout=5)
    with pytest.raises(BackendUnavailable, match="menu:7"):
        lock.try_acquire_read()


def test_bad_arguments_are_refused(engine: sqlalchemy.Engine, tmp_path: Any) -> None:
    sqlite = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with pytest.raises(TypeError, match="psycopg"):
        PostgresRWLock(sqlite, "menu:7")
    with pytest.raises(TypeError, match="Engine"):
        PostgresRWLock(object(), "menu:7")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        PostgresRWLock(engine, "")
    with pytest.raises(ValueError, match="fence_sequence"):
        PostgresRWLock(engine, "menu:7", fence_sequence="x; DROP TABLE y")
    with pytest.raises(ValueError, match="timeout"):
        PostgresRWLock(engine, "menu:7").acquire_write(timeout=0)


# -- fork ----------------------------------------------------------------------------------------


def _in_forked_child(handle: PostgresLockHandle, lock: PostgresRWLock, report: Any) -> None:
    try:
        handle.release()
        report.send("released the parent's hold")
    except LockNotHeldError:
        try:
            lock.acquire_write(timeout=0.3)
            report.send("got the parent's lock")
        except LockTimeout:
            report.send("ok")
    except BaseException as exc:
        report.send(repr(exc))
    os._exit(0)  # no interpreter teardown


def test_a_forked_child_neither_inherits_nor_breaks_the_parents_hold(
    make: Callable[..., PostgresRWLock],
) -> None:
    lock = make("menu:7")
    handle = lock.acquire_write(timeout=5)
    fork = multiprocessing.get_context("fork")
    report, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_in_forked_child, args=(handle, lock, send), daemon=True)
    child.start()
    try:
        assert report.poll(30), "the forked child never answered"
        assert report.recv() == "ok"
    finally:
        child.join(10)
        if child.is_alive():  # stuck (e.g. on the parent's socket): never wait for it
            child.kill()
            child.join(10)
    handle.release()  # the parent's session survived the child
    assert not handle.lost


# -- transaction-scoped locks ------------------------------------------------------------------


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_write_in_lasts_exactly_as_long_as_the_transaction(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock], end: str
) -> None:
    lock = make("menu:7")
    with engine.connect() as conn:
        held = lock.write_in(conn, timeout=5)
        assert held.mode == "write"
        assert held.token > 0
        conn.execute(text("SELECT 1"))  # the transaction goes on, the lock stays
        assert not _try_write(make("menu:7"))
        assert _in_thread(lambda: make("menu:7").try_acquire_read())(10) is None
        getattr(conn, end)()
        assert _try_write(make("menu:7"))


def test_write_in_a_session_and_read_in(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    lock = make("menu:7")
    with Session(engine) as session:
        lock.write_in(session, timeout=5)
        assert not _try_write(make("menu:7"))
        session.commit()
    with engine.connect() as conn:
        assert lock.read_in(conn, timeout=5).token == 0
        readers = _in_thread(lambda: _held(make("menu:7").read(timeout=5)))
        assert readers(10) == "held"  # readers share
        assert not _try_write(make("menu:7"))
        conn.rollback()
    assert _try_write(make("menu:7"))


def test_write_in_waits_for_a_session_holder_then_gets_in(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    holder = _in_thread(lambda: make("menu:7").acquire_write(timeout=5))(10)
    assert isinstance(holder, PostgresLockHandle)
    with engine.connect() as conn:
        conn.execute(text("SET lock_timeout = '7s'"))  # the application's own setting
        waiting = _in_thread(lambda: make("menu:7").write_in(conn, timeout=30))
        _wait_until_a_writer_waits(engine, holder.key)
        holder.release()
        assert waiting(40).mode == "write"
        assert not _try_write(make("menu:7"))
        assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "7s"  # put back
        conn.commit()


def test_write_in_timing_out_leaves_the_transaction_usable(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    table = f"cg_xact_{uuid.uuid4().hex[:8]}"
    _drop(engine, f"CREATE TABLE {table} (x int)")
    try:
        with make("menu:7").write(timeout=5), engine.connect() as conn:
            conn.execute(text(f"INSERT INTO {table} VALUES (1)"))
            before = conn.execute(text("SHOW lock_timeout")).scalar_one()
            with pytest.raises(LockTimeout, match="menu:7"):
                make("menu:7").write_in(conn, timeout=0.3)
            # Not aborted: the earlier insert commits, the setting is as it was.
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == before
            conn.execute(text(f"INSERT INTO {table} VALUES (2)"))
            conn.commit()
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 2
    finally:
        _drop(engine, f"DROP TABLE {table}")


def test_write_in_refuses_an_upgrade(
    engine: sqlalchemy.Engine, make: Callable[..., PostgresRWLock]
) -> None:
    lock = make("menu:7")
    with engine.connect() as conn:
        lock.read_in(conn, timeout=5)
        with pytest.raises(LockUpgradeError):
            lock.write_in(conn, timeout=5)
        conn.execute(text("SELECT 1"))  # the transaction is still usable
        conn.rollback()
        lock.write_in(conn, timeout=5)  # a new transaction may write
        lock.read_in(conn, timeout=5)  # and read while writing
        lock.write_in(conn, timeout=5)  # and write again
        conn.rollback()


def test_write_in_needs_a_transaction(engine: sqlalchemy.Engine) -> None:
    lock = PostgresRWLock(engine, "menu:7")
    autocommit = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    with autocommit as conn, pytest.raises(ValueError, match="autocommit"):
        lock.write_in(conn)
    with pytest.raises(TypeError, match="Connection or Session"):
        lock.write_in(engine)  # type: ignore[arg-type]


# -- asyncio: AsyncPostgresRWLock ----------------------------------------------------------------


@pytest.fixture
async def aengine(engine: sqlalchemy.Engine) -> AsyncIterator[AsyncEngine]:
    """An async engine on the test database (the sync ``engine`` fixture checked it)."""
    built = create_async_engine(postgres_url())
    yield built
    await close_idle_async_connections(built)
    await built.dispose()


@pytest.fixture
def amake(aengine: AsyncEngine, fence: str) -> Callable[..., AsyncPostgresRWLock]:
    namespace = f"t{uuid.uuid4().hex[:12]}"

    def build(name: str, **options: Any) -> AsyncPostgresRWLock:
        options.setdefault("fence_sequence", fence)
        return AsyncPostgresRWLock(aengine, name, namespace=namespace, **options)

    return build


async def _as_another_task(work: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``work`` in a task of its own (another owner); its value or exception."""
    try:
        return await asyncio.wait_for(asyncio.ensure_future(work()), 30)
    except Exception as exc:
        return exc


async def _aheld(context: Any) -> str:
    async with context:
        return "held"


async def test_async_lock_follows_the_rules(amake: Callable[..., AsyncPostgresRWLock]) -> None:
    lock = amake("menu:7")
    async with lock.read(timeout=5):
        assert await _as_another_task(lambda: _aheld(amake("menu:7").read(timeout=5))) == "held"
        blocked = await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=0.3)))
        assert isinstance(blocked, LockTimeout)
        with pytest.raises(LockUpgradeError):
            await lock.acquire_write(timeout=5)
    tokens = []
    async with lock.write(timeout=5) as outer, lock.write(timeout=5) as inner:
        assert inner.token == outer.token  # a reentrant hold shares its holding's token
        tokens.append(outer.token)
        downgraded = await lock.acquire_read(timeout=5)
    # Still a reader: readers join, writers wait.
    assert await _as_another_task(lambda: _aheld(amake("menu:7").read(timeout=5))) == "held"
    assert await _as_another_task(lambda: amake("menu:7").try_acquire_write()) is None
    await downgraded.release()
    async with lock.write(timeout=5) as again:
        tokens.append(again.token)
    assert tokens[1] > tokens[0]


async def test_sync_and_async_locks_of_one_name_exclude_each_other(
    make: Callable[..., PostgresRWLock], aengine: AsyncEngine, fence: str
) -> None:
    sync_lock = make("menu:7")
    async_lock = AsyncPostgresRWLock(
        aengine, "menu:7", namespace=sync_lock.namespace, fence_sequence=fence
    )
    async with async_lock.write(timeout=5) as held:
        assert not await asyncio.to_thread(_try_write, sync_lock)
    handle = await asyncio.to_thread(sync_lock.acquire_write, 5)
    assert handle.token > held.token
    assert await async_lock.try_acquire_read() is None
    await asyncio.to_thread(handle.release)
    assert await _as_another_task(lambda: _aheld(async_lock.read(timeout=5))) == "held"


async def test_async_terminated_session_marks_its_handles_lost(
    engine: sqlalchemy.Engine, amake: Callable[..., AsyncPostgresRWLock]
) -> None:
    lost = asyncio.Event()

    async def on_lost(handle: Any) -> None:
        lost.set()

    lock = amake("menu:7", on_lost=on_lost)
    handle = await lock.acquire_write(timeout=5)
    # A second lock on the same session: the watch must survive the statements run on it.
    other = await amake("menu:8").acquire_read(timeout=5)
    [pid] = await asyncio.to_thread(_holder_pids, engine, lock.key)
    await asyncio.to_thread(_terminate, engine, pid)
    await asyncio.wait_for(lost.wait(), 5)  # the loop watched the socket
    assert handle.lost
    assert other.lost
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=10))) == "held"
    with pytest.raises(LockLostError):
        await handle.release()


async def test_a_cancelled_async_wait_leaves_nothing_behind(
    engine: sqlalchemy.Engine, amake: Callable[..., AsyncPostgresRWLock]
) -> None:
    lock = amake("menu:7")
    holder = await lock.acquire_write(timeout=5)
    waiter = asyncio.ensure_future(amake("menu:7").acquire_write(timeout=30))
    await asyncio.to_thread(_wait_until_a_writer_waits, engine, lock.key)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await holder.release()
    assert not await asyncio.to_thread(_holder_pids, engine, lock.key)
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=5))) == "held"


async def test_async_write_in_lasts_as_long_as_the_transaction(
    aengine: AsyncEngine, amake: Callable[..., AsyncPostgresRWLock]
) -> None:
    lock = amake("menu:7")
    async with aengine.connect() as conn:
        held = await lock.write_in(conn, timeout=5)
        assert held.token > 0
        assert await _as_another_task(lambda: amake("menu:7").try_acquire_read()) is None
        await conn.commit()
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=5))) == "held"
    async with AsyncSession(aengine) as session:
        await lock.read_in(session, timeout=5)
        with pytest.raises(LockUpgradeError):
            await lock.write_in(session, timeout=5)
        assert await _as_another_task(lambda: amake("menu:7").try_acquire_write()) is None
        await session.rollback()
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=5))) == "held"


def _wait_until_granted_to_a_waiter(engine: sqlalchemy.Engine, key: int) -> None:
    """Blocks (the event loop too, on purpose): until the server granted the lock."""
    deadline = time.monotonic() + 10
    while not _holder_pids(engine, key):  # a condition polled with a deadline
        assert time.monotonic() < deadline, "the waiter was never granted the lock"
        time.sleep(0.005)


async def test_an_async_wait_cancelled_after_its_grant_leaves_nothing_behind(
    engine: sqlalchemy.Engine, amake: Callable[..., AsyncPostgresRWLock], fence: str
) -> None:
    waiting_lock = amake("menu:7")
    holder_lock = PostgresRWLock(
        engine, "menu:7", namespace=waiting_lock.namespace, fence_sequence=fence
    )
    holder = await asyncio.to_thread(holder_lock.acquire_write, 5)
    waiter = asyncio.ensure_future(waiting_lock.acquire_write(timeout=30))
    await asyncio.to_thread(_wait_until_a_writer_waits, engine, waiting_lock.key)
    # The server grants the waiter while the loop is held up, so the task is
    # cancelled with the grant already sitting unread in its socket.
    holder.release()
    _wait_until_granted_to_a_waiter(engine, waiting_lock.key)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not await asyncio.to_thread(_holder_pids, engine, waiting_lock.key)
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=5))) == "held"


@pytest.mark.slow
async def test_a_cancelled_async_release_finishes_in_the_background(
    engine: sqlalchemy.Engine, amake: Callable[..., AsyncPostgresRWLock]
) -> None:
    held = await amake("menu:7").acquire_read(timeout=5, owner="shared")
    blocker = await _as_another_task(lambda: amake("menu:8").acquire_write(timeout=5))
    # The owner's session is busy: another of its tasks waits (until its deadline).
    busy = asyncio.ensure_future(amake("menu:8").acquire_read(timeout=1, owner="shared"))
    await asyncio.to_thread(_wait_until_a_reader_waits, engine, blocker.key)
    release = asyncio.ensure_future(held.release())
    await asyncio.sleep(0)  # one loop turn: the release task runs up to its wait for the session
    release.cancel()
    with pytest.raises(asyncio.CancelledError):
        await release
    [waited] = await asyncio.gather(busy, return_exceptions=True)
    assert isinstance(waited, LockTimeout)
    # Once the session is free, the release goes through: a writer gets in.
    assert await _as_another_task(lambda: _aheld(amake("menu:7").write(timeout=5))) == "held"
    await blocker.release()


def _wait_until_a_reader_waits(engine: sqlalchemy.Engine, key: int) -> None:
    classid, objid = key_parts(key)
    query = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND mode = 'ShareLock' AND classid = CAST(:c AS oid) AND objid = CAST(:o AS oid)"
    )
    deadline = time.monotonic() + 10
    with engine.connect() as conn:
        while not conn.execute(query, {"c": classid, "o": objid}).scalar_one():
            assert time.monotonic() < deadline, "the reader never queued"
            time.sleep(0.01)
