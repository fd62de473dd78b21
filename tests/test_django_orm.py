"""The Django ORM hooks (``track_models``) and ORM values in the cache, on real
PostgreSQL (``DATABASE_URL``, set in CI) and Redis.

Django is configured once per process by tests/django_settings.py, in a schema of
the run's own; the models are tests/django_app's. Every test starts from empty
tables and ends with this thread's connections closed."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import time as dtime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis

from cacheguard import (
    MISSING,
    CacheGuard,
    KeyTemplateError,
    LockLostError,
    LockTimeout,
    cached_with_lock,
)
from tests.django_settings import DjangoDatabase, configure_django, create_tables, postgres_url
from tests.django_support import (
    CHURN_CHECKED,
    CHURN_SNAPSHOT_READS,
    DISH_KEYS,
    MENU_KEYS,
    MOVING_CHECKED,
    MOVING_MENUS,
    MOVING_OWNERS,
    churn_reader,
    churn_writer,
    lock_is_free,
    moving_churn_reader,
    moving_churn_writer,
    waiting_in_process,
)
from tests.helpers import make_guard, wait_until
from tests.procs import results_of, start_processes

if postgres_url() is None:
    pytest.skip("the Django ORM tests need PostgreSQL (DATABASE_URL)", allow_module_level=True)

DATABASE: DjangoDatabase = configure_django()
if not DATABASE.postgres:
    pytest.skip("Django was configured without PostgreSQL in this process", allow_module_level=True)
create_tables()

from django.core import serializers  # noqa: E402  (after the settings)
from django.db import connection, connections, transaction  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from cacheguard.integrations.django import track_models  # noqa: E402
from cacheguard.integrations.django.orm import (  # noqa: E402
    ManualTransactionError,
    ModelTracker,
)
from tests.django_app.models import Dish, Menu, MenuProxy, Owner, SpecialMenu  # noqa: E402

TABLES = (Dish, SpecialMenu, Menu, Owner)


@pytest.fixture(autouse=True)
def empty_tables() -> Iterator[None]:
    with connection.cursor() as cursor:
        names = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in TABLES)
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    yield
    connections.close_all()


@pytest.fixture
def guard(client: redis.Redis, namespace: str) -> Iterator[CacheGuard]:
    g = make_guard(client, namespace, wait_timeout=10)
    yield g
    g.close()


@pytest.fixture
def tracker(guard: CacheGuard) -> Iterator[ModelTracker]:
    t = track_models(guard, {Menu: MENU_KEYS, Dish: DISH_KEYS}, lock_timeout=10)
    yield t
    t.close()


@pytest.fixture
def owners() -> tuple[Owner, Owner]:
    return Owner.objects.create(name="Ann"), Owner.objects.create(name="Bob")


@pytest.fixture
def menus(owners: tuple[Owner, Owner], tracker: ModelTracker) -> list[Menu]:
    ann, _ = owners
    return [
        Menu.objects.create(name="Starters", slug="starters", owner=ann),
        Menu.objects.create(name="Soups", slug="soups", owner=ann),
        Menu.objects.create(name="Desserts", slug="desserts", owner=None),
    ]


def fill(guard: CacheGuard, *names: str) -> dict[str, bytes]:
    """Cache a value under each name; their stored entries, to put back later."""
    for name in names:
        guard.get_or_load(name, lambda n=name: f"old {n}", ttl=60)
    return {name: guard.client.get(guard.keys(name).value) for name in names}


def put_back(guard: CacheGuard, entries: dict[str, bytes]) -> None:
    """Store the old entries again without any lock: what a writer that ignores the
    locks, or an old value on its way, would do. The end of the transaction must
    remove them."""
    for name, raw in entries.items():
        guard.client.set(guard.keys(name).value, raw)


class SqlSpy:
    """Runs ``before`` when the first INSERT, UPDATE or DELETE of the menu table is
    about to be sent, and ``after`` once it ran (in the writer's transaction)."""

    def __init__(self, before: Callable[[], None], after: Callable[[], None]) -> None:
        self.before, self.after = before, after
        self.seen = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        first = not self.seen and _writes_menus(sql)
        if first:
            self.seen = True
            self.before()
        result = execute(sql, params, many, context)
        if first:
            self.after()
        return result


def _writes_menus(sql: str) -> bool:
    verb = sql.lstrip().split(" ", 1)[0].upper()
    return (
        verb in ("INSERT", "UPDATE", "DELETE")
        and '"django_app_menu"' in sql.split("WHERE", maxsplit=1)[0]
    )


def _other_connection() -> psycopg.Connection[Any]:
    """A connection of another program to the test's tables (autocommit, untracked)."""
    conninfo = "postgresql://" + str(postgres_url()).split("://", 1)[1]
    other = psycopg.connect(conninfo, autocommit=True)
    other.execute(f"SET search_path = {DATABASE.schema}")
    return other


class AfterTheFirstSelectForUpdate:
    """An execute wrapper that runs ``then`` once the first ``SELECT ... FOR UPDATE``
    ran: between the hooks' selection of the rows and the write."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then
        self.ran = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not self.ran and "FOR UPDATE" in sql:
            self.ran = True
            self.then()
        return result


# -- every kind of write: the keys of old and new values, before the SQL and after commit --


def _save(menus: list[Menu], bob: Owner) -> None:
    menu = Menu.objects.get(pk=menus[0].pk)
    menu.owner, menu.slug = bob, "hors-d-oeuvres"
    menu.save()


def _create(menus: list[Menu], bob: Owner) -> None:
    Menu.objects.create(name="Salads", slug="salads", owner=bob)


def _delete(menus: list[Menu], bob: Owner) -> None:
    Menu.objects.get(pk=menus[0].pk).delete()


def _queryset_update(menus: list[Menu], bob: Owner) -> None:
    assert Menu.objects.filter(slug="starters").update(owner=bob, slug="hors-d-oeuvres") == 1


def _queryset_delete(menus: list[Menu], bob: Owner) -> None:
    assert Menu.objects.filter(slug="starters").delete()[0] == 1


def _bulk_create(menus: list[Menu], bob: Owner) -> None:
    Menu.objects.bulk_create([Menu(name="Salads", slug="salads", owner=bob)])


def _bulk_update(menus: list[Menu], bob: Owner) -> None:
    menu = Menu.objects.get(pk=menus[0].pk)
    menu.owner, menu.slug = bob, "hors-d-oeuvres"
    Menu.objects.bulk_update([menu], ["owner", "slug"])


CHANGE = ("menu:list", "menu:1", "menu:starters", "menu:hors-d-oeuvres")
MOVE = ("menus:by-owner:1", "menus:by-owner:2")
# write -> (keys locked and invalidated before its SQL, keys held by the commit)
WRITES: dict[str, tuple[Callable[[list[Menu], Owner], None], tuple[str, ...], tuple[str, ...]]] = {
    "save": (_save, CHANGE + MOVE, CHANGE + MOVE),
    "create": (_create, ("menu:list", "menu:salads", "menus:by-owner:2"), ("menu:4",)),
    "delete": (_delete, CHANGE[:3] + MOVE[:1], CHANGE[:3] + MOVE[:1]),
    "queryset-update": (_queryset_update, CHANGE[:3] + MOVE[:1], CHANGE + MOVE),
    "queryset-delete": (_queryset_delete, CHANGE[:3] + MOVE[:1], CHANGE[:3] + MOVE[:1]),
    "bulk-create": (_bulk_create, ("menu:list", "menu:salads", "menus:by-owner:2"), ("menu:4",)),
    "bulk-update": (_bulk_update, CHANGE[:3] + MOVE[:1], CHANGE + MOVE),
}


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "autocommit"])
@pytest.mark.parametrize("kind", list(WRITES))
def test_each_write_kind_locks_old_and_new_keys(
    guard: CacheGuard,
    tracker: ModelTracker,
    menus: list[Menu],
    owners: tuple[Owner, Owner],
    kind: str,
    atomic: bool,
) -> None:
    """The keys of the old values and the new are write-locked and invalidated before
    the write's SQL runs (those known then) or before the commit (those known only
    after the SQL), held until the transaction ends, and invalidated again then."""
    write, before_sql, by_commit = WRITES[kind]
    held = tuple(dict.fromkeys(before_sql + by_commit))
    existing = [n for n in held if n != "menu:4"]  # no value for a menu not made yet
    entries = fill(guard, *existing)
    at_the_sql: dict[str, tuple[bool, Any]] = {}

    def before() -> None:
        at_the_sql.update({n: (lock_is_free(guard, n), guard.peek(n)) for n in before_sql})

    spy = SqlSpy(before, lambda: put_back(guard, entries))
    with connection.execute_wrapper(spy):
        if atomic:
            with transaction.atomic():
                write(menus, owners[1])
                assert set(held) <= tracker.held_keys()
        else:
            write(menus, owners[1])
    assert spy.seen
    assert at_the_sql == {n: (False, MISSING) for n in before_sql}  # locked and invalidated
    assert tracker.held_keys() == frozenset()
    assert all(lock_is_free(guard, n) for n in held)
    assert {n: guard.peek(n) for n in held} == dict.fromkeys(held, MISSING)  # again at the end


def test_a_read_waits_for_the_commit_and_gets_the_new_row(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def menu_name(menu_id: int) -> str:
        return str(Menu.objects.get(pk=menu_id).name)

    def read_in_another_thread() -> None:
        try:
            read.append(menu_name(1))
        finally:
            connections.close_all()  # the reader thread's connection

    assert menu_name(1) == "Starters"
    read: list[str] = []
    with transaction.atomic():
        with transaction.atomic():  # a savepoint's end releases nothing
            menu = Menu.objects.get(pk=1)
            menu.name = "Hors d'oeuvres"
            menu.save()
        reader = threading.Thread(target=read_in_another_thread)
        reader.start()
        # The reader waits for the write lock the transaction holds, not for a value.
        assert wait_until(lambda: waiting_in_process(guard, "menu:1"), 10)
        assert read == []
    reader.join(10)
    assert read == ["Hors d'oeuvres"]
    assert menu_name(1) == "Hors d'oeuvres"


def test_the_writers_own_reads_see_its_rows_and_store_nothing(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def menu_name(menu_id: int) -> str:
        return str(Menu.objects.get(pk=menu_id).name)

    @cached_with_lock(guard, key="count:menus", ttl=60)
    def menu_count() -> int:  # no template names this key: still nothing uncommitted stored
        return int(Menu.objects.count())

    def write_and_read_then_roll_back() -> None:
        with transaction.atomic():
            Menu.objects.filter(pk=1).update(name="Phantom")
            Menu.objects.create(name="Ghost", slug="ghost")
            assert menu_name(1) == "Phantom"
            assert menu_count() == 4
            assert guard.peek("menu:1") is MISSING
            assert guard.peek("count:menus") is MISSING
            raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        write_and_read_then_roll_back()
    assert all(lock_is_free(guard, n) for n in ("menu:1", "menu:list", "menu:ghost"))
    assert menu_name(1) == "Starters"
    assert menu_count() == 3


def test_a_rolled_back_savepoint_keeps_its_keys_locked_until_the_outermost_end(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    entries = fill(guard, "menu:soups")

    def in_a_savepoint_rolled_back() -> None:
        with transaction.atomic():
            Menu.objects.filter(slug="soups").update(name="Broths")
            raise RuntimeError("savepoint rolled back")

    with transaction.atomic():
        with pytest.raises(RuntimeError):
            in_a_savepoint_rolled_back()
        assert "menu:soups" in tracker.held_keys()
        assert not lock_is_free(guard, "menu:soups")
        put_back(guard, entries)
        Menu.objects.filter(slug="starters").update(name="Hors d'oeuvres")
    assert lock_is_free(guard, "menu:soups")
    assert guard.peek("menu:soups") is MISSING
    assert Menu.objects.get(slug="soups").name == "Soups"


def test_keys_are_per_database_alias(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    # Two aliases, two transactions: each holds and ends its own.
    with transaction.atomic(using="repeatable"):
        Menu.objects.using("repeatable").filter(pk=2).update(name="Broths")
        with transaction.atomic():
            Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")
            assert "menu:1" in tracker.held_keys()
            assert "menu:2" in tracker.held_keys("repeatable")
        assert "menu:1" not in tracker.held_keys()
        assert lock_is_free(guard, "menu:1")
        assert not lock_is_free(guard, "menu:2")
    assert lock_is_free(guard, "menu:2")


def test_an_update_changes_only_the_rows_it_selected_and_locked(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    # Between the hooks' SELECT ... FOR UPDATE and the UPDATE, another program makes
    # a third menu match the filter: its keys were not locked, so it must not change.
    def other_program() -> None:
        with _other_connection() as other:
            other.execute("UPDATE django_app_menu SET owner_id = 1 WHERE id = 3")

    spy = AfterTheFirstSelectForUpdate(other_program)
    with connection.execute_wrapper(spy):
        assert Menu.objects.filter(owner_id=1).update(name="Ann's") == 2
    assert spy.ran
    assert sorted(Menu.objects.values_list("id", "name")) == [
        (1, "Ann's"),
        (2, "Ann's"),
        (3, "Desserts"),
    ]


def test_a_row_that_comes_to_match_a_fast_delete_is_invalidated_by_prefix(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    Dish.objects.create(menu=menus[0], name="Bread")
    fill(guard, "menu:1:dishes", "menu:3:dishes")

    def other_program() -> None:  # a dish for menu 3 the hooks' SELECT did not see
        with _other_connection() as other:
            other.execute("INSERT INTO django_app_dish (menu_id, name) VALUES (3, 'Brioche')")

    spy = AfterTheFirstSelectForUpdate(other_program)
    with connection.execute_wrapper(spy):
        assert Dish.objects.filter(name__startswith="B").delete()[0] == 2  # a fast delete
    assert spy.ran
    assert guard.peek("menu:1:dishes") is MISSING
    assert guard.peek("menu:3:dishes") is MISSING  # its key was never named: "menu:" was


def test_a_value_stored_while_a_lock_was_gone_is_dropped_at_the_end(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], client: redis.Redis
) -> None:
    with transaction.atomic():
        Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")
        # The lock's hash vanishes (a failover lost it); another process fills the key.
        assert client.delete(guard.keys("menu:1").lock) == 1
        outsider = make_guard(client, guard.namespace)
        try:
            assert outsider.get_or_load("menu:1", lambda: "Starters", ttl=60) == "Starters"
        finally:
            outsider.close()
    assert guard.peek("menu:1") is MISSING  # invalidated again after the commit


def test_a_write_lock_lost_before_the_commit_rolls_the_transaction_back(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], client: redis.Redis
) -> None:
    def write_and_lose_the_lock() -> None:
        with transaction.atomic():
            Menu.objects.filter(pk=1).update(name="Written after the loss")
            state = connections["default"].__dict__["_cacheguard_tracking"][tracker]
            handle = state.locks["menu:1"][1]
            assert client.delete(guard.keys("menu:1").lock) == 1
            assert not handle.renew()  # what the watchdog's next renewal finds

    with pytest.raises(LockLostError) as lost:
        write_and_lose_the_lock()
    assert (lost.value.name, lost.value.mode) == ("menu:1", "write")
    assert "rolled back" in str(lost.value)
    assert Menu.objects.get(pk=1).name == "Starters"
    assert tracker.held_keys() == frozenset()
    assert all(lock_is_free(guard, n) for n in ("menu:list", "menu:starters"))


def test_a_fill_in_a_transaction_begun_before_a_write_does_not_store_its_old_row(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def menu_name(menu_id: int, using: str = "default") -> str:
        return str(Menu.objects.using(using).get(pk=menu_id).name)

    def write() -> None:
        try:
            Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")
        finally:
            connections.close_all()

    with transaction.atomic(using="repeatable"):  # REPEATABLE READ: one snapshot
        assert Menu.objects.using("repeatable").count() == 3  # the snapshot is taken
        writer = threading.Thread(target=write)  # committed, invalidated, released
        writer.start()
        writer.join(10)
        assert menu_name(1, using="repeatable") == "Starters"  # its snapshot's row...
        assert guard.peek("menu:1") is MISSING  # ...which it did not store
    assert menu_name(1) == "Hors d'oeuvres"
    assert guard.peek("menu:1") == "Hors d'oeuvres"


def test_a_transaction_begun_after_the_write_fills(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")
    with transaction.atomic(using="repeatable"):
        name = guard.get_or_load(
            "menu:1", lambda: Menu.objects.using("repeatable").get(pk=1).name, ttl=60
        )
    assert name == "Hors d'oeuvres"
    assert guard.peek("menu:1") == "Hors d'oeuvres"


def test_manual_transaction_management_is_refused(tracker: ModelTracker, menus: list[Menu]) -> None:
    transaction.set_autocommit(False)
    try:
        with pytest.raises(ManualTransactionError, match="autocommit off"):
            Menu.objects.filter(pk=1).update(name="Never")
        with pytest.raises(ManualTransactionError), transaction.atomic():
            Menu.objects.filter(pk=1).update(name="Never")
        Owner.objects.create(name="Untracked: fine")  # not a tracked model
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert Menu.objects.get(pk=1).name == "Starters"


def test_subclasses_and_proxies_share_the_templates(
    guard: CacheGuard, owners: tuple[Owner, Owner]
) -> None:
    # Tracking the proxy tracks writes through the concrete model and its subclasses.
    with track_models(guard, {MenuProxy: ("menu:{id}", "menu:{slug}")}) as by_proxy:
        special = SpecialMenu.objects.create(name="Chef's", slug="chefs", chef="Kim")
        fill(guard, "menu:1", "menu:chefs")
        with transaction.atomic():
            SpecialMenu.objects.filter(pk=special.pk).update(chef="Lee", name="Lee's")
            assert by_proxy.held_keys() == {"menu:1", "menu:chefs"}
        fill(guard, "menu:1")
        with transaction.atomic():
            Menu.objects.filter(pk=1).update(slug="lees")  # through the concrete model
            assert by_proxy.held_keys() == {"menu:1", "menu:chefs", "menu:lees"}
        with transaction.atomic():
            Menu.objects.get(pk=1).delete()  # deletes the SpecialMenu row too
            assert by_proxy.held_keys() == {"menu:1", "menu:lees"}
    assert guard.peek("menu:1") is MISSING


def test_on_delete_set_null_is_tracked(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], owners: tuple[Owner, Owner]
) -> None:
    fill(guard, "menus:by-owner:1", "menus:by-owner:None")
    with transaction.atomic():
        owners[0].delete()  # Menu.owner is SET_NULL: two menus move to no owner
        assert {"menus:by-owner:1", "menus:by-owner:None", "menu:1", "menu:2"} <= (
            tracker.held_keys()
        )
    assert guard.peek("menus:by-owner:1") is MISSING
    assert guard.peek("menus:by-owner:None") is MISSING


def test_rows_a_delete_updates_by_primary_key_are_tracked(
    guard: CacheGuard, menus: list[Menu], owners: tuple[Owner, Owner]
) -> None:
    Menu.objects.filter(pk__in=[1, 2]).update(deputy=owners[1])
    with track_models(guard, {Menu: ("menus:by-deputy:{deputy_id}",)}) as deputies:
        fill(guard, "menus:by-deputy:2", "menus:by-deputy:None")
        with transaction.atomic():
            owners[1].delete()  # on_delete=clear_deputy: the menus, updated by primary key
            assert deputies.held_keys() == {"menus:by-deputy:2", "menus:by-deputy:None"}
        assert guard.peek("menus:by-deputy:2") is MISSING
        assert guard.peek("menus:by-deputy:None") is MISSING
    assert list(Menu.objects.filter(deputy__isnull=False)) == []


def test_cascaded_and_fast_deletes_are_tracked(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    Dish.objects.create(menu=menus[0], name="Olives")
    Dish.objects.create(menu=menus[1], name="Broth")
    fill(guard, "menu:1:dishes", "menu:2:dishes")
    with transaction.atomic():
        Dish.objects.filter(menu_id=2).delete()  # a fast delete: no signals, no objects
        assert "menu:2:dishes" in tracker.held_keys()
        menus[0].delete()  # cascades to its dish
        assert "menu:1:dishes" in tracker.held_keys()
    assert guard.peek("menu:1:dishes") is MISSING
    assert guard.peek("menu:2:dishes") is MISSING
    assert not Dish.objects.exists()


def test_an_upsert_invalidates_the_keys_of_the_row_it_overwrites(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], owners: tuple[Owner, Owner]
) -> None:
    with transaction.atomic():
        Menu.objects.bulk_create(
            [Menu(name="Soups again", slug="soups", owner=owners[1])],
            update_conflicts=True,
            unique_fields=["slug"],
            update_fields=["name", "owner"],
        )
        assert {"menu:2", "menu:soups", "menus:by-owner:1", "menus:by-owner:2"} <= (
            tracker.held_keys()
        )


def test_writes_over_max_rows_invalidate_by_prefix_now_and_at_the_end(
    guard: CacheGuard, menus: list[Menu]
) -> None:
    with track_models(guard, {Menu: MENU_KEYS}, max_rows=2) as narrow:
        with transaction.atomic():
            Menu.objects.update(version=F("version") + 1)  # three rows: by prefix
            assert narrow.held_keys() == {"menu:list"}
            # Not locked: another thread fills a key of the templates from the old rows.
            filled = []
            thread = threading.Thread(
                target=lambda: filled.append(guard.get_or_load("menu:3", lambda: 0, ttl=60))
            )
            thread.start()
            thread.join(10)
            assert filled == [0]
            assert guard.peek("menu:3") == 0
        assert guard.peek("menu:3") is MISSING  # the prefix, invalidated again


def test_fixtures_are_tracked(guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]) -> None:
    fixture = serializers.serialize("json", [Menu.objects.get(pk=2)])
    fixture = fixture.replace('"Soups"', '"Loaded soups"')
    fill(guard, "menu:2", "menu:soups")
    with transaction.atomic():
        for loaded in serializers.deserialize("json", fixture):
            loaded.save()  # a raw save, as loaddata does
        assert {"menu:2", "menu:soups", "menu:list"} <= tracker.held_keys()
    assert guard.peek("menu:2") is MISSING
    assert Menu.objects.get(pk=2).name == "Loaded soups"


async def test_the_async_orm_methods_run_the_same_hooks(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    from asgiref.sync import sync_to_async

    fill(guard, "menu:1", "menu:2")
    menu = await Menu.objects.aget(pk=1)
    menu.name = "Hors d'oeuvres"
    await menu.asave()
    assert guard.peek("menu:1") is MISSING
    assert await Menu.objects.filter(pk=2).aupdate(name="Broths") == 1
    assert guard.peek("menu:2") is MISSING
    assert all(lock_is_free(guard, n) for n in ("menu:1", "menu:2", "menu:list"))
    await sync_to_async(connections.close_all)()


def test_untracked_models_take_no_locks_and_close_removes_the_hooks(
    guard: CacheGuard, owners: tuple[Owner, Owner]
) -> None:
    from django.db.models import QuerySet

    original = QuerySet.__dict__["update"]
    tracker = track_models(guard, {Menu: MENU_KEYS})
    assert track_models(guard, {Menu: MENU_KEYS}) is tracker  # tracked already
    assert QuerySet.__dict__["update"] is not original
    assert QuerySet.update.alters_data  # Django's templates still refuse to call it
    with transaction.atomic():
        Owner.objects.filter(pk=1).update(name="Anna")
        assert tracker.held_keys() == frozenset()
    tracker.close()
    tracker.close()
    assert QuerySet.__dict__["update"] is original
    with transaction.atomic():
        Menu.objects.create(name="Untracked now", slug="untracked")
        assert tracker.held_keys() == frozenset()
    again = track_models(guard, {Menu: MENU_KEYS})
    try:
        assert again is not tracker
        Menu.objects.filter(slug="untracked").update(name="Tracked again")
        assert guard.peek("menu:untracked") is MISSING
    finally:
        again.close()


def test_the_django_value_family_imports_nothing_without_django() -> None:
    probe = (
        "import sys, dataclasses\n"
        "from cacheguard.codecs import names_a_family, value_type\n"
        "@dataclasses.dataclass\n"
        "class Point:\n"
        "    x: int\n"
        "assert names_a_family(list[Point]) and not names_a_family(list[dict])\n"
        "value_type(list[Point]).dump([Point(1)])\n"
        "print(sorted(m for m in sys.modules if 'django' in m))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_models_templates_and_guards_are_checked(guard: CacheGuard) -> None:
    with pytest.raises(KeyTemplateError, match="'colour'"):
        track_models(guard, {Menu: ("menu:{colour}",)})
    with pytest.raises(KeyTemplateError, match="related row's id"):
        track_models(guard, {Menu: ("menu:{owner.name}",)})
    with pytest.raises(KeyTemplateError, match="__cache_keys__"):
        track_models(guard, [Menu])
    with pytest.raises(TypeError, match="not a Django model"):
        track_models(guard, {dict: ("x",)})
    with pytest.raises(TypeError, match="AsyncCacheGuard"):
        track_models(object(), {Menu: MENU_KEYS})
    with pytest.raises(ValueError, match="max_rows"):
        track_models(guard, {Menu: MENU_KEYS}, max_rows=0)
    with track_models(guard, {Menu: ("menu:{owner}", "menu:{pk}")}) as by_id:
        menu = Menu(pk=5, name="Unsaved", owner_id=9)
        assert by_id.keys_of(menu) == {"menu:9", "menu:5"}


def test_a_cache_backend_names_the_keys_as_it_maps_them(guard: CacheGuard) -> None:
    class Backend:  # what cacheguard.integrations.django.CacheGuardCache offers
        def __init__(self) -> None:
            self.guard = guard

        def guard_name(self, key: str, version: int | None = None) -> str:
            return f":{version or 1}:{key}"

    with track_models(Backend(), {Menu: MENU_KEYS}) as mapped, transaction.atomic():
        Menu.objects.create(name="Soups", slug="soups")
        cache_api = {":1:menu:list", ":1:menu:soups", ":1:menu:1", ":1:menus:by-owner:None"}
        own = {"menu:list", "menu:soups", "menu:1", "menus:by-owner:None"}
        assert mapped.held_keys() == cache_api | own  # both kinds of keys (docs/django.md)

    class Hashing(Backend):
        def guard_name(self, key: str, version: int | None = None) -> str:
            return uuid.uuid5(uuid.NAMESPACE_URL, key).hex

    with pytest.raises(ValueError, match="does not keep prefixes"):
        track_models(Hashing(), {Menu: MENU_KEYS})


def test_the_cache_backend_sees_the_writes_before_and_after_its_shutdown(
    redis_url: str, namespace: str, menus: list[Menu]
) -> None:
    from cacheguard.integrations.django import CacheGuardCache

    options = {"namespace": f"{namespace}-cache"}  # not the tracker fixture's names
    cache = CacheGuardCache(redis_url, {"KEY_PREFIX": "shop", "OPTIONS": options})
    with track_models(cache, {Menu: ("menu:{slug}",)}) as through_cache:
        assert cache.get_or_set("menu:soups", lambda: "Soups", timeout=60) == "Soups"
        with transaction.atomic():
            Menu.objects.filter(slug="soups").update(name="Broths")
            assert through_cache.held_keys() == {cache.guard_name("menu:soups"), "menu:soups"}
            assert through_cache.held_keys() == {"shop:1:menu:soups", "menu:soups"}
        assert cache.get("menu:soups") is None
        cache.shutdown()  # its guard closes; the next use opens another
        assert cache.get_or_set("menu:soups", lambda: "Broths", timeout=60) == "Broths"
        Menu.objects.filter(slug="soups").update(name="Consommés")
        assert cache.get("menu:soups") is None
    cache.shutdown()


# -- ORM values in the cache ------------------------------------------------------------------


def _fields(menu: Menu) -> tuple[Any, ...]:
    return tuple(getattr(menu, f.attname) for f in Menu._meta.concrete_fields)


def test_model_instances_round_trip_and_a_hit_runs_no_query(guard: CacheGuard) -> None:
    ann = Owner.objects.create(name="Ann")
    Menu.objects.create(
        name="Starters",
        slug="starters",
        owner=ann,
        price=Decimal("12.50"),
        opens=dtime(11, 30),
        tags=["vegan", {"spicy": 2}],
    )
    Menu.objects.create(name="Soups", slug="soups")

    @cached_with_lock(guard, key="menu:list", ttl=60)
    def list_menus() -> list[Menu]:
        return list(Menu.objects.order_by("id"))

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def get_menu(menu_id: int) -> Menu | None:
        return Menu.objects.filter(pk=menu_id).first()

    loaded = list_menus()
    with CaptureQueriesContext(connection) as queries:
        hit = list_menus()
    assert len(queries) == 0
    assert [_fields(m) for m in hit] == [_fields(m) for m in Menu.objects.order_by("id")]
    assert [_fields(m) for m in hit] == [_fields(m) for m in loaded]
    assert hit[0].opens == dtime(11, 30)
    assert hit[0].price == Decimal("12.50")
    assert all(m._state.adding is False and m._state.db == "default" for m in hit)
    assert get_menu(99) is None
    assert get_menu(99) is None  # a cached None
    assert guard.peek("menu:99") is None
    menu = get_menu(1)
    menu = get_menu(1)  # a hit: an instance that saves as an update of its row
    menu.name = "Hors d'oeuvres"
    with CaptureQueriesContext(connection) as queries:
        menu.save()
    assert [q["sql"].split(" ", 1)[0] for q in queries] == ["UPDATE"]
    assert Menu.objects.get(pk=1).name == "Hors d'oeuvres"
    assert menu.owner == ann  # related rows are read again when used


def test_deferred_fields_stay_deferred(guard: CacheGuard) -> None:
    Menu.objects.create(name="Starters", slug="starters", price=Decimal("3.00"))

    @cached_with_lock(guard, key="menu:names", ttl=60)
    def names() -> list[Menu]:
        return list(Menu.objects.only("id", "name"))

    names()
    with CaptureQueriesContext(connection) as queries:
        hit = names()
    assert len(queries) == 0
    assert hit[0].name == "Starters"
    assert "price" in hit[0].get_deferred_fields()
    assert hit[0].price == Decimal("3.00")  # loaded when asked for, as Django does


def test_stored_data_that_no_longer_fits_the_model_is_a_miss(guard: CacheGuard) -> None:
    Menu.objects.create(name="Starters", slug="starters")
    # An entry from before a field was added: it lacks "uid".
    old = {"db": "default", "fields": {"id": 1, "name": "Old", "slug": "starters"}}
    guard.get_or_load("menu:1", lambda: old, ttl=60)

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def get_menu(menu_id: int) -> Menu:
        return Menu.objects.get(pk=menu_id)

    assert get_menu(1).name == "Starters"
    assert guard.peek("menu:1")["fields"]["name"] == "Starters"


def test_values_rows_round_trip_as_they_are(guard: CacheGuard) -> None:
    Menu.objects.create(name="Starters", slug="starters", price=Decimal("12.50"))

    @cached_with_lock(guard, key="menu:rows", ttl=60)
    def rows() -> list[dict[str, Any]]:
        return list(Menu.objects.values("id", "name", "price", "created", "uid"))

    loaded = rows()
    with CaptureQueriesContext(connection) as queries:
        hit = rows()
    assert len(queries) == 0
    assert hit == loaded == list(Menu.objects.values("id", "name", "price", "created", "uid"))


def test_a_subclass_instance_is_refused_where_the_annotation_names_its_parent(
    guard: CacheGuard,
) -> None:
    from cacheguard import SerializationError

    SpecialMenu.objects.create(name="Chef's", slug="chefs", chef="Kim")

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def get_menu(menu_id: int) -> Menu:
        return SpecialMenu.objects.get(pk=menu_id)

    with pytest.raises(SerializationError, match="expected Menu"):
        get_menu(1)
    assert guard.peek("menu:1") is MISSING


# -- churn across processes -------------------------------------------------------------------


@pytest.mark.slow
def test_orm_churn_across_processes_reads_nothing_older_than_a_commit(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    for number in range(1, 5):
        Menu.objects.create(name=f"menu {number}", slug=f"menu-{number}")
        client.set(f"{namespace}:test:committed:{number}", 0)
    connections.close_all()
    started = start_processes(
        churn_reader,
        [(redis_url, namespace, DATABASE, True, 1), (redis_url, namespace, DATABASE, False, 2)],
    )
    writer = start_processes(churn_writer, [(redis_url, namespace, DATABASE, 150, 2)])
    kinds = results_of(writer, timeout=110)[0]
    readers = results_of(started, timeout=60)
    assert all(count >= 30 for count in kinds.values()), kinds  # every kind of write
    assert readers[0]["snapshot_reads"] >= CHURN_SNAPSHOT_READS, readers
    assert sum(r["checked"] for r in readers) >= CHURN_CHECKED, readers
    assert [r["stale"] for r in readers] == [0, 0], readers


@pytest.mark.slow
def test_orm_churn_moving_keys_reads_nothing_older_than_a_commit(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    """Menus change owners and come and go (every kind of write, tracked through the
    cache backend); readers read owners' lists and the whole list through the guard's
    names and through Django's cache API."""
    for number in range(1, MOVING_OWNERS + 1):
        Owner.objects.create(name=f"owner {number}")
    for number in range(MOVING_MENUS):
        Menu.objects.create(
            name=f"menu {number}", slug=f"menu-{number}", owner_id=number % MOVING_OWNERS + 1
        )
    rows = Menu.objects.values_list("id", "version", "owner_id")
    client.set(f"{namespace}:test:rows", ";".join(f"{i},{v},{o}" for i, v, o in rows))
    connections.close_all()
    started = start_processes(
        moving_churn_reader,
        [(redis_url, namespace, DATABASE, True, 1), (redis_url, namespace, DATABASE, False, 2)],
    )
    writer = start_processes(moving_churn_writer, [(redis_url, namespace, DATABASE, 100, 2)])
    kinds = results_of(writer, timeout=110)[0]
    readers = results_of(started, timeout=60)
    assert all(count >= 20 for count in kinds.values()), kinds  # every kind of write
    for kind in ("decorated", "cache_api", "list"):  # every kind of read, checked
        assert sum(r[kind] for r in readers) >= MOVING_CHECKED // 6, readers
    assert sum(r["exact"] for r in readers) >= 20, readers  # some compared whole
    assert readers[0]["snapshot_reads"] >= 30, readers
    assert [r["stale"] for r in readers] == [0, 0], readers


# -- the review's findings -------------------------------------------------------------------------


def test_new_keys_use_the_values_as_the_database_stores_them(guard: CacheGuard) -> None:
    import datetime as dt

    templates = ("menus:price:{price}", "menus:created:{created}", "menus:uid:{uid}")
    with track_models(guard, {Menu: templates}, lock_timeout=10) as tracker:
        menu = Menu.objects.create(name="Soups", slug="soups")
        menu.price = Decimal("12.5")  # stored as 12.50
        paris = dt.timezone(dt.timedelta(hours=2))
        menu.created = dt.datetime(2024, 5, 6, 7, 0, tzinfo=paris)  # read back in UTC
        menu.uid = "9B2E6C8E-5F3A-4B8D-9C1E-2A3B4C5D6E7F"  # read back as a lower-case UUID
        with transaction.atomic():
            menu.save()
            held = tracker.held_keys()
        as_read = tracker.keys_of(Menu.objects.get(pk=menu.pk))  # a reader's values
    assert "menus:price:12.50" in as_read
    assert as_read <= held


def test_save_signals_run_outside_the_hooks_transaction(tracker: ModelTracker) -> None:
    from django.db.models.signals import post_save, pre_save

    in_block: list[bool] = []

    def note_pre_save(sender: Any, **kwargs: Any) -> None:
        in_block.append(connection.in_atomic_block)

    def durable_ledger(sender: Any, instance: Menu, **kwargs: Any) -> None:
        in_block.append(connection.in_atomic_block)
        with transaction.atomic(durable=True):  # refused inside another block
            Owner.objects.create(name=f"audit {instance.pk}")

    def mail_server_down(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("mail server down")

    pre_save.connect(note_pre_save, sender=Menu)
    post_save.connect(durable_ledger, sender=Menu)
    try:
        Menu.objects.create(name="Soups", slug="soups")
        assert in_block == [False, False]  # as without tracking, in autocommit mode
        assert list(Owner.objects.values_list("name", flat=True)) == ["audit 1"]
        post_save.disconnect(durable_ledger, sender=Menu)
        post_save.connect(mail_server_down, sender=Menu)
        with pytest.raises(RuntimeError, match="mail server down"):
            Menu.objects.create(name="Salads", slug="salads")
    finally:
        pre_save.disconnect(note_pre_save, sender=Menu)
        post_save.disconnect(durable_ledger, sender=Menu)
        post_save.disconnect(mail_server_down, sender=Menu)
    # The handler failed after the save committed, as it does without tracking.
    assert sorted(Menu.objects.values_list("slug", flat=True)) == ["salads", "soups"]
    assert tracker.held_keys() == frozenset()


def test_on_commit_callbacks_run_after_the_keys_are_released(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def menu_name(menu_id: int) -> str:
        return str(Menu.objects.get(pk=menu_id).name)

    read: list[object] = []
    served = threading.Event()

    def reader() -> None:
        try:
            read.append(menu_name(1))
        except Exception as exc:  # a reader kept waiting for the writer's lock
            read.append(exc)
        finally:
            served.set()
            connections.close_all()

    held_in_callback: list[frozenset[str]] = []

    def slow_callback() -> None:  # e.g. sends a mail, waits for a reader
        held_in_callback.append(tracker.held_keys())
        threading.Thread(target=reader).start()
        served.wait(60)

    assert menu_name(1) == "Starters"
    with transaction.atomic():
        Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")
        transaction.on_commit(slow_callback)
    assert held_in_callback == [frozenset()]
    assert served.is_set()
    assert read == ["Hors d'oeuvres"]


def test_a_lock_timeout_after_the_sql_rolls_the_write_back(guard: CacheGuard) -> None:
    Menu.objects.create(name="Starters", slug="starters")
    holding, done = threading.Event(), threading.Event()

    def hold_the_next_id() -> None:  # its key is known only after the INSERT
        with guard.write("menu:2"):
            holding.set()
            done.wait(60)

    holder = threading.Thread(target=hold_the_next_id)
    holder.start()
    try:
        assert holding.wait(30)
        with (
            track_models(guard, {Menu: MENU_KEYS}, lock_timeout=0.2),
            transaction.atomic(),  # commits: the caller below carries on
            pytest.raises(LockTimeout),
        ):
            Menu.objects.create(name="Soups", slug="soups")
    finally:
        done.set()
        holder.join(30)
    assert list(Menu.objects.values_list("slug", flat=True)) == ["starters"]


def test_tracked_through_a_cache_both_kinds_of_key_are_invalidated(
    redis_url: str, namespace: str
) -> None:
    from cacheguard.integrations.django import CacheGuardCache

    cache = CacheGuardCache(redis_url, {"KEY_PREFIX": "shop", "OPTIONS": {"namespace": namespace}})
    templates = ("menu-by-name:{name}", "menu:{slug}")

    @cached_with_lock(cache.guard, key="menu:{slug}", ttl=60)  # the guard's own, escaped names
    def menu_name(slug: str) -> str:
        return str(Menu.objects.get(slug=slug).name)

    def slug_named(name: str) -> str:  # Django's cache API, a key built by hand
        return str(cache.get_or_set(f"menu-by-name:{name}", lambda: slug_of(name), timeout=60))

    def slug_of(name: str) -> str:
        return str(Menu.objects.get(name=name).slug)

    awkward = "Tapas:50%off#1"  # characters the guard's names escape
    Menu.objects.create(name=awkward, slug="tapas:1")
    Menu.objects.create(name="Soups", slug="soups")
    try:
        with track_models(cache, {Menu: templates}, max_rows=1) as tracker:
            assert (slug_named(awkward), menu_name("tapas:1")) == ("tapas:1", awkward)
            Menu.objects.filter(name=awkward).update(name="Tapas:60%off#1")
            assert cache.get(f"menu-by-name:{awkward}") is None
            assert menu_name("tapas:1") == "Tapas:60%off#1"
            # More rows than max_rows: both kinds, by prefix.
            assert (slug_named("Soups"), menu_name("soups")) == ("soups", "Soups")
            assert tracker.max_rows == 1
            Menu.objects.update(slug=None)  # no slug: the keys of the old ones go
            assert cache.get("menu-by-name:Soups") is None
            assert cache.guard.peek("menu:soups") is MISSING
    finally:
        cache.shutdown()


def test_a_template_starting_with_a_field_is_refused(guard: CacheGuard) -> None:
    with pytest.raises(KeyTemplateError, match="starts with a field"):
        track_models(guard, {Menu: ("menu:list", "{slug}")})


def test_a_tracker_of_another_namespace_does_not_stop_fills_from_storing(
    client: redis.Redis, namespace: str
) -> None:
    busy = make_guard(client, f"{namespace}-app", wait_timeout=10)
    other = make_guard(client, f"{namespace}-other", wait_timeout=10)
    Menu.objects.create(name="Starters", slug="starters")
    busy.invalidate(*(f"warm-up:{n}" for n in range(20)))  # its sequence is ahead
    try:
        with (
            track_models(busy, {Menu: ("menu:{id}",)}),
            track_models(other, {Owner: ("owner:{id}",)}),  # the other sequence: far behind
        ):
            Menu.objects.filter(pk=1).update(name="Hors d'oeuvres")  # menu:1's version > 20
            assert other.watermark() < busy.watermark()
            with transaction.atomic():  # both snapshots open; only busy's counts for busy
                name = busy.get_or_load("menu:1", lambda: Menu.objects.get(pk=1).name, ttl=60)
            assert name == "Hors d'oeuvres"
            assert busy.peek("menu:1") == "Hors d'oeuvres"  # stored
    finally:
        busy.close()
        other.close()


def test_tracking_again_after_another_library_patched_over_the_hooks(guard: CacheGuard) -> None:
    from django.db.models import QuerySet

    untracked = QuerySet.__dict__["update"]
    Menu.objects.create(name="Starters", slug="starters")
    first = track_models(guard, {Menu: MENU_KEYS}, lock_timeout=10)
    ours = QuerySet.__dict__["update"]

    def instrumented_update(self: Any, **kwargs: Any) -> Any:  # an APM's, without wraps
        return ours(self, **kwargs)

    QuerySet.update = instrumented_update
    try:
        first.close()  # ours stays under the instrumentation
        with (
            track_models(guard, {Menu: MENU_KEYS}, lock_timeout=10) as again,
            transaction.atomic(),
        ):
            assert Menu.objects.filter(pk=1).update(name="Hors d'oeuvres") == 1
            assert "menu:1" in again.held_keys()  # tracked, and no endless recursion
    finally:
        QuerySet.update = ours
        track_models(guard, {Menu: MENU_KEYS}).close()  # ours on top again: removed
    assert QuerySet.__dict__["update"] is untracked


@pytest.mark.parametrize("codec", ["default", "json"])
def test_json_field_data_round_trips_exactly(
    client: redis.Redis, namespace: str, codec: str
) -> None:
    from cacheguard.cache.codec import JsonCodec

    options: dict[str, Any] = {"codec": JsonCodec()} if codec == "json" else {}
    guard = make_guard(client, namespace, **options)
    tags = {"__cg__": "decimal", "v": "1"}  # what the JSON codec writes for Decimal("1")
    Menu.objects.create(name="Starters", slug="starters", tags=tags)
    Menu.objects.create(name="Soups", slug="soups", tags=[tags, {"__cg__": "bytes", "v": ""}])

    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def get_menu(menu_id: int) -> Menu:
        return Menu.objects.get(pk=menu_id)

    try:
        for menu_id in (1, 2):
            stored = Menu.objects.get(pk=menu_id).tags
            assert get_menu(menu_id).tags == stored  # the miss
            assert guard.peek(f"menu:{menu_id}") is not MISSING
            assert get_menu(menu_id).tags == stored  # the hit: the codec's tags stay data
    finally:
        guard.close()


def test_a_guard_and_a_cache_of_one_namespace_track_one_model_together(
    redis_url: str, namespace: str, guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    from cacheguard.integrations.django import CacheGuardCache

    cache = CacheGuardCache(redis_url, {"OPTIONS": {"namespace": namespace, "wait_timeout": 10}})
    try:
        # Both name the guard's "menu:soups"; two guard objects share no write holds.
        with track_models(cache, {Menu: ("menu:{slug}",)}, lock_timeout=10) as through_cache:
            with transaction.atomic():
                Menu.objects.filter(slug="soups").update(name="Broths")
                assert "menu:soups" in tracker.held_keys()
                assert through_cache.held_keys() == {":1:menu:soups"}
            assert lock_is_free(guard, "menu:soups")
    finally:
        cache.shutdown()


# -- guarantees no test checked before (the review's surviving mutations) -------------------------


def test_the_rows_a_write_names_are_selected_for_update(
    tracker: ModelTracker, menus: list[Menu]
) -> None:
    def selections(write: Callable[[], object]) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            write()
        return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]

    menu = Menu.objects.get(pk=1)
    menu.name = "Hors d'oeuvres"
    saved = selections(menu.save)  # by primary key: before the SQL, FOR UPDATE
    assert saved
    assert "FOR UPDATE" in saved[0]
    updated = selections(lambda: Menu.objects.filter(owner__isnull=True).update(name="Sweets"))
    assert updated
    assert all("FOR UPDATE" in sql for sql in updated)  # by a queryset
    deleted = selections(Menu.objects.get(pk=2).delete)
    assert any('"django_app_menu"' in sql and "FOR UPDATE" in sql for sql in deleted)


def test_a_write_locks_its_keys_in_sorted_order(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    write_lock = guard.write_lock

    def recorded(name: str) -> Any:
        order.append(name)
        return write_lock(name)

    monkeypatch.setattr(guard, "write_lock", recorded)
    with transaction.atomic():  # two writers in opposite orders cannot deadlock
        Menu.objects.filter(pk__in=[1, 2, 3]).update(name="Renamed")
    assert len(order) >= 5
    assert order == sorted(order)


def test_lock_timeout_bounds_the_wait_and_every_name_tried_is_invalidated_at_the_end(
    client: redis.Redis, namespace: str
) -> None:
    patient = make_guard(client, namespace, wait_timeout=600)  # far past the holder's hold
    Menu.objects.create(name="Starters", slug="starters")
    patient.get_or_load("menus:by-owner:None", lambda: ["stale"], ttl=60)
    holding, done = threading.Event(), threading.Event()

    def hold_a_key() -> None:  # sorted between menu:list and menus:by-owner:None
        with patient.write("menu:soups"):
            holding.set()
            done.wait(30)  # then released: a writer that ignored lock_timeout gets it

    holder = threading.Thread(target=hold_a_key)
    holder.start()
    try:
        assert holding.wait(30)
        with track_models(patient, {Menu: MENU_KEYS}, lock_timeout=0.2), transaction.atomic():
            with pytest.raises(LockTimeout):  # before its SQL: the transaction goes on
                Menu.objects.create(name="Soups", slug="soups")
            Owner.objects.create(name="Ann")  # the transaction goes on, and commits
    finally:
        done.set()
        holder.join(60)
        patient.close()
    # menus:by-owner:None was named but never locked: invalidated when the block ended.
    assert client.get(patient.keys("menus:by-owner:None").value) is None
    assert list(Owner.objects.values_list("name", flat=True)) == ["Ann"]
    assert list(Menu.objects.values_list("slug", flat=True)) == ["starters"]


def test_bulk_create_ignoring_conflicts_invalidates_by_prefix(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu]
) -> None:
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
    def menu_name(menu_id: int) -> str | None:
        menu = Menu.objects.filter(pk=menu_id).first()
        return None if menu is None else str(menu.name)

    assert menu_name(4) is None  # cached: no menu 4 yet
    # PostgreSQL reports no ids for ON CONFLICT DO NOTHING: the keys of the new
    # rows are not known, the templates' prefixes are.
    Menu.objects.bulk_create([Menu(name="Salads", slug="salads")], ignore_conflicts=True)
    assert menu_name(4) == "Salads"


def test_a_failed_watermark_read_stores_nothing_from_that_transaction(
    guard: CacheGuard, tracker: ModelTracker, menus: list[Menu], monkeypatch: pytest.MonkeyPatch
) -> None:
    def redis_down() -> int:
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(guard, "watermark", redis_down)
    with transaction.atomic():  # its snapshot's watermark is not known
        assert guard.get_or_load("count:menus", Menu.objects.count, ttl=60) == 3
        assert guard.peek("count:menus") is MISSING
    monkeypatch.undo()
    assert guard.get_or_load("count:menus", Menu.objects.count, ttl=60) == 3
    assert guard.peek("count:menus") == 3


def test_the_transaction_hooks_go_once_every_transaction_ended(
    guard: CacheGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db.transaction import Atomic

    untracked = Atomic.__dict__["__enter__"]
    tracker = track_models(guard, {Menu: MENU_KEYS}, lock_timeout=10)
    try:
        with transaction.atomic():  # its state becomes active: locks held
            Menu.objects.create(name="Starters", slug="starters")
        with monkeypatch.context() as broken:  # a block that fails to begin
            broken.setattr(connection, "set_autocommit", _database_gone)
            with pytest.raises(ConnectionError), transaction.atomic():
                pass
    finally:
        tracker.close()
    assert Atomic.__dict__["__enter__"] is untracked  # no state left open


def _database_gone(*args: Any, **kwargs: Any) -> None:
    raise ConnectionError("the database went away")


def test_an_update_forgets_the_rows_its_queryset_had_read(
    tracker: ModelTracker, menus: list[Menu]
) -> None:
    none_yet = Menu.objects.filter(name="Salads")
    assert list(none_yet) == []
    assert none_yet.update(slug="salads") == 0
    Menu.objects.filter(pk=3).update(name="Salads")
    assert [m.pk for m in none_yet] == [3]  # read again, as without tracking
    soups = Menu.objects.filter(name="Soups")
    assert [m.pk for m in soups] == [2]
    assert soups.update(name="Broths") == 1
    assert list(soups) == []


def test_the_model_codec_refuses_unknown_fields_and_keeps_the_alias() -> None:
    from cacheguard.codecs.django_models import model_converters

    dump, load = model_converters(Menu)
    data = dump(Menu.objects.create(name="Starters", slug="starters"))
    assert load(data)._state.db == "default"
    assert load({**data, "db": "replica"})._state.db == "replica"  # where it was read from
    with pytest.raises(ValueError, match="no field 'ghost'"):  # a model that lost a field
        load({**data, "fields": {**data["fields"], "ghost": 1}})
