"""``@cached_with_lock``: one decorator for both guards.

With a :class:`~cacheguard.CacheGuard` it returns a
:class:`~cacheguard.cache.loader.CachedFunction`; with an
:class:`~cacheguard.aio.AsyncCacheGuard`, for an ``async def``, an
:class:`~cacheguard.cache.async_loader.AsyncCachedFunction` whose calls and methods are
awaited. Keys, templates and method binding are the same.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from cacheguard.cache.default import DefaultGuard
from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.loader import CachedFunction, is_async_callable
from cacheguard.checks import Seconds

if TYPE_CHECKING:
    from cacheguard.cache.async_guard import AsyncCacheGuard
    from cacheguard.cache.async_loader import AsyncCachedFunction

# The asyncio side is looked up, not imported: a sync program never loads it, and an
# AsyncCacheGuard can only exist once its module was imported.
_ASYNC_GUARD = "cacheguard.cache.async_guard"
_ASYNC_LOADER = "cacheguard.cache.async_loader"

__all__ = ["DecorateWithDefault", "cached_with_lock"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def cached_with_lock(
    guard: CacheGuard,
    *,
    key: str | None = None,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[P, R]], CachedFunction[P, R]]: ...


@overload
def cached_with_lock(
    guard: AsyncCacheGuard,
    *,
    key: str | None = None,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[P, Awaitable[R]]], AsyncCachedFunction[P, R]]: ...


@overload
def cached_with_lock(
    guard: None = None,
    *,
    key: str | None = None,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> DecorateWithDefault: ...


def cached_with_lock(
    guard: CacheGuard | AsyncCacheGuard | None = None,
    *,
    key: str | None = None,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[P, Any]], Any]:
    """Read calls of the decorated function (or method) through ``guard``.

    ``key`` is a template naming the function's parameters, e.g. ``"menu:{menu_id}"``;
    without it, the key is the function's qualified name and its arguments.
    ``ttl`` and ``none_ttl``: seconds or a ``timedelta`` (``ttl=timedelta(minutes=5)``).
    The result keeps the signature and adds ``.invalidate``, ``.refresh`` and
    ``.peek`` taking the same arguments. With an ``AsyncCacheGuard``, decorate an
    ``async def``: calls and those methods are awaited. A ``CacheGuard`` refuses an
    ``async def`` here, at decoration (``TypeError``). The result pickles by
    reference, as the function it replaces (see :mod:`cacheguard.cache.loader`).

    ``type``: the values' type (see :mod:`cacheguard.codecs`); without it, the
    return annotation's when it names a dataclass, a pydantic model or a msgspec
    Struct that a family handles; ``False``: values as the codec stores them.

    Without ``guard``, every call reads through the default guard that
    :func:`cacheguard.use` installed, looked up when the call is made: the
    ``CacheGuard`` for a plain function, the ``AsyncCacheGuard`` for an ``async
    def`` (:class:`~cacheguard.NoDefaultGuard` when none is installed; see
    :mod:`cacheguard.cache.default`).
    """
    if guard is None:
        return DecorateWithDefault(key=key, ttl=ttl, none_ttl=none_ttl, type=type)
    if isinstance(guard, CacheGuard):
        sync_guard = guard

        def decorate(func: Callable[P, Any]) -> Any:
            return CachedFunction(sync_guard, func, key=key, ttl=ttl, none_ttl=none_ttl, type=type)

        return decorate
    async_module = sys.modules.get(_ASYNC_GUARD)
    if async_module is not None and isinstance(guard, async_module.AsyncCacheGuard):
        async_guard = guard
        cached_function = importlib.import_module(_ASYNC_LOADER).AsyncCachedFunction

        def decorate_async(func: Callable[P, Any]) -> Any:
            return cached_function(
                async_guard, func, key=key, ttl=ttl, none_ttl=none_ttl, type=type
            )

        return decorate_async
    raise TypeError(
        f"guard must be a CacheGuard or an AsyncCacheGuard, not {guard.__class__.__name__}"
    )


class DecorateWithDefault:
    """``@cached_with_lock(...)`` without a guard: an ``async def`` reads through the
    default asyncio guard, anything else through the default sync guard."""

    def __init__(
        self,
        *,
        key: str | None,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        type: Any,
    ) -> None:
        self.key, self.ttl, self.none_ttl, self.type = key, ttl, none_ttl, type

    # An async def matches Callable[P, R] too: this overload, first, wins for it.
    @overload
    def __call__(self, func: Callable[P, Awaitable[R]]) -> AsyncCachedFunction[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, func: Callable[P, R]) -> CachedFunction[P, R]: ...

    def __call__(self, func: Callable[P, Any]) -> Any:
        target = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        if is_async_callable(target):
            cached_function = importlib.import_module(_ASYNC_LOADER).AsyncCachedFunction
            return cached_function(
                DefaultGuard("asyncio"),
                func,
                key=self.key,
                ttl=self.ttl,
                none_ttl=self.none_ttl,
                type=self.type,
            )
        return CachedFunction(
            DefaultGuard("sync"),
            func,
            key=self.key,
            ttl=self.ttl,
            none_ttl=self.none_ttl,
            type=self.type,
        )
