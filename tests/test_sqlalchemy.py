"""The SQLAlchemy session hooks, on real PostgreSQL (DATABASE_URL, set in CI) and SQLite."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
import sqlalchemy as sa
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from cacheguard import (
    MISSING,
    BackendUnavailable,
    KeyTemplateError,
    LockLostError,
    LockTimeout,
)
from cacheguard.integrations.sqlalchemy import track_models
from cacheguard.testing import free_port
from tests import sa_support
from tests.helpers import client_for, make_guard, wait_until
from tests.procs import CTX, run_processes
from tests.sa_support import MENU_KEYS, Stack


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    name = f"menu_{uuid.uuid4().hex[:10]}"
    sa_support.create_table(db_url, name)
    yield name
    sa_support.drop_table(db_url, name)


@pytest.fixture
def stack(redis_url: str, namespace: str, db_url: str, table: str) -> Iterator[Stack]:
    s = Stack(redis_url, namespace, db_url, table, wait_timeout=5)
    yield s
    s.close()


def _waiting_in_process(stack: Stack, name: str) -> bool:
    """Is a thread of this process blocked on the local tier of ``name``'s lock?
    (CPython's Condition keeps its sleeping threads in ``_waiters``.)"""
    return bool(stack.guard.rwlock(name).local._cond._waiters)  # type: ignore[attr-defined]


def _lock_is_free(stack: Stack, name: str) -> bool:
    """Another owner could take the write lock of ``name`` right now."""
    handle = stack.guard.rwlock(name).remote.try_acquire_write(owner=f"probe-{uuid.uuid4().hex}")
    if handle is None:
        return False
    handle.release()
    return True


# -- commit, rollback, close -----------------------------------------------------------------------


def test_a_write_lock_lost_before_the_commit_fails_it(
    stack: Stack, redis_url: str, namespace: str
) -> None:
    other = make_guard(client_for(redis_url), namespace)  # another process's guard
    try:
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "written after the loss"
            session.flush()
            handle = session.info[stack.tracker._info_key].locks["menu:2"][1]
            # The lock's hash vanishes, another writer gets in and a reader stores a value.
            assert stack.client.delete(stack.guard.keys("menu:2").lock) == 1
            with other.write("menu:2", timeout=5):
                pass
            assert other.get_or_load("menu:2", lambda: "stale", ttl=60) == "stale"
            assert not handle.renew()  # what the watchdog's next renewal finds
            with pytest.raises(LockLostError) as lost:
                session.commit()
            assert (lost.value.name, lost.value.mode) == ("menu:2", "write")
            assert "not committed" in str(lost.value)
            with pytest.raises(LockLostError):
                session.commit()  # nothing commits until the transaction is rolled back
            session.rollback()
            assert stack.tracker.held_keys(session) == frozenset()
        assert other.peek("menu:2") is MISSING  # invalidated again at the rollback
        assert all(_lock_is_free(stack, n) for n in ("menu:list", "menu:2", "menu:children:1"))
        assert stack.name_of(2) == "menu 2"  # the change was not committed
    finally:
        other.close()
        other.client.close()


@pytest.mark.slow
def test_update_through_a_session_is_seen_by_every_process(
    stack: Stack, redis_url: str, namespace: str, db_url: str, table: str
) -> None:
    assert stack.names() == ["menu 1", "menu 2", "menu 3"]
    assert stack.name_of(2) == "menu 2"
    with stack.sessions() as session:
        session.get(stack.menu, 2).name = "soups"
        session.flush()
        assert stack.tracker.held_keys(session) == {
            "menu:list",
            "menu:2",
            "menu:children:1",
        }
        session.commit()
        assert stack.tracker.held_keys(session) == frozenset()
    assert all(_lock_is_free(stack, n) for n in ("menu:list", "menu:2", "menu:children:1"))
    assert stack.names() == ["menu 1", "soups", "menu 3"]
    assert stack.name_of(2) == "soups"
    others = run_processes(sa_support.read_names, [(redis_url, namespace, db_url, table)] * 2)
    assert others == [["menu 1", "soups", "menu 3"]] * 2


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "expired"])
def test_old_and_new_values_of_template_columns_are_both_invalidated(
    stack: Stack, loaded: bool
) -> None:
    with stack.sessions() as session:
        row = session.get(stack.menu, 3)
        if not loaded:  # the old value was never loaded: active history loads it
            session.expire(row, ["parent_id"])
        row.parent_id = 2
        session.flush()
        assert {"menu:children:1", "menu:children:2"} <= stack.tracker.held_keys(session)
        session.rollback()


def test_unchanged_objects_take_no_locks(stack: Stack) -> None:
    with stack.sessions() as session:
        row = session.get(stack.menu, 2)
        row.name = row.name  # a set event without a change
        session.flush()
        assert stack.tracker.held_keys(session) == frozenset()
        session.commit()


def test_rollback_releases_at_once_and_caches_nothing_uncommitted(stack: Stack) -> None:
    assert stack.names() == ["menu 1", "menu 2", "menu 3"]
    with stack.sessions() as session:
        session.get(stack.menu, 2).name = "phantom"
        session.flush()
        # The writer's own thread reads through the cache mid-transaction, with a
        # loader on the writer's session: it sees its own change, which must not be stored.
        seen = stack.guard.get_or_load(
            "menu:list",
            lambda: list(session.scalars(sa.select(stack.menu.name).order_by(stack.menu.id))),
            ttl=60,
        )
        assert seen == ["menu 1", "phantom", "menu 3"]
        assert stack.guard.peek("menu:list") is MISSING
        assert not _lock_is_free(stack, "menu:list")
        session.rollback()
        assert _lock_is_free(stack, "menu:list")
        assert _lock_is_free(stack, "menu:2")
    assert stack.guard.peek("menu:list") is MISSING
    assert stack.names() == ["menu 1", "menu 2", "menu 3"]


def test_close_without_commit_releases(stack: Stack) -> None:
    session = stack.sessions()
    session.get(stack.menu, 2).name = "abandoned"
    session.flush()
    assert not _lock_is_free(stack, "menu:2")
    session.close()
    assert _lock_is_free(stack, "menu:2")
    assert stack.name_of(2) == "menu 2"


@pytest.mark.slow
def test_a_session_dropped_without_close_releases_when_collected(stack: Stack) -> None:
    session = stack.sessions()
    session.get(stack.menu, 2).name = "dropped"
    session.flush()
    assert not _lock_is_free(stack, "menu:2")
    session.get_bind()  # keep nothing else referring to it
    del session
    import gc

    gc.collect()
    assert wait_until(lambda: _lock_is_free(stack, "menu:2"), 5)


def test_commit_from_another_thread_releases(stack: Stack) -> None:
    session = stack.sessions()
    session.get(stack.menu, 2).name = "handed over"
    session.flush()
    worker = threading.Thread(target=session.commit)
    worker.start()
    worker.join()
    session.close()
    assert _lock_is_free(stack, "menu:2")
    assert stack.name_of(2) == "handed over"
    # This thread's local lock is free again: it can write the key.
    with stack.guard.write("menu:2", timeout=2):
        pass


def test_other_threads_wait_for_the_transaction_then_see_the_commit(stack: Stack) -> None:
    assert stack.name_of(2) == "menu 2"
    results: list[str | None] = []
    with stack.sessions() as session:
        session.get(stack.menu, 2).name = "after commit"
        session.flush()
        reader = threading.Thread(target=lambda: results.append(stack.name_of(2)))
        reader.start()
        assert wait_until(lambda: _waiting_in_process(stack, "menu:2"))
        assert results == []  # blocked behind the write lock
        session.commit()
    reader.join(5)
    assert results == ["after commit"]


def test_new_objects_invalidate_their_keys_after_the_insert(stack: Stack) -> None:
    assert stack.name_of(9) is None  # cached as a negative entry
    with stack.sessions() as session:
        session.add(stack.menu(id=9, name="new", parent_id=2))
        session.flush()
        assert {"menu:9", "menu:list", "menu:children:2"} <= stack.tracker.held_keys(session)
        session.commit()
    assert stack.name_of(9) == "new"


def test_generated_ids_are_named_after_the_insert(stack: Stack) -> None:
    with stack.sessions() as session:
        row = stack.menu(name="generated", parent_id=1)
        session.add(row)
        session.flush()
        assert f"menu:{row.id}" in stack.tracker.held_keys(session)
        assert "menu:None" not in stack.tracker.held_keys(session)
        session.commit()


def test_delete_invalidates(stack: Stack) -> None:
    assert stack.name_of(3) == "menu 3"
    with stack.sessions() as session:
        session.delete(session.get(stack.menu, 3))
        session.commit()
    assert stack.name_of(3) is None
    assert stack.names() == ["menu 1", "menu 2"]


# -- savepoints ------------------------------------------------------------------------------------


def test_savepoint_commit_merges_and_rollback_drops_only_its_own(stack: Stack) -> None:
    with stack.sessions() as session:
        session.get(stack.menu, 1).name = "outer"
        session.flush()
        outer = set(stack.tracker.held_keys(session))
        assert outer == {"menu:list", "menu:1", "menu:children:None"}

        kept = session.begin_nested()
        session.get(stack.menu, 2).name = "kept"
        session.flush()
        kept.commit()
        assert "menu:2" in stack.tracker.held_keys(session)

        dropped = session.begin_nested()
        session.get(stack.menu, 3).name = "dropped"
        session.get(stack.menu, 1).name = "outer again"  # also the outer's key
        session.flush()
        assert "menu:3" in stack.tracker.held_keys(session)
        dropped.rollback()
        held = stack.tracker.held_keys(session)
        assert "menu:3" not in held  # only the savepoint touched it: released
        assert _lock_is_free(stack, "menu:3")
        assert outer | {"menu:2"} <= held  # the outer's and the merged savepoint's stay
        assert not _lock_is_free(stack, "menu:2")
        session.commit()
    assert stack.names() == ["outer", "kept", "menu 3"]
    assert all(_lock_is_free(stack, n) for n in ("menu:list", "menu:1", "menu:2"))


def test_nested_savepoints_merge_up_to_the_outermost(stack: Stack) -> None:
    with stack.sessions() as session:
        level1 = session.begin_nested()
        level2 = session.begin_nested()
        session.get(stack.menu, 3).name = "deep"
        session.flush()
        level2.commit()
        level1.commit()
        assert "menu:3" in stack.tracker.held_keys(session)
        assert not _lock_is_free(stack, "menu:3")
        session.commit()
    assert _lock_is_free(stack, "menu:3")
    assert stack.name_of(3) == "deep"


# -- ORM statements --------------------------------------------------------------------------------


def test_orm_update_statement_invalidates_the_rows_it_touches(stack: Stack) -> None:
    assert stack.names() == ["menu 1", "menu 2", "menu 3"]
    assert stack.name_of(2) == "menu 2"
    assert stack.name_of(1) == "menu 1"
    with stack.sessions() as session:
        session.execute(
            sa.update(stack.menu).where(stack.menu.id >= 2).values(name="bulk", parent_id=7)
        )
        held = stack.tracker.held_keys(session)
        assert {"menu:2", "menu:3", "menu:list", "menu:children:1", "menu:children:7"} <= held
        assert "menu:1" not in held
        session.commit()
    assert stack.names() == ["menu 1", "bulk", "bulk"]
    assert stack.name_of(2) == "bulk"
    assert stack.guard.peek("menu:1") == "menu 1"  # untouched row: still cached


def test_orm_bulk_update_by_primary_key_and_delete(stack: Stack) -> None:
    assert stack.name_of(2) == "menu 2"
    assert stack.name_of(3) == "menu 3"
    with stack.sessions() as session:
        session.execute(
            sa.update(stack.menu), [{"id": 2, "name": "two"}, {"id": 3, "name": "three"}]
        )
        assert {"menu:2", "menu:3"} <= stack.tracker.held_keys(session)
        session.commit()
    assert (stack.name_of(2), stack.name_of(3)) == ("two", "three")
    with stack.sessions() as session:
        session.execute(sa.delete(stack.menu).where(stack.menu.name == "two"))
        session.commit()
    assert stack.name_of(2) is None


def test_statements_over_max_rows_invalidate_by_prefix(stack: Stack) -> None:
    stack.tracker.max_rows = 1
    assert stack.name_of(1) == "menu 1"
    assert stack.name_of(2) == "menu 2"
    with stack.sessions() as session:
        session.execute(sa.update(stack.menu).values(sort=5))
        session.commit()
    assert stack.guard.peek("menu:1") is MISSING
    assert stack.guard.peek("menu:2") is MISSING


def test_a_row_that_joins_the_where_while_waiting_for_locks_is_invalidated(
    stack: Stack, db_url: str
) -> None:
    """T2 moves row 1 into T1's WHERE and commits while T1 waits for T2's cache locks."""
    t2 = stack.sessions()
    t2.get(stack.menu, 1).parent_id = 1
    t2.flush()  # holds menu:list, menu:1, menu:children:1
    updated, may_commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def t1() -> None:
        try:
            with stack.sessions() as session:
                stmt = sa.update(stack.menu).where(stack.menu.parent_id == 1).values(name="x")
                session.execute(stmt)
                updated.set()
                may_commit.wait(10)
                session.commit()
        except BaseException as exc:  # SQLite refuses the write: its snapshot is stale
            errors.append(exc)
            updated.set()

    worker = threading.Thread(target=t1)
    worker.start()
    # T1 selected rows 2 and 3 and waits for a cache lock that T2 holds.
    assert wait_until(
        lambda: any(
            _waiting_in_process(stack, k) for k in ("menu:list", "menu:1", "menu:children:1")
        )
    )
    t2.commit()
    t2.close()
    updated.wait(10)
    stack.name_of(1)  # a reader fills menu:1 before T1 commits
    may_commit.set()
    worker.join(10)
    if db_url.startswith("sqlite"):
        assert errors, "SQLite should refuse the upgrade of a stale read transaction"
    else:
        assert not errors
    with stack.sessions() as session:
        truth = {m.id: m.name for m in session.scalars(sa.select(stack.menu))}
    assert {i: stack.name_of(i) for i in truth} == truth


@pytest.mark.slow
def test_lock_timeout_midway_in_a_savepoint_invalidates_and_releases(stack: Stack) -> None:
    # Sorted: menu:3 < menu:children:1 < menu:list; the last one is taken elsewhere.
    other = stack.guard.rwlock("menu:list").remote.try_acquire_write(owner="someone-else")
    assert other is not None
    stack.tracker.lock_timeout = 0.3
    assert stack.name_of(3) == "menu 3"
    try:
        with stack.sessions() as session:
            savepoint = session.begin_nested()
            session.get(stack.menu, 3).name = "half locked"
            with pytest.raises(LockTimeout):
                session.flush()
            savepoint.rollback()
            assert stack.tracker.held_keys(session) == frozenset()
            assert _lock_is_free(stack, "menu:3")
            session.commit()
    finally:
        other.release()
    assert stack.guard.peek("menu:3") is MISSING  # invalidated on the way out
    assert stack.name_of(3) == "menu 3"


def test_prefix_invalidation_refuses_fills_from_older_snapshots(stack: Stack, db_url: str) -> None:
    """The key has no value and no fill when the prefix SCAN runs: the prefix stamp
    still keeps a reader on an older snapshot from storing the old row."""
    stack.tracker.max_rows = 1
    reader = stack.sessions()
    try:
        if not db_url.startswith("sqlite"):
            reader.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        assert reader.get(stack.menu, 2).name == "menu 2"  # snapshot taken
        with stack.sessions() as writer:
            writer.execute(sa.update(stack.menu).values(name="renamed"))  # prefix path
            writer.commit()

        def load_in_reader() -> str:
            return reader.scalars(sa.select(stack.menu.name).where(stack.menu.id == 2)).one()

        assert stack.guard.get_or_load("menu:2", load_in_reader, ttl=60) == "menu 2"
        assert stack.guard.peek("menu:2") is MISSING
    finally:
        reader.close()
    assert stack.name_of(2) == "renamed"


def test_orm_insert_statement_invalidates(stack: Stack) -> None:
    assert stack.name_of(7) is None
    with stack.sessions() as session:
        session.execute(sa.insert(stack.menu), [{"id": 7, "name": "seven", "parent_id": 1}])
        assert "menu:7" in stack.tracker.held_keys(session)
        session.commit()
    assert stack.name_of(7) == "seven"


def test_orm_insert_with_a_generated_id_invalidates_its_key(stack: Stack) -> None:
    with stack.sessions() as session:
        session.execute(sa.insert(stack.menu).values(name="generated", parent_id=1))
        session.commit()
    with stack.sessions() as session:
        new_id = session.scalars(sa.select(sa.func.max(stack.menu.id))).one()
    with stack.sessions() as session:
        session.execute(sa.delete(stack.menu).where(stack.menu.id == new_id))
        session.commit()
    assert stack.name_of(new_id) is None  # cached as missing
    with stack.sessions() as session:
        session.execute(sa.insert(stack.menu).values(id=new_id, name="back", parent_id=1))
        session.commit()
    assert stack.name_of(new_id) == "back"


def test_upsert_invalidates_the_keys_of_the_row_it_overwrites(stack: Stack, db_url: str) -> None:
    if db_url.startswith("sqlite"):
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    assert stack.name_of(2) == "menu 2"
    stmt = insert(stack.menu).values(id=2, name="upserted", parent_id=3)
    stmt = stmt.on_conflict_do_update(
        index_elements=[stack.menu.id], set_={"name": "upserted", "parent_id": 3}
    )
    with stack.sessions() as session:
        session.execute(stmt)
        held = stack.tracker.held_keys(session)
        assert {"menu:2", "menu:children:1", "menu:children:3"} <= held
        session.commit()
    assert stack.name_of(2) == "upserted"


# -- snapshots -------------------------------------------------------------------------------------


def test_a_reader_with_an_old_snapshot_cannot_fill_a_stale_row(stack: Stack, db_url: str) -> None:
    """PostgreSQL REPEATABLE READ / SQLite WAL: the reader's snapshot predates a commit."""
    reader = stack.sessions()
    try:
        if not db_url.startswith("sqlite"):
            reader.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        assert reader.get(stack.menu, 2).name == "menu 2"  # the snapshot is taken here
        with stack.sessions() as writer:
            writer.get(stack.menu, 2).name = "fresh"
            writer.commit()

        def load_in_reader() -> str:
            return reader.scalars(sa.select(stack.menu.name).where(stack.menu.id == 2)).one()

        # The reader sees its snapshot (that is its business) but must not cache it.
        assert stack.guard.get_or_load("menu:2", load_in_reader, ttl=60) == "menu 2"
        assert stack.guard.stats().stores_rejected == 1
        assert stack.guard.peek("menu:2") is MISSING
    finally:
        reader.close()
    assert stack.name_of(2) == "fresh"


def test_a_snapshot_taken_after_the_commit_may_fill(stack: Stack) -> None:
    with stack.sessions() as writer:
        writer.get(stack.menu, 2).name = "fresh"
        writer.commit()
    with stack.sessions() as reader:
        assert reader.get(stack.menu, 1) is not None  # transaction open in this thread
        assert stack.name_of(2) == "fresh"
    assert stack.guard.peek("menu:2") == "fresh"
    assert stack.guard.stats().stores_rejected == 0


# -- leases and dead holders -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_long_transaction_keeps_its_locks_past_the_lease(
    redis_url: str, namespace: str, db_url: str, table: str
) -> None:
    stack = Stack(redis_url, namespace, db_url, table, lease=0.5, wait_timeout=5)
    try:
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "slow"
            session.flush()
            time.sleep(2.0)  # four leases
            assert not _lock_is_free(stack, "menu:2")
            assert stack.guard.stats().backend_errors == 0
            session.commit()  # its release would raise LockLostError into the log if lost
        assert _lock_is_free(stack, "menu:2")
        assert stack.name_of(2) == "slow"
    finally:
        stack.close()


@pytest.mark.slow
def test_a_process_killed_mid_transaction_frees_its_locks_at_lease_end(
    client: redis.Redis, redis_url: str, namespace: str, db_url: str, table: str, stack: Stack
) -> None:
    lease = 1.0
    child = CTX.Process(
        target=sa_support.die_holding_write_locks,
        args=(redis_url, namespace, db_url, table, lease),
        daemon=True,
    )
    child.start()
    try:
        assert wait_until(lambda: client.get(f"{namespace}:test:flushed") == b"1", 30)
        assert not _lock_is_free(stack, "menu:2")
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        killed_at = time.monotonic()
        child.join(10)
        assert stack.name_of(2) == "menu 2"  # waits for the dead holder's lease
        waited = time.monotonic() - killed_at
        print(f"\nSIGKILLed mid-transaction (lease {lease:g} s): read served after {waited:.3f} s")
        assert waited <= lease + 1.0 + 2.0  # lease + 1 s, plus slack for a loaded machine
        assert stack.names() == ["menu 1", "menu 2", "menu 3"]
    finally:
        if child.is_alive():
            child.kill()


# -- failures and configuration --------------------------------------------------------------------


def test_flush_fails_cleanly_when_redis_is_down(namespace: str, db_url: str, table: str) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    down = Stack(dead_url, namespace, db_url, table, wait_timeout=1)
    try:
        with down.sessions() as session:
            session.get(down.menu, 2).name = "not written"  # begin: watermark -1, logged
            with pytest.raises(BackendUnavailable):
                session.flush()
            session.rollback()
        with down.sessions() as session:
            assert session.get(down.menu, 2).name == "menu 2"
    finally:
        down.close()


def test_flush_fails_cleanly_when_invalidation_fails(
    redis_url: str, namespace: str, db_url: str, table: str
) -> None:
    stack = Stack(redis_url, namespace, db_url, table, wait_timeout=1)
    # No retries of the client's own (from_url's clients have none either): refused at once.
    dead = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    stack.guard.client = dead  # invalidation fails; the lock scripts use the live client
    try:
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "not written"
            with pytest.raises(BackendUnavailable):
                session.flush()
            session.rollback()
        stack.guard.client = stack.client
        assert _lock_is_free(stack, "menu:2")
        with stack.sessions() as session:
            assert session.get(stack.menu, 2).name == "menu 2"
    finally:
        stack.guard.client = stack.client
        stack.close()


@pytest.mark.slow
def test_lock_timeout_fails_the_flush_and_releases(stack: Stack) -> None:
    other = stack.guard.rwlock("menu:2").remote.try_acquire_write(owner="someone-else")
    assert other is not None
    stack.tracker.lock_timeout = 0.3
    try:
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "blocked"
            with pytest.raises(LockTimeout):
                session.flush()
            session.rollback()
            assert stack.tracker.held_keys(session) == frozenset()
    finally:
        other.release()
    assert all(_lock_is_free(stack, n) for n in ("menu:list", "menu:2", "menu:children:1"))


@pytest.mark.slow
def test_lock_timeout_and_outbox_poll_take_a_timedelta(stack: Stack) -> None:
    """Durations are seconds or a timedelta (issue #26): ``lock_timeout`` bounds the
    flush's wait as its seconds do; bad ones are refused when the hooks are made."""
    stack.tracker.remove()
    stack.tracker = track_models(
        stack.guard, stack.sessions, {stack.menu: MENU_KEYS}, lock_timeout=timedelta(seconds=0.3)
    )
    assert stack.tracker.lock_timeout == 0.3
    other = stack.guard.rwlock("menu:2").remote.try_acquire_write(owner="someone-else")
    assert other is not None
    try:
        with stack.sessions() as session:
            session.get(stack.menu, 2).name = "blocked"
            with pytest.raises(LockTimeout):
                session.flush()
            session.rollback()
    finally:
        other.release()
    for bad in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match=r"^lock_timeout must be a finite number > 0"):
            track_models(stack.guard, stack.sessions, {stack.menu: MENU_KEYS}, lock_timeout=bad)
        with pytest.raises(ValueError, match=r"^outbox_poll must be a finite number > 0"):
            track_models(
                stack.guard,
                stack.sessions,
                {stack.menu: MENU_KEYS},
                outbox=True,
                outbox_poll=bad,
            )


def test_models_and_templates_are_checked(client: redis.Redis, namespace: str) -> None:
    class Base(DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = "item_unused"
        id: Mapped[int] = mapped_column(primary_key=True)
        __cache_keys__ = ("item:{id}",)

    guard = make_guard(client, namespace)
    factory = sa.orm.sessionmaker()
    with pytest.raises(KeyTemplateError, match="not a column attribute"):
        track_models(guard, factory, {Item: ("item:{nope}",)})
    with pytest.raises(KeyTemplateError, match="non-empty sequence"):
        track_models(guard, factory, {Item: "item:{id}"})
    with pytest.raises(TypeError, match="not a mapped"):
        track_models(guard, factory, {int: ("x",)})
    with pytest.raises(KeyTemplateError, match="__cache_keys__"):
        track_models(guard, factory, [int])
    with pytest.raises(ValueError, match="at least one"):
        track_models(guard, factory, {})
    with pytest.raises(TypeError, match="CacheGuard"):
        track_models(client, factory, [Item])  # type: ignore[arg-type]
    tracker = track_models(guard, factory, [Item])  # the class attribute form
    assert tracker.keys_of(Item(id=4)) == {"item:4"}
    tracker.remove()


def test_key_names_match_the_decorator_escaping(stack: Stack) -> None:
    from cacheguard.cache.templates import render_key

    row = stack.menu(id=5, name="x", parent_id=None)
    assert stack.tracker.keys_of(row) == {"menu:list", "menu:5", "menu:children:None"}
    assert render_key("menu:{menu_id}", {"menu_id": 5}) == "menu:5"
    assert client_for  # the helper module is importable by children
