"""The PostgreSQL lock store's decisions, with no waiting in them: written once for
:class:`~cacheguard.locks.postgres.rwlock.PostgresRWLock` and its asyncio twin
:class:`~cacheguard.locks.postgres.async_rwlock.AsyncPostgresRWLock`.

Keys, settings, statements and one owner's count of holds are plain functions and
classes. What is a sequence of statements with decisions between them is a
generator *flow*, as in :mod:`cacheguard.locks.protocol`: it yields the I/O it
waits for as a step and gets the answer sent back in. The driver throws whatever
a step raised into the flow, an interrupt or a task's cancellation too, and the
flow decides what it means. A flow keeps its session's books itself and calls the
session's ``end`` / ``leave`` / ``drop_connection``, which never wait.

Steps (answers in brackets):

* :class:`Enter`: the owner's session with its statement lock held, waiting at
  most ``wait`` s for another thread or task of the owner [the session, or
  ``None``]. The flow that entered it leaves it.
* :class:`Connect`: a connection that holds no lock [the connection].
* :class:`Run`: one psycopg statement on a session's connection [its first row;
  ``None`` with ``rows=False``].
* :class:`Transaction`: the SQLAlchemy connection of the caller's transaction,
  checked [the connection]; :class:`RunIn`: one ``text()`` statement on it [its
  only row; ``None`` with ``rows=False``].

Flows:

* :func:`acquire_flow` / :func:`try_flow`: the owner's plan for the key (count a
  reentry, refuse an upgrade, or ask the server), one lock statement with
  ``lock_timeout`` set to what is left of the deadline, and what its failure
  means: the wait ended (``lock_not_available``, a cancel, a deadlock) is
  :class:`LockTimeout`; a statement that failed or was interrupted after the
  grant is undone; a parked connection the server had closed is replaced once; a
  session the server ended is lost; a missing fencing sequence is made, then the
  token drawn.
* :func:`release_flow`: count the hold off; the last of its mode unlocks, and a
  failed unlock ends the session.
* :func:`take_in_flow`: ``write_in`` / ``read_in`` in the caller's transaction:
  one try that cannot fail, then a wait in a savepoint, so that a timeout leaves
  the transaction usable.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Final, Generic, TypeVar

import psycopg
import psycopg.errors
from psycopg import pq
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import Pool

from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import (
    BackendUnavailable,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
)
from cacheguard.locks.protocol import Mode
from cacheguard.locks.shape import HandleState
from cacheguard.redis.keys import check_namespace

__all__ = [
    "DEFAULT_FENCE_SEQUENCE",
    "KEEPALIVE_WITHIN",
    "MAX_IDLE",
    "Connect",
    "Enter",
    "Holds",
    "LockSettings",
    "Plan",
    "PostgresHandleState",
    "PostgresLockBase",
    "Run",
    "RunIn",
    "SessionState",
    "Step",
    "Transaction",
    "TransactionLock",
    "acquire_flow",
    "advisory_key",
    "alive",
    "broken",
    "check_dialect",
    "check_transaction",
    "detached_connection",
    "key_parts",
    "last_error",
    "lock_settings",
    "lock_timeout_ms",
    "releasable",
    "release_flow",
    "session_settings",
    "take_in_flow",
    "try_flow",
]

DEFAULT_FENCE_SEQUENCE: Final = "cacheguard_lock_fence"
MAX_IDLE: Final = 4  # parked connections kept per engine for the next owner
KEEPALIVE_WITHIN: Final = 25.0  # s: 10 idle + 3 probes 5 s apart (session_settings)
_KEY_PERSON: Final = b"cacheguard.lock"  # BLAKE2b personalisation: our keys only
_SEQUENCE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?")
_SAVEPOINT: Final = "cacheguard_lock_wait"

C = TypeVar("C", bound="psycopg.BaseConnection[Any]")
H = TypeVar("H", bound="PostgresHandleState")

# -- keys and settings -----------------------------------------------------------------------------


def advisory_key(namespace: str, name: str) -> int:
    """The signed 64-bit advisory lock key of ``name`` in ``namespace``.

    The same in every process and every version (a test pins it): the first
    8 bytes of BLAKE2b over both strings, each prefixed with its length, so
    ``("a:b", "c")`` and ``("a", "b:c")`` differ.
    """
    digest = hashlib.blake2b(digest_size=8, person=_KEY_PERSON)
    for part in (namespace, name):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return int.from_bytes(digest.digest(), "big", signed=True)


def key_parts(key: int) -> tuple[int, int]:
    """``(classid, objid)``: how ``pg_locks`` shows the bigint advisory ``key``."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


@dataclass(frozen=True)
class LockSettings:
    """A lock's checked settings (shared by the sync and the asyncio lock)."""

    name: str
    namespace: str
    key: int
    timeout: float
    fencing: bool
    fence_sequence: str


def lock_settings(
    name: object, namespace: str, timeout: object, fencing: object, fence_sequence: object
) -> LockSettings:
    """Check a lock's constructor arguments (ValueError / TypeError)."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    if not isinstance(fence_sequence, str) or not _SEQUENCE_NAME.fullmatch(fence_sequence):
        raise ValueError(
            "fence_sequence must be a lower-case SQL name, optionally schema-qualified "
            f"(schema.name), got {fence_sequence!r}"
        )
    return LockSettings(
        name=name,
        namespace=check_namespace(namespace),
        key=advisory_key(namespace, name),
        timeout=check_positive("timeout", timeout),
        fencing=bool(fencing),
        fence_sequence=fence_sequence,
    )


class PostgresLockBase:
    """What the sync and the asyncio lock keep: their checked settings."""

    def __init__(
        self,
        name: str,
        namespace: str,
        timeout: Seconds,
        fencing: bool,
        fence_sequence: str,
        timer: Callable[[], float],
    ) -> None:
        self._settings = lock_settings(name, namespace, timeout, fencing, fence_sequence)
        self._timer = timer

    # Read-only: the flows work from the checked settings.
    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def namespace(self) -> str:
        return self._settings.namespace

    @property
    def key(self) -> int:
        """The 64-bit advisory key (:func:`advisory_key` of namespace and name)."""
        return self._settings.key

    @property
    def timeout(self) -> float:
        """The default deadline of blocking acquisitions (s)."""
        return self._settings.timeout

    @property
    def fencing(self) -> bool:
        return self._settings.fencing

    @property
    def fence_sequence(self) -> str:
        return self._settings.fence_sequence

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key} namespace={self.namespace!r}>"


@dataclass(frozen=True)
class TransactionLock:
    """A lock held by a database transaction (:meth:`PostgresRWLock.write_in`):
    released when that transaction commits or rolls back, not before."""

    name: str
    mode: Mode
    token: int  # the fencing token of a write (fencing on), else 0


# -- one owner's holds -----------------------------------------------------------------------------


class Plan(Enum):
    """What an acquisition needs, given the owner's holds on the key."""

    REENTER = "reenter"  # counted here, no call to the server
    CALL = "call"  # the first hold of this mode: ask the server
    UPGRADE = "upgrade"  # write while only reading: refused


@dataclass
class _Count:
    reads: int = 0
    writes: int = 0
    token: int = 0  # the fencing token of the write holding


class Holds:
    """The locks one owner's session holds, by advisory key (PostgreSQL counts
    its own holds, but is told only the first acquire and last release per mode)."""

    def __init__(self) -> None:
        self._by_key: dict[int, _Count] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def plan(self, key: int, mode: Mode) -> Plan:
        count = self._by_key.get(key)
        if count is None:
            return Plan.CALL
        if mode == "write":
            if count.writes:
                return Plan.REENTER
            return Plan.UPGRADE if count.reads else Plan.CALL
        # A read while writing is a downgrade: take the shared lock as well, so it
        # remains when the write lock is released (granted at once to the holder).
        return Plan.REENTER if count.reads else Plan.CALL

    def granted(self, key: int, mode: Mode, token: int = 0) -> int:
        """Count one more hold; the handle's token (a reentrant write shares its
        holding's token; reads carry 0)."""
        count = self._by_key.setdefault(key, _Count())
        if mode == "read":
            count.reads += 1
            return 0
        if count.writes == 0:
            count.token = token
        count.writes += 1
        return count.token

    def released(self, key: int, mode: Mode) -> bool:
        """Count one hold less; ``True`` if it was the last of its mode (unlock)."""
        count = self._by_key[key]
        if mode == "read":
            count.reads -= 1
            last = count.reads == 0
        else:
            count.writes -= 1
            last = count.writes == 0
        if count.reads == 0 and count.writes == 0:
            del self._by_key[key]
        return last


# -- sessions and handles --------------------------------------------------------------------------


class SessionState(Generic[C, H]):
    """One owner's dedicated connection (``C``) and the holds it has in it; each
    driver's session adds how it is used (``use``) and watched. ``book`` keeps
    the sessions of one engine: ``leave``, ``forget`` and ``discard`` (close a
    connection without waiting for it)."""

    book: Any

    def __init__(self, book: Any, owner: str) -> None:
        self.book = book
        self.owner = owner
        self.pid = os.getpid()
        self.conn: C | None = None
        self.holds = Holds()
        self.handles: set[H] = set()
        self.users = 0  # threads or tasks between enter and leave
        self.broken = False

    def end(self, why: str) -> None:
        """The session ended: every hold in it is lost, the server freed them
        (called with ``use`` held, or by a watch while nobody uses the session)."""
        if self.broken:
            return
        self.broken = True
        handles, self.handles = self.handles, set()
        # All of them are lost before the first on_lost callback runs.
        lost = [handle for handle in handles if not (handle.lost or handle.released)]
        for handle in lost:
            handle.lost, handle.lost_reason = True, why
        for handle in lost:
            handle._announce_lost()
        self.drop_connection()
        self.book.forget(self)

    def drop_connection(self) -> None:
        """Close the connection (without waiting); the next statement needs another."""
        conn, self.conn = self.conn, None
        if conn is not None:
            self.book.discard(conn)

    def leave(self) -> None:
        """Done using the session (the book parks or watches its connection)."""
        self.book.leave(self)


class PostgresHandleState(HandleState):
    """What the sync and the asyncio handle know besides the lock: its key, and the
    session holding it."""

    __slots__ = ("key", "session")

    after_loss: ClassVar[str] = "its session ended, so PostgreSQL had freed it"

    def __init__(
        self, lock: Any, session: Any, mode: Mode, owner: str, token: int, on_lost: Any
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock
        self.session = session
        self.key: int = lock.key


def releasable(lock: object, handle: PostgresHandleState) -> bool:
    """Whether ``handle`` is still to release (``False``: it was released before);
    another lock's handle, or a parent's hold in a forked child, is refused."""
    if handle.lock is not lock:
        raise ValueError("this handle belongs to another lock")
    if handle.released:
        return False
    if handle.session.pid != os.getpid():
        raise LockNotHeldError(
            f"the {handle.mode} lock {handle.lock_name!r} is held by the process that forked "
            "this one; a child does not inherit its parent's locks",
            name=handle.lock_name,
            owner=handle.owner,
            mode=handle.mode,
        )
    return True


# -- connections -----------------------------------------------------------------------------------


def detached_connection(pool: Pool, kind: type[C], needs: str) -> C:
    """A new connection of ``pool`` (a pool of our own with the engine's settings),
    detached from it at once, so the pool's limits never bind and a connection
    holding a lock is never pooled. ``needs`` names the driver it must be."""
    fairy = pool.connect()
    conn = fairy.driver_connection
    fairy.detach()
    if not isinstance(conn, kind):
        fairy.close()
        raise TypeError(f"{needs} needs the psycopg driver (postgresql+psycopg://)")
    return conn


def session_settings(server_version: int) -> str:
    """The settings of a lock session: no server timeout may end it while it waits
    or holds (lock_timeout bounds every wait), and the server probes an idle client
    so that the locks of one that vanished (host down, network cut) are freed
    within about ``KEEPALIVE_WITHIN`` s rather than the system's two hours."""
    settings = {
        "statement_timeout": "0",
        "idle_in_transaction_session_timeout": "0",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
    }
    if server_version >= 140000:
        settings["idle_session_timeout"] = "0"
    calls = ", ".join(f"set_config('{name}', '{value}', false)" for name, value in settings.items())
    return f"SELECT {calls}"


def broken(conn: psycopg.BaseConnection[Any] | None) -> bool:
    return conn is None or conn.closed or conn.broken


def alive(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether the server still keeps the session: reads what the socket holds,
    without a round trip (a terminated backend leaves an error and EOF there)."""
    if broken(conn):
        return False
    try:
        # libpq stops after the data it read; EOF behind it shows on the next read.
        conn.pgconn.consume_input()
        conn.pgconn.consume_input()
    except psycopg.Error:
        return False
    return conn.pgconn.status == pq.ConnStatus.OK


def last_error(conn: psycopg.BaseConnection[Any]) -> str:
    message = conn.pgconn.error_message.decode("utf-8", "replace").strip()
    return " ".join(message.split()) or "the server closed the connection"


def check_dialect(who: str, dialect: Dialect) -> None:
    """``who`` needs an engine on PostgreSQL through psycopg 3."""
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise TypeError(
            f"{who} needs a PostgreSQL engine through psycopg 3 "
            f"(postgresql+psycopg://...), not {dialect.name}+{dialect.driver}"
        )


def check_transaction(dialect: str, driver_connection: object) -> None:
    """A transaction-scoped lock needs PostgreSQL and a connection in a transaction."""
    if dialect != "postgresql":
        raise TypeError(f"a transaction-scoped lock needs PostgreSQL, not {dialect}")
    if getattr(driver_connection, "autocommit", False):
        raise ValueError(
            "a transaction-scoped lock needs a connection in a transaction; this one is in "
            "autocommit mode, where the lock would end with its own statement"
        )


# -- errors ----------------------------------------------------------------------------------------

# The wait ended without the lock: lock_timeout (lock_not_available), a
# statement_timeout or cancel (query_canceled), or the server breaking a cycle of
# owners that wait for each other (deadlock_detected).
_WAIT_ENDED: Final = frozenset({"55P03", "57014", "40P01"})
# CREATE SEQUENCE IF NOT EXISTS raced by someone else's: made meanwhile, fine.
_MADE_MEANWHILE: Final = frozenset({"23505", "42P07"})


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg's, or SQLAlchemy's around one)."""
    error = exc.orig if isinstance(exc, DBAPIError) else exc
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return state if isinstance(state, str) else None


def _unavailable(name: str, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(
        f"PostgreSQL unreachable or refusing while working on lock {name!r}: {exc}"
    )


def _no_sequence(lock: LockSettings, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(
        f"the fencing sequence {lock.fence_sequence!r} of lock {lock.name!r} is missing "
        f"and could not be created ({exc}); create it (CREATE SEQUENCE "
        f"{lock.fence_sequence}) or pass fencing=False"
    )


# -- SQL -------------------------------------------------------------------------------------------
# Each acquisition is one statement answering (granted, token). The MATERIALIZED
# CTEs order it by data dependency: lock_timeout is set, then the lock is waited
# for, and only once it is granted is the fencing token drawn. to_regclass makes
# a missing sequence a NULL token rather than an error after the grant.

_WAIT_FOR: Final = {
    "write": """
WITH deadline AS MATERIALIZED (SELECT set_config('lock_timeout', %(ms)s, false)),
     granted AS MATERIALIZED (SELECT pg_advisory_lock(%(key)s) FROM deadline)
SELECT true, {token} FROM granted""",
    "read": """
WITH deadline AS MATERIALIZED (SELECT set_config('lock_timeout', %(ms)s, false)),
     granted AS MATERIALIZED (SELECT pg_advisory_lock_shared(%(key)s) FROM deadline)
SELECT true, {token} FROM granted""",
}
_TRY_FOR: Final = {
    "write": """
WITH granted AS MATERIALIZED (SELECT pg_try_advisory_lock(%(key)s) AS ok)
SELECT ok, CASE WHEN ok THEN {token} END FROM granted""",
    "read": """
WITH granted AS MATERIALIZED (SELECT pg_try_advisory_lock_shared(%(key)s) AS ok)
SELECT ok, CASE WHEN ok THEN {token} END FROM granted""",
}
_UNLOCK: Final = {
    "write": "SELECT pg_advisory_unlock(%(key)s)",
    "read": "SELECT pg_advisory_unlock_shared(%(key)s)",
}
_FENCE_TOKEN: Final = "nextval(to_regclass(%(fence)s))"
_NEXT_TOKEN: Final = "SELECT nextval(to_regclass(%(fence)s))"

# The transaction-scoped statements (SQLAlchemy text(), so named parameters).
# A write first looks for its own transaction's read hold (a refused upgrade
# answers NULL).
_XACT_TRY: Final = {
    "write": """
WITH mine AS MATERIALIZED (
       SELECT coalesce(bool_or(mode = 'ShareLock'), false) AS reads,
              coalesce(bool_or(mode = 'ExclusiveLock'), false) AS writes
       FROM pg_locks
       WHERE locktype = 'advisory' AND pid = pg_backend_pid()
         AND classid = CAST(:classid AS oid) AND objid = CAST(:objid AS oid) AND objsubid = 1),
     granted AS MATERIALIZED (
       SELECT CASE WHEN reads AND NOT writes THEN NULL
                   ELSE pg_try_advisory_xact_lock(:key) END AS ok FROM mine)
SELECT ok, CASE WHEN ok THEN {token} END FROM granted""",
    "read": """
WITH granted AS MATERIALIZED (SELECT pg_try_advisory_xact_lock_shared(:key) AS ok)
SELECT ok, CASE WHEN ok THEN {token} END FROM granted""",
}
# lock_timeout is set for this one wait, then put back as it was.
_XACT_WAIT: Final = {
    "write": """
WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value),
     deadline AS MATERIALIZED (SELECT set_config('lock_timeout', :ms, true) FROM previous),
     granted AS MATERIALIZED (SELECT pg_advisory_xact_lock(:key) FROM deadline),
     restored AS MATERIALIZED (
       SELECT set_config('lock_timeout', previous.value, true) FROM granted, previous)
SELECT {token} FROM restored""",
    "read": """
WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value),
     deadline AS MATERIALIZED (SELECT set_config('lock_timeout', :ms, true) FROM previous),
     granted AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:key) FROM deadline),
     restored AS MATERIALIZED (
       SELECT set_config('lock_timeout', previous.value, true) FROM granted, previous)
SELECT {token} FROM restored""",
}
_XACT_TOKEN: Final = "nextval(to_regclass(:fence))"


def _acquire_sql(mode: Mode, *, wait: bool, fenced: bool) -> str:
    token = _FENCE_TOKEN if fenced else "0::bigint"
    return (_WAIT_FOR if wait else _TRY_FOR)[mode].format(token=token)


def _create_sequence_sql(name: str) -> str:
    # The name was checked against _SEQUENCE_NAME: safe to put in the statement.
    return f"CREATE SEQUENCE IF NOT EXISTS {name}"


def lock_timeout_ms(remaining: float) -> str:
    """``lock_timeout`` for a wait of ``remaining`` seconds (0 would mean "forever")."""
    return str(max(1, math.ceil(remaining * 1000)))


# -- steps -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enter:
    """Step: ``book``'s session of ``owner`` with ``use`` held, waiting at most
    ``wait`` s; answer it, or ``None`` if it stayed busy."""

    book: Any
    owner: str
    wait: float


@dataclass(frozen=True, slots=True)
class Connect:
    """Step: a connection of ``book`` that holds no lock; answer it."""

    book: Any


@dataclass(frozen=True, slots=True)
class Run:
    """Step: run ``query`` (psycopg's ``%(name)s`` parameters) on ``conn``; answer
    its first row, or ``None`` if ``rows`` is false (a statement without rows)."""

    conn: Any
    query: str
    params: dict[str, Any] | None = None
    rows: bool = True


@dataclass(frozen=True, slots=True)
class Transaction:
    """Step: the SQLAlchemy connection of ``transaction`` (a connection or session),
    checked to hold a transaction on PostgreSQL; answer it."""

    transaction: Any


@dataclass(frozen=True, slots=True)
class RunIn:
    """Step: run ``query`` as SQLAlchemy ``text()`` (``:name`` parameters) on
    ``conn``; answer its only row, or ``None`` if ``rows`` is false."""

    conn: Any
    query: str
    params: dict[str, Any] | None = None
    rows: bool = True


Step = Enter | Connect | Run | Transaction | RunIn
_AnySession = SessionState[Any, Any]

# -- acquiring -------------------------------------------------------------------------------------


def acquire_flow(
    lock: LockSettings,
    book: Any,
    mode: Mode,
    owner: str,
    timeout: Seconds | None,
    *,
    timer: Callable[[], float],
    make: Callable[[Any, Mode, str, int], H],
) -> Generator[Step, Any, H]:
    """Wait until ``owner`` holds the lock (or :class:`LockTimeout`); return the
    handle ``make(session, mode, owner, token)`` made."""
    limit = lock.timeout if timeout is None else check_positive("timeout", timeout)
    handle = yield from _acquiring(
        lock, book, mode, owner, limit, wait=True, timer=timer, make=make
    )
    assert handle is not None  # a wait ends with the lock or an error
    return handle


def try_flow(
    lock: LockSettings,
    book: Any,
    mode: Mode,
    owner: str,
    *,
    timer: Callable[[], float],
    make: Callable[[Any, Mode, str, int], H],
) -> Generator[Step, Any, H | None]:
    """One attempt, no waiting in the server: the handle, or ``None`` if busy."""
    return (
        yield from _acquiring(
            lock, book, mode, owner, lock.timeout, wait=False, timer=timer, make=make
        )
    )


def _acquiring(
    lock: LockSettings,
    book: Any,
    mode: Mode,
    owner: str,
    limit: float,
    *,
    wait: bool,
    timer: Callable[[], float],
    make: Callable[[Any, Mode, str, int], H],
) -> Generator[Step, Any, H | None]:
    start = timer()
    deadline = start + limit
    for _ in range(2):  # a second time only if the owner's session had ended
        session: _AnySession | None = yield Enter(book, owner, deadline - timer())
        if session is None:  # another thread or task of this owner kept it busy
            raise LockTimeout(name=lock.name, mode=mode, waited=timer() - start, owner=owner)
        try:
            plan = session.holds.plan(lock.key, mode)
            if plan is not Plan.CALL and session.conn is not None and not alive(session.conn):
                # It ended unnoticed so far: its holds are gone, start afresh.
                session.end("the database session ended")
                continue
            if plan is Plan.UPGRADE:
                raise LockUpgradeError(name=lock.name, owner=owner)
            if plan is Plan.REENTER:
                token = session.holds.granted(lock.key, mode)
            else:
                fence = yield from _lock_call(
                    lock, book, session, mode, owner, start, deadline, wait=wait, timer=timer
                )
                if fence is None:
                    return None
                token = session.holds.granted(lock.key, mode, fence)
            handle = make(session, mode, owner, token)
            session.handles.add(handle)  # before leaving: a loss noticed then marks it
            return handle
        finally:
            session.leave()
    raise AssertionError("unreachable: a fresh session holds nothing")


def _lock_call(
    lock: LockSettings,
    book: Any,
    session: _AnySession,
    mode: Mode,
    owner: str,
    start: float,
    deadline: float,
    *,
    wait: bool,
    timer: Callable[[], float],
) -> Generator[Step, Any, int | None]:
    """Ask the server for the lock: the fencing token (0 without fencing), ``None``
    if a try found it busy."""
    fenced = lock.fencing and mode == "write"
    params: dict[str, Any] = {"key": lock.key, "fence": lock.fence_sequence}
    query = _acquire_sql(mode, wait=wait, fenced=fenced)
    retried = False
    while True:
        fresh = session.conn is None
        if fresh:
            try:
                session.conn = yield Connect(book)
            except (DBAPIError, psycopg.Error, OSError) as exc:
                raise _unavailable(lock.name, exc) from exc
        conn = session.conn
        params["ms"] = lock_timeout_ms(deadline - timer())
        try:
            row = yield Run(conn, query, dict(params))
        except psycopg.Error as exc:
            if not broken(conn):
                # The statement may have failed after the lock was granted (a
                # session lock outlives its statement's error): let it go again.
                yield from _unlock_quietly(lock, session, mode)
                if _sqlstate(exc) in _WAIT_ENDED:
                    raise LockTimeout(
                        name=lock.name, mode=mode, waited=timer() - start, owner=owner
                    ) from exc
                raise _unavailable(lock.name, exc) from exc
            if fresh and not session.holds and not retried:
                # A parked connection the server had closed: one more try.
                retried = True
                session.drop_connection()
                continue
            session.end(f"the database session ended: {exc}")
            raise _unavailable(lock.name, exc) from exc
        except GeneratorExit:  # the driver closed the flow: it may not yield any more
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, a cancelled task: psycopg cancelled the
            # wait in the server): granted or not, nothing may stay behind uncounted.
            yield from _unlock_quietly(lock, session, mode)
            raise
        granted, token = row
        if not granted:
            return None
        if token is None and fenced:  # granted, but the fencing sequence is missing
            return (yield from _token_after_making_the_sequence(lock, session, mode))
        return int(token)


def _unlock_quietly(
    lock: LockSettings, session: _AnySession, mode: Mode
) -> Generator[Step, Any, None]:
    """After a failed or interrupted acquire call: unlock once in case it was granted
    (PostgreSQL answers false, with a warning, if it was not). If even that fails
    (or is interrupted), the session ends: the server then frees whatever it held."""
    conn = session.conn
    if conn is None or session.broken:
        return
    try:
        yield Run(conn, _UNLOCK[mode], {"key": lock.key})
    except BaseException as exc:
        session.end(f"could not undo a failed acquire: {exc!r}")
        if not isinstance(exc, Exception):
            raise


def _token_after_making_the_sequence(
    lock: LockSettings, session: _AnySession, mode: Mode
) -> Generator[Step, Any, int]:
    conn = session.conn
    try:
        with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            # (made meanwhile by someone else)
            yield Run(conn, _create_sequence_sql(lock.fence_sequence), rows=False)
        row = yield Run(conn, _NEXT_TOKEN, {"fence": lock.fence_sequence})
    except GeneratorExit:  # the driver closed the flow: it may not yield any more
        raise
    except psycopg.Error as exc:
        if broken(conn):
            session.end(f"the database session ended: {exc}")
        else:
            yield from _unlock_quietly(lock, session, mode)
        raise _no_sequence(lock, exc) from exc
    except BaseException:
        # Interrupted after the grant (KeyboardInterrupt, a cancelled task): the
        # lock is not counted yet, so it may not stay held.
        yield from _unlock_quietly(lock, session, mode)
        raise
    return int(row[0])


# -- releasing -------------------------------------------------------------------------------------


def release_flow(handle: PostgresHandleState) -> Generator[Step, Any, None]:
    """Release one hold (the driver uses its session meanwhile); the last of its
    mode unlocks at the server. :class:`LockLostError` if the session had ended."""
    session: _AnySession = handle.session
    session.handles.discard(handle)
    if handle.lost or session.broken:
        raise handle._lost_at_release()
    if not session.holds.released(handle.key, handle.mode):
        return  # an outer hold of this mode remains
    conn = session.conn
    try:
        row = yield Run(conn, _UNLOCK[handle.mode], {"key": handle.key})
    except BaseException as exc:
        # Whatever went wrong (a cancel too), the session must not outlive a failed
        # unlock holding a lock nobody counts: end it (the server frees the rest).
        session.end(f"the database session ended: {str(exc) or repr(exc)}")
        if not isinstance(exc, psycopg.Error):
            raise
        if broken(conn):
            raise handle._lost_at_release() from exc
        raise _unavailable(handle.lock_name, exc) from exc
    if not (row and row[0]):
        session.end("the server did not hold the lock any more")
        raise handle._lost_at_release()


# -- transaction-scoped locks ----------------------------------------------------------------------


def take_in_flow(
    lock: LockSettings,
    transaction: object,
    mode: Mode,
    timeout: Seconds | None,
    *,
    timer: Callable[[], float],
) -> Generator[Transaction | RunIn, Any, TransactionLock]:
    """Take the lock in the caller's ``transaction`` until it commits or rolls back:
    first one attempt that cannot fail (an error would abort the transaction), and
    only if the lock is busy, a wait in a savepoint."""
    limit = lock.timeout if timeout is None else check_positive("timeout", timeout)
    start = timer()
    conn = yield Transaction(transaction)
    params: dict[str, Any] = {"key": lock.key, "fence": lock.fence_sequence}
    params["classid"], params["objid"] = key_parts(lock.key)
    fenced = lock.fencing and mode == "write"
    token = _XACT_TOKEN if fenced else "0::bigint"
    try:
        granted, fence = yield RunIn(conn, _XACT_TRY[mode].format(token=token), params)
        if granted is None:
            raise LockUpgradeError(name=lock.name)
        if not granted:
            params["ms"] = lock_timeout_ms(start + limit - timer())
            query = _XACT_WAIT[mode].format(token=token)
            fence = yield from _wait_in(lock, conn, mode, query, params, start, timer)
        if fence is None and fenced:  # granted, but the fencing sequence is missing
            fence = yield from _token_in_after_making_the_sequence(lock, conn)
    except DBAPIError as exc:
        raise _unavailable(lock.name, exc) from exc
    return TransactionLock(lock.name, mode, int(fence))


def _wait_in(
    lock: LockSettings,
    conn: Any,
    mode: Mode,
    query: str,
    params: dict[str, Any],
    start: float,
    timer: Callable[[], float],
) -> Generator[RunIn, Any, Any]:
    """Wait in a savepoint, so that a timeout leaves the transaction usable."""
    yield RunIn(conn, f"SAVEPOINT {_SAVEPOINT}", rows=False)
    try:
        (fence,) = yield RunIn(conn, query, params)
    except DBAPIError as exc:
        yield RunIn(conn, f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", rows=False)
        yield RunIn(conn, f"RELEASE SAVEPOINT {_SAVEPOINT}", rows=False)
        if _sqlstate(exc) in _WAIT_ENDED:
            raise LockTimeout(name=lock.name, mode=mode, waited=timer() - start) from exc
        raise
    # The lock passes from the savepoint to the enclosing transaction.
    yield RunIn(conn, f"RELEASE SAVEPOINT {_SAVEPOINT}", rows=False)
    return fence


def _token_in_after_making_the_sequence(
    lock: LockSettings, conn: Any
) -> Generator[RunIn, Any, int]:
    # In a savepoint: a failure must not abort the caller's transaction.
    yield RunIn(conn, f"SAVEPOINT {_SAVEPOINT}", rows=False)
    try:
        yield RunIn(conn, _create_sequence_sql(lock.fence_sequence), rows=False)
    except DBAPIError as exc:
        yield RunIn(conn, f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", rows=False)
        if _sqlstate(exc) not in _MADE_MEANWHILE:
            yield RunIn(conn, f"RELEASE SAVEPOINT {_SAVEPOINT}", rows=False)
            raise _no_sequence(lock, exc) from exc
    yield RunIn(conn, f"RELEASE SAVEPOINT {_SAVEPOINT}", rows=False)
    (token,) = yield RunIn(conn, f"SELECT {_XACT_TOKEN}", {"fence": lock.fence_sequence})
    return int(token)
