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

The decisions (the plan for a key, the statements, what an error reply means)
are in :mod:`cacheguard.locks.postgres.core`, shared with the asyncio lock; this
module is the blocking driver: sessions, their watch, and the answers to the
flows' steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool, QueuePool

from cacheguard._identity import on_fork_in_child, thread_owner
from cacheguard.checks import Seconds
from cacheguard.locks.postgres.core import (
    DEFAULT_FENCE_SEQUENCE,
    KEEPALIVE_WITHIN,
    MAX_IDLE,
    Connect,
    Enter,
    LockSettings,
    PostgresHandleState,
    PostgresLockBase,
    Run,
    RunIn,
    SessionState,
    Step,
    TransactionLock,
    acquire_flow,
    advisory_key,
    alive,
    broken,
    check_dialect,
    check_transaction,
    detached_connection,
    key_parts,
    last_error,
    lock_settings,
    lock_timeout_ms,
    releasable,
    release_flow,
    session_settings,
    take_in_flow,
    try_flow,
)
from cacheguard.locks.protocol import Mode
from cacheguard.locks.shape import RWLockShape, ThreadedHandle

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

LostCallback = Callable[["PostgresLockHandle"], None]
T = TypeVar("T")


# -- sessions --------------------------------------------------------------------------------------


class _Session(SessionState[psycopg.Connection[Any], "PostgresLockHandle"]):
    """One owner's dedicated connection and the locks it holds in it (``users`` is
    guarded by the book's mutex)."""

    book: _Book

    def __init__(self, book: _Book, owner: str) -> None:
        super().__init__(book, owner)
        self.use = threading.Lock()  # one statement at a time on the connection
        self.watched = False  # handed to the SessionWatch (changed under ``use``)
        self.rearm = False  # the watch dropped our socket while we used it
        self.flags = threading.Lock()  # guards ``rearm``


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
            if alive(conn):
                return conn
            self.discard(conn)
        conn = detached_connection(self._pool, psycopg.Connection, "PostgresRWLock")
        conn.autocommit = True  # no transaction stays open while a lock is held
        try:
            conn.execute(session_settings(conn.info.server_version))
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def discard(conn: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(Exception):
            conn.close()

    def _park(self, conn: psycopg.Connection[Any]) -> None:
        with self._mutex:
            if len(self._idle) < MAX_IDLE and not broken(conn):
                self._idle.append(conn)
                return
        self.discard(conn)

    def close_idle(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
        for conn in idle:
            self.discard(conn)


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
        if session in watched or session.broken or broken(conn):
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
            elif not alive(conn):
                self._unregister(selector, watched, session)
                session.end(f"the database session ended: {last_error(conn)}")
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


class PostgresLockHandle(PostgresHandleState, ThreadedHandle):
    """One acquisition of a :class:`PostgresRWLock`.

    ``token``: for write holds the fencing token (``fencing=True``), strictly
    greater than that of every earlier write hold; 0 for reads and without
    fencing. ``lost`` turns true when the session holding the lock ended.
    """

    __slots__ = ()

    lock: PostgresRWLock
    session: _Session


# -- the lock --------------------------------------------------------------------------------------


class PostgresRWLock(PostgresLockBase, RWLockShape[PostgresLockHandle]):
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
        timeout: Seconds = 30.0,
        fencing: bool = True,
        fence_sequence: str = DEFAULT_FENCE_SEQUENCE,
        on_lost: LostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(
                f"PostgresRWLock needs a sqlalchemy Engine, not {type(engine).__name__} "
                "(for an AsyncEngine use cacheguard.locks.postgres.AsyncPostgresRWLock)"
            )
        check_dialect("PostgresRWLock", engine.dialect)
        super().__init__(name, namespace, timeout, fencing, fence_sequence, timer)
        self.engine = engine
        self._on_lost = on_lost
        _book_for(engine)  # checks the pool class now rather than at first use

    @property
    def _book(self) -> _Book:
        # Looked up each time: a forked child gets a book (and connections) of its own.
        return _book_for(self.engine)

    def _acquire(
        self, mode: Mode, timeout: Seconds | None, owner: str | None
    ) -> PostgresLockHandle:
        owner = owner or thread_owner()
        flow = acquire_flow(
            self._settings, self._book, mode, owner, timeout, timer=self._timer, make=self._handle
        )
        return _drive(flow)

    def _try_once(self, mode: Mode, owner: str | None) -> PostgresLockHandle | None:
        owner = owner or thread_owner()
        flow = try_flow(
            self._settings, self._book, mode, owner, timer=self._timer, make=self._handle
        )
        return _drive(flow)

    def _handle(self, session: _Session, mode: Mode, owner: str, token: int) -> PostgresLockHandle:
        return PostgresLockHandle(self, session, mode, owner, token, self._on_lost)

    def release(self, handle: PostgresLockHandle) -> None:
        """Release one hold; :class:`LockLostError` if its session had ended."""
        if not releasable(self, handle):
            return
        handle.released = True
        session = handle.session
        with session.book._mutex:
            session.users += 1
        session.use.acquire()
        try:
            _drive(release_flow(handle))
        finally:
            session.leave()

    def write_in(
        self, transaction: Connection | Session, timeout: Seconds | None = None
    ) -> TransactionLock:
        """Take the write lock in ``transaction`` (a SQLAlchemy ``Connection`` or
        ``Session``) until it commits or rolls back; :class:`LockTimeout` at the
        deadline leaves the transaction usable. A transaction holding only the read
        lock gets :class:`LockUpgradeError`."""
        return _drive(
            take_in_flow(self._settings, transaction, "write", timeout, timer=self._timer)
        )

    def read_in(
        self, transaction: Connection | Session, timeout: Seconds | None = None
    ) -> TransactionLock:
        """Take the read lock in ``transaction`` until it commits or rolls back."""
        return _drive(take_in_flow(self._settings, transaction, "read", timeout, timer=self._timer))


# -- the driver ------------------------------------------------------------------------------------


def _drive(flow: Generator[Step, Any, T]) -> T:
    """Answer the flow's steps with blocking I/O. Whatever a step raises, an
    interrupt too, is thrown into the flow: it decides what that means."""
    try:
        step = next(flow)
        while True:
            try:
                reply = _answer(step)
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        flow.close()


def _answer(step: Step) -> Any:
    if isinstance(step, Run):
        cursor = step.conn.execute(step.query, step.params)
        return cursor.fetchone() if step.rows else None
    if isinstance(step, RunIn):
        result = step.conn.execute(text(step.query), step.params)
        return result.one() if step.rows else None
    if isinstance(step, Enter):
        return step.book.enter(step.owner, step.wait)
    if isinstance(step, Connect):
        return step.book.connect()
    return _transaction_connection(step.transaction)


def _transaction_connection(transaction: object) -> Connection:
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
    check_transaction(conn.dialect.name, conn.connection.driver_connection)
    return conn
