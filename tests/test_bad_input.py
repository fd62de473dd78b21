"""Bad key names (issue #23): every entry point of both guards refuses None, bytes,
other non-str, empty names and names with no UTF-8 form (lone surrogates) with a
plain ``TypeError``/``ValueError``, before Redis is touched; ``max_key_length``
shortens the names of every entry point alike; the dogpile backend checks its
database index at ``configure``.

"Before Redis is touched" is shown with a guard on a port where nothing listens
and ``on_backend_error="raise"``: a call that reached Redis would raise
:class:`BackendUnavailable` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from dogpile.cache import make_region

from cacheguard import MISSING, CacheGuard, CacheLoader
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader
from cacheguard.integrations.dogpile import BackendArgumentError
from cacheguard.redis.keys import shorten

KINDS = ("sync", "async")
NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: any call reaching Redis fails

BAD_NAMES = [
    pytest.param(None, TypeError, id="None"),
    pytest.param(b"menu:1", TypeError, id="bytes"),
    pytest.param(7, TypeError, id="int"),
    pytest.param(("menu", 1), TypeError, id="tuple"),
    pytest.param("", ValueError, id="empty"),
    pytest.param("menu:\ud800", ValueError, id="lone-surrogate"),
]

ENTRY_POINTS = [
    "get_or_load",
    "refresh",
    "peek",
    "peek_entry",
    "invalidate",
    "invalidate-second",
    "write",
    "write-second",
    "rwlock",
    "write_lock",
]


def make_guard(kind: str, url: str, namespace: str, **settings: Any) -> Any:
    settings.setdefault("on_backend_error", "raise")
    if kind == "sync":
        return CacheGuard(
            redis.Redis.from_url(url, socket_connect_timeout=1), namespace=namespace, **settings
        )
    client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=1)
    return AsyncCacheGuard(client, namespace=namespace, **settings)


async def resolve(result: Any) -> Any:
    """``result``, awaited if the asyncio guard gave a coroutine."""
    return await result if asyncio.iscoroutine(result) else result


async def call(guard: Any, entry: str, name: Any, load: Callable[[], Any]) -> Any:
    """Call ``entry`` of ``guard`` with ``name`` (awaiting what the asyncio guard returns)."""
    if entry in ("write", "write-second"):
        names = ("ok", name) if entry == "write-second" else (name,)
        if isinstance(guard, AsyncCacheGuard):
            async with guard.write(*names):
                return None
        with guard.write(*names):
            return None
    if entry == "get_or_load":
        result = guard.get_or_load(name, load, ttl=60)
    elif entry == "refresh":
        result = guard.refresh(name, load, ttl=60)
    elif entry == "invalidate-second":
        result = guard.invalidate("ok", name)
    else:
        result = getattr(guard, entry)(name)
    return await resolve(result)


async def close_with_client(guard: Any) -> None:
    """Close a test guard and the client it was given (a guard leaves that open)."""
    if isinstance(guard, AsyncCacheGuard):
        await guard.aclose()
        await guard.client.aclose()
    else:
        guard.close()
        guard.client.close()


@pytest.fixture(params=KINDS)
async def nowhere_guard(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Any]:
    guard = make_guard(request.param, NOWHERE, namespace)
    yield guard
    await close_with_client(guard)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("name", "error"), BAD_NAMES)
async def test_bad_names_are_refused_before_redis(
    nowhere_guard: Any, entry: str, name: Any, error: type[Exception]
) -> None:
    loads: list[int] = []
    with pytest.raises(error, match="key name"):
        await call(nowhere_guard, entry, name, lambda: loads.append(1))
    assert loads == []
    assert nowhere_guard.stats().backend_errors == 0


@pytest.mark.parametrize(
    ("prefix", "error"),
    [
        pytest.param(None, TypeError, id="None"),
        pytest.param(b"menu:", TypeError, id="bytes"),
        pytest.param("menu:\udfff", ValueError, id="lone-surrogate"),
    ],
)
async def test_bad_prefixes_are_refused_before_redis(
    nowhere_guard: Any, prefix: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="prefix"):
        await resolve(nowhere_guard.invalidate_prefix(prefix))
    assert nowhere_guard.stats().backend_errors == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_good_names_do_reach_redis(kind: str, namespace: str) -> None:
    """The counter-check: the same calls with a good name do reach (the absent) Redis."""
    guard = make_guard(kind, NOWHERE, namespace)
    with pytest.raises(Exception, match=r"nreachable|unavailable") as raised:
        await call(guard, "peek", "menu:1", lambda: 1)
    assert "key name" not in str(raised.value)
    if isinstance(guard, AsyncCacheGuard):
        await guard.client.aclose()
    else:
        guard.client.close()


# -- max_key_length, at every entry point ----------------------------------------------------


@pytest.fixture(params=KINDS)
async def real_guard(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Any]:
    guard = make_guard(request.param, redis_url, namespace, max_key_length=80)
    yield guard
    await close_with_client(guard)


async def test_max_key_length_shortens_every_entry_point_alike(
    real_guard: Any, client: redis.Redis, namespace: str
) -> None:
    long_name = "menu:" + "x" * 200
    short = shorten(long_name, 80)
    assert await call(real_guard, "get_or_load", long_name, lambda: {"v": 1}) == {"v": 1}
    assert await call(real_guard, "get_or_load", long_name, lambda: {"v": 9}) == {"v": 1}
    assert (real_guard.stats().misses, real_guard.stats().l2_hits) == (1, 1)  # read where stored
    stored = list(client.scan_iter(match=f"{namespace}:*:v"))
    assert stored == [real_guard.keys(short).value.encode()]
    assert len(short) <= 80
    assert await call(real_guard, "peek", long_name, lambda: None) == {"v": 1}
    assert (await call(real_guard, "peek_entry", long_name, lambda: None)).value == {"v": 1}
    assert await call(real_guard, "refresh", long_name, lambda: {"v": 2}) == {"v": 2}
    assert real_guard.rwlock(long_name) is real_guard.rwlock(short)
    # A loader whose template renders the same long name meets the same entry.
    loader_cls = AsyncCacheLoader if isinstance(real_guard, AsyncCacheGuard) else CacheLoader
    loader = loader_cls(real_guard, key="menu:{rest}", load=lambda rest: {"v": 3}, ttl=60)
    assert loader.key(rest="x" * 200) == short
    await call(real_guard, "write", long_name, lambda: None)
    await call(real_guard, "invalidate", long_name, lambda: None)
    assert client.exists(real_guard.keys(short).value) == 0
    assert list(client.scan_iter(match=f"{namespace}:*:v")) == []


# -- the dogpile backend's database ------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"db": 99}, id="db"),
        pytest.param({"url": "redis://127.0.0.1:6379/99"}, id="url"),
    ],
)
def test_dogpile_backend_refuses_a_database_the_server_lacks_at_configure(
    arguments: dict[str, Any], redis_url: str
) -> None:
    host, _, port = redis_url.split("//")[1].split("/", maxsplit=1)[0].partition(":")
    if "db" in arguments:
        arguments = {**arguments, "host": host, "port": int(port or 6379)}
    else:
        arguments = {"url": f"redis://{host}:{port or 6379}/99"}
    with pytest.raises(BackendArgumentError, match="database 99"):
        make_region().configure("cacheguard", arguments=arguments)


def test_dogpile_backend_takes_a_database_the_server_has(redis_url: str) -> None:
    host, _, port = redis_url.split("//")[1].split("/", maxsplit=1)[0].partition(":")
    region = make_region().configure(
        "cacheguard", arguments={"host": host, "port": int(port or 6379), "db": 1}
    )
    with contextlib.closing(region.backend):
        region.set("k", "v")
        assert region.get("k") == "v"
        region.delete("k")


def test_dogpile_backend_configures_with_redis_down() -> None:
    """Redis down is the calls' business: the index is not checked then."""
    region = make_region().configure(
        "cacheguard", arguments={"host": "127.0.0.1", "port": 1, "db": 3}
    )
    region.backend.close()


@pytest.mark.parametrize("call", ["get_or_load", "refresh"])
def test_a_sync_guard_refuses_an_async_loader_and_caches_nothing(
    client: redis.Redis, namespace: str, call: str
) -> None:
    """``get_or_load(name, async_def)`` on a sync guard (no decorator to refuse it at
    decoration): a clear TypeError at the load, no coroutine left unawaited, nothing
    stored, no hold left (the next plain load goes straight through)."""
    guard = CacheGuard(client, namespace=namespace, ttl_jitter=0)

    async def load() -> int:
        return 1

    with pytest.raises(TypeError, match="AsyncCacheGuard"):
        getattr(guard, call)("menu:1", load, ttl=60)
    assert guard.peek("menu:1") is MISSING  # nothing stored
    assert guard.get_or_load("menu:1", lambda: 2, ttl=60) == 2
    assert guard.stats().load_errors == 1
