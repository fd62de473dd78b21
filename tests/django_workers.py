"""Child-process code of tests/test_django_cache.py: each child configures Django
itself (spawned: nothing inherited) and makes its own ``CacheGuardCache``."""

from __future__ import annotations

import functools
from typing import Any

import redis

from cacheguard.backoff import Backoff

# A retry timer a minute long: within a test's deadline only the fill's announcement
# can wake a waiter.
NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)


def configure_django() -> None:
    """Django settings for the backend, once per process: the tests' shared settings
    (tests/django_settings.py: one SECRET_KEY in every process), so that these and
    the ORM tests can run in one process."""
    from tests.django_settings import configure_django as configure

    configure()


def backend(url: str, namespace: str, **options: Any) -> Any:
    configure_django()
    from cacheguard.integrations.django import CacheGuardCache

    return CacheGuardCache(url, {"OPTIONS": {"namespace": namespace, **options}})


def gated_loader(client: redis.Redis, counter: str, gate: str, value: Any) -> Any:
    """A get_or_set callable: counts its call in Redis, then waits for the test to
    open ``gate`` (a list it pushes a token to: BLPOP, no polling)."""

    def load() -> Any:
        client.incr(counter)
        if client.blpop([gate], timeout=120) is None:
            raise TimeoutError("the test never opened the gate")
        return value

    return load


def stampede(url: str, namespace: str, key: str, counter: str, gate: str, ready: str) -> Any:
    """One process of a cold-key stampede: get_or_set with a gated loader. The lock
    waits are long and the retry timer a minute: only the announcement of the fill
    wakes a waiter in time. Returns the value."""
    cache = backend(url, namespace, lease=60, wait_timeout=120, on_timeout="raise")
    cache.guard._state.wait_backoff = NO_TIMER_WAKE_UP
    client = redis.Redis.from_url(url, socket_timeout=130)
    try:
        load = gated_loader(client, counter, gate, {"menu": 7, "loaded_by": "one"})
        client.rpush(ready, "1")
        return cache.get_or_set(key, load, 300)
    finally:
        cache.shutdown()
        client.close()


def incr_many(url: str, namespace: str, key: str, times: int) -> int:
    """``times`` increments of one counter, racing the other processes."""
    cache = backend(url, namespace)
    try:
        last = 0
        for _ in range(times):
            last = cache.incr(key)
        return last
    finally:
        cache.shutdown()


def fill_gated(url: str, namespace: str, key: str, counter: str, gate: str) -> Any:
    """A get_or_set whose load waits for the test's gate (another process's fill)."""
    cache = backend(url, namespace, lease=60, wait_timeout=120)
    client = redis.Redis.from_url(url, socket_timeout=130)
    try:
        return cache.get_or_set(key, gated_loader(client, counter, gate, "from-process"), 300)
    finally:
        cache.shutdown()
        client.close()
