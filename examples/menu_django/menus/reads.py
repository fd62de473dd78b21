"""The menus' reads: through cacheguard (``@cached_with_lock``), and the same list
through Django's own Redis backend (``caches["plain"].get_or_set``) for the demo.

The decorated functions name no guard: they read through the default one, which
``MenusConfig.ready()`` installs (``cacheguard.use(caches["default"].guard)``), so
they are defined at import time, before any cache exists. Their keys are the ones
``track_models`` invalidates (``models.MENU_KEYS``): ``menu:{menu_id}`` and
``menu:{id}`` both render ``menu:7``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.cache import caches

from cacheguard import cached_with_lock

from .models import Menu

TTL = 300.0


@dataclass
class Slowness:
    """What makes building the list hurt: the demo sets it in its processes. After the
    query, ``after_query`` (if any) runs, then the build takes ``build_seconds``."""

    build_seconds: float = 0.0
    after_query: Callable[[], None] | None = None


SLOWNESS = Slowness()


def load_menu_list() -> list[dict[str, Any]]:
    """The list from the database: one SELECT, then the (slow) build."""
    rows = [menu.to_dict() for menu in Menu.objects.order_by("id")]
    if SLOWNESS.after_query is not None:
        SLOWNESS.after_query()
    if SLOWNESS.build_seconds:
        time.sleep(SLOWNESS.build_seconds)  # joins, permissions, rendering: the slow part
    return rows


@cached_with_lock(key="menu:list", ttl=TTL)
def menu_list() -> list[dict[str, Any]]:
    """Every menu, cached as ``menu:list``: one load across processes on a miss."""
    return load_menu_list()


@cached_with_lock(key="menu:{menu_id}", ttl=TTL)
def menu_detail(menu_id: int) -> Menu | None:
    """One menu as a model instance, cached as ``menu:{id}`` (a missing one too)."""
    menu: Menu | None = Menu.objects.filter(pk=menu_id).first()
    return menu


@cached_with_lock(key="menu:owner:{owner}", ttl=TTL)
def menus_of(owner: str) -> list[Menu]:
    """An owner's menus as model instances, cached as ``menu:owner:{owner}``."""
    return list(Menu.objects.filter(owner=owner).order_by("id"))


def plain_menu_list() -> list[dict[str, Any]]:
    """The same list through Django's own Redis backend (``caches["plain"]``): every
    caller that misses loads it, and ``menus/signals.py`` deletes it on writes."""
    value: list[dict[str, Any]] = caches["plain"].get_or_set("menu:list", load_menu_list, TTL)
    return value
