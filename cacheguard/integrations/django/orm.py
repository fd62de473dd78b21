"""The ORM hooks behind :func:`track_models`: Django writes that keep the cache right.

Django has no session to listen on: every write goes through a handful of
methods, patched once per process while a tracker is open (a write to a model
that is not tracked costs one dictionary lookup; every outermost ``atomic``
block, whatever it writes, one watermark read from Redis unless the trackers
pass ``snapshots=False``):

* ``Model.save_base`` (``save()``, ``create()``, ``get_or_create()``,
  ``update_or_create()``, fixtures' raw saves, ``asave()``...), and the block it
  opens around its SQL (``django.db.models.base.transaction`` is stood in for):
  the hooks' work and transaction wrap the SQL only, so ``pre_save`` and
  ``post_save`` handlers run outside them, as without tracking;
* ``Collector.delete`` (``Model.delete()``, ``QuerySet.delete()`` and what they
  cascade to, fast deletes and ``on_delete=SET_NULL``/``SET_DEFAULT``/``SET()``
  updates included: signals would miss the fast ones);
* ``QuerySet.update`` (and ``bulk_update``, which runs through it; the
  related managers' ``add``/``remove``/``clear`` of foreign keys);
* ``QuerySet.bulk_create``;
* ``Atomic.__enter__`` / ``Atomic.__exit__``: where a transaction begins and ends.

One tracked write, from its start to the end of its transaction:

1. Not in an ``atomic`` block (autocommit): the write is given one of its own, so
   that it is its own transaction whose end the hooks see. Autocommit off
   outside ``atomic`` (manual transaction management) is refused with
   :class:`ManualTransactionError`: nothing says when such a transaction commits.
2. Before the SQL: the rows the write touches are selected (``SELECT ... FOR
   UPDATE``, where the database has it, so they cannot change until the commit)
   for the old values of the template fields; with the new values the write
   carries, they name the keys, which are write-locked in sorted order and
   invalidated. ``QuerySet.update`` then updates exactly the rows it selected.
3. After the SQL: keys known only now (ids the database generated, values
   ``pre_save`` or an expression set, rows an update moved, a saved row's values
   as the database stores them) are locked and invalidated too, still before
   the commit. An error here (a lock timeout, Redis gone) marks the transaction
   for rollback: the write must not commit unseen by the cache.
4. From the first write on, no fill in that thread may store until the
   transaction ends: it may have read rows not yet committed.
5. The end of the outermost ``atomic`` block (commit or rollback; a savepoint's
   end changes nothing: its keys stay locked): every key invalidated again, then
   the locks released, before Django runs the ``on_commit`` callbacks. A write
   lock lost before the commit (a renewal found its holding gone) fails the
   commit with :class:`~cacheguard.exceptions.LockLostError` and rolls back.

Snapshots: when an outermost ``atomic`` block begins, each tracker reads its
guard's invalidation watermark before the database takes the transaction's
snapshot; fills in that thread while it is open do not store a value older than
a write that committed after it began (see ``cache/watermark.py``).

Needs Django 4.2 or newer. See ``docs/django.md``.
"""

from __future__ import annotations

import functools
import logging
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

try:
    from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
    from django.db.models import Model, Q, QuerySet
    from django.db.models import base as model_base
    from django.db.models.deletion import Collector
    from django.db.transaction import Atomic, TransactionManagementError, get_connection
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cacheguard.integrations.django needs Django 4.2 or newer: "
        "pip install 'cacheguard-redis[django]'"
    ) from exc

from cacheguard._identity import enter_holder, leave_holder
from cacheguard.cache.flows.write import write_lock_lost
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.templates import (
    CACHE_KEYS_ATTRIBUTE,
    literal_prefix,
    model_templates,
    render_key,
    template_fields,
)
from cacheguard.cache.watermark import snapshot_opened
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import CacheGuardError, KeyTemplateError

__all__ = [
    "CACHE_KEYS_ATTRIBUTE",
    "ManualTransactionError",
    "ModelTracker",
    "track_models",
]

log = logging.getLogger("cacheguard.integrations.django")

_NOT_COMMITTED = (
    "the transaction was rolled back instead of committed (its keys were invalidated "
    "again and its locks released)"
)
_CHUNK = 500  # primary keys per SELECT ... WHERE pk IN (...)
_OWN_BLOCK = "_cacheguard_own"  # set on the atomic blocks the hooks open themselves
_TRACKING = "_cacheguard_tracking"  # a connection's attribute: {tracker: its transaction's state}


class ManualTransactionError(CacheGuardError, TransactionManagementError):  # type: ignore[misc]
    """A tracked model was written with autocommit off outside ``transaction.atomic``
    (manual transaction management): nothing tells the hooks when that transaction
    commits, so they cannot invalidate after it or hold the locks until then. Use
    ``transaction.atomic``. (Also Django's ``TransactionManagementError``.)"""


# -- what a tracker knows of a model ----------------------------------------------------------


@dataclass(frozen=True)
class _ModelKeys:
    """The key templates of one tracked model, checked against its fields."""

    model: type[Any]
    fields: dict[str, tuple[str, ...]]  # template -> the names it substitutes
    columns: dict[str, str]  # a substituted name -> the field's attname ("owner" -> "owner_id")

    @property
    def attnames(self) -> frozenset[str]:
        return frozenset(self.columns.values())


@dataclass(eq=False)
class _TransactionLocks:
    """What one tracker holds for the transaction open on one connection (one
    thread's connection to one database alias)."""

    snapshot_watermark: int | None = None  # -1 once the transaction wrote: nothing stores
    snapshot_namespace: str | None = None  # whose sequence the watermark is of
    locks: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (lock, handle)
    touched: set[str] = field(default_factory=set)  # every name locked or tried
    prefixes: set[str] = field(default_factory=set)  # invalidated by prefix at the end too
    holder: Any = None  # whom the locks are for, until the transaction ends
    active: bool = False  # counted in _Registry.open_states

    # eq=False keeps identity hashing: a WeakSet holds it (cache/watermark.py)


# -- the trackers of the process, and the patches they share -------------------------------------


Plan = tuple[tuple["ModelTracker", _ModelKeys], ...]


class _Registry:
    """The open trackers; installs the patches with the first and removes them after
    the last (the transaction hooks only once no transaction holds anything)."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.trackers: list[ModelTracker] = []
        self.plans: dict[type[Any], Plan] = {}
        self.open_states = 0
        self.write_hooks = False
        self.transaction_hooks = False

    def plan(self, model: type[Any]) -> Plan:
        """The trackers (and their templates) a write through ``model`` concerns."""
        plans = self.plans  # replaced, not cleared, when the trackers change
        found = plans.get(model)
        if found is None:
            found = tuple(
                (tracker, spec) for tracker in list(self.trackers) for spec in tracker._specs(model)
            )
            plans[model] = found
        return found

    def snapshot_trackers(self) -> list[ModelTracker]:
        return [t for t in self.trackers if t.snapshots]

    def add(self, tracker: ModelTracker) -> ModelTracker:
        """Open ``tracker``, or return the open one tracking the same (see track_models)."""
        with self.mutex:
            existing = next((t for t in self.trackers if t._identity == tracker._identity), None)
            if existing is not None:
                tracker.closed = True
                return existing
            self.trackers.append(tracker)
            self.plans = {}
            if not self.write_hooks:
                _install(_WRITE_PATCHES)
                _install_save_transactions()
                self.write_hooks = True
            if not self.transaction_hooks:
                _install(_TRANSACTION_PATCHES)
                self.transaction_hooks = True
            return tracker

    def remove(self, tracker: ModelTracker) -> None:
        with self.mutex:
            if tracker in self.trackers:
                self.trackers.remove(tracker)
            self.plans = {}
            if not self.trackers and self.write_hooks:
                _uninstall(_WRITE_PATCHES)
                _uninstall_save_transactions()
                self.write_hooks = False
            self._maybe_uninstall_transaction_hooks()

    def activate(self, state: _TransactionLocks) -> None:
        if not state.active:
            with self.mutex:
                state.active = True
                self.open_states += 1

    def deactivate(self, state: _TransactionLocks) -> None:
        if state.active:
            with self.mutex:
                state.active = False
                self.open_states -= 1
                self._maybe_uninstall_transaction_hooks()

    def _maybe_uninstall_transaction_hooks(self) -> None:
        # A transaction open when the last tracker closed still needs its end seen.
        if not self.trackers and self.open_states == 0 and self.transaction_hooks:
            _uninstall(_TRANSACTION_PATCHES)
            self.transaction_hooks = False


_registry = _Registry()


class ModelTracker:
    """The hooks :func:`track_models` installed for one guard; :meth:`close` removes them."""

    def __init__(
        self,
        guard: Any,
        models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
        *,
        lock_timeout: Seconds | None = None,
        max_rows: int = 1000,
        snapshots: bool = True,
    ) -> None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError("max_rows must be an int >= 1")
        self._guard, self._cache = _guard_of(guard)
        self.lock_timeout = (
            None if lock_timeout is None else check_positive("lock_timeout", lock_timeout)
        )
        self.max_rows = max_rows
        self.snapshots = bool(snapshots)
        self._models = _check_models(models)
        # template -> the prefixes of the names it makes (given a cache backend: its
        # keys', mapped to the guard's names, and the guard's own)
        self._prefixes: dict[str, tuple[str, ...]] = {}
        for spec in self._models.values():
            for template, roots in spec.fields.items():
                if roots:
                    if not literal_prefix(template):
                        # Its names share no prefix: the fallback for writes of more
                        # than max_rows rows would invalidate the whole namespace.
                        raise KeyTemplateError(
                            f"key template {template!r} of {spec.model.__name__} starts "
                            "with a field: its keys could not be invalidated by prefix "
                            "(a write of many rows would wipe every key); begin it with "
                            "text, e.g. 'menu:{slug}'"
                        )
                    self._prefixes[template] = self._template_prefixes(template)
        self._identity = (
            id(guard),
            tuple(sorted((_label(m), tuple(s.fields)) for m, s in self._models.items())),
            self.lock_timeout,
            max_rows,
            self.snapshots,
        )
        self._source = guard  # kept: the identity names it by id()
        self.closed = False
        for prefix in self._all_prefixes():
            # Fills under these prefixes honour the prefix invalidations of a fallback.
            self.guard.watch_prefix(prefix)

    @property
    def guard(self) -> CacheGuard:
        """The guard the hooks lock and invalidate with: a cache backend's current one
        (its ``shutdown()`` closes it, and its next use makes another)."""
        if self._cache is None:
            return self._guard
        current: CacheGuard = self._cache.guard
        if current is not self._guard:
            for prefix in self._all_prefixes():
                current.watch_prefix(prefix)
            self._guard = current
        return current

    @property
    def models(self) -> dict[type[Any], tuple[str, ...]]:
        """The tracked models and their key templates."""
        return {model: tuple(spec.fields) for model, spec in self._models.items()}

    def close(self) -> None:
        """Stop tracking (idempotent). Transactions open now still invalidate and
        release what they hold when they end; the patches go with the last tracker."""
        if not self.closed:
            self.closed = True
            _registry.remove(self)

    remove = close  # the SQLAlchemy tracker's name for it

    def __enter__(self) -> ModelTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- introspection ----------------------------------------------------------------------

    def keys_of(self, instance: Any) -> set[str]:
        """The key names ``instance``'s current field values give (empty if untracked)."""
        names: set[str] = set()
        generated = {f.attname for f in instance._meta.concrete_fields if f.primary_key}

        def unknown(attname: str, value: Any) -> bool:
            return _is_expression(value) or (value is None and attname in generated)

        for spec in self._specs(type(instance)):
            names |= self._names(spec, _instance_values(instance, spec.attnames), unknown)
        return names

    def held_keys(self, using: str | None = None) -> frozenset[str]:
        """The keys this thread's transaction on database ``using`` (default: the
        default database) holds write locks on."""
        connection = connections[using or DEFAULT_DB_ALIAS]
        state = connection.__dict__.get(_TRACKING, {}).get(self)
        return frozenset(state.locks) if state is not None else frozenset()

    # -- keys ------------------------------------------------------------------------------

    def _specs(self, model: type[Any]) -> list[_ModelKeys]:
        """The templates a write through ``model`` affects: those of every tracked model
        whose table it writes (``model`` derives from the tracked model's concrete
        model: the model itself, its proxies, its multi-table subclasses)."""
        if self.closed:
            return []
        return [
            spec
            for tracked, spec in self._models.items()
            if issubclass(model, tracked._meta.concrete_model)
        ]

    def _keys(self, template: str, values: Mapping[str, Any]) -> tuple[str, ...]:
        """The names ``template`` gives for ``values``: the guard's own (escaped, as
        ``@cached_with_lock`` renders them) and, given a cache backend, the key of its
        cache API that a user's f-string would build (the values as ``str.format``
        writes them), mapped to the guard's name as the backend maps it."""
        own = render_key(template, values, max_length=self.guard.settings.max_key_length)
        if self._cache is None:
            return (own,)
        try:
            written = template.format_map(values)
        except (ValueError, TypeError, LookupError, AttributeError):
            return (own,)  # a value its format cannot write: no read built such a key
        return (own, str(self._cache.guard_name(written)))

    def _all_prefixes(self) -> list[str]:
        return sorted({p for prefixes in self._prefixes.values() for p in prefixes})

    def _names(
        self,
        spec: _ModelKeys,
        values: Mapping[str, Any],
        unknown: Callable[[str, Any], bool] | None = None,
    ) -> set[str]:
        """The names ``values`` (field values by attname) give; a template with a
        field missing from them, or whose value is ``unknown``, names none."""
        names: set[str] = set()
        for template, roots in spec.fields.items():
            substituted = {}
            for root in roots:
                attname = spec.columns[root]
                if attname not in values:
                    break
                value = values[attname]
                if unknown is not None and unknown(attname, value):
                    break
                substituted[root] = value
            else:
                names.update(self._keys(template, substituted))
        return names

    def _template_prefixes(self, template: str) -> tuple[str, ...]:
        """The prefixes every name of ``template`` starts with, as the guard names them."""
        prefix = literal_prefix(template)
        if self._cache is None:
            return (prefix,)
        # A cache backend maps its keys to the guard's names (KEY_PREFIX, version):
        # its prefix must map to a prefix of the guard's names, or no fallback works.
        probes = [f"{prefix}probe", f"{prefix}other:7"]
        mapped = [str(self._cache.guard_name(p)) for p in probes]
        head = mapped[0].removesuffix("probe")
        if head == mapped[0] or mapped[1] != head + "other:7":
            raise ValueError(
                f"the cache's key function does not keep prefixes ({probes[0]!r} becomes "
                f"{mapped[0]!r}): the keys of {template!r} could not be invalidated by "
                "prefix; use the default KEY_FUNCTION or pass the guard itself"
            )
        return (prefix, head)

    # -- transaction state -------------------------------------------------------------------

    def _state(self, connection: Any) -> _TransactionLocks:
        tracking: dict[ModelTracker, _TransactionLocks] = connection.__dict__.setdefault(
            _TRACKING, {}
        )
        state = tracking.get(self)
        if state is None:
            state = tracking[self] = _TransactionLocks()
        state.snapshot_namespace = self.guard.namespace  # fills of other namespaces ignore it
        return state

    def _began(self, connection: Any) -> None:
        """An outermost atomic block begins: the watermark, before its snapshot."""
        state = self._state(connection)
        try:
            state.snapshot_watermark = self.guard.watermark()
        except Exception as exc:
            # Unknown: no fill from this snapshot may store (-1 is below every version).
            state.snapshot_watermark = -1
            log.warning("no snapshot watermark (%s): fills in this transaction do not store", exc)
        _registry.activate(state)
        snapshot_opened(state)

    def _lock(self, connection: Any, names: set[str]) -> None:
        """Write-lock and invalidate ``names`` for the connection's transaction."""
        if not names:
            return
        state = self._state(connection)
        state.touched |= names  # invalidated at the end even if a lock below times out
        _registry.activate(state)
        if state.snapshot_watermark != -1:
            # Rows not yet committed may be read here from now on: no fill stores.
            state.snapshot_watermark = -1
            snapshot_opened(state)
        # A name another tracker of this namespace locked for this transaction stays
        # its (two guard objects of one namespace do not share write holds): both
        # invalidate it again at the end, when both release.
        elsewhere = self._held_by_others(connection, state)
        fresh = sorted(name for name in names if name not in state.locks and name not in elsewhere)
        if not fresh:
            return
        if state.holder is None:
            state.holder = enter_holder()
        for name in fresh:  # one global order within each batch
            lock = self.guard.write_lock(name)
            handle = lock.acquire_write(self.lock_timeout, holder=state.holder)
            state.locks[name] = (lock, handle)
        self.guard.invalidate(*fresh)

    def _held_by_others(self, connection: Any, state: _TransactionLocks) -> set[str]:
        """The names other guard objects of this namespace hold for the transaction
        (the same guard object takes a hold again: each tracker then holds its own)."""
        held: set[str] = set()
        for tracker, other in connection.__dict__.get(_TRACKING, {}).items():
            if (
                other is not state
                and other.snapshot_namespace == state.snapshot_namespace
                and tracker.guard is not self.guard
            ):
                held.update(other.locks)
        return held

    def _by_prefix(self, connection: Any, spec: _ModelKeys) -> None:
        """Too many rows, or rows not known: every name of the model's templates."""
        state = self._state(connection)
        self._lock(connection, self._names(spec, {}))  # the templates without fields
        for template, roots in spec.fields.items():
            if roots:
                for prefix in self._prefixes[template]:
                    state.prefixes.add(prefix)
                    self.guard.invalidate_prefix(prefix)

    def _end(self, state: _TransactionLocks) -> None:
        """The transaction ended: invalidate every name again, release. Never raises
        (the database has committed or rolled back already)."""
        locked = list(state.locks)
        names = locked + sorted(state.touched - set(locked))
        if names:
            try:
                self.guard.invalidate(*names)
            except Exception:
                log.exception("invalidating %d keys at the end of a transaction failed", len(names))
        for name in reversed(locked):
            lock, _ = state.locks.pop(name)
            try:
                lock.release_write(holder=state.holder)
            except Exception:
                log.exception("releasing the write lock of %r failed", name)
        for prefix in sorted(state.prefixes):
            try:
                self.guard.invalidate_prefix(prefix)
            except Exception:
                log.exception("invalidating the keys of %r* failed", prefix)
        state.locks.clear()
        state.touched.clear()
        state.prefixes.clear()
        state.snapshot_watermark = None  # no longer open (see cache/watermark.py)
        if state.holder is not None:
            holder, state.holder = state.holder, None
            leave_holder(holder)
        _registry.deactivate(state)


def track_models(
    guard: Any,
    models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
    *,
    lock_timeout: Seconds | None = None,
    max_rows: int = 1000,
    snapshots: bool = True,
) -> ModelTracker:
    """Keep ``guard``'s keys right whenever the Django ORM writes a tracked model.

    ``guard``: a :class:`~cacheguard.CacheGuard`, or a Django cache backend with a
    ``guard`` attribute and a ``guard_name(key)`` method (the keys the templates
    render are then the cache's keys, mapped to the guard's names as the backend
    maps them). ``models`` maps each model class to its key templates, e.g.
    ``{Menu: ("menu:list", "menu:{id}", "menus:by-owner:{owner_id}")}``; fields name
    the model's concrete fields (by name or attname; a foreign key renders its id)
    or ``pk``. A list of classes reads each one's ``__cache_keys__`` instead.
    Subclasses (multi-table inheritance) and proxies of a tracked model are tracked
    with its templates, and so is the concrete model of a tracked proxy.

    ``lock_timeout`` bounds each write-lock wait (seconds or a ``timedelta``;
    default: the guard's ``wait_timeout``); a write touching more than ``max_rows``
    rows invalidates its model's templates by prefix instead. ``snapshots=False``
    skips the watermark read when an outermost ``atomic`` block begins (one round
    trip to Redis each), at the price of fills from a transaction that began before
    a write being able to store that write's old rows.

    Tracking the same models with the same guard and options again returns the
    tracker already open. :meth:`ModelTracker.close` stops tracking.
    """
    candidate = ModelTracker(
        guard, models, lock_timeout=lock_timeout, max_rows=max_rows, snapshots=snapshots
    )
    return _registry.add(candidate)


# -- one tracked write -----------------------------------------------------------------------------


class _Work:
    """The names one tracked write gives, for each tracker it concerns, and the
    rows it selects for them."""

    def __init__(self, plan: Plan, model: type[Any], alias: str, connection: Any) -> None:
        self.plan = plan
        self.model = model
        self.alias = alias
        self.connection = connection
        meta = model._meta
        self.pk = meta.pk.attname
        self.attnames = sorted(frozenset().union(*(spec.attnames for _, spec in plan)) | {self.pk})
        # Fields whose None means "not generated yet" (a primary key, a parent link).
        self.generated = {f.attname for f in meta.concrete_fields if f.primary_key}
        self.max_rows = min(tracker.max_rows for tracker, _ in plan)
        self.names: dict[ModelTracker, set[str]] = {tracker: set() for tracker, _ in plan}

    def fixed(self) -> None:
        """The templates without fields: any write names them."""
        for tracker, spec in self.plan:
            self.names[tracker] |= tracker._names(spec, {})

    def rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        for tracker, spec in self.plan:
            for row in rows:
                self.names[tracker] |= tracker._names(spec, row)

    def instances(self, objs: Iterable[Any]) -> list[Any]:
        """Name the keys of ``objs``' values where they are known; the objects with a
        template value not known yet (an id to generate, an expression) are returned."""
        pending = []
        for obj in objs:
            values = _instance_values(obj, self.attnames)
            unknown = False

            def not_known(attname: str, value: Any) -> bool:
                nonlocal unknown
                if _is_expression(value) or (value is None and attname in self.generated):
                    unknown = True
                    return True
                return False

            for tracker, spec in self.plan:
                self.names[tracker] |= tracker._names(spec, values, not_known)
            if unknown:
                pending.append(obj)
        return pending

    def select(
        self, *, pks: Sequence[Any] | None = None, queryset: Any = None, limit: bool = True
    ) -> list[dict[str, Any]] | None:
        """The template fields of the rows with primary keys ``pks``, or of the rows
        ``queryset`` matches, locked until the transaction ends where the database can
        (``FOR UPDATE``); None when there are more than ``max_rows``."""
        manager = self.model._meta.concrete_model._base_manager.db_manager(self.alias)
        features = self.connection.features
        if pks is not None:
            keys = list(dict.fromkeys(pks))
            if limit and len(keys) > self.max_rows:
                return None
            found: list[dict[str, Any]] = []
            for start in range(0, len(keys), _CHUNK):
                query = manager.filter(pk__in=keys[start : start + _CHUNK])
                if features.has_select_for_update:
                    query = query.select_for_update()
                found.extend(query.values(*self.attnames))
            return found
        # By primary key in a subquery: the outer query has no DISTINCT, aggregate or
        # outer join that FOR UPDATE would refuse; the subquery locks nothing itself.
        inner = queryset.order_by().values("pk")
        inner.query.select_for_update = False
        query = manager.filter(pk__in=inner)
        if features.has_select_for_update:
            query = query.select_for_update()
        query = query.values(*self.attnames)
        bounded = limit and (
            features.supports_select_for_update_with_limit or not features.has_select_for_update
        )
        if bounded:
            query = query[: self.max_rows + 1]
        rows = list(query)
        return None if limit and len(rows) > self.max_rows else rows

    def by_prefix(self) -> None:
        for tracker, spec in self.plan:
            tracker._by_prefix(self.connection, spec)

    def lock(self) -> None:
        """Lock and invalidate what was named so far (each tracker's in sorted order)."""
        for tracker, names in self.names.items():
            tracker._lock(self.connection, names)
            names.clear()


@contextmanager
def _writing(alias: str) -> Iterator[Any]:
    """The transaction a tracked write runs in: the open atomic block's, or one of
    its own in autocommit mode; manual transaction management is refused."""
    connection = connections[alias]
    if connection.in_atomic_block:
        if not connection.commit_on_exit:  # entered with autocommit off
            raise _manual(alias)
        yield connection
        return
    if not connection.get_autocommit():
        raise _manual(alias)
    block = transaction.atomic(using=alias)
    setattr(block, _OWN_BLOCK, True)  # its snapshot is of no interest: it writes at once
    with block:
        yield connection


def _manual(alias: str) -> ManualTransactionError:
    return ManualTransactionError(
        f"a tracked model was written on database {alias!r} with autocommit off outside "
        "transaction.atomic: the cache cannot be kept right across a transaction whose "
        "commit it does not see; use transaction.atomic"
    )


# -- the patched methods ---------------------------------------------------------------------------

_ORIGINALS: dict[tuple[type[Any], str], Any] = {}
_LEFT_IN_PLACE: set[tuple[type[Any], str]] = set()  # ours, patched over by someone else


def _original(owner: type[Any], name: str) -> Any:
    return _ORIGINALS[(owner, name)]


def _save_base(
    self: Any,
    raw: bool = False,
    force_insert: Any = False,
    force_update: bool = False,
    using: str | None = None,
    update_fields: Any = None,
) -> Any:
    original = _original(Model, "save_base")
    plan = _registry.plan(type(self))
    if not plan:
        return original(self, raw, force_insert, force_update, using, update_fields)
    using = using or router.db_for_write(self.__class__, instance=self)
    # The SQL runs in the block Django's save_base opens around it (see
    # _SaveTransactions): pre_save and post_save stay outside the hooks' transaction,
    # as they are without tracking.
    saves = _pending_saves()
    pending = _PendingSave(self, plan, using)
    saves.append(pending)
    try:
        result = original(self, raw, force_insert, force_update, using, update_fields)
    finally:
        saves.remove(pending)
    if not pending.taken:  # a save_base that never asked for its block: keys after the fact
        with _writing(using) as connection, _after_sql(using):
            work = _Work(plan, type(self), using, connection)
            work.instances([self])
            work.rows(work.select(pks=[self.pk], limit=False) or [])
            work.lock()
    return result


@dataclass(eq=False)
class _PendingSave:
    """A tracked save_base under way in this thread, until Django asks for the block
    its SQL runs in."""

    instance: Any
    plan: Plan
    using: str
    taken: bool = False


_saving = threading.local()


def _pending_saves() -> list[_PendingSave]:
    saves: list[_PendingSave] | None = getattr(_saving, "saves", None)
    if saves is None:
        saves = _saving.saves = []
    return saves


@contextmanager
def _tracked_save(pending: _PendingSave, django_block: Any) -> Iterator[None]:
    """Django's block around a tracked save's SQL, inside the hooks' transaction:
    the keys of the row as it was and of the values saved are locked before it; of
    the row as the database now holds it, after."""
    pending.taken = True
    instance, using = pending.instance, pending.using
    with _writing(using) as connection:
        work = _Work(pending.plan, type(instance), using, connection)
        if instance.pk is not None:  # the row as it is: the old values
            work.rows(work.select(pks=[instance.pk], limit=False) or [])
        work.instances([instance])
        work.lock()
        with django_block:
            yield
        with _after_sql(using):
            # The row as stored: a generated id, values pre_save or an expression (F())
            # set, and the database's own form of each value (Decimal("12.5") stored
            # as 12.50, a datetime in UTC, a UUID in lower case), which readers' keys use.
            work.instances([instance])
            work.rows(work.select(pks=[instance.pk], limit=False) or [])
            work.lock()


class _SaveTransactions:
    """Stands in for ``django.db.transaction`` in ``django.db.models.base`` while a
    tracker is open: the block ``save_base`` opens around its SQL becomes the
    hooks' (for the save under way in this thread), everything else is Django's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(transaction, name)

    def atomic(self, *args: Any, **kwargs: Any) -> Any:
        return _block_for_save(transaction.atomic(*args, **kwargs), args, kwargs)

    def mark_for_rollback_on_error(self, *args: Any, **kwargs: Any) -> Any:
        return _block_for_save(
            transaction.mark_for_rollback_on_error(*args, **kwargs), args, kwargs
        )


def _block_for_save(block: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    saves = _pending_saves()
    using = kwargs.get("using", args[0] if args else None)
    if saves and not saves[-1].taken and saves[-1].using == using:
        return _tracked_save(saves[-1], block)
    return block


_SAVE_TRANSACTIONS = _SaveTransactions()


def _install_save_transactions() -> None:
    if model_base.transaction is transaction:
        model_base.transaction = _SAVE_TRANSACTIONS


def _uninstall_save_transactions() -> None:
    if model_base.transaction is _SAVE_TRANSACTIONS:
        model_base.transaction = transaction


@contextmanager
def _after_sql(alias: str) -> Iterator[None]:
    """Work after a write's SQL ran: if it fails (a lock that timed out, Redis gone),
    the transaction must not commit the write, though the caller may catch the error
    inside ``atomic`` and carry on."""
    try:
        yield
    except BaseException:
        connection = connections[alias]
        if connection.in_atomic_block:
            transaction.set_rollback(True, using=alias)
        raise


def _update(self: Any, **kwargs: Any) -> Any:
    original = _original(QuerySet, "update")
    plan = _registry.plan(self.model)
    if not plan or self.query.is_sliced or self.query.combinator:
        return original(self, **kwargs)  # untracked, or refused by Django
    self._for_write = True
    alias = self.db
    with _writing(alias) as connection:
        work = _Work(plan, self.model, alias, connection)
        rows = work.select(queryset=self)
        if rows is None:  # too many: every key of the templates
            work.by_prefix()
            return original(self, **kwargs)
        work.fixed()
        work.rows(rows)
        work.lock()
        if not rows:
            self._result_cache = None
            return 0
        pks = [row[work.pk] for row in rows]
        # Exactly the rows selected and locked: a row that came to match since is left
        # as if the update had run before it did, instead of changing unseen.
        count = original(self.filter(pk__in=pks), **kwargs)
        self._result_cache = None
        with _after_sql(alias):
            if _changes_template_fields(self.model, kwargs, work.attnames):
                moved = work.select(pks=pks, limit=False)
                if moved is None or len(moved) != len(rows):  # a primary key changed
                    work.by_prefix()
                else:
                    work.rows(moved)
                work.lock()
    return count


def _bulk_create(self: Any, objs: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
    original = _original(QuerySet, "bulk_create")
    plan = _registry.plan(self.model)
    if not plan:
        return original(self, objs, *args, **kwargs)
    objs = list(objs)
    if not objs:
        return original(self, objs, *args, **kwargs)
    options = _bulk_create_options(args, kwargs)
    self._for_write = True
    alias = self.db
    with _writing(alias) as connection:
        work = _Work(plan, self.model, alias, connection)
        work.fixed()
        work.instances(objs)
        overwritten = None  # the rows an upsert may overwrite
        if options["update_conflicts"]:
            overwritten = _conflicting(self.model, alias, objs, options["unique_fields"])
            rows = None if overwritten is None else work.select(queryset=overwritten)
            if rows is None:
                work.by_prefix()
                overwritten = None
            else:
                work.rows(rows)
        work.lock()
        result = original(self, objs, *args, **kwargs)
        with _after_sql(alias):
            pending = work.instances(objs)
            known = [obj.pk for obj in pending if obj.pk is not None and not _is_expression(obj.pk)]
            if len(known) < len(pending):  # ids the database did not report
                work.by_prefix()
            elif known:
                rows = work.select(pks=known)
                if rows is None:
                    work.by_prefix()
                else:
                    work.rows(rows)
            if overwritten is not None:
                rows = work.select(queryset=overwritten)
                if rows is None:
                    work.by_prefix()
                else:
                    work.rows(rows)
            work.lock()
    return result


def _collector_delete(self: Any) -> Any:
    original = _original(Collector, "delete")
    data = [(m, list(objs), p) for m, objs in self.data.items() if (p := _registry.plan(m))]
    fast = [(qs, p) for qs in self.fast_deletes if (p := _registry.plan(qs.model))]
    updated = []  # instances on_delete=SET_NULL/SET_DEFAULT/SET() changes, by model
    for instances_list in self.field_updates.values():
        for instances in instances_list:
            if isinstance(instances, QuerySet) and instances._result_cache is None:
                continue  # run through QuerySet.update, tracked there
            objs = list(instances)
            if objs and (plan := _registry.plan(type(objs[0]))):
                updated.append((type(objs[0]), objs, plan))
    if not (data or fast or updated):
        return original(self)
    with _writing(self.using) as connection:
        expected: Counter[str] = Counter()  # rows selected, by model label
        by_label: dict[str, list[_Work]] = {}
        prefixed: set[str] = set()
        for model, objs, plan in data:
            work = _Work(plan, model, self.using, connection)
            rows = work.select(pks=[obj.pk for obj in objs])
            _selected(work, rows, model._meta.label, expected, by_label, prefixed)
            work.instances(objs)  # values in memory too: more names never hurt
            work.lock()
        for queryset, plan in fast:
            work = _Work(plan, queryset.model, self.using, connection)
            rows = work.select(queryset=queryset)
            _selected(work, rows, queryset.model._meta.label, expected, by_label, prefixed)
            work.lock()
        moved = []
        for model, objs, plan in updated:
            work = _Work(plan, model, self.using, connection)
            pks = [obj.pk for obj in objs]
            rows = work.select(pks=pks)
            if rows is None:
                work.by_prefix()
            else:
                work.fixed()
                work.rows(rows)
                moved.append((work, pks))
            work.lock()
        result = original(self)
        with _after_sql(self.using):
            _, counts = result
            for label, count in counts.items():
                # More rows deleted than selected: a row came to match a fast delete after
                # the SELECT. Its keys are not known; its templates' are, by prefix.
                if label in by_label and label not in prefixed and count > expected[label]:
                    for work in by_label[label]:
                        work.by_prefix()
            for work, pks in moved:  # the new values of the rows updated
                rows = work.select(pks=pks)
                if rows is None:
                    work.by_prefix()
                else:
                    work.rows(rows)
                work.lock()
    return result


def _selected(
    work: _Work,
    rows: list[dict[str, Any]] | None,
    label: str,
    expected: Counter[str],
    by_label: dict[str, list[_Work]],
    prefixed: set[str],
) -> None:
    """Name a delete's rows (or its templates, by prefix) and count them by label."""
    by_label.setdefault(label, []).append(work)
    if rows is None:
        work.by_prefix()
        prefixed.add(label)
        return
    work.fixed()
    work.rows(rows)
    expected[label] += len(rows)


def _atomic_enter(self: Any) -> Any:
    original = _original(Atomic, "__enter__")
    began = None
    trackers = _registry.snapshot_trackers()
    if trackers and not getattr(self, _OWN_BLOCK, False):
        connection = get_connection(self.using)
        # The outermost block, in autocommit mode: a transaction begins (with autocommit
        # off, one is under way already, and its end is not seen).
        if not connection.in_atomic_block and connection.get_autocommit():
            began = connection
            for tracker in trackers:
                tracker._began(connection)
    try:
        return original(self)
    except BaseException:
        if began is not None and not began.in_atomic_block:
            _end_all(began)  # it never began
        raise


def _atomic_exit(self: Any, exc_type: Any, exc_value: Any, traceback: Any) -> Any:
    original = _original(Atomic, "__exit__")
    connection = get_connection(self.using)
    tracking = connection.__dict__.get(_TRACKING)
    if not tracking or not connection.in_atomic_block or connection.savepoint_ids:
        return original(self, exc_type, exc_value, traceback)  # not the outermost block
    lost = None
    if exc_type is None and connection.commit_on_exit and not connection.needs_rollback:
        lost = _lost_lock(tracking.values())
    try:
        if lost is None:
            if exc_type is None and connection.commit_on_exit and not connection.needs_rollback:
                # Run first of the on_commit callbacks: they run after the commit, and
                # a slow one must not keep the keys locked from readers.
                connection.run_on_commit.insert(0, (set(), lambda: _end_all(connection), True))
            return original(self, exc_type, exc_value, traceback)
        # Another writer may have run alongside: roll back instead of committing.
        original(self, type(lost), lost, None)
    finally:
        _end_all(connection)
    raise lost


def _end_all(connection: Any) -> None:
    tracking = connection.__dict__.get(_TRACKING)
    if not tracking:
        return
    for tracker, state in list(tracking.items()):
        tracker._end(state)
        if tracker.closed:
            del tracking[tracker]


def _lost_lock(states: Iterable[_TransactionLocks]) -> BaseException | None:
    for state in states:
        for name, (_, handle) in state.locks.items():
            if getattr(handle, "lost", False):
                return write_lock_lost(name, handle, None, then=_NOT_COMMITTED)
    return None


_WRITE_PATCHES: tuple[tuple[type[Any], str, Callable[..., Any]], ...] = (
    (Model, "save_base", _save_base),
    (QuerySet, "update", _update),
    (QuerySet, "bulk_create", _bulk_create),
    (Collector, "delete", _collector_delete),
)
_TRANSACTION_PATCHES: tuple[tuple[type[Any], str, Callable[..., Any]], ...] = (
    (Atomic, "__enter__", _atomic_enter),
    (Atomic, "__exit__", _atomic_exit),
)


def _install(patches: Iterable[tuple[type[Any], str, Callable[..., Any]]]) -> None:
    for owner, name, hook in patches:
        original = owner.__dict__[name]
        if getattr(original, "__cacheguard_hook__", None) is hook:
            continue
        if (owner, name) in _LEFT_IN_PLACE and original is not _ORIGINALS[(owner, name)]:
            # Ours was patched over (see _uninstall) and is still called through what
            # replaced it: recording that as the original would call ours again, forever.
            continue
        _LEFT_IN_PLACE.discard((owner, name))
        _ORIGINALS[(owner, name)] = original

        @functools.wraps(original)  # keeps alters_data and queryset_only (templates, managers)
        def patched(*args: Any, __hook: Callable[..., Any] = hook, **kwargs: Any) -> Any:
            return __hook(*args, **kwargs)

        patched.__cacheguard_hook__ = hook  # type: ignore[attr-defined]
        setattr(owner, name, patched)


def _uninstall(patches: Iterable[tuple[type[Any], str, Callable[..., Any]]]) -> None:
    for owner, name, hook in patches:
        current = owner.__dict__.get(name)
        if getattr(current, "__cacheguard_hook__", None) is hook:
            setattr(owner, name, _ORIGINALS[(owner, name)])
            _LEFT_IN_PLACE.discard((owner, name))
        elif current is not _ORIGINALS.get((owner, name)):
            # Patched again on top of ours by someone else: ours stays, passes calls
            # through while no tracker is open, and serves the next tracker again.
            _LEFT_IN_PLACE.add((owner, name))


# -- helpers -----------------------------------------------------------------------------------


def _guard_of(guard: Any) -> tuple[CacheGuard, Any]:
    """The guard, and the cache backend whose keys the templates render (or None)."""
    if isinstance(guard, CacheGuard):
        return guard, None
    inner = getattr(guard, "guard", None)
    if isinstance(inner, CacheGuard) and callable(getattr(guard, "guard_name", None)):
        return inner, guard
    raise TypeError(
        "track_models needs a CacheGuard (Django's ORM is sync: not an AsyncCacheGuard) or "
        f"a cache backend with a guard and guard_name(), not {type(guard).__name__}"
    )


def _check_models(
    models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
) -> dict[type[Any], _ModelKeys]:
    pairs = model_templates(models)
    checked: dict[type[Any], _ModelKeys] = {}
    for model, templates in pairs:
        if not (isinstance(model, type) and issubclass(model, Model)):
            raise TypeError(f"{model!r} is not a Django model class")
        if model._meta.abstract:
            raise TypeError(f"{model.__name__} is abstract: track its concrete models")
        if isinstance(templates, str) or not templates:
            raise KeyTemplateError(
                f"the key templates of {model.__name__} must be a non-empty sequence of "
                f"strings, got {templates!r}"
            )
        checked[model] = _model_keys(model, tuple(templates))
    return checked


def _model_keys(model: type[Any], templates: tuple[str, ...]) -> _ModelKeys:
    meta = model._meta
    by_name: dict[str, Any] = {"pk": meta.pk}
    for concrete in meta.concrete_fields:
        by_name.setdefault(concrete.name, concrete)
        by_name.setdefault(concrete.attname, concrete)
    fields: dict[str, tuple[str, ...]] = {}
    columns: dict[str, str] = {}
    for template in templates:
        roots = tuple(dict.fromkeys(template_fields(template)))
        for expression in _field_expressions(template):
            root = expression.split(".", 1)[0].split("[", 1)[0]
            found = by_name.get(root)
            if found is None:
                raise KeyTemplateError(
                    f"key template {template!r} of {model.__name__} names {root!r}, which "
                    f"is not a concrete field ({', '.join(sorted(by_name))})"
                )
            if found.is_relation and expression != root:
                raise KeyTemplateError(
                    f"key template {template!r} of {model.__name__}: {root!r} renders the "
                    f"related row's id ({found.attname}); {expression!r} cannot be read"
                )
            columns[root] = found.attname
        fields[template] = roots
    return _ModelKeys(model, fields, columns)


def _field_expressions(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def _label(model: type[Any]) -> str:
    return str(model._meta.label)


def _instance_values(obj: Any, attnames: Iterable[str]) -> dict[str, Any]:
    """The loaded field values of ``obj`` (a deferred field is left out, not loaded)."""
    loaded = obj.__dict__
    return {name: loaded[name] for name in attnames if name in loaded}


def _is_expression(value: Any) -> bool:
    return hasattr(value, "resolve_expression")


def _changes_template_fields(
    model: type[Any], kwargs: Mapping[str, Any], attnames: list[str]
) -> bool:
    """Can an ``update(**kwargs)`` change a template field's value (or the primary key)?"""
    meta = model._meta
    for name in kwargs:
        try:
            changed = meta.get_field(name)
        except Exception:
            return True  # Django will say what is wrong with it; assume the worst
        if changed.attname in attnames or changed.primary_key:
            return True
    return False


def _bulk_create_options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``bulk_create``'s options, given by position or by name."""
    names = ("batch_size", "ignore_conflicts", "update_conflicts", "update_fields", "unique_fields")
    options: dict[str, Any] = dict.fromkeys(names)
    options.update(zip(names, args, strict=False))
    options.update({k: v for k, v in kwargs.items() if k in options})
    return options


def _conflicting(model: type[Any], alias: str, objs: list[Any], unique_fields: Any) -> Any:
    """The rows an upsert of ``objs`` may overwrite (a queryset), or None if unknown."""
    if not unique_fields:
        return None  # the database picks the constraint: which rows is not known here
    meta = model._meta
    attnames = [meta.get_field(meta.pk.name if n == "pk" else n).attname for n in unique_fields]
    matches = Q()
    for obj in objs:
        values = {attname: getattr(obj, attname, None) for attname in attnames}
        if all(v is not None and not _is_expression(v) for v in values.values()):
            matches |= Q(**values)
    if not matches:
        return model._meta.concrete_model._base_manager.db_manager(alias).none()
    return model._meta.concrete_model._base_manager.db_manager(alias).filter(matches)
