"""The read-write lock on PostgreSQL advisory locks, on asyncio.

::

    engine = create_async_engine("postgresql+psycopg://...")
    lock = AsyncPostgresRWLock(engine, "menu:7")
    async with lock.write(timeout=5) as handle:
        await write_to_db(fencing_token=handle.token)

The same lock as :class:`~cacheguard.locks.postgres.rwlock.PostgresRWLock` (same keys,
statements, fencing sequence and bookkeeping), so sync and asyncio holders of one
name exclude each other. The differences:

Owners
    The default owner is the calling asyncio task (as for ``AsyncRedisRWLock``);
    each owner holding something has its own ``psycopg.AsyncConnection``.

Loss
    No thread: while a session holds locks and no statement runs on it, the loop
    watches its socket (``loop.add_reader``); a session the server ended marks its
    handles lost at once and calls ``on_lost`` on the loop.

Cancellation
    A task cancelled while it waits leaves nothing behind: psycopg cancels the
    wait in the server, and since the lock may have been granted just before,
    it is unlocked once more before the cancellation goes on (cancelled again
    meanwhile, the session is closed, which frees everything in it).

One event loop
    Sessions belong to the loop they were made on: a handle released from another
    loop raises :class:`~cacheguard.exceptions.WrongEventLoop`.

The decisions are :mod:`cacheguard.locks.postgres.core`'s, as for the sync lock;
this module answers their steps with awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.pool import Pool
from sqlalchemy.util import greenlet_spawn

from cacheguard.checks import Seconds
from cacheguard.exceptions import LockLostError, WrongEventLoop
from cacheguard.locks.async_shape import AsyncRWLockShape, LoopHandle
from cacheguard.locks.postgres.core import (
    DEFAULT_FENCE_SEQUENCE,
    MAX_IDLE,
    Connect,
    Enter,
    PostgresHandleState,
    PostgresLockBase,
    Run,
    RunIn,
    SessionState,
    Step,
    TransactionLock,
    acquire_flow,
    alive,
    broken,
    check_dialect,
    check_transaction,
    detached_connection,
    last_error,
    releasable,
    release_flow,
    session_settings,
    take_in_flow,
    try_flow,
)
from cacheguard.locks.protocol import Mode
from cacheguard.locks.redis.async_rwlock import task_owner

__all__ = [
    "AsyncPostgresLockHandle",
    "AsyncPostgresRWLock",
    "close_idle_async_connections",
]

log = logging.getLogger("cacheguard.lock")

AsyncLostCallback = Callable[["AsyncPostgresLockHandle"], object]
AsyncConn = psycopg.AsyncConnection[Any]
T = TypeVar("T")


class _AsyncSession(SessionState[AsyncConn, "AsyncPostgresLockHandle"]):
    """One owner's dedicated connection on one loop, and the locks it holds in it."""

    book: _AsyncBook

    def __init__(self, book: _AsyncBook, owner: str) -> None:
        super().__init__(book, owner)
        self.use = asyncio.Lock()  # one statement at a time on the connection
        self.reading_fd: int | None = None  # the socket the loop watches for us

    def end(self, why: str) -> None:
        if not self.broken:
            self.book.unwatch(self)  # before its connection goes
        super().end(why)


class _AsyncBook:
    """The dedicated sessions of one async engine on one event loop."""

    def __init__(self, engine: AsyncEngine, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # As for the sync lock: a pool of our own with the engine's settings, each
        # connection detached from it at once.
        self._pool: Pool = engine.sync_engine.pool.recreate()
        self._owners: dict[str, _AsyncSession] = {}
        self._idle: list[AsyncConn] = []
        self._background: set[asyncio.Task[Any]] = set()

    # sessions

    async def enter(self, owner: str, wait: float) -> _AsyncSession | None:
        """The owner's session with ``use`` held (``None`` if it stayed busy ``wait`` s)."""
        while True:
            session = self._owners.get(owner)
            if session is None:
                session = self._owners[owner] = _AsyncSession(self, owner)
            session.users += 1
            try:
                await asyncio.wait_for(session.use.acquire(), max(wait, 0.0))
            except asyncio.TimeoutError:
                self._unpin(session)
                return None
            except BaseException:
                self._unpin(session)
                raise
            if not session.broken:
                self.unwatch(session)  # psycopg reads the socket itself while we use it
                return session
            session.use.release()
            self._unpin(session)

    def leave(self, session: _AsyncSession) -> None:
        """Done with the session: park its connection if it holds nothing, watch it
        if it does; then release ``use``."""
        if not session.broken and session.conn is not None:
            if session.holds:
                self.watch(session)
            else:
                conn, session.conn = session.conn, None
                self._park(conn)
        session.use.release()
        self._unpin(session)

    def forget(self, session: _AsyncSession) -> None:
        if self._owners.get(session.owner) is session:
            del self._owners[session.owner]

    def _unpin(self, session: _AsyncSession) -> None:
        session.users -= 1
        if session.users == 0 and not session.holds:
            self.forget(session)

    # the watch: the loop reads the sockets of sessions that hold locks

    def watch(self, session: _AsyncSession) -> None:
        conn = session.conn
        if session.reading_fd is not None or conn is None or broken(conn):
            return
        session.reading_fd = conn.fileno()
        self._loop.add_reader(session.reading_fd, self._readable, session)

    def unwatch(self, session: _AsyncSession) -> None:
        if session.reading_fd is not None:
            self._loop.remove_reader(session.reading_fd)
            session.reading_fd = None

    def _readable(self, session: _AsyncSession) -> None:
        conn = session.conn
        if session.use.locked() or conn is None:
            self.unwatch(session)  # (its user watches it again when done)
        elif not alive(conn):
            session.end(f"the database session ended: {last_error(conn)}")

    # connections and tasks

    async def connect(self) -> AsyncConn:
        """A connection holding no locks: a parked one that still answers, or a new one."""
        while self._idle:
            conn = self._idle.pop()
            if alive(conn):
                return conn
            self.discard(conn)
        conn = await greenlet_spawn(
            detached_connection, self._pool, psycopg.AsyncConnection, "AsyncPostgresRWLock"
        )
        try:
            await conn.set_autocommit(True)
            await conn.execute(session_settings(conn.info.server_version))
        except BaseException:
            self.discard(conn)
            raise
        return conn

    def _park(self, conn: AsyncConn) -> None:
        if len(self._idle) < MAX_IDLE and not broken(conn):
            self._idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: AsyncConn) -> None:
        """Close ``conn`` in a task of its own."""
        self.spawn(_close(conn))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` as a task on the book's loop, referenced until it ends."""
        task = self._loop.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


async def _close(conn: AsyncConn) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable


_books: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[AsyncEngine, _AsyncBook]
] = weakref.WeakKeyDictionary()


def _book_for(engine: AsyncEngine) -> _AsyncBook:
    loop = asyncio.get_running_loop()
    books = _books.setdefault(loop, weakref.WeakKeyDictionary())
    book = books.get(engine)
    if book is None:
        book = books[engine] = _AsyncBook(engine, loop)
    return book


async def close_idle_async_connections(engine: AsyncEngine) -> None:
    """Close the running loop's parked lock connections of ``engine``."""
    books = _books.get(asyncio.get_running_loop())
    book = books.get(engine) if books is not None else None
    if book is not None:
        await book.close_idle()


class AsyncPostgresLockHandle(PostgresHandleState, LoopHandle):
    """One acquisition of an :class:`AsyncPostgresRWLock` (fields as
    :class:`~cacheguard.locks.postgres.rwlock.PostgresLockHandle`)."""

    __slots__ = ()

    lock: AsyncPostgresRWLock
    session: _AsyncSession

    def _loop(self) -> asyncio.AbstractEventLoop:
        return self.session.book._loop

    def _spawn_callback(self, awaitable: Awaitable[Any]) -> None:
        self.session.book.spawn(_awaited(awaitable))


class AsyncPostgresRWLock(PostgresLockBase, AsyncRWLockShape[AsyncPostgresLockHandle]):
    """:class:`~cacheguard.locks.postgres.rwlock.PostgresRWLock` on asyncio.

    ``engine``: a SQLAlchemy ``AsyncEngine`` on ``postgresql+psycopg://`` (psycopg's
    async driver). ``on_lost`` is called on the loop with a handle whose session
    ended (a coroutine function is run as a task). The other arguments are
    ``PostgresRWLock``'s.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        name: str,
        *,
        namespace: str = "cg",
        timeout: Seconds = 30.0,
        fencing: bool = True,
        fence_sequence: str = DEFAULT_FENCE_SEQUENCE,
        on_lost: AsyncLostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"AsyncPostgresRWLock needs a sqlalchemy AsyncEngine, not {type(engine).__name__}"
            )
        check_dialect("AsyncPostgresRWLock", engine.dialect)  # (an AsyncEngine's is async)
        super().__init__(name, namespace, timeout, fencing, fence_sequence, timer)
        self.engine = engine
        self._on_lost = on_lost

    async def _acquire(
        self, mode: Mode, timeout: Seconds | None, owner: str | None
    ) -> AsyncPostgresLockHandle:
        book, owner = _book_for(self.engine), owner or task_owner()
        flow = acquire_flow(
            self._settings, book, mode, owner, timeout, timer=self._timer, make=self._handle
        )
        return await _drive(flow)

    async def _try_once(self, mode: Mode, owner: str | None) -> AsyncPostgresLockHandle | None:
        book, owner = _book_for(self.engine), owner or task_owner()
        flow = try_flow(self._settings, book, mode, owner, timer=self._timer, make=self._handle)
        return await _drive(flow)

    def _handle(
        self, session: _AsyncSession, mode: Mode, owner: str, token: int
    ) -> AsyncPostgresLockHandle:
        return AsyncPostgresLockHandle(self, session, mode, owner, token, self._on_lost)

    async def release(self, handle: AsyncPostgresLockHandle) -> None:
        """Release one hold; :class:`LockLostError` if its session had ended."""
        if not releasable(self, handle):
            return
        session = handle.session
        book = session.book
        if book._loop is not asyncio.get_running_loop():
            raise WrongEventLoop(
                f"the {handle.mode} lock {self.name!r} was taken on another event loop; "
                "release it there"
            )
        handle.released = True
        session.users += 1
        try:
            await session.use.acquire()
        except BaseException:
            book._unpin(session)
            # Cancelled before it began: finish the release in the background.
            book.spawn(self._release_later(handle))
            raise
        await _release_in(handle)

    async def _release_later(self, handle: AsyncPostgresLockHandle) -> None:
        session = handle.session
        session.users += 1
        await session.use.acquire()
        try:
            await _release_in(handle)
        except LockLostError as lost:
            log.warning("%s (a cancelled release)", lost)

    async def write_in(
        self, transaction: AsyncConnection | AsyncSession, timeout: Seconds | None = None
    ) -> TransactionLock:
        """``PostgresRWLock.write_in`` for an ``AsyncConnection`` or ``AsyncSession``."""
        flow = take_in_flow(self._settings, transaction, "write", timeout, timer=self._timer)
        return await _drive(flow)

    async def read_in(
        self, transaction: AsyncConnection | AsyncSession, timeout: Seconds | None = None
    ) -> TransactionLock:
        """``PostgresRWLock.read_in`` for an ``AsyncConnection`` or ``AsyncSession``."""
        flow = take_in_flow(self._settings, transaction, "read", timeout, timer=self._timer)
        return await _drive(flow)


async def _release_in(handle: AsyncPostgresLockHandle) -> None:
    """The release, with the session's ``use`` held (and let go after)."""
    session = handle.session
    session.book.unwatch(session)
    try:
        await _drive(release_flow(handle))
    finally:
        session.leave()


# -- the driver ------------------------------------------------------------------------------------


async def _drive(flow: Generator[Step, Any, T]) -> T:
    """Answer the flow's steps with awaits. Whatever a step raises, a cancellation
    too, is thrown into the flow: it decides what that means."""
    try:
        step = next(flow)
        while True:
            try:
                reply = await _answer(step)
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        flow.close()


async def _answer(step: Step) -> Any:
    if isinstance(step, Run):
        cursor = await step.conn.execute(step.query, step.params)
        return await cursor.fetchone() if step.rows else None
    if isinstance(step, RunIn):
        result = await step.conn.execute(text(step.query), step.params)
        return result.one() if step.rows else None
    if isinstance(step, Enter):
        return await step.book.enter(step.owner, step.wait)
    if isinstance(step, Connect):
        return await step.book.connect()
    return await _transaction_connection(step.transaction)


async def _transaction_connection(transaction: object) -> AsyncConnection:
    if isinstance(transaction, AsyncSession):
        conn = await transaction.connection()
    elif isinstance(transaction, AsyncConnection):
        conn = transaction
    else:
        raise TypeError(
            "a transaction-scoped lock needs a sqlalchemy AsyncConnection or AsyncSession, "
            f"not {type(transaction).__name__}"
        )
    raw = await conn.get_raw_connection()
    check_transaction(conn.dialect.name, raw.driver_connection)
    return conn
