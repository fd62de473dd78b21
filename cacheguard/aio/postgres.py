"""The read-write lock on PostgreSQL advisory locks, on asyncio.

::

    engine = create_async_engine("postgresql+psycopg://...")
    lock = AsyncPostgresRWLock(engine, "menu:7")
    async with lock.write(timeout=5) as handle:
        await write_to_db(fencing_token=handle.token)

The same lock as :class:`~cacheguard.locks.postgres.PostgresRWLock` (same keys,
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
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.pool import Pool
from sqlalchemy.util import greenlet_spawn

from cacheguard.aio.rwlock import task_owner
from cacheguard.checks import check_positive
from cacheguard.exceptions import (
    BackendUnavailable,
    LockLostError,
    LockNotHeldError,
    LockTimeout,
    LockUpgradeError,
    WrongEventLoop,
)
from cacheguard.locks.postgres import (
    _NEXT_TOKEN,
    _SAVEPOINT,
    _UNLOCK,
    _WAIT_ENDED,
    _XACT_TOKEN,
    _XACT_TRY,
    _XACT_WAIT,
    DEFAULT_FENCE_SEQUENCE,
    MAX_IDLE,
    Holds,
    Plan,
    TransactionLock,
    _acquire_sql,
    _alive,
    _broken,
    _last_error,
    _session_settings,
    _sqlstate,
    _unavailable,
    key_parts,
    lock_settings,
    lock_timeout_ms,
)
from cacheguard.locks.redis_rwlock import HandleState

if TYPE_CHECKING:
    from cacheguard.locks.protocol import Mode

__all__ = [
    "AsyncPostgresLockHandle",
    "AsyncPostgresRWLock",
    "close_idle_async_connections",
]

log = logging.getLogger("cacheguard.lock")

AsyncLostCallback = Callable[["AsyncPostgresLockHandle"], object]
AsyncConn = psycopg.AsyncConnection[Any]


class _AsyncSession:
    """One owner's dedicated connection on one loop, and the locks it holds in it."""

    def __init__(self, book: _AsyncBook, owner: str) -> None:
        self.book = book
        self.owner = owner
        self.pid = os.getpid()
        self.conn: AsyncConn | None = None
        self.holds = Holds()
        self.handles: set[AsyncPostgresLockHandle] = set()
        self.use = asyncio.Lock()  # one statement at a time on the connection
        self.users = 0  # tasks between enter and leave
        self.broken = False
        self.reading_fd: int | None = None  # the socket the loop watches for us

    def end(self, why: str) -> None:
        """The session ended: every hold in it is lost (the server freed them)."""
        if self.broken:
            return
        self.broken = True
        self.book.unwatch(self)
        handles, self.handles = self.handles, set()
        lost = [handle for handle in handles if not (handle.lost or handle.released)]
        for handle in lost:
            handle.lost, handle.lost_reason = True, why
        for handle in lost:
            handle._announce_lost()
        conn, self.conn = self.conn, None
        if conn is not None:
            self.book.close_later(conn)
        self.book.forget(self)


class _AsyncBook:
    """The dedicated sessions of one async engine on one event loop."""

    def __init__(self, engine: AsyncEngine, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # As for the sync lock: a pool of our own with the engine's settings, each
        # connection detached from it at once.
        self._pool: Pool = engine.sync_engine.pool.recreate()
        self._owners: dict[str, _AsyncSession] = {}
        self._idle: list[AsyncConn] = []
        self._closing: set[asyncio.Task[None]] = set()

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
        if session.reading_fd is not None or conn is None or _broken(conn):
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
        elif not _alive(conn):
            session.end(f"the database session ended: {_last_error(conn)}")

    # connections

    async def connect(self) -> AsyncConn:
        """A connection holding no locks: a parked one that still answers, or a new one."""
        while self._idle:
            conn = self._idle.pop()
            if _alive(conn):
                return conn
            self.close_later(conn)
        conn = await greenlet_spawn(_detached_connection, self._pool)
        try:
            await conn.set_autocommit(True)
            await conn.execute(_session_settings(conn.info.server_version))
        except BaseException:
            self.close_later(conn)
            raise
        return conn

    def _park(self, conn: AsyncConn) -> None:
        if len(self._idle) < MAX_IDLE and not _broken(conn):
            self._idle.append(conn)
        else:
            self.close_later(conn)

    def close_later(self, conn: AsyncConn) -> None:
        task = self._loop.create_task(_close(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _detached_connection(pool: Pool) -> AsyncConn:
    """(Run in SQLAlchemy's greenlet) a connection of ``pool``, detached from it."""
    fairy = pool.connect()
    conn = fairy.driver_connection
    fairy.detach()
    if not isinstance(conn, psycopg.AsyncConnection):
        fairy.close()
        raise TypeError(
            "AsyncPostgresRWLock needs the psycopg driver (postgresql+psycopg://, async)"
        )
    return conn


async def _close(conn: AsyncConn) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


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


class AsyncPostgresLockHandle(HandleState):
    """One acquisition of an :class:`AsyncPostgresRWLock` (fields as
    :class:`~cacheguard.locks.postgres.PostgresLockHandle`)."""

    __slots__ = ("key", "lock", "session")

    def __init__(
        self,
        lock: AsyncPostgresRWLock,
        session: _AsyncSession,
        mode: Mode,
        owner: str,
        token: int,
        on_lost: AsyncLostCallback | None,
    ) -> None:
        super().__init__(mode, owner, token, on_lost)
        self.lock = lock
        self.session = session
        self.key = lock.key

    @property
    def lock_name(self) -> str:
        return self.lock.name

    async def release(self) -> None:
        await self.lock.release(self)

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
        self.session.book._loop.call_soon(self._run_on_lost)

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            result = self._on_lost(self)
            if inspect.isawaitable(result):  # an async callback: run it as a task
                task = self.session.book._loop.create_task(_awaited(result))
                self.session.book._closing.add(task)  # (a reference until it is done)
                task.add_done_callback(self.session.book._closing.discard)
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
            f"<AsyncPostgresLockHandle {self.mode} {self.lock.name!r} token={self.token} "
            f"owner={self.owner} {state}>"
        )


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable


class AsyncPostgresRWLock:
    """:class:`~cacheguard.locks.postgres.PostgresRWLock` on asyncio.

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
        timeout: float = 30.0,
        fencing: bool = True,
        fence_sequence: str = DEFAULT_FENCE_SEQUENCE,
        on_lost: AsyncLostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"AsyncPostgresRWLock needs a sqlalchemy AsyncEngine, not {type(engine).__name__}"
            )
        dialect = engine.dialect
        if dialect.name != "postgresql" or dialect.driver != "psycopg" or not dialect.is_async:
            raise TypeError(
                "AsyncPostgresRWLock needs a PostgreSQL engine through psycopg 3 "
                f"(postgresql+psycopg://...), not {dialect.name}+{dialect.driver}"
            )
        settings = lock_settings(name, namespace, timeout, fencing, fence_sequence)
        self.engine = engine
        self.name, self.namespace, self.key = settings.name, settings.namespace, settings.key
        self.timeout = settings.timeout
        self.fencing, self.fence_sequence = settings.fencing, settings.fence_sequence
        self._on_lost = on_lost
        self._timer = timer

    # -- acquiring ---------------------------------------------------------------------

    async def acquire_read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncPostgresLockHandle:
        """Wait until the read lock is ours (or :class:`LockTimeout`)."""
        handle = await self._acquire("read", timeout, owner, wait=True)
        assert handle is not None
        return handle

    async def acquire_write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncPostgresLockHandle:
        """Wait until the write lock is ours; a read holder gets :class:`LockUpgradeError`."""
        handle = await self._acquire("write", timeout, owner, wait=True)
        assert handle is not None
        return handle

    async def try_acquire_read(self, *, owner: str | None = None) -> AsyncPostgresLockHandle | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return await self._acquire("read", None, owner, wait=False)

    async def try_acquire_write(
        self, *, owner: str | None = None
    ) -> AsyncPostgresLockHandle | None:
        return await self._acquire("write", None, owner, wait=False)

    @asynccontextmanager
    async def read(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncIterator[AsyncPostgresLockHandle]:
        handle = await self.acquire_read(timeout, owner=owner)
        async with _released_on_exit(handle):
            yield handle

    @asynccontextmanager
    async def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncIterator[AsyncPostgresLockHandle]:
        handle = await self.acquire_write(timeout, owner=owner)
        async with _released_on_exit(handle):
            yield handle

    async def _acquire(
        self, mode: Mode, timeout: float | None, owner: str | None, *, wait: bool
    ) -> AsyncPostgresLockHandle | None:
        owner = owner or task_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        book = _book_for(self.engine)
        for _ in range(2):  # a second time only if the owner's session had ended
            session = await book.enter(owner, start + limit - self._timer())
            if session is None:  # another task of this owner kept its session busy
                raise LockTimeout(
                    name=self.name, mode=mode, waited=self._timer() - start, owner=owner
                )
            try:
                plan = session.holds.plan(self.key, mode)
                if plan is not Plan.CALL and session.conn is not None and not _alive(session.conn):
                    session.end("the database session ended")
                    continue
                if plan is Plan.UPGRADE:
                    raise LockUpgradeError(name=self.name, owner=owner)
                if plan is Plan.REENTER:
                    token = session.holds.granted(self.key, mode)
                else:
                    fence = await self._lock_call(session, mode, owner, start, start + limit, wait)
                    if fence is None:
                        return None
                    token = session.holds.granted(self.key, mode, fence)
                handle = AsyncPostgresLockHandle(self, session, mode, owner, token, self._on_lost)
                session.handles.add(handle)
                return handle
            finally:
                book.leave(session)
        raise AssertionError("unreachable: a fresh session holds nothing")

    async def _lock_call(
        self,
        session: _AsyncSession,
        mode: Mode,
        owner: str,
        start: float,
        deadline: float,
        wait: bool,
    ) -> int | None:
        fenced = self.fencing and mode == "write"
        params: dict[str, Any] = {"key": self.key, "fence": self.fence_sequence}
        query = _acquire_sql(mode, wait=wait, fenced=fenced)
        retried = False
        while True:
            fresh = session.conn is None
            if fresh:
                session.conn = await self._connect(session)
            conn = session.conn
            assert conn is not None
            params["ms"] = lock_timeout_ms(deadline - self._timer())
            try:
                row = await (await conn.execute(query, params)).fetchone()
            except psycopg.Error as exc:
                if not _broken(conn):
                    # Granted before the statement failed? Let it go again.
                    await self._unlock_quietly(session, mode)
                    if isinstance(exc, (*_WAIT_ENDED, psycopg.errors.DeadlockDetected)):
                        raise LockTimeout(
                            name=self.name, mode=mode, waited=self._timer() - start, owner=owner
                        ) from exc
                    raise _unavailable(self.name, exc) from exc
                if fresh and not session.holds and not retried:
                    retried = True  # a parked connection the server had closed
                    session.conn = None
                    session.book.close_later(conn)
                    continue
                session.end(f"the database session ended: {exc}")
                raise _unavailable(self.name, exc) from exc
            except BaseException:
                # Cancelled (psycopg cancelled the wait in the server): granted or
                # not, nothing may stay behind uncounted.
                await self._unlock_quietly(session, mode)
                raise
            assert row is not None
            granted, token = row
            if not granted:
                return None
            if token is None and fenced:  # granted, but the fencing sequence is missing
                return await self._token_after_making_the_sequence(session, mode)
            return int(token)

    async def _connect(self, session: _AsyncSession) -> AsyncConn:
        try:
            return await session.book.connect()
        except (DBAPIError, psycopg.Error, OSError) as exc:
            raise _unavailable(self.name, exc) from exc

    async def _unlock_quietly(self, session: _AsyncSession, mode: Mode) -> None:
        """After a failed or cancelled acquire call: unlock once in case it was granted.
        If even that fails (or is cancelled), the session ends: the server then frees
        whatever it held."""
        conn = session.conn
        if conn is None or session.broken:
            return
        try:
            await conn.execute(_UNLOCK[mode], {"key": self.key})
        except BaseException as exc:
            session.end(f"could not undo a failed acquire: {exc!r}")
            if not isinstance(exc, Exception):
                raise

    async def _token_after_making_the_sequence(self, session: _AsyncSession, mode: Mode) -> int:
        conn = session.conn
        assert conn is not None
        try:
            with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                await conn.execute(
                    psycopg.sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(
                        psycopg.sql.SQL(self.fence_sequence)  # checked by lock_settings
                    )
                )
            row = await (await conn.execute(_NEXT_TOKEN, {"fence": self.fence_sequence})).fetchone()
        except psycopg.Error as exc:
            if _broken(conn):
                session.end(f"the database session ended: {exc}")
            else:
                await self._unlock_quietly(session, mode)
            raise BackendUnavailable(
                f"the fencing sequence {self.fence_sequence!r} of lock {self.name!r} is "
                f"missing and could not be created ({exc}); create it or pass fencing=False"
            ) from exc
        assert row is not None
        return int(row[0])

    # -- releasing ---------------------------------------------------------------------

    async def release(self, handle: AsyncPostgresLockHandle) -> None:
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
            task = book._loop.create_task(self._release_later(handle))
            book._closing.add(task)
            task.add_done_callback(book._closing.discard)
            raise
        book.unwatch(session)
        try:
            await self._release_in(session, handle)
        finally:
            book.leave(session)

    async def _release_later(self, handle: AsyncPostgresLockHandle) -> None:
        session = handle.session
        session.users += 1
        await session.use.acquire()
        session.book.unwatch(session)
        try:
            await self._release_in(session, handle)
        except LockLostError as lost:
            log.warning("%s (a cancelled release)", lost)
        finally:
            session.book.leave(session)

    async def _release_in(self, session: _AsyncSession, handle: AsyncPostgresLockHandle) -> None:
        session.handles.discard(handle)
        if handle.lost or session.broken:
            raise handle._lost_at_release()
        if not session.holds.released(handle.key, handle.mode):
            return  # an outer hold of this mode remains
        conn = session.conn
        assert conn is not None
        try:
            row = await (await conn.execute(_UNLOCK[handle.mode], {"key": handle.key})).fetchone()
        except BaseException as exc:
            # The session must not outlive a failed unlock holding a lock nobody
            # counts: end it (the server frees the rest).
            session.end(f"the database session ended: {exc!r}")
            if isinstance(exc, psycopg.Error) and _broken(conn):
                raise handle._lost_at_release() from exc
            if isinstance(exc, psycopg.Error):
                raise _unavailable(self.name, exc) from exc
            raise
        if not (row and row[0]):
            session.end("the server did not hold the lock any more")
            raise handle._lost_at_release()

    # -- transaction-scoped locks ----------------------------------------------------------

    async def write_in(
        self, transaction: AsyncConnection | AsyncSession, timeout: float | None = None
    ) -> TransactionLock:
        """``PostgresRWLock.write_in`` for an ``AsyncConnection`` or ``AsyncSession``."""
        return await self._take_in(transaction, "write", timeout)

    async def read_in(
        self, transaction: AsyncConnection | AsyncSession, timeout: float | None = None
    ) -> TransactionLock:
        """``PostgresRWLock.read_in`` for an ``AsyncConnection`` or ``AsyncSession``."""
        return await self._take_in(transaction, "read", timeout)

    async def _take_in(
        self, transaction: AsyncConnection | AsyncSession, mode: Mode, timeout: float | None
    ) -> TransactionLock:
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        conn = await _transaction_connection(transaction)
        params: dict[str, Any] = {"key": self.key, "fence": self.fence_sequence}
        params["classid"], params["objid"] = key_parts(self.key)
        fenced = self.fencing and mode == "write"
        token = _XACT_TOKEN if fenced else "0::bigint"
        try:
            result = await conn.execute(text(_XACT_TRY[mode].format(token=token)), params)
            granted, fence = result.one()
            if granted is None:
                raise LockUpgradeError(name=self.name)
            if not granted:
                params["ms"] = lock_timeout_ms(start + limit - self._timer())
                fence = await self._wait_in(conn, mode, params, token, start)
            if fence is None and fenced:  # granted, but the fencing sequence is missing
                fence = await self._token_in_after_making_the_sequence(conn)
        except DBAPIError as exc:
            raise _unavailable(self.name, exc) from exc
        return TransactionLock(self.name, mode, int(fence))

    async def _wait_in(
        self, conn: AsyncConnection, mode: Mode, params: dict[str, Any], token: str, start: float
    ) -> Any:
        """Wait in a savepoint, so that a timeout leaves the transaction usable."""
        await conn.execute(text(f"SAVEPOINT {_SAVEPOINT}"))
        try:
            result = await conn.execute(text(_XACT_WAIT[mode].format(token=token)), params)
            fence = result.scalar_one()
        except DBAPIError as exc:
            await conn.execute(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
            await conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
            if _sqlstate(exc) in ("55P03", "57014", "40P01"):  # lock_timeout, cancel, deadlock
                raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start) from exc
            raise
        await conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
        return fence

    async def _token_in_after_making_the_sequence(self, conn: AsyncConnection) -> int:
        await conn.execute(text(f"SAVEPOINT {_SAVEPOINT}"))
        try:
            await conn.execute(text(f"CREATE SEQUENCE IF NOT EXISTS {self.fence_sequence}"))
        except DBAPIError as exc:
            await conn.execute(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
            if _sqlstate(exc) not in ("23505", "42P07"):  # not "made meanwhile by someone"
                await conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
                raise BackendUnavailable(
                    f"the fencing sequence {self.fence_sequence!r} of lock {self.name!r} is "
                    f"missing and could not be created ({exc})"
                ) from exc
        await conn.execute(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
        result = await conn.execute(text(f"SELECT {_XACT_TOKEN}"), {"fence": self.fence_sequence})
        return int(result.scalar_one())

    def __repr__(self) -> str:
        return f"<AsyncPostgresRWLock {self.name!r} key={self.key} namespace={self.namespace!r}>"


async def _transaction_connection(transaction: AsyncConnection | AsyncSession) -> AsyncConnection:
    if isinstance(transaction, AsyncSession):
        conn = await transaction.connection()
    elif isinstance(transaction, AsyncConnection):
        conn = transaction
    else:
        raise TypeError(
            "a transaction-scoped lock needs a sqlalchemy AsyncConnection or AsyncSession, "
            f"not {type(transaction).__name__}"
        )
    if conn.dialect.name != "postgresql":
        raise TypeError(f"a transaction-scoped lock needs PostgreSQL, not {conn.dialect.name}")
    raw = await conn.get_raw_connection()
    if getattr(raw.driver_connection, "autocommit", False):
        raise ValueError(
            "a transaction-scoped lock needs a connection in a transaction; this one is in "
            "autocommit mode, where the lock would end with its own statement"
        )
    return conn


@asynccontextmanager
async def _released_on_exit(handle: AsyncPostgresLockHandle) -> AsyncIterator[None]:
    """Release on exit; a lost lock raises unless the body already raised."""
    try:
        yield
    except BaseException:
        try:
            await handle.release()
        except LockLostError as lost:
            log.warning("%s (while the body raised)", lost)
        raise
    await handle.release()
