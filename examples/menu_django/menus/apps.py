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
        from .models import CACHE_API_KEYS, GUARD_KEYS, Menu

        cache = caches["default"]
        # Every save(), delete() and bulk QuerySet write of a Menu write-locks and
        # invalidates these keys (old and new field values) before its SQL, and again
        # once the outermost transaction commits. Given the cache, the templates are
        # keys of Django's cache API; given its guard, the guard's own names.
        track_models(cache, {Menu: CACHE_API_KEYS})
        track_models(cache.guard, {Menu: GUARD_KEYS})
        # The functions of reads.py decorated without a guard read through the
        # backend's guard: the same Redis, namespace and names as the second tracker.
        cacheguard.use(cache.guard)
        signals.connect()  # the plain cache's invalidation, for the demo's comparison
