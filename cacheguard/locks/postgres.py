"""The read-write lock on PostgreSQL advisory locks.

::

    engine = sqlalchemy.create_engine("postgresql+psycopg://...")
    lock = PostgresRWLock(engine, "menu:7")
    with lock.write(timeout=5) as handle:
        write_to_db(fencing_token=handle.token)

Sessions
    A holding lives in a PostgreSQL *session*: ``pg_advisory_lock`` (write) and
    ``pg_advisory_lock_shared`` (read) on a connection of its own per owner, made
    from the engine's settings but outside its pool, in autocommit mode. All locks
    one owner holds on one engine share that connection; when the owner holds
    nothing any more it is parked for the next owner (at most ``MAX_IDLE`` per
    engine). A session that ends frees every lock it held: a process that dies, or
    a connection the server terminated, leaves nothing behind and needs no lease;
    a host that vanished is found by the TCP keepalives the session asks the
    server for (``KEEPALIVE_WITHIN``).

Waiting
    A blocked acquisition waits *inside* PostgreSQL: one ``pg_advisory_lock`` call
    with ``lock_timeout`` set to what is left of the deadline. The server's lock
    queue wakes the waiter the moment the lock frees (no polling, no
    notification to lose; ``LISTEN/NOTIFY`` wake-ups would leave waiters out of
    that queue), and since a new request queues behind a conflicting one that
    already waits, a waiting writer holds off new readers: writer preference, and
    arrival order among writers, come from the server.

Reentrancy
    Counted here, per owner and key; PostgreSQL sees one lock call per mode (the
    first) and one unlock (the last). Read while writing takes the shared lock
    too, so releasing the write lock downgrades. Write while only reading is
    refused with :class:`LockUpgradeError`.

Keys
    :func:`advisory_key`: the first 8 bytes of a BLAKE2b digest of the namespace
    and the name (each length-prefixed). Two names that collide share one lock:
    more waiting, never two holders of one name at once (docs/locks.md).

Fencing
    With ``fencing=True`` (the default) a write holding takes ``nextval`` of one
    sequence (``cacheguard_lock_fence``, created on first use) in the same
    statement, after the lock was granted: strictly increasing across all write
    holdings of all locks, and across server restarts.

Loss
    One thread per process (:class:`SessionWatch`) sleeps in ``select()`` on the
    sockets of the sessions that hold locks; a session the server ended
    (``pg_terminate_backend``, a restart) marks its handles ``lost`` within
    moments, and their release raises :class:`LockLostError`.

Transaction-scoped locks
    :meth:`PostgresRWLock.write_in` / :meth:`~PostgresRWLock.read_in` take
    ``pg_advisory_xact_lock`` in the caller's own transaction: held until it
    commits or rolls back, excluding (and excluded by) the session-level locks of
    the same name.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import selectors
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final

import psycopg
import psycopg.errors
from psycopg import pq, sql
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool, QueuePool

from cacheguard._identity import on_fork_in_child, thread_owner
from cacheguard.checks import check_positive
from cacheguard.exceptions import (
    BackendUnavailable,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
)
from cacheguard.keys import check_namespace
from cacheguard.locks.redis_rwlock import HandleState, release_on_exit

if TYPE_CHECKING:
    from cacheguard.locks.protocol import Mode

__all__ = [
    "DEFAULT_FENCE_SEQUENCE",
    "KEEPALIVE_WITHIN",
    "MAX_IDLE",
    "LockSettings",
    "PostgresLockHandle",
    "PostgresRWLock",
    "SessionWatch",
    "TransactionLock",
    "advisory_key",
    "close_idle_connections",
    "key_parts",
    "lock_settings",
    "lock_timeout_ms",
]

log = logging.getLogger("cacheguard.lock")

DEFAULT_FENCE_SEQUENCE: Final = "cacheguard_lock_fence"
MAX_IDLE: Final = 4  # parked connections kept per engine for the next owner
KEEPALIVE_WITHIN: Final = 25.0  # s: 10 idle + 3 probes 5 s apart (_session_settings)
_KEY_PERSON: Final = b"cacheguard.lock"  # BLAKE2b personalisation: our keys only
_SEQUENCE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?")
_SAVEPOINT: Final = "cacheguard_lock_wait"

LostCallback = Callable[["PostgresLockHandle"], None]


# -- keys ------------------------------------------------------------------------------------------


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


# -- one owner's holds (no I/O: shared with the asyncio lock) --------------------------------------


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


def _acquire_sql(mode: Mode, *, wait: bool, fenced: bool) -> str:
    token = _FENCE_TOKEN if fenced and mode == "write" else "0::bigint"
    return (_WAIT_FOR if wait else _TRY_FOR)[mode].format(token=token)


def lock_timeout_ms(remaining: float) -> str:
    """``lock_timeout`` for a wait of ``remaining`` seconds (0 would mean "forever")."""
    return str(max(1, math.ceil(remaining * 1000)))


# -- errors ----------------------------------------------------------------------------------------

# The wait ended without the lock: lock_timeout, a statement_timeout or cancel.
_WAIT_ENDED: Final = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)


def _unavailable(name: str, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(
        f"PostgreSQL unreachable or refusing while working on lock {name!r}: {exc}"
    )


def _broken(conn: psycopg.BaseConnection[Any] | None) -> bool:
    return conn is None or conn.closed or conn.broken


def _alive(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether the server still keeps the session: reads what the socket holds,
    without a round trip (a terminated backend leaves an error and EOF there)."""
    if _broken(conn):
        return False
    try:
        # libpq stops after the data it read; EOF behind it shows on the next read.
        conn.pgconn.consume_input()
        conn.pgconn.consume_input()
    except psycopg.Error:
        return False
    return conn.pgconn.status == pq.ConnStatus.OK


def _last_error(conn: psycopg.BaseConnection[Any]) -> str:
    message = conn.pgconn.error_message.decode("utf-8", "replace").strip()
    return " ".join(message.split()) or "the server closed the connection"


def _session_settings(server_version: int) -> str:
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


# -- sessions --------------------------------------------------------------------------------------


class _Session:
    """One owner's dedicated connection and the locks it holds in it."""

    def __init__(self, book: _Book, owner: str) -> None:
        self.book = book
        self.owner = owner
        self.pid = os.getpid()
        self.conn: psycopg.Connection[Any] | None = None
        self.holds = Holds()
        self.handles: set[PostgresLockHandle] = set()
        self.use = threading.Lock()  # one statement at a time on the connection
        self.users = 0  # threads between enter and leave (guarded by the book's mutex)
        self.broken = False
        self.watched = False  # handed to the SessionWatch (changed under ``use``)
        self.rearm = False  # the watch dropped our socket while we used it
        self.flags = threading.Lock()  # guards ``rearm``

    def end(self, why: str) -> None:
        """The session ended (call with ``use`` held): every hold in it is lost."""
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
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self.book.forget(self)


class _Book:
    """The dedicated sessions of one engine in this process."""

    def __init__(self, engine: Engine) -> None:
        pool = engine.pool
        if not isinstance(pool, (QueuePool, NullPool)):
            raise TypeError(
                f"PostgresRWLock needs an engine with a QueuePool or a NullPool, "
                f"not a {type(pool).__name__} (it makes connections of its own from it)"
            )
        # A pool of our own with the engine's settings and connect events; each
        # connection is detached at once, so its limits never bind and the
        # application's pool never lends a connection to a waiting lock.
        self._pool = pool.recreate()
        self._mutex = threading.Lock()
        self._owners: dict[str, _Session] = {}
        self._idle: list[psycopg.Connection[Any]] = []

    # sessions

    def enter(self, owner: str, wait: float) -> _Session | None:
        """The owner's session with ``use`` held (``None`` if it stayed busy ``wait`` s)."""
        while True:
            with self._mutex:
                session = self._owners.get(owner)
                if session is None:
                    session = self._owners[owner] = _Session(self, owner)
                session.users += 1
            if not session.use.acquire(timeout=max(wait, 0.0)):
                self._unpin(session)
                return None
            if not session.broken:
                return session
            session.use.release()  # it ended meanwhile: the owner starts a new one
            self._unpin(session)

    def leave(self, session: _Session) -> None:
        """Done with the session: park its connection if it holds nothing, keep the
        watch on it if it does; then release ``use``."""
        parked: psycopg.Connection[Any] | None = None
        if not session.broken and not session.holds and session.conn is not None:
            parked, session.conn = session.conn, None
        if session.watched and (parked is not None or session.broken):
            session.watched = False
            default_watch().remove(session)
        elif session.holds and not session.watched and not session.broken:
            session.watched = True
            default_watch().add(session)
        if parked is not None:
            self._park(parked)
        session.use.release()
        with session.flags:
            rearm, session.rearm = session.rearm, False
        if rearm and session.watched:
            default_watch().add(session)
        self._unpin(session)

    def forget(self, session: _Session) -> None:
        with self._mutex:
            if self._owners.get(session.owner) is session:
                del self._owners[session.owner]

    def _unpin(self, session: _Session) -> None:
        with self._mutex:
            session.users -= 1
            idle = session.users == 0 and not session.holds
            if idle and self._owners.get(session.owner) is session:
                del self._owners[session.owner]

    # connections

    def connect(self) -> psycopg.Connection[Any]:
        """A connection holding no locks: a parked one that still answers, or a new one."""
        while True:
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if _alive(conn):
                return conn
            with contextlib.suppress(Exception):
                conn.close()
        fairy = self._pool.connect()
        conn = fairy.driver_connection
        fairy.detach()
        if not isinstance(conn, psycopg.Connection):
            fairy.close()
            raise TypeError("PostgresRWLock needs the psycopg driver (postgresql+psycopg://)")
        conn.autocommit = True  # no transaction stays open while a lock is held
        try:
            conn.execute(_session_settings(conn.info.server_version))
        except BaseException:
            conn.close()
            raise
        return conn

    def _park(self, conn: psycopg.Connection[Any]) -> None:
        with self._mutex:
            if len(self._idle) < MAX_IDLE and not _broken(conn):
                self._idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    def close_idle(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


_books: weakref.WeakKeyDictionary[Engine, _Book] = weakref.WeakKeyDictionary()
_books_mutex = threading.Lock()


def _book_for(engine: Engine) -> _Book:
    with _books_mutex:
        book = _books.get(engine)
        if book is None:
            book = _books[engine] = _Book(engine)
        return book


def close_idle_connections(engine: Engine) -> None:
    """Close the parked lock connections of ``engine`` (held locks keep theirs)."""
    with _books_mutex:
        book = _books.get(engine)
    if book is not None:
        book.close_idle()


# -- the watch -------------------------------------------------------------------------------------


class SessionWatch:
    """One thread per process that notices at once when a session holding locks
    ends: it sleeps in ``select()`` on those sessions' sockets, which only turn
    readable when the server says something unasked (an error, then EOF, when it
    terminates the backend). No query, no timer.

    A socket that turns readable while its owner is in the middle of a statement
    is left to the owner (dropped from the watch until the owner is done)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._pending: list[tuple[bool, _Session]] = []
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def add(self, session: _Session) -> None:
        self._post(True, session)

    def remove(self, session: _Session) -> None:
        self._post(False, session)

    def _post(self, add: bool, session: _Session) -> None:
        with self._mutex:
            self._pending.append((add, session))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cacheguard-pg-watch", daemon=True
                )
                self._thread.start()
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"!")

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        watched: dict[_Session, int] = {}
        try:
            while True:
                with self._mutex:
                    changes, self._pending = self._pending, []
                    if not changes and not watched:
                        self._thread = None
                        return
                for add, session in changes:
                    if add:
                        self._register(selector, watched, session)
                    else:
                        self._unregister(selector, watched, session)
                if not watched:
                    continue
                for key, _ in selector.select():
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif key.data in watched:
                        self._check(selector, watched, key.data)
        except Exception:
            log.exception("the PostgreSQL session watch stopped")
            with self._mutex:
                self._thread = None
        finally:
            selector.close()

    @staticmethod
    def _register(
        selector: selectors.BaseSelector, watched: dict[_Session, int], session: _Session
    ) -> None:
        conn = session.conn
        if session in watched or session.broken or _broken(conn):
            return
        assert conn is not None
        fd = conn.fileno()
        with contextlib.suppress(KeyError):  # a stale registration of a reused number
            stale = selector.get_key(fd).data
            watched.pop(stale, None)
            selector.unregister(fd)
        selector.register(fd, selectors.EVENT_READ, session)
        watched[session] = fd

    @staticmethod
    def _unregister(
        selector: selectors.BaseSelector, watched: dict[_Session, int], session: _Session
    ) -> None:
        fd = watched.pop(session, None)
        if fd is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(fd)

    def _check(
        self, selector: selectors.BaseSelector, watched: dict[_Session, int], session: _Session
    ) -> None:
        if not session.use.acquire(blocking=False):
            # The owner is reading its own reply: leave the socket to it until it
            # is done (it adds the session back), unless it just finished.
            self._unregister(selector, watched, session)
            with session.flags:
                session.rearm = True
            if not session.use.acquire(blocking=False):
                return
            with session.flags:
                session.rearm = False
            self._register(selector, watched, session)
        try:
            conn = session.conn
            if session.broken or conn is None:
                self._unregister(selector, watched, session)
            elif not _alive(conn):
                self._unregister(selector, watched, session)
                session.end(f"the database session ended: {_last_error(conn)}")
        finally:
            session.use.release()


_watch: SessionWatch | None = None
_watch_mutex = threading.Lock()


def default_watch() -> SessionWatch:
    """The process's session watch (a new one after ``fork()``)."""
    global _watch
    with _watch_mutex:
        if _watch is None:
            _watch = SessionWatch()
        return _watch


def _reset_after_fork() -> None:
    # The parent's sessions stay untouched in the child (psycopg never closes a
    # connection that another process opened): the child starts afresh.
    global _watch, _books, _books_mutex, _watch_mutex
    old = _watch
    _watch, _watch_mutex = None, threading.Lock()
    _books, _books_mutex = weakref.WeakKeyDictionary(), threading.Lock()
    if old is not None:
        for fd in (old._wake_r, old._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


on_fork_in_child(_reset_after_fork)


# -- handles ---------------------------------------------------------------------------------------


class PostgresLockHandle(HandleState):
    """One acquisition of a :class:`PostgresRWLock`.

    ``token``: for write holds the fencing token (``fencing=True``), strictly
    greater than that of every earlier write hold; 0 for reads and without
    fencing. ``lost`` turns true when the session holding the lock ended.
    """

    __slots__ = ("key", "lock", "session")

    def __init__(
        self,
        lock: PostgresRWLock,
        session: _Session,
        mode: Mode,
        owner: str,
        token: int,
        on_lost: LostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock
        self.session = session
        self.key = lock.key

    @property
    def lock_name(self) -> str:
        return self.lock.name

    def release(self) -> None:
        self.lock.release(self)

    def _announce_lost(self) -> None:
        log.warning(
            "lost the %s lock %r (owner %s, token %d): %s",
            self.mode,
            self.lock.name,
            self.owner,
            self.token,
            self.lost_reason,
        )
        if self._on_lost is not None:
            self._start_on_lost()

    def _start_on_lost(self) -> None:
        threading.Thread(target=self._run_on_lost, name="cacheguard-on-lost", daemon=True).start()

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            self._on_lost(self)
        except Exception:
            log.exception("on_lost callback of lock %r failed", self.lock.name)

    def _lost_at_release(self) -> LockLostError:
        self.lost = True
        self.lost_reason = self.lost_reason or "the holding was gone at release"
        return LockLostError(
            f"the {self.mode} lock {self.lock.name!r} (token {self.token}) was lost before "
            f"release: {self.lost_reason}; its session ended, so PostgreSQL had freed it",
            name=self.lock.name,
            owner=self.owner,
            mode=self.mode,
        )

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<PostgresLockHandle {self.mode} {self.lock.name!r} token={self.token} "
            f"owner={self.owner} {state}>"
        )


@dataclass(frozen=True)
class TransactionLock:
    """A lock held by a database transaction (:meth:`PostgresRWLock.write_in`):
    released when that transaction commits or rolls back, not before."""

    name: str
    mode: Mode
    token: int  # the fencing token of a write (fencing on), else 0


# -- the lock --------------------------------------------------------------------------------------


class PostgresRWLock:
    """A read-write lock shared by every session of one PostgreSQL database.

    ``engine``: a SQLAlchemy engine on ``postgresql+psycopg://``. ``namespace``
    and ``name`` give the advisory key (:func:`advisory_key`). ``timeout`` (s):
    the default deadline of blocking acquisitions. ``fencing``: give write
    handles a token from the sequence ``fence_sequence`` (created on first use
    if missing). ``on_lost`` is called (on a thread of its own) with a handle
    whose session ended.
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        *,
        namespace: str = "cg",
        timeout: float = 30.0,
        fencing: bool = True,
        fence_sequence: str = DEFAULT_FENCE_SEQUENCE,
        on_lost: LostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(
                f"PostgresRWLock needs a sqlalchemy Engine, not {type(engine).__name__} "
                "(for an AsyncEngine use cacheguard.aio.postgres.AsyncPostgresRWLock)"
            )
        if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
            raise TypeError(
                "PostgresRWLock needs a PostgreSQL engine through psycopg 3 "
                f"(postgresql+psycopg://...), not {engine.dialect.name}+{engine.dialect.driver}"
            )
        settings = lock_settings(name, namespace, timeout, fencing, fence_sequence)
        self.engine = engine
        self.name, self.namespace, self.key = settings.name, settings.namespace, settings.key
        self.timeout = settings.timeout
        self.fencing, self.fence_sequence = settings.fencing, settings.fence_sequence
        self._on_lost = on_lost
        self._timer = timer
        _book_for(engine)  # checks the pool class now rather than at first use

    @property
    def _book(self) -> _Book:
        # Looked up each time: a forked child gets a book (and connections) of its own.
        return _book_for(self.engine)

    # -- acquiring ---------------------------------------------------------------------

    def acquire_read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> PostgresLockHandle:
        """Block until the read lock is ours (or :class:`LockTimeout`)."""
        handle = self._acquire("read", timeout, owner, wait=True)
        assert handle is not None
        return handle

    def acquire_write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> PostgresLockHandle:
        """Block until the write lock is ours; a read holder gets :class:`LockUpgradeError`."""
        handle = self._acquire("write", timeout, owner, wait=True)
        assert handle is not None
        return handle

    def try_acquire_read(self, *, owner: str | None = None) -> PostgresLockHandle | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return self._acquire("read", None, owner, wait=False)

    def try_acquire_write(self, *, owner: str | None = None) -> PostgresLockHandle | None:
        return self._acquire("write", None, owner, wait=False)

    @contextmanager
    def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Iterator[PostgresLockHandle]:
        handle = self.acquire_read(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    @contextmanager
    def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> Iterator[PostgresLockHandle]:
        handle = self.acquire_write(timeout, owner=owner)
        with release_on_exit(handle.release):
            yield handle

    def _acquire(
        self, mode: Mode, timeout: float | None, owner: str | None, *, wait: bool
    ) -> PostgresLockHandle | None:
        owner = owner or thread_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        book = self._book
        for _ in range(2):  # a second time only if the owner's session had ended
            session = book.enter(owner, start + limit - self._timer())
            if session is None:  # another thread of this owner kept its session busy
                raise LockTimeout(
                    name=self.name, mode=mode, waited=self._timer() - start, owner=owner
                )
            try:
                plan = session.holds.plan(self.key, mode)
                if plan is not Plan.CALL and session.conn is not None and not _alive(session.conn):
                    # It ended unnoticed so far: its holds are gone, start afresh.
                    session.end("the database session ended")
                    continue
                return self._acquire_in(session, plan, mode, owner, start, start + limit, wait)
            finally:
                book.leave(session)
        raise AssertionError("unreachable: a fresh session holds nothing")

    def _acquire_in(
        self,
        session: _Session,
        plan: Plan,
        mode: Mode,
        owner: str,
        start: float,
        deadline: float,
        wait: bool,
    ) -> PostgresLockHandle | None:
        if plan is Plan.UPGRADE:
            raise LockUpgradeError(name=self.name, owner=owner)
        if plan is Plan.REENTER:
            token = session.holds.granted(self.key, mode)
        else:
            fence = self._lock_call(session, mode, owner, start, deadline, wait=wait)
            if fence is None:
                return None
            token = session.holds.granted(self.key, mode, fence)
        handle = PostgresLockHandle(self, session, mode, owner, token, self._on_lost)
        session.handles.add(handle)
        return handle

    def _lock_call(
        self,
        session: _Session,
        mode: Mode,
        owner: str,
        start: float,
        deadline: float,
        *,
        wait: bool,
    ) -> int | None:
        """Ask the server for the lock (``session.use`` held): the fencing token
        (0 without fencing), ``None`` if a try found it busy."""
        fenced = self.fencing and mode == "write"
        params: dict[str, Any] = {"key": self.key, "fence": self.fence_sequence}
        query = _acquire_sql(mode, wait=wait, fenced=fenced)
        retried = False
        while True:
            fresh = session.conn is None
            if fresh:
                session.conn = self._connect()
            conn = session.conn
            assert conn is not None
            params["ms"] = lock_timeout_ms(deadline - self._timer())
            try:
                row = conn.execute(query, params).fetchone()
            except psycopg.Error as exc:
                if not _broken(conn):
                    # The statement may have failed after the lock was granted (a
                    # session lock outlives its statement's error): let it go again.
                    self._unlock_quietly(session, mode)
                    if isinstance(exc, (*_WAIT_ENDED, psycopg.errors.DeadlockDetected)):
                        # lock_timeout, a cancel, or the server breaking a cycle of
                        # owners that wait for each other.
                        raise LockTimeout(
                            name=self.name, mode=mode, waited=self._timer() - start, owner=owner
                        ) from exc
                    raise _unavailable(self.name, exc) from exc
                if fresh and not session.holds and not retried:
                    # A parked connection the server had closed: one more try.
                    retried = True
                    session.conn = None
                    with contextlib.suppress(Exception):
                        conn.close()
                    continue
                session.end(f"the database session ended: {exc}")
                raise _unavailable(self.name, exc) from exc
            except BaseException:
                # Interrupted (KeyboardInterrupt: psycopg cancelled the wait): granted
                # or not, nothing may stay behind uncounted.
                self._unlock_quietly(session, mode)
                raise
            assert row is not None
            granted, token = row
            if not granted:
                return None
            if token is None and fenced:  # granted, but the fencing sequence is missing
                return self._token_after_making_the_sequence(session, mode)
            return int(token)

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return self._book.connect()
        except (DBAPIError, psycopg.Error, OSError) as exc:
            raise _unavailable(self.name, exc) from exc

    def _unlock_quietly(self, session: _Session, mode: Mode) -> None:
        """After a failed acquire call: unlock once in case it was granted (PostgreSQL
        answers false, with a warning, if it was not). If even that fails, the
        session ends: the server then frees whatever it held."""
        conn = session.conn
        if conn is None or session.broken:
            return
        try:
            conn.execute(_UNLOCK[mode], {"key": self.key})
        except BaseException as exc:
            session.end(f"could not undo a failed acquire: {exc!r}")
            if not isinstance(exc, Exception):
                raise

    def _token_after_making_the_sequence(self, session: _Session, mode: Mode) -> int:
        conn = session.conn
        assert conn is not None
        try:
            with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                conn.execute(self._create_sequence_sql())  # (made meanwhile by someone else)
            row = conn.execute(_NEXT_TOKEN, {"fence": self.fence_sequence}).fetchone()
        except psycopg.Error as exc:
            if _broken(conn):
                session.end(f"the database session ended: {exc}")
            else:
                self._unlock_quietly(session, mode)
            raise self._no_sequence(exc) from exc
        assert row is not None
        return int(row[0])

    def _create_sequence_sql(self) -> sql.Composed:
        # The name was checked against _SEQUENCE_NAME: safe to put in the statement.
        return sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(sql.SQL(self.fence_sequence))

    def _no_sequence(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(
            f"the fencing sequence {self.fence_sequence!r} of lock {self.name!r} is missing "
            f"and could not be created ({exc}); create it (CREATE SEQUENCE "
            f"{self.fence_sequence}) or pass fencing=False"
        )

    # -- releasing ---------------------------------------------------------------------

    def release(self, handle: PostgresLockHandle) -> None:
        """Release one hold; :class:`LockLostError` if its session had ended."""
        if handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        if handle.released:
            return
        session = handle.session
        if session.pid != os.getpid():
            raise LockNotHeldError(
                f"the {handle.mode} lock {self.name!r} is held by the process that forked "
                "this one; a child does not inherit its parent's locks",
                name=self.name,
                owner=handle.owner,
                mode=handle.mode,
            )
        handle.released = True
        with self._using(session):
            session.handles.discard(handle)
            if handle.lost or session.broken:
                raise handle._lost_at_release()
            if not session.holds.released(handle.key, handle.mode):
                return  # an outer hold of this mode remains
            conn = session.conn
            assert conn is not None
            try:
                row = conn.execute(_UNLOCK[handle.mode], {"key": handle.key}).fetchone()
            except psycopg.Error as exc:
                # Whatever went wrong, the session must not outlive a failed unlock
                # holding a lock nobody counts: end it (the server frees the rest).
                session.end(f"the database session ended: {exc}")
                if _broken(conn):
                    raise handle._lost_at_release() from exc
                raise _unavailable(self.name, exc) from exc
            if not (row and row[0]):
                session.end("the server did not hold the lock any more")
                raise handle._lost_at_release()

    @contextmanager
    def _using(self, session: _Session) -> Iterator[None]:
        book = session.book
        with book._mutex:
            session.users += 1
        session.use.acquire()
        try:
            yield
        finally:
            book.leave(session)

    # -- transaction-scoped locks ----------------------------------------------------------

    def write_in(
        self, transaction: Connection | Session, timeout: float | None = None
    ) -> TransactionLock:
        """Take the write lock in ``transaction`` (a SQLAlchemy ``Connection`` or
        ``Session``) until it commits or rolls back; :class:`LockTimeout` at the
        deadline leaves the transaction usable. A transaction holding only the read
        lock gets :class:`LockUpgradeError`."""
        return self._take_in(transaction, "write", timeout)

    def read_in(
        self, transaction: Connection | Session, timeout: float | None = None
    ) -> TransactionLock:
        """Take the read lock in ``transaction`` until it commits or rolls back."""
        return self._take_in(transaction, "read", timeout)

    def _take_in(
        self, transaction: Connection | Session, mode: Mode, timeout: float | None
    ) -> TransactionLock:
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        conn = _transaction_connection(transaction)
        params: dict[str, Any] = {"key": self.key, "fence": self.fence_sequence}
        params["classid"], params["objid"] = key_parts(self.key)
        fenced = self.fencing and mode == "write"
        token = _XACT_TOKEN if fenced else "0::bigint"
        try:
            # First one attempt that cannot fail (an error would abort the caller's
            # transaction); only if the lock is busy, a wait in a savepoint.
            granted, fence = conn.execute(text(_XACT_TRY[mode].format(token=token)), params).one()
            if granted is None:
                raise LockUpgradeError(name=self.name)
            if not granted:
                params["ms"] = lock_timeout_ms(start + limit - self._timer())
                fence = self._wait_in(conn, mode, params, token, start)
            if fence is None and fenced:  # granted, but the fencing sequence is missing
                fence = self._token_in_after_making_the_sequence(conn)
        except DBAPIError as exc:
            raise _unavailable(self.name, exc) from exc
        return TransactionLock(self.name, mode, int(fence))

    def _wait_in(
        self, conn: Connection, mode: Mode, params: dict[str, Any], token: str, start: float
    ) -> Any:
        """Wait in a savepoint, so that a timeout leaves the transaction usable."""
        conn.execute(text(f"SAVEPOINT {_SAVEPOINT}"))
        try:
            fence = conn.execute(text(_XACT_WAIT[mode].format(token=token)), params).scalar_one()
        except DBAPIError as exc:
            conn.execute(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
            conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
            if _sqlstate(exc) in ("55P03", "57014", "40P01"):  # lock_timeout, cancel, deadlock
                raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start) from exc
            raise
        # The lock passes from the savepoint to the enclosing transaction.
        conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
        return fence

    def _token_in_after_making_the_sequence(self, conn: Connection) -> int:
        # In a savepoint: a failure must not abort the caller's transaction.
        conn.execute(text(f"SAVEPOINT {_SAVEPOINT}"))
        try:
            conn.execute(text(f"CREATE SEQUENCE IF NOT EXISTS {self.fence_sequence}"))
        except DBAPIError as exc:
            conn.execute(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
            if _sqlstate(exc) not in ("23505", "42P07"):  # not "made meanwhile by someone"
                conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
                raise self._no_sequence(exc) from exc
        conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
        return int(
            conn.execute(text(f"SELECT {_XACT_TOKEN}"), {"fence": self.fence_sequence}).scalar_one()
        )

    def __repr__(self) -> str:
        return f"<PostgresRWLock {self.name!r} key={self.key} namespace={self.namespace!r}>"


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


def _sqlstate(exc: DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return state if isinstance(state, str) else None


def _transaction_connection(transaction: Connection | Session) -> Connection:
    """The SQLAlchemy connection of ``transaction``, checked to hold a transaction."""
    if isinstance(transaction, Session):
        conn = transaction.connection()
    elif isinstance(transaction, Connection):
        conn = transaction
    else:
        raise TypeError(
            "a transaction-scoped lock needs a sqlalchemy Connection or Session, "
            f"not {type(transaction).__name__}"
        )
    if conn.dialect.name != "postgresql":
        raise TypeError(f"a transaction-scoped lock needs PostgreSQL, not {conn.dialect.name}")
    dbapi = conn.connection.driver_connection
    if getattr(dbapi, "autocommit", False):
        raise ValueError(
            "a transaction-scoped lock needs a connection in a transaction; this one is in "
            "autocommit mode, where the lock would end with its own statement"
        )
    return conn
