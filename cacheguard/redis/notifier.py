"""Release notifications: one pub/sub connection per Redis server (per cluster
shard) per process.

Waiters of every lock of a process share one subscriber connection and one
listener thread. A waiter registers for its lock's release channel; the first
waiter of a channel sends SSUBSCRIBE and waits for Redis to confirm it (so no
release published after that point can be missed); a published release wakes
every waiter of that channel at once. Release channels are sharded (see
:mod:`cacheguard.redis.pubsub`); the L1 listener's namespace-wide channel is a
broadcast one. Channels stay subscribed for a while
after their last waiter leaves, so a hot lock does not pay SUBSCRIBE and
UNSUBSCRIBE on every contended wait.

The listener thread is the only reader of the connection; waiter threads only
write SUBSCRIBE commands to it, under a mutex. If the connection breaks, every
waiter is woken (it retries its acquire and falls back to its backoff timer),
and the listener reconnects and subscribes again to every channel still in use.

On a Redis Cluster, :func:`notifier_for` hands out a :class:`ClusterNotifier`:
one notifier per shard, picked by the channel's slot, which reconnects to
whichever node serves that slot after a failover; a channel whose slot leaves
its node is revoked by the server, and its waiters are woken to subscribe anew.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.connection import AbstractConnection
from redis.exceptions import RedisClusterException

from cacheguard._identity import on_fork_in_child
from cacheguard.redis.errors import REDIS_UNREACHABLE
from cacheguard.redis.pubsub import (
    Confirmations,
    parse_push,
    subscribe_commands,
    unsubscribe_commands,
)

__all__ = ["ClusterNotifier", "Notifier", "Subscription", "close_notifier_of", "notifier_for"]

log = logging.getLogger("cacheguard.notifier")

ConnectionFactory = Callable[[], AbstractConnection]

_all_notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()

_IDLE_POLL = 1.0  # listener housekeeping tick (s): reconnects, idle unsubscribes
_LINGER = 10.0  # keep a channel this long after its last waiter left (s)
_RECONNECT_CAP = 2.0


@dataclass(eq=False)
class _Channel:
    name: str
    sharded: bool
    waiters: set[Subscription] = field(default_factory=set)
    confirmed: threading.Event = field(default_factory=threading.Event)
    idle_since: float = 0.0


_INBOX_LIMIT = 16  # messages kept for a waiter between two waits (oldest dropped)


class Subscription:
    """One waiter's registration on one channel (not thread-safe: one waiter)."""

    __slots__ = ("_channel", "_inbox", "_notifier", "_sharded", "_woken", "closed")

    def __init__(self, notifier: Notifier, channel: str, *, sharded: bool = True) -> None:
        self._notifier = notifier
        self._channel = channel
        self._sharded = sharded
        self._woken = threading.Event()
        self._inbox: deque[bytes] = deque(maxlen=_INBOX_LIMIT)
        self.closed = False

    def open(self, timeout: float) -> bool:
        """Register and wait up to ``timeout`` for Redis to confirm; ``True`` if confirmed."""
        return self._notifier._register(self._channel, self, timeout, self._sharded)

    def wait(self, seconds: float) -> list[bytes]:
        """Sleep until a notification or ``seconds``; the messages received since the
        last wait (empty after a timeout, or after a wake-up for a lost connection)."""
        self._woken.wait(seconds)
        self._woken.clear()
        messages = []
        while self._inbox:  # popleft is atomic: nothing delivered meanwhile is lost
            messages.append(self._inbox.popleft())
        return messages

    def live_token(self) -> object | None:
        """An object that stays the same while this subscription stays confirmed and
        connected, else ``None``. Two equal tokens taken at two moments prove that no
        message on the channel could have been missed in between (a lost connection
        replaces the token)."""
        channel = self._notifier._channels.get(self._channel)  # a dict read: atomic
        if channel is None or self not in channel.waiters:
            return None
        confirmed = channel.confirmed
        return confirmed if confirmed.is_set() else None

    def drain(self) -> None:
        """Forget messages received so far (they are about a state now re-read)."""
        self._woken.clear()
        self._inbox.clear()

    def _deliver(self, payload: bytes | None) -> None:
        """Called by the listener (payload ``None``: wake up, no message)."""
        if payload is not None:
            self._inbox.append(payload)
        self._woken.set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._notifier._unregister(self._channel, self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Listener(Subscription):
    """A permanent subscription that hands every message to a callback.

    The callback runs on the listener thread: it must be quick and must not
    block or subscribe (the listener is the only reader of the connection)."""

    __slots__ = ("_callback", "_on_gap")

    def __init__(
        self,
        notifier: Notifier,
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


class Notifier:
    """Shared subscriber connection and listener thread for one Redis server (or
    one cluster shard)."""

    def __init__(
        self,
        connect: ConnectionFactory,
        *,
        timer: Callable[[], float] = time.monotonic,
        linger: float = _LINGER,
    ) -> None:
        self._connect = connect
        self._timer = timer
        self._linger = linger
        self.reconnects = 0
        self._reset()
        _all_notifiers.add(self)

    def _reset(self) -> None:
        """Fresh state (also in a forked child, whose parent's thread and socket
        are not its own: the socket is dropped, never closed, so the parent keeps it)."""
        self._mutex = threading.Lock()
        self._channels: dict[str, _Channel] = {}
        self._pending: Confirmations[_Channel] = Confirmations()
        self._conn: AbstractConnection | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._next_housekeeping = 0.0
        self._error_pause = 0.0  # grows while errors repeat (a refused SUBSCRIBE)

    # -- waiter side ---------------------------------------------------------------

    def subscription(self, channel: str) -> Subscription:
        """A waiter's registration on the sharded ``channel`` (see :meth:`Subscription.open`)."""
        return Subscription(self, channel)

    def listen(
        self,
        channel: str,
        callback: Callable[[bytes], None],
        *,
        timeout: float = 5.0,
        on_gap: Callable[[], None] | None = None,
    ) -> Subscription:
        """Call ``callback(payload)`` (on the listener thread) for every message on
        the broadcast ``channel`` until the returned subscription is closed. Messages published
        while the connection is down are lost: ``on_gap()`` is called when it drops,
        and :meth:`Subscription.live_token` tells when it is confirmed again."""
        listener = _Listener(self, channel, callback, on_gap)
        listener.open(timeout)
        return listener

    def _register(
        self, name: str, subscription: Subscription, timeout: float, sharded: bool
    ) -> bool:
        with self._mutex:
            self._ensure_thread()
            channel = self._channels.get(name)
            if channel is None:
                channel = self._channels[name] = _Channel(name, sharded)
                self._send_subscribe([channel])
            channel.waiters.add(subscription)
            confirmed = channel.confirmed
        if threading.current_thread() is self._thread:
            # Called from a listener callback: the confirmation can only be read
            # by this very thread, so waiting for it would only stall everyone.
            return confirmed.is_set()
        return confirmed.wait(timeout)

    def _unregister(self, name: str, subscription: Subscription) -> None:
        with self._mutex:
            channel = self._channels.get(name)
            if channel is not None:
                channel.waiters.discard(subscription)
                if not channel.waiters:
                    channel.idle_since = self._timer()

    def _send_subscribe(self, channels: list[_Channel]) -> None:
        """Subscribe ``channels``; caller holds the mutex."""
        conn = self._conn
        if conn is None or not channels:
            return  # the listener subscribes everything once it (re)connects
        named = {c.name: c for c in channels}
        try:
            for command in subscribe_commands((c.name, c.sharded) for c in channels):
                conn.send_command(*command, check_health=False)
                self._pending.sent(command, named)
        except REDIS_UNREACHABLE as exc:
            log.warning("subscribe failed, reconnecting: %s", exc)
            self._drop_locked()

    # -- listener side -----------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stopped.clear()
            self._thread = threading.Thread(
                target=self._listen, name="cacheguard-notifier", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the listener and drop the connection (waiters fall back to timers).

        Does not join the thread: ``close`` may run from a garbage-collection
        finaliser, which must not block; the listener exits on its next wake-up.
        """
        self._stopped.set()
        self._drop_connection()

    def _listen(self) -> None:
        delay = 0.05
        while not self._stopped.is_set():
            if self._conn is None:
                if not self._reconnect():
                    self._stopped.wait(delay)
                    delay = min(delay * 2, _RECONNECT_CAP)
                    continue
                delay = 0.05
            conn = self._conn
            assert conn is not None
            try:
                readable = conn.can_read(timeout=_IDLE_POLL)
                if self._conn is not conn:
                    # Dropped meanwhile (a failed SUBSCRIBE): redis-py may have quietly
                    # reconnected this object with no subscriptions; discard it.
                    with contextlib.suppress(Exception):
                        conn.disconnect()
                    continue
                if readable:
                    self._dispatch(conn.read_response(disconnect_on_error=False, push_request=True))
                    self._error_pause = 0.0
                if self._timer() >= self._next_housekeeping:  # also on a busy connection
                    self._next_housekeeping = self._timer() + _IDLE_POLL
                    self._unsubscribe_idle()
            except Exception as exc:
                if self._stopped.is_set():
                    return  # closed under our feet on purpose
                if isinstance(exc, REDIS_UNREACHABLE):
                    log.warning("release-notification connection lost: %s", exc)
                else:  # a malformed message must not kill the listener
                    log.exception("unexpected error in the release-notification listener")
                self._drop_connection()
                # An error that comes back at once (an ACL refusing the channels) must
                # not turn into a reconnect loop; waiters fall back to their timers.
                self._error_pause = min(max(self._error_pause * 2, 0.05), 2.0)
                self._stopped.wait(self._error_pause)

    def _reconnect(self) -> bool:
        try:
            conn = self._connect()
            conn.connect()
        except Exception as exc:  # also: no node serves the slot yet (a failover)
            log.debug("release-notification connection failed: %s", exc)
            return False
        with self._mutex:
            if self._stopped.is_set():  # closed while we connected: nobody will read it
                with contextlib.suppress(Exception):
                    conn.disconnect()
                return False
            self._conn = conn
            self._pending.clear()
            live = [c for c in self._channels.values() if c.waiters]
            for c in list(self._channels.values()):
                if not c.waiters:
                    del self._channels[c.name]
            self._send_subscribe(live)
            self.reconnects += 1
        return True

    def _drop_connection(self) -> None:
        with self._mutex:
            conn = self._drop_locked()
        if conn is not None:
            with contextlib.suppress(Exception):  # best effort on a broken socket
                conn.disconnect()

    def _drop_locked(self) -> AbstractConnection | None:
        """Forget the connection (caller holds the mutex); returns it to disconnect."""
        conn, self._conn = self._conn, None
        self._pending.clear()
        for channel in self._channels.values():
            # Release anyone waiting for a confirmation that will never come,
            # then start unconfirmed; wake all so they retry on their timers.
            channel.confirmed.set()
            channel.confirmed = threading.Event()
            for waiter in channel.waiters:
                waiter._deliver(None)
        return conn

    def _dispatch(self, message: Any) -> None:
        push = parse_push(message)
        if push is None:
            return
        payload: bytes | None = push.payload
        with self._mutex:
            channel = self._channels.get(push.channel)
            if push.kind == "message":
                waiters = list(channel.waiters) if channel is not None else []
            else:
                waiters = []
                verdict, expected = self._pending.settle(push)
                if verdict == "settled" and push.kind == "subscribed" and expected is not None:
                    expected.confirmed.set()
                elif verdict == "revoked" and channel is not None:
                    # The channel's slot left this node: forget it here and wake its
                    # waiters, who retry and subscribe where the slot lives now.
                    del self._channels[push.channel]
                    channel.confirmed.set()
                    waiters, payload = list(channel.waiters), None
        for waiter in waiters:  # outside the mutex, which the waiters' threads need
            waiter._deliver(payload)

    def _unsubscribe_idle(self) -> None:
        now = self._timer()
        with self._mutex:
            idle = [
                c
                for c in self._channels.values()
                if not c.waiters and now - c.idle_since >= self._linger
            ]
            if not idle or self._conn is None:
                return
            for c in idle:
                del self._channels[c.name]
            try:
                for command in unsubscribe_commands((c.name, c.sharded) for c in idle):
                    self._conn.send_command(*command, check_health=False)
                    self._pending.sent(command)
            except REDIS_UNREACHABLE as exc:
                log.warning("unsubscribe failed, reconnecting: %s", exc)
                self._drop_locked()

    def subscribed_channels(self) -> list[str]:
        with self._mutex:
            return sorted(self._channels)


class ClusterNotifier:
    """The notifiers of one Redis Cluster client: one per shard for sharded
    channels, each on the node that serves the slots it was made for (looked up
    again at every reconnect, so a failover moves it to the promoted replica), and
    one for broadcast channels on any node (moved to another one when it fails)."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = weakref.ref(client)
        self._mutex = threading.Lock()
        self._shards: dict[str, Notifier] = {}  # by the name of the node first serving it
        self._broadcast: Notifier | None = None

    def subscription(self, channel: str) -> Subscription:
        """A waiter's registration on the sharded ``channel``, on its shard's notifier."""
        client = self._live_client()
        slot = client.keyslot(channel)
        node = client.nodes_manager.get_node_from_slot(slot)
        with self._mutex:
            notifier = self._shards.get(node.name)
            if notifier is None:
                notifier = Notifier(_slot_connection_factory(self._client, slot))
                self._shards[node.name] = notifier
        return notifier.subscription(channel)

    def listen(
        self,
        channel: str,
        callback: Callable[[bytes], None],
        *,
        timeout: float = 5.0,
        on_gap: Callable[[], None] | None = None,
    ) -> Subscription:
        """:meth:`Notifier.listen` on the broadcast ``channel`` (any node hears it)."""
        with self._mutex:
            if self._broadcast is None:
                self._broadcast = Notifier(_any_node_connection_factory(self._client))
            notifier = self._broadcast
        return notifier.listen(channel, callback, timeout=timeout, on_gap=on_gap)

    def close(self) -> None:
        with self._mutex:
            notifiers = [*self._shards.values(), self._broadcast]
            self._shards, self._broadcast = {}, None
        for notifier in notifiers:
            if notifier is not None:
                notifier.close()

    def _live_client(self) -> RedisCluster:
        client = self._client()
        if client is None:
            raise redis.ConnectionError("the cluster client was garbage-collected")
        return client


def _node_connection(node: Any) -> AbstractConnection:
    # The node's own pool settings, outside its max_connections (as below).
    pool = node.redis_connection.connection_pool
    connection: AbstractConnection = pool.connection_class(**pool.connection_kwargs)
    return connection


def _refresh_topology(client: RedisCluster) -> None:
    """Have the cluster client read the slot map again (after a node failed us)."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError) as exc:  # again next time
        log.debug("cluster topology not refreshed: %s", exc)


def _slot_connection_factory(client_ref: Any, slot: int) -> ConnectionFactory:
    failed = False

    def connect() -> AbstractConnection:
        nonlocal failed
        client = client_ref()
        if client is None:
            raise redis.ConnectionError("the cluster client was garbage-collected")
        if failed:  # the last node we had for this slot failed: who serves it now?
            _refresh_topology(client)
        failed = True  # until this connection is made
        connection = _node_connection(client.nodes_manager.get_node_from_slot(slot))
        connection.connect()
        failed = False
        return connection

    return connect


def _any_node_connection_factory(client_ref: Any) -> ConnectionFactory:
    turn = 0

    def connect() -> AbstractConnection:
        nonlocal turn
        client = client_ref()
        if client is None:
            raise redis.ConnectionError("the cluster client was garbage-collected")
        if turn:
            _refresh_topology(client)
        nodes = client.get_primaries()
        if not nodes:
            raise redis.ConnectionError("no node of the cluster is known")
        node = nodes[turn % len(nodes)]
        turn += 1  # the next reconnect tries the next node
        connection = _node_connection(node)
        connection.connect()
        turn = 0
        return connection

    return connect


# -- one notifier per connection pool (or cluster client), per process ------------------

_notifiers: weakref.WeakKeyDictionary[Any, Notifier | ClusterNotifier] = weakref.WeakKeyDictionary()
_notifiers_mutex = threading.Lock()


def notifier_for(client: redis.Redis | RedisCluster) -> Notifier | ClusterNotifier:
    """The process's notifier for the server behind ``client``'s connection pool
    (a Sentinel master client's pool follows the master), or for a cluster client."""
    owner: Any = client if isinstance(client, RedisCluster) else client.connection_pool
    with _notifiers_mutex:
        notifier = _notifiers.get(owner)
        if notifier is None:
            if isinstance(client, RedisCluster):
                notifier = ClusterNotifier(client)
            else:
                notifier = Notifier(_weak_connection_factory(owner))
            _notifiers[owner] = notifier
            # The listener must not outlive its pool or client: stop it when they go.
            weakref.finalize(owner, notifier.close)
        return notifier


def close_notifier_of(client: redis.Redis | RedisCluster) -> None:
    """Stop and forget the notifier of ``client``'s pool (or cluster client), if any:
    for a guard closing a client it made (the next use would start a new one)."""
    owner: Any = client if isinstance(client, RedisCluster) else client.connection_pool
    with _notifiers_mutex:
        notifier = _notifiers.pop(owner, None)
    if notifier is not None:
        notifier.close()


def _weak_connection_factory(pool: Any) -> ConnectionFactory:
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
    global _notifiers_mutex
    # The parent's listener threads do not exist in the child, and its socket is
    # the parent's: every notifier starts afresh (waiters re-subscribe on demand).
    _notifiers_mutex = threading.Lock()
    for notifier in list(_all_notifiers):
        notifier._reset()


on_fork_in_child(_reset_after_fork)
