"""SQLAlchemy integration: sessions that keep the cache right by themselves.

``track_models(guard, Session, {Menu: ("menu:list", "menu:{id}")})`` hooks a
session factory so that every transaction that changes a ``Menu`` write-locks
and invalidates the keys it affects, holds the locks until the outermost
transaction ends, and invalidates again after the commit. Sessions from the
factory also record a snapshot watermark when their transaction begins, so a
fill loaded from an older snapshot cannot store a replaced row. With an
``AsyncCacheGuard``, pass an ``async_sessionmaker``: the same hooks run for
``AsyncSession``.

With ``outbox=True`` tracked writes go on while Redis is unreachable: their
invalidations go to an outbox table (:func:`outbox_table`) in the same
transaction and are replayed once Redis is back (see ``docs/outage.md``).

Needs SQLAlchemy 2.0 (``pip install 'cacheguard-redis[sqlalchemy]'``). See
``docs/guide.md`` (how to use it) and ``docs/design.md`` (how it works).
"""

from __future__ import annotations

try:
    import sqlalchemy  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cacheguard.integrations.sqlalchemy needs SQLAlchemy 2.0: "
        "pip install 'cacheguard-redis[sqlalchemy]'"
    ) from exc

from cacheguard.integrations.sqlalchemy.outbox import (
    DEFAULT_OUTBOX_TABLE,
    AsyncOutboxReplayer,
    OutboxReplayer,
    async_outbox_depth,
    outbox_depth,
    outbox_table,
)
from cacheguard.integrations.sqlalchemy.sqlite import sqlite_async_engine, sqlite_engine
from cacheguard.integrations.sqlalchemy.tracker import (
    CACHE_KEYS_ATTRIBUTE,
    ModelTracker,
    track_models,
)

__all__ = [
    "CACHE_KEYS_ATTRIBUTE",
    "DEFAULT_OUTBOX_TABLE",
    "AsyncOutboxReplayer",
    "ModelTracker",
    "OutboxReplayer",
    "async_outbox_depth",
    "outbox_depth",
    "outbox_table",
    "sqlite_async_engine",
    "sqlite_engine",
    "track_models",
]
