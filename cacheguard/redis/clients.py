"""The Redis deployments cacheguard runs on, through redis-py's own clients.

* one server: ``redis.Redis`` (URLs ``redis://``, ``rediss://``, ``unix://``);
* a master watched by Sentinel: ``Sentinel(...).master_for(name)``, a
  ``redis.Redis`` whose pool finds the master again after a failover
  (``redis+sentinel://``);
* a Redis Cluster: ``redis.cluster.RedisCluster`` (``redis+cluster://``);

and the ``redis.asyncio`` twin of each. Every key of a resource shares one hash
slot and every script touches one resource, so the scripts run unchanged on all
three; what differs is kept in two places that ask :func:`is_cluster`: script
batches (pipelined per node on a cluster, see ``redis/scripts.py``) and pub/sub
(one listener per shard, see ``redis/notifier.py``).

URL forms for ``from_url``::

    redis://[[user]:password@]host[:port][/db]             one server (redis-py's own form)
    redis+cluster://[[user]:password@]host:port[,host:port...]
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]

``rediss+cluster://`` and ``rediss+sentinel://`` connect with TLS. The password
of a cluster or Sentinel URL is the data nodes'; the sentinels are asked without
one.
"""

from __future__ import annotations

import asyncio
import collections
import select
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

try:  # a redis-py with maintenance notifications (see _idle_connections_checked)
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # an older redis-py, without them
    MaintNotificationsConfig = None  # type: ignore[assignment, misc]

__all__ = [
    "AsyncClient",
    "NoConnectionAvailable",
    "QueueingPool",
    "QuickCheckConnection",
    "SyncClient",
    "Target",
    "aclose_async_client",
    "async_client_from_url",
    "check_async_client",
    "check_sync_client",
    "close_sync_client",
    "direct_aget",
    "direct_get",
    "is_cluster",
    "node_namer",
    "parse_url",
    "pool_exhausted",
    "replicas_expected",
    "sync_client_from_url",
]

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_CLUSTERS = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)


def is_cluster(client: object) -> bool:
    """Is ``client`` a Redis Cluster client (sync or asyncio)?"""
    return isinstance(client, _CLUSTERS)


def node_namer(client: object) -> Callable[[str], str] | None:
    """For a cluster client, a function naming the node that serves a key now (from
    the client's own slot map); None for a single server or a Sentinel master."""
    if not isinstance(client, _CLUSTERS):
        return None
    cluster: Any = client

    def node_of(key: str) -> str:
        name: str = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key)).name
        return name

    return node_of


def replicas_expected(client: object) -> Callable[[], int]:
    """How many replicas must acknowledge a write-path invalidation when a guard's
    ``confirm_replicas`` is left to choose: one behind a Sentinel master (Sentinel is
    there to fail over to a replica) and on a cluster whose client knows replicas
    (asked at each write: an asyncio cluster client learns its nodes on first use);
    none on a single server."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(
        pool,
        (redis.sentinel.SentinelConnectionPool, redis.asyncio.sentinel.SentinelConnectionPool),
    ):
        return lambda: 1
    if isinstance(client, _CLUSTERS):
        cluster: Any = client
        return lambda: 1 if cluster.get_replicas() else 0
    return lambda: 0


def check_sync_client(client: object, who: str) -> None:
    """Refuse what ``who`` (a sync class) cannot use: an asyncio client, another
    object, or a client that decodes replies to str."""
    if not isinstance(client, (redis.Redis, redis.cluster.RedisCluster)):
        hint = (
            " (use the asyncio twin from cacheguard.aio for a redis.asyncio client)"
            if isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster))
            else ""
        )
        raise TypeError(
            f"{who} needs a redis.Redis or redis.cluster.RedisCluster client, "
            f"not {type(client).__name__}{hint}"
        )
    _check_bytes(client, who)


def check_async_client(client: object, who: str) -> None:
    """:func:`check_sync_client` for the asyncio classes."""
    if not isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
        raise TypeError(
            f"{who} needs a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster "
            f"client, not {type(client).__name__}"
            + (" (use the sync class for a sync client)" if isinstance(client, SyncClient) else "")
        )
    _check_bytes(client, who)


def _check_bytes(client: Any, who: str) -> None:
    if client.get_encoder().decode_responses:
        raise ValueError(f"{who} needs a client with decode_responses=False (it stores bytes)")


@dataclass(frozen=True)
class Target:
    """What a URL names: one server (``url``), a cluster (its ``nodes``), or a
    Sentinel ``service`` (its sentinels are ``nodes``)."""

    kind: Literal["server", "cluster", "sentinel"]
    url: str = ""
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)  # username, password, ssl


def parse_url(url: str) -> Target:
    """The deployment ``url`` names (the module docstring lists the forms)."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    scheme, _, rest = url.partition("://")
    base, _, kind = scheme.lower().partition("+")
    if not kind:
        return Target("server", url=url)
    if base not in ("redis", "rediss") or kind not in ("cluster", "sentinel") or not rest:
        raise ValueError(
            f"unsupported Redis URL {_redacted(url)!r}: expected redis://, rediss://, unix://, "
            "redis+cluster://host:port[,host:port...] or "
            "redis+sentinel://host:port[,host:port...]/service[/db]"
        )
    parts = urlsplit(f"{base}://{rest}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    options: dict[str, Any] = {"ssl": base == "rediss"}
    if user:
        options["username"] = unquote(user)
    if password:
        options["password"] = unquote(password)
    nodes = tuple(
        _host_port(h, url, 26379 if kind == "sentinel" else 6379) for h in hosts.split(",")
    )
    path = [p for p in parts.path.split("/") if p]
    if kind == "cluster":
        if path:
            raise ValueError(f"a cluster URL names no database or service: {_redacted(url)!r}")
        return Target("cluster", nodes=nodes, options=options)
    if not path or len(path) > 2:
        raise ValueError(f"a Sentinel URL needs /service[/db]: {_redacted(url)!r}")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"the database of a Sentinel URL is a number: {_redacted(url)!r}")
    return Target("sentinel", nodes=nodes, service=unquote(path[0]), db=int(db), options=options)


def _host_port(text: str, url: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":") or str(default_port)
    elif ":" in text:
        host, _, port = text.rpartition(":")
    else:
        host, port = text, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad host:port {text!r} in {_redacted(url)!r}")
    return host, int(port)


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    head, at, tail = rest.rpartition("@")
    return f"{scheme}{sep}***@{tail}" if at and head else url


def sync_client_from_url(url: str, options: Mapping[str, Any]) -> SyncClient:
    """A sync client for ``url`` with the connection ``options`` of every node."""
    target = parse_url(url)
    if target.kind == "server":
        return redis.Redis.from_url(url, **{**_quickly_checked(url), **options})
    if target.kind == "cluster":
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.nodes],  # type: ignore[no-untyped-call]
            **target.options,
            **options,
        )
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs=_sentinel_options(target, options), **options
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, db=target.db, **target.options
    )
    return client


def async_client_from_url(
    url: str, options: Mapping[str, Any], max_connections: int | None = None
) -> AsyncClient:
    """An asyncio client for ``url``. One server: a pool of at most
    ``max_connections`` (default 64) that makes tasks wait for a free connection; a
    cluster: at most that many per node (default 1,024; a task beyond it fails as
    Redis unavailable, since redis-py's cluster client does not queue tasks)."""
    target = parse_url(url)
    if target.kind == "server":
        pool = QueueingPool.from_url(
            url,
            max_connections=max_connections or 64,
            timeout=options["socket_timeout"],
            **_idle_connections_checked(),
            **options,
        )
        return redis.asyncio.Redis.from_pool(pool)  # its aclose() closes the pool too
    if target.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.nodes],
            max_connections=max_connections or 1024,
            **target.options,
            **options,
        )
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs=_sentinel_options(target, options), **options
    )
    client: redis.asyncio.Redis = sentinel.master_for(
        target.service, db=target.db, **target.options
    )
    return client


def _idle_connections_checked() -> dict[str, Any]:
    """Pool options so that a connection the server closed while it sat idle in the
    pool (a restarted Redis) is replaced when taken, not handed out to fail its
    first command (a backend error, a breaker failure and a bypass load in every
    process right after a recovery). redis-py 8 skips that check while maintenance
    notifications are on, and turns them on ("auto") by default: off here."""
    if MaintNotificationsConfig is None:  # an older redis-py: the check always runs
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


class QueueingPool(redis.asyncio.ConnectionPool):
    """An asyncio pool of at most ``max_connections`` whose tasks wait up to
    ``timeout`` s for a connection to be released when all are in use, instead of
    failing (then :class:`redis.ConnectionError`, "No connection available").

    redis-py's ``BlockingConnectionPool`` does the same through a condition and a
    timer armed on every take, which cost about 15 µs a command (profiled on a
    cache hit, ``bench/cache.py``); here a take is the plain pool's, and only a
    task that finds the pool used up waits. A release wakes the oldest waiter, which
    then takes a connection like any task: one that arrives meanwhile may take it
    first (the woken one waits again, at the back, within its deadline)."""

    def __init__(self, *, timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline: float | None = None
        while True:
            try:
                return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            except redis.ConnectionError as exc:
                if not _pool_used_up(exc):
                    raise
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.timeout
            # True: a release woke us; False: the deadline passed. (No wait_for: it
            # would swallow a cancellation that comes just after the wake-up.)
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_later(max(deadline - loop.time(), 0.0), _expire, waiter)
            try:
                woken = await waiter
            except BaseException:
                # Cancelled just as a release woke us: that wake-up is the next one's.
                if waiter.done() and not waiter.cancelled() and waiter.result():
                    self._wake_one()
                raise
            finally:
                timer.cancel()
            if not woken:
                raise NoConnectionAvailable("No connection available.")

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a waiter that timed out or was cancelled is done
                waiter.set_result(True)
                return


class NoConnectionAvailable(redis.ConnectionError):
    """A :class:`QueueingPool`'s task waited its whole timeout for a connection while
    every one was in use. A ``redis.ConnectionError`` (what redis-py's own pools
    raise), told apart by :func:`pool_exhausted`: Redis itself may be fine."""


def pool_exhausted(error: redis.ConnectionError) -> bool:
    """Did ``error`` come from a client's pool having no connection to give (all in
    use: a :class:`QueueingPool` after its wait, redis-py's pools at once), rather
    than from Redis?"""
    return isinstance(error, NoConnectionAvailable) or _pool_used_up(error)


def _pool_used_up(error: redis.ConnectionError) -> bool:
    """Is ``error`` redis-py's asyncio pool having no connection left to give?
    (MaxConnectionsError from redis-py 7.2; before, a plain ConnectionError.)"""
    used_up = getattr(redis.exceptions, "MaxConnectionsError", None)
    if used_up is not None and isinstance(error, used_up):
        return True
    return type(error) is redis.ConnectionError and str(error) == "Too many connections"


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


def direct_get(client: SyncClient) -> Callable[[str], Any] | None:
    """For a client :func:`sync_client_from_url` made (one server or a Sentinel
    master; None for a cluster): a GET on a connection taken from its pool, the
    command sent and its reply read, without the client's command machinery
    (retries, which these clients have none of, and redis-py's own metrics): a
    cache hit's one GET, about 8 µs cheaper (profiled, ``bench/cache.py``). Errors
    are the connection's own (it disconnects on any I/O error), as through
    ``client.get``."""
    if not isinstance(client, redis.Redis) or client.connection is not None:
        return None
    pool = client.connection_pool

    def get(key: str) -> Any:
        connection = pool.get_connection()
        try:
            connection.send_command("GET", key)  # type: ignore[no-untyped-call]
            return connection.read_response()
        finally:
            pool.release(connection)

    return get


def direct_aget(client: AsyncClient) -> Callable[[str], Any] | None:
    """:func:`direct_get` for a client :func:`async_client_from_url` made: a
    coroutine function. Its command is written as redis-py writes it, but the write's
    deadline is armed only when the socket's buffer did not take it all: redis-py
    arms it on every command through ``asyncio.wait_for``, which runs the write as a
    task of its own, a turn of the event loop per hit (about 20 µs, profiled)."""
    if not isinstance(client, redis.asyncio.Redis) or client.connection is not None:
        return None
    pool = client.connection_pool

    async def get(key: str) -> Any:
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await _send(connection, connection.pack_command("GET", key))
            return await connection.read_response()
        finally:
            await pool.release(connection)

    return get


async def _send(connection: Any, packed: list[bytes]) -> None:
    """Write ``packed`` on a connected asyncio ``connection``, failing as redis-py's
    ``send_packed_command`` does: a write that outlasts the socket timeout is a
    :class:`redis.TimeoutError`, a broken socket a :class:`redis.ConnectionError`,
    the connection dropped either way."""
    if getattr(connection, "_writer", None) is None:  # not redis-py's stream connection
        await connection.send_packed_command(packed)
        return
    if connection.health_check_interval:  # asked for in the URL: a PING when due
        await connection.check_health()
    writer = connection._writer  # read after the health check (it may reconnect)
    try:
        writer.writelines(packed)
        if writer.transport.get_write_buffer_size():  # the kernel did not take it all
            await asyncio.wait_for(writer.drain(), connection.socket_timeout)
    except asyncio.TimeoutError:
        await connection.disconnect(nowait=True)
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as error:
        await connection.disconnect(nowait=True)
        raise redis.ConnectionError(f"Error while writing to socket: {error}") from error
    except BaseException:  # cancelled mid-write: the stream's state is unknown
        await connection.disconnect(nowait=True)
        raise


def _quickly_checked(url: str) -> dict[str, Any]:
    """The connection class of a sync client of a plain TCP ``url``: redis-py's, with a
    cheaper check of a pooled connection (see :class:`QuickCheckConnection`)."""
    return {"connection_class": QuickCheckConnection} if url.startswith("redis://") else {}


class QuickCheckConnection(redis.Connection):
    """redis-py's TCP connection, whose pool asks before every command whether the
    connection has anything to read (a server that closed it while it sat idle, a
    reply left unread): redis-py answers by switching the socket to non-blocking
    for a ``recv`` that fails, and back, three system calls and an exception per
    command. Here one ``poll`` answers when nothing arrived and nothing is
    buffered; anything else is redis-py's own check."""

    def can_read(self, timeout: float = 0) -> bool:
        sock = self._sock
        buffer = getattr(self._parser, "_buffer", None)  # redis-py's own parsers
        if (
            timeout == 0
            and _poll is not None
            and sock is not None
            and buffer is not None
            and not buffer.unread_bytes()
            and not _readable_now(sock)
        ):
            return False
        return bool(super().can_read(timeout))


# poll, not select: select refuses a descriptor numbered 1024 or more, which a busy
# process reaches (and Windows has no poll: redis-py's own check runs there).
_poll = getattr(select, "poll", None)


def _readable_now(sock: Any) -> bool:
    """Has ``sock`` anything to read (or hung up), without waiting?"""
    assert _poll is not None
    poller = _poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _sentinel_options(target: Target, options: Mapping[str, Any]) -> dict[str, Any]:
    # The sentinels' own connections: the same timeouts and TLS, no credentials.
    return {**options, "ssl": target.options.get("ssl", False)}


# -- closing what from_url made ------------------------------------------------------------


def _sentinel_clients(client: object) -> list[Any]:
    """The clients of the sentinels behind a Sentinel master client (none otherwise)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(getattr(manager, "sentinels", ()))


def close_sync_client(client: SyncClient) -> None:
    """Close a client :func:`sync_client_from_url` made: its connections and pool
    (every node's, on a cluster) and, behind a Sentinel master, the sentinels'."""
    sentinels = _sentinel_clients(client)
    client.close()
    if not isinstance(client, redis.cluster.RedisCluster):  # a cluster's close() does both
        client.connection_pool.disconnect()
    for sentinel in sentinels:
        sentinel.close()


async def aclose_async_client(client: AsyncClient) -> None:
    """:func:`close_sync_client` for a client :func:`async_client_from_url` made."""
    sentinels = _sentinel_clients(client)
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        await client.aclose()
    else:
        await client.aclose(close_connection_pool=True)
    for sentinel in sentinels:
        await sentinel.aclose()
