"""Clean shutdown and pickling (issue #23): a guard closes what it made and only
that, refuses calls once closed, works as a context manager; decorated functions
and loaders pickle by reference, so process pools can run them.

Connections are counted with CLIENT LIST, by a client name each test gives its
guard's client (``?client_name=`` in the URL: every connection the client, its
pool and its release-notification listener open carries it).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import random
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import CacheGuard, CacheLoader, GuardClosed, cached_with_lock
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader, async_notifier_for
from cacheguard.redis.clients import aclose_async_client, close_sync_client
from tests import pickled_loaders
from tests.helpers import wait_until

KINDS = ("sync", "async")


def connections(client: redis.Redis, name: str) -> int:
    return sum(1 for c in client.client_list() if c.get("name") == name)


@pytest.fixture
def client_name() -> str:
    return f"cg-shutdown-{uuid.uuid4().hex[:10]}"


def named(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}client_name={name}"


async def close(guard: CacheGuard | AsyncCacheGuard) -> None:
    if isinstance(guard, AsyncCacheGuard):
        await guard.aclose()
    else:
        guard.close()


async def busy(guard: CacheGuard | AsyncCacheGuard, tag: str) -> None:
    """Use the guard the ways that open connections: many reads at once (a pool of
    them), a fill that waits for another's (the release-notification listener), a
    write."""
    names = [f"{tag}:{i}" for i in range(30)]
    if isinstance(guard, AsyncCacheGuard):

        async def slow() -> int:
            await asyncio.sleep(0.05)
            return 1

        await asyncio.gather(*(guard.get_or_load(n, slow, ttl=60) for n in names * 2))
        async with guard.write(names[0]):
            pass
        await guard.invalidate(*names)
    else:
        await asyncio.gather(
            *(asyncio.to_thread(guard.get_or_load, n, lambda: 1, ttl=60) for n in names * 2)
        )
        with guard.write(names[0]):
            pass
        guard.invalidate(*names)


async def resolve(result: Any) -> Any:
    """``result``, awaited if the asyncio guard gave a coroutine."""
    return await result if asyncio.iscoroutine(result) else result


async def enter_write(guard: CacheGuard | AsyncCacheGuard, *names: str) -> None:
    if isinstance(guard, AsyncCacheGuard):
        async with guard.write(*names):
            pass
    else:
        with guard.write(*names):
            pass


def from_url(kind: str, url: str, namespace: str, **settings: Any) -> Any:
    cls = CacheGuard if kind == "sync" else AsyncCacheGuard
    return cls.from_url(url, namespace=namespace, **settings)


# -- closing -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("l1", [0, 100], ids=["no-l1", "l1"])
async def test_close_closes_every_connection_from_url_made(
    kind: str, l1: int, redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    guard = from_url(kind, named(redis_url, client_name), namespace, l1_maxsize=l1)
    await busy(guard, "k")
    assert connections(client, client_name) > 0
    await close(guard)
    assert wait_until(lambda: connections(client, client_name) == 0), client.client_list()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_closed_guard_refuses_calls_and_opens_nothing(
    kind: str, redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    guard = from_url(kind, named(redis_url, client_name), namespace)
    await busy(guard, "k")
    await close(guard)
    await close(guard)  # idempotent
    calls: list[Callable[[], Any]] = [
        lambda: guard.get_or_load("k:1", lambda: 2, ttl=60),
        lambda: guard.refresh("k:1", lambda: 2, ttl=60),
        lambda: guard.peek("k:1"),
        lambda: guard.peek_entry("k:1"),
        lambda: guard.invalidate("k:1"),
        lambda: guard.invalidate_prefix("k:"),
        guard.watermark,
        lambda: guard.rwlock("k:1"),
        lambda: guard.write_lock("k:1"),
    ]
    for call in calls:
        with pytest.raises(GuardClosed, match="closed"):
            await resolve(call())
    with pytest.raises(GuardClosed):
        await enter_write(guard, "k:1")
    assert connections(client, client_name) == 0
    assert client.exists(guard.keys("k:1").value) == 0  # invalidated before close, not refilled


@pytest.mark.parametrize("kind", KINDS)
async def test_close_leaves_a_client_passed_in_open(
    kind: str, redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    url = named(redis_url, client_name)
    if kind == "sync":
        own = redis.Redis.from_url(url)
        guard: Any = CacheGuard(own, namespace=namespace)
    else:
        aown = redis.asyncio.Redis.from_url(url)
        guard = AsyncCacheGuard(aown, namespace=namespace)
    await busy(guard, "k")
    before = connections(client, client_name)
    await close(guard)
    if kind == "sync":
        assert own.ping()
        assert connections(client, client_name) == before
        own.close()
    else:
        assert await aown.ping()
        assert connections(client, client_name) >= 1
        await aown.aclose(close_connection_pool=True)
    with pytest.raises(GuardClosed):  # closed is closed, whoever owns the client
        await resolve(guard.peek("k:1"))


def test_sync_guard_is_a_context_manager(
    redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    with CacheGuard.from_url(named(redis_url, client_name), namespace=namespace) as guard:
        assert guard.get_or_load("k", lambda: 5, ttl=60) == 5
        assert connections(client, client_name) > 0
    assert wait_until(lambda: connections(client, client_name) == 0)
    with pytest.raises(GuardClosed):
        guard.peek("k")


async def test_asyncio_guard_is_an_async_context_manager(
    redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    url = named(redis_url, client_name)
    async with AsyncCacheGuard.from_url(url, namespace=namespace) as guard:
        assert await guard.get_or_load("k", lambda: 5, ttl=60) == 5
        assert connections(client, client_name) > 0
    assert wait_until(lambda: connections(client, client_name) == 0)
    with pytest.raises(GuardClosed):
        await guard.peek("k")


def pooled(client: Any) -> list[bool]:
    """Whether each connection in ``client``'s pool is connected: the client's own
    view, which shows a pool someone closed at once (the server notices later)."""
    pool = client.connection_pool
    return [c.is_connected for c in (*pool._available_connections, *pool._in_use_connections)]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_with_block_leaves_a_client_passed_in_open(
    kind: str, redis_url: str, client: redis.Redis, namespace: str, client_name: str
) -> None:
    """Leaving a guard's ``with`` block closes the guard, not a client it was given:
    the client's pooled connections are still the connected ones it had."""
    url = named(redis_url, client_name)
    guard: Any
    if kind == "sync":
        own = redis.Redis.from_url(url)
        with CacheGuard(own, namespace=namespace) as guard:
            await busy(guard, "k")
        open_ones = pooled(own)
    else:
        aown = redis.asyncio.Redis.from_url(url)
        async with AsyncCacheGuard(aown, namespace=namespace) as guard:
            await busy(guard, "k")
        open_ones = pooled(aown)
    assert open_ones, "the guard used the client's pool"
    assert all(open_ones), open_ones
    assert connections(client, client_name) >= len(open_ones)
    with pytest.raises(GuardClosed):  # the block closed the guard
        await resolve(guard.peek("k:1"))
    if kind == "sync":
        assert own.ping()
        own.close()
    else:
        assert await aown.ping()
        await async_notifier_for(aown).aclose()
        await aown.aclose(close_connection_pool=True)


def test_from_url_refusing_a_setting_leaves_no_connection(
    redis_url: str, client: redis.Redis, client_name: str
) -> None:
    with pytest.raises(ValueError, match="lease"):
        CacheGuard.from_url(named(redis_url, client_name), lease=-1)
    assert connections(client, client_name) == 0


class _Closable:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def close(self) -> None:
        self.log.append(self.name)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        self.log.append(f"{self.name}:{close_connection_pool}")


def test_closing_a_sentinel_master_client_closes_its_sentinels() -> None:
    """A Sentinel URL's client is a master client whose pool knows the sentinels'
    clients, which from_url made too: closing closes them (no Sentinel needed to
    see it: none of these connect)."""
    import redis.sentinel

    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1), ("127.0.0.1", 2)])  # type: ignore[no-untyped-call]
    master = sentinel.master_for("svc")  # type: ignore[no-untyped-call]
    closed: list[str] = []
    for i, s in enumerate(sentinel.sentinels):
        s.close = _Closable(closed, f"sentinel{i}").close  # type: ignore[method-assign]
    close_sync_client(master)
    assert closed == ["sentinel0", "sentinel1"]


async def test_closing_an_asyncio_sentinel_master_client_closes_its_sentinels() -> None:
    import redis.asyncio.sentinel

    sentinel = redis.asyncio.sentinel.Sentinel([("127.0.0.1", 1)])  # type: ignore[no-untyped-call]
    master = sentinel.master_for("svc")
    closed: list[str] = []
    sentinel.sentinels[0].aclose = _Closable(closed, "sentinel").aclose  # type: ignore[method-assign]
    await aclose_async_client(master)
    assert closed == ["sentinel:None"]


# -- pickling by reference -----------------------------------------------------------------


@pytest.fixture
def clean_pickle_namespace(client: redis.Redis) -> Iterator[None]:
    yield
    keys = list(client.scan_iter(match=f"{pickled_loaders.NAMESPACE}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.mark.parametrize(
    "obj",
    [
        pickled_loaders.square,
        pickled_loaders.cubes,
        pickled_loaders.asquare,
        pickled_loaders.acubes,
        pickled_loaders.Repo.get,
        pickled_loaders.Repo.static,
    ],
    ids=["decorated", "loader", "async-decorated", "async-loader", "method", "staticmethod"],
)
def test_loaders_pickle_by_reference(obj: Any) -> None:
    data = pickle.dumps(obj)
    assert len(data) < 200  # a name, not a guard
    assert pickle.loads(data) is obj


def test_a_bound_cached_method_pickles_as_its_instance_attribute(
    clean_pickle_namespace: None,
) -> None:
    bound = pickled_loaders.Repo(3).get
    again = pickle.loads(pickle.dumps(bound))
    assert again(n=random.randrange(10**9)) % 3 == 0


def test_a_loader_without_a_module_level_name_refuses_to_pickle_clearly(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="local:{n}", ttl=60)
        def local(n: int) -> int:
            return n

        with pytest.raises(pickle.PicklingError, match="by reference"):
            pickle.dumps(local)
        loader = CacheLoader(guard, key="l:{n}", load=pickled_loaders.load_cube, ttl=60)
        with pytest.raises(pickle.PicklingError, match="module-level name"):
            pickle.dumps(loader)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.slow
def test_process_pool_map_runs_decorated_functions_and_loaders(
    method: str, clean_pickle_namespace: None
) -> None:
    base = random.randrange(10**5)  # a cube msgpack can still encode
    numbers = [base + i for i in range(4)]
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        squares = list(pool.map(pickled_loaders.square, numbers))
        cubes = list(pool.map(pickled_loaders.cubes.get, numbers))
        asquare = pool.submit(pickled_loaders.run_async, pickled_loaders.asquare, base).result()
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        acube = pool.submit(pickled_loaders.run_async, pickled_loaders.acubes.get, base).result()
    assert [s["square"] for s in squares] == [n * n for n in numbers]
    assert [c["cube"] for c in cubes] == [n**3 for n in numbers]
    assert asquare["square"] == base * base
    assert acube["cube"] == base**3
    # The workers filled the cache through their own guards, on the same keys.
    assert pickled_loaders.square.peek(numbers[0]) == squares[0]
    assert pickled_loaders.cubes.peek(numbers[-1]) == cubes[-1]


# -- a sync guard refuses async functions ---------------------------------------------------


async def _coroutine_function(n: int) -> int:
    return n


async def _async_generator(n: int) -> Any:
    yield n


class _AsyncCallable:
    async def __call__(self, n: int) -> int:
        return n


def test_a_sync_guard_refuses_an_async_def_at_decoration(redis_url: str, namespace: str) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:
        with pytest.raises(TypeError, match="AsyncCacheGuard"):
            cached_with_lock(guard, key="a:{n}", ttl=60)(_coroutine_function)
        with pytest.raises(TypeError, match="AsyncCacheGuard"):
            cached_with_lock(guard, key="a:{n}", ttl=60)(staticmethod(_coroutine_function))
        for load in (_coroutine_function, _async_generator, _AsyncCallable()):
            with pytest.raises(TypeError, match="async function"):
                CacheLoader(guard, key="a:{n}", load=load, ttl=60)


async def test_an_asyncio_guard_takes_a_plain_function_and_awaits_it(
    redis_url: str, namespace: str
) -> None:
    """The asyncio loaders take plain functions on purpose (they run on the loop):
    decorated, such a function's calls are awaited, and work."""
    async with AsyncCacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="p:{n}", ttl=60)
        def plain(n: int) -> int:
            return n + 1

        assert await plain(1) == 2  # type: ignore[misc]
        assert await AsyncCacheLoader(guard, key="q:{n}", load=plain.load, ttl=60).get(2) == 3


def test_a_notifier_closed_while_it_connects_drops_the_new_connection() -> None:
    """close() racing the listener's reconnect: the connection made meanwhile is
    disconnected, not kept open by a listener that will never read it."""
    from cacheguard.redis.notifier import Notifier

    events: list[str] = []

    class Connection:
        def connect(self) -> None:
            notifier.close()  # the guard closes while the listener connects
            events.append("connect")

        def disconnect(self) -> None:
            events.append("disconnect")

    notifier = Notifier(Connection)  # type: ignore[arg-type]
    assert notifier._reconnect() is False
    assert events == ["connect", "disconnect"]
    assert notifier._conn is None
