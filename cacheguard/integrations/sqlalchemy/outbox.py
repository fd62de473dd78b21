"""The outbox: the invalidations of writes committed while Redis was unreachable.

With ``track_models(..., outbox=True)`` a tracked flush or ORM statement that
cannot write-lock or invalidate its keys (Redis down, a partition, the circuit
open) does not fail: it inserts the keys (or, on the by-prefix paths, the
prefixes) into the outbox table on the session's own connection, so the rows
commit, or roll back, with the transaction's writes. After the commit the
closing step invalidates them again and deletes exactly its rows once that went
through; otherwise the rows wait for a replay:

- before a guard serves a value from Redis after an outage it saw (its replay
  hook, :mod:`cacheguard.cache.outage.recovery`), in every process, also at start-up;
- every ``outbox_poll`` seconds in every tracking process (the poller), which
  bounds the staleness in processes that never saw the outage (a partition
  between one process and Redis): about ``outbox_poll`` plus one replay.

A replay reads its namespace's rows oldest first, a batch at a time (on
PostgreSQL ``FOR UPDATE SKIP LOCKED``, so replayers in many processes share the
rows out, then one pass that waits, at most the guard's ``wait_timeout``, for the
rows others hold and takes what they could not replay), invalidates them through
the guard and only then deletes them. Invalidating twice is harmless, so a
replayer that dies between the two only leaves rows to replay again. On a
cluster, the rows of keys whose node's circuit is open wait (reads of those keys
bypass Redis until it closes) while the others are replayed. See
``docs/outage.md``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from sqlalchemy.util import greenlet_spawn

from cacheguard._identity import on_fork_in_child
from cacheguard.cache.async_guard import AsyncCacheGuard
from cacheguard.cache.guard import CacheGuard
from cacheguard.checks import Seconds, check_int, check_positive
from cacheguard.exceptions import BackendUnavailable, GuardClosed
from cacheguard.integrations.sqlalchemy.guards import GuardIO, guard_io

__all__ = [
    "DEFAULT_OUTBOX_TABLE",
    "AsyncOutboxReplayer",
    "OutboxReplayer",
    "async_outbox_depth",
    "outbox_depth",
    "outbox_table",
]

log = logging.getLogger("cacheguard.integrations.sqlalchemy")

DEFAULT_OUTBOX_TABLE = "cacheguard_outbox"
KEY, PREFIX = "key", "prefix"  # what a row's name is
_NAMESPACE_LENGTH = 255
_DELETE_CHUNK = 500  # ids per DELETE ... WHERE id IN (...)
_STOP_JOIN = 5.0  # s: how long remove() waits for a poll under way
_BEFORE_EVERY_ID = -(2**63)  # where a pass's id cursor starts


def outbox_table(
    metadata: sa.MetaData, name: str = DEFAULT_OUTBOX_TABLE, schema: str | None = None
) -> sa.Table:
    """The outbox table, on ``metadata``: add it to the metadata your migrations
    (Alembic's ``target_metadata``) are made from.

    Columns: ``id`` (an autoincrement big integer), ``namespace`` (the guard's),
    ``kind`` (``"key"`` or ``"prefix"``), ``name`` (the key name or prefix) and
    ``created_at`` (set by the database). The index on ``(namespace, id)`` makes
    "the oldest rows of a namespace" one index range scan, so a poll of an empty
    outbox costs one cheap query. PostgreSQL and SQLite alike."""
    return sa.Table(
        name,
        metadata,
        sa.Column(
            "id",
            # SQLite numbers only an INTEGER PRIMARY KEY by itself (its rowid).
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("namespace", sa.String(_NAMESPACE_LENGTH), nullable=False),
        sa.Column("kind", sa.String(6), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(f"kind IN ('{KEY}', '{PREFIX}')", name=f"{name}_kind"),
        sa.Index(f"{name}_namespace_id", "namespace", "id"),
        schema=schema,
    )


def checked_table(outbox: Any) -> sa.Table:
    """The table ``track_models``' ``outbox=`` names: True for the default one (on a
    private MetaData), or a table :func:`outbox_table` made."""
    if outbox is True:
        return outbox_table(sa.MetaData())
    if not isinstance(outbox, sa.Table):
        raise TypeError(
            f"outbox must be True, False or a table made by outbox_table(), not {outbox!r}"
        )
    missing = {"id", "namespace", "kind", "name"} - set(outbox.c.keys())
    if missing:
        raise ValueError(
            f"the outbox table {outbox.name!r} lacks the columns {sorted(missing)}: "
            "make it with cacheguard.integrations.sqlalchemy.outbox_table()"
        )
    return outbox


def checked_bind(guard: Any, session_factory: Any, bind: Any) -> sa.Engine | AsyncEngine:
    """The engine replays and closing deletes use: ``bind``, else the session
    factory's (a ``sessionmaker``'s, ``async_sessionmaker``'s or
    ``scoped_session``'s ``bind``)."""
    if bind is None:
        factory = session_factory
        if isinstance(factory, scoped_session):
            factory = factory.session_factory
        if isinstance(factory, (sessionmaker, async_sessionmaker)):
            bind = factory.kw.get("bind")
    if bind is None:
        raise ValueError(
            "outbox=True needs the engine to replay the outbox from: the session factory "
            "has no bind, pass outbox_bind=engine (the database the tracked models live in)"
        )
    wanted = AsyncEngine if isinstance(guard, AsyncCacheGuard) else sa.Engine
    if not isinstance(bind, wanted):
        raise TypeError(
            f"outbox_bind for a {type(guard).__name__} must be an {wanted.__name__}, "
            f"not {type(bind).__name__}"
        )
    return bind


# -- replaying ------------------------------------------------------------------------------


class _Replay:
    """The replay of one namespace's rows, written once: blocking calls on a sync
    engine and the guard's :class:`~cacheguard.integrations.sqlalchemy.guards.GuardIO` (for an
    asyncio guard it runs in a greenlet, where both await in place)."""

    def __init__(self, guard: Any, engine: sa.Engine, table: sa.Table | None, batch: int) -> None:
        self.guard = guard
        self.io: GuardIO = guard_io(guard)
        self.engine = engine
        self.table = table = checked_table(True if table is None else table)
        self.batch = check_int("batch", batch, minimum=1)
        self.namespace = namespace = guard.namespace
        oldest = sa.select(table.c.id).where(table.c.namespace == namespace).order_by(table.c.id)
        self._peek = oldest.limit(1)
        # Each pass walks the ids up: rows left in the outbox (a dead shard's) are
        # not claimed again by the same pass.
        claim = (
            sa.select(table.c.id, table.c.kind, table.c.name)
            .where(table.c.namespace == namespace, table.c.id > sa.bindparam("after"))
            .order_by(table.c.id)
            .limit(self.batch)
        )
        # (claim, waits): on PostgreSQL the rows are locked while their batch is
        # invalidated, and other replayers skip them; then a pass that waits for the
        # rows others hold and takes what they could not replay (a replay that
        # returns must leave no row committed before it behind: guards serve after
        # it), until empty (rows deleted during a wait shorten a batch). It waits at
        # most wait_timeout in all: a frozen replayer elsewhere fails this replay.
        self._skip_locked = engine.dialect.name == "postgresql"
        self._claims = (
            [(claim.with_for_update(skip_locked=True), False), (claim.with_for_update(), True)]
            if self._skip_locked
            else [(claim, False)]
        )
        # One round trip for a poll on PostgreSQL: no BEGIN, no ROLLBACK.
        self._peek_options = {"isolation_level": "AUTOCOMMIT"} if self._skip_locked else {}

    def has_rows(self) -> bool:
        """Does the namespace have rows to replay? One indexed query."""
        with self.engine.connect().execution_options(**self._peek_options) as connection:
            return connection.execute(self._peek).first() is not None

    def replay(self, *, serving: bool = False) -> int:
        """Replay batches until the namespace's outbox is empty (but for rows that
        wait for their cluster node); how many rows. A batch that fails raises once
        the rows that went through are deleted. ``serving``: a guard waits for this
        replay before it serves (on SQLite the deletes then never wait for the
        database's write lock: it may be the reader's own transaction's)."""
        deadline = time.monotonic() + self.guard.settings.wait_timeout
        waiting: set[int] = set()  # ids of rows whose node's circuit is open
        total = 0
        for claim, waits in self._claims:
            after = _BEFORE_EVERY_ID
            while True:
                claimed, replayed, after = self._replay_batch(
                    claim, after, waiting, deadline, serving
                )
                total += replayed
                if claimed == 0 or (claimed < self.batch and not waits):
                    break
        if waiting:
            log.debug("%d outbox rows wait for their cluster node (circuit open)", len(waiting))
        return total

    def _replay_batch(
        self,
        claim: sa.Select[Any],
        after: int,
        waiting: set[int],
        deadline: float,
        serving: bool,
    ) -> tuple[int, int, int]:
        """One batch of ids above ``after``: (rows claimed, rows replayed, the last id)."""
        failure: Exception | None = None
        if self._skip_locked:
            with self.engine.begin() as connection:
                _bound_lock_waits(connection, deadline)
                rows = connection.execute(claim, {"after": after}).all()
                replayed, failure = self._invalidate(rows, waiting)
                _delete(connection, self.table, [row.id for row in replayed])
        else:  # no transaction held across Redis calls: SQLite would lock writers out
            with self.engine.connect() as connection:
                rows = connection.execute(claim, {"after": after}).all()
            replayed, failure = self._invalidate(rows, waiting)
            if replayed:
                self._delete_sqlite([row.id for row in replayed], wait=not serving)
        for row in replayed:
            self.guard._state.recorder.count("outbox_replays", row.name, 0.0, None, None)
        if failure is not None:
            raise failure
        return len(rows), len(replayed), rows[-1].id if rows else after

    def _invalidate(
        self, rows: Sequence[Any], waiting: set[int]
    ) -> tuple[list[Any], Exception | None]:
        """Invalidate ``rows`` (but those in ``waiting``, and those that join it):
        the rows that went through, and the first failure."""
        strange = {row.kind for row in rows} - {KEY, PREFIX}
        if strange:
            raise ValueError(f"outbox rows of unknown kinds {sorted(strange)} in {self.table.name}")
        guard = self.guard
        cluster = not guard._state.breakers.single
        rows = [row for row in rows if row.id not in waiting]  # (an earlier pass's)
        # On a cluster, by the circuit of a key's node before this batch's calls (a
        # node that fails only now may be the reader's own: that fails the replay):
        # open -> the row waits: reads of the key bypass Redis until the circuit
        # closes, and a guard replays again then; half-open -> the key is tried alone
        # (the probe) and waits if that fails; closed -> a failure fails the replay.
        circuits = {
            row.name: guard._state.breaker(row.name).state
            for row in rows
            if cluster and row.kind == KEY
        }
        waiting.update(row.id for row in rows if circuits.get(row.name) == "open")
        rows = [row for row in rows if row.id not in waiting]
        probes = sorted(name for name, state in circuits.items() if state == "half-open")
        keys = sorted({row.name for row in rows if row.kind == KEY} - set(probes))
        prefixes = sorted({row.name for row in rows if row.kind == PREFIX})
        went: set[tuple[str, str]] = set()
        failure: Exception | None = None
        try:
            if keys:
                self.io.invalidate(*keys)
                went.update((KEY, key) for key in keys)
        except BackendUnavailable:
            if not cluster:
                raise  # one node: the others would fail too
            # One node failing fails the call of all: each key on its own, then.
            for key in keys:
                try:
                    self.io.invalidate(key)
                    went.add((KEY, key))
                except BackendUnavailable as exc:
                    failure = failure or exc
        for key in probes:
            try:
                self.io.invalidate(key)
                went.add((KEY, key))
            except BackendUnavailable:
                waiting.update(row.id for row in rows if row.kind == KEY and row.name == key)
        for prefix in prefixes:  # a prefix spans every node: it waits for none
            try:
                self.io.invalidate_prefix(prefix)
                went.add((PREFIX, prefix))
            except BackendUnavailable as exc:
                if not cluster:
                    raise
                failure = failure or exc
        return [row for row in rows if (row.kind, row.name) in went], failure

    def _delete_sqlite(self, ids: list[int], *, wait: bool) -> None:
        """Delete replayed rows. Before serving, without waiting for the write lock:
        held (by the reader's own open transaction, maybe) the rows stay; their
        invalidation went through, a later replay only repeats it."""
        if wait:
            with self.engine.begin() as connection:
                _delete(connection, self.table, ids)
            return
        with self.engine.connect() as connection:
            busy = int(connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one())
            connection.exec_driver_sql("PRAGMA busy_timeout = 0")
            connection.commit()
            try:
                with connection.begin():
                    _delete(connection, self.table, ids)
            except sa.exc.OperationalError as exc:
                if "locked" not in str(exc.orig):
                    raise
                log.debug("%d replayed outbox rows stay: the database is locked", len(ids))
            finally:
                connection.exec_driver_sql(f"PRAGMA busy_timeout = {busy}")
                connection.commit()


def _bound_lock_waits(connection: sa.Connection, deadline: float) -> None:
    """PostgreSQL: a wait of this transaction for a lock (rows another replayer
    holds) ends at ``deadline``: the statement fails. (``lock_timeout`` 0 is no bound.)"""
    left_ms = max(1, int((deadline - time.monotonic()) * 1000))
    connection.exec_driver_sql(f"SET LOCAL lock_timeout = {left_ms}")


class OutboxReplayer:
    """Replays the outbox of a :class:`~cacheguard.CacheGuard`'s namespace.

    ``track_models(..., outbox=True)`` makes one and runs it by itself (before
    serving from Redis after an outage, and every ``outbox_poll`` seconds); make
    one yourself to replay from a process that tracks nothing (a cron job).
    ``bind`` is the engine of the database the outbox table lives in; ``table``
    defaults to ``outbox_table(MetaData())``; ``batch`` rows are read and
    invalidated at a time."""

    def __init__(
        self,
        guard: CacheGuard,
        bind: sa.Engine,
        table: sa.Table | None = None,
        *,
        batch: int = 500,
    ) -> None:
        if not isinstance(guard, CacheGuard):
            raise TypeError(f"OutboxReplayer needs a CacheGuard, not {type(guard).__name__}")
        if not isinstance(bind, sa.Engine):
            raise TypeError(f"bind must be an Engine, not {type(bind).__name__}")
        self._replay = _Replay(guard, bind, table, batch)
        self.table = self._replay.table

    def replay(self) -> int:
        """Invalidate every row of the namespace's outbox, then delete it; returns
        how many rows. Raises the first failure (the rows not yet deleted stay). On a
        cluster the rows of keys whose node's circuit is open stay, for a later
        replay. On PostgreSQL it waits at most the guard's ``wait_timeout`` for rows
        another replayer holds (then the database's lock timeout error is raised)."""
        return self._replay.replay()

    def has_rows(self) -> bool:
        """Does the namespace's outbox hold rows? (One indexed query.)"""
        return self._replay.has_rows()


class AsyncOutboxReplayer:
    """:class:`OutboxReplayer` for an :class:`~cacheguard.aio.AsyncCacheGuard`, on
    an ``AsyncEngine``: the same replay, run in a greenlet (as ``AsyncSession``
    runs its sync session), so its database calls and the guard's are awaited."""

    def __init__(
        self,
        guard: AsyncCacheGuard,
        bind: AsyncEngine,
        table: sa.Table | None = None,
        *,
        batch: int = 500,
    ) -> None:
        if not isinstance(guard, AsyncCacheGuard):
            raise TypeError(
                f"AsyncOutboxReplayer needs an AsyncCacheGuard, not {type(guard).__name__}"
            )
        if not isinstance(bind, AsyncEngine):
            raise TypeError(f"bind must be an AsyncEngine, not {type(bind).__name__}")
        self._replay = _Replay(guard, bind.sync_engine, table, batch)
        self.table = self._replay.table

    async def replay(self) -> int:
        """:meth:`OutboxReplayer.replay`, awaited."""
        return await greenlet_spawn(self._replay.replay)

    async def has_rows(self) -> bool:
        """:meth:`OutboxReplayer.has_rows`, awaited."""
        return await greenlet_spawn(self._replay.has_rows)


# -- what a tracker does with it --------------------------------------------------------------


class TrackerOutbox:
    """The outbox side of one :class:`~cacheguard.integrations.sqlalchemy.ModelTracker`: rows
    written in the session's transaction, deleted after the closing invalidation
    went through, and the replays (a hook of the guard's recovery, and the poller)."""

    def __init__(
        self, guard: Any, table: sa.Table, bind: sa.Engine | AsyncEngine, poll: Seconds
    ) -> None:
        self.guard = guard
        self.table = table
        self.namespace: str = guard.namespace
        if len(self.namespace) > _NAMESPACE_LENGTH:
            raise ValueError(f"the outbox keeps namespaces of up to {_NAMESPACE_LENGTH} characters")
        self.poll = check_positive("outbox_poll", poll)
        self._insert = table.insert()
        self.hook: Callable[[], Any]
        self._poller: _ThreadPoller | _TaskPoller
        if isinstance(bind, AsyncEngine):
            self._engine = bind.sync_engine  # the closing deletes run in the session's greenlet
            self.replayer: OutboxReplayer | AsyncOutboxReplayer = AsyncOutboxReplayer(
                guard, bind, table
            )
            self.hook = self._areplay
            self._poller = _TaskPoller(self.replayer, self.poll, guard)
        else:
            self._engine = bind
            self.replayer = OutboxReplayer(guard, bind, table)
            self.hook = self._replay
            self._poller = _ThreadPoller(self.replayer, self.poll, guard)

    def start(self) -> None:
        """Replay before serving from Redis (first at the guard's next read: this
        process may start after an outage), and poll."""
        self.guard._state.recovery.add(self.hook)
        self._poller.ensure_running()
        if isinstance(self._poller, _ThreadPoller):
            _outboxes.add(self)

    def stop(self) -> None:
        self.guard._state.recovery.remove(self.hook)
        self._poller.stop()

    def touch(self) -> None:
        """A hook of the tracker ran: the poller runs (started lazily on the loop of
        an asyncio guard; again in a forked child)."""
        self._poller.ensure_running()

    def _replay(self) -> None:
        self._poller.ensure_running()
        self.replayer._replay.replay(serving=True)

    async def _areplay(self) -> None:
        self._poller.ensure_running()
        await greenlet_spawn(self.replayer._replay.replay, serving=True)

    def write(
        self, session: Session, keys: Sequence[str], prefixes: Sequence[str]
    ) -> dict[tuple[str, str], int]:
        """Insert rows for ``keys`` and ``prefixes`` in ``session``'s transaction, on its
        own connection: they commit or roll back with its writes. Their ids, by
        ``(kind, name)``."""
        named = [(KEY, name) for name in keys] + [(PREFIX, prefix) for prefix in prefixes]
        rows = [{"namespace": self.namespace, "kind": k, "name": n} for k, n in named]
        connection = session.connection(bind_arguments={"clause": self._insert})
        ids = _insert(connection, self.table, rows)
        for _, name in named:
            self.guard._state.recorder.count("outbox_writes", name, 0.0, None, None)
        return dict(zip(named, ids, strict=True))

    def remove(self, ids: Collection[int]) -> None:
        """Delete rows whose invalidation was confirmed, in a short transaction of
        their own. Never raises: rows left behind are replayed (again) later."""
        if not ids:
            return
        try:
            with self._engine.begin() as connection:
                _delete(connection, self.table, sorted(ids))
        except Exception:
            log.exception("deleting %d outbox rows failed (they will be replayed)", len(ids))


def _insert(connection: sa.Connection, table: sa.Table, rows: list[dict[str, str]]) -> list[int]:
    if connection.dialect.insert_executemany_returning:
        returning = table.insert().returning(table.c.id, sort_by_parameter_order=True)
        return list(connection.execute(returning, rows).scalars())
    ids = []
    for row in rows:  # one statement a row, where executemany returns no ids
        key = connection.execute(table.insert(), row).inserted_primary_key
        assert key is not None
        ids.append(int(key[0]))
    return ids


def _delete(connection: sa.Connection, table: sa.Table, ids: Sequence[int]) -> None:
    for start in range(0, len(ids), _DELETE_CHUNK):
        chunk = ids[start : start + _DELETE_CHUNK]
        connection.execute(sa.delete(table).where(table.c.id.in_(chunk)))


# -- the pollers ----------------------------------------------------------------------------


class _ThreadPoller:
    """Replays a sync guard's outbox from a daemon thread every ``every`` seconds
    when it has rows; ends at :meth:`stop` (``tracker.remove()``), and at its next
    wake-up once the guard is closed."""

    def __init__(self, replayer: OutboxReplayer, every: float, guard: CacheGuard) -> None:
        self._replayer = replayer
        self._every = every
        self._guard = guard
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def ensure_running(self) -> None:
        thread = self._thread
        if (thread is not None and thread.is_alive()) or self._stopped.is_set():
            return
        with self._mutex:
            if self._guard._state.closed or self._stopped.is_set():
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="cacheguard-outbox", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_JOIN)

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            if self._guard._state.closed:
                return
            try:
                if self._replayer.has_rows():
                    self._replayer.replay()
            except GuardClosed:
                return
            except BackendUnavailable as exc:  # counted and logged by the guard
                log.info("outbox poll: Redis unreachable, the rows stay: %s", exc)
            except Exception:
                log.exception("outbox poll of namespace %r failed", self._guard.namespace)

    def reset_after_fork(self) -> None:
        """In a forked child the thread is gone (and may have held these): it starts
        again at the tracker's next hook or replay."""
        stopped = self._stopped.is_set()
        self._stopped = threading.Event()
        if stopped:
            self._stopped.set()
        self._mutex = threading.Lock()
        self._thread = None


class _TaskPoller:
    """The poller of an asyncio guard: a task on the guard's loop, started from
    inside that loop once the guard is bound to it (by the first hook or replay
    that runs there after a call of the guard); ``aclose()`` cancels it with the
    guard's other tasks."""

    def __init__(self, replayer: AsyncOutboxReplayer, every: float, guard: AsyncCacheGuard) -> None:
        self._replayer = replayer
        self._every = every
        self._guard = guard
        self._stopped = False
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        task = self._task
        if (task is not None and not task.done()) or self._stopped or self._guard._state.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on a loop yet: the next hook that runs on one starts it
        if self._guard._binding.loop is not loop:
            # Only on the guard's own loop: not on one it may never use (it binds at
            # its first call; the first replay, or the next transaction, starts it).
            return
        self._task = self._guard._spawn(self._run(), "cacheguard-outbox")

    def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        loop = task.get_loop()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            if self._stopped or self._guard._state.closed:
                return
            try:
                if await self._replayer.has_rows():
                    await self._replayer.replay()
            except GuardClosed:
                return
            except BackendUnavailable as exc:
                log.info("outbox poll: Redis unreachable, the rows stay: %s", exc)
            except Exception:
                log.exception("outbox poll of namespace %r failed", self._guard.namespace)


_outboxes: weakref.WeakSet[TrackerOutbox] = weakref.WeakSet()  # with a polling thread


def _reset_after_fork() -> None:
    for outbox in list(_outboxes):
        if isinstance(outbox._poller, _ThreadPoller):
            outbox._poller.reset_after_fork()
        # The child's first read replays (and so starts the child's poller).
        outbox.guard._state.recovery.mark()


on_fork_in_child(_reset_after_fork)


# -- monitoring --------------------------------------------------------------------------------


def _depth_query(table: sa.Table | None, namespace: str | None) -> sa.Select[Any]:
    table = checked_table(True if table is None else table)
    query = sa.select(sa.func.count()).select_from(table)
    return query if namespace is None else query.where(table.c.namespace == namespace)


def outbox_depth(
    bind: sa.Engine | sa.Connection,
    table: sa.Table | None = None,
    *,
    namespace: str | None = None,
) -> int:
    """How many rows wait in the outbox (of ``namespace``, or of all): the gauge to
    alert on. Rows stay only while some guard cannot replay them: a depth above 0
    for more than a few ``outbox_poll`` periods while Redis is up means replays
    fail (see the ``replay_failures`` counter and the logs)."""
    query = _depth_query(table, namespace)
    if isinstance(bind, sa.Connection):
        return int(bind.execute(query).scalar_one())
    with bind.connect() as connection:
        return int(connection.execute(query).scalar_one())


async def async_outbox_depth(
    bind: AsyncEngine | AsyncConnection,
    table: sa.Table | None = None,
    *,
    namespace: str | None = None,
) -> int:
    """:func:`outbox_depth` on an ``AsyncEngine`` (or ``AsyncConnection``)."""
    query = _depth_query(table, namespace)
    if isinstance(bind, AsyncConnection):
        return int((await bind.execute(query)).scalar_one())
    async with bind.connect() as connection:
        return int((await connection.execute(query)).scalar_one())
