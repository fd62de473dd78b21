"""Release notifications on asyncio: one pub/sub connection per (event loop, pool).

The asyncio twin of :mod:`cacheguard.redis.notifier`, with the same rules: the
waiters of every lock of one event loop share one subscriber connection and one
listener task; the first waiter of a channel sends SSUBSCRIBE and waits for Redis
to confirm it (no release published after that point can be missed); a published
message wakes every waiter of its channel; a channel stays subscribed for a while
after its last waiter left; if the connection drops, every waiter is woken (it
retries on its timers) and the listener reconnects with a growing pause and
subscribes again to every channel still in use. With no channel left at all, the
task disconnects and ends; the next subscription starts a new one. Release
channels are sharded, the L1 channel broadcast (:mod:`cacheguard.redis.pubsub`);
on a Redis Cluster, :func:`async_notifier_for` hands out an
:class:`AsyncClusterNotifier`, one notifier per shard, as the sync side does.

Why a raw connection and not ``redis.asyncio.client.PubSub``:

* PubSub takes its connection from the client's pool, so a long-lived subscriber
  uses up a slot of ``max_connections``; the sync notifier avoids that, and so does
  this one (a connection made with the pool's settings, not counted by it).
* PubSub reconnects inside its retry policy and re-subscribes on its own, without
  telling its user: we could not wake the waiters of a dropped connection (their
  messages may be lost) nor know when a channel is confirmed again, which is what
  :meth:`AsyncSubscription.open` and :meth:`AsyncSubscription.live_token` promise.
* Its confirmations are read as ordinary messages by whoever calls
  ``get_message``; here one task reads everything and matches each confirmation to
  the SUBSCRIBE it answers, as the sync listener does.

Only the listener task reads and writes the connection. Waiters queue the channels
to subscribe and poke the task, which keeps one read pending across its iterations
(never cancelling a read half-way through a reply), so SUBSCRIBE commands go out
in the order their confirmations are expected. Reads wait without a timeout
(``socket_timeout`` does not apply to an idle subscriber); writes use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisClusterException

from cacheguard._identity import on_fork_in_child
from cacheguard._loop import LoopBinding
from cacheguard.redis.errors import REDIS_UNREACHABLE
from cacheguard.redis.notifier import _IDLE_POLL, _INBOX_LIMIT, _LINGER, _RECONNECT_CAP
from cacheguard.redis.pubsub import (
    Confirmations,
    parse_push,
    subscribe_commands,
    unsubscribe_commands,
)

__all__ = [
    "AsyncClusterNotifier",
    "AsyncNotifier",
    "AsyncSubscription",
    "aclose_notifiers_of",
    "async_notifier_for",
]

log = logging.getLogger("cacheguard.notifier")

# Makes a connection (or a coroutine making one: a cluster's must look up its node).
AsyncConnectionFactory = Callable[[], AbstractConnection | Awaitable[AbstractConnection]]

_FIRST_RECONNECT_PAUSE = 0.05
_ERROR_PAUSE_CAP = 2.0


@dataclass(eq=False)
class _Channel:
    name: str
    sharded: bool
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: set[AsyncSubscription] = field(default_factory=set)
    idle_since: float = 0.0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _consume(task: asyncio.Future[Any]) -> None:
    """Mark a finished read's error as seen (the listener handles it, or it was dropped)."""
    if not task.cancelled():
        task.exception()


class AsyncSubscription:
    """One waiter's registration on one channel (one task waits on it at a time)."""

    __slots__ = ("_channel", "_inbox", "_notifier", "_sharded", "_wakeup", "_woken", "closed")

    def __init__(self, notifier: AsyncNotifier, channel: str, *, sharded: bool = True) -> None:
        self._notifier = notifier
        self._channel = channel
        self._sharded = sharded
        self._inbox: deque[bytes] = deque(maxlen=_INBOX_LIMIT)
        self._woken = False
        self._wakeup: asyncio.Future[None] | None = None
        self.closed = False

    async def open(self, timeout: float) -> bool:
        """Register and wait up to ``timeout`` for Redis to confirm; ``True`` if confirmed."""
        return await self._notifier._register(self._channel, self, timeout, self._sharded)

    async def wait(self, seconds: float) -> list[bytes]:
        """Sleep until a notification or ``seconds``; the messages received since the
        last wait (empty after a timeout, or after a wake-up for a lost connection)."""
        loop = self._notifier._binding.check()
        if not self._woken and seconds > 0:
            wakeup = self._wakeup = loop.create_future()
            timer = loop.call_later(seconds, _resolve, wakeup)
            try:
                await wakeup
            finally:
                timer.cancel()
                self._wakeup = None
        self._woken = False
        messages = list(self._inbox)
        self._inbox.clear()
        return messages

    def live_token(self) -> object | None:
        """An object that stays the same while this subscription stays confirmed and
        connected, else ``None`` (see the sync :meth:`Subscription.live_token`)."""
        channel = self._notifier._channels.get(self._channel)
        if channel is None or self not in channel.waiters:
            return None
        confirmed = channel.confirmed
        return confirmed if confirmed.is_set() else None

    def drain(self) -> None:
        """Forget messages received so far (they are about a state now re-read)."""
        self._woken = False
        self._inbox.clear()

    def _deliver(self, payload: bytes | None) -> None:
        """Called by the listener task (payload ``None``: wake up, no message)."""
        if payload is not None:
            self._inbox.append(payload)
        self._woken = True
        if self._wakeup is not None:
            _resolve(self._wakeup)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._notifier._unregister(self._channel, self)

    def __enter__(self) -> AsyncSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncListener(AsyncSubscription):
    """A permanent subscription that hands every message to a callback, which runs
    on the loop inside the listener task: it must be quick and must not block."""

    __slots__ = ("_callback", "_on_gap")

    def __init__(
        self,
        notifier: AsyncNotifier,
        channel: str,
        callback: Callable[[bytes], None],
        on_gap: Callable[[], None] | None,
    ) -> None:
        super().__init__(notifier, channel, sharded=False)
        self._callback = callback
        self._on_gap = on_gap

    def _deliver(self, payload: bytes | None) -> None:
        try:
            if payload is not None:
                self._callback(payload)
            elif self._on_gap is not None:  # the connection dropped: messages may be lost
                self._on_gap()
        except Exception:
            log.exception("listener callback for %s failed", self._channel)


class AsyncNotifier:
    """Shared subscriber connection and listener task for one Redis server, one loop."""

    def __init__(
        self,
        connect: AsyncConnectionFactory,
        *,
        timer: Callable[[], float] = time.monotonic,
        linger: float = _LINGER,
    ) -> None:
        self._connect = connect
        self._timer = timer
        self._linger = linger
        self.reconnects = 0  # connections made (the first one included)
        self._binding = LoopBinding("this AsyncNotifier")
        self._channels: dict[str, _Channel] = {}
        self._pending: Confirmations[_Channel] = Confirmations()
        self._unsent: list[_Channel] = []  # channels the listener must still subscribe
        self._conn: AbstractConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick: asyncio.Future[None] | None = None
        self._reading: asyncio.Future[Any] | None = None

    # -- waiter side ---------------------------------------------------------------

    def subscription(self, channel: str) -> AsyncSubscription:
        return AsyncSubscription(self, channel)

    async def listen(
        self,
        channel: str,
        callback: Callable[[bytes], None],
        *,
        timeout: float = 5.0,
        on_gap: Callable[[], None] | None = None,
    ) -> AsyncSubscription:
        """Call ``callback(payload)`` (on the loop, in the listener task) for every
        message on ``channel`` until the returned subscription is closed. Messages
        published while the connection is down are lost: ``on_gap()`` is called when
        it drops, and :meth:`AsyncSubscription.live_token` tells when it is confirmed
        again. Returns once Redis confirmed the subscription or ``timeout`` passed."""
        listener = _AsyncListener(self, channel, callback, on_gap)
        await listener.open(timeout)
        return listener

    async def _register(
        self, name: str, subscription: AsyncSubscription, timeout: float, sharded: bool
    ) -> bool:
        self._binding.check()
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = _Channel(name, sharded)
            self._unsent.append(channel)
            if self._kick is not None:
                _resolve(self._kick)
        channel.waiters.add(subscription)
        self._ensure_task()
        if not channel.confirmed.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(channel.confirmed.wait(), max(timeout, 0.0))
        # A dropped connection sets the event we waited on and replaces it: that is
        # a wake-up, not a confirmation.
        return self._channels.get(name) is channel and channel.confirmed.is_set()

    def _unregister(self, name: str, subscription: AsyncSubscription) -> None:
        channel = self._channels.get(name)
        if channel is not None:
            channel.waiters.discard(subscription)
            if not channel.waiters:
                channel.idle_since = self._timer()

    def subscribed_channels(self) -> list[str]:
        return sorted(self._channels)

    # -- the listener task -------------------------------------------------------------

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            loop = self._binding.check()
            self._task = loop.create_task(self._run(), name="cacheguard-notifier")

    def close(self) -> None:
        """Stop the listener task and drop the connection (waiters fall back to their
        timers); the next subscription starts again. Safe from any thread and from a
        garbage-collection finaliser: it only asks the task to stop."""
        task = self._task
        if task is None or task.done():
            return
        loop = task.get_loop()
        if loop.is_closed():
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the task has dropped its connection."""
        task = self._task
        self.close()
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({task})

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        reconnect_pause = _FIRST_RECONNECT_PAUSE
        error_pause = 0.0
        housekeeping = self._timer() + _IDLE_POLL
        try:
            while True:
                if self._conn is None:
                    if not self._channels:
                        return  # nothing to listen for
                    if not await self._reconnect():
                        await asyncio.sleep(reconnect_pause)
                        reconnect_pause = min(reconnect_pause * 2, _RECONNECT_CAP)
                        continue
                    reconnect_pause = _FIRST_RECONNECT_PAUSE
                conn = self._conn
                assert conn is not None
                try:
                    if self._unsent:
                        await self._send_subscribe(conn)
                    if self._reading is None:
                        self._reading = asyncio.ensure_future(
                            conn.read_response(
                                timeout=math.inf, disconnect_on_error=False, push_request=True
                            )
                        )
                        self._reading.add_done_callback(_consume)
                    kick = self._kick = loop.create_future()
                    if self._unsent:  # queued while we were sending
                        kick.set_result(None)
                    await asyncio.wait(
                        (self._reading, kick),
                        timeout=max(housekeeping - self._timer(), 0.0),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    self._kick = None
                    if self._reading.done():
                        reading, self._reading = self._reading, None
                        self._dispatch(reading.result())
                        error_pause = 0.0
                    if self._timer() >= housekeeping:  # also on a busy connection
                        housekeeping = self._timer() + _IDLE_POLL
                        await self._unsubscribe_idle(conn)
                        if not self._channels:
                            return  # the last channel is gone: disconnect, end the task
                except Exception as exc:
                    if isinstance(exc, REDIS_UNREACHABLE):
                        log.warning("release-notification connection lost: %s", exc)
                    else:  # a malformed message must not kill the listener
                        log.exception("unexpected error in the release-notification listener")
                    await self._drop()
                    # An error that comes back at once (an ACL refusing the channels)
                    # must not turn into a reconnect loop; waiters use their timers.
                    error_pause = min(max(error_pause * 2, 0.05), _ERROR_PAUSE_CAP)
                    await asyncio.sleep(error_pause)
        finally:
            self._kick = None
            if self._task is asyncio.current_task():
                self._task = None
            await self._drop()

    async def _reconnect(self) -> bool:
        try:
            made = self._connect()
            conn = await made if inspect.isawaitable(made) else made
            await conn.connect()
        except Exception as exc:  # also: no node serves the slot yet (a failover)
            log.debug("release-notification connection failed: %s", exc)
            return False
        self._conn = conn
        self._pending.clear()
        for c in list(self._channels.values()):
            if not c.waiters:
                del self._channels[c.name]
        self._unsent = list(self._channels.values())
        self.reconnects += 1
        return True

    async def _send_subscribe(self, conn: AbstractConnection) -> None:
        channels = [c for c in self._unsent if self._channels.get(c.name) is c]
        self._unsent.clear()
        named = {c.name: c for c in channels}
        for command in subscribe_commands((c.name, c.sharded) for c in channels):
            self._pending.sent(command, named)
            await conn.send_command(*command, check_health=False)

    async def _unsubscribe_idle(self, conn: AbstractConnection) -> None:
        now = self._timer()
        idle = [
            c
            for c in self._channels.values()
            if not c.waiters and now - c.idle_since >= self._linger
        ]
        if not idle:
            return
        for c in idle:
            del self._channels[c.name]
        for command in unsubscribe_commands((c.name, c.sharded) for c in idle):
            self._pending.sent(command)
            await conn.send_command(*command, check_health=False)

    async def _drop(self) -> None:
        """Forget the connection, wake every waiter, then disconnect."""
        conn, self._conn = self._conn, None
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
        self._pending.clear()
        self._unsent.clear()
        for channel in self._channels.values():
            # Release anyone waiting for a confirmation that will never come, then
            # start unconfirmed; wake all so they retry on their timers.
            channel.confirmed.set()
            channel.confirmed = asyncio.Event()
            for waiter in list(channel.waiters):
                waiter._deliver(None)
        if conn is not None:
            with contextlib.suppress(Exception):  # best effort on a broken socket
                await conn.disconnect(nowait=True)

    def _dispatch(self, message: Any) -> None:
        push = parse_push(message)
        if push is None:
            return
        channel = self._channels.get(push.channel)
        if push.kind == "message":
            if channel is not None:
                for waiter in list(channel.waiters):  # a callback may close its subscription
                    waiter._deliver(push.payload)
            return
        verdict, expected = self._pending.settle(push)
        if verdict == "settled" and push.kind == "subscribed" and expected is not None:
            expected.confirmed.set()
        elif verdict == "revoked" and channel is not None:
            # The channel's slot left this node: forget it here and wake its waiters,
            # who retry and subscribe where the slot lives now.
            del self._channels[push.channel]
            channel.confirmed.set()
            for waiter in list(channel.waiters):
                waiter._deliver(None)


class AsyncClusterNotifier:
    """The notifiers of one asyncio Redis Cluster client in one loop: one per shard
    for sharded channels (on the node serving the slots it was made for, looked up
    again at every reconnect), one for broadcast channels on any node (see the sync
    :class:`~cacheguard.redis.notifier.ClusterNotifier`)."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = weakref.ref(client)
        self._shards: dict[str, AsyncNotifier] = {}
        self._broadcast: AsyncNotifier | None = None

    def subscription(self, channel: str) -> AsyncSubscription:
        client = self._client()
        if client is None:
            raise redis.ConnectionError("the cluster client was garbage-collected")
        slot = client.keyslot(channel)
        node = client.nodes_manager.get_node_from_slot(slot)
        notifier = self._shards.get(node.name)
        if notifier is None:
            notifier = AsyncNotifier(_slot_connection_factory(self._client, slot))
            notifier._binding.check()
            self._shards[node.name] = notifier
        return notifier.subscription(channel)

    async def listen(
        self,
        channel: str,
        callback: Callable[[bytes], None],
        *,
        timeout: float = 5.0,
        on_gap: Callable[[], None] | None = None,
    ) -> AsyncSubscription:
        if self._broadcast is None:
            self._broadcast = AsyncNotifier(_any_node_connection_factory(self._client))
            self._broadcast._binding.check()
        return await self._broadcast.listen(channel, callback, timeout=timeout, on_gap=on_gap)

    def close(self) -> None:
        notifiers = [*self._shards.values(), self._broadcast]
        self._shards, self._broadcast = {}, None
        for notifier in notifiers:
            if notifier is not None:
                notifier.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until every listener has dropped its connection."""
        notifiers = [*self._shards.values(), self._broadcast]
        self._shards, self._broadcast = {}, None
        for notifier in notifiers:
            if notifier is not None:
                await notifier.aclose()


def _node_connection(node: Any) -> AbstractConnection:
    # The node's connection settings, outside its max_connections.
    connection: AbstractConnection = node.connection_class(**node.connection_kwargs)
    return connection


async def _refresh_topology(client: RedisCluster) -> None:
    """Have the cluster client read the slot map again (after a node failed us)."""
    try:
        await client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError) as exc:  # again next time
        log.debug("cluster topology not refreshed: %s", exc)


def _live(client_ref: Any) -> RedisCluster:
    client: RedisCluster | None = client_ref()
    if client is None:
        raise redis.ConnectionError("the cluster client was garbage-collected")
    return client


def _slot_connection_factory(client_ref: Any, slot: int) -> AsyncConnectionFactory:
    failed = False

    async def connect() -> AbstractConnection:
        nonlocal failed
        client = _live(client_ref)
        if failed:  # the last node we had for this slot failed: who serves it now?
            await _refresh_topology(client)
        failed = True  # until this connection is made
        connection = _node_connection(client.nodes_manager.get_node_from_slot(slot))
        await connection.connect()
        failed = False
        return connection

    return connect


def _any_node_connection_factory(client_ref: Any) -> AsyncConnectionFactory:
    turn = 0

    async def connect() -> AbstractConnection:
        nonlocal turn
        client = _live(client_ref)
        if turn:
            await _refresh_topology(client)
        nodes = client.get_primaries()
        if not nodes:
            raise redis.ConnectionError("no node of the cluster is known")
        node = nodes[turn % len(nodes)]
        turn += 1  # the next reconnect tries the next node
        connection = _node_connection(node)
        await connection.connect()
        turn = 0
        return connection

    return connect


# -- one notifier per (event loop, connection pool or cluster client) ---------------------

_notifiers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop,
    weakref.WeakKeyDictionary[Any, AsyncNotifier | AsyncClusterNotifier],
] = weakref.WeakKeyDictionary()


def async_notifier_for(
    client: redis.asyncio.Redis | RedisCluster,
) -> AsyncNotifier | AsyncClusterNotifier:
    """The notifier of the running event loop for the server behind ``client``'s pool
    (a Sentinel master client's pool follows the master), or for a cluster client."""
    loop = asyncio.get_running_loop()
    owner: Any = client if isinstance(client, RedisCluster) else client.connection_pool
    per_loop = _notifiers.get(loop)
    if per_loop is None:
        per_loop = _notifiers[loop] = weakref.WeakKeyDictionary()
    notifier = per_loop.get(owner)
    if notifier is None:
        if isinstance(client, RedisCluster):
            notifier = AsyncClusterNotifier(client)
        else:
            notifier = AsyncNotifier(_weak_connection_factory(owner))
            notifier._binding.check()
        per_loop[owner] = notifier
        # The listener must not outlive its pool or client: stop it when they go.
        weakref.finalize(owner, notifier.close)
    return notifier


async def aclose_notifiers_of(client: redis.asyncio.Redis | RedisCluster) -> None:
    """Stop and forget the notifiers of ``client``'s pool (or cluster client) in every
    loop, waiting for the running loop's to drop their connections: for a guard
    closing a client it made."""
    owner: Any = client if isinstance(client, RedisCluster) else client.connection_pool
    for per_loop in list(_notifiers.values()):
        notifier = per_loop.pop(owner, None)
        if notifier is not None:
            await notifier.aclose()


def _weak_connection_factory(pool: Any) -> AsyncConnectionFactory:
    # A strong reference here would keep every pool alive through its listener.
    pool_ref = weakref.ref(pool)

    def connect() -> AbstractConnection:
        live_pool = pool_ref()
        if live_pool is None:
            raise redis.ConnectionError("the connection pool was garbage-collected")
        # Same settings as the pool's connections, but not counted against its
        # max_connections: a long-lived subscriber must not use up the pool.
        connection: AbstractConnection = live_pool.connection_class(**live_pool.connection_kwargs)
        return connection

    return connect


def _reset_after_fork() -> None:
    # A forked child runs none of its parent's loops: it starts with no notifiers.
    _notifiers.clear()


on_fork_in_child(_reset_after_fork)
