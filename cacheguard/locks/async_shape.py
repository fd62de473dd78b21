"""The outside of every asyncio lock store, written once (the sync side is
:mod:`cacheguard.locks.shape`)::

    handle = await lock.acquire_write(timeout=5)
    handle = await lock.try_acquire_read()
    async with lock.write(timeout=5) as handle: ...

:class:`AsyncRWLockShape` builds these from a store's ``_acquire`` and
``_try_once``; :class:`LoopHandle` runs an ``on_lost`` callback on the event loop
(a coroutine function's result as a task).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from cacheguard.checks import Seconds
from cacheguard.exceptions import LockLostError
from cacheguard.locks.protocol import Mode
from cacheguard.locks.shape import HandleState

__all__ = ["AsyncRWLockShape", "LoopHandle", "release_on_exit"]

log = logging.getLogger("cacheguard.lock")

T = TypeVar("T")


class LoopHandle(HandleState):
    """An asyncio store's handle: ``await release()`` through its lock, and
    ``on_lost`` called soon on the loop (a slow callback must not hold up the task
    that noticed the loss); an awaitable it returns runs as a task."""

    __slots__ = ()

    async def release(self) -> None:
        await self.lock.release(self)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop the callback runs on."""
        return asyncio.get_running_loop()

    def _spawn_callback(self, awaitable: Awaitable[Any]) -> None:
        """Run an async callback's awaitable as a task, kept referenced until it ends."""
        self.lock._spawn(_awaited(awaitable))

    def _start_on_lost(self) -> None:
        self._loop().call_soon(self._run_on_lost)

    def _run_on_lost(self) -> None:
        assert self._on_lost is not None
        try:
            result = self._on_lost(self)
            if inspect.isawaitable(result):
                self._spawn_callback(result)
        except Exception:
            log.exception("on_lost callback of lock %r failed", self.lock_name)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


H = TypeVar("H", bound=LoopHandle)


class AsyncRWLockShape(Generic[H]):
    """The public methods of an asyncio lock store, from its ``_acquire`` and ``_try_once``."""

    async def acquire_read(self, timeout: Seconds | None = None, *, owner: str | None = None) -> H:
        """Wait until the read lock is ours (or :class:`LockTimeout`)."""
        return await self._acquire("read", timeout, owner)

    async def acquire_write(self, timeout: Seconds | None = None, *, owner: str | None = None) -> H:
        """Wait until the write lock is ours; a read holder gets :class:`LockUpgradeError`."""
        return await self._acquire("write", timeout, owner)

    async def try_acquire_read(self, *, owner: str | None = None) -> H | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return await self._try_once("read", owner)

    async def try_acquire_write(self, *, owner: str | None = None) -> H | None:
        """One attempt, no waiting: the handle, or ``None`` if the lock is busy."""
        return await self._try_once("write", owner)

    @contextlib.asynccontextmanager
    async def read(
        self, timeout: Seconds | None = None, *, owner: str | None = None
    ) -> AsyncIterator[H]:
        """Hold the read lock for the ``async with`` block."""
        handle = await self.acquire_read(timeout, owner=owner)
        async with release_on_exit(handle.release):
            yield handle

    @contextlib.asynccontextmanager
    async def write(
        self, timeout: Seconds | None = None, *, owner: str | None = None
    ) -> AsyncIterator[H]:
        """Hold the write lock for the ``async with`` block."""
        handle = await self.acquire_write(timeout, owner=owner)
        async with release_on_exit(handle.release):
            yield handle

    async def _acquire(self, mode: Mode, timeout: Seconds | None, owner: str | None) -> H:
        raise NotImplementedError

    async def _try_once(self, mode: Mode, owner: str | None) -> H | None:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def release_on_exit(release: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Await ``release`` on exit (also after a cancelled body); a lost lock raises
    unless the body already raised."""
    try:
        yield
    except BaseException:
        try:
            await release()
        except LockLostError as lost:
            log.warning("%s (while the body raised)", lost)
        raise
    await release()
