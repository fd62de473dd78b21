"""Entries' ages are judged by the Redis server's clock, so a host whose own wall
clock is off costs no loads and serves nothing past its end; on both guards.

The skewed host is a guard with an injected ``clock`` ten minutes fast or slow;
the others use the real one. Counts come from the guards' stats, not from time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import MISSING, CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache.entry import pack_entry
from tests.guard_drivers import KINDS, Guard

Make = Callable[..., Guard]
SKEWS = {"10 min fast": 600.0, "10 min slow": -600.0}


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    made: list[Guard] = []

    def build(**settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        if request.param == "sync":
            guard: CacheGuard | AsyncCacheGuard = CacheGuard(
                redis.Redis.from_url(redis_url, socket_timeout=10), **settings
            )
        else:
            guard = AsyncCacheGuard(
                redis.asyncio.Redis.from_url(redis_url, socket_timeout=10), **settings
            )
        made.append(Guard(request.param, guard))
        return made[-1]

    yield build
    for guard in made:
        await guard.close()


def skewed_clock(seconds: float) -> Callable[[], float]:
    return lambda: time.time() + seconds


class Loads:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, value: str) -> Callable[[], str]:
        def load() -> str:
            self.count += 1
            return value

        return load


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
async def test_a_host_whose_clock_is_off_loads_nothing_again(make: Make, skew: float) -> None:
    """Entries written by others are fresh to the skewed host, and entries it writes
    are fresh to others (stamped with the server's clock, not its own); also with a
    stale window and early refresh, whose judgements are by age too."""
    settings = {"stale_ttl": 30.0, "early_refresh_beta": 1.0}
    honest = make(**settings)
    skewed = make(clock=skewed_clock(skew), **settings)
    loads = Loads()
    assert await honest.get_or_load("a", loads("a"), ttl=60) == "a"
    for _ in range(3):
        assert await skewed.get_or_load("a", loads("again"), ttl=60) == "a"
    assert await skewed.get_or_load("b", loads("b"), ttl=60) == "b"
    for guard in (honest, skewed, honest):
        assert await guard.get_or_load("b", loads("again"), ttl=60) == "b"
    assert loads.count == 2  # "a" by the honest host, "b" by the skewed one: once each
    stats = skewed.guard.stats()
    assert (stats.misses, stats.stale_served, stats.early_refreshes) == (1, 0, 0)
    assert honest.guard.stats().misses == 1
    # A host whose first call is a refresh stamps its entry by the server's clock too
    # (its fill_begin's reply carries it).
    refresher = make(clock=skewed_clock(skew), **settings)
    assert await refresher.refresh("c", loads("c"), ttl=60) == "c"
    assert await honest.get_or_load("c", loads("again"), ttl=60) == "c"
    assert loads.count == 3
    stats = honest.guard.stats()
    assert (stats.misses, stats.stale_served, stats.early_refreshes) == (1, 0, 0)


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
async def test_a_host_whose_clock_is_off_serves_no_expired_entry_as_fresh(
    make: Make, client: redis.Redis, skew: float
) -> None:
    """An entry past its end (by the server's clock) that Redis still keeps for the
    stale policy is no hit, however the host's clock runs (ten minutes slow, the old
    judgement by the host's clock served it for ten more minutes)."""
    honest = make(on_timeout="stale")
    skewed = make(on_timeout="stale", clock=skewed_clock(skew))
    assert await honest.get_or_load("k", lambda: "old", ttl=30) == "old"
    key = honest.guard.keys("k").value
    kept_ms = client.pttl(key)
    assert kept_ms > 30_000  # kept one more lifetime, for timeouts only
    seconds, micros = client.time()
    aged = pack_entry(honest.guard.settings.codec, "old", created=seconds + micros / 1e6 - 45,
                      ttl=30, version=0, load_duration=0.0)  # fmt: skip
    client.set(key, aged, px=kept_ms)  # loaded 45 s ago by the server's clock
    assert await skewed.peek("k") is MISSING
    assert await skewed.get_or_load("k", lambda: "new", ttl=30) == "new"
    assert await honest.get_or_load("k", lambda: "newer", ttl=30) == "new"
