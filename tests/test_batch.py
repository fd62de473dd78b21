"""``get_or_load_many`` and ``@cached_many_with_lock`` on both guards, against the real
Redis: hits in one round trip, one ``load_many`` for the keys we fill, keys filled
elsewhere or held by a writer waited for once our own fills ended (so batches with
overlapping names never wait for each other), errors and left-out names releasing
what they hold, the outage bypass; then across real processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import cacheguard
from cacheguard import (
    MISSING,
    BackendUnavailable,
    CacheGuard,
    IncompleteLoad,
    NoDefaultGuard,
    cached_many_with_lock,
)
from cacheguard.aio import AsyncCacheGuard
from tests import cache_workers
from tests.guard_drivers import KINDS, Guard
from tests.helpers import subscribers, wait_until
from tests.procs import run_processes

Make = Callable[..., Guard]


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    made: list[Guard] = []

    def build(*, url: str | None = None, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        if request.param == "sync":
            guard: CacheGuard | AsyncCacheGuard = CacheGuard(
                redis.Redis.from_url(url or redis_url, socket_timeout=10), **settings
            )
        else:
            guard = AsyncCacheGuard(
                redis.asyncio.Redis.from_url(url or redis_url, socket_timeout=10), **settings
            )
        made.append(Guard(request.param, guard))
        return made[-1]

    yield build
    for guard in made:
        await guard.close()


class LoadMany:
    """A ``load_many`` recording each call's names; ``gate`` holds it until set,
    ``started`` is set once it was called. ``leave_out`` names are not returned."""

    def __init__(
        self, *, gate: threading.Event | None = None, leave_out: tuple[str, ...] = ()
    ) -> None:
        self.calls: list[list[str]] = []
        self.started = threading.Event()
        self.gate = gate
        self.leave_out = leave_out

    def __call__(self, names: list[str]) -> Any:
        self.calls.append(list(names))
        self.started.set()
        values = {name: f"value of {name}" for name in names if name not in self.leave_out}
        if self.gate is None:
            return values
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread of the sync guard: block
            assert self.gate.wait(30), "the test never opened the gate"
            return values
        return self._gated(values)

    async def _gated(self, values: dict[str, Any]) -> dict[str, Any]:
        assert self.gate is not None
        assert await asyncio.to_thread(self.gate.wait, 30), "the test never opened the gate"
        return values


async def started(load: LoadMany) -> None:
    assert await asyncio.to_thread(load.started.wait, 10), "load_many was never called"


def value(name: str) -> str:
    return f"value of {name}"


class Spy:
    """Counts the pipelines and the single GETs a guard's client sends."""

    def __init__(self, client: Any) -> None:
        self.pipelines = 0
        self.gets = 0
        pipeline, get = client.pipeline, client.get

        def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
            self.pipelines += 1
            return pipeline(*args, **kwargs)

        def counted_get(*args: Any, **kwargs: Any) -> Any:
            self.gets += 1
            return get(*args, **kwargs)

        client.pipeline, client.get = counted_pipeline, counted_get


# -- one guard -----------------------------------------------------------------------------


async def test_hits_come_in_one_round_trip_and_the_misses_in_one_load(make: Make) -> None:
    guard = make()
    for name in ("a", "b"):
        await guard.get_or_load(name, lambda name=name: value(name), ttl=60)
    load = LoadMany()
    got = await guard.get_or_load_many(["c", "a", "b", "d", "a"], load, ttl=60)
    assert list(got.items()) == [(n, value(n)) for n in ("c", "a", "b", "d")]  # order, once
    assert load.calls == [["c", "d"]]
    spy = Spy(guard.guard.client)
    again = await guard.get_or_load_many(["a", "b", "c", "d"], load, ttl=60)
    assert again == {n: value(n) for n in "abcd"}
    assert load.calls == [["c", "d"]]  # all hits: nothing loaded
    assert (spy.pipelines, spy.gets) == (1, 0)  # one round trip for all four
    stats = guard.stats()
    assert (stats.l2_hits, stats.misses, stats.loads) == (2 + 4, 2 + 2, 2 + 2)
    assert await guard.get_or_load_many([], load, ttl=60) == {}


async def test_entries_are_judged_as_single_reads_judge_them(
    make: Make, client: redis.Redis
) -> None:
    guard = make(l1_maxsize=100)
    l1 = guard.guard._state.l1
    assert l1 is not None
    for _ in range(500):  # the feed subscribes apart: a copy is kept once it is live
        await guard.get_or_load("fresh", lambda: value("fresh"), ttl=60)
        if "fresh" in l1:
            break
        await asyncio.sleep(0.01)
    assert "fresh" in l1
    before = guard.stats()
    client.set(guard.keys("garbage").value, b"\xff not an entry")
    client.rpush(guard.keys("a-list").value, b"x")  # someone else's key, of another type
    load = LoadMany()
    names = ["fresh", "garbage", "a-list", "new"]
    assert await guard.get_or_load_many(names, load, ttl=60) == {n: value(n) for n in names}
    assert load.calls == [["garbage", "a-list", "new"]]
    stats = guard.stats()
    assert stats.corrupt_entries == 2
    assert stats.l1_hits == before.l1_hits + 1  # "fresh", from L1: not even read
    assert "new" in l1  # what the batch loaded is kept in L1 as a single read's


async def test_a_key_filled_between_the_batchs_read_and_its_lock_is_not_loaded(
    make: Make,
) -> None:
    guard, other = make(), make()
    client = guard.guard.client
    real_pipeline = client.pipeline

    class FilledAfterTheRead:
        """The batch's pipeline: after its GETs answered, another guard fills "b"."""

        def __init__(self, pipe: Any) -> None:
            self.pipe = pipe

        def get(self, key: str) -> Any:
            return self.pipe.get(key)

        def execute(self, **kwargs: Any) -> Any:
            if guard.kind == "sync":
                replies = self.pipe.execute(**kwargs)
                other.guard.get_or_load("b", lambda: "filled meanwhile", ttl=60)
                return replies

            async def run() -> Any:
                replies = await self.pipe.execute(**kwargs)
                await other.guard.get_or_load("b", lambda: "filled meanwhile", ttl=60)
                return replies

            return run()

    client.pipeline = lambda **kwargs: FilledAfterTheRead(real_pipeline(**kwargs))
    load = LoadMany()
    got = await guard.get_or_load_many(["a", "b"], load, ttl=60)
    assert got == {"a": value("a"), "b": "filled meanwhile"}
    assert load.calls == [["a"]]  # double-checked under the lock: "b" is not loaded


async def test_a_writer_holding_a_key_is_waited_for_while_the_other_keys_load(
    make: Make, client: redis.Redis
) -> None:
    writer, reader = make(), make(lease=5)
    load = LoadMany()
    async with writer.write("a"):
        read = asyncio.ensure_future(reader.get_or_load_many(["a", "b"], load, ttl=60))
        # "b" is loaded and stored while the writer holds "a"; then "a" is waited for.
        assert await asyncio.to_thread(
            wait_until, lambda: subscribers(client, reader.keys("a").released_channel) >= 1, 10
        )
        assert load.calls == [["b"]]
        assert await writer.peek("b") == value("b")
        assert not read.done()
    assert await read == {"a": value("a"), "b": value("b")}
    assert load.calls == [["b"], ["a"]]  # "a" loaded once the write ended, on its own


async def test_batches_with_overlapping_reversed_names_do_not_wait_for_each_other(
    make: Make,
) -> None:
    # x fills a and b while a writer holds c and d; then y fills c and d while x still
    # loads: each holds the keys the other wants. A batch that waited for the others'
    # keys before loading its own would deadlock here until wait_timeout.
    x, y, writer = make(wait_timeout=60), make(wait_timeout=60), make()
    gate = threading.Event()
    load_x, load_y = LoadMany(gate=gate), LoadMany(gate=gate)
    expected = {n: value(n) for n in "abcd"}
    try:
        async with writer.write("c", "d"):
            batch_x = asyncio.ensure_future(
                x.get_or_load_many(["a", "b", "c", "d"], load_x, ttl=60)
            )
            await started(load_x)
        batch_y = asyncio.ensure_future(y.get_or_load_many(["d", "c", "b", "a"], load_y, ttl=60))
        await started(load_y)
        assert (load_x.calls, load_y.calls) == ([["a", "b"]], [["d", "c"]])
    finally:
        gate.set()
    done, _ = await asyncio.wait([batch_x, batch_y], timeout=20)
    assert len(done) == 2, "the batches waited for each other"
    assert await batch_x == expected
    assert await batch_y == expected
    assert (load_x.calls, load_y.calls) == ([["a", "b"]], [["d", "c"]])  # each key once


async def test_a_failing_load_many_releases_every_lock_and_caches_nothing(
    make: Make, client: redis.Redis
) -> None:
    guard, other = make(), make(wait_timeout=30)

    def broken(names: list[str]) -> Any:
        raise ZeroDivisionError("db down")

    await guard.get_or_load("hit", lambda: value("hit"), ttl=60)
    with pytest.raises(ZeroDivisionError):
        await guard.get_or_load_many(["a", "hit", "b"], broken, ttl=60)
    for name in ("a", "b"):
        assert await guard.peek(name) is MISSING
        assert client.hgetall(guard.keys(name).lock) == {}  # no hold left
    load = LoadMany()
    expected = {"a": value("a"), "b": value("b")}
    assert await other.get_or_load_many(["a", "b"], load, ttl=60) == expected
    assert load.calls == [["a", "b"]]  # not left waiting for a fill that ended
    assert guard.stats().load_errors == 2


async def test_stale_if_error_answers_a_failing_batch_with_the_values_seen(make: Make) -> None:
    guard, other = make(stale_if_error=60), make()
    assert await guard.get_or_load_many(["a", "b"], LoadMany(), ttl=60) == {
        "a": value("a"),
        "b": value("b"),
    }
    await other.invalidate("a", "b")  # another process: what this one saw stays noted

    def broken(names: list[str]) -> Any:
        raise ZeroDivisionError("db down")

    assert await guard.get_or_load_many(["b", "a"], broken, ttl=60) == {
        "b": value("b"),
        "a": value("a"),
    }
    assert guard.stats().stale_on_error == 2
    with pytest.raises(ZeroDivisionError):  # "c" was never seen: nothing to answer with
        await guard.get_or_load_many(["a", "c"], broken, ttl=60)


async def test_a_name_left_out_by_load_many_raises_and_is_not_cached(
    make: Make, client: redis.Redis
) -> None:
    guard = make()
    with pytest.raises(IncompleteLoad) as raised:
        await guard.get_or_load_many(["a", "b", "c"], LoadMany(leave_out=("b",)), ttl=60)
    assert raised.value.missing == ("b",)
    assert isinstance(raised.value, KeyError)
    assert "'b'" in str(raised.value)
    assert await guard.peek("a") == value("a")  # the names it returned are cached
    assert await guard.peek("b") is MISSING
    assert client.hgetall(guard.keys("b").lock) == {}
    load = LoadMany()
    assert await guard.get_or_load_many(["a", "b", "c"], load, ttl=60) == {
        n: value(n) for n in "abc"
    }
    assert load.calls == [["b"]]


async def test_a_load_many_that_returns_no_mapping_is_refused(make: Make) -> None:
    guard = make()
    with pytest.raises(TypeError, match="mapping"):
        await guard.get_or_load_many(["a"], lambda names: [1], ttl=60)
    with pytest.raises(TypeError, match="iterable"):
        await guard.get_or_load_many("ab", LoadMany(), ttl=60)  # type: ignore[arg-type]
    assert await guard.peek("a") is MISSING


async def test_redis_down_bypasses_with_one_load_for_every_name(make: Make) -> None:
    down = make(url="redis://127.0.0.1:1/0", on_backend_error="bypass")
    load = LoadMany()
    assert await down.get_or_load_many(["a", "b", "c"], load, ttl=60) == {
        n: value(n) for n in "abc"
    }
    assert load.calls == [["a", "b", "c"]]
    assert down.stats().bypasses == 3
    raising = make(url="redis://127.0.0.1:1/0", on_backend_error="raise")
    load = LoadMany()
    with pytest.raises(BackendUnavailable):
        await raising.get_or_load_many(["a", "b"], load, ttl=60)
    assert load.calls == []


def fail_scripts_of(guard: Guard, name: str) -> list[str]:
    """Make the scripts sent for ``name``'s keys fail as a dropped connection does;
    returns the names whose scripts were sent, in order."""
    client = guard.guard.client
    tag = guard.keys(name).tag
    sent: list[str] = []
    evalsha = client.evalsha

    def seen(args: tuple[Any, ...]) -> None:  # (sha, number of keys, first key, ...)
        sent.append(str(args[2]).split("{", 1)[1].split("}", 1)[0])
        if tag in str(args[2]):
            raise redis.ConnectionError(f"injected: the connection dropped for {name!r}")

    if guard.kind == "sync":

        def failing(*args: Any) -> Any:
            seen(args)
            return evalsha(*args)

        client.evalsha = failing
    else:

        async def afailing(*args: Any) -> Any:
            seen(args)
            return await evalsha(*args)

        client.evalsha = afailing
    return sent


async def test_redis_failing_mid_batch_stops_the_fills_and_loads_the_rest_at_once(
    make: Make,
) -> None:
    guard = make(on_backend_error="bypass")
    sent = fail_scripts_of(guard, "c")  # the GETs pass; "c"'s fill cannot begin
    load = LoadMany()
    names = ["a", "b", "c", "d", "e", "f"]
    assert await guard.get_or_load_many(names, load, ttl=60) == {n: value(n) for n in names}
    assert load.calls == [names]  # the fills begun and the bypassed names: one load
    assert not {"d", "e", "f"} & set(sent)  # never tried
    stats = guard.stats()
    assert (stats.bypasses, stats.backend_errors) == (4, 1)
    assert await guard.peek("a") == value("a")  # begun before: its fill ended as usual
    assert await guard.peek("b") == value("b")
    for name in "cdef":
        assert await guard.peek(name) is MISSING  # bypassed: nothing stored

    raising = make(on_backend_error="raise", namespace=f"{guard.guard.namespace}-raise")
    fail_scripts_of(raising, "c")
    load = LoadMany()
    with pytest.raises(BackendUnavailable):
        await raising.get_or_load_many(names, load, ttl=60)
    assert load.calls == []
    assert await raising.peek("a") is MISSING  # the fills begun ended, storing nothing
    assert await raising.get_or_load("a", lambda: "again", ttl=60) == "again"  # not held


async def test_a_decorated_function_of_a_list_of_ids(make: Make) -> None:
    guard = make()
    asked: list[list[int]] = []

    def menus(ids: list[int]) -> dict[int, dict[str, int]]:
        asked.append(list(ids))
        return {i: {"id": i} for i in ids}

    if guard.kind == "sync":
        cached = cached_many_with_lock(guard.guard, key="menu:{}", ttl=60)(menus)

        async def call(ids: list[int]) -> Any:
            return await asyncio.to_thread(cached, ids)

        async def invalidate(ids: list[int]) -> None:
            await asyncio.to_thread(cached.invalidate, ids)
    else:

        async def amenus(ids: list[int]) -> dict[int, dict[str, int]]:
            return menus(ids)

        acached = cached_many_with_lock(guard.guard, key="menu:{menu_id}", ttl=60)(amenus)
        call, invalidate = acached, acached.invalidate
    assert await call([3, 1, 3]) == {3: {"id": 3}, 1: {"id": 1}}
    assert await call([1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
    assert asked == [[3, 1], [2]]
    assert await guard.peek("menu:2") == {"id": 2}
    await invalidate([1])
    assert await call([1, 2]) == {1: {"id": 1}, 2: {"id": 2}}
    assert asked == [[3, 1], [2], [1]]


async def test_distinct_ids_with_one_key_are_refused_before_any_load(make: Make) -> None:
    guard = make()
    asked: list[list[Any]] = []

    def values(ids: list[Any]) -> dict[Any, str]:
        asked.append(list(ids))
        return {i: f"value of {i!r}" for i in ids}

    if guard.kind == "sync":
        cached = cached_many_with_lock(guard.guard, key="d:{}", ttl=60)(values)

        async def call(ids: list[Any]) -> Any:
            return await asyncio.to_thread(cached, ids)
    else:

        async def avalues(ids: list[Any]) -> dict[Any, str]:
            return values(ids)

        call = cached_many_with_lock(guard.guard, key="d:{}", ttl=60)(avalues)
    with pytest.raises(ValueError, match=r"ids 1 and '1' both have the key 'd:1'"):
        await call([1, "1", 2])
    assert asked == []  # refused before any load
    assert await guard.peek("d:2") is MISSING
    assert await call([1, 2, 1]) == {1: "value of 1", 2: "value of 2"}  # the same id twice


@pytest.mark.slow
async def test_entries_due_for_a_refresh_are_refreshed_together_in_the_background(
    make: Make,
) -> None:
    guard = make(stale_ttl=30)
    asked: list[list[str]] = []
    round_of = {"n": 1}

    def load_many(names: list[str]) -> dict[str, str]:
        asked.append(list(names))
        return {name: f"{name} #{round_of['n']}" for name in names}

    names = [f"item:{i}" for i in range(6)]
    first = {name: f"{name} #1" for name in names}
    assert await guard.get_or_load_many(names, load_many, ttl=0.3) == first
    deadline = time.monotonic() + 10
    while await guard.peek(names[-1]) is not MISSING:  # expired: in the stale window
        assert time.monotonic() < deadline, "the entries never expired"
        await asyncio.sleep(0.02)
    round_of["n"] = 2
    assert await guard.get_or_load_many(names, load_many, ttl=60) == first  # stale, served

    def refreshed() -> bool:
        return guard.stats().early_refreshes == len(names)

    assert await asyncio.to_thread(wait_until, refreshed, 10)
    assert asked == [names, names]  # one load_many for the whole batch's refresh
    assert guard.stats().stale_served == len(names)
    assert await guard.get_or_load_many(names, load_many, ttl=60) == {
        name: f"{name} #2" for name in names
    }
    assert asked == [names, names]


@dataclasses.dataclass
class Dish:
    id: int
    name: str


async def test_typed_values_are_stored_as_data_and_come_back_typed(make: Make) -> None:
    guard = make()
    load = LoadMany()

    def dishes(names: list[str]) -> dict[str, Dish]:
        load(names)
        return {name: Dish(int(name[-1]), name) for name in names}

    await guard.get_or_load("dish:2", lambda: {"id": "not an int"}, ttl=60)  # an older shape
    names = ["dish:1", "dish:2"]
    want = {name: Dish(int(name[-1]), name) for name in names}
    assert await guard.get_or_load_many(names, dishes, ttl=60, type=Dish) == want
    assert load.calls == [names]  # data that does not fit the type is a miss
    assert guard.stats().corrupt_entries == 1
    assert await guard.peek("dish:1") == {"id": 1, "name": "dish:1"}  # stored as data
    assert await guard.get_or_load_many(names, dishes, ttl=60, type=Dish) == want  # hits
    assert load.calls == [names]


async def test_a_decorated_function_infers_its_values_type(make: Make) -> None:
    guard = make()
    asked: list[list[int]] = []

    def dishes(ids: list[int]) -> dict[int, Dish]:
        asked.append(list(ids))
        return {i: Dish(i, f"dish {i}") for i in ids}

    def plain(ids: list[int]) -> dict[int, Dish]:  # type=False: values as the codec keeps them
        return {i: {"id": i} for i in ids}  # type: ignore[misc]

    if guard.kind == "sync":
        cached = cached_many_with_lock(guard.guard, key="dish:{}", ttl=60)(dishes)
        untyped = cached_many_with_lock(guard.guard, key="plain:{}", ttl=60, type=False)(plain)

        async def call(ids: list[int]) -> Any:
            return await asyncio.to_thread(cached, ids)

        async def call_untyped(ids: list[int]) -> Any:
            return await asyncio.to_thread(untyped, ids)
    else:

        async def adishes(ids: list[int]) -> dict[int, Dish]:
            return dishes(ids)

        async def aplain(ids: list[int]) -> dict[int, Dish]:
            return plain(ids)

        call = cached_many_with_lock(guard.guard, key="dish:{}", ttl=60)(adishes)
        call_untyped = cached_many_with_lock(guard.guard, key="plain:{}", ttl=60, type=False)(
            aplain
        )
    assert await call([1, 2]) == {1: Dish(1, "dish 1"), 2: Dish(2, "dish 2")}
    assert await call([2, 1]) == {2: Dish(2, "dish 2"), 1: Dish(1, "dish 1")}  # hits, typed
    assert asked == [[1, 2]]
    assert await guard.peek("dish:1") == {"id": 1, "name": "dish 1"}
    assert await call_untyped([3]) == {3: {"id": 3}}


async def test_a_cancelled_asyncio_batch_ends_the_fills_it_began(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    guard = AsyncCacheGuard(redis.asyncio.Redis.from_url(redis_url), namespace=namespace)
    called, never = asyncio.Event(), asyncio.Event()

    async def stuck(names: list[str]) -> dict[str, str]:
        called.set()
        await never.wait()
        raise AssertionError("not reached")

    try:
        batch = asyncio.ensure_future(guard.get_or_load_many(["a", "b"], stuck, ttl=60))
        await asyncio.wait_for(called.wait(), 10)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        for name in ("a", "b"):
            assert client.hgetall(guard.keys(name).lock) == {}  # no hold left behind
            assert await guard.peek(name) is MISSING
        got = await guard.get_or_load_many(
            ["a", "b"], lambda names: dict.fromkeys(names, 1), ttl=60
        )
        assert got == {"a": 1, "b": 1}
    finally:
        await guard.aclose()
        await guard.client.aclose()


async def test_a_batch_inside_its_own_write_loads_that_key_for_itself_only(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    guard = AsyncCacheGuard(redis.asyncio.Redis.from_url(redis_url), namespace=namespace)
    load = LoadMany()
    try:
        async with guard.write("a"):  # this task's write: what it loads may be uncommitted
            got = await guard.get_or_load_many(["a", "b"], load, ttl=60)
            assert got == {"a": value("a"), "b": value("b")}
            assert load.calls == [["a", "b"]]
        assert not client.exists(guard.keys("a").value)  # ours alone: not stored
        assert await guard.peek("b") == value("b")
    finally:
        await guard.aclose()
        await guard.client.aclose()


def test_a_function_decorated_without_a_guard_reads_through_the_installed_one(
    client: redis.Redis,
) -> None:
    @cached_many_with_lock(key="menu:{menu_id}", ttl=60)
    def menus(ids: list[int]) -> dict[int, str]:
        return {i: f"menu {i}" for i in ids}

    with pytest.raises(NoDefaultGuard):
        menus([1])
    guard = CacheGuard(client, namespace=f"t{uuid.uuid4().hex[:8]}")
    try:
        with cacheguard.use(guard):
            assert menus([2, 1]) == {2: "menu 2", 1: "menu 1"}
            assert guard.peek("menu:2") == "menu 2"
    finally:
        guard.invalidate("menu:1", "menu:2")
        guard.close()


def test_the_decorator_refuses_what_it_cannot_read_through(client: redis.Redis) -> None:
    guard = CacheGuard(client, namespace=f"t{uuid.uuid4().hex[:8]}")
    with pytest.raises(ValueError, match="one plain replacement field"):
        cached_many_with_lock(guard, key="menu:{a}:{b}", ttl=60)
    with pytest.raises(ValueError, match="one plain replacement field"):
        cached_many_with_lock(guard, key="menu", ttl=60)

    async def amenus(ids: list[int]) -> dict[int, int]:
        return {}

    with pytest.raises(TypeError, match="async def"):
        cached_many_with_lock(guard, key="menu:{}", ttl=60)(amenus)
    with pytest.raises(TypeError, match="CacheGuard or an AsyncCacheGuard"):
        cached_many_with_lock(object(), key="menu:{}", ttl=60)  # type: ignore[call-overload]
    guard.close()


# -- across processes ------------------------------------------------------------------------


@pytest.mark.slow
def test_overlapping_batches_across_processes_load_each_key_once(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    names = [f"item:{i}" for i in range(24)]
    start_at = time.time() + 1.5  # the children's imports done, they start together
    runs = [
        (redis_url, namespace, kind, 4, names, start_at)
        for kind in ("sync", "async", "sync", "async")
    ]
    results = run_processes(cache_workers.batch_worker, runs, timeout=90)
    for per_process in results:
        for got in per_process:
            assert got == {name: {"name": name} for name in got}
            assert set(got) <= set(names)
    loads = {name: int(client.get(f"{namespace}:loads:{name}") or 0) for name in names}
    assert loads == dict.fromkeys(names, 1)
