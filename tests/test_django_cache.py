"""The Django cache backend (cacheguard/integrations/django/cache.py) on the real Redis.

Django's own ``BaseCacheTests`` run in tests/test_django_cache_suite.py; here what
the backend adds or must keep: one entry format with the guard, ``get_or_set``'s one
load across processes (waiters woken by the announcement), writes that win over a
fill under way and close the process's loads begun before them to later callers,
``clear()`` bounded by its namespace and ``KEY_PREFIX`` and leaving nothing behind,
signed pickles only (no unsigned entry, nothing inflated before its signature is
checked; bytes that do not decode are absent for every operation), an atomic
``incr`` across processes whose callers in a process take turns, the asyncio
methods on the asyncio guard (no thread) with the sync ones' semantics, the
configurations' guards shared while used and closed when not, Cluster and Sentinel
URLs, and clear errors for bad input.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import math
import pickle
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cacheguard_testing.deployments import OwnedRedisCluster, OwnedSentinelSet

from cacheguard import BackendUnavailable, CacheGuardError, RecursiveLoadError
from cacheguard.cache import entry as entry_module
from cacheguard.cache.codec import JsonCodec, MsgpackCodec, PickleCodec
from cacheguard.cache.entry import HEADER_SIZE, pack_entry, unpack_entry
from cacheguard.cache.entry_writes import ENTRY_SWAP, FOREVER
from cacheguard.redis.keys import ResourceKeys
from tests import django_workers
from tests.helpers import flight_entries, run_threads, subscribers, wait_until
from tests.procs import results_of, run_processes, start_processes

pytest_plugins = ["tests.deployment_fixtures"]

django_workers.configure_django()

from django.conf import settings as django_settings  # noqa: E402
from django.core.cache.backends.base import CacheKeyWarning  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import override_settings  # noqa: E402

from cacheguard.integrations.django import CacheGuardCache  # noqa: E402
from cacheguard.integrations.django import cache as django_cache  # noqa: E402
from cacheguard.integrations.django.cache import (  # noqa: E402
    CacheBackendConfigError,
    PoolExhausted,
    UnpicklableValue,
)

Make = Callable[..., CacheGuardCache]


@pytest.fixture
def make(redis_url: str, namespace: str) -> Iterator[Make]:
    """Backends on the test's namespace (or another given), shut down afterwards."""
    made: list[CacheGuardCache] = []

    def build(location: Any = None, **params: Any) -> CacheGuardCache:
        options = params.pop("OPTIONS", {})
        options.setdefault("namespace", namespace)
        cache = CacheGuardCache(
            redis_url if location is None else location, {**params, "OPTIONS": options}
        )
        made.append(cache)
        return cache

    yield build
    for cache in made:
        cache.shutdown()


@pytest.fixture
def cache(make: Make) -> CacheGuardCache:
    return make()


class Gate:
    """A loader that says when it started and waits for the test to let it finish."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self._mutex = threading.Lock()

    def __call__(self) -> Any:
        with self._mutex:
            self.calls += 1
        self.started.set()
        assert self.release.wait(60), "the test never released the load"
        return self.value


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# -- one entry format with the guard --------------------------------------------------------------


def test_a_set_value_is_a_hit_for_get_or_set_and_for_the_guard(cache: CacheGuardCache) -> None:
    cache.set("menu", {"id": 7}, 60)
    assert cache.get_or_set("menu", lambda: pytest.fail("loaded despite the set value")) == {
        "id": 7
    }
    name = cache.guard_name("menu")
    assert cache.guard.get_or_load(name, lambda: pytest.fail("guard loaded"), ttl=60) == {"id": 7}
    entry = cache.guard.peek_entry(name)
    assert entry is not None
    assert entry.ttl == 60


def test_a_filled_value_is_read_by_get_and_expires_with_its_timeout(
    cache: CacheGuardCache, client: redis.Redis
) -> None:
    assert cache.get_or_set("menu", lambda: ["soup"], 30) == ["soup"]
    assert cache.get("menu") == ["soup"]
    assert cache.get_many(["menu", "other"]) == {"menu": ["soup"]}
    ttl_ms = client.pttl(cache.guard.keys(cache.guard_name("menu")).value)
    assert 25_000 < ttl_ms <= 30_000  # no jitter: Django's timeout is exact


def test_get_or_set_caches_a_none_and_calls_once(cache: CacheGuardCache) -> None:
    calls: list[int] = []
    assert cache.get_or_set("nothing", lambda: calls.append(1)) is None
    assert cache.get_or_set("nothing", lambda: calls.append(1)) is None
    assert cache.get("nothing", "default") is None
    assert calls == [1]


def test_timeouts_follow_django(cache: CacheGuardCache, client: redis.Redis) -> None:
    value_key = cache.guard.keys(cache.guard_name("k")).value
    cache.set("k", 1, None)
    assert client.pttl(value_key) == -1  # forever: no expiry
    entry = cache.guard.peek_entry(cache.guard_name("k"))
    assert entry is not None
    assert entry.ttl == FOREVER
    cache.set("k", 2, 0)  # 0: not stored, and the old value goes
    assert cache.get("k") is None
    cache.set("k", 3)
    cache.set("k", 4, -5)  # negative: deleted
    assert not cache.has_key("k")
    assert cache.get_or_set("k", lambda: "x", 0) == "x"  # 0: returned, not stored
    assert cache.get("k") is None
    cache.set("k", 5, 100.9)  # fractions kept (to the ms), not rounded down
    entry = cache.guard.peek_entry(cache.guard_name("k"))
    assert entry is not None
    assert entry.ttl == 100.9
    assert 90_000 < client.pttl(value_key) <= 100_900
    assert cache.get_backend_timeout() == 300
    assert cache.get_backend_timeout(None) is None
    assert cache.get_backend_timeout(-1) == 0
    assert cache.get_backend_timeout(FOREVER * 2) is None


def test_touch_restarts_the_entrys_life_for_the_guard_too(
    cache: CacheGuardCache, client: redis.Redis
) -> None:
    cache.set("k", "v", 60)
    assert cache.touch("k", 600)
    name = cache.guard_name("k")
    assert client.pttl(cache.guard.keys(name).value) > 500_000
    entry = cache.guard.peek_entry(name)
    assert entry is not None
    assert entry.ttl == 600
    assert cache.touch("k", None)
    assert client.pttl(cache.guard.keys(name).value) == -1
    assert not cache.touch("missing")
    assert cache.touch("k", 0)
    assert cache.get("k") is None


def test_versions_prefixes_and_key_functions_name_the_guards_keys(make: Make) -> None:
    plain = make()
    prefixed = make(KEY_PREFIX="shop", VERSION=3)
    plain.set("k", "plain")
    prefixed.set("k", "prefixed")
    assert plain.guard_name("k") == ":1:k"
    assert prefixed.guard_name("k") == "shop:3:k"
    assert prefixed.guard_name("k", version=4) == "shop:4:k"
    assert (plain.get("k"), prefixed.get("k")) == ("plain", "prefixed")
    assert plain.incr_version("k") == 2
    assert plain.get("k", version=2) == "plain"
    assert plain.get("k") is None
    custom = make(KEY_FUNCTION=lambda key, prefix, version: f"custom/{key}")
    assert custom.guard_name("k") == "custom/k"


def test_guard_name_is_what_the_guard_invalidates(cache: CacheGuardCache) -> None:
    long_key = "k" * 400
    with pytest.warns(CacheKeyWarning, match="longer than 250"):
        cache.set(long_key, "v")
    with pytest.warns(CacheKeyWarning, match="longer than 250"):
        name = cache.guard_name(long_key)
    assert len(name) <= cache.guard.settings.max_key_length
    cache.guard.invalidate(name)
    with pytest.warns(CacheKeyWarning):
        assert cache.get(long_key) is None


# -- get_or_set: one load across processes --------------------------------------------------------


@pytest.mark.slow
def test_a_cold_key_stampede_of_processes_loads_once_woken_by_the_announcement(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    count = 4
    counter, gate, ready = f"{namespace}:calls", f"{namespace}:gate", f"{namespace}:ready"
    key = "menu:7"
    started = start_processes(
        django_workers.stampede,
        [(redis_url, namespace, key, counter, gate, ready)] * count,
    )
    try:
        # Every process is about to call, one is loading; the others wait for its fill
        # (subscribed to the key's announcements), or, were the load not shared, would
        # be loading too: the gate opens once each process is one or the other.
        assert wait_until(lambda: client.llen(ready) == count, timeout=60)
        channel = ResourceKeys(namespace, f":1:{key}").released_channel
        assert wait_until(
            lambda: int(client.get(counter) or 0) + subscribers(client, channel) >= count,
            timeout=60,
        )
    finally:
        client.rpush(gate, *["open"] * count)  # enough for every loader there may be
    # The waiters' retry timers are a minute long: within 45 s only the fill's
    # announcement can have woken them.
    values = results_of(started, timeout=45)
    assert values == [{"menu": 7, "loaded_by": "one"}] * count
    assert int(client.get(counter) or 0) == 1


def test_threads_share_one_load(cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch) -> None:
    followers: list[str] = []
    flights = cache.guard._state.flights
    join = flights.join

    def counted_join(key: str, since: float = math.inf) -> Any:
        joined = join(key, since)
        if not joined[1]:
            followers.append(key)
        return joined

    monkeypatch.setattr(flights, "join", counted_join)
    gate = Gate("loaded")
    threads = [in_thread(lambda: cache.get_or_set("k", gate, 60)) for _ in range(5)]
    # Released once every thread loads or waits for the one load (a follower of its
    # flight): were loads not shared, each would be loading.
    try:
        assert wait_until(lambda: gate.calls + len(followers) >= 5, timeout=30)
    finally:
        gate.release.set()
    for thread, _ in threads:
        thread.join(30)
    assert [out for _, out in threads] == [["loaded"]] * 5
    assert gate.calls == 1


def test_a_non_callable_default_is_added_then_read(cache: CacheGuardCache) -> None:
    cache.set("taken", "first")
    assert cache.add("taken", "second") is False
    assert cache.get_or_set("taken", "second") == "first"
    assert cache.get_or_set("free", "second", 60) == "second"
    assert cache.get("free") == "second"


# -- writes win over a fill under way -------------------------------------------------------------


@pytest.mark.parametrize("write", ["set", "delete", "set_many", "delete_many", "incr"])
def test_a_write_during_a_fill_wins_over_it(cache: CacheGuardCache, write: str) -> None:
    cache.set("counter", 1)
    cache.delete("k")
    gate = Gate("loaded before the write")
    thread, out = in_thread(lambda: cache.get_or_set("k", gate, 60))
    assert gate.started.wait(30)
    expected: Any = None
    if write == "set":
        cache.set("k", "written", 60)
        expected = "written"
    elif write == "set_many":
        cache.set_many({"k": "written", "other": 1}, 60)
        expected = "written"
    elif write == "delete":
        cache.delete("k")
    elif write == "delete_many":
        cache.delete_many(["k", "other"])
    else:  # incr writes another key: its script must not touch this fill
        cache.incr("counter")
        expected = "loaded before the write"
    gate.release.set()
    thread.join(30)
    assert out == ["loaded before the write"]  # the caller gets its own load
    assert cache.get("k") == expected  # but the write's value is what stays


@pytest.mark.slow
def test_a_set_during_another_processs_fill_wins(
    redis_url: str, namespace: str, client: redis.Redis, cache: CacheGuardCache
) -> None:
    counter, gate = f"{namespace}:calls", f"{namespace}:gate"
    started = start_processes(
        django_workers.fill_gated, [(redis_url, namespace, "k", counter, gate)]
    )
    try:
        assert wait_until(lambda: client.get(counter) == b"1", timeout=60)
        cache.set("k", "written", 60)
    finally:
        client.rpush(gate, "open")
    assert results_of(started, timeout=60) == ["from-process"]
    assert cache.get("k") == "written"


# -- writes close the flights of loads begun before them ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("write", ["set", "add", "set_many", "delete", "clear"])
def test_a_get_or_set_after_a_write_does_not_share_a_load_begun_before(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    entered = flight_entries(monkeypatch, cache.guard._state.flights)
    gate = Gate("loaded before the write")
    leader_thread, leader = in_thread(lambda: cache.get_or_set("k", gate, 60))
    assert gate.started.wait(30)
    early_thread, early = in_thread(lambda: cache.get_or_set("k", lambda: "early", 60))
    stays = "written" if write in ("set", "add", "set_many") else "loaded after"
    try:
        assert wait_until(lambda: len(entered) >= 2, timeout=30)  # early joined the load
        if write == "set":
            cache.set("k", "written", 60)
        elif write == "add":
            assert cache.add("k", "written", 60)
        elif write == "set_many":
            cache.set_many({"k": "written"}, 60)
        elif write == "delete":
            cache.delete("k")
        else:
            cache.clear()
        late_thread, late = in_thread(lambda: cache.get_or_set("k", lambda: "loaded after", 60))
        if stays == "written":  # read from Redis at once: no wait for the load under way
            late_thread.join(30)
            assert late == ["written"]
        else:  # a miss: its own fill, once the one under way ended (storing nothing)
            assert wait_until(lambda: len(entered) >= 3, timeout=30)
    finally:
        gate.release.set()
    for thread in (leader_thread, early_thread, late_thread):
        thread.join(30)
    # The calls begun before the write get the load's value (theirs overlap the write).
    assert leader == early == ["loaded before the write"]
    assert late == [stays]
    assert cache.get("k") == stays


async def until(predicate: Callable[[], object], timeout: float = 30) -> None:
    """Let the loop's other tasks run until ``predicate`` holds (or fail at ``timeout``)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "never came true"
        await asyncio.sleep(0.001)


@pytest.mark.slow
@pytest.mark.parametrize("write", ["aset", "set in another thread", "adelete", "aclear"])
async def test_an_aget_or_set_after_a_write_does_not_share_a_load_begun_before(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    entered = flight_entries(monkeypatch, cache.async_guard()._state.flights)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "loaded before the write"

    leader = asyncio.ensure_future(cache.aget_or_set("k", slow, 60))
    await asyncio.wait_for(started.wait(), 30)
    early = asyncio.ensure_future(cache.aget_or_set("k", lambda: "early", 60))
    try:
        await until(lambda: len(entered) >= 2)
        if write == "aset":
            await cache.aset("k", "written", 60)
        elif write == "set in another thread":  # the sync guard's write tells this loop's
            await asyncio.to_thread(cache.set, "k", "written", 60)
        elif write == "adelete":
            await cache.adelete("k")
        else:
            await cache.aclear()
        late = asyncio.ensure_future(cache.aget_or_set("k", lambda: "loaded after", 60))
        if write in ("aset", "set in another thread"):  # served without waiting for the load
            assert await asyncio.wait_for(late, 30) == "written"
        else:
            await until(lambda: len(entered) >= 3)
    finally:
        release.set()
    assert (
        await asyncio.wait_for(asyncio.gather(leader, early), 30) == ["loaded before the write"] * 2
    )
    stays = "written" if write in ("aset", "set in another thread") else "loaded after"
    assert await asyncio.wait_for(late, 30) == stays
    assert await cache.aget("k") == stays


def test_get_or_set_of_its_own_key_in_its_callable_fails_at_once(cache: CacheGuardCache) -> None:
    def load() -> Any:
        return cache.get_or_set("k", lambda: "inner", 60)

    with pytest.raises(RecursiveLoadError):
        cache.get_or_set("k", load, 60)
    assert cache.get("k", "miss") == "miss"


# -- clear() --------------------------------------------------------------------------------------


def test_clear_deletes_its_namespace_only(make: Make, client: redis.Redis) -> None:
    mine = make()
    theirs = make(OPTIONS={"namespace": f"t{uuid.uuid4().hex[:12]}"})
    try:
        client.set(f"outside-{mine.namespace}", "x", ex=60)
        mine.set_many({"a": 1, "b": 2})
        theirs.set("a", "kept")
        mine.clear()
        assert mine.get_many(["a", "b"]) == {}
        assert theirs.get("a") == "kept"
        assert client.get(f"outside-{mine.namespace}") == b"x"
    finally:
        theirs.clear()
        client.delete(f"outside-{mine.namespace}")


def test_clear_with_a_key_prefix_deletes_that_prefix_only(make: Make) -> None:
    shop = make(KEY_PREFIX="shop")
    blog = make(KEY_PREFIX="blog")
    everything = make()
    shop.set("k", "shop")
    blog.set("k", "blog")
    everything.set("k", "plain")
    shop.clear()
    assert (shop.get("k"), blog.get("k"), everything.get("k")) == (None, "blog", "plain")
    everything.clear()  # no KEY_PREFIX: the whole namespace
    assert blog.get("k") is None


def test_clear_fails_a_fill_under_way(cache: CacheGuardCache) -> None:
    gate = Gate("loaded before the clear")
    thread, out = in_thread(lambda: cache.get_or_set("k", gate, 60))
    assert gate.started.wait(30)
    cache.clear()
    gate.release.set()
    thread.join(30)
    assert out == ["loaded before the clear"]
    assert cache.get("k") is None


def test_clear_leaves_no_key_behind(cache: CacheGuardCache, client: redis.Redis) -> None:
    cache.set_many({f"k{i}": i for i in range(50)}, 300)
    assert cache.get_or_set("filled", lambda: "loaded", 300) == "loaded"
    cache.clear()
    # No invalidation stamp per entry (a version key living version_ttl, 7 days).
    assert list(client.scan_iter(match=f"{cache.namespace}:*")) == []

    async def asynchronous() -> None:
        await cache.aset_many({f"a{i}": i for i in range(50)}, 300)
        await cache.aclear()
        assert await cache.aget_many([f"a{i}" for i in range(50)]) == {}

    asyncio.run(asynchronous())
    assert list(client.scan_iter(match=f"{cache.namespace}:*")) == []


def test_clear_of_a_key_prefix_leaves_a_longer_prefixs_entries(make: Make) -> None:
    shorter, longer = make(KEY_PREFIX="a"), make(KEY_PREFIX="a:b")
    longer.set("x", "longer's")
    shorter.set("x", "shorter's")
    assert (shorter.guard_name("x"), longer.guard_name("x")) == ("a:1:x", "a:b:1:x")
    shorter.clear()
    assert shorter.get("x") is None
    assert longer.get("x") == "longer's"


# -- signed pickles -------------------------------------------------------------------------------


def test_an_unsigned_or_tampered_pickle_is_never_unpickled(
    cache: CacheGuardCache, client: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self) -> Any:
            return (open, (str(marker), "w"))

    name = cache.guard_name("k")
    value_key = cache.guard.keys(name).value
    forged = pack_entry(
        PickleCodec(b"not the backend's key at all!"),
        Evil(),
        created=0.0,
        ttl=FOREVER,
        version=0,
        load_duration=0.0,
    )
    client.set(value_key, forged)
    assert cache.get("k", "miss") == "miss"
    assert cache.get_many(["k"]) == {}
    cache.set("k", "genuine")
    raw = client.get(value_key)
    assert raw is not None
    client.set(value_key, raw[:-1] + bytes([raw[-1] ^ 1]))  # one bit of the payload
    assert cache.get("k", "miss") == "miss"
    with pytest.raises(ValueError, match="not found"):
        cache.incr("k")
    assert not marker.exists()


def test_the_signing_key_comes_from_secret_key_or_options(make: Make) -> None:
    one = make()
    same = make()
    other = make(OPTIONS={"signing_key": "another key, 16 bytes or more"})
    one.set("k", "v")
    assert same.get("k") == "v"  # the same SECRET_KEY: the same key
    assert other.get("k", "miss") == "miss"  # signed with another key: a miss
    other.set("k", "w")
    assert one.get("k", "miss") == "miss"


def test_a_new_secret_key_makes_the_old_entries_misses(make: Make) -> None:
    make().set("k", "signed with the old key")
    with override_settings(SECRET_KEY="a rotated secret key, " + "r" * 40):
        rotated = make()
        assert rotated.get("k", "miss") == "miss"
        rotated.set("k", "signed with the new key")
    assert make().get("k", "miss") == "miss"


def server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def fresh_entry(codec: Any, value: Any, client: redis.Redis) -> bytes:
    """An entry of ``value`` by ``codec``, fresh by the server's clock (a guard would
    serve it, were it readable)."""
    return pack_entry(
        codec, value, created=server_now(client), ttl=300.0, version=0, load_duration=0.0
    )


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_an_unsigned_entry_is_refused_on_every_read_path(
    cache: CacheGuardCache, client: redis.Redis, codec: Any
) -> None:
    # Whoever can write to Redis writes a msgpack or JSON entry without the key: not a
    # value of this cache's, whatever path reads it.
    value_key = cache.guard.keys(cache.guard_name("k")).value
    client.set(value_key, fresh_entry(codec, 5, client))
    assert cache.get("k", "miss") == "miss"
    assert cache.get_many(["k"]) == {}
    assert not cache.has_key("k")
    with pytest.raises(ValueError, match="not found"):
        cache.incr("k")
    assert not cache.touch("k", 60)
    assert cache.get_or_set("k", lambda: "loaded", 60) == "loaded"  # the hit path, then
    client.set(value_key, fresh_entry(codec, 5, client))  # the fill's own look
    assert cache.add("k", "added", 60)  # nothing there to keep
    assert cache.get("k") == "added"

    async def asynchronous() -> None:
        client.set(value_key, fresh_entry(codec, 5, client))
        assert await cache.aget("k", "miss") == "miss"
        assert await cache.aget_many(["k"]) == {}
        with pytest.raises(ValueError, match="not found"):
            await cache.aincr("k")
        assert await cache.aget_or_set("k", lambda: "loaded", 60) == "loaded"

    asyncio.run(asynchronous())


def test_a_compressed_entry_is_authenticated_before_anything_is_inflated(
    make: Make, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make(OPTIONS={"compress": "zlib"})
    inflated: list[int] = []
    real_inflate = entry_module.inflate

    def counted(how: Any, data: Any) -> bytes:
        inflated.append(len(data))
        return real_inflate(how, data)

    monkeypatch.setattr(entry_module, "inflate", counted)
    big = "soup " * 10_000
    cache.set("page", big, 60)
    value_key = cache.guard.keys(cache.guard_name("page")).value
    stored = client.get(value_key)
    assert stored is not None
    assert stored[:2] == b"\xcb\x02"  # zlib
    assert cache.get("page") == big
    assert len(inflated) == 1
    # A bomb under the pickle codec's id: a few KiB inflating to 16 MiB (to 256 MiB
    # for a larger one); without the key's signature over it, refused uninflated.
    header = stored[:HEADER_SIZE]
    client.set(value_key, header + zlib.compress(bytes(16 << 20), 9))
    assert cache.get("page", "miss") == "miss"
    assert cache.get_or_set("page", lambda: "loaded", 60) == "loaded"
    client.set(value_key, stored[:-1] + bytes([stored[-1] ^ 1]))  # one bit flipped
    assert cache.get("page", "miss") == "miss"
    assert len(inflated) == 1


def test_the_signing_key_is_derived_from_secret_key_not_secret_key_itself(
    cache: CacheGuardCache, client: redis.Redis
) -> None:
    secret = django_settings.SECRET_KEY.encode()
    value_key = cache.guard.keys(cache.guard_name("k")).value
    client.set(value_key, fresh_entry(PickleCodec(secret), "signed with SECRET_KEY", client))
    assert cache.get("k", "miss") == "miss"  # SECRET_KEY itself signs nothing here
    derived = hmac.new(secret, b"cacheguard.integrations.django.CacheGuardCache", "sha256")
    client.set(value_key, fresh_entry(PickleCodec(derived.digest()), "ours", client))
    assert cache.get("k") == "ours"


def test_after_a_key_rotation_old_entries_are_absent_for_every_operation(make: Make) -> None:
    old = make()
    for key in ("lock", "touched", "flag", "async-lock"):
        old.set(key, "signed with the old key", None)
    with override_settings(SECRET_KEY="a rotated secret key, " + "r" * 40):
        new = make()
        assert not new.has_key("lock")
        assert new.add("lock", "mine", 30)  # an add-based lock can be taken again
        assert not new.add("lock", "theirs", 30)
        assert new.get("lock") == "mine"
        assert not new.touch("touched", 30)  # nothing there, as get() says
        assert new.get_or_set("flag", "default", 30) == "default"
        assert new.get("flag") == "default"  # stored by its add

        async def asynchronous() -> None:
            assert await new.aadd("async-lock", "mine", 30)
            assert await new.aget("async-lock") == "mine"
            assert not await new.atouch("touched", 30)

        asyncio.run(asynchronous())


# -- incr -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_incr_is_atomic_across_processes(redis_url: str, namespace: str) -> None:
    cache = django_workers.backend(redis_url, namespace)
    try:
        cache.set("hits", 0, None)
        lasts = run_processes(
            django_workers.incr_many, [(redis_url, namespace, "hits", 150)] * 4, timeout=120
        )
        assert cache.get("hits") == 600
        assert max(lasts) == 600
        assert cache.decr("hits", 100) == 500
    finally:
        cache.shutdown()


def test_incr_keeps_the_entrys_lifetime(cache: CacheGuardCache, client: redis.Redis) -> None:
    cache.set("n", 10, 120)
    before = cache.guard.peek_entry(cache.guard_name("n"))
    assert cache.incr("n", 5) == 15
    after = cache.guard.peek_entry(cache.guard_name("n"))
    assert before is not None
    assert after is not None
    assert (after.created, after.ttl, after.value) == (before.created, 120, 15)
    assert 100_000 < client.pttl(cache.guard.keys(cache.guard_name("n")).value) <= 120_000
    with pytest.raises(ValueError, match="Key 'missing' not found"):
        cache.incr("missing")
    cache.set("none", None)
    with pytest.raises(TypeError):
        cache.incr("none")


def lost_swaps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The compare-and-sets of incr/aincr that lost (found the key changed), recorded."""
    lost: list[str] = []
    answer, aanswer = django_cache._answer, django_cache._aanswer

    def counted(client: Any, step: Any) -> Any:
        reply = answer(client, step)
        if isinstance(step, tuple) and step[0] is ENTRY_SWAP and not reply:
            lost.append(step[1][0])
        return reply

    async def acounted(client: Any, step: Any) -> Any:
        reply = await aanswer(client, step)
        if isinstance(step, tuple) and step[0] is ENTRY_SWAP and not reply:
            lost.append(step[1][0])
        return reply

    monkeypatch.setattr(django_cache, "_answer", counted)
    monkeypatch.setattr(django_cache, "_aanswer", acounted)
    return lost


def test_concurrent_incrs_of_one_key_take_turns_in_the_process(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.set("n", 0, 120)
    lost = lost_swaps(monkeypatch)
    run_threads(8, lambda _: [cache.incr("n") for _ in range(25)])
    assert cache.get("n") == 200
    assert lost == []  # no thread's compare-and-set lost to another's


async def test_300_concurrent_aincrs_of_one_key_in_one_loop(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    # All at once, each retrying its compare-and-set against the others, they used up
    # the loop's 64 connections: the tasks waiting for one failed as Redis down.
    await cache.aset("n", 0, 120)
    lost = lost_swaps(monkeypatch)
    values = await asyncio.gather(*(cache.aincr("n") for _ in range(300)))
    assert sorted(values) == list(range(1, 301))
    assert await cache.aget("n") == 300
    assert lost == []


def test_an_incr_whose_compare_and_set_loses_reads_again(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.set("n", 1, 60)
    answer = django_cache._answer
    wrote: list[int] = []

    def racing(client: Any, step: Any) -> Any:
        reply = answer(client, step)
        if isinstance(step, django_cache._Read) and not wrote:
            wrote.append(1)
            cache.set("n", 10, 60)  # another writer, between incr's read and its write
        return reply

    monkeypatch.setattr(django_cache, "_answer", racing)
    assert cache.incr("n") == 11
    assert cache.get("n") == 11


async def test_an_aincr_whose_compare_and_set_loses_reads_again(
    cache: CacheGuardCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cache.aset("n", 1, 60)
    aanswer = django_cache._aanswer
    wrote: list[int] = []

    async def racing(client: Any, step: Any) -> Any:
        reply = await aanswer(client, step)
        if isinstance(step, django_cache._Read) and not wrote:
            wrote.append(1)
            await cache.aset("n", 10, 60)
        return reply

    monkeypatch.setattr(django_cache, "_aanswer", racing)
    assert await cache.aincr("n") == 11
    assert await cache.aget("n") == 11


async def test_a_pool_used_up_is_pool_exhausted_not_redis_down(make: Make) -> None:
    cache = make(OPTIONS={"max_connections": 1, "socket_timeout": 0.5})
    await cache.aset("k", 1)
    pool = cache.async_guard().client.connection_pool
    held = await pool.get_connection()  # the pool's one connection, in use
    try:
        with pytest.raises(PoolExhausted) as caught:
            await cache.aget("k")
        assert not isinstance(caught.value, BackendUnavailable)
    finally:
        await pool.release(held)
    assert await cache.aget("k") == 1


@pytest.mark.parametrize("write", ["touch", "incr"])
def test_touch_and_incr_during_a_fill_win_over_it(
    cache: CacheGuardCache, client: redis.Redis, write: str
) -> None:
    name = cache.guard_name("k")
    cache.set("k", 1, 60)
    gate = Gate(100)
    thread, out = in_thread(lambda: cache.guard.refresh(name, gate, ttl=60))
    assert gate.started.wait(30)
    try:
        if write == "touch":
            assert cache.touch("k", None)
        else:
            assert cache.incr("k") == 2
    finally:
        gate.release.set()
    thread.join(30)
    assert out == [100]  # the refresh's caller gets its load
    assert cache.get("k") == (1 if write == "touch" else 2)  # the write's entry stays
    if write == "touch":
        assert client.pttl(cache.guard.keys(name).value) == -1  # with no expiry


# -- asyncio --------------------------------------------------------------------------------------


async def test_the_async_methods_follow_django(cache: CacheGuardCache) -> None:
    assert await cache.aget("k") is None
    await cache.aset("k", {"v": 1}, 60)
    assert await cache.aget("k") == {"v": 1}
    assert cache.get("k") == {"v": 1}  # the same entries as the sync methods
    assert await cache.aadd("k", 2) is False
    assert await cache.aadd("n", 41) is True
    assert await cache.aincr("n") == 42
    assert await cache.adecr("n", 2) == 40
    assert await cache.aget_many(["k", "n", "x"]) == {"k": {"v": 1}, "n": 40}
    assert await cache.aset_many({"a": 1, "b": 2}) == []
    assert await cache.ahas_key("a")
    assert await cache.atouch("a", 100)
    assert await cache.adelete("a")
    assert not await cache.adelete("a")
    await cache.adelete_many(["b", "n"])
    assert await cache.aget_many(["b", "n"]) == {}
    calls: list[int] = []

    async def load() -> str:
        calls.append(1)
        return "loaded"

    assert await cache.aget_or_set("l", load, 60) == "loaded"
    assert await cache.aget_or_set("l", load, 60) == "loaded"
    assert await cache.aget_or_set("plain", lambda: "sync loader") == "sync loader"
    assert await cache.aget_or_set("d", "default") == "default"
    assert calls == [1]
    assert await cache.aincr_version("k") == 2
    assert await cache.aget("k", version=2) == {"v": 1}
    await cache.aclear()
    assert await cache.aget("l") is None


async def test_the_async_methods_use_no_thread_and_no_sync_guard(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make()
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    await cache.aset("k", 1)
    await cache.aadd("a", 1)
    await cache.aget("k")
    await cache.aget_many(["k"])
    await cache.ahas_key("k")
    await cache.aincr("k")
    await cache.atouch("k", 60)
    await cache.aset_many({"m": 1})
    await cache.aget_or_set("l", lambda: 1)
    await cache.adelete("k")
    await cache.adelete_many(["m"])
    await cache.aclear()
    monkeypatch.undo()
    assert started == []
    assert cache._shared._sync is None  # the sync guard was never made


@pytest.mark.slow
async def test_aget_or_set_waits_for_another_processs_fill(
    redis_url: str, namespace: str, client: redis.Redis, cache: CacheGuardCache
) -> None:
    counter, gate = f"{namespace}:calls", f"{namespace}:gate"
    started = start_processes(
        django_workers.fill_gated, [(redis_url, namespace, "k", counter, gate)]
    )
    try:
        assert await asyncio.to_thread(wait_until, lambda: client.get(counter) == b"1", 60)
        calls: list[int] = []

        async def load() -> str:
            calls.append(1)
            return "from-task"

        tasks = [asyncio.ensure_future(cache.aget_or_set("k", load, 60)) for _ in range(5)]
        # The gate opens once this loop's guard waits for the fill (subscribed to its
        # announcements; the filler is not), or a task ended without waiting.
        channel = ResourceKeys(namespace, cache.guard_name("k")).released_channel
        deadline = asyncio.get_running_loop().time() + 60
        while (
            subscribers(client, channel) < 1
            and not any(task.done() for task in tasks)
            and asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)
    finally:
        client.rpush(gate, "open")
    assert await asyncio.wait_for(asyncio.gather(*tasks), 60) == ["from-process"] * 5
    assert calls == []
    assert await asyncio.to_thread(results_of, started, timeout=60) == ["from-process"]
    assert int(client.get(counter) or 0) == 1


def test_each_event_loop_gets_its_guard_closed_with_the_loop(cache: CacheGuardCache) -> None:
    guards = []

    async def use() -> None:
        await cache.aset("k", "v")
        guards.append(cache.async_guard())

    asyncio.run(use())
    asyncio.run(use())
    assert guards[0] is not guards[1]
    assert all(guard._state.closed for guard in guards)  # closed as their loops shut down
    assert cache._shared._loops == {}
    loop = asyncio.new_event_loop()  # closed without shutting down its async generators
    loop.run_until_complete(use())
    loop.close()
    asyncio.run(use())  # forgets the closed loop's guard
    assert len(cache._shared._loops) == 0
    with pytest.raises(RuntimeError):
        cache.async_guard()  # no running loop


async def test_ashutdown_closes_the_loops_guard_and_a_later_call_opens_another(
    cache: CacheGuardCache,
) -> None:
    await cache.aset("k", 1)
    first = cache.async_guard()
    await cache.ashutdown()
    assert first._state.closed
    assert await cache.aget("k") == 1
    assert cache.async_guard() is not first


def test_close_keeps_the_connections_and_shutdown_closes_them(cache: CacheGuardCache) -> None:
    cache.set("k", 1)
    guard = cache.guard
    cache.close()
    assert cache.guard is guard
    assert cache.get("k") == 1
    cache.shutdown()
    assert guard._state.closed
    assert cache.get("k") == 1  # a new guard
    assert cache.guard is not guard


def test_instances_of_one_configuration_share_their_guard(make: Make) -> None:
    assert make().guard is make().guard
    assert make().guard is not make(OPTIONS={"lease": 12}).guard


def lifetime_of(cache: CacheGuardCache, client: redis.Redis, key: str) -> str:
    """How long the key lives: "gone", "forever" (no expiry, or a fill's FOREVER: ten
    years) or "expires"."""
    pttl = client.pttl(cache.guard.keys(cache.guard_name(key)).value)
    if pttl == -2:
        return "gone"
    return "forever" if pttl == -1 or pttl > FOREVER * 1000 / 2 else "expires"


@pytest.mark.parametrize(
    ("timeout", "expected"), [(0, "gone"), (-1, "gone"), (None, "forever"), (60, "expires")]
)
async def test_the_async_writes_take_timeouts_as_the_sync_ones(
    cache: CacheGuardCache, client: redis.Redis, timeout: Any, expected: str
) -> None:
    for key in ("set", "many", "add", "load"):
        await cache.aset(key, "before", 60)
        await cache.aset(f"a{key}", "before", 60)
    await asyncio.to_thread(cache.set, "set", "v", timeout)
    await asyncio.to_thread(cache.set_many, {"many": "v"}, timeout)
    await cache.adelete_many(["add", "aadd", "load", "aload"])
    await asyncio.to_thread(cache.add, "add", "v", timeout)
    await asyncio.to_thread(cache.get_or_set, "load", lambda: "v", timeout)
    await cache.aset("aset", "v", timeout)
    await cache.aset_many({"amany": "v"}, timeout)
    await cache.aadd("aadd", "v", timeout)
    await cache.aget_or_set("aload", lambda: "v", timeout)
    for key in ("set", "many", "add", "load"):
        assert lifetime_of(cache, client, key) == expected, key
        assert lifetime_of(cache, client, f"a{key}") == expected, f"a{key}"


async def test_aget_or_set_caches_a_none_as_get_or_set_does(cache: CacheGuardCache) -> None:
    calls: list[int] = []

    async def nothing() -> None:
        calls.append(1)

    assert await cache.aget_or_set("nothing", nothing, 60) is None
    assert await cache.aget_or_set("nothing", nothing, 60) is None
    assert await cache.aget("nothing", "default") is None
    assert calls == [1]


@pytest.mark.slow
def test_a_configuration_no_instance_uses_is_closed_once_another_is_made(
    redis_url: str, namespace: str
) -> None:
    params = {"OPTIONS": {"namespace": namespace}}
    first = CacheGuardCache(redis_url, params)
    guard = first.guard
    second = CacheGuardCache(redis_url, params)
    assert second.guard is guard  # Django's instance per thread: one guard
    del first, second
    gc.collect()
    # Unused, and no other configuration came: kept for the next instance (the next
    # request's, in a server that makes one per request).
    again = CacheGuardCache(redis_url, params)
    assert again.guard is guard
    del again
    gc.collect()
    guards = []
    for rotation in range(5):  # each a configuration of its own (its signing key)
        with override_settings(SECRET_KEY=f"rotated {rotation} " + "r" * 40):
            rotated = CacheGuardCache(redis_url, params)
            guards.append(rotated.guard)
            del rotated
            gc.collect()
    try:
        assert guard._state.closed
        assert [g._state.closed for g in guards] == [True] * 4 + [False]
        assert len(django_cache._registry) <= 2
    finally:
        guards[-1].close()


async def test_an_unused_configurations_loop_guard_is_closed_on_its_loop(
    redis_url: str, namespace: str
) -> None:
    first = CacheGuardCache(redis_url, {"OPTIONS": {"namespace": namespace}})
    await first.aset("k", 1)
    loop_guard = first.async_guard()
    del first
    gc.collect()
    with override_settings(SECRET_KEY="rotated again " + "r" * 40):
        other = CacheGuardCache(redis_url, {"OPTIONS": {"namespace": namespace}})
    await until(lambda: loop_guard._state.closed)
    assert await other.aget("k", "miss") == "miss"  # another key: its own guard
    await other.ashutdown()


# -- deployments ----------------------------------------------------------------------------------


def check_backend_on(cache: CacheGuardCache) -> None:
    cache.set("a", 1)
    cache.set_many({"b": 2, "c": 3})
    assert cache.get_many(["a", "b", "c", "d"]) == {"a": 1, "b": 2, "c": 3}
    assert cache.get_or_set("e", lambda: "loaded") == "loaded"
    assert cache.incr("a") == 2
    cache.delete_many(["b", "c"])
    cache.clear()
    assert cache.get_many(["a", "e"]) == {}

    async def asynchronous() -> None:
        await cache.aset_many({f"f{i}": i for i in range(20)})  # keys on every node
        assert await cache.aget_many([f"f{i}" for i in range(20)]) == {
            f"f{i}": i for i in range(20)
        }
        assert await cache.aget_or_set("g", lambda: "loaded") == "loaded"

    asyncio.run(asynchronous())


@pytest.mark.slow
def test_the_backend_on_a_cluster(redis_cluster: OwnedRedisCluster, cluster_namespace: str) -> None:
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in redis_cluster.nodes)
    cache = django_workers.backend(url, cluster_namespace)
    try:
        check_backend_on(cache)
    finally:
        cache.shutdown()


@pytest.mark.slow
def test_the_backend_on_a_sentinel_master(sentinel_set: OwnedSentinelSet, namespace: str) -> None:
    hosts = ",".join(f"{h}:{p}" for h, p in sentinel_set.sentinel_addresses)
    cache = django_workers.backend(
        f"redis+sentinel://{hosts}/{sentinel_set.master_name}", namespace
    )
    try:
        check_backend_on(cache)
    finally:
        cache.shutdown()


# -- bad input ------------------------------------------------------------------------------------


def test_an_unpicklable_value_raises_a_pickle_error_and_stores_nothing(
    cache: CacheGuardCache,
) -> None:
    cache.set("k", "old")
    for write in (
        lambda: cache.set("k", threading.Lock()),
        lambda: cache.add("new", threading.Lock()),
        lambda: cache.set_many({"k": threading.Lock()}),
        lambda: cache.get_or_set("fill", threading.Lock),
    ):
        with pytest.raises(pickle.PicklingError) as caught:
            write()
        assert isinstance(caught.value, UnpicklableValue)
        assert isinstance(caught.value, CacheGuardError)
    assert cache.get("k") == "old"
    assert cache.get_many(["new", "fill"]) == {}


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        ("http://127.0.0.1:6379", {}, "LOCATION"),
        (["redis://a:6379", "redis://b:6379"], {}, "one URL"),
        ("", {}, "LOCATION must be a Redis URL"),
        ("redis+cluster://127.0.0.1:6379/0", {}, "cluster URL names no database"),
        ("redis+sentinel://127.0.0.1:26379", {}, "needs /service"),
        (None, {"leese": 30}, "unknown 'leese'"),
        (None, {"MAX_ENTRIES": 30}, "maxmemory-policy"),
        (None, {"codec": "json"}, "pickled"),
        (None, {"l1_maxsize": 100}, "in-process copy"),
        (None, {"lease": -1}, "lease"),
        (None, {"on_timeout": "stale"}, "past its timeout"),
        (None, {"stale_if_error": 60}, "after a delete"),
        (None, {"outage_ttl": 60}, "after a delete"),
        (None, {"fallback_maxsize": 100}, "not available"),
        (None, {"signing_key": "short"}, "16 bytes"),
    ],
)
def test_a_bad_configuration_is_a_clear_error(
    make: Make, location: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(CacheBackendConfigError, match=message) as caught:
        make(location, OPTIONS=options)
    assert isinstance(caught.value, ImproperlyConfigured)


def test_redis_down_is_backend_unavailable(make: Make) -> None:
    cache = make("redis://127.0.0.1:1/0", OPTIONS={"connect_timeout": 0.5})
    with pytest.raises(BackendUnavailable):
        cache.get("k")
    with pytest.raises(BackendUnavailable):
        cache.set("k", 1)

    async def asynchronous() -> None:
        with pytest.raises(BackendUnavailable):
            await cache.aget("k")

    asyncio.run(asynchronous())


def test_an_entry_written_by_a_plain_guard_is_read_by_the_backend(
    cache: CacheGuardCache, client: redis.Redis
) -> None:
    # A guard with the backend's codec and namespace fills; the backend reads it.
    name = cache.guard_name("k")
    assert cache.guard.get_or_load(name, lambda: {"filled": True}, ttl=60) == {"filled": True}
    assert cache.get("k") == {"filled": True}
    raw = client.get(cache.guard.keys(name).value)
    assert raw is not None
    assert unpack_entry(cache.guard.settings.codec, raw).value == {"filled": True}
