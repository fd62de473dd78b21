"""Redis evicting the cache's keys: every ``maxmemory-policy`` users run, with real
eviction on a throwaway ``redis-server`` per policy (docs/design.md#eviction).

A fill in flight whose key is invalidated must not store, even when eviction takes
the version key before the fill ends (the version would read "never invalidated").
Each test holds a fill inside its loader, invalidates the key, fills Redis with
filler keys until the version key is evicted (the key's lock hash, which carries
the fill's hold, kept: touched more recently, more often, or expiring later than the
version key, as each policy ranks them), then lets the fill end. Under
``noeviction`` nothing is evicted: writes are refused once memory is full.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from cacheguard import MISSING, BackendUnavailable
from cacheguard.cache.wire import POISON_FLOOR
from cacheguard.testing import OwnedRedisServer
from tests.guard_drivers import KINDS, Guard, guards_on
from tests.helpers import wait_until
from tests.test_guard_both_drivers import Loads, started

pytest_plugins = ["tests.deployment_fixtures"]

EVICTING = ("allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl")
FILLER = b"x" * 200
# Under volatile-ttl the version key must go first and the lock hash last: the
# version key expires soonest, then the fillers, then the lock hash (the lease).
SETTINGS: dict[str, Any] = {"version_ttl": 60.0, "lease": 300.0, "ttl_jitter": 0}
FILLER_TTL_MS = 180_000


@pytest.fixture(scope="module")
def policy_server(
    request: pytest.FixtureRequest, redis_server_binary: str
) -> Iterator[tuple[str, str]]:
    """``(policy, url)``: a redis-server of its own per policy. ``lfu-log-factor 0``:
    every access counts, so the test can rank keys by frequency exactly."""
    policy = str(request.param)
    server = OwnedRedisServer(
        "--maxmemory-policy", policy, "--lfu-log-factor", "0", "--maxmemory-samples", "10"
    )
    try:
        yield policy, server.url
    finally:
        server.close()


@pytest.fixture
def plain(policy_server: tuple[str, str]) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(policy_server[1])
    client.config_set("maxmemory", 0)
    client.flushall()
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.flushall()
        client.close()


@pytest.fixture(params=KINDS)
async def guard(
    request: pytest.FixtureRequest, policy_server: tuple[str, str], plain: redis.Redis
) -> AsyncIterator[Guard]:
    async with guards_on(str(request.param), policy_server[1], **SETTINGS) as build:
        yield build(namespace="ev")


def _fillers(
    client: redis.Redis, *, until: Any, touch: bool, start: int = 0, limit: int = 400_000
) -> int:
    """Write filler keys ``filler:<start>``... (with a TTL, so every policy may evict
    them) in batches until ``until()`` is true; returns the next number. ``touch``:
    read each once, so that under LFU each counts one access more than a key only
    written."""
    for written in itertools.count(start, 100):
        if until() or written >= start + limit:
            return written
        pipe = client.pipeline(transaction=False)
        for i in range(written, written + 100):
            pipe.set(f"filler:{i}", FILLER, px=FILLER_TTL_MS)
            if touch:
                pipe.get(f"filler:{i}")
        pipe.execute(raise_on_error=False)
    raise AssertionError("unreachable")


def _idle_at_least(client: redis.Redis, key: str, seconds: int) -> None:
    """Wait until the server's LRU clock (seconds) counts ``key`` idle that long."""
    deadline = time.monotonic() + 15
    while int(client.object("idletime", key) or 0) < seconds:
        assert time.monotonic() < deadline, "the LRU clock did not move"
        time.sleep(0.05)


def _evict_version_key(client: redis.Redis, policy: str, version: str, lock: str) -> int:
    """Evict the version key by filling memory, keeping the lock hash: rank the keys
    so that the policy takes the version key first, then fillers older than the lock
    hash, never the lock hash while any of those are left. Returns the fillers written."""
    lru, lfu = policy.endswith("-lru"), policy.endswith("-lfu")
    if lru:  # the LRU clock ticks in seconds
        _idle_at_least(client, version, 1)
    # Old fillers, about 8000 of them (2 MB): the evictions before the version key is
    # sampled (about 8000 / maxmemory-samples 10 of them) take only old fillers.
    old = _fillers(client, until=lambda: False, touch=lfu, limit=8000)
    if lru:  # version key idle >= 2 s, old fillers >= 1 s, lock hash 0 s
        _idle_at_least(client, f"filler:{old - 1}", 1)
        _idle_at_least(client, version, 2)
        client.hgetall(lock)
    elif lfu:  # far more often used than the version key or any filler
        for _ in range(50):
            client.hgetall(lock)
    # volatile-ttl: the version key expires first, then the fillers, then the lock hash.
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used - 256 * 1024)  # evicts at once, then as we write
    try:
        return _fillers(client, until=lambda: not client.exists(version), touch=lfu, start=old)
    finally:
        client.config_set("maxmemory", 0)


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
@pytest.mark.parametrize("policy_server", EVICTING, indirect=True)
async def test_an_evicted_version_key_never_lets_an_old_value_in(
    guard: Guard, plain: redis.Redis, policy_server: tuple[str, str]
) -> None:
    policy = policy_server[0]
    keys = guard.keys("menu")
    gate = threading.Event()
    loads = Loads("old", gate=gate)
    filling = asyncio.ensure_future(guard.get_or_load("menu", loads, ttl=600))
    try:
        await started(loads)  # began on a cold key: the version it saw is '0'
        await guard.invalidate("menu")  # the database changed while the fill loads
        assert plain.exists(keys.version)
        evicted = await asyncio.to_thread(
            _evict_version_key, plain, policy, keys.version, keys.lock
        )
        assert evicted > 0
        assert not plain.exists(keys.version)
        assert plain.hget(keys.lock, "fill") is not None  # the fill's hold survived
    finally:
        gate.set()
    assert await filling == "old"  # its caller gets what it loaded; the cache does not
    assert await guard.peek("menu") is MISSING
    assert await guard.get_or_load("menu", Loads("new"), ttl=600) == "new"


@pytest.mark.slow
@pytest.mark.parametrize("policy_server", ["noeviction"], indirect=True)
async def test_noeviction_refuses_writes_and_caches_no_wrong_value(
    guard: Guard, plain: redis.Redis, policy_server: tuple[str, str]
) -> None:
    assert await guard.get_or_load("cached", Loads("old"), ttl=600) == "old"
    gate = threading.Event()
    loads = Loads("old", gate=gate)
    filling = asyncio.ensure_future(guard.get_or_load("menu", loads, ttl=600))
    gate_other = threading.Event()
    loads_other = Loads("other", gate=gate_other)
    other = asyncio.ensure_future(guard.get_or_load("other", loads_other, ttl=600))
    try:
        await started(loads)
        await started(loads_other)
        used = int(plain.info("memory")["used_memory"])
        plain.config_set("maxmemory", used + 256 * 1024)

        def refused() -> bool:
            try:
                plain.set("probe", FILLER, px=FILLER_TTL_MS)
            except redis.OutOfMemoryError:
                return True
            return False

        await asyncio.to_thread(_fillers, plain, until=refused, touch=False)
        full = plain.config_get("maxmemory")["maxmemory"]
        plain.config_set("maxmemory", int(full) - 64 * 1024)  # and well past the edge
        # Full. A read still reads; a cold key's fill cannot begin (Redis refuses its
        # write): Redis is down for the guard, so on_backend_error="bypass" loads
        # directly, and "raise" raises BackendUnavailable.
        assert await guard.peek("cached") == "old"
        assert await guard.get_or_load("cold", Loads("cold"), ttl=600) == "cold"
        assert not plain.exists(guard.keys("cold").value)
        async with guards_on(guard.kind, policy_server[1], **SETTINGS) as build:
            strict = build(namespace="ev", on_backend_error="raise")
            with pytest.raises(BackendUnavailable):
                await strict.get_or_load("cold", Loads("cold"), ttl=600)
        # The sequence's INCR is refused; the invalidations go through all the same,
        # poisoned: a script's first write is a delete, which Redis never refuses, and
        # Redis does not stop a script that has written. The value is gone, the fill in
        # flight failed.
        await guard.invalidate("cached", "menu", "nothing")
        assert await guard.peek("cached") is MISSING
        assert plain.hget(guard.keys("menu").lock, "fs") is None
        for name in ("cached", "menu", "nothing"):
            assert int(plain.get(guard.keys(name).version) or 0) >= POISON_FLOOR
        # A fill that ends while Redis is full: its caller gets the value, nothing is
        # stored, and its hold is released all the same.
        gate_other.set()
        assert await other == "other"
        assert not plain.exists(guard.keys("other").value)
        lock = guard.keys("other").lock
        assert await asyncio.to_thread(wait_until, lambda: not plain.exists(lock), 10)
        plain.config_set("maxmemory", 0)  # memory frees up before the fill ends
    finally:
        gate.set()
        gate_other.set()
    assert await filling == "old"
    assert await guard.peek("menu") is MISSING
    assert await guard.get_or_load("menu", Loads("new"), ttl=600) == "new"
    assert await guard.get_or_load("cached", Loads("new"), ttl=600) == "new"
