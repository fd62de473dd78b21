"""The app's start-up: the ORM hooks and the default guard, once per process."""

from __future__ import annotations

from django.apps import AppConfig


class MenusConfig(AppConfig):  # type: ignore[misc]  # django ships no type hints
    name = "menu_django.menus"
    label = "menus"

    def ready(self) -> None:
        from django.core.cache import caches

        import cacheguard
        from cacheguard.integrations.django import track_models

        from . import signals
        from .models import MENU_KEYS, Menu

        cache = caches["default"]
        # Every save(), delete() and bulk QuerySet write of a Menu write-locks and
        # invalidates these keys (old and new field values) before its SQL, and again
        # once the outermost transaction commits: the keys of Django's cache API and
        # the guard's own names (of the decorated reads) both.
        track_models(cache, {Menu: MENU_KEYS})
        # The functions of reads.py decorated without a guard read through the
        # backend's guard: the same Redis, namespace and names as the tracker's.
        cacheguard.use(cache.guard)
        signals.connect()  # the plain cache's invalidation, for the demo's comparison
