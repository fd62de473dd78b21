"""Loaders and decorated functions at module level, for the pickling tests
(tests/test_shutdown.py): a process pool's workers import this module and find
them here by name, with the guards this module makes at import."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cacheguard import CacheGuard, CacheLoader, cached_with_lock
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
NAMESPACE = "cgpickle"

guard = CacheGuard.from_url(REDIS_URL, namespace=NAMESPACE, ttl_jitter=0)
aguard = AsyncCacheGuard.from_url(REDIS_URL, namespace=NAMESPACE, ttl_jitter=0)


@cached_with_lock(guard, key="square:{n}", ttl=60)
def square(n: int) -> dict[str, int]:
    return {"n": n, "square": n * n, "pid": os.getpid()}


def load_cube(n: int) -> dict[str, int]:
    return {"n": n, "cube": n**3, "pid": os.getpid()}


cubes = CacheLoader(guard, key="cube:{n}", load=load_cube, ttl=60)


@cached_with_lock(aguard, key="asquare:{n}", ttl=60)
async def asquare(n: int) -> dict[str, int]:
    return {"n": n, "square": n * n, "pid": os.getpid()}


async def aload_cube(n: int) -> dict[str, int]:
    return load_cube(n)


acubes = AsyncCacheLoader(aguard, key="acube:{n}", load=aload_cube, ttl=60)


class Repo:
    """Decorated methods: pickled as class attributes."""

    def __init__(self, scale: int) -> None:
        self.scale = scale

    @cached_with_lock(guard, key="repo:{n}", ttl=60)
    def get(self, n: int) -> int:
        return n * self.scale

    @cached_with_lock(guard, key="repo-static:{n}", ttl=60)
    @staticmethod
    def static(n: int) -> int:
        return -n


def run_async(func: Any, *args: Any) -> Any:
    """Await ``func(*args)`` in a new loop (a worker runs one such task: the asyncio
    guard belongs to the first loop it is used on)."""
    return asyncio.run(func(*args))
