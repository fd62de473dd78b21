"""The two ways to use the cache: explicit ``CacheLoader`` objects and ``@cached_with_lock``
(:mod:`cacheguard.decorator`, which picks the sync or the asyncio class).

::

    menu = CacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=300)
    menu.get(menu_id=7)

    @cached_with_lock(guard, key="menu:list", ttl=300)
    def list_menus() -> list[dict]: ...

Both build the key from a template naming the load function's parameters (or,
without one, from the function's qualified name and its arguments: see
:mod:`cacheguard.cache.templates` for what is refused and why), and offer
``get``/call, ``invalidate``, ``refresh`` (reload now) and ``peek`` (the cached
value or :data:`MISSING`, no load). With an :class:`~cacheguard.aio.AsyncCacheGuard`
the decorator takes an ``async def`` and every method is awaited
(:mod:`cacheguard.aio.loader`); keys and validation are shared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.templates import KeyBuilder
from cacheguard.checks import check_positive

__all__ = ["BoundCachedFunction", "CacheLoader", "CachedFunction", "Decorated", "KeyedLoader"]

P = ParamSpec("P")
R = TypeVar("R")


class KeyedLoader(Generic[P, R]):
    """What both loaders share: the guard, the load function, the TTLs and the keys."""

    guard_type: type[Any] = CacheGuard

    def __init__(
        self,
        guard: Any,
        *,
        key: str | None,
        load: Callable[P, Any],
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> None:
        if not isinstance(guard, self.guard_type):
            raise TypeError(
                f"guard must be a {self.guard_type.__name__}, not {type(guard).__name__}"
            )
        if not callable(load):
            raise TypeError("load must be callable")
        self.guard = guard
        self.load = load
        self.ttl = check_positive("ttl", ttl)
        self.none_ttl = (
            none_ttl
            if none_ttl is MISSING or none_ttl is None
            else check_positive("none_ttl", none_ttl)
        )
        self._keys = KeyBuilder(load, key, max_length=guard.settings.max_key_length)
        self._label = self._keys.label  # every call's events carry it as their template

    @property
    def template(self) -> str:
        """What this loader's events are labelled by: its key template, or (without
        one) its load function's module and qualified name."""
        return self._label

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The key name of this call (inside the guard's namespace)."""
        return self._keys.build(args, kwargs)


class CacheLoader(KeyedLoader[P, R]):
    """Read-through access to one family of keys, loaded by ``load``."""

    guard: CacheGuard

    def __init__(
        self,
        guard: CacheGuard,
        *,
        key: str | None,
        load: Callable[P, R],
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> None:
        super().__init__(guard, key=key, load=load, ttl=ttl, none_ttl=none_ttl)

    def get(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The cached value, loaded once across all processes if missing."""
        name = self._keys.build(args, kwargs)
        value: R = self.guard.get_or_load(
            name,
            lambda: self.load(*args, **kwargs),
            ttl=self.ttl,
            none_ttl=self.none_ttl,
            template=self._label,
        )
        return value

    def refresh(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Load now and store (under the key's locks, once across processes)."""
        name = self._keys.build(args, kwargs)
        value: R = self.guard.refresh(
            name,
            lambda: self.load(*args, **kwargs),
            ttl=self.ttl,
            none_ttl=self.none_ttl,
            template=self._label,
        )
        return value

    def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Drop the cached value without locking (fills in flight fail their store)."""
        self.guard.invalidate(self._keys.build(args, kwargs), template=self._label)

    def peek(self, *args: P.args, **kwargs: P.kwargs) -> R | Missing:
        """The cached value, or :data:`MISSING`; never loads."""
        value: R | Missing = self.guard.peek(self._keys.build(args, kwargs), template=self._label)
        return value


class Decorated:
    """A loader placed as a decorator: unwraps ``staticmethod``/``classmethod`` and
    binds like the descriptor it replaces (shared by the sync and async decorators)."""

    _keys: KeyBuilder

    def _unwrap(self, func: Any) -> Callable[..., Any]:
        self._binding = "instance"
        if isinstance(func, staticmethod):
            func, self._binding = func.__func__, "static"
        elif isinstance(func, classmethod):
            func, self._binding = func.__func__, "class"
        return func  # type: ignore[no-any-return]

    def __set_name__(self, owner: type[Any], name: str) -> None:
        # Python placed us in a class body: the first argument is the instance (left
        # out of default keys) or, for a classmethod, the class (named in them).
        if self._binding == "instance":
            self._keys.bind_as("method")
        elif self._binding == "class":
            self._keys.bind_as("classmethod")

    def __get__(self, instance: object | None, owner: type[Any]) -> Any:
        if self._binding == "static":
            return self
        if self._binding == "class":
            return BoundCachedFunction(self, owner)
        if instance is None:
            return self
        return BoundCachedFunction(self, instance)


class CachedFunction(Decorated, CacheLoader[P, R]):
    """A function whose calls are read through the cache (see :func:`cached_with_lock`)."""

    def __init__(
        self,
        guard: CacheGuard,
        func: Callable[P, R],
        *,
        key: str | None,
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> None:
        func = cast("Callable[P, R]", self._unwrap(func))
        CacheLoader.__init__(self, guard, key=key, load=func, ttl=ttl, none_ttl=none_ttl)
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.get(*args, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> CachedFunction[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> BoundCachedFunction: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> Any:
        return Decorated.__get__(self, instance, owner)


class BoundCachedFunction:
    """A cached method bound to its instance (or class): filled in for every call.
    Its methods return what the cached function's return (awaitables for async)."""

    __slots__ = ("_cached", "_instance")

    def __init__(self, cached: Any, instance: object) -> None:
        self._cached = cached
        self._instance = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached.get(self._instance, *args, **kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached.invalidate(self._instance, *args, **kwargs)

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached.refresh(self._instance, *args, **kwargs)

    def peek(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached.peek(self._instance, *args, **kwargs)

    def key(self, *args: Any, **kwargs: Any) -> str:
        return self._cached.key(self._instance, *args, **kwargs)  # type: ignore[no-any-return]
