"""The outbox: the invalidations of writes committed while Redis was unreachable.

With ``track_models(..., outbox=True)`` a tracked flush or ORM statement that
cannot write-lock or invalidate its keys (Redis down, a partition, the circuit
open) does not fail: it inserts the keys (or, on the by-prefix paths, the
prefixes) into the outbox table on the session's own connection, so the rows
commit, or roll back, with the transaction's writes. After the commit the
closing step invalidates them again and deletes exactly its rows once that went
through; otherwise the rows wait for a replay:

- before a guard serves a value from Redis after an outage it saw (its replay
  hook, :mod:`cacheguard.cache.recovery`), in every process, also at start-up;
- every ``outbox_poll`` seconds in every tracking process (the poller), which
  bounds the staleness in processes that never saw the outage (a partition
  between one process and Redis): about ``outbox_poll`` plus one replay.

A replay reads its namespace's rows oldest first, a batch at a time (on
PostgreSQL ``FOR UPDATE SKIP LOCKED``, so replayers in many processes share the
rows out, then one pass that waits for the rows others hold and takes what they
could not replay), invalidates them through the guard and only then deletes them.
Invalidating twice is harmless, so a replayer that dies between the two only
leaves rows to replay again. See ``docs/outage.md``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from sqlalchemy.util import greenlet_spawn

from cacheguard._identity import on_fork_in_child
from cacheguard.aio.guard import AsyncCacheGuard
from cacheguard.cache.guard import CacheGuard
from cacheguard.checks import check_int, check_positive
from cacheguard.exceptions import BackendUnavailable, GuardClosed
from cacheguard.sqlalchemy.guards import GuardIO, guard_io

__all__ = [
    "DEFAULT_OUTBOX_TABLE",
    "AsyncOutboxReplayer",
    "OutboxReplayer",
    "async_outbox_depth",
    "outbox_depth",
    "outbox_table",
]

log = logging.getLogger("cacheguard.sqlalchemy")

DEFAULT_OUTBOX_TABLE = "cacheguard_outbox"
KEY, PREFIX = "key", "prefix"  # what a row's name is
_NAMESPACE_LENGTH = 255
_DELETE_CHUNK = 500  # ids per DELETE ... WHERE id IN (...)
_STOP_JOIN = 5.0  # s: how long remove() waits for a poll under way


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
            "make it with cacheguard.sqlalchemy.outbox_table()"
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
    engine and the guard's :class:`~cacheguard.sqlalchemy.guards.GuardIO` (for an
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
        claim = (
            sa.select(table.c.id, table.c.kind, table.c.name)
            .where(table.c.namespace == namespace)
            .order_by(table.c.id)
            .limit(self.batch)
        )
        # (claim, until empty): on PostgreSQL the rows are locked while their batch is
        # invalidated, and other replayers skip them; then a pass that waits for the
        # rows others hold and takes what they could not replay (a replay that
        # returns must leave no row committed before it behind: guards serve after
        # it). Rows deleted during that wait shorten a batch: it goes on until empty.
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

    def replay(self) -> int:
        """Replay batches until the namespace's outbox is empty; how many rows. A
        batch that fails raises (its rows stay)."""
        total = 0
        for claim, until_empty in self._claims:
            while True:
                done = self._replay_batch(claim)
                total += done
                if done == 0 or (done < self.batch and not until_empty):
                    break
        return total

    def _replay_batch(self, claim: sa.Select[Any]) -> int:
        if self._skip_locked:
            with self.engine.begin() as connection:
                rows = connection.execute(claim).all()
                if rows:
                    self._invalidate(rows)
                    _delete(connection, self.table, [row.id for row in rows])
        else:  # no transaction held across Redis calls: SQLite would lock writers out
            with self.engine.connect() as connection:
                rows = connection.execute(claim).all()
            if rows:
                self._invalidate(rows)
                with self.engine.begin() as connection:
                    _delete(connection, self.table, [row.id for row in rows])
        for row in rows:
            self.guard._stats.count("outbox_replays", row.name, 0.0, None, None)
        return len(rows)

    def _invalidate(self, rows: Sequence[Any]) -> None:
        keys = sorted({row.name for row in rows if row.kind == KEY})
        prefixes = sorted({row.name for row in rows if row.kind == PREFIX})
        strange = {row.kind for row in rows} - {KEY, PREFIX}
        if strange:
            raise ValueError(f"outbox rows of unknown kinds {sorted(strange)} in {self.table.name}")
        if keys:
            self.io.invalidate(*keys)
        for prefix in prefixes:
            self.io.invalidate_prefix(prefix)


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
        how many rows. Raises the first failure (the rows not yet deleted stay)."""
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
    """The outbox side of one :class:`~cacheguard.sqlalchemy.ModelTracker`: rows
    written in the session's transaction, deleted after the closing invalidation
    went through, and the replays (a hook of the guard's recovery, and the poller)."""

    def __init__(self, guard: Any, table: sa.Table, bind: sa.Engine | AsyncEngine, poll: float):
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
        self.guard._recovery.add(self.hook)
        self._poller.ensure_running()
        if isinstance(self._poller, _ThreadPoller):
            _outboxes.add(self)

    def stop(self) -> None:
        self.guard._recovery.remove(self.hook)
        self._poller.stop()

    def touch(self) -> None:
        """A hook of the tracker ran: the poller runs (started lazily on the loop of
        an asyncio guard; again in a forked child)."""
        self._poller.ensure_running()

    def _replay(self) -> None:
        assert isinstance(self.replayer, OutboxReplayer)
        self._poller.ensure_running()
        self.replayer.replay()

    async def _areplay(self) -> None:
        assert isinstance(self.replayer, AsyncOutboxReplayer)
        self._poller.ensure_running()
        await self.replayer.replay()

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
            self.guard._stats.count("outbox_writes", name, 0.0, None, None)
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
            if self._guard._closed or self._stopped.is_set():
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
            if self._guard._closed:
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
    inside the loop (the first hook or replay that runs there); ``aclose()``
    cancels it with the guard's other tasks."""

    def __init__(self, replayer: AsyncOutboxReplayer, every: float, guard: AsyncCacheGuard) -> None:
        self._replayer = replayer
        self._every = every
        self._guard = guard
        self._stopped = False
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        task = self._task
        if (task is not None and not task.done()) or self._stopped or self._guard._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on a loop yet: the next hook that runs on one starts it
        bound = self._guard._binding.loop
        if bound is not None and bound is not loop:
            return  # only on the guard's own loop
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
            if self._stopped or self._guard._closed:
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
        outbox.guard._recovery.mark()


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
