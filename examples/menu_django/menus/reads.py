"""The menus' reads, both ways the cacheguard backend offers.

- ``menu_list``: Django's cache API, ``cache.get_or_set("menu:list", load, ttl)``, the
  same call on either backend (the demo compares them); ``track_models(cache, ...)``
  invalidates it under the same key.
- ``menu_detail`` and ``menus_of``: ``@cached_with_lock``, model instances, under the
  guard's own names (``menu:{menu_id}`` and the tracked ``menu:{id}`` both render
  ``menu:7``); ``track_models(cache.guard, ...)`` invalidates them. They name no
  guard: they read through the default one, which ``MenusConfig.ready()`` installs
  (``cacheguard.use(caches["default"].guard)``), so they are defined at import time,
  before any cache exists.
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


def menu_list(alias: str = "default") -> list[dict[str, Any]]:
    """Every menu, through Django's cache API: ``caches[alias].get_or_set``. On the
    cacheguard backend (``default``) one caller across processes loads a missing
    list while the others wait for it; on Django's own (``plain``, for the demo's
    comparison) every caller that misses loads it."""
    value: list[dict[str, Any]] = caches[alias].get_or_set("menu:list", load_menu_list, TTL)
    return value


@cached_with_lock(key="menu:{menu_id}", ttl=TTL)
def menu_detail(menu_id: int) -> Menu | None:
    """One menu as a model instance, cached as ``menu:{id}`` (a missing one too)."""
    menu: Menu | None = Menu.objects.filter(pk=menu_id).first()
    return menu


@cached_with_lock(key="menu:owner:{owner}", ttl=TTL)
def menus_of(owner: str) -> list[Menu]:
    """An owner's menus as model instances, cached as ``menu:owner:{owner}``."""
    return list(Menu.objects.filter(owner=owner).order_by("id"))
