"""Reads of typed values (:mod:`cacheguard.codecs`) through either guard.

The cache holds what the value type's ``dump`` made of a loaded value: plain data
its codec stores. A read gets plain data back from the guard, as any read does
(a hit, a load, a wait for another process's load, a stale or a bypass value), and
the value type makes the typed value of it. The read checks every stored value it
finds against the type (``Read.fits``): data that no longer fits (an entry stored
before the type changed) is a miss, counted as a corrupt entry, and the key is
filled once across processes as any miss is.

The sync functions take a :class:`~cacheguard.CacheGuard`, the ``a``-prefixed ones
an :class:`~cacheguard.aio.AsyncCacheGuard`; both take the value type, made once by
the caller (a loader makes it when it is made, or at its first call for a
decorator's return annotation).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cacheguard.cache.entry import MISSING, Missing
from cacheguard.checks import Seconds
from cacheguard.codecs import ValueType, names_a_family

__all__ = [
    "Fits",
    "adumping",
    "aget_or_load",
    "apeek",
    "arefresh",
    "dumping",
    "get_or_load",
    "mapping_value_type",
    "peek",
    "refresh",
    "return_value_type",
]


def return_value_type(func: Callable[..., Any], codec: object) -> ValueType | None:
    """The value type of ``func``'s return annotation (an ``async def``'s: what it
    returns when awaited) if it names a dataclass, a pydantic model or a msgspec
    Struct that a family handles. None, and values go to the codec as they are, as
    without an annotation, when it names none, cannot be resolved (a name only a
    type checker sees), names a type no family handles (a dataclass with a Path
    field), or when the guard pickles (PickleCodec keeps every type as it is)."""
    return _value_type_of(_return_annotation(func, codec))


def mapping_value_type(func: Callable[..., Any], codec: object) -> ValueType | None:
    """:func:`return_value_type` for a function returning a mapping id -> value
    (``@cached_many_with_lock``): the value type of ``V`` in a return annotation
    ``Mapping[I, V]`` or ``dict[I, V]``, under the same conditions."""
    annotation = _return_annotation(func, codec)
    origin = typing.get_origin(annotation)
    if not (isinstance(origin, type) and issubclass(origin, Mapping)):
        return None
    arguments = typing.get_args(annotation)
    return _value_type_of(arguments[1] if len(arguments) == 2 else None)


def _return_annotation(func: Callable[..., Any], codec: object) -> Any:
    """``func``'s return annotation, resolved; None without one, when it cannot be
    resolved, or when the guard pickles (PickleCodec keeps every type as it is)."""
    from cacheguard.cache.codec import PickleCodec  # noqa: PLC0415

    if isinstance(codec, PickleCodec):
        return None
    try:
        return typing.get_type_hints(func, include_extras=True).get("return")
    except Exception:  # a name only a type checker sees (TYPE_CHECKING), a bad string
        return None


def _value_type_of(annotation: Any) -> ValueType | None:
    from cacheguard.codecs import value_type  # noqa: PLC0415  (only for annotated functions)

    if annotation is None or not names_a_family(annotation):
        return None
    try:
        return value_type(annotation)
    except TypeError:  # no family handles it: as before typed values, as it is
        return None


def dumping(values: ValueType, load: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: values.dump(load())


class Fits:
    """A typed read's check of stored values (``Read.fits``): converts them, and
    keeps the last conversion so the value served is not converted twice."""

    __slots__ = ("data", "value", "values")

    def __init__(self, values: ValueType) -> None:
        self.values = values
        self.data: Any = _NOTHING
        self.value: Any = None

    def __call__(self, data: Any) -> bool:
        try:
            self.value = self.values.load(data)
        except ValueError:
            return False
        self.data = data
        return True

    def load(self, data: Any) -> Any:
        """``data`` as the type: the checked conversion when it is the data checked."""
        return self.value if data is self.data else self.values.load(data)


_NOTHING = object()


def get_or_load(
    guard: Any,  # a CacheGuard (it calls in here: not imported)
    values: ValueType,
    name: str,
    load: Callable[[], Any],
    *,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None,
    template: str | None,
) -> Any:
    """``guard.get_or_load`` of a typed value: stored data that does not fit the type
    is a miss inside the read (filled once across processes, as a corrupt entry is)."""
    dumped = dumping(values, load)
    fits = Fits(values)
    data = guard._get_or_load(name, dumped, ttl, none_ttl, template, fits)
    try:
        return fits.load(data)
    except ValueError:  # shared by an untyped read of the key in this process: load again
        data = guard.refresh(name, dumped, ttl=ttl, none_ttl=none_ttl, template=template)
        return values.load(data)


def refresh(
    guard: Any,  # a CacheGuard (it calls in here: not imported)
    values: ValueType,
    name: str,
    load: Callable[[], Any],
    *,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None,
    template: str | None,
) -> Any:
    """``guard.refresh`` of a typed value."""
    dumped = dumping(values, load)
    return values.load(guard.refresh(name, dumped, ttl=ttl, none_ttl=none_ttl, template=template))


def peek(guard: Any, values: ValueType, name: str, *, template: str | None) -> Any:
    """``guard.peek`` of a typed value: :data:`MISSING` also for data that no longer
    fits the type (a read would load it again)."""
    data = guard.peek(name, template=template)
    if data is MISSING:
        return MISSING
    try:
        return values.load(data)
    except ValueError:
        return MISSING


def adumping(values: ValueType, load: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def dumped() -> Any:
        value = load()
        if inspect.isawaitable(value):
            value = await value
        return values.dump(value)

    return dumped


async def aget_or_load(
    guard: Any,  # an AsyncCacheGuard
    values: ValueType,
    name: str,
    load: Callable[[], Any],
    *,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None,
    template: str | None,
) -> Any:
    """``await guard.get_or_load`` of a typed value (see :func:`get_or_load`)."""
    dumped = adumping(values, load)
    fits = Fits(values)
    data = await guard._get_or_load(name, dumped, ttl, none_ttl, template, fits)
    try:
        return fits.load(data)
    except ValueError:  # shared by an untyped read of the key in this process: load again
        data = await guard.refresh(name, dumped, ttl=ttl, none_ttl=none_ttl, template=template)
        return values.load(data)


async def arefresh(
    guard: Any,  # an AsyncCacheGuard
    values: ValueType,
    name: str,
    load: Callable[[], Any],
    *,
    ttl: Seconds,
    none_ttl: Seconds | Missing | None,
    template: str | None,
) -> Any:
    """``await guard.refresh`` of a typed value."""
    dumped = adumping(values, load)
    data = await guard.refresh(name, dumped, ttl=ttl, none_ttl=none_ttl, template=template)
    return values.load(data)


async def apeek(guard: Any, values: ValueType, name: str, *, template: str | None) -> Any:
    """``await guard.peek`` of a typed value (see :func:`peek`)."""
    data = await guard.peek(name, template=template)
    if data is MISSING:
        return MISSING
    try:
        return values.load(data)
    except ValueError:
        return MISSING
