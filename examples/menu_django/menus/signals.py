"""How Django projects usually keep ``caches["plain"]`` in step: delete the keys once
the write commits. The demo shows what that leaves open: a reader that queried
before the commit stores the old list after it (and a changed owner's old list is
never deleted: a signal sees only the new row). cacheguard's ``track_models``
(``apps.py``) closes both."""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from .models import Menu


def _forget(instance: Menu) -> None:
    keys = ["menu:list", f"menu:{instance.pk}", f"menu:owner:{instance.owner}"]
    transaction.on_commit(lambda: caches["plain"].delete_many(keys))


def _saved(sender: type[Menu], instance: Menu, **kwargs: Any) -> None:
    _forget(instance)


def _deleted(sender: type[Menu], instance: Menu, **kwargs: Any) -> None:
    _forget(instance)


def connect() -> None:
    post_save.connect(_saved, sender=Menu, dispatch_uid="menu_django.plain.saved")
    post_delete.connect(_deleted, sender=Menu, dispatch_uid="menu_django.plain.deleted")
