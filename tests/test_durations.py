"""Durations (issue #26): every duration cacheguard takes is a number of seconds or a
``datetime.timedelta``, on both guards -- a read's ``ttl`` and ``none_ttl``, the
loaders' and the decorator's, every duration setting, ``from_url``'s timeouts, a
write's ``timeout``, the locks' leases and timeouts, the dogpile backend's
arguments and the SQLAlchemy hooks' ``lock_timeout`` and ``outbox_poll``.

A timedelta counts for its whole length in seconds (days and microseconds too:
:data:`LONG` has all three), what Redis is told is that length, and a bad one
(zero, negative, past ten years) gets the error its number gets, before anything
is loaded or stored. The lock stores' acquisitions are in the lock contract
(tests/test_lock_contract.py and its asyncio twin).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio
from dogpile.cache import make_region

from cacheguard import (
    MISSING,
    CacheGuard,
    CacheLoader,
    LocalRWLock,
    LockFactory,
    LockTimeout,
    RedisRWLock,
    cached_with_lock,
)
from cacheguard.aio import (
    AsyncCacheGuard,
    AsyncCacheLoader,
    AsyncLocalRWLock,
    AsyncLockFactory,
    AsyncRedisRWLock,
    AsyncRedlockRWLock,
)
from cacheguard.integrations.dogpile import BackendArgumentError
from cacheguard.locks import RedlockRWLock
from tests.guard_drivers import KINDS, Guard, guard_from_url

Make = Callable[..., Guard]

LONG = timedelta(days=1, seconds=30, milliseconds=250)  # days, seconds and microseconds
LONG_SECONDS = 86_430.25
QUARTER = timedelta(days=90)

# (a bad timedelta, the words the error of its number has)
BAD = [
    pytest.param(timedelta(0), "must be a finite number > 0", id="zero"),
    pytest.param(timedelta(seconds=-1), "must be a finite number > 0", id="negative"),
    pytest.param(timedelta(days=3651), "must be at most .*ten years", id="past-ten-years"),
]


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


class Loads:
    """A loader that counts its calls."""

    def __init__(self, value: Any = "v") -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


async def stored_ttl(guard: Guard, name: str) -> float:
    """The lifetime the entry of ``name`` was stored with."""
    entry = await guard._call(guard.guard.peek_entry, name)
    assert entry is not None, name
    return float(entry.ttl)


def redis_ttl(client: redis.Redis, guard: Guard, name: str) -> float:
    """What Redis was told: the seconds left on the value key of ``name``."""
    return int(client.pttl(guard.keys(name).value)) / 1000


# -- the guards ------------------------------------------------------------------------------


async def test_a_timedelta_ttl_lives_as_long_as_its_seconds(
    make: Make, client: redis.Redis
) -> None:
    guard = make()
    loads = Loads()
    assert await guard.get_or_load("td", loads, ttl=LONG) == "v"
    assert await guard.get_or_load("td", loads, ttl=LONG) == "v"  # the hit path takes it too
    assert loads.calls == 1
    assert await stored_ttl(guard, "td") == LONG_SECONDS
    assert LONG_SECONDS - 60 < redis_ttl(client, guard, "td") <= LONG_SECONDS
    # The number of the same length stores the same.
    await guard.get_or_load("n", Loads(), ttl=LONG_SECONDS)
    assert await stored_ttl(guard, "n") == LONG_SECONDS

    assert await guard.refresh("td", Loads("w"), ttl=timedelta(hours=2)) == "w"
    assert await stored_ttl(guard, "td") == 7200.0
    assert 7200 - 60 < redis_ttl(client, guard, "td") <= 7200

    nothing = timedelta(minutes=1, microseconds=500_000)
    assert await guard.get_or_load("none", Loads(None), ttl=LONG, none_ttl=nothing) is None
    assert await stored_ttl(guard, "none") == 60.5


async def test_loaders_and_the_decorator_take_timedelta_lifetimes(make: Make) -> None:
    guard = make()
    if guard.kind == "sync":
        loader: Any = CacheLoader(
            guard.guard,
            key="l:{n}",
            load=lambda n: n or None,
            ttl=LONG,
            none_ttl=timedelta(days=90),
        )
    else:
        loader = AsyncCacheLoader(
            guard.guard,
            key="l:{n}",
            load=lambda n: n or None,
            ttl=LONG,
            none_ttl=timedelta(days=90),
        )
    # Converted once, when the loader is made: its calls pass plain seconds.
    assert (loader.ttl, loader.none_ttl) == (LONG_SECONDS, 90 * 86_400.0)
    assert await guard._call(loader.get, 3) == 3
    assert await stored_ttl(guard, "l:3") == LONG_SECONDS
    assert await guard._call(loader.get, 0) is None
    assert await stored_ttl(guard, "l:0") == 90 * 86_400.0

    def double(n: int) -> int:
        return 2 * n

    decorated = guard.decorate(key="d:{n}", ttl=timedelta(minutes=5))(double)
    assert await decorated(4) == 8
    assert await stored_ttl(guard, "d:4") == 300.0


# Every duration setting, each a timedelta of a length of its own.
DURATION_SETTINGS = {
    "lease": timedelta(seconds=20),
    "wait_timeout": timedelta(seconds=4),
    "none_ttl": timedelta(seconds=45),
    "stale_ttl": timedelta(minutes=10),
    "l1_ttl": timedelta(seconds=3),
    "version_ttl": timedelta(days=2),
    "max_load_time": timedelta(seconds=50),
    "breaker_cooldown": timedelta(milliseconds=1500),
    "confirm_timeout": timedelta(milliseconds=700),
    "outage_ttl": timedelta(seconds=12),
    "stale_if_error": timedelta(minutes=2),
    "gutter_ttl": timedelta(seconds=7),
}


async def test_every_duration_setting_takes_a_timedelta(make: Make, client: redis.Redis) -> None:
    guard = make(**DURATION_SETTINGS)
    for name, value in DURATION_SETTINGS.items():
        kept = getattr(guard.guard.settings, name)
        assert type(kept) is float, name  # seconds, converted once
        assert kept == value.total_seconds(), name
    # And they act as their seconds: the locks' lease and timeout, the stale window
    # in what Redis keeps of an entry.
    lock = guard.guard.rwlock("k").remote
    assert (lock.lease, lock.timeout) == (20.0, 4.0)
    await guard.get_or_load("k", Loads(), ttl=timedelta(minutes=1))
    assert 660 - 60 < redis_ttl(client, guard, "k") <= 660
    # Zero is a timedelta too where 0 is allowed.
    assert make(outage_ttl=timedelta(0)).guard.settings.outage_ttl == 0.0


@pytest.mark.parametrize("kind", KINDS)
async def test_from_url_takes_timedelta_timeouts(kind: str, redis_url: str, namespace: str) -> None:
    guard = guard_from_url(
        kind,
        redis_url,
        namespace=namespace,
        connect_timeout=timedelta(milliseconds=1500),
        socket_timeout=timedelta(seconds=3),
    )
    try:
        options = guard.client.connection_pool.connection_kwargs
        assert (options["socket_connect_timeout"], options["socket_timeout"]) == (1.5, 3.0)
        assert await Guard(kind, guard).get_or_load("k", Loads(), ttl=timedelta(seconds=30)) == "v"
    finally:
        await Guard(kind, guard).close()


@pytest.mark.slow
async def test_a_write_waits_a_timedelta_timeout_as_its_seconds(make: Make) -> None:
    holder, writer = make(), make()  # two guards: two processes' worth of owners
    async with holder.write("k"):
        with pytest.raises(LockTimeout):
            async with writer.write("k", timeout=timedelta(milliseconds=300)):
                pass
    async with writer.write("k", timeout=timedelta(seconds=5)):
        pass


class RecordingStore:
    """A ``write_locks=`` store whose locks record the timeouts they are given."""

    def __init__(self) -> None:
        self.awaited = False  # an asyncio guard's store: its calls are awaited
        self.timeouts: list[object] = []

    def __call__(self, name: str) -> Any:
        store = self

        class Handle:
            lost = False

            def release(self) -> Any:
                return asyncio.sleep(0) if store.awaited else None

        class Lock:
            def __init__(self) -> None:
                self.name = name

            def acquire_write(self, timeout: object = None) -> Any:
                store.timeouts.append(timeout)
                if not store.awaited:
                    return Handle()

                async def granted() -> Handle:
                    return Handle()

                return granted()

        return Lock()


async def test_a_write_gives_its_lock_store_seconds(make: Make) -> None:
    """A write's ``timeout`` reaches the ``write_locks`` store as seconds, a float,
    whatever form it was given in: a store of your own needs to know one form."""
    store = RecordingStore()
    guard = make(write_locks=store)
    store.awaited = guard.kind == "async"
    async with guard.write("a", "b", timeout=timedelta(milliseconds=1500)):
        pass
    async with guard.write("a", timeout=2):
        pass
    assert store.timeouts == [1.5, 1.5, 2.0]
    assert all(type(timeout) is float for timeout in store.timeouts)


@pytest.mark.parametrize(("bad", "words"), BAD)
async def test_a_bad_timedelta_gets_the_error_its_number_gets(
    make: Make, bad: timedelta, words: str
) -> None:
    guard = make()
    loads = Loads()
    await guard.get_or_load("warm", loads, ttl=60)  # a hit takes the hit path
    for name in ("cold", "warm"):
        for number in (bad, bad.total_seconds()):
            with pytest.raises(ValueError, match=f"^ttl {words}"):
                await guard.get_or_load(name, loads, ttl=number)
        # A timedelta's error shows its seconds, the unit of the bounds.
        with pytest.raises(ValueError, match=re.escape(f"({bad.total_seconds():.15g} s)")):
            await guard.get_or_load(name, loads, ttl=bad)
        with pytest.raises(ValueError, match=f"^none_ttl {words}"):
            await guard.get_or_load(name, loads, ttl=60, none_ttl=bad)
    with pytest.raises(ValueError, match=f"^ttl {words}"):
        await guard.refresh("cold", loads, ttl=bad)
    with pytest.raises(ValueError, match=f"^timeout {words}"):
        async with guard.write("cold", timeout=bad):
            pass
    loader = CacheLoader if guard.kind == "sync" else AsyncCacheLoader
    with pytest.raises(ValueError, match=f"^ttl {words}"):
        loader(guard.guard, key="l:{n}", load=lambda n: n, ttl=bad)
    for setting in ("lease", "wait_timeout", "gutter_ttl"):
        with pytest.raises(ValueError, match=f"^{setting} {words}"):
            make(**{setting: bad})
    assert loads.calls == 1  # nothing loaded
    assert await guard.peek("cold") is MISSING  # nor stored
    assert len(guard.guard._state.flights) == 0  # a refused read leads no flight


async def test_a_negative_timedelta_is_refused_where_zero_is_allowed(make: Make) -> None:
    for setting in ("stale_ttl", "outage_ttl", "stale_if_error"):
        with pytest.raises(ValueError, match=rf"^{setting} must be a number >= 0.*\(-0.5 s\)"):
            make(**{setting: timedelta(milliseconds=-500)})


def test_a_duration_of_another_type_names_both_forms(client: redis.Redis, namespace: str) -> None:
    guard = CacheGuard(client, namespace=namespace)
    with pytest.raises(TypeError, match="number of seconds or a timedelta, not str"):
        guard.get_or_load("k", Loads(), ttl="60")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="number of seconds or a timedelta, not bool"):
        CacheGuard(client, namespace=namespace, lease=True)


# -- the locks -------------------------------------------------------------------------------


def test_sync_locks_take_timedelta_leases_and_timeouts(client: redis.Redis, namespace: str) -> None:
    lock = RedisRWLock(client, "k", namespace=namespace, lease=timedelta(seconds=20), timeout=LONG)
    assert (lock.lease, lock.timeout) == (20.0, LONG_SECONDS)
    with lock.write(timeout=timedelta(seconds=5)):
        assert 19_000 < int(client.pttl(lock.keys.lock)) <= 20_000  # Redis keeps the lease
    factory = LockFactory(client, namespace=namespace, lease=timedelta(seconds=20), timeout=LONG)
    assert (factory.lease, factory.timeout) == (20.0, LONG_SECONDS)
    assert factory.rwlock("k").remote.lease == 20.0
    redlock = RedlockRWLock(
        [client],
        "r",
        namespace=namespace,
        lease=timedelta(seconds=20),
        timeout=timedelta(seconds=5),
        instance_timeout=timedelta(milliseconds=200),
    )
    assert (redlock.lease, redlock.timeout) == (20.0, 5.0)
    with pytest.raises(ValueError, match=r"^lease must be a finite number > 0"):
        RedisRWLock(client, "k", namespace=namespace, lease=timedelta(0))


def test_the_local_lock_waits_a_timedelta_timeout_as_its_seconds() -> None:
    lock = LocalRWLock("k")
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock.write(timeout=timedelta(seconds=5)):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(LockTimeout):
            lock.acquire_read(timeout=timedelta(milliseconds=100))
        with pytest.raises(ValueError, match=r"^timeout must be a number >= 0.*\(-1 s\)"):
            lock.acquire_read(timeout=timedelta(seconds=-1))
    finally:
        done.set()
        holder.join(30)
    lock.release_read(holder=lock.acquire_read(timeout=timedelta(0)))  # free: no wait at all


async def test_asyncio_locks_take_timedelta_leases_and_timeouts(
    aclient: redis.asyncio.Redis, client: redis.Redis, namespace: str
) -> None:
    lock = AsyncRedisRWLock(
        aclient, "k", namespace=namespace, lease=timedelta(seconds=20), timeout=LONG
    )
    assert (lock.lease, lock.timeout) == (20.0, LONG_SECONDS)
    async with lock.write(timeout=timedelta(seconds=5)):
        assert 19_000 < int(client.pttl(lock.keys.lock)) <= 20_000
    factory = AsyncLockFactory(
        aclient, namespace=namespace, lease=timedelta(seconds=20), timeout=LONG
    )
    assert (factory.lease, factory.timeout) == (20.0, LONG_SECONDS)
    redlock = AsyncRedlockRWLock(
        [aclient], "r", namespace=namespace, lease=timedelta(seconds=20), timeout=LONG
    )
    assert (redlock.lease, redlock.timeout) == (20.0, LONG_SECONDS)

    local = AsyncLocalRWLock("k")
    await local.acquire_write(timeout=timedelta(seconds=5))
    with pytest.raises(LockTimeout):
        await asyncio.create_task(local.acquire_read(timeout=timedelta(milliseconds=100)))
    with pytest.raises(ValueError, match=r"^timeout must be a number >= 0.*\(-1 s\)"):
        await asyncio.create_task(local.acquire_read(timeout=timedelta(seconds=-1)))
    local.release_write()


# -- the dogpile backend -----------------------------------------------------------------------


def test_the_dogpile_backend_takes_timedelta_arguments(
    redis_url: str, client: redis.Redis, namespace: str
) -> None:
    region = make_region().configure(
        "cacheguard",
        arguments={
            "url": redis_url,
            "namespace": namespace,
            "lease": timedelta(seconds=20),
            "lock_timeout": 20,  # its alias: the same length, another form
            "redis_expiration_time": timedelta(minutes=10),
            "lock_blocking_timeout": timedelta(seconds=3),
            "socket_timeout": timedelta(seconds=4),
        },
    )
    backend = region.backend
    try:
        assert backend.guard.settings.lease == 20.0
        assert (backend.redis_expiration_time, backend.wait_timeout) == (600.0, 3.0)
        assert backend.guard.client.connection_pool.connection_kwargs["socket_timeout"] == 4.0
        region.set("k", "v")
        assert 600_000 - 60_000 < int(client.pttl(backend.guard.keys("k").value)) <= 600_000
    finally:
        backend.close()
    # An expiration of zero is "none", as 0 is.
    forever = make_region().configure(
        "cacheguard",
        arguments={"url": redis_url, "namespace": namespace, "redis_expiration_time": timedelta()},
    )
    try:
        assert forever.backend.redis_expiration_time is None
        forever.set("f", "v")
        assert client.pttl(forever.backend.guard.keys("f").value) == -1
    finally:
        forever.backend.close()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lease": timedelta(seconds=-1)}, "lease must be a finite number > 0"),
        ({"lease": 5, "lock_timeout": timedelta(seconds=6)}, "disagree"),
        ({"wait_timeout": timedelta(0)}, "wait_timeout must be a finite number > 0"),
        ({"redis_expiration_time": timedelta(days=-1)}, "redis_expiration_time must be"),
    ],
)
def test_the_dogpile_backend_refuses_bad_timedeltas(
    redis_url: str, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(BackendArgumentError, match=message):
        make_region().configure("cacheguard", arguments={"url": redis_url, **arguments})


# -- the decorator ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-3)])
def test_cached_with_lock_refuses_a_bad_timedelta_at_decoration(
    client: redis.Redis, namespace: str, bad: timedelta
) -> None:
    guard = CacheGuard(client, namespace=namespace)
    with pytest.raises(ValueError, match=r"^ttl must be a finite number > 0"):
        cached_with_lock(guard, key="k", ttl=bad)(lambda: 1)
