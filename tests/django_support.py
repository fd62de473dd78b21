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
