"""``@cached_many_with_lock``: a function of a list of ids read through a guard's
``get_or_load_many``, for both guards.

::

    @cached_many_with_lock(guard, key="menu:{}", ttl=300)
    def menus(ids: list[int]) -> dict[int, Menu]: ...   # loads the ids it is given

    menus([3, 1, 3])   # {3: ..., 1: ...}: cached ids from Redis, the rest loaded at once

The decorated function takes the ids (any iterable of hashable ids) and returns
a mapping id -> value; it is called only with the ids not cached, once for them
all. ``key`` has one replacement field, filled with each id (``"menu:{}"`` or
``"menu:{menu_id}"``). With an :class:`~cacheguard.aio.AsyncCacheGuard`, decorate
an ``async def``; calls are awaited. Without a guard, calls read through the
default guard of :func:`cacheguard.use` (see :mod:`cacheguard.cache.default`).
"""

from __future__ import annotations

import functools
import string
import sys
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from cacheguard.cache import typed
from cacheguard.cache.default import DefaultGuard
from cacheguard.cache.entry import MISSING, Missing
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.loader import UNRESOLVED, Unresolved, is_async_callable
from cacheguard.checks import Seconds
from cacheguard.codecs import ValueType, value_type

if TYPE_CHECKING:
    from cacheguard.cache.async_guard import AsyncCacheGuard

__all__ = ["AsyncCachedManyFunction", "CachedManyFunction", "cached_many_with_lock"]

_ASYNC_GUARD = "cacheguard.cache.async_guard"

I = TypeVar("I", bound=Hashable)  # noqa: E741
V = TypeVar("V")


def key_maker(key: str) -> Callable[[Any], str]:
    """The key of an id from a template with exactly one replacement field."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str template such as 'menu:{{}}', not {type(key).__name__}")
    fields = [field for _, field, _, _ in string.Formatter().parse(key) if field is not None]
    if len(fields) != 1 or any(c in fields[0] for c in ".[!:"):
        raise ValueError(
            f"key {key!r} must have exactly one plain replacement field for the id, "
            "such as 'menu:{}' or 'menu:{menu_id}'"
        )
    field = fields[0]
    if field in {"", "0"}:
        return key.format
    return lambda item: key.format(**{field: item})


class _Many(Generic[I, V]):
    """What both kinds share: the key of each id and the batch's loader by keys."""

    def __init__(
        self,
        guard: Any,
        func: Callable[[list[I]], Any],
        *,
        key: str,
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        type: Any = None,
    ) -> None:
        self.guard, self.func = guard, func
        self.template, self.ttl, self.none_ttl = key, ttl, none_ttl
        self.key = key_maker(key)
        # The values' type: given, none (False), or the return annotation's, read at
        # the first call (when every name it uses is defined).
        self._values: ValueType | Unresolved | None = (
            None if type is False else UNRESOLVED if type is None else value_type(type)
        )
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def _value_type(self) -> ValueType | None:
        """The values' type (None: values as the codec stores them)."""
        values = self._values
        if isinstance(values, Unresolved):
            codec = self.guard.settings.codec
            values = self._values = typed.mapping_value_type(self.func, codec)
        return values

    def _keys(self, ids: Iterable[I], *, distinct: bool = False) -> dict[str, I]:
        """Each id's key, duplicates once; with ``distinct``, two different ids whose
        keys are alike (``1`` and ``"1"`` in ``"menu:{}"``) are refused: one value
        could not answer both."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"ids must be an iterable of ids, not {type(ids).__name__}")
        by_key: dict[str, I] = {}
        for item in ids:
            key = self.key(item)
            known = by_key.setdefault(key, item)
            if distinct and known is not item and known != item:
                raise ValueError(
                    f"ids {known!r} and {item!r} both have the key {key!r} "
                    f"(key={self.template!r}): give ids of one type"
                )
        return by_key

    @staticmethod
    def _by_key(answer: Any, by_key: dict[str, I], keys: list[str]) -> dict[str, Any]:
        if not isinstance(answer, Mapping):
            raise TypeError(
                f"a function decorated with cached_many_with_lock must return a mapping "
                f"id -> value, not {type(answer).__name__}"
            )
        return {key: answer[by_key[key]] for key in keys if by_key[key] in answer}

    @staticmethod
    def _by_id(values: dict[str, Any], by_key: dict[str, I]) -> dict[I, Any]:
        return {item: values[key] for key, item in by_key.items()}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.func.__qualname__} key={self.template!r}>"


class CachedManyFunction(_Many[I, V]):
    """A function of a list of ids read through a :class:`~cacheguard.CacheGuard`."""

    def __call__(self, ids: Iterable[I]) -> dict[I, V]:
        by_key = self._keys(ids, distinct=True)

        def load_many(keys: list[str]) -> dict[str, Any]:
            return self._by_key(self.func([by_key[key] for key in keys]), by_key, keys)

        typed_as = self._value_type()
        values = self.guard._get_or_load_many(
            by_key, load_many, self.ttl, self.none_ttl, self.template, typed_as
        )
        return self._by_id(values, by_key)

    def invalidate(self, ids: Iterable[I]) -> None:
        """Drop the cached values of ``ids`` (everywhere)."""
        keys = list(self._keys(ids))
        if keys:
            self.guard.invalidate(*keys, template=self.template)


class AsyncCachedManyFunction(_Many[I, V]):
    """A function of a list of ids read through an
    :class:`~cacheguard.aio.AsyncCacheGuard`; calls are awaited."""

    async def __call__(self, ids: Iterable[I]) -> dict[I, V]:
        by_key = self._keys(ids, distinct=True)

        async def load_many(keys: list[str]) -> dict[str, Any]:
            answer = await self.func([by_key[key] for key in keys])
            return self._by_key(answer, by_key, keys)

        typed_as = self._value_type()
        values = await self.guard._get_or_load_many(
            by_key, load_many, self.ttl, self.none_ttl, self.template, typed_as
        )
        return self._by_id(values, by_key)

    async def invalidate(self, ids: Iterable[I]) -> None:
        """Drop the cached values of ``ids`` (everywhere)."""
        keys = list(self._keys(ids))
        if keys:
            await self.guard.invalidate(*keys, template=self.template)


@overload
def cached_many_with_lock(
    guard: CacheGuard | None = None,
    *,
    key: str,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[[list[I]], Mapping[I, V]]], CachedManyFunction[I, V]]: ...


@overload
def cached_many_with_lock(
    guard: AsyncCacheGuard,
    *,
    key: str,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[[list[I]], Awaitable[Mapping[I, V]]]], AsyncCachedManyFunction[I, V]]: ...


def cached_many_with_lock(
    guard: CacheGuard | AsyncCacheGuard | None = None,
    *,
    key: str,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None = MISSING,
    type: Any = None,
) -> Callable[[Callable[[list[Any]], Any]], Any]:
    """Read calls of a function of a list of ids through ``guard.get_or_load_many``:
    each id's value cached under ``key`` filled with the id, the function called
    once with the ids that are not (see the module docstring and ``docs/batch.md``).
    An id the function leaves out of its mapping raises
    :class:`~cacheguard.IncompleteLoad`. The result has ``.invalidate(ids)``.

    ``type``: the values' type (see :mod:`cacheguard.codecs`); without it, ``V`` of
    a return annotation ``Mapping[I, V]`` or ``dict[I, V]`` when it names a
    dataclass, a pydantic model or a msgspec Struct that a family handles (never
    for a guard that pickles); ``False``: values as the codec stores them."""
    key_maker(key)  # a bad template fails at decoration
    if type is not None and type is not False:
        value_type(type)  # a type no family handles fails at decoration
    if guard is not None and not isinstance(guard, CacheGuard):
        async_module = sys.modules.get(_ASYNC_GUARD)
        if async_module is None or not isinstance(guard, async_module.AsyncCacheGuard):
            raise TypeError(
                f"guard must be a CacheGuard or an AsyncCacheGuard, not {guard.__class__.__name__}"
            )

    def decorate(func: Callable[[list[Any]], Any]) -> Any:
        asynchronous = is_async_callable(func)
        chosen: Any = guard
        if guard is None:
            chosen = DefaultGuard("asyncio" if asynchronous else "sync")
        elif isinstance(guard, CacheGuard):
            if asynchronous:
                raise TypeError(
                    f"{func.__qualname__} is an async def: decorate it with an AsyncCacheGuard"
                )
        elif not asynchronous:
            raise TypeError(
                f"{func.__qualname__} is not an async def: an AsyncCacheGuard reads through "
                "async functions (use a CacheGuard for plain ones)"
            )
        kind = AsyncCachedManyFunction if asynchronous else CachedManyFunction
        return kind(chosen, func, key=key, ttl=ttl, none_ttl=none_ttl, type=type)

    return decorate
