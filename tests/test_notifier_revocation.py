"""A sharded channel revoked by the server (its slot left the node: a failover or a
migration) wakes its waiters and is forgotten, so the next subscription goes to the
slot's new node; both notifiers. The revocation is scripted into the listener's
dispatch, after a real subscription confirmed by the real server."""

from __future__ import annotations

import redis
import redis.asyncio

from cacheguard.redis.async_notifier import AsyncNotifier
from cacheguard.redis.notifier import Notifier


def test_a_revoked_channel_wakes_its_waiters_and_is_forgotten(
    client: redis.Redis, namespace: str
) -> None:
    notifier = Notifier(client.connection_pool.make_connection)
    channel = f"{namespace}:{{k}}:rel"
    try:
        with notifier.subscription(channel) as sub:
            assert sub.open(5)
            assert sub.live_token() is not None
            notifier._dispatch([b"sunsubscribe", channel.encode(), 0])
            assert sub._woken.is_set()  # woken at once, no message: retry elsewhere
            assert sub.wait(5) == []
            assert sub.live_token() is None
            assert channel not in notifier.subscribed_channels()
        with notifier.subscription(channel) as again:  # subscribes anew
            assert again.open(5)
            client.spublish(channel, b"free")
            assert again.wait(5) == [b"free"]
    finally:
        notifier.close()


async def test_a_revoked_channel_wakes_its_waiting_tasks_and_is_forgotten(
    aclient: redis.asyncio.Redis, client: redis.Redis, namespace: str
) -> None:
    notifier = AsyncNotifier(aclient.connection_pool.make_connection)
    channel = f"{namespace}:{{k}}:rel"
    try:
        with notifier.subscription(channel) as sub:
            assert await sub.open(5)
            notifier._dispatch([b"sunsubscribe", channel.encode(), 0])
            assert sub._woken  # woken at once, no message: retry elsewhere
            assert await sub.wait(5) == []
            assert sub.live_token() is None
            assert channel not in notifier.subscribed_channels()
        with notifier.subscription(channel) as again:
            assert await again.open(5)
            client.spublish(channel, b"free")
            assert await again.wait(5) == [b"free"]
    finally:
        await notifier.aclose()
