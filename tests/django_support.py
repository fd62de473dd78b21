"""Helpers and child-process bodies for the Django ORM hook tests
(tests/test_django_orm.py): children configure Django on the parent's database
(tests/django_settings.py) and build their guard from the Redis URL."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from cacheguard import CacheGuard, cached_with_lock
from tests.django_settings import DjangoDatabase, configure_django
from tests.helpers import client_for, make_guard

MENU_KEYS = ("menu:list", "menu:{id}", "menu:{slug}", "menus:by-owner:{owner_id}")
DISH_KEYS = ("menu:{menu_id}:dishes",)


def lock_is_free(guard: CacheGuard, name: str) -> bool:
    """Another owner could take the write lock of ``name`` right now."""
    handle = guard.rwlock(name).remote.try_acquire_write(owner=f"probe-{uuid.uuid4().hex}")
    if handle is None:
        return False
    handle.release()
    return True


def waiting_in_process(guard: CacheGuard, name: str) -> bool:
    """Is a thread of this process blocked on the local tier of ``name``'s lock?
    (CPython's Condition keeps its sleeping threads in ``_waiters``.)"""
    return bool(guard.rwlock(name).local._cond._waiters)  # type: ignore[attr-defined]


# -- the churn: readers and a writer in separate processes -----------------------------------------

CHURN_MENUS = 4


def _committed_key(namespace: str, menu_id: int) -> str:
    return f"{namespace}:test:committed:{menu_id}"


CHURN_CHECKED = 300  # checked reads the readers make at least while the writer writes
CHURN_SNAPSHOT_READS = 60  # and reads inside old snapshots


def churn_writer(
    redis_url: str, namespace: str, database: DjangoDatabase, writes: int, readers: int
) -> dict[str, int]:
    """Bump ``version`` of the menus at least ``writes`` times (and until the readers
    made their reads), in a mix of tracked writes (save, QuerySet.update, bulk_update;
    in atomic blocks, savepoints and autocommit); after each write returned, record
    the versions it committed in Redis."""
    configure_django(database=database)
    from django.db import transaction
    from django.db.models import F

    from cacheguard.integrations.django import track_models
    from tests.django_app.models import Menu

    client = client_for(redis_url)
    guard = make_guard(client, namespace, wait_timeout=30)
    tracker = track_models(guard, {Menu: MENU_KEYS}, lock_timeout=30)
    rng = random.Random(7)
    kinds = {"save": 0, "update": 0, "bulk_update": 0, "autocommit": 0, "savepoint": 0}
    try:
        deadline = time.monotonic() + 60
        while int(client.get(f"{namespace}:test:readers-ready") or 0) < readers:
            assert time.monotonic() < deadline, "the readers did not start"
            time.sleep(0.005)  # test-side polling for the start, nothing synchronised by it
        client.set(f"{namespace}:test:writer-ready", "1")
        index = 0
        while index < writes or not _reads_done(client, namespace):
            assert time.monotonic() < deadline + 60, "the readers read too little"
            index += 1
            ids = rng.sample(range(1, CHURN_MENUS + 1), 2)
            kind = list(kinds)[index % len(kinds)]
            kinds[kind] += 1
            if kind == "save":
                with transaction.atomic():
                    menu = Menu.objects.get(pk=ids[0])
                    menu.version += 1
                    menu.save()
            elif kind == "update":
                with transaction.atomic():
                    Menu.objects.filter(pk__in=ids).update(version=F("version") + 1)
            elif kind == "bulk_update":
                with transaction.atomic():
                    menus = list(Menu.objects.filter(pk__in=ids))
                    for menu in menus:
                        menu.version += 1
                    Menu.objects.bulk_update(menus, ["version"])
            elif kind == "autocommit":
                Menu.objects.filter(pk=ids[0]).update(version=F("version") + 1)
            else:
                with transaction.atomic(), transaction.atomic():  # a savepoint
                    menu = Menu.objects.get(pk=ids[0])
                    menu.version += 1
                    menu.save(update_fields=["version"])
            # The write has returned: what it committed is what every later read sees.
            for menu_id, version in Menu.objects.filter(pk__in=ids).values_list("id", "version"):
                client.set(_committed_key(namespace, menu_id), version)
        return kinds
    finally:
        client.set(f"{namespace}:test:writer-done", "1")
        tracker.close()
        guard.close()
        client.close()


def _reads_done(client: Any, namespace: str) -> bool:
    checked, snapshot_reads = client.mget(
        f"{namespace}:test:checked", f"{namespace}:test:snapshot-reads"
    )
    return int(checked or 0) >= CHURN_CHECKED and int(snapshot_reads or 0) >= CHURN_SNAPSHOT_READS


def churn_reader(
    redis_url: str, namespace: str, database: DjangoDatabase, snapshots: bool, seed: int
) -> dict[str, int]:
    """Read the menus through ``@cached_with_lock`` until the writer is done.

    Every read in autocommit mode is checked: the version it returns must be at least
    the one committed (and recorded) before it began. With ``snapshots``, every other
    round also reads inside a ``REPEATABLE READ`` transaction kept open over several
    reads (its values may be old: they are its snapshot's; what it must not do is
    store them, which the checked reads would see)."""
    configure_django(database=database)
    from django.db import connections, transaction

    from cacheguard.integrations.django import track_models
    from tests.django_app.models import Menu

    client = client_for(redis_url)
    guard = make_guard(client, namespace, wait_timeout=30)
    tracker = track_models(guard, {Menu: MENU_KEYS})  # the snapshot hooks of this process

    # type= as the annotation names Menu, imported here: not a name the module has.
    @cached_with_lock(guard, key="menu:{menu_id}", ttl=60, type=Menu | None)
    def get_menu(menu_id: int, using: str = "default") -> Menu | None:
        return Menu.objects.using(using).filter(pk=menu_id).first()

    rng = random.Random(seed)
    counts = {"checked": 0, "stale": 0, "snapshot_reads": 0, "rounds": 0}
    stale: list[str] = []
    try:
        get_menu(1)  # Django and the guard warmed up
        client.incr(f"{namespace}:test:readers-ready")
        while not client.get(f"{namespace}:test:writer-ready"):
            time.sleep(0.005)  # test-side polling for the start, nothing synchronised by it
        while not client.get(f"{namespace}:test:writer-done"):
            counts["rounds"] += 1
            if snapshots and counts["rounds"] % 2 == 0:
                with transaction.atomic(using="repeatable"):
                    Menu.objects.using("repeatable").count()  # the snapshot is taken here
                    for _ in range(6):
                        get_menu(rng.randint(1, CHURN_MENUS), using="repeatable")
                        counts["snapshot_reads"] += 1
                client.incrby(f"{namespace}:test:snapshot-reads", 6)
                continue
            client.incrby(f"{namespace}:test:checked", 6)
            for _ in range(6):
                menu_id = rng.randint(1, CHURN_MENUS)
                committed = int(client.get(_committed_key(namespace, menu_id)) or 0)
                menu = get_menu(menu_id)
                counts["checked"] += 1
                assert menu is not None
                if menu.version < committed:
                    counts["stale"] += 1
                    stale.append(f"menu {menu_id}: read {menu.version}, committed {committed}")
        if stale:
            print("stale reads:", stale[:10])
        return counts
    finally:
        tracker.close()
        guard.close()
        client.close()
        connections.close_all()


# -- the key-moving churn: menus change owners, come and go ---------------------------------------

MOVING_OWNERS = 3
MOVING_MENUS = 6
MOVING_KEYS = ("menu:list", "menus:by-owner:{owner_id}")
MOVING_CHECKED = 240  # checked reads the readers make at least, over all their kinds
MOVING_KINDS = ("save", "update", "bulk_update", "update_or_create", "delete_and_create")


def _moving_cache(redis_url: str, namespace: str) -> Any:
    from cacheguard.integrations.django import CacheGuardCache

    return CacheGuardCache(redis_url, {"OPTIONS": {"namespace": namespace, "wait_timeout": 30}})


def _moving_state(client: Any, namespace: str) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """(writes begun, writes ended, the rows committed: id -> (version, owner))."""
    begun, ended, rows = client.mget(
        f"{namespace}:test:begun", f"{namespace}:test:ended", f"{namespace}:test:rows"
    )
    committed = {
        int(i): (int(v), int(o))
        for i, v, o in (part.split(",") for part in (rows or b"").decode().split(";") if part)
    }
    return int(begun or 0), int(ended or 0), committed


def moving_churn_writer(
    redis_url: str, namespace: str, database: DjangoDatabase, writes: int, readers: int
) -> dict[str, int]:
    """Move menus between owners with every kind of write (save, QuerySet.update,
    bulk_update, update_or_create, a delete and a create), tracked through the cache
    backend, ``writes`` times at least and until the readers checked enough. Around
    each write: a counter of writes begun before it, and after its commit the rows
    committed and a counter of writes ended."""
    configure_django(database=database)
    from django.db import transaction
    from django.db.models import F

    from cacheguard.integrations.django import track_models
    from tests.django_app.models import Menu

    client = client_for(redis_url)
    cache = _moving_cache(redis_url, namespace)
    tracker = track_models(cache, {Menu: MOVING_KEYS}, lock_timeout=30)
    rng = random.Random(11)
    kinds = dict.fromkeys(MOVING_KINDS, 0)
    created = 0
    try:
        deadline = time.monotonic() + 60
        while int(client.get(f"{namespace}:test:readers-ready") or 0) < readers:
            assert time.monotonic() < deadline, "the readers did not start"
            time.sleep(0.005)  # test-side polling for the start, nothing synchronised by it
        index = 0
        while index < writes or int(client.get(f"{namespace}:test:checked") or 0) < MOVING_CHECKED:
            assert time.monotonic() < deadline + 60, "the readers read too little"
            kind = MOVING_KINDS[index % len(MOVING_KINDS)]
            index += 1
            kinds[kind] += 1
            ids = list(Menu.objects.order_by("id").values_list("id", flat=True))
            first, second = rng.sample(ids, 2)
            owner = rng.randint(1, MOVING_OWNERS)
            client.incr(f"{namespace}:test:begun")
            if kind == "save":
                with transaction.atomic():
                    menu = Menu.objects.get(pk=first)
                    menu.owner_id, menu.version = owner, menu.version + 1
                    menu.save()
            elif kind == "update":  # autocommit: its own transaction
                Menu.objects.filter(pk=first).update(owner_id=owner, version=F("version") + 1)
            elif kind == "bulk_update":
                with transaction.atomic():
                    menus = list(Menu.objects.filter(pk__in=[first, second]))
                    for menu in menus:
                        menu.owner_id, menu.version = owner, menu.version + 1
                    Menu.objects.bulk_update(menus, ["owner", "version"])
            elif kind == "update_or_create":
                slug, version = Menu.objects.filter(pk=first).values_list("slug", "version")[0]
                Menu.objects.update_or_create(
                    slug=slug, defaults={"owner_id": owner, "version": version + 1}
                )
            else:  # a menu goes, another comes (a new id: nothing reuses an old one)
                with transaction.atomic():
                    Menu.objects.filter(pk=first).delete()
                    created += 1
                    Menu.objects.create(
                        name=f"new {created}", slug=f"new-{created}", owner_id=owner
                    )
            rows = ";".join(
                f"{i},{v},{o}" for i, v, o in Menu.objects.values_list("id", "version", "owner_id")
            )
            client.set(f"{namespace}:test:rows", rows)
            exact = int(client.get(f"{namespace}:test:exact") or 0)
            client.incr(f"{namespace}:test:ended")
            if index % 5 == 0:  # a quiet moment: until a reader compared a read whole
                while int(client.get(f"{namespace}:test:exact") or 0) <= exact:
                    assert time.monotonic() < deadline + 60, "no read compared whole"
                    time.sleep(0.002)  # test-side polling, nothing synchronised by it
        return kinds
    finally:
        client.set(f"{namespace}:test:writer-done", "1")
        tracker.close()
        cache.shutdown()
        client.close()


def moving_churn_reader(
    redis_url: str, namespace: str, database: DjangoDatabase, snapshots: bool, seed: int
) -> dict[str, Any]:
    """Read owners' menus and the whole list, through ``@cached_with_lock`` on the
    backend's guard and through ``cache.get_or_set``, until the writer is done.

    A read is checked against the rows committed before it began: no menu in it has
    an older version, none deleted before is listed; and when no write was under way
    from before it to after it, it is exactly the committed rows. With ``snapshots``,
    every third round reads inside a ``REPEATABLE READ`` transaction (old values are
    its snapshot's: they must not be stored, which the checked reads would see)."""
    configure_django(database=database)
    from django.db import connections, transaction

    from cacheguard.integrations.django import track_models
    from tests.django_app.models import Menu

    client = client_for(redis_url)
    cache = _moving_cache(redis_url, namespace)
    tracker = track_models(cache, {Menu: MOVING_KEYS})  # the snapshot hooks of this process

    def rows_of(owner_id: int | None, using: str) -> list[list[int]]:
        query = Menu.objects.using(using).order_by("id")
        if owner_id is not None:
            query = query.filter(owner_id=owner_id)
        return [list(row) for row in query.values_list("id", "version", "owner_id")]

    @cached_with_lock(cache.guard, key="menus:by-owner:{owner_id}", ttl=60)
    def owner_menus(owner_id: int, using: str = "default") -> list[list[int]]:
        return rows_of(owner_id, using)

    def read(kind: str, owner_id: int, using: str = "default") -> list[list[int]]:
        if kind == "decorated":
            return owner_menus(owner_id, using)
        if kind == "cache_api":
            key = f"menus:by-owner:{owner_id}"  # built by hand, as Django code does
            return list(cache.get_or_set(key, lambda: rows_of(owner_id, using), 60))
        return list(cache.get_or_set("menu:list", lambda: rows_of(None, using), 60))

    rng = random.Random(seed)
    counts: dict[str, Any] = {"decorated": 0, "cache_api": 0, "list": 0, "exact": 0}
    counts.update(stale=0, snapshot_reads=0, rounds=0)
    stale: list[str] = []
    try:
        read("list", 1)  # Django, the cache and the guard warmed up
        client.incr(f"{namespace}:test:readers-ready")
        while not client.get(f"{namespace}:test:writer-done"):
            counts["rounds"] += 1
            if snapshots and counts["rounds"] % 3 == 0:
                with transaction.atomic(using="repeatable"):
                    Menu.objects.using("repeatable").count()  # the snapshot is taken here
                    for kind in ("decorated", "cache_api", "list"):
                        read(kind, rng.randint(1, MOVING_OWNERS), using="repeatable")
                        counts["snapshot_reads"] += 1
                continue
            done = counts["decorated"] + counts["cache_api"] + counts["list"]
            kind = ("decorated", "cache_api", "list")[done % 3]
            owner = rng.randint(1, MOVING_OWNERS)
            begun, ended, before = _moving_state(client, namespace)
            got = {i: (v, o) for i, v, o in read(kind, owner)}
            after_begun, _, _ = _moving_state(client, namespace)
            counts[kind] += 1
            client.incr(f"{namespace}:test:checked")
            expected = {i: row for i, row in before.items() if kind == "list" or row[1] == owner}
            for menu_id, (version, _) in got.items():
                if menu_id in before and version < before[menu_id][0]:
                    stale.append(f"{kind} {owner}: menu {menu_id} v{version} < {before[menu_id]}")
                elif menu_id not in before and before and menu_id < max(before):
                    stale.append(f"{kind} {owner}: menu {menu_id} deleted before, listed")
            if begun == ended == after_begun:  # no write under way from before to after
                counts["exact"] += 1
                client.incr(f"{namespace}:test:exact")
                if got != expected:
                    stale.append(f"{kind} {owner}: read {got}, committed {expected}")
        counts["stale"] = len(stale)
        if stale:
            print("stale reads:", stale[:10])
        return counts
    finally:
        tracker.close()
        cache.shutdown()
        client.close()
        connections.close_all()
