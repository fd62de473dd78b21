"""Typed values: dataclasses, pydantic models and msgspec Structs in the cache, read
back as the type they were stored as. Never pickle.

A guard's codec (:mod:`cacheguard.cache.codec`) turns plain data into bytes. A
*value type* stands in front of it for one annotated type: ``dump`` turns a value of
the type into plain data for the codec, ``load`` turns what a hit decoded back into
a value of the type, checking it as it goes. One family per value type, chosen from
the annotation by :func:`value_type`:

* an annotation naming a pydantic model anywhere (``Menu``, ``list[Menu]``,
  ``dict[str, Menu]``, ``Menu | None``): :class:`PydanticValues`, pydantic's own
  JSON for the whole value (its ``TypeAdapter``; the extra ``pydantic``);
* one naming a msgspec ``Struct``: :class:`MsgspecValues`, msgspec's JSON (the
  extra ``msgspec``);
* one naming a dataclass, or plain types only: :class:`DataclassValues`, the
  standard library's ``dataclasses``, each field converted by its own annotation
  (the codec's types: str, int, float, bool, None, bytes, datetime, date,
  Decimal, UUID; enums by value; lists, tuples, sets, dicts, ``X | None``);
* one naming a Django model (``Menu``, ``list[Menu]``, ``Menu | None``): the same
  family, each instance its concrete fields' values, read back as the instance a
  query returns (:mod:`cacheguard.codecs.django_models`; found only once Django is
  imported, never importing it).

``@cached_with_lock`` takes the value type from the function's return annotation
when it names a dataclass, a model (pydantic or Django) or a Struct that a family handles (``async
def``: the awaited type; not for a guard with PickleCodec; ``type=False``: never);
``CacheLoader``, ``get_or_load``, ``refresh`` and ``peek`` take it as ``type=``. A
type no family handles raises ``TypeError`` when it is given. Stored data that no
longer fits the type (the type changed between deploys) is a miss, filled once
across processes (see :mod:`cacheguard.cache.typed`).
"""

from __future__ import annotations

from cacheguard.codecs.values import (
    DataclassValues,
    MsgspecValues,
    PydanticValues,
    ValueType,
    names_a_family,
    value_type,
)

__all__ = [
    "DataclassValues",
    "MsgspecValues",
    "PydanticValues",
    "ValueType",
    "names_a_family",
    "value_type",
]
