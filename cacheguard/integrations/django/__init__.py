"""Django integration: a cache backend with stampede protection, and ORM hooks that
keep the cache right.

- :class:`CacheGuardCache` (``cacheguard.integrations.django.cache``): a backend for
  ``CACHES`` whose ``get_or_set`` calls the default once across processes; its async
  methods run on the asyncio guard.
- :func:`track_models` (``cacheguard.integrations.django.orm``): tracked models'
  ``save``, ``delete`` and bulk ``QuerySet`` writes write-lock and invalidate their
  keys before the SQL runs and again once the outermost transaction commits.

Needs Django 4.2 or newer (``pip install 'cacheguard-redis[django]'``). See the
Django section of ``docs/guide.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.integrations.django.cache import CacheGuardCache
    from cacheguard.integrations.django.orm import track_models

__all__ = ["CacheGuardCache", "track_models"]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "CacheGuardCache": "cacheguard.integrations.django.cache",
        "track_models": "cacheguard.integrations.django.orm",
    },
)
