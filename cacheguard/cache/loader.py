"""The two ways to use the cache: explicit ``CacheLoader`` objects and ``@cached_with_lock``.

::

    menu = CacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=300)
    menu.get(menu_id=7)

    @cached_with_lock(guard, key="menu:list", ttl=300)
    def list_menus() -> list[dict]: ...

Both build the key from a template naming the load function's parameters (or,
without one, from the function's qualified name and its arguments: see
:mod:`cacheguard.cache.templates` for what is refused and why), and offer
``get``/call, ``invalidate``, ``refresh`` (reload now) and ``peek`` (the cached
value or :data:`MISSING`, no load).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.templates import KeyBuilder
from cacheguard.checks import check_positive

__all__ = ["CacheLoader", "CachedFunction", "cached_with_lock"]

P = ParamSpec("P")
R = TypeVar("R")


class CacheLoader(Generic[P, R]):
    """Read-through access to one family of keys, loaded by ``load``."""

    def __init__(
        self,
        guard: CacheGuard,
        *,
        key: str | None,
        load: Callable[P, R],
        ttl: float,
        none_ttl: float | Missing | None = MISSING,
    ) -> None:
        if not isinstance(guard, CacheGuard):
            raise TypeError(f"guard must be a CacheGuard, not {type(guard).__name__}")
        if not callable(load):
            raise TypeError("load must be callable")
        self.guard = guard
        self.load = load
        self.ttl = check_positive("ttl", ttl)
        self.none_ttl = (
            none_ttl
            if none_ttl is MISSING or none_ttl is None
            else check_positive(
                "none_ttl",
                none_ttl,
            )
        )
        self._keys = KeyBuilder(load, key, max_length=guard.settings.max_key_length)

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The key name of this call (inside the guard's namespace)."""
        return self._keys.build(args, kwargs)

    def get(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The cached value, loaded once across all processes if missing."""
        name = self._keys.build(args, kwargs)
        return self.guard.get_or_load(
            name, lambda: self.load(*args, **kwargs), ttl=self.ttl, none_ttl=self.none_ttl
        )

    def refresh(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Load now and store (under the key's locks, once across processes)."""
        name = self._keys.build(args, kwargs)
        return self.guard.refresh(
            name, lambda: self.load(*args, **kwargs), ttl=self.ttl, none_ttl=self.none_ttl
        )

    def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Drop the cached value without locking (fills in flight fail their store)."""
        self.guard.invalidate(self._keys.build(args, kwargs))

    def peek(self, *args: P.args, **kwargs: P.kwargs) -> R | Missing:
        """The cached value, or :data:`MISSING`; never loads."""
        value: R | Missing = self.guard.peek(self._keys.build(args, kwargs))
        return value


class CachedFunction(CacheLoader[P, R]):
    """A function whose calls are read through the cache (see :func:`cached_with_lock`)."""

    def __init__(self, guard: CacheGuard, func: Callable[P, R], **settings: Any) -> None:
        # Placed above @staticmethod / @classmethod: cache the function beneath and
        # bind like the descriptor it replaces.
        self._binding = "instance"
        if isinstance(func, staticmethod):
            func, self._binding = func.__func__, "static"
        elif isinstance(func, classmethod):
            func, self._binding = func.__func__, "class"
        super().__init__(guard, load=func, **settings)
        functools.update_wrapper(self, func)

    def __set_name__(self, owner: type[Any], name: str) -> None:
        # Python placed us in a class body: the first argument is the instance (left
        # out of default keys) or, for a classmethod, the class (named in them).
        if self._binding == "instance":
            self._keys.bind_as("method")
        elif self._binding == "class":
            self._keys.bind_as("classmethod")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.get(*args, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> CachedFunction[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> _BoundCachedFunction[R]: ...

    def __get__(
        self, instance: object | None, owner: type[Any]
    ) -> CachedFunction[P, R] | _BoundCachedFunction[R]:
        if self._binding == "static":
            return self
        if self._binding == "class":
            return _BoundCachedFunction(self, owner)
        if instance is None:
            return self
        return _BoundCachedFunction(self, instance)


class _BoundCachedFunction(Generic[R]):
    """A cached method bound to its instance: ``self`` is filled in for every call."""

    __slots__ = ("_cached", "_instance")

    def __init__(self, cached: CachedFunction[Any, R], instance: object) -> None:
        self._cached = cached
        self._instance = instance

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self._cached.get(self._instance, *args, **kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> None:
        self._cached.invalidate(self._instance, *args, **kwargs)

    def refresh(self, *args: Any, **kwargs: Any) -> R:
        return self._cached.refresh(self._instance, *args, **kwargs)

    def peek(self, *args: Any, **kwargs: Any) -> R | Missing:
        return self._cached.peek(self._instance, *args, **kwargs)

    def key(self, *args: Any, **kwargs: Any) -> str:
        return self._cached.key(self._instance, *args, **kwargs)


def cached_with_lock(
    guard: CacheGuard,
    *,
    key: str | None = None,
    ttl: float,
    none_ttl: float | Missing | None = MISSING,
) -> Callable[[Callable[P, R]], CachedFunction[P, R]]:
    """Read calls of the decorated function (or method) through ``guard``.

    ``key`` is a template naming the function's parameters, e.g. ``"menu:{menu_id}"``;
    without it, the key is the function's qualified name and its arguments.
    The result keeps the signature and adds ``.invalidate``, ``.refresh`` and
    ``.peek`` taking the same arguments.
    """

    def decorate(func: Callable[P, R]) -> CachedFunction[P, R]:
        return CachedFunction(guard, func, key=key, ttl=ttl, none_ttl=none_ttl)

    return decorate
