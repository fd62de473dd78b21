"""Typed values (issue #26): dataclasses, pydantic models and msgspec Structs are
stored as plain data (never pickled) and read back as their type, through both
guards, the loaders and the decorator; the family is picked from the annotation;
data that no longer fits the type is loaded again; types no family handles are
refused clearly."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import threading
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import pydantic
import pytest

from cacheguard import (
    MISSING,
    CacheGuard,
    CacheLoader,
    JsonCodec,
    PickleCodec,
    SerializationError,
    cached_with_lock,
)
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader
from cacheguard.codecs import (
    DataclassValues,
    MsgspecValues,
    PydanticValues,
    names_a_family,
    value_type,
)

T = TypeVar("T")


class Course(enum.Enum):
    STARTER = "starter"
    MAIN = "main"


@dataclasses.dataclass(frozen=True)
class Dish:
    name: str
    price: decimal.Decimal
    course: Course = Course.MAIN
    tags: frozenset[str] = frozenset()


@dataclasses.dataclass
class Menu:
    id: int
    name: str
    dishes: list[Dish]
    updated: dt.datetime
    score: float = 0.0
    parent: Menu | None = None
    code: uuid.UUID | None = None
    size: tuple[int, int] = (1, 1)


class MenuModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)  # strict: datetime from JSON only
    id: int
    name: str
    updated: dt.datetime


class MenuStruct(msgspec.Struct):
    id: int
    name: str
    updated: dt.datetime


NOW = dt.datetime(2026, 11, 26, 12, 30, tzinfo=dt.timezone.utc)


def _menu(menu_id: int = 7) -> Menu:
    starter = Dish("Soup", decimal.Decimal("4.50"), Course.STARTER, frozenset({"hot"}))
    return Menu(
        menu_id,
        "Lunch",
        [starter, Dish("Fish", decimal.Decimal("12"))],
        NOW,
        score=4,  # an int where a float is annotated: read back as 4.0
        parent=Menu(1, "All day", [], NOW),
        code=uuid.UUID(int=menu_id),
        size=(2, 3),
    )


# -- the value types, without Redis -------------------------------------------------------------


def test_the_family_is_picked_from_the_annotation() -> None:
    assert isinstance(value_type(Menu), DataclassValues)
    assert isinstance(value_type(list[Menu] | None), DataclassValues)
    assert isinstance(value_type(dict[str, MenuModel]), PydanticValues)
    assert isinstance(value_type(list[MenuStruct]), MsgspecValues)
    assert isinstance(value_type(int), DataclassValues)  # plain types: checked, as they are
    assert names_a_family(list[Menu])
    assert names_a_family(MenuModel | None)
    assert not names_a_family(list[dict[str, int]])
    assert not names_a_family(int)
    assert value_type(list[Menu]) is value_type(list[Menu])  # made once


def test_dataclasses_round_trip_as_plain_data() -> None:
    values = value_type(Menu)
    plain = values.dump(_menu())
    assert plain["dishes"][0] == {
        "name": "Soup",
        "price": decimal.Decimal("4.50"),
        "course": "starter",
        "tags": ["hot"],
    }
    assert plain["size"] == [2, 3]
    back = values.load(plain)
    assert back == dataclasses.replace(_menu(), score=4.0)
    assert isinstance(back.score, float)
    assert type(back.dishes[0].tags) is frozenset
    assert type(back.size) is tuple
    assert values.load(values.dump(_menu())) == back


def test_data_that_does_not_fit_the_type_is_a_value_error() -> None:
    values = value_type(Menu)
    plain = values.dump(_menu())
    for broken in (
        {**plain, "id": "seven"},  # a field of another type
        {k: v for k, v in plain.items() if k != "name"},  # a field without default missing
        {**plain, "spicy": True},  # a field the type no longer has
        {**plain, "dishes": [{"name": "Soup"}]},  # a nested one incomplete
        {**plain, "updated": "yesterday"},
        ["not", "a", "dict"],
        {**plain, "dishes": [{**plain["dishes"][0], "course": "dessert"}]},  # no such enum
    ):
        with pytest.raises(ValueError):  # noqa: PT011  (the message is the type's business)
            values.load(broken)
    assert value_type(bool).load(True) is True
    with pytest.raises(ValueError):  # noqa: PT011
        value_type(int).load(True)  # a bool is not an int here


def test_a_value_not_of_the_type_is_refused_when_stored() -> None:
    with pytest.raises(SerializationError, match=r"cannot store .* as Menu"):
        value_type(Menu).dump({"id": 7})
    with pytest.raises(SerializationError, match="MenuModel"):
        value_type(MenuModel).dump({"id": 7})
    with pytest.raises(SerializationError, match="MenuStruct"):
        value_type(MenuStruct).dump(object())


class Opaque:
    pass


def test_types_no_family_handles_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match=r"cannot cache values of type Opaque.*PickleCodec"):
        value_type(Opaque)
    with pytest.raises(TypeError, match="cannot cache values of type Opaque"):
        value_type(list[Opaque])
    with pytest.raises(TypeError, match="ambiguous"):
        value_type(Menu | Dish)
    assert value_type(Literal["a", "b"]).load("a") == "a"


def test_pydantic_and_msgspec_use_their_own_json() -> None:
    model = MenuModel(id=1, name="Lunch", updated=NOW)
    stored = value_type(list[MenuModel]).dump([model])
    assert isinstance(stored, str)
    assert value_type(list[MenuModel]).load(stored) == [model]  # strict: parsed from JSON
    struct = MenuStruct(id=1, name="Lunch", updated=NOW)
    assert value_type(MenuStruct | None).load(value_type(MenuStruct | None).dump(struct)) == struct
    assert value_type(MenuStruct | None).load(value_type(MenuStruct | None).dump(None)) is None
    with pytest.raises(ValueError):  # noqa: PT011
        value_type(MenuModel).load('{"id": "x"}')
    with pytest.raises(ValueError):  # noqa: PT011
        value_type(MenuStruct).load({"id": 1})  # not JSON: stored by something else


# -- through the guards, both drivers ----------------------------------------------------------

KINDS = ("sync", "async")


def _run(kind: str, redis_url: str, namespace: str, test: Callable[..., Awaitable[None]]) -> None:
    async def main() -> None:
        if kind == "sync":
            with CacheGuard.from_url(redis_url, namespace=namespace) as guard:
                await test(guard, asyncio.to_thread)
        else:
            async with AsyncCacheGuard.from_url(redis_url, namespace=namespace) as aguard:

                async def call(f: Callable[..., Any], *a: Any, **k: Any) -> Any:
                    return await f(*a, **k)

                await test(aguard, call)

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_get_or_load_refresh_and_peek_read_typed_values(
    kind: str, redis_url: str, namespace: str
) -> None:
    loads: list[int] = []

    def load() -> list[Menu]:
        loads.append(1)
        return [_menu(7), _menu(8)]

    async def test(guard: Any, call: Callable[..., Awaitable[Any]]) -> None:
        kw = {"ttl": 60, "type": list[Menu]}
        first = await call(guard.get_or_load, "menus", load, **kw)
        hit = await call(guard.get_or_load, "menus", load, **kw)
        assert first == hit == [dataclasses.replace(_menu(n), score=4.0) for n in (7, 8)]
        assert isinstance(hit[0], Menu)
        assert isinstance(hit[0].dishes[0], Dish)
        assert loads == [1]
        plain = await call(guard.peek, "menus")  # stored as plain data: no pickle
        assert isinstance(plain, list)
        assert plain[0]["dishes"][0]["course"] == "starter"
        assert await call(guard.peek, "menus", type=list[Menu]) == hit
        assert await call(guard.refresh, "menus", load, **kw) == hit
        assert loads == [1, 1]
        assert await call(guard.peek, "other", type=Menu) is MISSING

    _run(kind, redis_url, namespace, test)


@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_stored_before_its_type_changed_is_loaded_again(
    kind: str, redis_url: str, namespace: str
) -> None:
    @dataclasses.dataclass
    class MenuV2:
        id: int
        title: str  # was "name"

    loads: list[str] = []

    def load_v2() -> MenuV2:
        loads.append("v2")
        return MenuV2(7, "Lunch")

    async def test(guard: Any, call: Callable[..., Awaitable[Any]]) -> None:
        await call(guard.get_or_load, "menu:7", lambda: _menu(7), ttl=60, type=Menu)
        assert await call(guard.peek, "menu:7", type=MenuV2) is MISSING  # does not fit
        assert await call(guard.get_or_load, "menu:7", load_v2, ttl=60, type=MenuV2) == MenuV2(
            7, "Lunch"
        )
        assert loads == ["v2"]  # not served: loaded again and stored over it
        assert await call(guard.get_or_load, "menu:7", load_v2, ttl=60, type=MenuV2) == MenuV2(
            7, "Lunch"
        )
        assert loads == ["v2"]  # then a hit
        stats = guard.stats()
        # the old data was a miss (counted as an entry that does not decode), never served
        assert (stats.corrupt_entries, stats.l2_hits) == (1, 1)

    _run(kind, redis_url, namespace, test)


@pytest.mark.parametrize("kind", KINDS)
def test_loaders_and_decorators_read_their_annotated_type(
    kind: str, redis_url: str, namespace: str
) -> None:
    loads: list[str] = []

    async def test(guard: Any, call: Callable[..., Awaitable[Any]]) -> None:
        if kind == "sync":

            @cached_with_lock(guard, key="model:{menu_id}", ttl=60)
            def model(menu_id: int) -> MenuModel | None:
                loads.append("model")
                return MenuModel(id=menu_id, name="Lunch", updated=NOW)

            @cached_with_lock(guard, key="struct:{menu_id}", ttl=60)
            def struct(menu_id: int) -> list[MenuStruct]:
                loads.append("struct")
                return [MenuStruct(id=menu_id, name="Lunch", updated=NOW)]

            loader = CacheLoader(
                guard, key="dish:{n}", load=lambda n: Dish(n, decimal.Decimal(1)), ttl=60, type=Dish
            )
        else:

            @cached_with_lock(guard, key="model:{menu_id}", ttl=60)
            async def model(menu_id: int) -> MenuModel | None:
                loads.append("model")
                return MenuModel(id=menu_id, name="Lunch", updated=NOW)

            @cached_with_lock(guard, key="struct:{menu_id}", ttl=60)
            async def struct(menu_id: int) -> list[MenuStruct]:
                loads.append("struct")
                return [MenuStruct(id=menu_id, name="Lunch", updated=NOW)]

            loader = AsyncCacheLoader(
                guard, key="dish:{n}", load=lambda n: Dish(n, decimal.Decimal(1)), ttl=60, type=Dish
            )
        for _ in range(2):
            assert await call(model, 1) == MenuModel(id=1, name="Lunch", updated=NOW)
            assert await call(struct, 2) == [MenuStruct(id=2, name="Lunch", updated=NOW)]
            assert await call(loader.get, "Soup") == Dish("Soup", decimal.Decimal(1))
        assert loads == ["model", "struct"]  # the second round: hits, decoded to the type
        assert isinstance(await call(guard.peek, "model:1"), str)  # pydantic's JSON
        assert await call(model.peek, 1) == MenuModel(id=1, name="Lunch", updated=NOW)
        assert await call(loader.peek, "Soup") == Dish("Soup", decimal.Decimal(1))
        assert await call(model.refresh, 1) == MenuModel(id=1, name="Lunch", updated=NOW)
        assert loads == ["model", "struct", "model"]

    _run(kind, redis_url, namespace, test)


def test_a_decorated_function_without_a_family_annotation_stores_its_values_as_they_are(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="plain", ttl=60)
        def plain() -> dict[str, int]:
            return {"a": 1}

        @cached_with_lock(guard, key="unresolved", ttl=60)
        def unresolved() -> NotDefinedAnywhere:  # type: ignore[name-defined]  # noqa: F821
            return {"b": 2}  # type: ignore[no-any-return]

        assert plain() == plain() == {"a": 1}
        assert unresolved() == unresolved() == {"b": 2}
        assert guard.peek("unresolved") == {"b": 2}


def test_a_loader_returning_another_type_fails_and_caches_nothing(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="wrong", ttl=60)
        def wrong() -> Menu:
            return {"id": 7}  # type: ignore[return-value]

        with pytest.raises(SerializationError, match="as Menu"):
            wrong()
        assert guard.peek("wrong") is MISSING
        assert guard.peek_entry("wrong") is None  # nothing stored
    with pytest.raises(TypeError, match="Opaque"):
        CacheLoader(guard, key="o", load=Opaque, ttl=60, type=Opaque)


@dataclasses.dataclass
class Shape:
    a: int
    b: int  # a field the stored entries below do not have


@pytest.mark.parametrize("kind", KINDS)
def test_readers_of_an_entry_stored_before_its_type_changed_load_it_once(
    kind: str, redis_url: str, namespace: str
) -> None:
    # After a deploy that changed a type, every hot key holds data of the old shape:
    # the readers must not each load it (one load, the others wait for it, as for
    # any miss), in one process and across guards (processes).
    loads: list[int] = []

    def load() -> Shape:
        loads.append(1)
        threading.Event().wait(0.05)  # a database query: the others arrive meanwhile
        return Shape(1, 2)

    with CacheGuard.from_url(redis_url, namespace=namespace) as old:
        old.get_or_load("shape", lambda: {"a": 1}, ttl=60)  # the old shape, stored

    async def main() -> list[Any]:
        if kind == "sync":
            guards = [CacheGuard.from_url(redis_url, namespace=namespace) for _ in range(2)]
            try:
                calls = [
                    asyncio.to_thread(guards[i % 2].get_or_load, "shape", load, ttl=60, type=Shape)
                    for i in range(20)
                ]
                return list(await asyncio.gather(*calls))
            finally:
                for guard in guards:
                    guard.close()
        aguards = [AsyncCacheGuard.from_url(redis_url, namespace=namespace) for _ in range(2)]
        try:
            return list(
                await asyncio.gather(
                    *(
                        aguards[i % 2].get_or_load("shape", load, ttl=60, type=Shape)
                        for i in range(20)
                    )
                )
            )
        finally:
            for aguard in aguards:
                await aguard.aclose()

    assert asyncio.run(main()) == [Shape(1, 2)] * 20
    assert loads == [1]  # filled once, as any miss


class Size(enum.Enum):
    SMALL = (1, 2)  # a value no codec keeps as it is


@dataclasses.dataclass
class WithInitVar:
    a: int
    scale: dataclasses.InitVar[int]


@dataclasses.dataclass
class Report:
    path: Path  # no family handles a Path: a pickling guard keeps it as it is


def test_types_whose_values_would_not_come_back_are_refused_when_given() -> None:
    with pytest.raises(TypeError, match="enum is stored by its value"):
        value_type(Size)
    with pytest.raises(TypeError, match="InitVar 'scale' has no default"):
        value_type(WithInitVar)
    assert value_type(bool | str).dump(True) is True  # a bool where the union has bool
    assert value_type(bool | str).load("x") == "x"
    with pytest.raises(SerializationError):
        value_type(int | str).dump(True)


def test_int_keys_come_back_from_the_json_codec(redis_url: str, namespace: str) -> None:
    loads: list[int] = []

    def load() -> dict[int, str]:
        loads.append(1)
        return {1: "a", 2: "b"}

    with CacheGuard.from_url(redis_url, namespace=namespace, codec=JsonCodec()) as guard:
        for _ in range(3):
            assert guard.get_or_load("ints", load, ttl=60, type=dict[int, str]) == {1: "a", 2: "b"}
        assert loads == [1]  # JSON made the keys strings: read back as ints, a hit
        assert guard.stats().corrupt_entries == 0


@pytest.mark.parametrize(
    "annotation",
    [MenuModel | None, MenuStruct | None, Menu | None],
    ids=["pydantic", "msgspec", "dataclass"],
)
def test_none_keeps_none_ttl_in_every_family(
    annotation: Any, redis_url: str, namespace: str
) -> None:
    loads: list[int] = []

    def load() -> None:
        loads.append(1)

    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:
        for _ in range(2):
            assert guard.get_or_load("none", load, ttl=60, none_ttl=None, type=annotation) is None
        assert loads == [1, 1]  # none_ttl=None: a None is never cached
        assert guard.get_or_load("kept", load, ttl=60, none_ttl=30, type=annotation) is None
        assert guard.peek("kept") is None  # stored as None, not as the JSON "null"


def test_decorators_infer_only_what_a_family_handles_and_type_false_opts_out(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(
        redis_url, namespace=namespace, codec=PickleCodec(hmac_key=b"k" * 32)
    ) as pickling:

        @cached_with_lock(pickling, key="report", ttl=60)
        def report() -> Report:
            return Report(Path("/tmp/x"))

        assert report() == report() == Report(Path("/tmp/x"))  # pickled, as before

        @cached_with_lock(pickling, key="dish", ttl=60)
        def dish() -> Dish:
            return Dish("Soup", decimal.Decimal(1))

        assert dish() == dish()
        assert isinstance(pickling.peek("dish"), Dish)  # a pickling guard keeps the type

    with CacheGuard.from_url(redis_url, namespace=namespace) as plain:

        @cached_with_lock(plain, key="report", ttl=60)
        def report_as_it_is() -> Report:
            return Report(Path("/tmp/x"))

        with pytest.raises(SerializationError, match="msgpack"):  # the codec's, as before
            report_as_it_is()

    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="annotated", ttl=60)
        def annotated() -> MenuModel:
            return {"id": 1}  # type: ignore[return-value]

        with pytest.raises(SerializationError, match="pass type=False"):
            annotated()

        @cached_with_lock(guard, key="as-it-is", ttl=60, type=False)
        def as_it_is() -> MenuModel:
            return {"id": 1}  # type: ignore[return-value]

        assert as_it_is() == as_it_is() == {"id": 1}

        @cached_with_lock(guard, key="unhandled", ttl=60)
        def unhandled() -> list[Size]:
            return [Size.SMALL]

        with pytest.raises(SerializationError):  # no family: the codec's own refusal
            unhandled()
