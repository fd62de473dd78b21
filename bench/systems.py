"""The read-through caches bench/compare.py puts side by side, one small adapter each.

Every adapter answers the same three questions in its library's own idiom:

- ``get(key, load)``: read-through, calling ``load()`` on a miss (as the library's
  users would write it: its decorator, region or lock around cache-aside);
- ``write(key, update)``: the write path, ``update()`` being the database commit
  (cache-aside libraries: commit, then delete the entry; cacheguard: its write lock);
- ``warm()``: open what a running service has open already, beyond the pooled
  connection a first ``get`` opens;
- ``close()``.

Sync adapters are called from threads; ``is_async`` adapters (cashews, cacheguard's
asyncio guard) expose
coroutines of the same names and are called from asyncio tasks. Each one keeps
its keys under its own prefix, stores values with msgpack where the library lets
the user choose, and gets the same lock lease (``lease`` seconds) where it has one.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import redis

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard, async_notifier_for
from cacheguard.redis.notifier import notifier_for


@dataclass(frozen=True)
class Settings:
    url: str
    prefix: str
    ttl: float = 60.0
    lease: float = 2.0
    l1: bool = False


class Naive:
    """Cache-aside without any lock: GET, on a miss load and SET."""

    label = "naive cache-aside"
    is_async = False

    def __init__(self, settings: Settings) -> None:
        self.client = redis.Redis.from_url(settings.url)
        self.prefix, self.ttl = settings.prefix, settings.ttl

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        raw = self.client.get(f"{self.prefix}:{key}")
        if raw is not None:
            return msgpack.unpackb(raw)
        value = load()
        self.client.set(f"{self.prefix}:{key}", msgpack.packb(value), px=int(self.ttl * 1000))
        return value

    def write(self, key: str, update: Callable[[], None]) -> None:
        update()
        self.client.delete(f"{self.prefix}:{key}")

    def warm(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()


class DoubleChecked(Naive):
    """Cache-aside with a lock around the load and a second GET under it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.lease = settings.lease

    def lock(self, key: str) -> Any:
        raise NotImplementedError

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        value_key = f"{self.prefix}:{key}"
        raw = self.client.get(value_key)
        if raw is not None:
            return msgpack.unpackb(raw)
        with self.lock(key):
            raw = self.client.get(value_key)
            if raw is not None:
                return msgpack.unpackb(raw)
            value = load()
            self.client.set(value_key, msgpack.packb(value), px=int(self.ttl * 1000))
            return value


class RedisPyLock(DoubleChecked):
    """redis-py's ``Lock`` (waiters poll every 100 ms, its default)."""

    label = "redis-py Lock"

    def lock(self, key: str) -> Any:
        return self.client.lock(f"{self.prefix}:lock:{key}", timeout=self.lease, sleep=0.1)


class PythonRedisLock(DoubleChecked):
    """python-redis-lock (waiters BLPOP a signal list; ``auto_renewal`` keeps a live
    holder's lock)."""

    label = "python-redis-lock"

    def __init__(self, settings: Settings) -> None:
        import redis_lock

        super().__init__(settings)
        self.lock_class = redis_lock.Lock

    def lock(self, key: str) -> Any:
        return self.lock_class(
            self.client, f"{self.prefix}:{key}", expire=int(self.lease), auto_renewal=True
        )


class DogpileCache:
    """A dogpile.cache region on its Redis backend with ``distributed_lock=True``.

    ``lock_timeout`` is the lease unless ``default_lock`` is set: dogpile's default
    is no timeout, so a holder that dies keeps the lock forever."""

    label = "dogpile.cache"
    is_async = False

    def __init__(self, settings: Settings, default_lock: bool = False) -> None:
        from dogpile.cache import make_region

        arguments: dict[str, Any] = {
            "url": settings.url,
            "distributed_lock": True,
            "thread_local_lock": False,  # dogpile's advice with a distributed lock
            "redis_expiration_time": int(settings.ttl),
        }
        if not default_lock:
            arguments["lock_timeout"] = int(settings.lease)
        self.prefix = settings.prefix
        self.region = make_region(
            key_mangler=lambda key: f"{settings.prefix}:{key}",
            serializer=msgpack.packb,
            deserializer=msgpack.unpackb,
        ).configure("dogpile.cache.redis", expiration_time=settings.ttl, arguments=arguments)

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        return self.region.get_or_create(key, load)

    def write(self, key: str, update: Callable[[], None]) -> None:
        update()
        self.region.delete(key)

    def warm(self) -> None:
        pass

    def close(self) -> None:
        backend = self.region.backend
        backend.writer_client.close()  # type: ignore[attr-defined]


class DogpileDefaultLock(DogpileCache):
    label = "dogpile.cache (no lock_timeout)"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, default_lock=True)


class Cashews:
    """cashews on its Redis backend, ``@cache(ttl=..., lock=True)``: in-process
    coalescing per key plus a Redis lock (whose TTL is the cache TTL) taken around
    every call, waiters retrying at once (``check_interval=0``)."""

    label = "cashews"
    is_async = True

    def __init__(self, settings: Settings) -> None:
        from cashews import Cache

        self.cache = Cache()
        self.cache.setup(settings.url, client_side=False)
        self._load: Callable[[], Awaitable[Any]] | None = None

        # The prefix goes into the key template so that the lock key cashews derives
        # from it ("lock:" + template) is this run's own too.
        @self.cache(ttl=settings.ttl, key=settings.prefix + ":{key}", lock=True)
        async def fetch(key: str) -> Any:
            assert self._load is not None
            return await self._load()

        self._fetch = fetch
        self.prefix = settings.prefix

    async def get(self, key: str, load: Callable[[], Awaitable[Any]]) -> Any:
        self._load = load  # one loader per workload, shared by every task
        return await self._fetch(key)

    async def write(self, key: str, update: Callable[[], Awaitable[None]]) -> None:
        await update()
        await self.cache.delete(f"{self.prefix}:{key}")

    async def warm(self) -> None:
        pass

    async def close(self) -> None:
        await self.cache.close()


class CacheGuardSystem:
    """cacheguard's ``get_or_load`` and ``write`` with library defaults, the lease set."""

    label = "cacheguard"
    is_async = False

    def __init__(self, settings: Settings) -> None:
        extra: dict[str, Any] = {"l1_maxsize": 1000, "l1_ttl": settings.ttl} if settings.l1 else {}
        self.guard = CacheGuard(
            redis.Redis.from_url(settings.url),
            namespace=settings.prefix,
            lease=settings.lease,
            **extra,
        )
        self.ttl = settings.ttl

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        return self.guard.get_or_load(key, load, ttl=self.ttl)

    def write(self, key: str, update: Callable[[], None]) -> None:
        with self.guard.write(key):
            update()

    def warm(self) -> None:
        # The process's one pub/sub connection, which a service has open after its
        # first wait; opening it costs a connect and a handshake.
        with notifier_for(self.guard.client).subscription(f"{self.guard.namespace}:warm") as sub:
            sub.open(5)

    def close(self) -> None:
        self.guard.close()
        self.guard.client.close()


class AsyncCacheGuardSystem:
    """cacheguard's asyncio guard: the same algorithm, entries and defaults, awaited."""

    label = "cacheguard (asyncio)"
    is_async = True

    def __init__(self, settings: Settings) -> None:
        extra: dict[str, Any] = {"l1_maxsize": 1000, "l1_ttl": settings.ttl} if settings.l1 else {}
        self.guard = AsyncCacheGuard.from_url(
            settings.url, namespace=settings.prefix, lease=settings.lease, **extra
        )
        self.ttl = settings.ttl

    async def get(self, key: str, load: Callable[[], Awaitable[Any]]) -> Any:
        return await self.guard.get_or_load(key, load, ttl=self.ttl)

    async def write(self, key: str, update: Callable[[], Awaitable[None]]) -> None:
        async with self.guard.write(key):
            await update()

    async def warm(self) -> None:
        subscription = async_notifier_for(self.guard.client).subscription(
            f"{self.guard.namespace}:warm"
        )
        await subscription.open(5)
        subscription.close()

    async def close(self) -> None:
        await self.guard.aclose()
        await self.guard.client.aclose()


SYSTEMS: dict[str, type[Any]] = {
    "cacheguard": CacheGuardSystem,
    "cacheguard-async": AsyncCacheGuardSystem,
    "naive": Naive,
    "redis-py-lock": RedisPyLock,
    "python-redis-lock": PythonRedisLock,
    "dogpile": DogpileCache,
    "cashews": Cashews,
}
# Shown only where it differs from the configured one: the holder-crash workload.
CRASH_EXTRA: dict[str, type[Any]] = {"dogpile-default": DogpileDefaultLock}


def versions() -> dict[str, str]:
    """Installed versions of every compared library."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in (
        "cacheguard-redis",
        "redis",
        "dogpile.cache",
        "cashews",
        "python-redis-lock",
        "msgpack",
    ):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found


def fresh_prefix(system: str) -> str:
    """A key prefix of its own for every system and run: cold keys, no cross-talk."""
    return f"cmp-{system}-{uuid.uuid4().hex[:8]}"
