"""The session hooks behind :func:`track_models`.

One transaction of a tracked session, from begin to end:

1. ``after_begin``: read the namespace's invalidation watermark before the
   database takes the snapshot, and register it as open in this thread (fills
   in this thread then cannot store from an older snapshot).
2. ``before_flush`` / ``after_flush``: the keys of every new, changed or deleted
   tracked object (old and new values of the template columns; new objects
   again after the INSERT, when their ids exist), write-locked in sorted order
   and invalidated before the first statement that touches them is committed.
3. ``do_orm_execute``: ORM ``update()`` / ``delete()`` / ``insert()``
   statements: the rows they touch are selected first (and again after an
   update, for the new values), then locked and invalidated like a flush.
   Statements touching more than ``max_rows`` rows, or whose rows cannot be
   selected, invalidate every key of the model's templates by prefix.
4. end of a savepoint: committed, its keys move to the enclosing transaction;
   rolled back, the keys only it touched are invalidated and released.
5. ``before_commit``: a write lock the transaction holds that was lost (a
   renewal found its holding gone: another writer may have got in) fails the
   commit with :class:`~cacheguard.exceptions.LockLostError`; nothing is
   committed, and every later commit of the transaction fails too, until it is
   rolled back (``with session.begin()`` does, as does closing the session).
6. end of the outermost transaction (commit, rollback or close): invalidate
   every key again (after a commit this removes anything filled from the old
   rows; after a rollback it is harmless), then release the locks.

With ``outbox=True``, a step 2 or 3 that finds Redis unreachable (or its circuit
open) writes the keys it could not lock and invalidate (the prefixes, on the
by-prefix paths) to the outbox table on the session's connection instead of
failing: the rows commit or roll back with the transaction (a savepoint's with
the savepoint). Step 6 then deletes the rows whose invalidation went through;
the rest wait for a replay (:mod:`cacheguard.integrations.sqlalchemy.outbox`).

Locks are held by the watchdog's renewals for as long as the transaction is
open; a process that dies mid-transaction frees them when its lease ends.

With an :class:`~cacheguard.aio.AsyncCacheGuard` and an ``async_sessionmaker`` the
same hooks run: ``AsyncSession`` runs its sync session, and so these events, in a
greenlet of the calling task, where the guard's coroutines are awaited in place
(``sqlalchemy.util.await_only``). Locks then belong to that task.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Mapper, ORMExecuteState, Session, SessionTransaction

from cacheguard._identity import on_fork_in_child
from cacheguard.cache.flows.read import client_error
from cacheguard.cache.flows.write import write_lock_lost
from cacheguard.cache.templates import (
    CACHE_KEYS_ATTRIBUTE,
    literal_prefix,
    model_templates,
    render_key,
    template_fields,
)
from cacheguard.cache.watermark import note_snapshot, snapshot_opened
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, KeyTemplateError
from cacheguard.integrations.sqlalchemy.guards import GuardIO, guard_io, session_class_of
from cacheguard.integrations.sqlalchemy.outbox import (
    KEY,
    PREFIX,
    TrackerOutbox,
    checked_bind,
    checked_table,
)

__all__ = ["CACHE_KEYS_ATTRIBUTE", "ModelTracker", "track_models"]

log = logging.getLogger("cacheguard.integrations.sqlalchemy")

_NOT_COMMITTED = (
    "the transaction was not committed: roll it back (its keys are then invalidated "
    "again and its locks released)"
)

_SESSION_EVENTS = (
    "after_begin",
    "before_flush",
    "after_flush",
    "before_commit",
    "after_commit",
    "after_transaction_end",
    "do_orm_execute",
)


@dataclass(frozen=True)
class _ModelKeys:
    """The key templates of one model, checked against its columns."""

    model: type[Any]
    templates: tuple[str, ...]
    fields: dict[str, tuple[str, ...]]  # template -> the attributes it substitutes
    primary_key: tuple[str, ...]  # attribute names of the primary key columns

    @property
    def columns(self) -> tuple[str, ...]:
        names = {f for fs in self.fields.values() for f in fs} | set(self.primary_key)
        return tuple(sorted(names))


@dataclass
class _TransactionLocks:
    """What one session holds for its current outermost transaction."""

    snapshot_watermark: int | None = None
    # name -> (lock, its hold's handle); every hold is ``holder``'s
    locks: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # name -> two-tier lock whose local write tier alone is held (outboxed keys)
    local_holds: dict[str, Any] = field(default_factory=dict)
    # Keyed by id(): holding the transactions would keep the session alive, and a
    # dropped session must be collected to release its locks. Entries end with them.
    by_transaction: dict[int, set[str]] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)  # invalidated by prefix at the end
    finalizer: weakref.finalize | None = None  # type: ignore[type-arg]
    holder: Any = None  # whom the locks are for, until the outermost transaction ends
    # Outbox rows written, by id() of the transaction (or savepoint) that wrote them:
    # (kind, name) -> row id. A savepoint's leave with it when it is rolled back.
    outboxed: dict[int, dict[tuple[str, str], int]] = field(default_factory=dict)
    outbox: TrackerOutbox | None = None  # where they are

    def outboxed_names(self, kind: str) -> set[str]:
        return {name for rows in self.outboxed.values() for k, name in rows if k == kind}

    def __hash__(self) -> int:  # held in a WeakSet (see cache/watermark.py)
        return id(self)


class ModelTracker:
    """The hooks :func:`track_models` installed; ``remove()`` uninstalls them."""

    def __init__(
        self,
        guard: Any,
        session_factory: Any,
        models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
        *,
        lock_timeout: Seconds | None = None,
        max_rows: int = 1000,
        outbox: bool | sa.Table = False,
        outbox_poll: Seconds = 1.0,
        outbox_bind: Any = None,
    ) -> None:
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError("max_rows must be an int >= 1")
        self.guard = guard
        self._io: GuardIO = guard_io(guard)  # TypeError for anything but the two guards
        self.session_factory = session_factory
        self._events_target = session_class_of(guard, session_factory)
        # Checked here, not at the first write: seconds from now on (a timedelta converted).
        self.lock_timeout = (
            None if lock_timeout is None else check_positive("lock_timeout", lock_timeout)
        )
        self.max_rows = max_rows
        self._models = _check_models(models)
        self._outbox: TrackerOutbox | None = None
        if outbox is not False:
            self._outbox = TrackerOutbox(
                guard,
                checked_table(outbox),
                checked_bind(guard, session_factory, outbox_bind),
                outbox_poll,
            )
        self._by_class: dict[type[Any], _ModelKeys | None] = {}
        self._info_key = f"cacheguard.tracker.{id(self)}"
        self._history_listeners: list[tuple[Any, str, Any]] = []

        def keep_old_value(target: Any, value: Any, oldvalue: Any, initiator: Any) -> Any:
            return value  # one function per tracker: remove() takes only its own

        for spec in self._models.values():
            for name in spec.columns:
                attribute = getattr(spec.model, name)
                # Loads the old value when a template column is set without being
                # loaded, so the key named by the old value can be invalidated too.
                event.listen(attribute, "set", keep_old_value, active_history=True, propagate=True)
                self._history_listeners.append((attribute, "set", keep_old_value))
        for spec in self._models.values():
            for template, fields in spec.fields.items():
                if fields:  # fills under it honour this model's prefix invalidations
                    guard.watch_prefix(literal_prefix(template))
        for name in _SESSION_EVENTS:
            event.listen(self._events_target, name, getattr(self, f"_on_{name}"))
        if self._outbox is not None:
            self._outbox.start()

    @property
    def outbox_table(self) -> sa.Table | None:
        """The outbox table (``outbox=True``), or None."""
        return self._outbox.table if self._outbox is not None else None

    @property
    def outbox_replayer(self) -> Any:
        """The :class:`~cacheguard.integrations.sqlalchemy.OutboxReplayer` (or its asyncio twin)
        of the outbox, or None."""
        return self._outbox.replayer if self._outbox is not None else None

    def remove(self) -> None:
        """Uninstall the hooks (transactions already open keep what they hold); stop
        replaying the outbox (its poller ends)."""
        if self._outbox is not None:
            self._outbox.stop()
        for name in _SESSION_EVENTS:
            if event.contains(self._events_target, name, getattr(self, f"_on_{name}")):
                event.remove(self._events_target, name, getattr(self, f"_on_{name}"))
        for target, name, listener in self._history_listeners:
            if event.contains(target, name, listener):
                event.remove(target, name, listener)
        self._history_listeners.clear()

    # -- introspection ---------------------------------------------------------------

    def keys_of(self, obj: Any) -> set[str]:
        """The key names ``obj``'s current column values give (empty if untracked)."""
        spec = self._spec_for(type(obj))
        if spec is None:
            return set()
        return self._render(spec, _current_values(obj, spec))

    def held_keys(self, session: Session) -> frozenset[str]:
        """The keys ``session``'s transaction holds write locks on."""
        state = session.info.get(self._info_key)
        return frozenset(state.locks) if state is not None else frozenset()

    # -- transaction begin -------------------------------------------------------------

    def _on_after_begin(
        self, session: Session, transaction: SessionTransaction, connection: Any
    ) -> None:
        if self._outbox is not None:
            self._outbox.touch()  # its poller runs (a task starts on the session's loop)
        state = self._state(session)
        if state.snapshot_watermark is not None:
            return  # a second connection or a savepoint of the same transaction
        try:
            state.snapshot_watermark = self._io.watermark()
        except BackendUnavailable as exc:
            # Unknown: no fill from this snapshot may store (-1 is below every version).
            state.snapshot_watermark = -1
            log.warning("no snapshot watermark (Redis unreachable): %s", exc)
        snapshot_opened(state)

    # -- flushes -----------------------------------------------------------------------

    def _on_before_flush(self, session: Session, flush_context: Any, instances: Any) -> None:
        self._lock(session, self._changed_keys(session, before_flush=True))

    def _on_after_flush(self, session: Session, flush_context: Any) -> None:
        # New objects have their ids now, and relationship-set foreign keys their values.
        self._lock(session, self._changed_keys(session, before_flush=False))

    def _changed_keys(self, session: Session, *, before_flush: bool) -> set[str]:
        names: set[str] = set()
        with session.no_autoflush:
            for obj in session.new:
                spec = self._spec_for(type(obj))
                if spec is not None:
                    names |= self._render(spec, _current_values(obj, spec), skip_none=before_flush)
            changed = [
                o for o in session.dirty if session.is_modified(o, include_collections=False)
            ]
            for obj in [*changed, *session.deleted]:
                spec = self._spec_for(type(obj))
                if spec is not None:
                    names |= self._render(spec, _current_values(obj, spec))
                    names |= self._render(spec, _old_values(obj, spec))
        return names

    # -- ORM statements ----------------------------------------------------------------------

    def _on_do_orm_execute(self, orm_state: ORMExecuteState) -> Any:
        session = orm_state.session
        state = session.info.get(self._info_key)
        if state is not None and state.snapshot_watermark is not None:
            note_snapshot(state.snapshot_watermark)  # a loader using this session
        if not (orm_state.is_update or orm_state.is_delete or orm_state.is_insert):
            return None
        mapper: Mapper[Any] | None = orm_state.bind_mapper
        spec = self._spec_for(mapper.class_) if mapper is not None else None
        if spec is None:
            return None
        if orm_state.is_insert:
            return self._run_insert(session, spec, orm_state)
        by_key = isinstance(orm_state.parameters, list)  # ORM bulk UPDATE by primary key
        rows = self._touched_rows(session, spec, orm_state)
        if rows is None:
            self._lock_by_prefix(session, spec)
            return None
        self._lock(session, self._fixed(spec) | self._names(spec, rows))
        result = orm_state.invoke_statement()
        # The rows were selected (and, where the database can, row-locked) before the
        # cache locks were waited for; a row that came to match the WHERE meanwhile is
        # only visible in the count. Then the keys are not known: invalidate by prefix.
        count = getattr(result, "rowcount", -1)
        if not by_key and isinstance(count, int) and count >= 0 and count != len(rows):
            self._lock_by_prefix(session, spec)
        if orm_state.is_update and rows:
            # New values (an update may move a row to another key); ``result`` is
            # left for the caller to consume as usual.
            after = self._select_by_key(session, spec, _primary_keys(spec, rows))
            if after is None:
                self._lock_by_prefix(session, spec)
            else:
                self._lock(session, self._names(spec, after))
        return result

    def _run_insert(self, session: Session, spec: _ModelKeys, orm_state: ORMExecuteState) -> Any:
        """An ORM insert(): keys from the values given; rows an upsert overwrites are
        selected first; keys naming generated ids come from the result, else by prefix."""
        params: Any = orm_state.parameters
        rows: list[Any] = params if isinstance(params, list) else [params] if params else []
        rows = [r for r in rows if isinstance(r, Mapping)]
        if not rows:  # insert(...).values(...): the values are in the statement
            rows = [_statement_values(orm_state.statement)]
        names = self._fixed(spec)
        with_keys = bool(rows) and all(set(spec.primary_key) <= set(r) for r in rows)
        if with_keys:  # an upsert would overwrite these rows: their old values count
            existing = self._select_by_key(session, spec, _primary_keys(spec, rows))
            if existing is None:
                self._lock_by_prefix(session, spec)
            else:
                names |= self._names(spec, existing)
        elif getattr(orm_state.statement, "_post_values_clause", None) is not None:
            self._lock_by_prefix(session, spec)  # ON CONFLICT on another column: rows unknown
        later: list[str] = []
        for template, fields in spec.fields.items():
            if not fields:
                continue
            if rows and all(set(fields) <= set(r) for r in rows):
                names |= {
                    render_key(template, r, max_length=self._io.settings.max_key_length)
                    for r in rows
                }
            else:
                later.append(template)
        self._lock(session, names)
        result = orm_state.invoke_statement()
        if later:
            generated = getattr(result, "inserted_primary_key_rows", None) or []
            new_rows = None
            if generated and all(None not in k for k in generated):
                new_rows = self._select_by_key(session, spec, [tuple(k) for k in generated])
            if new_rows is None:
                for template in later:  # ids the database generated, not reported
                    self._invalidate_prefix(session, template)
            else:
                self._lock(session, self._names(spec, new_rows))
        return result

    def _touched_rows(
        self, session: Session, spec: _ModelKeys, orm_state: ORMExecuteState
    ) -> list[dict[str, Any]] | None:
        """The template and key column values of the rows the statement touches, or
        None when they cannot be listed (too many). The rows are locked in the
        database where it supports ``FOR UPDATE``, so they cannot leave the set."""
        params = orm_state.parameters
        if isinstance(params, list):
            try:
                keys = _primary_keys(spec, params)
            except (KeyError, TypeError):
                return None
            if len(keys) > self.max_rows:
                return None
            where = _primary_key_in(spec, keys)
        else:
            where = getattr(orm_state.statement, "whereclause", None)
        return self._select_rows(session, spec, where, for_update=True)

    def _select_by_key(
        self, session: Session, spec: _ModelKeys, keys: list[tuple[Any, ...]]
    ) -> list[dict[str, Any]] | None:
        return self._select_rows(session, spec, _primary_key_in(spec, keys))

    def _select_rows(
        self, session: Session, spec: _ModelKeys, where: Any, *, for_update: bool = False
    ) -> list[dict[str, Any]] | None:
        query = sa.select(*(getattr(spec.model, c) for c in spec.columns))
        if where is not None:
            query = query.where(where)
        query = query.limit(self.max_rows + 1).execution_options(autoflush=False)
        if for_update:
            query = query.with_for_update()
        rows = [dict(r) for r in session.execute(query).mappings()]
        return rows if len(rows) <= self.max_rows else None

    def _lock_by_prefix(self, session: Session, spec: _ModelKeys) -> None:
        self._lock(session, self._fixed(spec))
        for template, fields in spec.fields.items():
            if fields:
                self._invalidate_prefix(session, template)

    def _invalidate_prefix(self, session: Session, template: str) -> None:
        """Invalidate every key ``template`` can name: now, and again when the
        outermost transaction ends (nothing is locked; see docs/design.md). Redis
        unreachable, with the outbox: the prefix goes to the outbox instead."""
        prefix = literal_prefix(template)
        state = self._state(session)
        state.prefixes.add(prefix)
        if self._outbox is not None and prefix in state.outboxed_names(PREFIX):
            return  # its row is in the transaction already
        try:
            self._io.invalidate_prefix(prefix)
        except BackendUnavailable as exc:
            if self._outbox is None:
                raise
            self._to_outbox(session, state, (), (prefix,), exc)

    # -- locks ---------------------------------------------------------------------------------

    def _lock(self, session: Session, names: set[str]) -> None:
        """Write-lock and invalidate ``names`` for the session's transaction; with
        the outbox, Redis unreachable puts them in the outbox instead."""
        if not names:
            return
        state = self._state(session)
        transaction = session.get_nested_transaction() or session.get_transaction()
        if transaction is not None:
            state.by_transaction.setdefault(id(transaction), set()).update(names)
        outboxed = state.outboxed_names(KEY) if self._outbox is not None else set()
        fresh = sorted(n for n in names if n not in state.locks and n not in outboxed)
        if not fresh:
            return
        if state.finalizer is None:
            # A session dropped without close(): release when it is collected (by a
            # background thread: the collector may run inside any lock of ours).
            _start_orphan_thread()
            state.finalizer = weakref.finalize(session, _release_later, self._io, state)
        if state.holder is None:
            state.holder = self._io.enter_holder()
        if self._outbox is None:
            self._lock_and_invalidate(state, fresh)
            return
        try:
            # An open circuit costs no wait (each lock would wait out a dead socket).
            closed = self.guard._state.circuit_open(f"write-locking {', '.join(fresh)}", fresh)
            if closed is not None:
                raise closed
            self._lock_and_invalidate(state, fresh, report=True)
        except BackendUnavailable as exc:
            # Locks taken before the failure stay held until the transaction ends.
            self._to_outbox(session, state, fresh, (), exc)

    def _lock_and_invalidate(
        self, state: _TransactionLocks, fresh: list[str], *, report: bool = False
    ) -> None:
        """``report``: tell the guard's circuit breakers how the locks' calls went
        (the lock layer does not); its probe may be one of them."""
        me = state.holder
        for name in fresh:  # one global order within each batch
            lock = self._io.rwlock(name)
            try:
                handle = self._io.acquire_write(lock, self.lock_timeout, me)
            except BackendUnavailable as exc:
                if report:
                    self.guard._state.backend_failed(name, client_error(exc))
                raise
            state.locks[name] = (lock, handle)
        if report:
            for breaker in {id(b): b for b in map(self.guard._state.breaker, fresh)}.values():
                breaker.success()
        self._io.invalidate(*fresh)

    def _to_outbox(
        self,
        session: Session,
        state: _TransactionLocks,
        keys: Sequence[str],
        prefixes: Sequence[str],
        error: BackendUnavailable,
    ) -> None:
        """Redis is unreachable: the invalidations of ``keys`` and ``prefixes`` go
        to the outbox, in the session's transaction, and the statement goes on."""
        assert self._outbox is not None
        rows = self._outbox.write(session, keys, prefixes)
        # No write lock in Redis: hold the keys' local write tier instead, so this
        # transaction's own reads load privately (its writes are uncommitted: never
        # stored, remembered nor shared) and this process's other callers wait.
        for name in sorted(keys):
            if name not in state.locks and name not in state.local_holds:
                timeout = self.lock_timeout
                if timeout is None:
                    timeout = self._io.settings.wait_timeout
                state.local_holds[name] = self._io.hold_local(name, timeout, state.holder)
        transaction = session.get_nested_transaction() or session.get_transaction()
        state.outboxed.setdefault(id(transaction), {}).update(rows)
        state.outbox = self._outbox
        self.guard._state.forget_here(keys)
        for prefix in prefixes:
            _forget_prefix_here(self.guard, prefix)
        self.guard._state.recovery.mark()  # replay before serving from Redis again
        log.warning(
            "Redis unreachable (%s): %d invalidations go to the outbox with the transaction",
            error,
            len(rows),
        )

    # -- transaction end -----------------------------------------------------------------------

    def _on_before_commit(self, session: Session) -> None:
        """A lost write lock fails the commit (raised here, SQLAlchemy commits nothing);
        the lock stays listed, lost, so a commit tried again fails again."""
        state = session.info.get(self._info_key)
        if state is None:
            return
        for name, (_, handle) in state.locks.items():
            if getattr(handle, "lost", False):
                raise write_lock_lost(name, handle, None, then=_NOT_COMMITTED)

    def _on_after_commit(self, session: Session) -> None:
        state = session.info.get(self._info_key)
        if state is not None:
            committed = session.get_nested_transaction() or session.get_transaction()
            if committed is not None:
                state.committed.add(id(committed))

    def _on_after_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        state = session.info.get(self._info_key)
        if state is None:
            return
        if transaction.parent is None:
            _release_all(self._io, state, committed=id(transaction) in state.committed)
            return
        if not transaction.nested:
            return  # a flush's internal subtransaction
        own = state.by_transaction.pop(id(transaction), set())
        rows = state.outboxed.pop(id(transaction), {})
        if id(transaction) in state.committed:
            state.committed.discard(id(transaction))
            enclosing = _enclosing(transaction)
            if enclosing is not None:
                state.by_transaction.setdefault(id(enclosing), set()).update(own)
                state.outboxed.setdefault(id(enclosing), {}).update(rows)
            return
        # Rolled back: what only this savepoint touched is as before (its outbox rows
        # went with it); let it go.
        still = set().union(*state.by_transaction.values())
        _release(self._io, state, sorted(own - still))

    # -- helpers ---------------------------------------------------------------------------------

    def _state(self, session: Session) -> _TransactionLocks:
        state = session.info.get(self._info_key)
        if state is None:
            state = session.info[self._info_key] = _TransactionLocks()
        return state

    def _spec_for(self, cls: type[Any]) -> _ModelKeys | None:
        if cls not in self._by_class:
            self._by_class[cls] = next(
                (self._models[base] for base in cls.__mro__ if base in self._models), None
            )
        return self._by_class[cls]

    def _fixed(self, spec: _ModelKeys) -> set[str]:
        return {
            render_key(t, {}, max_length=self._io.settings.max_key_length)
            for t, fields in spec.fields.items()
            if not fields
        }

    def _names(self, spec: _ModelKeys, rows: Iterable[Mapping[str, Any]]) -> set[str]:
        """The key names of ``rows`` (column values by attribute name)."""
        return set().union(*(self._render(spec, row) for row in rows))

    def _render(
        self, spec: _ModelKeys, values: Mapping[str, Any], *, skip_none: bool = False
    ) -> set[str]:
        names = set()
        for template, fields in spec.fields.items():
            if skip_none and any(values.get(f) is None for f in fields):
                continue  # a new object's generated id: named after the INSERT
            names.add(render_key(template, values, max_length=self._io.settings.max_key_length))
        return names


def track_models(
    guard: Any,
    session_factory: Any,
    models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
    *,
    lock_timeout: Seconds | None = None,
    max_rows: int = 1000,
    outbox: bool | sa.Table = False,
    outbox_poll: Seconds = 1.0,
    outbox_bind: Any = None,
) -> ModelTracker:
    """Keep ``guard``'s keys right for every session ``session_factory`` makes.

    ``models`` maps each model class to its key templates, e.g.
    ``{Menu: ("menu:list", "menu:{id}")}``; fields name the model's column
    attributes. A list of classes reads each one's ``__cache_keys__`` instead.
    ``session_factory`` is a ``sessionmaker``, a ``Session`` subclass or a
    ``scoped_session``; with an :class:`~cacheguard.aio.AsyncCacheGuard`, an
    ``async_sessionmaker`` (or an ``AsyncSession`` subclass with a
    ``sync_session_class`` of its own). ``lock_timeout`` bounds each write-lock wait (default:
    the guard's ``wait_timeout``); statements touching more than ``max_rows``
    rows invalidate their model's templates by prefix. ``lock_timeout`` and
    ``outbox_poll`` are seconds or a ``timedelta``.

    ``outbox=True`` (or a table made by :func:`~cacheguard.integrations.sqlalchemy.outbox_table`;
    True is the default table, ``cacheguard_outbox``): while Redis is unreachable,
    tracked writes go on and their invalidations go to the outbox table in the
    same transaction, replayed by every guard before it serves from Redis again
    and by a poller every ``outbox_poll`` seconds. ``outbox_bind``: the engine
    (``AsyncEngine`` for an asyncio guard) replays use; default: the session
    factory's ``bind``. The table must exist (create it in a migration). See
    ``docs/outage.md``.
    """
    return ModelTracker(
        guard,
        session_factory,
        models,
        lock_timeout=lock_timeout,
        max_rows=max_rows,
        outbox=outbox,
        outbox_poll=outbox_poll,
        outbox_bind=outbox_bind,
    )


# -- module helpers ---------------------------------------------------------------------------


def _check_models(
    models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
) -> dict[type[Any], _ModelKeys]:
    pairs = model_templates(models)
    checked: dict[type[Any], _ModelKeys] = {}
    for model, templates in pairs:
        try:
            mapper = sa.inspect(model)
        except sa.exc.NoInspectionAvailable:
            raise TypeError(f"{model!r} is not a mapped SQLAlchemy class") from None
        if not isinstance(mapper, Mapper):
            raise TypeError(f"{model!r} is not a mapped SQLAlchemy class")
        if isinstance(templates, str) or not templates:
            raise KeyTemplateError(
                f"the key templates of {model.__name__} must be a non-empty sequence of "
                f"strings, got {templates!r}"
            )
        columns = set(mapper.column_attrs.keys())
        fields: dict[str, tuple[str, ...]] = {}
        for template in templates:
            roots = tuple(dict.fromkeys(template_fields(template)))
            unknown = [r for r in roots if r not in columns]
            if unknown:
                raise KeyTemplateError(
                    f"key template {template!r} of {model.__name__} names {unknown[0]!r}, "
                    f"which is not a column attribute ({', '.join(sorted(columns))})"
                )
            fields[template] = roots
        primary_key = tuple(mapper.get_property_by_column(c).key for c in mapper.primary_key)
        checked[model] = _ModelKeys(model, tuple(templates), fields, primary_key)
    return checked


def _current_values(obj: Any, spec: _ModelKeys) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in spec.columns}


def _old_values(obj: Any, spec: _ModelKeys) -> dict[str, Any]:
    """Column values as last loaded from or flushed to the database."""
    inspected = sa.inspect(obj)
    values = {}
    for name in spec.columns:
        history = inspected.attrs[name].history
        values[name] = history.deleted[0] if history.deleted else getattr(obj, name)
    return values


def _statement_values(statement: Any) -> dict[str, Any]:
    """The literal values of an ``insert(...).values(...)``, by column key."""
    try:
        return {k: v for k, v in statement.compile().params.items() if v is not None}
    except Exception:  # a statement that does not compile on its own: values unknown
        return {}


def _primary_keys(spec: _ModelKeys, rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(row[k] for k in spec.primary_key) for row in rows]


def _primary_key_in(spec: _ModelKeys, keys: list[tuple[Any, ...]]) -> Any:
    columns = [getattr(spec.model, k) for k in spec.primary_key]
    if len(columns) == 1:
        return columns[0].in_([k[0] for k in keys])
    return sa.tuple_(*columns).in_(keys)


def _enclosing(transaction: SessionTransaction) -> SessionTransaction | None:
    """The savepoint or outermost transaction around ``transaction``."""
    parent = transaction.parent
    while parent is not None and parent.parent is not None and not parent.nested:
        parent = parent.parent
    return parent


def _forget_prefix_here(guard: Any, prefix: str) -> None:
    """What this process keeps of the keys under ``prefix`` goes (L1 keeps no
    prefixes: all of it)."""
    if guard._state.last_seen is not None:
        guard._state.last_seen.drop_prefix(prefix)
    if guard._state.l1 is not None:
        guard._state.l1.tier.clear()


def _release(guard: GuardIO, state: _TransactionLocks, names: list[str]) -> set[str]:
    """Invalidate ``names`` once more (locked or not: a lock that timed out still
    leaves a change behind), then release the locks among them; the names whose
    invalidation went through. Never raises: it runs after the database has
    committed or rolled back."""
    if not names:
        return set()
    invalidated: set[str] = set()
    try:
        guard.invalidate(*names)
        invalidated = set(names)
    except Exception:
        log.exception("invalidating %d keys at the end of a transaction failed", len(names))
    for name in reversed(names):
        local = state.local_holds.pop(name, None)
        if local is not None:
            try:
                guard.release_local(local, state.holder)
            except Exception:
                log.exception("releasing the local write hold of %r failed", name)
        held = state.locks.pop(name, None)
        if held is None:
            continue
        try:
            guard.release_write(held[0], state.holder)
        except Exception:
            log.exception("releasing the write lock of %r failed", name)
    return invalidated


def _release_all(guard: GuardIO, state: _TransactionLocks, *, committed: bool = False) -> None:
    """The outermost transaction ended: invalidate everything again, release all;
    after a commit, delete the outbox rows whose invalidation went through now."""
    touched = set().union(*state.by_transaction.values())
    names = list(state.locks) + sorted(touched - set(state.locks))  # locks in taking order
    invalidated = {(KEY, name) for name in _release(guard, state, names)}
    for prefix in sorted(state.prefixes):
        try:
            guard.invalidate_prefix(prefix)
        except Exception:
            log.exception("invalidating the keys of %r* failed", prefix)
        else:
            invalidated.add((PREFIX, prefix))
    rows = {named: row for written in state.outboxed.values() for named, row in written.items()}
    if committed and rows and state.outbox is not None:  # rolled back, the rows are gone
        # Only rows whose invalidation is confirmed; the others wait for a replay.
        confirmed = [row for named, row in rows.items() if named in invalidated]
        state.outbox.remove(confirmed)
    state.outboxed.clear()
    state.outbox = None
    state.prefixes.clear()
    state.by_transaction.clear()
    state.committed.clear()
    state.snapshot_watermark = None  # no longer open (see cache/watermark.py)
    if state.holder is not None:
        holder, state.holder = state.holder, None
        guard.leave_holder(holder)
    if state.finalizer is not None:
        state.finalizer.detach()
        state.finalizer = None


_orphans: queue.SimpleQueue[tuple[GuardIO, _TransactionLocks]] = queue.SimpleQueue()
_orphan_thread: threading.Thread | None = None
_orphan_mutex = threading.Lock()


def _release_later(guard: GuardIO, state: _TransactionLocks) -> None:
    """Finalizer of a dropped session: hand its locks to the releasing thread
    (SimpleQueue.put is safe inside the garbage collector; nothing else is)."""
    _orphans.put((guard, state))


def _start_orphan_thread() -> None:
    """Start the thread that releases dropped sessions' locks (once per process),
    before any finalizer can need it."""
    global _orphan_thread
    with _orphan_mutex:
        if _orphan_thread is None or not _orphan_thread.is_alive():
            _orphan_thread = threading.Thread(
                target=_release_orphans, name="cacheguard-orphans", daemon=True
            )
            _orphan_thread.start()


def _release_orphans() -> None:
    while True:
        guard, state = _orphans.get()
        _release_all(guard, state)  # logs its failures, never raises


def _reset_after_fork() -> None:
    global _orphans, _orphan_thread, _orphan_mutex
    _orphans = queue.SimpleQueue()  # the parent's dropped sessions are the parent's
    _orphan_thread = None
    _orphan_mutex = threading.Lock()


on_fork_in_child(_reset_after_fork)
