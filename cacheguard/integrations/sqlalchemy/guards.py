"""The guard as the session hooks see it: the same calls for both guards.

The hooks of :mod:`cacheguard.integrations.sqlalchemy.tracker` are SQLAlchemy session events,
plain functions. With a :class:`~cacheguard.CacheGuard` they call it directly
(locks held by the calling thread). With an
:class:`~cacheguard.aio.AsyncCacheGuard` they run in the greenlet in which
``AsyncSession`` runs its sync session, so each coroutine of the guard is
awaited in place by the calling task (locks held by that task); from outside
such a greenlet (a dropped session, released by the orphan thread) the
coroutine is sent to the guard's event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from cacheguard._identity import enter_holder, leave_holder
from cacheguard.cache.async_guard import AsyncCacheGuard
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.settings import GuardSettings
from cacheguard.locks.async_local import current_task

__all__ = ["GuardIO", "guard_io", "session_class_of"]

_FROM_ANOTHER_THREAD_TIMEOUT = 30.0  # s: a release sent to the guard's loop


class GuardIO(Protocol):
    settings: GuardSettings

    def enter_holder(self) -> Any: ...
    def leave_holder(self, holder: Any) -> None: ...
    def watermark(self) -> int: ...
    def invalidate(self, *names: str) -> None: ...
    def invalidate_prefix(self, prefix: str) -> int: ...
    def rwlock(self, name: str) -> Any: ...  # the write path's lock of name
    def acquire_write(self, lock: Any, timeout: float | None, holder: Any) -> Any: ...
    def release_write(self, lock: Any, holder: Any) -> None: ...
    # The key's local write tier alone (keys whose invalidation went to the outbox):
    # this process's other callers wait, and the holder's own reads stay private.
    def hold_local(self, name: str, timeout: float | None, holder: Any) -> Any: ...
    def release_local(self, lock: Any, holder: Any) -> None: ...


class _Blocking:
    """A sync guard, called directly; holds belong to a holder per session (the
    context's, made ambient: reads in the transaction see the session's writes)."""

    def __init__(self, guard: CacheGuard) -> None:
        self.guard = guard
        self.settings = guard.settings

    def enter_holder(self) -> Any:
        return enter_holder()

    def leave_holder(self, holder: Any) -> None:
        leave_holder(holder)

    def watermark(self) -> int:
        return self.guard.watermark()

    def invalidate(self, *names: str) -> None:
        self.guard.invalidate(*names)

    def invalidate_prefix(self, prefix: str) -> int:
        return self.guard.invalidate_prefix(prefix)

    def rwlock(self, name: str) -> Any:
        return self.guard.write_lock(name)

    def acquire_write(self, lock: Any, timeout: float | None, holder: Any) -> Any:
        return lock.acquire_write(timeout, holder=holder)

    def release_write(self, lock: Any, holder: Any) -> None:
        lock.release_write(holder=holder)

    def hold_local(self, name: str, timeout: float | None, holder: Any) -> Any:
        lock = self.guard.rwlock(name)  # the two-tier lock the read path consults
        lock.local.acquire_write(timeout, holder=holder)
        return lock

    def release_local(self, lock: Any, holder: Any) -> None:
        lock.local.release_write(holder=holder)


class _Awaiting:
    """An asyncio guard, awaited in the session's greenlet; holds belong to tasks."""

    def __init__(self, guard: AsyncCacheGuard) -> None:
        self.guard = guard
        self.settings = guard.settings

    def _run(self, call: Coroutine[Any, Any, Any]) -> Any:
        if in_greenlet():
            return await_only(call)
        loop = self.guard._binding.loop
        if loop is None or loop.is_closed():
            call.close()
            raise RuntimeError(
                "an AsyncCacheGuard's session hooks ran outside AsyncSession and its "
                "event loop is gone: nothing can be sent to Redis"
            )
        future = asyncio.run_coroutine_threadsafe(call, loop)
        return future.result(_FROM_ANOTHER_THREAD_TIMEOUT)

    def enter_holder(self) -> Any:
        return current_task()

    def leave_holder(self, holder: Any) -> None:
        pass  # a task's holds end with the task's releases

    def watermark(self) -> int:
        return int(self._run(self.guard.watermark()))

    def invalidate(self, *names: str) -> None:
        self._run(self.guard.invalidate(*names))

    def invalidate_prefix(self, prefix: str) -> int:
        return int(self._run(self.guard.invalidate_prefix(prefix)))

    def rwlock(self, name: str) -> Any:
        return self.guard.write_lock(name)

    def acquire_write(self, lock: Any, timeout: float | None, holder: Any) -> Any:
        return self._run(lock.acquire_write(timeout))  # for the calling task, the holder

    def release_write(self, lock: Any, holder: Any) -> None:
        self._run(lock.release_write(holder=holder))

    def hold_local(self, name: str, timeout: float | None, holder: Any) -> Any:
        lock = self.guard.rwlock(name)
        self._run(lock.local.acquire_write(timeout))  # for the calling task, the holder
        return lock

    def release_local(self, lock: Any, holder: Any) -> None:
        loop = self.guard._binding.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            lock.local.release_write(holder=holder)
        else:  # a dropped session's release, from another thread: on the loop, so it wakes
            loop.call_soon_threadsafe(functools.partial(lock.local.release_write, holder=holder))


def guard_io(guard: Any) -> GuardIO:
    if isinstance(guard, CacheGuard):
        return _Blocking(guard)
    if isinstance(guard, AsyncCacheGuard):
        return _Awaiting(guard)
    raise TypeError(f"guard must be a CacheGuard or an AsyncCacheGuard, not {type(guard).__name__}")


def session_class_of(guard: Any, factory: Any) -> Any:
    """What the session events are listened on for ``factory``.

    A sync guard takes a ``sessionmaker``, a ``Session`` subclass or a
    ``scoped_session`` as it is. An asyncio guard takes an ``async_sessionmaker``:
    its sync sessions' class, given one of its own when it has none (listening on
    ``Session`` itself would track every session of the program); or an
    ``AsyncSession`` subclass whose ``sync_session_class`` is its own."""
    is_async = isinstance(factory, async_sessionmaker) or (
        isinstance(factory, type) and issubclass(factory, AsyncSession)
    )
    if isinstance(guard, CacheGuard):
        if is_async:
            raise TypeError(
                "an async_sessionmaker needs an AsyncCacheGuard (cacheguard.aio); "
                "a CacheGuard tracks sync sessions"
            )
        return factory
    if not is_async:
        raise TypeError(
            "an AsyncCacheGuard tracks AsyncSession: pass an async_sessionmaker, "
            f"not {type(factory).__name__}"
        )
    if isinstance(factory, async_sessionmaker):
        sync_class = factory.kw.get("sync_session_class") or factory.class_.sync_session_class
        if sync_class is Session:
            sync_class = type("TrackedSession", (Session,), {})
            factory.kw["sync_session_class"] = sync_class
        return sync_class
    if factory.sync_session_class is Session:
        raise TypeError(
            f"{factory.__name__}.sync_session_class is Session itself; give it a Session "
            "subclass of its own, or pass an async_sessionmaker"
        )
    return factory.sync_session_class
