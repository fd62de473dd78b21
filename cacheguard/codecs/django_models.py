"""Django model instances as typed values: their concrete fields as plain data.

Part of the dataclass family (:class:`~cacheguard.codecs.DataclassValues`): a model
class is one more kind of value its converters know, so ``Menu``, ``list[Menu]``,
``Menu | None``, ``dict[int, Menu]`` and dataclasses holding models all work. Django
itself is never imported here: a model class exists only once Django is, and this
module is loaded only for an annotation that names one.

An instance is stored as ``{"db": its database alias, "fields": {attname: value}}``
(plus ``"deferred"``: the fields ``only()``/``defer()`` left out, never loaded to be
stored). Values the guard's codecs store as they are (str, int, float, bool, None,
bytes, datetime, date, Decimal, UUID) go as they are; a ``JSONField``'s data as its
JSON text (its encoder and decoder, as the database stores it: the codec's tagged
forms, ``{"__cg__": ...}``, in a user's JSON stay data); any other (a time, a
duration, a file's name, an array) as the field's own string (``value_to_string``),
read back by ``to_python``. A hit builds the instance as a query does
(``Model.from_db``: ``_state.adding`` False, ``_state.db`` set), so it saves as an
update. Related objects (``select_related``, prefetches) and annotations
(``annotate()``, ``extra()``) are not stored: a hit reads related objects again when
they are used, and has no annotations. Never pickle.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["is_django_model", "model_converters"]

# Stored as they are by the guard's codecs (msgpack and JSON with their extensions).
_AS_THEY_ARE = frozenset(
    {str, int, float, bool, bytes, dt.datetime, dt.date, decimal.Decimal, uuid.UUID}
)


def is_django_model(part: Any) -> bool:
    """Is ``part`` a Django model class? (False, at no cost, while Django is not loaded.)"""
    models = sys.modules.get("django.db.models")
    return models is not None and isinstance(part, type) and issubclass(part, models.Model)


def model_converters(kind: type[Any]) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """``(dump, load)`` for instances of the model class ``kind`` (exactly it: a
    subclass or proxy instance would lose its own fields or class)."""
    meta = kind._meta
    if meta.abstract:
        raise TypeError(f"cacheguard cannot cache values of type {kind.__qualname__}: abstract")
    from django.core.exceptions import ValidationError  # noqa: PLC0415  (Django is loaded)
    from django.db.models import JSONField  # noqa: PLC0415

    fields = list(meta.concrete_fields)
    attnames = [f.attname for f in fields]
    known = set(attnames)
    pk = meta.pk.attname
    as_data = {f.attname for f in fields if isinstance(f, JSONField)}
    # Per field, the type a stored value is taken as it is (no to_python call).
    exact = {f.attname: _exact_type(f) for f in fields}
    by_attname = {f.attname: f for f in fields}

    def dump(value: Any) -> Any:
        if type(value) is not kind:
            raise ValueError(
                f"expected {kind.__qualname__}, got {type(value).__name__} {value!r:.60}"
            )
        deferred = value.get_deferred_fields()
        loaded = value.__dict__
        stored: dict[str, Any] = {}
        for name, model_field in zip(attnames, fields, strict=True):
            if name in deferred:
                continue
            item = loaded[name]
            if item is not None and name in as_data:  # as text: never read as a tag
                stored[name] = json.dumps(item, cls=model_field.encoder)
            elif item is None or type(item) in _AS_THEY_ARE:
                stored[name] = item
            else:
                stored[name] = model_field.value_to_string(value)
        data: dict[str, Any] = {"db": value._state.db, "fields": stored}
        if deferred:
            data["deferred"] = sorted(deferred)
        return data

    def load(data: Any) -> Any:
        if not isinstance(data, Mapping) or not isinstance(data.get("fields"), Mapping):
            raise ValueError(f"not a stored {kind.__qualname__}: {data!r:.60}")
        stored = data["fields"]
        deferred = set(data.get("deferred") or ())
        alias = data.get("db")
        if alias is not None and not isinstance(alias, str):
            raise ValueError(f"not a database alias: {alias!r:.60}")
        unknown = (set(stored) | deferred) - known
        if unknown:
            raise ValueError(f"{kind.__qualname__} has no field {sorted(unknown)[0]!r}")
        missing = known - set(stored) - deferred
        if missing or pk not in stored:
            raise ValueError(f"{kind.__qualname__} stored without {sorted(missing or {pk})[0]!r}")
        names, values = [], []
        for name in attnames:
            if name not in stored:
                continue
            item = stored[name]
            if item is not None and name in as_data:
                if not isinstance(item, str):
                    raise ValueError(f"{kind.__qualname__}.{name}: not stored as JSON text")
                try:
                    item = json.loads(item, cls=by_attname[name].decoder)
                except ValueError as exc:
                    raise ValueError(f"{kind.__qualname__}.{name}: {exc}") from exc
            elif item is not None and type(item) is not exact[name]:
                try:
                    item = by_attname[name].to_python(item)
                except (ValidationError, TypeError) as exc:
                    raise ValueError(f"{kind.__qualname__}.{name}: {exc}") from exc
            names.append(name)
            values.append(item)
        return kind.from_db(alias, names, values)

    return dump, load


def _exact_type(model_field: Any) -> type | None:
    """The Python type a field's value has, when its ``to_python`` of a value of that
    type gives it back unchanged (the common fields); None: always ``to_python``."""
    from django.db import models  # noqa: PLC0415

    if isinstance(model_field, models.BooleanField):
        return bool
    if isinstance(model_field, models.IntegerField):  # AutoFields are IntegerFields
        return int
    if isinstance(model_field, models.FloatField):
        return float
    if isinstance(model_field, (models.CharField, models.TextField)):
        return str
    if model_field.is_relation:  # a foreign key's id: its target's type
        return _exact_type(model_field.target_field)
    return None
