"""Running Lua scripts on an asyncio client: :func:`arun_pipelined`, the twin of
:func:`cacheguard.redis.scripts.run_pipelined` (one pipeline per cluster node, the
nodes in parallel)."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException

from cacheguard.redis.errors import REDIS_DOWN
from cacheguard.redis.scripts import (
    Confirm,
    ScriptCall,
    _by_node,
    _checked,
    _confirmed,
    _needs_reload,
    _placed,
    _queued,
    _scripts_of,
)

__all__ = ["aclose_node_clients", "arun_pipelined"]


async def arun_pipelined(
    client: redis.asyncio.Redis | AsyncRedisCluster,
    calls: list[ScriptCall],
    confirm: Confirm | None = None,
) -> list[Any]:
    """:func:`run_pipelined` on an asyncio client."""
    if isinstance(client, AsyncRedisCluster):
        return await _arun_per_node(client, calls, confirm)
    pipe = _queued(client.pipeline(transaction=False), calls, confirm)
    results = await pipe.execute(raise_on_error=False)
    if _needs_reload(results):
        for script in _scripts_of(calls):
            await client.script_load(script.source)
        pipe = _queued(client.pipeline(transaction=False), calls, confirm)
        results = await pipe.execute(raise_on_error=False)
    return _confirmed(_checked(results), confirm)


_node_clients: weakref.WeakKeyDictionary[AsyncRedisCluster, dict[str, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary()
)


def _node_client(cluster: AsyncRedisCluster, node: Any) -> redis.asyncio.Redis:
    """A plain asyncio client of one cluster node (the asyncio cluster client offers
    no pipeline of a node's own), made with the node's connection settings."""
    per_node = _node_clients.setdefault(cluster, {})
    client = per_node.get(node.name)
    if client is None:
        pool = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, **node.connection_kwargs
        )
        client = per_node[node.name] = redis.asyncio.Redis(connection_pool=pool)
    return client


async def aclose_node_clients(cluster: object) -> None:
    """Close the per-node clients :func:`arun_pipelined` made for ``cluster`` (a guard
    closing the cluster client it made); the next call would make them again."""
    per_node = _node_clients.pop(cluster, None) if isinstance(cluster, AsyncRedisCluster) else None
    for client in (per_node or {}).values():
        await client.aclose(close_connection_pool=True)


async def _arun_per_node(
    client: AsyncRedisCluster, calls: list[ScriptCall], confirm: Confirm | None
) -> list[Any]:
    """:func:`_run_per_node` on an asyncio cluster client (the nodes in parallel)."""
    try:
        # A new client reads its slot map now rather than after a first attempt that
        # places nothing (the retry below would read it too).
        await client.initialize()
    except RedisClusterException as exc:  # no startup node answered
        raise redis.ConnectionError(str(exc)) from exc
    results: list[Any] = [None] * len(calls)
    pending = list(range(len(calls)))
    for attempt in range(2):
        again: list[int] = []
        groups = list(_by_node(client, calls, pending, results, again).values())
        batches = await asyncio.gather(
            *(
                arun_pipelined(_node_client(client, node), [calls[i] for i in indexes], confirm)
                for node, indexes in groups
            ),
            return_exceptions=True,
        )
        for (_, indexes), batch in zip(groups, batches, strict=True):
            if isinstance(batch, BaseException) and not isinstance(batch, REDIS_DOWN):
                raise batch
            replies = [batch] * len(indexes) if isinstance(batch, BaseException) else batch
            again += _placed(indexes, replies, results)
        if not again or attempt:
            break
        try:
            await client.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException, OSError):
            break
        pending = again
    return results
