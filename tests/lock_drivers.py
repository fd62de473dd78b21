"""One face for the sync and the asyncio lock, so a lock test is written once.

``Driver("sync", ...)`` wraps :class:`RedisRWLock` (its blocking calls run on the
test's own thread, so the thread is the default owner), ``Driver("async", ...)``
wraps :class:`AsyncRedisRWLock` (the test's task is the default owner). Every call
is awaited either way; :meth:`Driver.in_background` runs an acquisition
concurrently (a daemon thread, or a task).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis
import redis.asyncio

from cacheguard import LockHandle, RedisRWLock, Watchdog
from cacheguard.aio import AsyncLockHandle, AsyncRedisRWLock, AsyncWatchdog
from cacheguard.backoff import Backoff

Handle = LockHandle | AsyncLockHandle

# A retry timer of a minute: within a test's deadline only a release announcement wakes.
NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Lock:
    """A sync or asyncio lock behind awaitable methods of the same names."""

    def __init__(self, lock: RedisRWLock | AsyncRedisRWLock) -> None:
        self.lock = lock
        self.keys = lock.keys

    async def acquire_read(self, timeout: float | None = None, *, owner: str | None = None) -> Any:
        return await maybe_await(self.lock.acquire_read(timeout, owner=owner))

    async def acquire_write(self, timeout: float | None = None, *, owner: str | None = None) -> Any:
        return await maybe_await(self.lock.acquire_write(timeout, owner=owner))

    async def try_acquire_read(self, *, owner: str | None = None) -> Any:
        return await maybe_await(self.lock.try_acquire_read(owner=owner))

    async def try_acquire_write(self, *, owner: str | None = None) -> Any:
        return await maybe_await(self.lock.try_acquire_write(owner=owner))

    @contextlib.asynccontextmanager
    async def write(
        self, timeout: float | None = None, *, owner: str | None = None
    ) -> AsyncIterator[Any]:
        if isinstance(self.lock, AsyncRedisRWLock):
            async with self.lock.write(timeout, owner=owner) as handle:
                yield handle
        else:
            with self.lock.write(timeout, owner=owner) as handle:
                yield handle


async def release(handle: Handle) -> None:
    await maybe_await(handle.release())


class Driver:
    def __init__(
        self,
        kind: str,
        client: redis.Redis,
        aclient: redis.asyncio.Redis,
        namespace: str,
    ) -> None:
        self.kind = kind
        self.client = client  # also what the tests inspect Redis with
        self.aclient = aclient
        self.namespace = namespace

    def lock(self, name: str = "res", **kw: Any) -> Lock:
        if self.kind == "sync":
            return Lock(RedisRWLock(self.client, name, namespace=self.namespace, **kw))
        return Lock(AsyncRedisRWLock(self.aclient, name, namespace=self.namespace, **kw))

    def watchdog(self) -> Watchdog | AsyncWatchdog:
        return Watchdog() if self.kind == "sync" else AsyncWatchdog()

    def in_background(self, acquire: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``acquire()`` concurrently; the future gets its result."""
        if self.kind == "async":
            return asyncio.ensure_future(acquire())
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def run() -> None:
            try:
                result = acquire()
            except BaseException as exc:
                loop.call_soon_threadsafe(_fail, future, exc)
            else:
                loop.call_soon_threadsafe(_succeed, future, result)

        # A daemon: under a broken wake-up it would otherwise outlive the test.
        threading.Thread(target=run, daemon=True).start()
        return future


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def fields(client: redis.Redis, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}


async def eventually(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` (test-side only) until true or ``timeout``, yielding to the loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return bool(predicate())
