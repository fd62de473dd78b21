"""The two ways to use the cache: explicit ``CacheLoader`` objects and ``@cached_with_lock``
(:mod:`cacheguard.cache.decorator`, which picks the sync or the asyncio class).

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
(:mod:`cacheguard.cache.async_loader`); keys and validation are shared. A sync guard
refuses an ``async def`` at decoration (it would cache the coroutine object).

**Pickling.** Loaders and decorated functions pickle by reference, as functions
do: the pickle holds the module and the name they are bound to, and unpickling
imports that module and takes the object found there (with its guard, made at
import in that process). So ``ProcessPoolExecutor.map(decorated, ...)`` works for
a decorated function or method (a class attribute of a module-level class), or a
loader bound to a module-level name; one that is not refuses to pickle with
:class:`pickle.PicklingError`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
import sys
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

from cacheguard.cache import typed
from cacheguard.cache.default import DefaultGuard, Driver
from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.templates import KeyBuilder, describe
from cacheguard.checks import Seconds, check_positive
from cacheguard.codecs import ValueType, value_type
from cacheguard.redis.keys import shorten

__all__ = [
    "BoundCachedFunction",
    "CacheLoader",
    "CachedFunction",
    "Decorated",
    "KeyedLoader",
    "is_async_callable",
]

P = ParamSpec("P")
R = TypeVar("R")


class Unresolved:
    """A decorated function's values' type before its first call."""


UNRESOLVED = Unresolved()


class KeyedLoader(Generic[P, R]):
    """What both loaders share: the guard, the load function, the TTLs and the keys."""

    guard_type: type[Any] = CacheGuard
    driver: Driver = "sync"  # whose default guard stands in when none is given
    takes_async = False  # may load be an async def? (the asyncio loaders: yes)

    def __init__(
        self,
        guard: Any,
        *,
        key: str | None,
        load: Callable[P, Any],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        type: Any = None,
        infer_type: bool = False,
    ) -> None:
        # (`type` is the values' type here: the guard's class is its __class__.)
        # A DefaultGuard (a function decorated without a guard) is the guard that
        # cacheguard.use() installed, looked up on every call.
        self._deferred = isinstance(guard, DefaultGuard)
        if self._deferred and guard.driver != self.driver:
            raise TypeError(f"a {self.__class__.__name__} reads through the {self.driver} guard")
        if not self._deferred and not isinstance(guard, self.guard_type):
            raise TypeError(
                f"guard must be a {self.guard_type.__name__}, not {guard.__class__.__name__}"
            )
        if not callable(load):
            raise TypeError("load must be callable")
        if not self.takes_async and is_async_callable(load):
            raise TypeError(
                f"{describe(load)} is an async function: a {guard.__class__.__name__} would "
                "cache the coroutine object, not its result; use an AsyncCacheGuard "
                "(cacheguard.aio) for async functions"
            )
        self.guard = guard
        self.load = load
        # Seconds from here on, a timedelta converted once (not on every call).
        self.ttl = check_positive("ttl", ttl)
        self.none_ttl = (
            none_ttl
            if isinstance(none_ttl, Missing) or none_ttl is None
            else check_positive("none_ttl", none_ttl)
        )
        # The default guard is not known yet: names are shortened by the guard that
        # serves the call (as it shortens any name past its max_key_length).
        max_length = sys.maxsize if self._deferred else guard.settings.max_key_length
        self._keys = KeyBuilder(load, key, max_length=max_length)
        self._label = self._keys.label  # every call's events carry it as their template
        self._made_in = _calling_module()  # where to find this loader by name, to pickle it
        # The values' type: given, or (a decorator) read from the return annotation at
        # the first call, when every name it uses is defined.
        self._values: ValueType | Unresolved | None = (
            None
            if type is False or (type is None and not infer_type)  # False: values as they are
            else UNRESOLVED
            if type is None
            else value_type(type)
        )

    def _value_type(self) -> ValueType | None:
        """The values' type, the return annotation's read once (see __init__)."""
        values = self._values
        if isinstance(values, Unresolved):
            values = self._values = typed.return_value_type(self.load, self.guard.settings.codec)
        return values

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference (see the module docstring): the module and name this
        loader is bound to."""
        for module_name in dict.fromkeys((self._made_in, getattr(self.load, "__module__", None))):
            module = sys.modules.get(module_name) if module_name else None
            for name, value in vars(module).items() if module is not None else ():
                if value is self:
                    return _by_reference, (module_name, name)
        raise pickle.PicklingError(
            f"cannot pickle {self!r}: a loader pickles by reference, as functions do; "
            "bind it to a module-level name (another process finds it there)"
        )

    @property
    def template(self) -> str:
        """What this loader's events are labelled by: its key template, or (without
        one) its load function's module and qualified name."""
        return self._label

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The key name of this call (inside the guard's namespace)."""
        name = self._keys.build(args, kwargs)
        if self._deferred:  # as the installed guard will shorten it
            return shorten(name, self.guard.settings.max_key_length)
        return name


class CacheLoader(KeyedLoader[P, R]):
    """Read-through access to one family of keys, loaded by ``load``; ``ttl`` and
    ``none_ttl`` (as for :meth:`CacheGuard.get_or_load`) are seconds or a ``timedelta``."""

    guard: CacheGuard

    def __init__(
        self,
        guard: CacheGuard | DefaultGuard,
        *,
        key: str | None,
        load: Callable[P, R],
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

    def get(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The cached value, loaded once across all processes if missing."""
        name = self._keys.build(args, kwargs)
        if self._values is not None and (values := self._value_type()) is not None:
            return typed.get_or_load(  # type: ignore[no-any-return]
                self.guard,
                values,
                name,
                lambda: self.load(*args, **kwargs),
                ttl=self.ttl,
                none_ttl=self.none_ttl,
                template=self._label,
            )
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
        if self._values is not None and (values := self._value_type()) is not None:
            return typed.refresh(  # type: ignore[no-any-return]
                self.guard,
                values,
                name,
                lambda: self.load(*args, **kwargs),
                ttl=self.ttl,
                none_ttl=self.none_ttl,
                template=self._label,
            )
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
        name = self._keys.build(args, kwargs)
        if self._values is not None and (values := self._value_type()) is not None:
            return typed.peek(self.guard, values, name, template=self._label)  # type: ignore[no-any-return]
        value: R | Missing = self.guard.peek(name, template=self._label)
        return value


class Decorated:
    """A loader placed as a decorator: unwraps ``staticmethod``/``classmethod`` and
    binds like the descriptor it replaces (shared by the sync and async decorators)."""

    _keys: KeyBuilder
    __module__: str
    __qualname__: str

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference, as the function it replaces: its module and
        qualified name (see the module docstring)."""
        module_name, qualname = self.__module__, self.__qualname__
        try:
            found = _by_reference(module_name, qualname)
        except (ImportError, KeyError, TypeError) as exc:
            found = exc
        if found is not self:
            raise pickle.PicklingError(
                f"cannot pickle {module_name}.{qualname}: a decorated function pickles by "
                f"reference, as functions do, and {module_name}.{qualname} is not it "
                f"(found {found!r}); decorate a function defined at module level or in a "
                "class, and keep it under its own name"
            )
        return _by_reference, (module_name, qualname)

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
        guard: CacheGuard | DefaultGuard,
        func: Callable[P, R],
        *,
        key: str | None,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None = MISSING,
        type: Any = None,
    ) -> None:
        func = cast("Callable[P, R]", self._unwrap(func))
        CacheLoader.__init__(
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

    def __reduce__(self) -> tuple[Any, ...]:
        # The cached method of its instance (or class): pickled as that attribute lookup.
        return getattr, (self._instance, self._cached.__name__)


def is_async_callable(func: object) -> bool:
    """Does calling ``func`` give a coroutine or an async generator (an ``async def``,
    a bound one, a partial of one, an object with an ``async def __call__``)?"""
    while isinstance(func, functools.partial):
        func = func.func
    call = func if inspect.isroutine(func) else inspect.getattr_static(type(func), "__call__", None)
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def _by_reference(module_name: str, qualname: str) -> Any:
    """The object bound to ``qualname`` in module ``module_name``, read from the
    namespaces themselves (a class attribute is not bound by its descriptor)."""
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = vars(target)[part]
    return target


_LOADER_MODULES = frozenset(
    ("cacheguard.cache.loader", "cacheguard.cache.async_loader", "cacheguard.cache.decorator")
)


def _calling_module() -> str | None:
    """The module that made a loader: the first caller outside the loader classes."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _LOADER_MODULES:
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_globals.get("__name__") if frame is not None else None
