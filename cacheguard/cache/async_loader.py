"""The asyncio loaders: :class:`AsyncCacheLoader` and the decorator's
:class:`AsyncCachedFunction` (what :func:`cacheguard.cached_with_lock` returns for
an :class:`AsyncCacheGuard`).

::

    menu = AsyncCacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=300)
    await menu.get(menu_id=7); await menu.invalidate(menu_id=7)

    @cached_with_lock(guard, key="menu:list", ttl=300)
    async def list_menus() -> list[dict]: ...

Keys, templates, validation and method binding are the sync loaders'
(:mod:`cacheguard.cache.loader`); only the calls are awaited.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from cacheguard.cache import typed
from cacheguard.cache.async_guard import AsyncCacheGuard
from cacheguard.cache.default import DefaultGuard
from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.loader import Decorated, KeyedLoader
from cacheguard.checks import Seconds

__all__ = ["AsyncCacheLoader", "AsyncCachedFunction"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncCacheLoader(KeyedLoader[P, R]):
    """Read-through access to one family of keys, loaded by ``load`` (``async def``,
    or a plain function)."""

    guard_type = AsyncCacheGuard
    driver = "asyncio"
    takes_async = True
    guard: AsyncCacheGuard

    def __init__(
        self,
        guard: AsyncCacheGuard | DefaultGuard,
        *,
        key: str | None,
        load: Callable[P, Awaitable[R]] | Callable[P, R],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        type: Any = None,
        infer_type: bool = False,
    ) -> None:
        super().__init__(
            guard,
            key=key,
            load=load,
            ttl=ttl,
            none_ttl=none_ttl,
            type=type,
            infer_type=infer_type,
        )

    async def get(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The cached value, loaded once across all processes if missing."""
        name = self._keys.build(args, kwargs)
        if self._values is not None and (values := self._value_type()) is not None:
            return await typed.aget_or_load(  # type: ignore[no-any-return]
                self.guard,
                values,
                name,
                lambda: self.load(*args, **kwargs),
                ttl=self.ttl,
                none_ttl=self.none_ttl,
                template=self._label,
            )
        value: R = await self.guard.get_or_load(
            name,
            lambda: self.load(*args, **kwargs),
            ttl=self.ttl,
            none_ttl=self.none_ttl,
            template=self._label,
        )
        return value

    async def refresh(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Load now and store (under the key's locks, once across processes)."""
        name = self._keys.build(args, kwargs)
        if self._values is not None and (values := self._value_type()) is not None:
            return await typed.arefresh(  # type: ignore[no-any-return]
                self.guard,
                values,
                name,
                lambda: self.load(*args, **kwargs),
                ttl=self.ttl,
                none_ttl=self.none_ttl,
                template=self._label,
            )
        value: R = await self.guard.refresh(
            name,
            lambda: self.load(*args, **kwargs),
            ttl=self.ttl,
            none_ttl=self.none_ttl,
            template=self._label,
        )
        return value

    async def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Drop the cached value without locking (fills in flight fail their store)."""
        await self.guard.invalidate(self._keys.build(args, kwargs), template=self._label)

    async def peek(self, *args: P.args, **kwargs: P.kwargs) -> R | Missing:
        """The cached value, or :data:`MISSING`; never loads."""
        name = self._keys.build(args, kwargs)
        if self._values is not None and (values := self._value_type()) is not None:
            return await typed.apeek(self.guard, values, name, template=self._label)  # type: ignore[no-any-return]
        value: R | Missing = await self.guard.peek(name, template=self._label)
        return value


class AsyncCachedFunction(Decorated, AsyncCacheLoader[P, R]):
    """An ``async def`` whose calls are read through the cache."""

    def __init__(
        self,
        guard: AsyncCacheGuard | DefaultGuard,
        func: Callable[P, Awaitable[R]],
        *,
        key: str | None,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        type: Any = None,
    ) -> None:
        func = cast("Callable[P, Awaitable[R]]", self._unwrap(func))
        AsyncCacheLoader.__init__(
            self,
            guard,
            key=key,
            load=func,
            ttl=ttl,
            none_ttl=none_ttl,
            type=type,
            infer_type=True,
        )
        functools.update_wrapper(self, func)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self.get(*args, **kwargs)
