"""``cacheguard.sqlalchemy``, kept so that code written for it keeps working:
the SQLAlchemy integration now lives in :mod:`cacheguard.integrations.sqlalchemy`."""

from __future__ import annotations

from cacheguard.integrations.sqlalchemy import (
    CACHE_KEYS_ATTRIBUTE,
    DEFAULT_OUTBOX_TABLE,
    AsyncOutboxReplayer,
    ModelTracker,
    OutboxReplayer,
    async_outbox_depth,
    outbox_depth,
    outbox_table,
    sqlite_async_engine,
    sqlite_engine,
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
