"""The ``Menu`` model and the cache keys a change to one of its rows affects.

Its table has a name of its own, ``cacheguard_django_menu``: the demo drops, creates
and fills only it, never another table of the database it is pointed at.
"""

from __future__ import annotations

from typing import Any

from django.db import models

# The keys a row's change affects (track_models renders them from the row's fields,
# the old values and the new). Tracked through the cache, each names both kinds of
# key the reads use (menus/reads.py): the key of Django's cache API
# (cache.get_or_set("menu:list", ...)), mapped as the backend maps it (KEY_PREFIX,
# VERSION), and the guard's own name, that of the @cached_with_lock reads.
# A menu moved to another owner refreshes both owners' lists.
MENU_KEYS = ("menu:list", "menu:{id}", "menu:owner:{owner}")


class Menu(models.Model):  # type: ignore[misc]  # django ships no type hints
    name = models.CharField(max_length=100)
    price = models.PositiveIntegerField(default=0, help_text="in cents")
    owner = models.CharField(max_length=50, db_index=True)

    class Meta:
        app_label = "menus"
        db_table = "cacheguard_django_menu"
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.name} ({self.owner})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "name": self.name, "price": self.price, "owner": self.owner}


EDITABLE = ("name", "price", "owner")
