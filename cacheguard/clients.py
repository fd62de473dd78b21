"""``cacheguard.clients``, kept so that code written for it keeps working:
the Redis deployments and URL forms now lives in :mod:`cacheguard.redis.clients`."""

from __future__ import annotations

from cacheguard.redis.clients import (
    AsyncClient,
    SyncClient,
    Target,
    aclose_async_client,
    async_client_from_url,
    check_async_client,
    check_sync_client,
    close_sync_client,
    is_cluster,
    node_namer,
    parse_url,
    replicas_expected,
    sync_client_from_url,
)

__all__ = [
    "AsyncClient",
    "SyncClient",
    "Target",
    "aclose_async_client",
    "async_client_from_url",
    "check_async_client",
    "check_sync_client",
    "close_sync_client",
    "is_cluster",
    "node_namer",
    "parse_url",
    "replicas_expected",
    "sync_client_from_url",
]
