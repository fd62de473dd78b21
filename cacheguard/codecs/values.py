"""The value types of :mod:`cacheguard.codecs`: one class per family, and
:func:`value_type`, which picks the family from an annotation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from cacheguard.exceptions import SerializationError

__all__ = [
    "DataclassValues",
    "MsgspecValues",
    "PydanticValues",
    "ValueType",
    "names_a_family",
    "value_type",
]

T = TypeVar("T")

# What the guard's codecs store as they are (msgpack and JSON with their extensions).
_SCALARS: tuple[type, ...] = (
    str,
    int,
    float,
    bool,
    bytes,
    dt.datetime,
    dt.date,
    decimal.Decimal,
    uuid.UUID,
)
_NONE = type(None)


class ValueType(Protocol):
    """How the values of one annotated type become plain data and back."""

    annotation: Any

    def dump(self, value: Any) -> Any:
        """Plain data for the guard's codec; :class:`SerializationError` for a value
        not of the type (a loader that returned something else)."""

    def load(self, data: Any) -> Any:
        """A value of the type from what a hit decoded; ``ValueError`` if it does not fit."""


# -- picking a family -----------------------------------------------------------------------


def _parts(annotation: Any) -> Iterator[Any]:
    """``annotation`` and every type it is made of (arguments of generics, unions,
    ``Annotated``'s first; not the fields of classes)."""
    yield annotation
    for argument in typing.get_args(annotation):
        if argument is not Ellipsis and not isinstance(argument, (str, int, bytes)):
            yield from _parts(argument)


def _is_pydantic_model(part: Any) -> bool:
    pydantic = sys.modules.get("pydantic")  # a model exists only once pydantic is imported
    return pydantic is not None and isinstance(part, type) and issubclass(part, pydantic.BaseModel)


def _is_struct(part: Any) -> bool:
    msgspec = sys.modules.get("msgspec")
    return msgspec is not None and isinstance(part, type) and issubclass(part, msgspec.Struct)


def _is_django_model(part: Any) -> bool:
    # A model class exists only once Django is imported: no import here otherwise.
    if sys.modules.get("django.db.models") is None:
        return False
    from cacheguard.codecs.django_models import is_django_model  # noqa: PLC0415

    return is_django_model(part)


def _family(annotation: Any) -> str | None:
    parts = list(_parts(annotation))
    if any(_is_pydantic_model(part) for part in parts):
        return "pydantic"
    if any(_is_struct(part) for part in parts):
        return "msgspec"
    if any(
        (dataclasses.is_dataclass(part) and isinstance(part, type)) or _is_django_model(part)
        for part in parts
    ):
        return "dataclass"  # Django models are converted field by field as dataclasses are
    return None


def names_a_family(annotation: Any) -> bool:
    """Does ``annotation`` name a dataclass, a pydantic model, a msgspec Struct or a
    Django model? (What ``@cached_with_lock`` looks for in a return annotation.)"""
    return _family(annotation) is not None


def value_type(annotation: Any) -> ValueType:
    """The value type of ``annotation`` (see :mod:`cacheguard.codecs`); ``TypeError``
    when no family handles it. Made once per hashable annotation."""
    try:
        return _cached_value_type(annotation)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _make_value_type(annotation)


@functools.lru_cache(maxsize=512)
def _cached_value_type(annotation: Any) -> ValueType:
    return _make_value_type(annotation)


def _make_value_type(annotation: Any) -> ValueType:
    family = _family(annotation)
    if family == "pydantic":
        return PydanticValues(annotation)
    if family == "msgspec":
        return MsgspecValues(annotation)
    return DataclassValues(annotation)


# -- pydantic and msgspec: their own JSON -----------------------------------------------------


class PydanticValues:
    """A value checked and serialised by pydantic (``TypeAdapter``): stored as
    pydantic's JSON of it, read back with ``validate_json`` (strict models included)."""

    def __init__(self, annotation: Any) -> None:
        import pydantic  # noqa: PLC0415  (the optional extra, imported when used)

        self.annotation = annotation
        self._adapter = pydantic.TypeAdapter(annotation)
        try:  # a None stays None (the guard's none_ttl applies to it)
            self._adapter.validate_python(None)
            self._nullable = True
        except pydantic.ValidationError:
            self._nullable = False

    def dump(self, value: Any) -> Any:
        import pydantic_core  # noqa: PLC0415

        if value is None and self._nullable:
            return None
        try:
            return self._adapter.dump_json(value, warnings="error").decode()
        except pydantic_core.PydanticSerializationError as exc:
            raise SerializationError(_not_of_the_type(value, self.annotation, exc)) from exc

    def load(self, data: Any) -> Any:
        if data is None and self._nullable:
            return None
        if not isinstance(data, str):
            raise ValueError(
                f"not pydantic JSON of {_name(self.annotation)}: {type(data).__name__}"
            )
        return self._adapter.validate_json(data)  # a ValidationError is a ValueError


class MsgspecValues:
    """A value checked and serialised by msgspec: stored as msgspec's JSON of it,
    read back with ``msgspec.json.decode(type=...)``."""

    def __init__(self, annotation: Any) -> None:
        import msgspec  # noqa: PLC0415  (the optional extra, imported when used)

        self.annotation = annotation
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(annotation)
        try:  # a None stays None (the guard's none_ttl applies to it)
            msgspec.convert(None, annotation)
            self._nullable = True
        except msgspec.ValidationError:
            self._nullable = False

    def dump(self, value: Any) -> Any:
        if value is None and self._nullable:
            return None
        try:
            return self._encoder.encode(value).decode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(_not_of_the_type(value, self.annotation, exc)) from exc

    def load(self, data: Any) -> Any:
        if data is None and self._nullable:
            return None
        if not isinstance(data, str):
            raise ValueError(f"not the JSON of {_name(self.annotation)}: {type(data).__name__}")
        return self._decoder.decode(data)  # msgspec.ValidationError is a ValueError


# -- dataclasses and plain types: converted field by field -------------------------------------

Convert = Callable[[Any], Any]
Seen = dict[Any, tuple[Convert, Convert]]  # the converters of the dataclasses met so far


class DataclassValues:
    """Dataclasses, Django models and plain types, by the standard library alone: a
    dataclass becomes a dict of its fields (each converted by its annotation), a
    Django model instance a dict of its concrete fields (see
    :mod:`cacheguard.codecs.django_models`), enums their value, sets and tuples
    lists; ``load`` rebuilds and checks every part."""

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self._dump, self._load = _converters(annotation, {})

    def dump(self, value: Any) -> Any:
        try:
            return self._dump(value)
        except ValueError as exc:
            raise SerializationError(_not_of_the_type(value, self.annotation, exc)) from exc

    def load(self, data: Any) -> Any:
        return self._load(data)


def _converters(annotation: Any, seen: Seen) -> tuple[Convert, Convert]:
    """``(dump, load)`` for ``annotation``; ``seen`` ties recursive dataclasses."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or annotation is object:
        return _same, _same
    if annotation is None or annotation is _NONE:
        return _checked(_NONE), _checked(_NONE)
    if origin is typing.Annotated:
        return _converters(arguments[0], seen)
    if origin is typing.Literal:
        return _literal(arguments), _literal(arguments)
    if origin in (typing.Union, types.UnionType):
        return _union(annotation, arguments, seen)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum(annotation)
    if annotation is float:
        return _float, _float  # an int is a float where Python's typing says so
    if isinstance(annotation, type) and annotation in _SCALARS:
        return _checked(annotation), _checked(annotation)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass(annotation, seen)
    if _is_django_model(annotation):
        from cacheguard.codecs.django_models import model_converters  # noqa: PLC0415

        return model_converters(annotation)
    if origin in (list, set, frozenset) or annotation in (list, set, frozenset):
        item = arguments[0] if arguments else Any
        return _sequence(origin or annotation, item, seen)
    if origin is tuple or annotation is tuple:
        return _tuple(arguments, seen)
    if origin is dict or annotation is dict:
        key, item = arguments if arguments else (Any, Any)
        return _dict(key, item, seen)
    raise TypeError(
        f"cacheguard cannot cache values of type {_name(annotation)}: use a dataclass, a "
        "pydantic model, a msgspec Struct, plain data (str, int, float, bool, None, bytes, "
        "datetime, date, Decimal, UUID, enums, lists, tuples, sets and dicts of them) or "
        "PickleCodec for anything else"
    )


def _not_of_the_type(value: Any, annotation: Any, exc: BaseException) -> str:
    return (
        f"cannot store {value!r:.80} as {_name(annotation)}: {exc} (a decorated "
        "function's return annotation names the type: fix it, or pass type=False to "
        "store the values as they are)"
    )


def _name(annotation: Any) -> str:
    return getattr(annotation, "__qualname__", None) or repr(annotation)


def _same(value: Any) -> Any:
    return value


def _checked(kind: type | tuple[type, ...]) -> Convert:
    bools = kind is bool or (isinstance(kind, tuple) and bool in kind)

    def check(value: Any) -> Any:
        if isinstance(value, bool) and not bools:  # a bool is an int, not for us
            raise _mismatch(kind, value)
        if not isinstance(value, kind):
            raise _mismatch(kind, value)
        return value

    check.exact = kind  # type: ignore[attr-defined]  # a value of exactly it passes as it is
    return check


def _mismatch(kind: Any, value: Any) -> ValueError:
    # ValueError: on load, data that does not fit is a miss; on dump, made TypeError above.
    return ValueError(f"expected {_name(kind)}, got {type(value).__name__} {value!r:.60}")


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _mismatch(float, value)
    return float(value)  # JSON and msgpack may hand back 2.0 as 2


def _literal(allowed: tuple[Any, ...]) -> Convert:
    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"expected one of {allowed!r}, got {value!r:.60}")
        return value

    return check


def _enum(kind: type[enum.Enum]) -> tuple[Convert, Convert]:
    if not all(isinstance(member.value, (str, int, float, _NONE)) for member in kind):
        raise TypeError(
            f"cacheguard cannot cache values of type {_name(kind)}: an enum is stored by "
            "its value, and its values are not all str, int, float or None"
        )

    def dump(value: Any) -> Any:
        if not isinstance(value, kind):
            raise _mismatch(kind, value)
        return value.value

    return dump, kind


def _union(annotation: Any, arguments: tuple[Any, ...], seen: Seen) -> tuple[Convert, Convert]:
    others = [argument for argument in arguments if argument is not _NONE]
    optional = len(others) < len(arguments)
    if len(others) == 1:
        dump_one, load_one = _converters(others[0], seen)
    elif all(isinstance(other, type) and other in _SCALARS for other in others):
        dump_one = load_one = _checked(tuple(others))
    else:
        raise TypeError(
            f"cacheguard cannot cache values of type {annotation!r}: a union of several "
            "classes is ambiguous once stored (a dataclass or X | None is not); use a "
            "pydantic model or a msgspec Struct with a discriminator"
        )
    if not optional:
        return dump_one, load_one
    return (
        lambda value: None if value is None else dump_one(value),
        lambda data: None if data is None else load_one(data),
    )


def _dataclass(kind: type, seen: Seen) -> tuple[Convert, Convert]:
    if kind in seen:  # a recursive dataclass: the converters being made, looked up late
        # (late: the lambdas look the pair up when called, once it is complete)
        return (lambda value: seen[kind][0](value)), (lambda data: seen[kind][1](data))  # noqa: PLW0108
    seen[kind] = (_same, _same)  # replaced below, before any call
    try:
        hints = typing.get_type_hints(kind)
    except (NameError, TypeError) as exc:
        raise TypeError(f"cannot read the annotations of {_name(kind)}: {exc}") from exc
    for extra in getattr(kind, "__dataclass_fields__", {}).values():
        if (
            extra._field_type is dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
            and extra.default is dataclasses.MISSING
            and extra.default_factory is dataclasses.MISSING
        ):
            raise TypeError(
                f"cacheguard cannot cache values of type {_name(kind)}: its InitVar "
                f"{extra.name!r} has no default, and is not stored (it is no field)"
            )
    fields = [f for f in dataclasses.fields(kind) if f.init]
    converters = {f.name: _converters(hints.get(f.name, Any), seen) for f in fields}
    dumps = [
        (name, convert[0], getattr(convert[0], "exact", None))
        for name, convert in converters.items()
    ]
    # Per field: the loader, and the type a value passes as it is (a str for a str
    # field): the common case costs a type check, not a call.
    loads = {
        name: (convert[1], getattr(convert[1], "exact", None))
        for name, convert in converters.items()
    }

    def dump(value: Any) -> Any:
        if type(value) is not kind:
            raise _mismatch(kind, value)
        plain = {}
        for name, convert, exact in dumps:
            item = getattr(value, name)
            plain[name] = item if type(item) is exact else convert(item)
        return plain

    def load(data: Any) -> Any:
        if type(data) is not dict and not isinstance(data, Mapping):  # (an ABC check is slow)
            raise _mismatch(dict, data)
        arguments = {}
        for name, item in data.items():
            found = loads.get(name)
            if found is None:
                raise ValueError(f"{_name(kind)} has no field {name!r}")
            arguments[name] = item if type(item) is found[1] else found[0](item)
        try:
            return kind(**arguments)
        except TypeError as exc:  # a field without a default is missing
            raise ValueError(f"cannot make a {_name(kind)}: {exc}") from exc

    seen[kind] = (dump, load)
    return dump, load


def _sequence(kind: Any, item: Any, seen: Seen) -> tuple[Convert, Convert]:
    dump_item, load_item = _converters(item, seen)

    def dump(value: Any) -> Any:
        if not isinstance(value, kind):
            raise _mismatch(kind, value)
        return [dump_item(element) for element in value]

    def load(data: Any) -> Any:
        if not isinstance(data, list):
            raise _mismatch(list, data)
        loaded = [load_item(element) for element in data]
        return loaded if kind is list else kind(loaded)

    return dump, load


def _tuple(arguments: tuple[Any, ...], seen: Seen) -> tuple[Convert, Convert]:
    if not arguments or (len(arguments) == 2 and arguments[1] is Ellipsis):
        dump_items, load_items = _sequence(tuple, arguments[0] if arguments else Any, seen)
        return dump_items, load_items
    each = [_converters(argument, seen) for argument in arguments]

    def dump(value: Any) -> Any:
        if not isinstance(value, tuple) or len(value) != len(each):
            raise _mismatch(tuple, value)
        return [convert[0](element) for convert, element in zip(each, value, strict=True)]

    def load(data: Any) -> Any:
        if not isinstance(data, list) or len(data) != len(each):
            raise _mismatch(tuple, data)
        return tuple(convert[1](element) for convert, element in zip(each, data, strict=True))

    return dump, load


def _dict(key: Any, item: Any, seen: Seen) -> tuple[Convert, Convert]:
    dump_key, load_key = _converters(key, seen)
    if key in (int, float):  # JSON stores every key as a string: read it back as one
        load_key = _number_key(key, load_key)
    dump_item, load_item = _converters(item, seen)

    def dump(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _mismatch(dict, value)
        return {dump_key(k): dump_item(v) for k, v in value.items()}

    def load(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _mismatch(dict, data)
        return {load_key(k): load_item(v) for k, v in data.items()}

    return dump, load


def _number_key(kind: type, load: Convert) -> Convert:
    def key(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                raise _mismatch(kind, value) from None
        return load(value)

    return key
