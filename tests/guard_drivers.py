"""One face for the sync and the asyncio guard, so a cache test is written once.

``Guard("sync", ...)`` wraps :class:`CacheGuard`: each call runs in a worker
thread (``asyncio.to_thread``), as a threaded service would call it, so many
calls gathered at once are many threads. ``Guard("async", ...)`` wraps
:class:`AsyncCacheGuard`: each call is a task of the test's loop. Loaders given
to either are plain functions (both guards accept them; the asyncio guard also
takes ``async def``, tested on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from cacheguard import CacheGuard, CacheLoader, cached_with_lock
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader
from cacheguard.backoff import Backoff

KINDS = ("sync", "async")


def guard_from_url(
    kind: str, url: str, *, socket_timeout: float = 10.0, **settings: Any
) -> CacheGuard | AsyncCacheGuard:
    """A guard of ``kind`` on a new client for ``url``, in any deployment's form."""
    if kind == "sync":
        return CacheGuard.from_url(url, socket_timeout=socket_timeout, **settings)
    return AsyncCacheGuard.from_url(url, socket_timeout=socket_timeout, **settings)


@contextlib.asynccontextmanager
async def guards_on(kind: str, url: str, **defaults: Any) -> AsyncIterator[Callable[..., Guard]]:
    """A factory of guards of ``kind`` for ``url`` (``defaults`` under each call's
    settings); every guard made is closed at the end."""
    made: list[Guard] = []

    def build(**settings: Any) -> Guard:
        made.append(Guard(kind, guard_from_url(kind, url, **{**defaults, **settings})))
        return made[-1]

    try:
        yield build
    finally:
        for guard in made:
            await guard.close()


# A retry timer of a minute: within a test's deadline only an announcement wakes.
NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)


class Loader:
    """A CacheLoader or AsyncCacheLoader behind awaitable methods."""

    def __init__(self, guard: Guard, loader: CacheLoader[Any, Any] | AsyncCacheLoader[Any, Any]):
        self._guard = guard
        self._loader = loader

    async def get(self, *args: Any) -> Any:
        return await self._guard._call(self._loader.get, *args)

    async def peek(self, *args: Any) -> Any:
        return await self._guard._call(self._loader.peek, *args)

    async def invalidate(self, *args: Any) -> Any:
        return await self._guard._call(self._loader.invalidate, *args)

    async def refresh(self, *args: Any) -> Any:
        return await self._guard._call(self._loader.refresh, *args)


class Guard:
    """A sync or asyncio guard behind awaitable methods of the same names."""

    def __init__(self, kind: str, guard: CacheGuard | AsyncCacheGuard) -> None:
        self.kind = kind
        self.guard = guard

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.kind == "sync":
            return await asyncio.to_thread(method, *args, **kwargs)
        return await method(*args, **kwargs)

    async def get_or_load(self, name: str, load: Callable[[], Any], **kwargs: Any) -> Any:
        return await self._call(self.guard.get_or_load, name, load, **kwargs)

    async def get_or_load_many(
        self, names: list[str], load_many: Callable[[list[str]], Any], **kwargs: Any
    ) -> Any:
        return await self._call(self.guard.get_or_load_many, names, load_many, **kwargs)

    async def peek(self, name: str) -> Any:
        return await self._call(self.guard.peek, name)

    async def refresh(self, name: str, load: Callable[[], Any], **kwargs: Any) -> Any:
        return await self._call(self.guard.refresh, name, load, **kwargs)

    async def invalidate(self, *names: str) -> None:
        await self._call(self.guard.invalidate, *names)

    async def invalidate_prefix(self, prefix: str) -> int:
        return int(await self._call(self.guard.invalidate_prefix, prefix))

    async def watermark(self) -> int:
        return int(await self._call(self.guard.watermark))

    @contextlib.asynccontextmanager
    async def write(self, *names: str, timeout: float | None = None) -> AsyncIterator[None]:
        if isinstance(self.guard, AsyncCacheGuard):
            async with self.guard.write(*names, timeout=timeout):
                yield
            return
        # Entered in one worker thread and left in another: supported, as under ASGI.
        context = self.guard.write(*names, timeout=timeout)
        await asyncio.to_thread(context.__enter__)
        try:
            yield
        except BaseException as exc:
            if not await asyncio.to_thread(context.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await asyncio.to_thread(context.__exit__, None, None, None)

    def loader(self, *, key: str, load: Callable[..., Any], ttl: float) -> Loader:
        if isinstance(self.guard, AsyncCacheGuard):
            return Loader(self, AsyncCacheLoader(self.guard, key=key, load=load, ttl=ttl))
        return Loader(self, CacheLoader(self.guard, key=key, load=load, ttl=ttl))

    def decorate(self, *, key: str, ttl: float) -> Callable[[Callable[..., Any]], Any]:
        """``cached_with_lock`` on ``func`` (an ``async def`` twin for the asyncio
        guard); the result's calls and methods are awaitable either way."""

        def wrap(func: Callable[..., Any]) -> Any:
            if isinstance(self.guard, AsyncCacheGuard):

                @functools.wraps(func)
                async def twin(*args: Any, **kwargs: Any) -> Any:
                    return func(*args, **kwargs)

                return cached_with_lock(self.guard, key=key, ttl=ttl)(twin)
            cached = cached_with_lock(self.guard, key=key, ttl=ttl)(func)

            class Awaitable:
                async def __call__(inner, *args: Any) -> Any:
                    return await asyncio.to_thread(cached, *args)

                async def peek(inner, *args: Any) -> Any:
                    return await asyncio.to_thread(cached.peek, *args)

                async def invalidate(inner, *args: Any) -> Any:
                    return await asyncio.to_thread(cached.invalidate, *args)

            return Awaitable()

        return wrap

    def stats(self) -> Any:
        return self.guard.stats()

    def keys(self, name: str) -> Any:
        return self.guard.keys(name)

    async def close(self) -> None:
        if isinstance(self.guard, AsyncCacheGuard):
            await self.guard.aclose()
            await self.guard.client.aclose()
        else:
            self.guard.close()
            self.guard.client.close()
