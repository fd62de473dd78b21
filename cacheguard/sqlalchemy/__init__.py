"""SQLAlchemy integration: sessions that keep the cache right by themselves.

``track_models(guard, Session, {Menu: ("menu:list", "menu:{id}")})`` hooks a
session factory so that every transaction that changes a ``Menu`` write-locks
and invalidates the keys it affects, holds the locks until the outermost
transaction ends, and invalidates again after the commit. Sessions from the
factory also record a snapshot watermark when their transaction begins, so a
fill loaded from an older snapshot cannot store a replaced row. With an
``AsyncCacheGuard``, pass an ``async_sessionmaker``: the same hooks run for
``AsyncSession``.

Needs SQLAlchemy 2.0 (``pip install 'cacheguard[sqlalchemy]'``). See
``docs/guide.md`` (how to use it) and ``docs/design.md`` (how it works).
"""

from __future__ import annotations

try:
    import sqlalchemy  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cacheguard.sqlalchemy needs SQLAlchemy 2.0: pip install 'cacheguard[sqlalchemy]'"
    ) from exc

from cacheguard.sqlalchemy.sqlite import sqlite_async_engine, sqlite_engine
from cacheguard.sqlalchemy.tracker import CACHE_KEYS_ATTRIBUTE, ModelTracker, track_models

__all__ = [
    "CACHE_KEYS_ATTRIBUTE",
    "ModelTracker",
    "sqlite_async_engine",
    "sqlite_engine",
    "track_models",
]
