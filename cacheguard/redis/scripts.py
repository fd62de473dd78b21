"""Running Lua scripts: EVALSHA with one reload on NOSCRIPT, pipelined per node.

The runner knows no script: the lock's and the cache's Lua live with their stores
(``cacheguard/locks/redis/lua.py``, ``cacheguard/cache/scripts.py``); the asyncio
runner is :mod:`cacheguard.redis.async_scripts`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.client
from redis.cluster import RedisCluster
from redis.exceptions import AskError, NoScriptError, RedisClusterException

from cacheguard.exceptions import WriteNotConfirmed
from cacheguard.redis.errors import REDIS_DOWN, REDIS_UNREACHABLE, classify

if TYPE_CHECKING:
    import redis.asyncio
    import redis.asyncio.client
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

__all__ = ["Confirm", "LuaScript", "ScriptCall", "run_pipelined"]


class LuaScript:
    """A script sent by EVALSHA, loaded on NOSCRIPT; no per-client state.

    ``script(client, keys, args)`` on a ``redis.Redis``; ``await script.acall(client,
    keys, args)`` on a ``redis.asyncio.Redis``.
    """

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis | RedisCluster, keys: list[str], args: list[Any]) -> Any:
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                # First use on this server, or after a restart / SCRIPT FLUSH. EVAL runs
                # it and caches it on the keys' own node (SCRIPT LOAD on a cluster client
                # would go to every master, and fail while any of them is down).
                return client.eval(self.source, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            error = classify(exc)
            if error is exc:
                raise
            raise error from exc

    async def acall(
        self, client: redis.asyncio.Redis | AsyncRedisCluster, keys: list[str], args: list[Any]
    ) -> Any:
        """The same call on an asyncio client."""
        try:
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                return await client.eval(self.source, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            error = classify(exc)
            if error is exc:
                raise
            raise error from exc


ScriptCall = tuple[LuaScript, list[str], list[Any]]


# (replicas that must acknowledge, seconds to wait): a WAIT after the calls.
Confirm = tuple[int, float]


def run_pipelined(
    client: redis.Redis | RedisCluster, calls: list[ScriptCall], confirm: Confirm | None = None
) -> list[Any]:
    """Run script calls in one pipelined round trip (EVALSHA, one reload on NOSCRIPT).

    Returns one result per call; an error reply comes back as the exception
    object (the caller decides), while a lost connection raises. With ``confirm``,
    a WAIT follows the calls on their connection, and the results of calls that
    too few replicas acknowledged in time are :class:`WriteNotConfirmed` errors.
    On a cluster the calls go in one pipeline per node, and a node's failure is the
    error of its calls only (the others' results stand).
    """
    if isinstance(client, RedisCluster):
        return _run_per_node(client, calls, confirm)
    results = _queued(client.pipeline(transaction=False), calls, confirm).execute(
        raise_on_error=False
    )
    if _needs_reload(results):
        for script in _scripts_of(calls):  # server restarted or flushed
            client.script_load(script.source)
        results = _queued(client.pipeline(transaction=False), calls, confirm).execute(
            raise_on_error=False
        )
    return _confirmed(_checked(results), confirm)


def _by_node(
    client: Any, calls: list[ScriptCall], indexes: list[int], results: list[Any], again: list[int]
) -> dict[str, tuple[Any, list[int]]]:
    """``indexes`` of ``calls`` grouped by the node serving their keys now; a call
    whose slot has no node in the client's slot map (a failover, or a map read
    while a node was down) gets the error as its result and goes in ``again``."""
    groups: dict[str, tuple[Any, list[int]]] = {}
    for index in indexes:
        try:
            node = client.get_node_from_key(calls[index][1][0])
        except REDIS_DOWN as exc:
            results[index] = exc
            again.append(index)
            continue
        groups.setdefault(node.name, (node, []))[1].append(index)
    return groups


def _placed(indexes: list[int], replies: list[Any], results: list[Any]) -> list[int]:
    """Put one node's ``replies`` in ``results``; the indexes of the calls that must go
    again once the slot map is read anew (redirected: MOVED is an AskError; or their
    node failed)."""
    again = []
    for index, reply in zip(indexes, replies, strict=True):
        results[index] = reply
        if isinstance(reply, (AskError, *REDIS_DOWN)):
            again.append(index)
    return again


def _run_per_node(
    client: RedisCluster, calls: list[ScriptCall], confirm: Confirm | None
) -> list[Any]:
    """:func:`run_pipelined` on a cluster. Calls a node redirects, or whose node failed,
    go once more after the client reads the slot map again; what still fails is
    that call's result."""
    results: list[Any] = [None] * len(calls)
    pending = list(range(len(calls)))
    for attempt in range(2):
        again: list[int] = []
        for node, indexes in _by_node(client, calls, pending, results, again).values():
            try:
                replies = run_pipelined(node.redis_connection, [calls[i] for i in indexes], confirm)
            except REDIS_DOWN as exc:
                replies = [exc] * len(indexes)
            again += _placed(indexes, replies, results)
        if not again or attempt:
            break
        try:
            client.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException, OSError):
            break  # no node answers: the errors stand
        pending = again
    return results


_Pipeline = TypeVar("_Pipeline", redis.client.Pipeline, redis.asyncio.client.Pipeline)


def _queued(pipe: _Pipeline, calls: list[ScriptCall], confirm: Confirm | None) -> _Pipeline:
    for script, keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    if confirm is not None:
        replicas, seconds = confirm
        pipe.execute_command("WAIT", replicas, max(1, int(seconds * 1000)))  # type: ignore[no-untyped-call]
    return pipe


def _confirmed(results: list[Any], confirm: Confirm | None) -> list[Any]:
    """The calls' results, WAIT's reply taken off the end; with too few replicas
    acknowledging, every successful call's result becomes WriteNotConfirmed."""
    if confirm is None:
        return results
    acked, results = results[-1], results[:-1]
    replicas, seconds = confirm
    if isinstance(acked, int) and acked >= replicas:
        return results
    error = WriteNotConfirmed(
        f"{acked if isinstance(acked, int) else 'no'} of {replicas} replica(s) acknowledged "
        f"the write within {seconds} s (WAIT): a failover now could lose it"
    )
    return [r if isinstance(r, Exception) else error for r in results]


def _needs_reload(results: list[Any]) -> bool:
    return any(isinstance(r, NoScriptError) for r in results)


def _scripts_of(calls: list[ScriptCall]) -> set[LuaScript]:
    return {script for script, _, _ in calls}


def _checked(results: list[Any]) -> list[Any]:
    """``results`` as a list, error replies classified; raises the first "Redis
    unreachable" error among them."""
    for r in results:
        if isinstance(r, REDIS_UNREACHABLE):
            raise r
    return [classify(r) if isinstance(r, redis.ResponseError) else r for r in results]
