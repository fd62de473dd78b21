"""The deployments a URL names and the clients the guards accept (cacheguard/redis/clients.py),
then both guards on a real Sentinel set (a master, a replica, three sentinels)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest
import redis
import redis.asyncio
import redis.cluster
from cacheguard_testing.deployments import OwnedSentinelSet

from cacheguard import MISSING, BackendUnavailable, CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.redis.clients import parse_url
from cacheguard.redis.errors import NoReplicasError
from cacheguard.testing import OwnedRedisServer
from tests.guard_drivers import KINDS, NO_TIMER_WAKE_UP, Guard, guards_on
from tests.helpers import subscribers, waiting_in
from tests.test_guard_both_drivers import Loads, started

pytest_plugins = ["tests.deployment_fixtures"]


def test_url_forms() -> None:
    assert parse_url("redis://h:1/2").kind == "server"
    assert parse_url("unix:///tmp/r.sock").kind == "server"
    cluster = parse_url("redis+cluster://u:p%40ss@a:7000,b:7001,[::1]:7002,c")
    assert cluster.kind == "cluster"
    assert cluster.nodes == (("a", 7000), ("b", 7001), ("::1", 7002), ("c", 6379))
    assert cluster.options == {"ssl": False, "username": "u", "password": "p@ss"}
    sentinel = parse_url("rediss+sentinel://:secret@s1,s2:26380/menu-master/3")
    assert sentinel.kind == "sentinel"
    assert sentinel.nodes == (("s1", 26379), ("s2", 26380))
    assert (sentinel.service, sentinel.db) == ("menu-master", 3)
    assert sentinel.options == {"ssl": True, "password": "secret"}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "needs /service"),
        ("redis+sentinel://s1/menu/x", "is a number"),
        ("redis+cluster://a:1/0", "no database"),
        ("redis+cluster://a:99999", "bad host:port"),
        ("redis+nonsense://a:1", "unsupported Redis URL"),
        ("http+cluster://user:hunter2@a:1", r"\*\*\*@a:1"),  # the password is not echoed
    ],
)
def test_bad_urls_are_refused_clearly(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        CacheGuard.from_url(url)
    assert "hunter2" not in str(caught.value)


def test_clients_of_the_wrong_kind_are_refused() -> None:
    with pytest.raises(TypeError, match=r"cacheguard\.aio"):
        CacheGuard(redis.asyncio.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sync class"):
        AsyncCacheGuard(redis.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RedisCluster"):
        CacheGuard(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decode_responses=False"):
        CacheGuard(redis.Redis(decode_responses=True))


# -- on a real Sentinel set ---------------------------------------------------------------

Make = Callable[..., Guard]


def sentinel_url(sentinels: OwnedSentinelSet) -> str:
    hosts = ",".join(f"{h}:{p}" for h, p in sentinels.sentinel_addresses)
    return f"redis+sentinel://{hosts}/{sentinels.master_name}"


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, sentinel_set: OwnedSentinelSet, namespace: str
) -> AsyncIterator[Make]:
    async with guards_on(request.param, sentinel_url(sentinel_set), namespace=namespace) as build:
        yield build


@pytest.mark.slow
async def test_guards_on_a_sentinel_master_fill_write_and_wake_by_announcement(
    make: Make, sentinel_set: OwnedSentinelSet
) -> None:
    filler = make(lease=60)
    waiter = make(lease=60, wait_timeout=120, on_timeout="raise")
    waiter.guard._state.wait_backoff = NO_TIMER_WAKE_UP
    gate = threading.Event()
    slow = Loads("filled", gate=gate)
    filling = asyncio.ensure_future(filler.get_or_load("k", slow, ttl=60))
    await started(slow)
    with waiting_in() as waits:  # the waiter subscribed, looked again, and waits
        waiting = asyncio.ensure_future(waiter.get_or_load("k", Loads("waiter"), ttl=60))
        assert await asyncio.to_thread(waits.wait, 10)
    host, port = sentinel_set.master_address()
    with redis.Redis(host=host, port=port) as master:  # subscribed on the master
        assert subscribers(master, waiter.keys("k").released_channel) >= 1
    gate.set()
    assert await asyncio.wait_for(waiting, 20) == "filled"
    assert await filling == "filled"
    async with filler.write("k"):
        assert await waiter.peek("k") is MISSING
    assert await waiter.get_or_load("k", lambda: "after the write", ttl=60) == "after the write"


def test_a_master_without_its_replicas_is_redis_refusing_not_an_error(
    redis_server_binary: str, namespace: str
) -> None:
    # min-replicas-to-write 1 and no replica: the master answers NOREPLICAS to every
    # write (a fill's scripts, an invalidation). Reads bypass to the loader; writes
    # fail with BackendUnavailable; nothing counts as a corrupt entry.
    server = OwnedRedisServer("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
    try:
        guard = CacheGuard.from_url(server.url, namespace=namespace)
        assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        with pytest.raises(BackendUnavailable) as caught:
            guard.invalidate("k")
        assert isinstance(caught.value.__cause__, NoReplicasError)
        stats = guard.stats()
        assert stats.corrupt_entries == 0
        assert stats.backend_errors >= 2
    finally:
        server.close()
